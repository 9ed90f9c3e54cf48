//! Previews for the dashboard: a stitched frame scaled down to at most
//! [`EDGE`] pixels a side, and each tile of a frame being rendered scaled
//! by the same factor (the mosaic), as 8-bit PNG. PNG frames are averaged
//! down as they are; OpenEXR frames and float tiles (linear light) are
//! clamped to 0–1 and given the sRGB transfer curve, as Blender's
//! "Standard" view shows them; sample-sum tiles show the mean of the
//! samples they hold. A preview is made once, the first time it is asked
//! for, and stored like other blobs: the `previews` table names it (or why
//! none can be made) by the blob it was made of, and garbage collection
//! takes it with its job. One preview is made at a time
//! ([`Previews::making`]): asked for at once by many, a frame is decoded
//! once and its memory is one frame's; frames over [`MAX_PIXELS`] get
//! none.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use hyper::{Response, StatusCode};
use tessera_protocol::float_tile::FloatTile;
use tessera_protocol::sums::{srgb8, SumTile};
use tessera_protocol::Digest;
use tessera_store::BlobStore;

use super::{error, full, refused, Body};
use crate::server::Shared;
use crate::service::{self, off_runtime as off};

/// The longest side of a preview, in pixels.
pub const EDGE: u32 = 320;
/// The largest frame a preview is made of (pixels: 8K UHD, 7680x4320, is
/// 33 million), and the most bytes its decoding may take.
pub const MAX_PIXELS: u64 = 40_000_000;
const MAX_DECODED: usize = 1 << 30;
/// The most channel samples of an OpenEXR frame's first layer a preview
/// reads (4 bytes each as float: 640 MB).
const MAX_EXR_SAMPLES: u64 = 160_000_000;

/// Previews being made.
#[derive(Default)]
pub struct Previews {
    /// Held while a preview is made: one at a time.
    pub making: Mutex<()>,
}

/// Why no preview could be made.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("the frame cannot be read: {0}")]
    Unreadable(String),
    #[error("the frame is {0}x{1}: past the {MAX_PIXELS}-pixel bound for previews")]
    TooLarge(u32, u32),
}

/// The preview of a PNG or OpenEXR frame's bytes (8-bit RGBA PNG).
pub fn make(frame: &[u8]) -> Result<Vec<u8>, PreviewError> {
    let (w, h, rgba) = rgba8(frame)?;
    let (pw, ph, small) = shrink(w, h, &rgba, w.max(h).div_ceil(EDGE).max(1));
    encode(pw, ph, &small)
}

/// The preview of one tile's bytes (PNG, OpenEXR, a float tile or a
/// sample-sum tile) at the scale of its frame's preview: a frame of
/// `frame_w` × `frame_h`.
pub fn make_tile(tile: &[u8], (frame_w, frame_h): (u32, u32)) -> Result<Vec<u8>, PreviewError> {
    let (w, h, rgba) = rgba8(tile)?;
    let (pw, ph, small) = shrink(w, h, &rgba, frame_w.max(frame_h).div_ceil(EDGE).max(1));
    encode(pw, ph, &small)
}

/// Any image the farm stores, as 8-bit RGBA.
fn rgba8(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), PreviewError> {
    if crate::exr::is_exr(bytes) {
        exr_rgba8(bytes)
    } else if tessera_protocol::float_tile::is_float_tile(bytes) {
        let t = FloatTile::parse(bytes).map_err(|e| PreviewError::Unreadable(e.to_string()))?;
        check_size(t.width, t.height)?;
        let rgba = (t.rgba.chunks_exact(4))
            .flat_map(|p| [srgb8(p[0]), srgb8(p[1]), srgb8(p[2]), alpha8(p[3])])
            .collect();
        Ok((t.width, t.height, rgba))
    } else if SumTile::is_sums(bytes) {
        let t = SumTile::parse(bytes).map_err(|e| PreviewError::Unreadable(e.to_string()))?;
        check_size(t.width, t.height)?;
        let rgba = (t.to_srgb8().chunks_exact(3))
            .flat_map(|p| [p[0], p[1], p[2], 255])
            .collect();
        Ok((t.width, t.height, rgba))
    } else {
        png_rgba8(bytes)
    }
}

fn alpha8(v: f32) -> u8 {
    (if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) } * 255.0 + 0.5) as u8
}

fn encode(pw: u32, ph: u32, small: &[u8]) -> Result<Vec<u8>, PreviewError> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, pw, ph);
        encoder.set_color(png::ColorType::Rgba);
        encoder.set_depth(png::BitDepth::Eight);
        let unreadable = |e: png::EncodingError| PreviewError::Unreadable(e.to_string());
        let mut writer = encoder.write_header().map_err(unreadable)?;
        writer.write_image_data(small).map_err(unreadable)?;
    }
    Ok(out)
}

fn check_size(w: u32, h: u32) -> Result<(), PreviewError> {
    if w == 0 || h == 0 || u64::from(w) * u64::from(h) > MAX_PIXELS {
        return Err(PreviewError::TooLarge(w, h));
    }
    Ok(())
}

/// A PNG's pixels as 8-bit RGBA.
fn png_rgba8(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), PreviewError> {
    let bad = |e: png::DecodingError| PreviewError::Unreadable(e.to_string());
    let mut decoder = png::Decoder::new_with_limits(
        std::io::Cursor::new(bytes),
        png::Limits { bytes: MAX_DECODED },
    );
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(bad)?;
    let (w, h) = (reader.info().width, reader.info().height);
    check_size(w, h)?;
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data).map_err(bad)?;
    let samples = info.color_type.samples();
    let rgba: Vec<u8> = (data[..info.buffer_size()].chunks_exact(samples))
        .flat_map(|p| match p {
            [g] => [*g, *g, *g, 255],
            [g, a] => [*g, *g, *g, *a],
            [r, g, b] => [*r, *g, *b, 255],
            [r, g, b, a] => [*r, *g, *b, *a],
            _ => [0, 0, 0, 0],
        })
        .collect();
    Ok((w, h, rgba))
}

/// An OpenEXR frame's combined RGBA (the first layer; in a multilayer file
/// the `Combined` pass) as 8-bit sRGB.
fn exr_rgba8(bytes: &[u8]) -> Result<(u32, u32, Vec<u8>), PreviewError> {
    use exr::prelude::*;
    // The first layer's every channel is read: bound them all from the
    // header before any is.
    let meta = exr::meta::MetaData::read_from_buffered(std::io::Cursor::new(bytes), false)
        .map_err(|e| PreviewError::Unreadable(e.to_string()))?;
    let header =
        (meta.headers.first()).ok_or_else(|| PreviewError::Unreadable("no layer".into()))?;
    let (w, h) = (
        header.layer_size.width() as u32,
        header.layer_size.height() as u32,
    );
    check_size(w, h)?;
    let samples = (header.channels.list.len() as u64) * u64::from(w) * u64::from(h);
    if samples > MAX_EXR_SAMPLES {
        return Err(PreviewError::TooLarge(w, h));
    }
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .first_valid_layer()
        .all_attributes()
        .from_buffered(std::io::Cursor::new(bytes))
        .map_err(|e| PreviewError::Unreadable(e.to_string()))?;
    let layer = image.layer_data;
    let (w, h) = (layer.size.width() as u32, layer.size.height() as u32);
    check_size(w, h)?;
    let channels = &layer.channel_data.list;
    let find = |c: &str| {
        let named = |suffix: &str| {
            (channels.iter()).position(|ch| {
                let name = ch.name.to_string();
                name == c || name.ends_with(suffix)
            })
        };
        named(&format!("Combined.{c}")).or_else(|| named(&format!(".{c}")))
    };
    let [r, g, b, a] = ["R", "G", "B", "A"].map(find);
    let r = r.ok_or_else(|| PreviewError::Unreadable("no R channel".into()))?;
    let (g, b) = (g.unwrap_or(r), b.unwrap_or(r));
    let value = |c: usize, i: usize| channels[c].sample_data.value_by_flat_index(i).to_f32();
    let srgb = |v: f32| {
        let v = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
        let v = if v <= 0.003_130_8 {
            v * 12.92
        } else {
            1.055 * v.powf(1.0 / 2.4) - 0.055
        };
        (v * 255.0 + 0.5) as u8
    };
    let n = w as usize * h as usize;
    let mut rgba = Vec::with_capacity(n * 4);
    for i in 0..n {
        rgba.extend_from_slice(&[
            srgb(value(r, i)),
            srgb(value(g, i)),
            srgb(value(b, i)),
            a.map_or(255, |a| (value(a, i).clamp(0.0, 1.0) * 255.0 + 0.5) as u8),
        ]);
    }
    Ok((w, h, rgba))
}

/// `rgba` (w × h, 8-bit) averaged down by the whole factor `k`.
fn shrink(w: u32, h: u32, rgba: &[u8], k: u32) -> (u32, u32, Vec<u8>) {
    if k <= 1 {
        return (w, h, rgba.to_vec());
    }
    let (pw, ph) = (w.div_ceil(k), h.div_ceil(k));
    let mut out = Vec::with_capacity(pw as usize * ph as usize * 4);
    for py in 0..ph {
        for px in 0..pw {
            let mut sum = [0u32; 4];
            let mut n = 0;
            for y in py * k..((py + 1) * k).min(h) {
                for x in px * k..((px + 1) * k).min(w) {
                    let at = (y as usize * w as usize + x as usize) * 4;
                    for c in 0..4 {
                        sum[c] += u32::from(rgba[at + c]);
                    }
                    n += 1;
                }
            }
            out.extend(sum.map(|s| ((s + n / 2) / n) as u8));
        }
    }
    (pw, ph, out)
}

/// `GET /v1/jobs/{job}/frames/{frame}/preview`: the stitched frame scaled
/// down (see [`make`]).
pub(super) async fn frame(
    shared: &Arc<Shared>,
    job: u64,
    frame: u32,
) -> anyhow::Result<Response<Body>> {
    let found = match off(shared, move |s| service::frame(s, job, frame)).await {
        Ok(found) => found,
        Err(e) => return Ok(refused(&e)),
    };
    let what = format!("frame {frame} of job {job}");
    serve(shared, job, frame, 0, found.digest, what, make).await
}

/// `GET /v1/jobs/{job}/frames/{frame}/tiles/{tile}/preview`: a rendered
/// tile at its frame preview's scale (see [`make_tile`]).
pub(super) async fn tile(
    shared: &Arc<Shared>,
    job: u64,
    frame: u32,
    tile: u32,
) -> anyhow::Result<Response<Body>> {
    let (source, resolution) =
        match off(shared, move |s| service::tile_source(s, job, frame, tile)).await {
            Ok(found) => found,
            Err(e) => return Ok(refused(&e)),
        };
    let what = format!("tile {tile} of frame {frame} of job {job}");
    let part = tile.saturating_add(1);
    serve(shared, job, frame, part, source, what, move |b| {
        make_tile(b, resolution)
    })
    .await
}

/// The preview of `part` of a frame made of the blob `source`: the stored
/// one, else made now (one at a time), stored and recorded.
async fn serve(
    shared: &Arc<Shared>,
    job: u64,
    frame: u32,
    part: u32,
    source: Digest,
    what: String,
    make: impl FnOnce(&[u8]) -> Result<Vec<u8>, PreviewError> + Send + 'static,
) -> anyhow::Result<Response<Body>> {
    let shared = shared.clone();
    let label = what.clone();
    let made = tokio::task::spawn_blocking(move || -> anyhow::Result<Result<Vec<u8>, String>> {
        let stored = |s: &Shared| -> anyhow::Result<Option<Result<Vec<u8>, String>>> {
            match s.db().preview(job, frame, part, &source)? {
                Some(Ok(digest)) => match s.store.get(&digest) {
                    Ok(png) => Ok(Some(Ok(png))),
                    // Collected under it, or lost: made again.
                    Err(_) => Ok(None),
                },
                Some(Err(why)) => Ok(Some(Err(why))),
                None => Ok(None),
            }
        };
        if let Some(found) = stored(&shared)? {
            return Ok(found);
        }
        // One at a time; the one that waited may find it made.
        let _making = crate::shared::relock(&shared.previews.making);
        if let Some(found) = stored(&shared)? {
            return Ok(found);
        }
        let bytes = (shared.store.get(&source)).with_context(|| format!("reading {label}"))?;
        let made = make(&bytes).map_err(|e| e.to_string());
        let recorded = match &made {
            Ok(png) => {
                let digest = shared.store.put_bytes(png)?;
                // Where the record says it is (see the stitcher).
                shared.store.inner().sync(&[digest])?;
                Ok(digest)
            }
            Err(why) => Err(why.clone()),
        };
        shared
            .db()
            .set_preview(job, frame, part, &source, &recorded)?;
        Ok(made)
    })
    .await??;
    Ok(match made {
        Ok(png) => full(StatusCode::OK, "image/png", png),
        Err(e) => error(StatusCode::NOT_FOUND, &format!("no preview of {what}: {e}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_of(w: u32, h: u32, color: png::ColorType, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(color);
        e.set_depth(png::BitDepth::Eight);
        e.write_header().unwrap().write_image_data(data).unwrap();
        out
    }

    fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        png_rgba8(bytes).unwrap()
    }

    #[test]
    fn a_large_frame_is_averaged_down_to_the_edge() {
        // 640x64 RGB: left half black, right half white.
        let (w, h) = (640, 64);
        let data: Vec<u8> = (0..w * h)
            .flat_map(|i| if i % w < w / 2 { [0; 3] } else { [255; 3] })
            .collect();
        let preview = make(&png_of(w, h, png::ColorType::Rgb, &data)).unwrap();
        let (pw, ph, px) = decode(&preview);
        assert_eq!((pw, ph), (320, 32));
        assert_eq!(&px[..4], &[0, 0, 0, 255]);
        assert_eq!(&px[px.len() - 4..], &[255, 255, 255, 255]);
    }

    #[test]
    fn a_small_gray_frame_keeps_its_size_as_rgba() {
        let preview = make(&png_of(2, 1, png::ColorType::Grayscale, &[10, 200])).unwrap();
        assert_eq!(
            decode(&preview),
            (2, 1, vec![10, 10, 10, 255, 200, 200, 200, 255])
        );
    }

    #[test]
    fn an_exr_frame_is_shown_in_srgb() {
        // Linear 0.0, 0.2140 (sRGB 0.5) and 4.0 (clamped to white).
        let rgba = [
            0.0, 0.0, 0.0, 1.0, 0.214, 0.214, 0.214, 1.0, 4.0, 4.0, 4.0, 1.0,
        ];
        let exr = crate::exr::encode_rgba_f32(3, 1, &rgba);
        let (w, h, px) = decode(&make(&exr).unwrap());
        assert_eq!((w, h), (3, 1));
        assert_eq!(px[0], 0);
        assert!((i32::from(px[4]) - 128).abs() <= 1, "{}", px[4]);
        assert_eq!(px[8], 255);
    }

    #[test]
    fn garbage_is_refused() {
        assert!(matches!(
            make(b"not an image"),
            Err(PreviewError::Unreadable(_))
        ));
        assert!(matches!(
            make_tile(b"TSUM\x01", (64, 64)),
            Err(PreviewError::Unreadable(_))
        ));
    }

    #[test]
    fn a_tile_is_shrunk_by_its_frames_factor() {
        // A 1280x640 frame's preview is 320x160 (a quarter): its 64x32
        // tile's is 16x8. A sum tile of 2 samples of radiance 1.0: white.
        let mut t = SumTile::new(64, 32);
        for s in t.sums.iter_mut() {
            *s = 2 * tessera_protocol::sums::fixed(1.0);
        }
        t.samples = 2;
        let (w, h, px) = decode(&make_tile(&t.encode(), (1280, 640)).unwrap());
        assert_eq!((w, h), (16, 8));
        assert!(px.iter().all(|&v| v == 255));
        // A float tile: linear 0.214 is sRGB mid-gray.
        let f = FloatTile {
            width: 4,
            height: 4,
            samples: 1,
            rgba: [0.214, 0.214, 0.214, 1.0].repeat(16),
        };
        let (w, h, px) = decode(&make_tile(&f.encode(), (320, 320)).unwrap());
        assert_eq!((w, h), (4, 4));
        assert!((i32::from(px[0]) - 128).abs() <= 1, "{}", px[0]);
    }
}
