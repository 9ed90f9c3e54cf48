//! The HTTP API, the Python client, events, `/metrics` and webhooks, against
//! a real coordinator (`--http`, TLS with its own certificate) and real
//! workers. The Python client's own tests (`python/tests`) run here, in the
//! Python `.ci/run` prepared (`$TESSERA_TEST_PYTHON`, with
//! `prometheus_client` for the metrics parser); so does the README's Python
//! three-shot script. The webhook receiver is a small HTTP server in this
//! file, on 127.0.0.1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{scenes, Farm};
use crate::requires::{require, Need};

fn python() -> PathBuf {
    require(Need::PyClient);
    std::env::var_os("TESSERA_TEST_PYTHON").unwrap().into()
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `args` in the test Python with the farm's ticket and the `tessera`
/// binary in its environment; fails the test with its output unless it
/// exits 0.
fn run_python(farm: &Farm, args: &[&str], cwd: &Path) -> String {
    let out = Command::new(python())
        .args(args)
        .current_dir(cwd)
        .env("PYTHONPATH", repo().join("python"))
        .env("TESSERA_TICKET", farm.client_ticket())
        .env("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))
        .env("TESSERA_TEST_SCENES", scenes())
        .env("TESSERA_TEST_DATA_DIR", &farm.data)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "python {args:?} failed:\n{text}");
    text
}

/// The routes the server serves are exactly those the OpenAPI document
/// lists (the router answers only `ROUTES`; the Python tests call each).
#[test]
fn openapi_document_lists_exactly_the_served_routes() {
    let doc: Value = serde_json::from_str(tessera_coordinator::http::OPENAPI).unwrap();
    let mut documented: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(|m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut served: Vec<(String, String)> = (tessera_coordinator::http::ROUTES.iter())
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served);
}

/// Every endpoint through the Python client (and a wrong or missing bearer
/// secret refused), responses checked against the OpenAPI schemas,
/// `tessera events --json`, `/metrics` against `status --json`, and the
/// README's Python three-shot script.
#[test]
#[ignore = "needs TESSERA_TEST_PYTHON (a Python 3.9+ with prometheus_client)"]
fn python_client_drives_every_endpoint_of_a_real_farm() {
    python();
    let mut farm = Farm::start("t14a-http", &["--http"]);
    let url = std::fs::read_to_string(farm.data.join("http.url")).unwrap();
    let quic = farm.client_ticket();
    let ticket = std::fs::read_to_string(quic.trim_start_matches('@')).unwrap();
    let addr = ticket.split('@').nth(1).unwrap().split('/').next().unwrap();
    assert_eq!(
        url.trim(),
        format!("https://{addr}"),
        "the API listens where the ticket says"
    );
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    farm.add_worker_with("w2", &["--engine", "builtin"]);
    farm.wait_workers(2);
    let work = farm.dir.join("py");
    std::fs::create_dir_all(&work).unwrap();
    let out = run_python(
        &farm,
        &[
            repo().join("python/tests/test_client.py").to_str().unwrap(),
            "-v",
        ],
        &work,
    );
    eprintln!("{out}");
    assert!(out.contains("OK"), "{out}");
}

/// The README's Python three-shot script, as written there.
#[test]
#[ignore = "needs TESSERA_TEST_PYTHON (a Python 3.9+ with prometheus_client)"]
fn readme_python_three_shot_script_runs() {
    python();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = "<!-- three-shot.py -->\n```python\n";
    let begin = readme
        .find(start)
        .expect("README has the Python three-shot script")
        + start.len();
    let script = &readme[begin..begin + readme[begin..].find("```").unwrap()];
    let mut farm = Farm::start("t14a-three", &["--http"]);
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    farm.add_worker_with("w2", &["--engine", "builtin"]);
    farm.wait_workers(2);
    let work = farm.dir.join("studio");
    std::fs::create_dir_all(work.join("shots/textures")).unwrap();
    for texture in std::fs::read_dir(scenes().join("textures")).unwrap() {
        let texture = texture.unwrap().path();
        std::fs::copy(
            &texture,
            work.join("shots/textures")
                .join(texture.file_name().unwrap()),
        )
        .unwrap();
    }
    for shot in ["sh010", "sh020", "sh030"] {
        std::fs::copy(
            scenes().join("demo.scene.json"),
            work.join(format!("shots/{shot}.scene.json")),
        )
        .unwrap();
    }
    std::fs::write(work.join("three_shot.py"), script).unwrap();
    let out = run_python(&farm, &["three_shot.py"], &work);
    eprintln!("{out}");
    for shot in ["sh010", "sh020", "sh030"] {
        let dir = work.join("renders").join(shot);
        let frames: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .collect();
        assert_eq!(frames.len(), 2, "{shot}: {frames:?}");
    }
}

/// What the receiver saw of one delivery.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    kind: String,
    signature: String,
    body: Vec<u8>,
    answered: u16,
}

/// A webhook receiver on 127.0.0.1 that answers `status` to every POST
/// (503: an outage that answers), and can stop listening altogether.
struct Receiver {
    port: u16,
    status: Arc<Mutex<u16>>,
    seen: Arc<Mutex<Vec<Delivery>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start(port: u16, status: u16, seen: Arc<Mutex<Vec<Delivery>>>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = Arc::new(Mutex::new(status));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (status, seen, stop) = (status.clone(), seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let answer = *status.lock().unwrap();
                            if let Some(d) = serve_one(conn, answer) {
                                seen.lock().unwrap().push(d);
                            }
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
        };
        Receiver {
            port,
            status,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Stops listening: connections are refused from now on.
    fn shut(mut self) -> (u16, Arc<Mutex<Vec<Delivery>>>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        (self.port, self.seen.clone())
    }
}

fn serve_one(conn: TcpStream, answer: u16) -> Option<Delivery> {
    conn.set_nonblocking(false).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let header = |name: &str| {
        (headers.iter())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let len: usize = header("content-length").parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let reason = if answer == 200 { "OK" } else { "Unavailable" };
    let mut conn = conn;
    let _ = write!(
        conn,
        "HTTP/1.1 {answer} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    Some(Delivery {
        id: header("x-tessera-event-id"),
        kind: header("x-tessera-event"),
        signature: header("x-tessera-signature"),
        body,
        answered: answer,
    })
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A job submitted with no worker connected is blocked, then done once one
/// joins; the receiver answers 503, then stops listening, and the
/// coordinator is killed (SIGKILL) and started again in between. Each event
/// is delivered with a 2xx exactly once, signed with HMAC-SHA256 over its
/// body, with the same id on every attempt.
#[test]
fn webhooks_arrive_once_each_across_an_outage_and_a_restart() {
    const SECRET: &str = "t14a-webhook-secret";
    let seen = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, 503, seen.clone());
    let url = format!("http://127.0.0.1:{}/hooks/tessera", receiver.port);
    let mut farm = Farm::start_with_env(
        "t14a-hook",
        &[
            "--webhook",
            &url,
            "--webhook-backoff-ms",
            "100",
            "--webhook-max-backoff-ms",
            "1000",
        ],
        &[("TESSERA_WEBHOOK_SECRET", SECRET)],
    );
    let job = farm.submit_demo_frame("1x1");
    // Blocked (no worker): queued, then refused with 503 and retried.
    wait_until(
        "retries of the blocked event",
        Duration::from_secs(30),
        || seen.lock().unwrap().len() >= 3,
    );
    // A full outage: nothing listens; the coordinator dies and comes back.
    let (port, seen) = receiver.shut();
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    let status = farm.wait_for(job, "done", |s| s["state"] == "done");
    assert_eq!(status["state"], "done");
    // The job's done event waits in the outbox behind the blocked one.
    std::thread::sleep(Duration::from_millis(300));
    let receiver = Receiver::start(port, 200, seen.clone());
    wait_until("both events delivered", Duration::from_secs(60), || {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|d| d.answered == 200)
            .count()
            >= 2
    });
    // Nothing more comes: no duplicate after the delivery is recorded.
    std::thread::sleep(Duration::from_millis(1500));
    *receiver.status.lock().unwrap() = 200;
    let (_, seen) = receiver.shut();
    let seen = seen.lock().unwrap().clone();
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, SECRET.as_bytes());
    let mut delivered: Vec<(String, String)> = Vec::new();
    for d in &seen {
        let hex = d
            .signature
            .strip_prefix("sha256=")
            .expect("sha256= signature");
        let tag: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        ring::hmac::verify(&key, &d.body, &tag).expect("a valid HMAC-SHA256 signature");
        let body: Value = serde_json::from_slice(&d.body).unwrap();
        assert_eq!(
            body["id"].to_string(),
            d.id,
            "the body carries the event id"
        );
        assert_eq!(body["type"], d.kind);
        assert_eq!(body["job"], job);
        if d.answered == 200 {
            delivered.push((d.id.clone(), d.kind.clone()));
        }
    }
    delivered.sort();
    assert_eq!(
        delivered
            .iter()
            .map(|(_, k)| k.as_str())
            .collect::<Vec<_>>(),
        ["job.blocked", "job.done"],
        "each event delivered exactly once: {seen:#?}"
    );
    let retried = seen.iter().filter(|d| d.answered != 200).count();
    assert!(retried >= 3, "the outage was retried: {seen:#?}");
    // Every attempt at one event carries the same id.
    let blocked_id = &delivered[0].0;
    assert!(seen
        .iter()
        .filter(|d| d.kind == "job.blocked")
        .all(|d| &d.id == blocked_id));
}

/// A job whose cost reaches its `--budget-usd` (here canceled by it):
/// the receiver gets one `job.budget_reached` event naming the budget and
/// the cost, and no other event of that job.
#[test]
fn a_job_reaching_its_budget_sends_one_budget_event() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let receiver = Receiver::start(0, 200, seen.clone());
    let url = format!("http://127.0.0.1:{}/hooks", receiver.port);
    let mut farm = Farm::start_with_env(
        "t14-budget-hook",
        &["--webhook", &url],
        &[("TESSERA_WEBHOOK_SECRET", "t14-budget-secret")],
    );
    // $360/h is $0.10 a second of lease: $0.30 lasts a few tasks of 32.
    farm.add_worker_with(
        "w1",
        &[
            "--engine",
            "builtin",
            "--price-per-hour",
            "360",
            "--slots",
            "1",
        ],
    );
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1-8",
        "--tiles",
        "2x2",
        "--samples",
        "64",
        "--budget-usd",
        "0.3",
        "--on-budget",
        "cancel",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    let s = farm.wait_for(job, "the budget to cancel the job", |s| {
        s["state"] == "canceled"
    });
    assert!(s["cost_usd"].as_f64().unwrap() >= 0.3, "{s}");
    wait_until("the budget event", Duration::from_secs(30), || {
        seen.lock()
            .unwrap()
            .iter()
            .any(|d| d.kind == "job.budget_reached")
    });
    // Nothing more comes for it: the event is sent once.
    std::thread::sleep(Duration::from_millis(1500));
    let (_, seen) = receiver.shut();
    let seen = seen.lock().unwrap().clone();
    let kinds: Vec<&str> = seen.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(kinds, ["job.budget_reached"], "{seen:#?}");
    let body: Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body["job"], job);
    assert_eq!(body["budget_usd"], 0.3);
    assert!(body["cost_usd"].as_f64().unwrap() >= 0.3, "{body}");
    assert!(
        ["running", "canceled"].contains(&body["state"].as_str().unwrap()),
        "{body}"
    );
}
