//! The coordinator's state in PostgreSQL (`--state`), on a scratch server
//! of the test's own: what only a database server can do to a coordinator.
//! (The fault tests that also run on PostgreSQL are beside their SQLite
//! forms, named `…_on_postgresql`.)

use std::collections::HashMap;
use std::time::Duration;

use crate::harness::{assert_frames_match_reference, process_ended, scenes, Farm, State};

/// PostgreSQL restarted (`pg_ctl restart -m fast`: every connection
/// closed) while a job renders: the coordinator connects again, the
/// results that arrived meanwhile wait for the database instead of
/// failing the job, and every task is accepted once.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres)"]
fn postgresql_restarted_mid_job_fails_nothing_and_loses_nothing() {
    let mut farm = Farm::start_with_state(
        "pgrestart",
        &["--heartbeat-ms", "300", "--lease-ms", "1500"],
        State::Postgres,
    );
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
    let coordinator = farm.coordinator_pid();
    farm.wait_for(id, "a third of the tasks", |s| {
        s["tasks_done"].as_u64().unwrap() >= total / 3
    });
    farm.restart_postgres();

    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["state"], "done", "{done}");
    assert_frames_match_reference(&out, &scene, &[1, 2, 3, 4]);
    assert!(
        !process_ended(coordinator),
        "the same coordinator carried on"
    );
    let mut accepted: HashMap<(u64, u32), u32> = HashMap::new();
    for task in farm.accepted() {
        *accepted.entry(task).or_default() += 1;
    }
    assert_eq!(accepted.len() as u64, total, "every task accepted");
    assert!(
        accepted.values().all(|&n| n == 1),
        "a task was accepted twice: {accepted:?}"
    );
    // What the database holds after it came back: every result, once.
    let db = farm.db();
    assert_eq!(db.results(id).unwrap().len() as u64, total);
    assert_eq!(db.frames(id).unwrap().len(), 4);
}

/// A sample of `/metrics`: the value of `metric`, if it is there.
fn metric(farm: &Farm, metric: &str) -> Option<f64> {
    let ticket = crate::hostile::ticket(farm, "client.ticket");
    let (code, body) = crate::harness::http_call(
        &ticket,
        crate::harness::http_addr(farm),
        "GET",
        "/metrics",
        "",
    );
    if code != 200 {
        return None;
    }
    (body.lines())
        .find_map(|l| l.strip_prefix(&format!("{metric} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// PostgreSQL stopped for longer than a result waits for it (30 s): the
/// coordinator says so in `/metrics` (the state out of reach, the farm's
/// lease ended), hands out nothing, refuses the results it cannot commit
/// and never fails the job; started again, the same coordinator renews
/// its lease and the job completes, each task accepted once, the frames
/// exact.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres)"]
fn postgresql_down_past_the_commit_wait_fails_no_job_and_shows_in_metrics() {
    let mut farm = Farm::start_with_state(
        "pgdown",
        &["--heartbeat-ms", "300", "--lease-ms", "1500", "--http"],
        State::Postgres,
    );
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
    let coordinator = farm.coordinator_pid();
    farm.wait_for(id, "a third of the tasks", |s| {
        s["tasks_done"].as_u64().unwrap() >= total / 3
    });
    assert_eq!(metric(&farm, "tessera_state_reachable"), Some(1.0));
    assert_eq!(metric(&farm, "tessera_farm_lease_held"), Some(1.0));
    farm.stop_postgres();
    let down = std::time::Instant::now();
    crate::failover::wait_until("the scrape saying so", Duration::from_secs(60), || {
        metric(&farm, "tessera_state_reachable") == Some(0.0)
            && metric(&farm, "tessera_farm_lease_held") == Some(0.0)
    });
    // Past the 30 s a commit waits: results are refused, not the job.
    while down.elapsed() < Duration::from_secs(40) {
        std::thread::sleep(Duration::from_millis(500));
    }
    farm.start_postgres();
    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["state"], "done", "{done}");
    assert_frames_match_reference(&out, &scene, &[1, 2, 3, 4]);
    assert!(
        !process_ended(coordinator),
        "the same coordinator carried on"
    );
    let mut accepted: HashMap<(u64, u32), u32> = HashMap::new();
    for task in farm.accepted() {
        *accepted.entry(task).or_default() += 1;
    }
    assert_eq!(accepted.len() as u64, total, "every task accepted");
    assert!(accepted.values().all(|&n| n == 1), "{accepted:?}");
    assert_eq!(farm.db().results(id).unwrap().len() as u64, total);
    assert_eq!(metric(&farm, "tessera_state_reachable"), Some(1.0));
    assert_eq!(metric(&farm, "tessera_farm_lease_held"), Some(1.0));
    let refused = farm
        .coordinator_log()
        .matches("cannot commit results")
        .count();
    eprintln!("postgresql down 40 s: {refused} commit attempts waited; the job completed");
}
