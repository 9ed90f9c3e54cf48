//! Client ⇄ coordinator: a [`ClientRequest`] on the control stream,
//! answered by one [`ClientResponse`]; errors carry an [`ErrorKind`].

use serde::{Deserialize, Serialize};

use super::*;
use crate::build::BuildInfo;
use crate::chunk::ChunkList;
use crate::job::JobSpec;
use crate::Digest;

/// Client → coordinator, on the control stream; each gets one response.
// A request is built once, sent and dropped (never stored in bulk): a
// `Submit`'s spec inline costs nothing that boxing it would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientRequest {
    /// Which of these blobs (whole files or chunks) does the coordinator lack?
    MissingBlobs(Vec<Digest>),
    /// Which files did these chunk lists (`ChunkList::id`) make here? A
    /// client names a large file by its chunk list. Answered by `Known`.
    KnownLists(Vec<Digest>),
    /// Store a large file by joining its chunks, all of them uploaded
    /// before; the coordinator hashes the joined file. Answered by
    /// `Assembled` with its digest.
    Assemble(ChunkList),
    Submit(JobSpec),
    /// One job, or every job when `None`.
    Status(Option<u64>),
    Cancel(u64),
    /// The stitched frames of a job so far.
    Frames(u64),
    /// The failed attempts of a job (of one task), with the renderer's log.
    Logs {
        job: u64,
        task: Option<u32>,
    },
    /// Turn this connection into a feed: a `Snapshot` now and regularly,
    /// and every `Event` as it happens. No further requests are read.
    Subscribe,
    /// Every tile of one frame of a job.
    Tiles {
        job: u64,
        frame: u32,
    },
    /// Stop (or resume) handing out a job's tasks; running ones finish.
    Pause {
        job: u64,
        paused: bool,
    },
    /// Ask a worker to finish its tasks and leave.
    Drain {
        worker: u64,
    },
    /// Collect garbage now: remove stored blobs no retained job uses.
    /// Answered by `Collected`.
    CollectGarbage,
    /// Record a Blender build: the digest of its `BuildManifest` blob, whose
    /// files were all uploaded before. Answered by `BuildAdded`.
    AddBuild(Digest),
    /// The Blender builds the coordinator holds. Answered by `Builds`.
    Builds,
    /// Revoke every worker enrolled under `name`: disconnected now, refused
    /// from then on. Answered by `Revoked`.
    RevokeWorker {
        name: String,
    },
    /// Replace both tickets' secrets: the old tickets are refused for new
    /// connections; enrolled workers keep their credentials. Answered by
    /// `Tickets`.
    RotateTickets,
    /// One page of `Status(None)`: jobs with ids above `after_job` and
    /// workers with ids above `after_worker`, each list as long as fits one
    /// page. Answered by `StatusPage`.
    StatusPage {
        after_job: u64,
        after_worker: u64,
    },
    /// One page of `Logs`: entries after the cursor `after` (0 first).
    /// Answered by `LogsPage`.
    LogsPage {
        job: u64,
        task: Option<u32>,
        after: u64,
    },
    /// One page of `Frames`: frames above `after` (all with `None`).
    /// Answered by `FramesPage`.
    FramesPage {
        job: u64,
        after: Option<u32>,
    },
    /// Scan an uploaded `.blend` on a worker whose Blender can read it
    /// (see [`CoordMsg::Scan`]). Answered by `Scanned`.
    Scan {
        blend: Digest,
        path: String,
        version: crate::blender::BlenderVersion,
    },
    /// Put a failed job back in the queue: the tasks without a result are
    /// rendered again. Answered by `Retried`.
    Retry(u64),
    /// One job in detail: its frames by state, its latest failed attempts
    /// and the workers rendering it or that rendered it. Answered by
    /// `JobDetail`.
    JobDetail(u64),
    /// One page of the jobs that match `filter`, with ids above `after`
    /// (0 first), oldest first. Answered by `JobsPage`.
    JobsPage {
        filter: JobFilter,
        after: u64,
    },
    /// The frames of a job stitched after the cursor `after` (0 first), in
    /// the order they were stitched: what `wait` polls, reading only what
    /// is new. Answered by `NewFrames`.
    NewFrames {
        job: u64,
        after: u64,
    },
    /// Give a queued or running job a new priority (higher goes first):
    /// its tasks not yet handed out are ranked by it. Added in version 20
    /// (a client sends it only to a coordinator of its own version or
    /// newer). Answered by `Prioritized`.
    SetPriority {
        job: u64,
        priority: i32,
    },
    /// A `tessera fleet run`'s nodes and billing, at each of its ticks:
    /// kept (the latest) for the dashboard. Added in version 20. Answered
    /// by `Done`.
    FleetReport(super::FleetReport),
}

/// Which jobs a `status` (or the HTTP API) lists. Every part that is given
/// must match; an empty filter matches every job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    /// Any of these states (every state when empty).
    pub states: Vec<JobState>,
    /// The job's name: exactly, or as a glob when it holds `*` or `?`
    /// (`sh0*`); case-sensitive.
    pub name: Option<String>,
    /// Submitted at or after this wall-clock time (unix ms).
    pub since_unix_ms: Option<u64>,
    /// Only these job ids (every id when empty).
    pub ids: Vec<u64>,
}

/// The most ids (and states) one [`JobFilter`] may name.
pub const MAX_FILTER_IDS: usize = 10_000;

impl JobFilter {
    /// Refuses a filter too large to be a reasonable question.
    pub fn check(&self) -> Result<(), String> {
        if self.ids.len() > MAX_FILTER_IDS || self.states.len() > MAX_FILTER_IDS {
            return Err(format!(
                "a status filter names at most {MAX_FILTER_IDS} job ids"
            ));
        }
        if self
            .name
            .as_ref()
            .is_some_and(|n| n.len() > crate::text::MAX_NAME * 4)
        {
            return Err(format!(
                "a name pattern is at most {} bytes",
                crate::text::MAX_NAME * 4
            ));
        }
        Ok(())
    }

    /// Whether a job of this state, name and submit time passes.
    pub fn matches(&self, id: u64, state: JobState, name: &str, submitted_unix_ms: u64) -> bool {
        (self.ids.is_empty() || self.ids.contains(&id))
            && (self.states.is_empty() || self.states.contains(&state))
            && self.since_unix_ms.is_none_or(|t| submitted_unix_ms >= t)
            && self.name.as_deref().is_none_or(|p| name_matches(p, name))
    }
}

/// `pattern` against `name`: `*` is any run of characters, `?` any one;
/// anything else is itself.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative glob with one backtrack point: linear in practice, and at
    // worst quadratic (bounded by the pattern's length cap).
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The most items one page carries; fewer when their encoding would pass
/// [`PAGE_BYTES`]. Every reply fits its frame: a list too long for one is
/// asked for page by page.
pub const PAGE_ITEMS: usize = 256;
/// The most bytes a page's items take encoded (a quarter of a frame).
pub const PAGE_BYTES: usize = crate::codec::MAX_FRAME as usize / 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClientResponse {
    Missing(Vec<Digest>),
    /// The file each asked chunk list made, in order, if any.
    Known(Vec<Option<Digest>>),
    /// The digest of the file an `Assemble` stored.
    Assembled(Digest),
    Submitted(JobStatus),
    Status {
        jobs: Vec<JobStatus>,
        workers: Vec<WorkerStatus>,
    },
    Canceled(JobStatus),
    Frames(Vec<FrameOutput>),
    Logs(Vec<TaskLog>),
    Snapshot(Snapshot),
    Event {
        unix_ms: u64,
        event: FarmEvent,
    },
    Tiles(Vec<TileStatus>),
    Collected(Collected),
    /// How many identities a `RevokeWorker` revoked, and how many
    /// connections it closed.
    Revoked {
        identities: u32,
        disconnected: u32,
    },
    /// The new tickets, as lines.
    Tickets {
        worker: String,
        client: String,
    },
    Done,
    /// The request was refused or failed: the kind says which (clients act
    /// on it, never on the words), the message says what to do.
    Error(ClientError),
    BuildAdded(BuildInfo),
    Builds(Vec<BuildInfo>),
    /// `more`: either list goes on past this page.
    StatusPage {
        jobs: Vec<JobStatus>,
        workers: Vec<WorkerStatus>,
        more: bool,
    },
    /// `next`: the cursor of the next page, if there is one.
    LogsPage {
        logs: Vec<TaskLog>,
        next: Option<u64>,
    },
    FramesPage {
        frames: Vec<FrameOutput>,
        next: Option<u32>,
    },
    /// A farm scan's JSON (unchecked beyond its size: the client bounds
    /// what it reads), and the worker that ran it.
    Scanned {
        worker: String,
        json: String,
    },
    JobDetail(Box<JobDetail>),
    Retried(JobStatus),
    /// `next`: ask again with `after: next` for more; `None`: that was all.
    JobsPage {
        jobs: Vec<JobStatus>,
        next: Option<u64>,
    },
    /// `next`: the cursor to ask with next (the one asked with when nothing
    /// is new); `more`: frames past this page are already waiting.
    NewFrames {
        frames: Vec<FrameOutput>,
        next: u64,
        more: bool,
    },
    /// The job with its new priority (see `ClientRequest::SetPriority`).
    Prioritized(JobStatus),
}

/// What kind of failure a client's request met. Both APIs carry it: QUIC in
/// [`ClientResponse::Error`], HTTP as the status code (404, 409, 400, 401,
/// 503, 500) and the error body's `kind`. Clients (the CLI's exit codes,
/// the Python client's exceptions) follow the kind, never the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorKind {
    /// No such job, worker, frame or build.
    NotFound,
    /// The job (or worker) is in a state that forbids the request: cancel
    /// of a finished job, retry of one that did not fail, a request id
    /// reused for another submit.
    Conflict,
    /// The request itself is wrong: a spec out of bounds, a file not
    /// uploaded, a hostile path.
    Invalid,
    /// A missing or wrong secret.
    Unauthorized,
    /// The farm cannot do it now, but may later: no worker to ask, one
    /// that left or did not answer in time. Asking again may succeed.
    Unavailable,
    /// The coordinator failed (its database, its store): not the client's
    /// doing.
    Internal,
}

impl ErrorKind {
    /// Every kind, in the order of the README's table.
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::NotFound,
        ErrorKind::Conflict,
        ErrorKind::Invalid,
        ErrorKind::Unauthorized,
        ErrorKind::Unavailable,
        ErrorKind::Internal,
    ];

    /// The kind as the HTTP API's error body names it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }

    /// The HTTP status code the API answers this kind with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::Conflict => 409,
            ErrorKind::Invalid => 400,
            ErrorKind::Unauthorized => 401,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A refused or failed client request: its [`ErrorKind`] and a one-line
/// message saying what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct ClientError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ClientError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ClientError {
        ClientError {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::NotFound, message)
    }

    pub fn conflict(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Conflict, message)
    }

    pub fn invalid(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Invalid, message)
    }

    pub fn unavailable(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> ClientError {
        ClientError::new(ErrorKind::Internal, message)
    }
}

/// The longest prefix of `items` that makes one page (at least one item):
/// at most [`PAGE_ITEMS`], their encoding within [`PAGE_BYTES`]. Returns it
/// and whether items were left out.
pub fn take_page<T: Serialize>(items: impl IntoIterator<Item = T>) -> (Vec<T>, bool) {
    let mut page = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        // Measured in the larger of the encodings (named fields).
        let len = crate::codec::encode_as(crate::codec::Codec::CURRENT, &item)
            .map_or(PAGE_BYTES, |b| b.len());
        if page.len() == PAGE_ITEMS || (!page.is_empty() && bytes + len > PAGE_BYTES) {
            return (page, true);
        }
        bytes += len;
        page.push(item);
    }
    (page, false)
}

/// What one garbage collection did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collected {
    pub removed_blobs: u64,
    pub removed_bytes: u64,
    pub kept_blobs: u64,
    pub kept_bytes: u64,
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn a_filter_matches_names_by_glob_and_every_part_it_gives() {
        for (pattern, name, ok) in [
            ("sh010", "sh010", true),
            ("sh010", "sh0100", false),
            ("sh0*", "sh020", true),
            ("*", "", true),
            ("sh0?0", "sh030", true),
            ("sh0?0", "sh03", false),
            ("*lighting*", "sh010-lighting-v2", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ] {
            assert_eq!(name_matches(pattern, name), ok, "{pattern} {name}");
        }
        let f = JobFilter {
            states: vec![JobState::Failed, JobState::Canceled],
            name: Some("sh*".into()),
            since_unix_ms: Some(1000),
            ids: vec![],
        };
        assert!(f.matches(1, JobState::Failed, "sh010", 1000));
        assert!(!f.matches(1, JobState::Done, "sh010", 1000));
        assert!(!f.matches(1, JobState::Failed, "env", 1000));
        assert!(!f.matches(1, JobState::Failed, "sh010", 999));
        assert!(JobFilter::default().matches(7, JobState::Queued, "x", 0));
        let ids = JobFilter {
            ids: vec![3, 5],
            ..Default::default()
        };
        assert!(ids.matches(5, JobState::Done, "x", 0) && !ids.matches(4, JobState::Done, "x", 0));
    }

    #[test]
    fn a_page_holds_at_most_its_items_and_bytes_and_never_nothing() {
        let (page, more) = take_page(0..PAGE_ITEMS as u32 + 1);
        assert_eq!((page.len(), more), (PAGE_ITEMS, true));
        let (page, more) = take_page(0..3u32);
        assert_eq!((page, more), (vec![0, 1, 2], false));
        // Items of a megabyte: four fill the page's bytes.
        let big = vec![vec![7u8; 1 << 20]; 10];
        let (page, more) = take_page(big.iter());
        assert!(more && page.len() < 4, "{}", page.len());
        // One item larger than a page still goes, alone.
        let huge = vec![vec![0u8; PAGE_BYTES + 1]; 2];
        let (page, more) = take_page(huge.iter());
        assert_eq!((page.len(), more), (1, true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error kind travels on the wire with its message, and maps to
    /// its own HTTP status and name.
    #[test]
    fn an_error_carries_its_kind_on_the_wire() {
        let mut statuses = std::collections::HashSet::new();
        let mut names = std::collections::HashSet::new();
        for kind in ErrorKind::ALL {
            let sent = ClientResponse::Error(ClientError::new(kind, format!("{kind} here")));
            let bytes = crate::codec::encode(&sent).unwrap();
            let got: ClientResponse = crate::codec::decode_frame(&bytes).unwrap();
            match got {
                ClientResponse::Error(e) => {
                    assert_eq!(
                        (e.kind, e.message.as_str()),
                        (kind, &*format!("{kind} here"))
                    )
                }
                other => panic!("{other:?}"),
            }
            assert!(statuses.insert(kind.http_status()), "{kind}");
            assert!(names.insert(kind.name()), "{kind}");
        }
        assert_eq!(
            ErrorKind::ALL.map(ErrorKind::http_status),
            [404, 409, 400, 401, 503, 500]
        );
    }
}
