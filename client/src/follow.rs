//! Following jobs to their end (`wait`, `submit --wait`): several jobs at
//! once, an optional timeout, each stitched frame written to `--output` as
//! soon as the coordinator has it (not when the whole job ends), and a
//! connection that comes back by itself when the coordinator restarts:
//! frames already written and verified are not fetched again, and the
//! exit code says how the jobs ended, not that a connection dropped.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tessera_protocol::messages::{FrameOutput, JobState, JobStatus};
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_store::blob::BlobDir;

use crate::client::Client;
use crate::exit;
use crate::progress::Progress;

/// How long a lost coordinator is waited for before `wait` gives up with
/// [`exit::UNREACHABLE`] (a `--timeout` that ends sooner wins).
pub const RECONNECT_FOR: Duration = Duration::from_secs(300);

/// How often the jobs are polled.
const POLL: Duration = Duration::from_millis(250);

/// How often a progress line is printed when stderr is not a terminal.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What `wait` was asked to do.
#[derive(Clone)]
pub struct WaitOptions {
    /// `--output DIR` and `--overwrite`.
    pub output: Option<(PathBuf, bool)>,
    /// `--partial`: also fetch the finished frames of a job that failed or
    /// was canceled.
    pub partial: bool,
    pub timeout: Option<Duration>,
    /// Progress on stderr: a bar on a terminal, else a line every few seconds.
    pub progress: bool,
}

/// How the wait ended: each job's last status and the files written for
/// it, and whether the time ran out first.
pub struct Waited {
    pub jobs: Vec<(JobStatus, Vec<PathBuf>)>,
    /// Of each job's files, how many this run downloaded (the others were
    /// in place already, with the same bytes).
    pub downloaded: Vec<usize>,
    pub timed_out: bool,
}

impl Waited {
    pub fn exit_code(&self) -> i32 {
        let finished = exit::for_jobs(self.jobs.iter().map(|(s, _)| s));
        match (finished, self.timed_out) {
            (exit::OK, true) => exit::TIMED_OUT,
            (code, _) => code,
        }
    }
}

/// One job being followed.
struct Followed {
    id: u64,
    status: Option<JobStatus>,
    /// Frames done when the frame list was last read.
    frames_seen: Option<u32>,
    /// Where the next read of new frames starts (see `Client::new_frames`).
    cursor: u64,
    writer: Option<FrameWriter>,
}

/// Follows `jobs` until every one is final (or the timeout), writing
/// frames as they finish. `client` is the connection to start with; it is
/// replaced by a new one when the coordinator goes away and comes back.
pub async fn wait(
    ticket: &Ticket,
    client: Option<Client>,
    jobs: &[u64],
    opts: &WaitOptions,
) -> anyhow::Result<Waited> {
    let started = Instant::now();
    let deadline = opts.timeout.map(|t| started + t);
    let mut client = client;
    let mut followed: Vec<Followed> = jobs
        .iter()
        .map(|&id| Followed {
            id,
            status: None,
            frames_seen: None,
            cursor: 0,
            writer: None,
        })
        .collect();
    let mut progress = opts.progress.then(|| Shown::new(jobs.len()));
    let mut lost_since: Option<Instant> = None;
    let mut backoff = reconnect_backoff();
    loop {
        let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
        if client.is_none() {
            match Client::connect(ticket).await {
                Ok(c) => {
                    if lost_since.take().is_some() {
                        eprintln!("reconnected to the coordinator; carrying on");
                    }
                    backoff = reconnect_backoff();
                    client = Some(c);
                }
                Err(e) if exit::is_unreachable(&e) => {
                    let since = *lost_since.get_or_insert_with(Instant::now);
                    if timed_out {
                        return Ok(finish(followed, true));
                    }
                    if since.elapsed() >= RECONNECT_FOR {
                        return Err(e.context(format!(
                            "the coordinator did not come back within {} s",
                            RECONNECT_FOR.as_secs()
                        )));
                    }
                    let mut pause = backoff.next().unwrap_or(MAX_RECONNECT_WAIT);
                    if let Some(d) = deadline {
                        pause = pause.min(d.saturating_duration_since(Instant::now()));
                    }
                    tokio::time::sleep(pause).await;
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        let c = client.as_mut().expect("connected above");
        match poll(c, &mut followed, opts).await {
            Ok(()) => {}
            Err(e) if exit::is_unreachable(&e) => {
                if lost_since.is_none() {
                    eprintln!("lost the connection to the coordinator; reconnecting (frames already written are kept)");
                    lost_since = Some(Instant::now());
                }
                client = None;
                continue;
            }
            Err(e) => return Err(e),
        }
        if let Some(p) = &mut progress {
            p.show(&followed);
        }
        if followed
            .iter()
            .all(|f| f.status.as_ref().is_some_and(|s| s.state.is_final()))
        {
            if let Some(p) = &mut progress {
                p.finish();
            }
            return Ok(finish(followed, false));
        }
        if timed_out {
            if let Some(p) = &mut progress {
                p.finish();
            }
            return Ok(finish(followed, true));
        }
        let mut pause = POLL;
        if let Some(d) = deadline {
            pause = pause.min(d.saturating_duration_since(Instant::now()));
        }
        tokio::time::sleep(pause).await;
    }
}

fn finish(followed: Vec<Followed>, timed_out: bool) -> Waited {
    let mut jobs = Vec::new();
    let mut downloaded = Vec::new();
    for f in followed {
        let Some(status) = f.status else { continue };
        let (files, fresh) = f
            .writer
            .map(|w| (w.files(), w.downloaded))
            .unwrap_or_default();
        jobs.push((status, files));
        downloaded.push(fresh);
    }
    Waited {
        jobs,
        downloaded,
        timed_out,
    }
}

/// One round: each unfinished job's status, and its new frames.
async fn poll(
    client: &mut Client,
    followed: &mut [Followed],
    opts: &WaitOptions,
) -> anyhow::Result<()> {
    for f in followed.iter_mut() {
        if f.status.as_ref().is_some_and(|s| s.state.is_final()) {
            continue;
        }
        let status = client.job(f.id).await?;
        if let (None, Some((dir, overwrite))) = (&f.writer, &opts.output) {
            let dir = output_dir(dir, &status);
            f.writer = Some(FrameWriter::new(&dir, f.id, *overwrite)?);
        }
        let done = status.frames_done;
        let fetch = match status.state {
            JobState::Failed | JobState::Canceled => opts.partial,
            _ => true,
        };
        let changed = f.frames_seen != Some(done) || status.state.is_final();
        if let (Some(w), true, true) = (&mut f.writer, fetch, changed) {
            // Read only when it grew, and then only the frames stitched
            // since the last read; each frame is fetched once. At the end
            // the whole list, once: whatever a cursor could miss (a
            // database restored from a backup renumbers) is written then.
            if status.state.is_final() {
                let frames = client.frames(f.id).await?;
                w.write(client, &frames).await?;
            } else {
                let (frames, next) = client.new_frames(f.id, f.cursor).await?;
                w.write(client, &frames).await?;
                f.cursor = next;
            }
            f.frames_seen = Some(done);
        }
        f.status = Some(status);
    }
    Ok(())
}

/// `--output` for one job: `{id}` and `{name}` in the path become the
/// job's id and name (with `/`, control characters and a leading `.` made
/// `_`), so `wait 4 5 6 --output 'shots/{name}'` keeps each shot apart.
pub fn output_dir(template: &Path, job: &JobStatus) -> PathBuf {
    let Some(text) = template.to_str() else {
        return template.to_path_buf();
    };
    if !text.contains("{id}") && !text.contains("{name}") {
        return template.to_path_buf();
    }
    let mut name: String = job
        .name
        .chars()
        .map(|c| {
            if c == '/' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if name.starts_with('.') || name.is_empty() {
        name.insert(0, '_');
    }
    PathBuf::from(
        text.replace("{id}", &job.id.to_string())
            .replace("{name}", &name),
    )
}

/// Progress on stderr: a bar on a terminal, a line every few seconds
/// otherwise (a script's log).
struct Shown {
    bar: Option<Progress>,
    last_line: Option<Instant>,
    jobs: usize,
}

impl Shown {
    fn new(jobs: usize) -> Shown {
        let terminal = std::io::stderr().is_terminal();
        Shown {
            bar: terminal.then(|| Progress::new("rendering", "tasks")),
            last_line: None,
            jobs,
        }
    }

    fn show(&mut self, followed: &[Followed]) {
        let statuses: Vec<&JobStatus> = followed.iter().filter_map(|f| f.status.as_ref()).collect();
        let done: u64 = statuses.iter().map(|s| u64::from(s.tasks_done)).sum();
        let total: u64 = statuses.iter().map(|s| u64::from(s.tasks_total)).sum();
        if let Some(bar) = &mut self.bar {
            bar.update(done, total);
            return;
        }
        if self.last_line.is_some_and(|t| t.elapsed() < PROGRESS_EVERY) {
            return;
        }
        self.last_line = Some(Instant::now());
        for s in statuses {
            if s.state.is_final() && self.jobs > 1 {
                continue;
            }
            eprintln!("{}", progress_line(s));
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = &mut self.bar {
            bar.finish();
        }
    }
}

/// `job 3 (sh010): running, 12/48 tasks, 2/6 frames, eta 31 s`.
pub fn progress_line(s: &JobStatus) -> String {
    let mut line = format!(
        "job {} ({}): {}, {}/{} tasks, {}/{} frames",
        s.id,
        crate::shown::text(&s.name),
        s.state.name(),
        s.tasks_done,
        s.tasks_total,
        s.frames_done,
        s.frames_total
    );
    if s.paused {
        line += ", paused";
    }
    if let Some(eta) = s.eta_secs.filter(|_| !s.state.is_final()) {
        line += &format!(", eta {eta:.0} s");
    }
    if let Some(b) = &s.blocked {
        line += &format!(", blocked: {}", crate::shown::text(b));
    }
    line
}

/// Writes a job's frames into the output folder as they appear. A file
/// already there with the same bytes is kept; one with other bytes
/// (another job's frame, a user's file) is an error naming it, unless
/// `overwrite`. Frames arrive in a staging folder of this run's own
/// making, the only thing removed afterwards.
pub struct FrameWriter {
    dir: PathBuf,
    overwrite: bool,
    job: u64,
    staging: Option<(Staging, BlobDir)>,
    /// Each frame written (or found in place) and the digest it holds.
    written: HashMap<u32, (Digest, PathBuf)>,
    /// The folder was made by this run: if no frame came, it goes again.
    made_dir: bool,
    /// How many frames this run downloaded (not found in place).
    pub downloaded: usize,
}

impl FrameWriter {
    pub fn new(dir: &Path, job: u64, overwrite: bool) -> anyhow::Result<FrameWriter> {
        let made_dir = !dir.exists();
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(FrameWriter {
            dir: dir.to_path_buf(),
            overwrite,
            job,
            staging: None,
            written: HashMap::new(),
            made_dir,
            downloaded: 0,
        })
    }

    /// The files written or found in place, in frame order.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut frames: Vec<(&u32, &(Digest, PathBuf))> = self.written.iter().collect();
        frames.sort_by_key(|(f, _)| **f);
        frames.into_iter().map(|(_, (_, p))| p.clone()).collect()
    }

    /// Writes every frame of `frames` not written yet.
    pub async fn write(
        &mut self,
        client: &mut Client,
        frames: &[FrameOutput],
    ) -> anyhow::Result<()> {
        for f in frames {
            if self
                .written
                .get(&f.frame)
                .is_some_and(|(d, _)| *d == f.digest)
            {
                continue;
            }
            let dest = self.dir.join(file_name(f));
            if dest.symlink_metadata().is_ok() {
                if same_bytes(&dest, &f.digest) {
                    self.written.insert(f.frame, (f.digest, dest));
                    continue;
                }
                // A frame this run wrote may be replaced by its re-render
                // (a `--verify` check withdrew it); anything else only
                // with --overwrite.
                let ours = self.written.contains_key(&f.frame);
                if (!self.overwrite && !ours) || !dest.is_file() {
                    bail!(
                        "{} already exists and holds something else; nothing there was replaced (pass --overwrite to replace it, or pick another --output)",
                        dest.display()
                    );
                }
            }
            if self.staging.is_none() {
                let staging = Staging::create(&self.dir, self.job)?;
                let blobs = BlobDir::open(&staging.0)?;
                self.staging = Some((staging, blobs));
            }
            let (_, staged) = self.staging.as_ref().expect("created above");
            client
                .get_blob(f.digest, staged)
                .await
                .with_context(|| format!("downloading frame {}", f.frame))?;
            std::fs::rename(staged.path(&f.digest), &dest)
                .with_context(|| format!("writing {}", dest.display()))?;
            self.written.insert(f.frame, (f.digest, dest));
            self.downloaded += 1;
        }
        Ok(())
    }
}

/// The scene's own name for the frame (checked to be a plain file name),
/// else `frame_NNNN.EXT`.
fn file_name(f: &FrameOutput) -> String {
    f.file_name()
}

/// A staging folder this run created inside the output folder; removed
/// when dropped. A folder of the same name that was there before is never
/// touched: another name is picked.
impl Drop for FrameWriter {
    /// A folder this run made and no frame came to (a job cancelled or
    /// failed before any) is removed, so that none is left empty.
    fn drop(&mut self) {
        self.staging = None;
        if self.made_dir && self.written.is_empty() {
            // Only an empty folder: remove_dir refuses anything else.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

struct Staging(PathBuf);

impl Staging {
    fn create(dir: &Path, job: u64) -> anyhow::Result<Staging> {
        for attempt in 0..100u32 {
            let path = dir.join(format!(
                ".tessera-download-{job}-{}-{attempt}",
                std::process::id()
            ));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(Staging(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", path.display()))
                }
            }
        }
        bail!("cannot create a staging folder in {}", dir.display())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the file at `path` holds exactly the bytes of `digest`.
fn same_bytes(path: &Path, digest: &Digest) -> bool {
    std::fs::File::open(path)
        .ok()
        .and_then(|f| Digest::of_reader(f).ok())
        .is_some_and(|(d, _)| d == *digest)
}

/// The longest wait between two attempts to reconnect.
const MAX_RECONNECT_WAIT: Duration = Duration::from_secs(5);

/// `tessera events`: the farm's events (one job's, with `job`) until the
/// job ends or stdout closes, followed across a coordinator's restart or a
/// standby's takeover: a lost feed is subscribed again (through every
/// address of the ticket) for up to [`RECONNECT_FOR`]. Events of the gap
/// are not shown; one job's final state never is missed (asked for after
/// each subscription).
pub async fn events(ticket: &Ticket, job: Option<u64>, json: bool) -> anyhow::Result<i32> {
    use tessera_protocol::messages::FarmEvent;
    let mut lost_since: Option<Instant> = None;
    let mut backoff = reconnect_backoff();
    loop {
        // Subscribed first, so that nothing falls between: an unknown job
        // is an error; a finished one's stream is its final event alone.
        let subscribed = async {
            let feed = Client::connect(ticket).await?.subscribe().await?;
            let finished = match job {
                Some(job) => {
                    let status = Client::connect(ticket).await?.job(job).await?;
                    status.state.is_final().then(|| {
                        let event = FarmEvent::JobChanged {
                            job,
                            state: status.state,
                        };
                        let at = status.finished_unix_ms.unwrap_or(status.submitted_unix_ms);
                        crate::report::event_line(at, &event, json)
                    })
                }
                None => None,
            };
            anyhow::Ok((feed, finished))
        };
        let lost = match subscribed.await {
            Ok((_, Some(last))) => {
                println!("{last}");
                return Ok(exit::OK);
            }
            Ok((feed, None)) => {
                if lost_since.take().is_some() {
                    eprintln!("reconnected to the coordinator; events go on (those meanwhile were missed)");
                }
                backoff = reconnect_backoff();
                match crate::report::stream_events(feed, job, json).await {
                    crate::report::FeedEnd::Done => return Ok(exit::OK),
                    crate::report::FeedEnd::Lost(e) => e,
                }
            }
            // Only a coordinator out of reach is waited for; a wrong ticket
            // or an unknown job is said at once.
            Err(e) if exit::is_unreachable(&e) && lost_since.is_some() => e,
            Err(e) => return Err(e),
        };
        let since = match lost_since {
            Some(since) => since,
            None => {
                eprintln!("lost the coordinator's event feed ({lost:#}); reconnecting");
                *lost_since.insert(Instant::now())
            }
        };
        if since.elapsed() >= RECONNECT_FOR {
            return Err(lost.context(format!(
                "the coordinator did not come back within {} s",
                RECONNECT_FOR.as_secs()
            )));
        }
        tokio::time::sleep(backoff.next().unwrap_or(MAX_RECONNECT_WAIT)).await;
    }
}

/// The waits between attempts to reconnect: 200 ms doubling up to
/// [`MAX_RECONNECT_WAIT`], from the first again once reconnected.
fn reconnect_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(MAX_RECONNECT_WAIT)
        .without_max_times()
        .build()
}
