//! The HTTP API against its document, by schemathesis (PyPI), the
//! property-based tester of OpenAPI documents: on a live coordinator with a
//! done and a failed job, every route of `api/openapi.json` is called with
//! cases generated from the document (valid and invalid ones), and every
//! answer is checked against it (status codes, content types, headers,
//! schemas, no server error, invalid input refused, valid input accepted,
//! no route served without the bearer secret). Its configuration and hooks
//! are in `tests/schemathesis/`.

use std::path::Path;
use std::process::Command;

use crate::harness::{http_addr, scenes, Farm};
use crate::requires::{require, Need};

#[test]
#[ignore = "needs TESSERA_TEST_SCHEMATHESIS (schemathesis from PyPI)"]
fn schemathesis_finds_no_failure_on_any_route_of_a_live_coordinator() {
    require(Need::Schemathesis);
    let mut farm = Farm::start("contract", &["--http"]);
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let done = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--samples",
        "4",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    farm.wait_done(done, &farm.dir.join("done"));
    let broken = crate::scripting::broken_scene(&farm.dir);
    let failed = farm.json(&[
        "submit",
        broken.to_str().unwrap(),
        "--frames",
        "1",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    farm.wait_for(failed, "the job to fail", |s| s["state"] == "failed");

    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = repo.join("tests/schemathesis");
    let ticket = crate::hostile::ticket(&farm, "client.ticket");
    let reports = farm.dir.join("schemathesis");
    let out = Command::new(std::env::var_os("TESSERA_TEST_SCHEMATHESIS").unwrap())
        .arg("--no-color")
        .arg("--config-file")
        .arg(config.join("schemathesis.toml"))
        .arg("run")
        .arg(repo.join("api/openapi.json"))
        .arg("--report-dir")
        .arg(&reports)
        .current_dir(&farm.dir)
        .env(
            "TESSERA_CONTRACT_URL",
            format!("https://{}", http_addr(&farm)),
        )
        .env("TESSERA_CONTRACT_SECRET", &ticket.secret)
        .env("TESSERA_CONTRACT_HOOKS", config.join("hooks.py"))
        .output()
        .expect("schemathesis runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "schemathesis found failures:\n{text}");
    // It tested every operation of the document (an error, a failure or
    // an operation it could not test fails the run above).
    let doc: serde_json::Value = serde_json::from_str(tessera_coordinator::http::OPENAPI).unwrap();
    let operations: usize = (doc["paths"].as_object().unwrap().values())
        .map(|p| p.as_object().unwrap().len())
        .sum();
    let tested = (text.lines())
        .find_map(|l| l.trim().strip_prefix("Tested:"))
        .and_then(|n| n.trim().parse::<usize>().ok());
    assert_eq!(tested, Some(operations), "operations tested:\n{text}");
}
