//! What coordinators sharing one PostgreSQL database agree through: the
//! lease the active one holds (its holder a generation, its end on the
//! database's own clock, so no two machines' clocks are compared), the
//! address each coordinator serves at (tickets name them all), and the
//! certificate and ticket secrets they share.
//!
//! The lease fences: a result is committed only in a transaction that
//! finds the lease held by this coordinator and not ended ([`Db::fence`]),
//! and holds the lease row while it commits, so a standby takes over
//! either before such a commit (which then fails) or after it (and finds
//! it when it restores the farm).

use std::time::Duration;

use super::sql::{args, Sql};
use super::{Db, DbError};

/// The database's clock now, in microseconds since the Unix epoch.
macro_rules! now_us {
    () => {
        "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)"
    };
}

/// Who holds the lease, as the database says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub generation: u64,
    /// The holder's data dir's instance id.
    pub instance: String,
    pub addr: String,
    /// Until the lease ends, by the database's clock (negative: it ended).
    pub ends_in_ms: i64,
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This coordinator holds the lease for the time it asked.
    Ours,
    /// Another holds it (or held it last and it has not ended).
    Theirs(Holder),
}

/// How long a coordinator's address is named in tickets after it was last
/// seen (a standby down for a week drops out of new tickets).
const ADDRESS_KEPT_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

impl Db {
    /// Takes or renews the lease for `generation` for `ttl`, as the
    /// coordinator process `instance` serving at `addr`. Granted when
    /// nobody holds it; when this generation holds it (even if it ended
    /// meanwhile: nobody took it); when it ended; or when generation
    /// `replacing` holds it (a holder the caller saw is gone).
    pub fn claim_lease(
        &self,
        generation: u64,
        instance: &str,
        addr: &str,
        ttl: Duration,
        replacing: Option<u64>,
    ) -> Result<Claim, DbError> {
        self.require_postgres("a lease")?;
        let changed = self.sql.execute(
            concat!(
                "INSERT INTO coordinator_lease (id, holder, instance, addr, expires_us) ",
                "VALUES (1, ?1, ?2, ?3, ",
                now_us!(),
                " + ?4) ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder, ",
                "instance = EXCLUDED.instance, addr = EXCLUDED.addr, ",
                "expires_us = EXCLUDED.expires_us WHERE coordinator_lease.holder = EXCLUDED.holder ",
                "OR coordinator_lease.holder = ?5 ",
                "OR coordinator_lease.expires_us < ",
                now_us!()
            ),
            &args![
                generation as i64,
                instance,
                addr,
                ttl.as_micros() as i64,
                replacing.map_or(-1, |g| g as i64)
            ],
        )?;
        if changed == 1 {
            return Ok(Claim::Ours);
        }
        let holder = self
            .lease_holder()?
            .ok_or_else(|| DbError::Column("the lease row vanished".into()))?;
        Ok(Claim::Theirs(holder))
    }

    /// Who holds (or last held) the lease, if anyone ever did.
    pub fn lease_holder(&self) -> Result<Option<Holder>, DbError> {
        self.require_postgres("a lease")?;
        let row = self.sql.query_opt(
            concat!(
                "SELECT holder, instance, addr, (expires_us - ",
                now_us!(),
                ") / 1000 FROM coordinator_lease WHERE id = 1"
            ),
            &[],
        )?;
        row.map(|r| {
            Ok(Holder {
                generation: r.u64(0)?,
                instance: r.text(1)?,
                addr: r.text(2)?,
                ends_in_ms: r.int(3)?,
            })
        })
        .transpose()
    }

    /// Ends the lease now if `generation` holds it (a coordinator told to
    /// stop): a standby takes over at its next look instead of waiting.
    pub fn release_lease(&self, generation: u64) -> Result<(), DbError> {
        self.require_postgres("a lease")?;
        self.sql.execute(
            "UPDATE coordinator_lease SET expires_us = 0 WHERE id = 1 AND holder = ?1",
            &args![generation as i64],
        )?;
        Ok(())
    }

    /// Records that a coordinator of `generation` serves at `addr` now.
    pub fn register_coordinator(&self, addr: &str, generation: u64) -> Result<(), DbError> {
        self.require_postgres("coordinator addresses")?;
        self.sql.execute(
            concat!(
                "INSERT INTO coordinators (addr, generation, seen_us) VALUES (?1, ?2, ",
                now_us!(),
                ") ON CONFLICT (addr) DO UPDATE SET generation = EXCLUDED.generation, ",
                "seen_us = EXCLUDED.seen_us"
            ),
            &args![addr, generation as i64],
        )?;
        Ok(())
    }

    /// The addresses of the `max` coordinators seen last (each standby and
    /// active one every few seconds), in order.
    pub fn coordinator_addrs(&self, max: usize) -> Result<Vec<String>, DbError> {
        self.require_postgres("coordinator addresses")?;
        let rows = self.sql.query(
            concat!(
                "SELECT addr FROM (SELECT addr, seen_us FROM coordinators WHERE seen_us > ",
                now_us!(),
                " - ?1 ORDER BY seen_us DESC LIMIT ?2) AS recent ORDER BY addr"
            ),
            &args![ADDRESS_KEPT_FOR.as_micros() as i64, max as i64],
        )?;
        rows.iter().map(|r| r.text(0)).collect()
    }

    /// The shared secrets `names`: those stored, and for each not stored
    /// yet the value `given` returns, stored now. One transaction: two
    /// coordinators starting at once agree on every one (a certificate and
    /// its key come from the same coordinator).
    pub fn shared_secrets(
        &self,
        names: &[&str],
        mut given: impl FnMut(&str) -> Vec<u8>,
    ) -> Result<Vec<Vec<u8>>, DbError> {
        self.sql.transaction(|tx| {
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let found = tx.query_opt(
                    "SELECT value FROM coordinator_secrets WHERE name = ?1",
                    &args![*name],
                )?;
                let value = match found {
                    Some(row) => row.blob(0)?,
                    None => {
                        let value = given(name);
                        tx.execute(
                            "INSERT INTO coordinator_secrets (name, value) VALUES (?1, ?2)
                             ON CONFLICT (name) DO NOTHING",
                            &args![*name, value.as_slice()],
                        )?;
                        // Another coordinator's, if it stored one first.
                        tx.query_one(
                            "SELECT value FROM coordinator_secrets WHERE name = ?1",
                            &args![*name],
                        )?
                        .blob(0)?
                    }
                };
                out.push(value);
            }
            Ok(out)
        })
    }

    /// Replaces shared secrets (new ticket secrets: `rotate-tickets`).
    pub fn set_shared_secrets(&self, secrets: &[(&str, &[u8])]) -> Result<(), DbError> {
        self.sql.transaction(|tx| {
            for (name, value) in secrets {
                tx.execute(
                    "INSERT INTO coordinator_secrets (name, value) VALUES (?1, ?2)
                     ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value",
                    &args![*name, *value],
                )?;
            }
            Ok(())
        })
    }

    /// From now on, results commit only while `generation` holds the lease.
    pub fn set_fence(&mut self, generation: u64) {
        self.fence = Some(generation);
    }

    /// In a transaction that writes what only the lease holder may write:
    /// fails unless this coordinator holds the lease and it has not ended,
    /// and holds the lease row until the transaction ends (a standby's
    /// claim waits for it).
    pub(super) fn fence(&self, tx: &Sql) -> Result<(), DbError> {
        let Some(generation) = self.fence else {
            return Ok(());
        };
        let row = tx.query_opt(
            concat!(
                "SELECT holder, expires_us - ",
                now_us!(),
                " FROM coordinator_lease WHERE id = 1 FOR SHARE"
            ),
            &[],
        )?;
        match row {
            Some(r) if r.u64(0)? != generation => Err(DbError::Fenced { holder: r.u64(0)? }),
            Some(r) if r.int(1)? > 0 => Ok(()),
            _ => Err(DbError::LeaseLapsed),
        }
    }

    fn require_postgres(&self, what: &str) -> Result<(), DbError> {
        if self.is_postgres() {
            Ok(())
        } else {
            Err(DbError::Column(format!(
                "{what} is kept only in a PostgreSQL state (--state)"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::NewResult;
    use crate::scratch_postgres::ScratchPostgres;
    use tessera_protocol::Digest;

    fn result(job: u64, index: u32, epoch: u64) -> NewResult<'static> {
        NewResult {
            job,
            index,
            output: Digest::of(&index.to_le_bytes()),
            render_ms: 1,
            worker: "w",
            epoch,
        }
    }

    /// Two coordinators on one database: one holds the lease, the other
    /// is told who; the lease passes only once it ended (or to the
    /// holder's own data dir); a result is committed only by the holder
    /// while its lease lasts, and a commit of the old holder after a
    /// takeover is refused as fenced.
    #[test]
    #[ignore = "needs PostgreSQL's initdb and postgres (apt-get install postgresql)"]
    fn the_lease_passes_only_when_it_ends_and_fences_the_old_holders_commits() {
        let server = ScratchPostgres::start("lease").unwrap();
        let (mut a, mut b) = (
            Db::connect(&server.url()).unwrap(),
            Db::connect(&server.url()).unwrap(),
        );
        assert_eq!(a.lease_holder().unwrap(), None, "nobody held it yet");
        let ttl = Duration::from_millis(1500);
        let (ga, gb) = (a.next_generation().unwrap(), b.next_generation().unwrap());
        assert_eq!(
            a.claim_lease(ga, "dir-a", "10.0.0.1:7700", ttl, None)
                .unwrap(),
            Claim::Ours
        );
        let Claim::Theirs(holder) = b
            .claim_lease(gb, "dir-b", "10.0.0.2:7700", ttl, None)
            .unwrap()
        else {
            panic!("a second coordinator took a held lease");
        };
        assert_eq!(
            (
                holder.generation,
                holder.instance.as_str(),
                holder.addr.as_str()
            ),
            (ga, "dir-a", "10.0.0.1:7700")
        );
        assert!(
            holder.ends_in_ms > 0 && holder.ends_in_ms <= 1500,
            "{holder:?}"
        );
        // Renewing is claiming again.
        assert_eq!(
            a.claim_lease(ga, "dir-a", "10.0.0.1:7700", ttl, None)
                .unwrap(),
            Claim::Ours
        );

        // The holder commits while its lease lasts.
        let job = a
            .insert_job(&crate::db::tests::spec(None), 1, 0, 0)
            .unwrap();
        a.set_fence(ga);
        b.set_fence(gb);
        assert_eq!(
            a.insert_results(&[result(job, 0, ga << 32)], &[]).unwrap(),
            [true]
        );
        let refused = b
            .insert_results(&[result(job, 1, gb << 32)], &[])
            .unwrap_err();
        assert!(
            matches!(refused, DbError::Fenced { holder } if holder == ga),
            "{refused}"
        );
        assert!(refused.is_transient() && !refused.is_unreachable());

        // It lapses: the holder's commits wait (nobody took it), and the
        // holder can still renew.
        std::thread::sleep(ttl + Duration::from_millis(100));
        let lapsed = a
            .insert_results(&[result(job, 2, ga << 32)], &[])
            .unwrap_err();
        assert!(matches!(lapsed, DbError::LeaseLapsed), "{lapsed}");
        assert!(lapsed.is_unreachable(), "a lapsed lease is waited for");
        assert_eq!(
            a.claim_lease(ga, "dir-a", "10.0.0.1:7700", ttl, None)
                .unwrap(),
            Claim::Ours
        );

        // It ends for good: the standby takes it, and the old holder's
        // commit is refused as fenced.
        std::thread::sleep(ttl + Duration::from_millis(100));
        assert_eq!(
            b.claim_lease(gb, "dir-b", "10.0.0.2:7700", ttl, None)
                .unwrap(),
            Claim::Ours
        );
        let fenced = a
            .insert_results(&[result(job, 3, ga << 32)], &[])
            .unwrap_err();
        assert!(
            matches!(fenced, DbError::Fenced { holder } if holder == gb),
            "{fenced}"
        );
        assert!(matches!(
            a.claim_lease(ga, "dir-a", "10.0.0.1:7700", ttl, None).unwrap(),
            Claim::Theirs(Holder { generation, .. }) if generation == gb
        ));
        assert_eq!(
            b.insert_results(&[result(job, 4, gb << 32)], &[]).unwrap(),
            [true]
        );
        let stored: Vec<u32> = (b.results(job).unwrap().iter()).map(|r| r.index).collect();
        assert_eq!(
            stored,
            [0, 4],
            "only the holders' results, each in its lease"
        );

        // A holder seen gone is replaced at once, and only that holder;
        // an ended lease is released for a standby at once.
        let gb2 = b.next_generation().unwrap();
        assert!(matches!(
            b.claim_lease(gb2, "b2", "10.0.0.2:7700", ttl, Some(ga))
                .unwrap(),
            Claim::Theirs(_)
        ));
        assert_eq!(
            b.claim_lease(gb2, "b2", "10.0.0.2:7700", ttl, Some(gb))
                .unwrap(),
            Claim::Ours
        );
        b.release_lease(gb2).unwrap();
        assert!(b.lease_holder().unwrap().unwrap().ends_in_ms <= 0);
        assert_eq!(
            a.claim_lease(ga + 10, "dir-a", "10.0.0.1:7700", ttl, None)
                .unwrap(),
            Claim::Ours
        );

        // Addresses and shared secrets.
        a.register_coordinator("10.0.0.1:7700", ga).unwrap();
        b.register_coordinator("10.0.0.2:7700", 0).unwrap();
        assert_eq!(
            a.coordinator_addrs(8).unwrap(),
            ["10.0.0.1:7700", "10.0.0.2:7700"]
        );
        let first = a
            .shared_secrets(&["k1", "k2"], |n| n.as_bytes().to_vec())
            .unwrap();
        let second = b
            .shared_secrets(&["k1", "k2"], |_| b"other".to_vec())
            .unwrap();
        assert_eq!(
            first, second,
            "the first coordinator's secrets are everyone's"
        );
        b.set_shared_secrets(&[("k2", b"new")]).unwrap();
        assert_eq!(
            a.shared_secrets(&["k2"], |_| Vec::new()).unwrap(),
            [b"new".to_vec()]
        );
    }
}
