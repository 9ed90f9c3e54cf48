//! `tessera events`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Only this job's events.
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
    report::stream_events(client.subscribe().await?, job, json).await
}
