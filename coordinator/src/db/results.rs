//! Accepted results, stitched frames and passes, task logs.

use super::*;

/// The frames of a job after a rowid, in the order they were stitched (by
/// the `frames_by_seq` index: one range seek).
pub(super) const FRAMES_SINCE: &str =
    "SELECT rowid, frame, digest, size FROM frames INDEXED BY frames_by_seq
     WHERE job = ?1 AND rowid > ?2 ORDER BY rowid LIMIT ?3";

impl Db {
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

    /// The preview of a frame's `part` (0 the frame, 1 + N its tile N), when
    /// one was made of the blob `source`: its blob, or why none can be.
    pub fn preview(
        &self,
        job: u64,
        frame: u32,
        part: u32,
        source: &Digest,
    ) -> Result<Option<Result<Digest, String>>, DbError> {
        let row: Option<(Option<String>, Option<String>)> = self
            .conn
            .query_row(
                "SELECT digest, refused FROM previews
                 WHERE job = ?1 AND frame = ?2 AND part = ?3 AND source = ?4",
                params![job as i64, frame, part, source.to_hex()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        Ok(row.map(
            |(digest, refused)| match digest.and_then(|d| d.parse::<Digest>().ok()) {
                Some(d) => Ok(d),
                None => Err(refused.unwrap_or_else(|| "no preview".into())),
            },
        ))
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
        self.conn.execute(
            "INSERT OR REPLACE INTO previews (job, frame, part, source, digest, refused)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![job as i64, frame, part, source.to_hex(), digest, refused],
        )?;
        Ok(())
    }
}
