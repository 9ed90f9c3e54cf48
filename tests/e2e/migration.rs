//! A worker whose address changes mid-task keeps its lease: QUIC
//! connection migration. SIGUSR1 makes a worker move its connection to a
//! fresh UDP socket on a new port (what a restarted NAT mapping looks like
//! to the coordinator); the coordinator sees the same connection arrive
//! from a new address, and nothing is requeued, rejoined or rendered twice.

use crate::harness::{assert_frames_match_reference_samples, field, scenes, Farm};

#[test]
fn a_worker_whose_socket_is_rebound_mid_task_keeps_its_lease_and_its_result_is_accepted_once() {
    // Leases of 1 s: a migration that stalled the connection for longer
    // would show up as an expired lease.
    let mut farm = Farm::start("migrate", &["--heartbeat-ms", "300", "--lease-ms", "1000"]);
    let mover = farm.add_worker("mover");
    let scene = scenes().join("demo.scene.json");
    let id = farm.submit_demo_frame("2x2");
    farm.wait_mid_render(id, mover, "mover");
    let all = farm.json(&["status", "--json"]);
    let held: Vec<u64> = (all["workers"].as_array().unwrap().iter())
        .flat_map(|w| w["tasks"].as_array().unwrap().clone())
        .filter_map(|t| t["task"].as_u64())
        .collect();
    // The one it renders, and with pipelined leases the next one queued.
    assert!((1..=2).contains(&held.len()), "a task mid-render: {all}");
    let pid = farm.worker_pid(mover);
    let ok = std::process::Command::new("kill")
        .args(["-USR1", &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    farm.wait_for(
        id,
        "the coordinator to see the worker's new address",
        |_| {
            farm.coordinator_log()
                .contains("worker's address changed; its connection migrated")
        },
    );
    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["tasks_done"], 4);
    assert_frames_match_reference_samples(&out, &scene, &[1], 256);

    let log = farm.log_of(mover);
    assert!(log.contains("UDP socket rebound"), "{log}");
    // The same connection throughout: one join, no lease lost.
    assert_eq!(log.matches("joined the farm").count(), 1, "{log}");
    assert!(!log.contains("disconnected from the coordinator"), "{log}");
    let coord = farm.coordinator_log();
    assert!(!coord.contains("lease expired"), "{coord}");
    // The tasks held across the rebind were rendered and accepted once.
    let accepted: Vec<(u64, u32)> = farm.accepted();
    let once = |task: u64| accepted.iter().filter(|a| **a == (id, task as u32)).count();
    assert_eq!(accepted.len(), 4, "{log}");
    for &task in &held {
        assert_eq!(once(task), 1, "task {task}: {log}");
        let renders = (log.lines())
            .filter(|l| l.contains("task rendered") && field(l, "task") == Some(task))
            .count();
        assert_eq!(renders, 1, "task {task}: {log}");
    }
}
