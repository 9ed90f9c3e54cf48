//! `tessera wait`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(required = true)]
    pub jobs: Vec<u64>,
    /// Download the frames here, each as soon as it is stitched.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Replace files in --output that hold other frames (another
    /// job's, say); without it such a file is an error.
    #[arg(long)]
    pub overwrite: bool,
    /// With --output: also fetch the finished frames of a job that
    /// failed or was canceled.
    #[arg(long, requires = "output")]
    pub partial: bool,
    /// Give up after this long (e.g. 90s, 30m, 2h) with exit code 5;
    /// the jobs go on.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        jobs,
        output,
        overwrite,
        partial,
        timeout,
        json,
        ticket,
    } = args;
    let ticket = ticket.resolve()?;
    let client = Client::connect(&ticket).await?;
    let opts = follow::WaitOptions {
        output: output.map(|dir| (dir, overwrite)),
        partial,
        timeout,
        progress: !json,
    };
    let mut jobs = jobs;
    let mut seen = std::collections::HashSet::new();
    jobs.retain(|j| seen.insert(*j));
    finish_wait(&ticket, client, &jobs, &opts, json, None).await
}
