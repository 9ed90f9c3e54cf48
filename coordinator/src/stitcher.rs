//! Stitching a finished frame: reads its tasks' outputs from the blob
//! store, joins tiles and merges sample ranges (see [`crate::stitch`]),
//! stores the frame, records it, and tells the farm core.
//!
//! Frames are stitched one at a time on one thread, like results are
//! committed on one: a frame's buffers are reused from one frame to the
//! next instead of being spread over the blocking pool's threads, whose
//! allocator arenas would keep them (memory follows active work).

use std::sync::Arc;

use tokio::sync::mpsc;

use anyhow::{bail, Context};
use tessera_protocol::job::{JobSpec, OutputFormat};
use tessera_protocol::messages::StitchedPasses;
use tessera_protocol::sums::SumTile;
use tessera_store::BlobStore;

use crate::commit::{FAILPOINT, FAILPOINT_EXIT_AFTER_PASSES};
use crate::db::StoredFrame;
use crate::farm::StitchStage;
use crate::server::Shared;
use crate::{exr, stitch};

/// What the stitch thread is given.
pub(crate) enum StitchMsg {
    /// Stitch frame `frame_pos` of `job`.
    Frame { job: u64, frame_pos: usize },
    /// Finish what came before, then end.
    Stop,
}

/// The stitch thread: stitches each frame it is given; a failure fails
/// the job, unless the database could not be reached (the stitch waits
/// for it) or another coordinator serves the farm now (which stitches the
/// frame when it restores the job).
pub(crate) fn stitcher(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<StitchMsg>) {
    use crate::commit::Unreachable;
    while let Some(StitchMsg::Frame { job, frame_pos }) = rx.blocking_recv() {
        let mut bucket_said = None;
        let mut damaged_since = None;
        let stitched = loop {
            match crate::commit::patiently("stitch", || stitch_frame(&shared, job, frame_pos)) {
                Err(e) if e.unreachable() && !shared.lease.lost() => {
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                // A blob read from the bucket did not hash right (twice):
                // a damaging path looks like rot, so it is read again for
                // a while before the frame (and its job) is given up on.
                Err(e)
                    if damaged_in_the_bucket(&shared, &e)
                        && damaged_since
                            .get_or_insert_with(std::time::Instant::now)
                            .elapsed()
                            < DAMAGED_PATIENCE
                        && !shared.lease.lost() =>
                {
                    std::thread::sleep(std::time::Duration::from_secs(2));
                }
                // The bucket out of reach or refusing (a revoked key): an
                // outage, waited out; the frame is stitched once it ends.
                Err(e) if the_buckets(&e) && !shared.lease.lost() => {
                    if bucket_said.is_none_or(|at: std::time::Instant| {
                        at.elapsed() >= std::time::Duration::from_secs(10)
                    }) {
                        tracing::warn!(
                            job,
                            "cannot store a stitched frame, waiting for the bucket: {e:#}"
                        );
                        bucket_said = Some(std::time::Instant::now());
                    }
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
                outcome => break outcome,
            }
        };
        if let Err(e) = stitched {
            if crate::commit::is_transient(&e) {
                tracing::warn!(job, "frame left unstitched: {e:#}");
                continue;
            }
            let error = format!("stitching failed: {e:#}");
            shared.update(|core, now| core.fail_job(job, error, now));
        }
    }
}

/// How long a frame whose blobs read back damaged from the bucket is
/// tried again before its job fails.
const DAMAGED_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether `e` says a blob read from the farm's bucket did not hash right.
fn damaged_in_the_bucket(shared: &Shared, e: &anyhow::Error) -> bool {
    shared.store.inner().bucket().is_some()
        && e.chain().any(|c| {
            matches!(
                c.downcast_ref::<tessera_store::blob::BlobError>(),
                Some(tessera_store::blob::BlobError::Corrupt(_))
            )
        })
}

/// Whether `e` is the bucket's answer (see
/// [`tessera_store::backed::is_the_buckets`]).
fn the_buckets(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<tessera_store::blob::BlobError>()
            .is_some_and(tessera_store::backed::is_the_buckets)
    })
}

fn stitch_frame(shared: &Arc<Shared>, job_id: u64, frame_pos: usize) -> anyhow::Result<()> {
    let Some(plan) = shared.read(|core, _| core.stitch_plan(job_id, frame_pos)) else {
        return Ok(());
    };
    let spec = plan.spec;
    let frame = spec.frames[frame_pos];
    let image = match plan.stage {
        StitchStage::Finished => {
            // The finishing task wrote the frame, as Blender writes it; a
            // multilayer one is completed with the frame's stitched passes.
            let finishing = plan.first + plan.renders;
            let output = shared.db().result_range(job_id, finishing, 1)?;
            let Some(digest) = output.first() else {
                bail!("frame {frame}: its finishing task's result is not stored");
            };
            let finished = shared.store.get(digest)?;
            if exr::finish::needs_passes(&finished) {
                let passes = plan.passes.with_context(|| {
                    format!("frame {frame}: its stitched passes are not recorded")
                })?;
                let stitched = shared.store.get(&passes.digest)?;
                exr::finish::complete(&stitched, &finished)
                    .with_context(|| format!("frame {frame}: completing the finished frame"))?
            } else {
                finished
            }
        }
        StitchStage::Frame | StitchStage::Passes => {
            stitch_results(shared, job_id, &spec, frame_pos, plan.first, plan.renders)?
        }
    };
    let digest = shared.store.put_bytes(&image)?;
    // In the bucket before the frame is recorded: `put_bytes` skips bytes
    // this machine's folder holds already, which a coordinator killed
    // between storing and uploading them may hold only there.
    shared.store.inner().sync(&[digest])?;
    let size = image.len() as u64;
    if plan.stage == StitchStage::Passes {
        // The finishing task's input: kept out of the job's frames.
        shared.db().insert_passes(job_id, frame, digest, size)?;
        if std::env::var(FAILPOINT).is_ok_and(|v| v == FAILPOINT_EXIT_AFTER_PASSES) {
            // The test of a restart between a frame's passes and its
            // finishing task: die like a killed process, passes recorded.
            tracing::warn!(
                job = job_id,
                frame,
                "failpoint: exiting after stitching passes"
            );
            std::process::abort();
        }
        tracing::info!(
            job = job_id,
            frame,
            "passes stitched; finishing task queued"
        );
        let passes = StitchedPasses { digest, size };
        shared.update(|core, _| core.passes_stitched(job_id, frame_pos, passes));
        return Ok(());
    }
    shared.db().insert_frame(
        job_id,
        &StoredFrame {
            frame,
            digest,
            size,
        },
    )?;
    tracing::info!(job = job_id, frame, "frame stitched");
    let ((), recorded) = shared.act(|core, now| core.frame_stitched(job_id, frame_pos, now));
    recorded
}

/// A frame (or its passes) from the `count` results from task `first` on:
/// tiles joined, sample ranges merged.
fn stitch_results(
    shared: &Arc<Shared>,
    job_id: u64,
    spec: &JobSpec,
    frame_pos: usize,
    first: u32,
    per_frame: u32,
) -> anyhow::Result<Vec<u8>> {
    let frame = spec.frames[frame_pos];
    if let Some(unreal) = &spec.unreal {
        let task = shared
            .read(|core, _| core.chunk_task(job_id, frame_pos))
            .with_context(|| format!("frame {frame} is in none of the job's chunks"))?;
        let outputs = shared.db().result_range(job_id, task, 1)?;
        let output = outputs.first().with_context(|| {
            format!("frame {frame}: the result of chunk task {task} is not stored")
        })?;
        let name = unreal.frame_file_name(&spec.frames, frame, spec.output);
        let image = unreal_frame(&shared.store.get(output)?, frame, &name, spec.output)?;
        return Ok(image);
    }
    let outputs = shared.db().result_range(job_id, first, per_frame)?;
    if outputs.len() != per_frame as usize {
        bail!(
            "frame {frame}: {} of {per_frame} results are stored",
            outputs.len()
        );
    }
    let (w, h) = spec.resolution;
    let ranges = spec.sample_ranges as usize;
    // Outputs are in task order: tile after tile, each with its sample ranges.
    let mut tiles = Vec::with_capacity(outputs.len() / ranges);
    for (i, chunk) in outputs.chunks(ranges).enumerate() {
        let parts = chunk
            .iter()
            .map(|d| shared.store.get(d))
            .collect::<Result<Vec<_>, _>>()?;
        tiles.push((spec.tiles.rect(i as u32, w, h), parts));
    }
    let float = tiles
        .iter()
        .all(|(_, parts)| parts.iter().all(|p| stitch::is_float_tile(p)));
    let sums = (tiles.iter()).all(|(_, parts)| parts.iter().all(|p| SumTile::is_sums(p)));
    let whole = tiles.len() == 1
        && tiles[0].1.len() == 1
        && (tiles[0].0.width, tiles[0].0.height) == (w, h);
    let layers = (tiles.iter()).all(|(_, parts)| parts.iter().all(|p| exr::is_exr(p)));
    let image = if whole && !sums && !float {
        // One task rendered the whole frame: the renderer's file is the
        // frame, untouched (its format, passes, codec and metadata).
        tiles.remove(0).1.remove(0)
    } else if layers {
        // OpenEXR tiles and sample ranges with every layer and pass: ranges
        // merged and tiles stitched channel by channel, written with the
        // scene's codec and metadata.
        let n = spec.samples;
        let k = spec.sample_ranges;
        let weights: Vec<u32> = (0..k).map(|r| n * (r + 1) / k - n * r / k).collect();
        exr::stitch_layers(w, h, &tiles, &weights).with_context(|| format!("frame {frame}"))?
    } else if sums {
        stitch::stitch_sums(w, h, &tiles, spec.samples).with_context(|| format!("frame {frame}"))?
    } else if float {
        let rgba = stitch::stitch_float(w, h, &tiles).with_context(|| format!("frame {frame}"))?;
        if spec.output != OutputFormat::Exr {
            bail!("frame {frame}: float tiles need EXR output");
        }
        exr::encode_rgba_f32(w, h, &rgba)
    } else {
        if ranges != 1 {
            bail!("frame {frame}: sample ranges must render float tiles");
        }
        let pngs: Vec<_> = tiles
            .into_iter()
            .map(|(rect, mut parts)| (rect, parts.remove(0)))
            .collect();
        stitch::stitch_png(w, h, &pngs).with_context(|| format!("frame {frame}"))?
    };
    Ok(image)
}

/// Takes frame `frame` out of a chunk task's bundle: the file Movie Render
/// Queue wrote, under the name its config gives it, in the job's format.
fn unreal_frame(
    bundle: &[u8],
    frame: u32,
    name: &str,
    format: OutputFormat,
) -> anyhow::Result<Vec<u8>> {
    let bundle = tessera_protocol::unreal::Bundle::decode(bundle)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("frame {frame}"))?;
    let Some(f) = bundle.frames.into_iter().find(|f| f.frame == frame) else {
        bail!("frame {frame}: the chunk's result does not hold it");
    };
    if f.name != name {
        bail!(
            "frame {frame}: Movie Render Queue named it `{}`, the job expects `{name}`",
            f.name
        );
    }
    let magic_ok = match format {
        OutputFormat::Png => f.bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        OutputFormat::Exr => exr::is_exr(&f.bytes),
        OutputFormat::Image => false,
    };
    if !magic_ok {
        bail!(
            "frame {frame}: `{name}` is not a {} file",
            format.extension()
        );
    }
    Ok(f.bytes)
}
