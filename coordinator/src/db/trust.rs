//! What workers are trusted with: leases by identity, quarantined
//! identities, verification summaries.

use super::*;

impl Db {
    /// Records leases handed out (task, epoch, identity).
    pub fn record_leases(&mut self, leases: &[(u64, u32, u64, String)]) -> Result<(), DbError> {
        self.sql.transaction(|tx| {
            for (job, idx, epoch, identity) in leases {
                tx.execute(
                    "INSERT INTO leases (job, idx, epoch, identity) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (job, idx, epoch) DO UPDATE SET identity = excluded.identity",
                    &args![*job as i64, *idx, *epoch as i64, identity],
                )?;
            }
            Ok(())
        })
    }

    /// The leases of `job` that no committed result ended: (task, epoch,
    /// identity).
    pub fn open_leases(&self, job: u64) -> Result<Vec<(u32, u64, String)>, DbError> {
        let rows = self.sql.query(
            "SELECT l.idx, l.epoch, l.identity FROM leases l WHERE l.job = ?1
             AND NOT EXISTS (SELECT 1 FROM results r WHERE r.job = l.job AND r.idx = l.idx)",
            &args![job as i64],
        )?;
        rows.iter()
            .map(|r| Ok((r.u32(0)?, r.u64(1)?, r.text(2)?)))
            .collect()
    }

    /// Withdraws committed results of `job` and the frames they made.
    pub fn withdraw(&mut self, job: u64, tasks: &[u32], frames: &[u32]) -> Result<(), DbError> {
        self.sql.transaction(|tx| {
            for idx in tasks {
                tx.execute(
                    "DELETE FROM results WHERE job = ?1 AND idx = ?2",
                    &args![job as i64, *idx],
                )?;
            }
            for frame in frames {
                tx.execute(
                    "DELETE FROM frames WHERE job = ?1 AND frame = ?2",
                    &args![job as i64, *frame],
                )?;
            }
            Ok(())
        })
    }

    pub fn quarantine(
        &self,
        identity: &str,
        name: &str,
        reason: &str,
        unix_ms: u64,
    ) -> Result<(), DbError> {
        self.sql.execute(
            "INSERT INTO quarantined (identity, name, reason, unix_ms) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT DO NOTHING",
            &args![identity, name, reason, unix_ms as i64],
        )?;
        Ok(())
    }

    /// Every quarantined identity with its reason.
    pub fn quarantined(&self) -> Result<Vec<(String, String)>, DbError> {
        let rows = (self.sql).query("SELECT identity, reason FROM quarantined", &[])?;
        rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?))).collect()
    }

    /// Keeps a finished job's verification summary.
    pub fn set_verification(&self, job: u64, summary: &Verification) -> Result<(), DbError> {
        let text = serde_json::to_string(summary).expect("a summary serializes");
        self.sql.execute(
            "INSERT INTO verifications (job, summary) VALUES (?1, ?2)
             ON CONFLICT (job) DO UPDATE SET summary = excluded.summary",
            &args![job as i64, text],
        )?;
        Ok(())
    }

    pub fn verification(&self, job: u64) -> Result<Option<Verification>, DbError> {
        let row = self.sql.query_opt(
            "SELECT summary FROM verifications WHERE job = ?1",
            &args![job as i64],
        )?;
        let text = row.map(|r| r.text(0)).transpose()?;
        Ok(text.and_then(|t| serde_json::from_str(&t).ok()))
    }
}
