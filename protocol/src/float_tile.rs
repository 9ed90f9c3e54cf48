//! Float tiles: what an engine sends for float output or one sample range
//! of a tile (the Blender session writes them from Blender's own 32-bit
//! float EXR; `worker/src/engine/blender/session.py`, `write_float_tile`).
//! Sample ranges of a tile merge by their sample-count-weighted mean, which
//! equals the mean over all samples up to float rounding.
//!
//! Layout (little-endian): `b"TFLT"`, u32 width, u32 height, u32 channels
//! (4), u32 samples averaged, then width × height × 4 f32, RGBA, rows top
//! to bottom.

/// A linear float tile (see the module documentation for its layout).
#[derive(Debug, Clone, PartialEq)]
pub struct FloatTile {
    pub width: u32,
    pub height: u32,
    pub samples: u32,
    pub rgba: Vec<f32>,
}

pub const MAGIC: &[u8; 4] = b"TFLT";
const HEADER: usize = 20;

/// Why bytes are not a float tile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FloatTileError(&'static str);

impl FloatTile {
    pub fn parse(bytes: &[u8]) -> Result<FloatTile, FloatTileError> {
        let bad = |reason: &'static str| FloatTileError(reason);
        if bytes.get(..4) != Some(MAGIC) || bytes.len() < HEADER {
            return Err(bad("not a float tile"));
        }
        let word =
            |i: usize| u32::from_le_bytes(bytes[4 + i * 4..8 + i * 4].try_into().expect("4 bytes"));
        let (width, height, channels, samples) = (word(0), word(1), word(2), word(3));
        if channels != 4 {
            return Err(bad("float tiles must have 4 channels"));
        }
        let len = (width as usize)
            .checked_mul(height as usize)
            .and_then(|n| n.checked_mul(16))
            .and_then(|n| n.checked_add(HEADER));
        if len != Some(bytes.len()) {
            return Err(bad("float tile length does not match its size"));
        }
        let rgba = bytes[HEADER..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        Ok(FloatTile {
            width,
            height,
            samples,
            rgba,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.rgba.len() * 4);
        out.extend_from_slice(MAGIC);
        for v in [self.width, self.height, 4, self.samples] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.rgba {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }
}

/// Whether `bytes` start like a float tile.
pub fn is_float_tile(bytes: &[u8]) -> bool {
    bytes.get(..4) == Some(MAGIC)
}
