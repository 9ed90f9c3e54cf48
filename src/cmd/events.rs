//! `tessera events`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only this job's events; the stream ends when the job is done, failed
    /// or canceled (at once if it already is).
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
    // an error, a finished one's stream is already over.
    if let Some(job) = job {
        if Client::connect(&ticket)
            .await?
            .job(job)
            .await?
            .state
            .is_final()
        {
            return Ok(0);
        }
    }
    report::stream_events(feed, job, json).await
}
