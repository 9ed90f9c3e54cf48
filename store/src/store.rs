//! A content-addressed blob store behind a trait: [`BlobStore`] is what the
//! coordinator needs of one (has, put, get, remove, list, chunk lists and
//! assembly); [`BlobDir`] on the local disk is the first implementation, and
//! [`Verified`] wraps any store to hash what it is given *and* what it
//! reads back, so a blob that rotted on disk is refused, never served.
//!
//! [`suite`] is one test suite that every implementation must pass; a
//! second store (object storage, later) only has to pass it too.

use std::time::SystemTime;

use crate::blob::{BlobDir, BlobError};
use tessera_protocol::chunk::{ChunkList, Recipe};
use tessera_protocol::Digest;

/// One stored blob, as listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBlob {
    pub digest: Digest,
    pub size: u64,
    /// When it was written (or last touched).
    pub written: SystemTime,
}

/// A content-addressed store. Every method may block: call it off the
/// async runtime for large blobs.
pub trait BlobStore: Send + Sync {
    /// The size of a stored blob, `None` when it is not stored.
    fn has(&self, digest: &Digest) -> Option<u64>;
    /// Stores `bytes` under `digest`; durable before it returns.
    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), BlobError>;
    /// A stored blob's bytes.
    fn get(&self, digest: &Digest) -> Result<Vec<u8>, BlobError>;
    /// Removes a blob (and what it was assembled from, if it was); removing
    /// what is not stored is not an error.
    fn remove(&self, digest: &Digest) -> Result<(), BlobError>;
    /// Every stored blob.
    fn list(&self) -> Result<Vec<StoredBlob>, BlobError>;
    /// Whether the blob is stored; if so, marks it as just written.
    fn touch(&self, digest: &Digest) -> bool;
    /// Joins a chunk list (its chunks all stored) into one blob, returning
    /// the whole file's digest.
    fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError>;
    /// The file a chunk list was joined into, if it is still stored.
    fn file_of_list(&self, list: &Digest) -> Option<Digest>;
    /// The chunks a stored file was assembled from, if it was.
    fn recipe(&self, file: &Digest) -> Option<Recipe>;
}

impl BlobStore for BlobDir {
    fn has(&self, digest: &Digest) -> Option<u64> {
        self.size(digest)
    }

    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), BlobError> {
        Ok(self.put_as(digest, bytes)?)
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, BlobError> {
        self.read(digest)
    }

    fn remove(&self, digest: &Digest) -> Result<(), BlobError> {
        Ok(BlobDir::remove(self, digest)?)
    }

    fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        Ok((BlobDir::list(self)?.into_iter())
            .map(|(digest, size, written)| StoredBlob {
                digest,
                size,
                written,
            })
            .collect())
    }

    fn touch(&self, digest: &Digest) -> bool {
        BlobDir::touch(self, digest)
    }

    fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError> {
        BlobDir::assemble_list(self, list)
    }

    fn file_of_list(&self, list: &Digest) -> Option<Digest> {
        BlobDir::file_of_list(self, list)
    }

    fn recipe(&self, file: &Digest) -> Option<Recipe> {
        BlobDir::recipe(self, file)
    }
}

/// A store that hashes every blob it is given before storing it and every
/// blob it reads before returning it: a mismatch is an error, so a
/// corrupted blob is refused, not served, and removed, so it is missing
/// rather than stored wrong.
#[derive(Debug, Clone)]
pub struct Verified<S> {
    inner: S,
}

impl<S: BlobStore> Verified<S> {
    pub fn new(inner: S) -> Verified<S> {
        Verified { inner }
    }

    /// The store underneath, for what streams bytes without holding them
    /// (blob streams, which verify as they receive).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Stores `bytes`, returning their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<Digest, BlobError> {
        let digest = Digest::of(bytes);
        if self.inner.has(&digest) != Some(bytes.len() as u64) {
            self.inner.put(&digest, bytes)?;
        }
        Ok(digest)
    }
}

fn check(expected: &Digest, bytes: &[u8]) -> Result<(), BlobError> {
    let actual = Digest::of(bytes);
    if actual != *expected {
        return Err(BlobError::Mismatch {
            expected: *expected,
            actual,
        });
    }
    Ok(())
}

impl<S: BlobStore> BlobStore for Verified<S> {
    fn has(&self, digest: &Digest) -> Option<u64> {
        self.inner.has(digest)
    }

    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), BlobError> {
        check(digest, bytes)?;
        self.inner.put(digest, bytes)
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, BlobError> {
        let bytes = self.inner.get(digest)?;
        if check(digest, &bytes).is_err() {
            // Rotted on disk: gone, so the store reports it missing and the
            // next submit (or worker) uploads it again.
            self.inner.remove(digest)?;
            return Err(BlobError::Corrupt(*digest));
        }
        Ok(bytes)
    }

    fn remove(&self, digest: &Digest) -> Result<(), BlobError> {
        self.inner.remove(digest)
    }

    fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        self.inner.list()
    }

    fn touch(&self, digest: &Digest) -> bool {
        self.inner.touch(digest)
    }

    fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError> {
        // The inner store hashes the joined file while joining; the digest
        // it returns is that hash.
        self.inner.assemble_list(list)
    }

    fn file_of_list(&self, list: &Digest) -> Option<Digest> {
        self.inner.file_of_list(list)
    }

    fn recipe(&self, file: &Digest) -> Option<Recipe> {
        self.inner.recipe(file)
    }
}

/// The behaviour every [`BlobStore`] must have. `store` must start empty.
/// Panics with what went wrong.
pub fn suite(store: &dyn BlobStore) {
    use crate::chunk::ChunkRef;

    let a = b"tile bytes".as_slice();
    let da = Digest::of(a);
    // Missing, then stored, read back, listed.
    assert_eq!(store.has(&da), None);
    assert!(matches!(store.get(&da), Err(BlobError::NotFound(d)) if d == da));
    assert!(!store.touch(&da));
    store.put(&da, a).expect("put");
    assert_eq!(store.has(&da), Some(a.len() as u64));
    assert_eq!(store.get(&da).expect("get"), a);
    assert!(store.touch(&da));
    // Putting the same blob again is fine.
    store.put(&da, a).expect("put again");
    let listed = store.list().expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].digest, listed[0].size), (da, a.len() as u64));
    // An empty blob is a blob.
    let de = Digest::of(b"");
    store.put(&de, b"").expect("put empty");
    assert_eq!(store.has(&de), Some(0));
    assert_eq!(store.get(&de).expect("get empty"), b"");
    // Chunks join into a file, verified while joining; the list is known
    // afterwards and the recipe kept.
    let chunks: Vec<&[u8]> = vec![b"first chunk, ", b"second chunk, ", b"third"];
    let mut refs = Vec::new();
    for c in &chunks {
        let d = Digest::of(c);
        store.put(&d, c).expect("put chunk");
        refs.push(ChunkRef {
            digest: d,
            len: c.len() as u32,
        });
    }
    let whole: Vec<u8> = chunks.concat();
    let list = ChunkList {
        size: whole.len() as u64,
        chunks: refs.clone(),
    };
    assert_eq!(store.file_of_list(&list.id()), None);
    let file = store.assemble_list(&list).expect("assemble");
    assert_eq!(file, Digest::of(&whole));
    assert_eq!(store.get(&file).expect("get file"), whole);
    assert_eq!(store.file_of_list(&list.id()), Some(file));
    let recipe = store.recipe(&file).expect("recipe kept");
    assert_eq!(recipe.chunks, refs);
    // A list naming a chunk that is not stored is refused, naming it.
    let missing = Digest::of(b"never stored");
    let bad = ChunkList {
        size: 12,
        chunks: vec![ChunkRef {
            digest: missing,
            len: 12,
        }],
    };
    let err = store.assemble_list(&bad).expect_err("missing chunk");
    assert!(err.to_string().contains(&missing.to_string()), "{err}");
    // Removing forgets the blob and its recipe; removing again is fine.
    store.remove(&file).expect("remove");
    assert_eq!(store.has(&file), None);
    assert_eq!(store.recipe(&file), None);
    assert_eq!(store.file_of_list(&list.id()), None);
    store.remove(&file).expect("remove again");
    store.remove(&da).expect("remove a");
    let left: Vec<Digest> = (store.list().expect("list").into_iter())
        .map(|b| b.digest)
        .collect();
    assert!(!left.contains(&da) && !left.contains(&file), "{left:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempdir::Dir, BlobDir) {
        let d = tempdir::Dir::new();
        let store = BlobDir::open_durable(d.path().join("blobs")).expect("open");
        (d, store)
    }

    #[test]
    fn the_suite_passes_on_the_filesystem_store() {
        let (_d, store) = dir();
        suite(&store);
    }

    #[test]
    fn the_suite_passes_on_the_verified_filesystem_store() {
        let (_d, store) = dir();
        suite(&Verified::new(store));
    }

    #[test]
    fn a_corrupted_stored_blob_is_refused_on_read_not_served() {
        let (_d, dir) = dir();
        let store = Verified::new(dir.clone());
        let digest = store.put_bytes(b"a frame's pixels").expect("put");
        // The disk flips a byte under the store.
        let path = dir.path(&digest);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[3] ^= 0x40;
        std::fs::write(&path, &bytes).expect("corrupt");
        let err = store.get(&digest).expect_err("corrupt blob refused");
        assert!(matches!(err, BlobError::Corrupt(d) if d == digest), "{err}");
        assert!(err.to_string().contains("corrupt"), "{err}");
        // Removed: missing now, so the next upload of it stores it again.
        assert_eq!(store.has(&digest), None);
        store.put_bytes(b"a frame's pixels").expect("put again");
        assert_eq!(store.get(&digest).expect("get"), b"a frame's pixels");
    }

    #[test]
    fn a_put_whose_bytes_do_not_match_the_digest_stores_nothing() {
        let (_d, dir) = dir();
        let store = Verified::new(dir);
        let claimed = Digest::of(b"what it says");
        let err = store.put(&claimed, b"what it is").expect_err("mismatch");
        assert!(matches!(err, BlobError::Mismatch { expected, .. } if expected == claimed));
        assert_eq!(store.has(&claimed), None);
    }

    #[test]
    fn an_unsynced_blob_is_synced_later_and_a_missing_one_is_an_error() {
        let (_d, dir) = dir();
        let digest = Digest::of(b"a worker's inline output");
        dir.put_unsynced(&digest, b"a worker's inline output")
            .expect("put");
        dir.sync(&[digest]).expect("sync");
        assert_eq!(
            Verified::new(dir.clone()).get(&digest).expect("get"),
            b"a worker's inline output"
        );
        assert!(dir.sync(&[Digest::of(b"never stored")]).is_err());
        // Many at once (one file-system sync), and one missing among many.
        let mut many: Vec<Digest> = (0..12u8)
            .map(|i| {
                let d = Digest::of(&[i; 100]);
                dir.put_unsynced(&d, &[i; 100]).expect("put");
                d
            })
            .collect();
        dir.sync(&many).expect("sync many");
        many.push(Digest::of(b"never stored"));
        assert!(dir.sync(&many).is_err());
        // Remembered as synced, a blob is not synced again; one removed is
        // forgotten.
        dir.sync_remembered(&many[..3]).expect("remembered");
        dir.remove(&many[0]).expect("remove");
        assert!(
            dir.sync_remembered(&many[..3]).is_err(),
            "removed, so synced again and missing"
        );
    }

    #[test]
    fn a_durable_store_keeps_what_it_stored_across_reopening() {
        let (d, dir) = dir();
        let digest = Verified::new(dir).put_bytes(b"kept").expect("put");
        let again = Verified::new(BlobDir::open_durable(d.path().join("blobs")).expect("reopen"));
        assert_eq!(again.get(&digest).expect("get"), b"kept");
    }

    /// A temporary folder removed on drop (no extra dependency).
    mod tempdir {
        use std::path::{Path, PathBuf};

        pub struct Dir(PathBuf);

        impl Dir {
            pub fn new() -> Dir {
                let tag: u64 = rand::random();
                let p = std::env::temp_dir().join(format!("tessera-store-{tag:016x}"));
                std::fs::create_dir_all(&p).expect("temp dir");
                Dir(p)
            }

            pub fn path(&self) -> &Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }
}
