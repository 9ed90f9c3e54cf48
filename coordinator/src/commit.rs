//! Durable results: the group-commit thread writes accepted results to the
//! database in batches, and only then does the farm core acknowledge them
//! and count them ("durable before acknowledged").

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::db::NewResult;
use crate::farm::{AcceptedResult, CommitFailure};
use crate::server::Shared;

/// Most results written in one transaction.
const MAX_BATCH: usize = 4096;

/// The environment variable naming a failpoint, for tests that kill the
/// coordinator at one exact moment.
pub const FAILPOINT: &str = "TESSERA_FAILPOINT";
/// Ends the process right after the first committed batch, before any of
/// its results is acknowledged.
pub const FAILPOINT_EXIT_AFTER_COMMIT: &str = "exit-after-commit";
/// The first committed batch is reported to the farm core as refused by
/// an outage: a commit whose answer was lost and whose retries ran out,
/// with its rows in the database all the same.
pub const FAILPOINT_LOSE_FIRST_ANSWER: &str = "lose-first-commit-answer";
/// The stitcher aborts the coordinator once a frame's passes are stitched
/// and recorded, before its finishing task is handed out.
pub const FAILPOINT_EXIT_AFTER_PASSES: &str = "exit-after-passes";

/// What the commit thread is given.
pub(crate) enum CommitMsg {
    /// A result the scheduler accepted, to be made durable.
    Result(AcceptedResult),
    /// A lease handed to an enrolled identity (recorded, not waited for).
    Lease(tessera_protocol::messages::TaskRef, String),
    /// Committed results withdrawn (and the frames they made).
    Withdraw {
        job: u64,
        tasks: Vec<u32>,
        frames: Vec<u32>,
    },
    /// Finish what came before, then end.
    Stop,
}

/// The group-commit thread: writes accepted results in batches, then hands
/// the outcome to the farm core, which acknowledges and counts them and
/// asks for the frames they complete.
pub(crate) fn committer(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<CommitMsg>) {
    let failpoint = std::env::var(FAILPOINT).ok();
    let exit_after_commit = failpoint.as_deref() == Some(FAILPOINT_EXIT_AFTER_COMMIT);
    let mut lose_answer = failpoint.as_deref() == Some(FAILPOINT_LOSE_FIRST_ANSWER);
    let mut outage = Outage::default();
    let mut stop = false;
    while !stop {
        let Some(first) = rx.blocking_recv() else {
            return;
        };
        let mut batch = Vec::new();
        let mut leases = Vec::new();
        // A withdrawal ends a batch: it applies after what came before it.
        let mut withdraw = None;
        let mut msg = Some(first);
        while let Some(m) = msg.take() {
            match m {
                CommitMsg::Result(c) => batch.push(c),
                CommitMsg::Lease(t, identity) => leases.push((t.job, t.index, t.epoch, identity)),
                CommitMsg::Withdraw { job, tasks, frames } => {
                    withdraw = Some((job, tasks, frames));
                    break;
                }
                CommitMsg::Stop => {
                    stop = true;
                    break;
                }
            }
            if batch.len() + leases.len() >= MAX_BATCH {
                break;
            }
            msg = rx.try_recv().ok();
        }
        if !leases.is_empty() {
            if let Err(e) = shared.db().record_leases(&leases) {
                tracing::warn!("cannot record leases: {e}");
            }
        }
        if !batch.is_empty() {
            let lost = commit_results(&shared, batch, exit_after_commit, lose_answer, &mut outage);
            lose_answer &= !lost;
        }
        if let Some((job, tasks, frames)) = withdraw {
            if let Err(e) = shared.db().withdraw(job, &tasks, &frames) {
                tracing::error!(job, "cannot withdraw results: {e}");
            }
        }
    }
}

/// How often a store outage that goes on is said again in the log.
const OUTAGE_SAID_EVERY: Duration = Duration::from_secs(10);

/// The store being out of reach when results commit, as the log tells it:
/// the first refusal at once, then a line with the count every
/// [`OUTAGE_SAID_EVERY`], and its end.
#[derive(Debug, Default)]
struct Outage {
    began: Option<Instant>,
    said: Option<Instant>,
    /// Results refused since the last line, and in all.
    unsaid: u64,
    refused: u64,
}

impl Outage {
    /// `n` results refused at `now`: the count to say now, if it is time.
    fn refused(&mut self, n: usize, now: Instant) -> Option<u64> {
        self.began.get_or_insert(now);
        self.unsaid += n as u64;
        self.refused += n as u64;
        if self.said.is_some_and(|said| now < said + OUTAGE_SAID_EVERY) {
            return None;
        }
        self.said = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }

    /// Results durable again at `now`: how long the outage lasted and the
    /// results it refused, if there was one.
    fn over(&mut self, now: Instant) -> Option<(Duration, u64)> {
        let began = self.began?;
        let refused = self.refused;
        *self = Outage::default();
        Some((now - began, refused))
    }
}

/// How long work that needs the database (a batch of results, a stitch)
/// waits for it while it cannot be reached (PostgreSQL restarting or
/// failing over) before that work fails.
pub const UNREACHABLE_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `f` (which takes the database's lock itself, so it is not held
/// while waiting); while it fails because the database cannot be reached,
/// runs it again (reconnecting) for up to [`UNREACHABLE_PATIENCE`]. Meant
/// for the commit and stitch threads: nothing is acknowledged meanwhile.
pub(crate) fn patiently<T, E>(what: &str, mut f: impl FnMut() -> Result<T, E>) -> Result<T, E>
where
    E: std::fmt::Display + Unreachable,
{
    let began = Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        match f() {
            Err(e) if e.unreachable() && began.elapsed() < UNREACHABLE_PATIENCE => {
                tracing::warn!("cannot {what}, trying again: {e}");
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            outcome => return outcome,
        }
    }
}

/// An error that may say the database could not be reached.
pub(crate) trait Unreachable {
    fn unreachable(&self) -> bool;
}

impl Unreachable for crate::db::DbError {
    fn unreachable(&self) -> bool {
        self.is_unreachable()
    }
}

/// True when `e` is a database failure that is not the work's fault (see
/// [`crate::db::DbError::is_transient`]).
pub(crate) fn is_transient(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<crate::db::DbError>()
            .is_some_and(crate::db::DbError::is_transient)
    })
}

impl Unreachable for anyhow::Error {
    fn unreachable(&self) -> bool {
        self.chain().any(|c| {
            c.downcast_ref::<crate::db::DbError>()
                .is_some_and(crate::db::DbError::is_unreachable)
        })
    }
}

/// Writes one batch of results, then lets the core acknowledge them.
/// With `lose_answer` (a failpoint), a committed batch is reported to the
/// core as refused, and true is returned.
fn commit_results(
    shared: &Arc<Shared>,
    batch: Vec<AcceptedResult>,
    exit_after_commit: bool,
    lose_answer: bool,
    outage: &mut Outage,
) -> bool {
    let rows: Vec<NewResult<'_>> = batch
        .iter()
        .map(|c| NewResult {
            job: c.task.job,
            index: c.task.index,
            output: c.output,
            render_ms: c.render_ms,
            worker: &c.worker_name,
            epoch: c.task.epoch,
        })
        .collect();
    let jobs: Vec<u64> = batch.iter().map(|c| c.task.job).collect();
    let costs = shared.read(|core, _| core.closed_costs(&jobs));
    // The outputs first: a result is durable, blob and row, before it
    // is acknowledged.
    let outputs: Vec<_> = batch.iter().map(|c| c.output).collect();
    let synced = shared.store.inner().sync(&outputs);
    if synced.is_ok() {
        if let Some((lasted, refused)) = outage.over(Instant::now()) {
            tracing::warn!(
                refused,
                "results are durable again, after {:.1} s of the store out of reach",
                lasted.as_secs_f64()
            );
        }
    }
    let outcome = match synced {
        Ok(()) => patiently("commit results", || {
            shared.db().insert_results(&rows, &costs)
        })
        // The database out of reach, or the farm served by another
        // coordinator now: the results are refused and their tasks run
        // again; the jobs go on.
        .map_err(|e| CommitFailure {
            transient: e.is_transient(),
            reason: e.to_string(),
        }),
        // The bucket out of reach, or refusing (a revoked key), is an
        // outage like the database's: the results are refused and their
        // tasks run again; no job fails for it.
        Err(e) => {
            // Refused tasks run again at once: said once, then every
            // OUTAGE_SAID_EVERY with the count, not at each refusal.
            if let Some(refused) = outage.refused(batch.len(), Instant::now()) {
                tracing::warn!(
                    refused,
                    "cannot make results durable, refusing them (their tasks run again): {e}"
                );
            }
            Err(CommitFailure {
                transient: tessera_store::backed::is_the_buckets(&e),
                reason: format!("cannot make the outputs durable: {e}"),
            })
        }
    };
    if exit_after_commit && outcome.is_ok() {
        // The test of "durable before acknowledged": die like a killed
        // process, with the batch committed and nothing acknowledged.
        tracing::warn!(
            results = batch.len(),
            "failpoint: exiting after a commit, before its acknowledgements"
        );
        std::process::abort();
    }
    let lost = lose_answer && outcome.is_ok();
    let outcome = if lost {
        tracing::warn!(
            results = batch.len(),
            "failpoint: a committed batch reported as refused by an outage"
        );
        Err(CommitFailure {
            transient: true,
            reason: "failpoint: the commit's answer was lost".into(),
        })
    } else {
        outcome
    };
    shared.update(|core, now| core.committed(&batch, outcome, now));
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_outage_is_said_at_once_then_every_ten_seconds_with_the_count_then_its_end() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut outage = Outage::default();
        assert_eq!(outage.over(at(0)), None, "no outage, nothing to say");
        assert_eq!(outage.refused(2, at(0)), Some(2));
        // Refused tasks come back at once, 27 a second: said again only
        // once 10 s passed, with the refusals since the last line.
        let said: Vec<_> = (1..=300)
            .filter_map(|i| outage.refused(1, at(i * 37)))
            .collect();
        assert_eq!(said, [271], "the 271st came 10.027 s in");
        assert_eq!(outage.refused(1, at(15_000)), None);
        assert_eq!(
            outage.over(at(16_000)),
            Some((Duration::from_secs(16), 303))
        );
        assert_eq!(outage.over(at(17_000)), None, "said once");
        assert_eq!(
            outage.refused(1, at(18_000)),
            Some(1),
            "a new outage is said at once"
        );
    }
}
