//! What the coordinator keeps on disk survives rot and loss: a corrupt
//! stored blob is removed (so the next submit uploads it again) whether a
//! worker or the scrub finds it, a deleted WAL loses no acknowledged job,
//! and a hot backup restores into a working farm.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tessera_protocol::Digest;

use crate::harness::{assert_frames_match_reference, scenes, Farm};

/// Where the coordinator stores the blob of `file`'s bytes.
fn stored_blob(farm: &Farm, file: &Path) -> PathBuf {
    let hex = Digest::of(&std::fs::read(file).unwrap()).to_hex();
    farm.data.join("blobs").join(&hex[..2]).join(hex)
}

/// Flips one byte in the middle of `path`, keeping its size.
fn flip_a_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

fn wait_until(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Submits frame 1 of the demo scene in `tiles` (`CxR`); returns the job id.
fn submit(farm: &Farm, tiles: &str) -> u64 {
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        tiles,
        "--json",
    ]);
    job["id"].as_u64().unwrap()
}

/// Waits for `job` and checks its frame against a render made here.
fn assert_renders_right(farm: &Farm, job: u64, out: &str) {
    let out = farm.dir.join(out);
    farm.wait_done(job, &out);
    assert_frames_match_reference(&out, &scenes().join("demo.scene.json"), &[1]);
}

#[test]
fn a_stored_blob_that_rotted_is_removed_when_served_and_the_next_submit_uploads_it() {
    let mut farm = Farm::start("rot-served", &["--scrub-mb-per-sec", "0"]);
    let scene = scenes().join("demo.scene.json");
    let first = submit(&farm, "2x2");
    let blob = stored_blob(&farm, &scene);
    assert!(blob.exists(), "the submit stored the scene");
    flip_a_byte(&blob);
    // The worker asks for the scene; the coordinator finds it corrupt while
    // serving it, and removes it instead of failing every later job.
    farm.add_worker("w1");
    wait_until(
        "the corrupt blob's removal",
        Duration::from_secs(60),
        || !blob.exists(),
    );
    // The first job may have failed already (its scene is missing now).
    let _ = farm.run(&["cancel", &first.to_string()]);
    // Missing now: the resubmit uploads it, and the frame comes out right.
    let second = submit(&farm, "2x2");
    assert!(
        farm.status(second)["bytes_uploaded"].as_u64().unwrap() > 0,
        "the resubmit uploaded the scene again"
    );
    assert_renders_right(&farm, second, "out");
}

#[test]
fn the_scrub_finds_a_blob_that_rotted_while_the_coordinator_was_down() {
    let mut farm = Farm::start("rot-scrub", &["--scrub-mb-per-sec", "1000"]);
    farm.add_worker("w1");
    let scene = scenes().join("demo.scene.json");
    let first = submit(&farm, "2x2");
    assert_renders_right(&farm, first, "out1");
    farm.kill_coordinator();
    let blob = stored_blob(&farm, &scene);
    flip_a_byte(&blob);
    farm.start_coordinator();
    // Nobody reads the scene: the scrub alone finds it.
    wait_until("the scrub's removal", Duration::from_secs(60), || {
        !blob.exists()
    });
    let second = submit(&farm, "2x2");
    assert!(farm.status(second)["bytes_uploaded"].as_u64().unwrap() > 0);
    assert_renders_right(&farm, second, "out2");
    assert!(blob.exists(), "stored again, intact");
    assert_eq!(
        Digest::of(&std::fs::read(&blob).unwrap()),
        Digest::of(&std::fs::read(&scene).unwrap())
    );
}

#[test]
fn a_deleted_wal_loses_no_job_acknowledged_before_the_last_checkpoint() {
    let mut farm = Farm::start("wal", &[]);
    let job = submit(&farm, "2x2");
    let wal = farm.data.join("state.sqlite-wal");
    // The submit was committed to the WAL; the regular checkpoint (every
    // second) moves it into the main file and empties the WAL.
    wait_until("a checkpoint", Duration::from_secs(30), || {
        std::fs::metadata(&wal).map_or(true, |m| m.len() == 0)
    });
    farm.kill_coordinator();
    let _ = std::fs::remove_file(&wal);
    let _ = std::fs::remove_file(farm.data.join("state.sqlite-shm"));
    farm.start_coordinator();
    assert_eq!(farm.status(job)["state"], "queued");
    farm.add_worker("w1");
    assert_renders_right(&farm, job, "out");
}

#[test]
fn a_hot_backup_restores_into_a_farm_with_every_job_and_frame() {
    let mut farm = Farm::start("backup", &[]);
    farm.add_worker("w1");
    let job = submit(&farm, "2x2");
    assert_renders_right(&farm, job, "out1");
    // Taken while the coordinator runs.
    let copy = farm.dir.join("backup");
    let out = crate::harness::tessera()
        .args(["coordinator", "backup", "--data-dir"])
        .arg(&farm.data)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A second backup into the same folder is refused, not mixed in.
    let again = crate::harness::tessera()
        .args(["coordinator", "backup", "--data-dir"])
        .arg(&farm.data)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("not empty"));
    // The original is lost; the backup takes its place.
    farm.kill_coordinator();
    std::fs::rename(&farm.data, farm.dir.join("lost")).unwrap();
    std::fs::rename(&copy, &farm.data).unwrap();
    farm.start_coordinator();
    assert_eq!(farm.status(job)["state"], "done");
    let out = farm.dir.join("out2");
    farm.wait_done(job, &out);
    assert_frames_match_reference(&out, &scenes().join("demo.scene.json"), &[1]);
    // And it keeps working: a new job renders (the worker rejoins).
    let next = submit(&farm, "2x2");
    assert_renders_right(&farm, next, "out3");
}

#[test]
fn a_cached_file_edited_in_place_on_a_worker_is_verified_and_fetched_again() {
    let mut farm = Farm::start("cache-edit", &[]);
    farm.add_worker("w1");
    let scene = scenes().join("demo.scene.json");
    let first = submit(&farm, "2x2");
    assert_renders_right(&farm, first, "out1");
    // Someone edits the worker's cached scene in place, keeping its size
    // and its inode: another seed, so another picture if it were used.
    let digest = Digest::of(&std::fs::read(&scene).unwrap());
    let hex = digest.to_hex();
    let cached = (farm.dir.join("cache-w1").join("blobs"))
        .join(&hex[..2])
        .join(&hex);
    let text = std::fs::read_to_string(&cached).unwrap();
    let edited = text.replace("\"seed\": 2024", "\"seed\": 2025");
    assert!(edited != text && edited.len() == text.len());
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&cached)
            .unwrap();
        f.write_all(edited.as_bytes()).unwrap();
    }
    // The next task to use it finds the change, fetches the file again, and
    // renders the right frame.
    let second = submit(&farm, "2x2");
    assert_renders_right(&farm, second, "out2");
    assert_eq!(Digest::of(&std::fs::read(&cached).unwrap()), digest);
}

#[test]
fn a_task_whose_workers_keep_dying_fails_its_job_with_that_reason() {
    use tessera_worker::engine::{FAILPOINT, FAILPOINT_ABORT_IN_RENDER};
    let mut farm = Farm::start("dying", &[]);
    // Each worker's process aborts as soon as it starts rendering, as one
    // killed by a render that exhausts its memory would.
    for name in ["d1", "d2", "d3"] {
        farm.add_worker_env(name, &[], &[(FAILPOINT, FAILPOINT_ABORT_IN_RENDER)]);
    }
    farm.wait_workers(3);
    let job = submit(&farm, "1x1");
    let failed = farm.wait_for(job, "the job to fail", |s| s["state"] == "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("3 workers in a row died while rendering it"),
        "{error}"
    );
    // It took exactly the three workers down, and then stopped.
    for i in 0..3 {
        assert!(!farm.wait_worker_exit(i, Duration::from_secs(60)).success());
    }
}

/// SIGTERM while the coordinator is busy — results streaming in from two
/// workers, a hundred jobs no worker can take, a garbage collection and
/// clients polling `status` — ends it within its bound; started again,
/// every result a worker was told was accepted is there (none is rendered
/// again) and the job completes with the right frames.
#[test]
fn sigterm_under_load_ends_the_coordinator_in_time_and_keeps_every_acknowledged_result() {
    let mut farm = Farm::start("sigterm-load", &[]);
    farm.add_worker("w1");
    farm.add_worker("w2");
    farm.wait_workers(2);
    let scene = scenes().join("demo.scene.json");
    let scene = scene.to_str().unwrap();
    for _ in 0..100 {
        farm.json(&[
            "submit", scene, "--engine", "noop", "--frames", "1", "--json",
        ]);
    }
    let job = farm.json(&[
        "submit", scene, "--frames", "1-4", "--tiles", "8x8", "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    farm.wait_for(job, "results to stream in", |s| {
        s["tasks_done"].as_u64() >= Some(20)
    });
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (took, acked) = std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = farm.run(&["status", "--json"]);
                }
            });
        }
        scope.spawn(|| {
            let _ = farm.run(&["gc", "--json"]);
        });
        std::thread::sleep(Duration::from_millis(300));
        let pid = farm.coordinator_pid();
        let acked_before = farm.accepted();
        // SAFETY: a signal to the coordinator this test started.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let asked = Instant::now();
        // Ended: a zombie until the harness reaps it below.
        let ended = || crate::harness::process_ended(pid);
        while !ended() {
            assert!(asked.elapsed() < Duration::from_secs(30), "still running");
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = asked.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Acknowledged up to the exit: the workers' logs, read now.
        let acked = farm.accepted();
        assert!(acked.len() >= acked_before.len());
        (took, acked)
    });
    let status = farm.wait_coordinator_exit(Duration::from_secs(5));
    assert!(status.success(), "the coordinator exited with {status}");
    println!(
        "SIGTERM under load: the coordinator ended {} ms after it, {} results acknowledged",
        took.as_millis(),
        acked.iter().filter(|(j, _)| *j == job).count()
    );
    assert!(
        took < Duration::from_secs(5),
        "the coordinator took {took:?} to end after SIGTERM"
    );
    farm.start_coordinator();
    assert_renders_right_frames(&farm, job);
    // No acknowledged result was lost: none of those tasks rendered again.
    let renders = farm.renders();
    for task in acked.iter().filter(|(j, _)| *j == job) {
        let n = renders.iter().filter(|r| *r == task).count();
        assert_eq!(n, 1, "task {task:?} acknowledged, then rendered {n} times");
    }
}

fn assert_renders_right_frames(farm: &Farm, job: u64) {
    let out = farm.dir.join("out");
    farm.wait_done(job, &out);
    assert_frames_match_reference(&out, &scenes().join("demo.scene.json"), &[1, 2, 3, 4]);
}
