//! The farm core: everything the coordinator decides beyond the scheduler —
//! the job and worker tables, lease endings, job completion and failure,
//! pause, resume and cancel, blocked reasons and cost events — as a state
//! machine with no clock reads, no I/O and no locks.
//!
//! Events come in as method calls with the time passed in ([`Now`]); what
//! the outside world must do comes out as [`Effect`]s (messages to send,
//! results to commit, frames to stitch, job states to record), which the
//! async shell drains with [`FarmCore::take_effects`] and carries out in
//! order. Like `quinn-proto`, the core never reads a clock or touches a
//! socket, so its tests run on virtual time.

mod after;
mod blocked;
mod builds;
mod encode;
mod job;
mod jobs;
mod lost;
mod status;
#[cfg(test)]
mod tests;
mod verify;
mod workers;

use std::collections::{BTreeMap, HashMap, HashSet};

use lost::LostLeases;
pub use lost::{GONE_AFTER_MS, LOST_IN_A_ROW_FAILS};

use tessera_protocol::job::{JobSpec, OnBudget};
use tessera_protocol::messages::{
    CoordMsg, FarmEvent, JobState, JobStatus, StitchedPasses, TaskRef, WorkerInfo,
};
use tessera_protocol::telemetry::Telemetry;
use tessera_protocol::Digest;

pub(crate) use job::Job;
pub use jobs::{StitchPlan, StitchStage};

use crate::cost::Ledger;
use crate::scheduler::{self, Epoch, Millis, NewJob, Scheduler, TaskKey, WorkerId};

/// The time an event happens at, passed in by the caller: `ms` is the
/// scheduler's time base (milliseconds since this coordinator run started),
/// `unix_ms` the wall clock shown to people and stored in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub ms: Millis,
    pub unix_ms: u64,
}

/// What the core's settings are.
#[derive(Debug, Clone)]
pub struct FarmConfig {
    pub scheduler: scheduler::Config,
    pub cache_affinity: bool,
    /// Pipelined leases (see `Scheduler::set_pipelining`).
    pub pipelining: bool,
    pub heartbeat_ms: u64,
    pub lease_ms: u64,
    /// The assets are in an object store that workers may fetch from
    /// themselves (told in `Joined`).
    pub store_urls: bool,
}

/// A result the scheduler accepted, waiting for its commit.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptedResult {
    pub worker: WorkerId,
    pub worker_name: String,
    pub task: TaskRef,
    pub output: Digest,
    pub render_ms: u64,
}

/// Why a batch of accepted results was not committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitFailure {
    pub reason: String,
    /// The database could not be reached, or this coordinator no longer
    /// serves the farm: not the job's fault. Its tasks run again, and the
    /// job goes on.
    pub transient: bool,
}

impl CommitFailure {
    /// A failure that fails the jobs of the batch (a full disk).
    pub fn fatal(reason: impl Into<String>) -> CommitFailure {
        CommitFailure {
            reason: reason.into(),
            transient: false,
        }
    }
}

/// What the shell must do, in the order the core decided it.
#[derive(Debug, Clone)]
pub enum Effect {
    /// A message on a worker's control stream.
    Send { worker: WorkerId, msg: CoordMsg },
    /// An event for the monitor feed.
    Event { unix_ms: u64, event: FarmEvent },
    /// Make this result durable, then report with [`FarmCore::committed`].
    Commit(AcceptedResult),
    /// Every task of this frame is committed: stitch it, then report with
    /// [`FarmCore::frame_stitched`] (or [`FarmCore::fail_job`]).
    Stitch { job: u64, frame_pos: usize },
    /// Record a job's final state in the database, with its cost and
    /// counters: the core has forgotten it.
    Record {
        job: u64,
        state: JobState,
        unix_ms: u64,
        error: Option<String>,
        cost_usd: f64,
        counts: FinalCounts,
        /// A checked job's verification summary.
        verification: Option<tessera_protocol::messages::Verification>,
    },
    /// Something changed that may let the dispatcher hand out work.
    Wake,
    /// A live job is blocked, first time this run (the reason is in its
    /// status): for the `job.blocked` webhook.
    Blocked { job: u64, status: Box<JobStatus> },
    /// A job ended (done, failed, canceled): its final status, counts,
    /// error and end time, for the webhooks that tell of it.
    Ended { status: Box<JobStatus> },
    /// A job's cost reached its budget: for the `job.budget_reached`
    /// webhook, with the job's status at that moment (a job canceled by it
    /// is gone from the core before its record is written).
    BudgetReached { status: Box<JobStatus> },
    /// A lease was handed to this enrolled identity: recorded, so that
    /// after a restart only that identity may adopt it.
    Leased { task: TaskRef, identity: String },
    /// An identity was caught returning wrong pixels: record it for good.
    Quarantine {
        identity: String,
        name: String,
        reason: String,
        unix_ms: u64,
    },
    /// These committed results were withdrawn: delete their rows, and
    /// these frames' (they are stitched again once re-rendered).
    Withdraw {
        job: u64,
        tasks: Vec<u32>,
        frames: Vec<u32>,
    },
    /// A job was paused or resumed (`released`: resumed while a failed
    /// dependency held it): record it, so a restart keeps it so.
    Holds {
        job: u64,
        paused: bool,
        released: bool,
    },
    /// A job's priority changed: record it in its spec, so a restart keeps
    /// it.
    Priority { job: u64, priority: i32 },
    /// An encode job may run: read the frames of job `input`, then report
    /// them with [`FarmCore::inputs_resolved`].
    ResolveInputs { job: u64, input: u64 },
}

/// A job read back from the database on start.
pub struct RestoredJob {
    pub id: u64,
    pub spec: JobSpec,
    pub state: JobState,
    pub error: Option<String>,
    pub submitted_unix_ms: u64,
    pub finished_unix_ms: Option<u64>,
    pub bytes_uploaded: u64,
    pub bytes_deduplicated: u64,
    pub cost_usd: f64,
    /// Committed results: (task index, render ms).
    pub results: Vec<(u32, u64)>,
    /// Frames already stitched.
    pub frames: Vec<u32>,
    /// Frames whose passes are stitched for their finishing task.
    pub passes: Vec<(u32, StitchedPasses)>,
    /// Leases handed out by earlier runs and not ended by a result:
    /// (task index, epoch, identity).
    pub leases: Vec<(u32, u64, String)>,
}

pub(crate) struct WorkerEntry {
    pub name: String,
    /// The enrolled identity it connected with: what its blocklists,
    /// adoptable leases and quarantine hang on.
    pub identity: String,
    pub info: WorkerInfo,
    /// Jobs whose `JobInfo` this connection has already been sent.
    pub jobs_sent: HashSet<u64>,
    pub tasks_done: u64,
    /// Last reported (samples done, total) per running lease.
    pub progress: HashMap<TaskRef, (u32, u32, Option<String>)>,
    pub joined_ms: Millis,
    pub telemetry: Option<Telemetry>,
    /// Its latest readings, oldest first, at most `MAX_TELEMETRY_HISTORY`.
    pub history: std::collections::VecDeque<tessera_protocol::messages::TelemetryPoint>,
    pub draining: bool,
}

/// Everything the coordinator decides with.
pub struct FarmCore {
    config: FarmConfig,
    pub(crate) sched: Scheduler,
    pub(crate) jobs: BTreeMap<u64, Job>,
    pub(crate) workers: HashMap<WorkerId, WorkerEntry>,
    next_worker: WorkerId,
    submit_seq: u64,
    pub(crate) ledger: Ledger,
    /// After a restart with unfinished jobs, no task is handed out before
    /// this time, so workers that were rendering can rejoin and keep their
    /// tasks instead of seeing them given to whoever comes first.
    rejoin_until: Millis,
    /// Tasks whose lease ended without a result, until they are handed out
    /// again (to log how quickly a lost task restarts).
    requeued: HashSet<TaskKey>,
    /// Leases this run handed out that ended because their worker's
    /// connection did (task → epoch and worker name): what a worker that
    /// rejoins may name and adopt. Bounded by the live jobs' tasks.
    released: HashMap<TaskKey, (Epoch, String)>,
    /// Leases lost with their workers, per task in a row.
    lost: LostLeases,
    /// The Blender builds stored with `blender add`, oldest first: what a
    /// worker started with `--blender auto` offers besides its own.
    builds: Vec<tessera_protocol::build::BuildInfo>,
    /// Leases of earlier runs (task → epoch and identity), read back on
    /// start: a rejoining worker may adopt only those handed to its
    /// identity. Bounded by the live jobs' tasks.
    earlier: HashMap<TaskKey, (Epoch, String)>,
    /// Identities quarantined by a failed check, with the reason.
    quarantined: HashMap<String, String>,
    /// Per job, the identities blocklisted for it (they failed it too
    /// often, or cannot render it): applied to each connection they make.
    blocklists: HashMap<u64, HashSet<String>>,
    /// The final states of the jobs this run finished, newest
    /// [`FINISHED_KEPT`]: what a job submitted `--after` one of them sees
    /// before the database has recorded it.
    finished: BTreeMap<u64, JobState>,
    /// Jobs that just ended whose dependents are still to be told, and
    /// whether that is under way (so a long chain is settled in a loop,
    /// not by recursion).
    settle: Vec<(u64, JobState)>,
    settling: bool,
    effects: Vec<Effect>,
    /// Leases that expired since the start (for `/metrics`).
    pub lease_expiries: u64,
    /// Something changed that may block or unblock a job (a worker came,
    /// went or drains, a job was submitted, a budget reached …): the next
    /// dispatch looks for newly blocked jobs. Nothing looks otherwise.
    blocked_check: bool,
    /// Live jobs whose being blocked was told ([`Effect::Blocked`]): once
    /// per job.
    blocked_told: HashSet<u64>,
    /// The coordinator is shutting down: its workers leave because it
    /// does, so no job is blocked by their leaving, and no work goes out.
    stopping: bool,
    /// Batches of results refused in a row because they could not be made
    /// durable (the database or the bucket out of reach or refusing):
    /// their tasks wait longer each time before they are handed out again.
    refused_in_a_row: u32,
}

/// The first wait of a task whose result an outage refused; it doubles
/// with each batch refused in a row, up to [`OUTAGE_HOLD_MAX_MS`].
pub const OUTAGE_HOLD_MS: Millis = 500;
/// The longest such wait.
pub const OUTAGE_HOLD_MAX_MS: Millis = 30_000;

/// How many finished jobs' final states the core remembers (see
/// `FarmCore::finished`); older ones are read from the database.
pub const FINISHED_KEPT: usize = 4096;

fn key(task: TaskRef) -> TaskKey {
    TaskKey {
        job: task.job,
        index: task.index,
    }
}

fn lease_ref(task: TaskKey, epoch: Epoch) -> TaskRef {
    TaskRef {
        job: task.job,
        index: task.index,
        epoch: epoch.0,
    }
}

/// What every task of a job needs, for cache affinity (a file of one
/// frame, `submit --frame-files`, is needed by that frame's tasks only).
fn job_assets(spec: &JobSpec) -> Vec<(Digest, u64)> {
    (spec.manifest.iter())
        .filter(|m| m.frame.is_none())
        .map(|m| (m.digest, m.size))
        .collect()
}

impl FarmCore {
    pub fn new(config: FarmConfig) -> FarmCore {
        let mut sched = Scheduler::new(config.scheduler);
        sched.set_affinity(config.cache_affinity);
        sched.set_pipelining(config.pipelining);
        FarmCore {
            config,
            sched,
            jobs: BTreeMap::new(),
            workers: HashMap::new(),
            next_worker: 1,
            submit_seq: 0,
            ledger: Ledger::default(),
            rejoin_until: 0,
            requeued: HashSet::new(),
            released: HashMap::new(),
            lost: LostLeases::default(),
            builds: Vec::new(),
            earlier: HashMap::new(),
            quarantined: HashMap::new(),
            blocklists: HashMap::new(),
            finished: BTreeMap::new(),
            settle: Vec::new(),
            settling: false,
            effects: Vec::new(),
            lease_expiries: 0,
            refused_in_a_row: 0,
            blocked_check: false,
            blocked_told: HashSet::new(),
            stopping: false,
        }
    }

    /// What the shell must do now, oldest first.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        // A queued lease is billed from when it moved up to a render slot.
        for (a, at) in self.sched.take_promoted() {
            self.ledger.lease_rendering(a.task, a.worker, at);
        }
        std::mem::take(&mut self.effects)
    }

    /// The round-trip time of worker `id`'s connection, for its lease
    /// depth.
    pub fn worker_rtt(&mut self, id: WorkerId, rtt_ms: Millis) {
        self.sched.set_worker_rtt(id, rtt_ms);
    }

    fn send(&mut self, worker: WorkerId, msg: CoordMsg) {
        if self.workers.contains_key(&worker) {
            self.effects.push(Effect::Send { worker, msg });
        }
    }

    /// A task of `job` started (leased or adopted): the first this run
    /// tells that the job runs (`job.running`).
    pub(super) fn job_started(&mut self, job: u64, now: Now) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.started.is_none() {
            j.started = Some((now.ms, j.tasks_done));
            let state = JobState::Running;
            self.emit(now, FarmEvent::JobChanged { job, state });
        }
    }

    fn emit(&mut self, now: Now, event: FarmEvent) {
        self.effects.push(Effect::Event {
            unix_ms: now.unix_ms,
            event,
        });
    }

    /// Puts a job read from the database back, with its committed results
    /// and stitched frames; asks for the frames whose tasks are all done
    /// but which were not stitched yet.
    pub fn restore_job(&mut self, stored: RestoredJob, now: Now) {
        let id = stored.id;
        for (index, epoch, identity) in stored.leases {
            self.earlier
                .insert(TaskKey { job: id, index }, (Epoch(epoch), identity));
        }
        let mut job = Job::new(
            stored.spec,
            stored.submitted_unix_ms,
            stored.bytes_uploaded,
            stored.bytes_deduplicated,
        );
        for (index, render_ms) in stored.results {
            if job.count_once(index) {
                job.tasks_done += 1;
                job.render_ms += render_ms;
                for pos in job.frame_positions(index) {
                    job.done_per_frame[pos] += 1;
                }
            }
        }
        for frame in stored.frames {
            if let Some(pos) = job.spec.frames.iter().position(|&x| x == frame) {
                if !job.stitched[pos] {
                    job.stitched[pos] = true;
                    job.frames_done += 1;
                }
            }
        }
        for (frame, passes) in stored.passes {
            if let Some(pos) = job.spec.frames.iter().position(|&x| x == frame) {
                job.passes[pos] = Some(passes);
            }
        }
        self.ledger.restore_job(id, stored.cost_usd, job.tasks_done);
        if stored.state.is_final() {
            job.final_state = Some(stored.state);
            job.error = stored.error;
            job.finished_unix_ms = stored.finished_unix_ms;
        } else {
            let pending: Vec<u32> = (0..job.tasks_total())
                .filter(|&i| !job.is_counted(i))
                .collect();
            for pos in 0..job.done_per_frame.len() {
                if job.stitch_due(pos) {
                    self.effects.push(Effect::Stitch {
                        job: id,
                        frame_pos: pos,
                    });
                }
            }
            self.add_to_scheduler(id, &job, pending, now);
            tracing::info!(
                job = id,
                done = job.tasks_done,
                total = job.tasks_total(),
                "resumed job"
            );
        }
        let all_stitched =
            job.final_state.is_none() && job.frames_done == job.spec.frames.len() as u32;
        self.jobs.insert(id, job);
        // Every frame stitched but the job's end not recorded (the
        // coordinator stopped in between): it ends now.
        if all_stitched {
            self.frame_stitched(id, 0, now);
        }
    }

    /// Identities quarantined in earlier runs: they get no work.
    pub fn restore_quarantine(&mut self, quarantined: Vec<(String, String)>) {
        self.quarantined.extend(quarantined);
    }

    /// After restoring: with unfinished jobs, hand out nothing for one lease
    /// time so that workers still rendering can rejoin with their tasks.
    pub fn hold_for_rejoin(&mut self, now: Now) {
        if self.jobs.values().any(|j| j.final_state.is_none()) {
            self.rejoin_until = now.ms + self.config.lease_ms;
            tracing::info!(
                wait_ms = self.config.lease_ms,
                "unfinished jobs: waiting for workers to rejoin with their tasks before handing out work"
            );
            // Once the hold ends, the jobs still lacking a worker are told.
            self.blocked_check = true;
        }
    }

    fn add_to_scheduler(&mut self, id: u64, job: &Job, pending: Vec<u32>, now: Now) {
        self.submit_seq += 1;
        self.sched.add_job(
            NewJob {
                id,
                priority: job.spec.priority,
                submit_seq: self.submit_seq,
                engine: job.spec.engine.name().to_string(),
                total: job.tasks_total(),
                pending,
            },
            now.ms,
        );
        // A finishing task waits until its frame's passes are stitched.
        let held: Vec<u32> = (job.finishing_tasks().into_iter().enumerate())
            .filter(|&(pos, _)| job.passes[pos].is_none())
            .map(|(_, index)| index)
            .collect();
        self.sched.hold(id, &held);
        self.sched.set_job_assets(id, job_assets(&job.spec));
        if let Some(needs) = job.spec.blender {
            self.sched.set_job_blender(id, needs);
        }
        if let Some(needs) = &job.spec.host {
            self.sched.set_job_host(id, (**needs).clone());
        }
    }

    /// Adds a validated job the database has just recorded under `id`.
    pub fn submit(
        &mut self,
        id: u64,
        spec: JobSpec,
        submitted_unix_ms: u64,
        bytes_uploaded: u64,
        bytes_deduplicated: u64,
        now: Now,
    ) -> JobStatus {
        let job = Job::new(spec, submitted_unix_ms, bytes_uploaded, bytes_deduplicated);
        let pending = (0..job.tasks_total()).collect();
        self.add_to_scheduler(id, &job, pending, now);
        let status = job.status(id, 0, self.blocked(id, job.spec.engine));
        self.jobs.insert(id, job);
        let state = JobState::Queued;
        self.emit(now, FarmEvent::JobChanged { job: id, state });
        self.blocked_check = true;
        self.apply_holds(id, now);
        self.effects.push(Effect::Wake);
        status
    }

    /// Whether some worker heard from within its lease runs on an
    /// interruptible (spot) instance.
    pub fn has_interruptible_worker(&self, now: Now) -> bool {
        (self.workers.iter())
            .any(|(&id, w)| w.info.interruptible && !self.sched.is_silent(id, now.ms))
    }

    /// Expires overdue leases and fills free slots. Returns when it must be
    /// called again at the latest, if anything is pending.
    pub fn dispatch(&mut self, now: Now) -> Option<Millis> {
        let noted = self.sched.expire_noting_queued(now.ms);
        self.lease_expiries += noted.len() as u64;
        for (lost, queued) in &noted {
            // A lease queued behind busy slots never started: not lost with
            // its worker; nor one of a worker that said it drains.
            if let Some(w) = (self.workers.get(&lost.worker)).filter(|w| !w.draining && !queued) {
                self.lost.ended_with_worker(&w.identity, lost.task, now.ms);
            }
            let name = (self.workers.get(&lost.worker)).map_or("(gone)", |w| w.name.as_str());
            tracing::info!(
                job = lost.task.job,
                task = lost.task.index,
                worker = lost.worker,
                name,
                "lease expired; task requeued"
            );
        }
        let expired: Vec<_> = noted.into_iter().map(|(a, _)| a).collect();
        self.send_cancels(&expired, now);
        self.enforce_budgets(now);
        let hold = self.holding_for_rejoin(now) || self.stopping;
        // New work waits only while a lease of the earlier run may still
        // come back with its worker.
        if !(self.stopping || now.ms < self.rejoin_until && !self.earlier.is_empty()) {
            for a in self.sched.assign(now.ms) {
                self.lease_started(a, now);
            }
            // Queued tasks an idle worker stole from a busy one.
            let stolen = self.sched.take_superseded();
            for s in &stolen {
                tracing::info!(
                    job = s.task.job,
                    task = s.task.index,
                    worker = s.worker,
                    "stolen: a task queued behind a busy slot went to an idle worker"
                );
            }
            self.send_cancels(&stolen, now);
        }
        for task in self.lost.due(now.ms) {
            self.lease_lost(task, now);
        }
        if !hold {
            // While workers rejoin (or leave with the coordinator) a job
            // lacking them is not blocked: looked at once the hold ends.
            self.tell_blocked(now);
        }
        let next = (self.sched.next_deadline().into_iter())
            .chain(self.lost.next_deadline())
            .min();
        if hold {
            next.into_iter().chain([self.rejoin_until]).min()
        } else {
            next
        }
    }

    /// The coordinator is stopping: no more work goes out, and no job is
    /// told blocked by its workers leaving with it.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Workers may still rejoin with their tasks (see [`Self::hold_for_rejoin`]);
    /// new work goes out meanwhile once every lease of the earlier run is
    /// adopted.
    pub fn holding_for_rejoin(&self, now: Now) -> bool {
        now.ms < self.rejoin_until
    }

    /// Something changed that may block a job: the next dispatch looks.
    pub(crate) fn check_blocked_soon(&mut self) {
        if !self.blocked_check {
            self.blocked_check = true;
            self.effects.push(Effect::Wake);
        }
    }

    /// Tells ([`Effect::Blocked`]) of each live job blocked now that was not
    /// told of before, when something changed since the last look: work
    /// per change, never per tick.
    fn tell_blocked(&mut self, now: Now) {
        if !std::mem::take(&mut self.blocked_check) {
            return;
        }
        self.blocked_told.retain(|job| self.jobs.contains_key(job));
        let newly: Vec<u64> = (self.jobs.iter())
            .filter(|(id, j)| j.final_state.is_none() && !self.blocked_told.contains(id))
            .filter(|(&id, j)| self.blocked(id, j.spec.engine).is_some())
            .map(|(&id, _)| id)
            .collect();
        for job in newly {
            self.blocked_told.insert(job);
            // The status of this moment: what the `job.blocked` webhook
            // tells, the reason included.
            if let Some(status) = self.job_status(job, now) {
                let status = Box::new(status);
                self.effects.push(Effect::Blocked { job, status });
            }
        }
    }

    /// Jobs whose cost reached their budget (`submit --budget-usd`): under
    /// `stop-dispatch` no more of their tasks are handed out (running ones
    /// finish), under `cancel` they are canceled with their running tasks.
    /// Called before every assignment, so no task starts past a budget.
    fn enforce_budgets(&mut self, now: Now) {
        let reached: Vec<(u64, tessera_protocol::job::Budget, f64)> = (self.jobs.iter())
            .filter(|(_, j)| j.final_state.is_none() && j.budget_reached.is_none())
            .filter_map(|(&id, j)| j.spec.budget.map(|b| (id, b)))
            .map(|(id, b)| (id, b, self.ledger.job_cost(id, now.ms)))
            .filter(|(_, b, cost)| *cost >= b.usd)
            .collect();
        for (id, budget, cost) in reached {
            if let Some(status) = self.job_status(id, now) {
                self.effects.push(Effect::BudgetReached {
                    status: Box::new(status),
                });
            }
            self.blocked_check = true;
            let why = format!(
                "its budget of ${:.2} is reached (${cost:.2} spent)",
                budget.usd
            );
            match budget.on_reached {
                OnBudget::StopDispatch => {
                    tracing::info!(
                        job = id,
                        cost,
                        budget = budget.usd,
                        "budget reached: no more tasks are handed out"
                    );
                    self.sched.pause_job(id, true);
                    self.cancel_handed_back("the job reached its budget");
                    if let Some(j) = self.jobs.get_mut(&id) {
                        j.paused = true;
                        j.budget_reached = Some(format!(
                            "{why}: no more tasks are handed out, running ones finish; cancel it, or submit again with a larger --budget-usd"
                        ));
                    }
                }
                OnBudget::Cancel => {
                    tracing::info!(
                        job = id,
                        cost,
                        budget = budget.usd,
                        "budget reached: job canceled"
                    );
                    self.finish_job(
                        id,
                        JobState::Canceled,
                        Some(format!("canceled: {why} (--on-budget cancel)")),
                        now,
                    );
                }
            }
        }
    }

    /// Bills a new lease and sends it (with its job, the first time).
    fn lease_started(&mut self, a: scheduler::Assignment, now: Now) {
        let price = (self.workers.get(&a.worker)).map_or(0.0, |w| w.info.price_per_hour);
        if self.sched.is_queued(a.worker, a.task) {
            self.ledger.lease_queued(a.task, a.worker, price);
        } else {
            self.ledger.lease_started(a.task, a.worker, price, now.ms);
        }
        self.job_started(a.task.job, now);
        let event = FarmEvent::TaskStarted {
            job: a.task.job,
            index: a.task.index,
            worker: a.worker,
        };
        self.emit(now, event);
        let (Some(job), Some(worker)) =
            (self.jobs.get(&a.task.job), self.workers.get_mut(&a.worker))
        else {
            return;
        };
        let second = (self.sched.task_view(a.task))
            .and_then(|v| v.lease)
            .is_some_and(|(holder, _)| holder != a.worker);
        if second {
            tracing::info!(
                job = a.task.job,
                task = a.task.index,
                worker = a.worker,
                "straggler: a second attempt started on an idle worker"
            );
        }
        if self.requeued.remove(&a.task) {
            tracing::info!(
                job = a.task.job,
                task = a.task.index,
                worker = a.worker,
                name = worker.name.as_str(),
                unix_ms = now.unix_ms,
                "requeued task restarted"
            );
        }
        if worker.jobs_sent.insert(a.task.job) {
            let info = CoordMsg::Job(job.info(a.task.job));
            self.effects.push(Effect::Send {
                worker: a.worker,
                msg: info,
            });
        }
        self.effects.push(Effect::Leased {
            task: lease_ref(a.task, a.epoch),
            identity: worker.identity.clone(),
        });
        let assign = CoordMsg::Assign(job.task_spec(lease_ref(a.task, a.epoch)));
        self.effects.push(Effect::Send {
            worker: a.worker,
            msg: assign,
        });
    }

    fn running(&self, job: u64) -> u32 {
        self.sched.job_progress(job).map_or(0, |p| p.running)
    }
}

/// What a finished job counted, stored with its final state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FinalCounts {
    pub tasks_done: u32,
    pub frames_done: u32,
    pub render_ms: u64,
    /// Asset bytes served to workers for the job.
    pub bytes_to_workers: u64,
}
