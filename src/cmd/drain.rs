//! `tessera drain`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The worker's name or id (see `tessera status`); a name drains
    /// every connected worker of that name.
    pub worker: String,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args { worker, ticket } = args;
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let workers = client.workers().await?;
    let ids: Vec<(u64, String)> = match worker.parse::<u64>() {
        Ok(id) if !workers.iter().any(|w| w.name == worker) => {
            vec![(id, format!("{id}"))]
        }
        _ => (workers.iter())
            .filter(|w| w.name == worker)
            .map(|w| (w.id, format!("{} (id {})", shown::text(&w.name), w.id)))
            .collect(),
    };
    if ids.is_empty() {
        let names: Vec<String> = workers.iter().map(|w| shown::text(&w.name)).collect();
        anyhow::bail!(
            "no connected worker is named `{}` (connected: {})",
            shown::text(&worker),
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        );
    }
    for (id, shown) in ids {
        client.drain(id).await?;
        println!("worker {shown} is draining: it finishes its tasks, then leaves");
    }
    Ok(0)
}
