//! Content-defined chunking of large files into the [`Recipe`]s the wire
//! carries. [`chunk_file`] reads a file once and does all the work on a block
//! of it (cut points, chunk digests, the block's part of the whole-file
//! digest) on one of several threads, so ingest on two or more cores runs at
//! about the speed of plain single-threaded blake3 or faster.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use blake3::hazmat::{
    merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};

pub use tessera_protocol::chunk::{
    ChunkList, ChunkRef, Recipe, AVG_CHUNK, CHUNK_THRESHOLD, MAX_CHUNK, MIN_CHUNK,
};
use tessera_protocol::Digest;

/// How much of the file one thread reads and works on at a time. A power of
/// two, so that each block is a subtree of the file's BLAKE3 tree; 2 MiB
/// stays in cache while it is cut and hashed, and the `MAX_CHUNK` bytes read
/// past its end add 3 %.
const BLOCK: usize = 2 << 20;
/// Chunks in-memory bytes in one pass on this thread: the reference that
/// [`chunk_at`] must agree with.
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
struct Window<'a> {
    index: usize,
    /// File offset of `data[0]`.
    offset: u64,
    data: &'a [u8],
    block_len: usize,
    /// The file ends inside this window.
    last: bool,
}

impl Window<'_> {
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
        fastcdc::v2020::FastCDC::new(self.data, MIN_CHUNK, AVG_CHUNK, MAX_CHUNK)
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

/// What one window contributes to the whole-file digest.
enum Subtree {
    /// The window is the whole file: its digest.
    Whole(Digest),
    /// The chaining value of the window's block as a subtree of the file's
    /// BLAKE3 tree.
    Part(ChainingValue),
}

/// Hashes a window's block as its part of the whole file's BLAKE3 tree.
/// Every block but the last is `BLOCK` bytes, a power of two at an offset
/// that is a multiple of it, so each is one complete subtree of the file's
/// tree and the digest can be put together from the blocks' chaining values
/// ([`whole_digest`]) instead of a second pass over the file.
fn subtree(w: &Window) -> Subtree {
    let block = &w.data[..w.block_len];
    if w.index == 0 && w.last {
        return Subtree::Whole(Digest::from(blake3::hash(block)));
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset(w.offset);
    h.update(block);
    Subtree::Part(h.finalize_non_root())
}

/// The whole-file digest from the chaining values of its blocks, in order
/// (at least two), merged the way BLAKE3 splits its input: the left subtree
/// holds the largest power of two of blocks that leaves the right one not
/// empty.
fn whole_digest(parts: &[ChainingValue]) -> Digest {
    fn split(n: usize) -> usize {
        1 << (usize::BITS - 1 - (n - 1).leading_zeros())
    }
    fn merge(parts: &[ChainingValue]) -> ChainingValue {
        if let [one] = parts {
            return *one;
        }
        let (left, right) = parts.split_at(split(parts.len()));
        merge_subtrees_non_root(&merge(left), &merge(right), Mode::Hash)
    }
    let (left, right) = parts.split_at(split(parts.len()));
    Digest::from(merge_subtrees_root(&merge(left), &merge(right), Mode::Hash))
}

/// Bytes that can be read at any offset from several threads at once: a
/// file (positional reads) or bytes in memory.
pub trait ReadAt: Sync {
    /// Reads up to `buf.len()` bytes at `offset`; 0 at or past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
}

#[cfg(unix)]
impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let start = usize::try_from(offset).map_or(self.len(), |o| o.min(self.len()));
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

/// Fills `buf` from `offset` on, short only at the end of `src`.
fn read_full(src: &(impl ReadAt + ?Sized), buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// What a thread made of one block: its chunks and its part of the
/// whole-file digest.
struct Part {
    index: usize,
    last: bool,
    chunks: Vec<ChunkRef>,
    subtree: Option<Subtree>,
}

/// Reads `src` to its end and returns its recipe. `threads` threads each
/// take the next block of the file, read it (with the `MAX_CHUNK` bytes
/// after it) at its offset, cut it independently, hash it as a subtree of
/// the whole file's BLAKE3 tree, stitch its cuts to the previous block's
/// last chunk (which gives exactly the one-pass cut points) and hash its
/// chunks. All the work on a block happens on one thread while the block is
/// in that core's cache, and nothing waits on a single reading thread.
pub fn chunk_at(src: &(impl ReadAt + ?Sized), threads: usize) -> std::io::Result<Recipe> {
    let (size, chunks, digest) = cut_and_hash(src, threads, true)?;
    Ok(Recipe {
        digest: digest.expect("asked for the whole-file digest"),
        size,
        chunks,
    })
}

/// [`chunk_at`] without the whole-file digest: what a client sends.
pub fn list_at(src: &(impl ReadAt + ?Sized), threads: usize) -> std::io::Result<ChunkList> {
    let (size, chunks, _) = cut_and_hash(src, threads, false)?;
    Ok(ChunkList { size, chunks })
}

/// Size, chunks and (when `whole`) the whole-file digest of `src`.
fn cut_and_hash(
    src: &(impl ReadAt + ?Sized),
    threads: usize,
    whole: bool,
) -> std::io::Result<(u64, Vec<ChunkRef>, Option<Digest>)> {
    let next = AtomicUsize::new(0);
    // The first block index past the end of the file, once known.
    let end = AtomicUsize::new(usize::MAX);
    // (next block allowed to stitch, where the previous chunk ended, a
    // thread failed and the rest should stop)
    let seam = (Mutex::new((0usize, 0u64, false)), Condvar::new());
    let fail = |seam: &(Mutex<(usize, u64, bool)>, Condvar)| {
        seam.0.lock().expect("seam").2 = true;
        seam.1.notify_all();
    };
    let work = || -> std::io::Result<Vec<Part>> {
        let mut parts = Vec::new();
        let mut buf = vec![0u8; BLOCK + MAX_CHUNK];
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            if index >= end.load(Ordering::Relaxed) {
                return Ok(parts);
            }
            let offset = index as u64 * BLOCK as u64;
            let n = match read_full(src, &mut buf, offset) {
                Ok(n) => n,
                Err(e) => {
                    fail(&seam);
                    return Err(e);
                }
            };
            if n == 0 && index > 0 {
                end.fetch_min(index, Ordering::Relaxed);
                return Ok(parts);
            }
            let last = n <= BLOCK;
            if last {
                end.fetch_min(index + 1, Ordering::Relaxed);
            }
            let w = Window {
                index,
                offset,
                data: &buf[..n],
                block_len: n.min(BLOCK),
                last,
            };
            let independent = w.independent_cuts();
            let subtree = whole.then(|| subtree(&w));
            let cuts = {
                let (lock, ready) = &seam;
                let mut state = lock.lock().expect("seam");
                while state.0 != index && !state.2 {
                    state = ready.wait(state).expect("seam");
                }
                if state.2 {
                    return Ok(parts);
                }
                let start = (state.1 - offset) as usize;
                let cuts = w.true_cuts(start, independent);
                let end = cuts
                    .last()
                    .map_or(state.1, |&(s, l)| offset + (s + l) as u64);
                *state = (index + 1, end, false);
                ready.notify_all();
                cuts
            };
            let chunks = cuts
                .iter()
                .map(|&(start, len)| ChunkRef {
                    digest: Digest::from(blake3::hash(&w.data[start..start + len])),
                    len: len as u32,
                })
                .collect();
            parts.push(Part {
                index,
                last,
                chunks,
                subtree,
            });
        }
    };
    let mut parts = Vec::new();
    std::thread::scope(|s| -> std::io::Result<()> {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(work)).collect();
        for h in handles {
            parts.extend(h.join().expect("chunk thread")?);
        }
        Ok(())
    })?;
    parts.sort_by_key(|p| p.index);
    // A file that shrank while it was read can leave blocks past the one
    // that saw the end; the recipe ends there (and will not match what the
    // coordinator assembles, so it is refused there, not trusted).
    if let Some(last) = parts.iter().position(|p| p.last) {
        parts.truncate(last + 1);
    }
    let mut size = 0u64;
    let mut chunks = Vec::new();
    let mut cvs = Vec::with_capacity(parts.len());
    let mut digest = None;
    for (i, part) in parts.into_iter().enumerate() {
        debug_assert_eq!(i, part.index, "blocks are contiguous");
        size += part.chunks.iter().map(|c| u64::from(c.len)).sum::<u64>();
        chunks.extend(part.chunks);
        match part.subtree {
            Some(Subtree::Whole(d)) => digest = Some(d),
            Some(Subtree::Part(cv)) => cvs.push(cv),
            None => {}
        }
    }
    if whole && digest.is_none() {
        digest = Some(whole_digest(&cvs));
    }
    Ok((size, chunks, digest))
}

/// The recipe of the file at `path`, hashed on every available core.
pub fn chunk_file(path: &Path) -> std::io::Result<Recipe> {
    chunk_at(&std::fs::File::open(path)?, cores())
}

/// The chunk list of the file at `path` (no whole-file digest), on every
/// available core: what `submit` computes for a large file.
pub fn list_file(path: &Path) -> std::io::Result<ChunkList> {
    list_at(&std::fs::File::open(path)?, cores())
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
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
                let got = chunk_at(&data[..], threads).unwrap();
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
    fn the_whole_file_digest_put_together_from_blocks_is_blake3_of_the_file() {
        // Block counts whose BLAKE3 trees are shaped differently: one block,
        // powers of two, one more than a power of two, a short last block.
        let data = noise(9 * BLOCK + 1, 77);
        for len in [
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            3 * BLOCK,
            4 * BLOCK,
            4 * BLOCK + 1024,
            5 * BLOCK + 1,
            7 * BLOCK + 999,
            8 * BLOCK,
            9 * BLOCK + 1,
        ] {
            let got = chunk_at(&data[..len], 2).unwrap();
            assert_eq!(got.digest, Digest::of(&data[..len]), "{len} bytes");
            assert_eq!(got.size, len as u64);
            got.check().unwrap();
        }
    }

    #[test]
    fn a_read_error_part_way_is_returned_and_no_thread_is_left_waiting() {
        /// Fails every read that reaches into its third block.
        struct Failing(Vec<u8>);
        impl ReadAt for Failing {
            fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
                if offset + buf.len() as u64 > 2 * BLOCK as u64 + 1 {
                    return Err(std::io::Error::other("disk went away"));
                }
                self.0[..].read_at(buf, offset)
            }
        }
        let src = Failing(noise(6 * BLOCK, 5));
        for threads in [1, 2, 4] {
            let err = chunk_at(&src, threads).unwrap_err();
            assert_eq!(err.to_string(), "disk went away");
        }
    }

    #[test]
    fn a_chunk_list_is_the_recipe_without_the_whole_file_digest() {
        let data = noise(5 * BLOCK + 4321, 8);
        let recipe = chunk_at(&data[..], 2).unwrap();
        let list = list_at(&data[..], 2).unwrap();
        assert_eq!((list.size, &list.chunks), (recipe.size, &recipe.chunks));
        assert_eq!(list.id(), recipe.list_id());
        list.check().unwrap();
        // One chunk changed, or the same chunks in another order: another id.
        let mut other = list.clone();
        other.chunks.swap(0, 1);
        assert_ne!(other.id(), list.id());
        let mut edited = data.clone();
        edited[BLOCK] ^= 1;
        assert_ne!(list_at(&edited[..], 2).unwrap().id(), list.id());
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
        let r = chunk_at(&b""[..], 2).unwrap();
        assert_eq!((r.size, r.chunks.len()), (0, 0));
        let r = chunk_at(&b"abc"[..], 2).unwrap();
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
