//! The worker's asset cache: blobs by digest (verified on arrival), and one
//! folder per job built from them with hard links, so a job's files exist on
//! this machine at the paths its manifest names, whatever paths they had on
//! the artist's machine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tessera_protocol::blob::{self, BlobDir};
use tessera_protocol::job::{sanitize_manifest_path, ManifestEntry};
use tessera_protocol::messages::JobInfo;
use tessera_protocol::Digest;
use tokio::sync::OnceCell;

pub struct Cache {
    blobs: BlobDir,
    jobs_root: PathBuf,
    /// One preparation per job; concurrent slots of the same job wait for it.
    prepared: Mutex<HashMap<u64, Arc<OnceCell<PathBuf>>>>,
}

impl Cache {
    pub fn open(dir: &Path) -> anyhow::Result<Cache> {
        // Engines run in other folders: every path handed out is absolute.
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the cache {}", dir.display()))?;
        let dir = &dir.canonicalize()?;
        let blobs = BlobDir::open(dir.join("blobs"))
            .with_context(|| format!("cannot open the cache in {}", dir.display()))?;
        let jobs_root = dir.join("jobs");
        // Job folders are rebuilt from blobs; stale ones from an earlier run go.
        let _ = std::fs::remove_dir_all(&jobs_root);
        std::fs::create_dir_all(&jobs_root)?;
        Ok(Cache {
            blobs,
            jobs_root,
            prepared: Mutex::new(HashMap::new()),
        })
    }

    pub fn blobs(&self) -> &BlobDir {
        &self.blobs
    }

    /// Forgets job folders prepared over an earlier connection (job ids are
    /// the coordinator's, and it may have been replaced).
    pub fn reset_jobs(&self) {
        self.prepared.lock().expect("cache lock").clear();
    }

    /// Fetches the job's missing blobs from the coordinator and lays out its
    /// folder. Returns the folder.
    pub async fn prepare(
        &self,
        conn: &quinn::Connection,
        job: &JobInfo,
    ) -> anyhow::Result<PathBuf> {
        let cell = self
            .prepared
            .lock()
            .expect("cache lock")
            .entry(job.job)
            .or_default()
            .clone();
        let dir = cell.get_or_try_init(|| self.build(conn, job)).await?;
        Ok(dir.clone())
    }

    async fn build(&self, conn: &quinn::Connection, job: &JobInfo) -> anyhow::Result<PathBuf> {
        let mut fetched = 0u64;
        for entry in &job.manifest {
            if self.blobs.size(&entry.digest) != Some(entry.size) {
                fetched += blob::get(conn, entry.digest, Some(job.job), &self.blobs)
                    .await
                    .with_context(|| format!("fetching `{}`", entry.path))?;
            }
        }
        let tag = Digest::of(format!("{:?}", job.manifest).as_bytes()).to_hex();
        let dir = self.jobs_root.join(format!("{}-{}", job.job, &tag[..12]));
        let blobs = self.blobs.clone();
        let manifest = job.manifest.clone();
        let dir2 = dir.clone();
        tokio::task::spawn_blocking(move || lay_out(&blobs, &dir2, &manifest)).await??;
        tracing::info!(
            job = job.job,
            files = job.manifest.len(),
            fetched_bytes = fetched,
            "job files ready"
        );
        Ok(dir)
    }
}

fn lay_out(blobs: &BlobDir, dir: &Path, manifest: &[ManifestEntry]) -> anyhow::Result<()> {
    for entry in manifest {
        let parts = sanitize_manifest_path(&entry.path)?;
        let dest = parts.iter().fold(dir.to_path_buf(), |p, c| p.join(c));
        if dest.exists() {
            continue;
        }
        std::fs::create_dir_all(dest.parent().expect("joined under dir"))?;
        let src = blobs.path(&entry.digest);
        if std::fs::hard_link(&src, &dest).is_err() {
            std::fs::copy(&src, &dest)
                .with_context(|| format!("placing `{}` in {}", entry.path, dir.display()))?;
        }
    }
    Ok(())
}
