//! Encode jobs on the coordinator (see `tessera_protocol::encode`): what a
//! submit of one must say, the frame size it inherits from the job it
//! encodes, and its input files, read from that job's stitched frames once
//! it has ended.

use anyhow::bail;
use tessera_protocol::encode::{self, EncodeSpec};
use tessera_protocol::job::{frame_file_name, Engine, JobSpec, ManifestEntry, OutputFormat};
use tessera_protocol::messages::ClientError;

use crate::db::Db;
use crate::server::Shared;
use crate::service::internal;

/// Checks what an encode job (or a job that says it is one) says of
/// itself; called by `submit::validate`.
pub fn check(spec: &JobSpec) -> anyhow::Result<()> {
    let encode = match (spec.engine, &spec.encode) {
        (Engine::Ffmpeg, Some(e)) => e,
        (Engine::Ffmpeg, None) => {
            bail!("an ffmpeg job needs its `encode` (the job whose frames it encodes)")
        }
        (other, Some(_)) => bail!("`encode` is for ffmpeg jobs; this is a {other} job"),
        (_, None) => return Ok(()),
    };
    check_encode(spec, encode)
}

fn check_encode(spec: &JobSpec, encode: &EncodeSpec) -> anyhow::Result<()> {
    if !spec.after.contains(&encode.input) {
        bail!(
            "an encode job runs after the job whose frames it encodes: add {} to `after`",
            encode.input
        );
    }
    if !spec.manifest.is_empty() {
        bail!(
            "an encode job has no files of its own: its inputs are job {}'s frames",
            encode.input
        );
    }
    if spec.frames != [1] || spec.tiles.count() != 1 || spec.sample_ranges != 1 {
        bail!("an encode job is one task: frames [1], tiles 1x1, one sample range");
    }
    if spec.output != OutputFormat::Image || spec.finish || spec.blender.is_some() {
        bail!("an encode job writes a movie (output `image`), with no Blender settings");
    }
    let movie = spec.output_name.as_deref().unwrap_or_default();
    encode::check_movie_name(movie).map_err(anyhow::Error::msg)?;
    encode::check_options(&encode.input_options, true).map_err(anyhow::Error::msg)?;
    encode::check_options(&encode.output_options, false).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Before an encode job is validated: it takes the frame size of the job
/// it encodes (which bounds the size of its result), and that job must
/// make frames (not be another encode job).
pub(crate) fn prepare(shared: &Shared, spec: &mut JobSpec) -> Result<(), ClientError> {
    let Some(input) = spec.encode.as_ref().map(|e| e.input) else {
        return Ok(());
    };
    let stored = shared.db().job(input).map_err(internal)?;
    let Some(stored) = stored else {
        return Err(ClientError::invalid(format!(
            "encode: there is no job {input} on this coordinator"
        )));
    };
    if stored.spec.encode.is_some() {
        return Err(ClientError::invalid(format!(
            "encode: job {input} is an encode job; an encode job encodes a render's frames"
        )));
    }
    spec.resolution = stored.spec.resolution;
    Ok(())
}

/// The input files of an encode job: the frames job `input` stitched, in
/// frame order, as [`encode::input_path`] names them (with the extension
/// the job gives its frames); or why there are none to encode.
pub(crate) fn inputs(db: &Db, input: u64) -> Result<Vec<ManifestEntry>, String> {
    let read = |e: crate::db::DbError| format!("cannot read job {input}'s frames: {e}");
    let stored = db
        .job(input)
        .map_err(read)?
        .ok_or_else(|| format!("job {input}, whose frames it encodes, is gone"))?;
    let frames = db.frames(input).map_err(read)?;
    if frames.is_empty() {
        return Err(format!(
            "job {input}, whose frames it encodes, has no frames"
        ));
    }
    let spec = &stored.spec;
    let name = (spec.output_name.as_deref()).and_then(|t| frame_file_name(t, frames[0].frame));
    let ext = match &name {
        Some(n) => n.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()),
        None => Some(spec.output.extension().to_string()),
    }
    .filter(|e| encode::is_image_extension(e))
    .ok_or_else(|| {
        format!(
            "job {input}'s frames have no image extension ffmpeg can read by (name them with --render-output and --use-extension 1)"
        )
    })?;
    Ok((frames.iter().enumerate())
        .map(|(i, f)| ManifestEntry {
            path: encode::input_path(i, &ext),
            digest: f.digest,
            size: f.size,
            origin: None,
            frame: None,
        })
        .collect())
}
