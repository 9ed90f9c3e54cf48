//! The finishing step for whole-frame effects, on the official Blender 4.5
//! as the `bpy` module (with OpenImageDenoise; `TESSERA_TEST_BPY`): a frame
//! split into tiles and sample ranges renders its passes only, and one
//! finishing task composites and denoises the whole frame. Each test is
//! `#[ignore = "needs bpy 4.5 (TESSERA_TEST_BPY)"]`, like the other
//! Blender tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tessera_coordinator::commit::{FAILPOINT, FAILPOINT_EXIT_AFTER_PASSES};

use crate::blender::{assert_not_blank, in_bpy, png_raw, run_ok};
use crate::harness::Farm;
use crate::requires::{require, Need};

/// Side of the tile grid the boundary figure is measured along.
const GRID: u32 = 4;

/// Mean |d| along the boundaries (in 1/255) below which no seam can be
/// seen, whatever the figure elsewhere.
const SEAM_FLOOR: f64 = 0.01;

/// How far a frame is from Blender's own: PSNR over RGB, and the mean
/// absolute difference (in 1/255) of the pixels within 2 px of an internal
/// edge of the 4x4 grid ("boundary") and of all the others ("elsewhere").
#[derive(Debug, Clone, Copy)]
struct Figures {
    psnr: f64,
    boundary: f64,
    elsewhere: f64,
}

impl Figures {
    /// The acceptance bar: PSNR ≥ 45 dB, boundaries no worse than elsewhere.
    fn holds(self) -> bool {
        self.psnr >= 45.0 && self.boundary <= self.elsewhere
    }
}

/// RGB of an 8-bit RGB or RGBA PNG, rows top to bottom.
fn rgb(path: &Path) -> (u32, u32, Vec<u8>) {
    let (w, h, color, depth, data) = png_raw(path);
    assert_eq!(depth, png::BitDepth::Eight, "{}", path.display());
    let n = match color {
        png::ColorType::Rgb => 3,
        png::ColorType::Rgba => 4,
        other => panic!("{}: {other:?}", path.display()),
    };
    let rgb = data.chunks(n).flat_map(|p| p[..3].to_vec()).collect();
    (w, h, rgb)
}

fn figures(got: &Path, want: &Path) -> Figures {
    let (w, h, a) = rgb(got);
    let (w2, h2, b) = rgb(want);
    assert_eq!((w, h), (w2, h2), "{} vs {}", got.display(), want.display());
    let f = |v: &[u8]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    figures_of(w, h, &f(&a), &f(&b))
}

/// [`Figures`] of two RGB images of `w` x `h` pixels, rows top to bottom,
/// on a scale of 0 to 255.
fn figures_of(w: u32, h: u32, a: &[f64], b: &[f64]) -> Figures {
    assert_eq!(a.len(), b.len());
    let near_edge = |x: u32, y: u32| {
        (1..GRID).any(|i| {
            let (ex, ey) = (w * i / GRID, h * i / GRID);
            (ex.saturating_sub(2)..ex + 2).contains(&x)
                || (ey.saturating_sub(2)..ey + 2).contains(&y)
        })
    };
    let (mut sq, mut edge, mut rest) = (0f64, (0f64, 0u32), (0f64, 0u32));
    for y in 0..h {
        for x in 0..w {
            let i = 3 * (y * w + x) as usize;
            let d: Vec<f64> = (0..3).map(|c| a[i + c] - b[i + c]).collect();
            sq += d.iter().map(|v| v * v).sum::<f64>();
            let mad = d.iter().map(|v| v.abs()).sum::<f64>() / 3.0;
            let bucket = if near_edge(x, y) {
                &mut edge
            } else {
                &mut rest
            };
            bucket.0 += mad;
            bucket.1 += 1;
        }
    }
    let mse = sq / f64::from(3 * w * h);
    Figures {
        psnr: if mse == 0.0 {
            f64::INFINITY
        } else {
            10.0 * (255f64 * 255.0 / mse).log10()
        },
        boundary: edge.0 / f64::from(edge.1),
        elsewhere: rest.0 / f64::from(rest.1),
    }
}

#[test]
#[ignore = "needs bpy 4.5 (TESSERA_TEST_BPY)"]
fn compositor_and_denoising_on_4x4_tiles_and_4_sample_ranges_match_blenders_full_render_across_a_restart(
) {
    require(Need::Bpy);
    let py = PathBuf::from(std::env::var_os("TESSERA_TEST_BPY").expect("checked"));
    let py_s = py.to_str().unwrap();
    let mut farm = Farm::start("finishing", &[]);
    // The probe's scene (Cycles, 16 samples, OpenImageDenoise; glare, lens
    // distortion and colour balance; PNG at 128x96), Blender's own full
    // render of it, and the old per-tile way: each 4x4 tile composited and
    // denoised alone.
    let dir = farm.dir.join("probe");
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/finishing_probe.py");
    let src = format!(
        "import sys\nsys.argv = ['probe', {:?}, '--for-farm']\nP = {:?}\nexec(compile(open(P).read(), P, 'exec'))",
        dir.to_str().unwrap(),
        probe.to_str().unwrap()
    );
    run_ok(&mut in_bpy(&py, None, &src));
    // The coordinator dies once the frame's passes are stitched and
    // recorded, before its finishing task is handed out.
    farm.coordinator_env = vec![(FAILPOINT.into(), FAILPOINT_EXIT_AFTER_PASSES.into())];
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.add_worker_with("b1", &["--engine", "blender", "--blender-python", py_s]);
    farm.wait_workers(1);
    let submitted = farm.json(&[
        "submit",
        dir.join("scene.blend").to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--sample-ranges",
        "4",
        "--blender-python",
        py_s,
        "--json",
    ]);
    let id = submitted["id"].as_u64().unwrap();
    let warnings = submitted["warnings"]
        .as_array()
        .expect("warnings as a list");
    assert!(
        !warnings.iter().any(|w| {
            let w = w.as_str().unwrap_or_default();
            w.contains("denoised on its own") || w.contains("compositor runs on each tile")
        }),
        "per-tile warnings for a finished frame: {warnings:?}"
    );
    let status = farm.wait_coordinator_exit(Duration::from_secs(300));
    assert!(!status.success(), "the failpoint ended it: {status}");
    let db = tessera_coordinator::db::Db::open(&farm.data.join("state.sqlite")).unwrap();
    assert_eq!(db.passes(id).unwrap().len(), 1, "the passes are recorded");
    assert!(db.frames(id).unwrap().is_empty(), "and are not a frame");
    drop(db);
    // Restarted, the farm hands out the finishing task and renders no tile
    // again.
    farm.coordinator_env.clear();
    farm.start_coordinator();
    let out = farm.dir.join("out");
    let job = farm.wait_done(id, &out);
    assert_eq!(job["state"], "done", "{job}");
    // 16 tiles x 4 sample ranges of passes, and one finishing task.
    assert_eq!(job["tasks_total"], 65, "{job}");
    assert_eq!(job["tasks_done"], 65, "{job}");
    let mut renders = farm.renders();
    assert_eq!(renders.len(), 65, "each task rendered once: {renders:?}");
    renders.sort_unstable();
    renders.dedup();
    assert_eq!(renders.len(), 65, "each task rendered once");
    // Named as Blender names it (its output path is the default `/tmp/`),
    // and the stitched passes are not among the frames.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["0001.png"]);
    let reference = dir.join("ref.png");
    assert_not_blank(&reference, &rgb(&reference).2);
    let farm_way = figures(&out.join("0001.png"), &reference);
    let per_tile = figures(&dir.join("per_tile.png"), &reference);
    eprintln!(
        "finishing step (4x4 tiles, 4 sample ranges): PSNR {:.2} dB, mean |d| along tile boundaries {:.4}/255, elsewhere {:.4}/255",
        farm_way.psnr, farm_way.boundary, farm_way.elsewhere
    );
    eprintln!(
        "old per-tile way (4x4 tiles): PSNR {:.2} dB, mean |d| along tile boundaries {:.4}/255, elsewhere {:.4}/255",
        per_tile.psnr, per_tile.boundary, per_tile.elsewhere
    );
    assert!(farm_way.holds(), "the finishing step: {farm_way:?}");
    assert!(
        per_tile.boundary > per_tile.elsewhere,
        "the boundary check must catch the per-tile way's seams: {per_tile:?}"
    );
    assert!(
        per_tile.psnr < 45.0,
        "the per-tile way is far from Blender's own: {per_tile:?}"
    );
}

/// An OpenEXR read with the `exr` crate: its size, codec, metadata keys,
/// and each channel's pixel type and samples (rows top to bottom).
struct Exr {
    size: (u32, u32),
    codec: String,
    keys: Vec<String>,
    channels: std::collections::BTreeMap<String, (&'static str, Vec<f32>)>,
}

fn read_exr(path: &Path) -> Exr {
    use exr::prelude::*;
    let image = read()
        .no_deep_data()
        .largest_resolution_level()
        .all_channels()
        .first_valid_layer()
        .all_attributes()
        .from_file(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let layer = &image.layer_data;
    let channels = (layer.channel_data.list.iter())
        .map(|c| {
            let samples = match &c.sample_data {
                FlatSamples::F16(v) => ("half", v.iter().map(|x| x.to_f32()).collect()),
                FlatSamples::F32(v) => ("float", v.clone()),
                FlatSamples::U32(v) => ("uint", v.iter().map(|&x| x as f32).collect()),
            };
            (c.name.to_string(), samples)
        })
        .collect();
    let mut keys: Vec<String> = (image.attributes.other.keys())
        .chain(layer.attributes.other.keys())
        .map(|k| k.to_string())
        .collect();
    keys.sort();
    Exr {
        size: (layer.size.0 as u32, layer.size.1 as u32),
        codec: format!("{:?}", layer.encoding.compression),
        keys,
        channels,
    }
}

/// The RGB of pass `pass` (`ViewLayer.Combined`): scene-linear values
/// clamped to [0, 1] (full scale), on a scale of 0 to 255.
fn pass_rgb(e: &Exr, pass: &str) -> Vec<f64> {
    let c = |id: &str| {
        let name = format!("{pass}.{id}");
        &(e.channels.get(&name))
            .unwrap_or_else(|| panic!("no channel {name}"))
            .1
    };
    let (r, g, b) = (c("R"), c("G"), c("B"));
    (0..r.len())
        .flat_map(|i| [r[i], g[i], b[i]])
        .map(|v| f64::from(v.clamp(0.0, 1.0)) * 255.0)
        .collect()
}

#[test]
#[ignore = "needs bpy 4.5 (TESSERA_TEST_BPY)"]
fn a_tiled_multilayer_exr_with_compositor_and_denoising_is_finished_whole_with_every_layer_and_pass_of_blenders_own(
) {
    require(Need::Bpy);
    let py = PathBuf::from(std::env::var_os("TESSERA_TEST_BPY").expect("checked"));
    let py_s = py.to_str().unwrap();
    let mut farm = Farm::start("finishing-layers", &[]);
    // The probe's scene as a half-float multilayer OpenEXR (PIZ) of two
    // view layers (the second in clay) with depth, normal, mist and
    // Cryptomatte passes, and
    // Blender's own full render of it.
    let dir = farm.dir.join("probe");
    let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/finishing_probe.py");
    let src = format!(
        "import sys\nsys.argv = ['probe', {:?}, '--for-farm', '--multilayer']\nP = {:?}\nexec(compile(open(P).read(), P, 'exec'))",
        dir.to_str().unwrap(),
        probe.to_str().unwrap()
    );
    run_ok(&mut in_bpy(&py, None, &src));
    farm.add_worker_with("b1", &["--engine", "blender", "--blender-python", py_s]);
    farm.wait_workers(1);
    let submitted = farm.json(&[
        "submit",
        dir.join("scene.blend").to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--sample-ranges",
        "2",
        "--blender-python",
        py_s,
        "--json",
    ]);
    let id = submitted["id"].as_u64().unwrap();
    let warnings = submitted["warnings"]
        .as_array()
        .expect("warnings as a list");
    assert!(
        !warnings.iter().any(|w| {
            let w = w.as_str().unwrap_or_default();
            w.contains("denoised on its own") || w.contains("compositing")
        }),
        "per-tile warnings for a finished frame: {warnings:?}"
    );
    let out = farm.dir.join("out");
    let job = farm.wait_done(id, &out);
    assert_eq!(job["state"], "done", "{job}");
    // 16 tiles x 2 sample ranges of passes, and one finishing task.
    assert_eq!(job["tasks_total"], 33, "{job}");
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["0001.exr"]);
    let got = read_exr(&out.join("0001.exr"));
    let want = read_exr(&dir.join("ref.exr"));
    let kinds = |e: &Exr| {
        (e.channels.iter())
            .map(|(n, (kind, _))| format!("{n}:{kind}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&got), kinds(&want), "the channels Blender writes");
    eprintln!(
        "multilayer, finished: {} channels as Blender writes them, codec {}",
        got.channels.len(),
        got.codec
    );
    assert_eq!(got.codec, want.codec, "codec");
    assert_eq!(got.keys, want.keys, "metadata keys (Blender's stamp)");
    assert_eq!(got.size, want.size);
    let (w, h) = got.size;
    assert_ne!(
        pass_rgb(&want, "ViewLayer.Combined"),
        pass_rgb(&want, "Second.Combined"),
        "the view layers differ, so a mix-up shows"
    );
    let passes = [
        "ViewLayer.Combined",
        "Second.Combined",
        "Composite.Combined",
        "ViewLayer.Noisy Image",
    ];
    for pass in passes {
        let (a, b) = (pass_rgb(&got, pass), pass_rgb(&want, pass));
        let f = figures_of(w, h, &a, &b);
        let differ = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        let max = (a.iter().zip(&b)).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        eprintln!(
            "{pass} (4x4 tiles, 2 sample ranges): PSNR {:.2} dB, mean |d| along tile boundaries {:.6}/255, elsewhere {:.6}/255; {differ} of {} samples differ, by at most {max:.4}/255",
            f.psnr, f.boundary, f.elsewhere, a.len()
        );
        // Half floats: a difference of a few ulps in the float values
        // flips a sample's last half bit (1/8 of an 8-bit level near 1) here
        // and there; a seam is more than a hundredth of an 8-bit level
        // along the boundaries on average.
        let seamless = f.boundary <= f.elsewhere || f.boundary < SEAM_FLOOR;
        assert!(f.psnr >= 45.0 && seamless, "{pass}: {f:?}");
    }
}
