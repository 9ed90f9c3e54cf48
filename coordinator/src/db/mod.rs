//! Durable state: jobs, accepted results, stitched frames, in SQLite (the
//! data dir's `state.sqlite`, the default) or PostgreSQL (`--state
//! postgres://…`), through one set of statements ([`sql`]). A result is
//! committed here before the worker is told it was accepted, so whatever
//! was acknowledged survives a crash of the coordinator.

use std::path::Path;

use tessera_protocol::build::BuildInfo;
use tessera_protocol::job::JobSpec;
use tessera_protocol::messages::{log_tail, JobState, JobStatus, TaskLog, Verification};
use tessera_protocol::Digest;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL error: {}", sql::chain(.0))]
    Postgres(#[from] postgres::Error),
    #[error("cannot connect to PostgreSQL at {0}")]
    Connect(String),
    #[error("unexpected value in the database: {0}")]
    Column(String),
    #[error("stored job {0} is unreadable: {1}")]
    Corrupt(u64, String),
    #[error("the database was written by a newer Tessera (schema version {found}; this build reads up to {SCHEMA_VERSION}): run a newer tessera on this data dir")]
    Newer { found: i64 },
    #[error("the database cannot be migrated: {0}")]
    Migration(String),
    #[error("this coordinator no longer serves the farm: the coordinator of generation {holder} took it over")]
    Fenced { holder: u64 },
    #[error("this coordinator's lease on the farm ended (the database was out of reach): waiting to renew it")]
    LeaseLapsed,
}

impl DbError {
    /// True when the failure is not the work's fault: the database could
    /// not be reached, or this coordinator no longer serves the farm. Work
    /// that failed so is done again, never failed.
    pub fn is_transient(&self) -> bool {
        self.is_unreachable() || matches!(self, DbError::Fenced { .. })
    }

    /// True when the database could not be reached (PostgreSQL restarted,
    /// failed over or cut off): the same call may succeed a moment later.
    pub fn is_unreachable(&self) -> bool {
        use postgres::error::SqlState;
        match self {
            // The lease ended while the database was out of reach: the
            // lease keeper renews it when it can (nobody else took it).
            DbError::Connect(_) | DbError::LeaseLapsed => true,
            DbError::Postgres(e) => {
                e.is_closed()
                    // "error communicating with the server": its socket died.
                    || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
                    || e.code().is_some_and(|c| {
                        c.code().starts_with("08")
                            || [
                                SqlState::ADMIN_SHUTDOWN,
                                SqlState::CRASH_SHUTDOWN,
                                SqlState::CANNOT_CONNECT_NOW,
                            ]
                            .contains(c)
                    })
            }
            _ => false,
        }
    }
}

/// The schema this build writes (the migrations in `schema.rs` say what
/// each version added).
pub const SCHEMA_VERSION: i64 = 6;

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
    sql: Sql,
    /// The generation results are committed under, on a farm whose
    /// coordinators share the database (see `lease.rs`).
    fence: Option<u64>,
}

#[cfg(test)]
mod both;
mod jobs;
mod lease;
mod results;
mod schema;
pub(crate) mod sql;
#[cfg(test)]
mod tests;
mod trust;

pub use lease::{Claim, Holder};
pub use schema::migrate;
use sql::{args, Row, Sql};

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

const JOB_COLUMNS: &str = "id, spec, state, submitted_ms, finished_ms, bytes_uploaded, bytes_deduplicated, error, cost_usd, tasks_done, frames_done, render_ms, bytes_to_workers";

/// One `jobs` row, selected with [`JOB_COLUMNS`]. A count, size or time
/// below zero, or a cost that is not a finite amount ≥ 0, makes the row
/// unreadable: nothing the coordinator writes is so.
fn job_row(r: &Row) -> Result<(u64, String, StoredJobRest), DbError> {
    let id = r.u64(0)?;
    let bad = |what: &str| DbError::Corrupt(id, format!("its {what} is out of range"));
    let count = |i: usize, what: &str| -> Result<Option<u64>, DbError> {
        r.opt_int(i)?
            .map(|v| u64::try_from(v).map_err(|_| bad(what)))
            .transpose()
    };
    let small = |v: u64, what: &str| u32::try_from(v).map_err(|_| bad(what));
    let counts = match (
        count(9, "tasks done")?,
        count(10, "frames done")?,
        count(11, "render time")?,
        count(12, "bytes sent")?,
    ) {
        (Some(t), Some(f), Some(ms), sent) => Some(FinalCounts {
            tasks_done: small(t, "tasks done")?,
            frames_done: small(f, "frames done")?,
            render_ms: ms,
            bytes_to_workers: sent.unwrap_or(0),
        }),
        _ => None,
    };
    let cost_usd = r.real(8)?;
    if !cost_usd.is_finite() || cost_usd < 0.0 {
        return Err(bad("cost"));
    }
    let required = |i: usize, what: &str| count(i, what)?.ok_or_else(|| bad(what));
    Ok((
        id,
        r.text(1)?,
        StoredJobRest {
            state: parse_state(&r.text(2)?),
            submitted_ms: required(3, "submit time")?,
            finished_ms: count(4, "finish time")?,
            bytes_uploaded: required(5, "bytes uploaded")?,
            bytes_deduplicated: required(6, "bytes deduplicated")?,
            error: r.opt_text(7)?,
            cost_usd,
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

/// The jobs of rows selected with [`JOB_COLUMNS`]. A row that cannot be
/// read (edited by hand, or by a hostile hand) is left out, saying which:
/// one bad row does not hide every other job. It stays in the database.
fn stored_jobs(rows: Vec<Row>) -> Result<Vec<StoredJob>, DbError> {
    let mut jobs = Vec::with_capacity(rows.len());
    for r in &rows {
        match job_row(r).and_then(stored_job) {
            Ok(job) => jobs.push(job),
            Err(e) => tracing::error!("left out of the job list: {e}"),
        }
    }
    Ok(jobs)
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
    /// Opens (or creates) the SQLite database at `path`.
    pub fn open(path: &Path) -> Result<Db, DbError> {
        let mut conn = rusqlite::Connection::open(path)?;
        // WAL + FULL: a committed transaction survives a crash of the process
        // and of the machine.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.set_prepared_statement_cache_capacity(64);
        migrate(&mut conn)?;
        Ok(Db {
            sql: Sql::Sqlite(conn),
            fence: None,
        })
    }

    /// Connects to the PostgreSQL database at `url` and brings its schema
    /// to this build's version.
    pub fn connect(url: &str) -> Result<Db, DbError> {
        let sql = Sql::postgres(url)?;
        schema::migrate_postgres(&sql)?;
        Ok(Db { sql, fence: None })
    }

    /// Opens the state a coordinator keeps: PostgreSQL at `url` when one
    /// is given, else SQLite in `data_dir`.
    pub fn open_state(data_dir: &Path, url: Option<&str>) -> Result<Db, DbError> {
        match url {
            Some(url) => Db::connect(url),
            None => Db::open(&data_dir.join("state.sqlite")),
        }
    }

    /// Copies the WAL into the main database file and empties it, so the
    /// main file alone holds every commit up to now (a lost or deleted WAL
    /// then loses only what was committed since).
    /// An empty WAL is left alone: at rest the coordinator writes nothing
    /// (truncating even an empty file updates its times).
    /// (PostgreSQL checkpoints by itself: nothing to do there.)
    pub fn checkpoint(&self) -> Result<(), DbError> {
        let Some(conn) = self.sql.sqlite() else {
            return Ok(());
        };
        let frames: i64 = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))?;
        if frames > 0 {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        }
        Ok(())
    }

    /// The connection, for the tables kept by other modules (identities,
    /// webhooks; their tables are in the migrations too).
    pub(crate) fn sql(&self) -> &Sql {
        &self.sql
    }

    /// True when the state is in PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        self.sql.is_postgres()
    }

    /// Increments and returns the start counter; epochs of this run start at
    /// `generation << 32`, above every epoch of earlier runs.
    pub fn next_generation(&mut self) -> Result<u64, DbError> {
        // One statement that reads and writes: two coordinators sharing a
        // PostgreSQL database never get the same generation.
        self.sql.execute(
            "INSERT INTO meta (key, value) VALUES ('generation', 0) ON CONFLICT (key) DO NOTHING",
            &[],
        )?;
        let row = self.sql.query_one(
            "UPDATE meta SET value = value + 1 WHERE key = 'generation' RETURNING value",
            &[],
        )?;
        row.u64(0)
    }
}
