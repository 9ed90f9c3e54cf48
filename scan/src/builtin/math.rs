//! Vector math and the per-pixel random stream of the builtin engine. The
//! random stream is a splitmix64 sequence whose seed is a hash of the pixel,
//! sample index, frame and scene seed, so every sample of every pixel draws
//! the same numbers no matter which tile, thread or machine renders it.

use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

/// A point, direction or linear RGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Vec3 {
    pub x: f32,
    pub y: f32,
    pub z: f32,
}

impl Vec3 {
    pub const ZERO: Vec3 = Vec3::new(0.0, 0.0, 0.0);
    pub const ONE: Vec3 = Vec3::new(1.0, 1.0, 1.0);

    pub const fn new(x: f32, y: f32, z: f32) -> Vec3 {
        Vec3 { x, y, z }
    }
    pub fn dot(self, o: Vec3) -> f32 {
        self.x * o.x + self.y * o.y + self.z * o.z
    }
    pub fn cross(self, o: Vec3) -> Vec3 {
        Vec3::new(
            self.y * o.z - self.z * o.y,
            self.z * o.x - self.x * o.z,
            self.x * o.y - self.y * o.x,
        )
    }
    pub fn length(self) -> f32 {
        self.dot(self).sqrt()
    }
    pub fn normalized(self) -> Vec3 {
        self / self.length()
    }
    pub fn lerp(self, o: Vec3, t: f32) -> Vec3 {
        self + (o - self) * t
    }
    pub fn min(self, v: f32) -> Vec3 {
        Vec3::new(self.x.min(v), self.y.min(v), self.z.min(v))
    }
    /// Component `axis` (0 = x, 1 = y, 2 = z).
    pub fn axis(self, axis: usize) -> f32 {
        [self.x, self.y, self.z][axis]
    }
    pub fn reflect(self, n: Vec3) -> Vec3 {
        self - n * (2.0 * self.dot(n))
    }
}

impl From<[f32; 3]> for Vec3 {
    fn from(a: [f32; 3]) -> Vec3 {
        Vec3::new(a[0], a[1], a[2])
    }
}

macro_rules! elementwise {
    ($trait:ident, $fn:ident, $op:tt) => {
        impl $trait for Vec3 {
            type Output = Vec3;
            fn $fn(self, o: Vec3) -> Vec3 {
                Vec3::new(self.x $op o.x, self.y $op o.y, self.z $op o.z)
            }
        }
        impl $trait<f32> for Vec3 {
            type Output = Vec3;
            fn $fn(self, s: f32) -> Vec3 {
                Vec3::new(self.x $op s, self.y $op s, self.z $op s)
            }
        }
    };
}
elementwise!(Add, add, +);
elementwise!(Sub, sub, -);
elementwise!(Mul, mul, *);
elementwise!(Div, div, /);

impl Neg for Vec3 {
    type Output = Vec3;
    fn neg(self) -> Vec3 {
        Vec3::new(-self.x, -self.y, -self.z)
    }
}

impl AddAssign for Vec3 {
    fn add_assign(&mut self, o: Vec3) {
        *self = *self + o;
    }
}

/// The splitmix64 finaliser: a fast, well-mixing 64-bit hash.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A splitmix64 random stream owned by one sample of one pixel.
pub struct Rng(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Rng {
    /// A stream seeded by hashing `key` (pixel x, y, sample, frame, seed).
    pub fn new(key: &[u64]) -> Rng {
        Rng(key
            .iter()
            .fold(GOLDEN, |h, &k| mix64(h ^ mix64(k.wrapping_add(GOLDEN)))))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN);
        mix64(self.0)
    }
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }
    /// Uniform on the unit sphere (no rejection loop: a fixed number of draws).
    pub fn unit_vector(&mut self) -> Vec3 {
        let z = 1.0 - 2.0 * self.next_f32();
        let r = (1.0 - z * z).max(0.0).sqrt();
        let phi = std::f32::consts::TAU * self.next_f32();
        Vec3::new(r * phi.cos(), r * phi.sin(), z)
    }
}
