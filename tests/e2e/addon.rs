//! The Blender add-on (`blender/tessera_addon`) driven in Blender's
//! background mode against a real farm: its operators submit the open file
//! (3 frames in 2x2 tiles, with a 200 MB incompressible texture to upload),
//! watch the job and fetch the frames into the scene's output folder,
//! which must equal that Blender's own render. Run in Debian's Blender 3.4
//! (the legacy add-on, `bl_info`) and in the `bpy` 4.5 module
//! (`TESSERA_TEST_BPY`; built and installed as a 4.2+ extension), each
//! rendering on a worker of its own Blender.
//!
//! The add-on must never hold Blender's UI thread: each operator and each
//! timer callback only starts or looks at a background `tessera` process.
//! The tests assert the structure that guarantees it -- each operator
//! returns while the process it started is still running (checked by pid),
//! a cancel stops a running submission and everything it started -- and
//! print the longest hold of each kind (a figure, not asserted; see
//! BENCHMARKS.md).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::blender::{assert_same_pixels, in_bpy, run_ok};
use crate::blender_versions::make_project;
use crate::harness::Farm;
use crate::requires::{require, Need};

/// What the add-on's operators do, as an artist's clicks would, each call
/// (and each call of the timer's callback, `_poll`, which the tests make
/// themselves: no timer runs in background mode) timed:
/// 1. Submit, then Cancel while the submission runs: the process and its
///    group are gone, nothing is queued.
/// 2. Submit with frames the CLI refuses: the panel shows its stderr line.
/// 3. Submit for real (uploading the 200 MB texture) and run the timer
///    until the job is queued.
/// 4. Fetch while the job runs, Refresh and the timer until the frames are
///    in. Writes what it saw to `RESULT`.
const DRIVE: &str = r#"
import json, os, subprocess, sys, time
import bpy, addon_utils
addon = sys.modules[MOD]
prefs = bpy.context.preferences.addons[MOD].preferences
prefs.ticket = TICKET
prefs.tessera_path = TESSERA
prefs.asset_roots = EXTERNAL  # the project's absolute-path texture lies there
scene = bpy.context.scene
scene.render.filepath = "//renders/shot_####"
big = bpy.data.images.load(BIG, check_existing=False)
big.use_fake_user = True  # kept in the file, so the submit uploads it
t = scene.tessera
t.tiles_cols = 2
t.tiles_rows = 2
holds = {}
def timed(name, fn):
    t0 = time.perf_counter()
    r = fn()
    holds[name] = max(holds.get(name, 0.0), time.perf_counter() - t0)
    return r
def poll_until(name, done, what, seconds=600):
    deadline = time.time() + seconds
    while not done():
        assert time.time() < deadline, what
        timed(name, addon._poll)
        time.sleep(0.02)
def group_gone(pid):
    try:
        os.killpg(pid, 0)
        return False
    except ProcessLookupError:
        return True
r = {}

# 1. Cancel while the submission runs.
t.frames = "1-3"
assert timed("submit", bpy.ops.tessera.submit) == {"FINISHED"}, "submit"
child = addon.RUNNING["submit"]
r["cancel_child_running_on_return"] = child.running()
assert timed("cancel", bpy.ops.tessera.cancel) == {"FINISHED"}, "cancel"
poll_until("timer", lambda: "submit" not in addon.RUNNING, "the canceled submission went on")
deadline = time.time() + 60
while not group_gone(child.pid):
    assert time.time() < deadline, "the canceled submission's processes live on"
    time.sleep(0.05)
r["canceled"] = {"state": t.state, "job": t.job_id}

# 2. An error shows the CLI's own stderr line.
t.frames = "not-frames"
assert timed("submit", bpy.ops.tessera.submit) == {"FINISHED"}, "submit"
poll_until("timer", lambda: "submit" not in addon.RUNNING, "the bad submit did not end")
cli = subprocess.run([TESSERA] + addon.submit_args(t, bpy.data.filepath, addon.asset_roots(prefs)),
                     env=dict(os.environ, TESSERA_TICKET=TICKET), capture_output=True, text=True)
r["bad"] = {"state": t.state, "message": t.message, "job": t.job_id,
            "cli_code": cli.returncode,
            "cli_last_line": [l.strip() for l in cli.stderr.splitlines() if l.strip()][-1]}

# 3. The real submission, uploading the 200 MB texture.
t.frames = "1-3"
before = os.stat(bpy.data.filepath).st_mtime_ns
assert timed("submit", bpy.ops.tessera.submit) == {"FINISHED"}, "submit"
r["submit_child_running_on_return"] = addon.RUNNING["submit"].running()
r["saved"] = os.stat(bpy.data.filepath).st_mtime_ns > before
holds["timer"] = 0.0
poll_until("timer", lambda: "submit" not in addon.RUNNING, "the submission did not end")
holds["timer during the upload"] = holds.pop("timer")
assert t.job_id, t.message
r["job"] = t.job_id
r["state_at_fetch"] = t.state

# 4. Fetch while the job runs.
assert timed("fetch", bpy.ops.tessera.fetch) == {"FINISHED"}, "fetch"
r["fetch_child_running_on_return"] = addon.RUNNING["fetch"].running()
seen = [(t.state, t.frames_done, t.frames_total)]
deadline = time.time() + 600
last_refresh = 0.0
while not t.fetched:
    assert time.time() < deadline, "the frames never came: " + t.message
    timed("timer", addon._poll)
    if time.time() - last_refresh > 0.3:
        last_refresh = time.time()
        assert timed("refresh", bpy.ops.tessera.refresh) == {"FINISHED"}, "refresh"
        seen.append((t.state, t.frames_done, t.frames_total))
    time.sleep(0.02)
holds["timer during the fetch"] = holds.pop("timer")
r.update({"state": t.state, "seen": seen, "fetched": t.fetched,
          "holds_ms": {k: round(v * 1000, 1) for k, v in holds.items()}})
json.dump(r, open(RESULT, "w"))
"#;

/// Enables the add-on from the source folder, as a legacy (3.x) add-on.
const LEGACY: &str = r#"
import sys, addon_utils
sys.path.insert(0, ADDON_DIR)
addon_utils.enable("tessera_addon", default_set=True)
MOD = "tessera_addon"
"#;

/// Installs and enables the add-on as an extension from the zip Blender's
/// own `blender_ext.py build` made.
const EXTENSION: &str = r#"
assert bpy.ops.extensions.package_install_files(
    filepath=EXTENSION_ZIP, repo="user_default", enable_on_install=True) == {"FINISHED"}
MOD = "bl_ext.user_default.tessera_addon"
"#;

fn script(farm: &Farm, result: &Path, setup: &str, zip: Option<&Path>) -> String {
    let ticket = std::fs::read_to_string(farm.data.join("client.ticket")).unwrap();
    let addon = Path::new(env!("CARGO_MANIFEST_DIR")).join("blender");
    format!(
        "import bpy\nADDON_DIR = {:?}\nTICKET = {:?}\nTESSERA = {:?}\nRESULT = {:?}\nEXTERNAL = {:?}\nBIG = {:?}\nEXTENSION_ZIP = {:?}\n{setup}{DRIVE}",
        addon.to_str().unwrap(),
        ticket.trim(),
        env!("CARGO_BIN_EXE_tessera"),
        result.to_str().unwrap(),
        farm.dir.join("external").to_str().unwrap(),
        big_texture_path(farm).to_str().unwrap(),
        zip.map_or("", |z| z.to_str().unwrap()),
    )
}

fn big_texture_path(farm: &Farm) -> PathBuf {
    farm.dir.join("project/textures/big_noise.raw")
}

/// Writes 200 MB that no compression shrinks (xorshift noise).
fn write_big_texture(path: &Path) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..200 {
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block).unwrap();
    }
    f.flush().unwrap();
}

/// Drives the add-on on `project/shot.blend` in `blender` (a Command that
/// runs Python given last), renders the reference with `reference`, and
/// checks the fetched frames against it.
fn submit_watch_fetch(
    farm: &Farm,
    project: &Path,
    setup: &str,
    zip: Option<&Path>,
    run: impl Fn(&Path, &str) -> Command,
) {
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
    write_big_texture(&big_texture_path(farm));
    let result = farm.dir.join("addon-result.json");
    let out = run(&blend, &script(farm, &result, setup, zip))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the add-on failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
    println!(
        "UI-thread holds, longest of each kind (ms): {}",
        r["holds_ms"]
    );
    // No operator waits on the process it starts: each returned while the
    // process still ran.
    for key in [
        "cancel_child_running_on_return",
        "submit_child_running_on_return",
        "fetch_child_running_on_return",
    ] {
        assert_eq!(r[key], true, "{key}: {r}");
    }
    assert!(
        matches!(r["state_at_fetch"].as_str(), Some("queued" | "running")),
        "the fetch was of a running job: {r}"
    );
    // Cancel stopped the running submission: nothing was queued.
    assert_eq!(r["canceled"]["state"], "canceled", "{r}");
    assert_eq!(r["canceled"]["job"], 0, "{r}");
    // A refused submit shows the CLI's own reason.
    assert_ne!(r["bad"]["cli_code"], 0, "{r}");
    assert_eq!(r["bad"]["state"], "failed", "{r}");
    assert_eq!(r["bad"]["message"], r["bad"]["cli_last_line"], "{r}");
    assert_eq!(r["state"], "done", "{r}");
    assert_eq!(
        r["saved"], true,
        "the file was saved before it was submitted"
    );
    let renders = project.join("renders");
    assert_eq!(Path::new(r["fetched"].as_str().unwrap()), renders);
    // It watched the job through the farm's own status; the farm has that
    // one job only.
    let job = farm.status(r["job"].as_u64().unwrap());
    assert_eq!(
        (job["frames_total"].as_u64(), job["tasks_total"].as_u64()),
        (Some(3), Some(12))
    );
    let all = farm.json(&["status", "--json"]);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 1, "{all}");
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
    submit_watch_fetch(&farm, &project, LEGACY, None, |blend, src| {
        let mut cmd = Command::new("blender");
        cmd.args(["-b", "--factory-startup", "--disable-autoexec"])
            .arg(blend)
            .args(["--python-exit-code", "3", "--python-expr", src]);
        cmd
    });
}

/// Validates the extension manifest and builds the extension's zip with
/// the `blender_ext.py` that ships in `bpy` 4.5 (what `blender --command
/// extension build` runs).
fn build_extension(py: &Path, out: &Path) -> PathBuf {
    let site = Command::new(py)
        .args([
            "-I",
            "-c",
            "import bpy; print(bpy.utils.system_resource('SCRIPTS'))",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(site.stdout).unwrap();
    let scripts = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    let tool = scripts.join("addons_core/bl_pkg/cli/blender_ext.py");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("blender/tessera_addon");
    run_ok(Command::new(py).arg(&tool).arg("validate").arg(&source));
    std::fs::create_dir_all(out).unwrap();
    run_ok(
        Command::new(py)
            .arg(&tool)
            .arg("build")
            .arg("--source-dir")
            .arg(&source)
            .arg("--output-dir")
            .arg(out),
    );
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "zip"))
        .expect("blender_ext.py build made no zip")
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
    let zip = build_extension(&py, &farm.dir.join("extension"));
    // Joined before anything is submitted: this machine's Blender (3.4)
    // cannot read the 4.5 file, so submit asks a 4.5 worker to scan it,
    // and without one it refuses even a submit it should refuse for its
    // frames (the refusal the add-on is checked to show).
    farm.wait_workers(1);
    // The extension installs into a user folder of the test's own.
    let user = farm.dir.join("blender-user");
    submit_watch_fetch(&farm, &project, EXTENSION, Some(&zip), |blend, src| {
        let mut cmd = in_bpy(&py, Some(blend), src.trim_start_matches("import bpy\n"));
        cmd.env("BLENDER_USER_RESOURCES", &user);
        cmd
    });
}
