//! Whole-frame renders of builtin scenes, the references the e2e tests
//! compare a farm's frames with, rendered once and kept.
//!
//! A frame of the demo scene at 512 samples takes 20 s of CPU in a debug
//! build, and dozens of tests ask for the same few: a test that renders one
//! keeps it under `CARGO_TARGET_TMPDIR/e2e-references/`, named by a hash of
//! everything the render reads (the renderer's source files and
//! `Cargo.lock`, the scene, its textures, the frame, the samples), and the
//! next test asking reads it there, in this run or a later one (CI keeps
//! its target folder). A changed renderer or dependency is a new name. The
//! sources are hashed as compiled into the test binary, not as they are on
//! disk; and a kept reference that differs from a farm's frame is checked
//! against a fresh render before the test fails.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessera_worker::engine::builtin;

/// Whether `got` is `frame` of a builtin scene rendered whole. A kept
/// reference that differs is never the last word: the frame is rendered
/// here again and compared with that (and kept in its place), so a kept
/// file that was damaged or made by other code fails nothing.
pub fn matches(scene: &Path, frame: u32, samples: Option<u32>, got: &(u32, u32, Vec<u8>)) -> bool {
    let (kept, name) = lookup(scene, frame, samples);
    if kept.as_ref() == Some(got) {
        return true;
    }
    let fresh = render(scene, frame, samples);
    write(&name, fresh.0, fresh.1, &fresh.2);
    if kept.is_some() && fresh == *got {
        eprintln!(
            "reference {} differed from a fresh render of the same frame; replaced",
            name.display()
        );
    }
    fresh == *got
}

/// The kept reference of `frame`, if there is one, and its file's name.
type Kept = (Option<(u32, u32, Vec<u8>)>, PathBuf);

fn lookup(scene: &Path, frame: u32, samples: Option<u32>) -> Kept {
    let bytes = std::fs::read(scene).unwrap_or_else(|e| panic!("{}: {e}", scene.display()));
    let s = builtin::Scene::load(scene).unwrap();
    let samples = samples.unwrap_or_else(|| s.samples());
    let mut key = blake3::Hasher::new();
    key.update(renderer_identity().as_bytes());
    key.update(&(bytes.len() as u64).to_le_bytes());
    key.update(&bytes);
    for path in s.texture_paths() {
        let texture = std::fs::read(scene.parent().unwrap().join(&path)).unwrap_or_default();
        key.update(&(path.len() as u64).to_le_bytes());
        key.update(path.as_bytes());
        key.update(&(texture.len() as u64).to_le_bytes());
        key.update(&texture);
    }
    key.update(&frame.to_le_bytes());
    key.update(&samples.to_le_bytes());
    let name = dir().join(format!("{}.rgb", key.finalize().to_hex()));
    (read(&name), name)
}

/// `frame` rendered whole here.
fn render(scene: &Path, frame: u32, samples: Option<u32>) -> (u32, u32, Vec<u8>) {
    let s = builtin::Scene::load(scene).unwrap();
    let samples = samples.unwrap_or_else(|| s.samples());
    let textures = builtin::Textures::load(&s, scene.parent().unwrap()).unwrap();
    let (w, h) = s.resolution();
    let full = builtin::PixelRect::full(w, h);
    (
        w,
        h,
        builtin::render_tile(&s, &textures, frame, full, samples, 2),
    )
}

/// The builtin renderer's sources as this test binary was built from them
/// (the worker's `engine/builtin/`, the scanner's `builtin/`, the
/// protocol's `sums.rs`), `Cargo.lock`, and this file: compiled in, so a
/// reference is named after the code that renders it, not after the files
/// on disk, which may have changed since the build.
const RENDERER: &[(&str, &[u8])] = &[
    ("Cargo.lock", include_bytes!("../../Cargo.lock")),
    (
        "protocol/src/sums.rs",
        include_bytes!("../../protocol/src/sums.rs"),
    ),
    (
        "scan/src/builtin/math.rs",
        include_bytes!("../../scan/src/builtin/math.rs"),
    ),
    (
        "scan/src/builtin/mod.rs",
        include_bytes!("../../scan/src/builtin/mod.rs"),
    ),
    (
        "scan/src/builtin/scene.rs",
        include_bytes!("../../scan/src/builtin/scene.rs"),
    ),
    ("tests/e2e/reference.rs", include_bytes!("reference.rs")),
    (
        "worker/src/engine/builtin/mod.rs",
        include_bytes!("../../worker/src/engine/builtin/mod.rs"),
    ),
    (
        "worker/src/engine/builtin/render.rs",
        include_bytes!("../../worker/src/engine/builtin/render.rs"),
    ),
    (
        "worker/src/engine/builtin/tests.rs",
        include_bytes!("../../worker/src/engine/builtin/tests.rs"),
    ),
    (
        "worker/src/engine/builtin/texture.rs",
        include_bytes!("../../worker/src/engine/builtin/texture.rs"),
    ),
];

/// A hash of [`RENDERER`]. A file added to one of those folders and not
/// to the list fails here, naming it.
fn renderer_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for folder in ["worker/src/engine/builtin", "scan/src/builtin"] {
            for entry in std::fs::read_dir(root.join(folder)).unwrap() {
                let name = format!("{folder}/{}", entry.unwrap().file_name().to_string_lossy());
                assert!(
                    RENDERER.iter().any(|(listed, _)| *listed == name),
                    "{name} is not in tests/e2e/reference.rs's RENDERER: add it, so that a \
                     change to it names new references"
                );
            }
        }
        let mut hash = blake3::Hasher::new();
        for (name, bytes) in RENDERER {
            hash.update(name.as_bytes());
            hash.update(&(bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        }
        hash.finalize().to_hex().to_string()
    })
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e-references")
}

/// A kept reference: width and height (u32, little-endian), then the
/// pixels; None when absent or not whole.
fn read(path: &Path) -> Option<(u32, u32, Vec<u8>)> {
    let bytes = std::fs::read(path).ok()?;
    let (head, rgb) = bytes.split_at_checked(8)?;
    let w = u32::from_le_bytes(head[..4].try_into().unwrap());
    let h = u32::from_le_bytes(head[4..].try_into().unwrap());
    (rgb.len() as u64 == u64::from(w) * u64::from(h) * 3).then(|| (w, h, rgb.to_vec()))
}

/// Keeps a reference: written aside, then renamed into place, so a test
/// reading it at the same moment sees all of it or none.
fn write(path: &Path, w: u32, h: u32, rgb: &[u8]) {
    let _ = std::fs::create_dir_all(path.parent().unwrap());
    let aside = path.with_extension(format!("{}.part", std::process::id()));
    let mut bytes = Vec::with_capacity(8 + rgb.len());
    bytes.extend_from_slice(&w.to_le_bytes());
    bytes.extend_from_slice(&h.to_le_bytes());
    bytes.extend_from_slice(rgb);
    if std::fs::write(&aside, &bytes).is_ok() {
        let _ = std::fs::rename(&aside, path);
    }
}
