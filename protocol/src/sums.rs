//! Sample-sum tiles: what the builtin engine sends for one sample range of a
//! tile. Each pixel's red, green and blue are sums of its samples' radiance
//! in fixed point (units of 2⁻³²), so the sums of a tile's ranges add up
//! exactly, in any order: a tile rendered as K ranges and merged here is
//! bit-identical to the same tile rendered whole, and a range lost to a
//! preempted worker is simply rendered again.
//!
//! Layout (little-endian): `b"TSUM"`, u32 width, u32 height, u32 samples,
//! then width × height × 3 u64 sums, row-major.

pub const MAGIC: &[u8; 4] = b"TSUM";
const HEADER: usize = 16;
/// 1.0 in fixed point.
const ONE: f64 = 4_294_967_296.0;

/// A sample's radiance in one channel, as the fixed-point value that sums
/// add up. Negative and non-finite values count as 0.
pub fn fixed(radiance: f32) -> u64 {
    if radiance.is_finite() && radiance > 0.0 {
        (f64::from(radiance) * ONE).round() as u64
    } else {
        0
    }
}

/// The mean of `samples` samples whose fixed-point sum is `sum`, as 8-bit
/// sRGB: clamped to [0, 1], then the sRGB curve.
pub fn mean_srgb8(sum: u64, samples: u32) -> u8 {
    let mean = (sum as f64 / ONE / f64::from(samples.max(1))) as f32;
    srgb8(mean)
}

/// Linear radiance to 8-bit sRGB: clamp to [0, 1], then the sRGB curve.
pub fn srgb8(linear: f32) -> u8 {
    let c = linear.clamp(0.0, 1.0);
    let s = if c <= 0.003_130_8 {
        c * 12.92
    } else {
        1.055 * c.powf(1.0 / 2.4) - 0.055
    };
    (s * 255.0 + 0.5) as u8
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumTile {
    pub width: u32,
    pub height: u32,
    /// How many samples the sums hold.
    pub samples: u32,
    /// Per pixel, row-major: red, green, blue.
    pub sums: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SumTileError {
    #[error("not a sample-sum tile")]
    NotSums,
    #[error("a {width}x{height} sample-sum tile needs {want} bytes, got {got}")]
    Length {
        width: u32,
        height: u32,
        want: usize,
        got: usize,
    },
    #[error("cannot add a {0}x{1} tile's samples to a {2}x{3} tile")]
    Size(u32, u32, u32, u32),
    #[error("the sums overflow")]
    Overflow,
}

impl SumTile {
    pub fn new(width: u32, height: u32) -> SumTile {
        SumTile {
            width,
            height,
            samples: 0,
            sums: vec![0; width as usize * height as usize * 3],
        }
    }

    pub fn is_sums(bytes: &[u8]) -> bool {
        bytes.get(..4) == Some(MAGIC)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.sums.len() * 8);
        out.extend_from_slice(MAGIC);
        for v in [self.width, self.height, self.samples] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.sums {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Parses a tile, checking its length against its size before reading.
    pub fn parse(bytes: &[u8]) -> Result<SumTile, SumTileError> {
        if !SumTile::is_sums(bytes) || bytes.len() < HEADER {
            return Err(SumTileError::NotSums);
        }
        let word =
            |i: usize| u32::from_le_bytes(bytes[4 + i * 4..8 + i * 4].try_into().expect("4 bytes"));
        let (width, height, samples) = (word(0), word(1), word(2));
        let want = (width as usize)
            .checked_mul(height as usize)
            .and_then(|n| n.checked_mul(24))
            .and_then(|n| n.checked_add(HEADER));
        if want != Some(bytes.len()) {
            return Err(SumTileError::Length {
                width,
                height,
                want: want.unwrap_or(usize::MAX),
                got: bytes.len(),
            });
        }
        let sums = bytes[HEADER..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok(SumTile {
            width,
            height,
            samples,
            sums,
        })
    }

    /// Adds another range's samples of the same tile.
    pub fn add(&mut self, other: &SumTile) -> Result<(), SumTileError> {
        if (self.width, self.height) != (other.width, other.height) {
            return Err(SumTileError::Size(
                other.width,
                other.height,
                self.width,
                self.height,
            ));
        }
        for (a, b) in self.sums.iter_mut().zip(&other.sums) {
            *a = a.checked_add(*b).ok_or(SumTileError::Overflow)?;
        }
        self.samples = (self.samples)
            .checked_add(other.samples)
            .ok_or(SumTileError::Overflow)?;
        Ok(())
    }

    /// The tile as 8-bit sRGB RGB, row-major.
    pub fn to_srgb8(&self) -> Vec<u8> {
        (self.sums.iter())
            .map(|&sum| mean_srgb8(sum, self.samples))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_add_up_to_the_whole_exactly() {
        let radiance = [0.1f32, 0.7, 3.5, 10.0, 0.0003, 1.0, 0.5, 0.25];
        let mut whole = SumTile::new(1, 1);
        let mut parts = [SumTile::new(1, 1), SumTile::new(1, 1)];
        for (i, r) in radiance.iter().enumerate() {
            for c in 0..3 {
                whole.sums[c] += fixed(*r * (c + 1) as f32);
                parts[i * 2 / radiance.len()].sums[c] += fixed(*r * (c + 1) as f32);
            }
            whole.samples += 1;
            parts[i * 2 / radiance.len()].samples += 1;
        }
        let [mut merged, second] = parts;
        merged.add(&second).unwrap();
        assert_eq!(merged, whole);
        assert_eq!(merged.to_srgb8(), whole.to_srgb8());
    }

    #[test]
    fn encode_and_parse_round_trip_and_bad_bytes_are_refused() {
        let mut t = SumTile::new(2, 1);
        t.samples = 7;
        t.sums = vec![1, 2, 3, u64::MAX, 5, 6];
        assert_eq!(SumTile::parse(&t.encode()).unwrap(), t);
        let mut short = t.encode();
        short.pop();
        assert!(matches!(
            SumTile::parse(&short),
            Err(SumTileError::Length {
                want: 64,
                got: 63,
                ..
            })
        ));
        assert_eq!(SumTile::parse(b"\x89PNG"), Err(SumTileError::NotSums));
        // A header claiming a huge tile is refused by its length.
        let mut huge = MAGIC.to_vec();
        for v in [u32::MAX, u32::MAX, 1] {
            huge.extend_from_slice(&v.to_le_bytes());
        }
        assert!(SumTile::parse(&huge).is_err());
        assert_eq!(
            t.clone().add(&SumTile::new(1, 1)),
            Err(SumTileError::Size(1, 1, 2, 1))
        );
        assert_eq!(t.clone().add(&t), Err(SumTileError::Overflow));
    }

    #[test]
    fn srgb_curve_matches_known_values() {
        assert_eq!(srgb8(0.0), 0);
        assert_eq!(srgb8(1.0), 255);
        assert_eq!(srgb8(2.0), 255);
        assert_eq!(srgb8(0.5), 188);
        assert_eq!(srgb8(-1.0), 0);
        assert_eq!(mean_srgb8(fixed(1.0) * 4, 4), 255);
    }
}
