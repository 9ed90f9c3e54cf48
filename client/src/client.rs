//! The client side of `submit`, `status`, `wait` and `cancel`: finds every
//! file a scene needs, hashes it, uploads only what the coordinator lacks,
//! submits the manifest, follows a job and downloads its frames.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tessera_protocol::blender::{BlenderNeeds, VersionReq};
use tessera_protocol::job::{
    limits, parse_frames, Engine, JobSpec, ManifestEntry, OutputFormat, TileGrid,
    SAMPLE_RANGES_AUTO,
};
use tessera_protocol::messages::{
    answer, request, AnswerError, ClientRequest, ClientResponse, Collected, FrameOutput, JobDetail,
    JobFilter, JobStatus, Request, Role, TileStatus, WorkerStatus,
};
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_scan::{blender_runtime, builtin};
use tessera_store::chunk::{self, ChunkList, CHUNK_THRESHOLD};
use tessera_transport::blob::{self, BlobDir};
use tessera_transport::{self as transport, Channel, Timing};

use crate::blend;
use crate::progress::{human_bytes, Progress};
use crate::share::{self, Sharing};

mod scan;
mod upload;

use scan::scan;
pub use scan::SceneFile;
#[cfg(test)]
use upload::hash_file;
use upload::missing;
pub(crate) use upload::{hash_files, real_path, send_missing};
pub use upload::{submit, submit_encode, upload_scene, JobFile, Submitted};

/// Reads a ticket given as text, or as `@FILE`.
pub fn resolve_ticket(value: Option<&str>) -> anyhow::Result<Ticket> {
    let value = value.context(
        "no ticket: pass --ticket @DATA_DIR/client.ticket (or set TESSERA_TICKET) with the ticket the coordinator wrote",
    )?;
    let text = match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the ticket file {path}"))?,
        None => value.to_string(),
    };
    Ok(text.trim().parse()?)
}

/// The endpoints of every client connection this process opened: closed
/// by [`close_all`] before it exits, so the coordinator forgets each
/// connection at once instead of holding it (and its buffers) until its
/// idle timeout.
static OPENED: std::sync::Mutex<Vec<quinn::Endpoint>> = std::sync::Mutex::new(Vec::new());

/// How long the last goodbye may take before the process exits anyway.
const CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_millis(250);

/// Closes every client connection this process opened and waits (at most
/// [`CLOSE_WITHIN`]) for the close to be sent.
pub async fn close_all() {
    let opened = std::mem::take(&mut *OPENED.lock().unwrap_or_else(|e| e.into_inner()));
    for endpoint in &opened {
        endpoint.close(0u32.into(), b"done");
    }
    let idle = wait_idle_all(&opened);
    let _ = tokio::time::timeout(CLOSE_WITHIN, idle).await;
}

async fn wait_idle_all(endpoints: &[quinn::Endpoint]) {
    for endpoint in endpoints {
        endpoint.wait_idle().await;
    }
}

/// A connected client.
pub struct Client {
    session: transport::Session,
}

impl Client {
    pub async fn connect(ticket: &Ticket) -> anyhow::Result<Client> {
        match ticket.role {
            Role::Client => {}
            Role::Worker => bail!(
                "this is a worker ticket; it can only join workers. Use the client ticket (DATA_DIR/client.ticket) to submit or administer"
            ),
            Role::Viewer => bail!(
                "this is a viewer ticket; it opens the web dashboard and the HTTP API to look, nothing else. Use the client ticket (DATA_DIR/client.ticket) to submit or administer"
            ),
        }
        let name = format!("client-{}", std::process::id());
        let session = transport::connect(ticket, &name, Timing::default()).await?;
        (OPENED.lock().unwrap_or_else(|e| e.into_inner())).push(session.endpoint.clone());
        Ok(Client { session })
    }

    pub async fn call(&mut self, request: &ClientRequest) -> anyhow::Result<ClientResponse> {
        let ch: &mut Channel = &mut self.session.control;
        ch.send(request).await?;
        let response = ch.recv::<ClientResponse>().await?.ok_or_else(|| {
            crate::exit::Unreachable("the coordinator closed the connection".into())
        })?;
        // A refusal keeps its kind: the exit code follows it (`exit.rs`).
        if let ClientResponse::Error(e) = response {
            return Err(anyhow::Error::new(e));
        }
        Ok(response)
    }

    /// Asks a typed request and returns its typed answer; a refusal keeps
    /// its [`ErrorKind`](tessera_protocol::messages::ErrorKind), as in [`Client::call`].
    pub async fn ask<R: Request>(&mut self, request: R) -> anyhow::Result<R::Response> {
        let ch: &mut Channel = &mut self.session.control;
        ch.send(&request.into()).await?;
        let response = ch.recv::<ClientResponse>().await?.ok_or_else(|| {
            crate::exit::Unreachable("the coordinator closed the connection".into())
        })?;
        match answer::<R>(response) {
            Ok(value) => Ok(value),
            Err(AnswerError::Refused(e)) => Err(anyhow::Error::new(e)),
            Err(e @ AnswerError::Unexpected(_)) => Err(anyhow::Error::new(e)),
        }
    }

    /// Uploads one blob unless the coordinator has it; returns the bytes sent.
    pub async fn put_blob(&mut self, bytes: Vec<u8>) -> anyhow::Result<u64> {
        let digest = Digest::of(&bytes);
        if missing(self, vec![digest]).await?.is_empty() {
            return Ok(0);
        }
        let len = bytes.len() as u64;
        blob::put_retrying(&self.session.connection, digest, 3, || Ok(bytes.clone())).await?;
        Ok(len)
    }

    pub async fn status(
        &mut self,
        job: Option<u64>,
    ) -> anyhow::Result<(Vec<JobStatus>, Vec<WorkerStatus>)> {
        if job.is_some() {
            return match self.call(&ClientRequest::Status(job)).await? {
                ClientResponse::Status { jobs, workers } => Ok((jobs, workers)),
                other => bail!("unexpected reply {other:?}"),
            };
        }
        // Every job and worker, page by page: each reply fits its frame.
        let (mut jobs, mut workers) = (Vec::new(), Vec::new());
        let (mut after_job, mut after_worker) = (0, 0);
        loop {
            let request = ClientRequest::StatusPage {
                after_job,
                after_worker,
            };
            match self.call(&request).await? {
                ClientResponse::StatusPage {
                    jobs: j,
                    workers: w,
                    more,
                } => {
                    after_job = j.last().map_or(after_job, |s| s.id);
                    after_worker = w.last().map_or(after_worker, |s| s.id);
                    let empty = j.is_empty() && w.is_empty();
                    jobs.extend(j);
                    workers.extend(w);
                    if !more || empty {
                        return Ok((jobs, workers));
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    /// Every job matching `filter`, oldest first, page by page.
    pub async fn jobs(&mut self, filter: &JobFilter) -> anyhow::Result<Vec<JobStatus>> {
        let mut jobs = Vec::new();
        let mut after = 0;
        loop {
            let request = ClientRequest::JobsPage {
                filter: filter.clone(),
                after,
            };
            match self.call(&request).await? {
                ClientResponse::JobsPage { jobs: j, next } => {
                    jobs.extend(j);
                    match next {
                        Some(n) if n > after => after = n,
                        _ => return Ok(jobs),
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    /// Puts a failed job back in the queue.
    pub async fn retry(&mut self, job: u64) -> anyhow::Result<JobStatus> {
        self.ask(request::Retry { job }).await
    }

    /// One job in detail (`status JOB`).
    pub async fn job_detail(&mut self, job: u64) -> anyhow::Result<JobDetail> {
        self.ask(request::Detail { job }).await
    }

    /// Every connected worker, page by page.
    pub async fn workers(&mut self) -> anyhow::Result<Vec<WorkerStatus>> {
        let mut workers = Vec::new();
        let mut after_worker = 0;
        loop {
            // No job has an id this high: the pages carry workers only.
            let request = ClientRequest::StatusPage {
                after_job: i64::MAX as u64,
                after_worker,
            };
            match self.call(&request).await? {
                ClientResponse::StatusPage {
                    workers: w, more, ..
                } => {
                    after_worker = w.last().map_or(after_worker, |s| s.id);
                    let empty = w.is_empty();
                    workers.extend(w);
                    if !more || empty {
                        return Ok(workers);
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    /// The stitched frames of a job so far, page by page.
    pub async fn frames(&mut self, job: u64) -> anyhow::Result<Vec<FrameOutput>> {
        let mut frames = Vec::new();
        let mut after = None;
        loop {
            match self.call(&ClientRequest::FramesPage { job, after }).await? {
                ClientResponse::FramesPage { frames: f, next } => {
                    frames.extend(f);
                    match next {
                        Some(n) if after.is_none_or(|a| n > a) => after = Some(n),
                        _ => return Ok(frames),
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    /// The frames of a job stitched after the cursor `after` (0 first),
    /// and the cursor to ask with next: only what is new is read.
    pub async fn new_frames(
        &mut self,
        job: u64,
        mut after: u64,
    ) -> anyhow::Result<(Vec<FrameOutput>, u64)> {
        let mut frames = Vec::new();
        loop {
            match self.call(&ClientRequest::NewFrames { job, after }).await? {
                ClientResponse::NewFrames {
                    frames: f,
                    next,
                    more,
                } => {
                    let advanced = next > after;
                    frames.extend(f);
                    after = after.max(next);
                    if !more || !advanced {
                        return Ok((frames, after));
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    pub async fn job(&mut self, job: u64) -> anyhow::Result<JobStatus> {
        self.status(Some(job))
            .await?
            .0
            .pop()
            .with_context(|| format!("no job {job} on this coordinator"))
    }

    pub async fn cancel(&mut self, job: u64) -> anyhow::Result<JobStatus> {
        self.ask(request::Cancel { job }).await
    }

    /// The failed attempts of a job (or of one of its tasks), with the
    /// renderer's log of each.
    pub async fn logs(
        &mut self,
        job: u64,
        task: Option<u32>,
    ) -> anyhow::Result<Vec<tessera_protocol::messages::TaskLog>> {
        let mut logs = Vec::new();
        let mut after = 0;
        loop {
            match self
                .call(&ClientRequest::LogsPage { job, task, after })
                .await?
            {
                ClientResponse::LogsPage { logs: l, next } => {
                    logs.extend(l);
                    match next {
                        Some(n) if n > after => after = n,
                        _ => return Ok(logs),
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
    }

    /// Every tile of one frame of a job, for the mosaic.
    pub async fn tiles(&mut self, job: u64, frame: u32) -> anyhow::Result<Vec<TileStatus>> {
        match self.call(&ClientRequest::Tiles { job, frame }).await? {
            ClientResponse::Tiles(t) => Ok(t),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Pauses (or resumes) a job.
    pub async fn pause(&mut self, job: u64, paused: bool) -> anyhow::Result<()> {
        match self.call(&ClientRequest::Pause { job, paused }).await? {
            ClientResponse::Done => Ok(()),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Gives a queued or running job a new priority; its status after.
    pub async fn set_priority(&mut self, job: u64, priority: i32) -> anyhow::Result<JobStatus> {
        match self
            .call(&ClientRequest::SetPriority { job, priority })
            .await?
        {
            ClientResponse::Prioritized(status) => Ok(status),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Reports a fleet's nodes and billing (kept for the dashboard).
    pub async fn fleet_report(
        &mut self,
        report: tessera_protocol::messages::FleetReport,
    ) -> anyhow::Result<()> {
        match self.call(&ClientRequest::FleetReport(report)).await? {
            ClientResponse::Done => Ok(()),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Has the coordinator collect garbage now.
    pub async fn collect_garbage(&mut self) -> anyhow::Result<Collected> {
        match self.call(&ClientRequest::CollectGarbage).await? {
            ClientResponse::Collected(c) => Ok(c),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Asks a worker to finish its tasks and leave.
    pub async fn drain(&mut self, worker: u64) -> anyhow::Result<()> {
        match self.call(&ClientRequest::Drain { worker }).await? {
            ClientResponse::Done => Ok(()),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Revokes every worker enrolled as `name`: returns (identities
    /// revoked, connections closed).
    pub async fn revoke_worker(&mut self, name: &str) -> anyhow::Result<(u32, u32)> {
        let request = ClientRequest::RevokeWorker { name: name.into() };
        match self.call(&request).await? {
            ClientResponse::Revoked {
                identities,
                disconnected,
            } => Ok((identities, disconnected)),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Has the coordinator replace both tickets: returns (worker, client).
    pub async fn rotate_tickets(&mut self) -> anyhow::Result<(String, String)> {
        match self.call(&ClientRequest::RotateTickets).await? {
            ClientResponse::Tickets { worker, client } => Ok((worker, client)),
            other => bail!("unexpected reply {other:?}"),
        }
    }

    /// Turns this connection into the farm's feed.
    pub async fn subscribe(mut self) -> anyhow::Result<Feed> {
        self.session.control.send(&ClientRequest::Subscribe).await?;
        Ok(Feed {
            session: self.session,
        })
    }

    /// Fetches one blob into `dest` (re-hashed as it arrives).
    pub async fn get_blob(&mut self, digest: Digest, dest: &BlobDir) -> anyhow::Result<()> {
        blob::get(&self.session.connection, digest, None, dest).await?;
        Ok(())
    }
}

/// The farm's feed: `ClientResponse::Snapshot` now and every half second,
/// and `ClientResponse::Event` as things happen.
pub struct Feed {
    session: transport::Session,
}

impl Feed {
    /// The next update; `None` when the coordinator closed the feed.
    pub async fn next(&mut self) -> anyhow::Result<Option<ClientResponse>> {
        Ok(self.session.control.recv::<ClientResponse>().await?)
    }
}

/// What the user asked `submit` for.
#[derive(Clone)]
pub struct SubmitOptions {
    pub scene: PathBuf,
    pub frames: Option<String>,
    pub tiles: TileGrid,
    pub sample_ranges: u32,
    pub samples: Option<u32>,
    /// `--verify P`: percent of tasks checked on another worker.
    pub verify: u32,
    /// `--deadline`: from now.
    pub deadline: Option<std::time::Duration>,
    /// `--budget-usd` and `--on-budget`.
    pub budget: Option<tessera_protocol::job::Budget>,
    /// `--task-timeout`.
    pub task_timeout: Option<std::time::Duration>,
    pub name: Option<String>,
    pub priority: i32,
    pub request_id: Option<String>,
    pub engine: Option<Engine>,
    /// `--frame-names frame`: name frames `frame_NNNN.EXT`, not as the scene does.
    pub builtin_frame_names: bool,
    /// A template's `--render-output` frame-name template (`output_####`)
    /// and whether the format's extension is appended (`--use-extension`).
    pub output_pattern: Option<(String, bool)>,
    /// A template's `--render-format`: the frames are written in it
    /// instead of the `.blend` file's own format.
    pub render_format: Option<tessera_protocol::blender::ImageFormat>,
    /// A template step's `hostRequirements`: what the machine rendering
    /// its tasks must have.
    pub host: Option<tessera_protocol::host::HostNeeds>,
    pub allow_missing: bool,
    pub progress: bool,
    /// `--blender`: which Blender versions may render it (default: the
    /// major.minor that saved the file).
    pub blender: Option<VersionReq>,
    /// `--blender-python` / `TESSERA_BLENDER_PYTHON`: a `bpy` interpreter
    /// for the dependency scan when this machine's Blender cannot read
    /// the file.
    pub blender_python: Option<PathBuf>,
    /// For a `.uproject`: the sequence, map and config, and the split.
    pub unreal: crate::uproject::UnrealOptions,
    /// `--after`: jobs that must be done before this one starts.
    pub after: Vec<u64>,
    /// `--after-failure`: what this job does when one of those fails.
    pub after_failure: tessera_protocol::job::AfterFailure,
    /// `--paused`: held until `tessera resume`.
    pub paused: bool,
    /// `--frame-files`: patterns naming the files of one frame each.
    pub frame_files: Vec<String>,
    /// `--project-root`, `--asset-root` (with the studio's), `--allow-file`:
    /// what the scene may upload besides itself (see `share.rs`).
    pub share: crate::share::ShareOptions,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file whose sharing was checked, swapped for a link to another
    /// before it is read (the adversary's race, made certain): refused,
    /// and the other file's bytes are never hashed.
    #[test]
    fn a_checked_file_swapped_for_a_link_before_it_is_read_is_refused() {
        let dir = std::env::temp_dir().join(format!("tessera-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("proj")).unwrap();
        let texture = dir.join("proj/race.png");
        std::fs::write(&texture, b"benign").unwrap();
        std::fs::write(dir.join("secret"), b"secret").unwrap();
        let checked = std::fs::canonicalize(&texture).unwrap();
        let read = |on_disk: &Path| hash_file("race.png".into(), on_disk.to_path_buf(), None);
        assert_eq!(read(&checked).unwrap().entry.size, 6);
        // Swapped for a link to the secret, after the check.
        std::fs::remove_file(&texture).unwrap();
        std::os::unix::fs::symlink(dir.join("secret"), &texture).unwrap();
        let err = read(&checked).err().expect("a swapped file was read");
        assert!(format!("{err:#}").contains("changed while it was read"));
        // A folder on the way swapped for a link: refused too.
        std::fs::remove_file(&texture).unwrap();
        std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
        std::fs::write(dir.join("elsewhere/race.png"), b"secret").unwrap();
        std::fs::rename(dir.join("proj"), dir.join("proj-old")).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("proj")).unwrap();
        assert!(
            read(&checked).is_err(),
            "a folder swapped for a link was followed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
