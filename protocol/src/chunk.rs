//! Chunked files on the wire. A file of at least [`CHUNK_THRESHOLD`] bytes
//! travels as a [`Recipe`]: its whole-file digest and the ordered list of its
//! chunks (FastCDC 2020 cut points, blake3 of each chunk). Chunks are
//! ordinary blobs, so an edited file shares every chunk outside the edited
//! regions with its earlier version and only the changed chunks travel. The
//! chunker itself is `tessera_store::chunk`.

use serde::{Deserialize, Serialize};

use crate::Digest;

/// Files this large or larger are chunked; smaller ones travel whole.
pub const CHUNK_THRESHOLD: u64 = 1 << 20;
/// FastCDC bounds. Small chunks keep what an edit drags along small: an edit
/// of `n` bytes re-sends about `n` + 2 × the mean chunk (about 23 KiB). FastCDC
/// does not look for a cut in the first `MIN_CHUNK` bytes of a chunk, so a
/// minimum close to the average spares half of the cut-point work.
pub const MIN_CHUNK: usize = 12 * 1024;
pub const AVG_CHUNK: usize = 16 * 1024;
pub const MAX_CHUNK: usize = 64 * 1024;

/// One chunk of a file: its digest and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub digest: Digest,
    pub len: u32,
}

/// A large file as its client sees it: the ordered list of its chunks. The
/// client names the file by the list's [`ChunkList::id`] and leaves the
/// whole-file digest to the coordinator, which hashes the file anyway when it
/// joins the chunks (and so is the one to vouch for it). That spares every
/// submit a second BLAKE3 pass over its large files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkList {
    pub size: u64,
    pub chunks: Vec<ChunkRef>,
}

impl ChunkList {
    /// A digest of the list (sizes and chunk digests, in order): the same
    /// list, the same file.
    pub fn id(&self) -> Digest {
        list_id(self.size, &self.chunks)
    }

    /// Byte offset of every chunk, in order.
    pub fn offsets(&self) -> impl Iterator<Item = (u64, &ChunkRef)> {
        offsets(&self.chunks)
    }

    /// See [`Recipe::check`].
    pub fn check(&self) -> Result<(), String> {
        check(self.size, &self.chunks, &self.id())
    }
}

fn list_id(size: u64, chunks: &[ChunkRef]) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("tessera 2026-11 chunk list");
    h.update(&size.to_le_bytes());
    for c in chunks {
        h.update(&c.digest.0);
        h.update(&c.len.to_le_bytes());
    }
    Digest::from(h.finalize())
}

fn offsets(chunks: &[ChunkRef]) -> impl Iterator<Item = (u64, &ChunkRef)> {
    chunks.iter().scan(0u64, |at, c| {
        let start = *at;
        *at += u64::from(c.len);
        Some((start, c))
    })
}

/// The chunk lengths add up to `size` and respect the chunker's bounds (so a
/// list cannot name a huge "chunk"). `name` names the file in the error.
fn check(size: u64, chunks: &[ChunkRef], name: &Digest) -> Result<(), String> {
    if let Some(c) = chunks
        .iter()
        .find(|c| c.len == 0 || c.len as usize > MAX_CHUNK)
    {
        return Err(format!(
            "chunk {} of {name} has length {}, outside 1..={MAX_CHUNK}",
            c.digest, c.len
        ));
    }
    let total: u64 = chunks.iter().map(|c| u64::from(c.len)).sum();
    if total != size {
        return Err(format!(
            "the chunks of {name} add up to {total} bytes, not its size {size}"
        ));
    }
    Ok(())
}

/// A file as the ordered list of its chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recipe {
    /// blake3 of the whole file.
    pub digest: Digest,
    pub size: u64,
    pub chunks: Vec<ChunkRef>,
}

impl Recipe {
    /// Byte offset of every chunk, in order.
    pub fn offsets(&self) -> impl Iterator<Item = (u64, &ChunkRef)> {
        offsets(&self.chunks)
    }

    /// Checks that the chunk lengths add up to the file size and respect the
    /// chunker's bounds (so a recipe cannot name a huge "chunk").
    pub fn check(&self) -> Result<(), String> {
        check(self.size, &self.chunks, &self.digest)
    }

    /// The [`ChunkList::id`] of this file's chunks.
    pub fn list_id(&self) -> Digest {
        list_id(self.size, &self.chunks)
    }
}
