//! Workers trusted only for what they hold, against a real coordinator: a
//! worker fetches only its tasks' blobs, a huge slot claim takes no more
//! than the worker has proven, and `--verify` catches a worker returning
//! altered pixels.

use crate::harness::{assert_frames_match_reference_samples, scenes, Farm, State};
use crate::hostile::{runtime, ticket};
use crate::hostile_worker::rogue;

use tessera_protocol::messages::{ClientRequest, ClientResponse, CoordMsg, JobInfo};
use tessera_protocol::Digest;
use tessera_store::blob::BlobError;
use tessera_transport::blob::{self, BlobDir};
use tessera_transport::{self as transport, Timing};

fn submit(farm: &Farm, frames: &str, tiles: &str, extra: &[&str]) -> u64 {
    let scene = scenes().join("demo.scene.json");
    let mut args = vec![
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        frames,
        "--tiles",
        tiles,
        "--samples",
        "16",
        "--json",
    ];
    args.extend_from_slice(extra);
    farm.json(&args)["id"].as_u64().unwrap()
}

/// A worker holding a task of one job may fetch that job's scene file; it is
/// refused another job's output frame and a blob no task needs, and an
/// honest farm still renders.
#[test]
fn a_worker_fetches_only_the_blobs_of_tasks_it_holds() {
    a_worker_fetches_only_the_blobs_of_tasks_it_holds_on(State::Sqlite);
}

/// The same with the assets in a bucket: the URLs a worker is handed to
/// fetch from the object store itself follow the same rule, and fetch the
/// right bytes without credentials.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and Garage"]
fn a_worker_fetches_only_the_blobs_of_tasks_it_holds_on_postgresql_and_s3() {
    a_worker_fetches_only_the_blobs_of_tasks_it_holds_on(State::PostgresS3);
}

fn a_worker_fetches_only_the_blobs_of_tasks_it_holds_on(state: State) {
    let mut farm = Farm::start_with_state("trust-fetch", &[], state);
    farm.add_worker("honest");
    farm.wait_workers(1);
    let first = submit(&farm, "1", "1x1", &[]);
    let out = farm.dir.join("out");
    farm.wait_done(first, &out);
    assert_frames_match_reference_samples(&out, &scenes().join("demo.scene.json"), &[1], 16);
    farm.kill_worker(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !farm.json(&["status", "--json"])["workers"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed worker stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }

    let rt = runtime();
    let ct = ticket(&farm, "client.ticket");
    let frame: Digest = rt.block_on(async {
        let mut c = transport::connect(&ct, "reader", Timing::default())
            .await
            .unwrap();
        c.control.send(&ClientRequest::Frames(first)).await.unwrap();
        match c.control.recv::<ClientResponse>().await.unwrap() {
            Some(ClientResponse::Frames(frames)) => frames[0].digest,
            other => panic!("{other:?}"),
        }
    });
    let wt = ticket(&farm, "worker.ticket");
    let mut s = rt.block_on(rogue::join(&wt, "fetcher", rogue::info(1, 0.0)));
    let second = submit(&farm, "2", "1x1", &[]);
    let cache = BlobDir::open(farm.dir.join("rogue-cache")).unwrap();
    rt.block_on(async {
        let mut job: Option<JobInfo> = None;
        loop {
            let beat = tessera_protocol::messages::WorkerMsg::Heartbeat { telemetry: None };
            s.control.send(&beat).await.unwrap();
            let next = tokio::time::timeout(
                std::time::Duration::from_millis(500),
                s.control.recv::<CoordMsg>(),
            );
            let Ok(next) = next.await else { continue };
            match next.unwrap().expect("connected") {
                CoordMsg::Job(info) => job = Some(info),
                CoordMsg::Assign(spec) => {
                    assert_eq!(spec.task.job, second);
                    break;
                }
                _ => {}
            }
        }
        let scene = job.expect("the job came before its task").manifest[0].digest;
        let got = blob::get(&s.connection, scene, Some(second), &cache).await;
        assert!(
            got.is_ok(),
            "its own task's scene file was refused: {got:?}"
        );
        for (what, digest) in [
            ("another job's frame", frame),
            ("an unrelated blob", Digest::of(b"not a blob of any task")),
        ] {
            match blob::get(&s.connection, digest, Some(second), &cache).await {
                Err(BlobError::Refused { reason, .. }) => {
                    assert!(reason.contains("not needed by a task"), "{what}: {reason}")
                }
                other => panic!("{what} was not refused: {other:?}"),
            }
            if state == State::PostgresS3 {
                let located = blob::locate(&s.connection, &[digest], Some(second)).await;
                assert!(
                    matches!(located, Err(BlobError::Refused { .. })),
                    "{what}: a URL was handed out: {located:?}"
                );
            }
        }
        if state == State::PostgresS3 {
            let urls = blob::locate(&s.connection, &[scene], Some(second))
                .await
                .unwrap();
            let (url, len) = urls[0].clone().expect("the scene is in the bucket");
            assert!(
                url.contains("X-Amz-Signature=") && url.contains("X-Amz-Expires="),
                "{url}"
            );
            let bytes = tokio::task::spawn_blocking(move || {
                let mut body = ureq::get(&url).call().unwrap().into_body();
                body.with_config().limit(1 << 30).read_to_vec().unwrap()
            })
            .await
            .unwrap();
            assert_eq!((bytes.len() as u64, Digest::of(&bytes)), (len, scene));
        }
    });
    drop(s);
    farm.add_worker("honest-again");
    let out = farm.dir.join("out-2");
    farm.wait_done(second, &out);
    assert_frames_match_reference_samples(&out, &scenes().join("demo.scene.json"), &[2], 16);
}

/// The case: a worker claiming 100,000 slots (capped to 256) beside
/// an honest one-slot worker, on a 16-task job. It is given only the slots
/// it is trusted with before it delivers anything (4), so the honest worker
/// renders the other 12 instead of sitting idle, and the job completes.
#[test]
fn a_huge_slot_claim_takes_no_more_than_it_has_proven() {
    let mut farm = Farm::start("trust-slots", &[]);
    let wt = ticket(&farm, "worker.ticket");
    let rt = runtime();
    let mut s = rt.block_on(rogue::join(&wt, "greedy", rogue::info(100_000, 0.0)));
    farm.add_worker_with("honest", &["--slots", "1"]);
    farm.wait_workers(2);
    let job = submit(&farm, "1", "4x4", &[]);
    let out = farm.dir.join("out");
    let counter = std::thread::spawn(move || {
        let rt = runtime();
        rt.block_on(async {
            let mut assigned = 0;
            while let Ok(Ok(Some(msg))) = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                s.control.recv::<CoordMsg>(),
            )
            .await
            {
                if let CoordMsg::Assign(_) = msg {
                    assigned += 1;
                }
            }
            assigned
        })
    });
    let done = farm.wait_done(job, &out);
    assert_frames_match_reference_samples(&out, &scenes().join("demo.scene.json"), &[1], 16);
    assert_eq!(done["tasks_done"], 16);
    let accepted = farm.accepted().len();
    assert!(
        accepted >= 12,
        "the honest worker rendered only {accepted} of 16"
    );
    drop(rt);
    let assigned = counter.join().unwrap();
    assert!(
        (1..=4).contains(&assigned),
        "the greedy worker was given {assigned} tasks"
    );
}

/// The acceptance case: `--verify 10` on a farm where one of three workers
/// returns altered pixels (failpoint `alter-pixels`). Every worker's first
/// result is checked on another; the liar is outvoted, quarantined by its
/// identity, its results are rendered again, and the frames equal a clean
/// render. `status --json` shows the verification.
#[test]
fn verify_quarantines_a_worker_returning_altered_pixels_and_the_frames_are_clean() {
    let mut farm = Farm::start("trust-verify", &[]);
    farm.add_worker("honest-a");
    farm.add_worker_env("liar", &[], &[("TESSERA_FAILPOINT", "alter-pixels")]);
    farm.add_worker("honest-b");
    farm.wait_workers(3);
    let job = submit(&farm, "1-2", "2x2", &["--verify", "10"]);
    let out = farm.dir.join("out");
    let done = farm.wait_done(job, &out);
    assert_frames_match_reference_samples(&out, &scenes().join("demo.scene.json"), &[1, 2], 16);
    let v = &done["verification"];
    assert_eq!(v["percent"], 10, "{done}");
    assert_eq!(v["quarantined"], serde_json::json!(["liar"]), "{done}");
    assert!(v["mismatched"].as_u64().unwrap() >= 1, "{done}");
    assert!(v["agreed"].as_u64().unwrap() >= 2, "{done}");
    assert_eq!(v["pending"], 0, "{done}");
    // Quarantined for good: after a restart it still gets no work.
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.wait_workers(3);
    let again = submit(&farm, "3", "2x2", &["--verify", "0"]);
    let out = farm.dir.join("out-3");
    farm.wait_done(again, &out);
    assert_frames_match_reference_samples(&out, &scenes().join("demo.scene.json"), &[3], 16);
    let status = farm.json(&["status", "--json"]);
    let liar = (status["workers"].as_array().unwrap().iter())
        .find(|w| w["name"] == "liar")
        .expect("the liar is still connected");
    assert_eq!(liar["tasks_done"], 0, "{status}");
    assert_eq!(liar["state"], "draining", "{status}");
    let shown = farm.json(&["status", &job.to_string(), "--json"]);
    assert_eq!(
        shown["verification"]["quarantined"],
        serde_json::json!(["liar"])
    );
}

/// Every reply fits its frame: `status` of more jobs than one page holds
/// is read page by page, and lists every job, each once, in order.
#[test]
fn status_of_many_jobs_is_read_page_by_page() {
    use tessera_protocol::job::{Engine, JobSpec, ManifestEntry};
    use tessera_protocol::messages::PAGE_ITEMS;
    use tessera_transport::blob::BlobSource;
    let farm = Farm::start("trust-pages", &[]);
    let ct = ticket(&farm, "client.ticket");
    let jobs = PAGE_ITEMS * 2 + 10;
    let rt = runtime();
    rt.block_on(async {
        let mut s = transport::connect(&ct, "many", Timing::default())
            .await
            .unwrap();
        let bytes = std::fs::read(scenes().join("demo.scene.json")).unwrap();
        let digest = Digest::of(&bytes);
        let len = bytes.len() as u64;
        blob::put(&s.connection, digest, len, BlobSource::Bytes(&bytes))
            .await
            .unwrap();
        for i in 0..jobs {
            let spec = JobSpec {
                manifest: vec![ManifestEntry {
                    path: "demo.scene.json".into(),
                    digest,
                    size: len,
                    origin: None,
                    frame: None,
                }],
                resolution: (160, 90),
                ..JobSpec::new(format!("{i:0>128}"), Engine::Builtin, "demo.scene.json")
            };
            s.control.send(&ClientRequest::Submit(spec)).await.unwrap();
            match s.control.recv::<ClientResponse>().await.unwrap() {
                Some(ClientResponse::Submitted(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        // One page holds at most PAGE_ITEMS jobs, and says there are more.
        let page = ClientRequest::StatusPage {
            after_job: 0,
            after_worker: 0,
        };
        s.control.send(&page).await.unwrap();
        match s.control.recv::<ClientResponse>().await.unwrap() {
            Some(ClientResponse::StatusPage { jobs, more, .. }) => {
                assert_eq!(jobs.len(), PAGE_ITEMS);
                assert!(more);
            }
            other => panic!("{other:?}"),
        }
    });
    let all = farm.json(&["status", "--json"]);
    let ids: Vec<u64> = (all["jobs"].as_array().unwrap().iter())
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, (1..=jobs as u64).collect::<Vec<_>>());
}
