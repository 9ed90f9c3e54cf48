//! RunPod: pods from the worker image, on-demand or spot (interruptible, at
//! a bid per GPU).
//!
//! Endpoints used: the GraphQL API, `POST https://api.runpod.io/graphql`
//! with `{"query", "variables"}` and the key as a bearer header (never the
//! `?api_key=` query parameter, which proxies log). Documented at
//! <https://docs.runpod.io/sdks/graphql/manage-pods> (schema:
//! <https://graphql-spec.runpod.io/>):
//! - `gpuTypes { id displayName memoryInGb lowestPrice(input: {gpuCount})
//!   { minimumBidPrice uninterruptablePrice } }`: offers, prices per GPU-hour
//!   (<https://docs.runpod.io/sdks/graphql/manage-pods#list-gpu-types>).
//! - `podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput)`:
//!   an on-demand pod with `imageName`, `gpuTypeId`, `gpuCount`,
//!   `cloudType`, `dockerArgs`, `env: [{key, value}]`, `containerDiskInGb`.
//! - `podRentInterruptable(input: PodRentInterruptableInput)`: a spot pod,
//!   the same fields and `bidPerGpu`.
//! - `pod(input: {podId}) { id desiredStatus runtime { uptimeInSeconds } }`:
//!   `desiredStatus` `RUNNING` (booting while `runtime` is null), `EXITED`
//!   (stopped: a spot pod outbid or stopped, its volume kept),
//!   `TERMINATED`; a pod that no longer exists reads as `null`.
//! - `podStop(input: {podId})` and `podTerminate(input: {podId})`.
//!
//! GraphQL reports errors with HTTP 200 and an `errors` list: "There are no
//! longer any instances available with the requested specifications" is an
//! offer gone; a balance or limit message is a quota. Per-second billing.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_spec, gpu_wanted, worker_args, worker_env};
use crate::http::{Api, Reply};
use crate::provider::{
    Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError, Secret,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunpodConfig {
    /// The GraphQL endpoint.
    pub api_url: String,
    /// GPU type ids or display names wanted (`NVIDIA GeForce RTX 4090`,
    /// `RTX 4090`); empty: any.
    pub gpu_types: Vec<String>,
    pub gpu_count: u32,
    pub min_vram_gib: u32,
    pub max_usd_per_gpu_hour: f64,
    /// Spot pods (interruptible) at the lowest bid plus `bid_margin`.
    pub interruptible: bool,
    pub bid_margin: f64,
    /// `SECURE`, `COMMUNITY` or `ALL`.
    pub cloud_type: String,
    pub container_disk_gb: u32,
}

impl Default for RunpodConfig {
    fn default() -> Self {
        RunpodConfig {
            api_url: "https://api.runpod.io/graphql".into(),
            gpu_types: Vec::new(),
            gpu_count: 1,
            min_vram_gib: 0,
            max_usd_per_gpu_hour: 2.0,
            interruptible: false,
            bid_margin: 0.05,
            cloud_type: "ALL".into(),
            container_disk_gb: 40,
        }
    }
}

pub struct Runpod {
    config: RunpodConfig,
    api: Api,
}

const GPU_TYPES: &str = "query GpuTypes($gpuCount: Int) { gpuTypes { id displayName memoryInGb \
    lowestPrice(input: {gpuCount: $gpuCount}) { minimumBidPrice uninterruptablePrice } } }";
const DEPLOY_ON_DEMAND: &str = "mutation Deploy($input: PodFindAndDeployOnDemandInput) { \
    podFindAndDeployOnDemand(input: $input) { id desiredStatus imageName machineId } }";
const RENT_INTERRUPTABLE: &str = "mutation Rent($input: PodRentInterruptableInput!) { \
    podRentInterruptable(input: $input) { id desiredStatus imageName machineId } }";
const POD: &str = "query Pod($input: PodFilter) { pod(input: $input) { id desiredStatus \
    runtime { uptimeInSeconds } } }";
const STOP: &str =
    "mutation Stop($input: PodStopInput!) { podStop(input: $input) { id desiredStatus } }";
const TERMINATE: &str =
    "mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }";

impl Runpod {
    pub fn new(config: RunpodConfig, api_key: Secret) -> Result<Runpod, ProviderError> {
        let api = Api::new(&config.api_url, Some(api_key), None)?;
        Ok(Runpod { config, api })
    }

    /// One GraphQL call: the reply's `data`, or the error its `errors` mean.
    fn graphql(
        &self,
        what: &str,
        query: &str,
        variables: Value,
    ) -> Result<(Reply, Value), ProviderError> {
        let body = json!({"query": query, "variables": variables});
        let r = self.api.call("POST", "", Some(&body))?;
        if !r.ok() {
            return Err(r.error(what));
        }
        let data = r.body.get("data").cloned().unwrap_or(Value::Null);
        Ok((r, data))
    }

    /// Stops a pod and keeps its volume (a spot pod can be resumed later).
    pub fn stop(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let (r, _) = self.graphql("runpod podStop", STOP, json!({"input": {"podId": node.0}}))?;
        match errors(&r) {
            Some(m) if m.to_lowercase().contains("not found") => {
                Err(ProviderError::NoSuchNode(node.clone()))
            }
            Some(m) => Err(ProviderError::Other(format!("runpod podStop: {m}"))),
            None => Ok(()),
        }
    }
}

/// The first GraphQL error's message, if the reply has one.
fn errors(r: &Reply) -> Option<String> {
    let list = r.body.get("errors")?.as_array()?;
    let first = list.first()?;
    Some(crate::http::cut(
        first
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("error"),
        300,
    ))
}

fn launch_error(offer: &Offer, message: String) -> ProviderError {
    let m = message.to_lowercase();
    if m.contains("no longer any instances available")
        || m.contains("not available")
        || m.contains("no instances")
    {
        ProviderError::OfferGone(offer.id.clone())
    } else if m.contains("balance")
        || m.contains("quota")
        || m.contains("limit")
        || m.contains("insufficient funds")
    {
        ProviderError::Quota(format!("runpod: {message}"))
    } else if m.contains("unauthorized") || m.contains("api key") {
        ProviderError::Auth(format!("runpod: {message}"))
    } else {
        ProviderError::Other(format!("runpod deploy: {message}"))
    }
}

impl Provider for Runpod {
    fn name(&self) -> &str {
        "runpod"
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        let c = &self.config;
        let count = c.gpu_count.clamp(1, 16);
        let (r, data) = self.graphql("runpod gpuTypes", GPU_TYPES, json!({"gpuCount": count}))?;
        if let Some(m) = errors(&r) {
            return Err(ProviderError::Other(format!("runpod gpuTypes: {m}")));
        }
        let list = data
            .get("gpuTypes")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut offers = Vec::new();
        for g in list.iter().take(256) {
            let Some(id) = g.get("id").and_then(Value::as_str) else {
                continue;
            };
            let display = g.get("displayName").and_then(Value::as_str).unwrap_or(id);
            let vram = g
                .get("memoryInGb")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(4096) as u32;
            let price = g.get("lowestPrice").and_then(|p| {
                if c.interruptible {
                    p.get("minimumBidPrice")
                        .and_then(Value::as_f64)
                        .map(|b| b * (1.0 + c.bid_margin.max(0.0)))
                } else {
                    p.get("uninterruptablePrice").and_then(Value::as_f64)
                }
            });
            // No price: none to rent now.
            let Some(per_gpu) = price.filter(|p| p.is_finite() && *p > 0.0) else {
                continue;
            };
            let wanted = gpu_wanted(&c.gpu_types, id) || gpu_wanted(&c.gpu_types, display);
            if wanted && vram >= c.min_vram_gib && per_gpu <= c.max_usd_per_gpu_hour {
                offers.push(Offer {
                    id: id.to_string(),
                    gpu: display.to_string(),
                    gpu_count: count,
                    vram_gib: vram,
                    usd_per_hour: per_gpu * f64::from(count),
                    interruptible: c.interruptible,
                    region: None,
                    billing: Billing::Increment(1),
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
        let (r, data) = self.graphql("runpod pod", POD, json!({"input": {"podId": node.0}}))?;
        if let Some(m) = errors(&r) {
            if m.to_lowercase().contains("not found") {
                return Ok(NodeState::Gone);
            }
            return Err(ProviderError::Other(format!("runpod pod: {m}")));
        }
        let pod = data.get("pod").cloned().unwrap_or(Value::Null);
        if pod.is_null() {
            return Ok(NodeState::Gone);
        }
        let up = pod.get("runtime").is_some_and(|rt| !rt.is_null());
        Ok(match pod.get("desiredStatus").and_then(Value::as_str) {
            Some("RUNNING") if up => NodeState::Running,
            Some("RUNNING" | "CREATED" | "RESTARTING") => NodeState::Starting,
            Some("EXITED") => NodeState::Paused,
            Some("TERMINATED" | "DEAD") => NodeState::Gone,
            _ => NodeState::Starting,
        })
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let (r, _) = self.graphql(
            "runpod podTerminate",
            TERMINATE,
            json!({"input": {"podId": node.0}}),
        )?;
        match errors(&r) {
            Some(m) if !m.to_lowercase().contains("not found") => {
                Err(ProviderError::Other(format!("runpod podTerminate: {m}")))
            }
            _ => {
                tracing::info!(provider = "runpod", node = %node, "pod terminated");
                Ok(())
            }
        }
    }
}

impl Runpod {
    fn launch_node(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        check_spec(spec)?;
        let env: Vec<Value> = worker_env(spec)
            .into_iter()
            .map(|(key, value)| json!({"key": key, "value": value}))
            .collect();
        let args: Vec<String> = worker_args(spec)
            .iter()
            .map(|a| super::shell_quote(a))
            .collect();
        let mut input = json!({
            "name": spec.name,
            "imageName": spec.image,
            "gpuTypeId": offer.id,
            "gpuCount": offer.gpu_count.max(1),
            "cloudType": self.config.cloud_type,
            "containerDiskInGb": self.config.container_disk_gb,
            "volumeInGb": 0,
            "dockerArgs": args.join(" "),
            "env": env,
        });
        let (query, field) = if offer.interruptible {
            input["bidPerGpu"] = json!(offer.usd_per_hour / f64::from(offer.gpu_count.max(1)));
            (RENT_INTERRUPTABLE, "podRentInterruptable")
        } else {
            (DEPLOY_ON_DEMAND, "podFindAndDeployOnDemand")
        };
        let (r, data) = self.graphql("runpod deploy", query, json!({"input": input}))?;
        if let Some(m) = errors(&r) {
            return Err(launch_error(offer, m));
        }
        let id = data
            .pointer(&format!("/{field}/id"))
            .and_then(Value::as_str)
            .ok_or_else(|| ProviderError::OfferGone(offer.id.clone()))?;
        tracing::info!(provider = "runpod", offer = %offer.id, node = %id, usd_per_hour = offer.usd_per_hour, "pod created");
        Ok(NodeId(id.to_string()))
    }
}
