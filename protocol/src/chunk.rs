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
/// How much of the file is read at a time; blocks are chunked in parallel.
const BLOCK: usize = 4 * 1024 * 1024;

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

/// Chunks in-memory bytes in one pass on this thread: the reference that
/// [`chunk_reader`] must agree with.
pub fn chunk_bytes(data: &[u8]) -> Recipe {
    let chunks = fastcdc::v2020::FastCDC::new(data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
        .map(|c| ChunkRef {
            digest: Digest::of(&data[c.offset..c.offset + c.length]),
            len: c.length as u32,
        })
        .collect();
    Recipe {
        digest: Digest::of(data),
        size: data.len() as u64,
        chunks,
    }
}

/// One block of the file plus the first `MAX_CHUNK` bytes after it, so that
/// every chunk starting in the block can be cut from the window alone.
struct Window {
    index: usize,
    /// File offset of `data[0]`.
    offset: u64,
    data: Vec<u8>,
    block_len: usize,
    /// The file ends inside this window.
    last: bool,
}

impl Window {
    /// Chunks may start below this position.
    fn limit(&self) -> usize {
        if self.last {
            self.data.len()
        } else {
            self.block_len
        }
    }

    /// Chunks as if the file's chunking restarted at this block: (start,
    /// length) for every chunk starting below `limit`.
    fn independent_cuts(&self) -> Vec<(usize, usize)> {
        let limit = self.limit();
        fastcdc::v2020::FastCDC::new(&self.data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
            .take_while(|c| c.offset < limit)
            .map(|c| (c.offset, c.length))
            .collect()
    }

    /// The file's true chunks starting in this block, given that the
    /// previous block's last chunk ended at `start` (relative to the window).
    /// Cuts from `start` one at a time until they meet a cut of the
    /// independent chunking, from where the two agree (a cut depends only on
    /// the bytes from its chunk's start).
    fn true_cuts(&self, start: usize, independent: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
        if start == 0 {
            return independent;
        }
        let limit = self.limit();
        let mut out = Vec::new();
        let mut at = start;
        while at < limit {
            if let Ok(i) = independent.binary_search_by_key(&at, |&(s, _)| s) {
                out.extend_from_slice(&independent[i..]);
                return out;
            }
            let c = fastcdc::v2020::FastCDC::new(&self.data[at..], MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
                .next()
                .expect("bytes remain after `at`");
            out.push((at, c.length));
            at += c.length;
        }
        out
    }
}

/// Reads `src` to its end and returns its recipe. Windows of the file are
/// chunked and hashed on `threads` threads at once (each block is cut
/// independently, then stitched to the previous block's last cut, which
/// gives exactly the one-pass cut points) while one more thread hashes the
/// whole file. The whole-file hash is the lighter half of the work, so the
/// chunk threads share its core once it is done with a window rather than
/// leave that core idle.
pub fn chunk_reader(mut src: impl Read, threads: usize) -> std::io::Result<Recipe> {
    let workers = threads.max(1);
    std::thread::scope(|s| {
        let (whole_tx, whole_rx) = mpsc::sync_channel::<Arc<Window>>(workers + 2);
        let whole = s.spawn(move || {
            let mut h = blake3::Hasher::new();
            for w in whole_rx {
                h.update(&w.data[..w.block_len]);
            }
            Digest::from(h.finalize())
        });
        let (work_tx, work_rx) = mpsc::sync_channel::<Arc<Window>>(workers);
        let work_rx = Arc::new(Mutex::new(work_rx));
        // (next window allowed to stitch, where the previous chunk ended)
        let seam = Arc::new((Mutex::new((0usize, 0u64)), std::sync::Condvar::new()));
        let (done_tx, done_rx) = mpsc::channel::<(usize, Vec<ChunkRef>)>();
        for _ in 0..workers {
            let (work_rx, done_tx, seam) = (work_rx.clone(), done_tx.clone(), seam.clone());
            s.spawn(move || loop {
                let next = work_rx.lock().expect("chunk work queue").recv();
                let Ok(w) = next else { return };
                let independent = w.independent_cuts();
                let cuts = {
                    let (lock, ready) = &*seam;
                    let mut state = lock.lock().expect("seam");
                    while state.0 != w.index {
                        state = ready.wait(state).expect("seam");
                    }
                    let start = (state.1 - w.offset) as usize;
                    let cuts = w.true_cuts(start, independent);
                    let end = cuts
                        .last()
                        .map_or(state.1, |&(s, l)| w.offset + (s + l) as u64);
                    *state = (w.index + 1, end);
                    ready.notify_all();
                    cuts
                };
                let refs = cuts
                    .iter()
                    .map(|&(start, len)| ChunkRef {
                        digest: Digest::from(blake3::hash(&w.data[start..start + len])),
                        len: len as u32,
                    })
                    .collect();
                if done_tx.send((w.index, refs)).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);

        let read_block = |src: &mut dyn Read| -> std::io::Result<Vec<u8>> {
            let mut block = Vec::with_capacity(BLOCK + MAX_CHUNK);
            src.take(BLOCK as u64).read_to_end(&mut block)?;
            Ok(block)
        };
        let mut size = 0u64;
        let read_result = (|| -> std::io::Result<()> {
            let mut current = read_block(&mut src)?;
            let mut index = 0;
            loop {
                let next = if current.len() < BLOCK {
                    Vec::new()
                } else {
                    read_block(&mut src)?
                };
                let block_len = current.len();
                let last = next.is_empty();
                current.extend_from_slice(&next[..next.len().min(MAX_CHUNK)]);
                let w = Arc::new(Window {
                    index,
                    offset: size,
                    data: current,
                    block_len,
                    last,
                });
                size += block_len as u64;
                index += 1;
                let _ = whole_tx.send(w.clone());
                let _ = work_tx.send(w);
                if last {
                    return Ok(());
                }
                current = next;
            }
        })();
        drop(whole_tx);
        drop(work_tx);
        let mut parts: Vec<(usize, Vec<ChunkRef>)> = done_rx.into_iter().collect();
        parts.sort_by_key(|p| p.0);
        let digest = whole.join().expect("whole-file hasher");
        read_result?;
        Ok(Recipe {
            digest,
            size,
            chunks: parts.into_iter().flat_map(|p| p.1).collect(),
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
        // Several blocks (each cut on its own, then stitched), a tail that is
        // not a whole block, an exact number of blocks, and a tail shorter
        // than the largest chunk.
        for len in [3 * BLOCK + 123_457, 2 * BLOCK, 2 * BLOCK + 1000] {
            let data = noise(len, len as u64);
            let expected = chunk_bytes(&data);
            assert_eq!(expected.digest, Digest::of(&data));
            expected.check().unwrap();
            for threads in [1, 2, 5] {
                let got = chunk_reader(&data[..], threads).unwrap();
                assert_eq!(got, expected, "{threads} threads, {len} bytes");
            }
            let mean = data.len() / expected.chunks.len();
            assert!(
                (AVG_CHUNK / 2..AVG_CHUNK * 2).contains(&mean),
                "mean chunk {mean}"
            );
        }
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
