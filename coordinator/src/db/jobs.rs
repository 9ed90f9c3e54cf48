//! Jobs: their rows, holds, builds and what the finished ones add up to.

use super::*;

impl Db {
    pub fn job_by_request(&self, request_id: &str) -> Result<Option<u64>, DbError> {
        let row = (self.sql).query_opt(
            "SELECT id FROM jobs WHERE request_id = ?1",
            &args![request_id],
        )?;
        row.map(|r| r.u64(0)).transpose()
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
        let row = self.sql.query_one(
            "INSERT INTO jobs (request_id, spec, state, submitted_ms, bytes_uploaded, bytes_deduplicated)
             VALUES (?1, ?2, 'queued', ?3, ?4, ?5) RETURNING id",
            &args![
                spec.request_id.as_deref(),
                json,
                submitted_ms as i64,
                bytes_uploaded as i64,
                bytes_deduplicated as i64
            ],
        )?;
        row.u64(0)
    }

    pub fn set_state(
        &mut self,
        job: u64,
        state: JobState,
        finished_ms: Option<u64>,
        error: Option<&str>,
    ) -> Result<(), DbError> {
        self.sql.execute(
            "UPDATE jobs SET state = ?2, finished_ms = ?3, error = ?4 WHERE id = ?1",
            &args![
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
        stored_jobs(
            self.sql
                .query(&format!("SELECT {JOB_COLUMNS} FROM jobs ORDER BY id"), &[])?,
        )
    }

    /// Up to `limit` jobs with ids above `after`, in id order: a long scan
    /// in pages, so that the lock on the database is held briefly.
    pub fn jobs_page(&self, after: u64, limit: u32) -> Result<Vec<StoredJob>, DbError> {
        stored_jobs(self.sql.query(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2"),
            &args![after.min(i64::MAX as u64) as i64, limit],
        )?)
    }

    /// Puts a failed job back to `queued` (no error, no final counters);
    /// false when it is not failed.
    pub fn reopen_failed_job(&mut self, job: u64) -> Result<bool, DbError> {
        let n = self.sql.execute(
            "UPDATE jobs SET state = 'queued', finished_ms = NULL, error = NULL,
                 tasks_done = NULL, frames_done = NULL, render_ms = NULL, bytes_to_workers = NULL
             WHERE id = ?1 AND state = 'failed'",
            &args![job as i64],
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
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id > ?1{} ORDER BY id LIMIT ?2",
            where_rows(rows)
        );
        let after = after.min(i64::MAX as u64) as i64;
        stored_jobs(self.sql.query(&sql, &args![after, limit])?)
    }

    /// As [`Db::jobs_where`], newest first: at most `limit` rows with ids
    /// below `before`.
    pub fn jobs_where_before(
        &self,
        rows: &JobRows,
        before: u64,
        limit: u32,
    ) -> Result<Vec<StoredJob>, DbError> {
        let sql = format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE id < ?1{} ORDER BY id DESC LIMIT ?2",
            where_rows(rows)
        );
        let before = before.min(i64::MAX as u64) as i64;
        stored_jobs(self.sql.query(&sql, &args![before, limit])?)
    }

    /// How many rows `rows` selects.
    pub fn count_where(&self, rows: &JobRows) -> Result<u64, DbError> {
        let sql = format!("SELECT COUNT(*) FROM jobs WHERE 1 = 1{}", where_rows(rows));
        self.sql.query_one(&sql, &[])?.u64(0)
    }

    /// Every task output and frame of the jobs that are not finished, or
    /// finished after `finished_after` (unix ms): what garbage collection
    /// keeps besides the jobs' files.
    pub fn outputs_kept(&self, finished_after: u64) -> Result<Vec<Digest>, DbError> {
        let kept = "SELECT id FROM jobs WHERE state NOT IN ('done', 'failed', 'canceled')
                    OR finished_ms IS NULL OR finished_ms > ?1";
        let mut out = Vec::new();
        for table in [
            "SELECT output FROM results WHERE",
            "SELECT digest FROM frames WHERE",
            "SELECT digest FROM passes WHERE",
            "SELECT digest FROM previews WHERE digest IS NOT NULL AND",
        ] {
            let rows = self.sql.query(
                &format!("{table} job IN ({kept})"),
                &args![finished_after.min(i64::MAX as u64) as i64],
            )?;
            for row in rows {
                out.push(row.digest(0)?);
            }
        }
        Ok(out)
    }

    /// Records a Blender build (`blender add`); adding the same build again
    /// keeps the first record.
    pub fn add_build(&self, info: &BuildInfo) -> Result<BuildInfo, DbError> {
        let json = serde_json::to_string(info).expect("a build serialises");
        self.sql.execute(
            "INSERT INTO blender_builds (digest, info) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            &args![info.digest.to_hex(), json],
        )?;
        Ok(self
            .builds()?
            .into_iter()
            .find(|b| b.digest == info.digest)
            .expect("just recorded"))
    }

    /// Every Blender build recorded, oldest first.
    pub fn builds(&self) -> Result<Vec<BuildInfo>, DbError> {
        let rows = (self.sql).query("SELECT info FROM blender_builds ORDER BY rowid", &[])?;
        rows.iter()
            .map(|r| {
                serde_json::from_str(&r.text(0)?)
                    .map_err(|e| DbError::Column(format!("a stored Blender build: {e}")))
            })
            .collect()
    }

    /// Jobs still queued or running (the ones a restart resumes).
    pub fn unfinished_jobs(&self) -> Result<Vec<StoredJob>, DbError> {
        stored_jobs(self.sql.query(
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE state NOT IN ('done', 'failed', 'canceled') ORDER BY id"
            ),
            &[],
        )?)
    }

    /// Totals over every finished job, per final state, summed by the
    /// database: no job is read into memory (for `/metrics`).
    pub fn finished_totals(&self) -> Result<Vec<(JobState, FinishedTotals)>, DbError> {
        // PostgreSQL sums BIGINTs as NUMERIC: each sum is cast back.
        let rows = self.sql.query(
            "SELECT state, COUNT(*), CAST(SUM(COALESCE(tasks_done, 0)) AS BIGINT),
                    CAST(SUM(bytes_uploaded) AS BIGINT), CAST(SUM(bytes_deduplicated) AS BIGINT),
                    CAST(SUM(COALESCE(bytes_to_workers, 0)) AS BIGINT), SUM(cost_usd)
             FROM jobs WHERE state IN ('done', 'failed', 'canceled') GROUP BY state",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                let n = |i: usize| r.opt_int(i).map(|v| v.unwrap_or(0).max(0) as u64);
                Ok((
                    parse_state(&r.text(0)?),
                    FinishedTotals {
                        jobs: n(1)?,
                        tasks_done: n(2)?,
                        bytes_uploaded: n(3)?,
                        bytes_deduplicated: n(4)?,
                        bytes_to_workers: n(5)?,
                        cost_usd: r.opt_real(6)?.unwrap_or(0.0),
                    },
                ))
            })
            .collect()
    }

    /// Finished jobs, newest first, at most `limit`.
    pub fn finished_jobs(&self, limit: u32) -> Result<Vec<StoredJob>, DbError> {
        stored_jobs(self.sql.query(
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('done', 'failed', 'canceled') ORDER BY id DESC LIMIT ?1"
            ),
            &args![limit],
        )?)
    }

    /// A job's state, if there is a job with that id.
    pub fn job_state(&self, id: u64) -> Result<Option<JobState>, DbError> {
        let row =
            (self.sql).query_opt("SELECT state FROM jobs WHERE id = ?1", &args![id as i64])?;
        Ok(row.map(|r| r.text(0)).transpose()?.map(|s| parse_state(&s)))
    }

    /// Records a job's holds (the `job_holds` table).
    pub fn set_holds(&self, job: u64, paused: bool, released: bool) -> Result<(), DbError> {
        self.sql.execute(
            "INSERT INTO job_holds (job, paused, released) VALUES (?1, ?2, ?3)
             ON CONFLICT (job) DO UPDATE SET paused = excluded.paused, released = excluded.released",
            &args![job as i64, paused, released],
        )?;
        Ok(())
    }

    /// Records a job's new priority in its spec.
    pub fn set_priority(&self, job: u64, priority: i32) -> Result<(), DbError> {
        self.sql.transaction(|tx| {
            let row = tx.query_opt("SELECT spec FROM jobs WHERE id = ?1", &args![job as i64])?;
            let Some(row) = row else { return Ok(()) };
            let mut spec: JobSpec = serde_json::from_str(&row.text(0)?)
                .map_err(|e| DbError::Corrupt(job, e.to_string()))?;
            spec.priority = priority;
            let json = serde_json::to_string(&spec).expect("job specs serialise");
            tx.execute(
                "UPDATE jobs SET spec = ?2 WHERE id = ?1",
                &args![job as i64, json],
            )?;
            Ok(())
        })
    }

    /// A job's holds as last recorded: (paused, released), `None` when
    /// never paused or resumed.
    pub fn holds(&self, job: u64) -> Result<Option<(bool, bool)>, DbError> {
        let row = self.sql.query_opt(
            "SELECT paused, released FROM job_holds WHERE job = ?1",
            &args![job as i64],
        )?;
        row.map(|r| Ok((r.bool(0)?, r.bool(1)?))).transpose()
    }

    /// One job, if there is one with that id.
    pub fn job(&self, id: u64) -> Result<Option<StoredJob>, DbError> {
        let rows = self.sql.query(
            &format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"),
            &args![id.min(i64::MAX as u64) as i64],
        )?;
        // One job: an unreadable row is an error naming it, not "no job".
        rows.iter()
            .map(|r| stored_job(job_row(r)?))
            .next()
            .transpose()
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
        self.sql.transaction(|tx| {
            tx.execute(
                "UPDATE jobs SET state = ?2, finished_ms = ?3, error = ?4, cost_usd = ?5,
                     tasks_done = ?6, frames_done = ?7, render_ms = ?8, bytes_to_workers = ?9
                 WHERE id = ?1",
                &args![
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
            tx.execute("DELETE FROM leases WHERE job = ?1", &args![job as i64])?;
            Ok(())
        })
    }
}

/// The SQL conditions (each after ` AND `) that select `rows`.
fn where_rows(rows: &JobRows) -> String {
    let mut sql = String::new();
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
    sql
}
