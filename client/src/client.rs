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
        if ticket.role != Role::Client {
            bail!(
                "this is a worker ticket; it can only join workers. Use the client ticket (DATA_DIR/client.ticket) to submit or administer"
            );
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

/// A scene file and everything it references, ready to hash.
struct Scan {
    engine: Engine,
    frames: Vec<u32>,
    samples: u32,
    resolution: (u32, u32),
    output: OutputFormat,
    /// As asked, or 1 where `auto` cannot split this scene.
    sample_ranges: u32,
    /// The scene file first, then everything it references.
    files: Vec<SceneFile>,
    blender: Option<BlenderNeeds>,
    /// What the user should know about this job, each said once.
    warnings: Vec<String>,
    /// The scene's frame-name template, if it names its frames.
    output_name: Option<String>,
    unreal: Option<tessera_protocol::unreal::UnrealJob>,
    /// Frames end with a finishing task (see [`JobSpec::finish`]).
    finish: bool,
}

pub struct SceneFile {
    /// Where it goes in the job folder.
    pub job_path: String,
    pub on_disk: PathBuf,
    /// Its absolute path here, for engines that remap references.
    pub origin: Option<String>,
}

/// Checks the requested frames against the scene's range.
fn frames_in_range(requested: Option<&str>, first: u32, last: u32) -> anyhow::Result<Vec<u32>> {
    let frames = match requested {
        Some(f) => parse_frames(f).map_err(anyhow::Error::msg)?,
        // Counted before anything is allocated: a scene may declare
        // 0..4294967295.
        None if u64::from(last.saturating_sub(first)) >= limits::MAX_FRAMES as u64 => bail!(
            "the scene's frame range {first}-{last} has {} frames; a job has at most {} (pick some with --frames); nothing was uploaded",
            u64::from(last.saturating_sub(first)) + 1,
            limits::MAX_FRAMES
        ),
        None => (first..=last).collect(),
    };
    if let Some(bad) = frames.iter().find(|&&f| f < first || f > last) {
        bail!(
            "frame {bad} is outside the scene's frame range {first}-{last}; nothing was uploaded"
        );
    }
    Ok(frames)
}

async fn scan(client: &mut Client, opts: &SubmitOptions) -> anyhow::Result<Scan> {
    let path = &opts.scene;
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("`{}` is not a file name", path.display()))?
        .to_string();
    let engine = match opts.engine {
        Some(e) => e,
        None if file_name.ends_with(".blend") => Engine::Blender,
        None if file_name.ends_with(".json") => Engine::Builtin,
        None if file_name.ends_with(".uproject") => Engine::Unreal,
        None => bail!(
            "`{}`: unknown scene type (expected a .blend, an Unreal .uproject or a builtin *.scene.json file)",
            path.display()
        ),
    };
    if !path.is_file() {
        bail!("scene `{}` does not exist", path.display());
    }
    let sharing = Sharing::new(path, &opts.share)?;
    match engine {
        Engine::Builtin | Engine::Noop => {
            let scene = builtin::Scene::load(path)?;
            let (first, last) = scene.frame_range();
            let frames = frames_in_range(opts.frames.as_deref(), first, last)?;
            let dir = path.parent().unwrap_or(Path::new("."));
            let mut files = vec![SceneFile {
                job_path: file_name,
                on_disk: real_path(path)?,
                origin: None,
            }];
            let mut refused = Vec::new();
            for tex in scene.texture_paths() {
                let on_disk = dir.join(&tex);
                if !on_disk.is_file() {
                    bail!("texture `{tex}` named by the scene is missing (looked for {}); nothing was uploaded", on_disk.display());
                }
                match sharing.check(&on_disk) {
                    Ok(real) => files.push(SceneFile {
                        job_path: tex,
                        on_disk: real,
                        origin: None,
                    }),
                    Err(why) => refused.push(share::Refused {
                        path: on_disk.to_string_lossy().into_owned(),
                        used_by: format!("texture `{tex}`"),
                        why,
                    }),
                }
            }
            if !refused.is_empty() {
                return Err(sharing.refusal(&refused, "nothing was uploaded"));
            }
            Ok(Scan {
                engine,
                frames,
                samples: opts.samples.unwrap_or_else(|| scene.samples()),
                resolution: scene.resolution(),
                output: OutputFormat::Png,
                sample_ranges: opts.sample_ranges,
                files,
                blender: None,
                warnings: Vec::new(),
                output_name: None,
                unreal: None,
                finish: false,
            })
        }
        Engine::Blender => scan_blend(client, opts, path, file_name, &sharing).await,
        Engine::Unreal => {
            let p = crate::uproject::scan(path, opts.frames.as_deref(), &opts.unreal, &sharing)?;
            Ok(Scan {
                engine,
                frames: p.frames,
                samples: 1,
                resolution: p.resolution,
                output: p.output,
                sample_ranges: 1,
                files: p.files,
                blender: None,
                warnings: Vec::new(),
                output_name: None,
                unreal: Some(p.unreal),
                finish: false,
            })
        }
    }
}

async fn scan_blend(
    client: &mut Client,
    opts: &SubmitOptions,
    path: &Path,
    file_name: String,
    sharing: &Sharing,
) -> anyhow::Result<Scan> {
    let blend = blend::absolute(path)?;
    let project = blend.parent().context("a .blend file lies in a folder")?;
    let saved = blender_runtime::file_version(&blend).map_err(|e| {
        anyhow::anyhow!(
            "`{}` is not a readable .blend file: {}",
            blend.display(),
            e.root_cause()
        )
    })?;
    let version = opts
        .blender
        .unwrap_or(VersionReq::Series(saved.major, saved.minor));
    if let VersionReq::Series(ma, mi) = version {
        if (ma, mi) < saved.series() {
            bail!(
                "`{}` was saved by Blender {}; Blender {version} cannot read it (ask for --blender {} or newer)",
                blend.display(),
                saved.short(),
                saved.short()
            );
        }
    }
    let (mut s, nothing) = match blend::scanner(&blend, saved, opts.blender_python.as_deref())? {
        Some(runtime) => (blend::scan(&blend, &runtime)?, "nothing was uploaded"),
        // The .blend and its shared libraries went up for their scans.
        None => (
            farm_scan(client, &blend, saved, sharing).await?,
            "nothing was submitted",
        ),
    };
    // Files Blender ships: the worker's own Blender has them.
    s.files.retain(|f| !share::blender_own(Path::new(&f.path)));
    // What the artist did not mean to share is refused before anything
    // else is said or uploaded; what is shared is read from its real path.
    let mut refused = Vec::new();
    let mut real_paths = std::collections::HashMap::new();
    for f in s.files.iter().filter(|f| f.exists) {
        match sharing.check(Path::new(&f.path)) {
            Ok(real) => {
                real_paths.insert(f.path.clone(), real);
            }
            Err(why) => refused.push(share::Refused {
                path: f.path.clone(),
                used_by: format!("{} used by {}", f.kind, f.user),
                why,
            }),
        }
    }
    if !refused.is_empty() {
        return Err(sharing.refusal(&refused, nothing));
    }
    let missing: Vec<String> = s
        .files
        .iter()
        .filter(|f| !f.exists)
        .map(|f| format!("{} ({} used by {})", f.path, f.kind, f.user))
        .collect();
    if !missing.is_empty() && !opts.allow_missing {
        bail!(
            "{} file(s) the scene uses are missing; {nothing}: {} (pass --allow-missing to render without them)",
            missing.len(),
            missing.join(", ")
        );
    }
    let frames = frames_in_range(opts.frames.as_deref(), s.frame_start, s.frame_end)?;
    let cycles = s.render_engine == "CYCLES";
    let whole = opts.tiles.count() == 1 && opts.sample_ranges <= 1;
    // Whole-frame effects on a split frame: the tiles render their passes,
    // and one finishing task per frame composites and denoises the whole
    // frame and writes the scene's output. A multilayer OpenEXR keeps every
    // rendered pass, which a finishing compositor does not give back.
    let finish = cycles
        && !whole
        && (s.compositing || s.use_denoising)
        && !s.is_movie
        && s.file_format != "OPEN_EXR_MULTILAYER";
    let output = match s.file_format.as_str() {
        "PNG" => OutputFormat::Png,
        "OPEN_EXR" | "OPEN_EXR_MULTILAYER" => OutputFormat::Exr,
        _ if s.is_movie => OutputFormat::Image, // refused below, with the reason
        _ if whole || finish => OutputFormat::Image,
        other => {
            bail!("the scene's output format {other} can only be rendered as whole frames: submit without --tiles and --sample-ranges, or set it to PNG or OpenEXR")
        }
    };
    // `auto` splits only what merges exactly: Cycles to EXR, not denoised,
    // and not composited unless a finishing task composites the whole
    // frame (an unsplit frame has none).
    let sample_ranges = match opts.sample_ranges {
        SAMPLE_RANGES_AUTO
            if !cycles
                || output != OutputFormat::Exr
                || s.use_denoising
                || (s.compositing && !finish) =>
        {
            1
        }
        k => k,
    };
    if !cycles && (opts.tiles.count() > 1 || sample_ranges > 1) {
        bail!(
            "the scene renders with {}, which renders whole frames only: submit it without --tiles and --sample-ranges",
            s.render_engine
        );
    }
    if sample_ranges > 1 {
        if output != OutputFormat::Exr && !finish {
            bail!("--sample-ranges merges float images: set the scene's output format to OpenEXR");
        }
        if s.use_denoising && !finish {
            bail!("--sample-ranges cannot merge denoised renders exactly: turn denoising off in the scene");
        }
        // Blender 4.5 renders a range as a subset of the full render's own
        // sampling pattern; 4.2 to 4.4 only offset it, which adds up to the
        // full render with the Tabulated Sobol pattern only.
        let renderer_may_lack_subsets = match version {
            VersionReq::Series(ma, mi) | VersionReq::AtLeast(ma, mi) => (ma, mi) < (4, 5),
        };
        let pattern = s.sampling_pattern.as_deref().unwrap_or("");
        if saved.series() >= (4, 2)
            && renderer_may_lack_subsets
            && !pattern.is_empty()
            && pattern != "TABULATED_SOBOL"
        {
            bail!(
                "--sample-ranges on Blender {} merges exactly only with the Tabulated Sobol pattern (this scene uses {pattern}): set Render > Sampling > Advanced > Pattern to Tabulated Sobol, or render with Blender 4.5 or newer (--blender '>=4.5')",
                version
            );
        }
    }
    if s.is_movie {
        bail!(
            "the scene's output format {} is a movie, which the farm does not encode: set the output to an image format (PNG, or OpenEXR) and encode the frames afterwards, e.g. with ffmpeg",
            s.file_format
        );
    }
    let mut warnings = blend_warnings(&s, opts.tiles.count() > 1, sample_ranges > 1, finish);
    if finish && s.use_denoising && s.denoiser.as_deref() == Some("OPTIX") {
        warnings.push("the scene denoises with OptiX; the finishing step of a split frame denoises with OpenImageDenoise, so frames differ from a full render: submit without --tiles and --sample-ranges for OptiX's result".into());
    }
    let small = std::fs::metadata(&blend).map_or(true, |m| m.len() < CHUNK_THRESHOLD);
    if let (Some(kind), true) = (&s.compressed, small) {
        // Large files get the note about chunking when they are hashed.
        eprintln!("note: `{file_name}` is {kind}-compressed; Blender reads it as is");
    }
    let mut files = vec![SceneFile {
        job_path: file_name,
        on_disk: real_path(&blend)?,
        origin: Some(blend.to_string_lossy().into_owned()),
    }];
    for dep in s.files.iter().filter(|f| f.exists) {
        let Some(real) = real_paths.remove(&dep.path) else {
            continue; // listed twice
        };
        files.push(SceneFile {
            job_path: blend::job_path(project, Path::new(&dep.path))?,
            on_disk: real,
            origin: Some(dep.path.clone()),
        });
    }
    tracing::info!(blender = %s.blender_version, files = files.len(), "scanned {}", blend.display());
    let needs = BlenderNeeds {
        saved_by: Some(saved),
        version,
        // The finishing step denoises with the compositor's OpenImageDenoise.
        denoise: cycles && s.use_denoising && (s.denoiser.as_deref() != Some("OPTIX") || finish),
        osl: cycles && s.use_osl,
        eevee: matches!(
            s.render_engine.as_str(),
            "BLENDER_EEVEE" | "BLENDER_EEVEE_NEXT" | "BLENDER_WORKBENCH"
        ),
    };
    Ok(Scan {
        engine: Engine::Blender,
        frames,
        samples: opts.samples.unwrap_or(s.samples),
        resolution: s.resolution,
        output,
        sample_ranges,
        files,
        blender: Some(needs),
        warnings,
        output_name: s.output_name.clone(),
        unreal: None,
        finish,
    })
}

/// Scans `blend` on a worker whose Blender reads it (this machine has
/// none): uploads it, has the farm list what it references, checks those
/// files here as the local scan does, and does the same for each linked
/// library it finds (at most [`blend::MAX_FARM_LIBRARIES`], nested at
/// most [`blend::MAX_LIBRARY_DEPTH`] deep).
async fn farm_scan(
    client: &mut Client,
    blend: &Path,
    saved: tessera_protocol::blender::BlenderVersion,
    sharing: &Sharing,
) -> anyhow::Result<blend::Scan> {
    let (mut main, worker) = match scan_on_farm(client, blend, saved).await {
        Ok(scanned) => scanned,
        Err(e) => {
            let why = crate::shown::text(&format!("{e:#}"));
            return Err(blend::farm_scan_failed(blend, saved, &why));
        }
    };
    eprintln!(
        "note: this machine's Blender cannot read `{}` (saved by Blender {}): worker {} scanned it",
        blend.display(),
        saved.short(),
        crate::shown::text(&worker)
    );
    let mut scanned: HashSet<PathBuf> = HashSet::from([blend.to_path_buf()]);
    let mut level: Vec<PathBuf> = libraries_of(&main, &scanned, sharing);
    for _depth in 0..blend::MAX_LIBRARY_DEPTH {
        if level.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for lib in level {
            if !scanned.insert(lib.clone()) {
                continue;
            }
            if scanned.len() > blend::MAX_FARM_LIBRARIES + 1 {
                bail!(
                    "`{}` links more than {} libraries; nothing was submitted",
                    blend.display(),
                    blend::MAX_FARM_LIBRARIES
                );
            }
            let version = blender_runtime::file_version(&lib).unwrap_or(saved);
            let (s, _) = scan_on_farm(client, &lib, version)
                .await
                .with_context(|| format!("scanning the library `{}` on the farm", lib.display()))?;
            next.extend(libraries_of(&s, &scanned, sharing));
            blend::merge(&mut main, s);
        }
        level = next;
    }
    Ok(main)
}

/// The libraries a scan lists that exist here, are not scanned yet and may
/// be shared (one that may not is never uploaded for a scan: the submit
/// refuses it, naming it, once the scans are done).
fn libraries_of(s: &blend::Scan, scanned: &HashSet<PathBuf>, sharing: &Sharing) -> Vec<PathBuf> {
    (s.files.iter())
        .filter(|f| f.kind == "library" && f.exists)
        .map(|f| PathBuf::from(&f.path))
        .filter(|p| !scanned.contains(p))
        .filter(|p| !share::blender_own(p) && sharing.check(p).is_ok())
        .collect()
}

/// Uploads one `.blend` and has a worker scan it; the checked scan and the
/// worker's name.
async fn scan_on_farm(
    client: &mut Client,
    blend: &Path,
    version: tessera_protocol::blender::BlenderVersion,
) -> anyhow::Result<(blend::Scan, String)> {
    let path = blend.to_str().context("the .blend's path is not UTF-8")?;
    let mut hashed = hash_files(&[SceneFile {
        job_path: "scan.blend".into(),
        on_disk: real_path(blend)?,
        origin: None,
    }])
    .await?;
    send_missing(client, &mut hashed, false).await?;
    let request = ClientRequest::Scan {
        blend: hashed[0].entry.digest,
        path: path.to_string(),
        version,
    };
    match client.call(&request).await? {
        ClientResponse::Scanned { worker, json } => Ok((blend::from_farm(&json, blend)?, worker)),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// The warnings that apply to a `.blend` job split into tiles (`tiled`)
/// and/or sample ranges (`ranged`), its frames finished whole or not
/// (`finish`): general ones from the scan, then those of settings that only
/// matter for the split the job uses.
fn blend_warnings(s: &blend::Scan, tiled: bool, ranged: bool, finish: bool) -> Vec<String> {
    let mut w = s.warnings.clone();
    let split = tiled || ranged;
    if ranged && s.use_adaptive_sampling {
        w.push("adaptive sampling is on: merged sample ranges differ slightly from a single render (float precision no longer holds)".into());
    }
    // A finishing step denoises, composites and stamps the whole frame.
    let tiled = tiled && !finish;
    if tiled && s.use_denoising {
        w.push("denoising is on: each tile is denoised on its own and does not match a full render (measured on a test scene, 2x2 tiles, OpenImageDenoise: up to 42/255 on 63 % of pixels); submit without --tiles for exact frames".into());
    }
    if tiled && s.compositing {
        w.push("compositing nodes are in use: the compositor runs on each tile, so filters that read neighbouring pixels (blur, glare, lens distortion) differ from a full render (measured on a test scene with glare and lens distortion, 2x2 tiles: up to 29/255 on 78 % of pixels); submit without --tiles for exact frames".into());
    }
    if tiled && s.stamp_burn_in {
        w.push("metadata burn-in (render.use_stamp) is on: every tile gets its own stamp".into());
    }
    if split && s.time_limit {
        w.push("a render time limit is set: split renders are not deterministic".into());
    }
    if ranged && !s.layer_sample_overrides.is_empty() {
        w.push(format!(
            "view layers override the sample count ({}): sample ranges and --samples do not apply to them",
            s.layer_sample_overrides.join(", ")
        ));
    }
    let mut seen = std::collections::HashSet::new();
    w.retain(|x| seen.insert(x.clone()));
    w
}

/// A submitted job and the warnings that apply to it.
pub struct Submitted {
    pub status: JobStatus,
    pub warnings: Vec<String>,
    /// Every file of the job and where on this machine it was read.
    pub files: Vec<JobFile>,
}

/// A file of a submitted job: its path in the job folder, where it was
/// read on this machine (symbolic links resolved), its size and digest.
pub struct JobFile {
    pub path: String,
    pub from: PathBuf,
    pub size: u64,
    pub digest: Digest,
}

/// Scans, hashes, uploads what is missing, and submits. Returns the job's
/// status; warnings are printed once on stderr and returned.
pub async fn submit(client: &mut Client, opts: &SubmitOptions) -> anyhow::Result<Submitted> {
    let (spec, warnings, from) = upload_scene(client, opts).await?;
    let files = (spec.manifest.iter().zip(from))
        .map(|(e, from)| JobFile {
            path: e.path.clone(),
            from,
            size: e.size,
            digest: e.digest,
        })
        .collect();
    match client.call(&ClientRequest::Submit(spec)).await? {
        ClientResponse::Submitted(status) => Ok(Submitted {
            status,
            warnings,
            files,
        }),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// Scans, hashes and uploads what is missing: the job spec to submit (by
/// [`submit`], or by `submit --upload-only` for the HTTP API), its
/// warnings (printed once on stderr), and where each manifest entry's file
/// was read.
pub async fn upload_scene(
    client: &mut Client,
    opts: &SubmitOptions,
) -> anyhow::Result<(JobSpec, Vec<String>, Vec<PathBuf>)> {
    let scan = scan(client, opts).await?;
    for w in &scan.warnings {
        eprintln!("warning: {w}");
    }
    let name = opts.name.clone().unwrap_or_else(|| {
        opts.scene
            .file_name()
            .map_or("job".into(), |n| n.to_string_lossy().into_owned())
    });
    let mut spec = JobSpec {
        request_id: opts.request_id.clone(),
        name,
        engine: scan.engine,
        scene: scan.files[0].job_path.clone(),
        manifest: Vec::new(),
        frames: scan.frames,
        tiles: opts.tiles,
        sample_ranges: scan.sample_ranges,
        samples: scan.samples,
        resolution: scan.resolution,
        priority: opts.priority,
        output: scan.output,
        blender: scan.blender,
        output_name: scan.output_name.filter(|_| !opts.builtin_frame_names),
        unreal: scan.unreal.map(Box::new),
        finish: scan.finish,
        verify_percent: opts.verify,
        after: opts.after.clone(),
        after_failure: opts.after_failure,
        paused: opts.paused,
        deadline_unix_ms: opts.deadline.map(|d| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_millis() as u64);
            now.saturating_add(d.as_millis().min(u128::from(u64::MAX / 2)) as u64)
        }),
        budget: opts.budget,
        task_timeout_ms: opts
            .task_timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    };
    // The coordinator checks the same; checking here first uploads nothing
    // for a job it would refuse.
    if let Err(e) = spec.check_limits() {
        bail!("{e}; nothing was uploaded");
    }
    // Checked before anything is hashed or uploaded.
    if scan.engine == Engine::Unreal && !opts.frame_files.is_empty() {
        bail!("--frame-files is for Blender and builtin scenes (an Unreal chunk renders warm-up frames before its own); nothing was uploaded");
    }
    let paths: Vec<&str> = scan.files.iter().map(|f| f.job_path.as_str()).collect();
    let file_frames = crate::frame_files::assign(&opts.frame_files, &paths)?;
    // A frame's files are uploaded only when the job renders that frame.
    let rendered: std::collections::HashSet<u32> = spec.frames.iter().copied().collect();
    let before = scan.files.len();
    let (files, file_frames): (Vec<SceneFile>, Vec<Option<u32>>) = (scan.files.into_iter())
        .zip(file_frames)
        .filter(|(_, f)| f.is_none_or(|f| rendered.contains(&f)))
        .unzip();
    if files.len() < before {
        eprintln!(
            "note: --frame-files: {} files of frames this job does not render are left out",
            before - files.len()
        );
    }
    let from: Vec<PathBuf> = files.iter().map(|f| f.on_disk.clone()).collect();
    let hashed = hash_files(&files).await?;
    for h in &hashed {
        if let Some(note) = &h.note {
            eprintln!("note: {note}");
        }
    }
    let mut hashed = hashed;
    send_missing(client, &mut hashed, opts.progress).await?;
    spec.manifest = hashed.into_iter().map(|h| h.entry).collect();
    for (entry, frame) in spec.manifest.iter_mut().zip(file_frames) {
        entry.frame = frame;
    }
    Ok((spec, scan.warnings, from))
}

/// A scene file, hashed.
pub(crate) struct Hashed {
    /// For a large file, `digest` is only known once the coordinator has
    /// joined its chunks (`send_missing` fills it in).
    pub entry: ManifestEntry,
    on_disk: PathBuf,
    /// Its chunks, for a file of at least `CHUNK_THRESHOLD` bytes.
    list: Option<ChunkList>,
    /// Something the user should know (a compressed file defeats chunking).
    pub note: Option<String>,
}

/// Hashes every file; large ones are chunked (on every core).
pub(crate) async fn hash_files(files: &[SceneFile]) -> anyhow::Result<Vec<Hashed>> {
    let files: Vec<(String, PathBuf, Option<String>)> = files
        .iter()
        .map(|f| (f.job_path.clone(), f.on_disk.clone(), f.origin.clone()))
        .collect();
    tokio::task::spawn_blocking(move || {
        files
            .into_iter()
            .map(|(path, on_disk, origin)| hash_file(path, on_disk, origin))
            .collect()
    })
    .await?
}

/// The scene file the user named, every link resolved (the file they
/// named is meant, whatever links lead to it).
pub(crate) fn real_path(path: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The path the kernel opened `file` by, every link resolved.
fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

fn chunk_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn hash_file(path: String, on_disk: PathBuf, origin: Option<String>) -> anyhow::Result<Hashed> {
    use std::io::Read;
    let cannot = || format!("cannot read {}", on_disk.display());
    let mut file = std::fs::File::open(&on_disk).with_context(cannot)?;
    // `on_disk` is the real path its sharing was checked for: the file
    // opened must be that one, not what a link swapped in since leads to
    // (its content is hashed here, and an upload that differs from the
    // hash is refused by the coordinator).
    let opened = opened_path(&file);
    if opened.as_deref() != Some(on_disk.as_path()) {
        bail!(
            "{} changed while it was read (it now leads to {}); nothing was uploaded",
            on_disk.display(),
            opened.map_or("an unknown file".into(), |p| p.display().to_string())
        );
    }
    let len = file.metadata().with_context(cannot)?.len();
    let (digest, size, list, note) = if len >= CHUNK_THRESHOLD {
        let mut head = [0u8; 8];
        file.read_exact(&mut head).with_context(cannot)?;
        let list = chunk::list_at(&file, chunk_threads()).with_context(cannot)?;
        let note = chunk::compression(&head).map(|kind| {
            format!(
                "`{path}` is {kind}-compressed ({}): chunk-level dedupe cannot find its unchanged parts, so every edit uploads all of it; save it uncompressed (Blender: File > Save As, untick Compress) to upload only what changed",
                human_bytes(list.size)
            )
        });
        (list.id(), list.size, Some(list), note)
    } else {
        let (digest, size) =
            Digest::of_reader(std::io::BufReader::new(file)).with_context(cannot)?;
        (digest, size, None, None)
    };
    Ok(Hashed {
        entry: ManifestEntry {
            path,
            digest,
            size,
            origin,
            frame: None,
        },
        on_disk,
        list,
        note,
    })
}

/// One blob to upload: a whole small file, or a chunk of a large one.
#[derive(Clone)]
struct Upload {
    digest: Digest,
    len: u64,
    file: Arc<std::fs::File>,
    offset: u64,
    path: PathBuf,
}

impl Upload {
    fn read(&self) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, self.offset)?;
        Ok(buf)
    }
}

/// Asks which of `digests` the coordinator lacks, in batches that fit a frame.
async fn missing(client: &mut Client, digests: Vec<Digest>) -> anyhow::Result<HashSet<Digest>> {
    let mut out = HashSet::new();
    for batch in digests.chunks(100_000) {
        match client
            .call(&ClientRequest::MissingBlobs(batch.to_vec()))
            .await?
        {
            ClientResponse::Missing(m) => out.extend(m),
            other => bail!("unexpected reply {other:?}"),
        }
    }
    Ok(out)
}

/// Asks which files the coordinator joined from these chunk lists before.
async fn known_lists(client: &mut Client, ids: &[Digest]) -> anyhow::Result<Vec<Option<Digest>>> {
    let mut out = Vec::with_capacity(ids.len());
    for batch in ids.chunks(100_000) {
        match client
            .call(&ClientRequest::KnownLists(batch.to_vec()))
            .await?
        {
            ClientResponse::Known(files) if files.len() == batch.len() => out.extend(files),
            other => bail!("unexpected reply {other:?}"),
        }
    }
    Ok(out)
}

/// Uploads what the coordinator lacks: small files whole, large files as
/// the chunks it does not hold yet (so an interrupted upload resumes where
/// it stopped), then has it join each large file from its chunks. A large
/// file goes by its chunk list, and the coordinator names it: with the
/// digest of a file it joined from the same list before, or with the digest
/// it computes as it joins the chunks; this fills in `entry.digest`.
/// Returns the bytes it uploaded.
pub(crate) async fn send_missing(
    client: &mut Client,
    files: &mut [Hashed],
    progress: bool,
) -> anyhow::Result<u64> {
    let large: Vec<(usize, Digest)> = files
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.list.as_ref().map(|l| (i, l.id())))
        .collect();
    let ids: Vec<Digest> = large.iter().map(|&(_, id)| id).collect();
    let known = known_lists(client, &ids).await?;
    // Large files to join, one per distinct chunk list.
    let mut to_join: Vec<usize> = Vec::new();
    let mut listed = HashSet::new();
    for (&(i, id), file) in large.iter().zip(known) {
        match file {
            Some(digest) => files[i].entry.digest = digest,
            None if listed.insert(id) => to_join.push(i),
            None => {}
        }
    }
    let mut seen = HashSet::new();
    let small: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].list.is_none() && seen.insert(files[i].entry.digest))
        .collect();
    let lacking = missing(
        client,
        small.iter().map(|&i| files[i].entry.digest).collect(),
    )
    .await?;
    let chunk_digests: Vec<Digest> = to_join
        .iter()
        .filter_map(|&i| files[i].list.as_ref())
        .flat_map(|l| l.chunks.iter().map(|c| c.digest))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut lacking_chunks = missing(client, chunk_digests).await?;
    let mut uploads = Vec::new();
    let sending = small
        .into_iter()
        .filter(|i| lacking.contains(&files[*i].entry.digest))
        .chain(to_join.iter().copied());
    for i in sending {
        let h = &files[i];
        let file = Arc::new(
            std::fs::File::open(&h.on_disk)
                .with_context(|| format!("cannot read {}", h.on_disk.display()))?,
        );
        let upload = |digest, len, offset| Upload {
            digest,
            len,
            file: file.clone(),
            offset,
            path: h.on_disk.clone(),
        };
        match &h.list {
            None => uploads.push(upload(h.entry.digest, h.entry.size, 0)),
            Some(list) => {
                for (offset, c) in list.offsets() {
                    // A chunk that repeats inside the files goes up once.
                    if lacking_chunks.remove(&c.digest) {
                        uploads.push(upload(c.digest, u64::from(c.len), offset));
                    }
                }
            }
        }
    }
    let sent = upload(&client.session.connection, uploads, progress).await?;
    for i in to_join {
        let list = files[i]
            .list
            .clone()
            .expect("a large file has a chunk list");
        let id = list.id();
        let digest = match client
            .call(&ClientRequest::Assemble(list))
            .await
            .with_context(|| format!("storing `{}`", files[i].entry.path))?
        {
            ClientResponse::Assembled(digest) => digest,
            other => bail!("unexpected reply {other:?}"),
        };
        for &(j, _) in large.iter().filter(|(_, l)| *l == id) {
            files[j].entry.digest = digest;
        }
    }
    Ok(sent)
}

/// Streams that upload at once.
const UPLOAD_STREAMS: usize = 8;

/// Uploads blobs on several streams at once, with a progress bar (bytes,
/// rate, ETA) on a terminal. A blob the coordinator refuses as corrupt is
/// read and sent again. Returns the bytes of the blobs it sent.
async fn upload(
    conn: &quinn::Connection,
    uploads: Vec<Upload>,
    progress: bool,
) -> anyhow::Result<u64> {
    if uploads.is_empty() {
        return Ok(0);
    }
    let total: u64 = uploads.iter().map(|u| u.len).sum();
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar_task = progress.then(|| {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut bar = Progress::new("uploading", "bytes");
            loop {
                let s = sent.load(Ordering::Relaxed);
                bar.update(s, total);
                if s >= total {
                    bar.finish();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let mut queue = uploads;
    queue.reverse();
    let queue = Arc::new(std::sync::Mutex::new(queue));
    let mut workers = Vec::new();
    for _ in 0..UPLOAD_STREAMS {
        let (conn, queue, sent) = (conn.clone(), queue.clone(), sent.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().expect("upload queue").pop();
                let Some(u) = next else {
                    return anyhow::Ok(());
                };
                blob::put_retrying(&conn, u.digest, 3, || u.read())
                    .await
                    .with_context(|| {
                        format!(
                            "uploading {} (if it was saved during the upload, run submit again)",
                            u.path.display()
                        )
                    })?;
                sent.fetch_add(u.len, Ordering::Relaxed);
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    if let Some(t) = bar_task {
        let _ = t.await;
    }
    tracing::info!(
        bytes = total,
        ms = started.elapsed().as_millis() as u64,
        "uploaded"
    );
    Ok(total)
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
