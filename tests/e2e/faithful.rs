//! Faithful output: a frame from the farm is the file Blender would have
//! written, or the job says why. Real Blender (Debian's 3.4) on scenes
//! derived from `scenes/blender/make_scenes.py`'s `shot.blend`; gated like
//! the other Blender tests by TESSERA_BLENDER_TESTS=1.

use crate::blender::{assert_same_pixels, blender, enabled, run_ok, Project};
use crate::harness::Farm;

/// Saves a copy of `project`'s `shot.blend` as `name` with `settings`
/// applied (Python statements with `s` bound to the scene).
fn derive(project: &Project, name: &str, settings: &[&str]) -> String {
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
fn a_scene_whose_denoiser_the_workers_blender_lacks_fails_with_one_readable_error_and_no_frame() {
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
        .status()
        .unwrap()
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
    // One frame: each of its 3 attempts fails the same way, in a fresh
    // Blender each time, and the job fails with the reason said once.
    let out = farm.run(&[
        "submit",
        &blend,
        "--frames",
        "1",
        "--wait",
        "--json",
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert!(!out.status.success(), "a failed job exits non-zero");
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["tasks_done"], 0, "no render was accepted: {job}");
    let error = job["error"].as_str().unwrap();
    assert_eq!(
        error.matches("built without it").count(),
        1,
        "the reason is said once: {error}"
    );
    assert!(error.contains("OpenImageDenoise"), "{error}");
    assert!(error.len() < 600, "{} bytes: {error}", error.len());
    assert!(!out_dir.exists(), "no frame was written");
    assert_eq!(
        farm.log_of(0).matches("blender session started").count(),
        3,
        "every attempt ran in a fresh Blender"
    );
    // The log stays with the job: `tessera logs JOB [TASK]`.
    let id = job["id"].as_u64().unwrap().to_string();
    let logs = farm.json(&["logs", &id, "--json"]);
    let attempts = logs["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{logs}");
    for a in attempts {
        assert!(a["error"].as_str().unwrap().contains("OpenImageDenoise"));
        // Blender's own output, e.g. the session's start-up line.
        assert!(
            a["log"]
                .as_str()
                .unwrap()
                .contains("tessera-session: ready"),
            "{a}"
        );
    }
    let text = farm.run(&["logs", &id, "0"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.matches("== job").count(), 3, "{text}");
    let none = farm.run(&["logs", "999"]);
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no job 999"));

    // Three frames, as in the report: nothing is accepted; once the worker
    // has failed 3 of the job's tasks the job is blocked, saying why.
    let job = farm.json(&["submit", &blend, "--frames", "1-3", "--json"]);
    let id = job["id"].as_u64().unwrap();
    let s = farm.wait_for(id, "the job to be blocked", |s| {
        s["blocked"]
            .as_str()
            .is_some_and(|b| b.contains("blocklisted"))
    });
    assert_eq!(s["tasks_done"], 0, "{s}");
    assert_eq!(s["frames_done"], 0, "{s}");
    assert!(
        s["blocked"].as_str().unwrap().contains("OpenImageDenoise"),
        "{s}"
    );
}

#[test]
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
}

#[test]
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
    let submit = |extra: &[&str]| {
        let mut args = vec!["submit", blend.as_str(), "--frames", "1", "--json"];
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
    let (job, stderr) = submit(&[]);
    assert_eq!(job["warnings"], serde_json::json!([]), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    // Tiles: the compositor applies (adaptive sampling does not: tiles are exact).
    let (job, stderr) = submit(&["--tiles", "2x2"]);
    let warnings = job["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].as_str().unwrap().contains("compositing"));
    assert_eq!(stderr.matches("warning:").count(), 1, "{stderr}");
    assert!(!stderr.contains("adaptive"), "{stderr}");
}
