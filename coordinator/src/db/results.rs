//! Accepted results, stitched frames and passes, task logs.

use super::*;

/// The frames of a job after a rowid, in the order they were stitched (by
/// the `frames_by_seq` index: one range seek).
pub(super) const FRAMES_SINCE: &str =
    "SELECT rowid, frame, digest, size FROM frames INDEXED BY frames_by_seq
     WHERE job = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3";

/// [`FRAMES_SINCE`] in PostgreSQL, whose `frames_by_seq` is on `(job,
/// rowid)` (`rowid` a column there) and which has no `INDEXED BY`.
const FRAMES_SINCE_PG: &str = "SELECT rowid, frame, digest, size FROM frames
     WHERE job = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3";

/// A stored frame (or passes) row: frame, digest, size.
fn frame_row(r: &Row) -> Result<StoredFrame, DbError> {
    Ok(StoredFrame {
        frame: r.u32(0)?,
        digest: r.digest(1)?,
        size: r.u64(2)?,
    })
}

fn task_log(r: &Row, from: usize) -> Result<TaskLog, DbError> {
    Ok(TaskLog {
        task: r.u32(from)?,
        worker: r.u64(from + 1)?,
        unix_ms: r.u64(from + 2)?,
        error: r.text(from + 3)?,
        log: r.text(from + 4)?,
    })
}

impl Db {
    /// Commits one accepted result. Returns false if the task already had
    /// one (it is then left untouched).
    pub fn insert_result(&mut self, row: NewResult<'_>) -> Result<bool, DbError> {
        Ok(self.insert_results(&[row], &[])?[0])
    }

    /// Commits a batch of accepted results in one transaction (group
    /// commit), with the jobs' costs so far. Returns, per row, whether it was
    /// new: a row already there with the same output and epoch is this
    /// result, committed by an attempt whose answer was lost (a connection
    /// that closed at its commit), and counts as new.
    pub fn insert_results(
        &mut self,
        rows: &[NewResult<'_>],
        costs: &[(u64, f64)],
    ) -> Result<Vec<bool>, DbError> {
        self.sql.transaction(|tx| {
            self.fence(tx)?;
            for (job, cost) in costs {
                tx.execute(
                    "UPDATE jobs SET cost_usd = ?2 WHERE id = ?1",
                    &args![*job as i64, *cost],
                )?;
            }
            let mut fresh = Vec::with_capacity(rows.len());
            for r in rows {
                let n = tx.execute(
                    "INSERT INTO results (job, idx, output, render_ms, worker, epoch)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                    &args![
                        r.job as i64,
                        r.index,
                        r.output.to_hex(),
                        r.render_ms as i64,
                        r.worker,
                        r.epoch as i64
                    ],
                )?;
                let same = n == 0
                    && tx
                        .query_opt(
                            "SELECT 1 FROM results WHERE job = ?1 AND idx = ?2 AND output = ?3 AND epoch = ?4",
                            &args![r.job as i64, r.index, r.output.to_hex(), r.epoch as i64],
                        )?
                        .is_some();
                fresh.push(n == 1 || same);
            }
            Ok(fresh)
        })
    }

    pub fn results(&self, job: u64) -> Result<Vec<StoredResult>, DbError> {
        let rows = self.sql.query(
            "SELECT idx, output, render_ms FROM results WHERE job = ?1 ORDER BY idx",
            &args![job as i64],
        )?;
        rows.iter()
            .map(|r| {
                Ok(StoredResult {
                    index: r.u32(0)?,
                    output: r.digest(1)?,
                    render_ms: r.u64(2)?,
                })
            })
            .collect()
    }

    /// Outputs of the tasks `first..first+count` of a job, in index order.
    pub fn result_range(&self, job: u64, first: u32, count: u32) -> Result<Vec<Digest>, DbError> {
        let rows = self.sql.query(
            "SELECT output FROM results WHERE job = ?1 AND idx >= ?2 AND idx < ?3 ORDER BY idx",
            &args![job as i64, first, i64::from(first) + i64::from(count)],
        )?;
        rows.iter().map(|r| r.digest(0)).collect()
    }

    /// Records a stitched frame, in place of an earlier stitch of it; a
    /// frame stitched again is new to [`Db::frames_since`].
    pub fn insert_frame(&mut self, job: u64, frame: &StoredFrame) -> Result<(), DbError> {
        let row = args![
            job as i64,
            frame.frame,
            frame.digest.to_hex(),
            frame.size as i64
        ];
        if self.sql.is_postgres() {
            // Its `rowid` is an identity column: a row inserted anew gets
            // the next one.
            return self.sql.transaction(|tx| {
                self.fence(tx)?;
                tx.execute(
                    "DELETE FROM frames WHERE job = ?1 AND frame = ?2",
                    &row[..2],
                )?;
                tx.execute(
                    "INSERT INTO frames (job, frame, digest, size) VALUES (?1, ?2, ?3, ?4)",
                    &row,
                )?;
                Ok(())
            });
        }
        self.sql.execute(
            "INSERT OR REPLACE INTO frames (job, frame, digest, size) VALUES (?1, ?2, ?3, ?4)",
            &row,
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
        self.sql.execute(
            "INSERT INTO passes (job, frame, digest, size) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (job, frame) DO UPDATE SET digest = excluded.digest, size = excluded.size",
            &args![job as i64, frame, digest.to_hex(), size as i64],
        )?;
        Ok(())
    }

    /// The stitched passes of `job`'s frames that have them.
    pub fn passes(&self, job: u64) -> Result<Vec<StoredFrame>, DbError> {
        let rows = self.sql.query(
            "SELECT frame, digest, size FROM passes WHERE job = ?1 ORDER BY frame",
            &args![job as i64],
        )?;
        rows.iter().map(frame_row).collect()
    }

    /// Keeps a failed attempt's error and renderer log (cut to
    /// `MAX_TASK_LOG` bytes) for `tessera logs`.
    pub fn insert_task_log(&mut self, job: u64, entry: &TaskLog) -> Result<(), DbError> {
        self.sql.execute(
            "INSERT INTO task_logs (job, idx, worker, unix_ms, error, log) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            &args![
                job as i64,
                entry.task,
                entry.worker as i64,
                entry.unix_ms as i64,
                entry.error.as_str(),
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
        let rows = self.sql.query(
            "SELECT rowid, idx, worker, unix_ms, error, log FROM task_logs
             WHERE job = ?1 AND (CAST(?2 AS BIGINT) IS NULL OR idx = ?2) AND rowid > ?3
             ORDER BY rowid LIMIT ?4",
            &args![job as i64, task, after.min(i64::MAX as u64) as i64, limit],
        )?;
        rows.iter()
            .map(|r| Ok((r.u64(0)?, task_log(r, 1)?)))
            .collect()
    }

    pub fn task_logs(&self, job: u64, task: Option<u32>) -> Result<Vec<TaskLog>, DbError> {
        let rows = self.sql.query(
            "SELECT idx, worker, unix_ms, error, log FROM task_logs
             WHERE job = ?1 AND (CAST(?2 AS BIGINT) IS NULL OR idx = ?2) ORDER BY rowid",
            &args![job as i64, task],
        )?;
        rows.iter().map(|r| task_log(r, 0)).collect()
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
        let total = (self.sql)
            .query_one(
                "SELECT COUNT(*) FROM task_logs WHERE job = ?1",
                &args![job as i64],
            )?
            .u64(0)?;
        let rows = self.sql.query(
            "SELECT idx, worker, unix_ms, error FROM task_logs
             WHERE job = ?1 ORDER BY rowid DESC LIMIT ?2",
            &args![job as i64, limit],
        )?;
        let mut out = (rows.iter())
            .map(|r| Ok((r.u32(0)?, r.u64(1)?, r.u64(2)?, r.text(3)?)))
            .collect::<Result<Vec<_>, DbError>>()?;
        out.reverse();
        Ok((out, total as u32))
    }

    /// Who rendered a job's accepted results: (worker name, results, Σ
    /// render ms), most results first.
    pub fn result_workers(&self, job: u64) -> Result<Vec<(String, u32, u64)>, DbError> {
        let rows = self.sql.query(
            "SELECT worker, COUNT(*), CAST(COALESCE(SUM(render_ms), 0) AS BIGINT) FROM results
             WHERE job = ?1 GROUP BY worker ORDER BY COUNT(*) DESC, worker",
            &args![job as i64],
        )?;
        rows.iter()
            .map(|r| Ok((r.text(0)?, r.u64(1)? as u32, r.u64(2)?)))
            .collect()
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
        let sql = match self.sql.is_postgres() {
            true => FRAMES_SINCE_PG,
            false => FRAMES_SINCE,
        };
        let rows = self.sql.query(
            sql,
            &args![job as i64, after.min(i64::MAX as u64) as i64, limit],
        )?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.u64(0)?,
                    StoredFrame {
                        frame: r.u32(1)?,
                        digest: r.digest(2)?,
                        size: r.u64(3)?,
                    },
                ))
            })
            .collect()
    }

    pub fn frames(&self, job: u64) -> Result<Vec<StoredFrame>, DbError> {
        let rows = self.sql.query(
            "SELECT frame, digest, size FROM frames WHERE job = ?1 ORDER BY frame",
            &args![job as i64],
        )?;
        rows.iter().map(frame_row).collect()
    }

    /// The preview of a frame's `part` (0 the frame, 1 + N its tile N), when
    /// one was made of the blob `source`: its blob, or why none can be.
    pub fn preview(
        &self,
        job: u64,
        frame: u32,
        part: u32,
        source: &Digest,
    ) -> Result<Option<Result<Digest, String>>, DbError> {
        let row = self.sql.query_opt(
            "SELECT digest, refused FROM previews
             WHERE job = ?1 AND frame = ?2 AND part = ?3 AND source = ?4",
            &args![job as i64, frame, part, source.to_hex()],
        )?;
        let Some(row) = row else { return Ok(None) };
        let (digest, refused) = (row.opt_text(0)?, row.opt_text(1)?);
        Ok(Some(match digest.and_then(|d| d.parse::<Digest>().ok()) {
            Some(d) => Ok(d),
            None => Err(refused.unwrap_or_else(|| "no preview".into())),
        }))
    }

    /// Records the preview made of `source` for a frame's `part` (or why
    /// none can be), in place of one made of an earlier source.
    pub fn set_preview(
        &self,
        job: u64,
        frame: u32,
        part: u32,
        source: &Digest,
        made: &Result<Digest, String>,
    ) -> Result<(), DbError> {
        let (digest, refused) = match made {
            Ok(d) => (Some(d.to_hex()), None),
            Err(why) => (None, Some(why.as_str())),
        };
        self.sql.execute(
            "INSERT INTO previews (job, frame, part, source, digest, refused)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (job, frame, part) DO UPDATE SET
                 source = excluded.source, digest = excluded.digest, refused = excluded.refused",
            &args![job as i64, frame, part, source.to_hex(), digest, refused],
        )?;
        Ok(())
    }
}
