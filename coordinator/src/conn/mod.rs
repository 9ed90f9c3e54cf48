//! Connections: the accept loop, and one task per connection — the
//! handshake ([`handshake`]), then a worker session ([`worker`]) or a client
//! session ([`client`], with the monitor's [`feed`]), and blob streams
//! ([`blob`]) beside either.

mod blob;
pub(crate) mod client;
mod feed;
pub(crate) mod fetch;
mod gate;
mod handshake;
pub(crate) mod scan;
mod worker;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tessera_protocol::messages::{CoordMsg, Role};
use tokio::task::JoinSet;

use crate::identity::{self, Admission};
use crate::server::Shared;
use gate::{Gate, Pass};
use handshake::Admitted;

/// Accepts connections until its task is aborted; aborting it aborts every
/// connection it started.
pub(crate) async fn accept(shared: Arc<Shared>, endpoint: quinn::Endpoint) {
    let mut connections = JoinSet::new();
    let gate = Arc::new(Gate::default());
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let Some(pass) = gate.enter(incoming.remote_address().ip()) else {
                    tracing::debug!(peer = %incoming.remote_address(), "refused: too many unauthenticated connections");
                    incoming.refuse();
                    continue;
                };
                let shared = shared.clone();
                connections.spawn(async move {
                    if let Err(e) = serve_connection(shared, incoming, pass).await {
                        tracing::debug!("connection ended: {e:#}");
                    }
                });
            }
            // Reap finished connections so the set holds live ones only.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    connections.shutdown().await;
}

async fn serve_connection(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    pass: Pass,
) -> anyhow::Result<()> {
    let admitted = handshake::handshake(&shared, incoming).await;
    drop(pass);
    let Some(Admitted {
        conn,
        admission,
        name,
        mut control,
    }) = admitted?
    else {
        return Ok(());
    };
    // An enrolled worker is known by its identity (and its enrolled name);
    // one with the shared ticket is enrolled now and told its credential.
    let (role, name, identity) = match admission {
        Admission::Client => (Role::Client, name, None),
        Admission::Enrolled { id, name } => (Role::Worker, name, Some(id)),
        Admission::Enroll => {
            let credential = {
                let db = shared.db();
                identity::enroll(db.conn(), &name, crate::server::unix_ms())?
            };
            tracing::info!(%name, identity = %credential.id, "worker enrolled");
            control
                .send(&CoordMsg::Enrolled {
                    credential: credential.line,
                })
                .await?;
            (Role::Worker, name, Some(credential.id))
        }
    };
    let _registered = identity
        .as_deref()
        .map(|id| shared.identities.register(id, conn.clone()));
    let uploaded = Arc::new(AtomicU64::new(0));
    let fetch = Arc::new(match role {
        Role::Worker => fetch::Fetch::worker(),
        Role::Client => fetch::Fetch::client(),
    });
    // Blob streams run beside the session, in this same task, until the
    // peer closes the connection.
    let streams = blob::serve_streams(
        shared.clone(),
        conn.clone(),
        uploaded.clone(),
        fetch.clone(),
    );
    let session = async {
        match role {
            Role::Worker => {
                // Every worker is enrolled by now; its identity is what the
                // farm trusts it by.
                let identity = identity.clone().unwrap_or_else(|| name.clone());
                worker::serve(
                    shared.clone(),
                    conn.clone(),
                    control,
                    name,
                    identity,
                    fetch.clone(),
                )
                .await
            }
            Role::Client => client::serve(shared.clone(), control, uploaded.clone()).await,
        }
    };
    let (result, ()) = tokio::join!(session, streams);
    result
}
