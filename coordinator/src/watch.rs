//! Watching the async runtime: that nothing blocks it, and how late it
//! gets. Three measures, all in `/metrics`:
//!
//! - **Blocking calls**: the database handle ([`crate::shared::Shared::db`])
//!   asks [`must_not_block`] first; on a runtime worker thread that is
//!   counted and logged with the caller's place in the source. Worker
//!   threads are known by the runtime's park hook ([`runtime_thread`],
//!   installed by the binary), so blocking-pool, commit and stitch threads
//!   never count.
//! - **Stalls**: a ticker on the runtime wakes every [`TICK`]; a wake-up
//!   later than [`STALL`] means every runtime thread was busy or blocked
//!   that long (no connection was served meanwhile).
//! - **Heartbeat gaps**: the time between two heartbeats of one worker as
//!   the coordinator handled them (a worker sends one every heartbeat
//!   interval; a longer gap is a late heartbeat, on the network or here).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the stall ticker wakes.
pub const TICK: Duration = Duration::from_millis(50);
/// A wake-up this late is a stall.
pub const STALL: Duration = Duration::from_millis(200);
/// Heartbeat gaps kept for the quantiles.
const GAPS_KEPT: usize = 4096;

thread_local! {
    static ON_RUNTIME: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as a runtime worker: the runtime's park and
/// unpark hooks call this (`tokio::runtime::Builder::on_thread_park`),
/// which run on worker threads only.
pub fn runtime_thread() {
    ON_RUNTIME.with(|c| c.set(true));
}

/// What the watch counted since the start.
#[derive(Default)]
pub(crate) struct Watch {
    pub blocking_calls: AtomicU64,
    pub stalls: AtomicU64,
    /// The latest wake-up's lateness past [`TICK`], most of all, µs.
    pub worst_late_us: AtomicU64,
    gaps: Mutex<Gaps>,
}

#[derive(Default)]
struct Gaps {
    recent: VecDeque<Duration>,
    max: Duration,
    count: u64,
    sum: Duration,
}

/// Heartbeat gaps: p50, p99 of the recent ones, the longest ever, how
/// many were seen and their sum.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GapFigures {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub count: u64,
    pub sum: Duration,
}

impl Watch {
    /// Counts a blocking call made on a runtime thread, if this is one.
    #[track_caller]
    pub fn must_not_block(&self, what: &str) {
        if ON_RUNTIME.with(Cell::get) {
            self.blocking_calls.fetch_add(1, Ordering::Relaxed);
            let at = std::panic::Location::caller();
            tracing::error!(%at, "{what} used on an async runtime thread (it may block every connection)");
        }
    }

    /// One heartbeat handled `gap` after the worker's previous one.
    pub fn heartbeat_gap(&self, gap: Duration) {
        let mut g = self.gaps.lock().unwrap_or_else(|e| e.into_inner());
        if g.recent.len() == GAPS_KEPT {
            g.recent.pop_front();
        }
        g.recent.push_back(gap);
        g.max = g.max.max(gap);
        g.count += 1;
        g.sum += gap;
    }

    pub fn gap_figures(&self) -> GapFigures {
        let g = self.gaps.lock().unwrap_or_else(|e| e.into_inner());
        let mut sorted: Vec<Duration> = g.recent.iter().copied().collect();
        sorted.sort();
        let at = |q: f64| {
            let last = sorted.len().checked_sub(1)?;
            Some(sorted[(last as f64 * q).round() as usize])
        };
        GapFigures {
            p50: at(0.5).unwrap_or_default(),
            p99: at(0.99).unwrap_or_default(),
            max: g.max,
            count: g.count,
            sum: g.sum,
        }
    }

    /// Ticks until its task is aborted, counting late wake-ups.
    pub async fn stall_ticker(&self) {
        let mut last = Instant::now();
        loop {
            tokio::time::sleep(TICK).await;
            let now = Instant::now();
            let late = now.duration_since(last).saturating_sub(TICK);
            last = now;
            self.worst_late_us
                .fetch_max(late.as_micros() as u64, Ordering::Relaxed);
            if late >= STALL {
                self.stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    late_ms = late.as_millis() as u64,
                    "the async runtime stalled: no thread was free to serve"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_blocking_call_counts_on_a_runtime_thread_only() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_park(runtime_thread)
            .on_thread_unpark(runtime_thread)
            .build()
            .unwrap();
        let watch = Arc::new(Watch::default());
        let w = watch.clone();
        runtime.block_on(async move {
            // Let each worker park once (the hook marks it), then call from
            // a task, from the blocking pool, and from a thread of our own.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let on_pool = w.clone();
            tokio::task::spawn_blocking(move || on_pool.must_not_block("test"))
                .await
                .unwrap();
            let own = w.clone();
            std::thread::spawn(move || own.must_not_block("test"))
                .join()
                .unwrap();
            assert_eq!(w.blocking_calls.load(Ordering::Relaxed), 0);
            let on_task = w.clone();
            tokio::spawn(async move { on_task.must_not_block("test") })
                .await
                .unwrap();
        });
        assert_eq!(watch.blocking_calls.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn heartbeat_gaps_give_their_quantiles_and_the_longest() {
        let watch = Watch::default();
        for ms in (1..=100).chain([5000]) {
            watch.heartbeat_gap(Duration::from_millis(ms));
        }
        let g = watch.gap_figures();
        assert_eq!(g.count, 101);
        assert_eq!(g.max, Duration::from_millis(5000));
        assert_eq!(g.p50, Duration::from_millis(51));
        assert_eq!(g.p99, Duration::from_millis(100));
    }
}
