//! Lambda Cloud's API, stood in (no Lambda account here): instance-types,
//! launch with user data, get instance, terminate; its error envelope
//! `{"error": {code, message, suggestion}}` and its launch rate limit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tessera_fleet::boot::{launch_until_booted, BootPolicy, Skipped};
use tessera_fleet::provider::{Billing, NodeState, Provider, ProviderError};
use tessera_fleet::providers::lambda::{Lambda, LambdaConfig};

use crate::standin::{Request, Response, StandIn};

#[derive(Default)]
struct Cloud {
    /// Instance id → (instance type, polls).
    instances: HashMap<String, (String, u32)>,
    next: u32,
    no_capacity: Vec<String>,
    never_boots: Vec<String>,
    fail_next: Option<Response>,
}

fn error(status: u16, code: &str, message: &str) -> Response {
    Response::json(
        status,
        json!({"error": {"code": code, "message": message, "suggestion": "see the docs"}}),
    )
}

fn instance_types() -> Value {
    let t = |name: &str, desc: &str, gpu: &str, cents: u32, gpus: u32, regions: &[&str]| {
        (
            name.to_string(),
            json!({
                "instance_type": {"name": name, "description": desc, "gpu_description": gpu,
                    "price_cents_per_hour": cents, "specs": {"vcpus": 30, "memory_gib": 200, "storage_gib": 512, "gpus": gpus}},
                "regions_with_capacity_available": regions.iter().map(|r| json!({"name": r, "description": r})).collect::<Vec<_>>()
            }),
        )
    };
    let map: serde_json::Map<String, Value> = [
        t(
            "gpu_1x_a100_sxm4",
            "1x A100 (40 GB SXM4)",
            "A100 (40 GB SXM4)",
            129,
            1,
            &["us-east-1", "us-west-2"],
        ),
        t(
            "gpu_1x_h100_pcie",
            "1x H100 (80 GB PCIe)",
            "H100 (80 GB PCIe)",
            249,
            1,
            &["us-west-3"],
        ),
        t(
            "gpu_8x_a100_80gb_sxm4",
            "8x A100 (80 GB SXM4)",
            "A100 (80 GB SXM4)",
            1432,
            8,
            &[],
        ),
        t(
            "gpu_1x_a10",
            "1x A10 (24 GB PCIe)",
            "A10 (24 GB PCIe)",
            75,
            1,
            &["us-east-1"],
        ),
    ]
    .into_iter()
    .collect();
    json!({"data": map})
}

fn stand_in() -> (StandIn, Arc<Mutex<Cloud>>) {
    let cloud = Arc::new(Mutex::new(Cloud::default()));
    let c = cloud.clone();
    let s = StandIn::start("/api/v1", move |r: &Request| {
        let mut c = c.lock().unwrap();
        let route = r.route().trim_start_matches("/api/v1").to_string();
        match (r.method.as_str(), route.as_str()) {
            ("GET", "/instance-types") => Response::json(200, instance_types()),
            ("POST", "/instance-operations/launch") => {
                if let Some(f) = c.fail_next.take() {
                    return f;
                }
                let b = r.json();
                let ty = b["instance_type_name"].as_str().unwrap().to_string();
                if c.no_capacity.contains(&ty) {
                    return error(
                        400,
                        "instance-operations/launch/insufficient-capacity",
                        "Not enough capacity to fulfill launch request.",
                    );
                }
                c.next += 1;
                let id = format!("0920582c7ff04139{:04}", c.next);
                c.instances.insert(id.clone(), (ty, 0));
                Response::json(200, json!({"data": {"instance_ids": [id]}}))
            }
            ("POST", "/instance-operations/terminate") => {
                let ids: Vec<String> =
                    serde_json::from_value(r.json()["instance_ids"].clone()).unwrap();
                let gone: Vec<Value> = ids
                    .iter()
                    .filter_map(|i| {
                        c.instances
                            .remove(i)
                            .map(|_| json!({"id": i, "status": "terminating"}))
                    })
                    .collect();
                if gone.is_empty() {
                    return error(
                        404,
                        "global/object-does-not-exist",
                        "Specified instance does not exist.",
                    );
                }
                Response::json(200, json!({"data": {"terminated_instances": gone}}))
            }
            ("GET", path) if path.starts_with("/instances/") => {
                let id = &path["/instances/".len()..];
                let never = c.never_boots.clone();
                match c.instances.get_mut(id) {
                    None => error(
                        404,
                        "global/object-does-not-exist",
                        "Specified instance does not exist.",
                    ),
                    Some((ty, polls)) => {
                        *polls += 1;
                        let status = if *polls > 1 && !never.contains(ty) {
                            "active"
                        } else {
                            "booting"
                        };
                        Response::json(
                            200,
                            json!({"data": {"id": id, "status": status, "instance_type": {"name": ty}}}),
                        )
                    }
                }
            }
            _ => error(404, "global/object-does-not-exist", "no such route"),
        }
    });
    (s, cloud)
}

fn lambda(s: &StandIn, key: &tessera_fleet::provider::Secret, interval: f64) -> Lambda {
    let config = LambdaConfig {
        api_url: s.url.clone(),
        gpu_types: vec!["A100".into(), "H100".into()],
        min_vram_gib: 40,
        max_usd_per_gpu_hour: 3.0,
        ssh_key_name: "farm-key".into(),
        launch_interval_secs: interval,
        ..LambdaConfig::default()
    };
    Lambda::new(config, key.clone()).unwrap()
}

#[test]
fn lambda_launches_with_the_ticket_in_an_env_file_not_a_command() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("lambda-launch"), crate::key("lambda-launch"));
    let mut l = lambda(&s, &key, 0.0);
    let mut offers = l.offers().unwrap();
    offers.sort_by(|a, b| a.id.cmp(&b.id));
    // One offer per region with capacity; the 8x A100 has none, the A10 is another GPU.
    let ids: Vec<_> = offers.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "gpu_1x_a100_sxm4@us-east-1",
            "gpu_1x_a100_sxm4@us-west-2",
            "gpu_1x_h100_pcie@us-west-3"
        ]
    );
    assert_eq!(
        (
            offers[0].usd_per_hour,
            offers[0].vram_gib,
            offers[0].billing
        ),
        (1.29, 40, Billing::Increment(60))
    );
    assert!(offers.iter().all(|o| !o.interruptible));

    let node = l.launch(&offers[0], &spec).unwrap();
    let launch = s
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    let b = launch.json();
    assert_eq!(b["instance_type_name"], "gpu_1x_a100_sxm4");
    assert_eq!(b["region_name"], "us-east-1");
    assert_eq!(b["ssh_key_names"], json!(["farm-key"]));
    assert_eq!(b["name"], spec.name);
    let ud = b["user_data"].as_str().unwrap();
    assert!(ud.starts_with("#cloud-config\n"), "{ud}");
    let ticket_line = format!(
        "      TESSERA_WORKER_TICKET={}",
        spec.worker_ticket.expose()
    );
    assert!(ud.lines().any(|l| l == ticket_line), "{ud}");
    assert!(ud.contains("permissions: \"0600\""));
    assert_eq!(
        ud.matches(spec.worker_ticket.expose()).count(),
        1,
        "the ticket is only in the env file"
    );
    // The runcmd entry is a YAML flow sequence (JSON): the docker command.
    let run = ud.lines().find(|l| l.starts_with("  - [")).unwrap();
    let argv: Vec<String> = serde_json::from_str(&run[4..]).unwrap();
    assert_eq!(&argv[..2], ["docker", "run"]);
    assert!(argv
        .windows(2)
        .any(|w| w == ["--env-file", "/etc/tessera/worker.env"]));
    assert!(argv.contains(&"registry.example/tessera-worker:0.1".to_string()));
    assert!(argv
        .windows(3)
        .any(|w| w == ["worker", "--name", spec.name.as_str()]));
    assert!(argv
        .iter()
        .all(|a| !a.contains(spec.worker_ticket.expose())));

    assert_eq!(l.state(&node).unwrap(), NodeState::Starting);
    assert_eq!(l.state(&node).unwrap(), NodeState::Running);
    l.release(&node).unwrap();
    assert!(cloud.lock().unwrap().instances.is_empty());
    assert_eq!(l.state(&node).unwrap(), NodeState::Gone);
    l.release(&node).unwrap();
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn lambda_keeps_to_its_launch_rate_and_honours_429() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("lambda-rate"), crate::key("lambda-rate"));
    let mut l = lambda(&s, &key, 60.0);
    let offers = l.offers().unwrap();
    l.launch(&offers[0], &spec).unwrap();
    // A second launch within the interval is not sent at all.
    match l.launch(&offers[0], &spec) {
        Err(ProviderError::RateLimited {
            retry_after: Some(wait),
        }) => assert!(wait <= Duration::from_secs(60) && !wait.is_zero()),
        other => panic!("expected RateLimited, got {other:?}"),
    }
    let launches = s
        .requests()
        .iter()
        .filter(|r| r.route().ends_with("/launch"))
        .count();
    assert_eq!(launches, 1);
    // The server's own 429 and its Retry-After.
    let mut l = lambda(&s, &key, 0.0);
    cloud.lock().unwrap().fail_next = Some(
        error(429, "global/too-many-requests", "Too many requests")
            .with_header("Retry-After", "12"),
    );
    match l.launch(&offers[0], &spec) {
        Err(ProviderError::RateLimited { retry_after }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(12)))
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn lambda_errors_are_told_apart_capacity_quota_key() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("lambda-errors"), crate::key("lambda-errors"));
    let mut l = lambda(&s, &key, 0.0);
    let offers = l.offers().unwrap();
    let a100 = offers
        .iter()
        .find(|o| o.id.starts_with("gpu_1x_a100"))
        .unwrap();
    cloud
        .lock()
        .unwrap()
        .no_capacity
        .push("gpu_1x_a100_sxm4".into());
    assert!(matches!(l.launch(a100, &spec), Err(ProviderError::OfferGone(id)) if id == a100.id));
    cloud.lock().unwrap().fail_next = Some(error(
        400,
        "global/quota-exceeded",
        "Quota exceeded for instances.",
    ));
    assert!(matches!(
        l.launch(a100, &spec),
        Err(ProviderError::Quota(_))
    ));
    cloud.lock().unwrap().fail_next = Some(error(
        401,
        "global/invalid-api-key",
        "API key was invalid, expired, or deleted.",
    ));
    assert!(matches!(l.launch(a100, &spec), Err(ProviderError::Auth(_))));
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn lambda_an_instance_that_never_boots_is_terminated_and_another_type_tried() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("lambda-boot"), crate::key("lambda-boot"));
    let mut l = lambda(&s, &key, 0.0);
    let offers = l.offers().unwrap();
    cloud
        .lock()
        .unwrap()
        .never_boots
        .push("gpu_1x_a100_sxm4".into());
    let policy = BootPolicy {
        boot_timeout: Duration::from_millis(300),
        poll: Duration::from_millis(20),
        max_attempts: 4,
    };
    let booted =
        launch_until_booted(&mut l, &offers, &spec, policy, &mut Default::default()).unwrap();
    // Both A100 regions never boot; the H100 does.
    assert_eq!(booted.offer.id, "gpu_1x_h100_pcie@us-west-3");
    assert_eq!(booted.skipped.len(), 2);
    assert!(booted
        .skipped
        .iter()
        .all(|(_, why)| matches!(why, Skipped::NeverBooted(_))));
    assert_eq!(
        cloud
            .lock()
            .unwrap()
            .instances
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec![booted.node.0.clone()]
    );
    crate::assert_secrets_kept(&s, &key, &spec);
}
