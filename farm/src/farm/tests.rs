//! The farm core on virtual time: fake workers are ids and inboxes, the
//! database is a set of committed tasks, and every effect the core returns
//! is collected and checked. No clock, no sockets, no sleeps.
//!
//! The cases read as data where they can; the randomized simulation at the
//! end drives many workers joining, leaving, rejoining with their tasks,
//! going silent and failing, with commits and stitches arriving late and in
//! batches, and checks that each task is accepted exactly once and that the
//! job counters equal the committed results.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tessera_protocol::job::{Engine, JobSpec, ManifestEntry, TileGrid};
use tessera_protocol::messages::{
    CoordMsg, FarmEvent, JobState, StitchedPasses, TaskRef, TaskSpec, TileState, WorkerInfo,
    WorkerMsg, WorkerState,
};
use tessera_protocol::Digest;

use super::*;
use crate::farm::FinalCounts;

const LEASE: Millis = 1_000;

fn config(max_attempts: u32) -> FarmConfig {
    FarmConfig {
        scheduler: scheduler::Config {
            lease_ms: LEASE,
            max_attempts,
            first_epoch: 1,
            retry_backoff_ms: 0,
            straggler_percent: 0,
        },
        cache_affinity: true,
        pipelining: false,
        heartbeat_ms: LEASE / 4,
        lease_ms: LEASE,
        store_urls: false,
    }
}

/// A builtin job of `frames` frames, each cut into `tiles` tiles.
fn spec(name: &str, frames: u32, tiles: u32) -> JobSpec {
    JobSpec {
        manifest: vec![ManifestEntry {
            path: "scene.json".into(),
            digest: Digest::of(name.as_bytes()),
            size: name.len() as u64,
            origin: None,
            frame: None,
        }],
        frames: (1..=frames).collect(),
        tiles: TileGrid {
            cols: tiles,
            rows: 1,
        },
        samples: 4,
        resolution: (64, 16),
        ..JobSpec::new(name, Engine::Builtin, "scene.json")
    }
}

fn worker_info(slots: u32, engine: Engine, holding: Vec<TaskRef>) -> WorkerInfo {
    WorkerInfo {
        engines: vec![engine],
        slots,
        price_per_hour: 1.0,
        hostname: "test".into(),
        holding,
        interruptible: false,
        cached: Vec::new(),
        blenders: Vec::new(),
        fetches_builds: false,
        draining: false,
        host: None,
    }
}

/// One farm core on virtual time, with every effect sorted by kind.
struct Farm {
    core: FarmCore,
    now: Millis,
    /// Messages per worker, oldest first, not yet read by the test.
    inbox: HashMap<WorkerId, Vec<CoordMsg>>,
    events: Vec<FarmEvent>,
    commits: Vec<AcceptedResult>,
    stitches: Vec<(u64, usize)>,
    records: Vec<(u64, JobState, Option<String>)>,
    /// Each recorded job's counters.
    finals: HashMap<u64, FinalCounts>,
    wakes: usize,
    next_job: u64,
    quarantined: Vec<String>,
    withdrawn: Vec<(u64, Vec<u32>)>,
    /// Recorded holds: (job, paused, released).
    holds: Vec<(u64, bool, bool)>,
    /// Recorded priorities: (job, priority).
    priorities: Vec<(u64, i32)>,
    /// Jobs told blocked, and whose budget was reached.
    blocked: Vec<u64>,
    budgets: Vec<u64>,
    /// Encode jobs whose inputs were asked for: (job, input job).
    resolve: Vec<(u64, u64)>,
}

impl Farm {
    fn new(max_attempts: u32) -> Farm {
        Farm {
            core: FarmCore::new(config(max_attempts)),
            now: 0,
            inbox: HashMap::new(),
            events: Vec::new(),
            commits: Vec::new(),
            stitches: Vec::new(),
            records: Vec::new(),
            finals: HashMap::new(),
            wakes: 0,
            next_job: 1,
            quarantined: Vec::new(),
            withdrawn: Vec::new(),
            holds: Vec::new(),
            priorities: Vec::new(),
            blocked: Vec::new(),
            budgets: Vec::new(),
            resolve: Vec::new(),
        }
    }

    fn now(&self) -> Now {
        Now {
            ms: self.now,
            unix_ms: 1_700_000_000_000 + self.now,
        }
    }

    fn at(&mut self, now: Millis) -> &mut Farm {
        assert!(now >= self.now, "virtual time runs forward");
        self.now = now;
        self
    }

    fn collect(&mut self) {
        for effect in self.core.take_effects() {
            match effect {
                Effect::Send { worker, msg } => self.inbox.entry(worker).or_default().push(msg),
                Effect::Event { event, .. } => self.events.push(event),
                Effect::Commit(c) => self.commits.push(c),
                Effect::Stitch { job, frame_pos } => self.stitches.push((job, frame_pos)),
                Effect::Record {
                    job,
                    state,
                    error,
                    counts,
                    ..
                } => {
                    self.records.push((job, state, error));
                    self.finals.insert(job, counts);
                }
                Effect::Wake => self.wakes += 1,
                Effect::Blocked { job, .. } => self.blocked.push(job),
                Effect::Ended { .. } => {}
                Effect::BudgetReached { status } => self.budgets.push(status.id),
                Effect::Leased { .. } => {}
                Effect::Quarantine { identity, .. } => self.quarantined.push(identity),
                Effect::Withdraw { job, tasks, .. } => self.withdrawn.push((job, tasks)),
                Effect::Holds {
                    job,
                    paused,
                    released,
                } => self.holds.push((job, paused, released)),
                Effect::ResolveInputs { job, input } => self.resolve.push((job, input)),
                Effect::Priority { job, priority } => self.priorities.push((job, priority)),
            }
        }
    }

    fn submit(&mut self, spec: JobSpec) -> u64 {
        let id = self.next_job;
        self.next_job += 1;
        let now = self.now();
        self.core.submit(id, spec, now.unix_ms, 0, 0, now);
        // Every job it runs after was submitted to this core.
        self.core.link_after(id, &[], now);
        self.collect();
        id
    }

    fn join(&mut self, name: &str, info: WorkerInfo) -> WorkerId {
        let now = self.now();
        // Each test worker is enrolled under its own name.
        let id = self.core.worker_joined(name, name, info, now);
        self.collect();
        id
    }

    fn leave(&mut self, id: WorkerId) -> usize {
        let now = self.now();
        let n = self.core.worker_left(id, now);
        self.collect();
        self.inbox.remove(&id);
        n
    }

    fn dispatch(&mut self) {
        let now = self.now();
        self.core.dispatch(now);
        self.collect();
    }

    fn msg(&mut self, id: WorkerId, msg: WorkerMsg) {
        let now = self.now();
        self.core.worker_msg(id, msg, now);
        self.collect();
    }

    fn done(&mut self, id: WorkerId, task: TaskRef) {
        let now = self.now();
        self.core
            .result_offered(id, task, Digest::of(&task.index.to_le_bytes()), 10, now);
        self.collect();
    }

    /// Commits every pending result (all fresh unless already committed).
    fn commit_all(&mut self, db: &mut BTreeSet<(u64, u32)>) {
        let batch = std::mem::take(&mut self.commits);
        let fresh = (batch.iter())
            .map(|c| db.insert((c.task.job, c.task.index)))
            .collect();
        let now = self.now();
        self.core.committed(&batch, Ok(fresh), now);
        self.collect();
    }

    fn stitch_all(&mut self) {
        for (job, pos) in std::mem::take(&mut self.stitches) {
            assert!(
                self.core.stitch_plan(job, pos).is_some(),
                "job {job} frame {pos}"
            );
            let now = self.now();
            self.core.frame_stitched(job, pos, now);
            self.collect();
        }
    }

    /// Messages worker `id` has received since last asked.
    fn read(&mut self, id: WorkerId) -> Vec<CoordMsg> {
        self.inbox.remove(&id).unwrap_or_default()
    }

    /// The leases worker `id` has been assigned since last asked.
    fn assigned(&mut self, id: WorkerId) -> Vec<TaskSpec> {
        (self.read(id).into_iter())
            .filter_map(|m| match m {
                CoordMsg::Assign(spec) => Some(spec),
                _ => None,
            })
            .collect()
    }

    fn state(&self, job: u64) -> JobState {
        self.core.job_status(job, self.now()).expect("job").state
    }
}

fn kinds(msgs: &[CoordMsg]) -> Vec<String> {
    msgs.iter()
        .map(|m| match m {
            CoordMsg::Joined { .. } => "joined".to_string(),
            CoordMsg::Enrolled { .. } => "enrolled".to_string(),
            CoordMsg::Job(j) => format!("job {}", j.job),
            CoordMsg::Assign(s) => format!("assign {}/{}", s.task.job, s.task.index),
            CoordMsg::Cancel(t) => format!("cancel {}/{}", t.job, t.index),
            CoordMsg::Drain => "drain".to_string(),
            CoordMsg::Ack { task, accepted, .. } => {
                format!("ack {}/{} {accepted}", task.job, task.index)
            }
            CoordMsg::Builds(b) => format!("builds {}", b.len()),
            CoordMsg::Scan { id, .. } => format!("scan {id}"),
        })
        .collect()
}

#[test]
fn a_joining_worker_is_welcomed_then_sent_the_job_then_its_leases() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 3, 1));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.dispatch();
    let msgs = farm.read(w);
    assert_eq!(
        kinds(&msgs),
        ["joined", "job 1", "assign 1/0", "assign 1/1"],
        "job {job}"
    );
    assert_eq!(farm.state(job), JobState::Running);
}

#[test]
fn a_job_completes_when_every_frame_is_committed_and_stitched() {
    let mut farm = Farm::new(3);
    let mut db = BTreeSet::new();
    let job = farm.submit(spec("a", 2, 2));
    let w = farm.join("w1", worker_info(4, Engine::Builtin, vec![]));
    farm.dispatch();
    let leases = farm.assigned(w);
    assert_eq!(leases.len(), 4);
    for spec in &leases[..3] {
        farm.done(w, spec.task);
    }
    // Not acknowledged, not counted, nothing to stitch before the commit.
    assert!(farm.read(w).is_empty());
    assert_eq!(farm.core.job_status(job, farm.now()).unwrap().tasks_done, 0);
    farm.commit_all(&mut db);
    assert_eq!(
        kinds(&farm.read(w)),
        ["ack 1/0 true", "ack 1/1 true", "ack 1/2 true"]
    );
    assert_eq!(farm.stitches, [(job, 0)], "frame 1's two tiles are in");
    farm.stitch_all();
    farm.done(w, leases[3].task);
    farm.commit_all(&mut db);
    assert_eq!(farm.stitches, [(job, 1)]);
    assert!(
        farm.records.is_empty(),
        "not done before its last frame is stitched"
    );
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
    let counts = FinalCounts {
        tasks_done: 4,
        frames_done: 2,
        render_ms: 40,
        bytes_to_workers: 0,
    };
    assert_eq!(farm.finals[&job], counts, "recorded with the job");
    // Finished, it is forgotten: the database describes it from now on.
    assert!(farm.core.job_status(job, farm.now()).is_none());
    assert!(farm.core.stitch_plan(job, 0).is_none());
    let statuses = farm.core.worker_statuses(farm.now());
    assert_eq!(
        (statuses[0].tasks_done, statuses[0].state),
        (4, WorkerState::Idle)
    );
}

#[test]
fn a_worker_adopts_only_leases_handed_to_a_worker_of_its_name() {
    let mut farm = Farm::new(3);
    farm.submit(spec("a", 3, 1));
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w1)[0].task;
    assert_eq!(farm.leave(w1), 1);
    // Another worker names w1's ended lease, and queued tasks it was never
    // given under epoch 0 and under an epoch of this run.
    let queued = |index, epoch| TaskRef {
        job: lease.job,
        index,
        epoch,
    };
    let claims = vec![lease, queued(1, 0), queued(2, lease.epoch)];
    let rogue = farm
        .at(100)
        .join("rogue", worker_info(3, Engine::Builtin, claims));
    assert_eq!(
        kinds(&farm.read(rogue)),
        ["joined", "cancel 1/0", "cancel 1/1", "cancel 1/2"],
        "nothing adopted"
    );
    // w1, rejoining under its own name, adopts its lease.
    let back = farm
        .at(200)
        .join("w1", worker_info(1, Engine::Builtin, vec![lease]));
    assert_eq!(
        kinds(&farm.read(back)),
        ["joined"],
        "its own lease is adopted"
    );
}

#[test]
fn a_worker_that_leaves_gives_its_tasks_back_and_rejoining_keeps_what_it_still_holds() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 2, 1));
    let w1 = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.dispatch();
    let leases = farm.assigned(w1);
    assert_eq!(leases.len(), 2);
    assert_eq!(farm.leave(w1), 2, "both tasks go back to the queue");
    // It rejoins naming one task under its lease and one under a lease this
    // farm never handed out.
    let forged = TaskRef {
        epoch: 999,
        ..leases[1].task
    };
    let w2 = farm.at(100).join(
        "w1",
        worker_info(2, Engine::Builtin, vec![leases[0].task, forged]),
    );
    assert_eq!(kinds(&farm.read(w2)), ["joined", "cancel 1/1"]);
    farm.dispatch();
    let again = farm.assigned(w2);
    assert_eq!(
        again.iter().map(|s| s.task.index).collect::<Vec<_>>(),
        [1],
        "the adopted task is not handed out again"
    );
    let mut db = BTreeSet::new();
    farm.done(w2, leases[0].task);
    farm.done(w2, again[0].task);
    farm.commit_all(&mut db);
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
    assert_eq!(db.len(), 2);
}

#[test]
fn a_late_result_from_a_worker_that_left_is_refused() {
    let mut farm = Farm::new(3);
    farm.submit(spec("a", 1, 1));
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w1)[0].task;
    farm.leave(w1);
    let w2 = farm.join("w2", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let again = farm.assigned(w2)[0].task;
    assert!(again.epoch > lease.epoch);
    // w1 comes back without naming the task, then sends its stale result.
    let w1b = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.read(w1b);
    farm.done(w1b, lease);
    assert_eq!(kinds(&farm.read(w1b)), ["ack 1/0 false"]);
    assert!(farm.commits.is_empty());
}

#[test]
fn canceling_a_job_during_a_render_tells_its_worker_and_records_it() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 2, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w)[0].task;
    let now = farm.now();
    let status = farm.core.cancel(job, now).expect("job");
    farm.collect();
    assert_eq!(status.state, JobState::Canceled);
    assert_eq!(kinds(&farm.read(w)), ["cancel 1/0"]);
    assert_eq!(farm.records, [(job, JobState::Canceled, None)]);
    // The result that was on its way is refused; nothing more is handed out.
    farm.done(w, lease);
    assert_eq!(kinds(&farm.read(w)), ["ack 1/0 false"]);
    farm.at(5 * LEASE).dispatch();
    assert!(farm.read(w).is_empty());
    // Canceling again changes nothing: the core no longer holds it.
    let now = farm.now();
    assert!(farm.core.cancel(job, now).is_none());
    assert!(farm.core.cancel(99, now).is_none());
    farm.collect();
    assert_eq!(farm.records.len(), 1);
}

#[test]
fn a_paused_job_hands_out_nothing_until_resumed() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 2, 1));
    let now = farm.now();
    assert!(farm.core.pause(job, true, now));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    assert!(farm.assigned(w).is_empty());
    assert!(farm.core.job_status(job, farm.now()).unwrap().paused);
    let wakes = farm.wakes;
    assert!(farm.core.pause(job, false, now));
    farm.collect();
    assert!(farm.wakes > wakes, "resuming wakes the dispatcher");
    farm.dispatch();
    assert_eq!(farm.assigned(w).len(), 2);
    assert!(!farm.core.pause(99, true, now), "no such job");
}

#[test]
fn a_raised_priority_takes_the_next_free_slot_and_is_recorded() {
    let mut farm = Farm::new(3);
    let first = farm.submit(spec("first", 4, 1));
    let second = farm.submit(spec("second", 4, 1));
    assert!(farm.core.set_priority(second, 5));
    farm.collect();
    assert_eq!(farm.priorities, vec![(second, 5)]);
    assert_eq!(
        farm.core.job_status(second, farm.now()).unwrap().priority,
        5
    );
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    let got = farm.assigned(w);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].task.job, second, "the later job, raised, goes first");
    // Lowered below the other, the first job's tasks come next.
    assert!(farm.core.set_priority(second, -1));
    farm.done(w, got[0].task);
    farm.dispatch();
    assert_eq!(farm.assigned(w)[0].task.job, first);
    assert!(!farm.core.set_priority(99, 1), "no such job");
}

#[test]
fn a_workers_telemetry_history_keeps_its_latest_readings() {
    use tessera_protocol::messages::MAX_TELEMETRY_HISTORY;
    use tessera_protocol::telemetry::{HostTelemetry, Telemetry};
    let mut farm = Farm::new(3);
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    let n = MAX_TELEMETRY_HISTORY + 5;
    for i in 0..n {
        let telemetry = Telemetry {
            host: HostTelemetry {
                cpu_model: "cpu".into(),
                cores: 2,
                load_1m: i as f32,
                memory_used_bytes: 1,
                memory_total_bytes: 2,
            },
            gpus: vec![],
            gpu_note: Some("no NVIDIA driver".into()),
        };
        farm.msg(
            w,
            WorkerMsg::Heartbeat {
                telemetry: Some(telemetry),
            },
        );
    }
    let detail = farm.core.worker_detail(w, farm.now()).unwrap();
    assert_eq!(detail.history.len(), MAX_TELEMETRY_HISTORY);
    assert_eq!(detail.history[0].load_1m, 5.0, "the oldest went");
    assert_eq!(detail.history.last().unwrap().load_1m, (n - 1) as f32);
    assert_eq!(detail.history[0].gpu_utilization_pct, None);
    assert!(farm.core.worker_detail(w + 1, farm.now()).is_none());
}

#[test]
fn a_task_that_fails_max_attempts_times_fails_its_job_with_the_errors() {
    let mut farm = Farm::new(2);
    let job = farm.submit(spec("a", 2, 1));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    let mut failures = 0;
    for step in 0..10 {
        farm.at(step * 10).dispatch();
        let Some(lease) = farm.assigned(w).into_iter().find(|s| s.task.index == 0) else {
            continue;
        };
        failures += 1;
        let error = format!("boom {failures}");
        farm.msg(
            w,
            WorkerMsg::Failed {
                task: lease.task,
                error,
                log: String::new(),
                unsupported: false,
            },
        );
        if !farm.records.is_empty() {
            break;
        }
    }
    assert_eq!(failures, 2);
    let (id, state, error) = farm.records[0].clone();
    assert_eq!((id, state), (job, JobState::Failed));
    let error = error.expect("an error");
    assert!(error.starts_with("task 0 failed 2 times"), "{error}");
    assert!(error.contains("boom 2"), "{error}");
    assert!(farm.events.iter().any(|e| matches!(
        e,
        FarmEvent::JobChanged {
            state: JobState::Failed,
            ..
        }
    )));
    assert_eq!(farm.finals[&job].tasks_done, 0);
    assert!(farm.core.job_status(job, farm.now()).is_none(), "forgotten");
}

#[test]
fn a_commit_the_database_could_not_take_refuses_the_result_and_runs_the_task_again() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w)[0].task;
    farm.done(w, lease);
    let batch = std::mem::take(&mut farm.commits);
    let now = farm.now();
    let unreachable = CommitFailure {
        reason: "the database cannot be reached".into(),
        transient: true,
    };
    farm.core.committed(&batch, Err(unreachable), now);
    farm.collect();
    assert_eq!(kinds(&farm.read(w)), ["ack 1/0 false"]);
    assert!(
        farm.records.is_empty(),
        "the job did not fail: {:?}",
        farm.records
    );
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.state, JobState::Queued, "its task is queued again");
    assert_eq!(status.tasks_done, 0);
    // Not at once (rendered again and again while nothing can be kept):
    // after OUTAGE_HOLD_MS, under a new lease.
    farm.dispatch();
    assert!(farm.assigned(w).is_empty(), "handed out again at once");
    let t = farm.now;
    farm.at(t + crate::farm::OUTAGE_HOLD_MS);
    farm.dispatch();
    let again = farm.assigned(w)[0].task;
    assert_eq!((again.job, again.index), (lease.job, lease.index));
    assert!(again.epoch > lease.epoch);
    // Refused again in a row: it waits twice as long.
    farm.done(w, again);
    let batch = std::mem::take(&mut farm.commits);
    let refused = CommitFailure {
        reason: "the bucket refused: HTTP 403 AccessDenied".into(),
        transient: true,
    };
    farm.core.committed(&batch, Err(refused), farm.now());
    farm.collect();
    let t = farm.now;
    farm.at(t + crate::farm::OUTAGE_HOLD_MS);
    farm.dispatch();
    assert!(farm.assigned(w).is_empty(), "the second wait is longer");
    farm.at(t + 2 * crate::farm::OUTAGE_HOLD_MS);
    // (Heard from meanwhile: a worker silent for a lease gets nothing.)
    farm.msg(w, WorkerMsg::Heartbeat { telemetry: None });
    farm.dispatch();
    let third = farm.assigned(w)[0].task;
    assert!(third.epoch > again.epoch);
    // Once results are kept again, no wait is left over.
    farm.done(w, third);
    farm.commit_all(&mut BTreeSet::new());
    let acks = kinds(&farm.read(w));
    assert_eq!(
        acks.last().map(String::as_str),
        Some("ack 1/0 true"),
        "{acks:?}"
    );
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
}

/// A commit whose answer was lost (PostgreSQL stopped at its COMMIT) and
/// whose retries then ran out: the core was told it failed, though the
/// row is in the database. The task ran again, and its second result found
/// the first one's row there; that row is counted and the frame stitched.
/// Before, it was acknowledged and never counted: the frame was never
/// stitched and the job never ended (seen in CI's `state::postgresql_down…`).
#[test]
fn a_result_whose_refused_commit_had_landed_is_counted_when_its_task_runs_again() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 2));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.dispatch();
    let leases: Vec<_> = farm.assigned(w).iter().map(|l| l.task).collect();
    assert_eq!(leases.len(), 2);
    farm.done(w, leases[0]);
    let batch = std::mem::take(&mut farm.commits);
    // In the database, though the core hears it failed.
    let mut db = BTreeSet::from([(job, leases[0].index)]);
    let lost = CommitFailure {
        reason: "the database cannot be reached".into(),
        transient: true,
    };
    farm.core.committed(&batch, Err(lost), farm.now());
    farm.collect();
    farm.done(w, leases[1]);
    farm.commit_all(&mut db);
    assert!(farm.stitches.is_empty(), "one tile of two counted");
    let t = farm.now;
    farm.at(t + crate::farm::OUTAGE_HOLD_MS);
    farm.msg(w, WorkerMsg::Heartbeat { telemetry: None });
    farm.dispatch();
    let again = farm.assigned(w)[0].task;
    assert_eq!(again.index, leases[0].index);
    farm.done(w, again);
    let batch = std::mem::take(&mut farm.commits);
    // The database already holds the task's row: not fresh.
    farm.core.committed(&batch, Ok(vec![false]), farm.now());
    farm.collect();
    assert_eq!(
        kinds(&farm.read(w)).last().map(String::as_str),
        Some("ack 1/0 true")
    );
    assert_eq!(farm.stitches, [(job, 0)], "both tiles counted");
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
}

/// A task counted once, whatever the commits report: the same result
/// reported again (as when a job was retried while one of its commits was
/// in flight, and the task rendered again) counts nothing more.
#[test]
fn a_task_is_counted_once_however_often_its_results_commit() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 2));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.dispatch();
    let leases: Vec<_> = farm.assigned(w).iter().map(|l| l.task).collect();
    farm.done(w, leases[0]);
    let batch = std::mem::take(&mut farm.commits);
    farm.core.committed(&batch, Ok(vec![true]), farm.now());
    farm.core.committed(&batch, Ok(vec![false]), farm.now());
    farm.core.committed(&batch, Ok(vec![true]), farm.now());
    farm.collect();
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.tasks_done, 1);
    assert!(farm.stitches.is_empty(), "one tile of two");
    farm.done(w, leases[1]);
    farm.commit_all(&mut BTreeSet::new());
    assert_eq!(farm.stitches, [(job, 0)]);
}

/// In a job whose results are checked, a row the database already held
/// for a task may be another identity's, never checked: the job fails
/// saying so, and neither takes it nor waits forever.
#[test]
fn a_row_already_held_for_a_checked_task_fails_its_job_saying_why() {
    let mut farm = Farm::new(3);
    let mut spec = spec("v", 1, 1);
    spec.verify_percent = 100;
    let job = farm.submit(spec);
    let a = farm.join("a", worker_info(1, Engine::Builtin, vec![]));
    let b = farm.join("b", worker_info(1, Engine::Builtin, vec![]));
    for _ in 0..10 {
        farm.dispatch();
        for id in [a, b] {
            for lease in farm.assigned(id) {
                farm.done(id, lease.task);
            }
        }
        if !farm.commits.is_empty() {
            break;
        }
        let at = farm.now + 1;
        farm.at(at);
    }
    let batch = std::mem::take(&mut farm.commits);
    assert_eq!(batch.len(), 1, "the checked result");
    farm.core.committed(&batch, Ok(vec![false]), farm.now());
    farm.collect();
    assert!(farm.stitches.is_empty(), "not taken for the frame");
    let [(id, state, Some(error))] = &farm.records[..] else {
        panic!("{:?}", farm.records);
    };
    assert_eq!((*id, *state), (job, JobState::Failed));
    assert!(error.contains("was not checked"), "{error}");
}

#[test]
fn a_failed_commit_is_refused_to_the_worker_and_fails_the_job() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w)[0].task;
    farm.done(w, lease);
    let batch = std::mem::take(&mut farm.commits);
    let now = farm.now();
    farm.core
        .committed(&batch, Err(CommitFailure::fatal("disk full")), now);
    farm.collect();
    assert_eq!(kinds(&farm.read(w)), ["ack 1/0 false"]);
    assert_eq!(farm.records[0].0, job);
    assert_eq!(farm.records[0].1, JobState::Failed);
    assert_eq!(
        farm.records[0].2.as_deref(),
        Some("the coordinator could not store a result: disk full")
    );
}

fn check_blocked(workers: &[Engine], expected: Option<&str>) {
    let mut farm = Farm::new(3);
    let mut spec = spec("a", 1, 1);
    spec.engine = Engine::Blender;
    let job = farm.submit(spec);
    for (i, &engine) in workers.iter().enumerate() {
        farm.join(&format!("w{i}"), worker_info(1, engine, vec![]));
    }
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.blocked.as_deref(), expected, "workers {workers:?}");
}

#[test]
fn a_job_says_why_it_cannot_progress() {
    check_blocked(&[], Some("no workers are connected"));
    // Paused, it is held, not blocked; resumed, blocked again.
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 1));
    let now = farm.now();
    assert!(farm.core.pause(job, true, now));
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.blocked, None, "{status:?}");
    let now = farm.now();
    assert!(farm.core.pause(job, false, now));
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.blocked.as_deref(), Some("no workers are connected"));
    check_blocked(
        &[Engine::Builtin],
        Some("no connected worker offers the blender engine"),
    );
    check_blocked(&[Engine::Builtin, Engine::Blender], None);
}

#[test]
fn a_job_whose_tasks_are_all_in_is_not_blocked_while_its_frame_is_stitched() {
    let mut farm = Farm::new(3);
    let mut db = BTreeSet::new();
    let job = farm.submit(spec("a", 1, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w)[0].task;
    farm.done(w, lease);
    farm.commit_all(&mut db);
    // The only worker leaves before the frame is stitched.
    farm.leave(w);
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!(status.tasks_done, status.tasks_total);
    assert_eq!(status.blocked, None, "{status:?}");
    farm.stitch_all();
    assert_eq!(farm.records[0].0, job);
    assert_eq!(farm.records[0].1, JobState::Done);
}

#[test]
fn a_lost_lease_is_canceled_and_costs_are_billed_per_lease() {
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("a", 1, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    farm.assigned(w);
    // No heartbeat: the lease expires and the worker is told.
    farm.at(LEASE + 1).dispatch();
    let msgs = kinds(&farm.read(w));
    assert_eq!(
        msgs.first().map(String::as_str),
        Some("cancel 1/0"),
        "{msgs:?}"
    );
    farm.msg(w, WorkerMsg::Heartbeat { telemetry: None });
    farm.at(LEASE + 2).dispatch();
    let cost = farm.core.job_status(job, farm.now()).unwrap().cost_usd;
    assert!(cost > 0.0, "the expired lease was billed: {cost}");
}

#[test]
fn tiles_show_rendering_with_progress_then_done() {
    let mut farm = Farm::new(3);
    let mut db = BTreeSet::new();
    let job = farm.submit(spec("a", 1, 2));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let lease = farm.assigned(w)[0].task;
    let progress = WorkerMsg::Progress {
        task: lease,
        done: 2,
        total: 4,
        stage: None,
    };
    farm.msg(w, progress);
    let states: Vec<_> = (farm.core.tiles(job, 1).unwrap().into_iter())
        .map(|t| t.state)
        .collect();
    assert_eq!(
        states,
        [TileState::Rendering(Some((2, 4))), TileState::Queued]
    );
    // A stage (a shader compile) is shown with the task, bounded however
    // long the worker sent it.
    let stage = format!("compiling shaders: {}", "é".repeat(500));
    farm.msg(
        w,
        WorkerMsg::Progress {
            task: lease,
            done: 0,
            total: 4,
            stage: Some(stage.clone()),
        },
    );
    let shown = (farm.core.worker_statuses(farm.now()).into_iter())
        .find_map(|s| s.tasks.into_iter().next())
        .and_then(|t| t.stage)
        .expect("the stage is shown");
    assert!(stage.starts_with(&shown) && shown.len() <= tessera_protocol::messages::MAX_STAGE);
    assert!(shown.starts_with("compiling shaders: é"));
    farm.done(w, lease);
    farm.commit_all(&mut db);
    let states: Vec<_> = (farm.core.tiles(job, 1).unwrap().into_iter())
        .map(|t| t.state)
        .collect();
    assert_eq!(states[0], TileState::Done);
    assert_eq!(
        farm.core.tiles(job, 7).unwrap_err(),
        "job 1 does not render frame 7"
    );
}

// ---- randomized simulation ----

/// SplitMix64: a tiny deterministic PRNG, so a failing seed replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A simulated worker machine: it keeps rendering while disconnected,
/// names what it holds when it rejoins, and re-sends finished results.
#[derive(Default)]
struct Machine {
    /// Its id on the current connection.
    conn: Option<WorkerId>,
    /// Leases it renders, with when each finishes.
    rendering: BTreeMap<(u64, u32), (TaskRef, Millis)>,
    /// Rendered, not yet acknowledged.
    finished: BTreeMap<(u64, u32), TaskRef>,
    /// Not heartbeating until then.
    silent_until: Millis,
}

/// What one simulated run went through, to check the runs cover the cases.
#[derive(Default)]
struct Seen {
    rejoins_holding: usize,
    cancels: usize,
    refused: usize,
    failures: usize,
}

fn simulate(seed: u64) -> Seen {
    let mut seen = Seen::default();
    let mut rng = Rng(seed);
    let mut farm = Farm::new(50);
    let mut db: BTreeSet<(u64, u32)> = BTreeSet::new();
    let shapes: Vec<(u32, u32)> = (0..1 + rng.below(3))
        .map(|_| (1 + rng.below(4) as u32, 1 + rng.below(3) as u32))
        .collect();
    let jobs: Vec<u64> = (shapes.iter().enumerate())
        .map(|(j, &(frames, tiles))| farm.submit(spec(&format!("job{j}"), frames, tiles)))
        .collect();
    let mut machines: Vec<Machine> = (0..2 + rng.below(4)).map(|_| Machine::default()).collect();
    let mut accepted_acks = 0usize;
    let mut step = 0;
    while farm.records.len() < jobs.len() {
        step += 1;
        assert!(step < 200_000, "seed {seed}: the farm never finished");
        let now = farm.now + 1 + rng.below(200);
        farm.at(now);
        // Machines connect, disconnect and go silent.
        for (i, m) in machines.iter_mut().enumerate() {
            match m.conn {
                None if rng.chance(20) => {
                    let holding: Vec<TaskRef> = (m.rendering.values().map(|(t, _)| *t))
                        .chain(m.finished.values().copied())
                        .collect();
                    seen.rejoins_holding += usize::from(!holding.is_empty());
                    let id = farm.join(&format!("m{i}"), worker_info(2, Engine::Builtin, holding));
                    m.conn = Some(id);
                }
                Some(id) if rng.chance(2) => {
                    farm.leave(id);
                    m.conn = None;
                }
                Some(_) if rng.chance(2) => m.silent_until = now + 2 * LEASE,
                _ => {}
            }
        }
        farm.dispatch();
        for m in machines.iter_mut() {
            let Some(id) = m.conn else { continue };
            for msg in farm.read(id) {
                match msg {
                    CoordMsg::Assign(spec) => {
                        let t = spec.task;
                        let finish = now + 50 + rng.below(800);
                        m.rendering.insert((t.job, t.index), (t, finish));
                    }
                    CoordMsg::Cancel(t) => {
                        seen.cancels += 1;
                        if m.rendering
                            .get(&(t.job, t.index))
                            .is_some_and(|(l, _)| *l == t)
                        {
                            m.rendering.remove(&(t.job, t.index));
                        }
                        if m.finished.get(&(t.job, t.index)) == Some(&t) {
                            m.finished.remove(&(t.job, t.index));
                        }
                    }
                    CoordMsg::Ack { task, accepted, .. } => {
                        // Failures are acknowledged too: count results only.
                        let result = m.finished.get(&(task.job, task.index)) == Some(&task);
                        accepted_acks += usize::from(accepted && result);
                        seen.refused += usize::from(!accepted);
                        m.finished.remove(&(task.job, task.index));
                    }
                    CoordMsg::Joined { .. } => {
                        // A rejoining machine sends its finished results again.
                        for &t in m.finished.values() {
                            farm.core.result_offered(
                                id,
                                t,
                                Digest::of(&t.index.to_le_bytes()),
                                10,
                                farm.now(),
                            );
                        }
                    }
                    CoordMsg::Job(_)
                    | CoordMsg::Drain
                    | CoordMsg::Enrolled { .. }
                    | CoordMsg::Builds(_)
                    | CoordMsg::Scan { .. } => {}
                }
            }
            farm.collect();
            // Rendering goes on with or without a connection; results go
            // out only on one.
            let done: Vec<_> = (m.rendering.iter())
                .filter(|(_, (_, at))| *at <= now)
                .map(|(&k, &(t, _))| (k, t))
                .collect();
            for (k, t) in done {
                m.rendering.remove(&k);
                if rng.chance(1) {
                    seen.failures += 1;
                    let error = "device lost".to_string();
                    farm.msg(
                        id,
                        WorkerMsg::Failed {
                            task: t,
                            error,
                            log: String::new(),
                            unsupported: false,
                        },
                    );
                } else {
                    m.finished.insert(k, t);
                    farm.done(id, t);
                }
            }
            if now >= m.silent_until {
                farm.msg(id, WorkerMsg::Heartbeat { telemetry: None });
            }
        }
        // Commits and stitches come late and in batches.
        if rng.chance(40) {
            let before = db.len();
            let offered = farm.commits.len();
            farm.commit_all(&mut db);
            assert_eq!(
                db.len() - before,
                offered,
                "seed {seed}: a task was accepted twice"
            );
        }
        if rng.chance(30) {
            farm.stitch_all();
        }
    }
    for (&job, &(frames, tiles)) in jobs.iter().zip(&shapes) {
        let committed = db.iter().filter(|(j, _)| *j == job).count() as u32;
        let record = farm.records.iter().find(|r| r.0 == job);
        assert_eq!(
            record.map(|r| r.1),
            Some(JobState::Done),
            "seed {seed}: job {job}"
        );
        let counts = farm.finals[&job];
        assert_eq!(
            counts.tasks_done, committed,
            "seed {seed}: job {job} counters"
        );
        assert_eq!(counts.tasks_done, frames * tiles, "seed {seed}: job {job}");
        assert_eq!(counts.frames_done, frames, "seed {seed}: job {job}");
        assert!(
            farm.core.job_status(job, farm.now()).is_none(),
            "seed {seed}: forgotten"
        );
    }
    let records: BTreeSet<u64> = farm.records.iter().map(|r| r.0).collect();
    assert_eq!(
        records.len(),
        jobs.len(),
        "seed {seed}: each job recorded once"
    );
    // A result is acknowledged as accepted only once it is committed, and
    // at most once (an acknowledgement lost with a connection is not sent
    // again: the rejoining machine's copy is refused or adopted, never
    // counted twice).
    assert!(
        accepted_acks <= db.len(),
        "seed {seed}: {accepted_acks} acks for {} results",
        db.len()
    );
    seen
}

#[test]
fn random_farm_accepts_each_task_once_and_counts_only_committed_results() {
    let mut total = Seen::default();
    for seed in 1..=60 {
        let seen = simulate(seed);
        total.rejoins_holding += seen.rejoins_holding;
        total.cancels += seen.cancels;
        total.refused += seen.refused;
        total.failures += seen.failures;
    }
    // The runs went through what they are meant to.
    assert!(
        total.rejoins_holding > 0,
        "no machine rejoined holding tasks"
    );
    assert!(total.cancels > 0, "no lease was canceled");
    assert!(total.refused > 0, "no result was refused");
    assert!(total.failures > 0, "no task failed");
}

/// `--blender auto`: a worker with no Blender of its own offers the stored
/// builds; a 4.5 job waits until a 4.5 build is stored, then goes to it.
#[test]
fn an_auto_worker_offers_the_stored_builds_and_is_told_of_each() {
    use tessera_protocol::blender::{BlenderNeeds, BlenderVersion, VersionReq};
    use tessera_protocol::build::{BuildInfo, BuildKind};
    let build = |v: (u16, u16, u16), features: &[&str]| BuildInfo {
        digest: Digest::of(format!("{v:?}").as_bytes()),
        version: BlenderVersion::new(v.0, v.1, v.2),
        kind: BuildKind::Module,
        size: 1,
        files: 1,
        features: features.iter().map(|f| f.to_string()).collect(),
        added_unix_ms: 0,
        holders: Vec::new(),
    };
    let mut farm = Farm::new(3);
    let mut job = spec("a", 1, 1);
    job.engine = Engine::Blender;
    job.blender = Some(BlenderNeeds {
        saved_by: Some(BlenderVersion::new(4, 5, 0)),
        version: VersionReq::Series(4, 5),
        denoise: true,
        osl: false,
        eevee: false,
    });
    let job = farm.submit(job);
    let mut info = worker_info(1, Engine::Blender, vec![]);
    info.fetches_builds = true;
    let w = farm.join("auto", info.clone());
    assert_eq!(kinds(&farm.read(w)), ["joined", "builds 0"]);
    let blocked = |farm: &Farm| farm.core.job_status(job, farm.now()).unwrap().blocked;
    assert_eq!(
        blocked(&farm).as_deref(),
        Some("needs Blender 4.5; no connected worker offers Blender")
    );
    // A 4.5 build without OpenImageDenoise does not do; one with it does.
    farm.core
        .set_builds(vec![build((4, 2, 9), &[]), build((4, 5, 4), &[])]);
    farm.collect();
    assert_eq!(kinds(&farm.read(w)), ["builds 2"]);
    assert!(blocked(&farm).unwrap().contains("OpenImageDenoise"));
    farm.dispatch();
    assert!(farm.assigned(w).is_empty());
    let with_oidn = build((4, 5, 4), &["OpenImageDenoise"]);
    let name = with_oidn.offer().name;
    farm.core.set_builds(vec![build((4, 2, 9), &[]), with_oidn]);
    farm.collect();
    assert_eq!(blocked(&farm), None);
    farm.dispatch();
    assert_eq!(farm.assigned(w).len(), 1);
    // A worker without `--blender auto` offers only its own Blenders.
    info.fetches_builds = false;
    let plain = farm.join("plain", info);
    assert_eq!(kinds(&farm.read(plain)), ["joined"]);
    let workers = farm.core.worker_statuses(farm.now());
    let offers: Vec<(&str, Vec<&str>)> = (workers.iter())
        .map(|w| {
            (
                w.name.as_str(),
                w.blenders.iter().map(|o| o.name.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(offers[1], ("plain", vec![]));
    assert_eq!(offers[0].1.len(), 2);
    assert_eq!(offers[0].1[1], name);
    assert!(name.contains("Blender 4.5.4 (bpy, stored build"), "{name}");
}

/// A restored copy of job 1 (`spec`) with `results` committed and the
/// passes of frame 1 stored or not.
/// A coordinator stopped after a job's last frame was stitched and before
/// the job's end was recorded: restored, the job ends at once.
#[test]
fn a_job_restored_with_every_frame_stitched_ends_at_once() {
    let mut farm = Farm::new(3);
    let now = farm.now();
    farm.core.restore_job(
        RestoredJob {
            id: 1,
            spec: spec("a", 2, 1),
            state: JobState::Running,
            error: None,
            submitted_unix_ms: now.unix_ms,
            finished_unix_ms: None,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            cost_usd: 0.0,
            results: vec![(0, 10), (1, 10)],
            frames: vec![1, 2],
            passes: Vec::new(),
            leases: Vec::new(),
        },
        now,
    );
    farm.collect();
    assert_eq!(farm.records, [(1, JobState::Done, None)]);
}

fn restored(spec: JobSpec, results: &[u32], passes: Option<StitchedPasses>) -> Farm {
    let mut farm = Farm::new(3);
    let now = farm.now();
    farm.core.restore_job(
        RestoredJob {
            id: 1,
            spec,
            state: JobState::Running,
            error: None,
            submitted_unix_ms: now.unix_ms,
            finished_unix_ms: None,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            cost_usd: 0.0,
            results: results.iter().map(|&i| (i, 10)).collect(),
            frames: Vec::new(),
            passes: passes.map(|p| (1, p)).into_iter().collect(),
            leases: Vec::new(),
        },
        now,
    );
    farm.collect();
    farm
}

#[test]
fn a_finishing_task_waits_for_its_frames_passes_also_across_a_restart() {
    let finishing = JobSpec {
        finish: true,
        ..spec("fx", 1, 2)
    };
    let mut farm = Farm::new(3);
    let mut db = BTreeSet::new();
    let job = farm.submit(finishing.clone());
    let w = farm.join("w1", worker_info(4, Engine::Builtin, vec![]));
    farm.dispatch();
    let leases = farm.assigned(w);
    let indices: Vec<u32> = leases.iter().map(|s| s.task.index).collect();
    assert_eq!(indices, [0, 1], "the finishing task (2) is held back");
    assert!(leases.iter().all(|s| s.finish.is_none()));
    let status = farm.core.job_status(job, farm.now()).unwrap();
    assert_eq!((status.tasks_total, status.tasks_running), (3, 2));
    for s in &leases {
        farm.done(w, s.task);
    }
    farm.commit_all(&mut db);
    assert_eq!(farm.stitches, [(job, 0)]);
    let plan = farm.core.stitch_plan(job, 0).unwrap();
    assert_eq!(
        (plan.stage, plan.first, plan.renders),
        (StitchStage::Passes, 0, 2)
    );
    farm.dispatch();
    assert!(
        farm.assigned(w).is_empty(),
        "still held until the passes are stored"
    );
    let passes = StitchedPasses {
        digest: Digest::of(b"passes"),
        size: 6,
    };
    farm.stitches.clear();
    farm.core.passes_stitched(job, 0, passes);
    farm.collect();
    assert!(
        farm.core.stitch_plan(job, 0).is_none(),
        "nothing to stitch meanwhile"
    );
    farm.dispatch();
    let fin = farm.assigned(w);
    assert_eq!(fin.len(), 1);
    assert_eq!((fin[0].task.index, fin[0].finish), (2, Some(passes)));
    assert_eq!(
        (fin[0].tile.width, fin[0].tile.height),
        (64, 16),
        "the whole frame"
    );

    // A coordinator restarted now hands out the finishing task again, and
    // nothing that rendered; without stored passes it stitches them first.
    let mut again = restored(finishing.clone(), &[0, 1], Some(passes));
    assert!(again.stitches.is_empty());
    let w2 = again.join("w2", worker_info(4, Engine::Builtin, vec![]));
    again.dispatch();
    let specs = again.assigned(w2);
    assert_eq!(specs.len(), 1);
    assert_eq!((specs[0].task.index, specs[0].finish), (2, Some(passes)));
    let mut unstitched = restored(finishing, &[0, 1], None);
    assert_eq!(unstitched.stitches, [(1, 0)]);
    let w3 = unstitched.join("w3", worker_info(4, Engine::Builtin, vec![]));
    unstitched.dispatch();
    assert!(unstitched.assigned(w3).is_empty(), "renders nothing twice");

    // The finishing task's output is the frame; the job is then done.
    farm.done(w, fin[0].task);
    farm.commit_all(&mut db);
    assert_eq!(farm.stitches, [(job, 0)]);
    let plan = farm.core.stitch_plan(job, 0).unwrap();
    assert_eq!(
        (plan.stage, plan.first, plan.renders),
        (StitchStage::Finished, 0, 2)
    );
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
    assert_eq!(farm.finals[&job].tasks_done, 3);
}

/// `--verify`: runs a farm of honest workers and one liar (its outputs
/// differ) until the job is done or nothing moves; returns what the
/// database would hold (task → output) and the job's final verification.
fn run_checked_farm(
    workers: &[(&str, bool)],
    late_honest: Option<&str>,
) -> (BTreeMap<u32, Digest>, Vec<String>, Option<String>) {
    let mut farm = Farm::new(3);
    let mut spec = spec("v", 4, 4);
    spec.verify_percent = 10;
    let job = farm.submit(spec);
    let mut ids: Vec<(WorkerId, bool)> = (workers.iter())
        .map(|&(name, liar)| {
            (
                farm.join(name, worker_info(1, Engine::Builtin, vec![])),
                liar,
            )
        })
        .collect();
    let honest = |t: &TaskRef| Digest::of(&t.index.to_le_bytes());
    let mut db = BTreeSet::new();
    let mut outputs = BTreeMap::new();
    let mut blocked = None;
    for round in 0..400 {
        farm.dispatch();
        let mut moved = false;
        for &(id, liar) in &ids.clone() {
            for spec in farm.assigned(id) {
                moved = true;
                let t = spec.task;
                let output = if liar {
                    Digest::of(b"altered pixels")
                } else {
                    honest(&t)
                };
                let now = farm.now();
                farm.core.result_offered(id, t, output, 10, now);
                farm.collect();
            }
        }
        for c in &farm.commits {
            outputs.insert(c.task.index, c.output);
        }
        farm.commit_all(&mut db);
        for (_, tasks) in std::mem::take(&mut farm.withdrawn) {
            for t in tasks {
                db.remove(&(job, t));
                outputs.remove(&t);
            }
        }
        farm.stitch_all();
        if farm.records.iter().any(|r| r.0 == job) {
            break;
        }
        if !moved {
            blocked = farm
                .core
                .job_status(job, farm.now())
                .and_then(|s| s.blocked);
            match late_honest {
                Some(name) if ids.len() == workers.len() => {
                    let id = farm.join(name, worker_info(1, Engine::Builtin, vec![]));
                    ids.push((id, false));
                }
                _ if round > 50 => break,
                _ => {}
            }
        }
        let at = farm.now + 1;
        farm.at(at);
    }
    assert!(
        farm.records
            .iter()
            .any(|r| r.0 == job && r.1 == JobState::Done),
        "the job did not finish: {:?} blocked: {blocked:?}",
        farm.records
    );
    for (i, d) in &outputs {
        let t = TaskRef {
            job,
            index: *i,
            epoch: 0,
        };
        assert_eq!(*d, honest(&t), "task {i} kept an altered output");
    }
    (outputs, farm.quarantined.clone(), blocked)
}

/// The acceptance case on virtual time: with one worker returning altered
/// pixels among two honest ones, every worker's first result is checked,
/// the liar is outvoted and quarantined by identity, its results are
/// withdrawn and rendered again, and every task ends with honest pixels.
#[test]
fn a_lying_worker_is_outvoted_quarantined_and_its_results_rendered_again() {
    let (outputs, quarantined, _) =
        run_checked_farm(&[("a", false), ("liar", true), ("b", false)], None);
    assert_eq!(outputs.len(), 16);
    assert_eq!(quarantined, ["liar"]);
}

/// Two workers disagreeing cannot tell which one lies: the check waits,
/// saying so, for a third worker, whose render decides.
#[test]
fn two_workers_that_disagree_wait_for_a_third_opinion() {
    let (outputs, quarantined, blocked) =
        run_checked_farm(&[("a", false), ("liar", true)], Some("c"));
    assert_eq!(outputs.len(), 16);
    assert_eq!(quarantined, ["liar"]);
    let blocked = blocked.expect("the job said why it waited");
    assert!(blocked.contains("a worker other than"), "{blocked}");
}

/// After a restart, a lease of an earlier run is adopted only by the
/// enrolled identity it was handed to (recorded in the database), never by
/// another identity naming it or a queued task under an earlier epoch.
#[test]
fn an_earlier_runs_lease_is_adopted_only_by_the_identity_it_was_handed_to() {
    let mut farm = Farm::new(3);
    let mut c = config(3);
    c.scheduler.first_epoch = 2 << 32;
    farm.core = FarmCore::new(c);
    let epoch = (1 << 32) + 5;
    let now = farm.now();
    farm.core.restore_job(
        RestoredJob {
            id: 1,
            spec: spec("a", 3, 1),
            state: JobState::Running,
            error: None,
            submitted_unix_ms: 0,
            finished_unix_ms: None,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            cost_usd: 0.0,
            results: Vec::new(),
            frames: Vec::new(),
            leases: vec![(0, epoch, "w1".into())],
            passes: Vec::new(),
        },
        now,
    );
    farm.collect();
    let held = |index, epoch| TaskRef {
        job: 1,
        index,
        epoch,
    };
    // Another identity names w1's lease, and a queued task under an epoch
    // of the earlier run it was never given.
    let rogue = farm.join(
        "rogue",
        worker_info(2, Engine::Builtin, vec![held(0, epoch), held(1, epoch - 1)]),
    );
    assert_eq!(
        kinds(&farm.read(rogue)),
        ["joined", "cancel 1/0", "cancel 1/1"],
        "nothing adopted"
    );
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![held(0, epoch)]));
    assert_eq!(
        kinds(&farm.read(w1)),
        ["joined"],
        "its own lease is adopted"
    );
    assert!(farm.core.holds(w1, held(0, epoch)).is_ok());
}

/// A worker blocklisted for a job stays blocklisted when it reconnects:
/// the blocklist hangs on its enrolled identity, not its connection.
#[test]
fn a_blocklist_follows_the_identity_across_connections() {
    let mut farm = Farm::new(10);
    let job = farm.submit(spec("a", 8, 1));
    let w = farm.join("flaky", worker_info(1, Engine::Builtin, vec![]));
    for _ in 0..scheduler::BLOCKLIST_AFTER {
        farm.dispatch();
        let task = farm.assigned(w)[0].task;
        let failed = WorkerMsg::Failed {
            task,
            error: "boom".into(),
            log: String::new(),
            unsupported: false,
        };
        farm.msg(w, failed);
    }
    farm.dispatch();
    assert!(
        farm.assigned(w).is_empty(),
        "blocklisted on this connection"
    );
    farm.leave(w);
    let again = farm.join("flaky", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert!(farm.assigned(again).is_empty(), "and on its next one");
    let blocked = farm.core.job_status(job, farm.now()).unwrap().blocked;
    assert!(blocked.unwrap().contains("blocklisted"));
    let detail = farm.core.worker_detail(again, farm.now()).unwrap();
    assert_eq!(detail.blocklisted_by, vec![job], "its worker page says so");
    assert_eq!(detail.quarantined, None);
    // Another identity gets the job's tasks.
    let other = farm.join("steady", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert_eq!(farm.assigned(other).len(), 1);
}

/// The issue's case: millions of `Progress` messages for tasks a worker
/// does not hold. Progress is kept only for its leases, so the map stays
/// bounded by them (here 200,000 messages, one kept).
#[test]
fn progress_for_tasks_a_worker_does_not_hold_is_not_kept() {
    let mut farm = Farm::new(3);
    farm.submit(spec("a", 1, 1));
    let w = farm.join("w", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    let held = farm.assigned(w)[0].task;
    for i in 0..200_000u32 {
        let task = TaskRef {
            job: 1 + u64::from(i % 7),
            index: i,
            epoch: u64::from(i),
        };
        let now = farm.now();
        (farm.core).worker_msg(
            w,
            WorkerMsg::Progress {
                task,
                done: 1,
                total: 2,
                stage: None,
            },
            now,
        );
    }
    let now = farm.now();
    (farm.core).worker_msg(
        w,
        WorkerMsg::Progress {
            task: held,
            done: 1,
            total: 2,
            stage: None,
        },
        now,
    );
    farm.collect();
    let kept = &farm.core.workers[&w].progress;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept.get(&held), Some(&(1, 2, None)));
}

/// A farm scan goes to a worker whose own Blender is the file's series or
/// the closest newer one, never an older one, and never a draining worker.
#[test]
fn a_farm_scan_goes_to_the_closest_blender_not_older_than_the_file() {
    use tessera_protocol::blender::{BlenderOffer, BlenderVersion};
    let offer = |major, minor| BlenderOffer {
        version: BlenderVersion::new(major, minor, 0),
        name: format!("Blender {major}.{minor}"),
        device_types: vec![],
        devices: vec![],
        render_device: "CPU".into(),
        oidn: false,
        osl: false,
        eevee: false,
    };
    let with = |offers: Vec<BlenderOffer>| {
        let mut info = worker_info(1, Engine::Blender, vec![]);
        info.blenders = offers;
        info
    };
    let mut farm = Farm::new(3);
    let v = |major, minor| BlenderVersion::new(major, minor, 4);
    assert_eq!(farm.core.scanner_for(v(4, 5)), None, "no workers");
    farm.join("old", with(vec![offer(3, 4), offer(4, 2)]));
    assert_eq!(farm.core.scanner_for(v(4, 5)), None, "only older Blenders");
    let five = farm.join("five", with(vec![offer(5, 0)]));
    let both = farm.join("both", with(vec![offer(3, 4), offer(4, 5)]));
    assert_eq!(farm.core.scanner_for(v(4, 5)), Some((both, "both".into())));
    assert_eq!(farm.core.scanner_for(v(4, 3)).map(|w| w.0), Some(both));
    assert_eq!(farm.core.scanner_for(v(5, 0)).map(|w| w.0), Some(five));
    farm.msg(both, WorkerMsg::Draining);
    assert_eq!(farm.core.scanner_for(v(4, 5)).map(|w| w.0), Some(five));
    farm.leave(five);
    assert_eq!(farm.core.scanner_for(v(4, 5)), None);
}

/// Worker `w`'s lease on task `index` (of whichever job).
fn held_lease(farm: &Farm, w: WorkerId, index: u32) -> TaskRef {
    let (task, epoch) = (farm.core.sched.running_on(w).into_iter())
        .find(|(t, _)| t.index == index)
        .expect("the worker holds the task");
    lease_ref(task, epoch)
}

/// A farm core with pipelined leases on.
fn pipelined_farm() -> Farm {
    let mut farm = Farm::new(3);
    farm.core.sched.set_pipelining(true);
    farm
}

/// Pipelined leases end to end through the core: a one-slot worker holds
/// its next task; a worker joining idle steals it, and the first holder is
/// told to drop it. Every task is committed once.
#[test]
fn a_queued_task_is_stolen_by_an_idle_worker_and_canceled_on_the_busy_one() {
    let mut farm = pipelined_farm();
    let mut db = BTreeSet::new();
    let job = farm.submit(spec("a", 3, 1));
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert_eq!(
        kinds(&farm.read(w1)),
        ["joined", "job 1", "assign 1/0", "assign 1/1"]
    );
    farm.at(100);
    let first = held_lease(&farm, w1, 0);
    farm.done(w1, first);
    farm.commit_all(&mut db);
    farm.dispatch();
    assert_eq!(kinds(&farm.read(w1)), ["ack 1/0 true", "assign 1/2"]);
    let w2 = farm.join("w2", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert_eq!(kinds(&farm.read(w2)), ["joined", "job 1", "assign 1/2"]);
    assert_eq!(kinds(&farm.read(w1)), ["cancel 1/2"]);
    for (w, index) in [(w2, 2), (w1, 1)] {
        let lease = held_lease(&farm, w, index);
        farm.done(w, lease);
    }
    farm.commit_all(&mut db);
    farm.stitch_all();
    assert_eq!(farm.records, [(job, JobState::Done, None)]);
    assert_eq!(db.len(), 3);
}

/// `tessera drain`: the worker is told, hands back what is queued behind its
/// slot, finishes what it renders and is never leased again, not a later
/// job's task nor a pipelined one. A job only draining, quarantined or
/// blocklisted workers could render says so, naming them; a worker that
/// can take it clears that.
#[test]
fn a_drained_worker_gets_no_new_lease_and_a_job_only_it_could_render_says_blocked() {
    let mut farm = pipelined_farm();
    let first = farm.submit(spec("a", 3, 1));
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert_eq!(
        kinds(&farm.read(w1)),
        ["joined", "job 1", "assign 1/0", "assign 1/1"]
    );
    assert!(farm.core.drain(w1));
    farm.collect();
    assert_eq!(kinds(&farm.read(w1)), ["drain", "cancel 1/1"]);
    let later = farm.submit(spec("b", 2, 1));
    farm.dispatch();
    assert!(farm.read(w1).is_empty(), "a draining worker was leased");
    let blocked = |farm: &Farm, job| farm.core.job_status(job, farm.now()).unwrap().blocked;
    for job in [first, later] {
        let why = blocked(&farm, job).expect("says why it waits");
        assert!(why.contains("draining (w1)"), "{why}");
    }
    // Its render ends: still nothing new for it.
    farm.at(100);
    let lease = held_lease(&farm, w1, 0);
    farm.done(w1, lease);
    let mut db = BTreeSet::new();
    farm.commit_all(&mut db);
    farm.dispatch();
    let msgs = kinds(&farm.read(w1));
    assert_eq!(msgs, ["ack 1/0 true"], "a drained worker was leased");
    // Its connection drops and it joins again, saying it drains: still
    // nothing for it.
    farm.leave(w1);
    let mut info = worker_info(1, Engine::Builtin, vec![]);
    info.draining = true;
    let w1 = farm.join("w1", info);
    farm.dispatch();
    assert_eq!(
        kinds(&farm.read(w1)),
        ["joined"],
        "a rejoined drainer was leased"
    );
    // A quarantined worker is named as such.
    let q = farm.join("q", worker_info(1, Engine::Builtin, vec![]));
    let now = farm.now();
    farm.core.quarantine("q", "q", "altered pixels".into(), now);
    farm.collect();
    farm.dispatch();
    assert!(
        !kinds(&farm.read(q)).iter().any(|k| k.starts_with("assign")),
        "a quarantined worker was leased"
    );
    let why = blocked(&farm, later).unwrap();
    assert!(
        why.contains("draining (w1)") && why.contains("quarantined (q)"),
        "{why}"
    );
    // A worker that can take the work clears it.
    let w2 = farm.join("w2", worker_info(1, Engine::Builtin, vec![]));
    assert_eq!(blocked(&farm, later), None);
    farm.dispatch();
    assert!(kinds(&farm.read(w2))
        .iter()
        .any(|k| k.starts_with("assign")));
}

/// A worker shutting down hands back the tasks queued behind its slots at
/// once (it is told to drop them); it finishes the one it renders.
#[test]
fn a_draining_worker_hands_back_the_tasks_queued_behind_its_slots() {
    let mut farm = pipelined_farm();
    farm.submit(spec("a", 2, 1));
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    farm.read(w1);
    farm.msg(w1, WorkerMsg::Draining);
    assert_eq!(kinds(&farm.read(w1)), ["cancel 1/1"]);
    let w2 = farm.join("w2", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert_eq!(kinds(&farm.read(w2)), ["joined", "job 1", "assign 1/1"]);
    assert_eq!(farm.core.sched.running_on(w1).len(), 1);
}

/// Only a lease its worker was rendering counts as lost with it: a task
/// queued behind a busy slot never started, and a worker that said it
/// drains (SIGTERM, `tessera drain --drain-grace`) handed its work back on
/// purpose. Three workers that die rendering a task fail its job; three
/// that drain and leave, and the queued task each dying one held, do not.
#[test]
fn only_a_lease_its_worker_was_rendering_counts_as_lost_with_it() {
    let key = |index| scheduler::TaskKey { job: 1, index };
    // Drained and gone, three times: nothing counts, the job goes on.
    let mut farm = pipelined_farm();
    let job = farm.submit(spec("a", 2, 1));
    for round in 0..3u64 {
        let w = farm.join(
            &format!("drainer{round}"),
            worker_info(1, Engine::Builtin, vec![]),
        );
        farm.dispatch();
        assert_eq!(farm.assigned(w).len(), 2);
        farm.msg(w, WorkerMsg::Draining);
        farm.leave(w);
        farm.at((round + 1) * (GONE_AFTER_MS + 1));
        farm.dispatch();
    }
    for index in [0, 1] {
        assert_eq!(farm.core.lost.in_a_row(key(index)), 0);
    }
    assert_ne!(farm.state(job), JobState::Failed);

    // Died three times: the rendered task counts each time, the queued one
    // never, and the third death fails the job with that reason.
    let mut farm = pipelined_farm();
    let job = farm.submit(spec("a", 2, 1));
    for round in 0..3u64 {
        let w = farm.join(
            &format!("dying{round}"),
            worker_info(1, Engine::Builtin, vec![]),
        );
        farm.dispatch();
        assert_eq!(farm.assigned(w).len(), 2);
        let (rendering, queued): (Vec<_>, Vec<_>) = (farm.core.sched.running_on(w).into_iter())
            .map(|(t, _)| t)
            .partition(|t| !farm.core.sched.is_queued(w, *t));
        assert_eq!((rendering.len(), queued.len()), (1, 1));
        farm.leave(w);
        farm.at((round + 1) * (GONE_AFTER_MS + 1));
        farm.dispatch();
        assert_eq!(
            farm.core.lost.in_a_row(queued[0]),
            0,
            "a queued lease counted"
        );
        if round < 2 {
            assert_eq!(farm.core.lost.in_a_row(rendering[0]), round as u32 + 1);
        }
    }
    let (failed, state, error) = farm.records.last().cloned().expect("the job is recorded");
    assert_eq!((failed, state), (job, JobState::Failed));
    let error = error.unwrap_or_default();
    assert!(error.contains("3 workers in a row died"), "{error}");
}

/// A job is told blocked (for its webhook) once, when a change blocks it,
/// and nothing is told while nothing changes.
#[test]
fn a_blocked_job_is_told_once_when_a_change_blocks_it() {
    let mut farm = pipelined_farm();
    let first = farm.submit(spec("a", 2, 1));
    farm.dispatch();
    assert_eq!(farm.blocked, [first], "no worker: blocked");
    for _ in 0..3 {
        farm.dispatch();
    }
    assert_eq!(farm.blocked, [first], "told again with nothing changed");
    // A worker takes it; drained, the job is blocked again: still told once.
    let w1 = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert!(farm.core.drain(w1));
    farm.collect();
    farm.dispatch();
    assert_eq!(farm.blocked, [first]);
    // A job submitted now, which only the draining worker could take.
    let second = farm.submit(spec("b", 1, 1));
    farm.dispatch();
    assert_eq!(farm.blocked, [first, second]);
    // A job whose engine no worker offers, with a worker there.
    let mut unreal = spec("c", 1, 1);
    unreal.engine = Engine::Noop;
    let third = farm.submit(unreal);
    farm.dispatch();
    assert_eq!(farm.blocked, [first, second, third]);
}

/// `spec` run after `after`, doing `on_failure` when one of them fails.
fn after(name: &str, after: &[u64], on_failure: tessera_protocol::job::AfterFailure) -> JobSpec {
    JobSpec {
        after: after.to_vec(),
        after_failure: on_failure,
        ..spec(name, 1, 1)
    }
}

/// Renders every task worker `w` is given until job `job` is done.
fn render_until_done(farm: &mut Farm, w: WorkerId, job: u64, db: &mut BTreeSet<(u64, u32)>) {
    for _ in 0..20 {
        farm.dispatch();
        for lease in farm.assigned(w) {
            farm.done(w, lease.task);
        }
        farm.commit_all(db);
        farm.stitch_all();
        if farm.records.iter().any(|r| r.0 == job) {
            return;
        }
    }
    panic!("job {job} did not finish");
}

#[test]
fn a_job_after_another_gets_no_task_until_that_one_is_done() {
    use tessera_protocol::job::AfterFailure::Fail;
    let mut farm = Farm::new(3);
    let first = farm.submit(spec("first", 2, 1));
    let second = farm.submit(after("second", &[first], Fail));
    let w = farm.join("w1", worker_info(4, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    let leases = farm.assigned(w);
    let jobs: BTreeSet<u64> = leases.iter().map(|s| s.task.job).collect();
    assert_eq!(jobs, BTreeSet::from([first]), "only the first job runs");
    let status = farm.core.job_status(second, farm.now()).unwrap();
    assert_eq!(status.state, JobState::Queued);
    assert_eq!(
        (status.after, status.waiting_for),
        (vec![first], vec![first])
    );
    let blocked = status.blocked.unwrap();
    assert!(blocked.contains("waiting for job 1 to finish"), "{blocked}");
    let mut db = BTreeSet::new();
    for lease in leases {
        farm.done(w, lease.task);
    }
    farm.commit_all(&mut db);
    farm.stitch_all();
    assert_eq!(farm.records[0].1, JobState::Done);
    let status = farm.core.job_status(second, farm.now()).unwrap();
    assert!(
        status.waiting_for.is_empty() && status.blocked.is_none(),
        "{status:?}"
    );
    render_until_done(&mut farm, w, second, &mut db);
    assert_eq!(farm.records[1], (second, JobState::Done, None));
}

#[test]
fn a_failed_dependency_fails_or_holds_its_dependents_as_each_chose() {
    use tessera_protocol::job::AfterFailure::{Fail, Hold};
    let mut farm = Farm::new(1);
    let shot = farm.submit(spec("shot", 1, 1));
    let fails = farm.submit(after("fails", &[shot], Fail));
    let holds = farm.submit(after("holds", &[shot], Hold));
    // A chain behind the one that fails fails with it.
    let behind = farm.submit(after("behind", &[fails], Fail));
    let w = farm.join("w1", worker_info(4, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    let leases = farm.assigned(w);
    assert_eq!(leases.len(), 1);
    farm.msg(
        w,
        WorkerMsg::Failed {
            task: leases[0].task,
            error: "boom".into(),
            log: String::new(),
            unsupported: false,
        },
    );
    let state_of = |farm: &Farm, job: u64| farm.records.iter().find(|r| r.0 == job).cloned();
    assert_eq!(state_of(&farm, shot).unwrap().1, JobState::Failed);
    let (_, state, error) = state_of(&farm, fails).unwrap();
    assert_eq!(state, JobState::Failed);
    assert!(error
        .unwrap()
        .starts_with("job 1, which this job runs after, failed"));
    let (_, state, error) = state_of(&farm, behind).unwrap();
    assert_eq!(state, JobState::Failed);
    assert!(error
        .unwrap()
        .starts_with("job 2, which this job runs after, failed"));
    // The one that holds stays, says why and what to do, and runs once
    // resumed.
    assert!(state_of(&farm, holds).is_none());
    let status = farm.core.job_status(holds, farm.now()).unwrap();
    assert_eq!(
        (status.state, status.waiting_for),
        (JobState::Queued, vec![shot])
    );
    let blocked = status.blocked.unwrap();
    assert!(
        blocked.contains("held: job 1, which it runs after, failed"),
        "{blocked}"
    );
    assert!(blocked.contains("tessera resume 3"), "{blocked}");
    farm.at(10).dispatch();
    assert!(farm.assigned(w).is_empty(), "held");
    let now = farm.now();
    assert!(farm.core.pause(holds, false, now));
    farm.collect();
    assert_eq!(
        farm.holds,
        vec![(holds, false, true)],
        "recorded for a restart"
    );
    let status = farm.core.job_status(holds, farm.now()).unwrap();
    assert!(
        status.waiting_for.is_empty() && status.blocked.is_none(),
        "{status:?}"
    );
    let mut db = BTreeSet::new();
    render_until_done(&mut farm, w, holds, &mut db);
    assert_eq!(state_of(&farm, holds).unwrap().1, JobState::Done);
}

#[test]
fn a_job_submitted_paused_waits_for_resume_and_a_restart_keeps_its_holds() {
    let mut farm = Farm::new(3);
    let job = farm.submit(JobSpec {
        paused: true,
        ..spec("paused", 1, 1)
    });
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    assert!(farm.assigned(w).is_empty());
    assert!(farm.core.job_status(job, farm.now()).unwrap().paused);
    // Restored with its recorded holds (resumed), it runs.
    let mut restarted = Farm::new(3);
    let now = restarted.now();
    restarted.core.restore_job(
        RestoredJob {
            id: job,
            spec: JobSpec {
                paused: true,
                ..spec("paused", 1, 1)
            },
            state: JobState::Queued,
            error: None,
            submitted_unix_ms: now.unix_ms,
            finished_unix_ms: None,
            bytes_uploaded: 0,
            bytes_deduplicated: 0,
            cost_usd: 0.0,
            results: Vec::new(),
            frames: Vec::new(),
            passes: Vec::new(),
            leases: Vec::new(),
        },
        now,
    );
    restarted.core.restore_holds(job, false, false);
    restarted.core.link_after(job, &[], now);
    let w = restarted.join("w1", worker_info(2, Engine::Builtin, vec![]));
    restarted.read(w);
    restarted.dispatch();
    assert_eq!(restarted.assigned(w).len(), 1);
}

#[test]
fn dependencies_the_database_reports_finished_release_or_fail_at_once() {
    use tessera_protocol::job::AfterFailure::{Fail, Hold};
    let mut farm = Farm::new(3);
    farm.next_job = 10;
    let now = farm.now();
    // Jobs 1 (done) and 2 (canceled) finished in an earlier run.
    let stored = [(1, JobState::Done), (2, JobState::Canceled)];
    let runs = farm.next_job;
    farm.next_job += 1;
    farm.core
        .submit(runs, after("runs", &[1], Fail), now.unix_ms, 0, 0, now);
    farm.core.link_after(runs, &stored, now);
    let held = farm.next_job;
    farm.core
        .submit(held, after("held", &[1, 2], Hold), now.unix_ms, 0, 0, now);
    farm.core.link_after(held, &stored, now);
    farm.collect();
    let status = farm.core.job_status(held, now).unwrap();
    assert_eq!(status.waiting_for, vec![2]);
    assert!(status
        .blocked
        .unwrap()
        .contains("job 2, which it runs after, was canceled"));
    let w = farm.join("w1", worker_info(2, Engine::Builtin, vec![]));
    farm.read(w);
    farm.dispatch();
    let jobs: Vec<u64> = farm.assigned(w).iter().map(|s| s.task.job).collect();
    assert_eq!(jobs, vec![runs]);
}

#[test]
fn canceling_the_head_of_a_long_chain_fails_every_job_behind_it_without_recursing() {
    use tessera_protocol::job::AfterFailure::Fail;
    let mut farm = Farm::new(3);
    let head = farm.submit(spec("head", 1, 1));
    let mut last = head;
    for i in 0..2000 {
        last = farm.submit(after(&format!("j{i}"), &[last], Fail));
    }
    let now = farm.now();
    farm.core.cancel(head, now);
    farm.collect();
    assert_eq!(farm.records.len(), 2001);
    assert!(farm.records[1..].iter().all(|r| r.1 == JobState::Failed));
    assert!(farm.core.job_status(last, now).is_none(), "forgotten");
}

/// `submit --budget-usd 0.01` at $36/h: each 0.5 s task costs $0.005, so
/// the budget is reached with the second finished task (all within one
/// lease: the worker sends no heartbeat here). `stop-dispatch` hands
/// out nothing more and lets the running tasks finish; `cancel` cancels the
/// job with them. Either way the status says why.
fn check_budget(on_reached: tessera_protocol::job::OnBudget) {
    use tessera_protocol::job::{Budget, OnBudget};
    let mut farm = Farm::new(3);
    let mut db = BTreeSet::new();
    let mut s = spec("budget", 6, 1);
    s.budget = Some(Budget {
        usd: 0.01,
        on_reached,
    });
    let job = farm.submit(s);
    let mut info = worker_info(2, Engine::Builtin, vec![]);
    info.price_per_hour = 36.0;
    let w = farm.join("w1", info);
    farm.dispatch();
    let first = farm.assigned(w);
    assert_eq!(first.len(), 2);
    farm.at(500);
    farm.done(w, first[0].task);
    farm.commit_all(&mut db);
    // $0.005 closed plus $0.005 running on the second slot: reached.
    farm.dispatch();
    let status = farm.core.job_status(job, farm.now());
    match on_reached {
        OnBudget::StopDispatch => {
            let status = status.expect("still a job");
            assert!(
                farm.assigned(w).is_empty(),
                "a task started past the budget"
            );
            let why = status.blocked.expect("says why");
            assert!(why.contains("budget of $0.01 is reached"), "{why}");
            // The running task finishes and is accepted; nothing follows.
            farm.at(800);
            farm.done(w, first[1].task);
            farm.commit_all(&mut db);
            farm.dispatch();
            assert!(farm.assigned(w).is_empty());
            let status = farm.core.job_status(job, farm.now()).unwrap();
            assert_eq!(status.tasks_done, 2, "the running task was counted");
            assert_eq!(status.tasks_running, 0);
        }
        OnBudget::Cancel => {
            assert!(status.is_none(), "a canceled job is forgotten by the core");
            let (_, state, error) = farm.records.last().expect("recorded").clone();
            assert_eq!(state, JobState::Canceled);
            assert!(error.unwrap().contains("budget of $0.01 is reached"));
            assert!(kinds(&farm.read(w)).contains(&"cancel 1/1".to_string()));
        }
    }
}

#[test]
fn a_budget_reached_stops_dispatch_and_lets_running_tasks_finish() {
    check_budget(tessera_protocol::job::OnBudget::StopDispatch);
}

#[test]
fn a_budget_reached_cancels_the_job_and_its_running_tasks() {
    check_budget(tessera_protocol::job::OnBudget::Cancel);
}

/// Just restarted, a job whose workers have yet to rejoin is not told
/// blocked; once the hold ends, one still lacking a worker is. And when the
/// coordinator stops, its workers leaving block nothing.
#[test]
fn no_job_is_told_blocked_while_workers_rejoin_or_leave_with_the_coordinator() {
    let mut farm = restored(spec("r", 1, 1), &[], None);
    let now = farm.now();
    farm.core.hold_for_rejoin(now);
    farm.collect();
    farm.dispatch();
    assert!(farm.core.holding_for_rejoin(farm.now()));
    assert_eq!(farm.blocked, Vec::<u64>::new(), "told during the hold");
    let lease = config(3).lease_ms;
    farm.at(lease + 1).dispatch();
    assert_eq!(farm.blocked, [1], "still no worker after the hold");

    // A job with its worker, then the coordinator stops and the worker goes.
    let mut farm = Farm::new(3);
    let job = farm.submit(spec("s", 4, 1));
    let w = farm.join("w1", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert!(farm.blocked.is_empty());
    farm.core.stop();
    let now = farm.now();
    farm.core.worker_left(w, now);
    farm.collect();
    farm.dispatch();
    assert!(
        farm.blocked.is_empty(),
        "job {job} told blocked by a shutdown"
    );
    assert!(
        farm.assigned(w).len() <= 1,
        "no work goes out while stopping"
    );
}

/// An encode job of job `input`'s frames into `shot.mp4`.
fn encode_of(input: u64) -> JobSpec {
    JobSpec {
        manifest: Vec::new(),
        frames: vec![1],
        after: vec![input],
        output: tessera_protocol::job::OutputFormat::Image,
        output_name: Some("shot.mp4".into()),
        encode: Some(Box::new(tessera_protocol::encode::EncodeSpec {
            input,
            input_options: vec!["-r".into(), "24".into()],
            output_options: vec![],
        })),
        ..JobSpec::new("encode", Engine::Ffmpeg, "")
    }
}

#[test]
fn an_encode_job_waits_for_its_input_frames_and_its_worker_reads_only_them() {
    let mut farm = Farm::new(1);
    let render = farm.submit(spec("render", 2, 1));
    let encode = farm.submit(encode_of(render));
    let failing = farm.submit(encode_of(render));
    assert!(
        farm.resolve.is_empty(),
        "no frames asked for while the job they come from is live"
    );
    let w = farm.join("w1", worker_info(4, Engine::Builtin, vec![]));
    let f = farm.join("f1", worker_info(1, Engine::Ffmpeg, vec![]));
    farm.read(f);
    let mut db = BTreeSet::new();
    render_until_done(&mut farm, w, render, &mut db);
    assert!(farm.assigned(f).is_empty(), "no task before its inputs");
    farm.resolve.sort_unstable();
    assert_eq!(farm.resolve, vec![(encode, render), (failing, render)]);
    assert_eq!(farm.state(encode), JobState::Queued);
    farm.dispatch();
    assert!(farm.assigned(f).is_empty(), "held until they are read");
    let frame = ManifestEntry {
        path: tessera_protocol::encode::input_path(0, "jpg"),
        digest: Digest::of(b"frame 1"),
        size: 7,
        origin: None,
        frame: None,
    };
    let now = farm.now();
    farm.core
        .inputs_resolved(encode, Ok(vec![frame.clone()]), now);
    farm.core
        .inputs_resolved(failing, Err("job 1 has no frames".into()), now);
    farm.collect();
    farm.dispatch();
    let msgs = farm.read(f);
    let info = msgs.iter().find_map(|m| match m {
        CoordMsg::Job(info) => Some(info.clone()),
        _ => None,
    });
    let info = info.expect("the job's info");
    assert_eq!(
        info.manifest,
        vec![frame.clone()],
        "its inputs are its files"
    );
    assert_eq!(info.encode.unwrap().movie, "shot.mp4");
    assert!(msgs
        .iter()
        .any(|m| matches!(m, CoordMsg::Assign(t) if t.task.job == encode)));
    assert!(
        farm.core.task_needs(f, &frame.digest),
        "it may read its inputs"
    );
    assert!(!farm.core.task_needs(w, &frame.digest), "nobody else may");
    let failed = farm.records.iter().find(|r| r.0 == failing).unwrap();
    assert_eq!(
        (failed.1, failed.2.as_deref()),
        (JobState::Failed, Some("job 1 has no frames"))
    );
}

#[test]
fn a_job_with_host_needs_goes_only_to_a_worker_whose_machine_meets_them() {
    use tessera_protocol::host::{Amount, HostFacts, HostNeeds};
    let mut farm = Farm::new(1);
    let job = farm.submit(JobSpec {
        host: Some(Box::new(HostNeeds {
            gpus: Some(Amount { min: 1, max: None }),
            os: vec!["linux".into()],
            ..HostNeeds::default()
        })),
        ..spec("gpu", 1, 1)
    });
    let machine = |gpus| HostFacts {
        gpus,
        gpu_memory_mib: 8192,
        cpus: 8,
        memory_mib: 16384,
        os: "linux".into(),
        arch: "x86_64".into(),
    };
    let mut cpu_only = worker_info(1, Engine::Builtin, vec![]);
    cpu_only.host = Some(Box::new(machine(0)));
    let a = farm.join("a", cpu_only);
    let b = farm.join("b", worker_info(1, Engine::Builtin, vec![]));
    farm.dispatch();
    assert!(farm.assigned(a).is_empty() && farm.assigned(b).is_empty());
    let blocked = farm
        .core
        .job_status(job, farm.now())
        .unwrap()
        .blocked
        .unwrap();
    assert!(
        blocked.contains("needs at least 1 GPUs; has 0"),
        "{blocked}"
    );
    let mut gpu = worker_info(1, Engine::Builtin, vec![]);
    gpu.host = Some(Box::new(machine(2)));
    let c = farm.join("c", gpu);
    farm.dispatch();
    assert_eq!(
        farm.assigned(c).len(),
        1,
        "the machine with a GPU renders it"
    );
}
