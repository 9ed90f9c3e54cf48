//! Paperspace (DigitalOcean): machines from a template, with a startup
//! script that starts the worker container.
//!
//! Endpoints used (`https://api.paperspace.com/v1`, bearer key), documented
//! at <https://docs.digitalocean.com/reference/paperspace/api-reference/>:
//! - `GET /templates/{id}` → the template with `availableMachineTypes:
//!   [{machineTypeLabel, isAvailable}]`: which of the configured machine
//!   types can be created now (`…/api-reference/template`). Paperspace's API
//!   gives no prices: each machine type's price comes from the fleet file.
//! - `POST /startup-scripts` with `name`, `script`, `isRunOnce` → `{id}`;
//!   `DELETE /startup-scripts/{id}` when the machine is released
//!   (`…/api-reference/startup-script`).
//! - `POST /machines` with `name`, `machineType`, `templateId`, `region`,
//!   `diskSize`, `startupScriptId`, `publicIpType`, `startOnCreate` →
//!   `{"data": {id, state}}` (`…/api-reference/machine`).
//! - `GET /machines/{id}` → `{id, state}`: `provisioning`, `starting`,
//!   `restarting`, `upgrading` while it boots, `serviceready`/`ready`
//!   running, `stopping`/`off` stopped.
//! - `PATCH /machines/{id}/stop`, `DELETE /machines/{id}`.
//!
//! Errors are `{code, message}`; a capacity or availability message is an
//! offer gone, a quota or limit message a quota. The startup script writes
//! the env file (the ticket in it, mode 0600) from a quoted heredoc and
//! runs `docker run --env-file`: the ticket is in no command line.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_spec, docker_run_argv, env_file, gpu_wanted, shell_quote, ENV_FILE};
use crate::http::{Api, Reply};
use crate::provider::{
    Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError, Secret,
};

/// A machine type the fleet may rent, with the price Paperspace bills it at.
#[derive(Clone, Debug, Deserialize)]
pub struct MachineType {
    /// Paperspace's label, e.g. `A100-80G`, `A4000`.
    pub name: String,
    pub gpu: String,
    #[serde(default = "one")]
    pub gpu_count: u32,
    pub vram_gib: u32,
    pub usd_per_hour: f64,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PaperspaceConfig {
    pub api_url: String,
    /// A Linux template with Docker and the NVIDIA container runtime (e.g.
    /// the ML-in-a-Box template).
    pub template_id: String,
    /// `East Coast (NY2)`, `West Coast (CA1)`, `Europe (AMS1)`.
    pub region: String,
    pub disk_gb: u32,
    pub machine_types: Vec<MachineType>,
    pub gpu_types: Vec<String>,
    pub min_vram_gib: u32,
    pub max_usd_per_gpu_hour: f64,
}

impl Default for PaperspaceConfig {
    fn default() -> Self {
        PaperspaceConfig {
            api_url: "https://api.paperspace.com/v1".into(),
            template_id: String::new(),
            region: "East Coast (NY2)".into(),
            disk_gb: 100,
            machine_types: Vec::new(),
            gpu_types: Vec::new(),
            min_vram_gib: 0,
            max_usd_per_gpu_hour: 4.0,
        }
    }
}

pub struct Paperspace {
    config: PaperspaceConfig,
    api: Api,
    /// Machine id → the startup script made for it (deleted on release).
    scripts: HashMap<String, String>,
}

impl Paperspace {
    pub fn new(config: PaperspaceConfig, api_key: Secret) -> Result<Paperspace, ProviderError> {
        if config.template_id.is_empty() {
            return Err(ProviderError::Other(
                "paperspace: template_id is required (a Linux template with Docker and the NVIDIA runtime)".into(),
            ));
        }
        let api = Api::new(&config.api_url, Some(api_key), None)?;
        Ok(Paperspace {
            config,
            api,
            scripts: HashMap::new(),
        })
    }

    /// Stops a machine (its disk is kept, and billed).
    pub fn stop(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let r = self.api.call(
            "PATCH",
            &format!("/machines/{}/stop", crate::http::encode(&node.0)),
            None,
        )?;
        match r.status {
            404 => Err(ProviderError::NoSuchNode(node.clone())),
            _ if r.ok() => Ok(()),
            _ => Err(r.error("paperspace stop machine")),
        }
    }
}

/// The startup script: the env file from a quoted heredoc (nothing in it
/// is expanded), then the worker container.
pub fn startup_script(spec: &LaunchSpec) -> String {
    let argv: Vec<String> = docker_run_argv(spec)
        .iter()
        .map(|a| shell_quote(a))
        .collect();
    format!(
        "#!/bin/sh\nset -eu\numask 077\nmkdir -p /etc/tessera\ncat > {ENV_FILE} <<'TESSERA_ENV'\n{}TESSERA_ENV\n\
         docker rm -f tessera-worker >/dev/null 2>&1 || true\n{}\n",
        env_file(spec),
        argv.join(" ")
    )
}

fn classify(what: &str, offer: &Offer, r: &Reply) -> ProviderError {
    let m = r.message().to_lowercase();
    if r.status == 429 || r.status == 401 || r.status == 403 {
        return r.error(what);
    }
    if m.contains("capacity")
        || m.contains("not available")
        || m.contains("unavailable")
        || m.contains("out of stock")
    {
        return ProviderError::OfferGone(offer.id.clone());
    }
    if m.contains("quota") || m.contains("limit") || m.contains("balance") || r.status == 402 {
        return ProviderError::Quota(format!("paperspace: {}", r.message()));
    }
    r.error(what)
}

impl Provider for Paperspace {
    fn name(&self) -> &str {
        "paperspace"
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        let path = format!(
            "/templates/{}",
            crate::http::encode(&self.config.template_id)
        );
        let r = self.api.call("GET", &path, None)?;
        if !r.ok() {
            return Err(r.error("paperspace get template"));
        }
        let available: Vec<&str> = r
            .body
            .get("availableMachineTypes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|m| m.get("isAvailable").and_then(Value::as_bool) == Some(true))
            .filter_map(|m| m.get("machineTypeLabel").and_then(Value::as_str))
            .collect();
        let c = &self.config;
        Ok(c.machine_types
            .iter()
            .filter(|m| available.contains(&m.name.as_str()))
            .filter(|m| gpu_wanted(&c.gpu_types, &m.gpu) && m.vram_gib >= c.min_vram_gib)
            .filter(|m| {
                m.usd_per_hour > 0.0
                    && m.usd_per_hour / f64::from(m.gpu_count.max(1)) <= c.max_usd_per_gpu_hour
            })
            .map(|m| Offer {
                id: m.name.clone(),
                gpu: m.gpu.clone(),
                gpu_count: m.gpu_count.max(1),
                vram_gib: m.vram_gib,
                usd_per_hour: m.usd_per_hour,
                interruptible: false,
                region: Some(c.region.clone()),
                billing: Billing::Increment(1),
            })
            .collect())
    }

    fn launch(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        self.launch_node(offer, spec)
            .map_err(|e| super::scrub(e, spec.worker_ticket.expose()))
    }

    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        let r = self.api.call(
            "GET",
            &format!("/machines/{}", crate::http::encode(&node.0)),
            None,
        )?;
        if r.status == 404 {
            return Ok(NodeState::Gone);
        }
        if !r.ok() {
            return Err(r.error("paperspace get machine"));
        }
        let m = r
            .body
            .get("data")
            .filter(|d| d.is_object())
            .unwrap_or(&r.body);
        Ok(match m.get("state").and_then(Value::as_str) {
            Some("ready" | "serviceready") => NodeState::Running,
            Some("off" | "stopping") => NodeState::Paused,
            Some("deleted" | "deleting") => NodeState::Gone,
            _ => NodeState::Starting,
        })
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let r = self.api.call(
            "DELETE",
            &format!("/machines/{}", crate::http::encode(&node.0)),
            None,
        )?;
        if !(r.ok() || r.status == 404) {
            return Err(r.error("paperspace delete machine"));
        }
        if let Some(script) = self.scripts.remove(&node.0) {
            let r = self.api.call(
                "DELETE",
                &format!("/startup-scripts/{}", crate::http::encode(&script)),
                None,
            )?;
            if !(r.ok() || r.status == 404) {
                tracing::warn!(provider = "paperspace", node = %node, "the startup script was not deleted: {}", r.message());
            }
        }
        tracing::info!(provider = "paperspace", node = %node, "machine deleted");
        Ok(())
    }
}

impl Paperspace {
    fn launch_node(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        check_spec(spec)?;
        let script = json!({
            "name": format!("tessera-{}", spec.name),
            "script": startup_script(spec),
            "isRunOnce": false,
            "isEnabled": true,
        });
        let r = self.api.call("POST", "/startup-scripts", Some(&script))?;
        if !r.ok() {
            return Err(classify("paperspace create startup script", offer, &r));
        }
        let script_id = r
            .body
            .get("id")
            .or_else(|| r.body.pointer("/data/id"))
            .and_then(Value::as_str)
            .ok_or_else(|| ProviderError::Other("paperspace: the startup script has no id".into()))?
            .to_string();
        let machine = json!({
            "name": spec.name,
            "machineType": offer.id,
            "templateId": self.config.template_id,
            "region": self.config.region,
            "diskSize": self.config.disk_gb,
            "startupScriptId": script_id,
            "publicIpType": "dynamic",
            "startOnCreate": true,
            "autoShutdownEnabled": false,
        });
        let r = self.api.call("POST", "/machines", Some(&machine))?;
        let id = r
            .body
            .pointer("/data/id")
            .or_else(|| r.body.get("id"))
            .and_then(Value::as_str);
        let (true, Some(id)) = (r.ok(), id) else {
            let _ = self.api.call(
                "DELETE",
                &format!("/startup-scripts/{}", crate::http::encode(&script_id)),
                None,
            );
            return Err(classify("paperspace create machine", offer, &r));
        };
        tracing::info!(provider = "paperspace", offer = %offer.id, node = %id, usd_per_hour = offer.usd_per_hour, "machine created");
        self.scripts.insert(id.to_string(), script_id);
        Ok(NodeId(id.to_string()))
    }
}
