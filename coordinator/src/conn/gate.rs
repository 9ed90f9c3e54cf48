//! Limits on peers that have not proved a secret yet: how many may be in
//! their handshake at once, in total and from one address. A peer over
//! either limit is refused before any cryptography is done for it; one
//! within them holds its place only until its `Hello` is checked or the
//! handshake deadline passes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Unauthenticated connections held at once, from everyone.
pub(crate) const MAX_UNAUTHENTICATED: usize = 512;
/// Unauthenticated connections held at once from one address (a studio
/// behind one NAT address restarting many workers together stays under it).
pub(crate) const MAX_UNAUTHENTICATED_PER_ADDR: usize = 64;

#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    per_addr: HashMap<IpAddr, usize>,
}

/// One unauthenticated connection's place; dropping it frees the place.
pub(crate) struct Pass {
    gate: Arc<Gate>,
    addr: IpAddr,
}

impl Gate {
    /// A place for a connection from `addr`, or `None` when a limit is
    /// reached.
    pub fn enter(self: &Arc<Self>, addr: IpAddr) -> Option<Pass> {
        let mut counts = self.counts();
        let from_addr = counts.per_addr.get(&addr).copied().unwrap_or(0);
        if counts.total >= MAX_UNAUTHENTICATED || from_addr >= MAX_UNAUTHENTICATED_PER_ADDR {
            return None;
        }
        counts.total += 1;
        *counts.per_addr.entry(addr).or_default() += 1;
        Some(Pass {
            gate: self.clone(),
            addr,
        })
    }

    /// Unauthenticated connections held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.counts().total
    }

    /// The counts stay right whatever panicked while holding them.
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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

    #[test]
    fn limits_hold_per_address_and_in_total_and_places_come_back() {
        let gate = Arc::new(Gate::default());
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let passes: Vec<Pass> = (0..MAX_UNAUTHENTICATED_PER_ADDR)
            .map(|_| gate.enter(a).expect("within the per-address limit"))
            .collect();
        assert!(gate.enter(a).is_none(), "over the per-address limit");
        drop(passes);
        assert_eq!(gate.held(), 0);
        assert!(gate.enter(a).is_some(), "places come back when dropped");

        // Many addresses: the total caps them.
        let mut held = Vec::new();
        for i in 0..MAX_UNAUTHENTICATED {
            let addr = IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8]);
            held.push(gate.enter(addr).expect("within the total"));
        }
        assert!(gate.enter("198.51.100.7".parse().unwrap()).is_none());
        assert_eq!(gate.held(), MAX_UNAUTHENTICATED);
        held.clear();
        assert_eq!(gate.held(), 0);
        assert!(
            gate.counts().per_addr.is_empty(),
            "nothing per address is kept"
        );
    }
}
