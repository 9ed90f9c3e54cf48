//! Open Job Description import on a real farm with Debian's Blender:
//! `scenes/openjd/blender-render.template.yaml` (a Blender template in our
//! own words after the OpenJD specifications' Blender sample) becomes two
//! jobs, the second `--after` the first, whose frames equal Blender's own
//! render, named as its `--render-output` names them;
//! `blender-ffmpeg.template.yaml` is refused with its reason and submits
//! nothing.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::blender::{assert_same_pixels, run_ok};
use crate::blender_versions::make_project;
use crate::harness::{scenes, Farm};
use crate::requires::{require, Need};

/// Debian Blender's own render of `frames` of `blend` to `out/ref_NNNN.png`.
fn reference(blend: &Path, out: &Path, frames: &[u32]) {
    for f in frames {
        let src = format!(
            "import bpy\ns = bpy.context.scene\ns.frame_set({f})\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
            out.join(format!("ref_{f:04}")).to_str().unwrap()
        );
        run_ok(
            Command::new("blender")
                .args(["-b", "--factory-startup", "--disable-autoexec"])
                .arg(blend)
                .args(["--python-exit-code", "3", "--python-expr", &src]),
        );
    }
}

#[test]
#[ignore = "needs blender"]
fn a_blender_openjd_template_imports_as_dependent_jobs_and_renders_like_blender() {
    require(Need::Blender);
    let mut farm = Farm::start("openjd", &[]);
    let project = make_project(None, &farm.dir);
    let template = project.join("blender-render.template.yaml");
    std::fs::copy(
        scenes().join("openjd/blender-render.template.yaml"),
        &template,
    )
    .unwrap();
    let refs = farm.dir.join("refs");
    reference(&project.join("shot.blend"), &refs, &[1, 2, 3]);

    // Unmappable: refused with the step and field, nothing submitted.
    let bad = project.join("blender-ffmpeg.template.yaml");
    std::fs::copy(scenes().join("openjd/blender-ffmpeg.template.yaml"), &bad).unwrap();
    let out = farm.run(&["submit", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("steps[1] (EncodeVideo).script.embeddedFiles (Encode): `ffmpeg -y -r 24")
            && err.contains("is not a Blender command"),
        "{err}"
    );
    let none = farm.json(&["status", "--json"]);
    assert_eq!(none["jobs"].as_array().unwrap().len(), 0, "{none}");

    farm.add_worker_with("b1", &["--engine", "blender"]);
    let frames = farm.dir.join("frames");
    let out = farm.run(&[
        "submit",
        template.to_str().unwrap(),
        "--job-param",
        "LastFrame=3",
        "--wait",
        "--json",
        "--output",
        frames.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let finals: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(finals.len(), 2, "one final status per step");
    let (preview, render) = (&finals[0], &finals[1]);
    assert_eq!(preview["name"], "Tessera shot / Preview");
    assert_eq!(render["name"], "Tessera shot / Render");
    assert_eq!(
        (
            preview["frames_total"].as_u64(),
            render["frames_total"].as_u64()
        ),
        (Some(1), Some(3))
    );
    assert_eq!(render["after"][0], preview["id"], "the step dependency");
    // Named as the template's --render-output names them, under --output.
    assert_same_pixels(
        &frames.join("preview/frame-0002.png"),
        &refs.join("ref_0002.png"),
    );
    for f in 1..=3 {
        assert_same_pixels(
            &frames.join(format!("output_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
    // Render started only after Preview was done.
    let renders = farm.renders();
    let (p, r) = (
        preview["id"].as_u64().unwrap(),
        render["id"].as_u64().unwrap(),
    );
    let last_p = renders.iter().rposition(|x| x.0 == p).unwrap();
    let first_r = renders.iter().position(|x| x.0 == r).unwrap();
    assert!(last_p < first_r, "{renders:?}");
}
