//! The builtin engine: a small deterministic CPU path tracer for the
//! `*.scene.json` files in `scenes/`, so the farm runs (demo, tests,
//! benchmarks) on a machine without Blender. It renders spheres, planes and
//! boxes with diffuse (optionally PNG-textured), metal, glass and emissive
//! materials under a keyframed camera. Any tile of a frame is bit-identical
//! to the same pixels of the full frame, whatever the tile size or thread
//! count, so the coordinator can stitch tiles from different workers exactly.

mod math;
mod render;
mod scene;
mod texture;

#[cfg(test)]
mod tests;

pub use render::{render_tile, render_tile_sums, render_tile_sums_until};
pub use scene::Scene;
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

/// Why a scene or one of its textures cannot be used; each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// The scene file could not be read.
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The JSON is malformed, or a field is unknown, missing or of the wrong type.
    #[error("{origin}: line {line}, column {column}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// The scene parsed but a value makes no sense (e.g. an unknown material name).
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    /// A texture named by the scene could not be read or decoded.
    #[error("texture `{path}` (looked for {resolved}): {message}")]
    Texture {
        path: String,
        resolved: String,
        message: String,
    },
    /// Bytes that should be a PNG are not one.
    #[error("not a valid PNG: {0}")]
    Png(String),
}
