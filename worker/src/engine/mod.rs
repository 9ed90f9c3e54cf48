//! Render engines. Each engine turns one task (frame, tile rectangle, sample
//! range) of a job whose files are laid out in a local folder into the bytes
//! of its output image. Engines are blocking; the worker runs them on
//! blocking threads.

pub mod blender;
pub use tessera_scan::blender_runtime;
pub mod builtin;
pub mod ffmpeg;
pub mod unreal;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_protocol::job::Engine as EngineKind;
use tessera_protocol::messages::{JobInfo, TaskSpec};

/// The environment variable naming a worker failpoint, for tests.
pub const FAILPOINT: &str = "TESSERA_FAILPOINT";
/// The builtin engine aborts the worker process when it starts a render.
pub const FAILPOINT_ABORT_IN_RENDER: &str = "abort-in-render";
/// A lying worker, for the `--verify` tests: the builtin engine inverts the
/// first row of every tile it renders whole, keeping its size and format.
pub const FAILPOINT_ALTER_PIXELS: &str = "alter-pixels";

/// The error of a render stopped because its task was canceled.
pub const CANCELED: &str = "canceled by the coordinator";

/// Milliseconds since the first call in this process: the clock renderers'
/// last output is kept on.
pub fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A renderer's last sign of life on [`clock_ms`]: updated by whatever reads
/// its output, read by the worker's stall watch.
pub type Heard = Arc<AtomicU64>;

/// What the worker asks of a running render, and what the render tells it:
/// whether it is canceled, the process group rendering it (killed at once
/// by a cancel, so that no renderer goes on for a task nobody wants), and
/// when that renderer last printed anything.
#[derive(Default)]
pub struct Control {
    canceled: AtomicBool,
    /// The process group now rendering the task (0: none), and its clock.
    running: Mutex<(i32, Option<Heard>)>,
}

impl Control {
    /// Cancels the task: its engine stops early, and the process group
    /// rendering it, if any, is killed now.
    pub fn cancel(&self) {
        let running = self.running.lock().expect("control lock");
        self.canceled.store(true, Ordering::Relaxed);
        crate::child::kill_group(running.0);
    }

    pub fn is_canceled(&self) -> bool {
        self.canceled.load(Ordering::Relaxed)
    }

    /// The flag, for engines that poll it in their own loops.
    pub fn flag(&self) -> &AtomicBool {
        &self.canceled
    }

    /// The task now renders in process group `group`, whose output `heard`
    /// follows: a cancel kills it. False (and the group killed) when the
    /// task was canceled already.
    pub fn running_in(&self, group: i32, heard: Option<Heard>) -> bool {
        let mut running = self.running.lock().expect("control lock");
        if self.is_canceled() {
            crate::child::kill_group(group);
            return false;
        }
        *running = (group, heard);
        true
    }

    /// The process group is no longer the task's (before it is reaped).
    pub fn done_running(&self) {
        *self.running.lock().expect("control lock") = (0, None);
    }

    /// The process group rendering the task now (0: none).
    pub fn group(&self) -> i32 {
        self.running.lock().expect("control lock").0
    }

    /// The renderer was seen working (its CPU time grows): for the stall
    /// watch, as good as a line of output. Cycles in the background prints
    /// its progress rarely (Blender 3.4: the first sample and the last).
    pub fn seen_busy(&self) {
        if let Some(heard) = &self.running.lock().expect("control lock").1 {
            heard.store(clock_ms(), Ordering::Relaxed);
        }
    }

    /// How long the renderer has printed nothing; `None` when no process
    /// with a watched output renders the task now (an in-process engine, or
    /// one that watches itself).
    pub fn quiet_for(&self) -> Option<Duration> {
        let running = self.running.lock().expect("control lock");
        let heard = running.1.as_ref()?.load(Ordering::Relaxed);
        Some(Duration::from_millis(clock_ms().saturating_sub(heard)))
    }
}

/// A failed render: one line for people, and the renderer's own output
/// around it, which the worker sends along for `tessera logs`.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub log: String,
    /// This worker cannot render the job at all (a feature its renderer
    /// lacks): the coordinator gives it no more of the job.
    pub unsupported: bool,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// One renderer a worker offers.
pub trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;

    /// Renders `task` of `job`, whose files are laid out under `job_dir`.
    /// `progress(done, total, stage)` reports samples as the engine learns
    /// them, and what it does before it renders any (`stage`, short text).
    /// `ctl` is canceled when the coordinator no longer wants the task (or
    /// it ran past its time): an engine polls it, or names the process
    /// group it renders in (`Control::running_in`), which the cancel
    /// kills; either way it returns an error soon after, and never renders
    /// the task again.
    fn render(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>>;

    /// Ends renderer sessions that have had no task for `idle` (a renderer
    /// kept warm between tasks holds memory, and may spin a core).
    fn end_idle_sessions(&self, _idle: Duration) {}

    /// A finishing task: runs the scene's whole-frame effects (compositor,
    /// denoising) on the frame's stitched `passes` and returns the frame in
    /// the scene's own output format.
    fn finish(
        &self,
        job: &JobInfo,
        _job_dir: &Path,
        _task: &TaskSpec,
        _passes: &Path,
        _ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        anyhow::bail!("the {} engine has no finishing step", job.engine)
    }

    /// The Blenders this engine offers (none for other engines).
    fn blender_offers(&self) -> Vec<tessera_protocol::blender::BlenderOffer> {
        Vec::new()
    }

    /// Scans `blend` (saved by Blender `saved`) for the farm: what it
    /// references as stored, with relative paths resolved against
    /// `artist_path`, the file's path on the submitting machine. Returns
    /// the scan's JSON. Only a Blender engine can.
    fn scan(
        &self,
        _blend: &Path,
        _saved: tessera_protocol::blender::BlenderVersion,
        _artist_path: &str,
    ) -> anyhow::Result<String> {
        anyhow::bail!("this engine cannot scan .blend files")
    }
}

/// The embedded path tracer. Keeps the last few parsed scenes so successive
/// tiles of a job skip parsing and texture decoding.
pub struct Builtin {
    threads: usize,
    scenes: Mutex<HashMap<PathBuf, Arc<(builtin::Scene, builtin::Textures)>>>,
}

impl Builtin {
    pub fn new(threads: usize) -> Builtin {
        Builtin {
            threads: threads.max(1),
            scenes: Mutex::new(HashMap::new()),
        }
    }

    fn scene(&self, path: &Path) -> anyhow::Result<Arc<(builtin::Scene, builtin::Textures)>> {
        if let Some(s) = self.scenes.lock().expect("scene cache").get(path) {
            return Ok(s.clone());
        }
        let scene = builtin::Scene::load(path)?;
        let textures = builtin::Textures::load(&scene, path.parent().unwrap_or(Path::new(".")))?;
        let loaded = Arc::new((scene, textures));
        let mut cache = self.scenes.lock().expect("scene cache");
        if cache.len() >= 8 {
            cache.clear();
        }
        cache.insert(path.to_path_buf(), loaded.clone());
        Ok(loaded)
    }
}

impl Engine for Builtin {
    fn kind(&self) -> EngineKind {
        EngineKind::Builtin
    }

    fn render(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        _progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        let canceled = ctl.flag();
        if std::env::var(FAILPOINT).is_ok_and(|v| v == FAILPOINT_ABORT_IN_RENDER) {
            // A render that takes its worker down (a crash, the OOM killer).
            std::process::abort();
        }
        let loaded = self
            .scene(&job_dir.join(&job.scene))
            .context("loading the scene")?;
        let (scene, textures) = &*loaded;
        let (w, h) = scene.resolution();
        let rect = builtin::PixelRect {
            x: task.tile.x,
            y: task.tile.y,
            width: task.tile.width,
            height: task.tile.height,
        };
        anyhow::ensure!(
            rect.fits(w, h),
            "tile {rect:?} lies outside the {w}x{h} frame"
        );
        let (first, end) = task.samples;
        anyhow::ensure!(
            first < end && end <= task.total_samples,
            "sample range {first}..{end} is not within the {} samples",
            task.total_samples
        );
        if task.samples != (0, task.total_samples) {
            // One range of a tile split for checkpoints: sums that the
            // coordinator adds up with the tile's other ranges.
            let sums = builtin::render_tile_sums_until(
                scene,
                textures,
                task.frame,
                rect,
                first..end,
                self.threads,
                canceled,
            )
            .context(CANCELED)?;
            return Ok(sums.encode());
        }
        let sums = builtin::render_tile_sums_until(
            scene,
            textures,
            task.frame,
            rect,
            0..task.total_samples,
            self.threads,
            canceled,
        )
        .context(CANCELED)?;
        let mut pixels = sums.to_srgb8();
        if std::env::var(FAILPOINT).is_ok_and(|v| v == FAILPOINT_ALTER_PIXELS) {
            let row = rect.width as usize * 3;
            pixels[..row].iter_mut().for_each(|p| *p = 255 - *p);
        }
        Ok(builtin::encode_png(rect.width, rect.height, &pixels))
    }
}

/// Renders nothing: every task yields a black tile of the right size, so
/// jobs still stitch. For measuring the farm itself: its dispatch overhead
/// (`per_task` zero), or how it recovers from failures with workers whose
/// speed does not depend on this machine's cores, as separate GPUs' would
/// not (`per_task` set: each task takes that long).
pub struct Noop {
    pub per_task: std::time::Duration,
}

impl Engine for Noop {
    fn kind(&self) -> EngineKind {
        EngineKind::Noop
    }

    fn render(
        &self,
        _job: &JobInfo,
        _job_dir: &Path,
        task: &TaskSpec,
        _progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        let canceled = ctl.flag();
        let until = std::time::Instant::now() + self.per_task;
        while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
            anyhow::ensure!(!canceled.load(Ordering::Relaxed), CANCELED);
            std::thread::sleep(left.min(std::time::Duration::from_millis(20)));
        }
        let (w, h) = (task.tile.width, task.tile.height);
        Ok(builtin::encode_png(
            w,
            h,
            &vec![0; w as usize * h as usize * 3],
        ))
    }
}
