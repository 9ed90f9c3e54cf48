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

mod evidence;
mod session;

use evidence::{check_evidence, crop_png};
use session::{failure, FinishCommand, RenderCommand, Rendered, Session, SessionError};
#[cfg(test)]
use session::{parse_progress, Reply};

/// The session script, passed with `--python-expr`.
pub const SESSION_PY: &str = include_str!("blender/session.py");
pub use tessera_scan::blender::{detect, SAFE_ARGS, SCAN_PY};

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
mod tests;

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
            render_format: None,
            encode: None,
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
