//! What workers are trusted with: leases by identity, quarantined
//! identities, verification summaries.

use super::*;

impl Db {
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
}
