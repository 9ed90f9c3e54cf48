//! Operating a farm: cost per job, pausing a job, draining a worker, and the
//! readable status tables.

use std::time::Duration;

use crate::harness::{field, scenes, Farm};

#[test]
fn job_cost_is_lease_time_times_each_workers_price() {
    let mut farm = Farm::start("cost", &[]);
    farm.add_worker_with("cheap", &["--price-per-hour", "3.6"]);
    farm.add_worker_with("dear", &["--price-per-hour", "36"]);
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1-2",
        "--tiles",
        "4x4",
        "--wait",
        "--json",
    ]);
    assert_eq!(job["state"], "done");
    // Σ render time × price, from what each worker logged it rendered.
    let mut rendered_cost = 0.0;
    for (i, price) in [(0, 3.6), (1, 36.0)] {
        for line in farm
            .log_of(i)
            .lines()
            .filter(|l| l.contains("task rendered"))
        {
            rendered_cost += field(line, "render_ms").unwrap() as f64 / 3_600_000.0 * price;
        }
    }
    let cost = job["cost_usd"].as_f64().unwrap();
    // A lease covers the render plus dispatch and upload: at most a few
    // milliseconds per task on loopback.
    let slack = 32.0 * 0.25 / 3600.0 * 36.0;
    assert!(
        cost >= rendered_cost * 0.999,
        "cost {cost} < rendered {rendered_cost}"
    );
    assert!(
        cost <= rendered_cost + slack,
        "cost {cost} > rendered {rendered_cost} + {slack}"
    );
    assert_eq!(
        job["cost_to_finish_usd"],
        serde_json::Value::Null,
        "nothing left to pay for"
    );
    // The farm burns both prices per hour while connected.
    let all = farm.json(&["status", "--json"]);
    let burn: f64 = all["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["price_per_hour"].as_f64().unwrap())
        .sum();
    assert!((burn - 39.6).abs() < 1e-9);
}

#[test]
fn a_paused_job_gets_no_new_tasks_and_a_drained_worker_leaves_cleanly() {
    let mut farm = Farm::start("pause", &[]);
    let w = farm.add_worker("w1");
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    let out = farm.run(&["pause", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let paused = farm.status(id);
    assert_eq!(paused["paused"], true);
    std::thread::sleep(Duration::from_millis(1500));
    let still = farm.status(id);
    let done = still["tasks_done"].as_u64().unwrap();
    assert!(done <= 1, "a paused job kept running: {still}");
    let out = farm.run(&["resume", &id.to_string()]);
    assert!(out.status.success());
    let finished = farm.json(&["wait", &id.to_string(), "--json"]);
    assert_eq!(finished["state"], "done");

    // Drain: the worker finishes what it holds and exits 0.
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    farm.wait_for(id, "a task to finish", |s| {
        s["tasks_done"].as_u64().unwrap() >= 1
    });
    let workers = farm.json(&["status", "--json"]);
    let worker_id = workers["workers"][0]["id"].as_u64().unwrap();
    let out = farm.run(&["drain", &worker_id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = farm.wait_worker_exit(w, Duration::from_secs(30));
    assert!(status.success(), "drained worker exited with {status}");
    let left = farm.status(id);
    assert!(
        left["tasks_done"].as_u64().unwrap() < 16,
        "the drained worker took no new work: {left}"
    );
    assert_eq!(left["blocked"], "no workers are connected");
}

/// `--congestion bbr` on both ends: assets go out and results come back
/// under BBR, and the frame is the one a local render makes; a name it
/// does not know is refused as bad usage.
#[test]
fn a_farm_sending_with_bbr_renders_the_same_frame() {
    let mut farm = Farm::start("bbr", &["--congestion", "bbr"]);
    farm.add_worker_with("w1", &["--congestion", "bbr"]);
    let id = farm.submit_demo_frame("2x2");
    let out = farm.dir.join("out");
    farm.wait_done(id, &out);
    let scene = scenes().join("demo.scene.json");
    crate::harness::assert_frames_match_reference_samples(&out, &scene, &[1], 256);

    let bad = crate::harness::tessera()
        .args([
            "worker",
            "--ticket",
            &farm.worker_ticket(),
            "--congestion",
            "vegas",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("expected cubic-veno, cubic, newreno or bbr"),
        "{err}"
    );
}

/// `tessera status | head -1` and the like: a command whose reader goes
/// away ends quietly (exit 0, or killed by SIGPIPE as `141` in a shell),
/// never with a panic and a backtrace.
#[test]
fn client_commands_end_quietly_when_their_reader_closes_the_pipe() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    let mut farm = Farm::start("closed-pipe", &[]);
    farm.add_worker("w1");
    farm.wait_workers(1);
    let job = farm.submit_demo_frame("2x2");
    let id = job.to_string();
    let commands: [&[&str]; 4] = [
        &["status"],
        &["status", "--json"],
        &["wait", &id],
        &["events", "--json"],
    ];
    for args in commands {
        let mut child = farm
            .command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A job that makes events and costs little to render.
        let eventful = || {
            let scene = scenes().join("demo.scene.json");
            let args = [
                "submit",
                scene.to_str().unwrap(),
                "--samples",
                "1",
                "--json",
            ];
            farm.json(&args);
        };
        if args[0] == "events" {
            // Something to print: the stream shows only what happens now.
            eventful();
        }
        // Read one line, then close the pipe, as `head -1` does.
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if args[0] == "events" {
            // More events after the reader left: the next write meets a
            // closed pipe.
            eventful();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "tessera {args:?}: {:?} {stderr}",
            out.status
        );
        assert!(!stderr.contains("panicked"), "tessera {args:?}: {stderr}");
    }
}
