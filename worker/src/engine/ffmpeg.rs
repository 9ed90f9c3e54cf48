//! The ffmpeg engine: an encode job's one task (see
//! `tessera_protocol::encode`) runs ffmpeg over the input frames laid out in
//! the job folder and returns the movie.
//!
//! ffmpeg runs as an owned child (its own process group, killed on cancel
//! and with the worker), with an argument vector built here, never a shell:
//! the options are checked again against the protocol's list, the input is
//! the job folder's own frame pattern and the output a file beside the job
//! folder. Its stderr is watched for signs of life (the stall window) and
//! its tail kept as the task's log.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tessera_protocol::encode;
use tessera_protocol::job::Engine as EngineKind;
use tessera_protocol::messages::{JobInfo, TaskSpec, MAX_TASK_LOG};

use super::{clock_ms, Control, Engine, Failure, Heard, CANCELED};

/// The environment variable naming the ffmpeg to run (else `ffmpeg` on
/// the PATH).
pub const FFMPEG_ENV: &str = "TESSERA_FFMPEG";

pub struct Ffmpeg {
    program: PathBuf,
}

impl Ffmpeg {
    /// The ffmpeg this worker offers: `TESSERA_FFMPEG`, else `ffmpeg` on
    /// the PATH, if it runs (`ffmpeg -version`).
    pub fn find() -> Option<Ffmpeg> {
        let program = match std::env::var_os(FFMPEG_ENV) {
            Some(p) => PathBuf::from(p),
            None => std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("ffmpeg"))
                    .find(|p| p.is_file())
            })?,
        };
        let mut cmd = Command::new(&program);
        cmd.arg("-version").stdin(Stdio::null());
        let out = crate::child::output(cmd).ok()?;
        let works = out.status.success() && out.stdout.starts_with(b"ffmpeg version");
        works.then_some(Ffmpeg { program })
    }

    pub fn program(&self) -> &Path {
        &self.program
    }
}

impl Engine for Ffmpeg {
    fn kind(&self) -> EngineKind {
        EngineKind::Ffmpeg
    }

    fn render(
        &self,
        job: &JobInfo,
        job_dir: &Path,
        task: &TaskSpec,
        _progress: &(dyn Fn(u32, u32, Option<&str>) + Sync),
        ctl: &Control,
    ) -> anyhow::Result<Vec<u8>> {
        let enc = job
            .encode
            .as_ref()
            .context("an ffmpeg job without its encode spec")?;
        encode::check_movie_name(&enc.movie).map_err(anyhow::Error::msg)?;
        encode::check_options(&enc.spec.input_options, true).map_err(anyhow::Error::msg)?;
        encode::check_options(&enc.spec.output_options, false).map_err(anyhow::Error::msg)?;
        let ext = input_extension(job)?;
        let container = enc.movie.rsplit_once('.').map_or("mp4", |(_, e)| e);
        let out = job_dir.with_extension(format!(
            "out-{}-{}.{container}",
            task.task.index, task.task.epoch
        ));
        let mut cmd = Command::new(&self.program);
        cmd.args(["-nostdin", "-hide_banner", "-y"])
            .args(&enc.spec.input_options)
            .args(["-start_number", "1", "-f", "image2", "-i"])
            .arg(job_dir.join(encode::input_pattern(&ext)))
            .args(&enc.spec.output_options)
            .arg(&out)
            .current_dir(job_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let result = run(cmd, ctl);
        let bytes = std::fs::read(&out);
        let _ = std::fs::remove_file(&out);
        result?;
        let bytes = bytes.context("ffmpeg wrote no movie")?;
        anyhow::ensure!(!bytes.is_empty(), "ffmpeg wrote an empty movie");
        Ok(bytes)
    }
}

/// The extension of the input frames the job folder holds (one for all).
fn input_extension(job: &JobInfo) -> anyhow::Result<String> {
    let prefix = format!("{}/", encode::INPUT_DIR);
    let mut exts = (job.manifest.iter())
        .filter_map(|m| m.path.strip_prefix(&prefix))
        .filter_map(|name| name.rsplit_once('.').map(|(_, e)| e.to_string()));
    let ext = exts.next().context("an encode job without input frames")?;
    anyhow::ensure!(
        encode::is_image_extension(&ext) && exts.all(|e| e == ext),
        "the input frames are not all images of one format"
    );
    Ok(ext)
}

/// Runs ffmpeg to its end as an owned child in `ctl`'s care: its stderr's
/// tail is the log of a failure; a cancel kills it.
fn run(cmd: Command, ctl: &Control) -> anyhow::Result<()> {
    let mut owned = crate::child::spawn(cmd).context("cannot start ffmpeg")?;
    let heard: Heard = Arc::new(clock_ms().into());
    let tail = Arc::new(Mutex::new(Vec::<u8>::new()));
    let mut stderr = owned.child.stderr.take().expect("piped");
    let reader = {
        let (heard, tail) = (heard.clone(), tail.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                heard.store(clock_ms(), Ordering::Relaxed);
                let mut t = tail.lock().expect("tail lock");
                t.extend_from_slice(&buf[..n]);
                if t.len() > MAX_TASK_LOG {
                    let cut = t.len() - MAX_TASK_LOG;
                    t.drain(..cut);
                }
            }
        })
    };
    if !ctl.running_in(owned.group(), Some(heard)) {
        let _ = owned.wait();
        let _ = reader.join();
        anyhow::bail!(CANCELED);
    }
    let status = owned.wait();
    ctl.done_running();
    let _ = reader.join();
    if ctl.is_canceled() {
        anyhow::bail!(CANCELED);
    }
    let status = status.context("cannot wait for ffmpeg")?;
    if status.success() {
        return Ok(());
    }
    let log = String::from_utf8_lossy(&tail.lock().expect("tail lock")).replace('\r', "\n");
    let last = (log.lines().rev())
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("no output")
        .to_string();
    Err(Failure {
        message: format!("ffmpeg failed ({status}): {last}"),
        log,
        unsupported: false,
    }
    .into())
}
