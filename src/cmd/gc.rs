//! `tessera gc`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { json, ticket } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let c = client.collect_garbage().await?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "removed_blobs": c.removed_blobs,
                "removed_bytes": c.removed_bytes,
                "kept_blobs": c.kept_blobs,
                "kept_bytes": c.kept_bytes,
            })
        );
    } else {
        println!(
            "removed {} blobs ({}), kept {} ({})",
            c.removed_blobs,
            progress::human_bytes(c.removed_bytes),
            c.kept_blobs,
            progress::human_bytes(c.kept_bytes)
        );
    }
    Ok(0)
}
