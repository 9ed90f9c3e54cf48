//! Job dependencies and holds on a real farm: `submit --after`,
//! `--after-failure hold|fail` and `--paused`, across coordinator restarts
//! (SIGKILL). The failing shot fails for real: its texture is not a PNG,
//! which the client does not decode and the worker's engine refuses.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::harness::{assert_frames_match_reference, scenes, Farm};

/// A copy of `textured.scene.json` whose wood texture is not a PNG: it
/// submits (the texture exists) and every render of it fails.
fn broken_shot(dir: &Path) -> PathBuf {
    let shot = dir.join("broken");
    std::fs::create_dir_all(shot.join("textures")).unwrap();
    let scene = shot.join("textured.scene.json");
    std::fs::copy(scenes().join("textured.scene.json"), &scene).unwrap();
    std::fs::copy(
        scenes().join("textures/checker.png"),
        shot.join("textures/checker.png"),
    )
    .unwrap();
    std::fs::write(shot.join("textures/wood.png"), b"not a png at all").unwrap();
    scene
}

fn submit(farm: &Farm, scene: &Path, extra: &[&str]) -> u64 {
    let mut args = vec![
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "2x1",
        "--json",
    ];
    args.extend_from_slice(extra);
    farm.json(&args)["id"].as_u64().unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn a_chain_with_a_failing_middle_shot_holds_or_fails_its_dependents_as_chosen_across_restarts() {
    let mut farm = Farm::start("after-chain", &[]);
    let good = scenes().join("demo.scene.json");
    let broken = broken_shot(&farm.dir);
    // Shot 1 is held until resumed; shot 2 (broken) runs after it; shot 3
    // waits after a failure of shot 2, shot 4 fails with it.
    let first = submit(&farm, &good, &["--paused"]);
    let middle = submit(&farm, &broken, &["--after", &first.to_string()]);
    let m = middle.to_string();
    let held = submit(&farm, &good, &["--after", &m, "--after-failure", "hold"]);
    let fails = submit(&farm, &good, &["--after", &format!("{m},{first}")]);
    // An unknown job is refused, saying so.
    let out = farm.run(&["submit", good.to_str().unwrap(), "--after", "999"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--after 999: there is no job 999"), "{err}");

    let s = farm.status(held);
    assert_eq!(
        (s["state"].as_str(), ids(&s["after"])),
        (Some("queued"), vec![middle])
    );
    assert_eq!(s["after_failure"], "hold");
    assert_eq!(ids(&s["waiting_for"]), vec![middle]);
    assert_eq!(ids(&farm.status(fails)["after"]), vec![first, middle]);
    let text = farm.run(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains(&format!("after {m} (hold)")), "{text}");

    // A restart before anything ran keeps the pause and the dependencies.
    // Two workers: one alone would be blocklisted for the broken shot
    // (3 failures) before any of its tasks failed its 3 attempts, and the
    // shot would wait, blocked, instead of failing.
    farm.add_worker("w1");
    farm.add_worker("w2");
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.wait_workers(2);
    let s = farm.status(first);
    assert_eq!(
        (s["state"].as_str(), s["paused"].as_bool()),
        (Some("queued"), Some(true))
    );
    assert_eq!(ids(&farm.status(middle)["waiting_for"]), vec![first]);

    let out = farm.run(&["resume", &first.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out1 = farm.dir.join("out1");
    farm.wait_done(first, &out1);
    assert_frames_match_reference(&out1, &good, &[1]);

    let s = farm.wait_for(middle, "the broken shot to fail", |s| {
        s["state"] == "failed"
    });
    assert!(s["error"].as_str().unwrap().contains("wood.png"), "{s}");
    let s = farm.wait_for(fails, "its dependent to fail", |s| s["state"] == "failed");
    let error = s["error"].as_str().unwrap();
    assert!(
        error.starts_with(&format!("job {m}, which this job runs after, failed")),
        "{error}"
    );
    assert_eq!(s["tasks_done"], 0);
    // `wait` on the one that failed with its dependency is non-zero.
    assert!(!farm.run(&["wait", &fails.to_string()]).status.success());

    // The held one stays held, says why, and a restart keeps it so.
    let s = farm.status(held);
    assert_eq!(s["state"], "queued");
    assert!(
        (s["blocked"].as_str().unwrap())
            .contains(&format!("held: job {m}, which it runs after, failed")),
        "{s}"
    );
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.wait_workers(2);
    let s = farm.status(held);
    assert_eq!(
        (s["state"].as_str(), ids(&s["waiting_for"])),
        (Some("queued"), vec![middle])
    );
    assert_eq!(s["tasks_done"], 0, "nothing of it ran");
    assert_eq!(farm.status(fails)["state"], "failed");

    // Resumed, it runs without the failed shot.
    assert!(farm.run(&["resume", &held.to_string()]).status.success());
    let out3 = farm.dir.join("out3");
    farm.wait_done(held, &out3);
    assert_frames_match_reference(&out3, &good, &[1]);
}

#[test]
fn a_job_after_a_running_one_starts_when_it_is_done_even_across_a_restart_mid_render() {
    let mut farm = Farm::start("after-restart", &[]);
    farm.add_worker("w1");
    farm.wait_workers(1);
    let first = farm.submit_demo_frame("4x4");
    let second = submit(
        &farm,
        &scenes().join("spheres.scene.json"),
        &["--after", &first.to_string()],
    );
    farm.wait_for(first, "the first shot to start", |s| {
        s["tasks_done"].as_u64() > Some(0)
    });
    let s = farm.status(second);
    assert_eq!(
        (s["state"].as_str(), s["tasks_done"].as_u64()),
        (Some("queued"), Some(0))
    );
    farm.kill_coordinator();
    farm.start_coordinator();
    let out = farm.dir.join("out2");
    farm.wait_done(second, &out);
    assert_frames_match_reference(&out, &scenes().join("spheres.scene.json"), &[1]);
    // It started only once the first was done: the worker rendered every
    // task of the first before any of the second.
    assert_eq!(farm.status(first)["state"], "done");
    let renders = farm.renders();
    let last_first = renders.iter().rposition(|r| r.0 == first).unwrap();
    let first_second = renders.iter().position(|r| r.0 == second).unwrap();
    assert!(last_first < first_second, "{renders:?}");
}
