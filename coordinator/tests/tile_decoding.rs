//! Property tests of what the coordinator decodes from workers' results:
//! PNG, float and sample-sum tiles, arbitrary or mutated from real ones,
//! stitched into a frame: an error, never a panic, and no allocation
//! beyond the decoders' limits.

use proptest::prelude::*;
use tessera_coordinator::stitch;
use tessera_protocol::job::TileRect;

const RECT: TileRect = TileRect {
    x: 0,
    y: 0,
    width: 4,
    height: 4,
};

/// A real 4x4 RGB PNG: the seed mutations start from.
fn png_tile() -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, 4, 4);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().unwrap();
    writer.write_image_data(&[90u8; 48]).unwrap();
    writer.finish().unwrap();
    out
}

fn stitch_all(bytes: &[u8]) {
    let _ = stitch::stitch_png(4, 4, &[(RECT, bytes.to_vec())]);
    let ranges = [(RECT, vec![bytes.to_vec()])];
    let _ = stitch::stitch_sums(4, 4, &ranges, 1);
    let _ = stitch::stitch_float(4, 4, &ranges);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_tiles_are_refused_not_panicked_on(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        stitch_all(&bytes);
    }

    #[test]
    fn mutated_png_tiles_are_refused_or_stitched(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..5)) {
        let mut bytes = png_tile();
        for (at, value) in flips {
            let len = bytes.len();
            bytes[at % len] = value;
        }
        stitch_all(&bytes);
    }
}

#[test]
fn the_unmutated_seed_stitches() {
    let frame = stitch::stitch_png(4, 4, &[(RECT, png_tile())]).expect("a real tile stitches");
    assert!(!frame.is_empty());
}
