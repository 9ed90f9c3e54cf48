//! `tessera retry`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    pub job: u64,
    /// Then wait for it (as `wait`).
    #[arg(long)]
    pub wait: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        job,
        wait,
        json,
        ticket,
    } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let status = client.retry(job).await?;
    if !wait {
        if json {
            println!("{}", report::job_json(&status));
        } else {
            println!(
                "job {job} is {} again: {}",
                status.state.name(),
                follow::progress_line(&status)
            );
        }
        return Ok(0);
    }
    let opts = follow::WaitOptions {
        output: None,
        partial: false,
        timeout: None,
        progress: !json,
    };
    finish_wait(&ticket, client, &[job], &opts, json, None).await
}
