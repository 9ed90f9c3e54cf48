//! The cloud adapters against stand-ins of their providers' APIs.
//!
//! A cloud provider's API cannot run here, so each test starts a stand-in
//! HTTP server (`standin.rs`) that implements the documented request and
//! response shapes of the endpoints the adapter uses (the adapter's module
//! doc cites the pages), and checks what the adapter sends: the image, the
//! environment, the price, the GPU type; the ticket only in the node's
//! environment, never on a command line or in a log; the API key only in
//! the `Authorization` header. Each provider's errors are played too: a
//! quota, an offer gone, HTTP 429 with `Retry-After`, a node that never
//! boots (another offer is tried).

mod boot;
mod kubernetes;
mod lambda;
mod manifests;
mod paperspace;
mod runpod;
mod standin;
mod vast;

use std::io::Write;
use std::sync::{Mutex, Once};

use tessera_fleet::provider::{LaunchSpec, Secret};

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
static CAPTURE: Once = Once::new();

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything the adapters logged in this test process, at every level.
pub fn logs() -> String {
    CAPTURE.call_once(|| {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .init();
    });
    String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned()
}

/// A launch spec whose ticket and name are unique to the test.
pub fn spec(test: &str) -> LaunchSpec {
    logs();
    LaunchSpec {
        name: format!("fleet-{test}"),
        image: "registry.example/tessera-worker:0.1".into(),
        worker_ticket: Secret::new(format!("tsr1.worker.{test}.Zx9secret")),
        env: vec![("RUST_LOG".into(), "info".into())],
        worker_args: vec!["--slots".into(), "auto".into(), "--interruptible".into()],
    }
}

pub fn key(test: &str) -> Secret {
    Secret::new(format!("apikey-{test}-0123456789"))
}

/// The API key went in every request's `Authorization: Bearer` header and
/// nowhere else; neither the key nor the ticket is in any log line.
pub fn assert_secrets_kept(s: &standin::StandIn, key: &Secret, spec: &LaunchSpec) {
    let requests = s.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {}", key.expose()).as_str()),
            "{} {}",
            r.method,
            r.path
        );
        assert!(
            !r.path.contains(key.expose()),
            "the key is in a URL: {}",
            r.path
        );
        assert!(!r.body.contains(key.expose()), "the key is in a body");
        assert!(
            !r.path.contains(spec.worker_ticket.expose()),
            "the ticket is in a URL"
        );
    }
    let logs = logs();
    assert!(
        !logs.contains(spec.worker_ticket.expose()),
        "the ticket was logged"
    );
    assert!(!logs.contains(key.expose()), "the API key was logged");
}
