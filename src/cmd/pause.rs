//! `tessera pause`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    pub job: u64,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { job, ticket } = args;
    pause(job, ticket, true).await
}
