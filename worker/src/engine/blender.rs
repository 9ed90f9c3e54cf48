//! The Blender engine: drives the real `blender -b` installed on the worker.
//!
//! Each slot keeps one Blender process with the job's scene loaded (a
//! *session*: `session.py` reading one JSON command per line on stdin), so
//! successive tiles of a job skip Blender's start-up and scene load. A session
//! that dies is replaced by a fresh process for the task at hand. Blender
//! always runs with `--factory-startup --disable-autoexec`: a submitted file's
//! Python never runs. Arguments are an argument vector, never a shell line.
//!
//! A worker may offer several Blenders (executables and `bpy` modules, see
//! [`super::blender_runtime`]); each job renders in the one that fits it
//! (the version that saved the file, the features it needs), and a file
//! saved by a newer Blender is never opened by an older one.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tessera_protocol::job::{Engine as EngineKind, OutputFormat};
use tessera_protocol::messages::{JobInfo, TaskSpec};

use super::blender_runtime::{file_version, Installed};
use super::{clock_ms, Control, Engine, Heard, CANCELED};
use crate::child::{self, Owned};
use tessera_protocol::blender::{BlenderNeeds, BlenderOffer, VersionReq};

/// The session script, passed with `--python-expr`.
pub const SESSION_PY: &str = include_str!("blender/session.py");
pub use tessera_scan::blender::{detect, SAFE_ARGS, SCAN_PY};
const REPLY: &str = "@@TESSERA@@ ";
/// Lines of Blender's output kept per session (for errors and `tessera logs`).
const LOG_LINES: usize = 400;

/// Cycles compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda,
    Optix,
    Hip,
    Oneapi,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_uppercase().as_str() {
            "CPU" => Ok(Device::Cpu),
            "CUDA" => Ok(Device::Cuda),
            "OPTIX" => Ok(Device::Optix),
            "HIP" => Ok(Device::Hip),
            "ONEAPI" => Ok(Device::Oneapi),
            _ => Err(format!(
                "unknown Blender device `{s}` (expected auto, CPU, CUDA, OPTIX, HIP or ONEAPI)"
            )),
        }
    }
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Cuda => "CUDA",
            Device::Optix => "OPTIX",
            Device::Hip => "HIP",
            Device::Oneapi => "ONEAPI",
        }
    }

    /// The environment that pins a process to GPU `index` (none for CPU).
    pub fn pin_env(self, index: usize) -> Option<(&'static str, String)> {
        match self {
            Device::Cpu => None,
            Device::Cuda | Device::Optix => Some(("CUDA_VISIBLE_DEVICES", index.to_string())),
            Device::Hip => Some(("HIP_VISIBLE_DEVICES", index.to_string())),
            Device::Oneapi => Some(("ONEAPI_DEVICE_SELECTOR", format!("level_zero:{index}"))),
        }
    }

    /// The environment of slot `slot`'s Blender processes, its probe at
    /// join and its sessions alike, so that what was probed is what renders:
    /// only GPU `slot` visible, GPUs numbered as nvidia-smi and NVML number
    /// them. Empty on the CPU.
    pub fn slot_env(self, slot: usize) -> Vec<(&'static str, String)> {
        match self.pin_env(slot) {
            None => Vec::new(),
            Some(pin) => vec![("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()), pin],
        }
    }

    /// One probe environment per GPU the worker renders on (`slots` of
    /// them, slot i on GPU i); a single unpinned probe on the CPU, where
    /// every slot shares the same processor.
    pub fn probe_envs(self, slots: u32) -> Vec<Vec<(&'static str, String)>> {
        match self {
            Device::Cpu => vec![Vec::new()],
            gpu => (0..slots.max(1) as usize)
                .map(|s| gpu.slot_env(s))
                .collect(),
        }
    }
}

/// What `session.py` is told when it starts.
#[derive(Serialize)]
struct SessionConfig<'a> {
    job_dir: &'a Path,
    artist_blend: Option<&'a str>,
    /// Path on the artist's machine → path in the job folder.
    files: std::collections::BTreeMap<&'a str, &'a str>,
    device: &'static str,
    gpu_index: Option<usize>,
}

#[derive(Serialize)]
struct RenderCommand<'a> {
    op: &'static str,
    frame: u32,
    tile: [u32; 4],
    samples: [u32; 2],
    /// The full render's sample count, of which `samples` is a range.
    total: u32,
    out: &'a Path,
    raw: bool,
    /// A tile or sample range of an OpenEXR frame: travel as an
    /// uncompressed OpenEXR of every layer and pass (not 4-channel float).
    layers: bool,
    /// A task of a frame with a finishing task: the render layers only (no
    /// compositor, no denoising), with the denoising data.
    passes: bool,
}

/// A finishing task: the compositor and denoising on a frame's stitched
/// passes, written in the scene's own output format.
#[derive(Serialize)]
struct FinishCommand<'a> {
    op: &'static str,
    frame: u32,
    passes: &'a Path,
    out: &'a Path,
}

#[derive(Deserialize)]
struct Reply {
    ok: bool,
    error: Option<String>,
    /// The failure would repeat on this worker (a feature its Blender lacks).
    #[serde(default)]
    unsupported: bool,
    #[serde(flatten)]
    rendered: Option<Rendered>,
}

/// A successful render reply: what was asked, and what Blender's output
/// file says it holds.
#[derive(Debug, Deserialize)]
struct Rendered {
    width: u32,
    height: u32,
    samples: u32,
    /// Blender 4.5+ rendered the task's samples as a subset of the full
    /// render's sampling pattern; Cycles then stamps the full count.
    #[serde(default)]
    subset: bool,
    engine: String,
    /// `[x, y, w, h]`: the output is the whole frame; cut this tile out.
    crop: Option<[u32; 4]>,
    evidence: Evidence,
    /// The passes (`ViewLayer.Depth`) the scene's view layers ask for, where
    /// the session knows them (Cycles to multilayer OpenEXR).
    #[serde(default)]
    asked_passes: Option<Vec<String>>,
    /// A finishing task's output: composited, not rendered (Cycles stamps
    /// no samples into it).
    #[serde(default)]
    finished: bool,
}

/// Read back from the written image: its size and channels, and the stamp
/// Blender writes into every file (frame, Cycles' samples per view layer).
#[derive(Debug, Deserialize)]
struct Evidence {
    width: u32,
    height: u32,
    channels: u32,
    frame: Option<i64>,
    #[serde(default)]
    samples: std::collections::BTreeMap<String, u32>,
    /// False for formats without Blender's stamp (TIFF, …): frame and
    /// samples then come from the session, not the file.
    #[serde(default)]
    stamped: bool,
    /// The passes an OpenEXR holds (`ViewLayer.Depth`); none for other formats.
    #[serde(default)]
    passes: Option<Vec<String>>,
}

/// Why a session could not render a task.
enum SessionError {
    /// The process died or stopped answering: start a new one.
    Died(String),
    /// Blender answered with an error: the task failed, and the session is
    /// not used again (Blender 3.4 renders empty images after some errors).
    Failed(String),
    /// The scene needs a feature this worker's Blender lacks: every task of
    /// the job would fail the same way here.
    Unsupported(String),
    /// The task was canceled: its session was killed (never used again,
    /// and the task never rendered again).
    Canceled,
}

/// The last lines Blender printed, for error reports.
type Log = Arc<Mutex<VecDeque<String>>>;

fn remember(log: &Log, line: &str) {
    let mut log = log.lock().expect("log lock");
    if log.len() == LOG_LINES {
        log.pop_front();
    }
    log.push_back(line.to_string());
}

fn excerpt(log: &Log) -> String {
    let log = log.lock().expect("log lock");
    let tail: Vec<&str> = log.iter().rev().take(3).map(String::as_str).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Everything kept of a session's output, one line each.
fn full_log(log: &Log) -> String {
    let log = log.lock().expect("log lock");
    let mut text = String::new();
    for line in log.iter() {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// A failed render of `session`'s, ending the session (it is never used
/// again): the error line, and its log for `tessera logs`.
fn failure(session: Session, message: String, unsupported: bool) -> anyhow::Error {
    let log = session.log.clone();
    session.quit();
    super::Failure {
        message,
        log: full_log(&log),
        unsupported,
    }
    .into()
}

/// One Blender process with a job's scene loaded.
struct Session {
    job: u64,
    /// Which of the engine's Blenders runs it.
    install: usize,
    child: Owned,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: Log,
    /// When Blender last printed a line, on stdout or stderr.
    heard: Heard,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Session {
    fn start(
        blender: &Blender,
        install: usize,
        slot: usize,
        job: &JobInfo,
        job_dir: &Path,
    ) -> anyhow::Result<Session> {
        let runtime = &blender.runtime(install);
        let files = job
            .manifest
            .iter()
            .filter_map(|m| m.origin.as_deref().map(|o| (o, m.path.as_str())))
            .collect();
        let artist_blend = job
            .manifest
            .iter()
            .find(|m| m.path == job.scene)
            .and_then(|m| m.origin.as_deref());
        let config = SessionConfig {
            job_dir,
            artist_blend,
            files,
            device: blender.device.name(),
            gpu_index: (blender.device != Device::Cpu).then_some(0),
        };
        let config_path = job_dir.with_extension(format!("session-{slot}.json"));
        std::fs::write(&config_path, serde_json::to_vec(&config)?)?;
        let blend = job_dir.join(&job.scene);
        let mut cmd = runtime.command(Some(&blend), SESSION_PY, &[&config_path], blender.threads);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.envs(blender.device.slot_env(slot));
        let mut child = child::spawn(cmd)
            .with_context(|| format!("cannot start {}", runtime.path().display()))?;
        let log: Log = Arc::default();
        let heard: Heard = Arc::new(clock_ms().into());
        let stderr = child.child.stderr.take().expect("piped");
        let (err_log, err_heard) = (log.clone(), heard.clone());
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                err_heard.store(clock_ms(), Ordering::Relaxed);
                remember(&err_log, &line);
            }
        });
        tracing::info!(
            job = job.job,
            slot,
            pid = child.group(),
            "blender session started"
        );
        Ok(Session {
            job: job.job,
            install,
            stdin: child.child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.child.stdout.take().expect("piped")),
            child,
            log,
            heard,
            stderr_reader: Some(stderr_reader),
        })
    }

    /// Sends `command` and reads Blender's answer, with the session's
    /// process group named in `ctl` meanwhile: a cancel kills it, and the
    /// session then answers [`SessionError::Canceled`].
    fn render(
        &mut self,
        command: &impl Serialize,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> Result<Rendered, SessionError> {
        if !ctl.running_in(self.child.group(), Some(self.heard.clone())) {
            return Err(SessionError::Canceled);
        }
        self.heard.store(clock_ms(), Ordering::Relaxed);
        let result = self.exchange(command, progress);
        ctl.done_running();
        match result {
            Err(SessionError::Died(_)) if ctl.is_canceled() => Err(SessionError::Canceled),
            result => result,
        }
    }

    fn exchange(
        &mut self,
        command: &impl Serialize,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
    ) -> Result<Rendered, SessionError> {
        let died = |s: &mut Session, what: &str| {
            let status = s
                .wait_exit()
                .map_or("still running".into(), |st| st.to_string());
            SessionError::Died(format!(
                "blender {what} ({status}); last output: {}",
                excerpt(&s.log)
            ))
        };
        let line = serde_json::to_string(command).expect("commands serialise");
        if writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .is_err()
        {
            // A closed pipe is the same crash as an exit mid-render: one wording,
            // so that a job failing the same way says its error once.
            return Err(died(self, "exited while rendering"));
        }
        let mut buf = String::new();
        loop {
            buf.clear();
            match self.stdout.read_line(&mut buf) {
                Ok(0) | Err(_) => return Err(died(self, "exited while rendering")),
                Ok(_) => self.heard.store(clock_ms(), Ordering::Relaxed),
            }
            let text = buf.trim_end();
            if let Some(json) = text.strip_prefix(REPLY) {
                let reply: Reply = serde_json::from_str(json).map_err(|e| {
                    SessionError::Failed(format!("unreadable reply from blender: {e}"))
                })?;
                let error = reply.error.unwrap_or_default();
                return match (reply.ok, reply.rendered) {
                    (true, Some(rendered)) => Ok(rendered),
                    (true, None) => Err(SessionError::Failed(
                        "blender's reply lacks what it rendered".into(),
                    )),
                    (false, _) if reply.unsupported => Err(SessionError::Unsupported(format!(
                        "this worker cannot render the scene: {error}"
                    ))),
                    (false, _) => Err(SessionError::Failed(format!(
                        "blender could not render: {error}"
                    ))),
                };
            }
            remember(&self.log, text);
            if let Some((done, total)) = parse_progress(text) {
                progress(done, total, None);
            }
        }
    }

    /// Waits up to 5 s for the process to exit (killing it after that), and
    /// for its last stderr lines to be read.
    fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                _ => {
                    self.child.kill();
                    break self.child.wait().ok();
                }
            }
        };
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
        status
    }

    fn quit(mut self) {
        let _ = writeln!(self.stdin, "{{\"op\":\"quit\"}}");
        let _ = self.stdin.flush();
        self.wait_exit();
    }
}

/// `... | Sample 12/64` → (12, 64).
pub fn parse_progress(line: &str) -> Option<(u32, u32)> {
    let rest = &line[line.rfind("Sample ")? + 7..];
    let (done, total) = rest.split_once('/')?;
    let total: String = total.chars().take_while(char::is_ascii_digit).collect();
    Some((done.trim().parse().ok()?, total.parse().ok()?))
}

struct Slot {
    busy: bool,
    session: Option<Session>,
    /// Since when the slot has had no task.
    idle_since: Instant,
}

pub struct Blender {
    /// The Blenders this worker renders with, each probed: first the
    /// `local` ones it offers, then the stored builds it fetched
    /// (`--blender auto`), which only ever grow.
    installs: Mutex<Vec<Installed>>,
    local: usize,
    /// The build each job renders with (an index into `installs`), for jobs
    /// that no local Blender fits.
    job_builds: Mutex<std::collections::HashMap<u64, usize>>,
    /// Which of `installs` is each build's (by manifest digest).
    builds: Mutex<std::collections::HashMap<tessera_protocol::Digest, usize>>,
    device: Device,
    /// Keep a session per slot between tasks (false: one process per task).
    persistent: bool,
    /// Render threads per session (`blender -t`).
    threads: usize,
    slots: Mutex<Vec<Slot>>,
    slot_freed: std::sync::Condvar,
}

impl Blender {
    pub fn new(
        installs: Vec<Installed>,
        device: Device,
        slots: u32,
        persistent: bool,
        threads: usize,
    ) -> Blender {
        let slots = (0..slots.max(1))
            .map(|_| Slot {
                busy: false,
                session: None,
                idle_since: Instant::now(),
            })
            .collect();
        Blender {
            local: installs.len(),
            installs: Mutex::new(installs),
            job_builds: Mutex::default(),
            builds: Mutex::default(),
            device,
            persistent,
            threads: threads.max(1),
            slots: Mutex::new(slots),
            slot_freed: std::sync::Condvar::new(),
        }
    }

    /// Takes a free slot, waiting for one: a render whose lease was
    /// canceled may still be finishing in its slot.
    fn checkout(&self) -> anyhow::Result<(usize, Option<Session>)> {
        let mut slots = self.slots.lock().expect("slots lock");
        loop {
            if let Some(i) = slots.iter().position(|s| !s.busy) {
                slots[i].busy = true;
                return Ok((i, slots[i].session.take()));
            }
            slots = self.slot_freed.wait(slots).expect("slots lock");
        }
    }

    fn runtime(&self, install: usize) -> super::blender_runtime::Runtime {
        self.installs.lock().expect("installs lock")[install]
            .runtime
            .clone()
    }

    /// Whether one of this worker's own Blenders fits `job`.
    pub fn fits_locally(&self, job: &JobInfo, job_dir: &Path) -> bool {
        self.local_for(job, job_dir).is_ok()
    }

    /// Renders `job` with the stored build `digest`, unpacked in the
    /// folder `probe` runs it from: probed the first time (`probe` gives
    /// the build's [`Installed`]), then kept.
    pub fn use_build(
        &self,
        job: u64,
        digest: tessera_protocol::Digest,
        probe: impl FnOnce() -> anyhow::Result<Installed>,
    ) -> anyhow::Result<()> {
        let known = self
            .builds
            .lock()
            .expect("builds lock")
            .get(&digest)
            .copied();
        let index = match known {
            Some(i) => i,
            None => {
                let installed = probe()?;
                let mut installs = self.installs.lock().expect("installs lock");
                installs.push(installed);
                let i = installs.len() - 1;
                self.builds.lock().expect("builds lock").insert(digest, i);
                i
            }
        };
        self.job_builds
            .lock()
            .expect("job builds lock")
            .insert(job, index);
        Ok(())
    }

    /// Ends the sessions of slots that have had no task for `idle`.
    fn end_idle(&self, idle: Duration) {
        let ended: Vec<Session> = {
            let mut slots = self.slots.lock().expect("slots lock");
            (slots.iter_mut())
                .filter(|s| !s.busy && s.idle_since.elapsed() >= idle)
                .filter_map(|s| s.session.take())
                .collect()
        };
        for session in ended {
            tracing::info!(
                job = session.job,
                idle_s = idle.as_secs(),
                "ending an idle blender session"
            );
            session.quit();
        }
    }

    /// Ends the sessions of the slots that render with a stored build, so
    /// its files are no longer open once it is evicted.
    pub fn end_build_sessions(&self) {
        let mut slots = self.slots.lock().expect("slots lock");
        for slot in slots.iter_mut() {
            if slot
                .session
                .as_ref()
                .is_some_and(|s| s.install >= self.local)
            {
                slot.session.take().expect("checked").quit();
            }
        }
    }

    /// Which Blender renders `job`: the build chosen for it, else the first
    /// of its own that fits what it needs. The file's own header is checked
    /// too, so a file saved by a newer Blender is never opened by an older
    /// one, whatever the coordinator said.
    fn install_for(&self, job: &JobInfo, job_dir: &Path) -> anyhow::Result<usize> {
        let build = self
            .job_builds
            .lock()
            .expect("job builds lock")
            .get(&job.job)
            .copied();
        match build {
            Some(i) => {
                let offer = self.installs.lock().expect("installs lock")[i]
                    .offer
                    .clone();
                match self.needs(job, job_dir)?.unmet(&offer) {
                    None => Ok(i),
                    Some(why) => anyhow::bail!("the stored build cannot render this job: {why}"),
                }
            }
            None => self.local_for(job, job_dir),
        }
    }

    /// Probes a stored build's Blender as this worker's first slot runs it.
    pub fn probe_build(
        &self,
        runtime: &super::blender_runtime::Runtime,
    ) -> anyhow::Result<Installed> {
        super::blender_runtime::probe_build(runtime, self.device.name(), &self.device.slot_env(0))
    }

    fn needs(&self, job: &JobInfo, job_dir: &Path) -> anyhow::Result<BlenderNeeds> {
        job_needs(job, job_dir)
    }
}

/// What `job` needs of its Blender, with the file's own header taken into
/// account (no Blender older than the file, whatever the job says).
pub fn job_needs(job: &JobInfo, job_dir: &Path) -> anyhow::Result<BlenderNeeds> {
    let saved = file_version(&job_dir.join(&job.scene))?;
    let needs = job.blender.unwrap_or(BlenderNeeds {
        saved_by: None,
        version: VersionReq::AtLeast(saved.major, saved.minor),
        denoise: false,
        osl: false,
        eevee: false,
    });
    Ok(BlenderNeeds {
        saved_by: Some(needs.saved_by.map_or(saved, |s| s.max(saved))),
        ..needs
    })
}

impl Blender {
    /// The first of this worker's own Blenders that fits `job`.
    fn local_for(&self, job: &JobInfo, job_dir: &Path) -> anyhow::Result<usize> {
        let needs = self.needs(job, job_dir)?;
        let offers: Vec<BlenderOffer> = self.installs.lock().expect("installs lock")[..self.local]
            .iter()
            .map(|i| i.offer.clone())
            .collect();
        needs.pick(&offers).ok_or_else(|| {
            let why: Vec<String> = offers.iter().filter_map(|o| needs.unmet(o)).collect();
            anyhow::anyhow!(
                "this worker has no Blender for this job: {}",
                why.join("; ")
            )
        })
    }

    fn checkin(&self, i: usize, session: Option<Session>) {
        let mut slots = self.slots.lock().expect("slots lock");
        slots[i].busy = false;
        slots[i].session = session;
        slots[i].idle_since = Instant::now();
        self.slot_freed.notify_one();
    }

    #[allow(clippy::too_many_arguments)]
    fn render_in_slot(
        &self,
        slot: usize,
        session: &mut Option<Session>,
        job: &JobInfo,
        job_dir: &Path,
        command: &impl Serialize,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Rendered> {
        if ctl.is_canceled() {
            anyhow::bail!(CANCELED);
        }
        let install = self.install_for(job, job_dir)?;
        if session
            .as_ref()
            .is_some_and(|s| s.job != job.job || s.install != install)
        {
            session.take().expect("checked").quit();
        }
        if session.is_none() {
            *session = Some(Session::start(self, install, slot, job, job_dir)?);
        }
        match session
            .as_mut()
            .expect("started")
            .render(command, progress, ctl)
        {
            Ok(rendered) => Ok(rendered),
            Err(SessionError::Canceled) => {
                // Killed: never used again, and the task never rendered
                // again, whatever its process did before it died.
                tracing::info!(
                    job = job.job,
                    slot,
                    "blender session ended: its task was stopped (canceled, past its time limit, or stalled)"
                );
                Err(failure(
                    session.take().expect("started"),
                    CANCELED.into(),
                    false,
                ))
            }
            Err(e @ (SessionError::Failed(_) | SessionError::Unsupported(_))) => {
                // Never render in a session that reported an error: the
                // next task (a retry, maybe) gets a fresh process.
                tracing::info!(
                    job = job.job,
                    slot,
                    "ending the blender session after an error"
                );
                let unsupported = matches!(e, SessionError::Unsupported(_));
                let (SessionError::Failed(e)
                | SessionError::Unsupported(e)
                | SessionError::Died(e)) = e
                else {
                    unreachable!("matched above")
                };
                Err(failure(session.take().expect("started"), e, unsupported))
            }
            Err(SessionError::Died(e)) => {
                tracing::warn!(
                    job = job.job,
                    slot,
                    "blender session died: {e}; retrying in a fresh process"
                );
                *session = None;
                let mut fresh = Session::start(self, install, slot, job, job_dir)?;
                match fresh.render(command, progress, ctl) {
                    Ok(rendered) => {
                        fresh.quit();
                        Ok(rendered)
                    }
                    Err(SessionError::Canceled) => Err(failure(fresh, CANCELED.into(), false)),
                    Err(SessionError::Unsupported(e)) => Err(failure(fresh, e, true)),
                    Err(SessionError::Failed(e) | SessionError::Died(e)) => {
                        Err(failure(fresh, e, false))
                    }
                }
            }
        }
    }
}

impl Engine for Blender {
    fn kind(&self) -> EngineKind {
        EngineKind::Blender
    }

    fn end_idle_sessions(&self, idle: Duration) {
        self.end_idle(idle);
    }

    fn blender_offers(&self) -> Vec<BlenderOffer> {
        self.installs.lock().expect("installs lock")[..self.local]
            .iter()
            .map(|i| i.offer.clone())
            .collect()
    }

    /// In the worker's own Blender of the file's series, else the closest
    /// newer one (never an older one: it may crash on the file); the same
    /// choice as the coordinator's `scanner_for`.
    fn scan(
        &self,
        blend: &Path,
        saved: tessera_protocol::blender::BlenderVersion,
        artist_path: &str,
    ) -> anyhow::Result<String> {
        let runtime = {
            let installs = self.installs.lock().expect("installs lock");
            (installs[..self.local].iter())
                .filter(|i| i.offer.version.series() >= saved.series())
                .min_by_key(|i| i.offer.version.series())
                .map(|i| i.runtime.clone())
                .with_context(|| {
                    format!(
                        "this worker has no Blender {} or newer to scan it",
                        saved.short()
                    )
                })?
        };
        let out = blend.with_extension("scan.json");
        let mut cmd = runtime.command(
            Some(blend),
            tessera_scan::blender::SCAN_PY,
            &[out.as_os_str(), "--remote".as_ref(), artist_path.as_ref()],
            0,
        );
        cmd.stdin(Stdio::null());
        let output = child::output(cmd)
            .with_context(|| format!("cannot run {}", runtime.path().display()))?;
        let json = std::fs::read(&out);
        let _ = std::fs::remove_file(&out);
        match json {
            Ok(bytes) if output.status.success() => {
                String::from_utf8(bytes).context("the scan wrote JSON that is not UTF-8")
            }
            _ => {
                let text = String::from_utf8_lossy(&output.stderr).into_owned()
                    + &String::from_utf8_lossy(&output.stdout);
                let line = (text.lines())
                    .find(|l| l.contains("Error:") || l.contains("error:"))
                    .unwrap_or("")
                    .trim()
                    .to_string();
                anyhow::bail!("the scan failed ({}): {line}", output.status)
            }
        }
    }

    fn render(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        // A cancel kills the session's process group (Blender has no way
        // to stop a render mid-sample that leaves the session usable):
        // the slot is free within milliseconds, and the next task starts a
        // fresh session.
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        // Float tiles where they are merged or stitched in float: sample
        // ranges, and tiles of an EXR frame. A whole frame is Blender's own
        // file, in the scene's format with everything in it.
        let whole = (task.tile.width, task.tile.height) == job.resolution;
        let ranged = task.samples != (0, task.total_samples);
        // A frame with a finishing task: every tile its passes, in float.
        let passes = job.finish;
        let raw = passes || ranged || (job.output == OutputFormat::Exr && !whole);
        let layers = passes || (raw && job.output == OutputFormat::Exr);
        let out = job_dir.with_extension(format!(
            "out-{}-{}.{}",
            task.task.index,
            task.task.epoch,
            if raw { "tflt" } else { "img" }
        ));
        let command = RenderCommand {
            op: "render",
            frame: task.frame,
            tile: [task.tile.x, task.tile.y, task.tile.width, task.tile.height],
            samples: [task.samples.0, task.samples.1],
            total: task.total_samples,
            out: &out,
            raw,
            layers,
            passes,
        };
        let (slot, mut session) = self.checkout()?;
        let result = self.render_in_slot(slot, &mut session, job, job_dir, &command, progress, ctl);
        if !self.persistent {
            if let Some(s) = session.take() {
                s.quit();
            }
        }
        self.checkin(slot, session);
        let rendered = result?;
        let bytes = std::fs::read(&out)
            .with_context(|| format!("blender wrote no output at {}", out.display()));
        let _ = std::fs::remove_file(&out);
        let bytes = bytes?;
        check_evidence(&rendered, task, job.resolution)?;
        match rendered.crop {
            Some([x, y, w, h]) => crop_png(&bytes, x, y, w, h),
            None => Ok(bytes),
        }
    }

    fn finish(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        passes: &Path,
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        let out =
            job_dir.with_extension(format!("out-{}-{}.img", task.task.index, task.task.epoch));
        let command = FinishCommand {
            op: "finish",
            frame: task.frame,
            passes,
            out: &out,
        };
        let (slot, mut session) = self.checkout()?;
        let result = self.render_in_slot(
            slot,
            &mut session,
            job,
            job_dir,
            &command,
            &|_, _, _| {},
            ctl,
        );
        // The finishing step rebuilt the scene's compositor: that session
        // renders nothing more.
        if let Some(s) = session.take() {
            s.quit();
        }
        self.checkin(slot, None);
        let rendered = result?;
        let bytes = std::fs::read(&out)
            .with_context(|| format!("blender wrote no output at {}", out.display()));
        let _ = std::fs::remove_file(&out);
        let bytes = bytes?;
        check_evidence(&rendered, task, job.resolution)?;
        Ok(bytes)
    }
}

/// Accepts a render only on Blender's own evidence that it rendered what
/// was asked: the frame, the size, the passes the scene asks for, and
/// (Cycles) the samples it stamped into the file. An error here is what a canceled or empty render looks like.
fn check_evidence(r: &Rendered, task: &TaskSpec, frame: (u32, u32)) -> anyhow::Result<()> {
    let e = &r.evidence;
    let tile = (task.tile.width, task.tile.height);
    anyhow::ensure!(
        (r.width, r.height) == tile,
        "blender rendered a {}x{} tile, the task is {}x{}",
        r.width,
        r.height,
        tile.0,
        tile.1
    );
    let written = if r.crop.is_some() { frame } else { tile };
    anyhow::ensure!(
        (e.width, e.height) == written,
        "blender's output is {}x{} pixels, expected {}x{}",
        e.width,
        e.height,
        written.0,
        written.1
    );
    anyhow::ensure!(e.channels >= 1, "blender's output has no colour channels");
    anyhow::ensure!(
        e.frame == Some(i64::from(task.frame)),
        "blender's output is stamped frame {}, the task is frame {}",
        e.frame.map_or("(none)".into(), |f| f.to_string()),
        task.frame
    );
    if let Some(asked) = &r.asked_passes {
        // Blender may add passes of its own; every pass asked for must be there.
        let held = e.passes.as_deref().unwrap_or_default();
        let missing: Vec<&str> = (asked.iter())
            .filter(|p| !held.contains(p))
            .map(String::as_str)
            .collect();
        anyhow::ensure!(
            missing.is_empty(),
            "blender's output lacks the passes {} that the scene asks for (it holds {})",
            missing.join(", "),
            if held.is_empty() {
                "none".to_string()
            } else {
                held.join(", ")
            }
        );
    }
    anyhow::ensure!(
        r.finished == task.finish.is_some(),
        "blender's reply is {}, the task is {}",
        if r.finished {
            "a finished frame"
        } else {
            "a render"
        },
        if task.finish.is_some() {
            "a finishing task"
        } else {
            "a render"
        }
    );
    if r.engine == "CYCLES" && !r.finished {
        let want = task.samples.1 - task.samples.0;
        if !e.stamped {
            anyhow::ensure!(
                r.samples == want,
                "blender was set to {} samples, the task asks for {want}",
                r.samples
            );
            return Ok(());
        }
        anyhow::ensure!(
            r.samples == want,
            "blender was set to {} samples, the task asks for {want}",
            r.samples
        );
        // A subset render stamps the count of the render it is part of.
        let stamped = if r.subset { task.total_samples } else { want };
        anyhow::ensure!(
            e.samples.values().any(|&n| n == stamped) && e.samples.values().all(|&n| n <= stamped),
            "Cycles reports {:?} samples per view layer, the task asks for {want}",
            e.samples
        );
    }
    Ok(())
}

/// Cuts the `w` x `h` rectangle at (x, y) out of a PNG, keeping its colour
/// type and bit depth, so the tile's pixels are exactly the frame's.
fn crop_png(bytes: &[u8], x: u32, y: u32, w: u32, h: u32) -> anyhow::Result<Vec<u8>> {
    let mut decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder
        .read_info()
        .context("blender's output is not a PNG")?;
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data)?;
    anyhow::ensure!(
        x + w <= info.width && y + h <= info.height,
        "tile {w}x{h} at {x},{y} lies outside blender's {}x{} output",
        info.width,
        info.height
    );
    let bits = info.color_type.samples() * info.bit_depth as usize;
    anyhow::ensure!(
        bits.is_multiple_of(8),
        "sub-byte PNG pixels are not supported"
    );
    let bpp = bits / 8;
    let mut tile = Vec::with_capacity(w as usize * h as usize * bpp);
    for row in y..y + h {
        let start = row as usize * info.line_size + x as usize * bpp;
        tile.extend_from_slice(&data[start..start + w as usize * bpp]);
    }
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(info.color_type);
        encoder.set_depth(info.bit_depth);
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&tile)?;
    }
    Ok(out)
}

impl Drop for Blender {
    fn drop(&mut self) {
        if let Ok(mut slots) = self.slots.lock() {
            for slot in slots.iter_mut() {
                if let Some(s) = slot.session.take() {
                    s.quit();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::messages::StitchedPasses;

    #[test]
    fn progress_lines_are_parsed() {
        let line = "Fra:1 Mem:21.36M (Peak 23.04M) | Time:00:00.57 | Remaining:00:00.42 | Mem:3.07M, Peak:3.07M | Scene, ViewLayer | Sample 12/64";
        assert_eq!(parse_progress(line), Some((12, 64)));
        assert_eq!(
            parse_progress("Fra:1 Mem:21.36M | Scene | Synchronizing object | Cube"),
            None
        );
    }

    fn task(frame: u32, tile: [u32; 4], samples: (u32, u32)) -> TaskSpec {
        TaskSpec {
            task: tessera_protocol::messages::TaskRef {
                job: 1,
                index: 0,
                epoch: 1,
            },
            frame,
            tile: tessera_protocol::job::TileRect {
                x: tile[0],
                y: tile[1],
                width: tile[2],
                height: tile[3],
            },
            samples,
            total_samples: samples.1,
            unreal: None,
            finish: None,
        }
    }

    fn reply(json: &str) -> Rendered {
        let r: Reply = serde_json::from_str(json).unwrap();
        assert!(r.ok);
        r.rendered.unwrap()
    }

    #[test]
    fn a_render_is_accepted_only_on_blenders_evidence() {
        let t = task(3, [8, 4, 40, 30], (0, 16));
        let good = r#"{"ok":true,"width":40,"height":30,"samples":16,"engine":"CYCLES","crop":[8,4,40,30],
            "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{"ViewLayer":16},"stamped":true}}"#;
        check_evidence(&reply(good), &t, (96, 64)).unwrap();
        let cases = [
            // The stamp names another frame, or none (an empty render).
            (
                good.replace(r#""frame":3"#, r#""frame":2"#),
                "stamped frame 2",
            ),
            (
                good.replace(r#""frame":3"#, r#""frame":null"#),
                "stamped frame (none)",
            ),
            // Cycles reports fewer samples than asked, or none at all.
            (
                good.replace(r#"{"ViewLayer":16}"#, r#"{"ViewLayer":4}"#),
                "samples per view layer",
            ),
            (
                good.replace(r#"{"ViewLayer":16}"#, "{}"),
                "samples per view layer",
            ),
            // The written file is not the frame's size.
            (
                good.replace(r#""width":96"#, r#""width":40"#),
                "output is 40x64",
            ),
            (
                good.replace(r#""channels":4"#, r#""channels":0"#),
                "no colour channels",
            ),
        ];
        for (json, want) in cases {
            let err = check_evidence(&reply(&json), &t, (96, 64)).unwrap_err();
            assert!(err.to_string().contains(want), "{err} / {want}");
        }
        // A sample range rendered as a subset (Blender 4.5+) is stamped with
        // the full render's count; one rendered from an offset, with its own.
        let range = task(3, [8, 4, 40, 30], (8, 16));
        let subset = good.replace(r#""samples":16,"#, r#""samples":8,"subset":true,"#);
        check_evidence(&reply(&subset), &range, (96, 64)).unwrap();
        let offset = good
            .replace(r#""samples":16,"#, r#""samples":8,"#)
            .replace(r#"{"ViewLayer":16}"#, r#"{"ViewLayer":8}"#);
        check_evidence(&reply(&offset), &range, (96, 64)).unwrap();
        let offset_claiming_all = good.replace(r#""samples":16,"#, r#""samples":8,"#);
        let err = check_evidence(&reply(&offset_claiming_all), &range, (96, 64)).unwrap_err();
        assert!(err.to_string().contains("samples per view layer"), "{err}");
        // Every pass the scene asks for must be in the file; passes Blender
        // adds of its own are no error.
        let ml = |held: &str| {
            good.replace(
                r#""stamped":true}"#,
                &format!(r#""stamped":true,"passes":{held}}},"asked_passes":["ViewLayer.Combined","ViewLayer.Depth","Second.Combined"]"#),
            )
        };
        let all = ml(
            r#"["Second.Combined","ViewLayer.Combined","ViewLayer.Depth","ViewLayer.Noisy Image"]"#,
        );
        check_evidence(&reply(&all), &t, (96, 64)).unwrap();
        for (held, want) in [
            (
                r#"["Second.Combined","ViewLayer.Combined"]"#,
                "lacks the passes ViewLayer.Depth that the scene asks for (it holds Second.Combined, ViewLayer.Combined)",
            ),
            (
                r#"["ViewLayer.Combined"]"#,
                "lacks the passes ViewLayer.Depth, Second.Combined",
            ),
            ("null", "(it holds none)"),
        ] {
            let err = check_evidence(&reply(&ml(held)), &t, (96, 64)).unwrap_err();
            assert!(err.to_string().contains(want), "{err} / {want}");
        }
        // Eevee and Workbench stamp no samples; the frame still counts.
        let eevee = r#"{"ok":true,"width":96,"height":64,"samples":8,"engine":"BLENDER_EEVEE","crop":null,
            "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{},"stamped":true}}"#;
        check_evidence(&reply(eevee), &task(3, [0, 0, 96, 64], (0, 8)), (96, 64)).unwrap();
        let failed: Reply =
            serde_json::from_str(r#"{"ok":false,"error":"x","unsupported":true}"#).unwrap();
        assert!(failed.rendered.is_none() && failed.unsupported);
    }

    #[test]
    fn a_finished_frame_is_accepted_without_a_samples_stamp_only_for_a_finishing_task() {
        let mut t = task(3, [0, 0, 96, 64], (0, 16));
        t.finish = Some(StitchedPasses {
            digest: tessera_protocol::Digest::of(b"passes"),
            size: 6,
        });
        // Composited, not rendered: Cycles stamps no samples.
        let finished = r#"{"ok":true,"width":96,"height":64,"samples":0,"engine":"CYCLES","crop":null,"finished":true,
            "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{},"stamped":true}}"#;
        check_evidence(&reply(finished), &t, (96, 64)).unwrap();
        let cases = [
            (
                finished.replace(r#""frame":3"#, r#""frame":2"#),
                "stamped frame 2",
            ),
            (
                finished.replace(
                    r#""width":96,"height":64,"c"#,
                    r#""width":48,"height":64,"c"#,
                ),
                "output is 48x64",
            ),
            // A render's reply to a finishing task, and the other way round.
            (
                finished.replace(r#""finished":true"#, r#""finished":false"#),
                "finishing task",
            ),
        ];
        for (json, want) in cases {
            let err = check_evidence(&reply(&json), &t, (96, 64)).unwrap_err();
            assert!(err.to_string().contains(want), "{want}: {err}");
        }
        t.finish = None;
        let err = check_evidence(&reply(finished), &t, (96, 64)).unwrap_err();
        assert!(err.to_string().contains("a finished frame"), "{err}");
    }

    #[test]
    fn tiles_are_cut_out_of_the_frame_exactly() {
        let (w, h) = (9u32, 5u32);
        let px: Vec<u8> = (0..w * h * 2).map(|i| (i * 7 % 251) as u8).collect();
        let mut frame = Vec::new();
        {
            let mut e = png::Encoder::new(&mut frame, w, h);
            e.set_color(png::ColorType::GrayscaleAlpha);
            e.set_depth(png::BitDepth::Eight);
            e.write_header().unwrap().write_image_data(&px).unwrap();
        }
        let tile = crop_png(&frame, 2, 1, 4, 3).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(tile))
            .read_info()
            .unwrap();
        let mut out = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut out).unwrap();
        assert_eq!(
            (info.width, info.height, info.color_type),
            (4, 3, png::ColorType::GrayscaleAlpha)
        );
        for row in 0..3usize {
            let src = ((1 + row) * w as usize + 2) * 2;
            assert_eq!(&out[row * 8..row * 8 + 8], &px[src..src + 8]);
        }
        assert!(crop_png(&frame, 6, 0, 4, 3)
            .unwrap_err()
            .to_string()
            .contains("outside"));
    }

    #[test]
    fn gpu_slots_are_pinned_one_gpu_each() {
        assert_eq!(Device::Cpu.pin_env(1), None);
        assert_eq!(
            Device::Cuda.pin_env(1),
            Some(("CUDA_VISIBLE_DEVICES", "1".into()))
        );
        assert_eq!(
            Device::Optix.pin_env(0),
            Some(("CUDA_VISIBLE_DEVICES", "0".into()))
        );
        assert_eq!(
            Device::Hip.pin_env(2),
            Some(("HIP_VISIBLE_DEVICES", "2".into()))
        );
        assert_eq!("optix".parse::<Device>(), Ok(Device::Optix));
        assert_eq!(Device::Cpu.slot_env(3), vec![]);
        assert_eq!(
            Device::Optix.slot_env(3),
            vec![
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
                ("CUDA_VISIBLE_DEVICES", "3".to_string())
            ]
        );
        assert!("metal"
            .parse::<Device>()
            .unwrap_err()
            .contains("expected auto, CPU, CUDA, OPTIX, HIP or ONEAPI"));
    }
}

#[cfg(test)]
mod probe_env_tests {
    use super::Device;

    /// Each GPU slot is probed at join under the very environment its
    /// sessions get, one probe per GPU; the CPU is probed once.
    #[test]
    fn every_gpu_slot_is_probed_on_its_own_gpu() {
        assert_eq!(Device::Cpu.probe_envs(4), vec![Vec::new()]);
        let envs = Device::Cuda.probe_envs(3);
        assert_eq!(envs.len(), 3);
        for (slot, env) in envs.iter().enumerate() {
            assert_eq!(env, &Device::Cuda.slot_env(slot));
            assert!(env.contains(&("CUDA_VISIBLE_DEVICES", slot.to_string())));
        }
        let hip = Device::Hip.probe_envs(2);
        assert_eq!(
            hip[1],
            vec![
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
                ("HIP_VISIBLE_DEVICES", "1".to_string())
            ]
        );
        assert_eq!(Device::Optix.probe_envs(0).len(), 1, "at least one probe");
    }
}

#[cfg(test)]
mod runtime_tests {
    #[test]
    fn a_worker_never_opens_a_file_newer_than_its_blender() {
        use crate::engine::blender::{Blender, Device};
        use crate::engine::Engine;
        use tessera_protocol::blender::{BlenderOffer, BlenderVersion};
        use tessera_protocol::job::{Engine as Kind, OutputFormat, TileRect};
        use tessera_protocol::messages::{JobInfo, TaskRef, TaskSpec};
        use tessera_scan::blender_runtime::{Installed, Runtime};
        let dir = std::env::temp_dir().join(format!("tessera-newer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("shot.blend"), b"BLENDER-v405REND\0\0\0\0").unwrap();
        // A Blender that would record being started: it must never run.
        let started = dir.join("started");
        let exe = dir.join("blender");
        std::fs::write(&exe, format!("#!/bin/sh\ntouch {}\n", started.display())).unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let debian = Installed {
            loaded_from: exe.clone(),
            runtime: Runtime::Executable(exe),
            offer: BlenderOffer {
                version: BlenderVersion::new(3, 4, 1),
                name: "Debian's Blender 3.4.1".into(),
                device_types: vec![],
                devices: vec![],
                render_device: "CPU".into(),
                oidn: false,
                osl: false,
                eevee: false,
            },
        };
        let engine = Blender::new(vec![debian], Device::Cpu, 1, true, 1);
        let job = JobInfo {
            job: 1,
            engine: Kind::Blender,
            scene: "shot.blend".into(),
            manifest: vec![],
            resolution: (96, 64),
            output: OutputFormat::Png,
            // As an old coordinator would send it: no needs at all.
            blender: None,
            unreal: None,
            finish: false,
            task_timeout_ms: None,
        };
        let tile = TileRect {
            x: 0,
            y: 0,
            width: 96,
            height: 64,
        };
        let task = TaskSpec {
            task: TaskRef {
                job: 1,
                index: 0,
                epoch: 1,
            },
            frame: 1,
            tile,
            samples: (0, 16),
            total_samples: 16,
            unreal: None,
            finish: None,
        };
        let err = engine
            .render(&job, &dir, &task, &|_, _, _| {}, &super::Control::default())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "this worker has no Blender for this job: the file was saved by Blender 4.5; Debian's Blender 3.4.1 cannot read it"
        );
        assert!(
            !started.exists(),
            "an older Blender was started on the file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
