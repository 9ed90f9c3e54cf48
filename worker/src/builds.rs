//! `--blender auto`: a worker that also renders with the Blender builds
//! stored on the coordinator (`tessera blender add`). The coordinator tells
//! it the builds ([`CoordMsg::Builds`](tessera_protocol::messages::CoordMsg))
//! and schedules on each build's [`BuildInfo::offer`]; for a job none of
//! its own Blenders fits, the worker picks the first build whose offer fits
//! (the same order the coordinator matched), fetches and unpacks it through
//! its cache ([`Cache::prepare_build`]), probes it once, and renders with
//! it. A probe must find the version the build claims, loaded from the
//! build's own folder, with the features it was recorded with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tessera_protocol::build::{BuildInfo, BuildKind};
use tessera_protocol::messages::JobInfo;

use crate::cache::{BuildFiles, Cache};
use crate::engine::blender::{job_needs, Blender};
use crate::engine::blender_runtime::Runtime;
use crate::engine::Failure;

pub struct AutoBuilds {
    /// The Python 3.11 a `bpy` build runs in (`--build-python`).
    pub python: PathBuf,
    pub blender: Arc<Blender>,
    known: Mutex<Vec<BuildInfo>>,
}

impl AutoBuilds {
    pub fn new(python: PathBuf, blender: Arc<Blender>) -> AutoBuilds {
        AutoBuilds {
            python,
            blender,
            known: Mutex::new(Vec::new()),
        }
    }

    /// The builds the coordinator holds now.
    pub fn set(&self, builds: Vec<BuildInfo>) {
        tracing::info!(builds = builds.len(), "stored blender builds");
        *self.known.lock().expect("builds lock") = builds;
    }

    /// For a job that none of this worker's own Blenders fits: the stored
    /// build it renders with, fetched and unpacked (pinned while the
    /// returned value lives), probed the first time. `None`: a Blender of
    /// its own fits.
    pub async fn prepare<'c>(
        &self,
        cache: &'c Cache,
        conn: &quinn::Connection,
        job: &JobInfo,
        job_dir: &Path,
    ) -> anyhow::Result<Option<BuildFiles<'c>>> {
        if self.blender.fits_locally(job, job_dir) {
            return Ok(None);
        }
        let needs = job_needs(job, job_dir)?;
        let build = {
            let known = self.known.lock().expect("builds lock");
            let offers: Vec<_> = known.iter().map(BuildInfo::offer).collect();
            match needs.pick(&offers) {
                Some(i) => known[i].clone(),
                None => {
                    return Err(unsupported(format!(
                        "neither this worker's Blenders nor the {} stored builds fit this job",
                        known.len()
                    )))
                }
            }
        };
        let files = cache.prepare_build(conn, job.job, build.digest).await?;
        let (dir, python, blender) = (
            files.dir().to_path_buf(),
            self.python.clone(),
            self.blender.clone(),
        );
        let job_id = job.job;
        tokio::task::spawn_blocking(move || {
            blender.use_build(job_id, build.digest, || {
                probe(&blender, &build, &dir, python)
            })
        })
        .await
        .context("the probe thread panicked")?
        .map_err(|e| unsupported(format!("{e:#}")))?;
        Ok(Some(files))
    }
}

/// A failure that means this worker cannot render the job at all.
fn unsupported(message: String) -> anyhow::Error {
    Failure {
        message,
        log: String::new(),
        unsupported: true,
    }
    .into()
}

/// Probes the build unpacked in `dir` and checks it is what it was stored
/// as: its version, loaded from `dir`, with the recorded features.
fn probe(
    blender: &Blender,
    build: &BuildInfo,
    dir: &Path,
    python: PathBuf,
) -> anyhow::Result<crate::engine::blender_runtime::Installed> {
    let runtime = match build.kind {
        BuildKind::Module => Runtime::ModuleIn {
            python,
            site: dir.to_path_buf(),
        },
        BuildKind::Executable => Runtime::Executable(dir.join("blender")),
    };
    let what = format!(
        "the stored Blender {} ({})",
        build.version,
        build.kind.name()
    );
    let installed = blender.probe_build(&runtime).with_context(|| {
        let hint = match build.kind {
            BuildKind::Module => format!(
                "; a bpy build needs a Python 3.11 with numpy, zstandard and requests (--build-python, now {})",
                runtime.path().display()
            ),
            BuildKind::Executable => String::new(),
        };
        format!("{what} does not start here{hint}")
    })?;
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    if !real(&installed.loaded_from).starts_with(real(dir)) {
        anyhow::bail!(
            "{what} was loaded from {}, not from its own folder {}",
            installed.loaded_from.display(),
            dir.display()
        );
    }
    let recorded = build.offer();
    if installed.offer.version != build.version
        || (recorded.oidn && !installed.offer.oidn)
        || (recorded.osl && !installed.offer.osl)
    {
        anyhow::bail!(
            "{what} is not what was stored: it says it is {} (OpenImageDenoise {}, OSL {})",
            installed.offer.name,
            installed.offer.oidn,
            installed.offer.osl
        );
    }
    tracing::info!(
        blender = %installed.offer.name,
        path = %dir.display(),
        device = %installed.offer.render_device,
        "stored blender build probed"
    );
    Ok(installed)
}
