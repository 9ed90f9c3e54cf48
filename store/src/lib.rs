//! Content-addressed storage: the [`BlobStore`] trait, the blob folder
//! ([`blob::BlobDir`]) behind it, the [`Verified`] decorator that re-hashes
//! what it is given, the chunker that cuts large files into the
//! recipes the wire carries, and the size-capped [`Lru`] index a cache evicts
//! by. The coordinator's asset store and a worker's cache are both blob
//! folders behind the trait.

pub mod blob;
pub mod chunk;
pub mod lru;
pub mod store;

pub use lru::Lru;
pub use store::{BlobStore, StoredBlob, Verified};
