//! Paperspace's (DigitalOcean's) API, stood in (no account here): get
//! template, startup scripts, machines create / get / stop / delete, and
//! its `{code, message}` errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tessera_fleet::boot::{launch_until_booted, BootPolicy, Skipped};
use tessera_fleet::provider::{NodeState, Provider, ProviderError};
use tessera_fleet::providers::paperspace::{MachineType, Paperspace, PaperspaceConfig};

use crate::standin::{Request, Response, StandIn};

#[derive(Default)]
struct Cloud {
    /// Machine id → (machine type, state, polls).
    machines: HashMap<String, (String, String, u32)>,
    scripts: HashMap<String, String>,
    next: u32,
    no_capacity: Vec<String>,
    never_boots: Vec<String>,
    fail_next: Option<Response>,
}

fn stand_in() -> (StandIn, Arc<Mutex<Cloud>>) {
    let cloud = Arc::new(Mutex::new(Cloud::default()));
    let c = cloud.clone();
    let s = StandIn::start("/v1", move |r: &Request| {
        let mut c = c.lock().unwrap();
        let route = r.route().trim_start_matches("/v1").to_string();
        let parts: Vec<&str> = route.trim_matches('/').split('/').collect();
        match (r.method.as_str(), parts.as_slice()) {
            ("GET", ["templates", "tmpl0docker"]) => Response::json(
                200,
                json!({
                "id": "tmpl0docker", "name": "ML-in-a-Box", "agentType": "LinuxHeadless",
                "operatingSystemLabel": "Ubuntu 22.04", "defaultSizeGb": 100,
                "availableMachineTypes": [
                    {"machineTypeLabel": "A4000", "isAvailable": true},
                    {"machineTypeLabel": "A100-80G", "isAvailable": true},
                    {"machineTypeLabel": "H100", "isAvailable": false}]}),
            ),
            ("POST", ["startup-scripts"]) => {
                c.next += 1;
                let id = format!("scr{}", c.next);
                c.scripts
                    .insert(id.clone(), r.json()["script"].as_str().unwrap().to_string());
                Response::json(
                    200,
                    json!({"id": id, "name": r.json()["name"], "isRunOnce": false}),
                )
            }
            ("DELETE", ["startup-scripts", id]) => match c.scripts.remove(*id) {
                Some(_) => Response::json(200, json!({"id": id})),
                None => Response::json(
                    404,
                    json!({"code": "NOT_FOUND", "message": "Startup script not found"}),
                ),
            },
            ("POST", ["machines"]) => {
                if let Some(f) = c.fail_next.take() {
                    return f;
                }
                let ty = r.json()["machineType"].as_str().unwrap().to_string();
                if c.no_capacity.contains(&ty) {
                    return Response::json(
                        400,
                        json!({"code": "BAD_REQUEST",
                        "message": format!("Machine type {ty} is out of capacity in this region")}),
                    );
                }
                c.next += 1;
                let id = format!("ps{:05}", c.next);
                c.machines
                    .insert(id.clone(), (ty, "provisioning".into(), 0));
                Response::json(
                    200,
                    json!({"event": {"name": "create", "state": "new"},
                    "data": {"id": id, "name": r.json()["name"], "state": "provisioning"}}),
                )
            }
            ("GET", ["machines", id]) => {
                let never = c.never_boots.clone();
                match c.machines.get_mut(*id) {
                    None => Response::json(
                        404,
                        json!({"code": "NOT_FOUND", "message": "Machine not found"}),
                    ),
                    Some((ty, state, polls)) => {
                        *polls += 1;
                        if *polls > 1 && !never.contains(ty) && state == "provisioning" {
                            *state = "ready".into();
                        }
                        Response::json(200, json!({"id": id, "state": state, "machineType": ty}))
                    }
                }
            }
            ("PATCH", ["machines", id, "stop"]) => match c.machines.get_mut(*id) {
                Some(m) => {
                    m.1 = "off".into();
                    Response::json(200, json!({"event": {"name": "stop"}, "data": {"id": id}}))
                }
                None => Response::json(
                    404,
                    json!({"code": "NOT_FOUND", "message": "Machine not found"}),
                ),
            },
            ("DELETE", ["machines", id]) => match c.machines.remove(*id) {
                Some(_) => Response::json(
                    200,
                    json!({"event": {"name": "delete"}, "data": {"id": id}}),
                ),
                None => Response::json(
                    404,
                    json!({"code": "NOT_FOUND", "message": "Machine not found"}),
                ),
            },
            _ => Response::json(404, json!({"code": "NOT_FOUND", "message": route})),
        }
    });
    (s, cloud)
}

fn paperspace(s: &StandIn, key: &tessera_fleet::provider::Secret) -> Paperspace {
    let mt = |name: &str, gpu: &str, vram, usd| MachineType {
        name: name.into(),
        gpu: gpu.into(),
        gpu_count: 1,
        vram_gib: vram,
        usd_per_hour: usd,
    };
    let config = PaperspaceConfig {
        api_url: s.url.clone(),
        template_id: "tmpl0docker".into(),
        machine_types: vec![
            mt("A4000", "A4000", 16, 0.76),
            mt("A100-80G", "A100", 80, 3.18),
            mt("H100", "H100", 80, 5.95),
        ],
        min_vram_gib: 16,
        max_usd_per_gpu_hour: 4.0,
        ..PaperspaceConfig::default()
    };
    Paperspace::new(config, key.clone()).unwrap()
}

#[test]
fn paperspace_creates_a_machine_whose_startup_script_keeps_the_ticket_off_the_command_line() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("ps-create"), crate::key("ps-create"));
    let mut p = paperspace(&s, &key);
    let offers = p.offers().unwrap();
    // H100 is not available on the template now (and over the price).
    assert_eq!(
        offers.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["A4000", "A100-80G"]
    );
    let node = p.launch(&offers[0], &spec).unwrap();
    let script_req = s
        .requests()
        .into_iter()
        .find(|r| r.route() == "/v1/startup-scripts")
        .unwrap();
    let script = script_req.json()["script"].as_str().unwrap().to_string();
    let machine = s
        .requests()
        .into_iter()
        .find(|r| r.route() == "/v1/machines")
        .unwrap()
        .json();
    assert_eq!(machine["machineType"], "A4000");
    assert_eq!(machine["templateId"], "tmpl0docker");
    assert_eq!(machine["region"], "East Coast (NY2)");
    assert_eq!(machine["startupScriptId"], "scr1");
    assert_eq!(machine["name"], spec.name);
    // The ticket is a line of the quoted heredoc; the docker line has none.
    let lines: Vec<&str> = script.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.ends_with("<<'TESSERA_ENV'"))
        .unwrap();
    let end = lines.iter().position(|l| *l == "TESSERA_ENV").unwrap();
    assert_eq!(
        lines[start + 1],
        format!("TESSERA_WORKER_TICKET={}", spec.worker_ticket.expose())
    );
    for (i, l) in lines.iter().enumerate() {
        if !(start < i && i < end) {
            assert!(
                !l.contains(spec.worker_ticket.expose()),
                "line {i} of the script holds the ticket: {l}"
            );
        }
    }
    let docker = lines
        .iter()
        .find(|l| l.starts_with("'docker' 'run'"))
        .unwrap();
    assert!(
        docker.contains("'--env-file' '/etc/tessera/worker.env'"),
        "{docker}"
    );
    assert!(
        docker.contains("'registry.example/tessera-worker:0.1' 'worker' '--name'"),
        "{docker}"
    );
    assert!(script.contains("umask 077"));

    assert_eq!(p.state(&node).unwrap(), NodeState::Starting);
    assert_eq!(p.state(&node).unwrap(), NodeState::Running);
    p.stop(&node).unwrap();
    assert_eq!(p.state(&node).unwrap(), NodeState::Paused);
    p.release(&node).unwrap();
    let c = cloud.lock().unwrap();
    assert!(
        c.machines.is_empty() && c.scripts.is_empty(),
        "the machine and its script are deleted"
    );
    drop(c);
    assert_eq!(p.state(&node).unwrap(), NodeState::Gone);
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn paperspace_errors_are_told_apart_capacity_quota_rate_limited() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("ps-errors"), crate::key("ps-errors"));
    let mut p = paperspace(&s, &key);
    let offers = p.offers().unwrap();
    cloud.lock().unwrap().no_capacity.push("A4000".into());
    assert!(
        matches!(p.launch(&offers[0], &spec), Err(ProviderError::OfferGone(id)) if id == "A4000")
    );
    cloud.lock().unwrap().fail_next = Some(Response::json(
        400,
        json!({"code": "BAD_REQUEST",
        "message": "You have reached your limit of 2 machines of this type; request a quota increase."}),
    ));
    assert!(matches!(
        p.launch(&offers[1], &spec),
        Err(ProviderError::Quota(_))
    ));
    cloud.lock().unwrap().fail_next = Some(
        Response::json(
            429,
            json!({"code": "TOO_MANY_REQUESTS", "message": "slow down"}),
        )
        .with_header("Retry-After", "30"),
    );
    match p.launch(&offers[1], &spec) {
        Err(ProviderError::RateLimited { retry_after }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(30)))
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // A failed create leaves no startup script behind.
    assert!(cloud.lock().unwrap().scripts.is_empty());
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn paperspace_a_machine_that_never_boots_is_deleted_and_another_type_tried() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("ps-boot"), crate::key("ps-boot"));
    let mut p = paperspace(&s, &key);
    let offers = p.offers().unwrap();
    cloud.lock().unwrap().never_boots.push("A4000".into());
    let policy = BootPolicy {
        boot_timeout: Duration::from_millis(300),
        poll: Duration::from_millis(20),
        max_attempts: 3,
    };
    let booted =
        launch_until_booted(&mut p, &offers, &spec, policy, &mut Default::default()).unwrap();
    assert_eq!(booted.offer.id, "A100-80G");
    assert!(matches!(booted.skipped.as_slice(), [(id, Skipped::NeverBooted(_))] if id == "A4000"));
    let c = cloud.lock().unwrap();
    assert_eq!(
        c.machines.keys().cloned().collect::<Vec<_>>(),
        vec![booted.node.0.clone()]
    );
    assert_eq!(c.scripts.len(), 1);
    drop(c);
    crate::assert_secrets_kept(&s, &key, &spec);
}
