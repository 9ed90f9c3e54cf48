//! Durable state in SQLite: jobs, accepted results, stitched frames. A result
//! is committed here before the worker is told it was accepted, so whatever
//! was acknowledged survives a crash of the coordinator.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{log_tail, JobState, TaskLog};
use tessera_protocol::Digest;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored job {0} is unreadable: {1}")]
    Corrupt(u64, String),
}

/// A job as stored.
#[derive(Debug, Clone)]
pub struct StoredJob {
    pub id: u64,
    pub spec: JobSpec,
    pub state: JobState,
    pub submitted_ms: u64,
    pub finished_ms: Option<u64>,
    pub bytes_uploaded: u64,
    pub bytes_deduplicated: u64,
    pub error: Option<String>,
    /// Cost of the job's ended leases, as last recorded.
    pub cost_usd: f64,
}

/// A result to commit.
#[derive(Debug, Clone)]
pub struct NewResult<'a> {
    pub job: u64,
    pub index: u32,
    pub output: Digest,
    pub render_ms: u64,
    pub worker: &'a str,
    pub epoch: u64,
}

/// An accepted task result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub index: u32,
    pub output: Digest,
    pub render_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredFrame {
    pub frame: u32,
    pub digest: Digest,
    pub size: u64,
}

pub struct Db {
    conn: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    request_id TEXT UNIQUE,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_ms INTEGER NOT NULL,
    finished_ms INTEGER,
    bytes_uploaded INTEGER NOT NULL,
    bytes_deduplicated INTEGER NOT NULL,
    error TEXT,
    cost_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS results (
    job INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    output TEXT NOT NULL,
    render_ms INTEGER NOT NULL,
    worker TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    PRIMARY KEY (job, idx)
);
CREATE TABLE IF NOT EXISTS frames (
    job INTEGER NOT NULL,
    frame INTEGER NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (job, frame)
);
CREATE TABLE IF NOT EXISTS task_logs (
    job INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    worker INTEGER NOT NULL,
    unix_ms INTEGER NOT NULL,
    error TEXT NOT NULL,
    log TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS task_logs_job ON task_logs (job, idx);
";

fn state_name(s: JobState) -> &'static str {
    s.name()
}

fn parse_state(s: &str) -> JobState {
    match s {
        "running" => JobState::Running,
        "done" => JobState::Done,
        "failed" => JobState::Failed,
        "canceled" => JobState::Canceled,
        _ => JobState::Queued,
    }
}

fn digest_col(row: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Digest> {
    let s: String = row.get(i)?;
    s.parse().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
    })
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let conn = Connection::open(path)?;
        // WAL + FULL: a committed transaction survives a crash of the process
        // and of the machine.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Db { conn })
    }

    /// Increments and returns the start counter; epochs of this run start at
    /// `generation << 32`, above every epoch of earlier runs.
    pub fn next_generation(&mut self) -> Result<u64, DbError> {
        let tx = self.conn.transaction()?;
        let current: Option<i64> = tx
            .query_row("SELECT value FROM meta WHERE key = 'generation'", [], |r| {
                r.get(0)
            })
            .optional()?;
        let next = current.unwrap_or(0) + 1;
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('generation', ?1)",
            [next],
        )?;
        tx.commit()?;
        Ok(next as u64)
    }

    pub fn job_by_request(&self, request_id: &str) -> Result<Option<u64>, DbError> {
        Ok(self
            .conn
            .query_row(
                "SELECT id FROM jobs WHERE request_id = ?1",
                [request_id],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|id| id as u64))
    }

    /// Inserts a new job; returns its id.
    pub fn insert_job(
        &mut self,
        spec: &JobSpec,
        submitted_ms: u64,
        bytes_uploaded: u64,
        bytes_deduplicated: u64,
    ) -> Result<u64, DbError> {
        let json = serde_json::to_string(spec).expect("job specs serialise");
        self.conn.execute(
            "INSERT INTO jobs (request_id, spec, state, submitted_ms, bytes_uploaded, bytes_deduplicated)
             VALUES (?1, ?2, 'queued', ?3, ?4, ?5)",
            params![spec.request_id, json, submitted_ms as i64, bytes_uploaded as i64, bytes_deduplicated as i64],
        )?;
        Ok(self.conn.last_insert_rowid() as u64)
    }

    pub fn set_state(
        &mut self,
        job: u64,
        state: JobState,
        finished_ms: Option<u64>,
        error: Option<&str>,
    ) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE jobs SET state = ?2, finished_ms = ?3, error = ?4 WHERE id = ?1",
            params![
                job as i64,
                state_name(state),
                finished_ms.map(|m| m as i64),
                error
            ],
        )?;
        Ok(())
    }

    pub fn jobs(&self) -> Result<Vec<StoredJob>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, spec, state, submitted_ms, finished_ms, bytes_uploaded, bytes_deduplicated, error, cost_usd
             FROM jobs ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)? as u64,
                r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
                r.get::<_, i64>(5)? as u64,
                r.get::<_, i64>(6)? as u64,
                r.get::<_, Option<String>>(7)?,
                r.get::<_, f64>(8)?,
            ))
        })?;
        let mut jobs = Vec::new();
        for row in rows {
            let (id, spec, state, submitted_ms, finished_ms, up, dedup, error, cost_usd) = row?;
            let spec: JobSpec =
                serde_json::from_str(&spec).map_err(|e| DbError::Corrupt(id, e.to_string()))?;
            jobs.push(StoredJob {
                id,
                spec,
                state: parse_state(&state),
                submitted_ms,
                finished_ms,
                bytes_uploaded: up,
                bytes_deduplicated: dedup,
                error,
                cost_usd,
            });
        }
        Ok(jobs)
    }

    /// Commits one accepted result. Returns false if the task already had
    /// one (it is then left untouched).
    pub fn insert_result(&mut self, row: NewResult<'_>) -> Result<bool, DbError> {
        Ok(self.insert_results(&[row], &[])?[0])
    }

    /// Commits a batch of accepted results in one transaction (group
    /// commit), with the jobs' costs so far. Returns, per row, whether it was
    /// new.
    pub fn insert_results(
        &mut self,
        rows: &[NewResult<'_>],
        costs: &[(u64, f64)],
    ) -> Result<Vec<bool>, DbError> {
        let tx = self.conn.transaction()?;
        for (job, cost) in costs {
            tx.execute(
                "UPDATE jobs SET cost_usd = ?2 WHERE id = ?1",
                params![*job as i64, cost],
            )?;
        }
        let mut fresh = Vec::with_capacity(rows.len());
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO results (job, idx, output, render_ms, worker, epoch)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for r in rows {
                let n = stmt.execute(params![
                    r.job as i64,
                    r.index,
                    r.output.to_hex(),
                    r.render_ms as i64,
                    r.worker,
                    r.epoch as i64
                ])?;
                fresh.push(n == 1);
            }
        }
        tx.commit()?;
        Ok(fresh)
    }

    pub fn results(&self, job: u64) -> Result<Vec<StoredResult>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT idx, output, render_ms FROM results WHERE job = ?1 ORDER BY idx")?;
        let rows = stmt.query_map([job as i64], |r| {
            Ok(StoredResult {
                index: r.get(0)?,
                output: digest_col(r, 1)?,
                render_ms: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Outputs of the tasks `first..first+count` of a job, in index order.
    pub fn result_range(&self, job: u64, first: u32, count: u32) -> Result<Vec<Digest>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT output FROM results WHERE job = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
        )?;
        let rows = stmt.query_map(params![job as i64, first, first + count], |r| {
            digest_col(r, 0)
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn insert_frame(&mut self, job: u64, frame: &StoredFrame) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT OR REPLACE INTO frames (job, frame, digest, size) VALUES (?1, ?2, ?3, ?4)",
            params![
                job as i64,
                frame.frame,
                frame.digest.to_hex(),
                frame.size as i64
            ],
        )?;
        Ok(())
    }

    /// Keeps a failed attempt's error and renderer log (cut to
    /// `MAX_TASK_LOG` bytes) for `tessera logs`.
    pub fn insert_task_log(&mut self, job: u64, entry: &TaskLog) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT INTO task_logs (job, idx, worker, unix_ms, error, log) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                job as i64,
                entry.task,
                entry.worker as i64,
                entry.unix_ms as i64,
                entry.error,
                log_tail(&entry.log)
            ],
        )?;
        Ok(())
    }

    /// The failed attempts of `job` (of task `task` only, if given), oldest first.
    pub fn task_logs(&self, job: u64, task: Option<u32>) -> Result<Vec<TaskLog>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT idx, worker, unix_ms, error, log FROM task_logs
             WHERE job = ?1 AND (?2 IS NULL OR idx = ?2) ORDER BY rowid",
        )?;
        let rows = stmt.query_map(params![job as i64, task], |r| {
            Ok(TaskLog {
                task: r.get(0)?,
                worker: r.get::<_, i64>(1)? as u64,
                unix_ms: r.get::<_, i64>(2)? as u64,
                error: r.get(3)?,
                log: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn frames(&self, job: u64) -> Result<Vec<StoredFrame>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT frame, digest, size FROM frames WHERE job = ?1 ORDER BY frame")?;
        let rows = stmt.query_map([job as i64], |r| {
            Ok(StoredFrame {
                frame: r.get(0)?,
                digest: digest_col(r, 1)?,
                size: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::job::{Engine, OutputFormat, TileGrid};

    fn spec(request_id: Option<&str>) -> JobSpec {
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
            output_name: None,
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
}
