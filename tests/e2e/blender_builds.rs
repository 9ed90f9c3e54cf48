//! `tessera blender add` and `blender list` with the official Blender 4.5
//! (`bpy`): a build is stored as its files, chunked, so a point release
//! uploads only what changed, whether it comes as a folder or a `.tar.xz`.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use tessera_protocol::chunk::{list_file, CHUNK_THRESHOLD};

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
/// Returns the bytes a client must send for it once 4.5.4 is stored.
fn point_release(site: &Path, to: &Path) -> u64 {
    link_tree(&site.join("bpy"), &to.join("bpy"));
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
    assert_eq!(u(&second["uploaded_bytes"]), expected, "{second}");
    assert!(u(&second["manifest_bytes"]) > 0);
    println!(
        "blender add: 4.5.4 uploaded {} of {} bytes in {first_s:.1} s; the 4.5.5 tarball ({} bytes, packed in {pack_s:.1} s) uploaded {} bytes ({:.3} % of the build) in {second_s:.1} s",
        u(&first["uploaded_bytes"]),
        size,
        std::fs::metadata(&tarball).unwrap().len(),
        expected,
        100.0 * expected as f64 / size as f64
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
