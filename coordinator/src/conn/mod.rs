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
use std::time::Instant;

use tessera_protocol::messages::{CoordMsg, Role};
use tokio::task::JoinSet;

use crate::identity::{self, Admission};
use crate::server::Shared;
use gate::{Entry, Gate, Pass};
use handshake::Admitted;

/// The environment variable that turns address validation off (any value),
/// for the benchmark's side-by-side run of the old behaviour only.
pub const NO_ADDRESS_VALIDATION: &str = "TESSERA_BENCH_NO_ADDRESS_VALIDATION";

/// Accepts connections until its task is aborted; aborting it aborts every
/// connection it started.
pub(crate) async fn accept(shared: Arc<Shared>, endpoint: quinn::Endpoint) {
    let mut connections = JoinSet::new();
    let gate = Arc::new(if std::env::var_os(NO_ADDRESS_VALIDATION).is_some() {
        tracing::warn!("{NO_ADDRESS_VALIDATION} is set: no address is validated with QUIC Retry");
        Gate::without_validation()
    } else {
        Gate::default()
    });
    let mut pressure = Pressure::default();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => {
                let Some(incoming) = incoming else { break };
                let peer = incoming.remote_address();
                let validated = incoming.remote_address_validated();
                let pass = match gate.enter(peer.ip(), validated, Instant::now()) {
                    Entry::Pass(pass) => pass,
                    Entry::Retry(why) => {
                        pressure.retried(&gate);
                        tracing::debug!(%peer, "address validation: Retry sent ({why})");
                        // A peer that has not proved its address may always
                        // be sent a Retry (quinn guarantees it); refuse
                        // should that ever change.
                        if let Err(e) = incoming.retry() {
                            e.into_incoming().refuse();
                        }
                        continue;
                    }
                    Entry::Refuse => {
                        tracing::debug!(%peer, "refused: too many unauthenticated connections");
                        incoming.refuse();
                        continue;
                    }
                };
                pressure.check(&gate);
                tracing::debug!(%peer, validated, "pre-auth place taken");
                let shared = shared.clone();
                connections.spawn(async move {
                    if let Err(e) = serve_connection(shared, incoming, pass).await {
                        tracing::debug!("connection ended: {e:#}");
                    }
                });
            }
            // Reap finished connections so the set holds live ones only.
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                (shared.metrics.connections_closed).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }
    connections.shutdown().await;
}

/// Tells the operator when the pre-auth places come under pressure and
/// when the pressure is over, with the Retries sent meanwhile.
#[derive(Default)]
struct Pressure {
    on: bool,
    retries: u64,
}

impl Pressure {
    fn retried(&mut self, gate: &Gate) {
        self.retries += 1;
        self.check(gate);
    }

    fn check(&mut self, gate: &Gate) {
        let on = gate.under_pressure();
        if on && !self.on {
            tracing::info!(
                held = gate.held(),
                max = gate::MAX_UNAUTHENTICATED,
                "pre-auth places under pressure: new peers must prove their address (QUIC Retry)"
            );
        } else if !on && self.on {
            tracing::info!(
                retries = self.retries,
                "pre-auth pressure over; Retries sent so far"
            );
        }
        self.on = on;
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    incoming: quinn::Incoming,
    pass: Pass,
) -> anyhow::Result<()> {
    let mut pass = Some(pass);
    let admitted = handshake::handshake(&shared, incoming, &mut pass).await;
    // A peer that did not get through must prove its address next time
    // (a refused one was marked before it was told).
    match (&admitted, pass) {
        (Ok(Some(_)), pass) => drop(pass),
        (Ok(None) | Err(_), Some(pass)) => pass.failed(Instant::now()),
        (_, None) => {}
    }
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
                let name = name.clone();
                shared
                    .blocking(move |s| {
                        identity::enroll(s.db().sql(), &name, crate::server::unix_ms())
                    })
                    .await??
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
    // Admitted as a worker or a client (a viewer never is, over QUIC).
    let is_worker = role == Role::Worker;
    let fetch = Arc::new(if is_worker {
        fetch::Fetch::worker()
    } else {
        fetch::Fetch::client()
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
        match is_worker {
            true => {
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
            false => client::serve(shared.clone(), control, uploaded.clone()).await,
        }
    };
    let (result, ()) = tokio::join!(session, streams);
    result
}
