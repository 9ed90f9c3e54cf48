//! Stitching: pastes the tiles of one frame into the full image, losslessly.
//! Tiles are PNGs of any colour type and bit depth (all tiles of a frame
//! share one); the frame is written as a PNG of the same kind, so stitched
//! pixels are exactly the rendered pixels.

pub use tessera_protocol::float_tile::{is_float_tile, FloatTile};
use tessera_protocol::job::TileRect;
use tessera_protocol::sums::SumTile;

#[derive(Debug, thiserror::Error)]
pub enum StitchError {
    #[error("tile {index} is not a readable PNG: {reason}")]
    BadTile { index: usize, reason: String },
    #[error("tile {index} is {got_w}x{got_h} pixels, expected {want_w}x{want_h}")]
    WrongSize {
        index: usize,
        got_w: u32,
        got_h: u32,
        want_w: u32,
        want_h: u32,
    },
    #[error("tile {index} has a different pixel format from tile 0")]
    MixedFormats { index: usize },
    #[error("cannot encode the frame: {0}")]
    Encode(String),
}

struct Decoded {
    width: u32,
    height: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    bytes_per_pixel: usize,
    data: Vec<u8>,
}

fn decode(index: usize, bytes: &[u8]) -> Result<Decoded, StitchError> {
    let bad = |e: png::DecodingError| StitchError::BadTile {
        index,
        reason: e.to_string(),
    };
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .map_err(bad)?;
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data).map_err(bad)?;
    data.truncate(info.buffer_size());
    if !(info.bit_depth as u8).is_multiple_of(8) {
        return Err(StitchError::BadTile {
            index,
            reason: "sub-byte bit depths are not supported".into(),
        });
    }
    let bytes_per_pixel = info.color_type.samples() * (info.bit_depth as usize / 8);
    Ok(Decoded {
        width: info.width,
        height: info.height,
        color: info.color_type,
        depth: info.bit_depth,
        bytes_per_pixel,
        data,
    })
}

/// Assembles a `width` × `height` frame from `tiles` (PNG bytes, each placed
/// at its rectangle) and returns the frame as PNG bytes.
pub fn stitch_png(
    width: u32,
    height: u32,
    tiles: &[(TileRect, Vec<u8>)],
) -> Result<Vec<u8>, StitchError> {
    // (colour type, bit depth) of the first tile, and the canvas.
    let mut frame: Option<((png::ColorType, png::BitDepth), Vec<u8>)> = None;
    for (index, (rect, bytes)) in tiles.iter().enumerate() {
        let tile = decode(index, bytes)?;
        if (tile.width, tile.height) != (rect.width, rect.height) {
            return Err(StitchError::WrongSize {
                index,
                got_w: tile.width,
                got_h: tile.height,
                want_w: rect.width,
                want_h: rect.height,
            });
        }
        let (format, canvas) = frame.get_or_insert_with(|| {
            let size = width as usize * height as usize * tile.bytes_per_pixel;
            ((tile.color, tile.depth), vec![0u8; size])
        });
        if *format != (tile.color, tile.depth) {
            return Err(StitchError::MixedFormats { index });
        }
        let bpp = tile.bytes_per_pixel;
        let row_len = rect.width as usize * bpp;
        for row in 0..rect.height as usize {
            let src = &tile.data[row * row_len..(row + 1) * row_len];
            let dst_start = ((rect.y as usize + row) * width as usize + rect.x as usize) * bpp;
            canvas[dst_start..dst_start + row_len].copy_from_slice(src);
        }
    }
    let ((color, depth), canvas) =
        frame.ok_or_else(|| StitchError::Encode("a frame needs at least one tile".into()))?;
    encode_png(width, height, color, depth, &canvas)
}

fn encode_png(
    width: u32,
    height: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    canvas: &[u8],
) -> Result<Vec<u8>, StitchError> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(color);
        encoder.set_depth(depth);
        let mut writer = encoder
            .write_header()
            .map_err(|e| StitchError::Encode(e.to_string()))?;
        writer
            .write_image_data(canvas)
            .map_err(|e| StitchError::Encode(e.to_string()))?;
    }
    Ok(out)
}

/// Assembles an 8-bit RGB PNG frame from tiles each given as the
/// sample-sum tiles of its sample ranges (`tessera_protocol::sums`). A
/// tile's ranges are added exactly and must hold `samples` samples in all;
/// the frame's pixels are then those of the tile rendered whole.
pub fn stitch_sums(
    width: u32,
    height: u32,
    tiles: &[(TileRect, Vec<Vec<u8>>)],
    samples: u32,
) -> Result<Vec<u8>, StitchError> {
    let mut canvas = vec![0u8; width as usize * height as usize * 3];
    for (index, (rect, ranges)) in tiles.iter().enumerate() {
        let bad = |reason: String| StitchError::BadTile { index, reason };
        let mut merged = SumTile::new(rect.width, rect.height);
        for bytes in ranges {
            let part = SumTile::parse(bytes).map_err(|e| bad(e.to_string()))?;
            merged.add(&part).map_err(|e| bad(e.to_string()))?;
        }
        if merged.samples != samples {
            return Err(bad(format!(
                "its sample ranges hold {} samples, the job has {samples}",
                merged.samples
            )));
        }
        let rgb = merged.to_srgb8();
        let row_len = rect.width as usize * 3;
        for row in 0..rect.height as usize {
            let dst = ((rect.y as usize + row) * width as usize + rect.x as usize) * 3;
            canvas[dst..dst + row_len].copy_from_slice(&rgb[row * row_len..(row + 1) * row_len]);
        }
    }
    encode_png(
        width,
        height,
        png::ColorType::Rgb,
        png::BitDepth::Eight,
        &canvas,
    )
}

/// Assembles a float RGBA frame from tiles, each given as the float tiles of
/// its sample ranges. Ranges are merged by their sample-count-weighted mean,
/// which equals the mean over all samples up to float rounding.
pub fn stitch_float(
    width: u32,
    height: u32,
    tiles: &[(TileRect, Vec<Vec<u8>>)],
) -> Result<Vec<f32>, StitchError> {
    let mut frame = vec![0f32; width as usize * height as usize * 4];
    for (index, (rect, ranges)) in tiles.iter().enumerate() {
        let parts = ranges
            .iter()
            .map(|b| {
                FloatTile::parse(b).map_err(|e| StitchError::BadTile {
                    index,
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        for p in &parts {
            if (p.width, p.height) != (rect.width, rect.height) {
                return Err(StitchError::WrongSize {
                    index,
                    got_w: p.width,
                    got_h: p.height,
                    want_w: rect.width,
                    want_h: rect.height,
                });
            }
        }
        let total: f64 = parts.iter().map(|p| f64::from(p.samples.max(1))).sum();
        for row in 0..rect.height as usize {
            for col in 0..rect.width as usize {
                for c in 0..4 {
                    let i = (row * rect.width as usize + col) * 4 + c;
                    let sum: f64 = parts
                        .iter()
                        .map(|p| f64::from(p.rgba[i]) * f64::from(p.samples.max(1)))
                        .sum();
                    let dst =
                        ((rect.y as usize + row) * width as usize + rect.x as usize + col) * 4 + c;
                    frame[dst] = (sum / total) as f32;
                }
            }
        }
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::job::TileGrid;

    fn png_rgb(w: u32, h: u32, px: impl Fn(u32, u32) -> [u8; 3]) -> (Vec<u8>, Vec<u8>) {
        let mut raw = Vec::new();
        for y in 0..h {
            for x in 0..w {
                raw.extend_from_slice(&px(x, y));
            }
        }
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(png::ColorType::Rgb);
        e.set_depth(png::BitDepth::Eight);
        e.write_header().unwrap().write_image_data(&raw).unwrap();
        (out, raw)
    }

    #[test]
    fn tiles_reassemble_the_exact_frame() {
        let (w, h) = (37, 23);
        let px = |x: u32, y: u32| [(x * 7) as u8, (y * 11) as u8, (x ^ y) as u8];
        let (_, full_raw) = png_rgb(w, h, px);
        let grid = TileGrid { cols: 3, rows: 2 };
        let tiles: Vec<_> = (0..grid.count())
            .map(|i| {
                let r = grid.rect(i, w, h);
                (r, png_rgb(r.width, r.height, |x, y| px(r.x + x, r.y + y)).0)
            })
            .collect();
        let frame = stitch_png(w, h, &tiles).unwrap();
        let d = decode(0, &frame).unwrap();
        assert_eq!((d.width, d.height), (w, h));
        assert_eq!(d.data, full_raw);
    }

    #[test]
    fn float_ranges_merge_by_sample_weight() {
        let rect = TileRect {
            x: 1,
            y: 0,
            width: 1,
            height: 1,
        };
        let a = FloatTile {
            width: 1,
            height: 1,
            samples: 3,
            rgba: vec![1.0, 2.0, 0.0, 1.0],
        };
        let b = FloatTile {
            width: 1,
            height: 1,
            samples: 1,
            rgba: vec![5.0, 2.0, 4.0, 1.0],
        };
        let frame = stitch_float(2, 1, &[(rect, vec![a.encode(), b.encode()])]).unwrap();
        assert_eq!(frame, vec![0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 1.0, 1.0]);
        assert!(is_float_tile(&a.encode()) && !is_float_tile(b"\x89PNG"));
        let err = FloatTile::parse(&a.encode()[..30]).unwrap_err();
        assert!(err.to_string().contains("length does not match"), "{err}");
    }

    #[test]
    fn sample_sum_ranges_merge_exactly_and_must_hold_every_sample() {
        use tessera_protocol::sums::fixed;
        let rect = TileRect {
            x: 1,
            y: 0,
            width: 1,
            height: 1,
        };
        let range = |values: &[f32]| {
            let mut t = SumTile::new(1, 1);
            for v in values {
                t.sums.iter_mut().for_each(|s| *s += fixed(*v));
            }
            t.samples = values.len() as u32;
            t.encode()
        };
        // Mean 0.5 over 4 samples: sRGB 188 in every channel.
        let parts = vec![range(&[0.25, 0.75]), range(&[1.0]), range(&[0.0])];
        let frame = stitch_sums(2, 1, &[(rect, parts.clone())], 4).unwrap();
        let d = decode(0, &frame).unwrap();
        assert_eq!(d.data, [0, 0, 0, 188, 188, 188]);
        let err = stitch_sums(2, 1, &[(rect, parts[..2].to_vec())], 4).unwrap_err();
        assert!(
            err.to_string().contains("hold 3 samples, the job has 4"),
            "{err}"
        );
        let err = stitch_sums(2, 1, &[(rect, vec![b"TSUM".to_vec()])], 4).unwrap_err();
        assert!(err.to_string().contains("tile 0"), "{err}");
    }

    #[test]
    fn wrong_tile_size_is_an_error() {
        let (tile, _) = png_rgb(4, 4, |_, _| [1, 2, 3]);
        let rect = TileRect {
            x: 0,
            y: 0,
            width: 5,
            height: 4,
        };
        let err = stitch_png(10, 10, &[(rect, tile)]).unwrap_err();
        assert!(
            err.to_string().contains("is 4x4 pixels, expected 5x4"),
            "{err}"
        );
        let err = stitch_png(10, 10, &[(rect, b"not a png".to_vec())]).unwrap_err();
        assert!(
            err.to_string().starts_with("tile 0 is not a readable PNG"),
            "{err}"
        );
    }
}
