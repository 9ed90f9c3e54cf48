//! Submit uploads only what the artist meant to share (`src/share.rs`):
//! what is refused never reaches the coordinator's store, checked there.
//! The `.blend` cases are in `blender.rs` (both Blender runtimes) and
//! `blender_versions.rs` (a default 4.5 scene, a farm scan); the helpers
//! and the Unreal and builtin cases are here.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{noise, scenes, Farm};
use crate::requires::{require, Need};

/// Whether the coordinator's store holds `bytes`: a blob named by their
/// digest, or (for `bytes` long enough not to occur by chance, ≥ 64) any
/// stored blob that contains them, a chunk of a larger file included.
pub(crate) fn store_holds(farm: &Farm, bytes: &[u8]) -> bool {
    let hex = blake3::hash(bytes).to_hex().to_string();
    let blobs = farm.data.join("blobs");
    if blobs.join(&hex[..2]).join(&hex).exists() {
        return true;
    }
    if bytes.len() < 64 {
        return false;
    }
    let finder = memchr::memmem::Finder::new(bytes);
    for d in std::fs::read_dir(&blobs).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            let held = std::fs::read(f.path()).unwrap_or_default();
            if finder.find(&held).is_some() {
                return true;
            }
        }
    }
    false
}

/// Runs `submit` with `args`, `env` added; (exit success, stdout, stderr).
pub(crate) fn submit(farm: &Farm, args: &[&str], env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut cmd = farm.command(&[&["submit"], args].concat());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A refusal: one line on stderr (after notes, such as a farm scan's),
/// naming every one of `named` (a path and the words that must follow it,
/// up to the next `)`), and none of `not_named`.
pub(crate) fn assert_refused(err: &str, named: &[(&Path, &str)], not_named: &[&Path]) {
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert!(
        lines[..lines.len() - 1]
            .iter()
            .all(|l| l.starts_with("note: ")),
        "{err}"
    );
    let err = lines[lines.len() - 1];
    assert!(err.contains("not shared"), "{err}");
    assert!(
        err.contains(&format!("{} file(s)", named.len())),
        "{} named: {err}",
        named.len()
    );
    for (path, why) in named {
        let at = err
            .find(&format!("{} (", path.display()))
            .unwrap_or_else(|| panic!("{} not named: {err}", path.display()));
        let rest = &err[at..];
        let own = &rest[..rest.find(')').unwrap_or(rest.len())];
        assert!(
            own.contains(why),
            "{} without `{why}`: {err}",
            path.display()
        );
    }
    for path in not_named {
        assert!(
            !err.contains(&format!("{} (", path.display())),
            "{} named: {err}",
            path.display()
        );
    }
    assert!(
        err.contains("--asset-root DIR") && err.contains("--allow-file PATH"),
        "{err}"
    );
}

/// The `uploads` of a `submit --json`: (path in the job, where it was read).
pub(crate) fn uploads(job: &Value) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = (job["uploads"].as_array().expect("uploads").iter())
        .map(|u| {
            (
                u["path"].as_str().unwrap().to_string(),
                PathBuf::from(u["from"].as_str().unwrap()),
            )
        })
        .collect();
    v.sort();
    v
}

/// An Unreal project whose `Plugins` is a link to a folder outside it
/// (holding a fake key): refused, named, and nothing of it stored; the
/// same folder named as an asset root travels.
#[test]
#[ignore = "needs python3"]
fn an_unreal_project_whose_plugins_link_out_of_it_is_refused_and_nothing_of_it_is_stored() {
    require(Need::Python3);
    let farm = Farm::start("sharing-unreal", &[]);
    let dir = farm.dir.join("Film");
    let elsewhere = farm.dir.join("elsewhere");
    for (rel, body) in [
        ("Film/Film.uproject", b"{\"FileVersion\": 3}".to_vec()),
        (
            "Film/Content/Seq/Main.uasset",
            b"StandInLevelSequence\n".to_vec(),
        ),
        ("Film/Content/Maps/Main.umap", b"StandInMap\n".to_vec()),
        (
            "Film/Content/Cine/Config.uasset",
            b"StandInMoviePipelinePrimaryConfig\n".to_vec(),
        ),
        ("elsewhere/Fx/Fx.uplugin", noise(4096, 1)),
        ("elsewhere/.ssh/id_rsa", noise(4096, 2)),
    ] {
        let p = farm.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    std::os::unix::fs::symlink(&elsewhere, dir.join("Plugins")).unwrap();
    let uproject = dir.join("Film.uproject");
    let args = [
        uproject.to_str().unwrap(),
        "--level-sequence",
        "/Game/Seq/Main",
        "--map",
        "/Game/Maps/Main",
        "--mrq-config",
        "/Game/Cine/Config",
        "--shots",
        "sh010=1-4",
        "--json",
    ];
    let (ok, out, err) = submit(&farm, &args, &[]);
    assert!(!ok, "{out}");
    assert_refused(
        &err,
        &[(
            &dir.join("Plugins"),
            &format!("a symbolic link to {}", elsewhere.display()),
        )],
        &[],
    );
    for secret in [noise(4096, 1), noise(4096, 2)] {
        assert!(
            !store_holds(&farm, &secret),
            "a refused file reached the store"
        );
    }
    assert!(
        !store_holds(&farm, b"StandInMap\n"),
        "nothing of a refused project is uploaded"
    );
    // Named as an asset root, the folder travels as the project's Plugins.
    let with_root = [&args[..], &["--asset-root", elsewhere.to_str().unwrap()]].concat();
    let (ok, out, err) = submit(&farm, &with_root, &[]);
    assert!(ok, "{err}");
    let job: Value = serde_json::from_str(&out).unwrap();
    let got = uploads(&job);
    assert!(
        got.contains(&(
            "Plugins/Fx/Fx.uplugin".into(),
            elsewhere.join("Fx/Fx.uplugin")
        )),
        "{got:?}"
    );
    assert!(store_holds(&farm, &noise(4096, 1)));
}

/// A builtin scene's texture that is a link out of the scene's folder is
/// refused like a `.blend`'s: named, not stored.
#[test]
fn a_builtin_scenes_texture_linked_out_of_its_folder_is_refused() {
    let farm = Farm::start("sharing-builtin", &[]);
    let dir = farm.dir.join("scene");
    std::fs::create_dir_all(dir.join("textures")).unwrap();
    std::fs::copy(
        scenes().join("textured.scene.json"),
        dir.join("textured.scene.json"),
    )
    .unwrap();
    for e in std::fs::read_dir(scenes().join("textures"))
        .unwrap()
        .flatten()
    {
        std::fs::copy(e.path(), dir.join("textures").join(e.file_name())).unwrap();
    }
    let scene: Value =
        serde_json::from_slice(&std::fs::read(dir.join("textured.scene.json")).unwrap()).unwrap();
    let tex = (scene["materials"].as_object().unwrap().values())
        .find_map(|m| m["texture"].as_str())
        .expect("a textured material")
        .to_string();
    // The texture becomes a link to a copy outside the scene's folder.
    let outside = farm.dir.join("outside").join(&tex);
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    let mut bytes = std::fs::read(dir.join(&tex)).unwrap();
    bytes.extend_from_slice(&noise(256, 9)); // bytes of its own
    std::fs::write(&outside, &bytes).unwrap();
    std::fs::remove_file(dir.join(&tex)).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join(&tex)).unwrap();
    let scene_path = dir.join("textured.scene.json");
    let (ok, _, err) = submit(&farm, &[scene_path.to_str().unwrap()], &[]);
    assert!(!ok);
    assert_refused(&err, &[(&dir.join(&tex), &format!("texture `{tex}`"))], &[]);
    assert!(!store_holds(&farm, &bytes));
}
