//! What a peer may read from the blob store: [`Fetch::may_fetch`] is the one
//! place that decides whether this worker may fetch this digest.
//!
//! A client may read any blob (it submitted the jobs and reads their
//! frames). A worker may read only what the tasks it holds right now need —
//! the files of their jobs' manifests, and the chunks of those files, granted
//! when it is served their recipe — and the files and chunks of recorded
//! Blender builds (`tessera blender add`), which any worker may run, and the
//! `.blend` of a farm scan it was asked for and has not answered. Anything
//! else, another job's output frames included, is refused.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use tessera_protocol::chunk::Recipe;
use tessera_protocol::Digest;

use crate::scheduler::WorkerId;
use crate::server::{relock, Shared};

/// The most chunk digests granted to one connection; past it the grants
/// start over (a worker then asks for the recipe again).
const MAX_GRANTED_CHUNKS: usize = 1 << 20;

/// What one connection may read.
pub(crate) struct Fetch {
    /// `None` for a client; for a worker, its id once it joined (before
    /// its `Join`, a worker reads nothing).
    worker: Option<OnceLock<WorkerId>>,
    /// Chunks of the files it may read, from the recipes it was served.
    granted: Mutex<HashSet<Digest>>,
}

impl Fetch {
    pub fn client() -> Fetch {
        Fetch {
            worker: None,
            granted: Mutex::default(),
        }
    }

    pub fn worker() -> Fetch {
        Fetch {
            worker: Some(OnceLock::new()),
            granted: Mutex::default(),
        }
    }

    /// The worker joined as `id`.
    pub fn joined(&self, id: WorkerId) {
        if let Some(w) = &self.worker {
            let _ = w.set(id);
        }
    }

    /// May this peer fetch `digest` (as a blob, or its recipe)?
    pub fn may_fetch(&self, shared: &Shared, digest: &Digest) -> bool {
        let Some(worker) = &self.worker else {
            return true;
        };
        let Some(&id) = worker.get() else {
            return false;
        };
        relock(&self.granted).contains(digest)
            || shared.read(|core, _| core.task_needs(id, digest))
            || shared.scans.may_fetch(id, digest)
            || shared.build_digests.holds(digest)
    }

    /// A recipe was served: its chunks may be fetched too.
    pub fn recipe_served(&self, recipe: &Recipe) {
        if self.worker.is_none() {
            return;
        }
        let mut granted = relock(&self.granted);
        if granted.len() + recipe.chunks.len() > MAX_GRANTED_CHUNKS {
            granted.clear();
        }
        granted.extend(recipe.chunks.iter().map(|c| c.digest));
    }
}

/// The digests of every recorded Blender build (manifests, files, chunks),
/// read again when the number of builds changes.
#[derive(Default)]
pub(crate) struct BuildDigests(Mutex<Option<HashSet<Digest>>>);

impl BuildDigests {
    /// Whether `digest` belongs to a recorded build: from the set read
    /// when the builds last changed (see [`BuildDigests::reload`]), never
    /// from the database on this path.
    pub fn holds(&self, digest: &Digest) -> bool {
        relock(&self.0)
            .as_ref()
            .is_some_and(|all| all.contains(digest))
    }

    /// The recorded builds changed (or the coordinator started): reads
    /// what they hold. Off the runtime: it reads the database and store.
    pub fn reload(&self, shared: &Shared) -> anyhow::Result<()> {
        let all: HashSet<Digest> = crate::builds::kept_by_builds(shared)?.into_iter().collect();
        *relock(&self.0) = (!all.is_empty()).then_some(all);
        Ok(())
    }
}
