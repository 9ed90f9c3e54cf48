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

/// Blender 4.5's own full render of frame 2 of `blend` (dither 0, the
/// generator's) to `stem.png`.
fn render_frame_2(py: &Path, blend: &Path, stem: &Path) {
    run_ok(&mut in_bpy(
        py,
        Some(blend),
        &format!(
            "s = bpy.context.scene\ns.frame_set(2)\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
            stem.to_str().unwrap()
        ),
    ));
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
    let refs = farm.dir.join("refs");
    render_frame_2(&py, &p45.join("shot.blend"), &refs.join("ref45_0002"));
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
        err.contains("was saved by Blender 4.5")
            && err.contains("no worker on the farm offers Blender 4.5 or newer to scan it")
            && err.contains("--blender-python"),
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

/// A client whose only Blender is Debian's 3.4, and a farm with a bpy 4.5
/// worker: the 4.5 file is scanned on the worker, never opened by a 3.4;
/// a missing texture is still named before anything is submitted; and the
/// file's textures (relative, absolute, a sequence, UDIM tiles) and its
/// linked libraries (one nested in the other) are found, uploaded and
/// rendered: the stitched tiles are 4.5's own full render, bit for bit.
#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_45_file_is_scanned_on_a_45_worker_when_the_clients_blender_is_34() {
    let Some(py) = bpy45() else {
        return;
    };
    let mut farm = Farm::start("blender-farm-scan", &[]);
    let p45 = make_project(Some(&py), &farm.dir.join("v45"));
    let refs = farm.dir.join("refs");
    render_frame_2(&py, &p45.join("shot.blend"), &refs.join("ref45_0002"));
    // The client's Blender: Debian's 3.4, through a wrapper that notes
    // every command line it is run with.
    let calls = farm.dir.join("blender-calls.txt");
    let wrapper = farm.dir.join("blender-34");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> {:?}\nexec blender \"$@\"\n",
            calls.to_str().unwrap()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    farm.add_worker_with(
        "bpy45",
        &[
            "--engine",
            "blender",
            "--blender-python",
            py.to_str().unwrap(),
        ],
    );
    farm.wait_workers(1);
    let submit = |blend: &Path| {
        crate::harness::tessera()
            .args(["submit", blend.to_str().unwrap(), "--frames", "2"])
            .args(["--tiles", "3x3", "--json"])
            .env("TESSERA_TICKET", farm.client_ticket())
            .env("TESSERA_BLENDER", &wrapper)
            .env_remove("TESSERA_BLENDER_PYTHON")
            .env("TESSERA_ASSET_ROOTS", farm.dir.join("v45/external"))
            .output()
            .unwrap()
    };

    // A missing texture, found by the farm's scan, is named by this
    // machine before anything is submitted.
    let out = submit(&p45.join("missing.blend"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("file(s) the scene uses are missing; nothing was submitted")
            && err.contains(&format!(
                "{} (image used by",
                p45.join("textures/nope.png").display()
            )),
        "{err}"
    );
    let all = farm.json(&["status", "--json"]);
    assert_eq!(
        all["jobs"].as_array().unwrap().len(),
        0,
        "nothing was submitted: {all}"
    );

    let out = submit(&p45.join("shot.blend"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("worker bpy45 scanned it"), "{err}");
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = farm.dir.join("out");
    let done = farm.wait_done(job["id"].as_u64().unwrap(), &dir);
    assert_eq!(done["state"], "done", "{done}");
    let want = png_pixels(&refs.join("ref45_0002.png"));
    let got = png_pixels(&dir.join("frame_0002.png"));
    assert_eq!((got.0, got.1), (want.0, want.1));
    let differing = got.2.iter().zip(&want.2).filter(|(a, b)| a != b).count();
    assert_eq!(
        differing, 0,
        "{differing} samples differ from 4.5's own render"
    );
    // Every file the scene uses reached the worker's job folder, those of
    // the libraries (found by their own farm scans) too.
    let jobs = farm.dir.join("cache-bpy45/jobs");
    let folder = (std::fs::read_dir(&jobs).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir() && p.file_name().unwrap().to_str().unwrap().starts_with("1-"))
        .expect("the job's folder");
    let external = farm.dir.join("v45/external/ext.png");
    let ext = format!("_abs{}", external.display());
    let seq: Vec<String> = (1..=6)
        .map(|f| format!("textures/seq/seq_{f:04}.png"))
        .collect();
    let wanted = [
        "shot.blend",
        "textures/rel.png",
        &ext,
        "textures/udim/grid.1001.png",
        "textures/udim/grid.1002.png",
        "lib/props.blend",
        "lib/tex/lib.png",
        "lib/deep/deep.blend",
        "lib/deep/tex/deep.png",
    ];
    for f in wanted.iter().copied().chain(seq.iter().map(String::as_str)) {
        assert!(
            folder.join(f).is_file(),
            "{f} is not in {}",
            folder.display()
        );
    }
    // The client asked its 3.4 which Blender it is, and never gave it a file.
    let calls = std::fs::read_to_string(&calls).unwrap();
    assert!(!calls.is_empty(), "the client never consulted its Blender");
    assert!(!calls.contains(".blend"), "a 3.4 opened a .blend: {calls}");
}

/// `submit` of a `.blend` saved by `py`, as this machine does it: scanned
/// by the bpy (`Some(py)`), or by the farm (`None`: the client's Blender is
/// Debian's 3.4, which cannot read a 4.5 file), with `env` added; the job
/// is held (`--paused`), so no worker renders it.
fn submit_45(
    farm: &Farm,
    blend: &Path,
    py: Option<&Path>,
    args: &[&str],
    env: &[(&str, &Path)],
) -> std::process::Output {
    let mut cmd = farm.command(&[&["submit", blend.to_str().unwrap(), "--paused"], args].concat());
    match py {
        Some(py) => cmd.env("TESSERA_BLENDER_PYTHON", py),
        None => cmd.env_remove("TESSERA_BLENDER_PYTHON"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// A default factory-startup 4.5 scene references Blender's own brush
/// bundle (`4.5/datafiles/assets/brushes/essentials_brushes-gp_draw.blend`)
/// by a path relative to the file: it uploads only its `.blend`, with no
/// warning, scanned here or by the farm, and also once the file is moved
/// (the path then points nowhere): the worker's Blender has its own.
#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_default_45_scene_uploads_only_itself_and_warns_of_nothing_also_once_moved() {
    let Some(py) = bpy45() else {
        return;
    };
    let mut farm = Farm::start("blender-default-45", &[]);
    let saved = farm.dir.join("a/default.blend");
    std::fs::create_dir_all(saved.parent().unwrap()).unwrap();
    run_ok(&mut in_bpy(
        &py,
        None,
        &format!(
            "bpy.ops.wm.read_factory_settings(use_empty=False)\nbpy.ops.wm.save_as_mainfile(filepath={:?})\n",
            saved.to_str().unwrap()
        ),
    ));
    let bytes = std::fs::read(&saved).unwrap();
    assert!(
        memchr::memmem::find(
            &bytes,
            b"datafiles/assets/brushes/essentials_brushes-gp_draw.blend"
        )
        .is_some(),
        "the default scene no longer references Blender's brush bundle: this test shows nothing"
    );
    let moved = farm.dir.join("b/c/d/moved.blend");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::copy(&saved, &moved).unwrap();
    farm.add_worker_with(
        "bpy45",
        &[
            "--engine",
            "blender",
            "--blender-python",
            py.to_str().unwrap(),
        ],
    );
    farm.wait_workers(1);
    for blend in [&saved, &moved] {
        for scanner in [Some(py.as_path()), None] {
            let out = submit_45(&farm, blend, scanner, &["--json"], &[]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{}: {err}", blend.display());
            assert!(!err.contains("warning"), "{}: {err}", blend.display());
            if scanner.is_none() {
                assert!(err.contains("worker bpy45 scanned it"), "{err}");
            }
            let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(job["warnings"], serde_json::json!([]), "{job}");
            let name = blend.file_name().unwrap().to_str().unwrap().to_string();
            assert_eq!(
                crate::sharing::uploads(&job),
                [(name, blend.to_path_buf())],
                "{job}"
            );
        }
    }
    // The store holds the two .blend files (the same bytes) and nothing
    // of Blender's.
    let bundle = py
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("lib/python3.11/site-packages/bpy/4.5/datafiles/assets/brushes/essentials_brushes-gp_draw.blend");
    let bundle = std::fs::read(&bundle).unwrap();
    assert!(!crate::sharing::store_holds(&farm, &bundle));
}

/// The hostile `.blend` of `blender::submit_refuses_files_outside_…`,
/// saved by 4.5 and scanned by the farm (this machine's Blender is 3.4):
/// the same refusals, and a library that is not shared is not even
/// uploaded for its own scan.
#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_farm_scan_refuses_what_a_local_scan_refuses_and_uploads_no_unshared_library() {
    use crate::sharing::{assert_refused, store_holds};
    let Some(py) = bpy45() else {
        return;
    };
    let mut farm = Farm::start("blender-farm-sharing", &[]);
    let root = farm.dir.join("artist");
    let home = root.join("home");
    let key = home.join(".ssh/id_rsa");
    let textures = root.join("textures");
    let wood = textures.join("wood.png");
    let libs = root.join("libs");
    let lib = libs.join("props.blend");
    let hostile = root.join("proj/hostile.blend");
    let hostname = Path::new("/etc/hostname");
    let (secret, wood_bytes) = (
        crate::harness::noise(4096, 21),
        crate::harness::noise(4096, 22),
    );
    for (p, b) in [(&key, &secret), (&wood, &wood_bytes)] {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
    let make = |out: &Path, refs: &[String]| {
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        run_ok(
            in_bpy(&py, None, crate::blender::MAKE_REFERENCING)
                .arg("--")
                .arg(out)
                .args(refs),
        );
    };
    let r = |name: &str, p: &Path| format!("{name}={}", p.display());
    make(&lib, &["lib-src=".to_string()]);
    make(
        &hostile,
        &[
            r("key", &key),
            r("host", hostname),
            r("wood", &wood),
            r("lib", &lib),
        ],
    );
    let lib_bytes = std::fs::read(&lib).unwrap();
    farm.add_worker_with(
        "bpy45",
        &[
            "--engine",
            "blender",
            "--blender-python",
            py.to_str().unwrap(),
        ],
    );
    farm.wait_workers(1);
    let env = [("HOME", home.as_path())];
    let out = submit_45(&farm, &hostile, None, &[], &env);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("worker bpy45 scanned it"), "{err}");
    assert_refused(
        &err,
        &[
            (&key, "hidden folder of a home directory"),
            (hostname, "image used by Image 'host'"),
            (&wood, "image used by Image 'wood'"),
            (&lib, "library used by Library 'props.blend'"),
        ],
        &[],
    );
    assert!(
        !store_holds(&farm, &lib_bytes),
        "an unshared library went up for its scan"
    );
    // Its folder shared, the library goes up for its scan; the key and
    // /etc/hostname are still refused.
    let (t, l) = (textures.to_str().unwrap(), libs.to_str().unwrap());
    let out = submit_45(
        &farm,
        &hostile,
        None,
        &["--asset-root", t, "--asset-root", l],
        &env,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_refused(
        &err,
        &[(&key, "hidden folder"), (hostname, "Image 'host'")],
        &[&wood, &lib],
    );
    assert!(store_holds(&farm, &lib_bytes));
    for refused in [&secret, &std::fs::read(hostname).unwrap(), &wood_bytes] {
        assert!(
            !store_holds(&farm, refused),
            "a refused file reached the store"
        );
    }
    let all = farm.json(&["status", "--json"]);
    assert_eq!(all["jobs"].as_array().map(Vec::len), Some(0), "{all}");
}
