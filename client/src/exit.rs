//! The process exit codes scripts rely on (listed in the README), and how
//! an error becomes one: a lost or unreachable coordinator is told apart
//! from a job that failed, was canceled, or did not finish in time.

use tessera_protocol::codec::CodecError;
use tessera_protocol::messages::{ClientError, ErrorKind, JobState, JobStatus};
use tessera_transport::TransportError;

/// Success: the command did what it was asked; `wait` and `submit --wait`:
/// every job is done.
pub const OK: i32 = 0;
/// Any other error (bad input, a refused request, a file that cannot be
/// written), with a one-line reason on stderr.
pub const ERROR: i32 = 1;
/// Bad usage: unknown option, missing or malformed argument (clap's code).
pub const USAGE: i32 = 2;
/// `wait` / `submit --wait`: a job failed.
pub const FAILED: i32 = 3;
/// `wait` / `submit --wait`: a job was canceled (and none failed).
pub const CANCELED: i32 = 4;
/// `wait --timeout`: the time ran out before every job finished.
pub const TIMED_OUT: i32 = 5;
/// The coordinator could not be reached, or the connection was lost and
/// did not come back in time.
pub const UNREACHABLE: i32 = 6;

/// The exit code for jobs that are all final: the worst of them (failed
/// before canceled before done).
pub fn for_jobs<'a>(jobs: impl IntoIterator<Item = &'a JobStatus>) -> i32 {
    let mut code = OK;
    for j in jobs {
        code = match (j.state, code) {
            (JobState::Failed, _) => FAILED,
            (JobState::Canceled, c) if c != FAILED => CANCELED,
            (_, c) => c,
        };
    }
    code
}

/// The coordinator did not answer: the error behind [`UNREACHABLE`].
#[derive(Debug)]
pub struct Unreachable(pub String);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

/// Options that do not go together, or a value clap could not check: the
/// error behind [`USAGE`].
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A usage error as an `anyhow` error (exit code [`USAGE`]).
pub fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(message.into()))
}

/// Whether `e` says the coordinator is unreachable or the connection to it
/// was lost (as opposed to an answer that refused something).
pub fn is_unreachable(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        if cause.downcast_ref::<Unreachable>().is_some() {
            return true;
        }
        if let Some(t) = cause.downcast_ref::<TransportError>() {
            return matches!(t, TransportError::Connect { .. } | TransportError::Lost(_))
                || matches!(
                    t,
                    TransportError::Codec(CodecError::Closed | CodecError::Io(_))
                );
        }
        if let Some(c) = cause.downcast_ref::<CodecError>() {
            return matches!(c, CodecError::Closed | CodecError::Io(_));
        }
        cause.downcast_ref::<quinn::ConnectionError>().is_some()
            || cause.downcast_ref::<quinn::WriteError>().is_some()
            || cause.downcast_ref::<quinn::ReadError>().is_some()
    })
}

/// The exit code for a refusal by the coordinator, by its kind (never by
/// its words): each is a refused request, [`ERROR`]. `Unavailable` (the
/// farm cannot now: no worker to scan with) is not [`UNREACHABLE`]: the
/// coordinator answered.
pub fn for_refusal(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::NotFound
        | ErrorKind::Conflict
        | ErrorKind::Invalid
        | ErrorKind::Unauthorized
        | ErrorKind::Unavailable
        | ErrorKind::Internal => ERROR,
    }
}

/// The exit code for an error that ended a command.
pub fn for_error(e: &anyhow::Error) -> i32 {
    if e.chain().any(|c| c.downcast_ref::<Usage>().is_some()) {
        USAGE
    } else if is_unreachable(e) {
        UNREACHABLE
    } else if let Some(refusal) = e.chain().find_map(|c| c.downcast_ref::<ClientError>()) {
        for_refusal(refusal.kind)
    } else {
        ERROR
    }
}
