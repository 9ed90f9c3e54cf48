//! The worker cache behind the store crate's [`BlobStore`] trait, like the
//! coordinator's blob folder: what is put goes into the [`Lru`] index under
//! the cap (evicting the least recently used unpinned blobs to make room),
//! what is read counts as used, and only what the index holds is listed or
//! served. A blob a running task has pinned is not removed. The store
//! crate's `suite` checks it (`cache/tests.rs`).

use std::io;

use tessera_protocol::chunk::{ChunkList, Recipe};
use tessera_store::blob::BlobError;
use tessera_store::{BlobStore, StoredBlob};

use super::*;

impl Cache {
    fn holds(&self, digest: &Digest) -> bool {
        self.state().lru.contains(digest)
    }
}

impl BlobStore for Cache {
    fn has(&self, digest: &Digest) -> Option<u64> {
        self.holds(digest)
            .then(|| self.blobs.size(digest))
            .flatten()
    }

    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), BlobError> {
        if self.has(digest) == Some(bytes.len() as u64) {
            self.state().lru.touch(digest);
            return Ok(());
        }
        let size = bytes.len() as u64;
        self.reserve(size, &format!("blob {digest}"))
            .map_err(|e| io::Error::new(io::ErrorKind::StorageFull, format!("{e:#}")))?;
        let stored = self.blobs.put_as(digest, bytes);
        self.unreserve(size);
        stored?;
        self.insert(*digest, size);
        Ok(())
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, BlobError> {
        if !self.holds(digest) {
            return Err(BlobError::NotFound(*digest));
        }
        let bytes = self.blobs.read(digest)?;
        self.state().lru.touch(digest);
        Ok(bytes)
    }

    fn remove(&self, digest: &Digest) -> Result<(), BlobError> {
        let mut state = self.state();
        if state.lru.is_pinned(digest) {
            return Err(BlobError::Refused {
                digest: *digest,
                reason: "a running task uses it; it is removed once the task ends".into(),
            });
        }
        self.blobs.remove(digest)?;
        if state.lru.contains(digest) {
            state.lru.remove(digest);
            state.removed.push(*digest);
        }
        state.chunks.retain(|_, at| at.file != *digest);
        state.stamps.remove(digest);
        Ok(())
    }

    fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        let listed = self.blobs.list()?;
        let state = self.state();
        Ok((listed.into_iter())
            .filter(|(digest, _, _)| state.lru.contains(digest))
            .map(|(digest, size, written)| StoredBlob {
                digest,
                size,
                written,
            })
            .collect())
    }

    fn touch(&self, digest: &Digest) -> bool {
        if !self.holds(digest) || !self.blobs.touch(digest) {
            return false;
        }
        self.state().lru.touch(digest);
        true
    }

    fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError> {
        self.reserve(list.size, "an assembled file")
            .map_err(|e| io::Error::new(io::ErrorKind::StorageFull, format!("{e:#}")))?;
        let file = self.blobs.assemble_list(list);
        self.unreserve(list.size);
        let file = file?;
        if !self.holds(&file) {
            self.insert(file, list.size);
        }
        if let Some(recipe) = self.blobs.recipe(&file) {
            index_chunks(&mut self.state().chunks, &recipe);
        }
        Ok(file)
    }

    fn file_of_list(&self, list: &Digest) -> Option<Digest> {
        (self.blobs.file_of_list(list)).filter(|file| self.holds(file))
    }

    fn recipe(&self, file: &Digest) -> Option<Recipe> {
        self.holds(file).then(|| self.blobs.recipe(file)).flatten()
    }
}
