//! `tessera priority`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    pub job: u64,
    /// The new priority: higher goes first; the default at submit is 0.
    #[arg(allow_negative_numbers = true)]
    pub priority: i32,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        job,
        priority,
        ticket,
    } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let status = client.set_priority(job, priority).await?;
    println!("job {job} has priority {}", status.priority);
    Ok(0)
}
