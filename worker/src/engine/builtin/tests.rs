//! Tests of the builtin engine, run against the real sample scenes in
//! `scenes/`: exact tile stitching, thread-count independence, animation and
//! textures taking effect, scene errors a user can act on, PNG round trips.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::*;

fn scenes_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenes")
}

fn load_from(dir: &Path, name: &str) -> (Scene, Textures) {
    let scene = Scene::load(&dir.join(name)).unwrap();
    let textures = Textures::load(&scene, dir).unwrap();
    (scene, textures)
}

fn full_frame((scene, textures): &(Scene, Textures), frame: u32, threads: usize) -> Vec<u8> {
    let (w, h) = scene.resolution();
    let rect = PixelRect::full(w, h);
    render_tile(scene, textures, frame, rect, scene.samples(), threads)
}

/// Renders a `cols` x `rows` grid of tiles (edges need not divide evenly) and stitches it.
fn render_by_tiles(
    (scene, textures): &(Scene, Textures),
    frame: u32,
    cols: u32,
    rows: u32,
) -> Vec<u8> {
    let (w, h) = scene.resolution();
    let mut stitched = vec![0; (w * h * 3) as usize];
    for (tx, ty) in (0..rows).flat_map(|ty| (0..cols).map(move |tx| (tx, ty))) {
        let (x, y) = (tx * w / cols, ty * h / rows);
        let (width, height) = ((tx + 1) * w / cols - x, (ty + 1) * h / rows - y);
        let rect = PixelRect {
            x,
            y,
            width,
            height,
        };
        let tile = render_tile(scene, textures, frame, rect, scene.samples(), 2);
        for (row, line) in tile.chunks(width as usize * 3).enumerate() {
            let start = (((y + row as u32) * w + x) * 3) as usize;
            stitched[start..start + line.len()].copy_from_slice(line);
        }
    }
    stitched
}

/// Fraction of bytes that differ between two equally long images.
fn differing(a: &[u8], b: &[u8]) -> f64 {
    a.iter().zip(b).filter(|(x, y)| x != y).count() as f64 / a.len() as f64
}

/// A scratch folder for one test, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let name = format!("tessera-builtin-{}-{name}", std::process::id());
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(dir.join("textures")).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn tiles_stitch_into_the_full_frame_byte_for_byte() {
    let textured = load_from(&scenes_dir(), "textured.scene.json");
    let full = full_frame(&textured, 2, 1);
    for (cols, rows) in [(4, 4), (3, 3), (7, 5)] {
        let stitched = render_by_tiles(&textured, 2, cols, rows);
        assert!(
            stitched == full,
            "{cols}x{rows} tiles differ from the full frame"
        );
    }
}

#[test]
fn sample_ranges_add_up_to_the_whole_tile_bit_for_bit() {
    let (scene, textures) = load_from(&scenes_dir(), "textured.scene.json");
    let rect = PixelRect {
        x: 8,
        y: 4,
        width: 24,
        height: 16,
    };
    let whole = render_tile(&scene, &textures, 2, rect, 48, 2);
    // Each split as (start, end) pairs: whole, in order, out of order.
    let splits: [&[(u32, u32)]; 3] = [
        &[(0, 48)],
        &[(0, 16), (16, 32), (32, 48)],
        &[(30, 48), (0, 1), (1, 30)],
    ];
    for ranges in splits {
        let mut merged = tessera_protocol::sums::SumTile::new(rect.width, rect.height);
        for range in ranges.iter().map(|&(a, b)| a..b) {
            let part = render_tile_sums(&scene, &textures, 2, rect, range, 1);
            let part = tessera_protocol::sums::SumTile::parse(&part.encode()).unwrap();
            merged.add(&part).unwrap();
        }
        assert_eq!(merged.samples, 48);
        assert!(
            merged.to_srgb8() == whole,
            "{ranges:?} differ from the whole tile"
        );
    }
    // A range alone is not the whole.
    let part = render_tile_sums(&scene, &textures, 2, rect, 0..16, 1);
    assert!(part.to_srgb8() != whole);
}

#[test]
fn a_canceled_render_stops_early() {
    let (scene, textures) = load_from(&scenes_dir(), "textured.scene.json");
    let (w, h) = scene.resolution();
    let canceled = std::sync::atomic::AtomicBool::new(true);
    let rect = PixelRect::full(w, h);
    // 100,000 samples of every pixel would take hours: this returns at
    // once only because every thread checks the flag before each row.
    let out = render_tile_sums_until(&scene, &textures, 1, rect, 0..100_000, 2, &canceled);
    assert!(out.is_none());
}

#[test]
fn a_cancel_stops_a_render_of_u32_max_samples_per_pixel() {
    let (scene, textures) = load_from(&scenes_dir(), "textured.scene.json");
    let canceled = std::sync::atomic::AtomicBool::new(false);
    // One pixel, 4,294,967,295 samples: hours of work in a single pixel,
    // so only a check inside the sample loop can stop it.
    let rect = PixelRect {
        x: 3,
        y: 2,
        width: 1,
        height: 1,
    };
    let out = std::thread::scope(|s| {
        let render = s.spawn(|| {
            render_tile_sums_until(&scene, &textures, 1, rect, 0..u32::MAX, 1, &canceled)
        });
        // Let it get going, then cancel; the join returns only if the
        // tracer gives up.
        std::thread::sleep(std::time::Duration::from_millis(100));
        canceled.store(true, std::sync::atomic::Ordering::Relaxed);
        render.join().expect("render thread")
    });
    assert!(out.is_none());
}

#[test]
fn output_does_not_depend_on_thread_count() {
    let textured = load_from(&scenes_dir(), "textured.scene.json");
    assert!(full_frame(&textured, 3, 1) == full_frame(&textured, 3, 3));
}

#[test]
fn camera_animation_changes_the_frame() {
    let textured = load_from(&scenes_dir(), "textured.scene.json");
    assert_eq!(textured.0.frame_range(), (1, 4));
    let (first, last) = (full_frame(&textured, 1, 2), full_frame(&textured, 4, 2));
    assert!(differing(&first, &last) > 0.5, "frames 1 and 4 look alike");
}

#[test]
fn textures_are_read_from_the_scene_folder_and_used() {
    let source = scenes_dir();
    let (same, swapped) = (TempDir::new("same"), TempDir::new("swapped"));
    for (dir, checker, wood) in [(&same, "checker", "wood"), (&swapped, "wood", "checker")] {
        let copy = |from: PathBuf, to: &str| std::fs::copy(from, dir.0.join(to)).unwrap();
        copy(source.join("textured.scene.json"), "textured.scene.json");
        copy(
            source.join(format!("textures/{checker}.png")),
            "textures/checker.png",
        );
        copy(
            source.join(format!("textures/{wood}.png")),
            "textures/wood.png",
        );
    }
    let textured = load_from(&source, "textured.scene.json");
    assert_eq!(
        textured.0.texture_paths(),
        ["textures/checker.png", "textures/wood.png"]
    );
    let original = full_frame(&textured, 1, 2);
    assert!(full_frame(&load_from(&same.0, "textured.scene.json"), 1, 2) == original);
    let swapped = full_frame(&load_from(&swapped.0, "textured.scene.json"), 1, 2);
    assert!(differing(&swapped, &original) > 0.3);
}

#[test]
fn sample_scenes_render_sensible_images() {
    for (name, frames, (w, h)) in [
        ("textured.scene.json", (1, 4), (160, 96)),
        ("spheres.scene.json", (1, 6), (192, 108)),
        ("demo.scene.json", (1, 8), (320, 180)),
    ] {
        let (scene, textures) = load_from(&scenes_dir(), name);
        assert_eq!(
            (scene.frame_range(), scene.resolution()),
            (frames, (w, h)),
            "{name}"
        );
        let rgb = render_tile(&scene, &textures, frames.0, PixelRect::full(w, h), 4, 2);
        let mean = rgb.iter().map(|&b| b as f64).sum::<f64>() / rgb.len() as f64;
        let white = rgb.chunks(3).filter(|p| p == &[255; 3]).count() as f64;
        assert!(
            (50.0..200.0).contains(&mean),
            "{name}: mean brightness {mean}"
        );
        assert!(
            white < 0.03 * (w * h) as f64,
            "{name}: {white} blown-out pixels"
        );
    }
}

/// A small valid scene to break in the error tests.
fn base_scene() -> Value {
    json!({
        "resolution": [8, 6], "samples": 2, "frames": { "start": 1, "end": 2 },
        "camera": [{ "frame": 1, "position": [0, 1, 5], "look_at": [0, 1, 0], "fov_deg": 40 }],
        "materials": {
            "grey": { "kind": "diffuse", "albedo": [0.5, 0.5, 0.5] },
            "tex": { "kind": "diffuse", "texture": "textures/a.png" }
        },
        "objects": [{ "shape": { "sphere": { "center": [0, 1, 0], "radius": 1 } }, "material": "grey" }]
    })
}

/// Whether `message` contains the parts of `pattern` between `*`s, in order.
fn matches(message: &str, pattern: &str) -> bool {
    let mut rest = message;
    pattern.split('*').all(|part| match rest.find(part) {
        Some(at) => {
            rest = &rest[at + part.len()..];
            true
        }
        None => false,
    })
}

/// Each case sets the JSON value at a pointer in `base_scene()` and gives the error it must cause.
const ERROR_CASES: &str = r#"
    /sampels                       | 4            | scene: line *: unknown field `sampels`, expected one of
    /materials/grey/colour         | [1, 0, 0]    | scene: line *: unknown field `colour`
    /materials/grey/kind           | "mirror"     | scene: line *: unknown variant `mirror`, expected one of*`metal`
    /objects/0/shape/sphere/centre | [0, 0, 0]    | scene: line *: unknown field `centre`
    /materials/tex/texture         | "../x.png"   | scene: line *: texture path `../x.png` contains `..`
    /materials/tex/texture         | "/etc/x.png" | scene: line *: texture path `/etc/x.png` is absolute
    /materials/tex/texture         | "a\\b.png"   | scene: line *: texture path `a\b.png` contains `\`; use `/`
    /objects/0/material            | "nope"       | scene: object 0: unknown material `nope`; the scene defines: grey, tex
    /objects/0/shape/sphere/radius | -1           | scene: object 0: sphere radius must be positive
    /frames/start                  | 3            | scene: frames: start 3 is after end 2
    /camera/0/fov_deg              | 0            | scene: camera keyframe at frame 1: fov_deg must be between 1 and 179
"#;

#[test]
fn scene_errors_say_what_to_fix() {
    assert!(Scene::parse(&base_scene().to_string()).is_ok());
    for case in ERROR_CASES.lines().filter(|line| !line.trim().is_empty()) {
        let [pointer, value, pattern] = [0, 1, 2].map(|i| case.split('|').nth(i).unwrap().trim());
        let mut scene = base_scene();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        scene.pointer_mut(parent).unwrap()[key] = serde_json::from_str(value).unwrap();
        let text = serde_json::to_string_pretty(&scene).unwrap();
        let message = Scene::parse(&text).map(|_| ()).expect_err(case).to_string();
        assert!(
            matches(&message, pattern),
            "{pointer}: {message:?} does not match {pattern:?}"
        );
    }
}

#[test]
fn missing_texture_error_names_the_path() {
    let scene = Scene::parse(&base_scene().to_string()).unwrap();
    let dir = TempDir::new("missing");
    let message = Textures::load(&scene, &dir.0).unwrap_err().to_string();
    assert!(message.starts_with("texture `textures/a.png`"), "{message}");
    let resolved = dir.0.join("textures/a.png");
    assert!(
        message.contains(&resolved.display().to_string()),
        "{message}"
    );
    std::fs::write(&resolved, b"not a png").unwrap();
    let message = Textures::load(&scene, &dir.0).unwrap_err().to_string();
    assert!(message.contains("not a valid PNG"), "{message}");
}

#[test]
fn png_round_trip_is_lossless() {
    let (w, h) = (7, 5);
    let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 256) as u8).collect();
    assert_eq!(
        decode_png_rgb(&encode_png(w, h, &rgb)).unwrap(),
        (w, h, rgb)
    );
    let garbage = decode_png_rgb(b"\x89PNG nonsense");
    assert!(matches!(garbage, Err(SceneError::Png(_))));
}

/// Dev aid, not a check: writes every frame of every sample scene as PNG to
/// `$TESSERA_PREVIEW_DIR` (default `/tmp/tessera-preview`) and prints timings.
/// `cargo test -p tessera-worker --lib builtin -- --ignored --nocapture`
#[test]
#[ignore = "a tool, not a check: writes preview frames"]
fn write_preview_frames() {
    let out = std::env::var("TESSERA_PREVIEW_DIR");
    let out = out.unwrap_or_else(|_| "/tmp/tessera-preview".into());
    std::fs::create_dir_all(&out).unwrap();
    for name in ["textured", "spheres", "demo"] {
        let loaded = load_from(&scenes_dir(), &format!("{name}.scene.json"));
        let ((w, h), (first, last)) = (loaded.0.resolution(), loaded.0.frame_range());
        for frame in first..=last {
            let start = std::time::Instant::now();
            let rgb = full_frame(&loaded, frame, 1);
            println!(
                "{name} frame {frame}: {w}x{h}, 1 thread, {:?}",
                start.elapsed()
            );
            std::fs::write(format!("{out}/{name}-{frame}.png"), encode_png(w, h, &rgb)).unwrap();
        }
    }
}
