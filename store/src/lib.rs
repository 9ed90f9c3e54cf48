//! Content-addressed storage: the [`BlobStore`] trait, the blob folder
//! ([`blob::BlobDir`]) behind it, the [`Verified`] decorator that re-hashes
//! what it is given, the chunker that cuts large files into the
//! recipes the wire carries, and the size-capped [`Lru`] index a cache evicts
//! by. The coordinator's asset store and a worker's cache are both blob
//! folders behind the trait; with the `s3` feature, the coordinator's folder
//! may stand in front of a bucket of an S3-compatible object store
//! ([`Backed`]).

#[cfg(feature = "s3")]
pub mod backed;
pub mod blob;
pub mod chunk;
pub mod lru;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(feature = "s3")]
pub mod scratch_garage;
pub mod store;

#[cfg(feature = "s3")]
pub use backed::Backed;
pub use lru::Lru;
pub use store::{BlobStore, StoredBlob, Verified};
