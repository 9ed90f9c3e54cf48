//! `tessera demo`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long, default_value_t = 3)]
    pub workers: u32,
    #[arg(long, default_value = "tessera-demo")]
    pub output: PathBuf,
    /// Split each frame into COLSxROWS tiles.
    #[arg(long, default_value = "4x4")]
    pub tiles: TileGrid,
    /// Use the builtin engine even when Blender is installed.
    #[arg(long)]
    pub builtin: bool,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        workers,
        output,
        tiles,
        builtin,
    } = args;
    crate::demo::run(workers.max(1), &output, tiles, builtin).await
}
