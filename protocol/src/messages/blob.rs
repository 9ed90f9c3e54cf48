//! The first frame of each blob stream ([`BlobRequest`]) and the
//! receiver's answer ([`BlobReply`]); the blob's bytes follow raw.

use serde::{Deserialize, Serialize};

use crate::chunk::Recipe;
use crate::Digest;

/// First frame of a blob stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BlobRequest {
    /// `len` raw bytes follow; the receiver re-hashes them.
    Put { digest: Digest, len: u64 },
    /// `job`: the job a worker fetches it for (counted as that job's
    /// bytes sent to workers).
    Get { digest: Digest, job: Option<u64> },
    /// The chunks of a large file, so a worker fetches only the chunks it
    /// lacks (and a cut download resumes).
    Recipe { digest: Digest },
    /// Several blobs on one stream (at most [`MAX_GET_MANY`]), answered in
    /// order: each `Found` with its bytes, or `NotFound`; a `Refused` one
    /// ends the stream. Chunks are small (16 KiB on average): one stream
    /// and round trip per chunk would hold a fetch on a long path to a few
    /// chunks per round trip.
    GetMany {
        digests: Vec<Digest>,
        job: Option<u64>,
    },
    /// Where a worker fetches these blobs itself, from the farm's object
    /// store (at most [`MAX_GET_MANY`]): answered in order, each `At` or
    /// `NotFound`; a `Refused` one ends the stream. Sent only to a
    /// coordinator whose [`crate::messages::CoordMsg::Joined`] said
    /// `store_urls`.
    Locate {
        digests: Vec<Digest>,
        job: Option<u64>,
    },
}

/// The most blobs one [`BlobRequest::GetMany`] names.
pub const MAX_GET_MANY: usize = 256;

/// The receiver's answer on a blob stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum BlobReply {
    Stored,
    Refused {
        reason: String,
    },
    /// `len` raw bytes follow.
    Found {
        len: u64,
    },
    Recipe(Recipe),
    NotFound,
    /// The blob's `len` bytes are at `url`, an HTTP GET (byte ranges
    /// allowed) that needs no credentials until it expires, minutes later.
    At {
        url: String,
        len: u64,
    },
}
