//! The handle every coordinator task shares: the farm core and the
//! workers' channels under one std mutex (never held across an `.await`),
//! the database under another, the blob store, the clock, and the inboxes
//! the core's effects go to. [`Shared::act`] runs the core and carries out
//! the effects it returns.
//!
//! A leaf: it names the types it holds and calls nothing of the modules
//! that use it (`server` builds it, `service`, `conn`, `http`, `commit`,
//! `stitcher`, `dispatch`, `webhook` … take it), so it is built without
//! sockets — the service's unit tests do.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use tessera_protocol::messages::{CoordMsg, FarmEvent, JobStatus, Snapshot, WorkerInfo};
use tessera_store::Backed;
use tessera_store::Verified;
use tokio::sync::{broadcast, mpsc, Notify};

use crate::commit::CommitMsg;
use crate::config::Config;
use crate::db::{Db, StoredJob};
use crate::farm::{Effect, FarmCore, Now};
use crate::identity::Identities;
use crate::scheduler::WorkerId;
use crate::stitcher::StitchMsg;

/// The core and the channels its effects go to, under one lock.
pub(crate) struct Locked {
    pub core: FarmCore,
    /// Each connected worker's control-stream writer.
    pub outbox: HashMap<WorkerId, mpsc::UnboundedSender<CoordMsg>>,
}

/// What the farm core tells of besides its events (see [`Effect::Blocked`]).
#[derive(Debug, Clone)]
pub(crate) enum Notice {
    /// A job was found blocked: its status at that moment.
    Blocked(Box<JobStatus>),
    BudgetReached(Box<JobStatus>),
    /// A job ended: its final status.
    Ended(Box<JobStatus>),
}

/// Everything the coordinator's tasks share.
pub(crate) struct Shared {
    state: Mutex<Locked>,
    db: Mutex<Db>,
    /// The asset store: every blob it is given or reads is hashed.
    pub store: Verified<Backed>,
    pub wake: Notify,
    start: Instant,
    pub config: Config,
    /// The tickets' secrets and the enrolled workers' connections.
    pub identities: Identities,
    /// The certificate fingerprint tickets name (their addresses are
    /// the lease's).
    pub fingerprint: String,
    /// The group-commit thread's and the stitch thread's inboxes.
    pub(crate) commits: mpsc::UnboundedSender<CommitMsg>,
    pub(crate) stitches: mpsc::UnboundedSender<StitchMsg>,
    events: broadcast::Sender<(u64, FarmEvent)>,
    /// Jobs newly blocked, and budgets reached: what webhooks tell of.
    notices: broadcast::Sender<Notice>,
    /// Held by garbage collection and by each submit: a job's blobs are
    /// either seen as referenced by a collection or submitted after it.
    pub gc: Mutex<()>,
    /// What workers may fetch of the recorded Blender builds.
    pub build_digests: crate::conn::fetch::BuildDigests,
    /// Farm scans handed to workers and not yet answered.
    pub scans: crate::conn::scan::Scans,
    /// What `/metrics` counts since the start.
    pub metrics: crate::http::metrics::Counters,
    /// Blocking calls on runtime threads, stalls, heartbeat gaps.
    pub watch: crate::watch::Watch,
    /// The dashboard's signed-in sessions (ended by `rotate-tickets`).
    pub sessions: crate::http::session::Sessions,
    /// Previews being made (one at a time).
    pub previews: crate::http::preview::Previews,
    /// The latest fleet report and when it came (unix ms).
    pub fleet: Mutex<Option<(u64, tessera_protocol::messages::FleetReport)>>,
    /// This coordinator's hold on the farm: while it is not valid, nothing
    /// is dispatched (see `lease.rs`).
    pub lease: Arc<crate::lease::Lease>,
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
    /// The handle around a restored farm core and an open database; the
    /// receivers are the commit and stitch threads' inboxes, for the
    /// caller to start them on (tests may read them instead).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        core: FarmCore,
        db: Db,
        store: Verified<Backed>,
        config: Config,
        identities: Identities,
        advertised: SocketAddr,
        fingerprint: String,
    ) -> (
        Shared,
        mpsc::UnboundedReceiver<CommitMsg>,
        mpsc::UnboundedReceiver<StitchMsg>,
    ) {
        let (commits, commit_rx) = mpsc::unbounded_channel();
        let (stitches, stitch_rx) = mpsc::unbounded_channel();
        let shared = Shared {
            state: Mutex::new(Locked {
                core,
                outbox: HashMap::new(),
            }),
            db: Mutex::new(db),
            store,
            wake: Notify::new(),
            start: Instant::now(),
            config,
            identities,
            fingerprint,
            commits,
            stitches,
            events: broadcast::channel(4096).0,
            notices: broadcast::channel(4096).0,
            gc: Mutex::new(()),
            build_digests: Default::default(),
            scans: Default::default(),
            metrics: Default::default(),
            watch: Default::default(),
            sessions: Default::default(),
            previews: Default::default(),
            fleet: Default::default(),
            lease: Arc::new(crate::lease::Lease::sole(advertised)),
        };
        (shared, commit_rx, stitch_rx)
    }

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

    pub fn notices(&self) -> broadcast::Receiver<Notice> {
        self.notices.subscribe()
    }

    /// The database. Never on a runtime thread: async code reaches it
    /// through [`Shared::blocking`] (a call from a runtime thread is
    /// counted and logged with its place, see [`crate::watch`]).
    #[track_caller]
    pub fn db(&self) -> std::sync::MutexGuard<'_, Db> {
        self.watch.must_not_block("the database");
        relock(&self.db)
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Locked> {
        relock(&self.state)
    }

    /// Runs `f` on the blocking pool and waits for it: how async code
    /// reaches the database, the blob store's files, or a core change that
    /// may record a job's end — never on a runtime thread, where a slow
    /// disk would stall every connection (ARCHITECTURE.md, Threads).
    pub async fn blocking<R: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Arc<Shared>) -> R + Send + 'static,
    ) -> anyhow::Result<R> {
        let shared = self.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| anyhow::anyhow!("a blocking task failed: {e}"))
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
                    Effect::Blocked { status, .. } => {
                        let _ = self.notices.send(Notice::Blocked(status));
                    }
                    Effect::Ended { status } => {
                        let _ = self.notices.send(Notice::Ended(status));
                    }
                    Effect::BudgetReached { status } => {
                        let _ = self.notices.send(Notice::BudgetReached(status));
                    }
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
                Effect::Priority { job, priority } => {
                    let recorded = (self.db().set_priority(job, priority))
                        .with_context(|| format!("cannot record the priority of job {job}"));
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
                Effect::ResolveInputs { job, input } => {
                    // The database's lock is let go before the core's is taken.
                    let inputs = crate::encode::inputs(&self.db(), input);
                    self.update(|core, now| core.inputs_resolved(job, inputs, now));
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
