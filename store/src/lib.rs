//! Content-addressed storage: the [`BlobStore`] trait, the blob folder
//! ([`blob::BlobDir`]) behind it, the [`Verified`] decorator that re-hashes
//! what it is given, and the chunker that cuts large files into the
//! recipes the wire carries. The coordinator's asset store and a worker's
//! cache are both blob folders.

pub mod blob;
pub mod chunk;
pub mod store;

pub use store::{BlobStore, StoredBlob, Verified};
