//! The Blender add-on (`blender/tessera_addon`) driven in Blender's
//! background mode against a real farm: its operators submit the open file
//! (3 frames in 2x2 tiles), watch the job and fetch the frames into the
//! scene's output folder, which must equal that Blender's own render. Run
//! in Debian's Blender 3.4 and in the `bpy` 4.5 module
//! (`TESSERA_TEST_BPY`), each rendering on a worker of its own Blender.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::blender::{assert_same_pixels, in_bpy, run_ok};
use crate::blender_versions::make_project;
use crate::harness::Farm;
use crate::requires::{require, Need};

/// What the add-on's operators do, as an artist's clicks would: set the
/// ticket in the preferences, the frames and tiles in the panel, then
/// Submit, Refresh until the job is final, Fetch. Writes what it saw to
/// `RESULT`.
const DRIVE: &str = r#"
import json, os, sys, time
import bpy, addon_utils
sys.path.insert(0, ADDON_DIR)
addon_utils.enable("tessera_addon", default_set=True)
prefs = bpy.context.preferences.addons["tessera_addon"].preferences
prefs.ticket = TICKET
prefs.tessera_path = TESSERA
prefs.asset_roots = EXTERNAL  # the project's absolute-path texture lies there
scene = bpy.context.scene
scene.render.filepath = "//renders/shot_####"
t = scene.tessera
t.frames = "1-3"
t.tiles_cols = 2
t.tiles_rows = 2
before = os.stat(bpy.data.filepath).st_mtime_ns
assert bpy.ops.tessera.submit() == {"FINISHED"}, "submit"
# Saved by the submit (the operator's own status fields dirty it again).
saved = os.stat(bpy.data.filepath).st_mtime_ns > before
seen = [(t.state, t.frames_done, t.frames_total)]
deadline = time.time() + 600
while t.state not in ("done", "failed", "canceled"):
    assert time.time() < deadline, "the job did not finish"
    time.sleep(0.3)
    assert bpy.ops.tessera.refresh() == {"FINISHED"}, "refresh"
    seen.append((t.state, t.frames_done, t.frames_total))
assert bpy.ops.tessera.fetch() == {"FINISHED"}, "fetch"
json.dump({"job": t.job_id, "state": t.state, "seen": seen, "fetched": t.fetched,
           "saved": saved}, open(RESULT, "w"))
"#;

fn script(farm: &Farm, result: &Path) -> String {
    let ticket = std::fs::read_to_string(farm.data.join("client.ticket")).unwrap();
    let addon = Path::new(env!("CARGO_MANIFEST_DIR")).join("blender");
    format!(
        "ADDON_DIR = {:?}\nTICKET = {:?}\nTESSERA = {:?}\nRESULT = {:?}\nEXTERNAL = {:?}\n{DRIVE}",
        addon.to_str().unwrap(),
        ticket.trim(),
        env!("CARGO_BIN_EXE_tessera"),
        result.to_str().unwrap(),
        farm.dir.join("external").to_str().unwrap()
    )
}

/// Drives the add-on on `project/shot.blend` in `blender` (a Command that
/// runs Python given last), renders the reference with `reference`, and
/// checks the fetched frames against it.
fn submit_watch_fetch(farm: &Farm, project: &Path, run: impl Fn(&Path, &str) -> Command) {
    let blend = project.join("shot.blend");
    let refs = farm.dir.join("refs");
    for f in 1..=3 {
        let stem = refs.join(format!("ref_{f:04}"));
        run_ok(&mut run(
            &blend,
            &format!(
                "import bpy\ns = bpy.context.scene\ns.frame_set({f})\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
                stem.to_str().unwrap()
            ),
        ));
    }
    let result = farm.dir.join("addon-result.json");
    let out = run(&blend, &script(farm, &result)).output().unwrap();
    assert!(
        out.status.success(),
        "the add-on failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    assert_eq!(r["state"], "done", "{r}");
    assert_eq!(
        r["saved"], true,
        "the file was saved before it was submitted"
    );
    let renders = project.join("renders");
    assert_eq!(Path::new(r["fetched"].as_str().unwrap()), renders);
    // It watched the job through the farm's own status.
    let job = farm.status(r["job"].as_u64().unwrap());
    assert_eq!(
        (job["frames_total"].as_u64(), job["tasks_total"].as_u64()),
        (Some(3), Some(12))
    );
    assert!(r["seen"].as_array().unwrap().len() >= 2, "{r}");
    let mut names: Vec<String> = std::fs::read_dir(&renders)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["shot_0001.png", "shot_0002.png", "shot_0003.png"]);
    for f in 1..=3 {
        assert_same_pixels(
            &renders.join(format!("shot_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
}

#[test]
#[ignore = "needs blender"]
fn the_addon_submits_watches_and_fetches_a_tiled_job_in_blender_3_4() {
    require(Need::Blender);
    let mut farm = Farm::start("addon-34", &[]);
    let project = make_project(None, &farm.dir);
    farm.add_worker_with("b1", &["--engine", "blender"]);
    submit_watch_fetch(&farm, &project, |blend, src| {
        let mut cmd = Command::new("blender");
        cmd.args(["-b", "--factory-startup", "--disable-autoexec"])
            .arg(blend)
            .args(["--python-exit-code", "3", "--python-expr", src]);
        cmd
    });
}

#[test]
#[ignore = "needs bpy 4.5 (TESSERA_TEST_BPY)"]
fn the_addon_submits_watches_and_fetches_a_tiled_job_in_the_bpy_45_module() {
    require(Need::Bpy);
    let py = PathBuf::from(std::env::var_os("TESSERA_TEST_BPY").unwrap());
    let mut farm = Farm::start("addon-45", &[]);
    let project = make_project(Some(&py), &farm.dir);
    farm.add_worker_with(
        "b45",
        &[
            "--engine",
            "blender",
            "--blender-python",
            py.to_str().unwrap(),
        ],
    );
    submit_watch_fetch(&farm, &project, |blend, src| {
        in_bpy(&py, Some(blend), src.trim_start_matches("import bpy\n"))
    });
}
