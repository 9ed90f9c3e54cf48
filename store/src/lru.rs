//! A size-capped least-recently-used index: which blobs a cache holds, how
//! recently each was used, which are pinned by running work, and which to
//! evict to make room under a byte cap. Plain data: no I/O; the worker's
//! cache keeps one beside its blob folder.

use std::collections::HashMap;

/// Which blobs the cache holds, how recently each was used, and which are
/// pinned by running tasks. Plain data: no I/O.
#[derive(Debug)]
pub struct Lru<K> {
    entries: HashMap<K, Entry>,
    /// Bytes held plus bytes reserved for fetches in flight.
    total: u64,
    clock: u64,
    pins: HashMap<K, u32>,
}

impl<K> Default for Lru<K> {
    fn default() -> Self {
        Lru {
            entries: HashMap::new(),
            total: 0,
            clock: 0,
            pins: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + std::hash::Hash + Ord> Lru<K> {
    /// Records a blob already stored (on start, oldest first).
    pub fn insert(&mut self, digest: K, size: u64) {
        self.clock += 1;
        let entry = Entry {
            size,
            used: self.clock,
        };
        if let Some(old) = self.entries.insert(digest, entry) {
            self.total -= old.size;
        }
        self.total += size;
    }

    pub fn contains(&self, digest: &K) -> bool {
        self.entries.contains_key(digest)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.entries.keys()
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn touch(&mut self, digest: &K) {
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(digest) {
            e.used = self.clock;
        }
    }

    pub fn is_pinned(&self, digest: &K) -> bool {
        self.pins.contains_key(digest)
    }

    pub fn pin(&mut self, digest: K) {
        *self.pins.entry(digest).or_default() += 1;
    }

    pub fn unpin(&mut self, digest: &K) {
        if let Some(n) = self.pins.get_mut(digest) {
            *n -= 1;
            if *n == 0 {
                self.pins.remove(digest);
            }
        }
    }

    /// Makes room for `size` more bytes under `cap` by evicting the least
    /// recently used unpinned blobs, and reserves the room. Returns what to
    /// delete, or `None` (and evicts nothing) when the pinned blobs leave
    /// too little room.
    pub fn reserve(&mut self, size: u64, cap: u64) -> Option<Vec<K>> {
        if self.total + size <= cap {
            self.total += size;
            return Some(Vec::new());
        }
        let mut candidates: Vec<(u64, K, u64)> = self
            .entries
            .iter()
            .filter(|(d, _)| !self.pins.contains_key(d))
            .map(|(d, e)| (e.used, *d, e.size))
            .collect();
        candidates.sort_unstable_by_key(|c| c.0);
        let mut free_after = self.total;
        let mut evict = Vec::new();
        for (_, digest, esize) in candidates {
            if free_after + size <= cap {
                break;
            }
            free_after -= esize;
            evict.push(digest);
        }
        if free_after + size > cap {
            return None;
        }
        for d in &evict {
            let e = self.entries.remove(d).expect("candidate is an entry");
            self.total -= e.size;
        }
        self.total += size;
        Some(evict)
    }

    /// Forgets an entry (its file was removed).
    pub fn remove(&mut self, digest: &K) {
        if let Some(e) = self.entries.remove(digest) {
            self.total -= e.size;
        }
    }

    /// Gives back a reservation (the fetch failed, or it is now an entry).
    pub fn release(&mut self, size: u64) {
        self.total -= size;
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    used: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::Digest;

    fn d(n: u8) -> Digest {
        Digest::of(&[n])
    }

    #[test]
    fn least_recently_used_goes_first_and_pinned_never() {
        let mut lru = Lru::default();
        for n in 1..=4 {
            lru.insert(d(n), 100);
        }
        lru.touch(&d(1)); // order now 2, 3, 4, 1
        lru.pin(d(2));
        // Room for 150 more under 400: evict the two oldest unpinned.
        assert_eq!(lru.reserve(150, 400), Some(vec![d(3), d(4)]));
        assert_eq!(lru.total(), 200 + 150);
        lru.release(150);
        lru.insert(d(5), 150);
        // Only unpinned 1 and 5 can go: 250 bytes; 2 stays pinned.
        assert_eq!(lru.reserve(400, 400), None);
        assert!(lru.contains(&d(2)) && lru.contains(&d(1)) && lru.contains(&d(5)));
        lru.unpin(&d(2));
        let evicted = lru.reserve(400, 400).unwrap();
        assert_eq!(evicted.len(), 3);
        assert_eq!(lru.total(), 400);
    }
}
