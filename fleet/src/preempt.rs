//! Draining the workers of nodes that are about to be taken away.
//!
//! A provider marks a node for preemption some minutes before it kills it
//! (CoreWeave: cordon and `qos.coreweave.cloud/pending-preemption`). The
//! fleet then asks the coordinator to drain each worker on it — no new
//! task, running ones finish or are handed back — so that its tasks are
//! back in the queue before the kill instead of waiting for their leases
//! to expire. The coordinator's side is behind [`Drainer`], which the
//! `tessera` binary implements with its client (`tessera drain`).

use std::collections::{BTreeSet, HashSet};

use crate::provider::ProviderError;
use crate::providers::kubernetes::{Kubernetes, PreemptedWorker};

/// Asks the coordinator to drain a worker, by the worker's name.
pub trait Drainer {
    fn drain(&mut self, worker: &str) -> Result<(), String>;
}

/// Remembers which workers were drained, so each is asked once.
#[derive(Default)]
pub struct Preemptions {
    drained: HashSet<String>,
}

impl Preemptions {
    /// Drains every worker on `nodes` not drained before; returns the
    /// workers drained now. A drain that fails is retried the next time.
    pub fn drain_nodes(
        &mut self,
        k8s: &Kubernetes,
        nodes: &BTreeSet<String>,
        drainer: &mut dyn Drainer,
    ) -> Result<Vec<PreemptedWorker>, ProviderError> {
        let mut now = Vec::new();
        for w in k8s.workers_on(nodes)? {
            if self.drained.contains(&w.worker) {
                continue;
            }
            match drainer.drain(&w.worker) {
                Ok(()) => {
                    tracing::info!(worker = %w.worker, node = %w.node, "node marked for preemption: worker drained");
                    self.drained.insert(w.worker.clone());
                    now.push(w);
                }
                Err(e) => {
                    tracing::warn!(worker = %w.worker, node = %w.node, "could not drain the worker of a node marked for preemption: {e}")
                }
            }
        }
        Ok(now)
    }

    /// One round: the nodes a node watch (up to `watch_secs`) marks, plus
    /// those already marked (a list), drained.
    pub fn watch_and_drain(
        &mut self,
        k8s: &Kubernetes,
        watch_secs: u32,
        drainer: &mut dyn Drainer,
    ) -> Result<Vec<PreemptedWorker>, ProviderError> {
        let mut nodes = k8s.preempting_nodes()?;
        nodes.extend(k8s.watch_preemptions(watch_secs)?);
        self.drain_nodes(k8s, &nodes, drainer)
    }
}
