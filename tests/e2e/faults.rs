//! Processes killed for real: the farm loses nothing that was acknowledged.

use std::collections::HashMap;

use crate::harness::{
    assert_frames_match_reference, assert_frames_match_reference_samples, scenes, Farm,
};

#[test]
fn coordinator_killed_mid_job_resumes_without_rerendering_finished_tiles() {
    let mut farm = Farm::start("coordkill", &[]);
    farm.add_worker("w1");
    farm.add_worker("w2");
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1-4",
        "--tiles",
        "4x4",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    let total = job["tasks_total"].as_u64().unwrap();
    assert_eq!(total, 64);

    let before = farm.wait_for(id, "a third of the tasks", |s| {
        s["tasks_done"].as_u64().unwrap() >= total / 3
    });
    farm.kill_coordinator();
    let done_at_kill = before["tasks_done"].as_u64().unwrap();
    assert!(done_at_kill < total, "the job finished before the kill");

    // Workers keep trying to reconnect; bring the coordinator back.
    std::thread::sleep(std::time::Duration::from_millis(500));
    farm.start_coordinator();
    let resumed = farm.status(id);
    assert!(
        resumed["tasks_done"].as_u64().unwrap() >= done_at_kill,
        "acknowledged results were lost: {resumed}"
    );

    let out = farm.dir.join("out");
    let done = farm.json(&[
        "wait",
        &id.to_string(),
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(done["state"], "done");
    assert_frames_match_reference(&out, &scene, &[1, 2, 3, 4]);

    // Each task was acknowledged exactly once over both coordinator lives:
    // nothing acknowledged before the kill was rendered and accepted again.
    let mut accepted: HashMap<(u64, u32), u32> = HashMap::new();
    for key in farm.accepted() {
        *accepted.entry(key).or_default() += 1;
    }
    assert_eq!(accepted.len() as u64, total, "every task accepted");
    assert!(
        accepted.values().all(|&n| n == 1),
        "a task was accepted twice: {accepted:?}"
    );
    // Re-renders are bounded by what was in flight (one slot per worker),
    // plus results that were rendered but not yet acknowledged at the kill.
    let renders = farm.renders().len() as u64;
    assert!(renders >= total);
    assert!(
        renders <= total + 4,
        "{renders} renders for {total} tasks: finished tiles were rendered again"
    );
}

#[test]
fn worker_killed_mid_task_has_its_task_requeued() {
    let mut farm = Farm::start(
        "workerkill",
        &["--heartbeat-ms", "300", "--lease-ms", "1000"],
    );
    let victim = farm.add_worker("victim");
    farm.add_worker("survivor");
    let scene = scenes().join("demo.scene.json");
    // Many samples make each tile take a good fraction of a second, so the
    // victim is caught mid-render.
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--samples",
        "256",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    farm.wait_for(id, "the victim to render a tile", |_| {
        farm.log_of(victim).contains("task rendered")
    });
    // Both workers are always busy while tasks remain: the victim dies mid-task.
    let running = farm.json(&["status", "--json"]);
    let victim_running = running["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "victim")
        .map(|w| w["running"].as_u64().unwrap())
        .unwrap();
    assert_eq!(
        victim_running, 1,
        "the victim holds a lease when killed: {running}"
    );
    farm.kill_worker(victim);

    let out = farm.dir.join("out");
    let done = farm.json(&[
        "wait",
        &id.to_string(),
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(done["state"], "done");
    assert_eq!(done["tasks_done"], 16);
    assert_frames_match_reference_samples(&out, &scene, &[1], 256);
    // The victim's lease expired (SIGKILL says no goodbye) and its task went
    // back to the queue; the survivor rendered the rest.
    let log = farm.coordinator_log();
    assert!(
        log.lines()
            .any(|l| l.contains("lease expired; task requeued") && l.contains("name=\"victim\"")),
        "no lease of the victim expired: {log}"
    );
    let survivor_log = farm.log_of(1);
    assert!(survivor_log.contains("result accepted"));
}
