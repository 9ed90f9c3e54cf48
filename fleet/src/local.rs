//! The `local` provider: each node is a `tessera worker` process on this
//! machine, for a single box with a GPU or a few. The ticket goes in a file
//! only its owner reads (`WORK_DIR/NAME/worker.ticket`, given as `--ticket
//! @FILE`), never its arguments or environment; the worker inherits only
//! the allow-listed part of the fleet's environment ([`NODE_ENV`]), never a
//! provider's key or the client ticket. A release sends SIGTERM (the worker
//! hands its leases back) and SIGKILL after a grace period.
//!
//! Workers are not tied to the fleet's life on purpose: a fleet killed with
//! SIGKILL leaves them running, so that the fleet started again finds them
//! (`list`: processes running `worker --name PREFIX… --cache-dir
//! WORK_DIR/NAME/cache`) and adopts them; a fleet that never returns leaves
//! them to end by themselves (`--exit-after-idle`). A fleet that stops
//! normally releases every one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::provider::NODE_ENV;
use crate::provider::{
    node_env_allowed, write_ticket_file, Billing, LaunchSpec, NodeId, NodeState, Offer, Provider,
    ProviderError,
};

pub struct LocalProvider {
    name: String,
    binary: PathBuf,
    work_dir: PathBuf,
    offer: Offer,
    children: HashMap<NodeId, Child>,
    /// Workers an earlier run of the fleet started, by pid.
    adopted: HashMap<NodeId, u32>,
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
            adopted: HashMap::new(),
            grace: Duration::from_secs(30),
        }
    }

    /// The process id of a node's worker (tests kill it for real).
    pub fn pid(&self, node: &NodeId) -> Option<u32> {
        (self.children.get(node).map(|c| c.id())).or_else(|| self.adopted.get(node).copied())
    }

    /// The `--cache-dir` a node named `name` is started with.
    fn cache_dir(&self, name: &str) -> PathBuf {
        self.work_dir.join(name).join("cache")
    }

    /// Live worker processes of this provider (`worker --name NAME …
    /// --cache-dir WORK_DIR/NAME/cache`) whose name starts with `prefix`.
    fn scan(&self, prefix: &str) -> Vec<(NodeId, u32)> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in dir.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Some(name) = self.worker_name(pid) {
                if name.starts_with(prefix) {
                    out.push((NodeId(name), pid));
                }
            }
        }
        out.sort();
        out
    }

    /// The node name of process `pid` if it is a live (not zombie) worker
    /// this provider started.
    fn worker_name(&self, pid: u32) -> Option<String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The state follows the command name's closing parenthesis.
        let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
        if matches!(state, 'Z' | 'X') {
            return None;
        }
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
        if args.get(1) != Some(&&b"worker"[..]) || args.get(2) != Some(&&b"--name"[..]) {
            return None;
        }
        let name = std::str::from_utf8(args.get(3)?).ok()?.to_string();
        let cache = self.cache_dir(&name);
        let cache = cache.to_str()?.as_bytes();
        let at = args.iter().position(|a| *a == b"--cache-dir")?;
        (args.get(at + 1) == Some(&cache)).then_some(name)
    }

    /// Ends an adopted worker: SIGTERM, then SIGKILL after the grace.
    fn end_adopted(&mut self, node: &NodeId, pid: u32) {
        let alive = |p: &Self| p.worker_name(pid).as_deref() == Some(node.0.as_str());
        let Ok(raw) = i32::try_from(pid) else {
            return;
        };
        if !alive(self) {
            return;
        }
        // SAFETY: a plain signal to a process just checked to be this
        // provider's worker for `node` (its command line names it).
        unsafe { libc::kill(raw, libc::SIGTERM) };
        let until = Instant::now() + self.grace;
        while Instant::now() < until {
            if !alive(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(self) {
            // SAFETY: as above, checked again just now.
            unsafe { libc::kill(raw, libc::SIGKILL) };
        }
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
        let ticket = dir.join("worker.ticket");
        write_ticket_file(&ticket, &spec.worker_ticket, 0o600)?;
        let mut args = worker_args(spec, offer);
        args.extend([
            "--cache-dir".to_string(),
            dir.join("cache").display().to_string(),
            "--ticket".to_string(),
            format!("@{}", ticket.display()),
        ]);
        let inherited =
            std::env::vars_os().filter(|(k, _)| k.to_str().is_some_and(node_env_allowed));
        let child = Command::new(&self.binary)
            .args(&args)
            .env_clear()
            .envs(inherited)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
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
        if let Some(&pid) = self.adopted.get(node) {
            if self.worker_name(pid).as_deref() == Some(node.0.as_str()) {
                return Ok(NodeState::Running);
            }
            self.adopted.remove(node);
            return Ok(NodeState::Gone);
        }
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
        if let Some(pid) = self.adopted.remove(node) {
            self.end_adopted(node, pid);
            return Ok(());
        }
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

    fn list(&mut self, prefix: &str) -> Result<Option<Vec<NodeId>>, ProviderError> {
        Ok(Some(
            self.scan(prefix).into_iter().map(|(id, _)| id).collect(),
        ))
    }

    fn adopt(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        if self.children.contains_key(node) {
            return self.state(node);
        }
        match self.scan(&node.0).into_iter().find(|(id, _)| id == node) {
            Some((id, pid)) => {
                self.adopted.insert(id, pid);
                Ok(NodeState::Running)
            }
            None => Ok(NodeState::Gone),
        }
    }
}

impl Drop for LocalProvider {
    /// Nothing keeps running after the fleet: every worker is stopped.
    fn drop(&mut self) {
        let nodes: Vec<NodeId> = (self.children.keys().chain(self.adopted.keys()))
            .cloned()
            .collect();
        for n in nodes {
            let _ = self.release(&n);
        }
    }
}
