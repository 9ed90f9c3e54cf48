//! Places for HTTP connections. A connection that has not yet made an
//! authenticated request (in its TLS handshake, sending headers, or with a
//! wrong secret) is *waiting*: waiting places are few per address and
//! bounded in all, and when either bound is reached the oldest waiting
//! connection (of that address, else of all) is closed to make room. So a
//! flood of idle sockets never keeps a newcomer out: it only shortens how
//! long idle sockets live. A connection that made an authenticated request
//! moves to a place of its own, which no waiting connection can take; it
//! keeps it while it is served and while idle between requests (bounded by
//! the header read timeout).
//!
//! Pure bookkeeping under one short lock: no I/O while it is held.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Bounds on the places.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Waiting connections of one address.
    pub waiting_per_address: usize,
    /// Waiting connections in all.
    pub waiting: usize,
    /// Authenticated connections of one address, and in all.
    pub authenticated_per_address: usize,
    pub authenticated: usize,
}

pub const LIMITS: Limits = Limits {
    waiting_per_address: 16,
    waiting: 256,
    authenticated_per_address: 64,
    authenticated: 256,
};

#[derive(Default)]
struct State {
    next: u64,
    /// Waiting connections by age (oldest first): address, whether it
    /// finished its TLS handshake, and the signal that closes it.
    waiting: BTreeMap<u64, (IpAddr, bool, Arc<Notify>)>,
    waiting_of: HashMap<IpAddr, usize>,
    authenticated: usize,
    authenticated_of: HashMap<IpAddr, usize>,
    /// Waiting connections closed to make room, since the start.
    evicted: u64,
}

/// Every connection's place.
pub struct Places {
    limits: Limits,
    state: Mutex<State>,
}

/// One connection's place; it is given back when dropped.
pub struct Place {
    places: Arc<Places>,
    id: u64,
    addr: IpAddr,
    /// Notified when the connection must close to make room.
    evict: Arc<Notify>,
    /// It holds an authenticated place.
    promoted: AtomicBool,
}

impl Places {
    pub fn new(limits: Limits) -> Arc<Places> {
        Arc::new(Places {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    /// A waiting place for a new connection from `addr`, closing the
    /// oldest waiting one of that address, or of all, to make room.
    pub fn admit(self: &Arc<Places>, addr: IpAddr) -> Place {
        let evict = Arc::new(Notify::new());
        let mut s = self.state.lock().expect("places lock");
        let id = s.next;
        s.next += 1;
        s.waiting.insert(id, (addr, false, evict.clone()));
        *s.waiting_of.entry(addr).or_insert(0) += 1;
        // Never the newcomer itself: it has had no chance to shake hands
        // yet, and preferring the unshaken would close every newcomer
        // while handshaken connections that send nothing hold the places.
        if s.waiting_of[&addr] > self.limits.waiting_per_address {
            if let Some(oldest) = oldest(&s, Some(addr), id) {
                evict_waiting(&mut s, oldest);
            }
        }
        if s.waiting.len() > self.limits.waiting {
            if let Some(oldest) = oldest(&s, None, id) {
                evict_waiting(&mut s, oldest);
            }
        }
        Place {
            places: self.clone(),
            id,
            addr,
            evict,
            promoted: AtomicBool::new(false),
        }
    }

    /// (waiting, authenticated) connections now, and how many waiting ones
    /// were closed to make room.
    pub fn counts(&self) -> (usize, usize, u64) {
        let s = self.state.lock().expect("places lock");
        (s.waiting.len(), s.authenticated, s.evicted)
    }
}

/// The waiting connection to close to make room (of `addr`, or of all):
/// the oldest that has not finished its TLS handshake, else the oldest.
/// A handshake costs its peer a round trip and the cryptography; a bare
/// TCP connection costs nothing, so a flood of them never closes a client
/// on a slow link that is past its handshake.
fn oldest(s: &State, addr: Option<IpAddr>, newcomer: u64) -> Option<u64> {
    let of = |id: &u64, a: &IpAddr| *id != newcomer && addr.is_none_or(|addr| *a == addr);
    (s.waiting.iter())
        .find(|(id, (a, shaken, _))| of(id, a) && !shaken)
        .or_else(|| s.waiting.iter().find(|(id, (a, _, _))| of(id, a)))
        .map(|(id, _)| *id)
}

fn evict_waiting(s: &mut State, id: u64) {
    if let Some((addr, _, evict)) = s.waiting.remove(&id) {
        forget(&mut s.waiting_of, addr);
        s.evicted += 1;
        evict.notify_one();
    }
}

fn forget(counts: &mut HashMap<IpAddr, usize>, addr: IpAddr) {
    if let Some(n) = counts.get_mut(&addr) {
        *n -= 1;
        if *n == 0 {
            counts.remove(&addr);
        }
    }
}

impl Place {
    /// The connection finished its TLS handshake: it is closed to make room
    /// only after every waiting one that has not.
    /// The address the connection came from.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn handshaken(&self) {
        let mut s = self.places.state.lock().expect("places lock");
        if let Some(entry) = s.waiting.get_mut(&self.id) {
            entry.1 = true;
        }
    }

    /// The connection made an authenticated request: it leaves the waiting
    /// places for one of its own, when there is one (otherwise it stays
    /// waiting, and may be closed to make room once its request is done).
    pub fn authenticated(&self) {
        let limits = self.places.limits;
        let mut s = self.places.state.lock().expect("places lock");
        if !s.waiting.contains_key(&self.id) {
            return;
        }
        let of = s.authenticated_of.get(&self.addr).copied().unwrap_or(0);
        if s.authenticated >= limits.authenticated || of >= limits.authenticated_per_address {
            return;
        }
        s.waiting.remove(&self.id);
        forget(&mut s.waiting_of, self.addr);
        s.authenticated += 1;
        *s.authenticated_of.entry(self.addr).or_insert(0) += 1;
        self.promoted.store(true, Ordering::Relaxed);
    }

    /// Resolves when the connection must close to make room.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut s = self.places.state.lock().expect("places lock");
        if s.waiting.remove(&self.id).is_some() {
            forget(&mut s.waiting_of, self.addr);
        } else if self.promoted.load(Ordering::Relaxed) {
            s.authenticated -= 1;
            forget(&mut s.authenticated_of, self.addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        waiting_per_address: 2,
        waiting: 3,
        authenticated_per_address: 2,
        authenticated: 3,
    };

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Whether `place` was told to close (without waiting).
    fn evicted(place: &Place) -> bool {
        let notified = place.evict.notified();
        futures_lite_poll(notified)
    }

    fn futures_lite_poll<F: std::future::Future>(f: F) -> bool {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        f.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn the_oldest_waiting_connection_of_an_address_then_of_all_makes_room() {
        let places = Places::new(LIMITS);
        let a1 = places.admit(ip(1));
        let a2 = places.admit(ip(1));
        // A third from the same address closes that address's oldest.
        let a3 = places.admit(ip(1));
        assert!(evicted(&a1));
        assert!(!evicted(&a2) && !evicted(&a3));
        // Another address fills the last place, then one more closes the
        // oldest of all.
        let b1 = places.admit(ip(2));
        assert!(!evicted(&a2));
        let b2 = places.admit(ip(2));
        assert!(evicted(&a2));
        assert!(!evicted(&a3) && !evicted(&b1) && !evicted(&b2));
        assert_eq!(places.counts(), (3, 0, 2));
        drop((a1, a2));
        assert_eq!(places.counts(), (3, 0, 2));
    }

    #[test]
    fn a_connection_past_its_handshake_is_closed_only_after_those_that_are_not() {
        let places = Places::new(LIMITS);
        let slow = places.admit(ip(1));
        slow.handshaken();
        // A flood of bare connections from other addresses: each new one
        // closes the oldest bare one, never the handshaken one.
        let flood: Vec<Place> = (0..20).map(|i| places.admit(ip(2 + i % 8))).collect();
        assert!(!evicted(&slow));
        assert_eq!(places.counts().0, 3);
        // Its own address's bound: bare ones go first there too.
        let mine: Vec<Place> = (0..3).map(|_| places.admit(ip(1))).collect();
        assert!(!evicted(&slow));
        drop((flood, mine));
    }

    #[test]
    fn handshaken_connections_that_send_nothing_never_close_a_newcomer() {
        let places = Places::new(LIMITS);
        // Every waiting place held by handshaken connections that never
        // finish their headers, from 3 addresses.
        let idle: Vec<Place> = (0..3).map(|i| places.admit(ip(10 + i))).collect();
        idle.iter().for_each(Place::handshaken);
        // A client arrives: it keeps its place (the oldest idle one goes),
        // and after its own handshake outlives the next newcomers.
        let client = places.admit(ip(1));
        assert!(!evicted(&client), "the newcomer was closed");
        assert!(evicted(&idle[0]));
        client.handshaken();
        let more: Vec<Place> = (0..2)
            .map(|i| {
                let p = places.admit(ip(20 + i));
                assert!(!evicted(&p));
                p.handshaken();
                p
            })
            .collect();
        assert!(evicted(&idle[1]) && evicted(&idle[2]));
        assert!(
            !evicted(&client),
            "a fresh handshaken client went before older idle ones"
        );
        drop((idle, more));
    }

    #[test]
    fn an_authenticated_connection_holds_a_place_no_waiting_one_can_take() {
        let places = Places::new(LIMITS);
        let a = places.admit(ip(1));
        a.authenticated();
        assert_eq!(places.counts(), (0, 1, 0));
        // Floods of waiting connections, from its address and others.
        let flood: Vec<Place> = (0..50).map(|i| places.admit(ip(1 + i % 5))).collect();
        assert!(!evicted(&a));
        assert_eq!(places.counts().0, 3);
        assert_eq!(places.counts().1, 1);
        drop(flood);
        assert_eq!(places.counts().0, 0);
        // Authenticated places are bounded per address and in all: past
        // them a connection stays waiting.
        let more: Vec<Place> = (0..2).map(|_| places.admit(ip(1))).collect();
        for p in &more {
            p.authenticated();
        }
        assert_eq!(places.counts(), (1, 2, 47));
        drop(a);
        assert_eq!(places.counts(), (1, 1, 47));
        drop(more);
        assert_eq!(places.counts(), (0, 0, 47));
    }
}
