//! Real Blender (the distribution's `blender`, 3.4) on real `.blend` files
//! made by `scenes/blender/make_scenes.py`. Each test is
//! `#[ignore = "needs blender"]`: listed as ignored by a plain `cargo test`,
//! run by CI's `--include-ignored`, and failed there if Blender is missing.
//!
//! Each test is also `blender::on_bpy::TEST`, the same on the `bpy` module
//! (see [`also_on_bpy`]). With `TESSERA_TEST_BLENDER_RUNTIME=bpy` the tests run on the `bpy`
//! module in the Python named by `TESSERA_BLENDER_PYTHON` instead: the
//! scenes are made and saved by that Blender, its own renders are the
//! references, workers offer it with `--blender-python`, and `submit`
//! (which reads `TESSERA_BLENDER_PYTHON` too) scans with it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::Farm;
use crate::requires::{require, Need};

/// A Blender test runs only when asked to (`--include-ignored`), and then
/// fails loudly if Blender is missing instead of passing.
pub(crate) fn enabled() -> bool {
    require(Need::Blender);
    true
}

/// Points this test process at the `bpy` module (`$TESSERA_TEST_BPY`)
/// instead of Debian's executable, as `TESSERA_TEST_BLENDER_RUNTIME=bpy`
/// would: what the [`also_on_bpy`] wrappers call before a test's body. The
/// variables it sets reach the whole process and the farms it starts, so it
/// runs only where nextest gives each test a process of its own.
pub(crate) fn use_bpy() {
    require(Need::Bpy);
    assert!(
        std::env::var("NEXTEST_EXECUTION_MODE").is_ok_and(|m| m == "process-per-test"),
        "a Blender test on bpy sets its process's environment: run it with cargo nextest \
         (./test), which gives each test a process of its own"
    );
    let py = std::env::var_os("TESSERA_TEST_BPY").unwrap();
    std::env::set_var("TESSERA_TEST_BLENDER_RUNTIME", "bpy");
    std::env::set_var("TESSERA_BLENDER_PYTHON", py);
}

/// The tests named, again on the official Blender 4.5 LTS as the `bpy`
/// module: `MODULE::on_bpy::TEST` runs `MODULE::TEST` after [`use_bpy`]
/// (scenes saved by 4.5, references rendered by 4.5). In the same run as
/// the rest, so CI needs no second pass for them.
macro_rules! also_on_bpy {
    ($($test:ident),* $(,)?) => {
        mod on_bpy {
            $(
                #[test]
                #[ignore = "needs blender and bpy 4.5 (TESSERA_TEST_BPY)"]
                fn $test() {
                    crate::blender::use_bpy();
                    super::$test();
                }
            )*
        }
    };
}
pub(crate) use also_on_bpy;

also_on_bpy!(
    tiled_blend_with_relative_absolute_and_linked_files_matches_blenders_own_render,
    sample_ranges_merge_to_the_full_render_within_float_precision,
    a_text_block_in_a_submitted_file_never_runs,
    bad_blend_files_are_refused_before_upload_with_one_line,
    a_crashing_blender_fails_the_task_with_its_last_lines_then_the_job,
    a_worker_whose_blender_always_crashes_is_blocklisted_and_the_job_completes_on_the_others,
    submit_refuses_files_outside_the_project_and_asset_roots_and_stores_none_of_them,
    a_reference_the_job_does_not_carry_never_reads_the_workers_own_file,
);

/// The `bpy` interpreter the tests run on, when they run on the module.
fn bpy_python() -> Option<PathBuf> {
    if std::env::var("TESSERA_TEST_BLENDER_RUNTIME").is_ok_and(|v| v == "bpy") {
        let py = std::env::var_os("TESSERA_BLENDER_PYTHON")
            .expect("TESSERA_TEST_BLENDER_RUNTIME=bpy needs TESSERA_BLENDER_PYTHON");
        return Some(PathBuf::from(py));
    }
    None
}

/// Python `src` in the bpy interpreter `py`, `blend` opened first (scripts
/// off).
pub(crate) fn in_bpy(py: &Path, blend: Option<&Path>, src: &str) -> Command {
    let open = blend.map_or(String::new(), |b| {
        format!(
            "bpy.ops.wm.open_mainfile(filepath={:?}, use_scripts=False)\n",
            b.to_str().unwrap()
        )
    });
    let mut cmd = Command::new(py);
    cmd.arg("-I")
        .arg("-c")
        .arg(format!("import bpy\n{open}{src}"));
    cmd
}

/// Runs Python `src` in the tests' Blender, with `blend` opened first
/// (scripts off) and `args` after `--`.
pub(crate) fn blender_script<S: AsRef<OsStr>>(
    blend: Option<&Path>,
    src: &str,
    args: &[S],
) -> Command {
    match bpy_python() {
        Some(py) => {
            let mut cmd = in_bpy(&py, blend, src);
            cmd.arg("--").args(args);
            cmd
        }
        None => {
            let exe = std::env::var_os("TESSERA_BLENDER").unwrap_or_else(|| "blender".into());
            let mut cmd = Command::new(exe);
            cmd.args(["-b", "--factory-startup", "--disable-autoexec"]);
            if let Some(b) = blend {
                cmd.arg(b);
            }
            let src = format!("import bpy\n{src}");
            cmd.args(["--python-exit-code", "3", "--python-expr", &src, "--"])
                .args(args);
            cmd
        }
    }
}

/// `--engine blender`, and the tests' Blender when it is the module.
pub(crate) fn blender_worker() -> Vec<String> {
    let mut args = vec!["--engine".to_string(), "blender".to_string()];
    if let Some(py) = bpy_python() {
        args.push("--blender-python".into());
        args.push(py.to_str().unwrap().into());
    }
    args
}

/// A worker offering `blender` (the tests' kind of Blender) instead.
fn add_worker_with_blender(farm: &mut Farm, name: &str, blender: &Path) -> usize {
    let flag = if bpy_python().is_some() {
        "--blender-python"
    } else {
        "--blender"
    };
    farm.add_worker_with(
        name,
        &["--engine", "blender", flag, blender.to_str().unwrap()],
    )
}

/// Starts a worker offering the tests' Blender.
fn add_blender_worker(farm: &mut Farm, name: &str) -> usize {
    let args = blender_worker();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    farm.add_worker_with(name, &args)
}

/// Debian's Blender executable (or `$TESSERA_BLENDER`).
pub(crate) fn blender() -> Command {
    let exe = std::env::var_os("TESSERA_BLENDER").unwrap_or_else(|| "blender".into());
    Command::new(exe)
}

pub(crate) fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run blender");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test project made by the generator: `project/shot.blend` with a
/// relative texture, a linked library, and an absolute-path texture in
/// `external/`.
pub(crate) struct Project {
    pub(crate) dir: PathBuf,
    external: PathBuf,
}

impl Project {
    pub(crate) fn make(root: &Path, extra: &[&str]) -> Project {
        let dir = root.join("project");
        let external = root.join("external");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/make_scenes.py");
        let src = format!(
            "P = {:?}\nexec(compile(open(P).read(), P, 'exec'))",
            script.to_str().unwrap()
        );
        let mut args = vec![
            OsStr::new("--project"),
            dir.as_os_str(),
            OsStr::new("--external"),
            external.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        run_ok(&mut blender_script(None, &src, &args));
        Project { dir, external }
    }

    pub(crate) fn blend(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// Blender's own render of the untouched file, as `blender -b FILE -o
    /// OUT/ref_#### -f N` writes it.
    pub(crate) fn reference(&self, blend: &str, out: &Path, frames: &[u32]) {
        for f in frames {
            let src = format!(
                "s = bpy.context.scene\ns.frame_set({f})\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
                out.join(format!("ref_{f:04}")).to_str().unwrap()
            );
            run_ok(&mut blender_script(
                Some(&self.dir.join(blend)),
                &src,
                &[] as &[&str],
            ));
        }
    }
}

/// Decoded PNG: (width, height, colour type, bit depth, raw samples).
pub(crate) fn png_raw(path: &Path) -> (u32, u32, png::ColorType, png::BitDepth, Vec<u8>) {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (
        info.width,
        info.height,
        info.color_type,
        info.bit_depth,
        buf,
    )
}

/// The float pixels of any image Blender can read (EXR of any codec).
pub(crate) fn blender_pixels(image: &Path, scratch: &Path) -> Vec<f32> {
    let out = scratch.join(format!(
        "{}.f32",
        image.file_name().unwrap().to_string_lossy()
    ));
    let expr = format!(
        "import bpy, array\nimg = bpy.data.images.load({:?})\npx = array.array('f', [0.0]) * len(img.pixels)\nimg.pixels.foreach_get(px)\nopen({:?}, 'wb').write(px.tobytes())\n",
        image.to_str().unwrap(),
        out.to_str().unwrap()
    );
    run_ok(&mut blender_script(None, &expr, &[] as &[&str]));
    std::fs::read(&out)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// An image's samples are not blank: a render that came back all zero (or
/// one colour) would make any comparison with it meaningless.
pub(crate) fn assert_not_blank(path: &Path, samples: &[u8]) {
    let distinct: std::collections::HashSet<u8> = samples.iter().copied().collect();
    assert!(
        distinct.len() >= 16,
        "{} is blank: {} distinct sample values",
        path.display(),
        distinct.len()
    );
}

/// `got` has exactly the samples of Blender's own render `want`, which is
/// not blank.
pub(crate) fn assert_same_pixels(got: &Path, want: &Path) {
    let (g, w) = (png_raw(got), png_raw(want));
    assert_not_blank(want, &w.4);
    assert_eq!(
        (g.0, g.1, g.2, g.3),
        (w.0, w.1, w.2, w.3),
        "{} vs {}: size or format",
        got.display(),
        want.display()
    );
    let differing = g.4.iter().zip(&w.4).filter(|(a, b)| a != b).count();
    assert_eq!(
        differing,
        0,
        "{}: {differing} samples differ from Blender's own render {}",
        got.display(),
        want.display()
    );
}

#[test]
#[ignore = "needs blender"]
fn tiled_blend_with_relative_absolute_and_linked_files_matches_blenders_own_render() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-tiles", &[]);
    let project = Project::make(&farm.dir, &[]);
    let refs = farm.dir.join("refs");
    project.reference("shot.blend", &refs, &[1, 2, 3, 4, 5, 6]);

    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--tiles",
        "3x3",
        "--json",
    ]);
    assert_eq!(job["frames_total"], 6);
    assert_eq!(job["tasks_total"], 54);
    // Workers have none of the artist's paths: remove the absolute-path
    // texture from its original place before any worker starts.
    let absolute: Vec<_> = std::fs::read_dir(&project.external)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!absolute.is_empty());
    let aside = farm.dir.join("aside");
    std::fs::create_dir_all(&aside).unwrap();
    for f in &absolute {
        std::fs::rename(f, aside.join(f.file_name().unwrap())).unwrap();
    }
    let blocked = farm.status(job["id"].as_u64().unwrap());
    assert_eq!(blocked["blocked"], "no workers are connected");
    for name in ["b1", "b2", "b3"] {
        add_blender_worker(&mut farm, name);
    }
    let out = farm.dir.join("out");
    let id = job["id"].as_u64().unwrap().to_string();
    let done = farm.json(&["wait", &id, "--json", "--output", out.to_str().unwrap()]);
    assert_eq!(done["state"], "done", "{done}");
    for f in 1..=6 {
        assert_same_pixels(
            &out.join(format!("frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
    // Persistent sessions: far fewer Blender starts than tasks.
    let starts: usize = (0..3)
        .map(|i| farm.log_of(i).matches("blender session started").count())
        .sum();
    assert!(starts <= 6, "{starts} blender starts for 54 tasks");

    // The zstd-compressed copy renders the same pixels (its submit needs the
    // artist's files back in place).
    for f in &absolute {
        std::fs::rename(aside.join(f.file_name().unwrap()), f).unwrap();
    }
    let zstd = project.dir.join("shot_zstd.blend");
    assert_eq!(
        &std::fs::read(&zstd).unwrap()[..4],
        &[0x28, 0xb5, 0x2f, 0xfd],
        "zstd magic"
    );
    let out_z = farm.dir.join("out_zstd");
    let z = farm.json(&[
        "submit",
        zstd.to_str().unwrap(),
        "--frames",
        "2",
        "--tiles",
        "2x2",
        "--wait",
        "--json",
        "--output",
        out_z.to_str().unwrap(),
    ]);
    assert_eq!(z["state"], "done", "{z}");
    assert_same_pixels(&out_z.join("frame_0002.png"), &refs.join("ref_0002.png"));
}

#[test]
#[ignore = "needs blender"]
fn sample_ranges_merge_to_the_full_render_within_float_precision() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-ranges", &[]);
    let project = Project::make(&farm.dir, &["--exr"]);
    let refs = farm.dir.join("refs");
    project.reference("shot.blend", &refs, &[3]);
    add_blender_worker(&mut farm, "b1");
    add_blender_worker(&mut farm, "b2");
    let out = farm.dir.join("out");
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--frames",
        "3",
        "--tiles",
        "2x2",
        "--sample-ranges",
        "2",
        "--wait",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["tasks_total"], 8);
    let got = blender_pixels(&out.join("frame_0003.exr"), &farm.dir);
    let want = blender_pixels(&refs.join("ref_0003.exr"), &farm.dir);
    assert_eq!(got.len(), want.len());
    let max = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "sample ranges vs full render: max abs difference {max:e} over {} floats",
        got.len()
    );
    assert!(max <= 1e-5, "max abs difference {max}");
    assert!(want.iter().any(|&v| v > 0.05), "the reference is not black");
}

#[test]
#[ignore = "needs blender"]
fn a_text_block_in_a_submitted_file_never_runs() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-trap", &[]);
    let marker = farm.dir.join("MARKER");
    let project = Project::make(&farm.dir, &["--trap", marker.to_str().unwrap()]);
    add_blender_worker(&mut farm, "b1");
    let job = farm.json(&[
        "submit",
        &project.blend("trap.blend"),
        "--frames",
        "1",
        "--tiles",
        "2x1",
        "--wait",
        "--json",
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert!(!marker.exists(), "the trap's text block ran");
}

#[test]
#[ignore = "needs blender"]
fn bad_blend_files_are_refused_before_upload_with_one_line() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-bad", &[]);
    // Not a .blend at all.
    let corrupt = farm.dir.join("corrupt.blend");
    std::fs::write(&corrupt, b"this is not a blend file").unwrap();
    let out = farm.run(&["submit", corrupt.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("is not a readable .blend file"), "{err}");

    // A texture missing on the artist's machine: named with its user.
    let project = Project::make(&farm.dir, &[]);
    let ext: Vec<_> = std::fs::read_dir(&project.external)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    std::fs::remove_file(&ext[0]).unwrap();
    let out = farm.run(&["submit", &project.blend("shot.blend")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("missing") && err.contains(ext[0].to_str().unwrap()) && err.contains("Image"),
        "{err}"
    );
    let all = farm.json(&["status", "--json"]);
    assert_eq!(
        all["jobs"].as_array().unwrap().len(),
        0,
        "nothing was submitted"
    );

    // Frames outside the scene's range.
    let out = farm.run(&[
        "submit",
        &project.blend("shot.blend"),
        "--allow-missing",
        "--frames",
        "5-9",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the scene's frame range 1-6"));

    // --allow-missing goes ahead; a farm without Blender says why it waits.
    farm.add_worker_with("cpu-only", &["--engine", "builtin"]);
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--allow-missing",
        "--frames",
        "1",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    let s = farm.wait_for(id, "the worker to join", |s| {
        s["blocked"] != "no workers are connected"
    });
    assert_eq!(
        s["blocked"],
        "no connected worker offers the blender engine"
    );
    assert_eq!(s["state"], "queued");
}

/// A Blender that passes the worker's start-up probes (version and
/// capabilities), then dies like a crashed GPU driver whenever it is asked
/// to render: the tests' executable, or their `bpy` interpreter.
fn crashing_blender(dir: &Path) -> PathBuf {
    let wrapper = dir.join("crashing-blender");
    let real = bpy_python().map_or_else(
        || std::env::var("TESSERA_BLENDER").unwrap_or_else(|_| "blender".into()),
        |p| p.to_str().unwrap().to_string(),
    );
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\nif [ \"$1\" = --version ]; then exec {real} --version; fi\ncase \"$*\" in *'Tessera capability probe'*|*TESSERA_EEVEE_OK*) exec {real} \"$@\";; esac\necho 'CUDA error: an illegal memory access was encountered (simulated)' >&2\nkill -SEGV $$\n"),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&wrapper)
        .status()
        .unwrap();
    wrapper
}

#[test]
#[ignore = "needs blender"]
fn a_crashing_blender_fails_the_task_with_its_last_lines_then_the_job() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-crash", &[]);
    let project = Project::make(&farm.dir, &[]);
    let wrapper = crashing_blender(&farm.dir);
    add_worker_with_blender(&mut farm, "crashy", &wrapper);
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--frames",
        "1",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap().to_string();
    let out = farm.run(&["wait", &id, "--json"]);
    assert!(!out.status.success(), "wait on a failed job exits non-zero");
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["state"], "failed");
    let error = s["error"].as_str().unwrap();
    assert!(
        error.contains("failed 3 times") && error.contains("illegal memory access"),
        "{error}"
    );
    // The real error, said once, in one line a person can read; Blender's
    // log stays with `tessera logs`.
    assert_eq!(error.matches("illegal memory access").count(), 1, "{error}");
    assert!(
        !error.contains('\n') && error.len() < 600,
        "{} bytes: {error}",
        error.len()
    );
    let logs = farm.json(&["logs", &id, "--json"]);
    let attempts = logs["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{logs}");
    assert!(
        (attempts.iter()).all(|a| a["log"].as_str().unwrap().contains("illegal memory access")),
        "{logs}"
    );
}

#[test]
#[ignore = "needs blender"]
fn a_worker_whose_blender_always_crashes_is_blocklisted_and_the_job_completes_on_the_others() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-blocklist", &[]);
    let project = Project::make(&farm.dir, &[]);
    let refs = farm.dir.join("refs");
    project.reference("shot.blend", &refs, &[4]);
    let wrapper = crashing_blender(&farm.dir);
    add_worker_with_blender(&mut farm, "crashy", &wrapper);
    // The crashing worker joins first, so it is offered tasks.
    farm.wait_workers(1);
    add_blender_worker(&mut farm, "good1");
    add_blender_worker(&mut farm, "good2");
    let out = farm.dir.join("out");
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--frames",
        "4",
        "--tiles",
        "4x3",
        "--wait",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert_same_pixels(&out.join("frame_0004.png"), &refs.join("ref_0004.png"));
    // Blocklisted after 3 failures; its queued tasks are handed back, but
    // with pipelined leases one more may have started before the
    // coordinator's word arrives.
    let crashes = farm.log_of(0).matches("task failed").count();
    assert!(
        (1..=4).contains(&crashes),
        "the crashing worker failed {crashes} tasks"
    );
    if crashes >= 3 {
        let log = farm.coordinator_log();
        assert!(
            log.contains("worker blocklisted for this job after 3 failures"),
            "{log}"
        );
    }
}

/// Python for [`blender_script`]: saves `OUT` (the first argument after
/// `--`) with one file image per `NAME=PATH` argument (kept by a fake
/// user), and, for `lib=PATH`, the cube's material linked from that
/// library instead. `lib-src` saves a library holding material `Prop`.
pub(crate) const MAKE_REFERENCING: &str = r#"
import sys
argv = sys.argv[sys.argv.index("--") + 1:]
out, refs = argv[0], argv[1:]
for r in refs:
    name, path = r.split("=", 1)
    if name == "lib-src":
        continue
    if name == "lib":
        with bpy.data.libraries.load(path, link=True) as (src, dst):
            dst.materials = ["Prop"]
        bpy.data.objects["Cube"].data.materials.append(dst.materials[0])
        continue
    img = bpy.data.images.new(name, 4, 4)
    img.source = "FILE"
    img.filepath = path
    img.use_fake_user = True
if refs == ["lib-src="]:
    bpy.data.materials.new("Prop").use_fake_user = True
bpy.ops.wm.save_as_mainfile(filepath=out)
"#;

fn make_referencing(out: &Path, refs: &[String]) {
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let mut args = vec![out.to_str().unwrap().to_string()];
    args.extend(refs.iter().cloned());
    run_ok(&mut blender_script(None, MAKE_REFERENCING, &args));
}

/// The issue's hostile `.blend`: images at a key in a fake home's `.ssh`,
/// at `/etc/hostname` and at a texture outside the project, and a library
/// outside it. Submit refuses, naming each with its datablock; asset roots
/// share the texture and the library but never the key (not even the home
/// as an asset root); `--allow-file` shares one file. Nothing refused
/// reaches the coordinator's store, checked there; a scene that uses only
/// shared files is submitted and `--json` says what was read from where.
#[test]
#[ignore = "needs blender"]
fn submit_refuses_files_outside_the_project_and_asset_roots_and_stores_none_of_them() {
    use crate::sharing::{assert_refused, store_holds, submit, uploads};
    if !enabled() {
        return;
    }
    let farm = Farm::start("blender-sharing", &[]);
    let root = farm.dir.join("artist");
    let home = root.join("home");
    let key = home.join(".ssh/id_rsa");
    let textures = root.join("textures");
    let wood = textures.join("wood.png");
    let libs = root.join("libs");
    let lib = libs.join("props.blend");
    let proj = root.join("proj");
    let inside = proj.join("tex/in.png");
    let hostname = Path::new("/etc/hostname");
    let (secret, wood_bytes, inside_bytes) = (
        crate::harness::noise(4096, 11),
        crate::harness::noise(4096, 12),
        crate::harness::noise(4096, 13),
    );
    for (p, b) in [
        (&key, &secret),
        (&wood, &wood_bytes),
        (&inside, &inside_bytes),
    ] {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
    let r = |name: &str, p: &Path| format!("{name}={}", p.display());
    make_referencing(&lib, &["lib-src=".to_string()]);
    let hostile = proj.join("hostile.blend");
    make_referencing(
        &hostile,
        &[
            r("key", &key),
            r("host", hostname),
            r("wood", &wood),
            "inside=//tex/in.png".to_string(),
            r("lib", &lib),
        ],
    );
    let clean = proj.join("clean.blend");
    make_referencing(
        &clean,
        &[r("wood", &wood), "inside=//tex/in.png".to_string()],
    );
    let lib_bytes = std::fs::read(&lib).unwrap();
    let hostname_bytes = std::fs::read(hostname).unwrap();
    let nothing_refused_stored = || {
        assert!(!store_holds(&farm, &secret), "the key reached the store");
        assert!(
            !store_holds(&farm, &hostname_bytes),
            "/etc/hostname reached the store"
        );
        assert!(
            !store_holds(&farm, &lib_bytes),
            "the library reached the store"
        );
    };
    let home_env = [("HOME", home.as_path())];
    let h = hostile.to_str().unwrap();
    let (t, l, hm) = (
        textures.to_str().unwrap(),
        libs.to_str().unwrap(),
        home.to_str().unwrap(),
    );
    let hidden = "hidden folder of a home directory";

    // No asset root: all four named, with their datablocks.
    let (ok, _, err) = submit(&farm, &[h, "--json"], &home_env);
    assert!(!ok);
    assert_refused(
        &err,
        &[
            (
                &key,
                &format!(
                    "image used by Image 'key'; in {}, a {hidden}",
                    home.join(".ssh").display()
                ),
            ),
            (hostname, "image used by Image 'host'"),
            (&wood, "image used by Image 'wood'"),
            (&lib, "library used by Library 'props.blend'"),
        ],
        &[&inside],
    );
    // The texture's and the library's folders as asset roots: the key and
    // /etc/hostname still refused.
    let (ok, _, err) = submit(&farm, &[h, "--asset-root", t, "--asset-root", l], &home_env);
    assert!(!ok);
    assert_refused(
        &err,
        &[(&key, hidden), (hostname, "Image 'host'")],
        &[&wood, &lib, &inside],
    );
    // The home itself as an asset root (from the environment): its hidden
    // folders are still refused; --allow-file shares /etc/hostname alone.
    let (ok, _, err) = submit(
        &farm,
        &[
            h,
            "--asset-root",
            t,
            "--asset-root",
            l,
            "--allow-file",
            "/etc/hostname",
        ],
        &[
            ("HOME", home.as_path()),
            ("TESSERA_ASSET_ROOTS", Path::new(hm)),
        ],
    );
    assert!(!ok);
    assert_refused(&err, &[(&key, hidden)], &[&wood, &lib, hostname]);
    nothing_refused_stored();
    assert!(
        !store_holds(&farm, &wood_bytes),
        "the texture was never allowed yet"
    );
    let statuses = farm.json(&["status", "--json"]);
    assert_eq!(
        statuses["jobs"].as_array().map(Vec::len),
        Some(0),
        "{statuses}"
    );

    // A scene that uses the project's texture and the outside one: refused
    // until the texture's folder is an asset root, then submitted, and
    // `--json` lists what was read from where.
    let c = clean.to_str().unwrap();
    let (ok, _, err) = submit(&farm, &[c], &home_env);
    assert!(!ok);
    assert_refused(&err, &[(&wood, "Image 'wood'")], &[&inside]);
    let (ok, out, err) = submit(&farm, &[c, "--asset-root", t, "--json"], &home_env);
    assert!(ok, "{err}");
    let job: serde_json::Value = serde_json::from_str(&out).unwrap();
    let abs = format!("_abs{}", wood.display());
    assert_eq!(
        uploads(&job),
        [
            (abs, wood.clone()),
            ("clean.blend".to_string(), clean.clone()),
            ("tex/in.png".to_string(), inside.clone()),
        ]
    );
    assert!(store_holds(&farm, &wood_bytes) && store_holds(&farm, &inside_bytes));
    nothing_refused_stored();
}

/// A scene whose world shows the image at `image` (absolute), Cycles, 32x24.
const MAKE_WORLD_IMAGE: &str = r#"
import sys
argv = sys.argv[sys.argv.index("--") + 1:]
out, path = argv[0], argv[1]
s = bpy.context.scene
s.render.engine = "CYCLES"
s.cycles.device = "CPU"
s.cycles.samples = 4
s.cycles.use_denoising = False
s.render.resolution_x, s.render.resolution_y = 32, 24
s.render.resolution_percentage = 100
s.frame_start = s.frame_end = 1
for o in list(bpy.data.objects):
    if o.type != "CAMERA":
        bpy.data.objects.remove(o)
img = bpy.data.images.new("worker_only", 4, 4)
img.source = "FILE"
img.filepath = path
w = s.world
w.use_nodes = True
env = w.node_tree.nodes.new("ShaderNodeTexEnvironment")
env.image = img
w.node_tree.links.new(env.outputs["Color"], w.node_tree.nodes["Background"].inputs["Color"])
bpy.ops.wm.save_as_mainfile(filepath=out)
"#;

/// A reference the job does not carry (missing where it was submitted,
/// `--allow-missing`) to a file that exists on the worker: the worker's
/// file is never read into the frame; it renders as missing (Blender's
/// pink), as it would have where it was submitted.
#[test]
#[ignore = "needs blender"]
fn a_reference_the_job_does_not_carry_never_reads_the_workers_own_file() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-unshared", &[]);
    let image = farm.dir.join("worker-disk/worker_only.png");
    let blend = farm.dir.join("proj/probe.blend");
    std::fs::create_dir_all(blend.parent().unwrap()).unwrap();
    run_ok(&mut blender_script(
        None,
        MAKE_WORLD_IMAGE,
        &[blend.to_str().unwrap(), image.to_str().unwrap()],
    ));
    let args = blender_worker();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    farm.add_worker_with("w1", &args);
    farm.wait_workers(1);
    let job = farm.json(&[
        "submit",
        blend.to_str().unwrap(),
        "--allow-missing",
        "--paused",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    // Now the file exists on the worker's disk: pure green.
    std::fs::create_dir_all(image.parent().unwrap()).unwrap();
    {
        let file = std::fs::File::create(&image).unwrap();
        let mut enc = png::Encoder::new(std::io::BufWriter::new(file), 4, 4);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().unwrap();
        w.write_image_data(&[0, 255, 0].repeat(16)).unwrap();
    }
    let out = farm.run(&["resume", &job.to_string()]);
    assert!(out.status.success());
    let dir = farm.dir.join("out");
    farm.wait_done(job, &dir);
    let frame = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let (_, _, color, depth, raw) = png_raw(&frame);
    assert_eq!(depth, png::BitDepth::Eight, "{color:?}");
    let channels = match color {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("{other:?}"),
    };
    let (r, g, b) = (raw[0], raw[1], raw[2]);
    eprintln!("corner pixel rgb ({r}, {g}, {b}), {channels} channels");
    assert!(
        g < r && g < b,
        "the worker's own file was rendered into the frame: ({r}, {g}, {b})"
    );
}
