//! `tessera events`.

use super::*;

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
    follow::events(&ticket, job, json).await
}
