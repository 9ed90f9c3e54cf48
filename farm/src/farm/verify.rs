//! `submit --verify P`: results from untrusted hosts checked by rendering
//! them again on a worker of another enrolled identity.
//!
//! Which results are checked: every worker's first result of the job (trust
//! is earned, so a worker that always lies is caught at once), and P % of
//! the tasks, picked by a hash of (job, task). A checked result is not
//! counted: its lease ends, it is kept aside as an *opinion*, and the task
//! goes back to the queue, excluded for the identities that already gave
//! one. The next opinion settles it:
//!
//! - it agrees with an earlier one: the task is done with it, and every
//!   opinion that disagreed with the pair marks its worker a liar;
//! - it disagrees with the only earlier one: a mismatch; a third worker is
//!   asked, and the one the other two outvote is the liar (with two workers
//!   the check waits for a third, and the job says so);
//! - three opinions that all differ: inconclusive, the last one is kept and
//!   nobody is blamed.
//!
//! Opinions agree when their output digests are equal: renders are compared
//! bit-exactly, which holds for the builtin engine and for Blender on CPU with
//! the exact-tile rules (README). A liar is quarantined by identity (farm-wide,
//! recorded in the database): it gets no more work, its running leases end,
//! and each result it delivered to a job being checked is withdrawn and
//! rendered again, its frames stitched anew.

use std::collections::{BTreeMap, HashMap, HashSet};

use tessera_protocol::blender::BlenderOffer;
use tessera_protocol::job::Engine;
use tessera_protocol::messages::{CoordMsg, TaskRef, Verification};
use tessera_protocol::Digest;

use super::{key, Effect, FarmCore, Now};
use crate::scheduler::{Epoch, Tag, TaskKey, WorkerId};

/// One render of a task being checked.
#[derive(Debug, Clone)]
struct Opinion {
    identity: String,
    name: String,
    output: Digest,
    /// What renders it deterministically (see [`device_class`]).
    device: Option<String>,
}

/// A job's checks.
#[derive(Debug, Clone, Default)]
pub(crate) struct Checks {
    percent: u32,
    /// Identities whose first result of this job was taken for a check.
    seen: HashSet<String>,
    /// Tasks being checked: their opinions so far, oldest first.
    pending: BTreeMap<u32, Vec<Opinion>>,
    /// Who delivered each result counted for this job in this run.
    rendered_by: HashMap<u32, String>,
    /// Results withdrawn before their commit was reported: not counted
    /// when it is.
    voided: HashSet<u32>,
    /// Results counted in this run.
    counted: HashSet<u32>,
    summary: Verification,
}

/// What a worker renders `engine` on, when its renders are deterministic
/// there: the builtin engine always, Blender only on CPU (the exact-tile
/// rules). `None`: its renders are compared within a tolerance.
fn device_class(engine: Engine, blenders: &[BlenderOffer]) -> Option<String> {
    match engine {
        Engine::Builtin | Engine::Noop => Some(engine.name().to_string()),
        Engine::Blender => {
            let cpu = !blenders.is_empty() && blenders.iter().all(|b| b.render_device == "CPU");
            cpu.then(|| "blender-cpu".to_string())
        }
        _ => None,
    }
}

/// The tag the scheduler knows an identity's connections by.
pub(crate) fn tag_of(identity: &str) -> Tag {
    let d = Digest::of(identity.as_bytes());
    u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes"))
}

/// Whether task `index` of `job` is among the `percent` % checked.
fn picked(job: u64, index: u32, percent: u32) -> bool {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&job.to_le_bytes());
    bytes[8..].copy_from_slice(&index.to_le_bytes());
    let d = Digest::of(&bytes);
    u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes")) % 100 < u64::from(percent)
}

impl Checks {
    pub fn new(percent: u32) -> Checks {
        Checks {
            percent,
            summary: Verification {
                percent,
                ..Verification::default()
            },
            ..Checks::default()
        }
    }

    pub fn summary(&self) -> Verification {
        Verification {
            pending: self.pending.len() as u32,
            ..self.summary.clone()
        }
    }
}

/// What to do with a result offered for a job being checked.
pub(super) enum Verdict {
    /// Count it as usual.
    Accept,
    /// Count it: it settled a check.
    Settled,
    /// Kept aside as an opinion (or refused): nothing more to do.
    Held,
}

impl FarmCore {
    /// A result offered for `task` by worker `id`: counted as usual, or
    /// kept aside as an opinion of a check (see the module documentation).
    // Long because: one decision read top to bottom (quarantined, wanted,
    // agreeing, outvoted, first opinion, kept aside), each case returning
    // its outcome; split, the cases would pass the same opinions around.
    pub(super) fn check_result(
        &mut self,
        id: WorkerId,
        task: TaskRef,
        output: Digest,
        similar: &[Digest],
        now: Now,
    ) -> Verdict {
        let Some(w) = self.workers.get(&id) else {
            return Verdict::Accept;
        };
        let (identity, name) = (w.identity.clone(), w.name.clone());
        let device = self
            .jobs
            .get(&task.job)
            .and_then(|j| device_class(j.spec.engine, &w.info.blenders));
        if self.quarantined.contains_key(&identity) {
            // A quarantined worker's result is not taken; its task goes on
            // elsewhere.
            if self
                .sched
                .release(id, key(task), Epoch(task.epoch), now.ms)
                .is_ok()
            {
                self.lease_ended(key(task), id, false, now);
            }
            self.refuse(id, task, "this worker is quarantined".into());
            return Verdict::Held;
        }
        let job_id = task.job;
        let Some(checks) = self.jobs.get_mut(&job_id).and_then(|j| j.verify.as_mut()) else {
            return Verdict::Accept;
        };
        let earlier: Vec<Opinion> = (checks.pending.get(&task.index).cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|o| o.identity != identity)
            .collect();
        let wanted = !earlier.is_empty()
            || checks.pending.contains_key(&task.index)
            || !checks.seen.contains(&identity)
            || picked(job_id, task.index, checks.percent);
        if !wanted {
            return Verdict::Accept;
        }
        checks.seen.insert(identity.clone());
        let mine = Opinion {
            identity: identity.clone(),
            name,
            output,
            device,
        };
        // Bit-exact where both render deterministically on the same device
        // class; within `compare::TOLERANCE` otherwise (the shell compared
        // those pixels and names the outputs that agree in `similar`).
        let agrees = |o: &Opinion| {
            o.output == output
                || (!(o.device.is_some() && o.device == mine.device) && similar.contains(&o.output))
        };
        let agreeing = earlier.iter().position(agrees);
        if let Some(_pos) = agreeing {
            // Settled: the outvoted opinions are liars.
            let liars: Vec<Opinion> = (earlier.iter()).filter(|o| !agrees(o)).cloned().collect();
            checks.pending.remove(&task.index);
            checks.summary.agreed += 1;
            for liar in liars {
                let reason = format!(
                    "its render of job {job_id} task {} differed from two other workers' renders",
                    task.index
                );
                self.quarantine(&liar.identity, &liar.name, reason, now);
            }
            return Verdict::Settled;
        }
        if earlier.len() >= 2 {
            checks.pending.remove(&task.index);
            checks.summary.inconclusive += 1;
            tracing::warn!(
                job = job_id,
                task = task.index,
                "three renders of the task all differ: kept the last, blamed nobody"
            );
            return Verdict::Settled;
        }
        if earlier.len() == 1 {
            checks.summary.mismatched += 1;
            tracing::warn!(
                job = job_id,
                task = task.index,
                first = earlier[0].name.as_str(),
                second = mine.name.as_str(),
                "verification mismatch: a third worker decides"
            );
        }
        let opinions = checks.pending.entry(task.index).or_default();
        if !opinions.iter().any(|o| o.identity == identity) {
            opinions.push(mine);
        }
        let tags: Vec<Tag> = opinions.iter().map(|o| tag_of(&o.identity)).collect();
        match self.sched.release(id, key(task), Epoch(task.epoch), now.ms) {
            Ok(()) => {
                for tag in tags {
                    self.sched.exclude(key(task), tag);
                }
                self.lease_ended(key(task), id, false, now);
                // Its bytes are stored; the worker may forget the task.
                self.send(
                    id,
                    CoordMsg::Ack {
                        task,
                        accepted: true,
                        reason: Some("kept to be checked against another worker's render".into()),
                    },
                );
                self.effects.push(Effect::Wake);
            }
            Err(refused) => {
                if let Some(o) = self.jobs.get_mut(&job_id).and_then(|j| j.verify.as_mut()) {
                    if let Some(list) = o.pending.get_mut(&task.index) {
                        list.retain(|o| o.identity != identity);
                        if list.is_empty() {
                            o.pending.remove(&task.index);
                        }
                    }
                }
                self.refuse(id, task, refused.to_string());
            }
        }
        Verdict::Held
    }

    /// The earlier opinions on `task` that worker `id`'s render must be
    /// compared with within a tolerance (their pair is not deterministic):
    /// the shell compares their pixels before offering the result.
    pub fn inexact_opinions(&self, id: WorkerId, task: TaskRef) -> Vec<Digest> {
        let (Some(w), Some(job)) = (self.workers.get(&id), self.jobs.get(&task.job)) else {
            return Vec::new();
        };
        let Some(checks) = job.verify.as_ref() else {
            return Vec::new();
        };
        let mine = device_class(job.spec.engine, &w.info.blenders);
        (checks.pending.get(&task.index).into_iter().flatten())
            .filter(|o| o.identity != w.identity && !(o.device.is_some() && o.device == mine))
            .map(|o| o.output)
            .collect()
    }

    /// Remembers who delivered a result counted for a job being checked.
    pub(super) fn rendered(&mut self, id: WorkerId, task: TaskRef) {
        let Some(identity) = self.workers.get(&id).map(|w| w.identity.clone()) else {
            return;
        };
        if let Some(checks) = self.jobs.get_mut(&task.job).and_then(|j| j.verify.as_mut()) {
            checks.rendered_by.insert(task.index, identity);
        }
    }

    /// Whether a committed result is still to be counted (not withdrawn
    /// while its commit was on its way); remembers it counted.
    pub(super) fn still_counts(&mut self, task: TaskRef) -> bool {
        let Some(checks) = self.jobs.get_mut(&task.job).and_then(|j| j.verify.as_mut()) else {
            return true;
        };
        if checks.voided.remove(&task.index) {
            return false;
        }
        checks.counted.insert(task.index);
        true
    }

    /// Quarantines an identity caught returning wrong pixels: recorded, no
    /// more work for any of its connections, their leases ended, and its
    /// results in every job being checked rendered again.
    pub(crate) fn quarantine(&mut self, identity: &str, name: &str, reason: String, now: Now) {
        self.check_blocked_soon();
        if self.quarantined.contains_key(identity) {
            return;
        }
        tracing::warn!(name, identity, "worker quarantined: {reason}");
        self.quarantined
            .insert(identity.to_string(), reason.clone());
        self.effects.push(Effect::Quarantine {
            identity: identity.to_string(),
            name: name.to_string(),
            reason,
            unix_ms: now.unix_ms,
        });
        let connections: Vec<WorkerId> = (self.workers.iter())
            .filter(|(_, w)| w.identity == identity)
            .map(|(&id, _)| id)
            .collect();
        for id in connections {
            self.stop_giving_work(id, now);
        }
        let jobs: Vec<u64> = self.jobs.keys().copied().collect();
        for job in jobs {
            self.withdraw(job, identity, name);
        }
        self.effects.push(Effect::Wake);
    }

    /// A quarantined worker's connection: it takes no new work and its
    /// leases end now.
    pub(super) fn stop_giving_work(&mut self, id: WorkerId, now: Now) {
        self.sched.drain_worker(id);
        if let Some(w) = self.workers.get_mut(&id) {
            w.draining = true;
        }
        for (task, epoch) in self.sched.running_on(id) {
            if self.sched.release(id, task, epoch, now.ms).is_ok() {
                self.lease_ended(task, id, false, now);
                self.send(
                    id,
                    CoordMsg::Cancel(TaskRef {
                        job: task.job,
                        index: task.index,
                        epoch: epoch.0,
                    }),
                );
            }
        }
    }

    /// Withdraws every result `identity` delivered to `job` (being checked):
    /// the tasks are queued again, their frames stitched anew.
    fn withdraw(&mut self, job_id: u64, identity: &str, name: &str) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return;
        };
        if job.final_state.is_some() {
            return;
        }
        let Some(checks) = job.verify.as_mut() else {
            return;
        };
        // Its opinions on pending checks no longer count.
        for opinions in checks.pending.values_mut() {
            opinions.retain(|o| o.identity != identity);
        }
        checks.pending.retain(|_, o| !o.is_empty());
        if !checks.summary.quarantined.iter().any(|n| n == name) {
            checks.summary.quarantined.push(name.to_string());
        }
        let tasks: Vec<u32> = (checks.rendered_by.iter())
            .filter(|(_, who)| who.as_str() == identity)
            .map(|(&i, _)| i)
            .collect();
        let mut withdrawn = Vec::new();
        let mut frames = Vec::new();
        for index in tasks {
            let task = TaskKey { job: job_id, index };
            if !self.sched.reopen(task) {
                continue;
            }
            let job = self.jobs.get_mut(&job_id).expect("checked above");
            let checks = job.verify.as_mut().expect("checked above");
            checks.rendered_by.remove(&index);
            checks.summary.rerendered += 1;
            let pos = (index / job.tasks_per_frame) as usize;
            if checks.counted.remove(&index) {
                job.tasks_done -= 1;
                job.done_per_frame[pos] -= 1;
                job.uncount(index);
            } else {
                checks.voided.insert(index);
            }
            if job.stitched[pos] {
                job.stitched[pos] = false;
                job.frames_done -= 1;
                frames.push(job.spec.frames[pos]);
            }
            withdrawn.push(index);
        }
        if !withdrawn.is_empty() {
            tracing::warn!(
                job = job_id,
                tasks = withdrawn.len(),
                name,
                "results of a quarantined worker withdrawn; rendering them again"
            );
            frames.sort_unstable();
            frames.dedup();
            self.effects.push(Effect::Withdraw {
                job: job_id,
                tasks: withdrawn,
                frames,
            });
        }
    }

    /// Why a job being checked waits, if its only queued tasks are checks
    /// no connected worker may render.
    pub(super) fn check_blocked(&self, job: u64) -> Option<String> {
        let j = self.jobs.get(&job)?;
        let checks = j.verify.as_ref()?;
        let progress = self.sched.job_progress(job)?;
        let waiting = self.sched.excluded_queued(job);
        if waiting.is_empty() || progress.queued as usize > waiting.len() {
            return None;
        }
        let tags = self.sched.connected_tags();
        let stuck = waiting
            .iter()
            .all(|(_, excluded)| tags.iter().all(|(_, t)| excluded.contains(t)));
        if !stuck {
            return None;
        }
        let (index, _) = waiting[0];
        let names: Vec<&str> = (checks.pending.get(&index).into_iter().flatten())
            .map(|o| o.name.as_str())
            .collect();
        Some(format!(
            "task {index} waits to be checked by a worker other than {}: --verify needs a \
             second worker (a third when two renders differ)",
            names.join(" and ")
        ))
    }
}
