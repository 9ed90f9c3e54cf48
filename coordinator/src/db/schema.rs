//! The schema and its versions, as rusqlite_migration's list: version N
//! is the first N migrations applied. SQLite's `user_version` holds the
//! version, and so does the `meta` row `schema`, which releases before
//! the migrations read (and refuse a newer database by): both are kept.
//! Version 1 had no version row; version 2 keeps a finished job's
//! counters in its row; version 3 adds Blender builds; version 4 brings
//! under the version the tables once created whenever missing (passes,
//! trust, holds, the frames-by-sequence index, webhooks, worker
//! identities), so it creates each only if missing; version 5 adds the
//! dashboard's stored previews; version 6 adds what coordinators sharing
//! a PostgreSQL database agree through (the lease, their addresses, the
//! shared certificate and ticket secrets; unused on SQLite).
//!
//! PostgreSQL's schema starts at version 5, as one migration
//! ([`PG_MIGRATIONS`]); a later version adds a step to both lists. It is
//! applied in one transaction under an advisory lock, so coordinators that
//! start at once against one database (an active one and its standby)
//! migrate it once. No migration crate is used for it: refinery (the one
//! that speaks to both) would bring regex, toml and time for these few
//! lines, and none takes the lock.

use rusqlite::{Connection, OptionalExtension};
use rusqlite_migration::{Migrations, M};

use super::*;

/// Version 1: jobs, accepted results, stitched frames, task logs.
pub(super) const V1: &str = "
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
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 1);
";

/// Version 2: a finished job's counters live in its row.
pub(super) const V2: &str = "
ALTER TABLE jobs ADD COLUMN tasks_done INTEGER;
ALTER TABLE jobs ADD COLUMN frames_done INTEGER;
ALTER TABLE jobs ADD COLUMN render_ms INTEGER;
ALTER TABLE jobs ADD COLUMN bytes_to_workers INTEGER;
UPDATE jobs SET
    bytes_to_workers = 0,
    tasks_done = (SELECT COUNT(*) FROM results WHERE results.job = jobs.id),
    frames_done = (SELECT COUNT(*) FROM frames WHERE frames.job = jobs.id),
    render_ms = (SELECT COALESCE(SUM(render_ms), 0) FROM results WHERE results.job = jobs.id)
WHERE state IN ('done', 'failed', 'canceled');
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 2);
";

/// Version 3: Blender builds shipped through the farm (`blender add`).
pub(super) const V3: &str = "
CREATE TABLE IF NOT EXISTS blender_builds (
    digest TEXT PRIMARY KEY,
    info TEXT NOT NULL
);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 3);
";

/// Version 4: what earlier versions created whenever missing, each only if
/// missing here too (a version 3 data dir has most of them):
///
/// - task logs (a version 1 data dir may lack them);
/// - a frame's stitched passes, the input of its finishing task, kept
///   apart from `frames` so clients never see them as a frame;
/// - a job's frames in the order they were stitched: an index on `job`
///   holds `(job, rowid)`, so "the frames of job J after rowid R" is one
///   range seek whatever the job's size (`wait` reads only what is new); a
///   frame stitched again (`INSERT OR REPLACE`) gets a new rowid: it is
///   new again;
/// - what workers are trusted with: the leases handed to each enrolled
///   identity, so that after a restart only that identity adopts them;
///   identities quarantined by `--verify` checks; each checked job's
///   verification summary once it finished;
/// - a job's holds as last changed by `pause`/`resume` (`released`:
///   resumed while a failed dependency held it, so it runs without it); a
///   job without a row is as its spec says (`submit --paused`);
/// - the webhook outbox (see [`crate::webhook`]);
/// - enrolled worker identities (see [`crate::identity`]).
pub(super) const V4: &str = "
CREATE TABLE IF NOT EXISTS task_logs (
    job INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    worker INTEGER NOT NULL,
    unix_ms INTEGER NOT NULL,
    error TEXT NOT NULL,
    log TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS task_logs_job ON task_logs (job, idx);
CREATE TABLE IF NOT EXISTS passes (
    job INTEGER NOT NULL,
    frame INTEGER NOT NULL,
    digest TEXT NOT NULL,
    size INTEGER NOT NULL,
    PRIMARY KEY (job, frame)
);
CREATE INDEX IF NOT EXISTS frames_by_seq ON frames (job);
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
);
CREATE TABLE IF NOT EXISTS job_holds (
    job INTEGER PRIMARY KEY,
    paused INTEGER NOT NULL,
    released INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_ms INTEGER NOT NULL DEFAULT 0,
    delivered_ms INTEGER
);
CREATE INDEX IF NOT EXISTS webhook_pending ON webhook_outbox (id) WHERE delivered_ms IS NULL;
CREATE TABLE IF NOT EXISTS webhook_meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS worker_identities (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_hash BLOB NOT NULL,
    enrolled_ms INTEGER NOT NULL,
    revoked_ms INTEGER
);
CREATE INDEX IF NOT EXISTS worker_identities_name ON worker_identities (name);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 4);
";

/// Version 5: the dashboard's previews, stored as blobs: one per stitched
/// frame (`part` 0) and per tile (`part` 1 + the tile's number), each made
/// once from the blob `source` (a frame stitched again gets a new one).
/// `digest` is the preview's blob, or NULL with `refused` saying why none
/// can be made. Collected with their job.
pub(super) const V5: &str = "
CREATE TABLE IF NOT EXISTS previews (
    job INTEGER NOT NULL,
    frame INTEGER NOT NULL,
    part INTEGER NOT NULL,
    source TEXT NOT NULL,
    digest TEXT,
    refused TEXT,
    PRIMARY KEY (job, frame, part)
);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 5);
";

/// Version 6: the coordinators' lease, their addresses and what they share
/// (see `db/lease.rs`). Only a PostgreSQL farm uses them.
pub(super) const V6: &str = "
CREATE TABLE IF NOT EXISTS coordinator_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder INTEGER NOT NULL,
    instance TEXT NOT NULL,
    addr TEXT NOT NULL,
    expires_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS coordinators (
    addr TEXT PRIMARY KEY,
    generation INTEGER NOT NULL,
    seen_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS coordinator_secrets (name TEXT PRIMARY KEY, value BLOB NOT NULL);
INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', 6);
";

/// Every migration, oldest first: [`SCHEMA_VERSION`] of them.
const MIGRATIONS: [&str; SCHEMA_VERSION as usize] = [V1, V2, V3, V4, V5, V6];

/// The version a data dir is at: the higher of `user_version` and its
/// `meta` row (a data dir written before the migrations has only the row,
/// or none at version 1; one without `jobs` is new).
fn version(conn: &Connection) -> Result<i64, DbError> {
    let user: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let has_jobs: bool = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)?;
    if !has_jobs {
        return Ok(user);
    }
    let row: Option<i64> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(user.max(row.unwrap_or(1)))
}

/// Brings the schema to [`SCHEMA_VERSION`]: creates it in a new database,
/// migrates an older one (the steps it lacks, in one transaction), and refuses a
/// newer one.
pub fn migrate(conn: &mut Connection) -> Result<(), DbError> {
    let found = version(conn)?;
    if found > SCHEMA_VERSION {
        return Err(DbError::Newer { found });
    }
    // A data dir from before the migrations: its version, where they look.
    conn.pragma_update(None, "user_version", found)?;
    let migrations = Migrations::new(MIGRATIONS.iter().map(|sql| M::up(sql)).collect());
    migrations.to_latest(conn).map_err(|e| match e {
        rusqlite_migration::Error::RusqliteError { err, .. } => DbError::Sqlite(err),
        e => DbError::Migration(e.to_string()),
    })
}

/// The PostgreSQL schema at version 5: the tables of SQLite's version 5
/// with 64-bit integers, and `rowid` an identity column where statements
/// read it (frames, task logs, builds).
const PG_V5: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE jobs (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    request_id TEXT UNIQUE,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    submitted_ms BIGINT NOT NULL,
    finished_ms BIGINT,
    bytes_uploaded BIGINT NOT NULL,
    bytes_deduplicated BIGINT NOT NULL,
    error TEXT,
    cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
    tasks_done BIGINT,
    frames_done BIGINT,
    render_ms BIGINT,
    bytes_to_workers BIGINT
);
CREATE TABLE results (
    job BIGINT NOT NULL,
    idx BIGINT NOT NULL,
    output TEXT NOT NULL,
    render_ms BIGINT NOT NULL,
    worker TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    PRIMARY KEY (job, idx)
);
CREATE TABLE frames (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY,
    job BIGINT NOT NULL,
    frame BIGINT NOT NULL,
    digest TEXT NOT NULL,
    size BIGINT NOT NULL,
    PRIMARY KEY (job, frame)
);
CREATE INDEX frames_by_seq ON frames (job, rowid);
CREATE TABLE blender_builds (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY,
    digest TEXT PRIMARY KEY,
    info TEXT NOT NULL
);
CREATE TABLE task_logs (
    rowid BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job BIGINT NOT NULL,
    idx BIGINT NOT NULL,
    worker BIGINT NOT NULL,
    unix_ms BIGINT NOT NULL,
    error TEXT NOT NULL,
    log TEXT NOT NULL
);
CREATE INDEX task_logs_job ON task_logs (job, idx);
CREATE TABLE passes (
    job BIGINT NOT NULL,
    frame BIGINT NOT NULL,
    digest TEXT NOT NULL,
    size BIGINT NOT NULL,
    PRIMARY KEY (job, frame)
);
CREATE TABLE leases (
    job BIGINT NOT NULL,
    idx BIGINT NOT NULL,
    epoch BIGINT NOT NULL,
    identity TEXT NOT NULL,
    PRIMARY KEY (job, idx, epoch)
);
CREATE TABLE quarantined (
    identity TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    reason TEXT NOT NULL,
    unix_ms BIGINT NOT NULL
);
CREATE TABLE verifications (job BIGINT PRIMARY KEY, summary TEXT NOT NULL);
CREATE TABLE job_holds (
    job BIGINT PRIMARY KEY,
    paused BIGINT NOT NULL,
    released BIGINT NOT NULL
);
CREATE TABLE webhook_outbox (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    next_ms BIGINT NOT NULL DEFAULT 0,
    delivered_ms BIGINT
);
CREATE INDEX webhook_pending ON webhook_outbox (id) WHERE delivered_ms IS NULL;
CREATE TABLE webhook_meta (k TEXT PRIMARY KEY, v BIGINT NOT NULL);
CREATE TABLE worker_identities (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_hash BYTEA NOT NULL,
    enrolled_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);
CREATE INDEX worker_identities_name ON worker_identities (name);
CREATE TABLE previews (
    job BIGINT NOT NULL,
    frame BIGINT NOT NULL,
    part BIGINT NOT NULL,
    source TEXT NOT NULL,
    digest TEXT,
    refused TEXT,
    PRIMARY KEY (job, frame, part)
);
INSERT INTO meta (key, value) VALUES ('schema', 5);
";

/// PostgreSQL's migrations: (the version each brings the schema to, its
/// statements), oldest first.
const PG_MIGRATIONS: [(i64, &str); 2] = [(5, PG_V5), (6, PG_V6)];

/// PostgreSQL's version 6 (SQLite's [`V6`]): the lease the active
/// coordinator holds (its holder a generation, its end on the database's
/// clock), every coordinator's address, and the certificate and ticket
/// secrets they share.
const PG_V6: &str = "
CREATE TABLE coordinator_lease (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    holder BIGINT NOT NULL,
    instance TEXT NOT NULL,
    addr TEXT NOT NULL,
    expires_us BIGINT NOT NULL
);
CREATE TABLE coordinators (
    addr TEXT PRIMARY KEY,
    generation BIGINT NOT NULL,
    seen_us BIGINT NOT NULL
);
CREATE TABLE coordinator_secrets (name TEXT PRIMARY KEY, value BYTEA NOT NULL);
UPDATE meta SET value = 6 WHERE key = 'schema';
";

/// The advisory lock a migration holds (any constant of Tessera's own).
const PG_MIGRATION_LOCK: i64 = 0x7465_7373_6572_6101;

/// Brings a PostgreSQL database to [`SCHEMA_VERSION`] (creating the schema
/// in an empty one), and refuses one a newer Tessera wrote.
pub(super) fn migrate_postgres(sql: &Sql) -> Result<(), DbError> {
    sql.transaction(|tx| {
        tx.execute(
            "SELECT pg_advisory_xact_lock(?1)",
            &args![PG_MIGRATION_LOCK],
        )?;
        tx.batch("CREATE TABLE IF NOT EXISTS tessera_schema (version BIGINT NOT NULL)")?;
        let found = match tx.query_opt("SELECT version FROM tessera_schema", &[])? {
            Some(row) => row.int(0)?,
            None => {
                tx.execute("INSERT INTO tessera_schema (version) VALUES (0)", &[])?;
                0
            }
        };
        if found > SCHEMA_VERSION {
            return Err(DbError::Newer { found });
        }
        for (version, statements) in PG_MIGRATIONS {
            if version > found {
                tx.batch(statements)
                    .map_err(|e| DbError::Migration(format!("to version {version}: {e}")))?;
                tx.execute("UPDATE tessera_schema SET version = ?1", &args![version])?;
            }
        }
        Ok(())
    })
}
