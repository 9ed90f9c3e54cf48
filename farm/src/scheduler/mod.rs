//! The scheduler core: which worker renders which task, under which lease.
//!
//! This is a plain state machine in the manner of `quinn-proto`: it does no
//! networking, no disk I/O and never reads a clock. The async server owns one
//! [`Scheduler`] behind a mutex, feeds it events (a job was submitted, a worker
//! joined, heartbeated, finished or failed a task, left) together with the
//! current time `now` in milliseconds, and carries out what comes back: send
//! these [`Assignment`]s, tell these workers to drop these tasks. It calls
//! [`Scheduler::expire`] once [`Scheduler::next_deadline`] is reached.
//!
//! Every assignment is a lease under a fresh, strictly increasing [`Epoch`].
//! A result is accepted only from the worker holding the current lease, with
//! that lease's epoch, so each task is marked done exactly once and a worker
//! that wakes up after its lease expired cannot overwrite newer work. Tasks of
//! an expired lease, or of a worker that left, go back to the front of their
//! job's queue.
//!
//! Cost: assigning, completing, failing or expiring one task is O(log n) in
//! the number of jobs and running leases; one [`Scheduler::assign`] call also
//! visits each worker once. Nothing scans all tasks.

use std::cmp::Reverse;
use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;

use tessera_protocol::blender::{BlenderNeeds, BlenderOffer};
use tessera_protocol::messages::MAX_CACHED_DIGESTS;
use tessera_protocol::Digest;

pub mod blender;

#[cfg(test)]
mod affinity_tests;
#[cfg(test)]
mod tests;

/// A job's id, chosen by the caller (the durable store).
pub type JobId = u64;
/// A worker's id, chosen by the caller (one per connection).
pub type WorkerId = u64;
/// What the caller knows a worker by across connections (its enrolled
/// identity, hashed): a task excluded for a tag goes to none of its
/// connections.
pub type Tag = u64;

/// Slots a worker is trusted with before it has proven any: its claim is
/// filled up to this many leases, plus one for each result it delivered on
/// this connection, so a worker claiming hundreds of slots cannot hoard a
/// job's tasks while honest workers sit idle.
pub const TRUSTED_SLOTS: u32 = 4;
/// Virtual time in milliseconds, always passed in by the caller.
pub type Millis = u64;

/// With pipelining on, the most tasks a worker holds queued behind each of
/// its render slots: enough to cover a round trip of up to this many task
/// times. The lease depth is `ceil(RTT / task time)` between 1 and this.
pub const MAX_AHEAD_PER_SLOT: u32 = 8;

/// One task of a job (a frame, a tile or a sample range), named by its index
/// within the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskKey {
    pub job: JobId,
    pub index: u32,
}

impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task {} of job {}", self.index, self.job)
    }
}

/// The generation of a lease. Every assignment gets a new one, larger than
/// all before it; a result must carry the epoch of the task's current lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long a lease lives after it was granted or last renewed by a
    /// heartbeat.
    pub lease_ms: Millis,
    /// Failed attempts of one task after which its whole job fails. 0 counts
    /// as 1.
    pub max_attempts: u32,
    /// The first epoch handed out; later ones are strictly larger. The server
    /// seeds it from [`Scheduler::next_epoch`] saved before a restart, so
    /// epochs never repeat.
    pub first_epoch: u64,
    /// How long a failed task waits before it is handed out again: this
    /// after its first failure, doubling with each further one, at most
    /// [`MAX_RETRY_BACKOFF_MS`]. 0 retries at once.
    pub retry_backoff_ms: Millis,
    /// Straggler threshold in percent of the job's mean task time: once a
    /// job has nothing left to hand out, a task running longer than this
    /// (and at least [`STRAGGLER_MIN_MS`]) is started a second time on an
    /// idle worker; the first result wins. 0 turns this off.
    pub straggler_percent: u32,
}

/// A task is never called a straggler before it has run this long.
pub const STRAGGLER_MIN_MS: Millis = 1_000;
/// Results of a job needed before its mean task time is trusted.
pub const STRAGGLER_MIN_SAMPLES: u32 = 3;

/// The longest a failed task waits for its retry.
pub const MAX_RETRY_BACKOFF_MS: Millis = 60_000;

/// A job as the scheduler needs it: what to render next and with which engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub id: JobId,
    /// Higher runs first.
    pub priority: i32,
    /// Submission order; among equal priorities, earlier runs first.
    pub submit_seq: u64,
    /// The engine a worker must offer to get this job's tasks.
    pub engine: String,
    /// Indices of the tasks still to render; the others (below `total`) are
    /// already done, e.g. before a coordinator restart. Handed out in index
    /// order; repeats and indices `>= total` are ignored.
    pub pending: Vec<u32>,
    /// Number of tasks in the job.
    pub total: u32,
}

/// A lease: `worker` renders `task` under `epoch`. Also used to name a lease
/// that ended (expired, canceled), so the server can tell that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub worker: WorkerId,
    pub task: TaskKey,
    pub epoch: Epoch,
}

/// What an accepted result did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// The task is done; `job_done` is true when it was the job's last one.
    TaskDone { job_done: bool },
}

/// What an accepted failure report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailOutcome {
    /// Failed attempts of this task so far, this one included.
    pub attempts: u32,
    /// The attempts are used up: the job is now `Failed` with the reported
    /// error. Otherwise the task was requeued behind the job's other tasks.
    pub job_failed: bool,
    /// Other leases of the job that ended because it failed; the server tells
    /// these workers to stop. Empty unless `job_failed`.
    pub cancel: Vec<Assignment>,
    /// This failure was the worker's `BLOCKLIST_AFTER`th on this job: it
    /// gets no more of the job's tasks.
    pub blocklisted: bool,
}

/// Failures of one job's tasks after which a worker gets no more of them.
pub const BLOCKLIST_AFTER: u32 = 3;

/// Why a result or failure report was refused. A refusal changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("{task} does not exist; the job is unknown or has fewer tasks")]
    UnknownTask { task: TaskKey },
    #[error("{task} is already done; this duplicate result was dropped")]
    AlreadyDone { task: TaskKey },
    #[error("job {job} is {state}; its results are no longer wanted")]
    JobNotRunning { job: JobId, state: JobState },
    #[error("result for {task} carries lease epoch {epoch}, but {}; drop this result", describe_current(.current))]
    StaleEpoch {
        task: TaskKey,
        epoch: Epoch,
        current: Option<Epoch>,
    },
    #[error("{task} is leased to worker {holder}, not to worker {worker}")]
    NotLeasedToWorker {
        task: TaskKey,
        worker: WorkerId,
        holder: WorkerId,
    },
    #[error("{task} waits for its frame's other tasks; it was never handed out")]
    Held { task: TaskKey },
}

fn describe_current(current: &Option<Epoch>) -> String {
    match current {
        Some(epoch) => format!("the task was handed out again under epoch {epoch}"),
        None => "that lease ended and the task is back in the queue".to_string(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// No task of it was handed out yet.
    Queued,
    /// Some task was handed out; not all are done.
    Running,
    /// All tasks are done.
    Done,
    /// A task failed `max_attempts` times; this is its last error.
    Failed(String),
    Canceled,
}

impl JobState {
    /// Queued or running: it still hands out tasks and accepts results.
    pub fn is_live(&self) -> bool {
        matches!(self, JobState::Queued | JobState::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobState::Queued => f.write_str("queued"),
            JobState::Running => f.write_str("running"),
            JobState::Done => f.write_str("done"),
            JobState::Failed(error) => write!(f, "failed ({error})"),
            JobState::Canceled => f.write_str("canceled"),
        }
    }
}

/// One task as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskView {
    pub done: bool,
    /// The worker and epoch of its current lease, if running.
    pub lease: Option<(WorkerId, Epoch)>,
    /// Failed attempts so far.
    pub failures: u32,
}

/// Task counts of one job. While the job is live, `done + running + queued
/// == total`; a failed or canceled job has nothing running or queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobProgress {
    pub total: u32,
    pub done: u32,
    pub running: u32,
    pub queued: u32,
}

/// Where a job stands in the assignment order: higher priority, then earlier
/// submission, then lower id.
type Rank = (Reverse<i32>, u64, JobId);

struct Job {
    rank: Rank,
    engine: String,
    state: JobState,
    /// Per task index: done or not.
    done: Vec<bool>,
    done_count: u32,
    running: u32,
    /// Task indices waiting for a worker, next first.
    queue: VecDeque<u32>,
    /// Failed tasks waiting out their retry backoff, with the time they go
    /// back into `queue`.
    backoff: HashMap<u32, Millis>,
    /// Failed attempts per task index, for tasks that failed at least once.
    failures: HashMap<u32, u32>,
    /// An operator paused it: no new leases, running ones finish.
    paused: bool,
    /// The error and worker of each failed attempt, per task index.
    errors: HashMap<u32, Vec<(WorkerId, String)>>,
    /// The most recent attempt's error, for saying why a job is blocked.
    last_error: Option<String>,
    /// Failed attempts per worker.
    worker_failures: HashMap<WorkerId, u32>,
    /// The workers each failed task failed on, so a retry goes elsewhere.
    failed_on: HashMap<u32, Vec<WorkerId>>,
    /// Workers that failed too often to get more of its tasks.
    blocklist: HashSet<WorkerId>,
    /// Tasks held back (not done, not queued) until [`Scheduler::release_held`]:
    /// a frame's finishing task, until its passes are stitched.
    held: HashSet<u32>,
    /// Per task index: tags whose workers must not get it (they already
    /// rendered it once, for a result being checked).
    excluded: HashMap<u32, Vec<Tag>>,
    /// Lease-to-result times of its accepted results, for stragglers.
    done_ms_sum: u64,
    done_ms_count: u32,
}

impl Job {
    fn total(&self) -> u32 {
        self.done.len() as u32
    }

    fn is_excluded(&self, index: u32, tag: Tag) -> bool {
        self.excluded.get(&index).is_some_and(|t| t.contains(&tag))
    }

    /// Whether one of the next queued tasks may go to a worker tagged `tag`.
    fn has_task_for(&self, tag: Tag) -> bool {
        self.excluded.is_empty()
            || self
                .queue
                .iter()
                .take(64)
                .any(|&i| !self.is_excluded(i, tag))
    }
}

struct Worker {
    slots: u32,
    /// Results it delivered on this connection (see [`TRUSTED_SLOTS`]).
    proven: u32,
    tag: Tag,
    engines: Vec<String>,
    leases: BTreeSet<TaskKey>,
    /// When it last showed a sign of life (joined, heartbeat, result).
    last_seen: Millis,
    /// Finishing its leases, then leaving: no new work.
    draining: bool,
    /// Its connection's round-trip time, as the shell last measured it.
    rtt_ms: Millis,
    /// Its recent tasks' time, from the start of rendering (as far as the
    /// scheduler can tell) to the result; a moving average.
    task_ms: Option<Millis>,
}

impl Worker {
    /// A render slot is free: it takes a task to render now, or a
    /// straggler's second attempt, or steals a queued one.
    fn has_free_slot(&self) -> bool {
        !self.draining && self.leases.len() < self.usable_slots() as usize
    }

    /// It takes another lease, `ahead` counting the leases it may hold
    /// queued behind its render slots (0 without pipelining).
    fn has_room(&self, ahead: u32) -> bool {
        !self.draining && self.leases.len() < (self.usable_slots() + ahead) as usize
    }

    /// Leases it may hold queued behind its render slots: per slot,
    /// enough tasks to cover one round trip (`ceil(RTT / task time)`),
    /// at least 1 and at most [`MAX_AHEAD_PER_SLOT`]; and all its leases
    /// together no more than it has proven ([`TRUSTED_SLOTS`] plus one per
    /// result), so queued leases are earned like slots.
    fn ahead(&self) -> u32 {
        let depth = match self.task_ms {
            Some(task) => self.rtt_ms.div_ceil(task.max(1)),
            None => 1,
        };
        let depth = depth.clamp(1, u64::from(MAX_AHEAD_PER_SLOT)) as u32;
        let usable = self.usable_slots();
        let all = (usable.saturating_mul(1 + depth)).min(TRUSTED_SLOTS.saturating_add(self.proven));
        all.saturating_sub(usable)
    }

    /// Its claimed slots, as far as it has proven them.
    fn usable_slots(&self) -> u32 {
        self.slots.min(TRUSTED_SLOTS.saturating_add(self.proven))
    }

    /// Silent for a whole lease: a task given to it now would only expire.
    fn is_silent(&self, now: Millis, lease_ms: Millis) -> bool {
        now.saturating_sub(self.last_seen) >= lease_ms
    }
}

struct Lease {
    worker: WorkerId,
    epoch: Epoch,
    deadline: Millis,
    /// When it was granted, or when it started rendering if it was queued.
    started: Millis,
    /// Held by its worker behind the tasks its slots render (pipelining):
    /// not rendering yet, so not a straggler, and another worker with an
    /// idle slot may steal it.
    queued: bool,
}

/// A task's ordinary lease, or the second one of a straggler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Attempt {
    Primary,
    Backup,
}

/// Which end of its job's queue a task goes back to.
#[derive(Clone, Copy)]
enum Requeue {
    /// Older work (an expired or returned lease): next in line.
    Front,
    /// A failed attempt: retried after the job's other tasks.
    Back,
}

/// The scheduler state machine; see the module documentation.
pub struct Scheduler {
    config: Config,
    next_epoch: u64,
    jobs: HashMap<JobId, Job>,
    /// Live jobs with queued tasks, per engine, in assignment order.
    ready: HashMap<String, BTreeSet<Rank>>,
    workers: BTreeMap<WorkerId, Worker>,
    leases: BTreeMap<TaskKey, Lease>,
    /// Second leases of stragglers, on other workers than the first.
    backups: BTreeMap<TaskKey, Lease>,
    deadlines: BTreeSet<(Millis, TaskKey, Attempt)>,
    /// Leases that lost to another attempt's result; the server tells
    /// their workers to stop (see [`Scheduler::take_superseded`]).
    superseded: Vec<Assignment>,
    /// Failed tasks in backoff, by the time they are queued again. An entry
    /// whose job ended or whose task was adopted meanwhile is skipped.
    retries: BTreeSet<(Millis, TaskKey)>,
    /// The worker that got the latest assignment; the next round of
    /// [`Scheduler::assign`] starts after it.
    last_served: Option<WorkerId>,
    /// Cache affinity: each job's assets (digest, size) and the assets each
    /// worker's cache holds. A task goes to the free worker that lacks the
    /// fewest of its job's bytes.
    affinity: Affinity,
    /// What each Blender job needs of its Blender, and the Blenders each
    /// worker offers: a Blender job goes only to a worker with a Blender
    /// that can render it (see [`blender`]).
    blender_needs: HashMap<JobId, BlenderNeeds>,
    blender_offers: HashMap<WorkerId, Vec<BlenderOffer>>,
    /// Pipelined leases: a worker also holds the next tasks of each slot
    /// (see [`Scheduler::set_pipelining`]).
    pipelining: bool,
    /// The latest `now` any call passed in: when a queued lease that moves
    /// up to a render slot started rendering.
    clock: Millis,
    /// Queued leases that moved up to a render slot, with when (see
    /// [`Scheduler::take_promoted`]).
    promoted: Vec<(Assignment, Millis)>,
}

#[derive(Default)]
struct Affinity {
    off: bool,
    assets: HashMap<JobId, Vec<(Digest, u64)>>,
    held: HashMap<WorkerId, HashSet<Digest>>,
}

impl Affinity {
    /// Bytes of `job`'s assets that `worker` would have to fetch.
    fn missing(&self, job: JobId, worker: WorkerId) -> u64 {
        let Some(assets) = self.assets.get(&job) else {
            return 0;
        };
        let held = self.held.get(&worker);
        assets
            .iter()
            .filter(|(d, _)| !held.is_some_and(|h| h.contains(d)))
            .map(|(_, size)| size)
            .sum()
    }
}

/// Halves a map's room when it is less than a quarter full (and large), so
/// that memory follows the live entries rather than their peak.
pub(crate) fn shrink_when_sparse<K: std::hash::Hash + Eq, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.capacity() / 2);
    }
}

impl Scheduler {
    pub fn new(config: Config) -> Self {
        Scheduler {
            config,
            next_epoch: config.first_epoch,
            jobs: HashMap::new(),
            ready: HashMap::new(),
            workers: BTreeMap::new(),
            leases: BTreeMap::new(),
            backups: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            superseded: Vec::new(),
            retries: BTreeSet::new(),
            last_served: None,
            affinity: Affinity::default(),
            blender_needs: HashMap::new(),
            blender_offers: HashMap::new(),
            pipelining: false,
            clock: 0,
            promoted: Vec::new(),
        }
    }

    /// Turns pipelined leases on or off (off by default). With them on, a
    /// worker holds, besides a task for each render slot, the next tasks
    /// of each slot ([`MAX_AHEAD_PER_SLOT`] at most, as many as its
    /// round trip takes task times), so it fetches their files and starts
    /// them without waiting for a round trip. A queued task is never stuck
    /// behind a busy slot: a worker with an idle slot and nothing else to
    /// do steals it, and a draining worker hands its queued tasks back.
    pub fn set_pipelining(&mut self, on: bool) {
        self.pipelining = on;
    }

    /// `worker`'s connection's round-trip time, for its lease depth.
    pub fn set_worker_rtt(&mut self, worker: WorkerId, rtt_ms: Millis) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.rtt_ms = rtt_ms;
        }
    }

    /// Leases `worker` may hold queued behind its render slots now.
    fn ahead_of(&self, worker: &Worker) -> u32 {
        if self.pipelining {
            worker.ahead()
        } else {
            0
        }
    }

    /// Queued leases that moved up to a render slot since the last call,
    /// each with when it did: the worker starts rendering it then (billing
    /// starts there).
    pub fn take_promoted(&mut self) -> Vec<(Assignment, Millis)> {
        std::mem::take(&mut self.promoted)
    }

    /// Whether `worker`'s lease on `task` waits behind its render slots.
    pub fn is_queued(&self, worker: WorkerId, task: TaskKey) -> bool {
        (self.leases.get(&task).filter(|l| l.worker == worker))
            .or_else(|| self.backups.get(&task).filter(|l| l.worker == worker))
            .is_some_and(|l| l.queued)
    }

    fn tick(&mut self, now: Millis) {
        self.clock = self.clock.max(now);
    }

    /// A lease of `worker`'s of `task`, primary or backup, to change.
    fn lease_of_mut(&mut self, worker: WorkerId, task: TaskKey) -> Option<&mut Lease> {
        match self.leases.get_mut(&task) {
            Some(lease) if lease.worker == worker => Some(lease),
            _ => self.backups.get_mut(&task).filter(|l| l.worker == worker),
        }
    }

    fn lease_of(&self, worker: WorkerId, task: TaskKey) -> Option<&Lease> {
        match self.leases.get(&task) {
            Some(lease) if lease.worker == worker => Some(lease),
            _ => self.backups.get(&task).filter(|l| l.worker == worker),
        }
    }

    /// How many of `worker`'s leases render now (are not queued).
    fn rendering(&self, worker: WorkerId) -> usize {
        let Some(w) = self.workers.get(&worker) else {
            return 0;
        };
        (w.leases.iter())
            .filter(|&&t| self.lease_of(worker, t).is_some_and(|l| !l.queued))
            .count()
    }

    /// Moves `worker`'s oldest queued leases up to its free render slots:
    /// the worker renders its tasks in the order it was given them.
    fn promote_queued(&mut self, worker: WorkerId) {
        let Some(w) = self.workers.get(&worker) else {
            return;
        };
        let usable = w.usable_slots() as usize;
        let rendering = self.rendering(worker);
        if rendering >= usable {
            return;
        }
        let mut queued: Vec<(Epoch, TaskKey)> = (w.leases.iter())
            .filter_map(|&t| {
                let l = self.lease_of(worker, t)?;
                l.queued.then_some((l.epoch, t))
            })
            .collect();
        queued.sort_unstable();
        let clock = self.clock;
        for (epoch, task) in queued.into_iter().take(usable - rendering) {
            let lease = self.lease_of_mut(worker, task).expect("listed above");
            lease.queued = false;
            lease.started = clock;
            self.promoted.push((
                Assignment {
                    worker,
                    task,
                    epoch,
                },
                clock,
            ));
        }
    }

    /// What Blender `job` needs; a Blender job without this runs on any
    /// worker offering the engine (jobs stored before versions were known).
    pub fn set_job_blender(&mut self, job: JobId, needs: BlenderNeeds) {
        self.blender_needs.insert(job, needs);
    }

    /// The Blenders `worker` offers.
    pub fn set_worker_blenders(&mut self, worker: WorkerId, offers: Vec<BlenderOffer>) {
        self.blender_offers.insert(worker, offers);
    }

    /// Whether one of `worker`'s Blenders can render `job` (true for jobs
    /// with no Blender needs).
    fn blender_fits(&self, worker: WorkerId, job: JobId) -> bool {
        let Some(needs) = self.blender_needs.get(&job) else {
            return true;
        };
        let offers = self
            .blender_offers
            .get(&worker)
            .map_or(&[][..], Vec::as_slice);
        blender::pick(needs, offers).is_some()
    }

    /// Why no connected worker can render Blender job `job`, if none can:
    /// `needs Blender 4.5; workers offer 3.4, 4.2`.
    pub fn blender_blocked(&self, job: JobId) -> Option<String> {
        let needs = self.blender_needs.get(&job)?;
        let offers: Vec<&BlenderOffer> = (self.workers.keys())
            .filter_map(|w| self.blender_offers.get(w))
            .flatten()
            .collect();
        blender::blocked_reason(needs, &offers)
    }

    /// Turns cache affinity off (for comparisons); it is on by default.
    pub fn set_affinity(&mut self, on: bool) {
        self.affinity.off = !on;
    }

    /// The assets (digest, size) every task of `job` needs.
    pub fn set_job_assets(&mut self, job: JobId, assets: Vec<(Digest, u64)>) {
        self.affinity.assets.insert(job, assets);
    }

    /// What `worker`'s cache gained and lost.
    pub fn worker_holds(&mut self, worker: WorkerId, added: &[Digest], removed: &[Digest]) {
        let held = self.affinity.held.entry(worker).or_default();
        for d in removed {
            held.remove(d);
        }
        // What a worker claims to hold is bounded, however many times it
        // claims more.
        let room = MAX_CACHED_DIGESTS.saturating_sub(held.len());
        held.extend(added.iter().copied().take(room));
    }

    /// Whether `worker`'s cache holds every one of `digests`.
    pub fn worker_holds_all(&self, worker: WorkerId, digests: &[Digest]) -> bool {
        self.affinity
            .held
            .get(&worker)
            .is_some_and(|held| digests.iter().all(|d| held.contains(d)))
    }

    /// Among `worker` and the other free workers in `turns` that can take
    /// `job`, the one lacking the fewest of its bytes (`worker` on a tie).
    fn affine_worker(
        &self,
        job: JobId,
        worker: WorkerId,
        turns: &VecDeque<WorkerId>,
        now: Millis,
    ) -> WorkerId {
        if self.affinity.off || !self.affinity.assets.contains_key(&job) {
            return worker;
        }
        let j = &self.jobs[&job];
        let eligible = |w: &WorkerId| {
            let wk = &self.workers[w];
            wk.has_room(self.ahead_of(wk))
                && !wk.is_silent(now, self.config.lease_ms)
                && wk.engines.contains(&j.engine)
                && self.blender_fits(*w, job)
                && !j.blocklist.contains(w)
                && j.has_task_for(wk.tag)
        };
        let mut best = (self.affinity.missing(job, worker), worker);
        for &w in turns.iter().filter(|w| **w != worker && eligible(w)) {
            let missing = self.affinity.missing(job, w);
            if missing < best.0 {
                best = (missing, w);
            }
        }
        best.1
    }

    /// Adds a job. A job with no pending task is `Done` at once. Adding an id
    /// that is already known does nothing (submission is idempotent).
    pub fn add_job(&mut self, job: NewJob, _now: Millis) {
        if self.jobs.contains_key(&job.id) {
            return;
        }
        let mut pending = job.pending;
        pending.retain(|&index| index < job.total);
        pending.sort_unstable();
        pending.dedup();
        let mut done = vec![true; job.total as usize];
        for &index in &pending {
            done[index as usize] = false;
        }
        let entry = Job {
            rank: (Reverse(job.priority), job.submit_seq, job.id),
            engine: job.engine,
            state: if pending.is_empty() {
                JobState::Done
            } else {
                JobState::Queued
            },
            done_count: job.total - pending.len() as u32,
            done,
            running: 0,
            queue: pending.into(),
            backoff: HashMap::new(),
            failures: HashMap::new(),
            paused: false,
            errors: HashMap::new(),
            last_error: None,
            worker_failures: HashMap::new(),
            failed_on: HashMap::new(),
            blocklist: HashSet::new(),
            held: HashSet::new(),
            excluded: HashMap::new(),
            done_ms_sum: 0,
            done_ms_count: 0,
        };
        sync_ready(&mut self.ready, &entry);
        self.jobs.insert(job.id, entry);
    }

    /// Adds a worker with `slots` concurrent tasks for the given engines. A
    /// known worker re-registering gets the new slots and engines and keeps
    /// its leases.
    pub fn add_worker(&mut self, worker: WorkerId, slots: u32, engines: Vec<String>, now: Millis) {
        match self.workers.entry(worker) {
            btree_map::Entry::Occupied(entry) => {
                let known = entry.into_mut();
                known.slots = slots;
                known.engines = engines;
                known.last_seen = now;
            }
            btree_map::Entry::Vacant(entry) => {
                entry.insert(Worker {
                    slots,
                    proven: 0,
                    tag: worker,
                    engines,
                    leases: BTreeSet::new(),
                    last_seen: now,
                    draining: false,
                    rtt_ms: 0,
                    task_ms: None,
                });
            }
        }
    }

    /// Removes a worker (it left, was preempted or lost its connection). Its
    /// leases end at once and their tasks go back to the front of their jobs'
    /// queues; returns those tasks in order.
    pub fn remove_worker(&mut self, worker: WorkerId, now: Millis) -> Vec<TaskKey> {
        self.tick(now);
        self.affinity.held.remove(&worker);
        self.blender_offers.remove(&worker);
        let Some(removed) = self.workers.remove(&worker) else {
            return Vec::new();
        };
        let tasks: Vec<TaskKey> = removed.leases.into_iter().collect();
        let mut requeue = Vec::new();
        for &task in &tasks {
            if self.leases.get(&task).is_some_and(|l| l.worker == worker) {
                self.end_lease(task);
                if !self.promote_backup(task) {
                    requeue.push(task);
                }
            } else {
                self.end_backup(task);
            }
        }
        self.requeue_front(requeue);
        tasks
    }

    /// Renews every lease `worker` holds until `now + lease_ms`.
    /// Returns true when the worker had been silent for a whole lease: it
    /// takes work again from now on, so the caller should call `assign`.
    pub fn heartbeat(&mut self, worker: WorkerId, now: Millis) -> bool {
        let lease_ms = self.config.lease_ms;
        let Some(known) = self.workers.get_mut(&worker) else {
            return false;
        };
        let was_silent = known.is_silent(now, lease_ms);
        known.last_seen = now;
        let known = &*known;
        let deadline = now.saturating_add(self.config.lease_ms);
        for &task in &known.leases {
            let (lease, attempt) = match self.leases.get_mut(&task) {
                Some(lease) if lease.worker == worker => (lease, Attempt::Primary),
                _ => (
                    (self.backups.get_mut(&task)).expect("a worker's lease is in a lease table"),
                    Attempt::Backup,
                ),
            };
            self.deadlines.remove(&(lease.deadline, task, attempt));
            lease.deadline = deadline;
            self.deadlines.insert((deadline, task, attempt));
        }
        was_silent
    }

    /// Fills every free slot that some queued task can use. Each worker gets
    /// the first task it can render in job order (priority, submission, task
    /// index); workers take turns one task at a time, starting after the
    /// worker served last, so work spreads over the farm. A worker silent for
    /// a whole lease gets nothing until it is heard from again.
    pub fn assign(&mut self, now: Millis) -> Vec<Assignment> {
        self.tick(now);
        self.release_retries(now);
        let start = self.last_served.map_or(0, |id| id.wrapping_add(1));
        let mut turns: VecDeque<WorkerId> = (self.workers.range(start..))
            .chain(self.workers.range(..start))
            .filter(|(_, worker)| {
                worker.has_room(self.ahead_of(worker))
                    && !worker.is_silent(now, self.config.lease_ms)
            })
            .map(|(&id, _)| id)
            .collect();
        let mut assignments = Vec::new();
        while let Some(worker) = turns.pop_front() {
            // It may have been filled by affinity since it joined the turns.
            let w = &self.workers[&worker];
            if !w.has_room(self.ahead_of(w)) {
                continue;
            }
            let Some(job) = self.best_job_for(worker) else {
                continue;
            };
            let target = self.affine_worker(job, worker, &turns, now);
            assignments.push(self.lease_next_task(job, target, now));
            self.last_served = Some(target);
            if target != worker {
                // The task went to a worker holding more of its job's assets;
                // this one still has a free slot and takes the next turn.
                turns.push_front(worker);
            } else if self.workers[&worker].has_room(self.ahead_of(&self.workers[&worker])) {
                turns.push_back(worker);
            }
        }
        if self.pipelining {
            self.steal(now, &mut assignments);
        }
        self.speculate(now, &mut assignments);
        assignments
    }

    /// Gives each worker with an idle render slot, once no queue has a
    /// task for it, the task queued last behind another worker's busy
    /// slots (its old lease ends: see [`Scheduler::take_superseded`]).
    fn steal(&mut self, now: Millis, assignments: &mut Vec<Assignment>) {
        let idle: Vec<WorkerId> = (self.workers.iter())
            .filter(|(_, w)| w.has_free_slot() && !w.is_silent(now, self.config.lease_ms))
            .map(|(&id, _)| id)
            .collect();
        for thief in idle {
            while self.workers[&thief].has_free_slot() {
                let Some((task, victim)) = self.queued_for(thief) else {
                    break;
                };
                let old = self.end_lease(task).expect("listed from the lease table");
                self.superseded.push(Assignment {
                    worker: victim,
                    task,
                    epoch: old.epoch,
                });
                let job = self.jobs.get_mut(&task.job).expect("a leased task's job");
                job.running += 1;
                let epoch = Epoch(self.next_epoch);
                self.next_epoch += 1;
                self.grant(task, thief, epoch, now, Attempt::Primary);
                assignments.push(Assignment {
                    worker: thief,
                    task,
                    epoch,
                });
            }
        }
    }

    /// The queued lease `thief` may take over: of a job it can render, on
    /// another worker, the one granted last (the last in its queue).
    fn queued_for(&self, thief: WorkerId) -> Option<(TaskKey, WorkerId)> {
        let w = &self.workers[&thief];
        (self.leases.iter())
            .filter(|(task, lease)| {
                let job = &self.jobs[&task.job];
                lease.queued
                    && lease.worker != thief
                    && !self.backups.contains_key(task)
                    && job.state.is_live()
                    && !job.paused
                    && w.engines.contains(&job.engine)
                    && self.blender_fits(thief, task.job)
                    && !job.blocklist.contains(&thief)
                    && !job.is_excluded(task.index, w.tag)
            })
            .max_by_key(|(_, lease)| lease.epoch)
            .map(|(&task, lease)| (task, lease.worker))
    }

    /// Gives each worker still idle a second attempt of the longest-running
    /// straggler it can render (see [`Config::straggler_percent`]).
    fn speculate(&mut self, now: Millis, assignments: &mut Vec<Assignment>) {
        if self.config.straggler_percent == 0 || self.leases.is_empty() {
            return;
        }
        let idle: Vec<WorkerId> = (self.workers.iter())
            .filter(|(_, w)| w.has_free_slot() && !w.is_silent(now, self.config.lease_ms))
            .map(|(&id, _)| id)
            .collect();
        for worker in idle {
            let Some(task) = self.straggler_for(worker, now) else {
                continue;
            };
            let epoch = Epoch(self.next_epoch);
            self.next_epoch += 1;
            self.grant(task, worker, epoch, now, Attempt::Backup);
            assignments.push(Assignment {
                worker,
                task,
                epoch,
            });
        }
    }

    /// The longest-running task that is a straggler and that `worker` may
    /// take a second attempt of.
    fn straggler_for(&self, worker: WorkerId, now: Millis) -> Option<TaskKey> {
        let engines = &self.workers[&worker].engines;
        let percent = u64::from(self.config.straggler_percent);
        (self.leases.iter())
            .filter(|(task, lease)| {
                let job = &self.jobs[&task.job];
                let running = now.saturating_sub(lease.started);
                lease.worker != worker
                    && !lease.queued
                    && !self.backups.contains_key(task)
                    && job.state.is_live()
                    && !job.paused
                    && job.queue.is_empty()
                    && job.backoff.is_empty()
                    && job.done_ms_count >= STRAGGLER_MIN_SAMPLES
                    && engines.contains(&job.engine)
                    && self.blender_fits(worker, task.job)
                    && !job.blocklist.contains(&worker)
                    && !job.is_excluded(task.index, self.workers[&worker].tag)
                    && running >= STRAGGLER_MIN_MS
                    && running * 100 * u64::from(job.done_ms_count) >= percent * job.done_ms_sum
            })
            .max_by_key(|(_, lease)| now.saturating_sub(lease.started))
            .map(|(&task, _)| task)
    }

    /// Leases that ended because another attempt of their task was
    /// accepted first; tell their workers to stop.
    pub fn take_superseded(&mut self) -> Vec<Assignment> {
        std::mem::take(&mut self.superseded)
    }

    /// Accepts the result of `task` from the worker holding its current lease
    /// under `epoch`. Anything else is refused and changes nothing.
    pub fn complete(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<Accepted, Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        // The winner's lease ends, and the other attempt's, if any, loses.
        let (won, lost) = match attempt {
            Attempt::Primary => (self.end_lease(task), self.end_backup(task)),
            Attempt::Backup => (self.end_backup(task), self.end_lease(task)),
        };
        let won = won.expect("checked above");
        if let Some(lost) = lost {
            self.superseded.push(Assignment {
                worker: lost.worker,
                task,
                epoch: lost.epoch,
            });
        }
        self.seen(worker, now);
        let took = now.saturating_sub(won.started);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.task_ms = Some(w.task_ms.map_or(took, |t| (3 * t + took) / 4));
        }
        self.proved(worker);
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        job.done_ms_sum += took;
        job.done_ms_count += 1;
        job.done[task.index as usize] = true;
        job.done_count += 1;
        let job_done = job.done_count == job.total();
        if job_done {
            job.state = JobState::Done;
        }
        Ok(Accepted::TaskDone { job_done })
    }

    /// Accepts a failed attempt of `task`, under the same rules as
    /// [`Scheduler::complete`]. The task is retried until it has failed
    /// `max_attempts` times; then the job fails with `error` and its other
    /// leases end. An expired lease is not a failed attempt.
    pub fn fail(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        error: String,
        now: Millis,
    ) -> Result<FailOutcome, Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        // A failed second attempt leaves the first running; a failed first
        // attempt hands the task to the second, if there is one.
        let carried_on = match attempt {
            Attempt::Backup => {
                self.end_backup(task);
                true
            }
            Attempt::Primary => {
                self.end_lease(task);
                self.promote_backup(task)
            }
        };
        self.seen(worker, now);
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        let attempts = job.failures.entry(task.index).or_insert(0);
        if attempt == Attempt::Primary {
            *attempts += 1;
        }
        let attempts = *attempts;
        job.last_error = Some(error.clone());
        let errors = job.errors.entry(task.index).or_default();
        errors.push((worker, error));
        job.failed_on.entry(task.index).or_default().push(worker);
        let by_worker = job.worker_failures.entry(worker).or_insert(0);
        *by_worker += 1;
        let blocklisted = *by_worker == BLOCKLIST_AFTER;
        if blocklisted {
            job.blocklist.insert(worker);
        }
        if attempts < self.config.max_attempts.max(1) || attempt == Attempt::Backup {
            let wait = retry_backoff(self.config.retry_backoff_ms, attempts);
            if carried_on {
                // Another attempt is still running: nothing to requeue.
            } else if wait == 0 {
                self.requeue(task, Requeue::Back);
            } else {
                let at = now.saturating_add(wait);
                job.backoff.insert(task.index, at);
                self.retries.insert((at, task));
            }
            return Ok(FailOutcome {
                attempts,
                job_failed: false,
                blocklisted,
                cancel: Vec::new(),
            });
        }
        let collected = collect_errors(errors);
        let cancel = self.stop_job(task.job, JobState::Failed(collected));
        Ok(FailOutcome {
            attempts,
            job_failed: true,
            blocklisted,
            cancel,
        })
    }

    /// Ends every lease whose deadline is at or before `now` and requeues its
    /// task at the front of its job; returns the expired leases.
    pub fn expire(&mut self, now: Millis) -> Vec<Assignment> {
        (self.expire_noting_queued(now).into_iter())
            .map(|(a, _)| a)
            .collect()
    }

    /// [`Scheduler::expire`], each lease with whether it was still queued
    /// behind its worker's slots (never started rendering).
    pub fn expire_noting_queued(&mut self, now: Millis) -> Vec<(Assignment, bool)> {
        self.tick(now);
        let mut expired = Vec::new();
        let mut requeue = Vec::new();
        while let Some(&(deadline, task, attempt)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            let lease = match attempt {
                Attempt::Primary => self.end_lease(task),
                Attempt::Backup => self.end_backup(task),
            };
            let lease = lease.expect("every deadline belongs to a lease");
            if attempt == Attempt::Primary && !self.promote_backup(task) {
                requeue.push(task);
            }
            // A worker that let a lease run out is silent until it is heard
            // from again by a heartbeat (a result alone, seen after its last
            // renewal, does not say it lives): the requeued task must not go
            // straight back to it.
            let lease_ms = self.config.lease_ms;
            if let Some(known) = self.workers.get_mut(&lease.worker) {
                known.last_seen = known.last_seen.min(now.saturating_sub(lease_ms));
            }
            let queued = lease.queued;
            expired.push((
                Assignment {
                    worker: lease.worker,
                    task,
                    epoch: lease.epoch,
                },
                queued,
            ));
        }
        self.requeue_front(requeue);
        expired
    }

    /// Cancels a queued or running job: it hands out no more tasks and its
    /// results are refused. Returns the leases the server must tell workers
    /// to drop. A job that is unknown or already over is left as it is.
    pub fn cancel_job(&mut self, job: JobId) -> Vec<Assignment> {
        match self.jobs.get(&job) {
            Some(known) if known.state.is_live() => self.stop_job(job, JobState::Canceled),
            _ => Vec::new(),
        }
    }

    /// Forgets a job that is over (done, failed or canceled), so memory
    /// follows active work; it is then unknown, like one never added.
    /// Returns false, changing nothing, for a live or unknown job.
    pub fn forget_job(&mut self, job: JobId) -> bool {
        if self.jobs.get(&job).is_none_or(|j| j.state.is_live()) {
            return false;
        }
        self.jobs.remove(&job);
        self.affinity.assets.remove(&job);
        self.retries.retain(|(_, task)| task.job != job);
        // Tables sized for a peak of live jobs give the room back once most
        // of them are over.
        shrink_when_sparse(&mut self.jobs);
        shrink_when_sparse(&mut self.affinity.assets);
        true
    }

    pub fn job_state(&self, job: JobId) -> Option<JobState> {
        self.jobs.get(&job).map(|known| known.state.clone())
    }

    pub fn job_progress(&self, job: JobId) -> Option<JobProgress> {
        self.jobs.get(&job).map(|known| JobProgress {
            total: known.total(),
            done: known.done_count,
            running: known.running,
            queued: (known.queue.len() + known.backoff.len() + known.held.len()) as u32,
        })
    }

    /// Holds back `job`'s queued tasks `indices`: they are handed out only
    /// once released (and count as queued meanwhile). Indices that are not
    /// queued are left as they are.
    pub fn hold(&mut self, job: JobId, indices: &[u32]) {
        let Some(known) = self.jobs.get_mut(&job) else {
            return;
        };
        let hold: HashSet<u32> = indices.iter().copied().collect();
        known
            .queue
            .retain(|i| !hold.contains(i) || !known.held.insert(*i));
        sync_ready(&mut self.ready, known);
    }

    /// Queues a held task next in line; false when it was not held (or its
    /// job is over).
    pub fn release_held(&mut self, task: TaskKey) -> bool {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return false;
        };
        if !job.held.remove(&task.index) || !job.state.is_live() {
            return false;
        }
        job.queue.push_front(task.index);
        sync_ready(&mut self.ready, job);
        true
    }

    /// Pauses or resumes a live job: a paused job hands out no new leases;
    /// running ones go on, queued ones (pipelined, not started) are handed
    /// back. Returns false for an unknown or finished job.
    pub fn pause_job(&mut self, job: JobId, paused: bool) -> bool {
        let Some(known) = self.jobs.get_mut(&job).filter(|j| j.state.is_live()) else {
            return false;
        };
        known.paused = paused;
        sync_ready(&mut self.ready, known);
        if paused {
            // Its tasks queued behind render slots have not started: they
            // go back to its queue, so that a pause stops the job once the
            // running ones end (see [`Scheduler::take_superseded`]).
            let holders: Vec<WorkerId> = (self.workers.iter())
                .filter(|(_, w)| w.leases.iter().any(|t| t.job == job))
                .map(|(&id, _)| id)
                .collect();
            for worker in holders {
                self.hand_back_queued(worker, Some(job));
            }
        }
        true
    }

    /// The worker takes no new work from now on; its leases run out
    /// normally, except those queued behind its render slots: they end and
    /// go back to the front of their queues (see
    /// [`Scheduler::take_superseded`]).
    pub fn drain_worker(&mut self, worker: WorkerId) -> bool {
        let Some(known) = self.workers.get_mut(&worker) else {
            return false;
        };
        known.draining = true;
        self.hand_back_queued(worker, None);
        true
    }

    /// Ends `worker`'s leases queued behind its render slots (of `job`
    /// only, with `Some`) and puts their tasks back at the front of their
    /// queues; the worker is told to drop them (see
    /// [`Scheduler::take_superseded`]).
    pub fn hand_back_queued(&mut self, worker: WorkerId, job: Option<JobId>) {
        let Some(known) = self.workers.get(&worker) else {
            return;
        };
        let queued: Vec<TaskKey> = (known.leases.iter().copied())
            .filter(|&t| job.is_none_or(|j| t.job == j))
            .filter(|&t| {
                self.leases
                    .get(&t)
                    .is_some_and(|l| l.worker == worker && l.queued)
            })
            .collect();
        for &task in &queued {
            let lease = self.end_lease(task).expect("listed from the lease table");
            self.superseded.push(Assignment {
                worker,
                task,
                epoch: lease.epoch,
            });
        }
        self.requeue_front(queued);
    }

    /// Whether the worker was silent for a whole lease as of `now`.
    pub fn is_silent(&self, worker: WorkerId, now: Millis) -> bool {
        self.workers
            .get(&worker)
            .is_some_and(|w| w.is_silent(now, self.config.lease_ms))
    }

    /// Where one task stands.
    pub fn task_view(&self, task: TaskKey) -> Option<TaskView> {
        let job = self
            .jobs
            .get(&task.job)
            .filter(|j| task.index < j.total())?;
        Some(TaskView {
            done: job.done[task.index as usize],
            lease: self.leases.get(&task).map(|l| (l.worker, l.epoch)),
            failures: job.failures.get(&task.index).copied().unwrap_or(0),
        })
    }

    /// The earliest lease deadline or end of a retry backoff: call
    /// [`Scheduler::expire`] and [`Scheduler::assign`] then.
    pub fn next_deadline(&self) -> Option<Millis> {
        let lease = self.deadlines.first().map(|&(deadline, _, _)| deadline);
        let retry = self.retries.first().map(|&(at, _)| at);
        lease.into_iter().chain(retry).min()
    }

    /// Takes over a lease a worker reports holding when it (re)joins, so a
    /// task still rendering there is not rendered again: after a coordinator
    /// restart, or when a worker reconnects before its old connection was
    /// noticed gone. The task must be live and not done, `epoch` one this
    /// farm handed out, and the task either waiting in its job's queue or
    /// leased under that same epoch (then the lease moves to `worker`).
    /// Anything else is refused and changes nothing: the worker should drop
    /// the task.
    pub fn adopt(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), Refused> {
        self.live_task(task)?;
        self.tick(now);
        if !self.workers.contains_key(&worker) || epoch.0 >= self.next_epoch {
            return Err(Refused::StaleEpoch {
                task,
                epoch,
                current: self.leases.get(&task).map(|l| l.epoch),
            });
        }
        if self.backups.get(&task).is_some_and(|b| b.epoch == epoch) {
            self.end_backup(task);
            self.grant(task, worker, epoch, now, Attempt::Backup);
            self.seen(worker, now);
            return Ok(());
        }
        match self.leases.get(&task) {
            Some(lease) if lease.epoch == epoch => {
                self.end_lease(task);
            }
            Some(lease) => {
                return Err(Refused::StaleEpoch {
                    task,
                    epoch,
                    current: Some(lease.epoch),
                })
            }
            None => {
                let job = self.jobs.get_mut(&task.job).expect("checked above");
                if job.held.contains(&task.index) {
                    return Err(Refused::Held { task });
                }
                if job.backoff.remove(&task.index).is_none() {
                    let pos = job.queue.iter().position(|&i| i == task.index);
                    job.queue
                        .remove(pos.expect("a live task not done, leased or in backoff is queued"));
                }
            }
        }
        let job = self.jobs.get_mut(&task.job).expect("checked above");
        job.running += 1;
        if job.state == JobState::Queued {
            job.state = JobState::Running;
        }
        sync_ready(&mut self.ready, job);
        self.grant(task, worker, epoch, now, Attempt::Primary);
        self.seen(worker, now);
        Ok(())
    }

    /// Ends `worker`'s lease on `task` under `epoch` without marking the
    /// task done or counting a failure: its result is kept aside to be
    /// checked, or the worker may not deliver it. The task runs on in its
    /// other attempt, if any, or goes back to the front of its queue.
    pub fn release(
        &mut self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), Refused> {
        let attempt = self.check_lease(worker, task, epoch)?;
        self.tick(now);
        match attempt {
            Attempt::Backup => {
                self.end_backup(task);
            }
            Attempt::Primary => {
                self.end_lease(task);
                if !self.promote_backup(task) {
                    self.requeue(task, Requeue::Front);
                }
            }
        }
        self.seen(worker, now);
        self.proved(worker);
        Ok(())
    }

    /// Gives `task` to no worker tagged `tag` from now on.
    pub fn exclude(&mut self, task: TaskKey, tag: Tag) {
        if let Some(job) = self.jobs.get_mut(&task.job) {
            let tags = job.excluded.entry(task.index).or_default();
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
    }

    /// Marks a done task of a live job as not done and queues it first: its
    /// result was withdrawn (its worker was caught returning wrong pixels).
    /// Returns false, changing nothing, when the task is not done.
    pub fn reopen(&mut self, task: TaskKey) -> bool {
        let Some(job) = self.jobs.get_mut(&task.job) else {
            return false;
        };
        if !job.done.get(task.index as usize).copied().unwrap_or(false)
            || !matches!(job.state, JobState::Running | JobState::Done)
        {
            return false;
        }
        job.done[task.index as usize] = false;
        job.done_count -= 1;
        job.state = JobState::Running;
        self.requeue(task, Requeue::Front);
        true
    }

    /// Names the worker's connection by `tag` (see [`Tag`]); a new worker
    /// is tagged by its own id.
    pub fn set_worker_tag(&mut self, worker: WorkerId, tag: Tag) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.tag = tag;
        }
    }

    /// The leases `worker` may hold at once now (see [`TRUSTED_SLOTS`]).
    pub fn usable_slots(&self, worker: WorkerId) -> u32 {
        self.workers.get(&worker).map_or(0, |w| w.usable_slots())
    }

    /// Queued tasks of `job` that only a worker with none of their excluded
    /// tags may take, with those tags: what a check waits for.
    pub fn excluded_queued(&self, job: JobId) -> Vec<(u32, Vec<Tag>)> {
        let Some(j) = self.jobs.get(&job) else {
            return Vec::new();
        };
        (j.queue.iter())
            .filter_map(|i| j.excluded.get(i).map(|t| (*i, t.clone())))
            .collect()
    }

    /// Whether some connected worker that takes work is tagged `tag`.
    pub fn connected_tags(&self) -> Vec<(WorkerId, Tag)> {
        (self.workers.iter())
            .filter(|(_, w)| !w.draining)
            .map(|(&id, w)| (id, w.tag))
            .collect()
    }

    fn proved(&mut self, worker: WorkerId) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.proven = w.proven.saturating_add(1);
        }
        self.promote_queued(worker);
    }

    /// Whether `worker` holds a current lease (or a straggler's second
    /// one) on `task` under `epoch`: what it may report on or send a
    /// result for.
    pub fn holds_lease(&self, worker: WorkerId, task: TaskKey, epoch: Epoch) -> bool {
        self.check_lease(worker, task, epoch).is_ok()
    }

    /// Digests held by `worker`, as far as affinity knows.
    #[cfg(test)]
    pub(crate) fn held_count(&self, worker: WorkerId) -> usize {
        self.affinity.held.get(&worker).map_or(0, |h| h.len())
    }

    /// The leases `worker` holds, in task order.
    pub fn running_on(&self, worker: WorkerId) -> Vec<(TaskKey, Epoch)> {
        let Some(known) = self.workers.get(&worker) else {
            return Vec::new();
        };
        (known.leases.iter())
            .map(|&task| match self.leases.get(&task) {
                Some(lease) if lease.worker == worker => (task, lease.epoch),
                _ => (task, self.backups[&task].epoch),
            })
            .collect()
    }

    /// The epoch the next assignment will get; persist it to seed
    /// [`Config::first_epoch`] after a restart.
    pub fn next_epoch(&self) -> u64 {
        self.next_epoch
    }

    /// The live job that comes first among those `worker` can render.
    fn best_job_for(&self, worker: WorkerId) -> Option<JobId> {
        let engines = &self.workers[&worker].engines;
        engines
            .iter()
            .filter_map(|engine| {
                self.ready.get(engine)?.iter().find(|&&(_, _, job)| {
                    let j = &self.jobs[&job];
                    !j.blocklist.contains(&worker)
                        && self.blender_fits(worker, job)
                        && j.has_task_for(self.workers[&worker].tag)
                })
            })
            .min()
            .map(|&(_, _, job)| job)
    }

    /// The error of `job`'s most recent failed attempt, if any.
    pub fn last_error(&self, job: JobId) -> Option<&str> {
        let j = self.jobs.get(&job)?;
        j.last_error.as_deref()
    }

    /// Gives `worker` no more of `job`'s tasks (it cannot render them).
    pub fn blocklist(&mut self, job: JobId, worker: WorkerId) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.blocklist.insert(worker);
        }
    }

    /// Whether `worker` failed too often to get more of `job`'s tasks.
    pub fn is_blocklisted(&self, job: JobId, worker: WorkerId) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.blocklist.contains(&worker))
    }

    fn lease_next_task(&mut self, job_id: JobId, worker: WorkerId, now: Millis) -> Assignment {
        let tag = self.workers[&worker].tag;
        let job = self.jobs.get_mut(&job_id).expect("a ready job exists");
        // A retry goes to another worker when one of the next few tasks is
        // not one this worker already failed; a task excluded for it (its
        // result is being checked) never does.
        let failed_here = |i: &u32| job.failed_on.get(i).is_some_and(|w| w.contains(&worker));
        let excluded = |i: &u32| job.is_excluded(*i, tag);
        let near = || job.queue.iter().take(64);
        let pos = (near().position(|i| !failed_here(i) && !excluded(i)))
            .or_else(|| near().position(|i| !excluded(i)))
            .expect("the caller checked that the job has a task for this worker");
        let index = job
            .queue
            .remove(pos)
            .expect("a ready job has a queued task");
        job.running += 1;
        if job.state == JobState::Queued {
            job.state = JobState::Running;
        }
        sync_ready(&mut self.ready, job);
        let task = TaskKey { job: job_id, index };
        let epoch = Epoch(self.next_epoch);
        self.next_epoch += 1;
        self.grant(task, worker, epoch, now, Attempt::Primary);
        Assignment {
            worker,
            task,
            epoch,
        }
    }

    /// Records a lease; a first attempt is counted as running by the
    /// caller.
    fn grant(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        epoch: Epoch,
        now: Millis,
        attempt: Attempt,
    ) {
        let deadline = now.saturating_add(self.config.lease_ms);
        let queued = self.pipelining
            && self.rendering(worker) >= self.workers[&worker].usable_slots() as usize;
        let lease = Lease {
            worker,
            epoch,
            deadline,
            started: now,
            queued,
        };
        match attempt {
            Attempt::Primary => self.leases.insert(task, lease),
            Attempt::Backup => self.backups.insert(task, lease),
        };
        self.deadlines.insert((deadline, task, attempt));
        self.workers
            .get_mut(&worker)
            .expect("leases go to known workers")
            .leases
            .insert(task);
    }

    /// Queues again the failed tasks whose backoff ended by `now`.
    fn release_retries(&mut self, now: Millis) {
        while let Some(&(at, task)) = self.retries.first() {
            if at > now {
                break;
            }
            self.retries.pop_first();
            let Some(job) = self.jobs.get_mut(&task.job) else {
                continue;
            };
            // Skipped when the job ended or the task was adopted meanwhile.
            if job.backoff.get(&task.index) == Some(&at) {
                job.backoff.remove(&task.index);
                if job.state.is_live() {
                    self.requeue(task, Requeue::Back);
                }
            }
        }
    }

    /// Whether `worker` holds the current lease of `task` under `epoch`.
    fn seen(&mut self, worker: WorkerId, now: Millis) {
        if let Some(known) = self.workers.get_mut(&worker) {
            known.last_seen = known.last_seen.max(now);
        }
    }

    /// `task` exists, is not done, and its job still runs.
    fn live_task(&self, task: TaskKey) -> Result<(), Refused> {
        let job = (self.jobs.get(&task.job))
            .filter(|job| task.index < job.total())
            .ok_or(Refused::UnknownTask { task })?;
        if job.done[task.index as usize] {
            return Err(Refused::AlreadyDone { task });
        }
        if !job.state.is_live() {
            return Err(Refused::JobNotRunning {
                job: task.job,
                state: job.state.clone(),
            });
        }
        Ok(())
    }

    fn check_lease(
        &self,
        worker: WorkerId,
        task: TaskKey,
        epoch: Epoch,
    ) -> Result<Attempt, Refused> {
        self.live_task(task)?;
        if (self.backups.get(&task)).is_some_and(|b| b.epoch == epoch && b.worker == worker) {
            return Ok(Attempt::Backup);
        }
        let lease = self.leases.get(&task);
        match lease {
            Some(lease) if lease.epoch == epoch && lease.worker == worker => Ok(Attempt::Primary),
            Some(lease) if lease.epoch == epoch => Err(Refused::NotLeasedToWorker {
                task,
                worker,
                holder: lease.worker,
            }),
            _ => Err(Refused::StaleEpoch {
                task,
                epoch,
                current: lease.map(|lease| lease.epoch),
            }),
        }
    }

    /// Removes a lease from every table; the task is then neither running nor
    /// queued until the caller decides.
    fn end_lease(&mut self, task: TaskKey) -> Option<Lease> {
        let lease = self.leases.remove(&task)?;
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Primary));
        if let Some(worker) = self.workers.get_mut(&lease.worker) {
            worker.leases.remove(&task);
        }
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.running -= 1;
        }
        self.promote_queued(lease.worker);
        Some(lease)
    }

    /// Ends a straggler's second lease; the task's counts do not change.
    fn end_backup(&mut self, task: TaskKey) -> Option<Lease> {
        let lease = self.backups.remove(&task)?;
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Backup));
        if let Some(worker) = self.workers.get_mut(&lease.worker) {
            worker.leases.remove(&task);
        }
        self.promote_queued(lease.worker);
        Some(lease)
    }

    /// After a task's first lease ended without a result: its second
    /// attempt, if any, becomes the first, and the task runs on.
    fn promote_backup(&mut self, task: TaskKey) -> bool {
        let Some(lease) = self.backups.remove(&task) else {
            return false;
        };
        self.deadlines
            .remove(&(lease.deadline, task, Attempt::Backup));
        self.deadlines
            .insert((lease.deadline, task, Attempt::Primary));
        self.leases.insert(task, lease);
        if let Some(job) = self.jobs.get_mut(&task.job) {
            job.running += 1;
        }
        true
    }

    fn requeue(&mut self, task: TaskKey, end: Requeue) {
        let job = self
            .jobs
            .get_mut(&task.job)
            .expect("a leased task's job exists");
        match end {
            Requeue::Front => job.queue.push_front(task.index),
            Requeue::Back => job.queue.push_back(task.index),
        }
        sync_ready(&mut self.ready, job);
    }

    /// Requeues tasks at the front so that they come back in task order.
    fn requeue_front(&mut self, mut tasks: Vec<TaskKey>) {
        tasks.sort_unstable_by(|a, b| b.cmp(a));
        for task in tasks {
            self.requeue(task, Requeue::Front);
        }
    }

    /// Ends a live job as `state`: its leases end and its queue empties.
    fn stop_job(&mut self, job_id: JobId, state: JobState) -> Vec<Assignment> {
        let first = TaskKey {
            job: job_id,
            index: 0,
        };
        let last = TaskKey {
            job: job_id,
            index: u32::MAX,
        };
        let tasks: Vec<TaskKey> = self
            .leases
            .range(first..=last)
            .map(|(&task, _)| task)
            .collect();
        let mut ended = Vec::with_capacity(tasks.len());
        for task in tasks {
            let lease = self.end_lease(task).expect("listed from the lease table");
            let backup = self.end_backup(task);
            for lease in [Some(lease), backup].into_iter().flatten() {
                ended.push(Assignment {
                    worker: lease.worker,
                    task,
                    epoch: lease.epoch,
                });
            }
        }
        let job = self
            .jobs
            .get_mut(&job_id)
            .expect("the caller checked the job");
        job.state = state;
        job.queue.clear();
        job.backoff.clear();
        job.held.clear();
        sync_ready(&mut self.ready, job);
        ended
    }
}

/// A failed task's attempts as one line: each distinct error once, with the
/// workers that hit it ("worker 3: X" or "workers 3, 5 (3 attempts): X").
fn collect_errors(attempts: &[(WorkerId, String)]) -> String {
    let mut distinct: Vec<(&str, Vec<WorkerId>)> = Vec::new();
    for (worker, error) in attempts {
        match distinct.iter_mut().find(|(e, _)| *e == error.as_str()) {
            Some((_, workers)) => workers.push(*worker),
            None => distinct.push((error, vec![*worker])),
        }
    }
    distinct
        .into_iter()
        .map(|(error, workers)| {
            let mut names: Vec<WorkerId> = workers.clone();
            names.sort_unstable();
            names.dedup();
            let names: Vec<String> = names.iter().map(|w| w.to_string()).collect();
            let who = if names.len() == 1 {
                format!("worker {}", names[0])
            } else {
                format!("workers {}", names.join(", "))
            };
            if workers.len() == 1 {
                format!("{who}: {error}")
            } else {
                format!("{who} ({} attempts): {error}", workers.len())
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The wait before the retry that follows failure number `attempts`.
fn retry_backoff(base: Millis, attempts: u32) -> Millis {
    let doublings = attempts.saturating_sub(1).min(16);
    base.saturating_mul(1 << doublings)
        .min(MAX_RETRY_BACKOFF_MS)
}

/// Keeps `job` in its engine's ready set exactly while it is live and has
/// queued tasks.
fn sync_ready(ready: &mut HashMap<String, BTreeSet<Rank>>, job: &Job) {
    if job.state.is_live() && !job.paused && !job.queue.is_empty() {
        match ready.get_mut(&job.engine) {
            Some(ranks) => {
                ranks.insert(job.rank);
            }
            None => {
                ready.insert(job.engine.clone(), BTreeSet::from([job.rank]));
            }
        }
    } else if let Some(ranks) = ready.get_mut(&job.engine) {
        ranks.remove(&job.rank);
    }
}
