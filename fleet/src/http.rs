//! The one blocking HTTP client every cloud adapter uses: a base URL, a
//! bearer credential, JSON in and out, and the few status codes the fleet
//! acts on mapped to [`ProviderError`] (429 with its `Retry-After`, 401/403).
//!
//! The credential is sent only in the `Authorization` header, never in a
//! URL (where proxies and logs keep it). Plain `http://` is refused except to
//! a loopback address (the stand-in servers of the tests): a key sent in the
//! clear to a real provider would be a key given away. Every response body
//! is read up to [`MAX_RESPONSE`]; nothing here logs a header or a body.

use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use crate::provider::{ProviderError, Secret};

/// The largest response body read from a provider (an offer list is the
/// biggest: a few hundred offers of a few hundred bytes each).
pub const MAX_RESPONSE: u64 = 8 << 20;
/// How long one request may take, connect to last byte.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured as given; a larger one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How much of an error body is quoted in an error message.
const MAX_QUOTED: usize = 300;

/// A provider's API: a base URL and the credential for it.
pub struct Api {
    agent: ureq::Agent,
    base: String,
    token: Option<Secret>,
}

/// A response: its status, its body (parsed as JSON when it is JSON, else
/// `Value::String` of the text) and the server's `Retry-After`, if any.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<Duration>,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error a non-2xx reply means when the caller knows nothing more
    /// specific: 429 → `RateLimited`, 401/403 → `Auth`, else `Other` quoting
    /// the provider's message.
    pub fn error(&self, what: &str) -> ProviderError {
        match self.status {
            429 => ProviderError::RateLimited {
                retry_after: self.retry_after,
            },
            401 | 403 => ProviderError::Auth(format!(
                "{what}: HTTP {}: {} (check the API key the fleet file names)",
                self.status,
                self.message()
            )),
            _ => ProviderError::Other(format!("{what}: HTTP {}: {}", self.status, self.message())),
        }
    }

    /// The provider's own words for an error, cut to a few hundred bytes:
    /// `message`, `msg`, `error.message` or `error`, else the whole body.
    pub fn message(&self) -> String {
        let b = &self.body;
        let text = [
            b.pointer("/error/message"),
            b.get("message"),
            b.get("msg"),
            b.pointer("/errors/0/message"),
            b.get("error"),
        ]
        .into_iter()
        .flatten()
        .find_map(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| match b {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        cut(&text, MAX_QUOTED)
    }
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl Api {
    /// A client for `base` (e.g. `https://console.vast.ai/api/v0`) sending
    /// `token` as a bearer credential. `ca_pem`: the certificates to trust
    /// instead of the public roots (a Kubernetes cluster's own CA).
    pub fn new(
        base: &str,
        token: Option<Secret>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Api, ProviderError> {
        let base = base.trim_end_matches('/').to_string();
        check_url(&base)?;
        let mut tls = ureq::tls::TlsConfig::builder();
        if let Some(pem) = ca_pem {
            let mut certs = Vec::new();
            for item in ureq::tls::parse_pem(pem) {
                match item {
                    Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
                    Ok(_) => {}
                    Err(e) => {
                        return Err(ProviderError::Other(format!(
                            "the CA certificate file is not PEM: {e}"
                        )))
                    }
                }
            }
            if certs.is_empty() {
                return Err(ProviderError::Other(
                    "the CA certificate file holds no certificate".into(),
                ));
            }
            tls = tls.root_certs(ureq::tls::RootCerts::from(certs));
        }
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .max_redirects(0)
            .user_agent(concat!("tessera-fleet/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls.build())
            .build()
            .new_agent();
        Ok(Api { agent, base, token })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends `method path` (path starting with `/`, query included) with an
    /// optional JSON body; returns the reply whatever its status. Transport
    /// failures are `ProviderError::Other`.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, ProviderError> {
        self.call_typed(method, path, body, "application/json")
    }

    /// The same with the body's content type given (a Kubernetes merge patch).
    pub fn call_typed(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<Reply, ProviderError> {
        let url = format!("{}{}", self.base, path);
        let transport = |e: ureq::Error| {
            // ureq's errors name the URL, never a header or body.
            ProviderError::Other(format!("{method} {url}: {e}"))
        };
        let auth = self
            .token
            .as_ref()
            .map(|t| format!("Bearer {}", t.expose()));
        let request = match method {
            "GET" => Method::Empty(self.agent.get(&url)),
            "DELETE" => Method::Empty(self.agent.delete(&url)),
            "POST" => Method::Body(self.agent.post(&url)),
            "PUT" => Method::Body(self.agent.put(&url)),
            "PATCH" => Method::Body(self.agent.patch(&url)),
            other => return Err(ProviderError::Other(format!("unsupported method {other}"))),
        };
        let request = match &auth {
            Some(a) => request.header("Authorization", a),
            None => request,
        }
        .header("Accept", "application/json");
        let mut response = match body {
            Some(b) => request
                .header("Content-Type", content_type)
                .send(b.to_string())
                .map_err(transport)?,
            None => request.send_empty().map_err(transport)?,
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let mut bytes = Vec::new();
        response
            .body_mut()
            .as_reader()
            .take(MAX_RESPONSE)
            .read_to_end(&mut bytes)
            .map_err(|e| ProviderError::Other(format!("{method} {url}: reading the reply: {e}")))?;
        let text = String::from_utf8_lossy(&bytes);
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| Value::String(cut(&text, 4096)))
        };
        Ok(Reply {
            status,
            body,
            retry_after,
        })
    }

    /// Opens `GET path` and returns a reader of its body as it arrives (a
    /// Kubernetes watch: one JSON event a line).
    pub fn stream(
        &self,
        path: &str,
    ) -> Result<(u16, Box<dyn std::io::BufRead + Send>), ProviderError> {
        let url = format!("{}{}", self.base, path);
        let mut request = self.agent.get(&url);
        if let Some(t) = &self.token {
            request = request.header("Authorization", format!("Bearer {}", t.expose()));
        }
        let response = request
            .call()
            .map_err(|e| ProviderError::Other(format!("GET {url}: {e}")))?;
        let status = response.status().as_u16();
        let reader = response.into_body().into_reader();
        Ok((
            status,
            Box::new(std::io::BufReader::new(reader.take(MAX_RESPONSE * 4))),
        ))
    }
}

enum Method {
    Empty(ureq::RequestBuilder<ureq::typestate::WithoutBody>),
    Body(ureq::RequestBuilder<ureq::typestate::WithBody>),
}

impl Method {
    fn header(self, k: &str, v: &str) -> Method {
        match self {
            Method::Empty(r) => Method::Empty(r.header(k, v)),
            Method::Body(r) => Method::Body(r.header(k, v)),
        }
    }

    fn send(self, body: String) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        match self {
            Method::Empty(r) => r.force_send_body().send(body),
            Method::Body(r) => r.send(body),
        }
    }

    fn send_empty(self) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        match self {
            Method::Empty(r) => r.call(),
            Method::Body(r) => r.send_empty(),
        }
    }
}

/// Only `https://`, or `http://` to a loopback address.
pub fn check_url(base: &str) -> Result<(), ProviderError> {
    if base.starts_with("https://") {
        return Ok(());
    }
    if let Some(rest) = base.strip_prefix("http://") {
        let host = rest.split('/').next().unwrap_or("");
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return Ok(());
        }
    }
    Err(ProviderError::Other(format!(
        "refusing API address {base}: use https:// (plain http only to a loopback address)"
    )))
}

/// `Retry-After` as delta-seconds (the form the providers send); an
/// HTTP-date or garbage reads as none.
pub fn parse_retry_after(v: &str) -> Option<Duration> {
    let secs: f64 = v.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(secs).min(MAX_RETRY_AFTER))
}

/// `s` percent-encoded for a URL path segment or query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_refused_except_to_loopback() {
        assert!(check_url("https://console.vast.ai/api/v0").is_ok());
        assert!(check_url("http://127.0.0.1:4242").is_ok());
        assert!(check_url("http://localhost:1/x").is_ok());
        assert!(check_url("http://[::1]:80").is_ok());
        let e = check_url("http://console.vast.ai").unwrap_err().to_string();
        assert!(e.contains("https://"), "{e}");
        assert!(check_url("http://127.0.0.1.example.com").is_err());
        assert!(check_url("ftp://127.0.0.1").is_err());
    }

    #[test]
    fn retry_after_is_read_as_seconds_and_bounded() {
        assert_eq!(parse_retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(" 1.5 "),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after("999999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-3"), None);
    }
}
