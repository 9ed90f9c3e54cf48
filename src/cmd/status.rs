//! `tessera status`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Job ids: one shows that job in detail; several list just those.
    pub jobs: Vec<u64>,
    /// Only jobs in these states (comma-separated): queued, running,
    /// done, failed, canceled; `active` (queued and running) and
    /// `finished` (done, failed, canceled).
    #[arg(long, value_delimiter = ',', value_parser = parse_states)]
    pub state: Vec<States>,
    /// Only jobs with this name; `*` and `?` match any characters
    /// (`--name 'sh0*'`).
    #[arg(long)]
    pub name: Option<String>,
    /// Only jobs submitted since then: a duration ago (`2h`, `30m`,
    /// `7d`) or a UTC time (`2026-12-01`, `2026-12-01T09:30:00Z`).
    #[arg(long, value_parser = parse_since)]
    pub since: Option<u64>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        jobs: ids,
        state,
        name,
        since,
        json,
        ticket,
    } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let mut states: Vec<JobState> = state.into_iter().flat_map(|s| s.0).collect();
    states.sort_by_key(|s| *s as u8);
    states.dedup();
    let filter = JobFilter {
        states,
        name,
        since_unix_ms: since,
        ids: ids.clone(),
    };
    let only_ids = JobFilter {
        ids: ids.clone(),
        ..Default::default()
    };
    if let ([id], true) = (&ids[..], filter == only_ids) {
        report::print_detail(&client.job_detail(*id).await?, json);
        return Ok(0);
    }
    let jobs = client.jobs(&filter).await?;
    let workers = client.workers().await?;
    report::print_status(None, &jobs, &workers, json);
    Ok(0)
}
