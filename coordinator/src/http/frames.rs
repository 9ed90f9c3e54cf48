//! Stitched frames over HTTP: one frame's bytes, every frame of a job as
//! one zip streamed as it is written, and which blobs the store lacks.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use tessera_protocol::messages::ClientError;
use tessera_protocol::Digest;
use tessera_store::BlobStore;
use tokio::sync::mpsc;

use super::events::ChannelBody;
use super::{body_json, full, ok_json, refused, Body};
use crate::server::Shared;
use crate::service::{self, off_runtime as off};

/// `GET /v1/jobs/{job}/frames/{frame}`: the stitched frame's bytes, with
/// its digest and (when it is a plain name) its file name.
pub(super) async fn frame(
    shared: &Arc<Shared>,
    job: u64,
    frame: u32,
) -> anyhow::Result<Response<Body>> {
    let found = match off(shared, move |s| service::frame(s, job, frame)).await {
        Ok(found) => found,
        Err(e) => return Ok(refused(&e)),
    };
    let shared2 = shared.clone();
    let bytes = tokio::task::spawn_blocking(move || shared2.store.get(&found.digest))
        .await?
        .with_context(|| format!("reading frame {frame} of job {job}"))?;
    shared.http_bytes_out(bytes.len() as u64);
    let mut r = full(StatusCode::OK, "application/octet-stream", bytes);
    let h = r.headers_mut();
    h.insert(
        "x-tessera-digest",
        HeaderValue::from_str(&found.digest.to_hex()).expect("hex"),
    );
    if let Some(name) = found
        .name
        .as_deref()
        .filter(|n| n.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
    {
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
            h.insert("content-disposition", v);
        }
    }
    Ok(r)
}

/// `POST /v1/blobs/missing`: which of the asked digests the store lacks.
pub(super) async fn blobs_missing(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
) -> anyhow::Result<Response<Body>> {
    #[derive(serde::Deserialize)]
    struct Asked {
        digests: Vec<Digest>,
    }
    let asked: Asked = match body_json(req).await {
        Ok(a) => a,
        Err(r) => return Ok(r),
    };
    let missing: Vec<Digest> = shared
        .blocking(move |s| {
            (asked.digests.into_iter())
                .filter(|d| !s.store.touch(d))
                .collect()
        })
        .await?;
    Ok(ok_json(StatusCode::OK, &json!({ "missing": missing })))
}

/// How many pieces of a zip may wait for a slow reader: a download holds
/// at most this many [`ZIP_PIECE`]s in memory, whatever the frames' size.
const ZIP_QUEUE: usize = 4;
const ZIP_PIECE: usize = 1 << 20;
/// A reader that takes no piece for this long has stalled: its download
/// ends, and its place (one of [`ZIPS_AT_ONCE`]) is free again.
const ZIP_STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// The most zips written at once, and from one address: each holds a
/// blocking thread for as long as its reader takes (a reader that stalls
/// gives its place back after [`ZIP_STALL`]), and one address cannot take
/// every place.
const ZIPS_AT_ONCE: usize = 8;
const ZIPS_PER_ADDRESS: usize = 2;
static ZIPS: std::sync::Mutex<Option<HashMap<IpAddr, usize>>> = std::sync::Mutex::new(None);

/// One of the [`ZIPS_AT_ONCE`] places, given back when dropped.
struct ZipSlot(IpAddr);

impl ZipSlot {
    /// A place for a zip to `peer`, or why there is none.
    fn take(peer: IpAddr) -> Result<ZipSlot, String> {
        let mut zips = crate::shared::relock(&ZIPS);
        let zips = zips.get_or_insert_with(HashMap::new);
        if zips.values().sum::<usize>() >= ZIPS_AT_ONCE {
            return Err(format!(
                "{ZIPS_AT_ONCE} zips are being downloaded: try again when one is done"
            ));
        }
        let mine = zips.entry(peer).or_default();
        if *mine >= ZIPS_PER_ADDRESS {
            return Err(format!(
                "{ZIPS_PER_ADDRESS} zips are being downloaded to {peer} already: try again when one is done"
            ));
        }
        *mine += 1;
        Ok(ZipSlot(peer))
    }
}

impl Drop for ZipSlot {
    fn drop(&mut self) {
        let mut zips = crate::shared::relock(&ZIPS);
        if let Some(zips) = zips.as_mut() {
            if let Some(n) = zips.get_mut(&self.0) {
                *n -= 1;
                if *n == 0 {
                    zips.remove(&self.0);
                }
            }
        }
    }
}

/// `GET /v1/jobs/{job}/frames.zip`: every frame stitched so far, named as
/// `wait --output` names them, stored (frames are compressed already), as
/// ZIP64 when large. Written on the blocking pool into a bounded channel:
/// memory is a few pieces whatever the job's size, and a reader that goes
/// away stops the writing. A frame that cannot be read ends the stream
/// early, so the archive is incomplete and readers see it as broken.
pub(super) async fn zip(
    shared: &Arc<Shared>,
    job: u64,
    peer: IpAddr,
) -> anyhow::Result<Response<Body>> {
    let frames = match off(shared, move |s| service::frames(s, job)).await {
        Ok(frames) => frames,
        Err(e) => return Ok(refused(&e)),
    };
    let slot = match ZipSlot::take(peer) {
        Ok(slot) => slot,
        Err(why) => return Ok(refused(&ClientError::unavailable(why))),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(ZIP_QUEUE);
    let writer = shared.clone();
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let sink = ChannelWriter {
            tx,
            runtime,
            piece: Vec::with_capacity(ZIP_PIECE),
            sent: 0,
        };
        match write_zip(&writer, job, &frames, sink) {
            Ok(sent) => writer.http_bytes_out(sent),
            Err(e) => tracing::warn!(job, "the zip of job {job}'s frames stopped: {e:#}"),
        }
    });
    let mut r = Response::new(ChannelBody(rx).boxed());
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/zip"));
    h.insert(
        "content-disposition",
        HeaderValue::from_str(&format!("attachment; filename=\"job_{job}_frames.zip\""))
            .expect("a plain header"),
    );
    Ok(r)
}

fn write_zip(
    shared: &Shared,
    job: u64,
    frames: &[tessera_protocol::messages::FrameOutput],
    sink: ChannelWriter,
) -> anyhow::Result<u64> {
    let mut zip = zip::ZipWriter::new_stream(sink);
    let stored = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .large_file(true);
    let mut names = std::collections::HashSet::new();
    for f in frames {
        // Two frames the scene names alike get the plain name each.
        let mut name = f.file_name();
        if !names.insert(name.clone()) {
            name = format!("frame_{:04}.{}", f.frame, f.format.extension());
            names.insert(name.clone());
        }
        let bytes = (shared.store.get(&f.digest))
            .with_context(|| format!("reading frame {} of job {job}", f.frame))?;
        zip.start_file(name, stored)?;
        zip.write_all(&bytes)?;
    }
    let mut sink = zip.finish()?.into_inner();
    sink.flush()?;
    Ok(sink.sent)
}

/// A `Write` that hands what is written to an HTTP body, a piece at a
/// time; it fails once the body's reader is gone.
struct ChannelWriter {
    tx: mpsc::Sender<Bytes>,
    /// To wait for room in the channel, at most [`ZIP_STALL`], from the
    /// blocking thread the zip is written on.
    runtime: tokio::runtime::Handle,
    piece: Vec<u8>,
    sent: u64,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = ZIP_PIECE - self.piece.len();
        let n = buf.len().min(room);
        self.piece.extend_from_slice(&buf[..n]);
        if self.piece.len() == ZIP_PIECE {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.piece, Vec::with_capacity(ZIP_PIECE));
        self.sent += piece.len() as u64;
        let sent = (self.runtime).block_on(self.tx.send_timeout(Bytes::from(piece), ZIP_STALL));
        sent.map_err(|e| match e {
            mpsc::error::SendTimeoutError::Timeout(_) => std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the reader took nothing for {} s", ZIP_STALL.as_secs()),
            ),
            mpsc::error::SendTimeoutError::Closed(_) => {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader went away")
            }
        })
    }
}
