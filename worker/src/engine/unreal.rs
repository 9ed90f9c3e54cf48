//! Unreal Engine through Movie Render Queue (MRQ), run from the command
//! line: one process per chunk task, its arguments a vector (never a
//! shell), its log read line by line for progress and errors, the frames it
//! wrote collected into a [`Bundle`].
//!
//! **Nothing here has been run against a real Unreal**: the tests drive a
//! stand-in executable (`tests/unreal_standin.py`) that accepts exactly the
//! arguments below and refuses any other. What each argument is, and where
//! Epic documents it, is in [`mrq_arguments`].
//!
//! The frame range of a chunk, its warm-up and the output folder are not
//! command-line arguments of MRQ: the documented way to control a render
//! beyond the preset is a Python executor
//! (`-MoviePipelineLocalExecutorClass=…MoviePipelinePythonHostExecutor
//! -ExecutorPythonClass=…`, on the command-line rendering page). Tessera's
//! executor (`unreal/tessera_mrq_executor.py`, installed as a content-only
//! project plugin in the job's folder) reads the task from the JSON file
//! named by `TESSERA_MRQ_TASK`, overrides the config's playback range
//! (`bUseCustomPlaybackRange`, `CustomStartFrame`, `CustomEndFrame`) and
//! output directory, and prints the `TesseraMRQ:` lines this module reads.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tessera_protocol::job::Engine as EngineKind;
use tessera_protocol::messages::{JobInfo, TaskSpec};
use tessera_protocol::unreal::{asset_name, Bundle, BundleFrame};

use super::{Control, Engine, Failure, CANCELED};

/// Epic's page on command-line rendering with Movie Render Queue.
pub const DOC_MRQ_COMMAND_LINE: &str = "https://dev.epicgames.com/documentation/en-us/unreal-engine/using-command-line-rendering-with-move-render-queue-in-unreal-engine";
/// Epic's page on the engine's command-line arguments.
pub const DOC_COMMAND_LINE: &str =
    "https://dev.epicgames.com/documentation/en-us/unreal-engine/command-line-arguments-in-unreal-engine";
/// Offscreen rendering (`-RenderOffscreen`), reviewed by Epic.
pub const DOC_RENDER_OFFSCREEN: &str =
    "https://unrealcontainers.com/blog/offscreen-rendering-in-windows-containers/";
/// `-graphicsadapter=N`: Epic documents the `r.GraphicsAdapter` console
/// variable it sets (here as nDisplay's per-node "Graphics Adapter", which
/// launches each node with it); what each value means (-1 the default, N
/// adapter N) is the engine's help text for the variable.
pub const DOC_GRAPHICS_ADAPTER: &str = "https://dev.epicgames.com/documentation/unreal-engine/API/Plugins/DisplayClusterConfiguration/UDisplayClusterConfigurationClus-_1/GraphicsAdapter";
/// Where Unreal keeps its local derived data cache: this environment
/// variable (Epic's derived data cache documentation).
pub const DDC_ENV: &str = "UE-LocalDataCachePath";
/// The environment variable naming the task file Tessera's executor reads.
pub const TASK_ENV: &str = "TESSERA_MRQ_TASK";
/// The Python class of Tessera's executor, as `-ExecutorPythonClass` names it.
pub const EXECUTOR_CLASS: &str = "/Engine/PythonTypes.TesseraMoviePipelineExecutor";
/// The executor Unreal runs (never run here: see the module docs).
const EXECUTOR_PY: &str = include_str!("unreal/tessera_mrq_executor.py");
/// The plugin that makes Unreal load the executor at start.
const PLUGIN_DIR: &str = "Plugins/TesseraMRQ";
/// How long Unreal may print nothing before it counts as hung (shader
/// compiles print as they go, so they are progress, not silence).
const SILENCE: Duration = Duration::from_secs(600);
/// For tests: a shorter silence limit, in milliseconds.
pub const SILENCE_ENV: &str = "TESSERA_UNREAL_SILENCE_MS";
/// Log lines kept for `tessera logs`.
const LOG_TAIL_LINES: usize = 60;

/// One argument of the command line and the page that documents it.
pub struct Argument {
    pub value: String,
    pub doc: &'static str,
}

/// The command line for one chunk: `UnrealEditor-Cmd PROJECT MAP -game
/// -LevelSequence=… -MoviePipelineConfig=… …`, each argument with the page
/// documenting it (`editor` itself not included).
///
/// `adapter`: the GPU this process renders on (`-graphicsadapter=N`, the
/// `r.GraphicsAdapter` console variable), given when the worker has one
/// slot per GPU; without it Unreal picks its default (a discrete GPU).
pub fn mrq_arguments(
    project: &Path,
    unreal: &tessera_protocol::unreal::UnrealJob,
    resolution: (u32, u32),
    adapter: Option<usize>,
) -> Vec<Argument> {
    let arg = |value: String, doc: &'static str| Argument { value, doc };
    let mut args = vec![
        // `<EXECUTABLE> [URL_PARAMETERS] [ARGUMENTS]`: the project, then
        // the map as the URL parameter.
        arg(project.display().to_string(), DOC_COMMAND_LINE),
        arg(unreal.map.clone(), DOC_COMMAND_LINE),
        arg("-game".into(), DOC_MRQ_COMMAND_LINE),
        arg(
            format!("-LevelSequence={}", unreal.level_sequence),
            DOC_MRQ_COMMAND_LINE,
        ),
        arg(
            format!("-MoviePipelineConfig={}", unreal.config),
            DOC_MRQ_COMMAND_LINE,
        ),
        arg(
            "-MoviePipelineLocalExecutorClass=/Script/MovieRenderPipelineCore.MoviePipelinePythonHostExecutor".into(),
            DOC_MRQ_COMMAND_LINE,
        ),
        arg(
            format!("-ExecutorPythonClass={EXECUTOR_CLASS}"),
            DOC_MRQ_COMMAND_LINE,
        ),
        arg("-windowed".into(), DOC_MRQ_COMMAND_LINE),
        arg(format!("-resx={}", resolution.0), DOC_MRQ_COMMAND_LINE),
        arg(format!("-resy={}", resolution.1), DOC_MRQ_COMMAND_LINE),
        arg("-RenderOffscreen".into(), DOC_RENDER_OFFSCREEN),
        arg("-Unattended".into(), DOC_COMMAND_LINE),
        arg("-StdOut".into(), DOC_COMMAND_LINE),
        arg("-log".into(), DOC_MRQ_COMMAND_LINE),
    ];
    if let Some(n) = adapter {
        args.push(arg(format!("-graphicsadapter={n}"), DOC_GRAPHICS_ADAPTER));
    }
    args
}

/// Movie Render Queue on this worker.
pub struct Unreal {
    editor: PathBuf,
    /// Derived data caches, one folder per project, kept between jobs.
    ddc_root: PathBuf,
    /// Their total size is kept under this (from `--cache-max`).
    ddc_max: Option<u64>,
    /// One slot per GPU: which are busy. With more than one, slot i's
    /// Unreal renders on GPU i only.
    slots: std::sync::Mutex<Vec<bool>>,
    slot_freed: std::sync::Condvar,
}

/// A slot taken for one render, given back when dropped.
struct SlotGuard<'a> {
    unreal: &'a Unreal,
    index: usize,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let mut slots = self.unreal.slots.lock().expect("slots lock");
        slots[self.index] = false;
        self.unreal.slot_freed.notify_one();
    }
}

impl Unreal {
    pub fn new(editor: PathBuf, cache_dir: &Path, cache_max: Option<u64>, slots: u32) -> Unreal {
        Unreal {
            editor,
            ddc_root: cache_dir.join("unreal-ddc"),
            ddc_max: cache_max,
            slots: std::sync::Mutex::new(vec![false; slots.max(1) as usize]),
            slot_freed: std::sync::Condvar::new(),
        }
    }

    /// Takes a free slot, waiting for one (a canceled render may still be
    /// finishing in its slot).
    fn take_slot(&self) -> SlotGuard<'_> {
        let mut slots = self.slots.lock().expect("slots lock");
        loop {
            if let Some(i) = slots.iter().position(|busy| !busy) {
                slots[i] = true;
                return SlotGuard {
                    unreal: self,
                    index: i,
                };
            }
            slots = self.slot_freed.wait(slots).expect("slots lock");
        }
    }

    /// Slot `slot`'s GPU pinning: `-graphicsadapter=slot` for the renderer,
    /// and only that GPU visible to CUDA in the process (plugins such as
    /// denoisers use CUDA), numbered as nvidia-smi numbers them, the same
    /// environment Blender's slots get. Nothing with a single slot.
    fn slot_pinning(&self, slot: usize) -> (Option<usize>, Vec<(&'static str, String)>) {
        if self.slots.lock().expect("slots lock").len() < 2 {
            return (None, Vec::new());
        }
        (Some(slot), super::blender::Device::Cuda.slot_env(slot))
    }

    /// The project's derived data cache: kept between its jobs. Its folder
    /// is named after the `.uproject`, so a new version of the project
    /// reuses what Unreal derived from the old one.
    fn ddc_for(&self, project: &Path) -> PathBuf {
        let stem = project
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("project");
        let safe: String = (stem.chars())
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.ddc_root.join(safe)
    }

    /// Removes the least recently used projects' caches (never `keep`)
    /// until they fit under the cap.
    fn trim_ddcs(&self, keep: &Path) {
        let Some(max) = self.ddc_max else { return };
        let Ok(entries) = std::fs::read_dir(&self.ddc_root) else {
            return;
        };
        let mut dirs: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .map(|e| {
                let p = e.path();
                let used =
                    (e.metadata().and_then(|m| m.modified())).unwrap_or(std::time::UNIX_EPOCH);
                (used, dir_size(&p), p)
            })
            .collect();
        let mut total: u64 = dirs.iter().map(|d| d.1).sum();
        dirs.sort();
        for (_, size, dir) in dirs {
            if total <= max {
                break;
            }
            if dir != keep && std::fs::remove_dir_all(&dir).is_ok() {
                tracing::info!(dir = %dir.display(), size, "evicted an Unreal derived data cache");
                total -= size;
            }
        }
    }
}

fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    (entries.filter_map(|e| e.ok()))
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// What the log said, line by line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LogState {
    /// Shaders still compiling, from the last shader-compile line.
    pub shaders_left: Option<u64>,
    /// Frames MRQ reported written: (frame, path).
    pub written: Vec<(u32, String)>,
    /// Frames done of the range, from the executor's progress lines.
    pub progress: Option<(u32, u32)>,
    /// The executor said the render finished, and whether it succeeded.
    pub finished: Option<bool>,
    /// The first error line that says why the render cannot go on.
    pub error: Option<UnrealError>,
}

/// The errors users hit, each made readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnrealError {
    /// The GPU was lost (D3D device removed/hung, Vulkan device lost):
    /// another worker's GPU may be fine.
    DeviceLost(String),
    /// The project needs a plugin this Unreal lacks.
    MissingPlugin(String),
    /// The map could not be loaded.
    MapLoad(String),
    /// An asset MRQ needs could not be loaded (sequence, config).
    Other(String),
}

impl UnrealError {
    fn message(&self, map: &str) -> String {
        match self {
            UnrealError::DeviceLost(line) => format!(
                "the GPU was lost during the render (device lost: {line}); the task is retried on another worker"
            ),
            UnrealError::MissingPlugin(name) => format!(
                "the project needs the plugin `{name}`, which this worker's Unreal does not have: add it to the project's Plugins/ folder or install it in the engine"
            ),
            UnrealError::MapLoad(line) => format!(
                "Unreal could not load the map `{map}` ({line}): check --map names a .umap in Content/ that this engine version can open"
            ),
            UnrealError::Other(line) => format!("Movie Render Queue failed: {line}"),
        }
    }
}

/// Reads one log line into `state`. The patterns are the engine's own
/// messages for each case (and Tessera's executor's `TesseraMRQ:` lines).
pub fn read_line(state: &mut LogState, line: &str) {
    let line = line.trim_end();
    if let Some(rest) = line.split_once("TesseraMRQ: ").map(|(_, r)| r) {
        let mut words = rest.split_whitespace();
        match words.next() {
            Some("progress") => {
                let parse = |w: Option<&str>| w.and_then(|w| w.parse::<u32>().ok());
                if let Some((d, t)) = words.next().and_then(|w| w.split_once('/')) {
                    if let (Some(d), Some(t)) = (parse(Some(d)), parse(Some(t))) {
                        state.progress = Some((d.min(t), t));
                    }
                }
            }
            Some("wrote") => {
                if let (Some(frame), Some(path)) =
                    (words.next().and_then(|w| w.parse().ok()), words.next())
                {
                    state.written.push((frame, path.to_string()));
                }
            }
            Some("finished") => state.finished = Some(words.next() == Some("success=True")),
            Some("error") => {
                let msg = rest.trim_start_matches("error").trim().to_string();
                state.error.get_or_insert(UnrealError::Other(msg));
            }
            _ => {}
        }
        return;
    }
    let lower = line.to_ascii_lowercase();
    if let Some(n) = line
        .split_once("Shaders left to compile ")
        .and_then(|(_, n)| n.split_whitespace().next()?.parse::<u64>().ok())
    {
        state.shaders_left = Some(n);
    }
    let device_lost = [
        "dxgi_error_device_removed",
        "dxgi_error_device_hung",
        "vk_error_device_lost",
        "gpu crashed or d3d device removed",
    ];
    if device_lost.iter().any(|p| lower.contains(p)) {
        let what = line.split_once("Error: ").map_or(line, |(_, r)| r);
        state.error = Some(UnrealError::DeviceLost(what.trim().to_string()));
        return;
    }
    if let Some(rest) = line.split_once("Unable to find plugin '") {
        let name = rest.1.split('\'').next().unwrap_or("").to_string();
        state.error.get_or_insert(UnrealError::MissingPlugin(name));
        return;
    }
    if lower.contains("failed to load map")
        || lower.contains("failed to load package") && lower.contains("map")
    {
        let what = line.split_once("Error: ").map_or(line, |(_, r)| r);
        state
            .error
            .get_or_insert(UnrealError::MapLoad(what.trim().to_string()));
    }
}

/// A shader compile as task progress shows it.
pub fn shader_stage(left: u64) -> String {
    format!("compiling shaders: {left} left")
}

impl Engine for Unreal {
    fn kind(&self) -> EngineKind {
        EngineKind::Unreal
    }

    // Long because: one Unreal run in order (check the chunk, write the
    // task file, take a slot and its GPU, start the editor in its own
    // process group, watch its output for progress and silence, collect
    // the frames); the child and its readers live across all of it.
    fn render(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        let unreal = job
            .unreal
            .as_ref()
            .context("an Unreal job without its sequence")?;
        let chunk = task
            .unreal
            .context("an Unreal task without its frame chunk")?;
        let range = chunk.range;
        anyhow::ensure!(
            range.from <= range.keep_from && range.keep_from <= range.to,
            "frame chunk {}..{} (kept from {}) is not a range",
            range.from,
            range.to,
            range.keep_from
        );
        let project = job_dir.join(&job.scene);
        anyhow::ensure!(project.is_file(), "the project `{}` is missing", job.scene);
        install_executor(job_dir)?;
        let out = job_dir.join(format!(
            "Saved/Tessera/{}-{}-{}",
            task.task.job, task.task.index, task.task.epoch
        ));
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)?;
        let task_file = out.join("task.json");
        let spec = serde_json::json!({
            "level_sequence": unreal.level_sequence,
            "map": unreal.map,
            "config": unreal.config,
            "start_frame": range.from,
            "end_frame": range.to,
            "output_directory": out.join("frames"),
        });
        std::fs::write(&task_file, serde_json::to_vec_pretty(&spec)?)?;
        let ddc = self.ddc_for(&project);
        std::fs::create_dir_all(&ddc)?;
        // Used now: its folder's time orders the caches for eviction.
        let _ =
            std::fs::File::open(&ddc).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        let slot = self.take_slot();
        let (adapter, pin) = self.slot_pinning(slot.index);
        let args = mrq_arguments(&project, unreal, job.resolution, adapter);
        let mut cmd = Command::new(&self.editor);
        cmd.args(args.iter().map(|a| &a.value))
            .envs(pin)
            .current_dir(job_dir)
            .env(TASK_ENV, &task_file)
            .env(DDC_ENV, &ddc)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut owned = crate::child::spawn(cmd)
            .with_context(|| format!("cannot start Unreal ({})", self.editor.display()))?;
        // A cancel kills Unreal's whole process group at once (its shader
        // compile workers with it); this loop watches its silence itself.
        ctl.running_in(owned.group(), None);
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let readers: Vec<_> = [
            owned
                .child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            owned
                .child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        .map(|r| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
        drop(tx);
        let silence = std::env::var(SILENCE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SILENCE, Duration::from_millis);
        let frames_total = range.to - range.from + 1;
        let mut state = LogState::default();
        let mut tail: std::collections::VecDeque<String> = Default::default();
        let mut heard = Instant::now();
        let mut stopped: Option<String> = None;
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    heard = Instant::now();
                    let shaders_before = state.shaders_left;
                    read_line(&mut state, &line);
                    if let Some((done, _)) = state.progress {
                        progress(done, frames_total, None);
                    } else if let Some(n) = state
                        .shaders_left
                        .filter(|_| state.shaders_left != shaders_before)
                    {
                        // A compile before the first frame: progress, shown.
                        progress(0, frames_total, Some(&shader_stage(n)));
                    }
                    if tail.len() == LOG_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if ctl.is_canceled() {
                stopped = Some(CANCELED.into());
            } else if heard.elapsed() > silence {
                stopped = Some(format!(
                    "Unreal printed nothing for {} and was stopped as hung",
                    seconds(silence)
                ));
            }
            if stopped.is_some() {
                owned.kill();
                break;
            }
        }
        ctl.done_running();
        let status = owned.wait()?;
        for r in readers {
            let _ = r.join();
        }
        while let Ok(line) = rx.try_recv() {
            read_line(&mut state, &line);
        }
        self.trim_ddcs(&ddc);
        let log: String = tail.into_iter().collect::<Vec<_>>().join("\n");
        let fail = |message: String| Failure {
            message,
            log: log.clone(),
            unsupported: false,
        };
        if let Some(why) = stopped {
            if why == CANCELED {
                anyhow::bail!(CANCELED);
            }
            return Err(fail(why).into());
        }
        if let Some(e) = &state.error {
            let mut failure = fail(e.message(&unreal.map));
            // A plugin this engine lacks, or a GPU that was lost: give this
            // worker no more of the job, so the task is retried on another.
            failure.unsupported = matches!(
                e,
                UnrealError::MissingPlugin(_) | UnrealError::DeviceLost(_)
            );
            return Err(failure.into());
        }
        if !status.success() || state.finished != Some(true) {
            let message = match state.shaders_left {
                Some(n) if n > 0 && state.written.is_empty() => format!(
                    "Unreal stopped ({status}) while it was still compiling shaders ({n} left): shader compiles are slow on a cold derived data cache; the task is retried"
                ),
                _ => format!(
                    "Unreal exited ({status}) before Movie Render Queue finished the frames {}..{}",
                    range.from, range.to
                ),
            };
            return Err(fail(message).into());
        }
        collect(&state, &out.join("frames"), job, unreal, chunk, &fail)
    }
}

/// `d` as the hang message says it: whole seconds as `600 s`, a limit
/// under a second or with a fraction as `0.6 s` (never `0 s`).
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// The kept frames MRQ wrote, each under the name the config gives it:
/// evidence that the frames asked for are the frames delivered.
fn collect(
    state: &LogState,
    dir: &Path,
    job: &JobInfo,
    unreal: &tessera_protocol::unreal::UnrealJob,
    chunk: tessera_protocol::unreal::UnrealTask,
    fail: &dyn Fn(String) -> Failure,
) -> anyhow::Result<Vec<u8>> {
    let range = chunk.range;
    let mut frames = Vec::new();
    for frame in range.keep_from..=range.to {
        let name = unreal.file_name_in_shot(chunk.shot as usize, frame, job.output);
        let reported = state.written.iter().any(|(f, p)| {
            *f == frame && Path::new(p).file_name().and_then(|n| n.to_str()) == Some(&name)
        });
        let path = dir.join(&name);
        if !reported || !path.is_file() {
            let wrote: Vec<String> = (std::fs::read_dir(dir).into_iter().flatten())
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .take(5)
                .collect();
            return Err(fail(format!(
                "Movie Render Queue did not write `{name}` for frame {frame} of `{}` (it wrote {}): check that the job's --mrq-format, --mrq-file-name-format and --mrq-zero-pad match the config `{}`",
                asset_name(&unreal.level_sequence),
                if wrote.is_empty() { "nothing".into() } else { wrote.join(", ") },
                unreal.config
            ))
            .into());
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        frames.push(BundleFrame { frame, name, bytes });
    }
    Ok(Bundle { frames }.encode())
}

/// Installs Tessera's executor in the job's folder as a content-only
/// plugin, whose `Content/Python/init_unreal.py` Unreal runs at start.
fn install_executor(job_dir: &Path) -> anyhow::Result<()> {
    let dir = job_dir.join(PLUGIN_DIR);
    let py = dir.join("Content/Python");
    std::fs::create_dir_all(&py)?;
    let uplugin = serde_json::json!({
        "FileVersion": 3,
        "FriendlyName": "Tessera Movie Render Queue executor",
        "CanContainContent": true,
        "EnabledByDefault": true,
        "Plugins": [
            {"Name": "MovieRenderPipeline", "Enabled": true},
            {"Name": "PythonScriptPlugin", "Enabled": true}
        ]
    });
    // Written aside and renamed: another slot's Unreal may be reading them.
    let put = |path: PathBuf, bytes: &[u8]| -> std::io::Result<()> {
        if std::fs::read(&path).is_ok_and(|b| b == bytes) {
            return Ok(());
        }
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)
    };
    put(
        dir.join("TesseraMRQ.uplugin"),
        &serde_json::to_vec_pretty(&uplugin)?,
    )?;
    put(py.join("init_unreal.py"), EXECUTOR_PY.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &[&str]) -> LogState {
        let mut s = LogState::default();
        for l in lines {
            read_line(&mut s, l);
        }
        s
    }

    #[test]
    fn a_hang_limit_is_said_in_seconds_never_as_zero() {
        assert_eq!(seconds(Duration::from_secs(600)), "600 s");
        assert_eq!(seconds(Duration::from_millis(600)), "0.6 s");
        assert_eq!(seconds(Duration::from_millis(2500)), "2.5 s");
    }

    #[test]
    fn derived_data_caches_are_kept_per_project_under_the_cap_least_recently_used_first() {
        let root = std::env::temp_dir().join(format!("tessera-ddc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let engine = Unreal::new("UnrealEditor-Cmd".into(), &root, Some(250_000), 1);
        let ddc = |name: &str, bytes: usize| {
            let dir = engine.ddc_for(Path::new(&format!("/p/{name}.uproject")));
            std::fs::create_dir_all(dir.join("sub")).unwrap();
            std::fs::write(dir.join("sub/a.ddp"), vec![0u8; bytes]).unwrap();
            // Modification times a second apart: oldest first.
            std::thread::sleep(Duration::from_millis(1100));
            dir
        };
        let old = ddc("Old Film", 100_000);
        let mid = ddc("Mid", 100_000);
        let now = ddc("Now", 100_000);
        assert!(old.ends_with("unreal-ddc/Old_Film"));
        engine.trim_ddcs(&now);
        assert!(!old.exists(), "the least recently used cache stays");
        assert!(mid.exists() && now.exists());
        assert_eq!(dir_size(&root.join("unreal-ddc")), 200_000);
        // The one in use is never removed, even alone above the cap.
        let big = Unreal::new("x".into(), &root, Some(1), 1);
        big.trim_ddcs(&now);
        assert!(now.exists() && !mid.exists());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn each_busy_slot_has_its_own_gpu_and_one_slot_pins_none() {
        let root = std::env::temp_dir();
        let one = Unreal::new("x".into(), &root, None, 1);
        assert_eq!(one.slot_pinning(one.take_slot().index), (None, vec![]));
        let two = Unreal::new("x".into(), &root, None, 2);
        let a = two.take_slot();
        let b = two.take_slot();
        assert_eq!((a.index, b.index), (0, 1));
        let (adapter, env) = two.slot_pinning(b.index);
        assert_eq!(adapter, Some(1));
        assert!(env.contains(&("CUDA_VISIBLE_DEVICES", "1".to_string())));
        // A third render waits for a slot; the one given back is reused.
        std::thread::scope(|s| {
            let third = s.spawn(|| two.take_slot().index);
            std::thread::sleep(Duration::from_millis(50));
            assert!(!third.is_finished(), "a third render got a slot of two");
            drop(a);
            assert_eq!(third.join().unwrap(), 0);
        });
        drop(b);
    }

    #[test]
    fn log_lines_become_progress_frames_and_readable_errors() {
        let s = read(&[
            "LogShaderCompilers: Display: Shaders left to compile 1200",
            "LogShaderCompilers: Display: Shaders left to compile 300",
            "LogPython: TesseraMRQ: progress 2/5",
            "LogPython: TesseraMRQ: wrote 4 /x/Main.0004.png",
            "LogPython: TesseraMRQ: finished success=True",
        ]);
        assert_eq!(s.shaders_left, Some(300));
        assert_eq!(s.progress, Some((2, 5)));
        assert_eq!(s.written, vec![(4, "/x/Main.0004.png".to_string())]);
        assert_eq!(s.finished, Some(true));
        assert_eq!(s.error, None);
        let lost = read(&[
            "LogVulkanRHI: Error: VulkanRHI::vkQueueSubmit failed with VK_ERROR_DEVICE_LOST",
        ]);
        assert!(matches!(lost.error, Some(UnrealError::DeviceLost(_))));
        let d3d = read(&["LogD3D12RHI: Error: GPU crashed or D3D Device Removed."]);
        assert!(matches!(d3d.error, Some(UnrealError::DeviceLost(_))));
        let plugin = read(&["LogPluginManager: Error: Unable to find plugin 'ShotFX' (referenced via Film.uproject). Install it and try again, or remove it from the required plugin list."]);
        assert_eq!(
            plugin.error,
            Some(UnrealError::MissingPlugin("ShotFX".into()))
        );
        assert!(plugin
            .error
            .unwrap()
            .message("/Game/M")
            .contains("plugin `ShotFX`"));
        let map = read(&["LogMovieRenderPipeline: Error: Failed to load map /Game/Maps/Main"]);
        assert!(map
            .error
            .unwrap()
            .message("/Game/Maps/Main")
            .contains("could not load the map `/Game/Maps/Main`"));
    }
}
