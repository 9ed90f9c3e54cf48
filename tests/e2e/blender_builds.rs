//! `tessera blender add` and `blender list` with the official Blender 4.5
//! (`bpy`): a build is stored as its files, chunked, so a point release
//! uploads only what changed, whether it comes as a folder or a `.tar.xz`.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tessera_store::chunk::{list_file, CHUNK_THRESHOLD};

use crate::harness::Farm;
use crate::requires::{require, Need};

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The site-packages folder of `$TESSERA_TEST_BPY`, which holds `bpy/`.
fn bpy_site() -> PathBuf {
    let py = std::env::var("TESSERA_TEST_BPY").unwrap();
    let out = Command::new(py)
        .args([
            "-I",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['platlib'])",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// Links (or copies) every file under `from` into `to`, keeping modes.
fn link_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            link_tree(&entry.path(), &dest);
        } else if std::fs::hard_link(entry.path(), &dest).is_err() {
            std::fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// Blender 4.5.4 as installed by pip: `bpy/` and its dist-info.
fn bpy_build(site: &Path, to: &Path) {
    link_tree(&site.join("bpy"), &to.join("bpy"));
    link_tree(
        &site.join("bpy-4.5.4.dist-info"),
        &to.join("bpy-4.5.4.dist-info"),
    );
}

/// A "4.5.5" made from 4.5.4 the way point releases differ: the main
/// library changed in a few places, a script added, the metadata bumped.
/// It is a slim build, to keep the test's `xz` packing short (the whole
/// 830 MB took 150–200 s to pack here): of 4.5.4's files only the main
/// library (213 MB, the one that changed), the startup scripts and the
/// metadata, which is still a build the coordinator accepts (its marker and
/// its `4.5/` folder). Returns the bytes a client must send for it once
/// 4.5.4 is stored: only the changed chunks and the new files.
fn point_release(site: &Path, to: &Path) -> u64 {
    std::fs::create_dir_all(to.join("bpy")).unwrap();
    std::fs::copy(site.join("bpy/__init__.so"), to.join("bpy/__init__.so")).unwrap();
    link_tree(
        &site.join("bpy/4.5/scripts/startup"),
        &to.join("bpy/4.5/scripts/startup"),
    );
    let lib = to.join("bpy/__init__.so");
    let mut bytes = std::fs::read(&lib).unwrap();
    let old = list_file(&lib).unwrap();
    assert!(old.size >= CHUNK_THRESHOLD, "the library is chunked");
    for at in [bytes.len() / 5, bytes.len() / 2, bytes.len() - 5000] {
        for b in &mut bytes[at..at + 64] {
            *b = !*b;
        }
    }
    std::fs::remove_file(&lib).unwrap();
    std::fs::write(&lib, &bytes).unwrap();
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    let new = list_file(&lib).unwrap();
    let had: HashSet<_> = old.chunks.iter().map(|c| c.digest).collect();
    let mut changed: HashSet<_> = HashSet::new();
    let lib_bytes: u64 = new
        .chunks
        .iter()
        .filter(|c| !had.contains(&c.digest) && changed.insert(c.digest))
        .map(|c| u64::from(c.len))
        .sum();
    let script = b"# added in the point release\nimport bpy\n";
    std::fs::write(
        to.join("bpy/4.5/scripts/startup/tessera_point_release.py"),
        script,
    )
    .unwrap();
    let info = to.join("bpy-4.5.5.dist-info");
    link_tree(&site.join("bpy-4.5.4.dist-info"), &info);
    let metadata = std::fs::read_to_string(info.join("METADATA"))
        .unwrap()
        .replace("Version: 4.5.4", "Version: 4.5.5");
    std::fs::remove_file(info.join("METADATA")).unwrap();
    std::fs::write(info.join("METADATA"), &metadata).unwrap();
    lib_bytes + script.len() as u64 + metadata.len() as u64
}

/// `tar cf - | xz -0 -T0` of `dir`, written with the crates the client
/// reads it with (on every core: packing is most of this test's time).
fn tar_xz(dir: &Path, top: &str, out: &Path) {
    let file = std::fs::File::create(out).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let stream = xz2::stream::MtStreamBuilder::new()
        .threads(cores)
        .preset(0)
        .encoder()
        .unwrap();
    let xz = xz2::write::XzEncoder::new_stream(file, stream);
    let mut tar = tar::Builder::new(xz);
    tar.append_dir_all(top, dir).unwrap();
    tar.into_inner().unwrap().finish().unwrap();
}

#[test]
#[ignore = "needs bpy 4.5 (TESSERA_TEST_BPY)"]
fn blender_add_of_a_point_release_uploads_only_its_changed_chunks() {
    require(Need::Bpy);
    let farm = Farm::start("blender-add", &[]);
    let site = bpy_site();
    let (a, b) = (farm.dir.join("bpy-4.5.4"), farm.dir.join("bpy-4.5.5"));
    bpy_build(&site, &a);
    let expected = point_release(&site, &b);

    let started = Instant::now();
    let first = farm.json(&["blender", "add", a.to_str().unwrap(), "--json"]);
    let first_s = started.elapsed().as_secs_f64();
    assert_eq!(first["version"], "4.5.4");
    assert_eq!(first["kind"], "bpy");
    assert!(first["features"]
        .as_array()
        .unwrap()
        .contains(&"OpenImageDenoise".into()));
    let size = u(&first["size"]);
    assert!(u(&first["files"]) > 1000, "{first}");
    assert!(u(&first["uploaded_bytes"]) > size / 2, "{first}");
    assert!(u(&first["uploaded_bytes"]) <= size, "{first}");

    // The point release as a tarball: unpacked here, only changed chunks sent.
    let tarball = farm.dir.join("blender-4.5.5.tar.xz");
    let packing = Instant::now();
    tar_xz(&b, "bpy-4.5.5", &tarball);
    let pack_s = packing.elapsed().as_secs_f64();
    let started = Instant::now();
    let second = farm.json(&["blender", "add", tarball.to_str().unwrap(), "--json"]);
    let second_s = started.elapsed().as_secs_f64();
    assert_eq!(second["version"], "4.5.5");
    assert_eq!(second["kind"], "bpy");
    let slim = u(&second["size"]);
    assert!(slim > 200_000_000 && u(&second["files"]) > 10, "{second}");
    assert_eq!(u(&second["uploaded_bytes"]), expected, "{second}");
    assert!(u(&second["manifest_bytes"]) > 0);
    println!(
        "blender add: 4.5.4 uploaded {} of {} bytes in {first_s:.1} s; the slim 4.5.5 tarball ({} bytes, {slim} unpacked, packed in {pack_s:.1} s) uploaded {} bytes ({:.3} % of it) in {second_s:.1} s",
        u(&first["uploaded_bytes"]),
        size,
        std::fs::metadata(&tarball).unwrap().len(),
        expected,
        100.0 * expected as f64 / slim as f64
    );

    // The same release as a folder is the same build: nothing to send.
    let again = farm.json(&["blender", "add", b.to_str().unwrap(), "--json"]);
    assert_eq!(again["digest"], second["digest"]);
    assert_eq!(u(&again["uploaded_bytes"]), 0);
    assert_eq!(u(&again["manifest_bytes"]), 0);

    let list = farm.json(&["blender", "list", "--json"]);
    let builds = list["builds"].as_array().unwrap();
    let versions: Vec<&str> = builds
        .iter()
        .map(|b| b["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["4.5.4", "4.5.5"]);
    assert_eq!(builds[0]["digest"], first["digest"]);
    let text = farm.run(&["blender", "list"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("4.5.5") && text.contains("bpy"), "{text}");

    // Garbage collection keeps a stored build's files and chunks, also once
    // they are older than its grace period.
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
    for d in std::fs::read_dir(farm.data.join("blobs"))
        .unwrap()
        .flatten()
    {
        if d.file_name().len() == 2 {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                let file = std::fs::File::options().write(true).open(f.path()).unwrap();
                file.set_modified(past).unwrap();
            }
        }
    }
    let collected = farm.json(&["gc", "--json"]);
    assert_eq!(u(&collected["removed_blobs"]), 0, "{collected}");
    assert!(u(&collected["kept_bytes"]) >= size, "{collected}");
}

#[test]
fn blender_add_refuses_what_is_not_a_build() {
    let farm = Farm::start("blender-add-bad", &[]);
    let dir = farm.dir.join("not-a-build");
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/readme.txt"), "hello").unwrap();
    let out = farm.run(&["blender", "add", dir.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not an official Blender build"), "{err}");
    let junk = farm.dir.join("junk.tar.xz");
    std::fs::write(&junk, b"not xz at all").unwrap();
    let out = farm.run(&["blender", "add", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot unpack"), "{err}");
    let list = farm.json(&["blender", "list", "--json"]);
    assert_eq!(list["builds"].as_array().unwrap().len(), 0);
}

/// Every file under `dir`, relative, `/`-separated (sorted).
fn files_under(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(dir)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                out.push((rel, e.path()));
            }
        }
    }
    out.sort();
    out
}

/// The installed bpy 4.5.4 as the wheel PyPI ships (a zip of `bpy/` and
/// its dist-info, modes kept), stored uncompressed so writing it is quick.
fn bpy_wheel(site: &Path, out: &Path) {
    use std::io::Write;
    use zip::write::SimpleFileOptions;
    let mut w = zip::ZipWriter::new(std::fs::File::create(out).unwrap());
    for top in ["bpy", "bpy-4.5.4.dist-info"] {
        for (rel, path) in files_under(&site.join(top)) {
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            let options = SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(true)
                .unix_permissions(mode);
            w.start_file(format!("{top}/{rel}"), options).unwrap();
            w.write_all(&std::fs::read(&path).unwrap()).unwrap();
        }
    }
    w.finish().unwrap();
}

fn tree_bytes(dir: &Path) -> u64 {
    files_under(dir)
        .iter()
        .map(|(_, p)| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// The workers `blender list` says hold the (only) build, once it says
/// `want` (the worker reports its cache as it changes).
fn wait_holders(farm: &Farm, want: &[&str]) -> serde_json::Value {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = farm.json(&["blender", "list", "--json"]);
        let holders: Vec<&str> = (list["builds"][0]["holders"].as_array().unwrap().iter())
            .map(|h| h.as_str().unwrap())
            .collect();
        if holders == want {
            return list;
        }
        assert!(
            Instant::now() < deadline,
            "holders never became {want:?}: {list}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs blender and bpy 4.5"]
fn a_45_file_on_a_34_farm_completes_on_a_blender_auto_worker_that_fetches_the_build_once_and_evicts_it(
) {
    require(Need::Blender);
    require(Need::Bpy);
    let py = PathBuf::from(std::env::var("TESSERA_TEST_BPY").unwrap());
    let py_s = py.to_str().unwrap();
    let mut farm = Farm::start("blender-auto", &[]);
    let t0 = Instant::now();
    let step = |what: &str| eprintln!("{:>6.1} s  {what}", t0.elapsed().as_secs_f64());
    let root = farm.dir.join("v45");
    let p45 = crate::blender_versions::make_project(Some(&py), &root);
    let shot = p45.join("shot.blend");
    // Blender 4.5's own full render of frame 2 (dither 0, the generator's).
    let refs = farm.dir.join("refs");
    crate::blender::run_ok(&mut crate::blender::in_bpy(
        &py,
        Some(&shot),
        &format!(
            "s = bpy.context.scene\ns.frame_set(2)\ns.render.filepath = {:?}\nbpy.ops.render.render(write_still=True)\n",
            refs.join("ref45_0002").to_str().unwrap()
        ),
    ));
    step("project and reference made");
    farm.add_worker_with("debian", &["--engine", "blender"]);
    farm.wait_workers(1);
    let submit = |farm: &Farm, extra: &[&str]| {
        let mut args = vec![
            "submit",
            shot.to_str().unwrap(),
            "--blender-python",
            py_s,
            "--json",
        ];
        args.extend_from_slice(extra);
        farm.json(&args)["id"].as_u64().unwrap()
    };
    let tiled = submit(&farm, &["--frames", "2", "--tiles", "3x3"]);
    let s = farm.wait_for(tiled, "the 4.5 file to be blocked", |s| {
        s["blocked"] != "no workers are connected"
    });
    assert_eq!(s["blocked"], "needs Blender 4.5; workers offer 3.4", "{s}");

    step("blocked");
    // The official 4.5.4 as a wheel, stored on the coordinator.
    let site = bpy_site();
    let wheel = farm
        .dir
        .join("bpy-4.5.4-cp311-cp311-manylinux_2_28_x86_64.whl");
    bpy_wheel(&site, &wheel);
    step("wheel written");
    let added = farm.json(&["blender", "add", wheel.to_str().unwrap(), "--json"]);
    step("wheel added");
    assert_eq!(
        (added["version"].as_str(), added["kind"].as_str()),
        (Some("4.5.4"), Some("bpy"))
    );
    let size = u(&added["size"]);
    std::fs::remove_file(&wheel).unwrap();
    assert_eq!(farm.status(tiled)["state"], "queued");

    // A node with nothing but tessera and a Python 3.11: `--blender auto`.
    let auto_args = [
        "--engine",
        "auto",
        "--blender",
        "auto",
        "--build-python",
        py_s,
    ];
    let auto = farm.add_worker_with("auto", &auto_args);
    let out = farm.dir.join("out");
    let done = farm.wait_done(tiled, &out.join("tiled"));
    step("tiled job done");
    let want = crate::blender_versions::png_pixels(&refs.join("ref45_0002.png"));
    let got = crate::blender_versions::png_pixels(&out.join("tiled/frame_0002.png"));
    assert_eq!((got.0, got.1), (want.0, want.1));
    let differing = got.2.iter().zip(&want.2).filter(|(a, b)| a != b).count();
    assert_eq!(
        differing, 0,
        "{differing} samples differ from 4.5's own render"
    );
    let first_fetch = u(&done["bytes_to_workers"]);
    assert!(first_fetch > size / 2, "the build was fetched: {done}");
    wait_holders(&farm, &["auto"]);
    let text = String::from_utf8_lossy(&farm.run(&["blender", "list"]).stdout).into_owned();
    assert!(text.contains("4.5.4") && text.contains(" auto"), "{text}");
    let status = farm.json(&["status", "--json"]);
    let offers = &status["workers"][1]["blenders"];
    assert!(
        offers[0]["name"].as_str().unwrap().contains("stored build"),
        "{status}"
    );
    // The Debian worker never opened the 4.5 file.
    assert!(!farm.log_of(0).contains("blender session started job=1"));

    // A second 4.5 job: the build is not fetched again.
    let whole = submit(&farm, &["--frames", "1"]);
    let done = farm.wait_done(whole, &out.join("whole"));
    assert_eq!(u(&done["bytes_to_workers"]), 0, "{done}");
    assert!(out.join("whole/frame_0001.png").is_file());

    step("second job done");
    // Two jobs rendered in the stored build and it is as it was laid out:
    // every file still a link to its blob in the cache, none written by
    // Blender (its Python once rewrote `__pycache__` files there, and the
    // next task's check of the build failed).
    let builds = farm.dir.join("cache-auto/builds");
    let rewritten: Vec<PathBuf> = files_under(&builds)
        .into_iter()
        .map(|(_, path)| path)
        .filter(|path| {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.nlink() < 2)
        })
        .collect();
    assert!(
        builds.is_dir() && rewritten.is_empty(),
        "files of the stored build no longer linked to the cache: {rewritten:?}"
    );
    // Restarted under a cap just above what its cache holds now, the
    // worker keeps the build; a job that needs more room than is left
    // evicts it, since no task uses it.
    // SIGTERM: it drains and says goodbye, so the farm forgets it at once.
    let stopped = Command::new("kill")
        .args(["-TERM", &farm.worker_pid(auto).to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    farm.wait_worker_exit(auto, std::time::Duration::from_secs(30));
    let gone = Instant::now() + std::time::Duration::from_secs(30);
    while farm.json(&["status", "--json"])["workers"]
        .as_array()
        .unwrap()
        .len()
        != 1
    {
        assert!(Instant::now() < gone, "the stopped worker is still listed");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let cache = farm.dir.join("cache-auto");
    let held = crate::assets::blob_bytes(&cache.join("blobs"));
    assert!(
        held >= size - size / 50 && held < size + size / 5,
        "the build is held once: {held} of {size}"
    );
    let cap = held + (1 << 20);
    let cap_s = cap.to_string();
    let mut capped = auto_args.to_vec();
    capped.extend(["--cache-max", &cap_s]);
    farm.add_worker_with("auto", &capped);
    farm.wait_workers(2);
    wait_holders(&farm, &["auto"]);
    step("restarted");
    let builtin = farm.dir.join("builtin");
    // Bigger than what the scene's files take and the room left, together.
    let side = (((2 * tree_bytes(&root) + (8 << 20)) / 3) as f64).sqrt() as u32;
    crate::assets::write_noise_png(&builtin.join("textures/noise.png"), side, 7);
    let scene = crate::assets::write_scene(&builtin, &["textures/noise.png"]);
    let job = farm.json(&["submit", scene.to_str().unwrap(), "--json"])["id"]
        .as_u64()
        .unwrap();
    farm.wait_done(job, &out.join("builtin"));
    wait_holders(&farm, &[]);
    step("evicted");
    let status = farm.json(&["status", "--json"]);
    let names: Vec<&str> = (status["workers"].as_array().unwrap().iter())
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["debian", "auto"], "still connected: {status}");
    let after = crate::assets::blob_bytes(&cache.join("blobs"));
    assert!(after <= cap, "{after} > {cap}");
    println!(
        "blender auto: fetched {first_fetch} bytes for a {size}-byte build once, 0 for the next job; evicted under a {cap}-byte cap (cache {held} -> {after} bytes)"
    );
}
