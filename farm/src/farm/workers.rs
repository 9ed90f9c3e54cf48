//! The farm core's worker events: joining (with adoption of the tasks a
//! rejoining worker still holds), leaving, heartbeats, progress, results
//! offered and tasks failed.

use tessera_protocol::blender::BlenderVersion;
use tessera_protocol::job::TileRect;
use tessera_protocol::messages::{CoordMsg, FarmEvent, TaskRef, WorkerInfo, WorkerMsg};
use tessera_protocol::Digest;

use std::collections::{HashMap, HashSet};

use super::{
    key, lease_ref, AcceptedResult, Effect, FarmCore, Now, WorkerEntry, LOST_IN_A_ROW_FAILS,
};
use crate::scheduler::{self, Epoch, TaskKey, WorkerId};

impl FarmCore {
    /// A worker joined under its enrolled `identity`: registers it, says
    /// welcome, applies its identity's blocklists and quarantine, adopts the
    /// tasks it still holds and cancels the ones it cannot keep.
    pub fn worker_joined(
        &mut self,
        name: &str,
        identity: &str,
        info: WorkerInfo,
        now: Now,
    ) -> WorkerId {
        self.check_blocked_soon();
        let id = self.next_worker;
        self.next_worker += 1;
        let engines = info.engines.iter().map(|e| e.name().to_string()).collect();
        self.sched.add_worker(id, info.slots, engines, now.ms);
        self.sched
            .set_worker_tag(id, super::verify::tag_of(identity));
        for (&job, identities) in &self.blocklists {
            if identities.contains(identity) {
                self.sched.blocklist(job, id);
            }
        }
        self.sched.worker_holds(id, &info.cached, &[]);
        self.sched.set_worker_blenders(id, self.offers_of(&info));
        self.sched
            .set_worker_host(id, info.host.as_deref().cloned());
        let fetches_builds = info.fetches_builds;
        let draining = info.draining;
        let holding = info.holding.clone();
        // Its process restarted if it no longer holds what it rendered.
        let held: Vec<TaskKey> = holding.iter().map(|&t| key(t)).collect();
        let lost = self.lost.rejoined(identity, &held);
        self.workers.insert(
            id,
            WorkerEntry {
                name: name.to_string(),
                identity: identity.to_string(),
                info,
                jobs_sent: HashSet::new(),
                tasks_done: 0,
                progress: HashMap::new(),
                joined_ms: now.ms,
                telemetry: None,
                history: Default::default(),
                draining: false,
            },
        );
        self.emit(
            now,
            FarmEvent::WorkerJoined {
                worker: id,
                name: name.to_string(),
            },
        );
        self.send(
            id,
            CoordMsg::Joined {
                worker_id: id,
                heartbeat_ms: self.config.heartbeat_ms,
                lease_ms: self.config.lease_ms,
                store_urls: self.config.store_urls,
            },
        );
        if fetches_builds {
            self.send(id, CoordMsg::Builds(self.builds.clone()));
        }
        if let Some(reason) = self.quarantined.get(identity) {
            tracing::warn!(
                worker = id,
                name,
                "a quarantined worker joined: no work for it ({reason})"
            );
            self.stop_giving_work(id, now);
            for &task in &holding {
                self.send(id, CoordMsg::Cancel(task));
            }
        } else {
            self.adopt_held_tasks(id, &holding, now);
            if draining {
                // Asked to drain before it reconnected: it finishes what
                // it adopted and gets nothing new.
                self.sched.drain_worker(id);
                if let Some(w) = self.workers.get_mut(&id) {
                    w.draining = true;
                }
            }
        }
        for task in lost {
            self.lease_lost(task, now);
        }
        self.effects.push(Effect::Wake);
        id
    }

    /// Takes over the leases of the tasks a (re)joining worker still holds,
    /// so that work still rendering when the coordinator restarted, or when
    /// the worker's connection dropped, is not rendered again; tells it to
    /// drop the rest.
    fn adopt_held_tasks(&mut self, id: WorkerId, holding: &[TaskRef], now: Now) {
        let (name, identity) = self
            .workers
            .get(&id)
            .map_or((String::new(), String::new()), |w| {
                (w.name.clone(), w.identity.clone())
            });
        for &task in holding {
            let done = (self.sched.task_view(key(task))).is_some_and(|view| view.done);
            let adopted = if done {
                Err(scheduler::Refused::AlreadyDone { task: key(task) })
            } else if self.may_adopt(&identity, task) {
                self.sched.adopt(id, key(task), Epoch(task.epoch), now.ms)
            } else {
                Err(scheduler::Refused::StaleEpoch {
                    task: key(task),
                    epoch: Epoch(task.epoch),
                    current: None,
                })
            };
            match adopted {
                Ok(()) => {
                    self.released.remove(&key(task));
                    self.earlier.remove(&key(task));
                    tracing::info!(
                        worker = id,
                        name,
                        job = task.job,
                        task = task.index,
                        epoch = task.epoch,
                        "task re-adopted from the rejoining worker"
                    );
                    let price = self.workers.get(&id).map_or(0.0, |w| w.info.price_per_hour);
                    self.ledger.lease_adopted(key(task), id, price, now.ms);
                    self.job_started(task.job, now);
                    if let Some(w) = self.workers.get_mut(&id) {
                        w.jobs_sent.insert(task.job);
                    }
                    let event = FarmEvent::TaskStarted {
                        job: task.job,
                        index: task.index,
                        worker: id,
                    };
                    self.emit(now, event);
                }
                Err(refused) => {
                    tracing::info!(
                        worker = id,
                        name,
                        job = task.job,
                        task = task.index,
                        "not re-adopted: {refused}"
                    );
                    self.send(id, CoordMsg::Cancel(task));
                }
            }
        }
    }

    /// Whether a (re)joining worker enrolled as `identity` may adopt `task`
    /// under the epoch it names: only a lease this farm handed to that
    /// identity — one still live, or one of this run that ended with its
    /// worker's connection ([`FarmCore::released`]), or one an earlier run
    /// recorded ([`FarmCore::earlier`]). A queued task named with a made-up
    /// epoch is refused.
    fn may_adopt(&self, identity: &str, task: TaskRef) -> bool {
        let Some(view) = self.sched.task_view(key(task)) else {
            return false;
        };
        if view.done {
            return false;
        }
        let first_epoch = self.config.scheduler.first_epoch;
        match view.lease {
            // Its lease is live: only the worker that holds it, under
            // another connection that has not ended yet.
            Some((holder, epoch)) if epoch.0 == task.epoch => self
                .workers
                .get(&holder)
                .is_none_or(|w| w.identity == identity),
            // Another lease is live: the scheduler refuses it, or adopts
            // the straggler's second lease it names.
            Some(_) => true,
            None if task.epoch >= first_epoch => self
                .released
                .get(&key(task))
                .is_some_and(|(epoch, holder)| epoch.0 == task.epoch && holder == identity),
            None => self
                .earlier
                .get(&key(task))
                .is_some_and(|(epoch, holder)| epoch.0 == task.epoch && holder == identity),
        }
    }

    /// A worker's connection ended: its leases go back to the queue.
    /// Returns how many tasks were requeued.
    pub fn worker_left(&mut self, id: WorkerId, now: Now) -> usize {
        self.check_blocked_soon();
        let held = self.sched.running_on(id);
        if let Some(w) = self.workers.get(&id) {
            for &(task, epoch) in &held {
                self.released.insert(task, (epoch, w.identity.clone()));
            }
        }
        // Only a lease it was rendering may have been lost with it: not one
        // queued behind its slots (never started), nor any of a worker that
        // said it drains (it handed its work back on purpose).
        let started: Vec<TaskKey> = (held.iter())
            .filter(|(task, _)| !self.sched.is_queued(id, *task))
            .map(|(task, _)| *task)
            .collect();
        let requeued = self.sched.remove_worker(id, now.ms);
        let identity = (self.workers.get(&id))
            .filter(|w| !w.draining)
            .map(|w| w.identity.clone());
        for &task in &requeued {
            self.lease_ended(task, id, false, now);
            if let Some(identity) = identity.as_ref().filter(|_| started.contains(&task)) {
                self.lost.ended_with_worker(identity, task, now.ms);
            }
        }
        if let Some(w) = self.workers.remove(&id) {
            self.emit(
                now,
                FarmEvent::WorkerLeft {
                    worker: id,
                    name: w.name,
                },
            );
        }
        self.effects.push(Effect::Wake);
        requeued.len()
    }

    /// A lease was lost with its worker (see [`super::lost`]): one more in
    /// a row for its task; at [`LOST_IN_A_ROW_FAILS`] the job fails with
    /// that reason.
    pub(super) fn lease_lost(&mut self, task: TaskKey, now: Now) {
        let lost = self.lost.count(task);
        tracing::warn!(
            job = task.job,
            task = task.index,
            lost,
            "a lease was lost with its worker"
        );
        if lost >= LOST_IN_A_ROW_FAILS {
            let error = format!(
                "task {}: {lost} workers in a row died while rendering it (each went away without a \
                 result and did not come back for it): the render may be crashing its worker or \
                 exhausting its memory",
                task.index
            );
            self.fail_job(task.job, error, now);
        }
    }

    /// Bills and forgets a lease that ended.
    pub(super) fn lease_ended(
        &mut self,
        task: TaskKey,
        worker: WorkerId,
        finished: bool,
        now: Now,
    ) {
        self.ledger.lease_ended(task, worker, finished, now.ms);
        let waiting = (self.sched.task_view(task)).is_some_and(|v| !v.done && v.lease.is_none());
        if !finished && waiting {
            self.requeued.insert(task);
        }
        if let Some(w) = self.workers.get_mut(&worker) {
            w.progress
                .retain(|t, _| (t.job, t.index) != (task.job, task.index));
        }
    }

    /// Tasks queued behind workers' render slots went back to their queues
    /// (`why`: the worker drains, the job was paused, the worker was
    /// blocklisted for the job): their holders drop them, and the others
    /// take them when they may.
    pub(super) fn cancel_handed_back(&mut self, why: &'static str) {
        let handed = self.sched.take_superseded();
        if !handed.is_empty() {
            tracing::info!(handed_back = handed.len(), why, "queued tasks handed back");
            // Not `now`-dependent: a canceled lease bills nothing more.
            for lease in &handed {
                self.ledger.lease_ended(lease.task, lease.worker, false, 0);
                self.send(
                    lease.worker,
                    CoordMsg::Cancel(lease_ref(lease.task, lease.epoch)),
                );
            }
            self.effects.push(Effect::Wake);
        }
    }

    /// Tells the holders of `leases` to stop working on them (the leases
    /// have ended).
    pub(super) fn send_cancels(&mut self, leases: &[scheduler::Assignment], now: Now) {
        for lease in leases {
            self.lease_ended(lease.task, lease.worker, false, now);
            self.send(
                lease.worker,
                CoordMsg::Cancel(lease_ref(lease.task, lease.epoch)),
            );
        }
    }

    /// A message from worker `id`, except `Done`, whose output the shell
    /// must check and store first (see [`FarmCore::result_offered`]).
    pub fn worker_msg(&mut self, id: WorkerId, msg: WorkerMsg, now: Now) {
        if let WorkerMsg::Done { task, .. } | WorkerMsg::Failed { task, .. } = &msg {
            if let Some(w) = self.workers.get_mut(&id) {
                w.progress.remove(task);
            }
        }
        match msg {
            // Scans are answered by the shell (`conn/scan.rs`), not here.
            WorkerMsg::Join(_) | WorkerMsg::Scanned { .. } => {}
            WorkerMsg::Cached { added, removed } => {
                self.sched.worker_holds(id, &added, &removed);
            }
            WorkerMsg::Draining => {
                self.check_blocked_soon();
                self.sched.drain_worker(id);
                self.cancel_handed_back("the worker drains");
                if let Some(w) = self.workers.get_mut(&id) {
                    w.draining = true;
                    tracing::info!(
                        worker = id,
                        name = w.name.as_str(),
                        "worker shutting down: no new work for it"
                    );
                }
            }
            WorkerMsg::Progress {
                task,
                done,
                total,
                mut stage,
            } => {
                // Kept only for a task the worker holds, so the map is
                // bounded by its leases.
                if self.holds(id, task).is_ok() {
                    if let Some(w) = self.workers.get_mut(&id) {
                        // From the network: bounded, cut at a character.
                        if let Some(s) = stage.as_mut() {
                            let mut end = s.len().min(tessera_protocol::messages::MAX_STAGE);
                            while !s.is_char_boundary(end) {
                                end -= 1;
                            }
                            s.truncate(end);
                        }
                        w.progress.insert(task, (done, total, stage));
                    }
                }
            }
            WorkerMsg::Heartbeat { telemetry } => {
                if let (Some(t), Some(w)) = (telemetry, self.workers.get_mut(&id)) {
                    use tessera_protocol::messages::{TelemetryPoint, MAX_TELEMETRY_HISTORY};
                    if w.history.len() == MAX_TELEMETRY_HISTORY {
                        w.history.pop_front();
                    }
                    w.history.push_back(TelemetryPoint::of(now.unix_ms, &t));
                    w.telemetry = Some(t);
                }
                if let Some(w) = self.workers.get(&id) {
                    self.lost.alive(&w.identity);
                }
                if self.sched.heartbeat(id, now.ms) {
                    self.effects.push(Effect::Wake);
                }
            }
            WorkerMsg::Done {
                task,
                output,
                render_ms,
                ..
            } => self.result_offered(id, task, output, render_ms, now),
            WorkerMsg::Failed {
                task,
                error,
                unsupported,
                ..
            } => self.task_failed(id, task, error, unsupported, now),
        }
    }

    /// Whether a file `digest` is needed by a task worker `id` holds now:
    /// its job's manifest lists it, or it is the stitched passes its
    /// finishing task composites. (Chunks of those files are granted when
    /// their recipe is served; see `conn::fetch`.)
    pub fn task_needs(&self, id: WorkerId, digest: &Digest) -> bool {
        (self.sched.running_on(id).into_iter()).any(|(t, _)| {
            let Some(job) = self.jobs.get(&t.job) else {
                return false;
            };
            let files = job.spec.manifest.iter().chain(job.inputs.iter().flatten());
            if files.into_iter().any(|m| m.digest == *digest) {
                return true;
            }
            // A finishing task reads its frame's stitched passes.
            let pos = (t.index / job.tasks_per_frame) as usize;
            job.spec.finish
                && t.index % job.tasks_per_frame == job.renders_per_frame()
                && job.passes.get(pos).copied().flatten().map(|p| p.digest) == Some(*digest)
        })
    }

    /// Whether worker `id` holds a current lease on `task` under its epoch.
    /// The worker to scan a file saved by Blender `saved` for the farm: a
    /// connected one, not draining, with a Blender of its own of that
    /// series or newer (never older: an older Blender may crash on the
    /// file), the closest series first, then the lowest id. Its id and name.
    pub fn scanner_for(&self, saved: BlenderVersion) -> Option<(WorkerId, String)> {
        let fits = |w: &WorkerEntry| {
            (w.info.blenders.iter())
                .map(|b| b.version.series())
                .filter(|s| *s >= saved.series())
                .min()
        };
        (self.workers.iter())
            .filter(|(_, w)| !w.draining)
            .filter_map(|(id, w)| Some((fits(w)?, *id, w)))
            .min_by_key(|(series, id, _)| (*series, *id))
            .map(|(_, id, w)| (id, w.name.clone()))
    }

    /// Whether worker `id` holds the current lease on `task`, and if not,
    /// why: a result for a task already done says so, so a worker that
    /// resends one after a coordinator restart knows it was kept.
    pub fn holds(&self, id: WorkerId, task: TaskRef) -> Result<(), scheduler::Refused> {
        self.sched.lease_check(id, key(task), Epoch(task.epoch))
    }

    /// What the output of `task` must be: its tile rectangle, and whether
    /// the task is its frame's only one or its finishing task (then the
    /// renderer's file is the frame, in whatever format it wrote). `None`
    /// for an unknown task.
    pub fn expected_output(&self, task: TaskRef) -> Option<(TileRect, bool)> {
        let job = self.jobs.get(&task.job)?;
        if task.index >= job.tasks_total() {
            return None;
        }
        let mut rect = job.task_spec(task).tile;
        // A chunk's bundle holds a whole frame per frame of the chunk.
        let frames = job.frame_positions(task.index).len() as u32;
        rect.height = rect.height.saturating_mul(frames.max(1));
        let finishing =
            job.spec.finish && task.index % job.tasks_per_frame == job.renders_per_frame();
        Some((rect, job.tasks_per_frame == 1 || finishing))
    }

    /// For a chunk task of an Unreal job: the frames its bundle must hold,
    /// each with the job's name for it, and their format.
    pub fn expected_bundle(
        &self,
        task: TaskRef,
    ) -> Option<(Vec<(u32, String)>, tessera_protocol::job::OutputFormat)> {
        let job = self.jobs.get(&task.job)?;
        let chunk = *job.chunks.as_ref()?.get(task.index as usize)?;
        let spec = &job.spec;
        let unreal = spec.unreal.as_ref()?;
        Some((
            unreal.expected_frames(&spec.frames, chunk, spec.output),
            spec.output,
        ))
    }

    /// A result whose output is not what its task asked for (wrong
    /// dimensions, too large, not stored): refused, and counted as a
    /// failed attempt of that worker, so the task is retried elsewhere and
    /// never reaches stitching.
    pub fn result_rejected(&mut self, id: WorkerId, task: TaskRef, reason: String, now: Now) {
        self.refuse(id, task, reason.clone());
        if self.holds(id, task).is_ok() {
            self.task_failed(id, task, format!("bad result: {reason}"), false, now);
        }
    }

    /// Refuses a worker's result (its output was not stored, or its lease
    /// is not current).
    pub fn refuse(&mut self, id: WorkerId, task: TaskRef, reason: String) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.progress.remove(&task);
        }
        tracing::info!(
            worker = id,
            job = task.job,
            task = task.index,
            "result refused: {reason}"
        );
        self.send(
            id,
            CoordMsg::Ack {
                task,
                accepted: false,
                reason: Some(reason),
            },
        );
    }

    /// A worker's finished task whose output is stored: accepted under its
    /// lease (then committed, then acknowledged) or refused.
    pub fn result_offered(
        &mut self,
        id: WorkerId,
        task: TaskRef,
        output: Digest,
        render_ms: u64,
        now: Now,
    ) {
        self.result_offered_similar(id, task, output, render_ms, &[], now);
    }

    /// [`FarmCore::result_offered`], with the earlier renders of a task
    /// being checked that this output agrees with within the tolerance
    /// (see [`FarmCore::inexact_opinions`]).
    pub fn result_offered_similar(
        &mut self,
        id: WorkerId,
        task: TaskRef,
        output: Digest,
        render_ms: u64,
        similar: &[Digest],
        now: Now,
    ) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.progress.remove(&task);
        }
        if self.holds(id, task).is_ok() {
            if let super::verify::Verdict::Held = self.check_result(id, task, output, similar, now)
            {
                return;
            }
        }
        match self
            .sched
            .complete(id, key(task), Epoch(task.epoch), now.ms)
        {
            Ok(_) => {
                self.rendered(id, task);
                self.lost.reset(key(task));
                self.lease_ended(key(task), id, true, now);
                // The other attempt of a straggler lost the race.
                let lost = self.sched.take_superseded();
                for l in &lost {
                    tracing::info!(
                        job = task.job,
                        task = task.index,
                        worker = l.worker,
                        winner = id,
                        "superseded: another attempt of the task finished first"
                    );
                }
                self.send_cancels(&lost, now);
                let worker_name = self
                    .workers
                    .get(&id)
                    .map_or(String::new(), |w| w.name.clone());
                self.effects.push(Effect::Commit(AcceptedResult {
                    worker: id,
                    worker_name,
                    task,
                    output,
                    render_ms,
                }));
            }
            Err(refused) => self.refuse(id, task, refused.to_string()),
        }
    }

    /// `unsupported`: the worker lacks something the job needs, so every task
    /// of the job would fail on it the same way.
    fn task_failed(
        &mut self,
        id: WorkerId,
        task: TaskRef,
        error: String,
        unsupported: bool,
        now: Now,
    ) {
        tracing::warn!(
            worker = id,
            job = task.job,
            task = task.index,
            "task failed: {error}"
        );
        let outcome = self
            .sched
            .fail(id, key(task), Epoch(task.epoch), error.clone(), now.ms);
        match outcome {
            Ok(outcome) => {
                // Recorded: the worker may forget the task (a worker that
                // kept it would never finish draining).
                self.send(
                    id,
                    CoordMsg::Ack {
                        task,
                        accepted: true,
                        reason: None,
                    },
                );
                self.lost.reset(key(task));
                if unsupported {
                    self.sched.blocklist(task.job, id);
                }
                if unsupported || outcome.blocklisted {
                    self.check_blocked_soon();
                    // Tasks of this job queued behind its slots go to
                    // other workers rather than fail here too.
                    self.sched.hand_back_queued(id, Some(task.job));
                    self.cancel_handed_back("the worker is blocklisted for the job");
                    if let Some(w) = self.workers.get(&id) {
                        (self.blocklists.entry(task.job).or_default()).insert(w.identity.clone());
                    }
                }
                self.lease_ended(key(task), id, false, now);
                let event = FarmEvent::TaskFailed {
                    job: task.job,
                    index: task.index,
                    worker: id,
                    error: error.clone(),
                };
                self.emit(now, event);
                if outcome.job_failed {
                    self.send_cancels(&outcome.cancel, now);
                    let collected = match self.sched.job_state(task.job) {
                        Some(scheduler::JobState::Failed(errors)) => errors,
                        _ => error,
                    };
                    let error = format!(
                        "task {} failed {} times: {collected}",
                        task.index, outcome.attempts
                    );
                    self.fail_job(task.job, error, now);
                } else if outcome.blocklisted {
                    tracing::warn!(
                        worker = id,
                        job = task.job,
                        "worker blocklisted for this job after {} failures",
                        scheduler::BLOCKLIST_AFTER
                    );
                }
            }
            Err(refused) => self.refuse(id, task, refused.to_string()),
        }
        self.effects.push(Effect::Wake);
    }
}
