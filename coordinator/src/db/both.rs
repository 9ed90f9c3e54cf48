//! The same calls on SQLite and on a real PostgreSQL server (a scratch
//! cluster, [`crate::scratch_postgres`]) leave the same state: every
//! method of [`Db`] and the statements of identities and webhooks run on
//! both, and what each answers is compared.

use super::tests::spec;
use super::*;
use crate::scratch_postgres::ScratchPostgres;
use tessera_protocol::blender::BlenderVersion;
use tessera_protocol::build::BuildKind;
use tessera_protocol::messages::{JobFilter, TaskLog};

/// Runs every call once, in an order that gives each something to find,
/// and writes down what each answered.
// Long because: one script of every call, in order, each one's answer
// noted; split, the order that gives each call something to find is lost.
fn transcript(db: &mut Db) -> Vec<String> {
    let mut out = Vec::new();
    let mut note = |what: &str, v: &dyn std::fmt::Debug| out.push(format!("{what}: {v:?}"));
    note("generation", &db.next_generation().unwrap());
    note("generation", &db.next_generation().unwrap());
    let a = db.insert_job(&spec(Some("req-a")), 1000, 10, 20).unwrap();
    let b = db.insert_job(&spec(None), 2000, 30, 0).unwrap();
    let c = db.insert_job(&spec(Some("req-c")), 3000, 0, 5).unwrap();
    note("ids", &(a, b, c));
    note("by request", &db.job_by_request("req-c").unwrap());
    note("by request", &db.job_by_request("none").unwrap());
    db.set_state(a, JobState::Running, None, None).unwrap();
    let row = |job, index, out: &[u8], worker| NewResult {
        job,
        index,
        output: Digest::of(out),
        render_ms: 40 + u64::from(index),
        worker,
        epoch: (7 << 32) + u64::from(index),
    };
    let fresh = db
        .insert_results(
            &[
                row(a, 0, b"0", "w1"),
                row(a, 1, b"1", "w2"),
                row(a, 2, b"2", "w1"),
            ],
            &[(a, 0.25)],
        )
        .unwrap();
    note("fresh", &fresh);
    note("again", &db.insert_result(row(a, 1, b"x", "w3")).unwrap());
    note("results", &db.results(a).unwrap());
    note("range", &db.result_range(a, 1, 5).unwrap());
    note("workers", &db.result_workers(a).unwrap());
    let frame = |f: u32, d: &[u8]| StoredFrame {
        frame: f,
        digest: Digest::of(d),
        size: u64::from(f) * 3,
    };
    for (f, d) in [(2, b"f2"), (1, b"f1"), (3, b"f3")] {
        db.insert_frame(a, &frame(f, d)).unwrap();
    }
    let since = db.frames_since(a, 0, 2).unwrap();
    note(
        "since",
        &since.iter().map(|(_, f)| f.frame).collect::<Vec<_>>(),
    );
    let cursor = since[1].0;
    db.insert_frame(a, &frame(2, b"f2 again")).unwrap();
    let after = db.frames_since(a, cursor, 10).unwrap();
    note(
        "after",
        &after.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>(),
    );
    note("frames", &db.frames(a).unwrap());
    db.insert_passes(a, 1, Digest::of(b"p"), 9).unwrap();
    db.insert_passes(a, 1, Digest::of(b"p2"), 10).unwrap();
    note("passes", &db.passes(a).unwrap());
    for (task, worker) in [(1, 5), (2, 6), (1, 7)] {
        let log = TaskLog {
            task,
            worker,
            unix_ms: 100 + u64::from(task),
            error: format!("error {task}/{worker}"),
            log: "log".repeat(task as usize),
        };
        db.insert_task_log(a, &log).unwrap();
    }
    let page = db.task_logs_page(a, None, 0, 2).unwrap();
    note(
        "log page",
        &page.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
    );
    let rest = db.task_logs_page(a, None, page[1].0, 10).unwrap();
    note(
        "log rest",
        &rest.iter().map(|(_, l)| l.clone()).collect::<Vec<_>>(),
    );
    note(
        "task 1",
        &db.task_logs_page(a, Some(1), 0, 10).unwrap().len(),
    );
    note("logs", &db.task_logs(a, Some(2)).unwrap());
    note("attempts", &db.attempts(a, 2).unwrap());
    db.set_holds(b, true, false).unwrap();
    db.set_holds(b, false, true).unwrap();
    note("holds", &(db.holds(b).unwrap(), db.holds(c).unwrap()));
    db.set_priority(b, 7).unwrap();
    db.set_priority(999, 7).unwrap();
    note(
        "job",
        &db.job(b).unwrap().map(|j| (j.spec.priority, j.state)),
    );
    note("missing", &db.job(999).unwrap().is_none());
    let counts = FinalCounts {
        tasks_done: 3,
        frames_done: 2,
        render_ms: 123,
        bytes_to_workers: 456,
    };
    db.finish_job(c, JobState::Failed, 5000, Some("boom"), 1.5, counts)
        .unwrap();
    db.finish_job(b, JobState::Done, 6000, None, 0.5, counts)
        .unwrap();
    note("state", &db.job_state(c).unwrap());
    note("finished", &db.finished_jobs(5).unwrap());
    let mut totals = db.finished_totals().unwrap();
    totals.sort_by_key(|(s, _)| s.name());
    note("totals", &totals);
    note("unfinished", &db.unfinished_jobs().unwrap());
    note(
        "reopen",
        &(
            db.reopen_failed_job(c).unwrap(),
            db.reopen_failed_job(c).unwrap(),
        ),
    );
    note("all", &db.jobs().unwrap());
    note("page", &db.jobs_page(a, 5).unwrap().len());
    let finished = JobRows {
        finished: Some(true),
        ..JobRows::for_filter(&JobFilter::default())
    };
    let ids = JobRows {
        ids: Some(vec![a, c]),
        since_unix_ms: Some(1500),
        finished: None,
    };
    note("where", &db.jobs_where(&finished, 0, 10).unwrap());
    note("before", &db.jobs_where_before(&ids, u64::MAX, 10).unwrap());
    note(
        "count",
        &(
            db.count_where(&finished).unwrap(),
            db.count_where(&ids).unwrap(),
        ),
    );
    let mut kept = db.outputs_kept(5500).unwrap();
    kept.sort();
    note("kept", &kept);
    let build = |digest: &[u8], added| BuildInfo {
        digest: Digest::of(digest),
        version: BlenderVersion::new(4, 5, 4),
        kind: BuildKind::Module,
        size: 10,
        files: 2,
        features: vec![],
        added_unix_ms: added,
        holders: Vec::new(),
    };
    db.add_build(&build(b"z", 1)).unwrap();
    note("build", &db.add_build(&build(b"z", 2)).unwrap());
    db.add_build(&build(b"a", 3)).unwrap();
    note("builds", &db.builds().unwrap());
    db.record_leases(&[(a, 3, 9, "id-1".into()), (a, 0, 8, "id-2".into())])
        .unwrap();
    db.record_leases(&[(a, 3, 9, "id-3".into())]).unwrap();
    let open = |db: &Db| {
        let mut leases = db.open_leases(a).unwrap();
        leases.sort();
        leases
    };
    note("open leases", &open(db));
    db.withdraw(a, &[0], &[1]).unwrap();
    note(
        "withdrawn",
        &(db.results(a).unwrap().len(), db.frames(a).unwrap().len()),
    );
    note("open after", &open(db));
    db.quarantine("id-1", "w1", "mismatch", 10).unwrap();
    db.quarantine("id-1", "w1", "again", 11).unwrap();
    note("quarantined", &db.quarantined().unwrap());
    let summary = Verification {
        percent: 10,
        agreed: 2,
        ..Default::default()
    };
    db.set_verification(a, &summary).unwrap();
    note(
        "verification",
        &(db.verification(a).unwrap(), db.verification(b).unwrap()),
    );
    let (src, png) = (Digest::of(b"src"), Digest::of(b"png"));
    db.set_preview(a, 1, 0, &src, &Err("refused".into()))
        .unwrap();
    db.set_preview(a, 1, 0, &src, &Ok(png)).unwrap();
    note(
        "preview",
        &(
            db.preview(a, 1, 0, &src).unwrap(),
            db.preview(a, 1, 1, &src).unwrap(),
        ),
    );
    let cred = crate::identity::enroll(db.sql(), "w9", 5).unwrap();
    note(
        "revoked",
        &(crate::identity::revoke(db.sql(), "w9", 6).unwrap() == vec![cred.id]),
    );
    note(
        "revoke none",
        &crate::identity::revoke(db.sql(), "nobody", 6).unwrap(),
    );
    crate::webhook::forget_endings(db.sql(), a).unwrap();
    db.checkpoint().unwrap();
    out
}

#[test]
#[ignore = "needs PostgreSQL's initdb and postgres (apt-get install postgresql)"]
fn every_call_answers_the_same_on_sqlite_and_postgresql() {
    let dir = std::env::temp_dir().join(format!("tessera-db-both-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sqlite = transcript(&mut Db::open(&dir.join("state.sqlite")).unwrap());
    let server = ScratchPostgres::start("both").unwrap();
    let mut pg = Db::connect(&server.url()).unwrap();
    assert!(pg.is_postgres());
    let postgres = transcript(&mut pg);
    for (lite, pg) in sqlite.iter().zip(&postgres) {
        assert_eq!(lite, pg, "SQLite (left) and PostgreSQL (right) differ");
    }
    assert_eq!(sqlite.len(), postgres.len());
    drop(pg);

    // Connecting again finds it all, and migrates nothing.
    let again = Db::connect(&server.url()).unwrap();
    assert_eq!(again.jobs().unwrap().len(), 3);
    assert_eq!(again.frames(1).unwrap().len(), 2);

    // A database a newer Tessera wrote is refused, naming its version.
    again
        .sql()
        .execute("UPDATE tessera_schema SET version = 99", &[])
        .unwrap();
    let err = Db::connect(&server.url()).err().expect("refused");
    assert!(matches!(err, DbError::Newer { found: 99 }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
#[ignore = "needs PostgreSQL's initdb and postgres (apt-get install postgresql)"]
fn coordinators_starting_at_once_migrate_once_and_never_share_a_generation() {
    let server = ScratchPostgres::start("race").unwrap();
    let url = server.url();
    let generations: Vec<u64> = std::thread::scope(|s| {
        let starts: Vec<_> = (0..4)
            .map(|_| s.spawn(|| Db::connect(&url).unwrap().next_generation().unwrap()))
            .collect();
        starts.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = generations.clone();
    sorted.sort();
    assert_eq!(sorted, [1, 2, 3, 4], "{generations:?}");
}

#[test]
fn a_missing_server_is_a_clear_error_with_no_password_shown() {
    let err = Db::connect("postgres://tessera:hunter2@127.0.0.1:1/farm")
        .err()
        .expect("nothing listens on port 1");
    let text = err.to_string();
    assert!(matches!(err, DbError::Connect(_)), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}
