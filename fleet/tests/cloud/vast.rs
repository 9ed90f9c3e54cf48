//! Vast.ai's REST API, stood in (no Vast.ai account here): search offers,
//! create instance from an ask, show instance, change bid, destroy.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tessera_fleet::boot::{launch_until_booted, BootPolicy, Skipped};
use tessera_fleet::provider::{NodeId, NodeState, Provider, ProviderError};
use tessera_fleet::providers::vast::{Vast, VastConfig};

use crate::standin::{Request, Response, StandIn};

#[derive(Default)]
struct Cloud {
    /// Instance id → (ask id, actual_status).
    instances: HashMap<u64, (u64, Value)>,
    next: u64,
    /// Asks that are taken when rented; asks whose instance never boots.
    gone: Vec<u64>,
    never_boots: Vec<u64>,
    /// The next create answers this instead.
    fail_next: Option<(u16, Value, Option<&'static str>)>,
}

fn offers() -> Value {
    json!({"offers": [
        {"id": 101, "ask_contract_id": 101, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
         "dph_total": 0.40, "min_bid": 0.20, "geolocation": "Texas, US", "reliability2": 0.99},
        {"id": 102, "ask_contract_id": 102, "gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram": 24576,
         "dph_total": 0.25, "min_bid": 0.12, "geolocation": "Quebec, CA"},
        {"id": 103, "ask_contract_id": 103, "gpu_name": "RTX 4090", "num_gpus": 2, "gpu_ram": 24564,
         "dph_total": 6.0, "min_bid": 3.0, "geolocation": "Texas, US"},
        {"id": 104, "ask_contract_id": 104, "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
         "dph_total": 0.45, "min_bid": 0.22, "geolocation": "Oregon, US"}
    ]})
}

fn stand_in() -> (StandIn, Arc<Mutex<Cloud>>) {
    let cloud = Arc::new(Mutex::new(Cloud {
        next: 9000,
        ..Default::default()
    }));
    let c = cloud.clone();
    let s = StandIn::start("/api/v0", move |r: &Request| {
        let mut c = c.lock().unwrap();
        let route = r.route().trim_start_matches("/api/v0").to_string();
        let parts: Vec<&str> = route.trim_matches('/').split('/').collect();
        match (r.method.as_str(), parts.as_slice()) {
            ("POST", ["bundles"]) => Response::json(200, offers()),
            ("PUT", ["asks", ask]) => {
                if let Some((status, body, retry)) = c.fail_next.take() {
                    let resp = Response::json(status, body);
                    return match retry {
                        Some(s) => resp.with_header("Retry-After", s),
                        None => resp,
                    };
                }
                let ask: u64 = ask.parse().unwrap();
                if c.gone.contains(&ask) {
                    return Response::json(
                        400,
                        json!({"success": false, "error": "no_such_ask",
                        "msg": format!("error 404/3603: no_such_ask  Instance type by id {ask} is not available.")}),
                    );
                }
                c.next += 1;
                let id = c.next;
                c.instances.insert(id, (ask, Value::Null));
                Response::json(200, json!({"success": true, "new_contract": id}))
            }
            ("GET", ["instances", id]) => {
                let id: u64 = id.parse().unwrap();
                let never = c.never_boots.clone();
                match c.instances.get_mut(&id) {
                    None => Response::json(200, json!({"instances": null})),
                    Some((ask, status)) => {
                        // null → loading → running, unless this ask never boots.
                        let next = match (status.as_str(), never.contains(ask)) {
                            (_, true) => json!("loading"),
                            (None, _) => json!("loading"),
                            (Some("loading"), _) => json!("running"),
                            (Some(s), _) => json!(s),
                        };
                        let shown = status.clone();
                        *status = next;
                        Response::json(
                            200,
                            json!({"instances": {"id": id, "actual_status": shown,
                            "intended_status": "running", "cur_state": "running", "gpu_name": "RTX 4090"}}),
                        )
                    }
                }
            }
            ("PUT", ["instances", "bid_price", id]) => {
                let id: u64 = id.parse().unwrap();
                match c.instances.get_mut(&id) {
                    Some((_, s)) => {
                        *s = json!("running");
                        Response::json(200, json!({"success": true}))
                    }
                    None => {
                        Response::json(404, json!({"success": false, "error": "no_such_instance"}))
                    }
                }
            }
            ("DELETE", ["instances", id]) => {
                let id: u64 = id.parse().unwrap();
                match c.instances.remove(&id) {
                    Some(_) => Response::json(200, json!({"success": true})),
                    None => {
                        Response::json(404, json!({"success": false, "error": "no_such_instance"}))
                    }
                }
            }
            _ => Response::json(
                404,
                json!({"success": false, "error": "not_found", "msg": route}),
            ),
        }
    });
    (s, cloud)
}

fn vast(s: &StandIn, key: &tessera_fleet::provider::Secret, interruptible: bool) -> Vast {
    let config = VastConfig {
        api_url: s.url.clone(),
        gpu_types: vec!["RTX 4090".into()],
        min_vram_gib: 20,
        max_usd_per_gpu_hour: 1.0,
        interruptible,
        regions: vec!["US".into()],
        ..VastConfig::default()
    };
    Vast::new(config, key.clone()).unwrap()
}

#[test]
fn vast_rents_the_cheapest_fitting_ask_with_the_ticket_only_in_env() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("vast-rent"), crate::key("vast-rent"));
    let mut v = vast(&s, &key, false);
    let offers = v.offers().unwrap();
    // 102 is another GPU, 103 costs $3/GPU-hour.
    assert_eq!(
        offers.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["101", "104"]
    );
    assert_eq!(
        (
            offers[0].gpu.as_str(),
            offers[0].vram_gib,
            offers[0].usd_per_hour
        ),
        ("RTX 4090", 24, 0.40)
    );
    let search = &s.requests()[0];
    assert_eq!(
        (search.method.as_str(), search.route()),
        ("POST", "/api/v0/bundles/")
    );
    let q = search.json();
    assert_eq!(q["gpu_name"], json!({"in": ["RTX 4090"]}));
    assert_eq!(q["type"], "on-demand");
    assert_eq!(q["gpu_ram"], json!({"gte": 20 * 1024}));

    let node = v.launch(&offers[0], &spec).unwrap();
    let create = s
        .requests()
        .into_iter()
        .find(|r| r.method == "PUT")
        .unwrap();
    assert_eq!(create.route(), "/api/v0/asks/101/");
    let b = create.json();
    assert_eq!(b["image"], "registry.example/tessera-worker:0.1");
    assert_eq!(b["runtype"], "args");
    assert_eq!(
        b["env"]["TESSERA_WORKER_TICKET"],
        spec.worker_ticket.expose()
    );
    assert_eq!(b["env"]["RUST_LOG"], "info");
    assert_eq!(
        b["args"],
        json!([
            "worker",
            "--name",
            spec.name,
            "--slots",
            "auto",
            "--interruptible"
        ])
    );
    assert!(
        b.get("price").is_none(),
        "an on-demand instance has no bid: {b}"
    );
    let ticket_places = create.body.matches(spec.worker_ticket.expose()).count();
    assert_eq!(ticket_places, 1, "the ticket is only the env value");
    assert!(!b["args"].to_string().contains(spec.worker_ticket.expose()));

    assert_eq!(v.state(&node).unwrap(), NodeState::Starting); // provisioning (null)
    assert_eq!(v.state(&node).unwrap(), NodeState::Starting); // loading
    assert_eq!(v.state(&node).unwrap(), NodeState::Running);
    v.release(&node).unwrap();
    assert!(cloud.lock().unwrap().instances.is_empty());
    assert_eq!(v.state(&node).unwrap(), NodeState::Gone);
    v.release(&node).unwrap(); // already gone: not an error
    crate::assert_secrets_kept(&s, &key, &spec);
    assert!(crate::logs().contains("instance created"));
}

#[test]
fn vast_bids_for_interruptible_and_an_outbid_instance_is_paused_then_resumes() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("vast-bid"), crate::key("vast-bid"));
    let mut v = vast(&s, &key, true);
    let offers = v.offers().unwrap();
    assert!(offers.iter().all(|o| o.interruptible));
    // The minimum bid plus the 10 % margin.
    assert!((offers[0].usd_per_hour - 0.22).abs() < 1e-9, "{offers:?}");
    assert_eq!(s.requests()[0].json()["type"], "bid");
    let node = v.launch(&offers[0], &spec).unwrap();
    let create = s
        .requests()
        .into_iter()
        .find(|r| r.method == "PUT")
        .unwrap();
    assert!((create.json()["price"].as_f64().unwrap() - 0.22).abs() < 1e-9);
    // Outbid: Vast.ai stops the container and keeps its disk.
    let id: u64 = node.0.parse().unwrap();
    cloud.lock().unwrap().instances.get_mut(&id).unwrap().1 = json!("stopped");
    assert_eq!(v.state(&node).unwrap(), NodeState::Paused);
    v.change_bid(&node, 0.30).unwrap();
    let bid = s
        .requests()
        .into_iter()
        .rfind(|r| r.route().contains("bid_price"))
        .unwrap();
    assert_eq!(bid.route(), format!("/api/v0/instances/bid_price/{id}/"));
    assert_eq!(bid.json(), json!({"client_id": "me", "price": 0.30}));
    assert_eq!(v.state(&node).unwrap(), NodeState::Running);
    v.release(&node).unwrap();
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn vast_errors_are_told_apart_gone_quota_rate_limited() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("vast-errors"), crate::key("vast-errors"));
    let mut v = vast(&s, &key, false);
    let offers = v.offers().unwrap();
    cloud.lock().unwrap().gone.push(101);
    assert!(
        matches!(v.launch(&offers[0], &spec), Err(ProviderError::OfferGone(id)) if id == "101")
    );
    cloud.lock().unwrap().fail_next = Some((
        402,
        json!({"success": false, "error": "insufficient_credit",
        "msg": "Your account lacks credit; see the billing page."}),
        None,
    ));
    assert!(matches!(
        v.launch(&offers[1], &spec),
        Err(ProviderError::Quota(_))
    ));
    cloud.lock().unwrap().fail_next = Some((
        429,
        json!({"detail": "API requests too frequent"}),
        Some("7"),
    ));
    match v.launch(&offers[1], &spec) {
        Err(ProviderError::RateLimited { retry_after }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)))
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
    // A provider echoing the request in its error does not carry the
    // ticket into the fleet's error (and so its log).
    let echo = format!(
        "invalid env {{\"TESSERA_WORKER_TICKET\": \"{}\"}}",
        spec.worker_ticket.expose()
    );
    cloud.lock().unwrap().fail_next = Some((
        400,
        json!({"success": false, "error": "invalid_args", "msg": echo}),
        None,
    ));
    let e = v.launch(&offers[1], &spec).unwrap_err().to_string();
    assert!(
        !e.contains(spec.worker_ticket.expose()) && e.contains("[ticket]"),
        "{e}"
    );
    assert!(matches!(
        v.state(&NodeId("424242".into())),
        Ok(NodeState::Gone)
    ));
    crate::assert_secrets_kept(&s, &key, &spec);
}

#[test]
fn vast_an_instance_that_never_boots_is_destroyed_and_the_next_ask_rented() {
    let (s, cloud) = stand_in();
    let (spec, key) = (crate::spec("vast-boot"), crate::key("vast-boot"));
    let mut v = vast(&s, &key, false);
    let offers = v.offers().unwrap();
    cloud.lock().unwrap().never_boots.push(101);
    let policy = BootPolicy {
        boot_timeout: Duration::from_millis(300),
        poll: Duration::from_millis(20),
        max_attempts: 3,
    };
    let booted =
        launch_until_booted(&mut v, &offers, &spec, policy, &mut Default::default()).unwrap();
    assert_eq!(booted.offer.id, "104");
    assert!(matches!(booted.skipped.as_slice(), [(id, Skipped::NeverBooted(_))] if id == "101"));
    // The one that never booted was destroyed; only the booted one is billed.
    let left: Vec<u64> = cloud.lock().unwrap().instances.keys().copied().collect();
    assert_eq!(left, [booted.node.0.parse::<u64>().unwrap()]);
    crate::assert_secrets_kept(&s, &key, &spec);
}
