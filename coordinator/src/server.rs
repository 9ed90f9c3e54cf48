//! The coordinator's wiring: opens the data dir, restores the farm core from
//! the database, starts the dispatcher, the group-commit thread, garbage
//! collection and the QUIC accept loop, and stops every one of them on
//! shutdown.
//!
//! The farm core lives in [`Shared`] under a std mutex that is never held
//! across an `.await`; [`Shared::act`] runs the core and carries out the
//! effects it returns. Connections hold a channel to their worker, not a
//! socket.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use tessera_protocol::blob::BlobDir;
use tessera_protocol::messages::{
    CoordMsg, FarmEvent, JobStatus, Snapshot, StitchedPasses, WorkerInfo,
};
use tessera_protocol::store::Verified;
use tessera_protocol::ticket::Ticket;
use tessera_protocol::transport::{self, Identity, Timing};
use tokio::sync::{broadcast, mpsc, Notify};
use tokio::task::JoinSet;

use crate::commit::{self, CommitMsg};
pub use crate::config::{Config, HttpListen, Webhook};
use crate::db::{Db, StoredJob};
use crate::farm::{Effect, FarmConfig, FarmCore, Now, RestoredJob};
use crate::identity::{self, Identities};
use crate::scheduler::{self, WorkerId};
use crate::stitcher::StitchMsg;
use crate::{conn, data_dir, dispatch, gc, stitcher, upkeep};

/// The core and the channels its effects go to, under one lock.
pub(crate) struct Locked {
    pub core: FarmCore,
    /// Each connected worker's control-stream writer.
    pub outbox: HashMap<WorkerId, mpsc::UnboundedSender<CoordMsg>>,
}

/// Everything the coordinator's tasks share.
pub(crate) struct Shared {
    state: Mutex<Locked>,
    db: Mutex<Db>,
    /// The asset store: every blob it is given or reads is hashed.
    pub store: Verified<BlobDir>,
    pub wake: Notify,
    start: Instant,
    pub config: Config,
    /// The tickets' secrets and the enrolled workers' connections.
    pub identities: Identities,
    /// The address and certificate fingerprint tickets name.
    pub advertised: SocketAddr,
    pub fingerprint: String,
    commits: mpsc::UnboundedSender<CommitMsg>,
    stitches: mpsc::UnboundedSender<StitchMsg>,
    events: broadcast::Sender<(u64, FarmEvent)>,
    /// Held by garbage collection and by each submit: a job's blobs are
    /// either seen as referenced by a collection or submitted after it.
    pub gc: Mutex<()>,
    /// What workers may fetch of the recorded Blender builds.
    pub build_digests: conn::fetch::BuildDigests,
    /// Farm scans handed to workers and not yet answered.
    pub scans: crate::conn::scan::Scans,
    /// What `/metrics` counts since the start.
    pub metrics: crate::http::metrics::Counters,
}

/// Locks `mutex`, recovering it if a thread panicked while holding it: a
/// panic in one connection's handler ends that connection (tokio catches
/// it), and the farm goes on with the state as the handler left it rather
/// than failing every later request on a poisoned lock.
pub(crate) fn relock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| {
        tracing::error!("a task panicked while holding a lock; carrying on");
        mutex.clear_poison();
        poisoned.into_inner()
    })
}

/// Milliseconds since the Unix epoch, from the wall clock.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Shared {
    /// The time now: the only place the coordinator's core time comes from.
    pub fn now(&self) -> Now {
        Now {
            ms: self.start.elapsed().as_millis() as u64,
            unix_ms: unix_ms(),
        }
    }

    pub fn events(&self) -> broadcast::Receiver<(u64, FarmEvent)> {
        self.events.subscribe()
    }

    pub fn db(&self) -> std::sync::MutexGuard<'_, Db> {
        relock(&self.db)
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Locked> {
        relock(&self.state)
    }

    /// Reads the core (no effects).
    pub fn read<R>(&self, f: impl FnOnce(&FarmCore, Now) -> R) -> R {
        let now = self.now();
        f(&self.locked().core, now)
    }

    /// A worker joined: the core names it, and its control-stream writer is
    /// registered before the core's first message to it goes out.
    pub fn join_worker(
        self: &Arc<Self>,
        tx: mpsc::UnboundedSender<CoordMsg>,
        name: &str,
        identity: &str,
        info: WorkerInfo,
    ) -> WorkerId {
        let (id, recorded) = self.locked_act(|locked, now| {
            let id = locked.core.worker_joined(name, identity, info, now);
            locked.outbox.insert(id, tx);
            id
        });
        log_failure(recorded);
        id
    }

    /// Runs `f` on the core and carries out the effects it left (see
    /// [`Shared::locked_act`]), logging a failure to record a job state.
    pub fn update<R>(self: &Arc<Self>, f: impl FnOnce(&mut FarmCore, Now) -> R) -> R {
        let (value, recorded) = self.act(f);
        log_failure(recorded);
        value
    }

    /// Runs `f` on the core and carries out the effects it left; returns
    /// `f`'s value and the first failure to record a job state.
    pub fn act<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut FarmCore, Now) -> R,
    ) -> (R, anyhow::Result<()>) {
        self.locked_act(|locked, now| f(&mut locked.core, now))
    }

    /// Runs `f` under the lock, then carries out the core's effects:
    /// messages and events at once under the lock (so their order is the
    /// core's), the rest (stitches, database records) after it.
    fn locked_act<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Locked, Now) -> R,
    ) -> (R, anyhow::Result<()>) {
        let now = self.now();
        let (value, later) = {
            let mut locked = self.locked();
            let value = f(&mut locked, now);
            let mut later = Vec::new();
            for effect in locked.core.take_effects() {
                match effect {
                    Effect::Send { worker, msg } => {
                        if let Some(tx) = locked.outbox.get(&worker) {
                            let _ = tx.send(msg);
                        }
                    }
                    // Nobody listening is fine; a slow listener lags, never
                    // blocks.
                    Effect::Event { unix_ms, event } => {
                        if let FarmEvent::TaskFailed { .. } = event {
                            (self.metrics.task_failures)
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        let _ = self.events.send((unix_ms, event));
                    }
                    Effect::Commit(result) => {
                        let _ = self.commits.send(CommitMsg::Result(result));
                    }
                    // Through the commit thread, in order with the results.
                    Effect::Leased { task, identity } => {
                        let _ = self.commits.send(CommitMsg::Lease(task, identity));
                    }
                    Effect::Withdraw { job, tasks, frames } => {
                        let _ = self
                            .commits
                            .send(CommitMsg::Withdraw { job, tasks, frames });
                    }
                    Effect::Wake => self.wake.notify_one(),
                    other => later.push(other),
                }
            }
            (value, later)
        };
        (value, self.carry_out(later))
    }

    /// A job's status: from the core while it is active, from the database
    /// once it is finished. `None` when there is no such job.
    pub fn job_status(&self, id: u64) -> anyhow::Result<Option<JobStatus>> {
        if let Some(status) = self.read(|core, now| core.job_status(id, now)) {
            return Ok(Some(status));
        }
        let db = self.db();
        let Some(job) = db.job(id)? else {
            return Ok(None);
        };
        let mut status = job.status();
        status.verification = db.verification(id)?;
        Ok(Some(status))
    }

    /// Every active job, workers and farm figures, with at most
    /// `finished` finished jobs (newest) read from the database.
    pub fn snapshot(&self, finished: u32) -> anyhow::Result<Snapshot> {
        let mut snapshot = self.read(|core, now| core.snapshot(now));
        let done = self.db().finished_jobs(finished)?;
        snapshot.jobs.extend(done.iter().map(StoredJob::status));
        snapshot.jobs.sort_by_key(|j| j.id);
        snapshot.jobs.dedup_by_key(|j| j.id);
        Ok(snapshot)
    }

    /// Counts frame bytes an HTTP client downloaded.
    pub fn http_bytes_out(&self, bytes: u64) {
        (self.metrics.http_bytes_out).fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sends `msg` to worker `id`; false when it is not connected.
    pub fn send_to_worker(&self, id: WorkerId, msg: CoordMsg) -> bool {
        (self.locked().outbox.get(&id)).is_some_and(|tx| tx.send(msg).is_ok())
    }

    /// Forgets a worker's writer once it has left.
    pub fn forget_outbox(&self, id: WorkerId) {
        self.locked().outbox.remove(&id);
    }

    fn carry_out(self: &Arc<Self>, effects: Vec<Effect>) -> anyhow::Result<()> {
        let mut first_error = Ok(());
        for effect in effects {
            match effect {
                Effect::Stitch { job, frame_pos } => {
                    let _ = self.stitches.send(StitchMsg::Frame { job, frame_pos });
                }
                Effect::Record {
                    job,
                    state,
                    unix_ms,
                    error,
                    cost_usd,
                    counts,
                    verification,
                } => {
                    let mut db = self.db();
                    let recorded = db
                        .finish_job(job, state, unix_ms, error.as_deref(), cost_usd, counts)
                        .and_then(|()| match &verification {
                            Some(v) => db.set_verification(job, v),
                            None => Ok(()),
                        })
                        .with_context(|| format!("cannot record job {job} as {}", state.name()));
                    drop(db);
                    if let Err(e) = recorded {
                        if first_error.is_ok() {
                            first_error = Err(e);
                        }
                    }
                }
                Effect::Holds {
                    job,
                    paused,
                    released,
                } => {
                    let recorded = (self.db().set_holds(job, paused, released))
                        .with_context(|| format!("cannot record the pause of job {job}"));
                    if let Err(e) = recorded {
                        if first_error.is_ok() {
                            first_error = Err(e);
                        }
                    }
                }
                Effect::Quarantine {
                    identity,
                    name,
                    reason,
                    unix_ms,
                } => {
                    let recorded = (self.db().quarantine(&identity, &name, &reason, unix_ms))
                        .with_context(|| format!("cannot record the quarantine of {name}"));
                    if let Err(e) = recorded {
                        if first_error.is_ok() {
                            first_error = Err(e);
                        }
                    }
                }
                _ => unreachable!("sent under the lock"),
            }
        }
        first_error
    }
}

fn log_failure(recorded: anyhow::Result<()>) {
    if let Err(e) = recorded {
        tracing::error!("{e:#}");
    }
}

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
    let (worker_ticket, client_ticket) =
        data_dir::write_tickets(dir, advertised, &identity.fingerprint())?;

    let mut db = Db::open(&dir.join("state.sqlite"))
        .with_context(|| format!("cannot open the database in {}", dir.display()))?;
    let generation = db.next_generation()?;
    identity::create_table(db.conn())?;
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
    let (commit_tx, commit_rx) = mpsc::unbounded_channel();
    let (stitch_tx, stitch_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        state: Mutex::new(Locked {
            core,
            outbox: HashMap::new(),
        }),
        db: Mutex::new(db),
        store,
        wake: Notify::new(),
        start: Instant::now(),
        config: config.clone(),
        identities: Identities::new(&worker_ticket, &client_ticket),
        advertised,
        fingerprint: identity.fingerprint(),
        commits: commit_tx,
        stitches: stitch_tx,
        events: broadcast::channel(4096).0,
        gc: Mutex::new(()),
        build_digests: Default::default(),
        scans: Default::default(),
        metrics: Default::default(),
    });
    restore(&shared)?;
    let builds = shared.db().builds()?;
    shared.update(|core, _| core.set_builds(builds));
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
    tasks.spawn(gc::every_hour(shared.clone()));
    tasks.spawn(upkeep::scrub(shared.clone(), config.scrub_bytes_per_sec));
    tasks.spawn(upkeep::checkpoint(shared.clone(), config.checkpoint_every));
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
                crate::http::tls(&identity)?,
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
        worker_ticket,
        client_ticket,
        endpoint,
        shared,
        tasks,
        committer,
        stitcher,
    })
}

impl Coordinator {
    /// Runs until `shutdown` resolves, then closes every connection, stops
    /// every task it started and lets the commit thread finish what it was
    /// given.
    pub async fn run_until(mut self, shutdown: impl std::future::Future<Output = ()>) {
        shutdown.await;
        self.endpoint
            .close(0u32.into(), b"coordinator shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(2), self.endpoint.wait_idle()).await;
        // Dropping the accept loop's set of connections aborts them too.
        self.tasks.shutdown().await;
        let _ = self.shared.commits.send(CommitMsg::Stop);
        let _ = self.shared.stitches.send(StitchMsg::Stop);
        let (committer, stitcher) = (self.committer, self.stitcher);
        let _ = tokio::task::spawn_blocking(move || (committer.join(), stitcher.join())).await;
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
