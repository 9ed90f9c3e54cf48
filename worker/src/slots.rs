//! Render slots, taken in the order tasks were assigned. A task fetches its
//! files first and then waits for a slot; without an order, a task assigned
//! second whose files arrived first would take the slot, while the
//! coordinator counts the first one as rendering and the second as queued
//! behind it (pipelined leases): a drain would then hand back, and cancel,
//! the task that renders. With [`Slots`] a task takes a slot only once every
//! task assigned before it has taken one or ended.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

pub struct Slots {
    permits: Arc<Semaphore>,
    /// Turns of tasks that have not taken a slot yet, and the next one.
    waiting: Mutex<(BTreeSet<u64>, u64)>,
    changed: Notify,
}

/// A task's place in the order, from its assignment until it takes a slot
/// (or ends: dropped, it lets the ones after it go).
pub struct Turn {
    slots: Arc<Slots>,
    n: u64,
}

impl Slots {
    pub fn new(slots: usize) -> Arc<Slots> {
        Arc::new(Slots {
            permits: Arc::new(Semaphore::new(slots)),
            waiting: Mutex::new((BTreeSet::new(), 0)),
            changed: Notify::new(),
        })
    }

    /// A place in the order, taken when the task is assigned.
    pub fn turn(self: &Arc<Slots>) -> Turn {
        let mut w = self.waiting.lock().expect("slots lock");
        let n = w.1;
        w.1 += 1;
        w.0.insert(n);
        Turn {
            slots: self.clone(),
            n,
        }
    }

    fn first(&self) -> Option<u64> {
        self.waiting.lock().expect("slots lock").0.first().copied()
    }
}

impl Turn {
    /// Waits until every task assigned before this one has taken a slot
    /// (or ended), then for a free slot (the semaphore is fair).
    pub async fn slot(self) -> OwnedSemaphorePermit {
        loop {
            let changed = self.slots.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Listening before looking: no change is missed in between.
            changed.as_mut().enable();
            if self.slots.first() == Some(self.n) {
                break;
            }
            changed.await;
        }
        let permit = (self.slots.permits.clone())
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        drop(self);
        permit
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.slots
            .waiting
            .lock()
            .expect("slots lock")
            .0
            .remove(&self.n);
        self.slots.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn pending<T>(f: &mut tokio::task::JoinHandle<T>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_task_takes_a_slot_only_after_those_assigned_before_it() {
        let slots = Slots::new(1);
        let (first, second) = (slots.turn(), slots.turn());
        // The second task's files are there first: it waits for the first.
        let mut second = tokio::spawn(second.slot());
        assert!(pending(&mut second).await);
        let held = first.slot().await;
        // The first renders; the second waits for its slot.
        assert!(pending(&mut second).await);
        drop(held);
        let _held = second.await.unwrap();
    }

    #[tokio::test]
    async fn a_task_that_ends_before_its_slot_lets_the_next_one_go() {
        let slots = Slots::new(1);
        let (first, second, third) = (slots.turn(), slots.turn(), slots.turn());
        let mut third = tokio::spawn(third.slot());
        let mut second = tokio::spawn(second.slot());
        assert!(pending(&mut second).await && pending(&mut third).await);
        // The first is canceled while it fetches.
        drop(first);
        let held = second.await.unwrap();
        assert!(pending(&mut third).await);
        drop(held);
        let _held = third.await.unwrap();
    }
}
