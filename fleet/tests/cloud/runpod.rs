//! RunPod's GraphQL API, stood in (no RunPod account here): gpuTypes with
//! lowestPrice, podFindAndDeployOnDemand, podRentInterruptable, pod,
//! podStop, podTerminate. Errors come as HTTP 200 with `errors`, as RunPod
//! answers them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tessera_fleet::boot::{launch_until_booted, BootPolicy, Skipped};
use tessera_fleet::provider::{NodeState, Provider, ProviderError};
use tessera_fleet::providers::runpod::{Runpod, RunpodConfig};

use crate::standin::{Request, Response, StandIn};

#[derive(Default)]
struct Cloud {
    /// Pod id → (gpu type, desiredStatus, polls so far).
    pods: HashMap<String, (String, String, u32)>,
    next: u32,
    gone: Vec<String>,
    never_boots: Vec<String>,
    fail_next: Option<Response>,
}

fn gpu_types() -> Value {
    json!({"data": {"gpuTypes": [
        {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24,
         "lowestPrice": {"minimumBidPrice": 0.2, "uninterruptablePrice": 0.69}},
        {"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 PCIe", "memoryInGb": 80,
         "lowestPrice": {"minimumBidPrice": 0.6, "uninterruptablePrice": 1.64}},
        {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80,
         "lowestPrice": {"minimumBidPrice": null, "uninterruptablePrice": null}},
        {"id": "NVIDIA RTX A4000", "displayName": "RTX A4000", "memoryInGb": 16,
         "lowestPrice": {"minimumBidPrice": 0.1, "uninterruptablePrice": 0.17}}
    ]}})
}

fn stand_in() -> (StandIn, Arc<Mutex<Cloud>>) {
    let cloud = Arc::new(Mutex::new(Cloud::default()));
    let c = cloud.clone();
    let s = StandIn::start("/graphql", move |r: &Request| {
        let mut c = c.lock().unwrap();
        assert_eq!((r.method.as_str(), r.route()), ("POST", "/graphql"));
        let b = r.json();
        let (q, vars) = (
            b["query"].as_str().unwrap().to_string(),
            b["variables"].clone(),
        );
        if q.contains("gpuTypes") {
            return Response::json(200, gpu_types());
        }
        if q.contains("podFindAndDeployOnDemand") || q.contains("podRentInterruptable") {
            if let Some(f) = c.fail_next.take() {
                return f;
            }
            let gpu = vars["input"]["gpuTypeId"].as_str().unwrap().to_string();
            if c.gone.contains(&gpu) {
                return Response::json(
                    200,
                    json!({"errors": [{"message":
                    "There are no longer any instances available with the requested specifications. Please refresh and try again."}],
                    "data": null}),
                );
            }
            c.next += 1;
            let id = format!("pod{:04}xyz", c.next);
            c.pods.insert(id.clone(), (gpu, "RUNNING".into(), 0));
            let field = if q.contains("podRentInterruptable") {
                "podRentInterruptable"
            } else {
                "podFindAndDeployOnDemand"
            };
            return Response::json(
                200,
                json!({"data": {field: {"id": id, "desiredStatus": "RUNNING",
                "imageName": vars["input"]["imageName"], "machineId": "m1"}}}),
            );
        }
        if q.contains("podTerminate") {
            let id = vars["input"]["podId"].as_str().unwrap();
            c.pods.remove(id);
            return Response::json(200, json!({"data": {"podTerminate": null}}));
        }
        if q.contains("podStop") {
            let id = vars["input"]["podId"].as_str().unwrap();
            return match c.pods.get_mut(id) {
                Some(p) => {
                    p.1 = "EXITED".into();
                    Response::json(
                        200,
                        json!({"data": {"podStop": {"id": id, "desiredStatus": "EXITED"}}}),
                    )
                }
                None => Response::json(200, json!({"errors": [{"message": "pod not found"}]})),
            };
        }
        if q.contains("pod(") {
            let id = vars["input"]["podId"].as_str().unwrap();
            let never = c.never_boots.clone();
            return match c.pods.get_mut(id) {
                None => Response::json(200, json!({"data": {"pod": null}})),
                Some((gpu, status, polls)) => {
                    *polls += 1;
                    let up = *polls > 1 && !never.contains(gpu) && status == "RUNNING";
                    let runtime = if up {
                        json!({"uptimeInSeconds": 5})
                    } else {
                        Value::Null
                    };
                    Response::json(
                        200,
                        json!({"data": {"pod": {"id": id, "desiredStatus": status, "runtime": runtime}}}),
                    )
                }
            };
        }
        Response::json(
            200,
            json!({"errors": [{"message": format!("unknown query {q}")}]}),
        )
    });
    (s, cloud)
}

fn runpod(s: &StandIn, key: &tessera_fleet::provider::Secret, interruptible: bool) -> Runpod {
    let config = RunpodConfig {
        api_url: s.url.clone(),
        gpu_types: vec!["RTX 4090".into(), "A100".into(), "H100".into()],
        min_vram_gib: 20,
        max_usd_per_gpu_hour: 2.0,
        interruptible,
        cloud_type: "SECURE".into(),
        ..RunpodConfig::default()
    };
    Runpod::new(config, key.clone()).unwrap()
}

#[test]
fn runpod_deploys_the_image_with_the_ticket_only_in_env() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("runpod-deploy"), crate::key("runpod-deploy"));
    let mut p = runpod(&s, &key, false);
    let offers = p.offers().unwrap();
    // H100 has no price now (none to rent); the A4000 has 16 GB.
    let ids: Vec<_> = offers
        .iter()
        .map(|o| (o.id.as_str(), o.usd_per_hour))
        .collect();
    assert_eq!(
        ids,
        [
            ("NVIDIA GeForce RTX 4090", 0.69),
            ("NVIDIA A100 80GB PCIe", 1.64)
        ]
    );
    assert_eq!(s.requests()[0].json()["variables"], json!({"gpuCount": 1}));
    let node = p.launch(&offers[0], &spec).unwrap();
    let deploy = s
        .requests()
        .into_iter()
        .rfind(|r| r.body.contains("podFindAndDeployOnDemand"))
        .unwrap();
    let input = &deploy.json()["variables"]["input"];
    assert_eq!(input["imageName"], "registry.example/tessera-worker:0.1");
    assert_eq!(input["gpuTypeId"], "NVIDIA GeForce RTX 4090");
    assert_eq!(input["gpuCount"], 1);
    assert_eq!(input["cloudType"], "SECURE");
    assert_eq!(
        input["env"][0],
        json!({"key": "TESSERA_WORKER_TICKET", "value": spec.worker_ticket.expose()})
    );
    assert_eq!(input["env"][1], json!({"key": "RUST_LOG", "value": "info"}));
    let args = input["dockerArgs"].as_str().unwrap();
    assert_eq!(
        args,
        format!(
            "'worker' '--name' '{}' '--slots' 'auto' '--interruptible'",
            spec.name
        )
    );
    assert!(input.get("bidPerGpu").is_none());
    assert_eq!(deploy.body.matches(spec.worker_ticket.expose()).count(), 1);

    assert_eq!(p.state(&node).unwrap(), NodeState::Starting);
    assert_eq!(p.state(&node).unwrap(), NodeState::Running);
    p.stop(&node).unwrap();
    assert_eq!(p.state(&node).unwrap(), NodeState::Paused);
    p.release(&node).unwrap();
    assert!(cloud.lock().unwrap().pods.is_empty());
    assert_eq!(p.state(&node).unwrap(), NodeState::Gone);
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn runpod_spot_pods_bid_per_gpu() {
    let (s, _cloud) = stand_in();
    let (spec, key) = (crate::spec("runpod-spot"), crate::key("runpod-spot"));
    let mut p = runpod(&s, &key, true);
    let offers = p.offers().unwrap();
    assert!((offers[0].usd_per_hour - 0.21).abs() < 1e-9, "{offers:?}"); // 0.20 + 5 %
    p.launch(&offers[0], &spec).unwrap();
    let rent = s
        .requests()
        .into_iter()
        .rfind(|r| r.body.contains("podRentInterruptable"))
        .unwrap();
    let input = &rent.json()["variables"]["input"];
    assert!((input["bidPerGpu"].as_f64().unwrap() - 0.21).abs() < 1e-9);
    assert_eq!(input["env"][0]["value"], spec.worker_ticket.expose());
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn runpod_errors_are_told_apart_gone_quota_rate_limited() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("runpod-errors"), crate::key("runpod-errors"));
    let mut p = runpod(&s, &key, false);
    let offers = p.offers().unwrap();
    cloud
        .lock()
        .unwrap()
        .gone
        .push("NVIDIA GeForce RTX 4090".into());
    assert!(matches!(
        p.launch(&offers[0], &spec),
        Err(ProviderError::OfferGone(_))
    ));
    cloud.lock().unwrap().fail_next = Some(Response::json(
        200,
        json!({"errors": [{"message":
        "Your account balance is too low to deploy this pod."}]}),
    ));
    assert!(matches!(
        p.launch(&offers[1], &spec),
        Err(ProviderError::Quota(_))
    ));
    cloud.lock().unwrap().fail_next = Some(
        Response::json(429, json!({"error": "too many requests"})).with_header("Retry-After", "3"),
    );
    match p.launch(&offers[1], &spec) {
        Err(ProviderError::RateLimited { retry_after }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(3)))
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn runpod_a_pod_that_never_boots_is_terminated_and_another_gpu_type_tried() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("runpod-boot"), crate::key("runpod-boot"));
    let mut p = runpod(&s, &key, false);
    let offers = p.offers().unwrap();
    cloud
        .lock()
        .unwrap()
        .never_boots
        .push("NVIDIA GeForce RTX 4090".into());
    let policy = BootPolicy {
        boot_timeout: Duration::from_millis(300),
        poll: Duration::from_millis(20),
        max_attempts: 3,
    };
    let booted =
        launch_until_booted(&mut p, &offers, &spec, policy, &mut Default::default()).unwrap();
    assert_eq!(booted.offer.id, "NVIDIA A100 80GB PCIe");
    assert!(matches!(
        booted.skipped.as_slice(),
        [(_, Skipped::NeverBooted(_))]
    ));
    assert_eq!(
        cloud
            .lock()
            .unwrap()
            .pods
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![booted.node.0.clone()]
    );
    crate::assert_secrets_kept(&s, &key, &spec);
}
