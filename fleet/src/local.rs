//! The `local` provider: each node is a `tessera worker` process on this
//! machine, for a single box with a GPU or a few. The ticket goes into the
//! process's environment (`TESSERA_WORKER_TICKET`), never its arguments; a
//! release sends SIGTERM (the worker hands its leases back) and SIGKILL
//! after a grace period.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::provider::{Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError};

pub struct LocalProvider {
    name: String,
    binary: PathBuf,
    work_dir: PathBuf,
    offer: Offer,
    children: HashMap<NodeId, Child>,
    /// How long a released worker has to stop after SIGTERM.
    pub grace: Duration,
}

impl LocalProvider {
    /// Workers run `binary` with their cache folders and logs under
    /// `work_dir`, reported to cost `usd_per_hour` on a `gpu`.
    pub fn new(
        name: &str,
        binary: PathBuf,
        work_dir: PathBuf,
        gpu: &str,
        usd_per_hour: f64,
    ) -> Self {
        LocalProvider {
            name: name.to_string(),
            binary,
            work_dir,
            offer: Offer {
                id: format!("{name}-node"),
                gpu: gpu.to_string(),
                gpu_count: 1,
                vram_gib: 0,
                usd_per_hour,
                interruptible: false,
                region: None,
                billing: Billing::Increment(1),
            },
            children: HashMap::new(),
            grace: Duration::from_secs(30),
        }
    }

    /// The process id of a node's worker (tests kill it for real).
    pub fn pid(&self, node: &NodeId) -> Option<u32> {
        self.children.get(node).map(|c| c.id())
    }
}

/// `tessera worker` arguments every fleet node gets: its name (so the
/// fleet matches node and worker) and the price it is billed at.
pub fn worker_args(spec: &LaunchSpec, offer: &Offer) -> Vec<String> {
    let mut args = vec![
        "worker".to_string(),
        "--name".to_string(),
        spec.name.clone(),
        "--price-per-hour".to_string(),
        format!("{}", offer.usd_per_hour),
    ];
    if offer.interruptible {
        args.push("--interruptible".to_string());
    }
    args.extend(spec.worker_args.iter().cloned());
    args
}

impl Provider for LocalProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        Ok(vec![self.offer.clone()])
    }

    fn launch(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        let dir = self.work_dir.join(&spec.name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| ProviderError::Other(format!("cannot create {}: {e}", dir.display())))?;
        let log = std::fs::File::create(dir.join("worker.log"))
            .map_err(|e| ProviderError::Other(format!("cannot create the worker log: {e}")))?;
        let err = log
            .try_clone()
            .map_err(|e| ProviderError::Other(e.to_string()))?;
        let mut args = worker_args(spec, offer);
        args.extend([
            "--cache-dir".to_string(),
            dir.join("cache").display().to_string(),
        ]);
        let child = Command::new(&self.binary)
            .args(&args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env("TESSERA_WORKER_TICKET", spec.worker_ticket.expose())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                ProviderError::Other(format!("cannot start {}: {e}", self.binary.display()))
            })?;
        let id = NodeId(spec.name.clone());
        self.children.insert(id.clone(), child);
        Ok(id)
    }

    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        let Some(child) = self.children.get_mut(node) else {
            return Ok(NodeState::Gone);
        };
        match child.try_wait() {
            Ok(None) => Ok(NodeState::Running),
            _ => {
                self.children.remove(node);
                Ok(NodeState::Gone)
            }
        }
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let Some(mut child) = self.children.remove(node) else {
            return Ok(());
        };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: a plain signal to a child this provider started and
            // has not reaped, so the pid is still its own.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let until = Instant::now() + self.grace;
        while Instant::now() < until {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok(())
    }
}

impl Drop for LocalProvider {
    /// Nothing keeps running after the fleet: every worker is stopped.
    fn drop(&mut self) {
        let nodes: Vec<NodeId> = self.children.keys().cloned().collect();
        for n in nodes {
            let _ = self.release(&n);
        }
    }
}
