//! The Kubernetes API of a CoreWeave cluster, stood in (no cluster here):
//! the Deployment's scale subresource, its pods (list, read, merge patch),
//! nodes (list, read, watch). A ReplicaSet is played by the stand-in: a
//! scale up makes a pod, a scale down removes the pod of lowest
//! `controller.kubernetes.io/pod-deletion-cost`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tessera_fleet::provider::{NodeState, Provider, ProviderError};
use tessera_fleet::providers::kubernetes::{
    Kubernetes, KubernetesConfig, PreemptedWorker, DELETION_COST,
};

use crate::standin::{Request, Response, StandIn};

pub struct Cluster {
    pub replicas: u32,
    /// Pod name → (node, deletion cost).
    pub pods: BTreeMap<String, (String, i64)>,
    /// Node name → Node object.
    pub nodes: BTreeMap<String, Value>,
    pub next: u32,
    pub watch: Vec<Value>,
    pub fail_next: Option<Response>,
}

pub fn node(name: &str, preempting: bool, cordoned: bool) -> Value {
    let mut labels =
        json!({"kubernetes.io/hostname": name, "gpu.nvidia.com/class": "A100_PCIE_80GB"});
    if preempting {
        labels["qos.coreweave.cloud/pending-preemption"] = json!("true");
    }
    json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "labels": labels},
           "spec": {"unschedulable": cordoned}})
}

fn pod(name: &str, node: &str) -> Value {
    json!({"kind": "Pod", "apiVersion": "v1",
           "metadata": {"name": name, "namespace": "render", "labels": {"app.kubernetes.io/name": "tessera-worker"}},
           "spec": {"nodeName": node}, "status": {"phase": "Running"}})
}

/// A stand-in API server for `cluster`; pods are named
/// `tessera-worker-<n>` and placed on the nodes in turn.
pub fn stand_in(cluster: Cluster) -> (StandIn, Arc<Mutex<Cluster>>) {
    let cluster = Arc::new(Mutex::new(cluster));
    let c = cluster.clone();
    let s = StandIn::start("", move |r: &Request| {
        let mut c = c.lock().unwrap();
        if let Some(f) = c.fail_next.take() {
            return f;
        }
        let scale = "/apis/apps/v1/namespaces/render/deployments/tessera-worker/scale";
        let scale_obj = |n: u32| {
            json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": "tessera-worker", "namespace": "render"}, "spec": {"replicas": n}, "status": {"replicas": n}})
        };
        match (r.method.as_str(), r.route()) {
            ("GET", p) if p == scale => Response::json(200, scale_obj(c.replicas)),
            ("PATCH", p) if p == scale => {
                assert_eq!(
                    r.header("content-type"),
                    Some("application/merge-patch+json")
                );
                let want = r.json()["spec"]["replicas"].as_u64().unwrap() as u32;
                while (c.pods.len() as u32) < want {
                    c.next += 1;
                    let nodes: Vec<String> = c.nodes.keys().cloned().collect();
                    let node = nodes[(c.next as usize - 1) % nodes.len()].clone();
                    let name = format!("tessera-worker-{}", c.next);
                    c.pods.insert(name, (node, 0));
                }
                while (c.pods.len() as u32) > want {
                    let victim = c
                        .pods
                        .iter()
                        .min_by_key(|(_, (_, cost))| *cost)
                        .map(|(k, _)| k.clone())
                        .unwrap();
                    c.pods.remove(&victim);
                }
                c.replicas = want;
                Response::json(200, scale_obj(want))
            }
            ("GET", "/api/v1/namespaces/render/pods") => {
                assert!(
                    r.path
                        .contains("labelSelector=app.kubernetes.io%2Fname%3Dtessera-worker"),
                    "{}",
                    r.path
                );
                let items: Vec<Value> = c.pods.iter().map(|(n, (node, _))| pod(n, node)).collect();
                Response::json(
                    200,
                    json!({"kind": "PodList", "apiVersion": "v1", "items": items}),
                )
            }
            ("GET", p) if p.starts_with("/api/v1/namespaces/render/pods/") => {
                let name = &p["/api/v1/namespaces/render/pods/".len()..];
                match c.pods.get(name) {
                    Some((node, _)) => Response::json(200, pod(name, node)),
                    None => Response::json(
                        404,
                        json!({"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404,
                        "message": format!("pods \"{name}\" not found")}),
                    ),
                }
            }
            ("PATCH", p) if p.starts_with("/api/v1/namespaces/render/pods/") => {
                assert_eq!(
                    r.header("content-type"),
                    Some("application/merge-patch+json")
                );
                let name = p["/api/v1/namespaces/render/pods/".len()..].to_string();
                let cost: i64 = r.json()["metadata"]["annotations"][DELETION_COST]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                match c.pods.get_mut(&name) {
                    Some(p) => {
                        p.1 = cost;
                        let (node, _) = p.clone();
                        Response::json(200, pod(&name, &node))
                    }
                    None => Response::json(
                        404,
                        json!({"kind": "Status", "reason": "NotFound", "code": 404}),
                    ),
                }
            }
            ("GET", "/api/v1/nodes") if r.path.contains("watch=true") => {
                Response::lines(200, &c.watch)
            }
            ("GET", "/api/v1/nodes") => {
                let items: Vec<Value> = c.nodes.values().cloned().collect();
                Response::json(
                    200,
                    json!({"kind": "NodeList", "apiVersion": "v1", "items": items}),
                )
            }
            ("GET", p) if p.starts_with("/api/v1/nodes/") => {
                match c.nodes.get(&p["/api/v1/nodes/".len()..]) {
                    Some(n) => Response::json(200, n.clone()),
                    None => Response::json(
                        404,
                        json!({"kind": "Status", "reason": "NotFound", "code": 404}),
                    ),
                }
            }
            _ => Response::json(
                404,
                json!({"kind": "Status", "reason": "NotFound", "code": 404, "message": r.path}),
            ),
        }
    });
    (s, cluster)
}

pub fn cluster(nodes: &[&str]) -> Cluster {
    Cluster {
        replicas: 0,
        pods: BTreeMap::new(),
        nodes: nodes
            .iter()
            .map(|n| (n.to_string(), node(n, false, false)))
            .collect(),
        next: 0,
        watch: Vec::new(),
        fail_next: None,
    }
}

pub fn adapter(s: &StandIn, token: &tessera_fleet::provider::Secret) -> Kubernetes {
    let config = KubernetesConfig {
        api_url: s.url.clone(),
        namespace: "render".into(),
        max_replicas: 4,
        interruptible: true,
        ..KubernetesConfig::default()
    };
    Kubernetes::new(config, token.clone()).unwrap()
}

#[test]
fn kubernetes_scales_the_deployment_and_removes_the_released_pod_only() {
    let (s, cluster) = stand_in(cluster(&["gpu-a", "gpu-b"]));
    let (spec, token) = (crate::spec("k8s-scale"), crate::key("k8s-scale"));
    let mut k = adapter(&s, &token);
    let offers = k.offers().unwrap();
    assert_eq!(
        (
            offers[0].id.as_str(),
            offers[0].gpu.as_str(),
            offers[0].interruptible
        ),
        ("tessera-worker", "A100_PCIE_80GB", true)
    );
    let a = k.launch(&offers[0], &spec).unwrap();
    let b = k.launch(&offers[0], &spec).unwrap();
    let c = k.launch(&offers[0], &spec).unwrap();
    assert_eq!(
        [a.0.as_str(), b.0.as_str(), c.0.as_str()],
        ["tessera-worker-1", "tessera-worker-2", "tessera-worker-3"]
    );
    assert_eq!(cluster.lock().unwrap().replicas, 3);
    assert_eq!(k.state(&b).unwrap(), NodeState::Running);
    // Releasing the middle one removes that pod, not the others.
    k.release(&b).unwrap();
    let left: Vec<String> = cluster.lock().unwrap().pods.keys().cloned().collect();
    assert_eq!(left, ["tessera-worker-1", "tessera-worker-3"]);
    assert_eq!(cluster.lock().unwrap().replicas, 2);
    assert_eq!(k.state(&b).unwrap(), NodeState::Gone);
    // The ticket is the Deployment's Secret: the adapter never sends it.
    assert!(!s.all_text().contains(spec.worker_ticket.expose()));
    k.launch(&offers[0], &spec).unwrap();
    k.launch(&offers[0], &spec).unwrap();
    assert!(
        matches!(k.launch(&offers[0], &spec), Err(ProviderError::Quota(_))),
        "max_replicas is 4"
    );
    cluster.lock().unwrap().fail_next = Some(
        Response::json(429, json!({"kind": "Status", "code": 429})).with_header("Retry-After", "1"),
    );
    assert!(matches!(
        k.state(&a),
        Err(ProviderError::RateLimited {
            retry_after: Some(_)
        })
    ));
    crate::assert_secrets_kept(&s, &token, &spec);
}

#[test]
fn kubernetes_a_pod_on_a_node_marked_for_preemption_is_preempting() {
    let (s, cluster) = stand_in(cluster(&["gpu-a", "gpu-b"]));
    let (spec, token) = (crate::spec("k8s-preempt"), crate::key("k8s-preempt"));
    let mut k = adapter(&s, &token);
    let offers = k.offers().unwrap();
    let a = k.launch(&offers[0], &spec).unwrap(); // on gpu-a
    let b = k.launch(&offers[0], &spec).unwrap(); // on gpu-b
    assert!(k.preempted_workers().unwrap().is_empty());
    cluster
        .lock()
        .unwrap()
        .nodes
        .insert("gpu-a".into(), node("gpu-a", true, true));
    assert_eq!(k.state(&a).unwrap(), NodeState::Preempting);
    assert_eq!(k.state(&b).unwrap(), NodeState::Running);
    assert_eq!(
        k.preempted_workers().unwrap(),
        [PreemptedWorker {
            worker: a.0.clone(),
            node: "gpu-a".into()
        }]
    );
    // Cordoned alone counts too (the label may come a moment later).
    cluster
        .lock()
        .unwrap()
        .nodes
        .insert("gpu-b".into(), node("gpu-b", false, true));
    assert_eq!(k.state(&b).unwrap(), NodeState::Preempting);
    crate::assert_secrets_kept(&s, &token, &spec);
}

#[test]
fn kubernetes_a_node_watch_event_with_the_label_names_that_node() {
    let mut c = cluster(&["gpu-a", "gpu-b", "gpu-c"]);
    c.watch = vec![
        json!({"type": "ADDED", "object": node("gpu-c", false, false)}),
        json!({"type": "MODIFIED", "object": node("gpu-b", true, true)}),
        json!({"type": "MODIFIED", "object": node("gpu-b", true, true)}),
        json!({"type": "DELETED", "object": node("gpu-a", true, true)}),
    ];
    let (s, _cluster) = stand_in(c);
    let token = crate::key("k8s-watch");
    let k = adapter(&s, &token);
    assert_eq!(k.watch_preemptions(5).unwrap(), ["gpu-b"]);
    let watch = s
        .requests()
        .into_iter()
        .find(|r| r.path.contains("watch=true"))
        .unwrap();
    assert_eq!(watch.path, "/api/v1/nodes?watch=true&timeoutSeconds=5");
    assert_eq!(
        watch.header("authorization"),
        Some(format!("Bearer {}", token.expose()).as_str())
    );
}
