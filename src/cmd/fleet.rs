//! `tessera fleet`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: FleetCommand,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { command } = args;
    match command {
        FleetCommand::Run {
            config,
            status_file,
            tick_ms,
            ticket,
        } => {
            let ticket = ticket.resolve()?;
            let mut client = Client::connect(&ticket).await?;
            let tick = std::time::Duration::from_millis(tick_ms.clamp(50, 60_000));
            crate::fleet::run(&config, &mut client, status_file.as_deref(), Some(tick)).await
        }
        FleetCommand::Plan {
            config,
            json,
            ticket,
        } => {
            let ticket = ticket.resolve()?;
            let mut client = Client::connect(&ticket).await?;
            crate::fleet::plan(&config, &mut client, json).await
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum FleetCommand {
    /// Rent, watch and release worker nodes for the queue, as the fleet
    /// file says, until SIGINT or SIGTERM (then every node is released).
    Run {
        /// The fleet file (TOML): providers, limits, the worker image.
        #[arg(long, default_value = "fleet.toml")]
        config: PathBuf,
        /// Write the fleet's nodes, billed cost and GPU-hours here (JSON),
        /// every tick.
        #[arg(long)]
        status_file: Option<PathBuf>,
        /// How often the fleet looks at the farm, milliseconds.
        #[arg(long, default_value_t = 1000, hide = true)]
        tick_ms: u64,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// A dry run: which offers the fleet would rent for the queue now, for
    /// how long, the estimated cost and finish time. Rents nothing.
    Plan {
        #[arg(long, default_value = "fleet.toml")]
        config: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}
