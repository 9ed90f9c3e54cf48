//! Content-defined chunking for large files. A file of at least
//! [`CHUNK_THRESHOLD`] bytes travels as a [`Recipe`]: its whole-file digest
//! and the ordered list of its chunks (FastCDC 2020 cut points, blake3 of each
//! chunk). Chunks are ordinary blobs, so an edited file shares every chunk
//! outside the edited regions with its earlier version and only the changed
//! chunks travel.
//!
//! [`chunk_file`] reads a file once and hashes it on several threads: one
//! thread computes the whole-file digest while the others hash chunks, so
//! ingest runs at close to the speed of plain blake3.

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::Digest;

/// Files this large or larger are chunked; smaller ones travel whole.
pub const CHUNK_THRESHOLD: u64 = 1 << 20;
/// FastCDC bounds. Small chunks keep what an edit drags along small; an edit
/// of `n` bytes re-sends about `n` + 1.5 × `AVG_CHUNK` bytes.
pub const MIN_CHUNK: usize = 4 * 1024;
pub const AVG_CHUNK: usize = 16 * 1024;
pub const MAX_CHUNK: usize = 64 * 1024;
/// How much of the file is read at a time.
const BLOCK: usize = 8 * 1024 * 1024;

/// One chunk of a file: its digest and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub digest: Digest,
    pub len: u32,
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
        self.chunks.iter().scan(0u64, |at, c| {
            let start = *at;
            *at += u64::from(c.len);
            Some((start, c))
        })
    }

    /// Checks that the chunk lengths add up to the file size and respect the
    /// chunker's bounds (so a recipe cannot name a huge "chunk").
    pub fn check(&self) -> Result<(), String> {
        if let Some(c) = self
            .chunks
            .iter()
            .find(|c| c.len == 0 || c.len as usize > MAX_CHUNK)
        {
            return Err(format!(
                "chunk {} of {} has length {}, outside 1..={MAX_CHUNK}",
                c.digest, self.digest, c.len
            ));
        }
        let total: u64 = self.chunks.iter().map(|c| u64::from(c.len)).sum();
        if total != self.size {
            return Err(format!(
                "the chunks of {} add up to {total} bytes, not its size {}",
                self.digest, self.size
            ));
        }
        Ok(())
    }
}

/// Cut points of `data`: the lengths of its chunks. When `eof` is false, the
/// tail whose cut could still depend on bytes not yet read is left out: a
/// chunk is only cut once `MAX_CHUNK` bytes past its start are known, so the
/// cut points do not depend on how the file was read.
fn cut(data: &[u8], eof: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(data.len() / AVG_CHUNK + 1);
    for c in fastcdc::v2020::FastCDC::new(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK) {
        if !eof && data.len() - c.offset < MAX_CHUNK {
            break;
        }
        out.push((c.offset, c.length));
    }
    out
}

/// Chunks in-memory bytes (tests and small inputs).
pub fn chunk_bytes(data: &[u8]) -> Recipe {
    let chunks = cut(data, true)
        .into_iter()
        .map(|(start, len)| ChunkRef {
            digest: Digest::of(&data[start..start + len]),
            len: len as u32,
        })
        .collect();
    Recipe {
        digest: Digest::of(data),
        size: data.len() as u64,
        chunks,
    }
}

/// Reads `src` to its end and returns its recipe, hashing on up to
/// `threads` threads (at least 2: the whole-file hash runs beside the
/// chunker).
pub fn chunk_reader(mut src: impl Read, threads: usize) -> std::io::Result<Recipe> {
    let hashers = threads.saturating_sub(1).max(1);
    type Batch = (Arc<Vec<u8>>, usize, Vec<(usize, usize)>);
    std::thread::scope(|s| {
        let (whole_tx, whole_rx) = mpsc::sync_channel::<Arc<Vec<u8>>>(4);
        let whole = s.spawn(move || {
            let mut h = blake3::Hasher::new();
            for block in whole_rx {
                h.update(&block);
            }
            Digest::from(h.finalize())
        });
        let (work_tx, work_rx) = mpsc::sync_channel::<Batch>(hashers * 2);
        let work_rx = Arc::new(Mutex::new(work_rx));
        let (done_tx, done_rx) = mpsc::channel::<Vec<(usize, ChunkRef)>>();
        for _ in 0..hashers {
            let (work_rx, done_tx) = (work_rx.clone(), done_tx.clone());
            s.spawn(move || loop {
                let next = work_rx.lock().expect("chunk work queue").recv();
                let Ok((buf, first, cuts)) = next else { return };
                let refs = cuts
                    .iter()
                    .enumerate()
                    .map(|(i, &(start, len))| {
                        let digest = Digest::from(blake3::hash(&buf[start..start + len]));
                        (
                            first + i,
                            ChunkRef {
                                digest,
                                len: len as u32,
                            },
                        )
                    })
                    .collect();
                if done_tx.send(refs).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);

        let mut size = 0u64;
        let mut count = 0usize;
        let mut carry: Vec<u8> = Vec::new();
        let read_result = (|| -> std::io::Result<()> {
            loop {
                let mut block = vec![0u8; BLOCK];
                let mut filled = 0;
                while filled < BLOCK {
                    match src.read(&mut block[filled..]) {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                block.truncate(filled);
                let eof = filled < BLOCK;
                size += filled as u64;
                let mut window = std::mem::take(&mut carry);
                if window.is_empty() {
                    window = block.clone();
                } else {
                    window.extend_from_slice(&block);
                }
                let _ = whole_tx.send(Arc::new(block));
                let cuts = cut(&window, eof);
                let used = cuts.last().map_or(0, |&(s, l)| s + l);
                carry = window[used..].to_vec();
                let window = Arc::new(window);
                let per = cuts.len().div_ceil(hashers).max(1);
                for part in cuts.chunks(per) {
                    let n = part.len();
                    let _ = work_tx.send((window.clone(), count, part.to_vec()));
                    count += n;
                }
                if eof {
                    return Ok(());
                }
            }
        })();
        drop(whole_tx);
        drop(work_tx);
        let mut chunks = vec![
            ChunkRef {
                digest: Digest::of(b""),
                len: 0
            };
            count
        ];
        for batch in done_rx {
            for (i, c) in batch {
                chunks[i] = c;
            }
        }
        let digest = whole.join().expect("whole-file hasher");
        read_result?;
        Ok(Recipe {
            digest,
            size,
            chunks,
        })
    })
}

/// The recipe of the file at `path`, hashed on every available core.
pub fn chunk_file(path: &Path) -> std::io::Result<Recipe> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    chunk_reader(std::fs::File::open(path)?, threads)
}

/// What kind of compression a file starts with, if any: compressed scene
/// files change throughout when edited, so chunking cannot find shared parts.
pub fn compression(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some("zstd")
    } else if head.starts_with(&[0x1f, 0x8b]) {
        Some("gzip")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes that do not repeat (xorshift).
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(len);
        out
    }

    #[test]
    fn threaded_reader_matches_in_memory_chunking() {
        // Several read blocks, a tail that is not a whole block.
        let data = noise(3 * BLOCK + 123_457, 7);
        let expected = chunk_bytes(&data);
        assert_eq!(expected.digest, Digest::of(&data));
        expected.check().unwrap();
        for threads in [1, 2, 5] {
            let got = chunk_reader(&data[..], threads).unwrap();
            assert_eq!(got, expected, "{threads} threads");
        }
        let mean = data.len() / expected.chunks.len();
        assert!(
            (AVG_CHUNK / 2..AVG_CHUNK * 2).contains(&mean),
            "mean chunk {mean}"
        );
    }

    #[test]
    fn an_edit_changes_only_nearby_chunks() {
        let data = noise(8 << 20, 3);
        let mut edited = data.clone();
        for b in &mut edited[4_000_000..4_010_000] {
            *b ^= 0x5a;
        }
        // An insertion shifts everything after it: chunks resynchronise.
        edited.splice(6_000_000..6_000_000, noise(777, 9));
        let a = chunk_bytes(&data);
        let b = chunk_bytes(&edited);
        let old: std::collections::HashSet<_> = a.chunks.iter().map(|c| c.digest).collect();
        let new_bytes: u64 = b
            .chunks
            .iter()
            .filter(|c| !old.contains(&c.digest))
            .map(|c| u64::from(c.len))
            .sum();
        assert!(new_bytes > 10_000, "the edit must show: {new_bytes}");
        assert!(
            new_bytes < 10_777 + 6 * MAX_CHUNK as u64,
            "{new_bytes} new bytes for a 10 kB edit and a 777 B insertion"
        );
    }

    #[test]
    fn empty_and_tiny_inputs() {
        let r = chunk_reader(&b""[..], 2).unwrap();
        assert_eq!((r.size, r.chunks.len()), (0, 0));
        let r = chunk_reader(&b"abc"[..], 2).unwrap();
        assert_eq!(r.chunks.len(), 1);
        assert_eq!(r.chunks[0].digest, Digest::of(b"abc"));
    }

    #[test]
    fn recipe_check_refuses_lies() {
        let mut r = chunk_bytes(&noise(300_000, 1));
        r.check().unwrap();
        r.size += 1;
        assert!(r.check().unwrap_err().contains("add up to"));
        r.size -= 1;
        r.chunks[0].len = 1 << 30;
        assert!(r.check().unwrap_err().contains("outside"));
    }

    #[test]
    fn compressed_files_are_recognised() {
        assert_eq!(compression(&[0x28, 0xb5, 0x2f, 0xfd, 0]), Some("zstd"));
        assert_eq!(compression(&[0x1f, 0x8b, 8]), Some("gzip"));
        assert_eq!(compression(b"BLENDER-v300"), None);
    }
}
