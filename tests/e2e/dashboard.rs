//! The web dashboard (`coordinator --http`, `/`): its sessions, CSRF
//! tokens and viewer role over raw HTTPS, and the page itself in a real
//! browser (Debian's headless Chromium through chromedriver) watching a
//! real Blender job. Screenshots of each page, 1280x800, are saved under
//! the target dir's `tmp/dashboard-screenshots/` for a person to look at.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_protocol::ticket::Ticket;

use crate::blender::{blender_worker, Project};
use crate::harness::{http_addr, Farm};
use crate::hostile::ticket;
use crate::requires::{require, Need};
use crate::webdriver::Browser;

/// An answer: status, headers (names lowercase), body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `method path` with `headers` and `body` over TLS pinned to the
/// coordinator's certificate (`ticket`'s fingerprint), one connection.
fn request(
    ticket: &Ticket,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = crate::harness::pinned_tls(ticket, addr);
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = (lines.next().and_then(|l| l.get(9..12)))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_string(),
    }
}

/// Opens `GET /v1/events` as Server-Sent Events with `cookie`, reads its
/// first bytes, and returns a thread that reads it to its end: `Ok` when
/// the coordinator ended it, an error when it was still open 60 s later.
fn open_stream(
    ticket: &Ticket,
    addr: SocketAddr,
    cookie: &str,
) -> std::thread::JoinHandle<std::io::Result<usize>> {
    let mut stream = crate::harness::pinned_tls(ticket, addr);
    let head = format!(
        "GET /v1/events HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut first = [0u8; 12];
    stream.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200", "the stream opens");
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        match stream.read_to_end(&mut rest) {
            Ok(n) => Ok(n),
            // An end without close_notify is an end.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(rest.len()),
            Err(e) => Err(e),
        }
    })
}

/// Signs in with `secret`: the cookie to send back and the CSRF token.
fn sign_in(t: &Ticket, addr: SocketAddr, secret: &str) -> (String, String, String) {
    let body = serde_json::json!({ "secret": secret }).to_string();
    let r = request(t, addr, "POST", "/ui/signin", &[], &body);
    assert_eq!(r.status, 200, "sign-in: {}", r.body);
    let set = r
        .header("set-cookie")
        .expect("a session cookie")
        .to_string();
    for attribute in [
        "HttpOnly",
        "Secure",
        "SameSite=Strict",
        "Max-Age=",
        "Path=/",
    ] {
        assert!(set.contains(attribute), "{attribute} missing: {set}");
    }
    let cookie = set.split(';').next().unwrap().to_string();
    let v = r.json();
    let role = v["role"].as_str().unwrap().to_string();
    (cookie, v["csrf"].as_str().unwrap().to_string(), role)
}

#[test]
fn the_dashboard_needs_a_session_checks_csrf_lets_a_viewer_only_look_and_rotation_ends_sessions() {
    // No worker: the job stays queued, whatever is asked of it.
    let farm = Farm::start("dashboard-security", &["--http"]);
    let client = ticket(&farm, "client.ticket");
    let viewer = ticket(&farm, "viewer.ticket");
    let addr = http_addr(&farm);
    let scene = crate::harness::scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--paused",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    let pause = format!("/v1/jobs/{job}/pause");
    let resume = format!("/v1/jobs/{job}/resume");
    // What a submit's scan warned of is kept with the job for its page.
    let mut spec = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "2",
        "--paused",
        "--upload-only",
    ]);
    spec["warnings"] = serde_json::json!(["the scene denoises with OptiX"]);
    let (code, body) =
        crate::harness::http_call(&client, addr, "POST", "/v1/jobs", &spec.to_string());
    assert_eq!(code, 201, "{body}");
    let warned = serde_json::from_str::<Value>(&body).unwrap()["id"].clone();
    let (_, body) = crate::harness::http_call(
        &client,
        addr,
        "GET",
        &format!("/v1/jobs/{warned}/detail"),
        "",
    );
    let detail: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        detail["warnings"],
        serde_json::json!(["the scene denoises with OptiX"])
    );
    spec["warnings"] = serde_json::json!(vec!["w"; 33]);
    let (code, _) = crate::harness::http_call(&client, addr, "POST", "/v1/jobs", &spec.to_string());
    assert_eq!(code, 400, "more warnings than a job keeps");
    let paused = || farm.status(job)["paused"].as_bool().unwrap();

    // The page's files are served to anyone, and hold nothing of the farm.
    let page = request(&client, addr, "GET", "/", &[], "");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("/ui/app.js"));
    assert!(!page.body.contains(&client.secret) && !page.body.contains(&viewer.secret));
    let csp = page.header("content-security-policy").unwrap();
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
    for asset in ["/ui/app.js", "/ui/app.css"] {
        assert_eq!(request(&client, addr, "GET", asset, &[], "").status, 200);
    }

    // No data without a bearer or a session: not with a made-up cookie.
    let jobs = "/v1/jobs";
    assert_eq!(request(&client, addr, "GET", jobs, &[], "").status, 401);
    let forged = [("Cookie", "tessera_session=00ff")];
    assert_eq!(request(&client, addr, "GET", jobs, &forged, "").status, 401);
    assert_eq!(
        request(&client, addr, "GET", "/ui/session", &forged, "").status,
        401
    );
    let wrong = request(
        &client,
        addr,
        "POST",
        "/ui/signin",
        &[],
        r#"{"secret":"nope"}"#,
    );
    assert_eq!((wrong.status, wrong.header("set-cookie")), (401, None));
    // The worker ticket opens no session.
    let worker = ticket(&farm, "worker.ticket");
    let body = serde_json::json!({ "secret": worker.secret }).to_string();
    assert_eq!(
        request(&client, addr, "POST", "/ui/signin", &[], &body).status,
        401
    );

    // The client ticket (whole, as pasted) signs in.
    let (cookie, csrf, role) = sign_in(&client, addr, &client.to_string());
    assert_eq!(role, "client");
    let with = |extra: &[(&'static str, &str)]| {
        let mut h: Vec<(&str, String)> = vec![("Cookie", cookie.clone())];
        h.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        h
    };
    let call = |method: &str, path: &str, h: &[(&str, String)]| {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        request(&client, addr, method, path, &h, "")
    };
    let listed = call("GET", jobs, &with(&[]));
    assert_eq!(listed.status, 200, "{}", listed.body);
    let ids: Vec<Value> = (listed.json().as_array().unwrap().iter())
        .map(|j| j["id"].clone())
        .collect();
    assert!(ids.contains(&Value::from(job)), "{ids:?}");
    let told = call("GET", "/ui/session", &with(&[])).json();
    assert_eq!(
        (told["role"].as_str(), told["csrf"].as_str()),
        (Some("client"), Some(csrf.as_str()))
    );

    // A request that changes something, sent as a cross-site form would
    // be (the cookie, no token, another origin), or with a wrong token:
    // refused, and nothing changed.
    for extra in [
        vec![("Origin", "https://evil.example")],
        vec![("X-Tessera-CSRF", "0000")],
    ] {
        let r = call("POST", &resume, &with(&extra));
        assert_eq!(r.status, 403, "{}", r.body);
        assert!(paused(), "a refused resume changed nothing");
    }
    // With its token it acts.
    let r = call("POST", &resume, &with(&[("X-Tessera-CSRF", &csrf)]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!paused());
    let r = call("POST", &pause, &with(&[("X-Tessera-CSRF", &csrf)]));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(paused());

    // The viewer ticket signs in to look: it reads, it cannot act.
    let (v_cookie, v_csrf, v_role) = sign_in(&client, addr, &viewer.secret);
    assert_eq!(v_role, "viewer");
    let as_viewer = |method: &str, path: &str, csrf: Option<&str>| {
        let mut h = vec![("Cookie", v_cookie.as_str())];
        if let Some(c) = csrf {
            h.push(("X-Tessera-CSRF", c));
        }
        request(&client, addr, method, path, &h, "")
    };
    assert_eq!(as_viewer("GET", jobs, None).status, 200);
    assert_eq!(
        as_viewer("GET", &format!("/v1/jobs/{job}/detail"), None).status,
        200
    );
    for path in [
        resume.clone(),
        format!("/v1/jobs/{job}/cancel"),
        "/v1/workers/1/drain".into(),
        "/v1/workers/1/revoke".into(),
        format!("/v1/jobs/{job}/priority"),
    ] {
        let r = as_viewer("POST", &path, Some(&v_csrf));
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    assert!(paused());
    assert_eq!(farm.status(job)["state"], "queued");
    // Its bearer is the same: it looks.
    let bearer = format!("Bearer {}", viewer.secret);
    let h = [("Authorization", bearer.as_str())];
    assert_eq!(request(&client, addr, "GET", jobs, &h, "").status, 200);
    assert_eq!(request(&client, addr, "POST", &resume, &h, "").status, 403);
    // Nor can a viewer ticket open a QUIC session.
    let mut viewer_cli = farm.command(&["status", "--json"]);
    viewer_cli.env("TESSERA_TICKET", viewer.to_string());
    let out = viewer_cli.output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("viewer ticket"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Signing out ends that session alone, and its open event stream with
    // the next event.
    let stream = open_stream(&client, addr, &cookie);
    let out = call("POST", "/ui/signout", &with(&[("X-Tessera-CSRF", &csrf)]));
    assert_eq!(out.status, 200);
    let bearer_c = format!("Bearer {}", client.secret);
    let as_client = [("Authorization", bearer_c.as_str())];
    for action in [&resume, &pause] {
        assert_eq!(
            request(&client, addr, "POST", action, &as_client, "").status,
            200
        );
    }
    let ended = stream.join().unwrap();
    assert!(ended.is_ok(), "the stream did not end: {ended:?}");
    assert_eq!(call("GET", jobs, &with(&[])).status, 401);
    assert_eq!(as_viewer("GET", jobs, None).status, 200);

    // rotate-tickets ends every session; the new viewer ticket signs in.
    let (cookie2, _, _) = sign_in(&client, addr, &client.secret);
    let rotated = farm.json(&["coordinator", "rotate-tickets", "--json"]);
    assert!(rotated["client"].is_string(), "{rotated}");
    assert_eq!(as_viewer("GET", jobs, None).status, 401);
    let h = [("Cookie", cookie2.as_str())];
    assert_eq!(request(&client, addr, "GET", jobs, &h, "").status, 401);
    assert_eq!(
        request(&client, addr, "GET", "/ui/session", &h, "").status,
        401
    );
    let new_viewer = ticket(&farm, "viewer.ticket");
    assert_ne!(new_viewer.secret, viewer.secret);
    let body = serde_json::json!({ "secret": viewer.secret }).to_string();
    assert_eq!(
        request(&client, addr, "POST", "/ui/signin", &[], &body).status,
        401
    );
    let (_, _, role) = sign_in(&client, addr, &new_viewer.secret);
    assert_eq!(role, "viewer");
}

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records what the job page showed, at each of its redraws: whether the
/// mosaic was ever partly done, whether a done tile of it showed its
/// pixels then, and the most thumbnails shown while the job was not yet
/// done.
const OBSERVE: &str = r#"
window.seen = { partial: false, thumbsBeforeDone: 0, tilePixels: false };
const look = () => {
  const tiles = [...document.querySelectorAll('#mosaic .tile')];
  const done = tiles.filter((t) => t.classList.contains('done')).length;
  if (done > 0 && done < tiles.length) window.seen.partial = true;
  // A done tile of a part-done frame shows its own rendered pixels.
  for (const img of document.querySelectorAll('#mosaic .tile.done img.tile-image')) {
    if (img.complete && img.naturalWidth > 0 && done < tiles.length) window.seen.tilePixels = true;
    else img.addEventListener('load', look, { once: true });
  }
  const state = (document.querySelector('#job-state') || {}).textContent;
  const thumbs = document.querySelectorAll('#frames img.thumb').length;
  if (state && state !== 'done') window.seen.thumbsBeforeDone = Math.max(window.seen.thumbsBeforeDone, thumbs);
};
new MutationObserver(look).observe(document.getElementById('view'), { childList: true, subtree: true });
look();
"#;

/// The page's script has run and shows the sign-in form.
const SIGN_IN_SHOWN: &str = "return document.body.dataset.ready === 'signin'";

fn job_state_is(state: &str) -> String {
    format!("const s = document.querySelector('#job-state'); return s !== null && s.textContent === '{state}'")
}

/// Clicks `css`, which asks to be clicked again (its text becomes
/// `confirm`) and does nothing yet, then clicks it again until `done`
/// (a second click that came after the confirmation's 15 s, on a loaded
/// machine, asks again).
fn confirmed_click(browser: &Browser, css: &str, confirm: &str, done: impl Fn() -> bool) {
    let long = Duration::from_secs(120);
    let shows_confirm =
        format!("return document.querySelector('{css}').textContent === '{confirm}'");
    browser.click_css(css, long);
    browser.wait_until("the confirmation", &shows_confirm, long);
    assert!(!done(), "one click did it: {css}");
    for _ in 0..5 {
        browser.click_css(css, long);
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(10) {
            if done() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        browser.wait_until("the confirmation again", &shows_confirm, long);
    }
    panic!("{css}: the confirmed click did nothing");
}

/// Waits until the CLI's status of `job` satisfies `pred`.
fn cli_agrees(farm: &Farm, job: u64, what: &str, pred: impl Fn(&Value) -> bool) {
    farm.wait_for(job, what, pred);
}

#[test]
#[ignore = "needs blender, chromium and chromedriver"]
fn a_browser_signs_in_watches_a_tiled_blender_job_fill_in_and_acts_on_it() {
    crate::blender::enabled();
    require(Need::Chromium);
    let long = Duration::from_secs(120);
    let mut farm = Farm::start("dashboard-browser", &["--http"]);
    let project = Project::make(&farm.dir, &[]);
    let args = blender_worker();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    farm.add_worker_with("b1", &args);
    farm.wait_workers(1);
    let base = format!("https://{}", http_addr(&farm));
    let shots = screenshots();
    let browser = Browser::start(&farm.dir);

    // Sign in with the client ticket, as pasted.
    browser.goto(&format!("{base}/"));
    browser.wait_until("the sign-in form", SIGN_IN_SHOWN, long);
    let secret = browser.wait_find("#secret", long);
    browser.screenshot(&shots.join("signin.png"));
    browser.type_text(&secret, &ticket(&farm, "client.ticket").to_string());
    browser.click_css("#signin-button", long);
    browser.wait_until(
        "the farm page with the worker",
        "return document.querySelector('#workers tr[data-worker]') !== null",
        long,
    );
    browser.screenshot(&shots.join("farm.png"));

    // A tiled Blender job, submitted held: its page shows the mosaic of
    // frame 1 with every tile queued. 1500 samples make each tile take a
    // while (under a second unloaded), so that the pause below lands
    // while frame 1 is part done.
    let blend = project.blend("shot.blend");
    let submitted = farm.json(&[
        "submit",
        &blend,
        "--frames",
        "1-2",
        "--tiles",
        "3x3",
        "--samples",
        "1500",
        "--paused",
        "--json",
    ]);
    let job = submitted["id"].as_u64().unwrap();
    browser.goto(&format!("{base}/#/jobs/{job}"));
    browser.wait_until("the held job's page", &job_state_is("paused"), long);
    browser.wait_until(
        "a mosaic of 9 queued tiles",
        "return document.querySelectorAll('#mosaic .tile.queued').length === 9",
        long,
    );
    browser.run(OBSERVE);

    // Resumed from the page: the CLI sees it; paused again from the page
    // once a tile is done, the CLI sees that, and the page shows frame 1
    // part done.
    browser.click_css("#act-resume", long);
    cli_agrees(&farm, job, "resumed", |s| s["paused"] == false);
    cli_agrees(&farm, job, "a tile done", |s| {
        s["tasks_done"].as_u64() >= Some(1)
    });
    browser.click_css("#act-pause", long);
    cli_agrees(&farm, job, "paused from the page", |s| s["paused"] == true);
    browser.wait_until("the paused badge", &job_state_is("paused"), long);
    browser.wait_until(
        "frame 1's mosaic part done, a done tile showing its pixels",
        "return window.seen.partial && window.seen.tilePixels",
        long,
    );
    browser.screenshot(&shots.join("job-mosaic.png"));
    browser.click_css("#act-resume", long);
    cli_agrees(&farm, job, "resumed again", |s| s["paused"] == false);

    // The thumbnails fill in as frames are stitched, and load.
    browser.wait_until(
        "the job done on the page",
        &job_state_is("done"),
        Duration::from_secs(300),
    );
    browser.wait_until(
        "two loaded thumbnails",
        "const i = [...document.querySelectorAll('#frames img.thumb')]; return i.length === 2 && i.every((x) => x.complete && x.naturalWidth > 0)",
        long,
    );
    let seen = browser.run("return window.seen");
    assert!(
        seen["thumbsBeforeDone"].as_u64() >= Some(1),
        "a thumbnail showed before the job was done: {seen}"
    );
    browser.screenshot(&shots.join("job.png"));

    // A frame downloaded from the page is the bytes `wait --output` writes.
    let out = farm.dir.join("out");
    let done = farm.json(&[
        "wait",
        &job.to_string(),
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(done["state"], "done", "{done}");
    browser.click_css("a.download[data-frame=\"1\"]", long);
    // Chromium writes a download under a temporary name, then renames it.
    let want = std::fs::read(out.join("frame_0001.png")).unwrap();
    let downloaded = browser.downloads.join("frame_0001.png");
    let began = Instant::now();
    while std::fs::read(&downloaded).ok().as_ref() != Some(&want) {
        let files: Vec<PathBuf> = std::fs::read_dir(&browser.downloads)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            began.elapsed() < long,
            "no frame_0001.png equal to wait --output's among {files:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // All frames as one zip: each entry is the bytes `wait --output` wrote.
    browser.click_css("#download-all", long);
    let zip_path = browser.downloads.join(format!("job_{job}_frames.zip"));
    let began = Instant::now();
    let entries = loop {
        if let Some(entries) = std::fs::read(&zip_path).ok().and_then(|b| unzip(&b)) {
            break entries;
        }
        assert!(
            began.elapsed() < long,
            "no whole job_{job}_frames.zip downloaded"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["frame_0001.png", "frame_0002.png"]);
    for (name, bytes) in &entries {
        assert_eq!(
            bytes,
            &std::fs::read(out.join(name)).unwrap(),
            "{name} in the zip"
        );
    }

    // The jobs page lists both; cancel one from its page.
    let held = farm.json(&["submit", &blend, "--frames", "3", "--paused", "--json"])["id"]
        .as_u64()
        .unwrap();
    browser.goto(&format!("{base}/#/jobs"));
    browser.wait_until(
        "the jobs list",
        &format!("return document.querySelector('#jobs tr[data-job=\"{held}\"]') !== null"),
        long,
    );
    browser.screenshot(&shots.join("jobs.png"));
    browser.goto(&format!("{base}/#/jobs/{held}"));
    browser.wait_until("the held job's page", &job_state_is("paused"), long);
    // Its priority, raised from the page: the CLI sees it.
    let field = browser.wait_find("#priority", long);
    browser.run("document.getElementById('priority').value = ''");
    browser.type_text(&field, "12");
    browser.click_css("#act-priority", long);
    cli_agrees(&farm, held, "priority 12 from the page", |s| {
        s["priority"] == 12
    });
    browser.wait_until(
        "the new priority shown",
        "const p = document.querySelector('#job-priority'); return p !== null && p.textContent === '12'",
        long,
    );
    // Cancel asks for a second click.
    confirmed_click(&browser, "#act-cancel", "Confirm cancel?", || {
        farm.status(held)["state"] == "canceled"
    });
    browser.wait_until("the canceled badge", &job_state_is("canceled"), long);

    // Drain the worker from its page: it leaves.
    let worker = farm.json(&["status", "--json"])["workers"][0]["id"]
        .as_u64()
        .unwrap();
    browser.goto(&format!("{base}/#/workers/{worker}"));
    browser.wait_find("#worker-state", long);
    // Its page tells its blocklists and quarantine (none) and draws the
    // telemetry it sent at each heartbeat.
    browser.wait_until(
        "the worker's telemetry history",
        "const b = document.querySelector('#worker-blocklists'); const q = document.querySelector('#worker-quarantine'); return b !== null && b.textContent === 'no job' && q.textContent === 'no' && document.querySelector('#worker-history svg.spark') !== null",
        long,
    );
    browser.screenshot(&shots.join("worker.png"));
    confirmed_click(&browser, "#act-drain", "Confirm drain?", || {
        farm.json(&["status", "--json"])["workers"]
            .as_array()
            .is_some_and(|w| w.iter().all(|w| w["state"] == "draining"))
    });
    let status = farm.wait_worker_exit(0, long);
    assert!(status.success(), "the drained worker left: {status:?}");

    // Signed out, then in as the viewer: it sees the job and cannot act,
    // not even by sending the request itself.
    browser.click_css("#signout", long);
    browser.wait_until("the sign-in form again", SIGN_IN_SHOWN, long);
    let secret = browser.wait_find("#secret", long);
    let viewer = ticket(&farm, "viewer.ticket");
    browser.type_text(&secret, &viewer.to_string());
    browser.click_css("#signin-button", long);
    browser.goto(&format!("{base}/#/jobs/{job}"));
    browser.wait_until("the done job, as the viewer", &job_state_is("done"), long);
    assert_eq!(
        browser.run("return document.getElementById('role').textContent"),
        "viewer (read-only)"
    );
    assert_eq!(
        browser.run("return document.getElementById('act-cancel').disabled"),
        true
    );
    let status = browser.wait_until(
        "a viewer's own POST answered",
        &format!(
            "if (!window.viewerAsked) {{ window.viewerAsked = true; fetch('/ui/session').then((r) => r.json()).then((s) => fetch('/v1/jobs/{held}/retry', {{ method: 'POST', headers: {{ 'X-Tessera-CSRF': s.csrf }} }})).then((r) => {{ window.viewerPost = r.status; }}); }} return window.viewerPost || null"
        ),
        long,
    );
    assert_eq!(status, 403);
    eprintln!("dashboard screenshots: {}", shots.display());
}

/// A zip's entries (name, bytes) in order; `None` until it is whole.
fn unzip(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    use std::io::Read;
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).ok()?;
    let mut out = Vec::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).ok()?;
        let mut data = Vec::new();
        entry.read_to_end(&mut data).ok()?;
        out.push((entry.name().ok()?.to_string(), data));
    }
    Some(out)
}

/// A test certificate authority and, signed by it, a certificate for
/// `localhost` and 127.0.0.1: (CA DER, chain PEM, key PEM).
fn operator_certificate() -> (Vec<u8>, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &Issuer::new(ca, ca_key))
        .unwrap();
    (
        ca_cert.der().to_vec(),
        pem("CERTIFICATE", leaf.der()),
        pem("PRIVATE KEY", &key.serialize_der()),
    )
}

fn pem(label: &str, der: &[u8]) -> String {
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in der.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            text.push(if i <= chunk.len() {
                B64[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    let lines: Vec<&str> = (0..text.len())
        .step_by(64)
        .map(|i| &text[i..(i + 64).min(text.len())])
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// `coordinator --http-cert --http-key`: the API and dashboard are served
/// with the operator's certificate, which a client verifies as a browser
/// does (its CA, its name), while QUIC keeps the pinned one; a key that is
/// not the certificate's stops the coordinator with an error naming both.
#[test]
fn an_operators_certificate_serves_the_dashboard_as_browsers_verify_it() {
    let dir = std::env::temp_dir().join(format!("tessera-http-cert-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, chain, key) = operator_certificate();
    let (chain_file, key_file) = (dir.join("chain.pem"), dir.join("key.pem"));
    std::fs::write(&chain_file, &chain).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let farm = Farm::start(
        "http-cert",
        &[
            "--http",
            "--http-cert",
            chain_file.to_str().unwrap(),
            "--http-key",
            key_file.to_str().unwrap(),
        ],
    );
    let client = ticket(&farm, "client.ticket");
    let addr = http_addr(&farm);
    // Verified against the CA, by name, as a browser does.
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(ca))
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = std::sync::Arc::new(tls);
    let get = |path: &str| {
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let conn = rustls::ClientConnection::new(tls.clone(), name).unwrap();
        let mut stream =
            rustls::StreamOwned::new(conn, std::net::TcpStream::connect(addr).unwrap());
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
            client.secret
        );
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    };
    let page = get("/");
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains("/ui/app.js"),
        "{page}"
    );
    assert!(get("/v1/jobs").starts_with("HTTP/1.1 200"));
    // The ticket's pin is the QUIC certificate's, not this one.
    let mut pinned = crate::harness::pinned_tls(&client, addr);
    let refused = pinned.write_all(b"GET / HTTP/1.1\r\n\r\n");
    assert!(refused.is_err(), "the pinned handshake succeeded");
    // QUIC is as it was.
    assert!(farm.json(&["status", "--json"])["jobs"].is_array());
    drop(farm);

    // Another key than the certificate's: the coordinator does not start.
    let other = dir.join("other.pem");
    std::fs::write(&other, operator_certificate().2).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["coordinator", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--http", "--http-cert"])
        .arg(&chain_file)
        .arg("--http-key")
        .arg(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--http-cert") && err.contains("certificate and key"),
        "{err}"
    );
    // A chain no handshake could carry is refused at start too.
    let long = dir.join("long.pem");
    std::fs::write(&long, chain.repeat(11)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["coordinator", "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--http", "--http-cert"])
        .arg(&long)
        .arg("--http-key")
        .arg(&key_file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("at most 10"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
