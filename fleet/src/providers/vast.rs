//! Vast.ai: rents a machine's offer ("ask") and runs the worker image on it.
//!
//! Endpoints used (REST API, `https://console.vast.ai/api/v0`, bearer key):
//! - search offers, `POST /bundles/` with a JSON query
//!   (<https://docs.vast.ai/api-reference/search/search-offers>);
//!   `gpu_ram` is in MB, `dph_total` the node's $/h, `min_bid` the lowest
//!   interruptible bid.
//! - create instance, `PUT /asks/{id}/` with `image`, `env`, `runtype:
//!   "args"`, `args`, `label`, `disk` and, for an interruptible instance, the
//!   bid `price` → `{"success": true, "new_contract": ID}`
//!   (<https://docs.vast.ai/api-reference/instances/create-instance>,
//!   <https://docs.vast.ai/api-reference/creating-instances-with-api>).
//! - show instance, `GET /instances/{id}/` → `{"instances": {...}}` with
//!   `actual_status` (`null`/`loading` while it starts, `running`,
//!   `stopped`, `exited`, `offline`, …) and `intended_status`
//!   (<https://docs.vast.ai/api-reference/instances/show-instance>).
//! - change bid, `PUT /instances/bid_price/{id}/` with `{"client_id": "me",
//!   "price": X}` (<https://docs.vast.ai/api-reference/instances/change-bid>).
//! - stop (keep the disk), `PUT /instances/{id}/` with `{"state": "stopped"}`
//!   (<https://docs.vast.ai/api-reference/instances/manage-instance>).
//! - destroy, `DELETE /instances/{id}/`
//!   (<https://docs.vast.ai/api-reference/instances/destroy-instance>).
//!
//! An interruptible instance that is outbid is stopped by Vast.ai with its
//! disk kept: it reads as [`NodeState::Paused`] (intended `running`, actual
//! not), and as `Running` again if it resumes, its cache intact. Per-second
//! billing. The ticket goes only in `env`; `args` never hold it.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{check_spec, gpu_wanted, worker_args, worker_env};
use crate::http::Api;
use crate::provider::{
    Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError, Secret,
};

/// Offers asked for in one search.
pub const MAX_OFFERS: u32 = 64;

/// What the fleet file says about Vast.ai (the key comes apart, as a
/// [`Secret`]).
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VastConfig {
    /// The API's base URL.
    pub api_url: String,
    /// GPU models wanted as Vast.ai names them (`RTX 4090`, `A100 SXM4`);
    /// empty: any.
    pub gpu_types: Vec<String>,
    pub min_vram_gib: u32,
    /// The most to pay per GPU-hour (on-demand price, or the bid).
    pub max_usd_per_gpu_hour: f64,
    /// Rent interruptible (bid) instances instead of on-demand ones.
    pub interruptible: bool,
    /// Bid this much above an offer's minimum bid (0.1: 10 %), within the
    /// maximum price.
    pub bid_margin: f64,
    /// Two-letter country codes the machine may be in; empty: any.
    pub regions: Vec<String>,
    /// Disk for the container, GB (the worker's asset cache lives there).
    pub disk_gb: u32,
    /// Minimum host reliability (0–1).
    pub min_reliability: f64,
}

impl Default for VastConfig {
    fn default() -> Self {
        VastConfig {
            api_url: "https://console.vast.ai/api/v0".into(),
            gpu_types: Vec::new(),
            min_vram_gib: 0,
            max_usd_per_gpu_hour: 2.0,
            interruptible: false,
            bid_margin: 0.1,
            regions: Vec::new(),
            disk_gb: 40,
            min_reliability: 0.95,
        }
    }
}

pub struct Vast {
    config: VastConfig,
    api: Api,
}

impl Vast {
    pub fn new(config: VastConfig, api_key: Secret) -> Result<Vast, ProviderError> {
        let api = Api::new(&config.api_url, Some(api_key), None)?;
        Ok(Vast { config, api })
    }

    /// The search query: what the config asks for, cheapest first.
    fn query(&self) -> Value {
        let c = &self.config;
        let mut q = json!({
            "rentable": {"eq": true},
            "rented": {"eq": false},
            "reliability": {"gte": c.min_reliability},
            "gpu_ram": {"gte": u64::from(c.min_vram_gib) * 1024},
            "type": if c.interruptible { "bid" } else { "on-demand" },
            "order": [["dph_total", "asc"]],
            "limit": MAX_OFFERS,
        });
        if !c.gpu_types.is_empty() {
            q["gpu_name"] = json!({"in": c.gpu_types});
        }
        if !c.regions.is_empty() {
            q["geolocation"] = json!({"in": c.regions});
        }
        q
    }

    /// Raises or lowers an interruptible instance's bid (USD per hour for
    /// the whole instance); a paused instance outbid may resume.
    pub fn change_bid(&mut self, node: &NodeId, usd_per_hour: f64) -> Result<(), ProviderError> {
        let body = json!({"client_id": "me", "price": usd_per_hour});
        let r = self.api.call(
            "PUT",
            &format!("/instances/bid_price/{}/", node.0),
            Some(&body),
        )?;
        match r.status {
            404 => Err(ProviderError::NoSuchNode(node.clone())),
            _ if r.ok() => Ok(()),
            _ => Err(r.error("vast change bid")),
        }
    }

    /// Stops an instance and keeps its disk (billing for storage only).
    pub fn stop(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let body = json!({"state": "stopped"});
        let r = self
            .api
            .call("PUT", &format!("/instances/{}/", node.0), Some(&body))?;
        match r.status {
            404 => Err(ProviderError::NoSuchNode(node.clone())),
            _ if r.ok() => Ok(()),
            _ => Err(r.error("vast stop")),
        }
    }
}

fn num(v: &Value, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

/// Vast.ai's error code and message, e.g. `no_such_ask`.
fn launch_error(offer: &Offer, r: &crate::http::Reply) -> ProviderError {
    let code = r.body.get("error").and_then(Value::as_str).unwrap_or("");
    let msg = r.message().to_lowercase();
    if r.status == 429 {
        return r.error("vast create instance");
    }
    if code == "no_such_ask"
        || r.status == 404
        || msg.contains("no_such_ask")
        || msg.contains("not available")
    {
        return ProviderError::OfferGone(offer.id.clone());
    }
    if code == "insufficient_credit"
        || r.status == 402
        || msg.contains("credit")
        || msg.contains("balance")
        || msg.contains("quota")
        || msg.contains("limit")
    {
        return ProviderError::Quota(format!("vast.ai: {}", r.message()));
    }
    r.error("vast create instance")
}

impl Provider for Vast {
    fn name(&self) -> &str {
        "vast"
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        let r = self.api.call("POST", "/bundles/", Some(&self.query()))?;
        if !r.ok() {
            return Err(r.error("vast search offers"));
        }
        let list = r
            .body
            .get("offers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let c = &self.config;
        let mut offers = Vec::new();
        for o in list.iter().take(MAX_OFFERS as usize) {
            let (Some(id), Some(gpu)) = (
                o.get("id").and_then(Value::as_u64),
                o.get("gpu_name").and_then(Value::as_str),
            ) else {
                continue;
            };
            let gpus = o
                .get("num_gpus")
                .and_then(Value::as_u64)
                .unwrap_or(1)
                .clamp(1, 64) as u32;
            let vram_gib = (num(o, "gpu_ram").unwrap_or(0.0) / 1024.0).round() as u32;
            let ceiling = c.max_usd_per_gpu_hour * f64::from(gpus);
            let price = if c.interruptible {
                // A bid under the minimum would never run: no offer then.
                match num(o, "min_bid") {
                    Some(b) if b <= ceiling => (b * (1.0 + c.bid_margin.max(0.0))).min(ceiling),
                    _ => f64::INFINITY,
                }
            } else {
                num(o, "dph_total").unwrap_or(f64::INFINITY)
            };
            let region = o
                .get("geolocation")
                .and_then(Value::as_str)
                .map(str::to_string);
            let fits = price.is_finite()
                && price > 0.0
                && price / f64::from(gpus) <= c.max_usd_per_gpu_hour
                && vram_gib >= c.min_vram_gib
                && gpu_wanted(&c.gpu_types, gpu)
                && (c.regions.is_empty()
                    || region
                        .as_deref()
                        .is_some_and(|g| c.regions.iter().any(|w| g.contains(w.as_str()))));
            if fits {
                offers.push(Offer {
                    id: id.to_string(),
                    gpu: gpu.to_string(),
                    gpu_count: gpus,
                    vram_gib,
                    usd_per_hour: price,
                    interruptible: c.interruptible,
                    region,
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
        let r = self.api.call(
            "GET",
            &format!("/instances/{}/", crate::http::encode(&node.0)),
            None,
        )?;
        if r.status == 404 {
            return Ok(NodeState::Gone);
        }
        if !r.ok() {
            return Err(r.error("vast show instance"));
        }
        let i = match r.body.get("instances") {
            Some(Value::Object(_)) => &r.body["instances"],
            Some(Value::Array(a)) if !a.is_empty() => &a[0],
            _ => return Ok(NodeState::Gone),
        };
        let actual = i.get("actual_status").and_then(Value::as_str);
        let intended = i.get("intended_status").and_then(Value::as_str);
        Ok(match (actual, intended) {
            (Some("running"), _) => NodeState::Running,
            (Some("destroyed" | "deleted"), _) => NodeState::Gone,
            (Some("stopped" | "exited" | "offline" | "frozen" | "unknown"), _) => NodeState::Paused,
            (_, Some("stopped")) => NodeState::Paused,
            // null (provisioning), loading, created, scheduling, rebooting
            _ => NodeState::Starting,
        })
    }

    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        let r = self.api.call(
            "DELETE",
            &format!("/instances/{}/", crate::http::encode(&node.0)),
            None,
        )?;
        if r.ok() || r.status == 404 {
            tracing::info!(provider = "vast", node = %node, "instance destroyed");
            return Ok(());
        }
        Err(r.error("vast destroy instance"))
    }
}

impl Vast {
    fn launch_node(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        check_spec(spec)?;
        let env: serde_json::Map<String, Value> = worker_env(spec)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        let mut body = json!({
            "image": spec.image,
            "label": spec.name,
            "disk": self.config.disk_gb,
            "runtype": "args",
            "args": worker_args(spec),
            "env": env,
        });
        if offer.interruptible {
            body["price"] = json!(offer.usd_per_hour);
        }
        let r = self.api.call(
            "PUT",
            &format!("/asks/{}/", crate::http::encode(&offer.id)),
            Some(&body),
        )?;
        let success = r
            .body
            .get("success")
            .and_then(Value::as_bool)
            .unwrap_or(r.ok());
        if !r.ok() || !success {
            return Err(launch_error(offer, &r));
        }
        let id = r
            .body
            .get("new_contract")
            .and_then(|v| {
                v.as_u64()
                    .map(|n| n.to_string())
                    .or_else(|| v.as_str().map(str::to_string))
            })
            .ok_or_else(|| {
                ProviderError::Other(format!(
                    "vast create instance: no new_contract in {}",
                    r.message()
                ))
            })?;
        tracing::info!(provider = "vast", offer = %offer.id, node = %id, usd_per_hour = offer.usd_per_hour, "instance created");
        Ok(NodeId(id))
    }
}
