//! `tessera events`.

use super::*;
use tessera_protocol::messages::FarmEvent;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only this job's events; the stream ends when the job is done, failed
    /// or canceled, with that event (alone, if it already is).
    #[arg(long)]
    pub job: Option<u64>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { job, json, ticket } = args;
    let ticket = ticket.resolve()?;
    let client = Client::connect(&ticket).await?;
    let feed = client.subscribe().await?;
    // Subscribed first, so that nothing falls between: an unknown job is
    // an error; a finished one's stream is its final event alone.
    if let Some(job) = job {
        let status = Client::connect(&ticket).await?.job(job).await?;
        if status.state.is_final() {
            let event = FarmEvent::JobChanged {
                job,
                state: status.state,
            };
            let at = status.finished_unix_ms.unwrap_or(status.submitted_unix_ms);
            println!("{}", report::event_line(at, &event, json));
            return Ok(0);
        }
    }
    report::stream_events(feed, job, json).await
}
