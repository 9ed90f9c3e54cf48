//! Blender versions on one farm: Debian's 3.4.1 executable next to the
//! official 4.5 LTS as the `bpy` module (the Python named by
//! `TESSERA_TEST_BPY`, which `.ci/run` installs). Each test is
//! `#[ignore = "needs blender and bpy 4.5"]`, like the other Blender tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::blender::{in_bpy, run_ok};
use crate::harness::Farm;
use crate::requires::{require, Need};

/// The `bpy` 4.5 interpreter: these tests run only when asked to
/// (`--include-ignored`), and then fail if it or Debian's Blender is missing.
fn bpy45() -> Option<PathBuf> {
    require(Need::Blender);
    require(Need::Bpy);
    std::env::var_os("TESSERA_TEST_BPY").map(PathBuf::from)
}

fn in_debian(blend: &Path, src: &str) -> Command {
    let mut cmd = Command::new("blender");
    cmd.args(["-b", "--factory-startup", "--disable-autoexec"])
        .arg(blend)
        .args(["--python-exit-code", "3", "--python-expr"])
        .arg(format!("import bpy\n{src}"));
    cmd
}

/// `make_scenes.py` run by `py`'s Blender into `root/project`.
pub(crate) fn make_project(py: Option<&Path>, root: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/make_scenes.py");
    let project = root.join("project");
    let args = [
        "--project".to_string(),
        project.to_str().unwrap().to_string(),
        "--external".to_string(),
        root.join("external").to_str().unwrap().to_string(),
    ];
    match py {
        Some(py) => {
            let src = format!(
                "P = {:?}\nexec(compile(open(P).read(), P, 'exec'))",
                script.to_str().unwrap()
            );
            run_ok(in_bpy(py, None, &src).arg("--").args(&args));
        }
        None => run_ok(
            Command::new("blender")
                .args(["-b", "--factory-startup", "--python"])
                .arg(&script)
                .arg("--")
                .args(&args),
        ),
    }
    project
}

pub(crate) fn png_pixels(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_45_file_waits_on_a_34_farm_and_completes_when_a_45_worker_joins() {
    let Some(py) = bpy45() else {
        return;
    };
    let py_s = py.to_str().unwrap();
    let mut farm = Farm::start("blender-versions", &[]);
    let root45 = farm.dir.join("v45");
    let p45 = make_project(Some(&py), &root45);
    assert_eq!(
        &std::fs::read(p45.join("shot.blend")).unwrap()[..12],
        b"BLENDER-v405"
    );
    // Blender 4.5's own full render of frame 2, dither 0 (the generator's).
    let refs = farm.dir.join("refs");
    run_ok(&mut in_bpy(
        &py,
        Some(&p45.join("shot.blend")),
        &format!(
            "s = bpy.context.scene\ns.frame_set(2)\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
            refs.join("ref45_0002").to_str().unwrap()
        ),
    ));
    // A 3.4 file with denoising on, which any Blender from 3.4 on may render.
    let root34 = farm.dir.join("v34");
    let p34 = make_project(None, &root34);
    let denoised = p34.join("denoised.blend");
    run_ok(&mut in_debian(
        &p34.join("shot.blend"),
        &format!(
            "bpy.context.scene.cycles.use_denoising = True\nbpy.ops.wm.save_as_mainfile(filepath={:?}, copy=True)\n",
            denoised.to_str().unwrap()
        ),
    ));

    farm.add_worker_with("debian", &["--engine", "blender"]);
    farm.wait_workers(1);
    let submit = |blend: &Path, extra: &[&str]| {
        let mut args = vec![
            "submit",
            blend.to_str().unwrap(),
            "--frames",
            "2",
            "--tiles",
            "3x3",
            "--blender-python",
            py_s,
            "--json",
        ];
        args.extend_from_slice(extra);
        farm.json(&args)["id"].as_u64().unwrap()
    };
    let plain = submit(&p45.join("shot.blend"), &[]);
    let zstd = submit(&p45.join("shot_zstd.blend"), &[]);
    let dn = submit(&denoised, &["--blender", ">=3.4"]);
    for job in [plain, zstd] {
        let s = farm.wait_for(job, "the 4.5 file to be blocked", |s| {
            s["blocked"] != "no workers are connected"
        });
        assert_eq!(s["blocked"], "needs Blender 4.5; workers offer 3.4", "{s}");
        assert_eq!(s["state"], "queued");
    }
    let s = farm.status(dn);
    assert_eq!(
        s["blocked"],
        "denoising needs OpenImageDenoise; Debian's Blender 3.4.1 is built without it",
        "{s}"
    );
    let text = String::from_utf8_lossy(&farm.run(&["status"]).stdout).into_owned();
    assert!(
        text.contains("blocked: needs Blender 4.5; workers offer 3.4")
            && text.contains("debian: Debian's Blender 3.4.1 renders on CPU"),
        "{text}"
    );
    let all = farm.json(&["status", "--json"]);
    let debian = &all["workers"][0];
    assert_eq!(
        debian["blenders"][0]["name"], "Debian's Blender 3.4.1",
        "{all}"
    );
    assert_eq!(debian["blenders"][0]["device"], "CPU");
    assert_eq!(debian["blenders"][0]["oidn"], false);

    farm.add_worker_with("bpy45", &["--engine", "blender", "--blender-python", py_s]);
    let out = farm.dir.join("out");
    for (job, name) in [(plain, "plain"), (zstd, "zstd"), (dn, "denoised")] {
        let dir = out.join(name);
        let done = farm.wait_done(job, &dir);
        assert_eq!(done["state"], "done", "{done}");
    }
    // Tiles stitched from 4.5 are 4.5's own full frame, bit for bit, from the
    // plain file and from its compressed copy.
    let want = png_pixels(&refs.join("ref45_0002.png"));
    for name in ["plain", "zstd"] {
        let got = png_pixels(&out.join(name).join("frame_0002.png"));
        assert_eq!((got.0, got.1), (want.0, want.1));
        let differing = got.2.iter().zip(&want.2).filter(|(a, b)| a != b).count();
        assert_eq!(
            differing, 0,
            "{name}: {differing} samples differ from 4.5's own render"
        );
    }
    // The 3.4 worker never opened a 4.5 file, and is still there.
    assert!(
        !farm.log_of(0).contains("blender session started job=1")
            && !farm.log_of(0).contains("blender session started job=2"),
        "{}",
        farm.log_of(0)
    );
    let all = farm.json(&["status", "--json"]);
    let names: Vec<&str> = (all["workers"].as_array().unwrap().iter())
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["debian", "bpy45"], "{all}");
    let bpy = &all["workers"][1]["blenders"][0];
    assert_eq!(bpy["name"], "Blender 4.5.4 LTS (bpy)", "{all}");
    assert_eq!(
        (bpy["oidn"].as_bool(), bpy["osl"].as_bool()),
        (Some(true), Some(true))
    );
}

#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_file_newer_than_every_local_blender_is_refused_without_a_scanner_and_bad_versions_are_refused()
{
    let Some(py) = bpy45() else {
        return;
    };
    let farm = Farm::start("blender-versions-submit", &[]);
    let p45 = make_project(Some(&py), &farm.dir.join("v45"));
    let shot = p45.join("shot.blend");
    // Debian's 3.4 must not scan a 4.5 file: the user is told what to do.
    let out = farm.run(&["submit", shot.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("was saved by Blender 4.5") && err.contains("--blender-python"),
        "{err}"
    );
    // Asking a 4.5 file to run on 4.2: refused before upload.
    let out = farm.run(&[
        "submit",
        shot.to_str().unwrap(),
        "--blender",
        "4.2",
        "--blender-python",
        py.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Blender 4.2 cannot read it"), "{err}");
    let out = farm.run(&["submit", shot.to_str().unwrap(), "--blender", "four"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a Blender version"));
    let all = farm.json(&["status", "--json"]);
    assert_eq!(
        all["jobs"].as_array().unwrap().len(),
        0,
        "nothing was submitted"
    );
}
