//! The coordinator's asset store: a blob folder, alone or in front of a
//! bucket of an S3-compatible object store.
//!
//! Alone, the folder is the store and every write is durable on its disk.
//! In front of a bucket, the bucket is the store (what a standby
//! coordinator on another machine finds) and the folder is this machine's
//! copy of what it touched: blobs arrive there (uploads, results), are
//! copied to the bucket before anything relies on them ([`Backed::sync`],
//! before a submit is answered and before a result is acknowledged), and
//! blobs only in the bucket are copied down when something reads them by
//! path ([`Backed::ensure_local`]).
//!
//! In the bucket, under its prefix: `blobs/HEX` (the bytes), `recipes/HEX`
//! (the chunks a file was joined from), `lists/HEX` (the file a chunk list
//! made) and `touched/HEX` (an empty object whose time is when the blob was
//! last named: objects cannot be touched in place).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::blob::{BlobDir, BlobError, MAX_BLOB};
use crate::s3::{Bucket, S3Error};
use crate::store::{BlobStore, StoredBlob};
use tessera_protocol::chunk::{ChunkList, Recipe};
use tessera_protocol::Digest;

/// Most digests remembered as already in the bucket.
const MAX_KNOWN: usize = 1 << 16;

/// How long a bucket object that did not hash right is taken for missing
/// before it is asked for again.
pub const SUSPECT_FOR: Duration = Duration::from_secs(60);
/// Most unknown digests one [`Backed::touch_many`] asks the bucket about.
const ASK_AT_MOST: usize = 256;
/// Most chunks whose place in a file is remembered (about 20 MB).
const MAX_HOMES: usize = 1 << 18;
/// Blobs up to this size are put without asking first whether the bucket
/// has them: one request instead of two.
const PUT_BLIND: u64 = 1 << 20;
/// The largest recipe or list object read back.
const MAX_RECIPE: u64 = 64 << 20;

/// A blob folder, with a bucket behind it or not.
#[derive(Debug, Clone)]
pub struct Backed {
    dir: BlobDir,
    bucket: Option<Arc<Bucket>>,
    /// Blobs known to be in the bucket, so naming them again costs no
    /// request. Bounded: emptied when it reaches [`MAX_KNOWN`].
    known: Arc<Mutex<HashSet<Digest>>>,
    /// Where each chunk of the files joined or whose recipes were read
    /// lies: its file, offset and length. Bounded by [`MAX_HOMES`].
    homes: Arc<Mutex<HashMap<Digest, Home>>>,
    /// Objects whose bytes did not hash right when read (twice), and when:
    /// taken for missing until stored again or for [`SUSPECT_FOR`].
    /// Bounded like `known`.
    suspect: Arc<Mutex<HashMap<Digest, Instant>>>,
}

/// Where a chunk lies: its file, offset and length.
type Home = (Digest, u64, u32);

fn io(e: S3Error) -> BlobError {
    BlobError::Io(e.into())
}

fn blob_name(d: &Digest) -> String {
    format!("blobs/{}", d.to_hex())
}

impl Backed {
    /// The folder alone: it must be durable.
    pub fn local(dir: BlobDir) -> Backed {
        Backed {
            dir,
            bucket: None,
            known: Default::default(),
            homes: Default::default(),
            suspect: Default::default(),
        }
    }

    /// The folder `dir` (this machine's copy) in front of `bucket`.
    pub fn with_bucket(dir: BlobDir, bucket: Bucket) -> Backed {
        Backed {
            dir,
            bucket: Some(Arc::new(bucket)),
            known: Default::default(),
            homes: Default::default(),
            suspect: Default::default(),
        }
    }

    /// The folder.
    pub fn dir(&self) -> &BlobDir {
        &self.dir
    }

    /// The bucket, if there is one.
    pub fn bucket(&self) -> Option<&Bucket> {
        self.bucket.as_deref()
    }

    /// Where the blob is (or would be) in the folder.
    pub fn path(&self, digest: &Digest) -> PathBuf {
        self.dir.path(digest)
    }

    fn known(&self, d: &Digest) -> bool {
        self.known.lock().expect("known lock").contains(d)
    }

    /// Marks `d`'s object in the bucket as not hashing right: missing to
    /// `has` and `touch`, and overwritten by an upload, for
    /// [`SUSPECT_FOR`]; then asked again (a damaging path, not rot, may
    /// have made it look bad: a standby taking over behind one must not
    /// take the whole bucket for missing for good).
    fn suspect(&self, d: Digest) {
        self.known.lock().expect("known lock").remove(&d);
        let mut suspect = self.suspect.lock().expect("suspect lock");
        if suspect.len() >= MAX_KNOWN {
            suspect.clear();
        }
        suspect.insert(d, Instant::now());
    }

    fn suspected(&self, d: &Digest) -> bool {
        let mut suspect = self.suspect.lock().expect("suspect lock");
        match suspect.get(d) {
            Some(since) if since.elapsed() < SUSPECT_FOR => true,
            Some(_) => {
                suspect.remove(d);
                false
            }
            None => false,
        }
    }

    fn remember(&self, d: Digest) {
        self.suspect.lock().expect("suspect lock").remove(&d);
        let mut known = self.known.lock().expect("known lock");
        if known.len() >= MAX_KNOWN {
            known.clear();
        }
        known.insert(d);
    }

    /// Whether the blob is stored; with a bucket, copies one that is only
    /// there into the folder first, so it can be read by [`Backed::path`].
    pub fn ensure_local(&self, digest: &Digest) -> Result<bool, BlobError> {
        if self.dir.contains(digest) {
            return Ok(true);
        }
        let Some(bucket) = &self.bucket else {
            return Ok(false);
        };
        if self.chunk_from_its_file(digest)? {
            return Ok(true);
        }
        // A copy that does not hash right is read once more before the
        // bucket's object is taken for rotten: one bad read (a flaky link,
        // a proxy) must not cost the only copy.
        match self.copy_down(bucket, digest) {
            Err(BlobError::Mismatch { .. }) => {}
            other => return other,
        }
        match self.copy_down(bucket, digest) {
            // Never deleted on what reads say (a damaging path looks the
            // same as rot): taken for missing, and stored again over it by
            // the next upload of those bytes.
            Err(BlobError::Mismatch { .. }) => {
                tracing::warn!(%digest, "the bucket's copy does not hash right (read twice): taken for missing until it is stored again; left in the bucket");
                self.suspect(*digest);
                Err(BlobError::Corrupt(*digest))
            }
            other => other,
        }
    }

    /// One copy of the bucket's object into the folder, verified; `false`
    /// when the bucket has none.
    fn copy_down(&self, bucket: &Bucket, digest: &Digest) -> Result<bool, BlobError> {
        let Some((len, body)) = bucket.open(&blob_name(digest)).map_err(io)? else {
            return Ok(false);
        };
        if len > MAX_BLOB {
            return Err(BlobError::TooLarge {
                digest: *digest,
                len,
            });
        }
        // Into a temporary file, then adopted: the folder re-hashes it, so
        // what the bucket gives back is checked like any upload.
        let temp = (self.dir.root().join("tmp")).join(format!(
            "{}.{:016x}",
            digest.to_hex(),
            rand::random::<u64>()
        ));
        let copied = (|| {
            let mut out = std::fs::File::create(&temp)?;
            let n = std::io::copy(&mut body.take(len), &mut out)?;
            if n != len {
                return Err(BlobError::Short {
                    digest: *digest,
                    expected: len,
                    got: n,
                });
            }
            self.dir.adopt(&temp, digest)
        })();
        if let Err(e) = copied {
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        self.remember(*digest);
        Ok(true)
    }

    /// What a scrub does with a blob whose durable copy did not hash
    /// right: with a bucket, put this machine's copy back if it is good,
    /// else read the bucket's again and, if still wrong, take it for
    /// missing (never deleting it); alone, remove it. Returns whether it is
    /// now missing.
    pub fn repair(&self, digest: &Digest) -> Result<bool, BlobError> {
        let Some(bucket) = &self.bucket else {
            self.dir.remove(digest)?;
            return Ok(true);
        };
        if let Ok(bytes) = self.dir.read(digest) {
            if Digest::of(&bytes) == *digest {
                tracing::warn!(%digest, "the bucket's copy was corrupt: put back from this machine's");
                bucket
                    .put_file(&blob_name(digest), &self.dir.path(digest))
                    .map_err(io)?;
                return Ok(false);
            }
            self.dir.remove(digest)?;
        }
        match self.ensure_local(digest) {
            Ok(_) => Ok(false),
            Err(BlobError::Corrupt(_)) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// A chunk of a file joined here or whose recipe was read: cut from the
    /// file (copied down first), checked, and stored in the folder. Chunks
    /// are not kept in the bucket one by one (a request each); their files
    /// and recipes are.
    fn chunk_from_its_file(&self, chunk: &Digest) -> Result<bool, BlobError> {
        use std::os::unix::fs::FileExt;
        let home = self.homes.lock().expect("homes lock").get(chunk).copied();
        let Some((file, offset, len)) = home else {
            return Ok(false);
        };
        if !(self.dir.contains(&file) || self.ensure_local(&file)?) {
            return Ok(false);
        }
        let mut bytes = vec![0u8; len as usize];
        std::fs::File::open(self.dir.path(&file))?.read_exact_at(&mut bytes, offset)?;
        if Digest::of(&bytes) != *chunk {
            return Ok(false);
        }
        self.dir.put_unsynced(chunk, &bytes)?;
        Ok(true)
    }

    /// Which of `digests` are stored, each marked as just written (see
    /// [`BlobStore::touch`]): those in the folder, or chunks of a file
    /// whose recipe is known; the bucket is asked about the rest only when
    /// they are few ([`ASK_AT_MOST`], 16 at a time). Many unknown digests
    /// are a new file's chunks, which the bucket never holds one by one:
    /// a request each would cost minutes on a long path.
    pub fn touch_many(&self, digests: &[Digest]) -> Vec<bool> {
        let mut stored: Vec<bool> = (digests.iter())
            .map(|d| self.dir.touch(d) || self.homes.lock().expect("homes lock").contains_key(d))
            .collect();
        let unknown: Vec<usize> = (0..digests.len()).filter(|&i| !stored[i]).collect();
        if self.bucket.is_none() || unknown.is_empty() || unknown.len() > ASK_AT_MOST {
            return stored;
        }
        let found: Vec<(usize, bool)> = std::thread::scope(|s| {
            let asks: Vec<_> = (unknown.chunks(unknown.len().div_ceil(16)))
                .map(|part| {
                    s.spawn(move || {
                        (part.iter())
                            .map(|&i| (i, self.touch(&digests[i])))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            asks.into_iter()
                .flat_map(|a| a.join().unwrap_or_default())
                .collect()
        });
        for (i, yes) in found {
            stored[i] = yes;
        }
        stored
    }

    /// Remembers where each chunk of `recipe` lies in its file.
    fn index(&self, recipe: &Recipe) {
        let mut homes = self.homes.lock().expect("homes lock");
        if homes.len() + recipe.chunks.len() > MAX_HOMES {
            homes.clear();
        }
        for (offset, c) in recipe.offsets() {
            homes
                .entry(c.digest)
                .or_insert((recipe.digest, offset, c.len));
        }
    }

    /// Stores `bytes` in the folder only; [`Backed::sync`] makes them
    /// durable (and copies them to the bucket) before anything relies on
    /// them.
    pub fn put_unsynced(&self, digest: &Digest, bytes: &[u8]) -> std::io::Result<()> {
        self.dir.put_unsynced(digest, bytes)
    }

    /// Makes stored blobs durable: synced to the folder's disk, or with a
    /// bucket, copied there (those not there yet).
    pub fn sync(&self, digests: &[Digest]) -> Result<(), BlobError> {
        match &self.bucket {
            None => Ok(self.dir.sync(digests)?),
            Some(bucket) => {
                for d in digests {
                    self.upload(bucket, d)?;
                }
                Ok(())
            }
        }
    }

    /// [`Backed::sync`] for blobs named again and again (a job's files):
    /// those made durable before are remembered and skipped.
    pub fn sync_remembered(&self, digests: &[Digest]) -> Result<(), BlobError> {
        match &self.bucket {
            None => Ok(self.dir.sync_remembered(digests)?),
            Some(_) => self.sync(digests),
        }
    }

    /// Copies a blob of the folder to the bucket unless it is there; one
    /// in neither is not stored.
    fn upload(&self, bucket: &Bucket, d: &Digest) -> Result<(), BlobError> {
        if self.known(d) {
            return Ok(());
        }
        let suspected = self.suspected(d);
        if self
            .dir
            .size(d)
            .is_some_and(|len| len <= PUT_BLIND || suspected)
        {
            bucket
                .put_file(&blob_name(d), &self.dir.path(d))
                .map_err(io)?;
            self.remember(*d);
            return Ok(());
        }
        let kept = bucket.head(&blob_name(d)).map_err(io)?;
        match self.dir.size(d) {
            Some(local) if kept != Some(local) => {
                bucket
                    .put_file(&blob_name(d), &self.dir.path(d))
                    .map_err(io)?;
            }
            // Only in the bucket (stored through another coordinator).
            None if kept.is_none() => return Err(BlobError::NotFound(*d)),
            _ => {}
        }
        self.remember(*d);
        Ok(())
    }

    /// The stored blob's bytes as a stream, from where it is durable (the
    /// bucket, if there is one): what a scrub re-hashes.
    pub fn open_durable(&self, digest: &Digest) -> Result<Option<crate::s3::Body>, BlobError> {
        match &self.bucket {
            Some(bucket) => Ok(bucket.open(&blob_name(digest)).map_err(io)?.map(|(_, r)| r)),
            None => match std::fs::File::open(self.dir.path(digest)) {
                Ok(f) => Ok(Some(Box::new(f))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e.into()),
            },
        }
    }

    /// A URL a worker fetches the blob from for `valid`, without
    /// credentials, and the blob's size: only with a bucket, and only for a
    /// blob in it.
    pub fn presign(&self, digest: &Digest, valid: Duration) -> Option<(String, u64)> {
        let bucket = self.bucket.as_ref()?;
        let len = bucket.head(&blob_name(digest)).ok()??;
        self.remember(*digest);
        Some((bucket.presign_get(&blob_name(digest), valid), len))
    }

    /// Copies a recipe (and its list) to the bucket.
    fn upload_recipe(&self, bucket: &Bucket, recipe: &Recipe) -> Result<(), BlobError> {
        let bytes = tessera_protocol::codec::encode(recipe)?;
        let hex = recipe.digest.to_hex();
        bucket.put(&format!("recipes/{hex}"), &bytes).map_err(io)?;
        let list = format!("lists/{}", recipe.list_id().to_hex());
        bucket.put(&list, hex.as_bytes()).map_err(io)
    }
}

impl BlobStore for Backed {
    fn has(&self, digest: &Digest) -> Option<u64> {
        if let Some(len) = self.dir.size(digest) {
            return Some(len);
        }
        let bucket = self.bucket.as_ref()?;
        if self.suspected(digest) {
            return None;
        }
        match bucket.head(&blob_name(digest)) {
            Ok(found) => found,
            Err(e) => {
                tracing_warn(&e);
                None
            }
        }
    }

    fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<(), BlobError> {
        match &self.bucket {
            None => Ok(self.dir.put_as(digest, bytes)?),
            Some(bucket) => {
                self.dir.put_unsynced(digest, bytes)?;
                if !self.known(digest) || self.suspected(digest) {
                    bucket.put(&blob_name(digest), bytes).map_err(io)?;
                    self.remember(*digest);
                }
                Ok(())
            }
        }
    }

    fn get(&self, digest: &Digest) -> Result<Vec<u8>, BlobError> {
        if self.bucket.is_none() {
            return self.dir.read(digest);
        }
        match self.dir.read(digest) {
            Ok(bytes) if Digest::of(&bytes) == *digest => return Ok(bytes),
            // This machine's copy rotted: the bucket's counts.
            Ok(_) => self.dir.remove(digest)?,
            Err(BlobError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        if !self.ensure_local(digest)? {
            return Err(BlobError::NotFound(*digest));
        }
        self.dir.read(digest)
    }

    fn remove(&self, digest: &Digest) -> Result<(), BlobError> {
        if let Some(bucket) = &self.bucket {
            let hex = digest.to_hex();
            if let Some(recipe) = self.recipe(digest) {
                bucket
                    .delete(&format!("lists/{}", recipe.list_id().to_hex()))
                    .map_err(io)?;
            }
            bucket.delete(&format!("recipes/{hex}")).map_err(io)?;
            bucket.delete(&format!("touched/{hex}")).map_err(io)?;
            bucket.delete(&blob_name(digest)).map_err(io)?;
            self.known.lock().expect("known lock").remove(digest);
        }
        Ok(self.dir.remove(digest)?)
    }

    fn list(&self) -> Result<Vec<StoredBlob>, BlobError> {
        let mut blobs: HashMap<Digest, StoredBlob> = HashMap::new();
        if let Some(bucket) = &self.bucket {
            for o in bucket.list("blobs").map_err(io)? {
                if let Ok(digest) = o.name.parse::<Digest>() {
                    let written = o.modified;
                    blobs.insert(
                        digest,
                        StoredBlob {
                            digest,
                            size: o.size,
                            written,
                        },
                    );
                }
            }
            for o in bucket.list("touched").map_err(io)? {
                if let Some(b) = (o.name.parse::<Digest>().ok()).and_then(|d| blobs.get_mut(&d)) {
                    b.written = b.written.max(o.modified);
                }
            }
        }
        // What is only in the folder (not yet copied up) is stored too.
        for (digest, size, written) in self.dir.list()? {
            let b = blobs.entry(digest).or_insert(StoredBlob {
                digest,
                size,
                written,
            });
            b.written = b.written.max(written);
        }
        Ok(blobs.into_values().collect())
    }

    fn touch(&self, digest: &Digest) -> bool {
        let local = self.dir.touch(digest);
        let Some(bucket) = &self.bucket else {
            return local;
        };
        if !local
            && (self.suspected(digest) || !matches!(bucket.head(&blob_name(digest)), Ok(Some(_))))
        {
            return false;
        }
        match bucket.put(&format!("touched/{}", digest.to_hex()), b"") {
            Ok(()) => true,
            Err(e) => {
                tracing_warn(&e);
                local
            }
        }
    }

    fn assemble_list(&self, list: &ChunkList) -> Result<Digest, BlobError> {
        let Some(bucket) = &self.bucket else {
            return self.dir.assemble_list(list);
        };
        if let Some(file) = self.file_of_list(&list.id()) {
            return Ok(file);
        }
        // Chunks of files joined before, named again (an edited file),
        // are cut from those files.
        for c in list.chunks.iter().filter(|c| !self.dir.contains(&c.digest)) {
            self.chunk_from_its_file(&c.digest)?;
        }
        let file = self.dir.assemble_list(list)?;
        // The file, then its recipe (a list object names only a file that
        // is there); its chunks stay in the folder, cut from the file where
        // another coordinator needs one.
        self.upload(bucket, &file)?;
        let recipe = self.dir.recipe(&file).ok_or_else(|| BlobError::Recipe {
            file,
            reason: "its recipe was not kept".into(),
        })?;
        self.upload_recipe(bucket, &recipe)?;
        self.index(&recipe);
        Ok(file)
    }

    fn file_of_list(&self, list: &Digest) -> Option<Digest> {
        if let Some(file) = self.dir.file_of_list(list) {
            return Some(file);
        }
        let bucket = self.bucket.as_ref()?;
        let named = bucket
            .get(&format!("lists/{}", list.to_hex()), MAX_RECIPE)
            .ok()??;
        let file: Digest = std::str::from_utf8(&named).ok()?.trim().parse().ok()?;
        self.touch(&file).then_some(file)
    }

    fn recipe(&self, file: &Digest) -> Option<Recipe> {
        let recipe = match self.dir.recipe(file) {
            Some(recipe) => recipe,
            None => {
                let bucket = self.bucket.as_ref()?;
                let bytes = bucket
                    .get(&format!("recipes/{}", file.to_hex()), MAX_RECIPE)
                    .ok()??;
                let recipe: Recipe = tessera_protocol::codec::decode_frame(&bytes).ok()?;
                (recipe.digest == *file).then_some(recipe)?
            }
        };
        if self.bucket.is_some() {
            self.index(&recipe);
        }
        Some(recipe)
    }
}

/// Whether asking again later may work: the bucket was out of reach or
/// busy (a disk error or a missing blob is not).
pub fn is_transient(e: &BlobError) -> bool {
    match e {
        BlobError::Io(io) => (io.get_ref())
            .and_then(|inner| inner.downcast_ref::<S3Error>())
            .is_some_and(|s3| s3.transient),
        _ => false,
    }
}

/// Whether the bucket answered `e` (out of reach, busy, or refusing: a
/// revoked key, a missing bucket), not this machine's disk.
pub fn is_the_buckets(e: &BlobError) -> bool {
    match e {
        BlobError::Io(io) => (io.get_ref()).is_some_and(|inner| inner.is::<S3Error>()),
        _ => false,
    }
}

fn tracing_warn(e: &S3Error) {
    tracing::warn!("{e}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scratch_garage::ScratchGarage;
    use crate::Verified;

    fn scratch_dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "tessera-backed-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ))
    }

    #[test]
    fn a_folder_alone_passes_the_store_suite() {
        let dir = scratch_dir("local");
        crate::store::suite(&Backed::local(BlobDir::open_durable(&dir).unwrap()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The store suite on a real S3-compatible server, then what another
    /// machine's coordinator (an empty folder, the same bucket) finds.
    #[test]
    #[ignore = "needs Garage (cargo install --locked garage@2.5.0, or TESSERA_TEST_GARAGE)"]
    fn a_folder_in_front_of_a_bucket_passes_the_store_suite_and_another_machine_finds_it_all() {
        let garage = ScratchGarage::start("suite").unwrap();
        let (one, two) = (scratch_dir("one"), scratch_dir("two"));
        let bucket = || garage.bucket("farm").unwrap();
        let store = Backed::with_bucket(BlobDir::open(&one).unwrap(), bucket());
        crate::store::suite(&store);

        // A blob received into the folder (an upload, a result) is in the
        // bucket once synced; a file joined from chunks, with its recipe.
        let tile = vec![7u8; 300_000];
        let d = Digest::of(&tile);
        store.put_unsynced(&d, &tile).unwrap();
        assert_eq!(
            bucket().head(&blob_name(&d)).unwrap(),
            None,
            "not before the sync"
        );
        store.sync(&[d]).unwrap();
        assert_eq!(bucket().head(&blob_name(&d)).unwrap(), Some(300_000));
        let chunks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 1000 + i as usize]).collect();
        let refs: Vec<tessera_protocol::chunk::ChunkRef> = (chunks.iter())
            .map(|c| tessera_protocol::chunk::ChunkRef {
                digest: Digest::of(c),
                len: c.len() as u32,
            })
            .collect();
        // Chunks arrive as uploads do: in the folder only.
        for c in &chunks {
            store.put_unsynced(&Digest::of(c), c).unwrap();
        }
        let list = ChunkList {
            size: refs.iter().map(|r| u64::from(r.len)).sum(),
            chunks: refs,
        };
        let file = store.assemble_list(&list).unwrap();

        // Another machine: nothing in its folder, everything in the bucket.
        let other = Verified::new(Backed::with_bucket(BlobDir::open(&two).unwrap(), bucket()));
        assert_eq!(other.get(&d).unwrap(), tile);
        assert!(other.inner().path(&d).exists(), "copied down when read");
        assert_eq!(other.file_of_list(&list.id()), Some(file));
        assert_eq!(other.recipe(&file).unwrap().chunks, list.chunks);
        // Chunks are not in the bucket one by one; once the file's recipe
        // was read, a chunk is cut from the file (what an older worker's
        // fetch of chunks asks of a standby).
        assert_eq!(
            bucket().head(&blob_name(&Digest::of(&chunks[1]))).unwrap(),
            None
        );
        assert!(other.inner().ensure_local(&Digest::of(&chunks[1])).unwrap());
        assert_eq!(other.get(&Digest::of(&chunks[1])).unwrap(), chunks[1]);
        assert_eq!(other.get(&file).unwrap(), chunks.concat());
        let listed: HashSet<Digest> = other.list().unwrap().iter().map(|b| b.digest).collect();
        assert!(listed.contains(&d) && listed.contains(&file));

        // A worker's URL fetches the bytes without credentials; a blob not
        // in the bucket has none.
        let (url, len) = other.inner().presign(&d, Duration::from_secs(60)).unwrap();
        assert_eq!(len, 300_000);
        let mut fetched = Vec::new();
        let response = ureq::get(&url).call().unwrap();
        (response.into_body().into_reader())
            .read_to_end(&mut fetched)
            .unwrap();
        assert_eq!(fetched, tile);
        assert_eq!(
            other
                .inner()
                .presign(&Digest::of(b"nope"), Duration::from_secs(60)),
            None
        );

        // Rot in the bucket is caught when read (and the blob removed), not
        // served: the bucket's copy is the one that counts.
        let rotten = vec![9u8; 5000];
        let r = Digest::of(&rotten);
        bucket().put(&blob_name(&r), b"not those bytes").unwrap();
        // Bytes that do not hash right, read twice, are never served and
        // never deleted (a damaging path reads the same as rot): the blob
        // is missing until stored again over them.
        assert!(matches!(other.get(&r), Err(BlobError::Corrupt(c)) if c == r));
        assert!(!other.inner().path(&r).exists());
        assert_eq!(
            bucket().head(&blob_name(&r)).unwrap(),
            Some(15),
            "left in place"
        );
        assert_eq!(other.has(&r), None);
        assert!(!other.touch(&r));
        other.put(&r, &rotten).unwrap();
        assert_eq!(
            bucket().get(&blob_name(&r), 1 << 20).unwrap().unwrap(),
            rotten
        );

        // A scrub that finds the bucket's copy wrong puts this machine's
        // good copy back instead of removing it; a rotten local copy is
        // replaced from the bucket, whose object stays.
        let good = vec![5u8; 4000];
        let g = Digest::of(&good);
        store.put(&g, &good).unwrap();
        bucket().put(&blob_name(&g), b"bitrot").unwrap();
        assert!(!store.repair(&g).unwrap(), "put back, not removed");
        assert_eq!(
            bucket().get(&blob_name(&g), 1 << 20).unwrap().unwrap(),
            good
        );
        std::fs::write(store.path(&g), b"rotten here").unwrap();
        assert_eq!(store.get(&g).unwrap(), good);
        assert_eq!(bucket().head(&blob_name(&g)).unwrap(), Some(4000));

        // Removal reaches the bucket.
        other.remove(&file).unwrap();
        assert_eq!(
            store.has(&file).filter(|_| !store.dir().contains(&file)),
            None
        );
        assert_eq!(bucket().head(&blob_name(&file)).unwrap(), None);
        assert_eq!(other.file_of_list(&list.id()), None);
        for dir in [one, two] {
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
