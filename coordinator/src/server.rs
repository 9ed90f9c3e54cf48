//! The coordinator's wiring: opens the data dir, restores the farm core from
//! the database, starts the dispatcher, the group-commit thread, garbage
//! collection and the QUIC accept loop, and stops every one of them on
//! shutdown.
//!
//! The handle every task shares, [`Shared`], lives in `shared.rs` (a leaf
//! module: it calls nothing of the modules that use it); it is re-exported
//! here for the modules that name it by this path.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tessera_protocol::messages::StitchedPasses;
use tessera_protocol::ticket::Ticket;
use tessera_store::blob::BlobDir;
use tessera_store::Verified;
use tessera_transport::{self as transport, Identity, Timing};
use tokio::task::JoinSet;

use crate::commit::{self, CommitMsg};
pub use crate::config::{Config, HttpCert, HttpListen, Webhook};
use crate::db::{Db, StoredJob};
use crate::farm::{FarmConfig, FarmCore, RestoredJob};
use crate::identity::Identities;
use crate::scheduler;
pub(crate) use crate::shared::{relock, unix_ms, Notice, Shared};
use crate::stitcher::StitchMsg;
use crate::{conn, data_dir, dispatch, gc, stitcher, upkeep};

/// A coordinator that is up and listening.
pub struct Coordinator {
    pub addr: SocketAddr,
    /// Where the HTTP API listens (TCP), when it was asked for.
    pub http_addr: Option<SocketAddr>,
    pub worker_ticket: Ticket,
    pub client_ticket: Ticket,
    endpoint: quinn::Endpoint,
    shared: Arc<Shared>,
    tasks: JoinSet<()>,
    committer: std::thread::JoinHandle<()>,
    stitcher: std::thread::JoinHandle<()>,
}

/// Opens the data dir (creating it, the certificate and the tickets on first
/// start), restores every job, and starts listening.
// Long because: the coordinator's start-up in order (data dir, identity,
// endpoints, tickets, database, store, farm core, threads and tasks);
// each step uses the ones before it and the order is the point.
pub async fn start(config: Config) -> anyhow::Result<Coordinator> {
    let dir = &config.data_dir;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the data dir {}", dir.display()))?;
    let identity = data_dir::load_identity(dir)?;
    let previous = data_dir::previous_worker_ticket(dir);

    let (endpoint, http) = bind_both(&config, &identity, previous).await?;
    let bound = endpoint.local_addr()?;
    let advertised = match config.advertise {
        Some(a) => a,
        None if bound.ip().is_unspecified() => {
            bail!("listening on {bound}: pass --advertise HOST:PORT so tickets name an address workers can reach")
        }
        None => bound,
    };
    let tickets = data_dir::write_tickets(dir, advertised, &identity.fingerprint(), false)?;

    let (state_dir, state_url) = (dir.clone(), config.state_url.clone());
    let (db, generation) = tokio::task::spawn_blocking(move || -> anyhow::Result<(Db, u64)> {
        let mut db = match &state_url {
            Some(url) => Db::connect(url).context("cannot open the state in PostgreSQL")?,
            None => Db::open(&state_dir.join("state.sqlite"))
                .with_context(|| format!("cannot open the database in {}", state_dir.display()))?,
        };
        let generation = db.next_generation()?;
        Ok((db, generation))
    })
    .await??;
    let store = Verified::new(BlobDir::open_durable(dir.join("blobs"))?);
    let core = FarmCore::new(FarmConfig {
        scheduler: scheduler::Config {
            lease_ms: config.lease_ms,
            max_attempts: config.max_attempts,
            first_epoch: generation << 32,
            retry_backoff_ms: config.retry_backoff_ms,
            straggler_percent: config.straggler_percent,
        },
        cache_affinity: config.cache_affinity,
        pipelining: config.pipelining,
        heartbeat_ms: config.heartbeat_ms,
        lease_ms: config.lease_ms,
    });
    let (shared, commit_rx, stitch_rx) = Shared::new(
        core,
        db,
        store,
        config.clone(),
        Identities::new(&tickets),
        advertised,
        identity.fingerprint(),
    );
    let shared = Arc::new(shared);
    // The database is read on the blocking pool, as everywhere (see
    // `Shared::blocking`).
    shared
        .blocking(|shared| -> anyhow::Result<()> {
            restore(shared)?;
            let builds = shared.db().builds()?;
            shared.update(|core, _| core.set_builds(builds));
            shared.build_digests.reload(shared)
        })
        .await??;
    let committer = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("commit".into())
            .spawn(move || commit::committer(shared, commit_rx))?
    };
    let stitcher = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("stitch".into())
            .spawn(move || stitcher::stitcher(shared, stitch_rx))?
    };
    let mut tasks = JoinSet::new();
    tasks.spawn(dispatch::dispatcher(shared.clone()));
    {
        let shared = shared.clone();
        tasks.spawn(async move { shared.watch.stall_ticker().await });
    }
    tasks.spawn(gc::every_hour(shared.clone()));
    tasks.spawn(upkeep::scrub(shared.clone(), config.scrub_bytes_per_sec));
    tasks.spawn(upkeep::checkpoint(shared.clone(), config.checkpoint_every));
    tasks.spawn(upkeep::trim_memory(shared.clone()));
    tasks.spawn(conn::accept(shared.clone(), endpoint.clone()));
    let http_addr = match http {
        Some(listener) => {
            let addr = listener.local_addr()?;
            let url = format!(
                "https://{}",
                match config.http {
                    Some(HttpListen::SamePort) => advertised,
                    _ => addr,
                }
            );
            std::fs::write(dir.join("http.url"), format!("{url}\n"))
                .with_context(|| format!("cannot write {}", dir.join("http.url").display()))?;
            tasks.spawn(crate::http::serve(
                shared.clone(),
                listener,
                crate::http::tls(&identity, config.http_cert.as_ref())?,
            ));
            tracing::info!(%addr, %url, "http api listening");
            Some(addr)
        }
        None => {
            let _ = std::fs::remove_file(dir.join("http.url"));
            None
        }
    };
    if let Some(hook) = &config.webhook {
        tasks.spawn(crate::webhook::deliver(shared.clone(), hook.clone()));
    }
    tracing::info!(%bound, %advertised, "coordinator listening");
    Ok(Coordinator {
        http_addr,
        addr: bound,
        worker_ticket: tickets.worker,
        client_ticket: tickets.client,
        endpoint,
        shared,
        tasks,
        committer,
        stitcher,
    })
}

/// How long a coordinator asked to stop (SIGTERM) may take to end.
pub const SHUTDOWN_WITHIN: Duration = Duration::from_millis(1500);

impl Coordinator {
    /// Runs until `shutdown` resolves, then closes every connection, stops
    /// every task it started and gives the commit and stitch threads what
    /// is left of [`SHUTDOWN_WITHIN`] to finish what they were given. Each
    /// step is bounded, so a busy coordinator still ends in time: a result
    /// is acknowledged only once committed, so nothing acknowledged is
    /// lost, and a frame not yet stitched is stitched at the next start.
    pub async fn run_until(mut self, shutdown: impl std::future::Future<Output = ()>) {
        shutdown.await;
        let deadline = tokio::time::Instant::now() + SHUTDOWN_WITHIN;
        // The workers leave because the coordinator does: no job is
        // blocked by that (no `job.blocked` webhook), no work goes out.
        self.shared.update(|core, _| core.stop());
        self.endpoint
            .close(0u32.into(), b"coordinator shutting down");
        let step = |share: u32| {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            left / share
        };
        let _ = tokio::time::timeout(step(4), self.endpoint.wait_idle()).await;
        // Dropping the accept loop's set of connections aborts them too.
        let _ = tokio::time::timeout(step(3), self.tasks.shutdown()).await;
        let _ = self.shared.commits.send(CommitMsg::Stop);
        let _ = self.shared.stitches.send(StitchMsg::Stop);
        let (committer, stitcher) = (self.committer, self.stitcher);
        let joined = tokio::task::spawn_blocking(move || (committer.join(), stitcher.join()));
        if tokio::time::timeout(step(1), joined).await.is_err() {
            tracing::warn!(
                "shutting down with the commit or stitch thread still at work: results not yet \
                 committed were not acknowledged (their workers send them again), frames not \
                 yet stitched are stitched at the next start"
            );
        }
    }
}

/// The QUIC endpoint on `config.listen`. Asked for any port, it takes the
/// previous run's port when it can, so workers holding the old ticket find
/// the coordinator again after a restart.
fn bind(
    config: &Config,
    identity: &Identity,
    previous: Option<Ticket>,
) -> anyhow::Result<quinn::Endpoint> {
    if config.listen.port() == 0 {
        if let Some(prev) = &previous {
            let addr = SocketAddr::new(config.listen.ip(), prev.addr.port());
            if let Ok(e) = transport::server_endpoint(addr, identity, Timing::default()) {
                return Ok(e);
            }
        }
    }
    Ok(transport::server_endpoint(
        config.listen,
        identity,
        Timing::default(),
    )?)
}

/// The QUIC endpoint and, when asked for, the HTTP API's TCP listener. With
/// [`HttpListen::SamePort`] the API takes the QUIC port's number on TCP (so
/// the client ticket's address names both); a QUIC port picked at random
/// whose number is taken on TCP is picked again.
async fn bind_both(
    config: &Config,
    identity: &Identity,
    previous: Option<Ticket>,
) -> anyhow::Result<(quinn::Endpoint, Option<tokio::net::TcpListener>)> {
    let tcp = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen for HTTP on {addr} (TCP)"))
    };
    match config.http {
        None => Ok((bind(config, identity, previous)?, None)),
        Some(HttpListen::Addr(addr)) => {
            Ok((bind(config, identity, previous)?, Some(tcp(addr).await?)))
        }
        Some(HttpListen::SamePort) => {
            let mut previous = previous;
            for _ in 0..16 {
                let endpoint = bind(config, identity, previous.take())?;
                match tcp(endpoint.local_addr()?).await {
                    Ok(listener) => return Ok((endpoint, Some(listener))),
                    Err(e) if config.listen.port() != 0 => {
                        return Err(e.context("pass --http HOST:PORT to serve it elsewhere"))
                    }
                    Err(_) => endpoint.close(0u32.into(), b""),
                }
            }
            bail!("found no port free on both UDP and TCP for QUIC and the HTTP API")
        }
    }
}

/// A stored job as the farm core takes it back: its results, frames,
/// passes and open leases from the database.
pub(crate) fn restored_job(db: &Db, stored: StoredJob) -> anyhow::Result<RestoredJob> {
    let results = db.results(stored.id)?;
    let frames = db.frames(stored.id)?;
    let passes = db.passes(stored.id)?;
    let leases = db.open_leases(stored.id)?;
    Ok(RestoredJob {
        id: stored.id,
        spec: stored.spec,
        state: stored.state,
        error: stored.error,
        submitted_unix_ms: stored.submitted_ms,
        finished_unix_ms: stored.finished_ms,
        bytes_uploaded: stored.bytes_uploaded,
        bytes_deduplicated: stored.bytes_deduplicated,
        cost_usd: stored.cost_usd,
        results: results.iter().map(|r| (r.index, r.render_ms)).collect(),
        frames: frames.iter().map(|f| f.frame).collect(),
        passes: (passes.iter())
            .map(|p| {
                let passes = StitchedPasses {
                    digest: p.digest,
                    size: p.size,
                };
                (p.frame, passes)
            })
            .collect(),
        leases,
    })
}

/// Rebuilds the farm core from the database's unfinished jobs (finished
/// ones stay in the database) and asks for the frames whose tasks are all
/// done but which were not stitched yet.
fn restore(shared: &Arc<Shared>) -> anyhow::Result<()> {
    let mut restored = Vec::new();
    let mut linked = Vec::new();
    {
        let db = shared.db();
        for stored in db.unfinished_jobs()? {
            let holds = db.holds(stored.id)?;
            let mut after = Vec::new();
            for &dep in &stored.spec.after {
                if let Some(state) = db.job_state(dep)? {
                    after.push((dep, state));
                }
            }
            linked.push((stored.id, holds, after));
            restored.push(restored_job(&db, stored)?);
        }
    }
    let quarantined = shared.db().quarantined()?;
    shared.update(|core, now| {
        core.restore_quarantine(quarantined);
        // By id: a job runs only after older ones, so those it waits for
        // are back before it.
        for (job, (id, holds, after)) in restored.into_iter().zip(linked) {
            core.restore_job(job, now);
            if let Some((paused, released)) = holds {
                core.restore_holds(id, paused, released);
            }
            core.link_after(id, &after, now);
        }
        core.hold_for_rejoin(now);
    });
    Ok(())
}
