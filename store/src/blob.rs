//! Blobs: a folder of files named by their digest, written only through a
//! verifying writer that re-hashes every byte. The blob streams that carry
//! them over QUIC are `tessera_transport::blob`.
//!
//! Both the coordinator's asset store and a worker's cache are a [`BlobDir`].

use std::path::{Path, PathBuf};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use tessera_protocol::chunk::{ChunkList, Recipe};
use tessera_protocol::codec::CodecError;
use tessera_protocol::Digest;

/// The largest blob either side accepts.
pub const MAX_BLOB: u64 = 1 << 40;
pub const BLOCK: usize = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("blob {expected} does not match its digest: the bytes hash to {actual}; not stored")]
    Mismatch { expected: Digest, actual: Digest },
    #[error("blob {digest} was cut short: expected {expected} bytes, got {got}")]
    Short {
        digest: Digest,
        expected: u64,
        got: u64,
    },
    #[error("blob {digest} of {len} bytes exceeds the limit of {MAX_BLOB} bytes")]
    TooLarge { digest: Digest, len: u64 },
    #[error("blob {0} not found")]
    NotFound(Digest),
    #[error(
        "stored blob {0} is corrupt: its bytes no longer hash to its digest; it was not served"
    )]
    Corrupt(Digest),
    #[error("cannot assemble {file}: {reason}")]
    Recipe { file: Digest, reason: String },
    #[error("the receiver refused blob {digest}: {reason}")]
    Refused { digest: Digest, reason: String },
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("connection lost: {0}")]
    Lost(String),
    #[error("blob store i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A folder of blobs: `ROOT/ab/abcdef…`, temporary files under `ROOT/tmp`.
#[derive(Debug, Clone)]
pub struct BlobDir {
    root: PathBuf,
    /// Each stored blob's file and folder are fsynced before the store
    /// says it is stored (the coordinator's store; a worker's cache can
    /// always fetch again and skips it).
    durable: bool,
    /// Blobs known to be on disk for good (synced, or written durably), so
    /// a job naming them again does not sync them again. Bounded: emptied
    /// when it reaches [`MAX_KNOWN_SYNCED`].
    synced: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<Digest>>>,
}

/// Most digests [`BlobDir`] remembers as synced.
const MAX_KNOWN_SYNCED: usize = 1 << 14;

impl BlobDir {
    /// A store whose writes are not fsynced (a cache).
    pub fn open(root: impl Into<PathBuf>) -> std::io::Result<BlobDir> {
        let root = root.into();
        std::fs::create_dir_all(root.join("tmp"))?;
        Ok(BlobDir {
            root,
            durable: false,
            synced: Default::default(),
        })
    }

    /// A store whose every write is durable before it returns: the file is
    /// fsynced before it is renamed into place and its folder after.
    pub fn open_durable(root: impl Into<PathBuf>) -> std::io::Result<BlobDir> {
        let mut dir = BlobDir::open(root)?;
        dir.durable = true;
        Ok(dir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.to_hex();
        self.root.join(&hex[..2]).join(hex)
    }

    /// The size of a stored blob, if present.
    pub fn size(&self, digest: &Digest) -> Option<u64> {
        std::fs::metadata(self.path(digest))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.size(digest).is_some()
    }

    /// Whether the blob is stored; if so, marks it as just written, so that
    /// garbage collection's grace period protects it until the submit that
    /// relies on it arrives.
    pub fn touch(&self, digest: &Digest) -> bool {
        std::fs::File::options()
            .write(true)
            .open(self.path(digest))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()))
            .is_ok()
    }

    fn temp_path(&self, digest: &Digest) -> PathBuf {
        use rand::Rng;
        let tag: u64 = rand::rng().random();
        self.root
            .join("tmp")
            .join(format!("{}.{tag:016x}", digest.to_hex()))
    }

    /// Moves a complete temporary file into place; in a durable store the
    /// file is synced first and its folder after.
    fn commit(&self, temp: &Path, digest: &Digest) -> std::io::Result<()> {
        self.commit_synced(temp, digest, self.durable)
    }

    fn commit_synced(&self, temp: &Path, digest: &Digest, sync: bool) -> std::io::Result<()> {
        let dest = self.path(digest);
        let parent = dest.parent().expect("blob paths have a parent");
        std::fs::create_dir_all(parent)?;
        if sync {
            std::fs::File::open(temp)?.sync_all()?;
        }
        std::fs::rename(temp, &dest)?;
        if sync {
            std::fs::File::open(parent)?.sync_all()?;
        }
        Ok(())
    }

    /// Makes stored blobs durable: each file is synced, then each folder
    /// holding one, once (or, for many, the whole file system once). For
    /// blobs stored with [`BlobDir::put_unsynced`] or [`BlobDir::receive`],
    /// before anything that relies on them is acknowledged (a result's
    /// commit).
    pub fn sync(&self, digests: &[Digest]) -> std::io::Result<()> {
        self.sync_files(digests)
    }

    /// [`BlobDir::sync`] for blobs that are named again and again (a job's
    /// files, submitted with every job that uses them): those it synced
    /// before are remembered, up to a bound, and not synced again.
    pub fn sync_remembered(&self, digests: &[Digest]) -> std::io::Result<()> {
        let known = |d: &Digest| self.synced.lock().expect("synced lock").contains(d);
        let digests: Vec<Digest> = digests.iter().filter(|d| !known(d)).copied().collect();
        self.sync_files(&digests)?;
        let mut synced = self.synced.lock().expect("synced lock");
        if synced.len() + digests.len() > MAX_KNOWN_SYNCED {
            synced.clear();
        }
        synced.extend(digests);
        Ok(())
    }

    fn sync_files(&self, digests: &[Digest]) -> std::io::Result<()> {
        if digests.is_empty() {
            return Ok(());
        }
        // Many at once: one `syncfs` of the store's file system writes
        // them all (and their folders) in one journal commit, where a sync
        // per file would commit once each. Each must exist, as with a sync
        // per file.
        #[cfg(target_os = "linux")]
        if digests.len() >= SYNCFS_FROM {
            if let Some(d) = digests.iter().find(|d| !self.contains(d)) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("blob {d} is not stored"),
                ));
            }
            return syncfs(&self.root);
        }
        let files: Vec<PathBuf> = digests.iter().map(|d| self.path(d)).collect();
        let folders: std::collections::BTreeSet<PathBuf> = (files.iter())
            .map(|p| p.parent().expect("blob paths have a parent").to_path_buf())
            .collect();
        sync_paths(&files)?;
        sync_paths(&folders.into_iter().collect::<Vec<_>>())
    }

    /// Stores `bytes` under `digest` without hashing or syncing them: the
    /// caller has checked the digest and calls [`BlobDir::sync`] before
    /// relying on them.
    pub fn put_unsynced(&self, digest: &Digest, bytes: &[u8]) -> std::io::Result<()> {
        if self.size(digest) != Some(bytes.len() as u64) {
            let temp = self.temp_path(digest);
            std::fs::write(&temp, bytes)?;
            self.commit_synced(&temp, digest, false)?;
        }
        Ok(())
    }

    /// Stores `bytes`, returning their digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> std::io::Result<Digest> {
        let digest = Digest::of(bytes);
        self.put_as(&digest, bytes)?;
        Ok(digest)
    }

    /// Stores `bytes` under `digest` without hashing them: the caller
    /// vouches for the digest (see [`crate::store::Verified`]).
    pub fn put_as(&self, digest: &Digest, bytes: &[u8]) -> std::io::Result<()> {
        if self.size(digest) != Some(bytes.len() as u64) {
            let temp = self.temp_path(digest);
            std::fs::write(&temp, bytes)?;
            self.commit(&temp, digest)?;
        }
        Ok(())
    }

    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, BlobError> {
        std::fs::read(self.path(digest)).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BlobError::NotFound(*digest),
            _ => BlobError::Io(e),
        })
    }

    /// Stores the file a recipe describes by joining its chunks, which must
    /// all be in this store already. The joined bytes are re-hashed; a
    /// mismatch leaves nothing behind. Blocking: call it off the runtime.
    pub fn assemble(&self, recipe: &Recipe) -> Result<(), BlobError> {
        self.assemble_from(recipe, self)
    }

    /// Moves the file at `path` (on this store's file system) into the
    /// store as `digest` once it hashes to it (blocking: call it off the
    /// runtime). On a mismatch the file is left where it is and nothing is
    /// stored.
    pub fn adopt(&self, path: &Path, digest: &Digest) -> Result<(), BlobError> {
        let (actual, len) = Digest::of_reader(std::fs::File::open(path)?)?;
        if len > MAX_BLOB {
            return Err(BlobError::TooLarge {
                digest: *digest,
                len,
            });
        }
        if actual != *digest {
            return Err(BlobError::Mismatch {
                expected: *digest,
                actual,
            });
        }
        self.commit(path, digest)?;
        Ok(())
    }

    /// [`BlobDir::assemble`] with the chunks in another store.
    pub fn assemble_from(&self, recipe: &Recipe, chunks: &BlobDir) -> Result<(), BlobError> {
        let file = recipe.digest;
        recipe
            .check()
            .map_err(|reason| BlobError::Recipe { file, reason })?;
        if self.contains(&file) {
            return Ok(());
        }
        let (temp, actual) = self.join(file, recipe.size, &recipe.chunks, chunks)?;
        if actual != file {
            let _ = std::fs::remove_file(&temp);
            return Err(BlobError::Mismatch {
                expected: file,
                actual,
            });
        }
        self.commit(&temp, &file)?;
        self.keep_recipe(recipe)?;
        Ok(())
    }

    /// Joins checked `chunks` (all in the store `from`) into a temporary
    /// file, hashing them as it writes; returns the file and its digest.
    /// `name` names the file in errors. On an error nothing is left behind.
    fn join(
        &self,
        name: Digest,
        size: u64,
        chunks: &[tessera_protocol::chunk::ChunkRef],
        from: &BlobDir,
    ) -> Result<(PathBuf, Digest), BlobError> {
        use std::io::Write;
        if size > MAX_BLOB {
            return Err(BlobError::TooLarge {
                digest: name,
                len: size,
            });
        }
        if let Some(c) = chunks
            .iter()
            .find(|c| from.size(&c.digest) != Some(u64::from(c.len)))
        {
            return Err(BlobError::Recipe {
                file: name,
                reason: format!("chunk {} is not stored; upload it first", c.digest),
            });
        }
        let temp = self.temp_path(&name);
        let joined = (|| -> Result<Digest, BlobError> {
            let mut out = std::io::BufWriter::with_capacity(BLOCK, std::fs::File::create(&temp)?);
            let mut hasher = blake3::Hasher::new();
            for c in chunks {
                let bytes = from.read(&c.digest)?;
                hasher.update(&bytes);
                out.write_all(&bytes)?;
            }
            out.flush()?;
            Ok(Digest::from(hasher.finalize()))
        })();
        match joined {
            Ok(digest) => Ok((temp, digest)),
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                Err(e)
            }
        }
    }

    fn recipe_path(&self, file: &Digest) -> PathBuf {
        self.root.join("recipes").join(file.to_hex())
    }

    fn list_path(&self, list: &Digest) -> PathBuf {
        self.root.join("lists").join(list.to_hex())
    }

    /// Remembers which chunks make up `recipe.digest` (so garbage collection
    /// keeps a retained file's chunks for the next edit of it, and a cache
    /// knows where in its files each chunk lies), and which file its chunk
    /// list makes (so a client naming the list learns it).
    pub fn keep_recipe(&self, recipe: &Recipe) -> std::io::Result<()> {
        let path = self.recipe_path(&recipe.digest);
        std::fs::create_dir_all(path.parent().expect("recipes folder"))?;
        let bytes = tessera_protocol::codec::encode(recipe).map_err(std::io::Error::other)?;
        let temp = self.temp_path(&recipe.digest);
        std::fs::write(&temp, bytes)?;
        std::fs::rename(temp, path)?;
        let list = self.list_path(&recipe.list_id());
        std::fs::create_dir_all(list.parent().expect("lists folder"))?;
        let temp = self.temp_path(&recipe.digest);
        std::fs::write(&temp, recipe.digest.to_hex())?;
        std::fs::rename(temp, list)
    }

    /// The file that the chunk list `list` (a [`ChunkList::id`]) was joined
    /// into here, if it is still stored; marks it as just written, like
    /// [`BlobDir::touch`].
    pub fn file_of_list(&self, list: &Digest) -> Option<Digest> {
        let hex = std::fs::read_to_string(self.list_path(list)).ok()?;
        let file: Digest = hex.trim().parse().ok()?;
        self.touch(&file).then_some(file)
    }

    /// Stores the file a client's chunk list describes by joining its
    /// chunks (all in this store already) and returns the file's digest,
    /// computed here while joining. A list joined before is not joined
    /// again. Blocking: call it off the runtime.
    pub fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError> {
        let id = list.id();
        list.check()
            .map_err(|reason| BlobError::Recipe { file: id, reason })?;
        if let Some(file) = self.file_of_list(&id) {
            return Ok(file);
        }
        let (temp, file) = self.join(id, list.size, &list.chunks, self)?;
        if self.contains(&file) {
            std::fs::remove_file(&temp)?;
        } else {
            self.commit(&temp, &file)?;
        }
        self.keep_recipe(&Recipe {
            digest: file,
            size: list.size,
            chunks: list.chunks.clone(),
        })?;
        Ok(file)
    }

    /// The chunks of a file stored by [`BlobDir::assemble`], if it was.
    pub fn recipe(&self, file: &Digest) -> Option<Recipe> {
        let bytes = std::fs::read(self.recipe_path(file)).ok()?;
        tessera_protocol::codec::decode_frame(&bytes).ok()
    }

    /// Every stored blob: digest, size and when it was written.
    pub fn list(&self) -> std::io::Result<Vec<(Digest, u64, std::time::SystemTime)>> {
        let mut out = Vec::new();
        for sub in std::fs::read_dir(&self.root)?.flatten() {
            let name = sub.file_name();
            if name.len() != 2 || !sub.path().is_dir() {
                continue;
            }
            for f in std::fs::read_dir(sub.path())?.flatten() {
                let Ok(digest) = f.file_name().to_string_lossy().parse::<Digest>() else {
                    continue;
                };
                let meta = f.metadata()?;
                out.push((digest, meta.len(), meta.modified()?));
            }
        }
        Ok(out)
    }

    /// Removes a blob (and its recipe, if it has one). A reader that has it
    /// open keeps reading it.
    pub fn remove(&self, digest: &Digest) -> std::io::Result<()> {
        self.synced.lock().expect("synced lock").remove(digest);
        if let Some(recipe) = self.recipe(digest) {
            let _ = std::fs::remove_file(self.list_path(&recipe.list_id()));
        }
        let _ = std::fs::remove_file(self.recipe_path(digest));
        match std::fs::remove_file(self.path(digest)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Reads exactly `len` bytes from `src` into the store, hashing as it
    /// writes. A mismatch leaves nothing behind. Not synced, even in a
    /// durable store: whoever relies on the blob calls [`BlobDir::sync`].
    pub async fn receive<R: AsyncRead + Unpin>(
        &self,
        digest: Digest,
        len: u64,
        src: &mut R,
    ) -> Result<(), BlobError> {
        if len > MAX_BLOB {
            return Err(BlobError::TooLarge { digest, len });
        }
        let temp = self.temp_path(&digest);
        let result = self.receive_into(&temp, digest, len, src).await;
        match result {
            Ok(()) => Ok(self.commit_synced(&temp, &digest, false)?),
            Err(e) => {
                let _ = tokio::fs::remove_file(&temp).await;
                Err(e)
            }
        }
    }

    async fn receive_into<R: AsyncRead + Unpin>(
        &self,
        temp: &Path,
        digest: Digest,
        len: u64,
        src: &mut R,
    ) -> Result<(), BlobError> {
        if len <= BLOCK as u64 {
            return self.receive_small(temp, digest, len as usize, src).await;
        }
        let mut file = tokio::fs::File::create(temp).await?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; BLOCK];
        let mut got = 0u64;
        while got < len {
            let want = (len - got).min(BLOCK as u64) as usize;
            let n = src.read(&mut buf[..want]).await?;
            if n == 0 {
                return Err(BlobError::Short {
                    digest,
                    expected: len,
                    got,
                });
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n]).await?;
            got += n as u64;
        }
        let actual = Digest::from(hasher.finalize());
        if actual != digest {
            return Err(BlobError::Mismatch {
                expected: digest,
                actual,
            });
        }
        file.flush().await?;
        Ok(())
    }

    /// [`BlobDir::receive_into`] for a blob of at most one block (a chunk):
    /// read whole, checked, and written in one step off the runtime, rather
    /// than a block buffer and a blocking-pool trip per write.
    async fn receive_small<R: AsyncRead + Unpin>(
        &self,
        temp: &Path,
        digest: Digest,
        len: usize,
        src: &mut R,
    ) -> Result<(), BlobError> {
        let mut bytes = vec![0u8; len];
        let mut got = 0;
        while got < len {
            let n = src.read(&mut bytes[got..]).await?;
            if n == 0 {
                return Err(BlobError::Short {
                    digest,
                    expected: len as u64,
                    got: got as u64,
                });
            }
            got += n;
        }
        let actual = Digest::of(&bytes);
        if actual != digest {
            return Err(BlobError::Mismatch {
                expected: digest,
                actual,
            });
        }
        let temp = temp.to_path_buf();
        tokio::task::spawn_blocking(move || std::fs::write(temp, bytes))
            .await
            .map_err(std::io::Error::other)??;
        Ok(())
    }
}

/// Most threads [`BlobDir::sync`] syncs files on at once: a file system
/// merges concurrent syncs into fewer journal commits.
const SYNC_THREADS: usize = 16;

/// From how many blobs [`BlobDir::sync`] syncs the whole file system once
/// instead of each file.
#[cfg(target_os = "linux")]
const SYNCFS_FROM: usize = 8;

/// Writes everything of the file system holding `path` to disk (`syncfs`).
#[cfg(target_os = "linux")]
fn syncfs(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    // SAFETY: `syncfs` takes a file descriptor, valid while `dir` lives.
    let rc = unsafe { libc::syncfs(dir.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Syncs every path (files or folders), on up to [`SYNC_THREADS`] threads.
fn sync_paths(paths: &[PathBuf]) -> std::io::Result<()> {
    let sync = |chunk: &[PathBuf]| -> std::io::Result<()> {
        for p in chunk {
            std::fs::File::open(p)?.sync_all()?;
        }
        Ok(())
    };
    if paths.len() <= 2 {
        return sync(paths);
    }
    let per_thread = paths.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (paths.chunks(per_thread))
            .map(|chunk| scope.spawn(move || sync(chunk)))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a sync thread panicked"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tessera-blob-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn verified_receive_stores_only_matching_bytes() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let dir = BlobDir::open(temp_dir("recv")).unwrap();
        let data = vec![42u8; 700_000];
        let digest = Digest::of(&data);
        rt.block_on(dir.receive(digest, data.len() as u64, &mut &data[..]))
            .unwrap();
        assert_eq!(dir.read(&digest).unwrap(), data);

        // Flipped byte: refused, nothing stored, no temp file left.
        let mut bad = data.clone();
        bad[1234] ^= 1;
        let other = Digest::of(b"something else");
        let err = rt
            .block_on(dir.receive(other, bad.len() as u64, &mut &bad[..]))
            .unwrap_err();
        assert!(matches!(err, BlobError::Mismatch { .. }), "{err}");
        assert!(err.to_string().contains("does not match its digest"));
        assert!(!dir.contains(&other));
        assert_eq!(
            std::fs::read_dir(dir.root().join("tmp")).unwrap().count(),
            0
        );

        // Short stream: refused.
        let err = rt
            .block_on(dir.receive(other, 10, &mut &b"abc"[..]))
            .unwrap_err();
        assert!(matches!(err, BlobError::Short { got: 3, .. }), "{err}");
        std::fs::remove_dir_all(dir.root()).unwrap();
    }

    /// A two-thread runtime, like the client's and the coordinator's.
    /// Stores the chunks of `data` at `offsets`.
    fn put_chunks<'a>(
        dir: &BlobDir,
        data: &[u8],
        offsets: impl Iterator<Item = (u64, &'a tessera_protocol::chunk::ChunkRef)>,
    ) {
        for (at, c) in offsets {
            let at = at as usize;
            dir.put_bytes(&data[at..at + c.len as usize]).unwrap();
        }
    }

    #[test]
    fn assemble_joins_stored_chunks_and_checks_the_whole_digest() {
        let dir = BlobDir::open(temp_dir("assemble")).unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i ^ (i >> 9)) as u8).collect();
        let recipe = crate::chunk::chunk_bytes(&data);
        assert!(recipe.chunks.len() > 10);
        // Not all chunks stored yet: refused, says which.
        let err = dir.assemble(&recipe).unwrap_err();
        assert!(err.to_string().contains("upload it first"), "{err}");
        put_chunks(&dir, &data, recipe.offsets());
        // A recipe naming the wrong whole-file digest stores nothing.
        let mut lie = recipe.clone();
        lie.digest = Digest::of(b"not it");
        let err = dir.assemble(&lie).unwrap_err();
        assert!(matches!(err, BlobError::Mismatch { .. }), "{err}");
        assert!(!dir.contains(&lie.digest));
        dir.assemble(&recipe).unwrap();
        assert_eq!(dir.read(&recipe.digest).unwrap(), data);
        assert_eq!(dir.recipe(&recipe.digest), Some(recipe.clone()));
        let distinct: std::collections::HashSet<_> =
            recipe.chunks.iter().map(|c| c.digest).collect();
        assert_eq!(dir.list().unwrap().len(), distinct.len() + 1);
        dir.remove(&recipe.digest).unwrap();
        assert_eq!(dir.recipe(&recipe.digest), None);
        assert!(!dir.contains(&recipe.digest));
        std::fs::remove_dir_all(dir.root()).unwrap();
    }

    #[test]
    fn a_chunk_list_is_joined_once_and_its_file_named_by_the_store() {
        let dir = BlobDir::open(temp_dir("lists")).unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i ^ (i >> 7)) as u8).collect();
        let list = crate::chunk::list_at(&data[..], 2).unwrap();
        let id = list.id();
        assert_eq!(dir.file_of_list(&id), None);
        let err = dir.assemble_list(&list).unwrap_err();
        assert!(err.to_string().contains("upload it first"), "{err}");
        put_chunks(&dir, &data, list.offsets());
        // A list that lies about its size is refused before any joining.
        let mut lie = list.clone();
        lie.size += 1;
        assert!(dir
            .assemble_list(&lie)
            .unwrap_err()
            .to_string()
            .contains("add up to"));

        let file = dir.assemble_list(&list).unwrap();
        assert_eq!(file, Digest::of(&data), "the store hashed the joined file");
        assert_eq!(dir.read(&file).unwrap(), data);
        assert_eq!(dir.file_of_list(&id), Some(file));
        let recipe = dir.recipe(&file).unwrap();
        assert_eq!((recipe.size, &recipe.chunks), (list.size, &list.chunks));
        // Joined once: a missing chunk no longer matters for the same list.
        let first = list.chunks[0].digest;
        dir.remove(&first).unwrap();
        assert_eq!(dir.assemble_list(&list).unwrap(), file);
        // Removing the file forgets the list too.
        dir.remove(&file).unwrap();
        assert_eq!(dir.file_of_list(&id), None);
        std::fs::remove_dir_all(dir.root()).unwrap();
    }

    #[test]
    fn put_bytes_is_idempotent() {
        let dir = BlobDir::open(temp_dir("put")).unwrap();
        let a = dir.put_bytes(b"tile").unwrap();
        let b = dir.put_bytes(b"tile").unwrap();
        assert_eq!(a, b);
        assert_eq!(dir.size(&a), Some(4));
        assert!(matches!(
            dir.read(&Digest::of(b"nope")),
            Err(BlobError::NotFound(_))
        ));
        std::fs::remove_dir_all(dir.root()).unwrap();
    }
}
