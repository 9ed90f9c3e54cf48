//! Open Job Description import on a real farm with Debian's Blender:
//! `scenes/openjd/blender-render.template.yaml` (a Blender template in our
//! own words after the OpenJD specifications' Blender sample) becomes two
//! jobs, the second `--after` the first, whose frames equal Blender's own
//! render, named as its `--render-output` names them; a step with another
//! command is refused with its reason and submits nothing.
//! `blender-ffmpeg.template.yaml`, a Deadline-style template, renders JPEG
//! frames and encodes them into a movie with real ffmpeg on a worker that
//! has it; PNG and OpenEXR frames, tiled or not, and the refusal of tiled
//! JPEG frames, with the same template.

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
    let bad = project.join("blender-convert.template.yaml");
    let text = std::fs::read_to_string(scenes().join("openjd/blender-ffmpeg.template.yaml"));
    std::fs::write(
        &bad,
        text.unwrap().replace("command: ffmpeg", "command: convert"),
    )
    .unwrap();
    let out = farm.run(&["submit", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "steps[1] (EncodeVideo).script.actions.onRun.command: `convert` is not Blender or ffmpeg"
        ),
        "{err}"
    );
    let none = farm.json(&["status", "--json"]);
    assert_eq!(none["jobs"].as_array().unwrap().len(), 0, "{none}");

    // The second step refused (frames 7-9 the scene lacks) after the first was
    // submitted: the first's job is canceled, none of it having run.
    let out = farm.run(&[
        "submit",
        template.to_str().unwrap(),
        "--job-param",
        "LastFrame=9",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("step Render of the template")
            && err.contains("the jobs of the steps before it were canceled before any task ran: 1"),
        "{err}"
    );
    let first = farm.status(1);
    assert_eq!(
        (first["state"].as_str(), first["tasks_done"].as_u64()),
        (Some("canceled"), Some(0)),
        "{first}"
    );
    let all = farm.json(&["status", "--json"]);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 1, "{all}");

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

/// How many frames a `--frames` list (`1-3,5`) names.
fn frame_count(list: &str) -> u64 {
    (list.split(','))
        .map(|p| match p.split_once('-') {
            Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The templates Tessera ships pass the OpenJD reference implementation's
/// `openjd check` (and a broken one does not), and Tessera's expansion of
/// the Blender sample agrees with the reference's `openjd summary`: the
/// job name, the steps and their dependencies, each step's task count
/// (Tessera's frames), and the PATH parameters' values (the scene, the
/// output directory), for the defaults and for values given.
#[test]
#[ignore = "needs openjd-cli"]
fn shipped_openjd_templates_pass_the_reference_check_and_expand_as_it_does() {
    require(Need::OpenJd);
    let cli = std::env::var_os("TESSERA_TEST_OPENJD").unwrap();
    let dir = scenes().join("openjd");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".template.yaml") {
            continue;
        }
        let out = Command::new(&cli).arg("check").arg(&path).output().unwrap();
        assert!(out.status.success(), "{}: {out:?}", path.display());
        checked += 1;
    }
    assert_eq!(checked, 2, "both shipped templates checked");
    let render = dir.join("blender-render.template.yaml");
    let text = std::fs::read_to_string(&render).unwrap();
    let bad = std::env::temp_dir().join(format!("tessera-openjd-bad-{}.yaml", std::process::id()));
    std::fs::write(
        &bad,
        text.replace("dependsOn: Preview", "dependsOn: Nowhere"),
    )
    .unwrap();
    let out = Command::new(&cli).arg("check").arg(&bad).output().unwrap();
    std::fs::remove_file(&bad).unwrap();
    assert!(
        !out.status.success(),
        "the reference refuses a broken template"
    );

    for params in [
        vec![],
        vec!["LastFrame=3"],
        vec![
            "FirstFrame=4",
            "LastFrame=9",
            "PreviewFrame=5",
            "OutputDir=/tmp/shot-out",
        ],
    ] {
        let mut cmd = Command::new(&cli);
        cmd.arg("summary").arg(&render).args(["--output", "json"]);
        for p in &params {
            cmd.args(["-p", p]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        let given: Vec<String> = params.iter().map(|p| p.to_string()).collect();
        let ours = tessera_client::openjd::load(&render, &given).unwrap();
        assert_eq!(summary["name"], ours.name.as_str(), "{params:?}");
        let value = |name: &str| {
            (summary["parameter_definitions"].as_array().unwrap().iter())
                .find(|d| d["name"] == name)
                .map(|d| d["value"].as_str().unwrap().to_string())
                .unwrap()
        };
        assert_eq!(
            ours.output_dir.as_deref(),
            Some(Path::new(&value("OutputDir"))),
            "{params:?}"
        );
        let steps = summary["steps"].as_array().unwrap();
        assert_eq!(steps.len(), ours.steps.len());
        for step in steps {
            let name = step["name"].as_str().unwrap();
            let mine = ours.steps.iter().find(|s| s.name == name).unwrap();
            assert_eq!(mine.scene, Path::new(&value("SceneFile")), "{name}");
            let theirs: Vec<&str> = (step["dependencies"].as_array())
                .map(|d| d.iter().map(|d| d["step_name"].as_str().unwrap()).collect())
                .unwrap_or_default();
            let after: Vec<&str> = (mine.after.iter())
                .map(|&i| ours.steps[i].name.as_str())
                .collect();
            assert_eq!(after, theirs, "{name}: dependencies");
            let frames = mine.frames.as_deref().unwrap();
            if step.get("parameter_definitions").is_some() {
                assert_eq!(
                    step["total_tasks"].as_u64(),
                    Some(frame_count(frames)),
                    "{name}"
                );
                let (first, last) = (value("FirstFrame"), value("LastFrame"));
                assert_eq!(frames, format!("{first}-{last}"), "{name}");
            } else {
                assert_eq!(step["total_tasks"].as_u64(), Some(1), "{name}");
                assert_eq!(frames, value("PreviewFrame"), "{name}");
            }
        }
    }
}
