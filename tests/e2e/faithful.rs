//! Faithful output: a frame from the farm is the file Blender would have
//! written, or the job says why. Real Blender (Debian's 3.4) on scenes
//! derived from `scenes/blender/make_scenes.py`'s `shot.blend`. Each test is
//! `#[ignore = "needs blender"]`, like the other Blender tests.

use crate::blender::{assert_same_pixels, blender, blender_pixels, enabled, run_ok, Project};
use crate::harness::Farm;

/// Saves a copy of `project`'s `shot.blend` as `name` with `settings`
/// applied (Python statements with `s` bound to the scene).
pub(crate) fn derive(project: &Project, name: &str, settings: &[&str]) -> String {
    let out = project.dir.join(name);
    let mut expr = String::from("import bpy\ns = bpy.context.scene\n");
    for line in settings {
        expr.push_str(line);
        expr.push('\n');
    }
    expr.push_str(&format!(
        "bpy.ops.wm.save_as_mainfile(filepath={:?}, copy=True)\n",
        out.to_str().unwrap()
    ));
    run_ok(
        blender()
            .args(["-b", "--factory-startup"])
            .arg(project.dir.join("shot.blend"))
            .args(["--python-exit-code", "3", "--python-expr", &expr]),
    );
    out.to_str().unwrap().to_string()
}

fn id_of(job: &serde_json::Value) -> String {
    job["id"].as_u64().expect("job id").to_string()
}

#[test]
#[ignore = "needs blender"]
fn a_scene_whose_denoiser_the_workers_blender_lacks_is_blocked_with_one_readable_reason_and_no_frame(
) {
    // Exactly as it happened on Debian's Blender 3.4.1 (no OpenImageDenoise):
    // the first render failed with "Build without OpenImageDenoiser", the
    // retry in the same Blender "rendered" an empty image in milliseconds,
    // and the job ended done with three black frames.
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-no-oidn", &[]);
    let project = Project::make(&farm.dir, &[]);
    let has_oidn = blender()
        .args(["-b", "--factory-startup", "--python-expr"])
        .arg("import _cycles, sys; sys.exit(7 if _cycles.with_openimagedenoise else 0)")
        .output()
        .unwrap()
        .status
        .code();
    assert_eq!(
        has_oidn,
        Some(0),
        "this test needs a Blender without OpenImageDenoise (Debian's 3.4)"
    );
    let blend = derive(
        &project,
        "denoised.blend",
        &["s.cycles.use_denoising = True"],
    );
    farm.add_worker_with("b1", &["--engine", "blender"]);
    let out_dir = farm.dir.join("out");
    // Three frames, as in the report. The worker reports that its Blender
    // has no OpenImageDenoise, so the job is blocked with that reason before
    // anything renders: no attempt, nothing accepted, no frame written.
    let job = farm.json(&["submit", &blend, "--frames", "1-3", "--json"]);
    let id = job["id"].as_u64().unwrap();
    let s = farm.wait_for(id, "the job to be blocked", |s| {
        s["blocked"]
            .as_str()
            .is_some_and(|b| b.contains("OpenImageDenoise"))
    });
    assert_eq!(s["tasks_done"], 0, "{s}");
    assert_eq!(s["tasks_running"], 0, "{s}");
    assert_eq!(s["frames_done"], 0, "{s}");
    let blocked = s["blocked"].as_str().unwrap();
    assert_eq!(
        blocked.matches("built without it").count(),
        1,
        "the reason is said once: {blocked}"
    );
    assert!(blocked.len() < 600, "{} bytes: {blocked}", blocked.len());
    let logs = farm.json(&["logs", &id.to_string(), "--json"]);
    assert_eq!(
        logs["attempts"].as_array().map(Vec::len),
        Some(0),
        "nothing was attempted: {logs}"
    );
    let id = id.to_string();
    farm.run(&["cancel", &id]);
    let out = farm.run(&["wait", &id, "--json", "--output", out_dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!out_dir.exists(), "no frame was written");
}

#[test]
#[ignore = "needs blender"]
fn a_failed_first_render_is_retried_in_a_fresh_blender_and_gives_blenders_pixels() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-retry-fresh", &[]);
    let project = Project::make(&farm.dir, &[]);
    let refs = farm.dir.join("refs");
    project.reference("shot.blend", &refs, &[2]);
    let marker = farm.dir.join("first-render-failed");
    // The session refuses every render after its injected failure, so a
    // worker that kept the failed session could never finish the job.
    farm.add_worker_env(
        "b1",
        &["--engine", "blender"],
        &[("TESSERA_TEST_FAIL_FIRST_RENDER", marker.to_str().unwrap())],
    );
    let out = farm.dir.join("out");
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--frames",
        "2",
        "--tiles",
        "2x1",
        "--wait",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert!(marker.exists(), "the first render did fail");
    assert_same_pixels(&out.join("frame_0002.png"), &refs.join("ref_0002.png"));
    let log = farm.log_of(0);
    assert_eq!(log.matches("task failed").count(), 1, "{log}");
    assert!(
        log.matches("blender session started").count() >= 2,
        "the retry ran in a new Blender process: {log}"
    );

    // The failed attempt's log stays with the job: `tessera logs JOB [TASK]`.
    let id = job["id"].as_u64().unwrap().to_string();
    let logs = farm.json(&["logs", &id, "--json"]);
    let attempts = logs["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{logs}");
    let a = &attempts[0];
    assert!(
        a["error"]
            .as_str()
            .unwrap()
            .contains("injected first-render failure"),
        "{a}"
    );
    // Blender's own output, e.g. the session's start-up line.
    assert!(
        a["log"]
            .as_str()
            .unwrap()
            .contains("tessera-session: ready"),
        "{a}"
    );
    let task = a["task"].as_u64().unwrap().to_string();
    let text = farm.run(&["logs", &id, &task]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.matches("== job").count(), 1, "{text}");
    assert!(text.contains("tessera-session: ready"), "{text}");
    let none = farm.run(&["logs", "999"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no job 999"));
}

#[test]
#[ignore = "needs blender"]
fn eevee_and_workbench_render_whole_frames_equal_to_blenders_own() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-engines", &[]);
    let project = Project::make(&farm.dir, &[]);
    derive(
        &project,
        "eevee.blend",
        &[
            "s.render.engine = 'BLENDER_EEVEE'",
            "s.eevee.taa_render_samples = 8",
        ],
    );
    derive(
        &project,
        "workbench.blend",
        &["s.render.engine = 'BLENDER_WORKBENCH'"],
    );
    farm.add_worker_with("b1", &["--engine", "blender"]);
    for name in ["eevee.blend", "workbench.blend"] {
        let refs = farm.dir.join(format!("refs-{name}"));
        project.reference(name, &refs, &[3]);
        let out = farm.dir.join(format!("out-{name}"));
        let job = farm.json(&[
            "submit",
            &project.blend(name),
            "--frames",
            "3",
            "--wait",
            "--json",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(job["state"], "done", "{name}: {job}");
        assert_same_pixels(&out.join("frame_0003.png"), &refs.join("ref_0003.png"));
    }
}

#[test]
#[ignore = "needs blender"]
fn tiles_with_blenders_default_dither_and_adaptive_sampling_equal_blenders_own_render() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-defaults", &[]);
    let project = Project::make(&farm.dir, &[]);
    // Blender's defaults: dither 1.0, adaptive sampling (threshold 0.01,
    // automatic min samples); 96 samples.
    let name = "defaults.blend";
    derive(
        &project,
        name,
        &[
            "s.render.dither_intensity = 1.0",
            "s.cycles.use_adaptive_sampling = True",
            "s.cycles.adaptive_threshold = 0.01",
            "s.cycles.adaptive_min_samples = 0",
            "s.cycles.samples = 96",
        ],
    );
    let refs = farm.dir.join("refs");
    project.reference(name, &refs, &[2]);
    farm.add_worker_with("b1", &["--engine", "blender"]);
    farm.add_worker_with("b2", &["--engine", "blender"]);
    for tiles in ["2x2", "4x4"] {
        let out = farm.dir.join(format!("out-{tiles}"));
        let job = farm.json(&[
            "submit",
            &project.blend(name),
            "--frames",
            "2",
            "--tiles",
            tiles,
            "--wait",
            "--json",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(job["state"], "done", "{tiles}: {job}");
        assert_eq!(
            job["warnings"],
            serde_json::json!([]),
            "nothing to warn about: tiles are exact with these settings"
        );
        assert_same_pixels(&out.join("frame_0002.png"), &refs.join("ref_0002.png"));
    }
}

#[test]
#[ignore = "needs blender"]
fn submit_warns_once_about_what_the_job_uses_and_lists_it_in_json() {
    if !enabled() {
        return;
    }
    let farm = Farm::start("blender-warnings", &[]);
    let project = Project::make(&farm.dir, &[]);
    let blend = derive(
        &project,
        "composited.blend",
        &[
            "s.use_nodes = True",
            "s.cycles.use_adaptive_sampling = True",
        ],
    );
    let submit = |blend: &str, extra: &[&str]| {
        let mut args = vec!["submit", blend, "--frames", "1", "--json"];
        args.extend_from_slice(extra);
        let out = farm.run(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        farm.run(&["cancel", &id_of(&job)]);
        (job, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Whole frames: the compositor and adaptive sampling change nothing.
    let (job, stderr) = submit(&blend, &[]);
    assert_eq!(job["warnings"], serde_json::json!([]), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    // Tiles: the compositor runs once, on the whole frame (its finishing
    // task, the fifth), and adaptive sampling keeps tiles exact: nothing
    // to warn about.
    let (job, stderr) = submit(&blend, &["--tiles", "2x2"]);
    assert_eq!(job["warnings"], serde_json::json!([]), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_eq!(job["tasks_total"], 5, "{job}");
    // Sample ranges: adaptive sampling applies, said once.
    let (job, stderr) = submit(&blend, &["--tiles", "2x2", "--sample-ranges", "2"]);
    let warnings = job["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].as_str().unwrap().contains("adaptive sampling"));
    assert_eq!(stderr.matches("warning:").count(), 1, "{stderr}");
    // A multilayer OpenEXR is finished whole as well (the finishing task's
    // composite completed with the stitched passes): nothing to warn about.
    let layers = derive(
        &project,
        "composited_layers.blend",
        &[
            "s.use_nodes = True",
            "s.render.image_settings.file_format = 'OPEN_EXR_MULTILAYER'",
        ],
    );
    let (job, stderr) = submit(&layers, &["--tiles", "2x2"]);
    assert_eq!(job["warnings"], serde_json::json!([]), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_eq!(job["tasks_total"], 5, "{job}");

    // A movie output is refused before anything is uploaded, naming the
    // alternative.
    let movie = derive(
        &project,
        "movie.blend",
        &["s.render.image_settings.file_format = 'FFMPEG'"],
    );
    let out = farm.run(&["submit", &movie, "--frames", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("is a movie") && err.contains("image format") && err.contains("ffmpeg"),
        "{err}"
    );
}

/// An EXR's header as (channel names, compression byte, attribute names),
/// and each chunk's bytes (the offset table followed), for comparing two
/// files' pixels exactly whatever their headers' lengths.
fn exr_parts(path: &std::path::Path) -> (Vec<String>, u8, Vec<String>, Vec<Vec<u8>>) {
    let d = std::fs::read(path).unwrap();
    assert_eq!(
        &d[..4],
        &[0x76, 0x2f, 0x31, 0x01],
        "{} is not EXR",
        path.display()
    );
    let mut pos = 8;
    let (mut chans, mut comp, mut names, mut height) = (Vec::new(), 0, Vec::new(), 0usize);
    let cstr = |p: usize| {
        let e = p + d[p..].iter().position(|&b| b == 0).unwrap();
        (String::from_utf8_lossy(&d[p..e]).into_owned(), e + 1)
    };
    while d[pos] != 0 {
        let (name, p) = cstr(pos);
        let (_kind, p) = cstr(p);
        let n = i32::from_le_bytes(d[p..p + 4].try_into().unwrap()) as usize;
        let v = &d[p + 4..p + 4 + n];
        match name.as_str() {
            "channels" => {
                let mut q = 0;
                while v[q] != 0 {
                    let e = q + v[q..].iter().position(|&b| b == 0).unwrap();
                    chans.push(String::from_utf8_lossy(&v[q..e]).into_owned());
                    q = e + 1 + 16;
                }
            }
            "compression" => comp = v[0],
            "dataWindow" => {
                let y0 = i32::from_le_bytes(v[4..8].try_into().unwrap());
                let y1 = i32::from_le_bytes(v[12..16].try_into().unwrap());
                height = (y1 - y0 + 1) as usize;
            }
            _ => {}
        }
        names.push(name);
        pos = p + 4 + n;
    }
    pos += 1;
    let lines_per_chunk = match comp {
        0..=2 => 1,
        3 | 5 => 16,
        4 | 6 | 7 => 32,
        _ => 256,
    };
    let chunks = height.div_ceil(lines_per_chunk);
    let mut data = Vec::new();
    for i in 0..chunks {
        let off = u64::from_le_bytes(d[pos + i * 8..pos + i * 8 + 8].try_into().unwrap()) as usize;
        let size = i32::from_le_bytes(d[off + 4..off + 8].try_into().unwrap()) as usize;
        data.push(d[off..off + 8 + size].to_vec());
    }
    names.sort();
    (chans, comp, names, data)
}

#[test]
#[ignore = "needs blender"]
fn whole_frames_arrive_in_the_scenes_own_format_and_name_with_every_pass() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-formats", &[]);
    let project = Project::make(&farm.dir, &[]);
    farm.add_worker_with("b1", &["--engine", "blender"]);
    let multilayer = [
        "im = s.render.image_settings",
        "im.file_format = 'OPEN_EXR_MULTILAYER'",
        "im.color_depth = '32'",
        "im.exr_codec = 'ZIP'",
        "s.render.filepath = '//render/sh010_####'",
        "second = s.view_layers.new('Second')",
        "for vl in s.view_layers:\n    vl.use_pass_z = True\n    vl.use_pass_normal = True\n    vl.use_pass_cryptomatte_object = True",
    ];
    // (file, settings, the name Blender gives frame 2, magic bytes)
    let cases: [(&str, Vec<&str>, &str, &[u8]); 5] = [
        (
            "ml.blend",
            multilayer.to_vec(),
            "sh010_0002.exr",
            &[0x76, 0x2f, 0x31, 0x01],
        ),
        (
            "png16.blend",
            vec![
                "s.render.image_settings.color_depth = '16'",
                "s.render.filepath = '//out/beauty_##'",
            ],
            "beauty_02.png",
            b"\x89PNG",
        ),
        (
            "jpeg.blend",
            vec![
                "s.render.image_settings.file_format = 'JPEG'",
                "s.render.image_settings.quality = 83",
                "s.render.filepath = '/tmp/'",
            ],
            "0002.jpg",
            &[0xff, 0xd8],
        ),
        (
            "tiff.blend",
            vec![
                "s.render.image_settings.file_format = 'TIFF'",
                "s.render.filepath = '//r/t_'",
            ],
            "t_0002.tif",
            b"II*\0",
        ),
        (
            "exr.blend",
            vec![
                "s.render.image_settings.file_format = 'OPEN_EXR'",
                "s.render.image_settings.exr_codec = 'PIZ'",
                "s.render.image_settings.color_depth = '16'",
            ],
            "frame_0002.exr",
            &[0x76, 0x2f, 0x31, 0x01],
        ),
    ];
    for (file, settings, name, magic) in cases {
        derive(&project, file, &settings);
        let refs = farm.dir.join(format!("refs-{file}"));
        project.reference(file, &refs, &[2]);
        let reference = std::fs::read_dir(&refs)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("ref_0002")
            })
            .expect("Blender's own render");
        let out = farm.dir.join(format!("out-{file}"));
        let job = farm.json(&[
            "submit",
            &project.blend(file),
            "--frames",
            "2",
            "--wait",
            "--json",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(job["state"], "done", "{file}: {job}");
        let got = out.join(name);
        assert!(
            got.is_file(),
            "{file}: no {name} in {:?}",
            std::fs::read_dir(&out).unwrap().collect::<Vec<_>>()
        );
        let bytes = std::fs::read(&got).unwrap();
        assert!(bytes.starts_with(magic), "{file}: not the scene's format");
        if magic[0] == 0x76 {
            let (gc, gz, gn, gd) = exr_parts(&got);
            let (wc, wz, wn, wd) = exr_parts(&reference);
            assert_eq!(gc, wc, "{file}: channels");
            assert_eq!(gz, wz, "{file}: codec");
            assert_eq!(gn, wn, "{file}: header attributes (metadata keys)");
            assert_eq!(gd, wd, "{file}: pixel data of every channel");
            if file == "ml.blend" {
                assert!(gc.len() >= 20, "{gc:?}");
                assert!(gc.iter().any(|c| c.starts_with("Second.")), "{gc:?}");
                assert!(gc.iter().any(|c| c.contains("Crypto")), "{gc:?}");
            }
        } else {
            assert_eq!(
                blender_pixels(&got, &farm.dir),
                blender_pixels(&reference, &farm.dir),
                "{file}: pixels"
            );
        }
    }
}

/// An OpenEXR read with the `exr` crate: (channel name, sample bits) of
/// every channel, the codec, and the names of its other (metadata)
/// attributes.
pub(crate) type ExrContent = (Vec<(String, Vec<u32>)>, String, Vec<String>);

pub(crate) fn exr_content(path: &std::path::Path) -> ExrContent {
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
    let channels = layer
        .channel_data
        .list
        .iter()
        .map(|c| {
            let bits = match &c.sample_data {
                FlatSamples::F16(v) => v.iter().map(|x| u32::from(x.to_bits())).collect(),
                FlatSamples::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                FlatSamples::U32(v) => v.clone(),
            };
            (c.name.to_string(), bits)
        })
        .collect();
    let mut keys: Vec<String> = (image.attributes.other.keys())
        .chain(layer.attributes.other.keys())
        .map(|k| k.to_string())
        .collect();
    keys.sort();
    (channels, format!("{:?}", layer.encoding.compression), keys)
}

#[test]
#[ignore = "needs blender"]
fn a_tiled_multilayer_exr_frame_has_every_channel_of_blenders_own_float_exact() {
    tiled_multilayer_is_blenders_own("blender-multilayer", &[], 9);
}

/// With the compositor on, the frame is finished whole: its Composite
/// layer made by Blender in the finishing task, every other channel
/// stitched, all float-exact (a compositor that only passes the render on).
#[test]
#[ignore = "needs blender"]
fn a_tiled_composited_multilayer_exr_frame_is_finished_with_every_channel_of_blenders_own_float_exact(
) {
    tiled_multilayer_is_blenders_own("blender-multilayer-finished", &["s.use_nodes = True"], 10);
}

/// A 3x3 tiled multilayer OpenEXR frame (two view layers; depth, normal,
/// Cryptomatte) of the test scene with `extra` settings, rendered in
/// `tasks` tasks: every channel, the codec and the metadata keys of
/// Blender's own file, float-exact.
fn tiled_multilayer_is_blenders_own(farm_name: &str, extra: &[&str], tasks: u64) {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start(farm_name, &[]);
    let project = Project::make(&farm.dir, &[]);
    let name = "ml.blend";
    let mut settings = vec![
        "im = s.render.image_settings",
        "im.file_format = 'OPEN_EXR_MULTILAYER'",
        "im.color_depth = '32'",
        "im.exr_codec = 'ZIP'",
        "s.render.filepath = '//render/sh010_####'",
        "second = s.view_layers.new('Second')",
        "for vl in s.view_layers:\n    vl.use_pass_z = True\n    vl.use_pass_normal = True\n    vl.use_pass_cryptomatte_object = True",
    ];
    settings.extend_from_slice(extra);
    derive(&project, name, &settings);
    let refs = farm.dir.join("refs");
    project.reference(name, &refs, &[2]);
    farm.add_worker_with("b1", &["--engine", "blender"]);
    farm.add_worker_with("b2", &["--engine", "blender"]);
    let out = farm.dir.join("out");
    let job = farm.json(&[
        "submit",
        &project.blend(name),
        "--frames",
        "2",
        "--tiles",
        "3x3",
        "--wait",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["tasks_total"], tasks, "{job}");
    let (got_ch, got_codec, got_keys) = exr_content(&out.join("sh010_0002.exr"));
    let (want_ch, want_codec, want_keys) = exr_content(&refs.join("ref_0002.exr"));
    let names = |c: &[(String, Vec<u32>)]| c.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got_ch), names(&want_ch), "channels");
    assert!(want_ch.len() >= 20, "{:?}", names(&want_ch));
    assert!(names(&want_ch).iter().any(|n| n.starts_with("Second.")));
    assert_eq!(got_codec, want_codec, "codec");
    assert_eq!(got_keys, want_keys, "metadata keys");
    for ((n, g), (_, w)) in got_ch.iter().zip(&want_ch) {
        let differing = g.iter().zip(w).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "channel {n}: {differing} samples differ");
    }
    eprintln!(
        "multilayer 3x3 ({extra:?}): {} channels float-exact, codec {got_codec}",
        got_ch.len()
    );
}
