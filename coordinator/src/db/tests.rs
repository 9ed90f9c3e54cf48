use super::results::FRAMES_SINCE;
use super::*;
use rusqlite::{params, Connection};

/// The SQLite connection of a database these tests opened.
fn lite(db: &Db) -> &Connection {
    db.sql.sqlite().expect("SQLite")
}
use tessera_protocol::job::{Engine, OutputFormat, TileGrid};

/// The virtual machine steps SQLite takes to read the frames of `job`
/// after `after`: what a `wait` poll costs the database.
fn steps_since(db: &Db, job: u64, after: u64) -> (usize, i32) {
    let mut stmt = lite(db).prepare(FRAMES_SINCE).unwrap();
    let n = (stmt.query_map(params![job as i64, after as i64, 1000], |_| Ok(())))
        .unwrap()
        .count();
    (n, stmt.get_status(rusqlite::StatementStatus::VmStep))
}

#[test]
fn new_frames_cost_what_is_new_not_what_the_job_holds() {
    let dir = std::env::temp_dir().join(format!("tessera-db-since-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut db = Db::open(&dir.join("state.sqlite")).unwrap();
    let frame = |frame: u32| StoredFrame {
        frame,
        digest: tessera_protocol::Digest::of(&frame.to_le_bytes()),
        size: 1,
    };
    // Job 1 has 10,000 frames, job 2 has 10; each job's frames are
    // stitched out of order, interleaved with the other's.
    for f in (1..=10_000u32).rev() {
        db.insert_frame(1, &frame(f)).unwrap();
        if f % 1000 == 0 {
            db.insert_frame(2, &frame(f / 1000)).unwrap();
        }
    }
    let all = db.frames_since(1, 0, 20_000).unwrap();
    assert_eq!(all.len(), 10_000);
    let order: Vec<u32> = all.iter().map(|(_, f)| f.frame).collect();
    assert_eq!(order[..3], [10_000, 9_999, 9_998], "in the order stitched");
    let (end_big, end_small) = (all.last().unwrap().0, db.frames_since(2, 0, 99).unwrap());
    assert_eq!(end_small.len(), 10);

    // Three new frames of each, one of them stitched again.
    for (job, f) in [(1, 10_001), (1, 5), (2, 11), (2, 3), (1, 10_002), (2, 12)] {
        db.insert_frame(job, &frame(f)).unwrap();
    }
    let new_big = db.frames_since(1, end_big, 99).unwrap();
    let frames: Vec<u32> = new_big.iter().map(|(_, f)| f.frame).collect();
    assert_eq!(
        frames,
        [10_001, 5, 10_002],
        "only what is new, restitched included"
    );
    assert!(db.frames_since(1, new_big[2].0, 99).unwrap().is_empty());

    // The same work on a job of 10,000 frames as on one of 10.
    let (n_big, steps_big) = steps_since(&db, 1, end_big);
    let (n_small, steps_small) = steps_since(&db, 2, end_small.last().unwrap().0);
    assert_eq!((n_big, n_small), (3, 3));
    println!("steps: {steps_big} on 10,000 frames, {steps_small} on 10");
    assert!(
        steps_big <= steps_small + 10 && steps_big < 200,
        "{steps_big} steps on 10,000 frames, {steps_small} on 10"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

pub(super) fn spec(request_id: Option<&str>) -> JobSpec {
    JobSpec {
        request_id: request_id.map(str::to_string),
        name: "shot".into(),
        engine: Engine::Builtin,
        scene: "a.scene.json".into(),
        manifest: vec![],
        frames: vec![1, 2],
        tiles: TileGrid { cols: 2, rows: 2 },
        sample_ranges: 1,
        samples: 8,
        resolution: (64, 32),
        priority: 0,
        output: OutputFormat::Png,
        blender: None,
        output_name: None,
        unreal: None,
        finish: false,
        verify_percent: 0,
        after: Vec::new(),
        after_failure: Default::default(),
        paused: false,
        deadline_unix_ms: None,
        budget: None,
        task_timeout_ms: None,
        render_format: None,
        encode: None,
        host: None,
        warnings: Vec::new(),
    }
}

#[test]
fn everything_committed_survives_reopening() {
    let dir = std::env::temp_dir().join(format!("tessera-db-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.sqlite");
    let out = Digest::of(b"tile");
    {
        let mut db = Db::open(&path).unwrap();
        assert_eq!(db.next_generation().unwrap(), 1);
        let id = db.insert_job(&spec(Some("req-1")), 1000, 10, 20).unwrap();
        let row = |output, epoch| NewResult {
            job: id,
            index: 3,
            output,
            render_ms: 55,
            worker: "w1",
            epoch,
        };
        assert!(db.insert_result(row(out, 7)).unwrap());
        assert!(!db.insert_result(row(Digest::of(b"other"), 8)).unwrap());
        db.insert_frame(
            id,
            &StoredFrame {
                frame: 1,
                digest: out,
                size: 4,
            },
        )
        .unwrap();
        db.set_state(id, JobState::Running, None, None).unwrap();
    }
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.next_generation().unwrap(), 2);
    let jobs = db.jobs().unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, JobState::Running);
    assert_eq!(
        (jobs[0].bytes_uploaded, jobs[0].bytes_deduplicated),
        (10, 20)
    );
    assert_eq!(db.job_by_request("req-1").unwrap(), Some(jobs[0].id));
    assert_eq!(
        db.results(jobs[0].id).unwrap(),
        vec![StoredResult {
            index: 3,
            output: out,
            render_ms: 55
        }]
    );
    assert_eq!(db.result_range(jobs[0].id, 0, 4).unwrap(), vec![out]);
    assert_eq!(db.frames(jobs[0].id).unwrap()[0].digest, out);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A priority set is in the job's spec when read back; a preview is found
/// by the blob it was made of, and kept exactly while its job is.
#[test]
fn priorities_and_previews_are_kept_with_their_job() {
    let (dir, path) = temp_db("previews");
    let mut db = Db::open(&path).unwrap();
    let id = db.insert_job(&spec(None), 1000, 0, 0).unwrap();
    db.set_priority(id, -4).unwrap();
    assert_eq!(db.job(id).unwrap().unwrap().spec.priority, -4);
    let (frame, again, png) = (
        Digest::of(b"frame"),
        Digest::of(b"again"),
        Digest::of(b"png"),
    );
    assert_eq!(db.preview(id, 1, 0, &frame).unwrap(), None);
    db.set_preview(id, 1, 0, &frame, &Ok(png)).unwrap();
    db.set_preview(id, 1, 3, &frame, &Err("too large".into()))
        .unwrap();
    assert_eq!(db.preview(id, 1, 0, &frame).unwrap(), Some(Ok(png)));
    assert_eq!(
        db.preview(id, 1, 3, &frame).unwrap(),
        Some(Err("too large".into()))
    );
    assert_eq!(
        db.preview(id, 1, 0, &again).unwrap(),
        None,
        "stitched again: made again"
    );
    assert!(
        db.outputs_kept(0).unwrap().contains(&png),
        "kept while the job is"
    );
    db.set_state(id, JobState::Done, Some(5000), None).unwrap();
    assert!(
        db.outputs_kept(4000).unwrap().contains(&png),
        "kept within retention"
    );
    assert!(
        !db.outputs_kept(6000).unwrap().contains(&png),
        "collected with it"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn temp_db(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("tessera-db-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.sqlite");
    (dir, path)
}

#[test]
fn stitched_passes_survive_reopening_apart_from_frames_and_are_kept_by_gc() {
    let (dir, path) = temp_db("passes");
    let passes = Digest::of(b"passes");
    let id = {
        let mut db = Db::open(&path).unwrap();
        let id = db.insert_job(&spec(None), 1000, 0, 0).unwrap();
        db.insert_passes(id, 1, passes, 6).unwrap();
        id
    };
    let db = Db::open(&path).unwrap();
    let stored = db.passes(id).unwrap();
    assert_eq!(
        stored,
        [StoredFrame {
            frame: 1,
            digest: passes,
            size: 6
        }]
    );
    assert!(db.frames(id).unwrap().is_empty(), "clients never see them");
    assert!(db.outputs_kept(0).unwrap().contains(&passes));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_blender_build_is_recorded_once_and_survives_reopening() {
    use tessera_protocol::blender::BlenderVersion;
    use tessera_protocol::build::BuildKind;
    let (dir, path) = temp_db("builds");
    let info = |digest: &[u8], added| BuildInfo {
        digest: Digest::of(digest),
        version: BlenderVersion::new(4, 5, 4),
        kind: BuildKind::Module,
        size: 10,
        files: 2,
        features: vec!["OpenImageDenoise".into()],
        added_unix_ms: added,
        holders: Vec::new(),
    };
    {
        let db = Db::open(&path).unwrap();
        assert_eq!(db.builds().unwrap(), vec![]);
        assert_eq!(db.add_build(&info(b"a", 1)).unwrap(), info(b"a", 1));
        // Added again later: the first record stays.
        assert_eq!(db.add_build(&info(b"a", 2)).unwrap(), info(b"a", 1));
        db.add_build(&info(b"b", 3)).unwrap();
    }
    let db = Db::open(&path).unwrap();
    assert_eq!(db.builds().unwrap(), vec![info(b"a", 1), info(b"b", 3)]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_newer_schema_is_refused_with_a_clear_message() {
    let (dir, path) = temp_db("newer");
    let db = Db::open(&path).unwrap();
    lite(&db)
        .execute("UPDATE meta SET value = 99 WHERE key = 'schema'", [])
        .unwrap();
    drop(db);
    let err = Db::open(&path).err().expect("refused");
    assert!(matches!(err, DbError::Newer { found: 99 }), "{err}");
    assert!(
        err.to_string().contains("written by a newer Tessera"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A data dir as the release before the migrations left it: version 3 in
/// its `meta` row, `user_version` 0, the tables it made whenever missing.
#[test]
fn a_version_three_data_dir_opens_and_is_upgraded_with_what_it_holds() {
    let (dir, path) = temp_db("v3");
    {
        let conn = Connection::open(&path).unwrap();
        let sql = [schema::V1, schema::V2, schema::V3, schema::V4].concat();
        let sql = sql.replace(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 4);",
            "",
        );
        conn.execute_batch(&sql).unwrap();
        conn.execute(
            "INSERT INTO passes (job, frame, digest, size) VALUES (1, 2, ?1, 3)",
            [Digest::of(b"pass").to_hex()],
        )
        .unwrap();
        let v: i64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(v, 3);
    }
    let db = Db::open(&path).unwrap();
    let user: i64 = lite(&db)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let row: i64 = lite(&db)
        .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!((user, row), (SCHEMA_VERSION, SCHEMA_VERSION));
    assert_eq!(db.passes(1).unwrap().len(), 1, "what it held is kept");
    drop(db);
    // And again: nothing left to do.
    Db::open(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_newer_user_version_is_refused_too() {
    let (dir, path) = temp_db("newer-user");
    let db = Db::open(&path).unwrap();
    lite(&db).pragma_update(None, "user_version", 7).unwrap();
    drop(db);
    let err = Db::open(&path).err().expect("refused");
    assert!(matches!(err, DbError::Newer { found: 7 }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_version_one_database_is_migrated_with_its_finished_jobs_counted() {
    let (dir, path) = temp_db("v1");
    {
        // The schema as version 1 wrote it: no version row, no counters.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE jobs (id INTEGER PRIMARY KEY, request_id TEXT UNIQUE, spec TEXT NOT NULL,
                 state TEXT NOT NULL, submitted_ms INTEGER NOT NULL, finished_ms INTEGER,
                 bytes_uploaded INTEGER NOT NULL, bytes_deduplicated INTEGER NOT NULL,
                 error TEXT, cost_usd REAL NOT NULL DEFAULT 0);
             CREATE TABLE results (job INTEGER NOT NULL, idx INTEGER NOT NULL, output TEXT NOT NULL,
                 render_ms INTEGER NOT NULL, worker TEXT NOT NULL, epoch INTEGER NOT NULL,
                 PRIMARY KEY (job, idx));
             CREATE TABLE frames (job INTEGER NOT NULL, frame INTEGER NOT NULL, digest TEXT NOT NULL,
                 size INTEGER NOT NULL, PRIMARY KEY (job, frame));
             INSERT INTO meta VALUES ('generation', 4);",
        )
        .unwrap();
        let json = serde_json::to_string(&spec(None)).unwrap();
        conn.execute(
            "INSERT INTO jobs (id, spec, state, submitted_ms, finished_ms, bytes_uploaded, bytes_deduplicated)
             VALUES (1, ?1, 'done', 10, 20, 0, 0)",
            [json],
        )
        .unwrap();
        let out = Digest::of(b"tile").to_hex();
        for idx in 0..2 {
            conn.execute(
                "INSERT INTO results VALUES (1, ?1, ?2, 30, 'w', 1)",
                params![idx, out],
            )
            .unwrap();
        }
    }
    let mut db = Db::open(&path).unwrap();
    assert_eq!(db.next_generation().unwrap(), 5, "earlier data kept");
    let job = db.job(1).unwrap().expect("job 1");
    let expected = FinalCounts {
        tasks_done: 2,
        frames_done: 0,
        render_ms: 60,
        bytes_to_workers: 0,
    };
    assert_eq!(job.counts, Some(expected));
    assert_eq!(job.status().tasks_done, 2);
    drop(db);
    // Opening it again finds it current.
    assert!(Db::open(&path).is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_finished_job_is_read_back_with_its_counters_and_cost() {
    let (dir, path) = temp_db("finished");
    let mut db = Db::open(&path).unwrap();
    let id = db.insert_job(&spec(None), 1000, 0, 0).unwrap();
    assert!(db.finished_jobs(10).unwrap().is_empty());
    assert_eq!(db.unfinished_jobs().unwrap().len(), 1);
    let counts = FinalCounts {
        tasks_done: 8,
        frames_done: 2,
        render_ms: 900,
        bytes_to_workers: 77,
    };
    db.finish_job(id, JobState::Done, 2000, None, 0.25, counts)
        .unwrap();
    assert!(db.unfinished_jobs().unwrap().is_empty());
    let status = db.finished_jobs(10).unwrap()[0].status();
    assert_eq!(
        (
            status.state,
            status.tasks_done,
            status.tasks_total,
            status.frames_done
        ),
        (JobState::Done, 8, 8, 2)
    );
    assert_eq!(
        (status.cost_usd, status.finished_unix_ms),
        (0.25, Some(2000))
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rows edited by hand (or by a hostile hand): a spec that is not JSON, a
/// negative size, a negative or non-finite cost. Each such job is left out
/// of the lists (the others are all there) and named when asked for alone.
#[test]
fn unreadable_job_rows_are_left_out_of_lists_and_named_alone() {
    let (dir, path) = temp_db("corrupt-rows");
    let mut db = Db::open(&path).unwrap();
    let ids: Vec<u64> = (0..5)
        .map(|i| db.insert_job(&spec(None), 1000 + i, 10, 0).unwrap())
        .collect();
    let sql = db.sql();
    let edit = |statement: &str, id: u64| {
        sql.execute(statement, &args![id as i64]).unwrap();
    };
    edit("UPDATE jobs SET spec = '{' WHERE id = ?1", ids[1]);
    edit("UPDATE jobs SET bytes_uploaded = -5 WHERE id = ?1", ids[2]);
    edit("UPDATE jobs SET cost_usd = -1.5 WHERE id = ?1", ids[3]);
    let listed: Vec<u64> = db.jobs().unwrap().iter().map(|j| j.id).collect();
    assert_eq!(listed, [ids[0], ids[4]]);
    let unfinished: Vec<u64> = (db.unfinished_jobs().unwrap().iter())
        .map(|j| j.id)
        .collect();
    assert_eq!(unfinished, [ids[0], ids[4]]);
    for id in &ids[1..4] {
        let e = db.job(*id).unwrap_err();
        assert!(matches!(e, DbError::Corrupt(n, _) if n == *id), "{e}");
    }
    assert_eq!(db.job(ids[4]).unwrap().unwrap().bytes_uploaded, 10);
    let _ = std::fs::remove_dir_all(&dir);
}
