//! The fleet's Kubernetes preemption drain against a real farm: a real
//! coordinator and two real builtin workers whose names are their pods'.
//! The Kubernetes API is a stand-in (no cluster here; the stand-in HTTP
//! server is the fleet's, `fleet/tests/cloud/standin.rs`) serving the
//! documented node list, node watch and pod list shapes.

#[path = "../../fleet/tests/cloud/standin.rs"]
#[allow(dead_code)]
mod standin;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tessera_fleet::preempt::{Drainer, Preemptions};
use tessera_fleet::provider::Secret;
use tessera_fleet::providers::kubernetes::{Kubernetes, KubernetesConfig, PreemptedWorker};

use crate::harness::{assert_frames_match_reference_samples, scenes, Farm};
use standin::{Request, Response, StandIn};

fn node(name: &str, preempting: bool) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if preempting {
        labels["qos.coreweave.cloud/pending-preemption"] = json!("true");
    }
    json!({"kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": preempting}})
}

/// Drains through the coordinator as an operator would: `tessera status`
/// for the worker's id, `tessera drain ID`.
struct FarmDrainer<'a>(&'a Farm);

impl Drainer for FarmDrainer<'_> {
    fn drain(&mut self, worker: &str) -> Result<(), String> {
        let all = self.0.json(&["status", "--json"]);
        let id = (all["workers"].as_array().unwrap().iter())
            .find(|w| w["name"] == worker)
            .and_then(|w| w["id"].as_u64())
            .ok_or_else(|| format!("no worker named {worker}"))?;
        let out = self.0.run(&["drain", &id.to_string()]);
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn a_node_marked_for_preemption_has_its_workers_drained_and_their_tasks_requeued_before_the_kill() {
    let mut farm = Farm::start("fleet-preempt", &[]);
    let (doomed, stays) = ("tessera-worker-7f9c", "tessera-worker-2b1d");
    let w_doomed = farm.add_worker(doomed);
    farm.add_worker(stays);
    farm.wait_workers(2);

    // The cluster: each worker's pod on its own node; the watch will carry
    // CoreWeave's label on gpu-a.
    let watch = Arc::new(Mutex::new(Vec::<Value>::new()));
    let events = watch.clone();
    let api = StandIn::start("", move |r: &Request| match r.route() {
        "/api/v1/nodes" if r.path.contains("watch=true") => {
            Response::lines(200, &events.lock().unwrap())
        }
        "/api/v1/nodes" => Response::json(
            200,
            json!({"kind": "NodeList", "items": [node("gpu-a", false), node("gpu-b", false)]}),
        ),
        "/api/v1/namespaces/tessera/pods" => Response::json(
            200,
            json!({"kind": "PodList", "items": [
            {"metadata": {"name": doomed}, "spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}},
            {"metadata": {"name": stays}, "spec": {"nodeName": "gpu-b"}, "status": {"phase": "Running"}}]}),
        ),
        _ => Response::json(404, json!({"kind": "Status", "code": 404})),
    });
    let config = KubernetesConfig {
        api_url: api.url.clone(),
        ..KubernetesConfig::default()
    };
    let k8s = Kubernetes::new(config, Secret::new("service-account-token")).unwrap();
    let mut preemptions = Preemptions::default();
    assert!(preemptions
        .watch_and_drain(&k8s, 1, &mut FarmDrainer(&farm))
        .unwrap()
        .is_empty());

    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--samples",
        "64",
        "--json",
    ]);
    let job = job["id"].as_u64().unwrap();
    farm.wait_mid_render(job, w_doomed, doomed);

    // CoreWeave cordons gpu-a and labels it: the fleet drains its worker.
    watch
        .lock()
        .unwrap()
        .push(json!({"type": "MODIFIED", "object": node("gpu-a", true)}));
    let drained = preemptions
        .watch_and_drain(&k8s, 1, &mut FarmDrainer(&farm))
        .unwrap();
    assert_eq!(
        drained,
        [PreemptedWorker {
            worker: doomed.into(),
            node: "gpu-a".into()
        }]
    );
    // Drained once, not again on the next round.
    assert!(preemptions
        .watch_and_drain(&k8s, 1, &mut FarmDrainer(&farm))
        .unwrap()
        .is_empty());

    // The worker finishes its task, leaves by itself, and only then is the
    // node killed: everything it rendered was accepted, nothing was lost.
    let exit = farm.wait_worker_exit(w_doomed, Duration::from_secs(60));
    assert!(exit.success(), "the drained worker exited with {exit}");
    let log = farm.log_of(w_doomed);
    let rendered = log.matches("task rendered").count();
    assert!(rendered >= 1);
    assert_eq!(
        log.matches("result accepted").count(),
        rendered,
        "a result of the drained worker was lost"
    );
    assert!(rendered < 16, "the drained worker rendered the whole job");

    // Its remaining tasks were requeued to the other worker: the job
    // completes, every tile exact, no task accepted twice.
    let out = farm.dir.join("out");
    farm.wait_done(job, &out);
    assert_frames_match_reference_samples(&out, &scene, &[1], 64);
    let mut accepted = farm.accepted();
    let all = accepted.len();
    accepted.sort();
    accepted.dedup();
    assert_eq!(accepted.len(), all, "a task was accepted twice");
    assert_eq!(all, 16);
    assert!(farm.log_of(1).matches("result accepted").count() > 0);
}
