//! What the farm core shows: job statuses (with cost, cost to finish and
//! ETA), worker statuses, snapshots for the monitor and a frame's tiles.

use tessera_protocol::messages::{
    FarmStatus, JobState, JobStatus, RunningTask, Snapshot, TaskRef, TileState, TileStatus,
    WorkerDetail, WorkerState, WorkerStatus,
};

use super::{FarmCore, Now, WorkerEntry};
use crate::scheduler::{TaskKey, WorkerId};

impl FarmCore {
    /// A job's status at `now`, or `None` when there is no such job.
    pub fn job_status(&self, id: u64, now: Now) -> Option<JobStatus> {
        let j = self.jobs.get(&id)?;
        let mut status = j.status(id, self.running(id), self.blocked(id, j.spec.engine));
        status.cost_usd = self.ledger.job_cost(id, now.ms);
        if j.final_state.is_none() {
            let remaining = status.tasks_total - status.tasks_done;
            status.cost_to_finish_usd = self.ledger.cost_to_finish(id, remaining, now.ms);
            if let Some((since, done_then)) = j.started {
                let done = f64::from(j.tasks_done.saturating_sub(done_then));
                let secs = now.ms.saturating_sub(since) as f64 / 1000.0;
                if done > 0.0 && secs > 0.0 {
                    // Tenths of a second: what a person or a script can use.
                    let eta = f64::from(remaining) * secs / done;
                    status.eta_secs = Some((eta * 10.0).round() / 10.0);
                }
            }
        }
        Some(status)
    }

    /// Status of every job, workers and farm figures, at `now`.
    pub fn snapshot(&self, now: Now) -> Snapshot {
        let workers = self.worker_statuses(now);
        // Folded from +0.0: an empty f64 `sum()` is -0.0, which the
        // monitor showed as `idle $-0.00/h` with every worker busy.
        let burn: f64 = workers
            .iter()
            .map(|w| w.price_per_hour)
            .fold(0.0, |a, b| a + b);
        let idle: f64 = workers
            .iter()
            .filter(|w| w.state == WorkerState::Idle)
            .map(|w| w.price_per_hour)
            .fold(0.0, |a, b| a + b);
        Snapshot {
            unix_ms: now.unix_ms,
            jobs: self
                .jobs
                .keys()
                .filter_map(|&id| self.job_status(id, now))
                .collect(),
            workers,
            farm: FarmStatus {
                burn_usd_per_hour: burn,
                idle_usd_per_hour: idle,
            },
        }
    }

    /// Every connected worker, by id.
    pub fn worker_statuses(&self, now: Now) -> Vec<WorkerStatus> {
        let mut out: Vec<WorkerStatus> = (self.workers.iter())
            .map(|(&id, w)| self.worker_status(id, w, now))
            .collect();
        out.sort_by_key(|w| w.id);
        out
    }

    /// One connected worker in detail; `None` when it is not connected.
    pub fn worker_detail(&self, id: WorkerId, now: Now) -> Option<WorkerDetail> {
        let w = self.workers.get(&id)?;
        let mut blocklisted_by: Vec<u64> = (self.blocklists.iter())
            .filter(|(_, identities)| identities.contains(&w.identity))
            .map(|(&job, _)| job)
            .collect();
        blocklisted_by.sort_unstable();
        Some(WorkerDetail {
            status: self.worker_status(id, w, now),
            blocklisted_by,
            quarantined: self.quarantined.get(&w.identity).cloned(),
            history: w.history.iter().copied().collect(),
        })
    }

    /// The name a connected worker's identity was enrolled under (what
    /// revoking names).
    pub fn worker_name(&self, id: WorkerId) -> Option<String> {
        self.workers.get(&id).map(|w| w.name.clone())
    }

    fn worker_status(&self, id: WorkerId, w: &WorkerEntry, now: Now) -> WorkerStatus {
        {
            {
                let tasks: Vec<RunningTask> = self
                    .sched
                    .running_on(id)
                    .into_iter()
                    .filter_map(|(key, epoch)| {
                        let job = self.jobs.get(&key.job)?;
                        let lease = TaskRef {
                            job: key.job,
                            index: key.index,
                            epoch: epoch.0,
                        };
                        let spec = job.task_spec(lease);
                        Some(RunningTask {
                            job: key.job,
                            index: key.index,
                            frame: spec.frame,
                            tile: spec.tile,
                            progress: w.progress.get(&lease).map(|p| (p.0, p.1)),
                            stage: w.progress.get(&lease).and_then(|p| p.2.clone()),
                        })
                    })
                    .collect();
                let state = if w.draining {
                    WorkerState::Draining
                } else if self.sched.is_silent(id, now.ms) {
                    WorkerState::Silent
                } else if tasks.is_empty() {
                    WorkerState::Idle
                } else {
                    WorkerState::Busy
                };
                WorkerStatus {
                    id,
                    name: w.name.clone(),
                    hostname: w.info.hostname.clone(),
                    engines: w.info.engines.clone(),
                    slots: w.info.slots,
                    state,
                    running: tasks.len() as u32,
                    tasks_done: w.tasks_done,
                    price_per_hour: w.info.price_per_hour,
                    connected_secs: now.ms.saturating_sub(w.joined_ms) / 1000,
                    tasks,
                    telemetry: w.telemetry.clone(),
                    interruptible: w.info.interruptible,
                    blenders: self.offers_of(&w.info),
                }
            }
        }
    }

    /// Every tile of one frame, for the mosaic.
    pub fn tiles(&self, job_id: u64, frame: u32) -> Result<Vec<TileStatus>, String> {
        let Some(job) = self.jobs.get(&job_id) else {
            return Err(format!("no job {job_id} on this coordinator"));
        };
        let Some(pos) = job.spec.frames.iter().position(|&f| f == frame) else {
            return Err(format!("job {job_id} does not render frame {frame}"));
        };
        let spec = &job.spec;
        let (w, h) = spec.resolution;
        let stitched = job.stitched[pos] || job.final_state == Some(JobState::Done);
        let mut out = Vec::new();
        for tile in 0..spec.tiles.count() {
            let state = if stitched {
                TileState::Done
            } else {
                let first = match &job.chunks {
                    // An Unreal frame is one tile of the chunk task holding it.
                    Some(chunks) => {
                        chunks.partition_point(|c| c.first_pos as usize <= pos) as u32 - 1
                    }
                    None => pos as u32 * job.tasks_per_frame + tile * spec.sample_ranges,
                };
                self.tile_state(job_id, first..first + spec.sample_ranges, job.final_state)
            };
            out.push(TileStatus {
                tile: spec.tiles.rect(tile, w, h),
                state,
            });
        }
        Ok(out)
    }

    /// The state of one unstitched tile from its tasks (its sample ranges).
    fn tile_state(
        &self,
        job_id: u64,
        tasks: std::ops::Range<u32>,
        final_state: Option<JobState>,
    ) -> TileState {
        let views: Vec<_> = tasks
            .filter_map(|index| {
                self.sched
                    .task_view(TaskKey { job: job_id, index })
                    .map(|v| (index, v))
            })
            .collect();
        if !views.is_empty() && views.iter().all(|(_, v)| v.done) {
            return TileState::Done;
        }
        if let Some((index, (worker, epoch))) =
            views.iter().find_map(|(i, v)| v.lease.map(|l| (*i, l)))
        {
            let lease = TaskRef {
                job: job_id,
                index,
                epoch: epoch.0,
            };
            let progress = (self.workers.get(&worker))
                .and_then(|w| w.progress.get(&lease).map(|p| (p.0, p.1)));
            return TileState::Rendering(progress);
        }
        if views.iter().any(|(_, v)| v.failures > 0) || final_state == Some(JobState::Failed) {
            return TileState::Failed;
        }
        TileState::Queued
    }
}
