//! `tessera blender`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub command: BlenderCommand,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { command } = args;
    blender_command(command).await
}

#[derive(Subcommand)]
pub(crate) enum BlenderCommand {
    /// Store an official Blender build on the coordinator: an unpacked
    /// folder, a `bpy` wheel (.whl) or a Linux tarball (.tar.xz). Its files
    /// are uploaded like scene files, so the next point release sends only
    /// what changed.
    Add {
        path: PathBuf,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
    /// The builds the coordinator holds.
    List {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

pub(crate) async fn blender_command(command: BlenderCommand) -> anyhow::Result<i32> {
    match command {
        BlenderCommand::Add { path, json, ticket } => {
            let ticket = ticket.resolve()?;
            let mut client = Client::connect(&ticket).await?;
            let added =
                build::add(&mut client, &path, !json && std::io::stderr().is_terminal()).await?;
            report::print_build_added(&added, json);
        }
        BlenderCommand::List { json, ticket } => {
            let ticket = ticket.resolve()?;
            let mut client = Client::connect(&ticket).await?;
            report::print_builds(&build::list(&mut client).await?, json);
        }
    }
    Ok(0)
}
