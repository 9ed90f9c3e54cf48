//! A hostile worker with the real worker ticket, speaking the protocol
//! directly against a real coordinator process: results for leases it
//! does not hold, results that do not fit their tile, prices and slot
//! claims out of range.

use crate::harness::{assert_frames_match_reference_samples, scenes, Farm};
use crate::hostile::{blob_files, runtime, ticket};

/// A worker speaking the protocol with the real worker ticket.
pub mod rogue {
    use tessera_protocol::job::Engine;
    use tessera_protocol::messages::{CoordMsg, TaskSpec, WorkerInfo, WorkerMsg};
    use tessera_protocol::ticket::Ticket;
    use tessera_transport::{self as transport, Session, Timing};

    pub fn info(slots: u32, price_per_hour: f64) -> WorkerInfo {
        WorkerInfo {
            engines: vec![Engine::Builtin],
            slots,
            price_per_hour,
            hostname: "rogue".into(),
            holding: Vec::new(),
            interruptible: false,
            cached: Vec::new(),
            blenders: Vec::new(),
            fetches_builds: false,
            draining: false,
            host: None,
        }
    }

    pub async fn join(ticket: &Ticket, name: &str, info: WorkerInfo) -> Session {
        let mut s = transport::connect(ticket, name, Timing::default())
            .await
            .unwrap();
        s.control.send(&WorkerMsg::Join(info)).await.unwrap();
        s
    }

    /// The next coordinator message, skipping `Enrolled` (a worker joining
    /// with the shared ticket is told its credential first), `Joined` and
    /// `Job`.
    pub async fn next(s: &mut Session) -> Option<CoordMsg> {
        loop {
            match s.control.recv::<CoordMsg>().await.ok()?? {
                CoordMsg::Enrolled { .. } | CoordMsg::Joined { .. } | CoordMsg::Job(_) => {}
                msg => return Some(msg),
            }
        }
    }

    pub async fn assignment(s: &mut Session) -> TaskSpec {
        loop {
            if let CoordMsg::Assign(spec) = next(s).await.expect("connection open") {
                return spec;
            }
        }
    }
}

/// A 1x1 PNG.
fn tiny_png() -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, 1, 1);
    enc.set_color(png::ColorType::Rgb);
    enc.write_header()
        .unwrap()
        .write_image_data(&[9, 9, 9])
        .unwrap();
    out
}

/// A hostile worker with the real worker ticket: 1,000 results for a task
/// it does not hold (a made-up epoch) are refused before a byte is
/// stored, and a 1x1 PNG for a tile is refused as a failed attempt on it;
/// an honest worker then renders the job, which completes with the right
/// pixels instead of failing at stitching.
#[test]
fn a_hostile_workers_results_store_nothing_and_the_job_completes_elsewhere() {
    use tessera_protocol::messages::{CoordMsg, TaskRef, WorkerMsg};
    use tessera_protocol::Digest;
    let mut farm = Farm::start("rogue-results", &[]);
    let wt = ticket(&farm, "worker.ticket");
    let rt = runtime();
    let mut s = rt.block_on(rogue::join(&wt, "rogue", rogue::info(1, 0.0)));
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "2x2",
        "--samples",
        "16",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    let before = blob_files(&farm);
    let reason = rt.block_on(async {
        let spec = rogue::assignment(&mut s).await;
        let mut refused = 0;
        for i in 0..1000u32 {
            let task = TaskRef {
                epoch: spec.task.epoch + 1 + u64::from(i),
                ..spec.task
            };
            let mut bytes = vec![0u8; 60 * 1024];
            bytes[..4].copy_from_slice(&i.to_be_bytes());
            let done = WorkerMsg::Done {
                task,
                output: Digest::of(&bytes),
                render_ms: 1,
                inline: Some(bytes),
            };
            s.control.send(&done).await.unwrap();
            if i % 50 == 0 {
                s.control
                    .send(&WorkerMsg::Heartbeat { telemetry: None })
                    .await
                    .unwrap();
            }
        }
        while refused < 1000 {
            match rogue::next(&mut s).await.expect("connection open") {
                CoordMsg::Ack {
                    accepted: false, ..
                } => refused += 1,
                CoordMsg::Ack { accepted: true, .. } => panic!("a made-up lease was accepted"),
                _ => {}
            }
        }
        let png = tiny_png();
        let done = WorkerMsg::Done {
            task: spec.task,
            output: Digest::of(&png),
            render_ms: 1,
            inline: Some(png),
        };
        s.control.send(&done).await.unwrap();
        loop {
            match rogue::next(&mut s).await.expect("connection open") {
                CoordMsg::Ack {
                    task,
                    accepted,
                    reason,
                } if task == spec.task => {
                    assert!(
                        !accepted,
                        "a 1x1 PNG was accepted for a {:?} tile",
                        spec.tile
                    );
                    return reason.unwrap_or_default();
                }
                _ => {}
            }
        }
    });
    assert!(reason.contains("1x1 PNG"), "{reason}");
    assert_eq!(blob_files(&farm), before, "refused results were stored");
    drop(s);
    farm.add_worker("honest");
    let out = farm.dir.join("out");
    farm.wait_done(job, &out);
    assert_frames_match_reference_samples(&out, &scene, &[1], 16);
}

/// Prices that are not a finite amount ≥ 0 are refused by the worker CLI
/// and by the coordinator; a claim of 100,000 slots is cut to the cap.
#[test]
fn bad_prices_are_refused_and_slot_claims_are_capped() {
    let farm = Farm::start("rogue-join", &[]);
    // Past the bound, any sum of leases could overflow to infinity.
    for price in ["NaN", "inf", "-1", "1e308"] {
        let out = crate::harness::tessera()
            .args(["worker", "--ticket", &farm.worker_ticket()])
            .arg(format!("--price-per-hour={price}"))
            .arg("--cache-dir")
            .arg(farm.dir.join("cache"))
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "--price-per-hour {price} was accepted"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("price"), "{price}: {err}");
    }
    let wt = ticket(&farm, "worker.ticket");
    let rt = runtime();
    rt.block_on(async {
        for price in [f64::NAN, f64::INFINITY, -1.0, 1e308] {
            let mut s = rogue::join(&wt, "priced", rogue::info(1, price)).await;
            assert!(
                rogue::next(&mut s).await.is_none(),
                "price {price} was accepted"
            );
        }
    });
    let all = farm.json(&["status", "--json"]);
    assert!(all["workers"].as_array().unwrap().is_empty(), "{all}");
    let _greedy = rt.block_on(rogue::join(&wt, "greedy", rogue::info(100_000, 0.0)));
    farm.wait_workers(1);
    let all = farm.json(&["status", "--json"]);
    assert_eq!(all["workers"][0]["slots"], 256, "{all}");
}

/// A 9 MiB worker name and a 6 MiB error message: the name cannot get past
/// the Hello, and the error is cut to `MAX_ERROR` before it is stored, so
/// `status`, `wait` and `cancel` keep working, also after a restart.
#[test]
fn huge_names_and_errors_do_not_break_status_or_cancel() {
    use tessera_protocol::messages::WorkerMsg;
    use tessera_transport::{self as transport, Timing};
    // A long lease: the rogue sends no heartbeat while it waits out the
    // retry backoff.
    let mut farm = Farm::start("rogue-text", &["--lease-ms", "10000"]);
    let wt = ticket(&farm, "worker.ticket");
    let rt = runtime();
    let huge_name = "n".repeat(9 << 20);
    let named = rt.block_on(transport::connect(&wt, &huge_name, Timing::default()));
    assert!(named.is_err(), "a 9 MiB name got past the Hello");

    let mut s = rt.block_on(rogue::join(&wt, "rogue", rogue::info(1, 0.0)));
    let scene = scenes().join("textured.scene.json");
    let job = farm.json(&["submit", scene.to_str().unwrap(), "--frames", "1", "--json"])["id"]
        .as_u64()
        .unwrap();
    rt.block_on(async {
        // Each attempt fails with a 6 MiB error, until the job fails.
        for _ in 0..3 {
            let spec = rogue::assignment(&mut s).await;
            let failed = WorkerMsg::Failed {
                task: spec.task,
                error: "e".repeat(6 << 20),
                log: "l".repeat(6 << 20),
                unsupported: false,
            };
            s.control.send(&failed).await.unwrap();
            s.control
                .send(&WorkerMsg::Heartbeat { telemetry: None })
                .await
                .unwrap();
        }
    });
    let failed = farm.wait_for(job, "the job to fail", |s| s["state"] == "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(error.len() <= 4096, "error of {} bytes stored", error.len());
    drop(s);
    let check = |farm: &Farm| {
        for args in [
            &["status"][..],
            &["status", "--json"],
            &["status", &job.to_string(), "--json"],
        ] {
            let out = farm.run(args);
            assert!(
                out.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Canceling the failed job is refused (a conflict: exit 1) in one
        // line, its long error not repeated.
        let out = farm.run(&["cancel", &job.to_string()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.len() < 4096, "{stderr}");
        let out = farm.run(&["wait", &job.to_string(), "--json"]);
        let waited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(waited["state"], "failed");
    };
    check(&farm);
    farm.kill_coordinator();
    farm.start_coordinator();
    check(&farm);
}
