//! Whole-frame renders of builtin scenes, the references the e2e tests
//! compare a farm's frames with, made once per test build.
//!
//! A frame of the demo scene at 512 samples takes 20 s of CPU in a debug
//! build, and dozens of tests ask for the same few: a test that renders one
//! keeps it under `CARGO_TARGET_TMPDIR/e2e-references/`, named by a hash of
//! everything the render reads (the renderer's source files and
//! `Cargo.lock`, the scene, its textures, the frame, the samples), and the
//! next test asking reads it there, in this run or a later one (CI keeps
//! its target folder). A changed renderer or dependency is a new name.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tessera_worker::engine::builtin;

/// The pixels of `frame` of a builtin scene rendered whole: `(width,
/// height, rgb8)`, from the cache or rendered here (and then kept).
pub fn frame(scene: &Path, frame: u32, samples: Option<u32>) -> (u32, u32, Vec<u8>) {
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
    let kept = dir().join(format!("{}.rgb", key.finalize().to_hex()));
    if let Some(found) = read(&kept) {
        return found;
    }
    let textures = builtin::Textures::load(&s, scene.parent().unwrap()).unwrap();
    let (w, h) = s.resolution();
    let rgb = builtin::render_tile(
        &s,
        &textures,
        frame,
        builtin::PixelRect::full(w, h),
        samples,
        2,
    );
    write(&kept, w, h, &rgb);
    (w, h, rgb)
}

/// A hash of the builtin renderer's sources (the worker's
/// `engine/builtin/`, the scanner's `builtin/`, the protocol's `sums.rs`)
/// and of `Cargo.lock`: what its pixels depend on. A source it missed
/// would make a stale reference, which fails a test, never passes one: the
/// farm's frames come from the code as it is.
fn renderer_identity() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("Cargo.lock"), root.join("protocol/src/sums.rs")];
        for folder in ["worker/src/engine/builtin", "scan/src/builtin"] {
            let found = std::fs::read_dir(root.join(folder)).unwrap();
            files.extend(found.map(|e| e.unwrap().path()));
        }
        files.sort();
        let mut hash = blake3::Hasher::new();
        for file in files {
            let bytes = std::fs::read(&file).unwrap();
            hash.update(
                file.strip_prefix(root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .as_bytes(),
            );
            hash.update(&(bytes.len() as u64).to_le_bytes());
            hash.update(&bytes);
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
