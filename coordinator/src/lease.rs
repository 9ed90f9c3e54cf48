//! The active coordinator's lease on a farm whose state is in PostgreSQL,
//! where a standby coordinator (`--standby`) waits to take over.
//!
//! The lease is a row (see `db/lease.rs`) its holder renews every
//! [`RENEW_EVERY`] for [`LEASE_TTL`], on a connection of its own in a
//! thread of its own ([`keep`]), so a busy commit never delays a renewal.
//! The holder acts (dispatches, and commits results) only while
//! [`Lease::valid`]: until [`LEASE_TTL`] less [`MARGIN`] after the start of
//! its last renewal that succeeded. The database ends the lease no earlier
//! than that (it adds the TTL to its own clock, after the renewal was sent),
//! so a standby can take over only once the holder has stopped. Commits are
//! also fenced in the database itself: a result is committed only in a
//! transaction that finds this coordinator's lease not ended.
//!
//! A holder that could not renew (the database out of reach) stops, and
//! carries on if it renews before anyone else took the lease; one that
//! finds another holder ends ([`Lease::lost`]). On a farm in SQLite there
//! is no lease: [`Lease::sole`] is always valid.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db::{Claim, Db, Holder};

/// How long a claim or renewal holds the lease.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// How often the holder renews it.
pub const RENEW_EVERY: Duration = Duration::from_millis(1000);
/// How often a standby looks whether the lease ended.
pub const STANDBY_LOOK_EVERY: Duration = Duration::from_millis(250);
/// How long before the lease's end by its own clock the holder stops
/// acting: room for two clocks running at slightly different rates.
pub const MARGIN: Duration = Duration::from_millis(500);

/// This coordinator's hold on the farm.
pub struct Lease {
    /// The generation it holds the lease as (0 on SQLite).
    pub generation: u64,
    base: Instant,
    /// Milliseconds after `base` until which it may act.
    valid_until_ms: AtomicU64,
    lost: AtomicBool,
    /// Who took the lease, once it was lost.
    taker: Mutex<Option<Holder>>,
    /// Woken when the lease is lost.
    pub lost_notify: tokio::sync::Notify,
    /// Every coordinator address tickets name, this one's first.
    addrs: Mutex<Vec<SocketAddr>>,
}

impl Lease {
    /// No lease to hold (SQLite): always valid.
    pub fn sole(addr: SocketAddr) -> Lease {
        Lease::new(0, u64::MAX, addr, Instant::now())
    }

    /// A lease `generation` was granted by a claim that began at `claimed`.
    pub fn held(generation: u64, claimed: Instant, addr: SocketAddr) -> Lease {
        let lease = Lease::new(generation, 0, addr, claimed);
        lease.renewed(claimed);
        lease
    }

    fn new(generation: u64, valid_until_ms: u64, addr: SocketAddr, base: Instant) -> Lease {
        Lease {
            generation,
            base,
            valid_until_ms: AtomicU64::new(valid_until_ms),
            lost: AtomicBool::new(false),
            taker: Mutex::new(None),
            lost_notify: tokio::sync::Notify::new(),
            addrs: Mutex::new(vec![addr]),
        }
    }

    /// True while this coordinator may dispatch and commit.
    pub fn valid(&self) -> bool {
        !self.lost()
            && (self.base.elapsed().as_millis() as u64)
                < self.valid_until_ms.load(Ordering::Acquire)
    }

    /// True once another coordinator took the lease: this one is done.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Who took it, once it was lost.
    pub fn taker(&self) -> Option<Holder> {
        self.taker.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A renewal that began at `started` succeeded.
    fn renewed(&self, started: Instant) {
        let until = started.saturating_duration_since(self.base) + LEASE_TTL - MARGIN;
        self.valid_until_ms
            .fetch_max(until.as_millis() as u64, Ordering::AcqRel);
    }

    fn lose(&self, taker: Holder) {
        *self.taker.lock().unwrap_or_else(|e| e.into_inner()) = Some(taker);
        self.lost.store(true, Ordering::Release);
        self.lost_notify.notify_waiters();
        // One that starts waiting after this sees `lost()` first.
        self.lost_notify.notify_one();
    }

    /// Every coordinator address tickets name, this one's first.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.addrs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records the addresses the database names (those that parse); true
    /// when they changed.
    pub fn name_others(&self, others: &[String]) -> bool {
        let parsed: Vec<SocketAddr> = others.iter().filter_map(|a| a.parse().ok()).collect();
        self.set_others(&parsed)
    }

    fn set_others(&self, others: &[SocketAddr]) -> bool {
        let mut addrs = self.addrs.lock().unwrap_or_else(|e| e.into_inner());
        let mine = addrs[0];
        let mut next = vec![mine];
        next.extend(others.iter().filter(|a| **a != mine).copied());
        next.truncate(tessera_protocol::ticket::MAX_ADDRS);
        let changed = *addrs != next;
        *addrs = next;
        changed
    }
}

/// Who this coordinator is to the lease.
pub struct Me {
    /// This process, as [`process_instance`] names it.
    pub instance: String,
    pub addr: SocketAddr,
}

/// This process as a lease's holder: `BOOT_ID/PID_NAMESPACE/PID`, enough
/// for another coordinator on the same machine (and PID namespace) to see
/// that it is gone. A data dir copied or a lock file removed does not
/// make two coordinators one.
pub fn process_instance() -> String {
    format!("{}/{}/{}", boot_id(), pid_namespace(), std::process::id())
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn pid_namespace() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// True only when `instance` names a process of this machine's boot and
/// this PID namespace that no longer exists. Anything else (another
/// machine, a container, an unreadable boot id) is never taken for gone:
/// its lease is waited out.
pub fn process_gone(instance: &str) -> bool {
    let mut parts = instance.rsplitn(3, '/');
    let (Some(pid), Some(ns), Some(boot)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    if boot.is_empty() || ns.is_empty() || boot != boot_id() || ns != pid_namespace() || pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 sends nothing; it asks whether the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    !alive && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// The lease keeper's thread: renews the lease every [`RENEW_EVERY`] on
/// a connection of its own to `url`, records this coordinator's address and learns
/// the others' (calling `addrs_changed` when they change, to rewrite the
/// tickets), until `stop` says to, then ends the lease so a standby takes
/// over at once. Returns when the lease is lost.
pub fn keep(
    lease: Arc<Lease>,
    url: &str,
    me: Me,
    addrs_changed: impl Fn(&[SocketAddr]),
    stop: std::sync::mpsc::Receiver<()>,
) {
    let addr = me.addr.to_string();
    let mut failing = false;
    let mut connection: Option<Db> = None;
    for round in 0u64.. {
        match stop.recv_timeout(RENEW_EVERY) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => {
                let released = connection
                    .as_ref()
                    .map(|db| db.release_lease(lease.generation));
                if let Some(Err(e)) = released {
                    tracing::warn!("cannot end the lease for a standby to take over: {e}");
                }
                return;
            }
        }
        let started = Instant::now();
        let db = match &connection {
            Some(db) => db,
            None => match Db::connect(url) {
                Ok(db) => connection.insert(db),
                Err(e) => {
                    if !failing {
                        tracing::error!("cannot reach the state to renew the lease: {e}");
                    }
                    failing = true;
                    continue;
                }
            },
        };
        match db.claim_lease(lease.generation, &me.instance, &addr, LEASE_TTL, None) {
            Ok(Claim::Ours) => {
                if failing {
                    tracing::info!(
                        valid_again = lease.valid(),
                        "the lease is renewed: the database is back"
                    );
                }
                failing = false;
                lease.renewed(started);
            }
            Ok(Claim::Theirs(taker)) => {
                tracing::error!(
                    generation = taker.generation,
                    addr = %taker.addr,
                    "another coordinator took the farm over: this one stops"
                );
                lease.lose(taker);
                return;
            }
            Err(e) => {
                if !failing {
                    tracing::error!(
                        "cannot renew the lease ({e}): dispatch and commits stop when it ends, \
                         in {} ms, until it is renewed",
                        LEASE_TTL.saturating_sub(MARGIN).as_millis()
                    );
                }
                failing = true;
                continue;
            }
        }
        // Its address, and the others', every few seconds.
        if round % 5 == 0 {
            let others = db
                .register_coordinator(&addr, lease.generation)
                .and_then(|()| db.coordinator_addrs(tessera_protocol::ticket::MAX_ADDRS));
            match others {
                Ok(others) => {
                    if lease.name_others(&others) {
                        addrs_changed(&lease.addrs());
                    }
                }
                Err(e) => tracing::debug!("cannot read the coordinators' addresses: {e}"),
            }
        }
    }
}

/// Takes the lease for a coordinator that is starting, as `me`: at once
/// when nobody holds it, when it ended, or when it is `me`'s own data
/// dir's (a run of it that is gone). When another coordinator holds it,
/// waits for it to end with `standby`, and otherwise fails, naming that
/// coordinator. Returns the generation it holds the lease as and when the
/// claim that was granted began. Blocks: run it on the blocking pool.
pub fn acquire(db: &mut Db, me: &Me, standby: bool) -> anyhow::Result<(u64, Instant)> {
    // Who held the lease when this one last said so.
    let mut said: Option<(u64, String)> = None;
    let mut out_of_reach = false;
    let mut looks = 0u64;
    loop {
        let holder = match look(db, me) {
            Ok(Looked::Ours(taken)) => return Ok(taken),
            Ok(Looked::Held(holder)) => holder,
            Ok(Looked::Again) => continue,
            // A standby outlasts a database restart: it waits for it.
            Err(e) if standby && e.is_unreachable() => {
                if !out_of_reach {
                    tracing::warn!("standing by: the state is out of reach ({e}); waiting for it");
                    out_of_reach = true;
                }
                std::thread::sleep(STANDBY_LOOK_EVERY * 4);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        out_of_reach = false;
        if !standby {
            anyhow::bail!(
                "another coordinator serves this farm: the one at {} (generation {}) holds its \
                 lease, which it renews every {} s. Two coordinators must not serve one farm; \
                 to start this one as its standby, which takes over when it stops, pass \
                 --standby",
                holder.addr,
                holder.generation,
                RENEW_EVERY.as_secs()
            );
        }
        // Still here: tickets keep naming this standby.
        looks += 1;
        if looks.is_multiple_of(20) {
            if let Err(e) = db.register_coordinator(&me.addr.to_string(), 0) {
                tracing::debug!("cannot record this standby's address: {e}");
            }
        }
        let now = Some((holder.generation, holder.addr.clone()));
        if said != now {
            tracing::info!(
                active = %holder.addr,
                generation = holder.generation,
                "standing by: another coordinator serves the farm; taking over when its lease ends"
            );
            said = now;
        }
        std::thread::sleep(STANDBY_LOOK_EVERY);
    }
}

/// What one look at the lease found.
enum Looked {
    /// Taken: the generation and when its claim began.
    Ours((u64, Instant)),
    Held(Holder),
    /// Another standby was quicker, or nobody holds it: look again.
    Again,
}

fn look(db: &mut Db, me: &Me) -> Result<Looked, crate::db::DbError> {
    let holder = db.lease_holder()?;
    // A holder whose process is gone (a coordinator killed on this machine
    // and started again) is replaced at once, not when its lease ends.
    let replacing = (holder.as_ref())
        .filter(|h| h.ends_in_ms > 0 && process_gone(&h.instance))
        .map(|h| h.generation);
    let free = replacing.is_some() || holder.as_ref().is_none_or(|h| h.ends_in_ms <= 0);
    if !free {
        return Ok(holder.map_or(Looked::Again, Looked::Held));
    }
    // A new generation at takeover: epochs only grow.
    let generation = db.next_generation()?;
    let started = Instant::now();
    let addr = me.addr.to_string();
    match db.claim_lease(generation, &me.instance, &addr, LEASE_TTL, replacing)? {
        Claim::Ours => Ok(Looked::Ours((generation, started))),
        Claim::Theirs(_) => Ok(Looked::Again),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_valid_until_its_ttl_less_the_margin_after_its_claim() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(Lease::sole(addr).valid());
        let lease = Lease::held(3, Instant::now(), addr);
        assert!(lease.valid());
        let long_ago = Instant::now() - LEASE_TTL;
        let stale = Lease::held(3, long_ago, addr);
        assert!(!stale.valid(), "a claim older than the TTL is over");
        stale.renewed(Instant::now());
        assert!(stale.valid(), "a renewal makes it valid again");
        stale.renewed(long_ago);
        assert!(stale.valid(), "an older renewal never shortens it");
        stale.lose(Holder {
            generation: 4,
            instance: "b".into(),
            addr: "127.0.0.1:2".into(),
            ends_in_ms: 5000,
        });
        assert!(stale.lost() && !stale.valid());
        assert_eq!(stale.taker().unwrap().generation, 4);
    }

    #[test]
    fn only_a_process_of_this_machine_that_is_gone_is_taken_for_gone() {
        let me = process_instance();
        assert!(!process_gone(&me), "this process runs");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let dead = format!("{}/{}/{pid}", boot_id(), pid_namespace());
        assert!(process_gone(&dead), "{dead}");
        // Another machine, another PID namespace, or garbage: never gone.
        assert!(!process_gone(&format!(
            "another-boot/{}/{pid}",
            pid_namespace()
        )));
        assert!(!process_gone(&format!("{}/pid:[1]/{pid}", boot_id())));
        for junk in [
            "",
            "x",
            "a/b/c",
            "//",
            &format!("{}/{}/-1", boot_id(), pid_namespace()),
        ] {
            assert!(!process_gone(junk), "{junk}");
        }
    }

    #[test]
    fn tickets_name_this_coordinator_first_and_each_other_once() {
        let (a, b, c) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            "127.0.0.1:3".parse().unwrap(),
        );
        let lease = Lease::sole(a);
        assert!(lease.set_others(&[b, a, c]));
        assert_eq!(lease.addrs(), vec![a, b, c]);
        assert!(!lease.set_others(&[a, b, c]), "the same set is no change");
    }
}
