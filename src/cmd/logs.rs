//! `tessera logs`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    pub job: u64,
    pub task: Option<u32>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        job,
        task,
        json,
        ticket,
    } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let logs = client.logs(job, task).await?;
    report::print_logs(job, &logs, json);
    Ok(0)
}
