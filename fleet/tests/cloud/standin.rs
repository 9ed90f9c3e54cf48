//! A stand-in for a cloud provider's API: a tiny HTTP/1.1 server on
//! 127.0.0.1:0 that records every request and answers with what the test's
//! handler returns, shaped as the provider documents it. A cloud API cannot
//! run here; this is the only stand-in in these tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

/// One request as the server read it.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    /// The path with its query, e.g. `/api/v0/bundles/?x=1`.
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} {}: body is not JSON ({e}): {}",
                self.method, self.path, self.body
            )
        })
    }

    /// The path without its query.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap()
    }
}

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(status: u16, body: Value) -> Response {
        Response {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.to_string(),
        }
    }

    pub fn with_header(mut self, k: &str, v: &str) -> Response {
        self.headers.push((k.into(), v.into()));
        self
    }

    /// A body of lines (a Kubernetes watch stream).
    pub fn lines(status: u16, lines: &[Value]) -> Response {
        let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
        Response {
            status,
            headers: vec![("Content-Type".into(), "application/json".into())],
            body,
        }
    }
}

type Handler = dyn Fn(&Request) -> Response + Send + Sync;

pub struct StandIn {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl StandIn {
    /// Serves `handler` on 127.0.0.1:0 until the test process ends.
    pub fn start(
        prefix: &str,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}{prefix}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let seen = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (seen, handler) = (seen.clone(), handler.clone());
                std::thread::spawn(move || serve(conn, &seen, &*handler));
            }
        });
        StandIn { url, requests }
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// Every byte every request carried (line, headers, body), for checks
    /// that a secret went only where it should.
    pub fn all_text(&self) -> String {
        self.requests()
            .iter()
            .map(|r| {
                let h: String = r
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}\n"))
                    .collect();
                format!("{} {}\n{h}\n{}\n", r.method, r.path, r.body)
            })
            .collect()
    }
}

fn serve(conn: TcpStream, seen: &Mutex<Vec<Request>>, handler: &Handler) {
    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut writer = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (
            parts.next().unwrap_or("").to_string(),
            parts.next().unwrap_or("").to_string(),
        );
        let mut headers = Vec::new();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let request = Request {
            method,
            path,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        };
        let response = handler(&request);
        seen.lock().unwrap().push(request);
        let mut out = format!(
            "HTTP/1.1 {} X\r\nContent-Length: {}\r\n",
            response.status,
            response.body.len()
        );
        for (k, v) in &response.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        out.push_str("\r\n");
        out.push_str(&response.body);
        if writer.write_all(out.as_bytes()).is_err() {
            return;
        }
    }
}
