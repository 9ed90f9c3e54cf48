//! A small W3C WebDriver client for the dashboard's tests: Debian's
//! headless Chromium driven through its chromedriver, over plain HTTP on
//! 127.0.0.1 (ureq). The driver runs in a process group of its own, with
//! the browser it starts; dropping the [`Browser`] ends its session and
//! kills the group.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::requires::{require, Need};

pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    pub downloads: PathBuf,
}

/// A page element, as the driver names it.
pub struct Element(String);

const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// A headless Chromium window of 1280x800 that trusts any certificate
    /// (the coordinator's is self-signed), saving downloads in
    /// `dir/downloads`.
    pub fn start(dir: &Path) -> Browser {
        require(Need::Chromium);
        let port = free_port();
        let mut cmd = Command::new("chromedriver");
        cmd.arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let driver = cmd.spawn().expect("chromedriver starts");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .into();
        let downloads = dir.join("downloads");
        std::fs::create_dir_all(&downloads).unwrap();
        let profile = dir.join("chromium-profile");
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            agent,
            downloads,
        };
        let began = Instant::now();
        loop {
            let ready = browser.call("GET", "/status", None);
            if ready.is_ok_and(|v| v["value"]["ready"] == true) {
                break;
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "chromedriver did not answer within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,800",
                         format!("--user-data-dir={}", profile.display())],
                "prefs": {
                    "download.default_directory": browser.downloads.to_str().unwrap(),
                    "download.prompt_for_download": false,
                },
            },
        }}});
        let session = browser.call("POST", "/session", Some(caps)).unwrap();
        browser.session = session["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {session}"))
            .to_string();
        // `--window-size` is the window's, frame included: the page itself
        // is made 1280x800, as the screenshots must be.
        let metrics = json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": {
            "width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": false}});
        browser.session_call("POST", "/goog/cdp/execute", Some(metrics));
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        let reply = match body {
            Some(b) => (self.agent.post(&url))
                .header("Content-Type", "application/json")
                .send(b.to_string()),
            None if method == "DELETE" => self.agent.delete(&url).call(),
            None => self.agent.get(&url).call(),
        };
        let mut reply = reply.map_err(|e| format!("{method} {path}: {e}"))?;
        let text = reply
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
        if reply.status().as_u16() >= 400 {
            return Err(format!("{method} {path}: {}", v["value"]));
        }
        Ok(v)
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        match self.call(method, &path, body) {
            Ok(v) => v["value"].clone(),
            Err(e) => panic!("WebDriver: {e}"),
        }
    }

    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The first element `css` selects, if any now.
    pub fn find(&self, css: &str) -> Option<Element> {
        let path = format!("/session/{}/element", self.session);
        let found = self.call(
            "POST",
            &path,
            Some(json!({"using": "css selector", "value": css})),
        );
        found
            .ok()
            .and_then(|v| v["value"][ELEMENT_KEY].as_str().map(|s| Element(s.into())))
    }

    /// The first element `css` selects, waited for up to `limit`.
    pub fn wait_find(&self, css: &str, limit: Duration) -> Element {
        let began = Instant::now();
        loop {
            if let Some(e) = self.find(css) {
                return e;
            }
            assert!(
                began.elapsed() < limit,
                "no `{css}` on the page within {limit:?}; the page says: {}",
                self.run("return document.body.innerText")
                    .as_str()
                    .unwrap_or("")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the element `css` selects once it is there and enabled,
    /// finding it again when a redraw replaced it between the two.
    pub fn click_css(&self, css: &str, limit: Duration) {
        let began = Instant::now();
        loop {
            let e = self.wait_find(css, limit);
            let at = format!("/session/{}/element/{}", self.session, e.0);
            match self.call("GET", &format!("{at}/enabled"), None) {
                Ok(v) if v["value"] == true => {
                    match self.call("POST", &format!("{at}/click"), Some(json!({}))) {
                        Ok(_) => return,
                        Err(err) if err.contains("stale") => {}
                        Err(err) => panic!("WebDriver: {err}"),
                    }
                }
                Ok(_) => {}
                Err(err) if err.contains("stale") => {}
                Err(err) => panic!("WebDriver: {err}"),
            }
            assert!(
                began.elapsed() < limit,
                "`{css}` was not enabled within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn type_text(&self, e: &Element, text: &str) {
        self.session_call(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        );
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page
    /// and returns what it returns.
    pub fn run_with(&self, script: &str, args: Value) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    pub fn run(&self, script: &str) -> Value {
        self.run_with(script, json!([]))
    }

    /// Waits up to `limit` for `script` to return something truthy, and
    /// returns it.
    pub fn wait_until(&self, what: &str, script: &str, limit: Duration) -> Value {
        let began = Instant::now();
        loop {
            let v = self.run(script);
            let truthy =
                !matches!(&v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("");
            if truthy {
                return v;
            }
            assert!(
                began.elapsed() < limit,
                "{what}: not within {limit:?}; the page says: {}",
                self.run("return document.body.innerText")
                    .as_str()
                    .unwrap_or("")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Saves the page (1280x800) as PNG at `path`.
    pub fn screenshot(&self, path: &Path) {
        let b64 = self.session_call("GET", "/screenshot", None);
        let png = base64_decode(b64.as_str().unwrap());
        // The PNG's IHDR: width and height, big-endian, at bytes 16..24.
        let size = |at: usize| {
            png.get(at..at + 4)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
        };
        assert_eq!(
            (size(16), size(20)),
            (Some(1280), Some(800)),
            "{}",
            path.display()
        );
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        // The driver and every browser process it started.
        unsafe { libc::kill(-(self.driver.id() as i32), libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Standard base64 (with padding), as WebDriver sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    for quad in clean.chunks(4) {
        let data: Vec<u8> = quad.iter().copied().filter(|&c| c != b'=').collect();
        let mut n = 0u32;
        for (i, &c) in data.iter().enumerate() {
            n |= value(c) << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..data.len()]);
    }
    out
}

#[test]
fn base64_decodes_as_webdriver_sends_it() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("YWJj"), b"abc");
}
