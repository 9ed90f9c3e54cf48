//! The builtin engine's scene file (`*.scene.json`). The serde types mirror
//! the JSON one to one (unknown fields are errors) and are checked once after
//! parsing, so the renderer reads a [`Scene`] without further checks. Cameras
//! and object motion are keyframed by frame number and linearly interpolated,
//! clamped to the first and last keyframe outside their range. In short
//! (`?` optional, defaults in brackets; colours linear RGB; see `scenes/`):
//!
//! ```text
//! resolution [w, h], samples, max_bounces? [6], seed? [0], frames {start, end}
//! background? {"sky": {horizon, zenith}} | {"color": [r, g, b]}
//! camera     [{frame, position, look_at, fov_deg}, ...]
//! materials  {name: {kind: "diffuse", albedo? [1,1,1], texture?, scale? [1]}
//!                 | {kind: "metal", albedo, fuzz? [0]} | {kind: "glass", ior}
//!                 | {kind: "emissive", color, strength? [1]}, ...}
//! objects    [{shape: {"sphere": {center, radius}} | {"plane": {point, normal}}
//!                 | {"box": {min, max}}, material, motion? [{frame, offset}, ...]}, ...]
//! ```
//!
//! Texture paths are relative to the scene file's folder. A texture wraps
//! `scale` times around a sphere, and repeats every `1 / scale` units on
//! planes and boxes.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::math::Vec3;
use super::SceneError;

const MAX_RESOLUTION: u32 = 16_384;
const MAX_BOUNCES: u32 = 64;

/// Returns `Err(format!(...))` from the enclosing function unless `$ok` holds.
macro_rules! ensure {
    ($ok:expr, $($message:tt)+) => {{
        let ok: bool = $ok;
        if !ok {
            return Err(format!($($message)+));
        }
    }};
}

/// A parsed and validated builtin scene.
#[derive(Debug, Clone)]
pub struct Scene {
    pub file: SceneFile,
    /// `file.materials` in name order, indexed by [`Object::material_index`].
    pub materials: Vec<Material>,
    texture_paths: Vec<String>,
}

/// The scene file as written; only [`SceneFile::validate`] turns it into a [`Scene`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SceneFile {
    pub resolution: [u32; 2],
    samples: u32,
    #[serde(default = "default_max_bounces")]
    pub max_bounces: u32,
    #[serde(default)]
    pub seed: u64,
    frames: Frames,
    #[serde(default)]
    pub background: Background,
    camera: Vec<CameraKey>,
    materials: BTreeMap<String, Material>,
    pub objects: Vec<Object>,
}

fn default_max_bounces() -> u32 {
    6
}

fn one() -> f32 {
    1.0
}

fn white() -> [f32; 3] {
    [1.0; 3]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Frames {
    start: u32,
    end: u32,
}

/// What a ray that leaves the scene sees: a flat colour or a vertical gradient.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Background {
    Color([f32; 3]),
    Sky { horizon: [f32; 3], zenith: [f32; 3] },
}

impl Default for Background {
    fn default() -> Self {
        Background::Sky {
            horizon: white(),
            zenith: [0.5, 0.7, 1.0],
        }
    }
}

impl Background {
    pub fn radiance(&self, dir: Vec3) -> Vec3 {
        match *self {
            Background::Color(c) => c.into(),
            Background::Sky { horizon, zenith } => {
                Vec3::from(horizon).lerp(zenith.into(), dir.y.max(0.0))
            }
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct CameraKey {
    frame: u32,
    position: [f32; 3],
    look_at: [f32; 3],
    fov_deg: f32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MotionKey {
    frame: u32,
    offset: [f32; 3],
}

/// How a surface scatters or emits light. Colours are linear RGB.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Material {
    /// `albedo` tints `texture` when there is one.
    Diffuse {
        #[serde(default = "white")]
        albedo: [f32; 3],
        texture: Option<TexturePath>,
        #[serde(default = "one")]
        scale: f32,
        /// Index of `texture` in [`Scene::texture_paths`], set by validation.
        #[serde(skip)]
        texture_index: Option<usize>,
    },
    Metal {
        albedo: [f32; 3],
        #[serde(default)]
        fuzz: f32,
    },
    Glass {
        ior: f32,
    },
    Emissive {
        color: [f32; 3],
        #[serde(default = "one")]
        strength: f32,
    },
}

/// A texture path, checked while parsing so the error carries a line number.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct TexturePath(String);

impl TryFrom<String> for TexturePath {
    type Error = String;
    fn try_from(path: String) -> Result<Self, String> {
        let absolute = path.starts_with(['/', '\\']) || path.get(1..2) == Some(":");
        let why = if path.is_empty() {
            "is empty"
        } else if absolute {
            "is absolute; write it relative to the scene file's folder"
        } else if path.contains('\\') {
            "contains `\\`; use `/` between folders"
        } else if path.split('/').any(|part| part == "..") {
            "contains `..`; textures must live inside the scene file's folder"
        } else {
            return Ok(TexturePath(path));
        };
        Err(format!("texture path `{path}` {why}"))
    }
}

/// One object: a shape, the name of its material and optional keyframed motion.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Object {
    pub shape: Shape,
    material: String,
    #[serde(default)]
    motion: Vec<MotionKey>,
    #[serde(skip)]
    pub material_index: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Shape {
    Sphere {
        center: [f32; 3],
        radius: f32,
    },
    /// `normal` is of unit length once the scene is validated.
    Plane {
        point: [f32; 3],
        normal: [f32; 3],
    },
    Box {
        min: [f32; 3],
        max: [f32; 3],
    },
}

impl Object {
    /// How far keyframed motion has moved the object at `frame`.
    pub fn offset_at(&self, frame: u32) -> Vec3 {
        if self.motion.is_empty() {
            return Vec3::ZERO;
        }
        let (a, b, t) = blend(&self.motion, frame, |k| k.frame);
        Vec3::from(a.offset).lerp(b.offset.into(), t)
    }
}

impl Scene {
    /// Parses and validates a scene from JSON text.
    pub fn parse(text: &str) -> Result<Scene, SceneError> {
        Scene::parse_named(text, "scene")
    }

    /// Reads, parses and validates a scene file.
    pub fn load(path: &Path) -> Result<Scene, SceneError> {
        let name = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(text) => Scene::parse_named(&text, &name),
            Err(source) => Err(SceneError::Read { path: name, source }),
        }
    }

    /// Like [`Scene::parse`], naming the scene `origin` in errors.
    pub fn parse_named(text: &str, origin: &str) -> Result<Scene, SceneError> {
        let origin = origin.to_string();
        let file: SceneFile = match serde_json::from_str(text) {
            Ok(file) => file,
            Err(e) => {
                let (line, column, full) = (e.line(), e.column(), e.to_string());
                let suffix = format!(" at line {line} column {column}");
                let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
                return Err(SceneError::Syntax {
                    origin,
                    line,
                    column,
                    message,
                });
            }
        };
        file.validate()
            .map_err(|message| SceneError::Invalid { origin, message })
    }

    /// First and last frame, inclusive.
    pub fn frame_range(&self) -> (u32, u32) {
        (self.file.frames.start, self.file.frames.end)
    }

    /// Width and height of a frame in pixels.
    pub fn resolution(&self) -> (u32, u32) {
        (self.file.resolution[0], self.file.resolution[1])
    }

    /// Samples per pixel of a full-quality render.
    pub fn samples(&self) -> u32 {
        self.file.samples
    }

    /// Texture paths as written in the scene (relative to its folder), sorted, deduplicated.
    pub fn texture_paths(&self) -> Vec<String> {
        self.texture_paths.clone()
    }

    /// Camera position, look-at point and vertical field of view at `frame`.
    pub fn camera_at(&self, frame: u32) -> (Vec3, Vec3, f32) {
        let (a, b, t) = blend(&self.file.camera, frame, |k| k.frame);
        let position = Vec3::from(a.position).lerp(b.position.into(), t);
        let look_at = Vec3::from(a.look_at).lerp(b.look_at.into(), t);
        (position, look_at, a.fov_deg + (b.fov_deg - a.fov_deg) * t)
    }
}

impl SceneFile {
    /// Checks what serde cannot and resolves names to indices.
    fn validate(mut self) -> Result<Scene, String> {
        let [w, h] = self.resolution;
        let (size, max) = (1..=MAX_RESOLUTION, MAX_RESOLUTION);
        ensure!(
            size.contains(&w) && size.contains(&h),
            "resolution must be between 1x1 and {max}x{max}, got {w}x{h}"
        );
        ensure!(self.samples > 0, "samples must be at least 1");
        ensure!(
            self.max_bounces <= MAX_BOUNCES,
            "max_bounces must be at most {MAX_BOUNCES}"
        );
        let Frames { start, end } = self.frames;
        ensure!(start <= end, "frames: start {start} is after end {end}");
        ensure!(
            !self.camera.is_empty(),
            "camera needs at least one keyframe"
        );
        check_key_order("camera", self.camera.iter().map(|k| k.frame))?;
        for key in &self.camera {
            let (frame, fov) = (key.frame, key.fov_deg);
            ensure!(
                (1.0..=179.0).contains(&fov),
                "camera keyframe at frame {frame}: fov_deg must be between 1 and 179, got {fov}"
            );
            ensure!(
                key.position != key.look_at,
                "camera keyframe at frame {frame}: position and look_at are the same point"
            );
        }

        let mut paths: Vec<String> = (self.materials.values())
            .filter_map(|m| match m {
                Material::Diffuse { texture, .. } => texture.as_ref().map(|t| t.0.clone()),
                _ => None,
            })
            .collect();
        paths.sort();
        paths.dedup();
        for (name, material) in &mut self.materials {
            check_material(material, &paths).map_err(|why| format!("material `{name}`: {why}"))?;
        }

        let names: Vec<&str> = self.materials.keys().map(String::as_str).collect();
        for (i, object) in self.objects.iter_mut().enumerate() {
            let (name, known) = (&object.material, names.join(", "));
            let index = names.iter().position(|n| n == name);
            ensure!(
                index.is_some(),
                "object {i}: unknown material `{name}`; the scene defines: {known}"
            );
            object.material_index = index.unwrap_or_default();
            check_shape(&mut object.shape).map_err(|why| format!("object {i}: {why}"))?;
            let what = format!("object {i}: motion");
            check_key_order(&what, object.motion.iter().map(|k| k.frame))?;
        }
        let materials = self.materials.values().cloned().collect();
        Ok(Scene {
            file: self,
            materials,
            texture_paths: paths,
        })
    }
}

fn check_material(material: &mut Material, texture_paths: &[String]) -> Result<(), String> {
    let colour_ok = |c: &[f32; 3]| c.iter().all(|v| (0.0..=1e6).contains(v));
    match material {
        Material::Diffuse {
            albedo,
            texture,
            scale,
            texture_index,
        } => {
            ensure!(colour_ok(albedo), "albedo must be between 0 and 1e6");
            ensure!(*scale > 0.0, "scale must be positive");
            *texture_index = texture
                .as_ref()
                .and_then(|t| texture_paths.binary_search(&t.0).ok());
        }
        Material::Metal { albedo, fuzz } => {
            ensure!(colour_ok(albedo), "albedo must be between 0 and 1e6");
            ensure!((0.0..=1.0).contains(fuzz), "fuzz must be between 0 and 1");
        }
        Material::Glass { ior } => {
            ensure!((1.0..=4.0).contains(ior), "ior must be between 1 and 4")
        }
        Material::Emissive { color, strength } => {
            ensure!(colour_ok(color), "color must be between 0 and 1e6");
            ensure!(
                (0.0..=1e6).contains(strength),
                "strength must be between 0 and 1e6"
            );
        }
    }
    Ok(())
}

fn check_shape(shape: &mut Shape) -> Result<(), String> {
    match shape {
        Shape::Sphere { radius, .. } => ensure!(*radius > 0.0, "sphere radius must be positive"),
        Shape::Plane { normal, .. } => {
            let n = Vec3::from(*normal);
            ensure!(n.length() > 0.0, "plane normal must not be zero");
            *normal = [n.x / n.length(), n.y / n.length(), n.z / n.length()];
        }
        Shape::Box { min, max } => {
            let ok = (0..3).all(|a| min[a] < max[a]);
            ensure!(ok, "box min must be below max on every axis");
        }
    }
    Ok(())
}

fn check_key_order(what: &str, frames: impl Iterator<Item = u32>) -> Result<(), String> {
    let mut previous: Option<u32> = None;
    for frame in frames {
        if let Some(p) = previous {
            ensure!(
                p < frame,
                "{what} keyframes must have increasing frames ({frame} follows {p})"
            );
        }
        previous = Some(frame);
    }
    Ok(())
}

/// The keyframes around `frame` and how far `frame` lies between them
/// (keys sorted by frame, at least one). Clamped outside the keyed range.
fn blend<K>(keys: &[K], frame: u32, at: impl Fn(&K) -> u32) -> (&K, &K, f32) {
    let next = keys.partition_point(|k| at(k) <= frame);
    if next == 0 || next == keys.len() {
        let key = &keys[next.saturating_sub(1)];
        return (key, key, 0.0);
    }
    let (a, b) = (&keys[next - 1], &keys[next]);
    (a, b, (frame - at(a)) as f32 / (at(b) - at(a)) as f32)
}
