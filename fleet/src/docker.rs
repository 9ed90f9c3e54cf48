//! The `docker` provider: each node is a container of the worker image on
//! this machine's Docker Engine, driven with the `docker` CLI. The ticket
//! reaches the container as a file mounted read-only
//! (`/run/tessera/worker.ticket`, given as `--ticket @FILE`), written in a
//! folder only this user may enter on this machine: never an
//! argument or a variable (`ps` and `docker inspect` show its path, never
//! the ticket). The container gets no variable of the fleet's but those the
//! fleet file sets for nodes (`env`). A container that is
//! paused reads as `Paused` (a Vast.ai instance outbid), one that exited or
//! was removed as `Gone`.
//!
//! Containers run with no restart policy (`--restart no`): when the worker
//! leaves by itself (`--exit-after-idle`) the container stops and holds no
//! CPU or GPU; it is kept (not `--rm`) so that its log can be saved when the
//! fleet releases it, and a fleet started again after a crash finds it with
//! `docker ps -a` by its label and name prefix.

use std::process::{Command, Output, Stdio};

use crate::local::worker_args;
use crate::provider::{
    write_ticket_file, Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError,
};

/// Where the ticket file is mounted in a container.
pub const TICKET_IN_CONTAINER: &str = "/run/tessera/worker.ticket";

pub struct DockerProvider {
    name: String,
    network: String,
    offer: Offer,
    /// Extra `docker run` arguments (e.g. `--gpus all`).
    pub run_args: Vec<String>,
    /// Seconds between SIGTERM and SIGKILL on release and `docker stop`.
    pub stop_timeout_secs: u32,
    /// Where a released container's log is kept (`NAME.log`).
    pub log_dir: Option<std::path::PathBuf>,
    /// Where the ticket file mounted into containers is written (an
    /// owner-only folder on this machine).
    pub secret_dir: std::path::PathBuf,
}

impl DockerProvider {
    pub fn new(name: &str, network: &str, gpu: &str, usd_per_hour: f64) -> Self {
        DockerProvider {
            name: name.to_string(),
            network: network.to_string(),
            offer: Offer {
                id: format!("{name}-container"),
                gpu: gpu.to_string(),
                gpu_count: 1,
                vram_gib: 0,
                usd_per_hour,
                interruptible: false,
                region: None,
                billing: Billing::Increment(1),
            },
            run_args: Vec::new(),
            stop_timeout_secs: 30,
            log_dir: None,
            secret_dir: std::env::temp_dir().join(format!("tessera-fleet-{name}")),
        }
    }
}

fn docker(args: &[&str]) -> Result<Output, ProviderError> {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| ProviderError::Other(format!("cannot run docker: {e} (is Docker installed?)")))
}

fn failure(what: &str, out: &Output) -> ProviderError {
    let err = String::from_utf8_lossy(&out.stderr);
    ProviderError::Other(format!("docker {what}: {}", err.trim()))
}

/// Maps `docker inspect`'s `.State.Status` to a node state.
pub fn state_of(status: &str) -> NodeState {
    match status.trim() {
        "running" => NodeState::Running,
        "paused" => NodeState::Paused,
        "created" | "restarting" => NodeState::Starting,
        _ => NodeState::Gone,
    }
}

impl Provider for DockerProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        Ok(vec![self.offer.clone()])
    }

    fn launch(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        let stop = self.stop_timeout_secs.to_string();
        let ticket = self.secret_dir.join("worker.ticket");
        // The image's worker runs as a user of its own: the file is readable
        // by all, its folder here by this user only.
        write_ticket_file(&ticket, &spec.worker_ticket, 0o444)?;
        let mount = format!("{}:{TICKET_IN_CONTAINER}:ro", ticket.display());
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--name",
            &spec.name,
            "--network",
            &self.network,
            "--label",
            "tessera.fleet=1",
            "--stop-timeout",
            &stop,
            "--restart",
            "no",
            "--volume",
            &mount,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (k, _) in &spec.env {
            args.extend(["-e".to_string(), k.clone()]);
        }
        args.extend(self.run_args.iter().cloned());
        args.push(spec.image.clone());
        // The image's entrypoint is `tessera`.
        args.extend(worker_args(spec, offer));
        args.extend(["--ticket".to_string(), format!("@{TICKET_IN_CONTAINER}")]);
        let out = Command::new("docker")
            .args(&args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ProviderError::Other(format!("cannot run docker: {e}")))?;
        if !out.status.success() {
            return Err(failure("run", &out));
        }
        Ok(NodeId(spec.name.clone()))
    }

    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        let out = docker(&["inspect", "--format", "{{.State.Status}}", &node.0])?;
        if !out.status.success() {
            // No such container: removed, so gone.
            return Ok(NodeState::Gone);
        }
        Ok(state_of(&String::from_utf8_lossy(&out.stdout)))
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        // A paused container cannot take SIGTERM: resume it first.
        let _ = docker(&["unpause", &node.0]);
        let t = self.stop_timeout_secs.to_string();
        let _ = docker(&["stop", "--time", &t, &node.0]);
        if let Some(dir) = &self.log_dir {
            if let Ok(log) = docker(&["logs", &node.0]) {
                let _ = std::fs::create_dir_all(dir);
                let mut text = log.stdout;
                text.extend_from_slice(&log.stderr);
                let _ = std::fs::write(dir.join(format!("{}.log", node.0)), text);
            }
        }
        let out = docker(&["rm", "--force", &node.0])?;
        // `docker rm` of a container already gone says so on stderr.
        let gone = String::from_utf8_lossy(&out.stderr).contains("No such container");
        if !out.status.success() && !gone {
            return Err(failure("rm", &out));
        }
        Ok(())
    }

    fn list(&mut self, prefix: &str) -> Result<Option<Vec<NodeId>>, ProviderError> {
        let out = docker(&[
            "ps",
            "--all",
            "--filter",
            "label=tessera.fleet=1",
            "--format",
            "{{.Names}}",
        ])?;
        if !out.status.success() {
            return Err(failure("ps", &out));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(Some(
            (text.lines().map(str::trim))
                .filter(|n| n.starts_with(prefix))
                .map(|n| NodeId(n.to_string()))
                .collect(),
        ))
    }
}
