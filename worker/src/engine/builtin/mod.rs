//! The builtin engine: a small deterministic CPU path tracer for the
//! `*.scene.json` files in `scenes/`, so the farm runs (demo, tests,
//! benchmarks) on a machine without Blender. It renders spheres, planes and
//! boxes with diffuse (optionally PNG-textured), metal, glass and emissive
//! materials under a keyframed camera. Any tile of a frame is bit-identical
//! to the same pixels of the full frame, whatever the tile size or thread
//! count, so the coordinator can stitch tiles from different workers exactly.

mod render;
mod texture;

// The scene file format and its math live in `tessera-scan`, which the
// client uses too.
pub(crate) use tessera_scan::builtin::math;
pub use tessera_scan::builtin::{scene, Scene, SceneError};

#[cfg(test)]
mod tests;

pub use render::{render_tile, render_tile_sums, render_tile_sums_until};
pub use texture::{decode_png_rgb, encode_png, Textures};

/// A rectangle of pixels in a frame; origin top-left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelRect {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

impl PixelRect {
    /// The whole of a `width` x `height` frame.
    pub fn full(width: u32, height: u32) -> PixelRect {
        PixelRect {
            x: 0,
            y: 0,
            width,
            height,
        }
    }

    /// Whether the rectangle lies inside a `width` x `height` frame.
    pub fn fits(&self, width: u32, height: u32) -> bool {
        self.x as u64 + self.width as u64 <= width as u64
            && self.y as u64 + self.height as u64 <= height as u64
    }
}
