//! A Blender session: one `blender -b` process per slot with the job's scene
//! loaded, driven by `session.py` over stdin (one JSON command a line) and
//! answering on stdout with a marked reply line; its output is kept as a
//! bounded log for errors and `tessera logs`, and progress lines are
//! parsed for the sample count.

use super::*;

pub(super) const REPLY: &str = "@@TESSERA@@ ";

/// Lines of Blender's output kept per session (for errors and `tessera logs`).
pub(super) const LOG_LINES: usize = 400;

/// What `session.py` is told when it starts.
#[derive(Serialize)]
pub(super) struct SessionConfig<'a> {
    pub(super) job_dir: &'a Path,
    pub(super) artist_blend: Option<&'a str>,
    /// Path on the artist's machine → path in the job folder.
    pub(super) files: std::collections::BTreeMap<&'a str, &'a str>,
    pub(super) device: &'static str,
    pub(super) gpu_index: Option<usize>,
    /// The job's format instead of the file's (`JobInfo::render_format`).
    pub(super) file_format: Option<&'static str>,
}

#[derive(Serialize)]
pub(super) struct RenderCommand<'a> {
    pub(super) op: &'static str,
    pub(super) frame: u32,
    pub(super) tile: [u32; 4],
    pub(super) samples: [u32; 2],
    /// The full render's sample count, of which `samples` is a range.
    pub(super) total: u32,
    pub(super) out: &'a Path,
    pub(super) raw: bool,
    /// A tile or sample range of an OpenEXR frame: travel as an
    /// uncompressed OpenEXR of every layer and pass (not 4-channel float).
    pub(super) layers: bool,
    /// A task of a frame with a finishing task: the render layers only (no
    /// compositor, no denoising), with the denoising data.
    pub(super) passes: bool,
}

/// A finishing task: the compositor and denoising on a frame's stitched
/// passes, written in the scene's own output format.
#[derive(Serialize)]
pub(super) struct FinishCommand<'a> {
    pub(super) op: &'static str,
    pub(super) frame: u32,
    pub(super) passes: &'a Path,
    pub(super) out: &'a Path,
}

#[derive(Deserialize)]
pub(super) struct Reply {
    pub(super) ok: bool,
    pub(super) error: Option<String>,
    /// The failure would repeat on this worker (a feature its Blender lacks).
    #[serde(default)]
    pub(super) unsupported: bool,
    #[serde(flatten)]
    pub(super) rendered: Option<Rendered>,
}

/// A successful render reply: what was asked, and what Blender's output
/// file says it holds.
#[derive(Debug, Deserialize)]
pub(super) struct Rendered {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) samples: u32,
    /// Blender 4.5+ rendered the task's samples as a subset of the full
    /// render's sampling pattern; Cycles then stamps the full count.
    #[serde(default)]
    pub(super) subset: bool,
    pub(super) engine: String,
    /// `[x, y, w, h]`: the output is the whole frame; cut this tile out.
    pub(super) crop: Option<[u32; 4]>,
    pub(super) evidence: Evidence,
    /// The passes (`ViewLayer.Depth`) the scene's view layers ask for, where
    /// the session knows them (Cycles to multilayer OpenEXR).
    #[serde(default)]
    pub(super) asked_passes: Option<Vec<String>>,
    /// A finishing task's output: composited, not rendered (Cycles stamps
    /// no samples into it).
    #[serde(default)]
    pub(super) finished: bool,
}

/// Read back from the written image: its size and channels, and the stamp
/// Blender writes into every file (frame, Cycles' samples per view layer).
#[derive(Debug, Deserialize)]
pub(super) struct Evidence {
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) channels: u32,
    pub(super) frame: Option<i64>,
    #[serde(default)]
    pub(super) samples: std::collections::BTreeMap<String, u32>,
    /// False for formats without Blender's stamp (TIFF, …): frame and
    /// samples then come from the session, not the file.
    #[serde(default)]
    pub(super) stamped: bool,
    /// The passes an OpenEXR holds (`ViewLayer.Depth`); none for other formats.
    #[serde(default)]
    pub(super) passes: Option<Vec<String>>,
}

/// Why a session could not render a task.
pub(super) enum SessionError {
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
pub(super) type Log = Arc<Mutex<VecDeque<String>>>;

pub(super) fn remember(log: &Log, line: &str) {
    let mut log = log.lock().expect("log lock");
    if log.len() == LOG_LINES {
        log.pop_front();
    }
    log.push_back(line.to_string());
}

pub(super) fn excerpt(log: &Log) -> String {
    let log = log.lock().expect("log lock");
    let tail: Vec<&str> = log.iter().rev().take(3).map(String::as_str).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

/// Everything kept of a session's output, one line each.
pub(super) fn full_log(log: &Log) -> String {
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
pub(super) fn failure(session: Session, message: String, unsupported: bool) -> anyhow::Error {
    let log = session.log.clone();
    session.quit();
    crate::engine::Failure {
        message,
        log: full_log(&log),
        unsupported,
    }
    .into()
}

/// One Blender process with a job's scene loaded.
pub(super) struct Session {
    pub(super) job: u64,
    /// Which of the engine's Blenders runs it.
    pub(super) install: usize,
    pub(super) child: Owned,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: BufReader<ChildStdout>,
    pub(super) log: Log,
    /// When Blender last printed a line, on stdout or stderr.
    pub(super) heard: Heard,
    pub(super) stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Session {
    pub(super) fn start(
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
            file_format: job.render_format.map(|f| f.blender_name()),
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
    pub(super) fn render(
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

    pub(super) fn exchange(
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
    pub(super) fn wait_exit(&mut self) -> Option<std::process::ExitStatus> {
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

    pub(super) fn quit(mut self) {
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
