//! Job description types shared by client, coordinator and worker: frame
//! sets, tile grids, sample ranges, engines, manifests, and the rules that
//! make a manifest path safe to lay out on a worker's disk.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Digest;

/// Which renderer a job needs. Lowercase in JSON (job specs stored before
/// that, capitalized, are read too); bincode encodes the variant's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// The embedded CPU path tracer for `*.scene.json` files.
    #[serde(alias = "Builtin")]
    Builtin,
    /// Blender, driven as `blender -b`.
    #[serde(alias = "Blender")]
    Blender,
    /// Unreal Movie Render Queue.
    #[serde(alias = "Unreal")]
    Unreal,
    /// Renders nothing: a one-byte result per task. For dispatch benchmarks.
    #[serde(alias = "Noop")]
    Noop,
    /// ffmpeg, encoding the frames of another job into a movie
    /// ([`crate::encode`]). Since version 20: sent only to workers that
    /// offer it, and to clients of version 20.
    Ffmpeg,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Builtin => "builtin",
            Engine::Blender => "blender",
            Engine::Unreal => "unreal",
            Engine::Noop => "noop",
            Engine::Ffmpeg => "ffmpeg",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "builtin" => Ok(Engine::Builtin),
            "blender" => Ok(Engine::Blender),
            "unreal" => Ok(Engine::Unreal),
            "noop" => Ok(Engine::Noop),
            "ffmpeg" => Ok(Engine::Ffmpeg),
            _ => Err(format!(
                "unknown engine `{s}` (expected builtin, blender, unreal, ffmpeg or noop)"
            )),
        }
    }
}

/// A rectangle of pixels, origin at the top-left of the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TileRect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

/// How a frame is cut into tiles: `cols` × `rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TileGrid {
    pub cols: u32,
    pub rows: u32,
}

/// Limits on a job's numbers, checked by the client before it uploads and
/// by the coordinator before it records a job ([`JobSpec::check_limits`]).
/// Within them every count below fits a `u32` and every product is done in
/// `u64`.
pub mod limits {
    /// Tiles per side of a frame.
    pub const MAX_TILES_PER_SIDE: u32 = 64;
    /// Samples per pixel (Cycles' own limit).
    pub const MAX_SAMPLES: u32 = 1 << 24;
    /// Sample ranges per tile, each a task of its own.
    pub const MAX_SAMPLE_RANGES: u32 = 1024;
    /// Frames in one job.
    pub const MAX_FRAMES: usize = 1_000_000;
    /// Width or height of a frame, in pixels.
    pub const MAX_RESOLUTION: u32 = 65536;
    /// Tasks in one job (frames × tiles × sample ranges).
    pub const MAX_TASKS: u64 = 10_000_000;
    /// A task's time limit (`--task-timeout`), in milliseconds: at least a
    /// second, at most 30 days.
    pub const MIN_TASK_TIMEOUT_MS: u64 = 1_000;
    pub const MAX_TASK_TIMEOUT_MS: u64 = 30 * 86_400_000;
    /// Percent of tasks rendered twice to check them (`--verify`).
    pub const MAX_VERIFY_PERCENT: u32 = 100;

    /// Too many frames, in the words both the CLI and the API use.
    pub fn too_many_frames(count: u64) -> String {
        format!("the job has {count} frames; the limit is {MAX_FRAMES}")
    }

    /// A tile grid's bounds, in the words both the CLI and the API use.
    pub fn check_tiles(cols: u32, rows: u32) -> Result<(), String> {
        if cols == 0 || rows == 0 || cols > MAX_TILES_PER_SIDE || rows > MAX_TILES_PER_SIDE {
            return Err(format!(
                "tile grid {cols}x{rows} is out of range: tiles per side must be between 1 and {MAX_TILES_PER_SIDE}"
            ));
        }
        Ok(())
    }
}

impl TileGrid {
    pub const WHOLE: TileGrid = TileGrid { cols: 1, rows: 1 };

    /// Tiles in the grid; saturates instead of overflowing (a grid beyond
    /// [`limits::MAX_TILES_PER_SIDE`] is refused before it is used).
    pub fn count(self) -> u32 {
        self.cols.saturating_mul(self.rows)
    }

    /// The rectangle of tile `i` (row-major) of a `width` × `height` frame.
    /// Tiles cover the frame exactly; the last column and row take the
    /// remainder. Computed in `u64`, so no grid or frame size overflows.
    pub fn rect(self, i: u32, width: u32, height: u32) -> TileRect {
        let (cols, rows) = (self.cols.max(1), self.rows.max(1));
        let (c, r) = (i % cols, i / cols);
        let at = |extent: u32, k: u32, n: u32| {
            (u64::from(extent) * u64::from(k) / u64::from(n)).min(u64::from(extent)) as u32
        };
        let (x0, x1) = (at(width, c, cols), at(width, c + 1, cols));
        let (y0, y1) = (at(height, r, rows), at(height, r.saturating_add(1), rows));
        TileRect {
            x: x0,
            y: y0,
            width: x1 - x0,
            height: y1.saturating_sub(y0),
        }
    }
}

/// Samples `[from, to)` of sample range `range` out of `ranges` for a
/// `samples`-sample render, in `u64` (no product overflows).
pub fn sample_range(samples: u32, range: u32, ranges: u32) -> (u32, u32) {
    let ranges = u64::from(ranges.max(1));
    let n = u64::from(samples);
    let at = |k: u64| (n * k.min(ranges) / ranges) as u32;
    (at(u64::from(range)), at(u64::from(range) + 1))
}

impl FromStr for TileGrid {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let err = || format!("`{s}` is not a tile grid: expected COLSxROWS, e.g. 4x4");
        let (c, r) = s.split_once(['x', 'X']).ok_or_else(err)?;
        let cols: u32 = c.trim().parse().map_err(|_| err())?;
        let rows: u32 = r.trim().parse().map_err(|_| err())?;
        limits::check_tiles(cols, rows)?;
        Ok(TileGrid { cols, rows })
    }
}

impl fmt::Display for TileGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// Parses a frame list: `1-250`, `1,5,9`, or a mix such as `1-3,7,10-12`.
/// The result is sorted and free of duplicates.
pub fn parse_frames(s: &str) -> Result<Vec<u32>, String> {
    let mut frames = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let bad = || format!("`{s}` is not a frame list: expected e.g. 1-250 or 1,5,9");
        if part.is_empty() {
            return Err(bad());
        }
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().map_err(|_| bad())?;
            let b: u32 = b.trim().parse().map_err(|_| bad())?;
            if b < a {
                return Err(format!("frame range `{part}` ends before it starts"));
            }
            // Counted before any is listed, in u64: no range allocates
            // past the limit.
            let count = frames.len() as u64 + u64::from(b - a) + 1;
            if count > limits::MAX_FRAMES as u64 {
                return Err(limits::too_many_frames(count));
            }
            frames.extend(a..=b);
        } else {
            frames.push(part.parse().map_err(|_| bad())?);
        }
        if frames.len() > limits::MAX_FRAMES {
            return Err(limits::too_many_frames(frames.len() as u64));
        }
    }
    frames.sort_unstable();
    frames.dedup();
    Ok(frames)
}

/// Image format of the stitched frames. Lowercase in JSON (capitalized,
/// as job specs stored before that have it, is read too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    #[serde(alias = "Png")]
    Png,
    #[serde(alias = "Exr")]
    Exr,
    /// Any other still format the renderer writes (JPEG, TIFF, …): whole
    /// frames only, delivered as the renderer wrote them.
    #[serde(alias = "Image")]
    Image,
}

impl OutputFormat {
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Png => "png",
            OutputFormat::Exr => "exr",
            OutputFormat::Image => "img",
        }
    }
}

/// Longest frame-name template a job may carry.
pub const MAX_OUTPUT_NAME: usize = 255;

/// The file name of `frame` from a scene's output name template, as
/// Blender names it: the last run of `#` becomes the frame number,
/// zero-padded to the run's length (`sh010_####.exr`, 7 → `sh010_0007.exr`).
/// `None` when the template is not a plain file name.
pub fn frame_file_name(template: &str, frame: u32) -> Option<String> {
    if template.is_empty()
        || template.len() > MAX_OUTPUT_NAME
        || template.contains(['/', '\\', '\0'])
        || template == "."
        || template == ".."
    {
        return None;
    }
    let end = template.rfind('#')? + 1;
    let start = template[..end].trim_end_matches('#').len();
    let digits = end - start;
    let name = format!("{}{frame:0digits$}{}", &template[..start], &template[end..]);
    (name != "." && name != "..").then_some(name)
}

/// One file of a job: where it goes in the job's folder, and its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub digest: Digest,
    pub size: u64,
    /// Where the file was on the submitting machine (absolute), for engines
    /// whose scene files name their dependencies by path (Blender).
    pub origin: Option<String>,
    /// The one frame whose tasks need this file (`submit --frame-files`: a
    /// file of a per-frame sequence, such as a simulation cache), or `None`
    /// when every task needs it. A worker fetches a frame's files only for
    /// a task of that frame.
    #[serde(default)]
    pub frame: Option<u32>,
}

impl ManifestEntry {
    /// Whether a task rendering `frames` (inclusive) needs this file.
    pub fn needed_for(&self, frames: std::ops::RangeInclusive<u32>) -> bool {
        self.frame.is_none_or(|f| frames.contains(&f))
    }
}

/// What a client submits.
/// `JobSpec::sample_ranges` asking the coordinator to choose: split tiles
/// into sample ranges when interruptible workers could lose them.
pub const SAMPLE_RANGES_AUTO: u32 = 0;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// Chosen by the client; a retried submit with the same id gets the same job.
    pub request_id: Option<String>,
    pub name: String,
    pub engine: Engine,
    /// Manifest path of the scene file.
    pub scene: String,
    pub manifest: Vec<ManifestEntry>,
    pub frames: Vec<u32>,
    pub tiles: TileGrid,
    /// Sample ranges per tile, each a task of its own;
    /// [`SAMPLE_RANGES_AUTO`] lets the coordinator choose.
    pub sample_ranges: u32,
    pub samples: u32,
    pub resolution: (u32, u32),
    pub priority: i32,
    pub output: OutputFormat,
    /// For Blender jobs: the Blender that saved the file and what the job
    /// needs of the one that renders it. `None` for other engines (and for
    /// jobs stored before this existed).
    #[serde(default)]
    pub blender: Option<crate::blender::BlenderNeeds>,
    /// The scene's own frame-name template (`sh010_####.exr`), if it has
    /// one; frames are then named by [`frame_file_name`].
    #[serde(default)]
    pub output_name: Option<String>,
    /// For Unreal jobs: the level sequence, map and Movie Render Queue
    /// config, and how the frames split into shot and chunk tasks.
    #[serde(default)]
    pub unreal: Option<Box<crate::unreal::UnrealJob>>,
    /// Each frame ends with a finishing task (Blender jobs split into
    /// tiles or sample ranges with the compositor or denoising on): the
    /// tiles render their passes only, and once a frame's passes are
    /// stitched one task composites and denoises the whole frame and writes
    /// the scene's output.
    #[serde(default)]
    pub finish: bool,
    /// `submit --verify P`: the percent of tasks (0–100) rendered again on
    /// a worker of another identity and compared (each worker's first
    /// result of the job is checked too).
    #[serde(default)]
    pub verify_percent: u32,
    /// `submit --after`: jobs (already submitted to this coordinator) that
    /// must be done before any of this job's tasks is handed out. Only
    /// existing jobs can be named, so dependencies never form a cycle.
    #[serde(default)]
    pub after: Vec<u64>,
    /// What happens to this job when a job it runs after fails or is
    /// canceled (`--after-failure`).
    #[serde(default)]
    pub after_failure: AfterFailure,
    /// `submit --paused`: held until `tessera resume`.
    #[serde(default)]
    pub paused: bool,
    /// `submit --deadline`: when the job should be done (wall clock, unix
    /// ms). The fleet rents enough nodes to meet it; the coordinator only
    /// shows it.
    #[serde(default)]
    pub deadline_unix_ms: Option<u64>,
    /// `submit --budget-usd`: the most the job may cost, and what happens
    /// when its cost reaches it.
    #[serde(default)]
    pub budget: Option<Budget>,
    /// `submit --task-timeout`: a task running longer than this is ended
    /// and fails with that reason (retried like any failure). Filled with
    /// the coordinator's `--task-timeout` default when not given.
    #[serde(default)]
    pub task_timeout_ms: Option<u64>,
    /// For Blender jobs: the format the frames are written in instead of
    /// the file's own (an OpenJD template's `--render-format`), by the
    /// task that writes the whole frame (a frame's only task, or its
    /// finishing task). `None`: the file's own. Since version 20.
    #[serde(default)]
    pub render_format: Option<crate::blender::ImageFormat>,
    /// For ffmpeg jobs: the frames of which job are encoded, and how
    /// (an OpenJD template's `ffmpeg` step). Since version 20.
    #[serde(default)]
    pub encode: Option<Box<crate::encode::EncodeSpec>>,
    /// What the machine that runs its tasks must have (an OpenJD
    /// template's `hostRequirements`). Since version 20.
    #[serde(default)]
    pub host: Option<Box<crate::host::HostNeeds>>,
    /// What the submitting client's scan warned of (a denoiser the farm
    /// may lack, a setting tiles change…), kept with the job so that its
    /// page shows them: at most [`MAX_WARNINGS`], each at most
    /// [`MAX_WARNING_BYTES`]. Since version 20.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The most jobs one job may run after (`--after`).
pub const MAX_AFTER: usize = 256;
/// The most submit warnings a job keeps, and the longest.
pub const MAX_WARNINGS: usize = 32;
pub const MAX_WARNING_BYTES: usize = 1024;

/// What a job does when a job it runs after (`--after`) fails or is
/// canceled. In JSON (the HTTP API, `--json`) lowercase like every other
/// name, `Fail` and `Hold` still read; on the wire (bincode, MessagePack)
/// as it always was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterFailure {
    /// It fails too, saying which job it waited for (the default).
    #[default]
    Fail,
    /// It stays held: `tessera resume` runs it anyway, `tessera cancel`
    /// drops it.
    Hold,
}

crate::json_lowercase!(AfterFailure {
    Fail = "fail" | "Fail",
    Hold = "hold" | "Hold",
});

impl AfterFailure {
    pub fn name(self) -> &'static str {
        match self {
            AfterFailure::Fail => "fail",
            AfterFailure::Hold => "hold",
        }
    }
}

impl FromStr for AfterFailure {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(AfterFailure::Fail),
            "hold" => Ok(AfterFailure::Hold),
            _ => Err(format!("`{s}`: expected fail or hold")),
        }
    }
}

/// Parses `--after 3,7,12` (job ids, comma-separated); sorted, without
/// duplicates, at most [`MAX_AFTER`].
pub fn parse_after(s: &str) -> Result<Vec<u64>, String> {
    let mut jobs = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let id: u64 = part
            .parse()
            .map_err(|_| format!("`{s}` is not a list of job ids: expected e.g. 3 or 3,7,12"))?;
        jobs.push(id);
    }
    jobs.sort_unstable();
    jobs.dedup();
    if jobs.len() > MAX_AFTER {
        return Err(format!(
            "--after names {} jobs; a job runs after at most {MAX_AFTER}",
            jobs.len()
        ));
    }
    Ok(jobs)
}

/// A job's budget (`submit --budget-usd X --on-budget ACTION`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub usd: f64,
    pub on_reached: OnBudget,
}

/// What happens when a job's cost reaches its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnBudget {
    /// `stop-dispatch`: no more tasks are handed out; running ones finish
    /// (their cost may pass the budget by what they take).
    StopDispatch,
    /// `cancel`: the job is canceled, its running tasks too.
    Cancel,
}

impl OnBudget {
    pub fn parse(s: &str) -> Result<OnBudget, String> {
        match s {
            "stop-dispatch" => Ok(OnBudget::StopDispatch),
            "cancel" => Ok(OnBudget::Cancel),
            _ => Err(format!(
                "--on-budget takes stop-dispatch or cancel, not {s:?}"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnBudget::StopDispatch => "stop-dispatch",
            OnBudget::Cancel => "cancel",
        }
    }
}

impl JobSpec {
    /// A job named `name` rendering `scene` with `engine`: one whole frame
    /// (frame 1, one sample, 64 x 64 PNG, priority 0), no files, and every
    /// option off. The one place that lists every field besides the client's
    /// submit: tests and benches start from it and set what they need with
    /// struct update syntax (`JobSpec { frames, ..JobSpec::new(..) }`), so a
    /// new field is one edit here.
    pub fn new(name: impl Into<String>, engine: Engine, scene: impl Into<String>) -> JobSpec {
        JobSpec {
            request_id: None,
            name: name.into(),
            engine,
            scene: scene.into(),
            manifest: Vec::new(),
            frames: vec![1],
            tiles: TileGrid::WHOLE,
            sample_ranges: 1,
            samples: 1,
            resolution: (64, 64),
            priority: 0,
            output: OutputFormat::Png,
            blender: None,
            output_name: None,
            unreal: None,
            finish: false,
            verify_percent: 0,
            after: Vec::new(),
            after_failure: AfterFailure::Fail,
            paused: false,
            deadline_unix_ms: None,
            budget: None,
            task_timeout_ms: None,
            render_format: None,
            encode: None,
            host: None,
            warnings: Vec::new(),
        }
    }

    /// Tasks per frame: every tile's sample ranges, and the finishing task.
    pub fn tasks_per_frame(&self) -> u32 {
        self.tiles.count() * self.sample_ranges + u32::from(self.finish)
    }

    /// Checks every number of the job against [`limits`] and returns its
    /// task count (never zero). Called by the client before uploading and
    /// by the coordinator before recording the job; nothing computed from a
    /// spec overflows once this passed.
    pub fn check_limits(&self) -> Result<u64, String> {
        use limits::*;
        if self.warnings.len() > MAX_WARNINGS
            || self.warnings.iter().any(|w| w.len() > MAX_WARNING_BYTES)
        {
            return Err(format!(
                "a job keeps at most {MAX_WARNINGS} warnings of at most {MAX_WARNING_BYTES} bytes"
            ));
        }
        if self.after.len() > crate::job::MAX_AFTER {
            return Err(format!(
                "the job runs after {} jobs; the limit is {}",
                self.after.len(),
                crate::job::MAX_AFTER
            ));
        }
        if let Some(b) = self.budget {
            if !b.usd.is_finite() || b.usd <= 0.0 {
                return Err("a job's budget must be a positive number of USD".into());
            }
        }
        if let Some(t) = self.task_timeout_ms {
            if !(MIN_TASK_TIMEOUT_MS..=MAX_TASK_TIMEOUT_MS).contains(&t) {
                return Err(format!(
                    "a task timeout of {t} ms is out of range (1 s to 30 days)"
                ));
            }
        }
        if self.frames.is_empty() {
            return Err("the job has no frames".into());
        }
        if self.frames.len() > MAX_FRAMES {
            return Err(too_many_frames(self.frames.len() as u64));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.frames.len());
        if let Some(twice) = self.frames.iter().find(|f| !seen.insert(**f)) {
            return Err(format!("frame {twice} is listed twice"));
        }
        let (w, h) = self.resolution;
        if w == 0 || h == 0 || w > MAX_RESOLUTION || h > MAX_RESOLUTION {
            return Err(format!(
                "resolution {w}x{h} is out of range (1 to {MAX_RESOLUTION} per side)"
            ));
        }
        let TileGrid { cols, rows } = self.tiles;
        check_tiles(cols, rows)?;
        if cols > w || rows > h {
            return Err(format!(
                "tile grid {} does not fit a {w}x{h} frame",
                self.tiles
            ));
        }
        if self.samples == 0 || self.samples > MAX_SAMPLES {
            return Err(format!(
                "{} samples is out of range: the sample count must be between 1 and {MAX_SAMPLES}",
                self.samples
            ));
        }
        if self.verify_percent > MAX_VERIFY_PERCENT {
            return Err(format!(
                "--verify {} is out of range: between 0 and {MAX_VERIFY_PERCENT} percent of the tasks",
                self.verify_percent
            ));
        }
        if self.sample_ranges > MAX_SAMPLE_RANGES {
            return Err(format!(
                "--sample-ranges {} is out of range: at most {MAX_SAMPLE_RANGES} sample ranges per tile",
                self.sample_ranges
            ));
        }
        if let Some(unreal) = &self.unreal {
            if self.engine != Engine::Unreal || (cols, rows) != (1, 1) || self.sample_ranges != 1 {
                return Err(
                    "an Unreal job renders whole frames: no --tiles or --sample-ranges".into(),
                );
            }
            unreal.check(&self.frames, self.output)?;
            return Ok(unreal.chunks(&self.frames).len() as u64);
        }
        if self.engine == Engine::Unreal {
            return Err("an Unreal job needs its level sequence, map and config".into());
        }
        let tasks = (u64::from(cols) * u64::from(rows) * u64::from(self.sample_ranges.max(1))
            + u64::from(self.finish))
            * self.frames.len() as u64;
        if tasks == 0 {
            return Err("the job would have no tasks".into());
        }
        if tasks > MAX_TASKS {
            return Err(format!(
                "the job would have {tasks} tasks; the limit is {MAX_TASKS}"
            ));
        }
        Ok(tasks)
    }
}

/// Why a manifest path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("manifest path `{0}` is absolute; paths must be relative to the job folder")]
    Absolute(String),
    #[error("manifest path `{0}` climbs out of the job folder with `..`")]
    ParentDir(String),
    #[error("manifest path {0:?} contains a NUL byte")]
    Nul(String),
    #[error("manifest path `{0}` has an empty or `.` component")]
    EmptyComponent(String),
    #[error("manifest path `{0}` contains a backslash or drive prefix")]
    Backslash(String),
}

/// Checks that `path` is a plain relative path (`a/b/c.png`) that stays inside
/// the job folder on every platform. Returns its components.
pub fn sanitize_manifest_path(path: &str) -> Result<Vec<&str>, PathError> {
    let owned = || path.to_string();
    if path.contains('\0') {
        return Err(PathError::Nul(owned()));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(owned()));
    }
    if path.contains('\\') || path.contains(':') {
        return Err(PathError::Backslash(owned()));
    }
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts {
        match *part {
            ".." => return Err(PathError::ParentDir(owned())),
            "" | "." => return Err(PathError::EmptyComponent(owned())),
            _ => {}
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_named_as_blender_names_them() {
        assert_eq!(
            frame_file_name("sh010_####.exr", 1).as_deref(),
            Some("sh010_0001.exr")
        );
        assert_eq!(
            frame_file_name("####.png", 12345).as_deref(),
            Some("12345.png")
        );
        assert_eq!(
            frame_file_name("a#b##.jpg", 7).as_deref(),
            Some("a#b07.jpg")
        );
        assert_eq!(frame_file_name("render", 7), None, "no frame number");
        for bad in ["../####.png", "a/####", "", "x\0####"] {
            assert_eq!(frame_file_name(bad, 1), None, "{bad:?}");
        }
    }

    #[test]
    fn frames() {
        assert_eq!(parse_frames("1-4").unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(parse_frames("9,1,5").unwrap(), vec![1, 5, 9]);
        assert_eq!(parse_frames("1-3,2,7").unwrap(), vec![1, 2, 3, 7]);
        assert!(parse_frames("4-1")
            .unwrap_err()
            .contains("ends before it starts"));
        assert!(parse_frames("a").is_err());
        assert!(parse_frames("1,,2").is_err());
    }

    #[test]
    fn tile_grid_covers_frame_exactly() {
        let g: TileGrid = "3x3".parse().unwrap();
        let (w, h) = (100, 61);
        let mut covered = vec![0u8; (w * h) as usize];
        for i in 0..g.count() {
            let r = g.rect(i, w, h);
            for y in r.y..r.y + r.height {
                for x in r.x..r.x + r.width {
                    covered[(y * w + x) as usize] += 1;
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
        assert!("0x2".parse::<TileGrid>().is_err());
        assert!("65x1".parse::<TileGrid>().is_err());
        assert!("4".parse::<TileGrid>().unwrap_err().contains("COLSxROWS"));
    }

    #[test]
    fn grids_and_sample_ranges_do_not_overflow() {
        // 65536x1 tiles of a 65536-pixel-wide frame: each tile one pixel
        // wide (this once gave a tile 4294901761 pixels wide).
        let g = TileGrid {
            cols: 65536,
            rows: 1,
        };
        let last = g.rect(65535, 65536, 8);
        assert_eq!((last.x, last.width, last.height), (65535, 1, 8));
        assert_eq!(
            TileGrid {
                cols: 65536,
                rows: 65536
            }
            .count(),
            u32::MAX
        );
        // 100000 samples in 100000 ranges: range 42949 is sample 42949.
        assert_eq!(sample_range(100_000, 42_949, 100_000), (42_949, 42_950));
        assert_eq!(
            sample_range(3_000_000_000, 1, 2),
            (1_500_000_000, 3_000_000_000)
        );
        assert_eq!(sample_range(10, 3, 4), (7, 10));
    }

    #[test]
    fn job_numbers_beyond_the_limits_are_refused() {
        let ok = JobSpec {
            frames: vec![1, 2],
            tiles: TileGrid { cols: 4, rows: 2 },
            sample_ranges: 2,
            samples: 64,
            resolution: (160, 90),
            ..JobSpec::new("n", Engine::Builtin, "s")
        };
        assert_eq!(ok.check_limits(), Ok(32));
        let refused = |f: &dyn Fn(&mut JobSpec)| {
            let mut spec = ok.clone();
            f(&mut spec);
            spec.check_limits().unwrap_err()
        };
        assert!(refused(&|s| s.samples = 3_000_000_000)
            .contains("sample count must be between 1 and 16777216"));
        assert!(refused(&|s| s.sample_ranges = 100_000).contains("at most 1024 sample ranges"));
        assert!(refused(&|s| {
            s.resolution = (65536, 65536);
            s.tiles = TileGrid {
                cols: 65536,
                rows: 65536,
            };
        })
        .contains("tiles per side must be between 1 and 64"));
        assert!(refused(&|s| s.frames.clear()).contains("no frames"));
        assert!(
            refused(&|s| s.frames = (0..=limits::MAX_FRAMES as u32).collect())
                .contains("frames; the limit")
        );
        assert!(refused(&|s| s.resolution = (0, 90)).contains("out of range"));
        assert_eq!(
            refused(&|s| s.frames = vec![1, 2, 1]),
            "frame 1 is listed twice"
        );
        assert_eq!(
            parse_frames("0-4294967295").unwrap_err(),
            "the job has 4294967296 frames; the limit is 1000000"
        );
        assert_eq!(
            parse_frames("1-600000,700000-1300000").unwrap_err(),
            "the job has 1200001 frames; the limit is 1000000"
        );
        assert_eq!(parse_frames("1-1000000").unwrap().len(), 1_000_000);
    }

    #[test]
    fn hostile_manifest_paths_are_refused() {
        assert_eq!(
            sanitize_manifest_path("textures/a.png").unwrap(),
            vec!["textures", "a.png"]
        );
        assert!(matches!(
            sanitize_manifest_path("../../x"),
            Err(PathError::ParentDir(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a/../../x"),
            Err(PathError::ParentDir(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("/etc/x"),
            Err(PathError::Absolute(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a\0b"),
            Err(PathError::Nul(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("a//b"),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            sanitize_manifest_path(""),
            Err(PathError::EmptyComponent(_))
        ));
        assert!(matches!(
            sanitize_manifest_path("C:\\x"),
            Err(PathError::Backslash(_))
        ));
        let msg = sanitize_manifest_path("../../x").unwrap_err().to_string();
        assert_eq!(
            msg,
            "manifest path `../../x` climbs out of the job folder with `..`"
        );
    }
}

#[cfg(test)]
mod after_failure_tests {
    use super::AfterFailure;

    #[test]
    fn after_failure_is_lowercase_in_json_and_reads_either_case() {
        assert_eq!(
            serde_json::to_string(&AfterFailure::Hold).unwrap(),
            "\"hold\""
        );
        assert_eq!(
            serde_json::to_string(&AfterFailure::Fail).unwrap(),
            "\"fail\""
        );
        for (text, want) in [
            ("\"Fail\"", AfterFailure::Fail),
            ("\"hold\"", AfterFailure::Hold),
        ] {
            assert_eq!(serde_json::from_str::<AfterFailure>(text).unwrap(), want);
        }
    }
}
