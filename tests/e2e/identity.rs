//! Worker identities: a worker enrolls once with the shared ticket and joins
//! with its own credential after that, so it can be revoked on its own
//! (cut off at once, refused for good) and the tickets can be rotated while
//! enrolled workers keep rendering.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{assert_frames_match_reference_samples, scenes, tessera, Farm};

/// Submits frames of the demo scene in 4x4 tiles; returns the job id.
fn submit(farm: &Farm, frames: &str, samples: u32) -> u64 {
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        frames,
        "--tiles",
        "4x4",
        "--samples",
        &samples.to_string(),
        "--json",
    ]);
    job["id"].as_u64().unwrap()
}

/// Tiles of a good fraction of a second, for a test that must catch a
/// worker mid-render: at the scene's own count a job can finish between
/// two polls.
const SLOW_SAMPLES: u32 = 256;
/// The demo scene's own sample count (`scenes/demo.scene.json`).
const SCENE_SAMPLES: u32 = 32;

fn worker_names(farm: &Farm) -> Vec<String> {
    let all = farm.json(&["status", "--json"]);
    (all["workers"].as_array().unwrap().iter())
        .map(|w| w["name"].as_str().unwrap().to_string())
        .collect()
}

/// Waits for a process that must end by itself; returns (success, stderr).
fn wait_exit(mut child: Child, what: &str) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        assert!(Instant::now() < deadline, "{what} did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A worker process joining with `ticket` (a line or @FILE).
fn worker_with_ticket(farm: &Farm, name: &str, ticket: &str) -> Child {
    tessera()
        .args(["worker", "--ticket", ticket, "--name", name, "--cache-dir"])
        .arg(farm.dir.join(format!("cache-{name}")))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_revoked_worker_is_cut_off_at_once_and_refused_for_good() {
    let mut farm = Farm::start("revoke", &[]);
    farm.add_worker("w1");
    farm.add_worker("w2");
    farm.wait_workers(2);
    assert!(
        farm.dir.join("cache-w1").join("identity").exists(),
        "w1 keeps its credential in its cache folder"
    );
    let job = submit(&farm, "1", SLOW_SAMPLES);
    farm.wait_mid_render(job, 0, "w1");

    let out = farm.run(&["worker", "revoke", "w1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The revoke answers once w1's session has ended (or a heartbeat has
    // passed): it is off the farm now, its lease back in the queue.
    assert_eq!(worker_names(&farm), ["w2"]);
    // w1 reconnects with its credential, is refused, and gives up.
    let status = farm.wait_worker_exit(0, Duration::from_secs(60));
    assert!(!status.success());
    assert!(farm.log_of(0).contains("was revoked"), "{}", farm.log_of(0));
    // Its task was rendered elsewhere; nothing is missing.
    let out_dir = farm.dir.join("out");
    farm.wait_done(job, &out_dir);
    assert_frames_match_reference_samples(
        &out_dir,
        &scenes().join("demo.scene.json"),
        &[1],
        SLOW_SAMPLES,
    );

    // Permanently: after a restart, with its credential...
    farm.kill_coordinator();
    farm.start_coordinator();
    let ticket = farm.worker_ticket();
    let (ok, stderr) = wait_exit(worker_with_ticket(&farm, "w1", &ticket), "w1");
    assert!(!ok && stderr.contains("was revoked"), "{stderr}");
    // ...and with the shared ticket and a fresh cache folder.
    std::fs::remove_dir_all(farm.dir.join("cache-w1")).unwrap();
    let (ok, stderr) = wait_exit(worker_with_ticket(&farm, "w1", &ticket), "w1");
    assert!(!ok && stderr.contains("was revoked"), "{stderr}");
    // Revoking a name nobody enrolled under is an error, not a no-op.
    let out = farm.run(&["worker", "revoke", "nobody"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no worker was ever enrolled"));
}

#[test]
fn rotated_tickets_refuse_new_joins_and_clients_while_enrolled_workers_render_on() {
    let mut farm = Farm::start("rotate", &[]);
    farm.add_worker("w1");
    farm.wait_workers(1);
    let read = |file: &str| std::fs::read_to_string(farm.data.join(file)).unwrap();
    let (old_worker, old_client) = (read("worker.ticket"), read("client.ticket"));

    let rotated = farm.json(&["coordinator", "rotate-tickets", "--json"]);
    assert_eq!(
        rotated["worker"].as_str().unwrap(),
        read("worker.ticket").trim()
    );
    assert_eq!(
        rotated["client"].as_str().unwrap(),
        read("client.ticket").trim()
    );
    assert_ne!(read("worker.ticket"), old_worker);
    assert_ne!(read("client.ticket"), old_client);

    // The old client ticket no longer connects.
    let out = tessera()
        .args(["status", "--json"])
        .env("TESSERA_TICKET", old_client.trim())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong client ticket"));
    // A new worker with the old worker ticket is refused.
    let (ok, stderr) = wait_exit(worker_with_ticket(&farm, "late", old_worker.trim()), "late");
    assert!(!ok && stderr.contains("wrong worker ticket"), "{stderr}");

    // The enrolled worker renders on, also after a coordinator restart.
    let scene = scenes().join("demo.scene.json");
    let first = submit(&farm, "1", SCENE_SAMPLES);
    farm.wait_done(first, &farm.dir.join("out1"));
    assert_frames_match_reference_samples(&farm.dir.join("out1"), &scene, &[1], SCENE_SAMPLES);
    farm.kill_coordinator();
    farm.start_coordinator();
    let second = submit(&farm, "2", SCENE_SAMPLES);
    farm.wait_done(second, &farm.dir.join("out2"));
    assert_frames_match_reference_samples(&farm.dir.join("out2"), &scene, &[2], SCENE_SAMPLES);
    assert_eq!(worker_names(&farm), ["w1"]);
    // And a new worker joins with the new ticket.
    farm.add_worker("w2");
    farm.wait_workers(2);
}
