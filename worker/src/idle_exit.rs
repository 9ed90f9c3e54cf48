//! `--exit-after-idle DUR`: a worker that has had nothing to do for `DUR`
//! leaves by itself, so that a node whose fleet is gone (killed, its machine
//! dead) stops running — and, where the provider's instance stops with its
//! main process, stops billing.
//!
//! "Nothing to do" is precise: the worker holds no task (none rendering,
//! none waiting for a slot, no result waiting to be acknowledged) and has
//! been assigned none for `DUR` — whether it was connected to a coordinator
//! that had no work for it or could not reach one at all. Every assignment
//! and every instant a task is held starts the window again.

use std::time::{Duration, Instant};

/// The idle window and when it last started.
#[derive(Debug)]
pub struct IdleExit {
    bound: Option<Duration>,
    since: Instant,
}

impl IdleExit {
    /// `None`: never leave for idleness.
    pub fn new(bound: Option<Duration>) -> IdleExit {
        IdleExit {
            bound,
            since: Instant::now(),
        }
    }

    /// Work arrived: the window starts again.
    pub fn work(&mut self) {
        self.since = Instant::now();
    }

    /// Whether the worker should leave now, given whether it holds a task;
    /// holding one starts the window again.
    pub fn expired(&mut self, holding: bool) -> bool {
        if holding {
            self.work();
            return false;
        }
        self.bound.is_some_and(|b| self.since.elapsed() >= b)
    }

    /// The bound, for the log line that says why the worker left.
    pub fn bound(&self) -> Option<Duration> {
        self.bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holding_a_task_or_receiving_one_restarts_the_window() {
        let mut never = IdleExit::new(None);
        assert!(!never.expired(false));
        let mut idle = IdleExit::new(Some(Duration::ZERO));
        assert!(idle.expired(false), "no task, window over");
        assert!(!idle.expired(true), "a held task is never idle");
        let mut idle = IdleExit::new(Some(Duration::from_secs(3600)));
        assert!(!idle.expired(false), "within the window");
        idle.since -= Duration::from_secs(3601);
        assert!(idle.expired(false), "past the window with nothing held");
        idle.work();
        assert!(
            !idle.expired(false),
            "an assignment starts the window again"
        );
    }
}
