//! The worker's task table: what it holds across connections — each task's
//! lease epoch and whether it is rendering or finished and waiting for its
//! acknowledgement — and the jobs those tasks belong to.
//!
//! It is plain data with no I/O and no clock: `run.rs` feeds it the
//! coordinator's messages (assign, cancel, ack) and the renders' outcomes,
//! and does what it answers (start a render, send a report). A render is
//! held as a handle `H` that can be stopped, so tests use a flag.

use std::collections::HashMap;
use std::sync::Arc;

use tessera_protocol::messages::{JobInfo, TaskRef, TaskSpec, WorkerMsg};

/// Something that stops a running render.
pub trait Stop {
    fn stop(&self);
}

/// A finished task's report, with the output to upload first when it is
/// too large to ride inline.
#[derive(Debug)]
pub struct Report {
    pub msg: WorkerMsg,
    pub upload: Option<Vec<u8>>,
}

/// What a render came to.
#[derive(Debug)]
pub enum Outcome {
    Report(Report),
    /// The connection it fetched its files over went away before the
    /// render could start: there is nothing to report. The task, to fetch
    /// again over the next connection if that one's coordinator left it
    /// with this worker (re-adopted).
    Lost(Box<TaskSpec>),
}

enum State<H> {
    Rendering(H),
    /// Rendered or failed; sent until the coordinator acknowledges it.
    Finished(Arc<Report>),
}

struct Held<H> {
    epoch: u64,
    state: State<H>,
}

/// The tasks this worker holds, across connections.
pub struct TaskTable<H: Stop> {
    tasks: HashMap<(u64, u32), Held<H>>,
    /// The jobs of tasks it was given, as the coordinator described them.
    jobs: HashMap<u64, Arc<JobInfo>>,
}

impl<H: Stop> Default for TaskTable<H> {
    fn default() -> Self {
        TaskTable {
            tasks: HashMap::new(),
            jobs: HashMap::new(),
        }
    }
}

fn key(t: TaskRef) -> (u64, u32) {
    (t.job, t.index)
}

impl<H: Stop> TaskTable<H> {
    /// The tasks to name when joining, in order.
    pub fn holding(&self) -> Vec<TaskRef> {
        let mut refs: Vec<TaskRef> = (self.tasks.iter())
            .map(|(&(job, index), t)| TaskRef {
                job,
                index,
                epoch: t.epoch,
            })
            .collect();
        refs.sort_by_key(|t| (t.job, t.index));
        refs
    }

    /// How many tasks it holds, rendering or finished.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// How many are rendering now.
    pub fn rendering(&self) -> usize {
        (self.tasks.values())
            .filter(|t| matches!(t.state, State::Rendering(..)))
            .count()
    }

    /// The coordinator described a job.
    pub fn job(&mut self, info: JobInfo) {
        self.jobs.insert(info.job, Arc::new(info));
    }

    /// A task was assigned: its job, to start the render with, or the
    /// reason it cannot be rendered (to report as a failure). A task
    /// assigned again stops and replaces the attempt it had here.
    pub fn assign(&mut self, task: &TaskSpec) -> Result<Arc<JobInfo>, String> {
        let Some(job) = self.jobs.get(&task.task.job).cloned() else {
            return Err("assigned a task of a job this worker was never told about".into());
        };
        let t = task.task;
        if let Some(old) = self.tasks.get(&key(t)) {
            let old = TaskRef {
                epoch: old.epoch,
                ..t
            };
            self.cancel(old);
        }
        Ok(job)
    }

    /// Whether `t` is held under its epoch and rendering (not finished).
    pub fn is_rendering(&self, t: TaskRef) -> bool {
        (self.tasks.get(&key(t)))
            .is_some_and(|h| h.epoch == t.epoch && matches!(h.state, State::Rendering(_)))
    }

    /// The job `job` as the coordinator described it.
    pub fn job_info(&self, job: u64) -> Option<Arc<JobInfo>> {
        self.jobs.get(&job).cloned()
    }

    /// The render of an assigned task started.
    pub fn started(&mut self, t: TaskRef, render: H) {
        let held = Held {
            epoch: t.epoch,
            state: State::Rendering(render),
        };
        if let Some(Held {
            state: State::Rendering(old),
            ..
        }) = self.tasks.insert(key(t), held)
        {
            old.stop();
        }
    }

    /// Drops the task if it is held under this very epoch, stopping its
    /// render. Returns whether it was held.
    pub fn cancel(&mut self, t: TaskRef) -> bool {
        if self.tasks.get(&key(t)).is_none_or(|h| h.epoch != t.epoch) {
            return false;
        }
        if let Some(Held {
            state: State::Rendering(render),
            ..
        }) = self.tasks.remove(&key(t))
        {
            render.stop();
        }
        true
    }

    /// A render ended. Returns the report to send, or `None` when the task
    /// was canceled meanwhile or its render was lost with its connection
    /// (then it is no longer held).
    pub fn finished(&mut self, t: TaskRef, outcome: Outcome) -> Option<Arc<Report>> {
        if self.tasks.get(&key(t)).is_none_or(|h| h.epoch != t.epoch) {
            return None;
        }
        match outcome {
            Outcome::Lost(_) => {
                self.tasks.remove(&key(t));
                None
            }
            Outcome::Report(report) => {
                let report = Arc::new(report);
                let held = Held {
                    epoch: t.epoch,
                    state: State::Finished(report.clone()),
                };
                self.tasks.insert(key(t), held);
                Some(report)
            }
        }
    }

    /// Whether the report held for `t` (under its epoch) says it failed.
    pub fn reported_failure(&self, t: TaskRef) -> bool {
        self.tasks.get(&key(t)).is_some_and(|h| {
            h.epoch == t.epoch
                && matches!(&h.state, State::Finished(r) if matches!(r.msg, WorkerMsg::Failed { .. }))
        })
    }

    /// The coordinator answered a report (accepted or refused): the task is
    /// no longer held, if it was under this epoch.
    pub fn ack(&mut self, t: TaskRef) -> bool {
        if self.tasks.get(&key(t)).is_some_and(|h| h.epoch == t.epoch) {
            self.tasks.remove(&key(t));
            return true;
        }
        false
    }

    /// Reports not yet acknowledged, to send again on a new connection.
    pub fn unacknowledged(&self) -> Vec<Arc<Report>> {
        (self.tasks.values())
            .filter_map(|t| match &t.state {
                State::Finished(report) => Some(report.clone()),
                State::Rendering(_) => None,
            })
            .collect()
    }

    /// Stops every render and forgets every task (leaving the farm).
    pub fn stop_all(&mut self) {
        for (_, task) in self.tasks.drain() {
            if let State::Rendering(render) = task.state {
                render.stop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use tessera_protocol::job::{Engine, OutputFormat, TileRect};
    use tessera_protocol::Digest;

    use super::*;

    /// A render that is only a flag saying whether it was stopped.
    #[derive(Clone, Default)]
    struct Flag(Rc<Cell<bool>>);

    impl Stop for Flag {
        fn stop(&self) {
            self.0.set(true);
        }
    }

    fn lease(job: u64, index: u32, epoch: u64) -> TaskRef {
        TaskRef { job, index, epoch }
    }

    fn info(job: u64) -> JobInfo {
        JobInfo {
            job,
            engine: Engine::Builtin,
            scene: "scene.json".into(),
            manifest: Vec::new(),
            resolution: (8, 8),
            output: OutputFormat::Png,
            blender: None,
            unreal: None,
            finish: false,
            task_timeout_ms: None,
            render_format: None,
            encode: None,
        }
    }

    fn spec(t: TaskRef) -> TaskSpec {
        TaskSpec {
            task: t,
            frame: 1,
            tile: TileRect {
                x: 0,
                y: 0,
                width: 8,
                height: 8,
            },
            samples: (0, 1),
            total_samples: 1,
            unreal: None,
            finish: None,
        }
    }

    fn done(t: TaskRef) -> Outcome {
        Outcome::Report(Report {
            msg: WorkerMsg::Done {
                task: t,
                output: Digest::of(b"x"),
                render_ms: 1,
                inline: Some(b"x".to_vec()),
            },
            upload: None,
        })
    }

    /// Assigns `t` and starts its render; returns the render's flag.
    fn start(table: &mut TaskTable<Flag>, t: TaskRef) -> Flag {
        table.assign(&spec(t)).expect("job known");
        let flag = Flag::default();
        table.started(t, flag.clone());
        flag
    }

    #[test]
    fn a_task_is_held_from_assignment_until_its_result_is_acknowledged() {
        let mut table = TaskTable::default();
        table.job(info(1));
        let t = lease(1, 0, 7);
        start(&mut table, t);
        assert_eq!((table.len(), table.rendering()), (1, 1));
        let report = table.finished(t, done(t)).expect("a report to send");
        assert!(matches!(report.msg, WorkerMsg::Done { task, .. } if task == t));
        assert_eq!((table.len(), table.rendering()), (1, 0));
        assert_eq!(table.unacknowledged().len(), 1);
        // An acknowledgement of another epoch changes nothing.
        assert!(!table.ack(lease(1, 0, 6)));
        assert!(table.ack(t));
        assert!(table.is_empty());
    }

    #[test]
    fn a_rejoining_worker_names_what_it_renders_and_what_is_unacknowledged() {
        let mut table = TaskTable::default();
        table.job(info(1));
        table.job(info(2));
        let (a, b, c) = (lease(2, 1, 5), lease(1, 3, 9), lease(1, 0, 4));
        for t in [a, b, c] {
            start(&mut table, t);
        }
        table.finished(b, done(b));
        table.ack(c);
        assert_eq!(table.holding(), [b, a], "sorted by job and index");
        assert_eq!(table.unacknowledged().len(), 1);
    }

    #[test]
    fn a_cancel_stops_only_the_render_of_that_epoch() {
        let mut table = TaskTable::default();
        table.job(info(1));
        let t = lease(1, 0, 7);
        let flag = start(&mut table, t);
        assert!(!table.cancel(lease(1, 0, 8)), "another epoch");
        assert!(!flag.0.get());
        assert!(table.cancel(t));
        assert!(flag.0.get(), "the render was stopped");
        assert!(table.is_empty());
        // Its outcome arriving later is dropped.
        assert!(table.finished(t, done(t)).is_none());
        assert!(table.is_empty());
    }

    #[test]
    fn a_task_assigned_again_replaces_the_attempt_it_had() {
        let mut table = TaskTable::default();
        table.job(info(1));
        let old = lease(1, 0, 7);
        let first = start(&mut table, old);
        let new = lease(1, 0, 12);
        let second = start(&mut table, new);
        assert!(first.0.get(), "the old attempt stopped");
        assert!(!second.0.get());
        assert_eq!(table.holding(), [new]);
        assert!(
            table.finished(old, done(old)).is_none(),
            "the old outcome is stale"
        );
        assert!(table.finished(new, done(new)).is_some());
    }

    #[test]
    fn a_task_of_an_unknown_job_is_refused_with_a_reason() {
        let mut table: TaskTable<Flag> = TaskTable::default();
        let err = table.assign(&spec(lease(5, 0, 1))).unwrap_err();
        assert_eq!(
            err,
            "assigned a task of a job this worker was never told about"
        );
        assert!(table.is_empty());
    }

    #[test]
    fn a_render_lost_with_its_connection_is_forgotten() {
        let mut table = TaskTable::default();
        table.job(info(1));
        let t = lease(1, 0, 7);
        start(&mut table, t);
        assert!(table.is_rendering(t));
        assert!(table
            .finished(t, Outcome::Lost(Box::new(spec(t))))
            .is_none());
        assert!(!table.is_rendering(t));
        assert!(table.holding().is_empty());
    }

    #[test]
    fn leaving_stops_every_render() {
        let mut table = TaskTable::default();
        table.job(info(1));
        let flags: Vec<Flag> = (0..3).map(|i| start(&mut table, lease(1, i, 1))).collect();
        table.stop_all();
        assert!(flags.iter().all(|f| f.0.get()));
        assert!(table.is_empty());
    }
}
