//! The path tracer. Each pixel's colour is a function of (scene, frame, pixel,
//! sample indices, scene seed) only: every sample draws from its own random
//! stream, samples are summed in index order, and every pixel goes through the
//! same code whatever tile or thread it belongs to. That is what lets tiles
//! rendered on different workers stitch into a frame byte for byte.

use std::f32::consts::{PI, TAU};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use tessera_protocol::sums::{self, SumTile};

use super::math::{Rng, Vec3};
use super::scene::{Material, Shape};
use super::{PixelRect, Scene, Textures};

/// Rays start this far along their direction, so a surface does not shadow itself.
const T_MIN: f32 = 1e-3;
/// Per-sample radiance is clamped to this so rare bright paths leave no fireflies.
const FIREFLY_CLAMP: f32 = 10.0;
/// How many samples of one pixel are traced between two looks at the cancel
/// flag (a few microseconds' work each).
const CANCEL_CHECK_EVERY: u32 = 64;

struct Ray {
    origin: Vec3,
    dir: Vec3,
}

impl Ray {
    fn new(origin: Vec3, dir: Vec3) -> Ray {
        Ray { origin, dir }
    }
}

/// Where a ray meets a shape: distance, outward normal, texture coordinates.
struct Surface {
    t: f32,
    outward: Vec3,
    u: f32,
    v: f32,
}

struct Camera {
    origin: Vec3,
    forward: Vec3,
    right: Vec3,
    up: Vec3,
    half_width: f32,
    half_height: f32,
}

impl Camera {
    fn new(scene: &Scene, frame: u32) -> Camera {
        let (origin, look_at, fov_deg) = scene.camera_at(frame);
        let forward = (look_at - origin).normalized();
        let world_up = if forward.y.abs() > 0.999 {
            Vec3::new(0.0, 0.0, -1.0)
        } else {
            Vec3::new(0.0, 1.0, 0.0)
        };
        let right = forward.cross(world_up).normalized();
        let half_height = (fov_deg.to_radians() / 2.0).tan();
        let [width, height] = scene.file.resolution;
        Camera {
            origin,
            forward,
            right,
            up: right.cross(forward),
            half_width: half_height * width as f32 / height as f32,
            half_height,
        }
    }

    /// The ray through film position (`u` right, `v` down), both in [0, 1].
    fn ray(&self, u: f32, v: f32) -> Ray {
        let across = self.right * ((2.0 * u - 1.0) * self.half_width);
        let down = self.up * ((1.0 - 2.0 * v) * self.half_height);
        Ray::new(self.origin, (self.forward + across + down).normalized())
    }
}

/// Everything about one frame that is the same for all its pixels.
struct FrameView<'a> {
    scene: &'a Scene,
    textures: &'a Textures,
    frame: u32,
    camera: Camera,
    /// Each object's keyframed motion at this frame.
    offsets: Vec<Vec3>,
}

impl FrameView<'_> {
    /// Radiance of pixel (`x`, `y`) summed over the sample indices in
    /// `samples`, in fixed point: sums of disjoint ranges add up exactly to
    /// the sum over their union (see `tessera_protocol::sums`).
    /// The fixed-point sums of one pixel's `samples`; gives up early (with
    /// partial sums nobody uses) once `canceled` turns true, checked every
    /// [`CANCEL_CHECK_EVERY`] samples, so a render stops in bounded time
    /// whatever its sample count.
    fn pixel_sums(&self, x: u32, y: u32, samples: Range<u32>, canceled: &AtomicBool) -> [u64; 3] {
        let [width, height] = self.scene.file.resolution;
        let mut sum = [0u64; 3];
        for sample in samples {
            if sample % CANCEL_CHECK_EVERY == 0 && canceled.load(Ordering::Relaxed) {
                break;
            }
            let (seed, frame) = (self.scene.file.seed, self.frame as u64);
            let mut rng = Rng::new(&[seed, frame, x as u64, y as u64, sample as u64]);
            let u = (x as f32 + rng.next_f32()) / width as f32;
            let v = (y as f32 + rng.next_f32()) / height as f32;
            let ray = self.camera.ray(u, v);
            let c = self.trace(ray, &mut rng).min(FIREFLY_CLAMP);
            for (s, v) in sum.iter_mut().zip([c.x, c.y, c.z]) {
                // Saturates rather than wraps: 4e9 bright samples exceed u64.
                *s = s.saturating_add(sums::fixed(v));
            }
        }
        sum
    }

    /// Follows one path from the camera until it leaves the scene, hits a
    /// light, is absorbed or runs out of bounces.
    fn trace(&self, mut ray: Ray, rng: &mut Rng) -> Vec3 {
        let mut throughput = Vec3::ONE;
        for _ in 0..=self.scene.file.max_bounces {
            let Some((surface, object)) = self.nearest(&ray) else {
                return throughput * self.scene.file.background.radiance(ray.dir);
            };
            let front = surface.outward.dot(ray.dir) < 0.0;
            let normal = if front {
                surface.outward
            } else {
                -surface.outward
            };
            let point = ray.origin + ray.dir * surface.t;
            let material = &self.scene.materials[self.scene.file.objects[object].material_index];
            let (attenuation, dir) = match *material {
                Material::Emissive { color, strength } => {
                    return throughput * Vec3::from(color) * strength
                }
                Material::Diffuse {
                    albedo,
                    scale,
                    texture_index,
                    ..
                } => {
                    let image = texture_index.and_then(|i| self.textures.get(i));
                    let (u, v) = (surface.u * scale, surface.v * scale);
                    let texel = image.map_or(Vec3::ONE, |image| image.sample(u, v));
                    // Cosine-weighted bounce: a random point on the unit sphere around the normal's tip.
                    let dir = normal + rng.unit_vector();
                    let dir = if dir.length() < 1e-6 {
                        normal
                    } else {
                        dir.normalized()
                    };
                    (texel * Vec3::from(albedo), dir)
                }
                Material::Metal { albedo, fuzz } => {
                    let dir = ray.dir.reflect(normal) + rng.unit_vector() * fuzz;
                    if dir.dot(normal) <= 0.0 {
                        return Vec3::ZERO;
                    }
                    (albedo.into(), dir.normalized())
                }
                Material::Glass { ior } => {
                    let ratio = if front { 1.0 / ior } else { ior };
                    let cos = (-ray.dir).dot(normal).min(1.0);
                    let sin = (1.0 - cos * cos).max(0.0).sqrt();
                    // Schlick's approximation of the Fresnel reflectance.
                    let r0 = ((1.0 - ratio) / (1.0 + ratio)).powi(2);
                    let reflectance = r0 + (1.0 - r0) * (1.0 - cos).powi(5);
                    let dir = if ratio * sin > 1.0 || reflectance > rng.next_f32() {
                        ray.dir.reflect(normal)
                    } else {
                        let across = (ray.dir + normal * cos) * ratio;
                        across - normal * (1.0 - across.dot(across)).abs().sqrt()
                    };
                    (Vec3::ONE, dir.normalized())
                }
            };
            throughput = throughput * attenuation;
            ray = Ray::new(point, dir);
        }
        Vec3::ZERO
    }

    /// The nearest surface along `ray` and the index of its object.
    fn nearest(&self, ray: &Ray) -> Option<(Surface, usize)> {
        let mut nearest: Option<(Surface, usize)> = None;
        for (index, (object, offset)) in self
            .scene
            .file
            .objects
            .iter()
            .zip(&self.offsets)
            .enumerate()
        {
            let t_max = nearest.as_ref().map_or(f32::INFINITY, |(s, _)| s.t);
            let moved = Ray::new(ray.origin - *offset, ray.dir);
            if let Some(surface) = intersect(&object.shape, &moved, t_max) {
                nearest = Some((surface, index));
            }
        }
        nearest
    }
}

/// Where `ray` first meets `shape` between [`T_MIN`] and `t_max`.
fn intersect(shape: &Shape, ray: &Ray, t_max: f32) -> Option<Surface> {
    let in_range = |t: f32| (T_MIN..t_max).contains(&t);
    match *shape {
        Shape::Sphere { center, radius } => {
            let oc = ray.origin - Vec3::from(center);
            let b = oc.dot(ray.dir);
            let disc = b * b - (oc.dot(oc) - radius * radius);
            if disc < 0.0 {
                return None;
            }
            let t = [-b - disc.sqrt(), -b + disc.sqrt()]
                .into_iter()
                .find(|&t| in_range(t))?;
            let outward = (oc + ray.dir * t) / radius;
            let u = 0.5 + outward.z.atan2(outward.x) / TAU;
            let v = 0.5 + outward.y.clamp(-1.0, 1.0).asin() / PI;
            Some(Surface { t, outward, u, v })
        }
        Shape::Plane { point, normal } => {
            let (point, outward) = (Vec3::from(point), Vec3::from(normal));
            let t = (point - ray.origin).dot(outward) / outward.dot(ray.dir);
            if !in_range(t) {
                return None;
            }
            // Texture axes: two directions in the plane, one unit apart per texture repeat.
            let helper = if outward.x.abs() > 0.9 {
                Vec3::new(0.0, 1.0, 0.0)
            } else {
                Vec3::new(1.0, 0.0, 0.0)
            };
            let tangent = helper.cross(outward).normalized();
            let d = ray.origin + ray.dir * t - point;
            let (u, v) = (d.dot(tangent), d.dot(outward.cross(tangent)));
            Some(Surface { t, outward, u, v })
        }
        Shape::Box { min, max } => {
            let (min, max) = (Vec3::from(min), Vec3::from(max));
            let (mut near, mut far) = ((f32::NEG_INFINITY, 0), (f32::INFINITY, 0));
            for axis in 0..3 {
                let inv = 1.0 / ray.dir.axis(axis);
                let t0 = (min.axis(axis) - ray.origin.axis(axis)) * inv;
                let t1 = (max.axis(axis) - ray.origin.axis(axis)) * inv;
                if t0.min(t1) > near.0 {
                    near = (t0.min(t1), axis);
                }
                if t0.max(t1) < far.0 {
                    far = (t0.max(t1), axis);
                }
            }
            // Entering the box, or leaving it when the ray starts inside.
            let (t, axis) = if near.0 >= T_MIN { near } else { far };
            if near.0 > far.0 || !in_range(t) {
                return None;
            }
            let p = ray.origin + ray.dir * t;
            let mut outward = [0.0; 3];
            outward[axis] = if near.0 >= T_MIN { -1.0 } else { 1.0 } * ray.dir.axis(axis).signum();
            let (ua, va) = [(2, 1), (0, 2), (0, 1)][axis];
            let (u, v) = (p.axis(ua) - min.axis(ua), p.axis(va) - min.axis(va));
            let outward = outward.into();
            Some(Surface { t, outward, u, v })
        }
    }
}

/// Renders `rect` of `frame` with `samples` samples per pixel. Returns 8-bit
/// sRGB RGB, row-major, `rect.width * rect.height * 3` bytes. Rows are split
/// across `threads` (at least 1) scoped threads; the bytes do not depend on it.
///
/// # Panics
/// If `rect` does not lie inside the scene's resolution.
pub fn render_tile(
    scene: &Scene,
    textures: &Textures,
    frame: u32,
    rect: PixelRect,
    samples: u32,
    threads: usize,
) -> Vec<u8> {
    render_tile_sums(scene, textures, frame, rect, 0..samples, threads).to_srgb8()
}

/// Renders the sample indices `samples` of `rect` of `frame`, as fixed-point
/// sums per pixel: the sums of a tile's ranges, added, give exactly
/// [`render_tile`]'s pixels. Threads as for [`render_tile`].
///
/// # Panics
/// If `rect` does not lie inside the scene's resolution.
pub fn render_tile_sums(
    scene: &Scene,
    textures: &Textures,
    frame: u32,
    rect: PixelRect,
    samples: Range<u32>,
    threads: usize,
) -> SumTile {
    let never = AtomicBool::new(false);
    render_tile_sums_until(scene, textures, frame, rect, samples, threads, &never)
        .expect("never canceled")
}

/// [`render_tile_sums`], giving up (None) soon after `canceled` turns true:
/// each thread checks it between rows and every few samples of a pixel.
pub fn render_tile_sums_until(
    scene: &Scene,
    textures: &Textures,
    frame: u32,
    rect: PixelRect,
    samples: Range<u32>,
    threads: usize,
    canceled: &AtomicBool,
) -> Option<SumTile> {
    let [width, height] = scene.file.resolution;
    assert!(
        rect.fits(width, height),
        "tile {rect:?} lies outside the {width}x{height} frame"
    );
    let camera = Camera::new(scene, frame);
    let offsets = scene
        .file
        .objects
        .iter()
        .map(|o| o.offset_at(frame))
        .collect();
    let view = FrameView {
        scene,
        textures,
        frame,
        camera,
        offsets,
    };
    let mut tile = SumTile::new(rect.width, rect.height);
    tile.samples = samples.len() as u32;
    let row_len = rect.width as usize * 3;
    if tile.sums.is_empty() {
        return Some(tile);
    }
    let rows_per_thread = (rect.height as usize).div_ceil(threads.clamp(1, rect.height as usize));
    std::thread::scope(|scope| {
        for (chunk_index, chunk) in tile.sums.chunks_mut(rows_per_thread * row_len).enumerate() {
            let (view, samples) = (&view, samples.clone());
            scope.spawn(move || {
                for (row, line) in chunk.chunks_mut(row_len).enumerate() {
                    if canceled.load(Ordering::Relaxed) {
                        return;
                    }
                    let y = rect.y + (chunk_index * rows_per_thread + row) as u32;
                    for (col, px) in line.chunks_mut(3).enumerate() {
                        let x = rect.x + col as u32;
                        let sums = view.pixel_sums(x, y, samples.clone(), canceled);
                        px.copy_from_slice(&sums);
                    }
                }
            });
        }
    });
    (!canceled.load(Ordering::Relaxed)).then_some(tile)
}
