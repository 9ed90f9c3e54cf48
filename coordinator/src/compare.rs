//! How two renders of one task are compared when the engine is not
//! deterministic between the two workers (`submit --verify` on Blender
//! workers rendering on different devices): within [`TOLERANCE`].
//! Renders a deterministic engine made are compared bit-exactly by digest
//! instead (see `farm/verify.rs`).

use tessera_protocol::float_tile::{is_float_tile, FloatTile};

/// The largest mean absolute difference, over every channel of every pixel
/// (values in [0, 1]: 8- and 16-bit samples scaled, floats clamped), at
/// which two renders of a tile still agree. Two samplers' noise on the same
/// scene differs by less; a tile with altered content by more.
pub const TOLERANCE: f64 = 0.02;

/// A render's samples in [0, 1] with its width and height, or `None` when
/// it is not a PNG, a float tile or a float OpenEXR this crate reads.
fn samples(bytes: &[u8]) -> Option<(u32, u32, Vec<f32>)> {
    if is_float_tile(bytes) {
        let t = FloatTile::parse(bytes).ok()?;
        return Some((t.width, t.height, clamp(t.rgba)));
    }
    if crate::exr::is_exr(bytes) {
        let (w, h, rgba) = crate::exr::decode_rgba_f32(bytes)?;
        return Some((w, h, clamp(rgba)));
    }
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .ok()?;
    let mut data = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut data).ok()?;
    data.truncate(info.buffer_size());
    let values = match info.bit_depth {
        png::BitDepth::Eight => data.iter().map(|&v| f32::from(v) / 255.0).collect(),
        png::BitDepth::Sixteen => (data.chunks_exact(2))
            .map(|c| f32::from(u16::from_be_bytes([c[0], c[1]])) / 65535.0)
            .collect(),
        _ => return None,
    };
    Some((info.width, info.height, values))
}

fn clamp(values: Vec<f32>) -> Vec<f32> {
    (values.into_iter())
        .map(|v| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        })
        .collect()
}

/// Whether two renders of the same tile agree within [`TOLERANCE`]: same
/// format, dimensions and channels, and a mean absolute difference at most
/// that. Anything unreadable disagrees.
pub fn within_tolerance(a: &[u8], b: &[u8]) -> bool {
    let (Some(a), Some(b)) = (samples(a), samples(b)) else {
        return false;
    };
    if (a.0, a.1, a.2.len()) != (b.0, b.1, b.2.len()) || a.2.is_empty() {
        return false;
    }
    let sum: f64 = (a.2.iter().zip(&b.2))
        .map(|(x, y)| f64::from((x - y).abs()))
        .sum();
    sum / a.2.len() as f64 <= TOLERANCE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, pixels: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.write_header()
            .unwrap()
            .write_image_data(pixels)
            .unwrap();
        out
    }

    #[test]
    fn renders_agree_within_the_tolerance_and_not_beyond() {
        let base: Vec<u8> = (0..16 * 8 * 3).map(|i| (i * 7 % 200) as u8).collect();
        // Noise of ±2 levels everywhere: a different sampler's render.
        let noisy: Vec<u8> = (base.iter().enumerate())
            .map(|(i, &v)| {
                if i % 2 == 0 {
                    v + 2
                } else {
                    v.saturating_sub(2)
                }
            })
            .collect();
        assert!(within_tolerance(&png(16, 8, &base), &png(16, 8, &noisy)));
        // Half the tile inverted: altered content.
        let mut altered = base.clone();
        altered[..16 * 4 * 3].iter_mut().for_each(|v| *v = 255 - *v);
        assert!(!within_tolerance(&png(16, 8, &base), &png(16, 8, &altered)));
        // Other dimensions, or bytes that are no image, never agree.
        assert!(!within_tolerance(&png(16, 8, &base), &png(8, 16, &base)));
        assert!(!within_tolerance(&png(16, 8, &base), b"not an image"));
        // Float tiles: clamped to [0, 1] and compared the same way.
        let tile = |v: f32| {
            FloatTile {
                width: 2,
                height: 2,
                samples: 4,
                rgba: vec![v; 16],
            }
            .encode()
        };
        assert!(within_tolerance(&tile(0.5), &tile(0.51)));
        assert!(!within_tolerance(&tile(0.5), &tile(0.6)));
        assert!(within_tolerance(&tile(3.0), &tile(7.0)), "both clamp to 1");
    }
}
