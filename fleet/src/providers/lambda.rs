//! Lambda Cloud: on-demand VMs launched with an SSH key and cloud-init user
//! data, terminated when released. No stop, no spot tier; billed by the
//! minute ([`Billing::Increment`]`(60)`), so the fleet can use a minute it
//! has paid for before releasing.
//!
//! Endpoints used (`https://cloud.lambda.ai/api/v1`, bearer key),
//! documented at <https://docs-api.lambda.ai/api/cloud>:
//! - `GET /instance-types` → `{"data": {NAME: {"instance_type": {name,
//!   description, gpu_description, price_cents_per_hour, specs: {gpus}},
//!   "regions_with_capacity_available": [{name}]}}}`
//!   (<https://docs-api.lambda.ai/api/cloud#listInstanceTypes>).
//! - `POST /instance-operations/launch` with `region_name`,
//!   `instance_type_name`, `ssh_key_names`, `name`, `quantity`, `user_data`
//!   → `{"data": {"instance_ids": [ID]}}`
//!   (<https://docs-api.lambda.ai/api/cloud#launchInstance>). Launches are
//!   limited to about one request per 12 s; this adapter keeps to that on
//!   its own (answering `RateLimited` without sending) and honours a 429's
//!   `Retry-After`.
//! - `GET /instances/{id}` → `{"data": {status}}`, `booting`, `active`,
//!   `unhealthy`, `terminating`, `terminated`
//!   (<https://docs-api.lambda.ai/api/cloud#getInstance>).
//! - `POST /instance-operations/terminate` with `instance_ids`
//!   (<https://docs-api.lambda.ai/api/cloud#terminateInstance>).
//!
//! Errors come as `{"error": {code, message, suggestion}}`: code
//! `instance-operations/launch/insufficient-capacity` is an offer gone,
//! `global/quota-exceeded` a quota, `global/invalid-api-key` refused
//! credentials, `global/object-does-not-exist` a node gone.
//!
//! The user data writes the worker's env file (mode 0600, the ticket in
//! it) and runs the worker image with `docker run --env-file`: the ticket is
//! in no command (Lambda Stack images have Docker and the NVIDIA runtime).

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_spec, docker_run_argv, env_file, gpu_wanted, ENV_FILE};
use crate::http::{Api, Reply};
use crate::provider::{
    Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError, Secret,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LambdaConfig {
    pub api_url: String,
    /// Instance type names (`gpu_1x_a100_sxm4`) or GPU names (`A100`,
    /// `H100`) wanted; empty: any.
    pub gpu_types: Vec<String>,
    pub min_vram_gib: u32,
    pub max_usd_per_gpu_hour: f64,
    /// Region names (`us-east-1`); empty: any with capacity.
    pub regions: Vec<String>,
    /// The SSH key (its name in the Lambda account) every VM is launched
    /// with: Lambda requires exactly one.
    pub ssh_key_name: String,
    /// Seconds between launch requests (Lambda documents one per 12 s).
    pub launch_interval_secs: f64,
}

impl Default for LambdaConfig {
    fn default() -> Self {
        LambdaConfig {
            api_url: "https://cloud.lambda.ai/api/v1".into(),
            gpu_types: Vec::new(),
            min_vram_gib: 0,
            max_usd_per_gpu_hour: 4.0,
            regions: Vec::new(),
            ssh_key_name: String::new(),
            launch_interval_secs: 12.0,
        }
    }
}

pub struct Lambda {
    config: LambdaConfig,
    api: Api,
    last_launch: Option<Instant>,
}

impl Lambda {
    pub fn new(config: LambdaConfig, api_key: Secret) -> Result<Lambda, ProviderError> {
        if config.ssh_key_name.is_empty() {
            return Err(ProviderError::Other(
                "lambda: ssh_key_name is required (the name of an SSH key in your Lambda account)"
                    .into(),
            ));
        }
        let api = Api::new(&config.api_url, Some(api_key), None)?;
        Ok(Lambda {
            config,
            api,
            last_launch: None,
        })
    }

    fn interval(&self) -> Duration {
        let s = self.config.launch_interval_secs;
        Duration::from_secs_f64(if s.is_finite() {
            s.clamp(0.0, 600.0)
        } else {
            12.0
        })
    }
}

/// Lambda's error code, e.g. `global/quota-exceeded`.
fn code(r: &Reply) -> &str {
    r.body
        .pointer("/error/code")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The VRAM per GPU in a description like `1x A100 (40 GB SXM4)`.
fn vram_from(description: &str) -> u32 {
    let Some(open) = description.find('(') else {
        return 0;
    };
    description[open + 1..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A YAML double-quoted scalar (JSON's string syntax is valid YAML).
fn yq(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// The cloud-init user data: the env file, then the worker container.
pub fn user_data(spec: &LaunchSpec) -> String {
    let mut y = String::from("#cloud-config\nwrite_files:\n");
    y.push_str(&format!(
        "  - path: {ENV_FILE}\n    permissions: \"0600\"\n    owner: root:root\n    content: |\n"
    ));
    for line in env_file(spec).lines() {
        y.push_str("      ");
        y.push_str(line);
        y.push('\n');
    }
    let argv: Vec<String> = docker_run_argv(spec).iter().map(|a| yq(a)).collect();
    y.push_str(&format!("runcmd:\n  - [{}]\n", argv.join(", ")));
    y
}

impl Provider for Lambda {
    fn name(&self) -> &str {
        "lambda"
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        let r = self.api.call("GET", "/instance-types", None)?;
        if !r.ok() {
            return Err(r.error("lambda instance-types"));
        }
        let c = &self.config;
        let mut offers = Vec::new();
        let Some(types) = r.body.get("data").and_then(Value::as_object) else {
            return Ok(offers);
        };
        for (name, t) in types.iter().take(256) {
            let it = &t["instance_type"];
            let description = it
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or(name);
            let gpu = it
                .get("gpu_description")
                .and_then(Value::as_str)
                .unwrap_or(description);
            let gpus = it
                .pointer("/specs/gpus")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .clamp(1, 64) as u32;
            let Some(cents) = it.get("price_cents_per_hour").and_then(Value::as_f64) else {
                continue;
            };
            let usd = cents / 100.0;
            let vram = vram_from(gpu).max(vram_from(description));
            let wanted = gpu_wanted(&c.gpu_types, name) || gpu_wanted(&c.gpu_types, gpu);
            if !wanted
                || vram < c.min_vram_gib
                || usd / f64::from(gpus) > c.max_usd_per_gpu_hour
                || usd <= 0.0
            {
                continue;
            }
            let regions = t
                .get("regions_with_capacity_available")
                .and_then(Value::as_array);
            for region in regions
                .into_iter()
                .flatten()
                .filter_map(|r| r.get("name").and_then(Value::as_str))
            {
                if !c.regions.is_empty() && !c.regions.iter().any(|w| w == region) {
                    continue;
                }
                offers.push(Offer {
                    // The instance type and the region: both go to launch.
                    id: format!("{name}@{region}"),
                    gpu: gpu.to_string(),
                    gpu_count: gpus,
                    vram_gib: vram,
                    usd_per_hour: usd,
                    interruptible: false,
                    region: Some(region.to_string()),
                    billing: Billing::Increment(60),
                });
            }
        }
        Ok(offers)
    }

    fn launch(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        self.launch_node(offer, spec)
            .map_err(|e| super::scrub(e, spec.worker_ticket.expose()))
    }

    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        let r = self.api.call(
            "GET",
            &format!("/instances/{}", crate::http::encode(&node.0)),
            None,
        )?;
        if r.status == 404 || code(&r) == "global/object-does-not-exist" {
            return Ok(NodeState::Gone);
        }
        if !r.ok() {
            return Err(r.error("lambda get instance"));
        }
        Ok(
            match r.body.pointer("/data/status").and_then(Value::as_str) {
                Some("active") => NodeState::Running,
                Some("terminating" | "terminated") => NodeState::Gone,
                // booting, unhealthy (not serving yet)
                _ => NodeState::Starting,
            },
        )
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let body = json!({"instance_ids": [node.0]});
        let r = self
            .api
            .call("POST", "/instance-operations/terminate", Some(&body))?;
        if r.ok() || r.status == 404 || code(&r) == "global/object-does-not-exist" {
            tracing::info!(provider = "lambda", node = %node, "instance terminated");
            return Ok(());
        }
        Err(r.error("lambda terminate"))
    }
}

impl Lambda {
    fn launch_node(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        check_spec(spec)?;
        if let Some(last) = self.last_launch {
            let wait = self.interval().saturating_sub(last.elapsed());
            if !wait.is_zero() {
                return Err(ProviderError::RateLimited {
                    retry_after: Some(wait),
                });
            }
        }
        let (instance_type, region) = offer.id.split_once('@').ok_or_else(|| {
            ProviderError::Other(format!("lambda: offer {} is not TYPE@REGION", offer.id))
        })?;
        let body = json!({
            "region_name": region,
            "instance_type_name": instance_type,
            "ssh_key_names": [self.config.ssh_key_name],
            "name": spec.name,
            "quantity": 1,
            "user_data": user_data(spec),
        });
        self.last_launch = Some(Instant::now());
        let r = self
            .api
            .call("POST", "/instance-operations/launch", Some(&body))?;
        if !r.ok() {
            return Err(match (r.status, code(&r)) {
                (429, _) => r.error("lambda launch"),
                (_, "instance-operations/launch/insufficient-capacity") => {
                    ProviderError::OfferGone(offer.id.clone())
                }
                (_, "global/quota-exceeded") => {
                    ProviderError::Quota(format!("lambda: {}", r.message()))
                }
                (_, "global/invalid-api-key") => {
                    ProviderError::Auth(format!("lambda: {}", r.message()))
                }
                _ => r.error("lambda launch"),
            });
        }
        let id = r
            .body
            .pointer("/data/instance_ids/0")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ProviderError::Other(format!("lambda launch: no instance id in {}", r.message()))
            })?;
        tracing::info!(provider = "lambda", offer = %offer.id, node = %id, usd_per_hour = offer.usd_per_hour, "instance launched");
        Ok(NodeId(id.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vram_is_read_from_the_description() {
        assert_eq!(vram_from("1x A100 (40 GB SXM4)"), 40);
        assert_eq!(vram_from("H100 (80 GB PCIe)"), 80);
        assert_eq!(vram_from("no memory here"), 0);
    }
}
