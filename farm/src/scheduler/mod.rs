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
//!
//! This file holds the types and the state; the `impl Scheduler` is split by
//! what it is about: `jobs` and `workers`
//! coming and going, `assign` (which worker gets which task), `results`
//! (leases, epochs, completion, failure, expiry, adoption), `pipeline`
//! (queued leases behind busy slots), `affinity` (cache affinity) and
//! [`blender`] (Blender version matching).

use std::cmp::Reverse;
use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;

use tessera_protocol::blender::{BlenderNeeds, BlenderOffer};
use tessera_protocol::messages::MAX_CACHED_DIGESTS;
use tessera_protocol::Digest;

mod affinity;
mod assign;
pub mod blender;
mod host;
mod jobs;
mod pipeline;
mod results;
mod workers;

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
    /// What each job with host needs asks of a machine, and what each
    /// worker's machine has (see [`host`]).
    host_needs: HashMap<JobId, tessera_protocol::host::HostNeeds>,
    host_facts: HashMap<WorkerId, tessera_protocol::host::HostFacts>,
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
            host_needs: HashMap::new(),
            host_facts: HashMap::new(),
            pipelining: false,
            clock: 0,
            promoted: Vec::new(),
        }
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

    /// The earliest lease deadline or end of a retry backoff: call
    /// [`Scheduler::expire`] and [`Scheduler::assign`] then.
    pub fn next_deadline(&self) -> Option<Millis> {
        let lease = self.deadlines.first().map(|&(deadline, _, _)| deadline);
        let retry = self.retries.first().map(|&(at, _)| at);
        lease.into_iter().chain(retry).min()
    }

    /// Digests held by `worker`, as far as affinity knows.
    #[cfg(test)]
    pub(crate) fn held_count(&self, worker: WorkerId) -> usize {
        self.affinity.held.get(&worker).map_or(0, |h| h.len())
    }
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
