//! `tessera monitor`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { ticket } = args;
    let ticket = ticket.resolve()?;
    crate::monitor::run(ticket).await?;
    Ok(0)
}
