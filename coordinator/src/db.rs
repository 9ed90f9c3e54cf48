//! Durable state in SQLite: jobs, accepted results, stitched frames. A result
//! is committed here before the worker is told it was accepted, so whatever
//! was acknowledged survives a crash of the coordinator.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};
use tessera_protocol::build::BuildInfo;
use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{log_tail, JobState, JobStatus, TaskLog, Verification};
use tessera_protocol::Digest;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored job {0} is unreadable: {1}")]
    Corrupt(u64, String),
    #[error("the database was written by a newer Tessera (schema version {found}; this build reads up to {SCHEMA_VERSION}): run a newer tessera on this data dir")]
    Newer { found: i64 },
}

/// The schema this build writes. Version 1 had no version row; version 2
/// keeps a finished job's counters in its row, so it is read from there
/// instead of held in memory.
pub const SCHEMA_VERSION: i64 = 3;

pub use tessera_farm::farm::FinalCounts;

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
    /// A finished job's counters (`None` while it runs).
    pub counts: Option<FinalCounts>,
}

impl StoredJob {
    /// The status of a finished job, from its row alone (a job still
    /// running is the farm core's to describe).
    pub fn status(&self) -> JobStatus {
        let counts = self.counts.unwrap_or_default();
        let tasks_per_frame = self.spec.tasks_per_frame();
        JobStatus {
            id: self.id,
            name: self.spec.name.clone(),
            engine: self.spec.engine,
            state: self.state,
            priority: self.spec.priority,
            frames_total: self.spec.frames.len() as u32,
            frames_done: counts.frames_done,
            tasks_total: match &self.spec.unreal {
                Some(u) => u.chunks(&self.spec.frames).len() as u32,
                None => tasks_per_frame * self.spec.frames.len() as u32,
            },
            tasks_done: counts.tasks_done,
            tasks_running: 0,
            bytes_uploaded: self.bytes_uploaded,
            bytes_deduplicated: self.bytes_deduplicated,
            bytes_to_workers: counts.bytes_to_workers,
            render_ms: counts.render_ms,
            submitted_unix_ms: self.submitted_ms,
            finished_unix_ms: self.finished_ms,
            error: self.error.clone(),
            blocked: None,
            cost_usd: self.cost_usd,
            cost_to_finish_usd: None,
            eta_secs: None,
            paused: false,
            verification: None,
            after: self.spec.after.clone(),
            after_failure: self.spec.after_failure,
            waiting_for: Vec::new(),
            deadline_unix_ms: self.spec.deadline_unix_ms,
            budget_usd: self.spec.budget.map(|b| b.usd),
        }
    }
}

/// What a `jobs` row must be for a [`JobFilter`] to possibly match it:
/// the part of the filter the database can check by itself.
///
/// [`JobFilter`]: tessera_protocol::messages::JobFilter
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobRows {
    pub ids: Option<Vec<u64>>,
    pub since_unix_ms: Option<u64>,
    /// `Some(true)`: only finished jobs; `Some(false)`: only active ones.
    /// A row's state is final once the job finished; an active job's row
    /// says `queued` while the core knows whether it runs.
    pub finished: Option<bool>,
}

impl JobRows {
    pub fn for_filter(f: &tessera_protocol::messages::JobFilter) -> JobRows {
        let finals = f.states.iter().filter(|s| s.is_final()).count();
        JobRows {
            ids: (!f.ids.is_empty()).then(|| f.ids.clone()),
            since_unix_ms: f.since_unix_ms,
            finished: match (finals, f.states.len()) {
                (_, 0) => None,
                (n, all) if n == all => Some(true),
                (0, _) => Some(false),
                _ => None,
            },
        }
    }
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
    cost_usd REAL NOT NULL DEFAULT 0,
    tasks_done INTEGER,
    frames_done INTEGER,
    render_ms INTEGER,
    bytes_to_workers INTEGER
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

/// A frame's stitched passes, the input of its finishing task: kept apart
/// from `frames`, so clients never see them as a frame. Created whenever
/// missing (only the finishing step reads it), so it needs no schema
/// version of its own.
const PASSES_TABLE: &str = "CREATE TABLE IF NOT EXISTS passes (
    job INTEGER NOT NULL,
    frame INTEGER NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (job, frame)
);";

/// A job's frames in the order they were stitched: an index on `job` holds
/// `(job, rowid)`, so "the frames of job J after rowid R" is one range seek
/// whatever the job's size (`wait` reads only what is new). A frame
/// stitched again (`INSERT OR REPLACE`) gets a new rowid: it is new again.
/// Created whenever missing, so it needs no schema version of its own.
const FRAMES_BY_SEQ: &str = "CREATE INDEX IF NOT EXISTS frames_by_seq ON frames (job);";
const FRAMES_SINCE: &str = "SELECT rowid, frame, digest, size FROM frames INDEXED BY frames_by_seq
     WHERE job = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3";

/// Version 3: Blender builds shipped through the farm (`blender add`).
const BUILDS_TABLE: &str = "CREATE TABLE IF NOT EXISTS blender_builds (
    digest TEXT PRIMARY KEY,
    info TEXT NOT NULL
);";

/// What workers are trusted with, beside the schema's tables (created when
/// missing; an older coordinator ignores them): the leases handed to each
/// enrolled identity, so that after a restart only that identity adopts
/// them; identities quarantined by `--verify` checks; and each checked
/// job's verification summary once it finished.
const TRUST_TABLES: &str = "
CREATE TABLE IF NOT EXISTS leases (
    job INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    identity TEXT NOT NULL,
    PRIMARY KEY (job, idx, epoch)
);
CREATE TABLE IF NOT EXISTS quarantined (
    identity TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    unix_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS verifications (
    job INTEGER PRIMARY KEY,
    summary TEXT NOT NULL
);";

/// A job's holds as last changed by `pause`/`resume` (`released`: resumed
/// while a failed dependency held it, so it runs without it). Created
/// when missing, so it needs no schema version of its own; a job without a
/// row is as its spec says (`submit --paused`).
const HOLDS_TABLE: &str = "CREATE TABLE IF NOT EXISTS job_holds (
    job INTEGER PRIMARY KEY,
    paused INTEGER NOT NULL,
    released INTEGER NOT NULL
);";

/// What the finished jobs of one state add up to (see
/// [`Db::finished_totals`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FinishedTotals {
    pub jobs: u64,
    pub tasks_done: u64,
    pub bytes_uploaded: u64,
    pub bytes_deduplicated: u64,
    pub bytes_to_workers: u64,
    pub cost_usd: f64,
}

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

/// Brings the schema to [`SCHEMA_VERSION`]: creates it in a new database,
/// migrates an older one, and refuses a newer one.
fn migrate(conn: &Connection) -> Result<(), DbError> {
    let has_jobs: bool = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)?;
    let version: i64 = if has_jobs {
        conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
            r.get(0)
        })
        .optional()?
        .unwrap_or(1)
    } else {
        0
    };
    if version > SCHEMA_VERSION {
        return Err(DbError::Newer { found: version });
    }
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    let tx = conn.unchecked_transaction()?;
    if version == 0 {
        tx.execute_batch(SCHEMA)?;
    }
    if version == 1 {
        // Version 2: a finished job's counters live in its row.
        tx.execute_batch(
            "ALTER TABLE jobs ADD COLUMN tasks_done INTEGER;
             ALTER TABLE jobs ADD COLUMN frames_done INTEGER;
             ALTER TABLE jobs ADD COLUMN render_ms INTEGER;
             ALTER TABLE jobs ADD COLUMN bytes_to_workers INTEGER;
             UPDATE jobs SET
                 bytes_to_workers = 0,
                 tasks_done = (SELECT COUNT(*) FROM results WHERE results.job = jobs.id),
                 frames_done = (SELECT COUNT(*) FROM frames WHERE frames.job = jobs.id),
                 render_ms = (SELECT COALESCE(SUM(render_ms), 0) FROM results WHERE results.job = jobs.id)
             WHERE state IN ('done', 'failed', 'canceled');",
        )?;
    }
    if version < 3 {
        tx.execute_batch(BUILDS_TABLE)?;
    }
    tx.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?1)",
        [SCHEMA_VERSION],
    )?;
    tx.commit()?;
    Ok(())
}

const JOB_COLUMNS: &str = "id, spec, state, submitted_ms, finished_ms, bytes_uploaded, bytes_deduplicated, error, cost_usd, tasks_done, frames_done, render_ms, bytes_to_workers";

/// One `jobs` row, selected with [`JOB_COLUMNS`].
fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(u64, String, StoredJobRest)> {
    let counts = match (
        r.get::<_, Option<i64>>(9)?,
        r.get::<_, Option<i64>>(10)?,
        r.get::<_, Option<i64>>(11)?,
        r.get::<_, Option<i64>>(12)?,
    ) {
        (Some(t), Some(f), Some(ms), sent) => Some(FinalCounts {
            tasks_done: t as u32,
            frames_done: f as u32,
            render_ms: ms as u64,
            bytes_to_workers: sent.unwrap_or(0) as u64,
        }),
        _ => None,
    };
    Ok((
        r.get::<_, i64>(0)? as u64,
        r.get::<_, String>(1)?,
        StoredJobRest {
            state: parse_state(&r.get::<_, String>(2)?),
            submitted_ms: r.get::<_, i64>(3)? as u64,
            finished_ms: r.get::<_, Option<i64>>(4)?.map(|v| v as u64),
            bytes_uploaded: r.get::<_, i64>(5)? as u64,
            bytes_deduplicated: r.get::<_, i64>(6)? as u64,
            error: r.get(7)?,
            cost_usd: r.get(8)?,
            counts,
        },
    ))
}

/// A job row but its id and spec.
struct StoredJobRest {
    state: JobState,
    submitted_ms: u64,
    finished_ms: Option<u64>,
    bytes_uploaded: u64,
    bytes_deduplicated: u64,
    error: Option<String>,
    cost_usd: f64,
    counts: Option<FinalCounts>,
}

fn stored_job((id, spec, rest): (u64, String, StoredJobRest)) -> Result<StoredJob, DbError> {
    let spec: JobSpec =
        serde_json::from_str(&spec).map_err(|e| DbError::Corrupt(id, e.to_string()))?;
    Ok(StoredJob {
        id,
        spec,
        state: rest.state,
        submitted_ms: rest.submitted_ms,
        finished_ms: rest.finished_ms,
        bytes_uploaded: rest.bytes_uploaded,
        bytes_deduplicated: rest.bytes_deduplicated,
        error: rest.error,
        cost_usd: rest.cost_usd,
        counts: rest.counts,
    })
}

impl Db {
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let conn = Connection::open(path)?;
        // WAL + FULL: a committed transaction survives a crash of the process
        // and of the machine.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        migrate(&conn)?;
        conn.execute_batch(PASSES_TABLE)?;
        conn.execute_batch(TRUST_TABLES)?;
        conn.execute_batch(HOLDS_TABLE)?;
        conn.execute_batch(FRAMES_BY_SEQ)?;
        Ok(Db { conn })
    }

    /// Copies the WAL into the main database file and empties it, so the
    /// main file alone holds every commit up to now (a lost or deleted WAL
    /// then loses only what was committed since).
    /// An empty WAL is left alone: at rest the coordinator writes nothing
    /// (truncating even an empty file updates its times).
    pub fn checkpoint(&self) -> Result<(), DbError> {
        let frames: i64 =
            (self.conn).query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))?;
        if frames > 0 {
            self.conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(())
    }

    /// The connection, for the tables kept by other modules (identities).
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
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

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<StoredJob>, DbError> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id"))?;
        let rows = stmt.query_map([], job_row)?;
        rows.map(|row| stored_job(row?)).collect()
    }

    /// Up to `limit` jobs with ids above `after`, in id order: a long scan
    /// in pages, so that the lock on the database is held briefly.
    pub fn jobs_page(&self, after: u64, limit: u32) -> Result<Vec<StoredJob>, DbError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![after as i64, limit], job_row)?;
        rows.map(|row| stored_job(row?)).collect()
    }

    /// Puts a failed job back to `queued` (no error, no final counters);
    /// false when it is not failed.
    pub fn reopen_failed_job(&mut self, job: u64) -> Result<bool, DbError> {
        let n = self.conn.execute(
            "UPDATE jobs SET state = 'queued', finished_ms = NULL, error = NULL,
                 tasks_done = NULL, frames_done = NULL, render_ms = NULL, bytes_to_workers = NULL
             WHERE id = ?1 AND state = 'failed'",
            [job as i64],
        )?;
        Ok(n == 1)
    }

    /// Up to `limit` jobs with ids above `after` that `rows` lets through,
    /// in id order (the coarse part of a [`JobFilter`]; the caller checks
    /// the rest on each job's status).
    ///
    /// [`JobFilter`]: tessera_protocol::messages::JobFilter
    pub fn jobs_where(
        &self,
        rows: &JobRows,
        after: u64,
        limit: u32,
    ) -> Result<Vec<StoredJob>, DbError> {
        let mut sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id > ?1");
        if let Some(ids) = &rows.ids {
            let list: Vec<String> = ids.iter().map(|i| (*i as i64).to_string()).collect();
            sql += &format!(" AND id IN ({})", list.join(","));
        }
        if let Some(since) = rows.since_unix_ms {
            sql += &format!(" AND submitted_ms >= {}", since.min(i64::MAX as u64));
        }
        match rows.finished {
            Some(true) => sql += " AND state IN ('done', 'failed', 'canceled')",
            Some(false) => sql += " AND state NOT IN ('done', 'failed', 'canceled')",
            None => {}
        }
        sql += " ORDER BY id LIMIT ?2";
        let mut stmt = self.conn.prepare(&sql)?;
        let after = after.min(i64::MAX as u64) as i64;
        let rows = stmt.query_map(params![after, limit], job_row)?;
        rows.map(|row| stored_job(row?)).collect()
    }

    /// Every task output and frame of the jobs that are not finished, or
    /// finished after `finished_after` (unix ms): what garbage collection
    /// keeps besides the jobs' files.
    pub fn outputs_kept(&self, finished_after: u64) -> Result<Vec<Digest>, DbError> {
        let kept = "SELECT id FROM jobs WHERE state NOT IN ('done', 'failed', 'canceled')
                    OR finished_ms IS NULL OR finished_ms > ?1";
        let mut out = Vec::new();
        for table in [
            "SELECT output FROM results",
            "SELECT digest FROM frames",
            "SELECT digest FROM passes",
        ] {
            let mut stmt = self
                .conn
                .prepare(&format!("{table} WHERE job IN ({kept})"))?;
            let rows = stmt.query_map([finished_after as i64], |r| digest_col(r, 0))?;
            for row in rows {
                out.push(row?);
            }
        }
        Ok(out)
    }

    /// Records a Blender build (`blender add`); adding the same build again
    /// keeps the first record.
    pub fn add_build(&self, info: &BuildInfo) -> Result<BuildInfo, DbError> {
        let json = serde_json::to_string(info).expect("a build serialises");
        self.conn.execute(
            "INSERT OR IGNORE INTO blender_builds (digest, info) VALUES (?1, ?2)",
            rusqlite::params![info.digest.to_hex(), json],
        )?;
        Ok(self
            .builds()?
            .into_iter()
            .find(|b| b.digest == info.digest)
            .expect("just recorded"))
    }

    /// Every Blender build recorded, oldest first.
    pub fn builds(&self) -> Result<Vec<BuildInfo>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT info FROM blender_builds ORDER BY rowid")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for row in rows {
            let info = serde_json::from_str(&row?).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    0,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?;
            out.push(info);
        }
        Ok(out)
    }

    /// Jobs still queued or running (the ones a restart resumes).
    pub fn unfinished_jobs(&self) -> Result<Vec<StoredJob>, DbError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state NOT IN ('done', 'failed', 'canceled') ORDER BY id"
        ))?;
        let rows = stmt.query_map([], job_row)?;
        rows.map(|row| stored_job(row?)).collect()
    }

    /// Totals over every finished job, per final state, summed by SQLite:
    /// no job is read into memory (for `/metrics`).
    pub fn finished_totals(&self) -> Result<Vec<(JobState, FinishedTotals)>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT state, COUNT(*), SUM(COALESCE(tasks_done, 0)), SUM(bytes_uploaded),
                    SUM(bytes_deduplicated), SUM(COALESCE(bytes_to_workers, 0)), SUM(cost_usd)
             FROM jobs WHERE state IN ('done', 'failed', 'canceled') GROUP BY state",
        )?;
        let rows = stmt.query_map([], |r| {
            let n = |i: usize| {
                r.get::<_, Option<i64>>(i)
                    .map(|v| v.unwrap_or(0).max(0) as u64)
            };
            Ok((
                parse_state(&r.get::<_, String>(0)?),
                FinishedTotals {
                    jobs: n(1)?,
                    tasks_done: n(2)?,
                    bytes_uploaded: n(3)?,
                    bytes_deduplicated: n(4)?,
                    bytes_to_workers: n(5)?,
                    cost_usd: r.get::<_, Option<f64>>(6)?.unwrap_or(0.0),
                },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Finished jobs, newest first, at most `limit`.
    pub fn finished_jobs(&self, limit: u32) -> Result<Vec<StoredJob>, DbError> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('done', 'failed', 'canceled') ORDER BY id DESC LIMIT ?1"
        ))?;
        let rows = stmt.query_map([limit], job_row)?;
        rows.map(|row| stored_job(row?)).collect()
    }

    /// A job's state, if there is a job with that id.
    pub fn job_state(&self, id: u64) -> Result<Option<JobState>, DbError> {
        let state: Option<String> = self
            .conn
            .query_row("SELECT state FROM jobs WHERE id = ?1", [id as i64], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(state.map(|s| parse_state(&s)))
    }

    /// Records a job's holds (see [`HOLDS_TABLE`]).
    pub fn set_holds(&self, job: u64, paused: bool, released: bool) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT OR REPLACE INTO job_holds (job, paused, released) VALUES (?1, ?2, ?3)",
            params![job as i64, paused, released],
        )?;
        Ok(())
    }

    /// A job's holds as last recorded: (paused, released), `None` when
    /// never paused or resumed.
    pub fn holds(&self, job: u64) -> Result<Option<(bool, bool)>, DbError> {
        Ok(self
            .conn
            .query_row(
                "SELECT paused, released FROM job_holds WHERE job = ?1",
                [job as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// One job, if there is one with that id.
    pub fn job(&self, id: u64) -> Result<Option<StoredJob>, DbError> {
        let row = self
            .conn
            .query_row(
                &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
                [id as i64],
                job_row,
            )
            .optional()?;
        row.map(stored_job).transpose()
    }

    /// Records a job's final state with its cost and counters.
    pub fn finish_job(
        &mut self,
        job: u64,
        state: JobState,
        finished_ms: u64,
        error: Option<&str>,
        cost_usd: f64,
        counts: FinalCounts,
    ) -> Result<(), DbError> {
        self.conn.execute(
            "UPDATE jobs SET state = ?2, finished_ms = ?3, error = ?4, cost_usd = ?5,
                 tasks_done = ?6, frames_done = ?7, render_ms = ?8, bytes_to_workers = ?9
             WHERE id = ?1",
            params![
                job as i64,
                state_name(state),
                finished_ms as i64,
                error,
                cost_usd,
                counts.tasks_done,
                counts.frames_done,
                counts.render_ms as i64,
                counts.bytes_to_workers as i64
            ],
        )?;
        self.conn
            .execute("DELETE FROM leases WHERE job = ?1", [job as i64])?;
        Ok(())
    }

    /// Records leases handed out (task, epoch, identity).
    pub fn record_leases(&mut self, leases: &[(u64, u32, u64, String)]) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO leases (job, idx, epoch, identity) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (job, idx, epoch, identity) in leases {
                stmt.execute(params![*job as i64, idx, *epoch as i64, identity])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The leases of `job` that no committed result ended: (task, epoch,
    /// identity).
    pub fn open_leases(&self, job: u64) -> Result<Vec<(u32, u64, String)>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT l.idx, l.epoch, l.identity FROM leases l WHERE l.job = ?1
             AND NOT EXISTS (SELECT 1 FROM results r WHERE r.job = l.job AND r.idx = l.idx)",
        )?;
        let rows = stmt.query_map([job as i64], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get(2)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Withdraws committed results of `job` and the frames they made.
    pub fn withdraw(&mut self, job: u64, tasks: &[u32], frames: &[u32]) -> Result<(), DbError> {
        let tx = self.conn.transaction()?;
        for idx in tasks {
            tx.execute(
                "DELETE FROM results WHERE job = ?1 AND idx = ?2",
                params![job as i64, idx],
            )?;
        }
        for frame in frames {
            tx.execute(
                "DELETE FROM frames WHERE job = ?1 AND frame = ?2",
                params![job as i64, frame],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn quarantine(
        &self,
        identity: &str,
        name: &str,
        reason: &str,
        unix_ms: u64,
    ) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT OR IGNORE INTO quarantined (identity, name, reason, unix_ms) VALUES (?1, ?2, ?3, ?4)",
            params![identity, name, reason, unix_ms as i64],
        )?;
        Ok(())
    }

    /// Every quarantined identity with its reason.
    pub fn quarantined(&self) -> Result<Vec<(String, String)>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT identity, reason FROM quarantined")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Keeps a finished job's verification summary.
    pub fn set_verification(&self, job: u64, summary: &Verification) -> Result<(), DbError> {
        let text = serde_json::to_string(summary).expect("a summary serializes");
        self.conn.execute(
            "INSERT OR REPLACE INTO verifications (job, summary) VALUES (?1, ?2)",
            params![job as i64, text],
        )?;
        Ok(())
    }

    pub fn verification(&self, job: u64) -> Result<Option<Verification>, DbError> {
        let text: Option<String> = self
            .conn
            .query_row(
                "SELECT summary FROM verifications WHERE job = ?1",
                [job as i64],
                |r| r.get(0),
            )
            .optional()?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
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

    /// Records a frame's stitched passes (its finishing task's input).
    pub fn insert_passes(
        &mut self,
        job: u64,
        frame: u32,
        digest: Digest,
        size: u64,
    ) -> Result<(), DbError> {
        self.conn.execute(
            "INSERT OR REPLACE INTO passes (job, frame, digest, size) VALUES (?1, ?2, ?3, ?4)",
            params![job as i64, frame, digest.to_hex(), size as i64],
        )?;
        Ok(())
    }

    /// The stitched passes of `job`'s frames that have them.
    pub fn passes(&self, job: u64) -> Result<Vec<StoredFrame>, DbError> {
        let mut stmt = self
            .conn
            .prepare("SELECT frame, digest, size FROM passes WHERE job = ?1 ORDER BY frame")?;
        let rows = stmt.query_map([job as i64], |r| {
            Ok(StoredFrame {
                frame: r.get(0)?,
                digest: digest_col(r, 1)?,
                size: r.get::<_, i64>(2)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
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
    /// Up to `limit` failed attempts' logs after cursor `after`, each with
    /// its cursor.
    pub fn task_logs_page(
        &self,
        job: u64,
        task: Option<u32>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<(u64, TaskLog)>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT rowid, idx, worker, unix_ms, error, log FROM task_logs
             WHERE job = ?1 AND (?2 IS NULL OR idx = ?2) AND rowid > ?3 ORDER BY rowid LIMIT ?4",
        )?;
        let rows = stmt.query_map(params![job as i64, task, after as i64, limit], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                TaskLog {
                    task: r.get(1)?,
                    worker: r.get::<_, i64>(2)? as u64,
                    unix_ms: r.get::<_, i64>(3)? as u64,
                    error: r.get(4)?,
                    log: r.get(5)?,
                },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

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

    /// The latest `limit` failed attempts of a job (newest last) without
    /// their logs, and how many there are in all: (task, worker, unix ms,
    /// error).
    #[allow(clippy::type_complexity)]
    pub fn attempts(
        &self,
        job: u64,
        limit: u32,
    ) -> Result<(Vec<(u32, u64, u64, String)>, u32), DbError> {
        let total: i64 = self.conn.query_row(
            "SELECT COUNT(*) FROM task_logs WHERE job = ?1",
            [job as i64],
            |r| r.get(0),
        )?;
        let mut stmt = self.conn.prepare(
            "SELECT idx, worker, unix_ms, error FROM task_logs
             WHERE job = ?1 ORDER BY rowid DESC LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![job as i64, limit], |r| {
            Ok((
                r.get::<_, u32>(0)?,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)? as u64,
                r.get::<_, String>(3)?,
            ))
        })?;
        let mut out: Vec<_> = rows.collect::<Result<_, _>>()?;
        out.reverse();
        Ok((out, total as u32))
    }

    /// Who rendered a job's accepted results: (worker name, results, Σ
    /// render ms), most results first.
    pub fn result_workers(&self, job: u64) -> Result<Vec<(String, u32, u64)>, DbError> {
        let mut stmt = self.conn.prepare(
            "SELECT worker, COUNT(*), COALESCE(SUM(render_ms), 0) FROM results
             WHERE job = ?1 GROUP BY worker ORDER BY COUNT(*) DESC, worker",
        )?;
        let rows = stmt.query_map([job as i64], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)? as u32,
                r.get::<_, i64>(2)? as u64,
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// At most `limit` of a job's frames stitched after the cursor `after`
    /// (0 first), in the order they were stitched, each with its cursor.
    /// Reads only those rows: the work is O(what is new), not O(the job).
    pub fn frames_since(
        &self,
        job: u64,
        after: u64,
        limit: u32,
    ) -> Result<Vec<(u64, StoredFrame)>, DbError> {
        let mut stmt = self.conn.prepare_cached(FRAMES_SINCE)?;
        let rows = stmt.query_map(
            params![job as i64, after.min(i64::MAX as u64) as i64, limit],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    StoredFrame {
                        frame: r.get(1)?,
                        digest: digest_col(r, 2)?,
                        size: r.get::<_, i64>(3)? as u64,
                    },
                ))
            },
        )?;
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

    /// The virtual machine steps SQLite takes to read the frames of `job`
    /// after `after`: what a `wait` poll costs the database.
    fn steps_since(db: &Db, job: u64, after: u64) -> (usize, i32) {
        let mut stmt = db.conn.prepare(FRAMES_SINCE).unwrap();
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
        db.conn
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
}
