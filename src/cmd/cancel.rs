//! `tessera cancel`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    pub job: u64,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { job, ticket } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let status = client.cancel(job).await?;
    println!("job {} is {}", status.id, status.state.name());
    Ok(0)
}
