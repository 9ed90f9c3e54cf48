//! Blender builds shipped through the farm: `blender add` records a build
//! whose files a client uploaded (each a blob, large ones chunked), once
//! its manifest has been checked and every file it lists is stored.

use tessera_protocol::build::{BuildInfo, BuildManifest};
use tessera_protocol::codec;
use tessera_protocol::Digest;
use tessera_store::BlobStore;

use std::sync::Arc;

use crate::server::Shared;

/// The largest manifest blob read: one codec frame.
const MAX_MANIFEST_BYTES: u64 = codec::MAX_FRAME as u64;

/// Records the build whose manifest blob is `digest`. Holds the garbage
/// collection lock, so the files it was just checked to have stay stored.
pub(crate) fn add_build(
    shared: &Arc<Shared>,
    digest: Digest,
    unix_ms: u64,
) -> anyhow::Result<BuildInfo> {
    let _gc = shared.gc.lock().expect("gc lock");
    let manifest = read_manifest(shared, &digest)?;
    let size = manifest.validate()?;
    let missing = manifest
        .files
        .iter()
        .filter(|f| !shared.store.touch(&f.digest))
        .count();
    if missing > 0 {
        anyhow::bail!(
            "{missing} of the build's {} files are not uploaded; run `tessera blender add` again",
            manifest.files.len()
        );
    }
    let info = BuildInfo {
        digest,
        version: manifest.version,
        kind: manifest.kind,
        size,
        files: manifest.files.len() as u64,
        features: manifest.features(),
        added_unix_ms: unix_ms,
        holders: Vec::new(),
    };
    let recorded = shared.db().add_build(&info)?;
    let builds = shared.db().builds()?;
    shared.update(|core, _| core.set_builds(builds));
    shared.build_digests.reload(shared)?;
    Ok(recorded)
}

/// Every stored build, each with the connected workers that hold all of
/// its files (`blender list`).
pub(crate) fn list_builds(shared: &Arc<Shared>) -> anyhow::Result<Vec<BuildInfo>> {
    let mut builds = shared.db().builds()?;
    for b in &mut builds {
        let manifest = read_manifest(shared, &b.digest)?;
        let files: Vec<Digest> = manifest.files.iter().map(|f| f.digest).collect();
        b.holders = shared.update(|core, _| core.holders(&files));
    }
    Ok(builds)
}

/// The manifest stored as `digest`, decoded (not yet validated).
pub(crate) fn read_manifest(shared: &Shared, digest: &Digest) -> anyhow::Result<BuildManifest> {
    match shared.store.has(digest) {
        None => anyhow::bail!("the build manifest {digest} is not uploaded"),
        Some(len) if len > MAX_MANIFEST_BYTES => {
            anyhow::bail!(
                "the build manifest is {len} bytes; at most {MAX_MANIFEST_BYTES} are read"
            )
        }
        Some(_) => {}
    }
    let bytes = shared.store.get(digest)?;
    BuildManifest::from_bytes(&bytes).map_err(|e| anyhow::anyhow!("unreadable build manifest: {e}"))
}

/// What garbage collection keeps for the recorded builds: each manifest,
/// its files, and their chunks.
pub(crate) fn kept_by_builds(shared: &Shared) -> anyhow::Result<Vec<Digest>> {
    let mut keep = Vec::new();
    for build in shared.db().builds()? {
        keep.push(build.digest);
        let manifest = read_manifest(shared, &build.digest)?;
        for f in &manifest.files {
            keep.push(f.digest);
            if let Some(recipe) = shared.store.recipe(&f.digest) {
                keep.extend(recipe.chunks.iter().map(|c| c.digest));
            }
        }
    }
    Ok(keep)
}
