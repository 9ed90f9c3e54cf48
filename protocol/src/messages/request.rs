//! Requests paired with their responses by type: each typed request below
//! becomes one [`ClientRequest`] and is answered by one variant of
//! [`ClientResponse`], which [`Request::response`] takes apart. A caller
//! asks with a typed request and gets its typed answer, or the
//! [`ClientError`] (with its [`super::ErrorKind`]) the coordinator refused
//! it with, never a response meant for another request.

use super::{
    ClientError, ClientRequest, ClientResponse, Collected, FrameOutput, JobDetail, JobStatus,
    TileStatus,
};
use crate::build::BuildInfo;
use crate::chunk::ChunkList;
use crate::job::JobSpec;
use crate::Digest;

/// A client request whose answer has a type of its own.
pub trait Request: Into<ClientRequest> {
    /// What the coordinator answers it with.
    type Response;

    /// The answer carried by `response`, or `None` when the coordinator
    /// answered with a variant meant for another request.
    fn response(response: ClientResponse) -> Option<Self::Response>;
}

/// How a typed request went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The coordinator refused or failed it, with a kind.
    #[error(transparent)]
    Refused(#[from] ClientError),
    /// It answered with a response of another request (a coordinator bug,
    /// or a peer that does not speak this protocol).
    #[error("unexpected reply {0}")]
    Unexpected(String),
}

/// Takes apart `response`, the answer to a request of type `R`.
pub fn answer<R: Request>(response: ClientResponse) -> Result<R::Response, AnswerError> {
    match response {
        ClientResponse::Error(e) => Err(AnswerError::Refused(e)),
        other => {
            let shown = format!("{other:?}");
            R::response(other)
                .ok_or_else(|| AnswerError::Unexpected(crate::text::truncate(&shown, 200)))
        }
    }
}

/// Declares typed requests: `Name(fields) => ClientRequest::Variant(..)
/// answered by ClientResponse::Variant(..) as Type`.
macro_rules! requests {
    ($(
        $(#[$doc:meta])*
        $name:ident $(( $($field:ident : $ty:ty),* ))? => $req:expr,
        $resp:pat => $value:expr, $out:ty;
    )*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name { $($(pub $field: $ty),*)? }

        impl From<$name> for ClientRequest {
            #[allow(unused_variables)]
            fn from(r: $name) -> ClientRequest {
                let $name { $($($field),*)? } = r;
                $req
            }
        }

        impl Request for $name {
            type Response = $out;
            fn response(response: ClientResponse) -> Option<$out> {
                match response {
                    $resp => Some($value),
                    _ => None,
                }
            }
        }
    )*};
}

requests! {
    /// Which of these blobs the coordinator lacks.
    MissingBlobs(digests: Vec<Digest>) => ClientRequest::MissingBlobs(digests),
        ClientResponse::Missing(d) => d, Vec<Digest>;
    /// The files these chunk lists made, if any.
    KnownLists(ids: Vec<Digest>) => ClientRequest::KnownLists(ids),
        ClientResponse::Known(d) => d, Vec<Option<Digest>>;
    /// Join uploaded chunks into one stored file: its digest.
    Assemble(list: ChunkList) => ClientRequest::Assemble(list),
        ClientResponse::Assembled(d) => d, Digest;
    /// A new job.
    Submit(spec: JobSpec) => ClientRequest::Submit(spec),
        ClientResponse::Submitted(s) => s, JobStatus;
    /// Cancel a job.
    Cancel(job: u64) => ClientRequest::Cancel(job),
        ClientResponse::Canceled(s) => s, JobStatus;
    /// Put a failed job back in the queue.
    Retry(job: u64) => ClientRequest::Retry(job),
        ClientResponse::Retried(s) => s, JobStatus;
    /// One job in detail.
    Detail(job: u64) => ClientRequest::JobDetail(job),
        ClientResponse::JobDetail(d) => *d, JobDetail;
    /// The stitched frames of a job.
    Frames(job: u64) => ClientRequest::Frames(job),
        ClientResponse::Frames(f) => f, Vec<FrameOutput>;
    /// Every tile of one frame.
    Tiles(job: u64, frame: u32) => ClientRequest::Tiles { job, frame },
        ClientResponse::Tiles(t) => t, Vec<TileStatus>;
    /// Stop or resume handing out a job's tasks.
    Pause(job: u64, paused: bool) => ClientRequest::Pause { job, paused },
        ClientResponse::Done => (), ();
    /// Ask a worker to drain.
    Drain(worker: u64) => ClientRequest::Drain { worker },
        ClientResponse::Done => (), ();
    /// Collect garbage now.
    CollectGarbage => ClientRequest::CollectGarbage,
        ClientResponse::Collected(c) => c, Collected;
    /// Record a Blender build.
    AddBuild(manifest: Digest) => ClientRequest::AddBuild(manifest),
        ClientResponse::BuildAdded(b) => b, BuildInfo;
    /// The stored Blender builds.
    Builds => ClientRequest::Builds,
        ClientResponse::Builds(b) => b, Vec<BuildInfo>;
    /// Revoke every worker enrolled under `name`: (identities, disconnected).
    RevokeWorker(name: String) => ClientRequest::RevokeWorker { name },
        ClientResponse::Revoked { identities, disconnected } => (identities, disconnected), (u32, u32);
    /// New ticket secrets: (worker ticket, client ticket).
    RotateTickets => ClientRequest::RotateTickets,
        ClientResponse::Tickets { worker, client } => (worker, client), (String, String);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_takes_its_own_answer_and_an_error_with_its_kind() {
        let req: ClientRequest = Cancel { job: 3 }.into();
        assert!(matches!(req, ClientRequest::Cancel(3)));
        assert_eq!(answer::<Pause>(ClientResponse::Done), Ok(()));
        let refused = ClientError::conflict("job 3 is done");
        assert_eq!(
            answer::<Cancel>(ClientResponse::Error(refused.clone())).unwrap_err(),
            AnswerError::Refused(refused)
        );
        let wrong = answer::<Cancel>(ClientResponse::Done).unwrap_err();
        assert!(matches!(wrong, AnswerError::Unexpected(s) if s == "Done"));
    }
}
