//! Limits on peers that have not proved a secret yet: how many may be in
//! their handshake at once, in total and from one address, and when a peer
//! must first prove its address with a QUIC Retry. A peer over either limit
//! is refused before any cryptography is done for it; one within them holds
//! its place only until its `Hello` is checked or the handshake deadline
//! passes.
//!
//! Address validation: a QUIC Initial costs its sender one datagram and can
//! carry any source address, so a place taken at the first Initial can be
//! held by a spoofer that never answers. While the places are under
//! pressure (a quarter of them taken, in total or from one address), and
//! always for an address whose last connection failed recently (its
//! handshake or `Hello` did not succeed), a peer that has not proved its
//! address is sent a Retry and takes no place; it takes one when it comes
//! back with the Retry's token, which only a peer that receives packets at
//! that address can do. A spoofed address that fails is therefore never a
//! lock-out: its real owner pays one round trip.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Unauthenticated connections held at once, from everyone.
pub(crate) const MAX_UNAUTHENTICATED: usize = 512;
/// Unauthenticated connections held at once from one address (a studio
/// behind one NAT address restarting many workers together stays under it).
pub(crate) const MAX_UNAUTHENTICATED_PER_ADDR: usize = 64;
/// From this many places held in total, a peer must prove its address.
pub(crate) const PRESSURE: usize = MAX_UNAUTHENTICATED / 4;
/// From this many places held by one address, a peer from it must prove
/// its address.
pub(crate) const PRESSURE_PER_ADDR: usize = MAX_UNAUTHENTICATED_PER_ADDR / 4;
/// How long an address whose connection failed must prove itself.
pub(crate) const FAILURE_MEMORY: Duration = Duration::from_secs(5 * 60);
/// Addresses remembered as failed at most (the oldest are forgotten first).
pub(crate) const MAX_REMEMBERED_FAILURES: usize = 4096;

/// The gate: places held now and addresses that failed recently.
pub(crate) struct Gate {
    /// Whether Retry is ever demanded (off only for the benchmark's
    /// side-by-side run without validation).
    validate: bool,
    state: Mutex<Counts>,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            validate: true,
            state: Mutex::default(),
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_addr: HashMap<IpAddr, usize>,
    /// Each remembered address's latest failure.
    failed: HashMap<IpAddr, Instant>,
    /// Failures in the order they happened, to forget the oldest first.
    failures: VecDeque<(Instant, IpAddr)>,
}

/// What a new connection attempt gets.
#[derive(Debug)]
pub(crate) enum Entry {
    /// A place: go ahead with the handshake.
    Pass(Pass),
    /// Prove the address first: answer with a Retry, take no place.
    Retry(Why),
    /// A limit is reached: refuse.
    Refuse,
}

/// Why a Retry is demanded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// A quarter of all places are held.
    Pressure,
    /// A quarter of the places one address may hold are held by it.
    AddressPressure,
    /// The address's last connection failed less than
    /// [`FAILURE_MEMORY`] ago.
    RecentFailure,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Why::Pressure => "pre-auth places under pressure",
            Why::AddressPressure => "pre-auth places of this address under pressure",
            Why::RecentFailure => "a recent failure from this address",
        })
    }
}

/// One unauthenticated connection's place; dropping it frees the place.
pub(crate) struct Pass {
    gate: Arc<Gate>,
    addr: IpAddr,
}

impl Gate {
    /// A gate that never demands a Retry (the old behaviour, for the
    /// benchmark's side-by-side run).
    pub fn without_validation() -> Gate {
        Gate {
            validate: false,
            ..Gate::default()
        }
    }

    /// What a connection attempt from `addr` gets at `now`; `validated`
    /// says whether it proved its address (it carries a token the
    /// coordinator issued to that address).
    pub fn enter(self: &Arc<Self>, addr: IpAddr, validated: bool, now: Instant) -> Entry {
        let mut counts = self.counts();
        let from_addr = counts.per_addr.get(&addr).copied().unwrap_or(0);
        if self.validate && !validated {
            let why = if counts.total >= PRESSURE {
                Some(Why::Pressure)
            } else if from_addr >= PRESSURE_PER_ADDR {
                Some(Why::AddressPressure)
            } else if counts.recently_failed(addr, now) {
                Some(Why::RecentFailure)
            } else {
                None
            };
            if let Some(why) = why {
                return Entry::Retry(why);
            }
        }
        if counts.total >= MAX_UNAUTHENTICATED || from_addr >= MAX_UNAUTHENTICATED_PER_ADDR {
            return Entry::Refuse;
        }
        counts.total += 1;
        *counts.per_addr.entry(addr).or_default() += 1;
        Entry::Pass(Pass {
            gate: self.clone(),
            addr,
        })
    }

    /// Whether a peer that has not proved its address is sent a Retry now
    /// whatever its address (for the log).
    pub fn under_pressure(&self) -> bool {
        self.validate && self.counts().total >= PRESSURE
    }

    /// Unauthenticated connections held now.
    pub fn held(&self) -> usize {
        self.counts().total
    }

    /// The counts stay right whatever panicked while holding them.
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Counts {
    /// Whether `addr` failed less than [`FAILURE_MEMORY`] before `now`;
    /// forgets failures older than that.
    fn recently_failed(&mut self, addr: IpAddr, now: Instant) -> bool {
        self.forget(|at| now.saturating_duration_since(at) >= FAILURE_MEMORY);
        self.failed.contains_key(&addr)
    }

    fn record_failure(&mut self, addr: IpAddr, now: Instant) {
        self.forget(|at| now.saturating_duration_since(at) >= FAILURE_MEMORY);
        if self.failures.len() >= MAX_REMEMBERED_FAILURES {
            self.forget_oldest();
        }
        if self.failed.insert(addr, now) != Some(now) {
            self.failures.push_back((now, addr));
        }
    }

    /// Forgets the oldest failures while `old` says they are old.
    fn forget(&mut self, old: impl Fn(Instant) -> bool) {
        while self.failures.front().is_some_and(|&(at, _)| old(at)) {
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((at, addr)) = self.failures.pop_front() {
            // A later failure of the same address keeps it remembered.
            if self.failed.get(&addr) == Some(&at) {
                self.failed.remove(&addr);
            }
        }
    }
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pass({})", self.addr)
    }
}

impl Pass {
    /// The connection failed (no handshake, no `Hello` in time, a refused
    /// `Hello`): its address must prove itself for [`FAILURE_MEMORY`].
    /// Frees the place.
    pub fn failed(self, now: Instant) {
        self.gate.counts().record_failure(self.addr, now);
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut counts = self.gate.counts();
        counts.total -= 1;
        if let Some(n) = counts.per_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                counts.per_addr.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: usize) -> IpAddr {
        IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8])
    }

    fn pass(entry: Entry) -> Pass {
        match entry {
            Entry::Pass(p) => p,
            other => panic!("expected a place, got {other:?}"),
        }
    }

    fn why(entry: Entry) -> Option<Why> {
        match entry {
            Entry::Retry(why) => Some(why),
            _ => None,
        }
    }

    #[test]
    fn limits_hold_per_address_and_in_total_and_places_come_back() {
        let gate = Arc::new(Gate::default());
        let now = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let passes: Vec<Pass> = (0..MAX_UNAUTHENTICATED_PER_ADDR)
            .map(|_| pass(gate.enter(a, true, now)))
            .collect();
        assert!(
            matches!(gate.enter(a, true, now), Entry::Refuse),
            "over the per-address limit"
        );
        drop(passes);
        assert_eq!(gate.held(), 0);
        pass(gate.enter(a, true, now));

        // Many addresses: the total caps them.
        let mut held = Vec::new();
        for i in 0..MAX_UNAUTHENTICATED {
            held.push(pass(gate.enter(addr(i), true, now)));
        }
        assert!(matches!(
            gate.enter("198.51.100.7".parse().unwrap(), true, now),
            Entry::Refuse
        ));
        assert_eq!(gate.held(), MAX_UNAUTHENTICATED);
        held.clear();
        assert_eq!(gate.held(), 0);
        assert!(
            gate.counts().per_addr.is_empty(),
            "nothing per address is kept"
        );
    }

    /// Who gets a Retry, as (places held in total, by the address, whether
    /// it failed recently, whether it proved its address) → expected.
    #[test]
    fn a_retry_is_demanded_under_pressure_and_after_a_failure_unless_validated() {
        let cases = [
            // (total held, held by the address, failed recently, validated) → retry
            ((0, 0, false, false), None),
            ((PRESSURE - 1, 0, false, false), None),
            ((PRESSURE, 0, false, false), Some(Why::Pressure)),
            ((PRESSURE, 0, false, true), None),
            (
                (PRESSURE_PER_ADDR, PRESSURE_PER_ADDR - 1, false, false),
                None,
            ),
            (
                (PRESSURE_PER_ADDR, PRESSURE_PER_ADDR, false, false),
                Some(Why::AddressPressure),
            ),
            ((PRESSURE_PER_ADDR, PRESSURE_PER_ADDR, false, true), None),
            ((0, 0, true, false), Some(Why::RecentFailure)),
            ((0, 0, true, true), None),
            ((PRESSURE, 0, true, false), Some(Why::Pressure)),
        ];
        let target: IpAddr = "203.0.113.9".parse().unwrap();
        for ((total, own, failed, validated), expected) in cases {
            let gate = Arc::new(Gate::default());
            let now = Instant::now();
            if failed {
                pass(gate.enter(target, true, now)).failed(now);
            }
            let mut held: Vec<Pass> = (0..own)
                .map(|_| pass(gate.enter(target, true, now)))
                .collect();
            held.extend((0..total - own).map(|i| pass(gate.enter(addr(i), true, now))));
            let entry = gate.enter(target, validated, now);
            // A Retry takes no place; a place is taken otherwise.
            let now_held = gate.held();
            let input = (total, own, failed, validated);
            assert_eq!(why(entry), expected, "{input:?}");
            let more = usize::from(expected.is_none());
            assert_eq!(now_held, total + more, "{input:?}");
        }
    }

    #[test]
    fn failures_are_forgotten_after_the_memory_and_past_the_bound() {
        let gate = Arc::new(Gate::default());
        let t0 = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        pass(gate.enter(a, false, t0)).failed(t0);
        let later = |d: Duration| gate.enter(a, false, t0 + d);
        assert_eq!(
            why(later(FAILURE_MEMORY - Duration::from_secs(1))),
            Some(Why::RecentFailure)
        );
        // Remembered from its latest failure.
        let t1 = t0 + Duration::from_secs(60);
        pass(gate.enter(a, true, t1)).failed(t1);
        assert_eq!(why(later(FAILURE_MEMORY)), Some(Why::RecentFailure));
        let p = pass(later(FAILURE_MEMORY + Duration::from_secs(60)));
        drop(p);
        assert!(gate.counts().failed.is_empty());

        // A flood of failing addresses keeps the newest.
        for i in 0..2 * MAX_REMEMBERED_FAILURES {
            pass(gate.enter(addr(i), false, t1)).failed(t1);
        }
        let counts = gate.counts();
        assert_eq!(counts.failed.len(), MAX_REMEMBERED_FAILURES);
        assert_eq!(counts.failures.len(), MAX_REMEMBERED_FAILURES);
        assert!(counts
            .failed
            .contains_key(&addr(2 * MAX_REMEMBERED_FAILURES - 1)));
        assert!(!counts.failed.contains_key(&addr(0)));
    }

    #[test]
    fn without_validation_no_retry_is_demanded() {
        let gate = Arc::new(Gate::without_validation());
        let now = Instant::now();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        pass(gate.enter(a, false, now)).failed(now);
        let held: Vec<Pass> = (0..PRESSURE)
            .map(|i| pass(gate.enter(addr(i), false, now)))
            .collect();
        pass(gate.enter(a, false, now));
        assert!(!gate.under_pressure());
        drop(held);
    }
}
