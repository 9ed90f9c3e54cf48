//! The coordinator's wiring: opens the data dir, restores the farm core from
//! the database, starts the dispatcher, the group-commit thread, garbage
//! collection and the QUIC accept loop, and stops every one of them on
//! shutdown.
//!
//! The handle every task shares, [`Shared`], lives in `shared.rs` (a leaf
//! module: it calls nothing of the modules that use it); it is re-exported
//! here for the modules that name it by this path.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tessera_protocol::messages::StitchedPasses;
use tessera_protocol::ticket::Ticket;
use tessera_store::blob::BlobDir;
use tessera_store::{Backed, Verified};
use tessera_transport::{self as transport, Identity, Timing};
use tokio::task::JoinSet;

use crate::commit::{self, CommitMsg};
pub use crate::config::{BlobsAt, Config, HttpCert, HttpListen, Webhook};
use crate::db::{Db, Holder, StoredJob};
use crate::farm::{FarmConfig, FarmCore, RestoredJob};
use crate::identity::Identities;
use crate::lease::{Lease, Me};
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
    lease: Arc<Lease>,
    keeper: Option<Keeper>,
    /// Held while it runs: no other coordinator starts on its data dir.
    _dir_lock: std::fs::File,
}

/// Why a coordinator stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It was told to.
    Asked,
    /// Another coordinator took the farm's lease over.
    LostLease(Option<Holder>),
}

/// Opens the data dir (creating it, the certificate and the tickets on first
/// start), restores every job, and starts listening.
// Long because: the coordinator's start-up in order (data dir, database
// and identity, store, endpoints, tickets and lease, farm core, threads and tasks);
// each step uses the ones before it and the order is the point.
pub async fn start(mut config: Config) -> anyhow::Result<Coordinator> {
    let dir = &config.data_dir.clone();
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the data dir {}", dir.display()))?;
    let dir_lock = data_dir::lock(dir)?;
    data_dir::remember(dir, &mut config.state_url, &mut config.blobs)?;
    if config.standby && config.state_url.is_none() {
        bail!("--standby takes over a farm whose state is in PostgreSQL: pass --state too");
    }
    let previous = data_dir::previous_worker_ticket(dir);

    let (state_dir, state_url) = (dir.clone(), config.state_url.clone());
    let (mut db, identity, secrets) =
        tokio::task::spawn_blocking(move || open_state(&state_dir, state_url.as_deref())).await??;
    // Before standing by: a standby whose bucket refuses it stops now, not
    // when it takes the farm over.
    let store = Verified::new(open_store(dir, config.blobs.as_ref(), config.standby).await?);
    let (endpoint, mut http) = bind_both(&config, &identity, previous).await?;
    let bound = endpoint.local_addr()?;
    let advertised = match config.advertise {
        Some(a) => a,
        None if bound.ip().is_unspecified() => {
            bail!("listening on {bound}: pass --advertise HOST:PORT so tickets name an address workers can reach")
        }
        None => bound,
    };
    let fingerprint = identity.fingerprint();
    let (db, generation, lease, keeper, tickets) = if db.is_postgres() {
        let me = Me {
            instance: crate::lease::process_instance(),
            addr: advertised,
        };
        // Tickets naming every coordinator, this one first, before it
        // waits: the active one's tickets name it from its next look.
        // A standby is named in tickets from now on; a coordinator that
        // is not one only once it holds the lease (one refused is never).
        let others = {
            let (d, a, standby) = (db, advertised.to_string(), config.standby);
            let (d, others) = tokio::task::spawn_blocking(move || {
                let registered = match standby {
                    true => d.register_coordinator(&a, 0),
                    false => Ok(()),
                };
                let others = registered
                    .and_then(|()| d.coordinator_addrs(tessera_protocol::ticket::MAX_ADDRS));
                (d, others)
            })
            .await?;
            db = d;
            others?
        };
        let waiting = Lease::sole(advertised);
        waiting.name_others(&others);
        let waiting_tickets =
            data_dir::write_tickets_for(dir, &waiting.addrs(), &fingerprint, secrets.clone())?;
        // Its HTTP port says it stands by (and its lease gauge, 0) until
        // it takes over; then the listener is the API's.
        let answering = match http.take() {
            Some(listener) => {
                let listener = Arc::new(listener);
                let bearers = crate::http::standby::Bearers {
                    client: waiting_tickets.client.secret.clone(),
                    viewer: waiting_tickets.viewer.secret.clone(),
                };
                let task = tokio::spawn(crate::http::standby::answer(
                    listener.clone(),
                    crate::http::tls(&identity, config.http_cert.as_ref())?,
                    Arc::new(bearers),
                ));
                Some((listener, task))
            }
            None => None,
        };
        // A standby refuses connections (clients and workers try the
        // ticket's other addresses) until it takes over.
        let refuser = {
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                while let Some(incoming) = endpoint.accept().await {
                    incoming.refuse();
                }
            })
        };
        let standby = config.standby;
        let (mut db, (generation, claimed), me, secrets) = tokio::task::spawn_blocking(move || {
            let taken = crate::lease::acquire(&mut db, &me, standby)?;
            // The secrets as they are now: tickets rotated while this one
            // stood by are the ones it serves with.
            let secrets = shared_ticket_secrets(&db)?;
            anyhow::Ok((db, taken, me, secrets))
        })
        .await??;
        refuser.abort();
        if let Some((listener, task)) = answering {
            task.abort();
            let _ = task.await;
            let listener = Arc::try_unwrap(listener)
                .map_err(|_| anyhow::anyhow!("the HTTP listener is still the standby's"))?;
            http = Some(listener);
        }
        db.set_fence(generation);
        tracing::info!(generation, "this coordinator holds the farm's lease");
        let lease = Arc::new(Lease::held(generation, claimed, advertised));
        lease.name_others(&others);
        let tickets = data_dir::write_tickets_for(dir, &lease.addrs(), &fingerprint, secrets)?;
        let keeper = start_keeper(&config, lease.clone(), me, &fingerprint)?;
        (db, generation, lease, Some(keeper), tickets)
    } else {
        let tickets = data_dir::write_tickets(dir, advertised, &fingerprint, false)?;
        let (db, generation) = tokio::task::spawn_blocking(move || {
            let generation = db.next_generation();
            generation.map(|g| (db, g))
        })
        .await??;
        let lease = Arc::new(Lease::sole(advertised));
        (db, generation, lease, None, tickets)
    };
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
        store_urls: store.inner().bucket().is_some(),
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
    let mut shared = shared;
    shared.lease = lease.clone();
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
    tasks.spawn(first_dispatch(shared.clone(), keeper.is_some()));
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
        lease,
        keeper,
        _dir_lock: dir_lock,
    })
}

/// Opens the state (SQLite in `dir`, or PostgreSQL at `url`) and the
/// identity tickets show: the certificate and the tickets' secrets, from
/// the data dir, or on a shared state those every coordinator of the farm
/// shares (the first one's, taken from its data dir when it has them).
fn open_state(dir: &Path, url: Option<&str>) -> anyhow::Result<(Db, Identity, [String; 3])> {
    let secrets = data_dir::ticket_secrets(dir, false);
    let Some(url) = url else {
        let db = Db::open(&dir.join("state.sqlite"))
            .with_context(|| format!("cannot open the database in {}", dir.display()))?;
        return Ok((db, data_dir::load_identity(dir)?, secrets));
    };
    let db = Db::connect(url).context("cannot open the state in PostgreSQL")?;
    let has_own = dir.join("coordinator.crt.der").exists();
    let local = match has_own {
        true => data_dir::load_identity(dir)?,
        false => Identity::generate()?,
    };
    let names = [
        "coordinator.crt.der",
        "coordinator.key.der",
        data_dir::SECRET_NAMES[0],
        data_dir::SECRET_NAMES[1],
        data_dir::SECRET_NAMES[2],
    ];
    let shared = db.shared_secrets(&names, |name| match name {
        "coordinator.crt.der" => local.cert_der.clone(),
        "coordinator.key.der" => local.key_der.clone(),
        n => {
            let role = data_dir::SECRET_NAMES.iter().position(|s| *s == n);
            role.map_or_else(Vec::new, |i| secrets[i].clone().into_bytes())
        }
    })?;
    let mut shared = shared.into_iter();
    let mut next = || shared.next().unwrap_or_default();
    let identity = Identity {
        cert_der: next(),
        key_der: next(),
    };
    let text = |b: Vec<u8>| String::from_utf8(b).context("a shared ticket secret is not text");
    let secrets = [text(next())?, text(next())?, text(next())?];
    Ok((db, identity, secrets))
}

/// Logs the first task this coordinator hands out, and how long after it
/// took the farm's lease (`shared`: after a failover, how long dispatch
/// stopped).
async fn first_dispatch(shared: Arc<Shared>, took_over: bool) {
    let began = std::time::Instant::now();
    let mut events = shared.events();
    loop {
        match events.recv().await {
            Ok((_, tessera_protocol::messages::FarmEvent::TaskStarted { job, index, .. })) => {
                let since_ms = began.elapsed().as_millis() as u64;
                tracing::info!(
                    job,
                    task = index,
                    since_ms,
                    took_over,
                    "first task handed out"
                );
                return;
            }
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// The tickets' secrets (worker, client, viewer) a shared state holds.
fn shared_ticket_secrets(db: &Db) -> anyhow::Result<[String; 3]> {
    let stored = db.shared_secrets(&data_dir::SECRET_NAMES, |_| {
        Ticket::new_secret().into_bytes()
    })?;
    let mut stored = stored.into_iter();
    let mut next = || {
        String::from_utf8(stored.next().unwrap_or_default())
            .context("a shared ticket secret is not text")
    };
    Ok([next()?, next()?, next()?])
}

/// The lease keeper's thread, and how to stop it.
struct Keeper {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Starts the thread that renews `lease` on a connection of its own and
/// rewrites the tickets when the farm's coordinators change.
fn start_keeper(
    config: &Config,
    lease: Arc<Lease>,
    me: Me,
    fingerprint: &str,
) -> anyhow::Result<Keeper> {
    let (dir, fingerprint) = (config.data_dir.clone(), fingerprint.to_string());
    let url = config
        .state_url
        .clone()
        .context("a lease needs a shared state")?;
    let (stop, stopped) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("lease".into())
        .spawn(move || {
            let rewrite = |addrs: &[SocketAddr]| {
                let secrets = data_dir::ticket_secrets(&dir, false);
                match data_dir::write_tickets_for(&dir, addrs, &fingerprint, secrets) {
                    Ok(_) => {
                        tracing::info!(?addrs, "tickets rewritten: the farm's coordinators changed")
                    }
                    Err(e) => tracing::warn!("cannot rewrite the tickets: {e:#}"),
                }
            };
            crate::lease::keep(lease, &url, me, rewrite, stopped);
        })?;
    Ok(Keeper { stop, thread })
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
    pub async fn run_until(mut self, shutdown: impl std::future::Future<Output = ()>) -> Stopped {
        let lost = async {
            while !self.lease.lost() {
                self.lease.lost_notify.notified().await;
            }
        };
        let stopped = tokio::select! {
            () = shutdown => Stopped::Asked,
            () = lost => Stopped::LostLease(self.lease.taker()),
        };
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
        // With a lease to end after them, they leave it a share.
        let share = if self.keeper.is_some() { 2 } else { 1 };
        if tokio::time::timeout(step(share), joined).await.is_err() {
            tracing::warn!(
                "shutting down with the commit or stitch thread still at work: results not yet \
                 committed were not acknowledged (their workers send them again), frames not \
                 yet stitched are stitched at the next start"
            );
        }
        // Last, with every commit done: the lease ends now, and a standby
        // takes over at its next look instead of waiting for it to run out.
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.stop.send(());
            let thread = keeper.thread;
            let ended = tokio::task::spawn_blocking(move || thread.join());
            let _ = tokio::time::timeout(step(1), ended).await;
        }
        if let Stopped::LostLease(taker) = &stopped {
            tracing::error!(
                taker = ?taker.as_ref().map(|t| (t.generation, &t.addr)),
                "stopped: another coordinator serves the farm now"
            );
        }
        stopped
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

/// The asset store: `DATA_DIR/blobs` or the folder `--blobs` names,
/// durable on its disk; or this machine's copy in `DATA_DIR/blobs` in front
/// of the bucket `--blobs` names, which is asked once here so that a wrong
/// endpoint or key stops the start with a clear error.
async fn open_store(dir: &Path, blobs: Option<&BlobsAt>, standby: bool) -> anyhow::Result<Backed> {
    let folder = |path: &Path, durable: bool| {
        let open = if durable {
            BlobDir::open_durable
        } else {
            BlobDir::open
        };
        open(path.to_path_buf())
            .with_context(|| format!("cannot open the asset store {}", path.display()))
    };
    match blobs {
        None => Ok(Backed::local(folder(&dir.join("blobs"), true)?)),
        Some(BlobsAt::Folder(path)) => Ok(Backed::local(folder(path, true)?)),
        Some(BlobsAt::Bucket(location)) => {
            let endpoint = tessera_store::s3::Endpoint::from_env().map_err(anyhow::Error::msg)?;
            let bucket = tessera_store::s3::Bucket::new(location.clone(), &endpoint)
                .map_err(anyhow::Error::msg)?;
            let probe = bucket.clone();
            let shown = endpoint.shown();
            match tokio::task::spawn_blocking(move || probe.list("blobs").map(|_| ())).await? {
                Ok(()) => {}
                // A standby that cannot reach it would take the farm over
                // unable to keep a result: it stands by only once it can.
                Err(e) if standby => bail!(
                    "the asset bucket {location} at {shown} is out of reach ({e}): a standby \
                     stands by only once it reaches its bucket"
                ),
                // Out of reach for now (a coordinator restarted during an
                // outage): serve, and wait for it where it is needed.
                Err(e) if e.transient => tracing::warn!(
                    %location,
                    endpoint = %shown,
                    "the asset bucket is out of reach for now ({e}); results wait for it"
                ),
                Err(e) => bail!(
                    "the asset bucket {location} at {shown} refused: {e} (check the bucket's \
                     name, AWS_REGION and the keys)"
                ),
            }
            tracing::info!(%location, endpoint = %shown, "assets in a bucket");
            Ok(Backed::with_bucket(
                folder(&dir.join("blobs"), false)?,
                bucket,
            ))
        }
    }
}
