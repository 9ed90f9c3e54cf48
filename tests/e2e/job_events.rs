//! Job events over a job's life, on both streams (`tessera events --json`
//! and the HTTP API's `/v1/events`), and webhooks whose payloads are the
//! state they describe, field by field against `status --json`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::harness::{http_addr, scenes, Farm};
use crate::http_api::{wait_until, Delivery, Receiver};

/// The fields a job webhook shares with `status --json`.
const SHARED_FIELDS: [&str; 10] = [
    "name",
    "frames_done",
    "frames_total",
    "tasks_done",
    "tasks_total",
    "cost_usd",
    "budget_usd",
    "error",
    "blocked",
    "finished_unix_ms",
];

/// Lines collected from a stream by a reader thread.
type Lines = Arc<Mutex<Vec<Value>>>;

/// Reads JSON object lines from `reader` into `lines` until it ends.
fn collect(reader: impl std::io::Read + Send + 'static, lines: Lines) {
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { return };
            let line = line.trim();
            if line.starts_with('{') {
                if let Ok(v) = serde_json::from_str(line) {
                    lines.lock().unwrap().push(v);
                }
            }
        }
    });
}

/// `tessera events --json`, its lines read into the returned list.
fn cli_events(farm: &Farm) -> (Child, Lines) {
    let mut child = farm
        .command(&["events", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = Lines::default();
    collect(child.stdout.take().unwrap(), lines.clone());
    (child, lines)
}

/// `GET /v1/events` over pinned TLS, its event lines read into the list
/// (chunk sizes and keep-alive lines are skipped: they are not objects).
fn http_events(farm: &Farm) -> Lines {
    let ticket = crate::hostile::ticket(farm, "client.ticket");
    let mut tls = tessera_transport::client_tls(&ticket.fingerprint).unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(tls), name).unwrap();
    let tcp = std::net::TcpStream::connect(http_addr(farm)).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    let head = format!(
        "GET /v1/events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        ticket.secret
    );
    stream.write_all(head.as_bytes()).unwrap();
    // The head and the first (empty) line: subscribed from here on.
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 200"), "{line}");
    let lines = Lines::default();
    collect(reader, lines.clone());
    lines
}

/// The `type`s of `job`'s job events (`job.*`) seen so far, in order.
fn job_types(lines: &Lines, job: u64) -> Vec<String> {
    (lines.lock().unwrap().iter())
        .filter(|v| v["job"] == job)
        .filter_map(|v| v["type"].as_str())
        .filter(|t| t.starts_with("job."))
        .map(str::to_string)
        .collect()
}

/// The body of the one delivery of `kind` for `job`, once it arrived.
fn delivered(seen: &Arc<Mutex<Vec<Delivery>>>, kind: &str, job: u64) -> Value {
    let mut body = None;
    wait_until(kind, Duration::from_secs(120), || {
        body = (seen.lock().unwrap().iter())
            .filter(|d| d.kind == kind)
            .map(|d| serde_json::from_slice::<Value>(&d.body).unwrap())
            .find(|b| b["job"] == job);
        body.is_some()
    });
    body.unwrap()
}

/// Each field the webhook shares with `status --json` is the same.
fn assert_same(kind: &str, body: &Value, status: &Value) {
    assert_eq!(body["state"], status["state"], "{kind}: {body} vs {status}");
    for f in SHARED_FIELDS {
        assert_eq!(body[f], status[f], "{kind}: `{f}` in {body} vs {status}");
    }
}

/// A job submitted with no worker: `job.queued`, then the `job.blocked`
/// webhook (its reason as `status` says it); paused and resumed
/// (`job.paused`, `job.resumed`); a worker joins: `job.running`, then
/// `job.done` with the webhook's final counts and end time as `status`
/// says them. Both streams show the same sequence. A job that fails:
/// `job.failed` with its error.
#[test]
fn job_events_follow_a_jobs_life_and_webhooks_carry_its_state() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, 200, seen.clone());
    let url = format!("http://127.0.0.1:{}/hooks", receiver.port);
    let mut farm = Farm::start_with_env(
        "job-events",
        &["--http", "--webhook", &url],
        &[("TESSERA_WEBHOOK_SECRET", "job-events-secret")],
    );
    let (mut cli, cli_lines) = cli_events(&farm);
    let http_lines = http_events(&farm);
    // The CLI's stream is subscribed once it shows an event: a submit
    // that nothing waits on shows `job.queued`.
    let mut job = 0;
    wait_until(
        "the CLI stream to subscribe",
        Duration::from_secs(30),
        || {
            job = farm.submit_demo_frame("2x2");
            !job_types(&cli_lines, job).is_empty()
        },
    );
    let blocked = delivered(&seen, "job.blocked", job);
    assert!(blocked["blocked"].is_string(), "{blocked}");
    assert_same("job.blocked", &blocked, &farm.status(job));
    for cmd in ["pause", "resume"] {
        let out = farm.run(&[cmd, &job.to_string()]);
        assert!(out.status.success(), "{cmd}: {out:?}");
    }
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    let done = delivered(&seen, "job.done", job);
    let status = farm.status(job);
    assert_eq!(status["state"], "done");
    assert_eq!(done["frames_done"], 1, "{done}");
    assert_eq!(done["tasks_done"], 4, "{done}");
    assert!(done["finished_unix_ms"].is_u64(), "{done}");
    assert_same("job.done", &done, &status);
    http_json_is_the_documents_and_the_clis(&farm, job, &status);
    let expected = [
        "job.queued",
        "job.paused",
        "job.resumed",
        "job.running",
        "job.done",
    ];
    for (what, lines) in [("events --json", &cli_lines), ("/v1/events", &http_lines)] {
        wait_until(what, Duration::from_secs(30), || {
            job_types(lines, job).last().map(String::as_str) == Some("job.done")
        });
        assert_eq!(job_types(lines, job), expected, "{what}");
    }

    // Each attempt runs past its 1 s limit: the job fails, and says why.
    let scene = scenes().join("demo.scene.json");
    let failing = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--samples",
        "100000",
        "--task-timeout",
        "1s",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    let failed = delivered(&seen, "job.failed", failing);
    let status = farm.status(failing);
    assert_eq!(status["state"], "failed");
    assert!(failed["error"].is_string(), "{failed}");
    assert_same("job.failed", &failed, &status);
    wait_until(
        "job.failed on the CLI stream",
        Duration::from_secs(30),
        || job_types(&cli_lines, failing).last().map(String::as_str) == Some("job.failed"),
    );
    assert_eq!(
        job_types(&cli_lines, failing)[..2],
        ["job.queued", "job.running"]
    );
    let _ = cli.kill();
    let _ = cli.wait();
    receiver.shut();
}

/// `GET /v1/jobs/ID` of a finished job: exactly the fields the OpenAPI
/// document's `JobStatus` lists (each it requires present), each value the
/// one `status --json` shows; `?state=finished` lists it, `?state=active`
/// does not.
fn http_json_is_the_documents_and_the_clis(farm: &Farm, job: u64, cli: &Value) {
    let ticket = crate::hostile::ticket(farm, "client.ticket");
    let addr = http_addr(farm);
    let get = |path: &str| -> Value {
        let (code, body) = crate::harness::http_call(&ticket, addr, "GET", path, "");
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    let http = get(&format!("/v1/jobs/{job}"));
    let doc: Value = serde_json::from_str(tessera_coordinator::http::OPENAPI).unwrap();
    let schema = &doc["components"]["schemas"]["JobStatus"];
    let documented: std::collections::BTreeSet<&str> =
        (schema["properties"].as_object().unwrap().keys())
            .map(String::as_str)
            .collect();
    let served: std::collections::BTreeSet<&str> = http
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(served, documented, "GET /v1/jobs/{job} against JobStatus");
    for r in schema["required"].as_array().unwrap() {
        assert!(served.contains(r.as_str().unwrap()), "{r} required");
    }
    assert_eq!(http["after_failure"], "fail", "{http}");
    for (k, v) in http.as_object().unwrap() {
        if let Some(c) = cli.get(k) {
            assert_eq!(v, c, "`{k}`: HTTP {http} vs CLI {cli}");
        }
    }
    let listed = |state: &str| -> bool {
        let page = get(&format!("/v1/jobs?state={state}"));
        let jobs = page.get("jobs").unwrap_or(&page).as_array().cloned();
        jobs.unwrap_or_default().iter().any(|j| j["id"] == job)
    };
    assert!(listed("finished"), "?state=finished lists the done job");
    assert!(!listed("active"), "?state=active does not list it");
}
