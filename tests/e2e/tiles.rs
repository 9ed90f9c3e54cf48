//! Tiles stitch exactly, and assets travel once.

use crate::harness::{assert_frames_match_reference, png_pixels, scenes, Farm};

#[test]
fn tiled_frames_are_bit_identical_to_whole_frames_and_resubmits_upload_nothing() {
    let mut farm = Farm::start("tiles", &[]);
    for name in ["w1", "w2", "w3"] {
        farm.add_worker(name);
    }
    let scene = scenes().join("textured.scene.json");
    let scene_arg = scene.to_str().unwrap();
    let tiled = farm.dir.join("tiled");
    let whole = farm.dir.join("whole");

    let first = farm.json(&[
        "submit",
        scene_arg,
        "--tiles",
        "4x4",
        "--wait",
        "--json",
        "--output",
        tiled.to_str().unwrap(),
    ]);
    assert_eq!(first["state"], "done");
    assert_eq!(first["frames_total"], 4);
    assert_eq!(first["frames_done"], 4);
    assert_eq!(first["tasks_total"], 64);
    assert_eq!(first["tasks_done"], 64);
    assert_eq!(first["error"], serde_json::Value::Null);
    // Everything was new: the scene and both textures went up once.
    let asset_bytes: u64 = [
        "textured.scene.json",
        "textures/checker.png",
        "textures/wood.png",
    ]
    .iter()
    .map(|p| std::fs::metadata(scenes().join(p)).unwrap().len())
    .sum();
    assert_eq!(first["bytes_uploaded"], asset_bytes);
    assert_eq!(first["bytes_deduplicated"], 0);

    // The same scene again, whole frames: nothing to upload.
    let second = farm.json(&[
        "submit",
        scene_arg,
        "--tiles",
        "1x1",
        "--wait",
        "--json",
        "--output",
        whole.to_str().unwrap(),
    ]);
    assert_eq!(second["state"], "done");
    assert_eq!(second["tasks_total"], 4);
    assert_eq!(second["bytes_uploaded"], 0);
    assert_eq!(second["bytes_deduplicated"], asset_bytes);

    for f in 1..=4 {
        let name = format!("frame_{f:04}.png");
        let a = std::fs::read(tiled.join(&name)).unwrap();
        let b = std::fs::read(whole.join(&name)).unwrap();
        assert!(a == b, "{name}: 4x4 tiles and the whole frame differ");
        assert_eq!(png_pixels(&tiled.join(&name)).0, 160);
    }
    assert_frames_match_reference(&tiled, &scene, &[1, 2, 3, 4]);

    // Every worker took part, and each task was rendered exactly once.
    let mut renders = farm.renders();
    assert_eq!(renders.len(), 64 + 4);
    renders.sort();
    renders.dedup();
    assert_eq!(renders.len(), 64 + 4);
    for i in 0..3 {
        assert!(
            farm.log_of(i).contains("task rendered"),
            "worker {i} rendered nothing"
        );
    }

    // `status` without --json shows the jobs and the workers.
    let out = farm.run(&["status"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("textured.scene.json") && text.contains("done"),
        "{text}"
    );
    assert!(text.contains("w1") && text.contains("w3"), "{text}");
}

#[test]
fn frames_list_and_unwaited_submit() {
    let mut farm = Farm::start("frames", &[]);
    farm.add_worker("w1");
    let scene = scenes().join("spheres.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "2,5",
        "--tiles",
        "2x1",
        "--json",
        "--name",
        "pick",
    ]);
    assert_eq!(job["name"], "pick");
    assert_eq!(job["frames_total"], 2);
    assert_eq!(job["tasks_total"], 4);
    assert!(
        matches!(job["state"].as_str(), Some("queued" | "running")),
        "{job}"
    );
    let id = job["id"].as_u64().unwrap().to_string();
    let out = farm.dir.join("out");
    let done = farm.json(&["wait", &id, "--json", "--output", out.to_str().unwrap()]);
    assert_eq!(done["state"], "done");
    assert_frames_match_reference(&out, &scene, &[2, 5]);
}
