//! Kubernetes (CoreWeave): the workers are the pods of one Deployment
//! (`deploy/kubernetes/`); the fleet scales it and watches the nodes.
//!
//! A node of the fleet is a **pod**: its [`NodeId`] is the pod's name, which
//! is also its worker's `--name` (the Deployment passes `metadata.name`
//! through the downward API), so the coordinator's worker and the pod are
//! matched by name. The image, GPUs and the ticket (a Secret, read through
//! `secretKeyRef` into `TESSERA_WORKER_TICKET`) are the Deployment's, so
//! `launch` ignores the spec's image and ticket.
//!
//! Endpoints used (Kubernetes API, bearer token, the cluster's CA):
//! - `GET`/`PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`
//!   (the scale subresource; a merge patch of `spec.replicas`)
//!   (<https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/deployment-v1/#update-replace-scale-of-the-specified-deployment>).
//! - `GET /api/v1/namespaces/{ns}/pods?labelSelector=…`, `GET …/pods/{name}`,
//!   and a merge patch of a pod's annotation
//!   `controller.kubernetes.io/pod-deletion-cost` so that scaling down
//!   removes that pod and no other
//!   (<https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/>,
//!   <https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#pod-deletion-cost>).
//! - `GET /api/v1/nodes` and `GET /api/v1/nodes?watch=true` (one JSON watch
//!   event a line: `{"type": "ADDED"|"MODIFIED"|"DELETED", "object": Node}`)
//!   (<https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/>,
//!   <https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes>).
//!
//! CoreWeave reclaims a spot node by cordoning it (`spec.unschedulable`)
//! and labelling it `qos.coreweave.cloud/pending-preemption: "true"`, then
//! draining it within minutes
//! (<https://docs.coreweave.com/platform/capacity-plans/spot-node-pools>).
//! A pod on such a node reads as [`NodeState::Preempting`], and
//! [`Kubernetes::preempted_workers`] names the workers to drain now, before
//! the kubelet's SIGTERM (which the worker also drains on).

use std::collections::{BTreeSet, HashSet};
use std::io::BufRead;
use std::path::PathBuf;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::http::{encode, Api, Reply};
use crate::provider::{
    Billing, LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError, Secret,
};

/// The label CoreWeave puts on a node it is about to reclaim.
pub const PENDING_PREEMPTION: &str = "qos.coreweave.cloud/pending-preemption";
/// Makes the ReplicaSet remove this pod first on a scale-down.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// Watch events read in one watch call.
pub const MAX_WATCH_EVENTS: usize = 10_000;
/// The most replicas the fleet scales the Deployment to.
pub const MAX_REPLICAS: u32 = 1000;

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// The API server (in a pod: `https://kubernetes.default.svc`).
    pub api_url: String,
    /// The cluster's CA certificate (PEM); none: the public roots (CoreWeave's
    /// public API endpoint).
    pub ca_file: Option<PathBuf>,
    pub namespace: String,
    pub deployment: String,
    /// Selects the Deployment's pods.
    pub pod_selector: String,
    /// What one pod has and costs, for the fleet's offers.
    pub gpu: String,
    pub gpu_count: u32,
    pub vram_gib: u32,
    pub usd_per_hour: f64,
    /// The node pool is spot (preemptible).
    pub interruptible: bool,
    pub max_replicas: u32,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            api_url: "https://kubernetes.default.svc".into(),
            ca_file: None,
            namespace: "tessera".into(),
            deployment: "tessera-worker".into(),
            pod_selector: "app.kubernetes.io/name=tessera-worker".into(),
            gpu: "A100_PCIE_80GB".into(),
            gpu_count: 1,
            vram_gib: 80,
            usd_per_hour: 2.21,
            interruptible: false,
            max_replicas: 16,
        }
    }
}

/// A worker whose node is being reclaimed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PreemptedWorker {
    /// The pod's name, which is the worker's name.
    pub worker: String,
    pub node: String,
}

pub struct Kubernetes {
    config: KubernetesConfig,
    api: Api,
    /// Pods handed out by `launch` (so two launches never claim one pod).
    claimed: HashSet<String>,
}

/// Whether a Node object is being reclaimed: cordoned, or labelled.
pub fn node_preempting(node: &Value) -> bool {
    let labelled = node
        .pointer("/metadata/labels")
        .and_then(|l| l.get(PENDING_PREEMPTION))
        .and_then(Value::as_str)
        == Some("true");
    let cordoned = node.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true);
    labelled || cordoned
}

fn name_of(v: &Value) -> Option<&str> {
    v.pointer("/metadata/name").and_then(Value::as_str)
}

impl Kubernetes {
    pub fn new(config: KubernetesConfig, token: Secret) -> Result<Kubernetes, ProviderError> {
        let ca = match &config.ca_file {
            Some(p) => Some(std::fs::read(p).map_err(|e| {
                ProviderError::Other(format!("cannot read the cluster CA {}: {e}", p.display()))
            })?),
            None => None,
        };
        let api = Api::new(&config.api_url, Some(token), ca.as_deref())?;
        Ok(Kubernetes {
            config,
            api,
            claimed: HashSet::new(),
        })
    }

    fn scale_path(&self) -> String {
        format!(
            "/apis/apps/v1/namespaces/{}/deployments/{}/scale",
            encode(&self.config.namespace),
            encode(&self.config.deployment)
        )
    }

    fn pod_path(&self, pod: &str) -> String {
        format!(
            "/api/v1/namespaces/{}/pods/{}",
            encode(&self.config.namespace),
            encode(pod)
        )
    }

    fn check(r: Reply, what: &str) -> Result<Value, ProviderError> {
        if r.ok() {
            Ok(r.body)
        } else {
            Err(r.error(what))
        }
    }

    /// The Deployment's replica count.
    pub fn replicas(&self) -> Result<u32, ProviderError> {
        let body = Self::check(
            self.api.call("GET", &self.scale_path(), None)?,
            "kubernetes read scale",
        )?;
        Ok(body
            .pointer("/spec/replicas")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(u64::from(MAX_REPLICAS)) as u32)
    }

    /// Scales the Deployment to `n` replicas.
    pub fn scale(&self, n: u32) -> Result<(), ProviderError> {
        let patch =
            json!({"spec": {"replicas": n.min(self.config.max_replicas.min(MAX_REPLICAS))}});
        let r = self.api.call_typed(
            "PATCH",
            &self.scale_path(),
            Some(&patch),
            "application/merge-patch+json",
        )?;
        Self::check(r, "kubernetes scale").map(|_| ())
    }

    /// The Deployment's pods (name, node name or none while unscheduled).
    pub fn pods(&self) -> Result<Vec<(String, Option<String>)>, ProviderError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector={}",
            encode(&self.config.namespace),
            encode(&self.config.pod_selector)
        );
        let body = Self::check(self.api.call("GET", &path, None)?, "kubernetes list pods")?;
        Ok(body
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|p| {
                p.pointer("/metadata/deletionTimestamp")
                    .is_none_or(Value::is_null)
            })
            .filter_map(|p| {
                let node = p
                    .pointer("/spec/nodeName")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                name_of(p).map(|n| (n.to_string(), node))
            })
            .collect())
    }

    /// Nodes being reclaimed now (cordoned or labelled), from a list.
    pub fn preempting_nodes(&self) -> Result<BTreeSet<String>, ProviderError> {
        let body = Self::check(
            self.api.call("GET", "/api/v1/nodes", None)?,
            "kubernetes list nodes",
        )?;
        Ok(body
            .get("items")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|n| node_preempting(n))
            .filter_map(|n| name_of(n).map(str::to_string))
            .collect())
    }

    /// Reads one node watch (`timeout_secs`, at most 25 s: within the
    /// client's request timeout; or until the server ends it)
    /// and returns the nodes its events mark for preemption (an `ADDED` or
    /// `MODIFIED` node cordoned or labelled), in the order they came.
    pub fn watch_preemptions(&self, timeout_secs: u32) -> Result<Vec<String>, ProviderError> {
        let path = format!(
            "/api/v1/nodes?watch=true&timeoutSeconds={}",
            timeout_secs.clamp(1, 25)
        );
        let (status, reader) = self.api.stream(&path)?;
        if !(200..300).contains(&status) {
            return Err(ProviderError::Other(format!(
                "kubernetes watch nodes: HTTP {status}"
            )));
        }
        let mut marked = Vec::new();
        for line in reader.lines().take(MAX_WATCH_EVENTS) {
            let line =
                line.map_err(|e| ProviderError::Other(format!("kubernetes watch nodes: {e}")))?;
            if line.trim().is_empty() {
                continue;
            }
            let event: Value = serde_json::from_str(&line).map_err(|e| {
                ProviderError::Other(format!("kubernetes watch nodes: a bad event: {e}"))
            })?;
            if let Some(node) = node_event(&event) {
                if !marked.contains(&node) {
                    marked.push(node);
                }
            }
        }
        Ok(marked)
    }

    /// The workers (pods of the Deployment) on `nodes`.
    pub fn workers_on(
        &self,
        nodes: &BTreeSet<String>,
    ) -> Result<Vec<PreemptedWorker>, ProviderError> {
        let mut out: Vec<PreemptedWorker> = self
            .pods()?
            .into_iter()
            .filter_map(|(pod, node)| {
                let node = node?;
                nodes
                    .contains(&node)
                    .then_some(PreemptedWorker { worker: pod, node })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Every worker whose node is being reclaimed now (a list, not a watch).
    pub fn preempted_workers(&self) -> Result<Vec<PreemptedWorker>, ProviderError> {
        let nodes = self.preempting_nodes()?;
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        self.workers_on(&nodes)
    }
}

/// The node a watch event marks for preemption, if it does.
pub fn node_event(event: &Value) -> Option<String> {
    let kind = event.get("type").and_then(Value::as_str)?;
    let node = event.get("object")?;
    (matches!(kind, "ADDED" | "MODIFIED") && node_preempting(node))
        .then(|| name_of(node).map(str::to_string))?
}

impl Provider for Kubernetes {
    fn name(&self) -> &str {
        "kubernetes"
    }

    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError> {
        let c = &self.config;
        if self.replicas()? >= c.max_replicas.min(MAX_REPLICAS) {
            return Ok(Vec::new());
        }
        Ok(vec![Offer {
            id: c.deployment.clone(),
            gpu: c.gpu.clone(),
            gpu_count: c.gpu_count.max(1),
            vram_gib: c.vram_gib,
            usd_per_hour: c.usd_per_hour,
            interruptible: c.interruptible,
            region: None,
            billing: Billing::Increment(60),
        }])
    }

    /// Scales up by one and returns the new pod (once the ReplicaSet has
    /// made it; until then a `pending-N` id that `state` resolves).
    fn launch(&mut self, _offer: &Offer, _spec: &LaunchSpec) -> Result<NodeId, ProviderError> {
        let before: HashSet<String> = self.pods()?.into_iter().map(|(p, _)| p).collect();
        let n = self.replicas()?;
        if n >= self.config.max_replicas.min(MAX_REPLICAS) {
            return Err(ProviderError::Quota(format!(
                "kubernetes: the deployment is at max_replicas ({n})"
            )));
        }
        self.scale(n + 1)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let new = self
                .pods()?
                .into_iter()
                .map(|(p, _)| p)
                .find(|p| !before.contains(p) && !self.claimed.contains(p));
            if let Some(pod) = new {
                self.claimed.insert(pod.clone());
                tracing::info!(provider = "kubernetes", node = %pod, replicas = n + 1, "deployment scaled up");
                return Ok(NodeId(pod));
            }
            if std::time::Instant::now() >= deadline {
                return Ok(NodeId(format!("pending-{}", n + 1)));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        if node.0.starts_with("pending-") {
            return Ok(NodeState::Starting);
        }
        let r = self.api.call("GET", &self.pod_path(&node.0), None)?;
        if r.status == 404 {
            return Ok(NodeState::Gone);
        }
        let pod = Self::check(r, "kubernetes read pod")?;
        if pod
            .pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
        {
            // Terminating: SIGTERM is on its way or sent; the worker drains.
            return Ok(NodeState::Preempting);
        }
        match pod.pointer("/status/phase").and_then(Value::as_str) {
            Some("Succeeded" | "Failed") => return Ok(NodeState::Gone),
            Some("Running") => {}
            _ => return Ok(NodeState::Starting),
        }
        let Some(host) = pod.pointer("/spec/nodeName").and_then(Value::as_str) else {
            return Ok(NodeState::Starting);
        };
        let r = self
            .api
            .call("GET", &format!("/api/v1/nodes/{}", encode(host)), None)?;
        if r.status == 404 {
            return Ok(NodeState::Preempting);
        }
        let n = Self::check(r, "kubernetes read node")?;
        Ok(if node_preempting(&n) {
            NodeState::Preempting
        } else {
            NodeState::Running
        })
    }

    /// Marks the pod as the one to remove and scales down by one.
    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError> {
        self.claimed.remove(&node.0);
        if !node.0.starts_with("pending-") {
            let patch = json!({"metadata": {"annotations": {DELETION_COST: "-1000000"}}});
            let r = self.api.call_typed(
                "PATCH",
                &self.pod_path(&node.0),
                Some(&patch),
                "application/merge-patch+json",
            )?;
            if r.status == 404 {
                // Already gone: its ReplicaSet has made, or makes, another
                // pod for the count, which the next scale-down removes.
                return Ok(());
            }
            Self::check(r, "kubernetes annotate pod")?;
        }
        let n = self.replicas()?;
        self.scale(n.saturating_sub(1))?;
        tracing::info!(provider = "kubernetes", node = %node, replicas = n.saturating_sub(1), "deployment scaled down");
        Ok(())
    }
}
