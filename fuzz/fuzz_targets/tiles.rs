//! Tile outputs as a worker may send them: PNG, float tiles and sample-sum
//! tiles, parsed and stitched into a small frame; errors, never a panic,
//! and no allocation beyond the decoders' limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_coordinator::stitch;
use tessera_protocol::float_tile::FloatTile;
use tessera_protocol::job::TileRect;
use tessera_protocol::sums::SumTile;

fuzz_target!(|data: &[u8]| {
    let _ = FloatTile::parse(data);
    let _ = SumTile::parse(data);
    let rect = TileRect {
        x: 0,
        y: 0,
        width: 4,
        height: 4,
    };
    let _ = stitch::stitch_png(4, 4, &[(rect, data.to_vec())]);
    let ranges = [(rect, vec![data.to_vec()])];
    let _ = stitch::stitch_sums(4, 4, &ranges, 1);
    let _ = stitch::stitch_float(4, 4, &ranges);
});
