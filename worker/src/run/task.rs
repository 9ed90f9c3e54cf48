//! Running one task: its environment, the engine's render on the blocking
//! pool with progress and cancellation heard from the connection, the
//! watch that reports a task busy or stuck, and the result sent back.

use super::*;

/// What a render task needs from the worker around it.
pub(super) struct TaskEnv {
    pub(super) config: Arc<Config>,
    pub(super) cache: Arc<Cache>,
    /// The connection it was assigned over, to fetch the job's files.
    pub(super) conn: quinn::Connection,
    pub(super) link: Link,
    pub(super) finished: mpsc::UnboundedSender<(TaskRef, Outcome)>,
    pub(super) slots: Arc<Slots>,
}

pub(super) async fn run_task(
    env: TaskEnv,
    job: Arc<JobInfo>,
    task: TaskSpec,
    ctl: Arc<Control>,
    turn: Turn,
) {
    let TaskEnv {
        config,
        cache,
        conn,
        link,
        finished,
        slots: _,
    } = env;
    let t = task.task;
    let outcome = match render(&config, &cache, &conn, link, &job, &task, ctl, turn).await {
        Ok(report) => Outcome::Report(report),
        Err(e) if matches!(e, RenderError::Fetch(_)) && conn.close_reason().is_some() => {
            tracing::warn!(
                job = t.job,
                task = t.index,
                "connection lost while fetching the job's files: {e:#}"
            );
            Outcome::Lost(Box::new(task))
        }
        Err(e) => {
            let failure = match &e {
                RenderError::Render(e) => e.downcast_ref::<crate::engine::Failure>(),
                RenderError::Fetch(_) => None,
            };
            let log = failure.map(|f| tessera_protocol::messages::log_tail(&f.log).to_string());
            let unsupported = failure.is_some_and(|f| f.unsupported);
            let e = anyhow::Error::from(e);
            tracing::warn!(job = t.job, task = t.index, "task failed: {e:#}");
            Outcome::Report(Report {
                msg: WorkerMsg::Failed {
                    task: t,
                    error: format!("{e:#}"),
                    log: log.unwrap_or_default(),
                    unsupported,
                },
                upload: None,
            })
        }
    };
    let _ = finished.send((t, outcome));
}

/// Waits for a render on the blocking pool, stopping it (through `ctl`)
/// once it runs past `limit`, or once its renderer has stalled for `stall`:
/// printed nothing and used almost no CPU time (a hung or deadlocked
/// renderer; one that spins without output is ended by `limit`). The task
/// then fails with that reason and the renderer's log.
pub(super) async fn watch(
    mut render: tokio::task::JoinHandle<anyhow::Result<Vec<u8>>>,
    ctl: &Control,
    limit: Option<Duration>,
    stall: Duration,
) -> anyhow::Result<Vec<u8>> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut stopped: Option<String> = None;
    let mut busy = BusyWatch::default();
    let result = loop {
        tokio::select! {
            result = &mut render => break result.context("the render thread panicked").and_then(|r| r),
            _ = tick.tick(), if stopped.is_none() => {
                let short = tessera_protocol::text::short_duration;
                if busy.working(ctl.group()) {
                    ctl.seen_busy();
                }
                if let Some(limit) = limit.filter(|l| started.elapsed() >= *l) {
                    stopped = Some(format!("task ran past its {} limit", short(limit)));
                } else if ctl.quiet_for().is_some_and(|q| q >= stall) {
                    stopped = Some(format!(
                        "the renderer printed nothing and used no CPU for {}: stopped as stalled",
                        short(stall)
                    ));
                }
                if let Some(why) = &stopped {
                    tracing::warn!("{why}");
                    ctl.cancel();
                }
            }
        }
    };
    match (stopped, result) {
        (Some(message), Err(e)) => {
            let log = (e.downcast_ref::<Failure>()).map_or_else(String::new, |f| f.log.clone());
            Err(Failure {
                message,
                log,
                unsupported: false,
            }
            .into())
        }
        // It finished in the moment it was stopped: the output is whole.
        (_, result) => result,
    }
}

/// Whether a renderer works, from the CPU time of its process group's
/// leader: at least a tenth of a core over each second it is sampled.
#[derive(Default)]
pub(super) struct BusyWatch {
    /// (group, CPU ms, when) of the last sample.
    pub(super) last: Option<(i32, u64, Instant)>,
}

impl BusyWatch {
    pub(super) const EVERY: Duration = Duration::from_secs(1);

    /// Samples `group` (0: none) when a second has passed since the last
    /// sample; true when it used a tenth of a core or more since.
    pub(super) fn working(&mut self, group: i32) -> bool {
        if group <= 0 {
            self.last = None;
            return false;
        }
        match self.last {
            Some((g, _, at)) if g == group && at.elapsed() < Self::EVERY => false,
            last => {
                // One small /proc file a second, served from the kernel's
                // memory: no disk, nothing to wait on.
                let Some(cpu) = crate::child::cpu_ms(group) else {
                    self.last = None;
                    return false;
                };
                let now = Instant::now();
                self.last = Some((group, cpu, now));
                last.filter(|(g, _, _)| *g == group)
                    .is_some_and(|(_, before, at)| {
                        let wall = now.duration_since(at).as_millis() as u64;
                        cpu.saturating_sub(before).saturating_mul(10) >= wall
                    })
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum RenderError {
    #[error("{0:#}")]
    Fetch(anyhow::Error),
    #[error("{0:#}")]
    Render(anyhow::Error),
}

// Long because: one task's life in order (engine, pinned files, the
// build, cache changes told, a render slot, progress, the render or
// finish on the blocking pool under the task timeout, the report); each
// step holds guards the later ones need alive, so it reads whole.
#[allow(clippy::too_many_arguments)]
pub(super) async fn render(
    config: &Config,
    cache: &Cache,
    conn: &quinn::Connection,
    link: Link,
    job: &Arc<JobInfo>,
    task: &TaskSpec,
    ctl: Arc<Control>,
    turn: Turn,
) -> Result<Report, RenderError> {
    let engine = config
        .engines
        .iter()
        .find(|e| e.kind() == job.engine)
        .cloned()
        .with_context(|| format!("this worker does not offer the {} engine", job.engine))
        .map_err(RenderError::Render)?;
    // The job's files stay pinned in the cache until this task is over.
    let files =
        (cache.prepare(conn, job, task.frames_needed()).await).map_err(RenderError::Fetch)?;
    let dir = files.dir().to_path_buf();
    // With `--blender auto`, the stored build the job renders with, if none
    // of the worker's own Blenders fits: pinned until this task is over.
    let _build = match &config.builds {
        Some(auto) if job.engine == tessera_protocol::job::Engine::Blender => {
            // One task at a time unpacks and checks a build: tasks fetched
            // ahead (pipelined leases) would otherwise check a build another
            // is still unpacking.
            static PREPARING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
            let one_at_a_time = PREPARING.lock().await;
            let build = auto.prepare(cache, conn, job, &dir).await;
            drop(one_at_a_time);
            build.map_err(|e| match e.downcast_ref::<crate::engine::Failure>() {
                Some(_) => RenderError::Render(e),
                None => RenderError::Fetch(e),
            })?
        }
        _ => None,
    };
    if cache.take_builds_removed() {
        if let Some(auto) = &config.builds {
            auto.blender.end_build_sessions();
        }
    }
    if let Some((added, removed)) = cache.take_changes() {
        // With no connection now, the next join reports the whole cache.
        if let Some(tx) = link.lock().expect("link lock").as_ref() {
            let _ = tx.send(WorkerMsg::Cached { added, removed });
        }
    }
    // Its files are here; it renders once a slot is free and every task
    // assigned before it has one (a task queued behind the slots waits
    // here, and is aborted here when canceled).
    let _slot = turn.slot().await;
    tracing::info!(
        job = task.task.job,
        task = task.task.index,
        epoch = task.task.epoch,
        "task rendering"
    );
    let started = Instant::now();
    let (job2, task2) = (job.clone(), task.clone());
    let t = task.task;
    let last_sent = std::sync::Mutex::new(None::<Instant>);
    // Samples done, at most four reports a second, on whichever connection
    // is current.
    let progress = move |done: u32, total: u32, stage: Option<&str>| {
        let mut last = last_sent.lock().expect("progress lock");
        if last.is_none_or(|l| l.elapsed() >= Duration::from_millis(250)) || done == total {
            *last = Some(Instant::now());
            if let Some(tx) = link.lock().expect("link lock").as_ref() {
                let _ = tx.send(WorkerMsg::Progress {
                    task: t,
                    done,
                    total,
                    stage: stage.map(str::to_string),
                });
            }
        }
    };
    // A canceled task's renderer is killed (the blocking thread is not
    // left rendering what nobody wants while the slot takes new work); one
    // past the job's time limit, or silent for the stall window, likewise.
    let limit = job.task_timeout_ms.map(Duration::from_millis);
    let watched = ctl.clone();
    let output = match task.finish {
        None => {
            let render = tokio::task::spawn_blocking(move || {
                engine.render(&job2, &dir, &task2, &progress, &ctl)
            });
            watch(render, &watched, limit, config.stall_window).await
        }
        Some(passes) => {
            // A finishing task: the frame's stitched passes, from the
            // coordinator like a job file, beside the job folder.
            let at = dir.with_extension(format!("passes-{}-{}.exr", t.index, t.epoch));
            (cache.fetch_passes(conn, t.job, passes, &at).await).map_err(RenderError::Fetch)?;
            let at2 = at.clone();
            let finish =
                tokio::task::spawn_blocking(move || engine.finish(&job2, &dir, &task2, &at2, &ctl));
            let finished = watch(finish, &watched, limit, config.stall_window).await;
            let _ = std::fs::remove_file(&at);
            finished
        }
    }
    .map_err(RenderError::Render)?;
    let render_ms = started.elapsed().as_millis() as u64;
    tracing::info!(
        job = t.job,
        task = t.index,
        frame = task.frame,
        x = task.tile.x,
        y = task.tile.y,
        render_ms,
        "task rendered"
    );
    let digest = Digest::of(&output);
    let inline = output.len() <= MAX_INLINE_OUTPUT;
    let (inline, upload) = if inline {
        (Some(output), None)
    } else {
        (None, Some(output))
    };
    Ok(Report {
        msg: WorkerMsg::Done {
            task: t,
            output: digest,
            render_ms,
            inline,
        },
        upload,
    })
}
