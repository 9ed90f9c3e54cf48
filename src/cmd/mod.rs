//! The subcommands of `tessera`, one module each: its arguments (`Args`,
//! with the option groups several share flattened in) and its `run`.

mod blender;
mod cancel;
mod coordinator;
mod demo;
mod drain;
mod events;
mod fleet;
mod gc;
mod logs;
mod monitor;
mod parse;
mod pause;
mod priority;
mod resume;
mod retry;
mod status;
mod submit;
mod wait;
mod worker;

use crate::client::{Client, SubmitOptions};
use crate::shutdown_signal;
use crate::{build, client, exit, follow, openjd, progress, report, share, shown, uproject};
use anyhow::Context;
use clap::Subcommand;
use parse::*;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tessera_coordinator::server::{HttpListen, Webhook};
use tessera_protocol::job::{Engine, TileGrid};
use tessera_protocol::messages::{JobFilter, JobState, MAX_SLOTS};
use tessera_worker::engine::{self, blender_runtime};

#[derive(clap::Args)]
pub(crate) struct TicketArg {
    /// Client ticket (the line in DATA_DIR/client.ticket), or @FILE holding it.
    #[arg(long, env = "TESSERA_TICKET", hide_env_values = true)]
    pub(crate) ticket: Option<String>,
}

impl TicketArg {
    /// The ticket given (`--ticket`, `TESSERA_TICKET`, `@FILE`), read and
    /// checked.
    pub(crate) fn resolve(&self) -> anyhow::Result<tessera_protocol::ticket::Ticket> {
        client::resolve_ticket(self.ticket.as_deref())
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the coordinator: schedules jobs, stores assets, stitches frames.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Coordinator(coordinator::Args),
    /// Run a worker: joins the farm with a worker ticket and renders tasks.
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Worker(worker::Args),
    /// Submit a scene: uploads what the farm lacks, then queues the job.
    Submit(submit::Args),
    /// Show jobs and workers, or one job in detail (its frames, failed
    /// attempts and workers). Filters narrow the list.
    Status(status::Args),
    /// Wait for jobs to finish, writing each frame as soon as it is
    /// stitched; exits 0 when every job is done, else with the code of the
    /// worst ending (see the README's exit codes).
    Wait(wait::Args),
    /// Show the failed attempts of a job (or of one task): each error and
    /// the renderer's log around it.
    Logs(logs::Args),
    /// Put a failed job back in the queue: its finished tasks and frames
    /// stay, the failed and unfinished tasks are rendered again.
    Retry(retry::Args),
    /// Cancel a job.
    Cancel(cancel::Args),
    /// Rented nodes on demand: `fleet run` and `fleet plan` (README, "Fleet").
    Fleet(fleet::Args),
    /// Blender builds shipped through the farm.
    Blender(blender::Args),
    /// Remove stored assets and frames that no retained job uses (the
    /// coordinator also does this every hour).
    Gc(gc::Args),
    /// Stop handing out a job's tasks (running ones finish).
    Pause(pause::Args),
    /// Resume a paused job.
    Resume(resume::Args),
    /// Give a queued or running job a new priority: higher goes first
    /// (tasks already handed out finish where they are).
    Priority(priority::Args),
    /// Ask a worker to finish its tasks and leave (its process exits 0; at
    /// once when it is idle).
    Drain(drain::Args),
    /// Stream farm events (jobs, tasks, workers) as they happen, one line
    /// each; with --json one JSON object a line (NDJSON).
    Events(events::Args),
    /// Watch the farm live: workers, GPUs, jobs, tiles, cost; pause, cancel, drain.
    Monitor(monitor::Args),
    /// Run a whole farm on this machine on a sample scene.
    Demo(demo::Args),
}

impl Command {
    /// The coordinator or a worker, running (not one of their admin
    /// subcommands): long-lived, logs at info.
    pub(crate) fn is_server(&self) -> bool {
        matches!(
            self,
            Command::Coordinator(coordinator::Args { admin: None, .. })
                | Command::Worker(worker::Args { admin: None, .. })
        )
    }

    /// The monitor owns the terminal.
    pub(crate) fn is_monitor(&self) -> bool {
        matches!(self, Command::Monitor(_))
    }

    /// A command that starts processes and writes to their pipes (where
    /// a closed pipe is an error to handle, not the end of the output).
    pub(crate) fn owns_children(&self) -> bool {
        self.is_server()
            || matches!(
                self,
                Command::Demo(_) | Command::Fleet(_) | Command::Monitor(_)
            )
    }
}

/// Runs one command; its exit code on success.
pub(crate) async fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Coordinator(args) => coordinator::run(args).await,
        Command::Worker(args) => worker::run(args).await,
        Command::Submit(args) => submit::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Wait(args) => wait::run(args).await,
        Command::Logs(args) => logs::run(args).await,
        Command::Retry(args) => retry::run(args).await,
        Command::Cancel(args) => cancel::run(args).await,
        Command::Fleet(args) => fleet::run(args).await,
        Command::Blender(args) => blender::run(args).await,
        Command::Gc(args) => gc::run(args).await,
        Command::Pause(args) => pause::run(args).await,
        Command::Resume(args) => resume::run(args).await,
        Command::Priority(args) => priority::run(args).await,
        Command::Drain(args) => drain::run(args).await,
        Command::Events(args) => events::run(args).await,
        Command::Monitor(args) => monitor::run(args).await,
        Command::Demo(args) => demo::run(args).await,
    }
}

pub(crate) async fn pause(job: u64, ticket: TicketArg, paused: bool) -> anyhow::Result<i32> {
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    client.pause(job, paused).await?;
    println!("job {job} {}", if paused { "paused" } else { "resumed" });
    Ok(0)
}

/// Follows `jobs` to their end and prints how each ended (one JSON
/// object with `--json`: the job's, or `{"jobs": [...]}` for several).
pub(crate) async fn finish_wait(
    ticket: &tessera_protocol::ticket::Ticket,
    client: Client,
    jobs: &[u64],
    opts: &follow::WaitOptions,
    json: bool,
    warnings: Option<&[String]>,
) -> anyhow::Result<i32> {
    let waited = follow::wait(ticket, Some(client), jobs, opts).await?;
    report::print_waited(&waited, warnings, json, opts.timeout);
    Ok(waited.exit_code())
}
