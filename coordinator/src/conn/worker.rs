//! A worker's session: its `Join`, then each message it sends handed to the
//! farm core, and a writer task draining the core's messages to it. A
//! finished task's output is checked against the blob store here, before
//! the core sees the result.

use std::sync::Arc;

use anyhow::bail;
use tessera_protocol::job::TileRect;
use tessera_protocol::messages::{
    check_price, TaskLog, TaskRef, WorkerInfo, WorkerMsg, MAX_CACHED_DIGESTS, MAX_INLINE_OUTPUT,
    MAX_SLOTS, MAX_TASK_LOG,
};
use tessera_protocol::text::{self, MAX_ERROR, MAX_NAME};
use tessera_protocol::Digest;
use tessera_store::BlobStore;
use tessera_transport::framing::{read_frame, write_frame_as};
use tessera_transport::Channel;
use tokio::sync::mpsc;

use crate::scheduler::{WorkerId, MAX_AHEAD_PER_SLOT};
use crate::server::{unix_ms, Shared};

pub(super) async fn serve(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    control: Channel,
    name: String,
    identity: String,
    fetch: Arc<super::fetch::Fetch>,
) -> anyhow::Result<()> {
    // What it is told goes in the encoding of its version.
    let codec = control.codec();
    let (mut send, mut recv) = control.split();
    let mut info = match read_frame::<WorkerMsg, _>(&mut recv).await? {
        Some(WorkerMsg::Join(info)) => info,
        Some(_) => bail!("worker {name} sent another message before joining"),
        None => bail!("worker {name} left before joining"),
    };
    if let Err(reason) = bound_join(&mut info) {
        bail!("worker {name} refused: {reason}");
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (slots, engines) = (info.slots, info.engines.clone());
    let id = shared.join_worker(tx, &name, &identity, info);
    fetch.joined(id);
    tracing::info!(worker = id, %name, slots, ?engines, peer = %conn.remote_address(), "worker joined");
    let writer = tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if write_frame_as(&mut send, codec, &msg).await.is_err() {
                break;
            }
        }
    });
    let result = async {
        // QUIC connection migration: a worker behind a NAT that remapped
        // it, or whose socket was rebound, keeps its connection and leases
        // from a new address; say so when its next message shows it.
        let mut peer = conn.remote_address();
        let mut last_heartbeat = None;
        while let Some(msg) = read_frame::<WorkerMsg, _>(&mut recv).await? {
            let now_at = conn.remote_address();
            if now_at != peer {
                tracing::info!(worker = id, %name, from = %peer, to = %now_at, "worker's address changed; its connection migrated");
                peer = now_at;
            }
            if let WorkerMsg::Heartbeat { .. } = msg {
                let at = std::time::Instant::now();
                if let Some(before) = last_heartbeat.replace(at) {
                    shared.watch.heartbeat_gap(at - before);
                }
                // Its lease depth follows the round trip. A heartbeat only
                // touches the core: handled here, at once.
                let rtt = conn.rtt().as_millis() as u64;
                shared.update(|core, now| {
                    core.worker_rtt(id, rtt);
                    core.worker_msg(id, msg, now)
                });
                continue;
            }
            // Results are checked against the store and may finish a job
            // (recorded in the database): on the blocking pool, one at a
            // time, in the order the worker sent them.
            shared.blocking(move |s| handle(s, id, msg)).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let requeued = match shared
        .blocking(move |s| s.update(|core, now| core.worker_left(id, now)))
        .await
    {
        Ok(requeued) => requeued,
        Err(e) => {
            tracing::error!(
                worker = id,
                "cannot requeue the leases of a worker that left: {e:#}"
            );
            0
        }
    };
    shared.forget_outbox(id);
    shared.scans.worker_left(id);
    tracing::info!(worker = id, %name, requeued, "worker left");
    writer.abort();
    result
}

/// What a worker's `Join` may claim: a price that is a finite amount ≥ 0,
/// at most [`MAX_SLOTS`] slots, a host name of [`MAX_NAME`] bytes, as many
/// held tasks as its slots and the tasks queued behind them may be
/// ([`MAX_AHEAD_PER_SLOT`] a slot) and [`MAX_CACHED_DIGESTS`] cached files;
/// more is cut off, a bad price refuses the worker.
fn bound_join(info: &mut WorkerInfo) -> Result<(), String> {
    check_price(info.price_per_hour)?;
    info.slots = info.slots.min(MAX_SLOTS);
    text::truncate_in_place(&mut info.hostname, MAX_NAME);
    let held = info.slots.saturating_mul(1 + MAX_AHEAD_PER_SLOT);
    info.holding.truncate(held as usize);
    info.cached.truncate(MAX_CACHED_DIGESTS);
    Ok(())
}

/// One message from worker `id`.
fn handle(shared: &Arc<Shared>, id: WorkerId, msg: WorkerMsg) {
    match msg {
        WorkerMsg::Done {
            task,
            output,
            render_ms,
            inline,
        } => {
            // The lease first: a result for a task this worker does not
            // hold stores nothing.
            let expected = shared.read(|core, _| {
                core.holds(id, task)
                    .map_err(|refused| refused.to_string())?;
                let rect = core.expected_output(task).ok_or("the task has no output")?;
                Ok::<_, String>((rect, core.expected_bundle(task)))
            });
            let ((rect, whole), bundle) = match expected {
                Ok(expected) => expected,
                Err(reason) => {
                    shared.update(|core, _| core.refuse(id, task, reason));
                    return;
                }
            };
            let stored = check_output(shared, output, inline.as_deref(), rect, whole)
                .and_then(|()| match &bundle {
                    Some(due) => check_bundle(shared, output, inline.as_deref(), due),
                    None => Ok(()),
                })
                .and_then(|()| store_output(shared, output, inline));
            let similar = match stored {
                Ok(()) => similar_renders(shared, id, task, output),
                Err(_) => Vec::new(),
            };
            shared.update(|core, now| match stored {
                Ok(()) => core.result_offered_similar(id, task, output, render_ms, &similar, now),
                Err(reason) => core.result_rejected(id, task, reason, now),
            });
        }
        WorkerMsg::Failed {
            task,
            mut error,
            mut log,
            unsupported,
        } => {
            text::truncate_in_place(&mut error, MAX_ERROR);
            keep_tail(&mut log, MAX_TASK_LOG);
            let entry = TaskLog {
                task: task.index,
                worker: id,
                unix_ms: unix_ms(),
                error: error.clone(),
                log,
            };
            if let Err(e) = shared.db().insert_task_log(task.job, &entry) {
                tracing::warn!(job = task.job, "cannot keep a failed task's log: {e}");
            }
            let msg = WorkerMsg::Failed {
                task,
                error,
                log: String::new(),
                unsupported,
            };
            shared.update(|core, now| core.worker_msg(id, msg, now));
        }
        WorkerMsg::Cached { mut added, removed } => {
            added.truncate(MAX_CACHED_DIGESTS);
            let msg = WorkerMsg::Cached { added, removed };
            shared.update(|core, now| core.worker_msg(id, msg, now));
        }
        WorkerMsg::Scanned { id: scan, result } => shared.scans.answered(id, scan, result),
        msg => shared.update(|core, now| core.worker_msg(id, msg, now)),
    }
}

/// The earlier renders of a task being checked (`--verify`) that `output`
/// agrees with within `compare::TOLERANCE`, for the pairs whose engine is
/// not deterministic between their workers.
fn similar_renders(shared: &Shared, id: WorkerId, task: TaskRef, output: Digest) -> Vec<Digest> {
    let earlier = shared.read(|core, _| core.inexact_opinions(id, task));
    if earlier.is_empty() {
        return earlier;
    }
    let Ok(mine) = shared.store.get(&output) else {
        return Vec::new();
    };
    (earlier.into_iter())
        .filter(|d| {
            (shared.store.get(d))
                .is_ok_and(|theirs| crate::compare::within_tolerance(&mine, &theirs))
        })
        .collect()
}

/// Cuts `log` to its last `max` bytes (on a character boundary): the end
/// of a renderer's log says why it failed.
fn keep_tail(log: &mut String, max: usize) {
    if log.len() > max {
        let mut start = log.len() - max;
        while !log.is_char_boundary(start) {
            start += 1;
        }
        log.replace_range(..start, "");
    }
}

/// Bytes per pixel a task's output may take: a float OpenEXR of 32
/// four-channel passes, uncompressed, is 512.
const MAX_OUTPUT_BYTES_PER_PIXEL: u64 = 512;
/// Room for headers and metadata on top of the pixels.
const OUTPUT_SLACK: u64 = 1 << 20;

/// Checks an output against its task before it is stored or accepted:
/// its size is capped by the tile rectangle, and a tile — PNG, float tile
/// (4 channels), sample-sum tile or OpenEXR (channels present) — must have
/// the tile's dimensions and, for the raw tile formats, exactly the length
/// they imply (the frame's only task may be any image the renderer wrote,
/// within the same size cap).
fn check_output(
    shared: &Shared,
    output: Digest,
    inline: Option<&[u8]>,
    rect: TileRect,
    whole: bool,
) -> Result<(), String> {
    let size = match inline {
        Some(bytes) => bytes.len() as u64,
        None => shared
            .store
            .has(&output)
            .ok_or_else(|| format!("output blob {output} was not uploaded"))?,
    };
    let cap =
        u64::from(rect.width) * u64::from(rect.height) * MAX_OUTPUT_BYTES_PER_PIXEL + OUTPUT_SLACK;
    if size > cap {
        return Err(format!(
            "the output is {size} bytes; a {}x{} tile's is at most {cap}",
            rect.width, rect.height
        ));
    }
    if whole {
        // The frame's only task: the renderer's file is the frame, in
        // whatever format it wrote.
        return Ok(());
    }
    let mut head = [0u8; PNG_HEAD];
    let head = match inline {
        Some(bytes) => &bytes[..bytes.len().min(PNG_HEAD)],
        None => {
            let n = read_head(&shared.store.inner().path(&output), &mut head)
                .map_err(|e| format!("cannot read the output: {e}"))?;
            &head[..n]
        }
    };
    let tile = (rect.width, rect.height);
    let (kind, dims) = if let Some(dims) = png_dimensions(head) {
        ("PNG", dims)
    } else if head.starts_with(tessera_protocol::float_tile::MAGIC) {
        let (dims, channels) = (words(head, 0), words(head, 2).0);
        if channels != 4 {
            return Err(format!(
                "the output is a float tile of {channels} channels; float tiles have 4 (RGBA)"
            ));
        }
        check_length("float tile", size, dims, 16, 20)?;
        ("float tile", dims)
    } else if head.starts_with(tessera_protocol::sums::MAGIC) {
        let dims = words(head, 0);
        check_length("sample-sum tile", size, dims, 24, 16)?;
        ("sample-sum tile", dims)
    } else if head.starts_with(&EXR_MAGIC) {
        let dims = match inline {
            Some(bytes) => exr_dimensions(std::io::Cursor::new(bytes)),
            None => std::fs::File::open(shared.store.inner().path(&output))
                .map_err(|e| format!("cannot read the output: {e}"))
                .and_then(|f| exr_dimensions(std::io::BufReader::new(f))),
        }?;
        ("OpenEXR", dims)
    } else {
        return Err("the output is not a PNG, float tile, sample-sum tile or OpenEXR image".into());
    };
    if dims != tile {
        return Err(format!(
            "the output is a {}x{} {kind}; the tile is {}x{}",
            dims.0, dims.1, rect.width, rect.height
        ));
    }
    Ok(())
}

/// OpenEXR's magic number.
const EXR_MAGIC: [u8; 4] = [0x76, 0x2f, 0x31, 0x01];

/// Two little-endian u32 from a float or sum tile's header, after its
/// magic: (width, height) at word `at`, (channels, _) at word 2.
fn words(head: &[u8], at: usize) -> (u32, u32) {
    let word = |i: usize| {
        head.get(4 + i * 4..8 + i * 4)
            .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    };
    (word(at), word(at + 1))
}

/// A float or sum tile's length must be its header plus its pixels.
fn check_length(
    kind: &str,
    size: u64,
    (w, h): (u32, u32),
    per_pixel: u64,
    header: u64,
) -> Result<(), String> {
    let want = u64::from(w) * u64::from(h) * per_pixel + header;
    if size != want {
        return Err(format!(
            "the output is a {w}x{h} {kind} of {size} bytes; it should be {want}"
        ));
    }
    Ok(())
}

/// The size of an OpenEXR's first layer (what stitching reads), read from
/// its headers alone; a layer must have channels.
fn exr_dimensions(reader: impl std::io::Read + std::io::Seek) -> Result<(u32, u32), String> {
    let meta = exr::meta::MetaData::read_from_buffered(reader, false)
        .map_err(|e| format!("the output is not a readable OpenEXR image: {e}"))?;
    let header = meta
        .headers
        .first()
        .ok_or("the OpenEXR image has no layer")?;
    if header.channels.list.is_empty() {
        return Err("the OpenEXR image has no channels".into());
    }
    let size = header.layer_size;
    Ok((size.0 as u32, size.1 as u32))
}

/// An Unreal chunk's bundle must hold exactly the chunk's frames, each
/// under the job's name for it and in its format, before it is stored: a
/// bad one is the worker's failed attempt, not the job's.
fn check_bundle(
    shared: &Shared,
    output: Digest,
    inline: Option<&[u8]>,
    (frames, format): &(Vec<(u32, String)>, tessera_protocol::job::OutputFormat),
) -> Result<(), String> {
    let read;
    let bytes = match inline {
        Some(b) => b,
        None => {
            read =
                (shared.store.get(&output)).map_err(|e| format!("cannot read the output: {e}"))?;
            &read[..]
        }
    };
    let bundle = tessera_protocol::unreal::Bundle::decode(bytes)?;
    bundle.check(frames, *format)
}

/// A PNG's signature and header chunk: enough for its dimensions.
const PNG_HEAD: usize = 24;

fn read_head(path: &std::path::Path, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Width and height from a PNG's header, or `None` when `head` is not the
/// start of a PNG.
fn png_dimensions(head: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    if head.len() < PNG_HEAD || head[..8] != SIGNATURE || &head[12..16] != b"IHDR" {
        return None;
    }
    let be = |at: usize| u32::from_be_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    Some((be(16), be(20)))
}

/// Stores an inline output after checking it against its digest, or checks
/// that an uploaded one is there.
fn store_output(shared: &Shared, output: Digest, inline: Option<Vec<u8>>) -> Result<(), String> {
    if let Some(bytes) = inline {
        if bytes.len() > MAX_INLINE_OUTPUT || Digest::of(&bytes) != output {
            return Err(format!("inline output does not match its digest {output}"));
        }
        // Synced with its commit, off this task (see `commit.rs`).
        if let Err(e) = shared.store.inner().put_unsynced(&output, &bytes) {
            return Err(format!("cannot store the output: {e}"));
        }
    } else if !shared.store.inner().dir().contains(&output) {
        return Err(format!("output blob {output} was not uploaded"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_dimensions_come_from_the_header_and_logs_keep_their_tail() {
        let mut png = Vec::new();
        let mut enc = png::Encoder::new(&mut png, 160, 90);
        enc.set_color(png::ColorType::Rgb);
        let data = vec![0u8; 160 * 90 * 3];
        enc.write_header().unwrap().write_image_data(&data).unwrap();
        assert_eq!(png_dimensions(&png[..PNG_HEAD]), Some((160, 90)));
        assert_eq!(png_dimensions(b"not a png at all, just bytes"), None);
        assert_eq!(png_dimensions(&png[..10]), None);

        // Float, sum and OpenEXR tiles: their dimensions from their headers.
        let float = tessera_protocol::float_tile::FloatTile {
            width: 3,
            height: 2,
            samples: 1,
            rgba: vec![0.5; 24],
        }
        .encode();
        assert_eq!(words(&float, 0), (3, 2));
        assert_eq!(words(&float, 2).0, 4, "channels");
        assert!(check_length("float tile", float.len() as u64, (3, 2), 16, 20).is_ok());
        let short = check_length("float tile", float.len() as u64 - 4, (3, 2), 16, 20);
        assert!(short.unwrap_err().contains("should be 116"));
        let exr = crate::exr::encode_rgba_f32(5, 4, &[0.25; 80]);
        assert!(exr.starts_with(&EXR_MAGIC));
        assert_eq!(exr_dimensions(std::io::Cursor::new(&exr)), Ok((5, 4)));
        let mut broken = exr.clone();
        broken.truncate(12);
        assert!(exr_dimensions(std::io::Cursor::new(&broken)).is_err());

        let mut log = format!("{}é the end", "x".repeat(100));
        keep_tail(&mut log, 9);
        assert_eq!(log, " the end", "cut on a character boundary");
    }
}
