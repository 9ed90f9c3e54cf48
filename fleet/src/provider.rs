//! What every provider adapter offers the fleet: offers to rent, a launch,
//! a node's state as the provider sees it, and a release.
//!
//! The trait is synchronous: each adapter is one blocking HTTP client, one
//! `docker` command or one child process at a time, and the fleet calls it
//! from its own thread. Nothing here holds a credential in a way that can be
//! printed: `Secret` has no `Display` and its `Debug` is redacted.

use std::fmt;
use std::time::Duration;

/// A credential or ticket: readable by the adapter that sends it, never
/// printed or logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that sends it (a header, an env var).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// How a provider rounds the time it bills.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Billing {
    /// Billed per this many seconds (1 for per-second, 60 for Lambda's minute).
    Increment(u32),
}

impl Billing {
    pub fn increment(self) -> Duration {
        match self {
            Billing::Increment(secs) => Duration::from_secs(u64::from(secs.max(1))),
        }
    }
}

/// Something a provider would rent now.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Offer {
    /// The provider's own id for the offer (an ask id, an instance type, a
    /// GPU type id), passed back to `launch`.
    pub id: String,
    /// The GPU model as the provider names it, e.g. `RTX_4090`, `A100_80GB`.
    pub gpu: String,
    pub gpu_count: u32,
    pub vram_gib: u32,
    /// What the provider bills for the whole node per hour, in USD.
    pub usd_per_hour: f64,
    /// Can be paused, stopped or preempted by the provider without notice.
    pub interruptible: bool,
    pub region: Option<String>,
    pub billing: Billing,
}

/// What the fleet wants a node to run: the worker image and how to reach
/// the coordinator. The ticket goes into the node's environment as
/// `TESSERA_WORKER_TICKET`, never onto a command line.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// A name unique to this fleet, which the worker also uses as its
    /// `--name` so that the fleet can match node and worker.
    pub name: String,
    /// The worker image (a Docker image reference or a template id).
    pub image: String,
    pub worker_ticket: Secret,
    /// Extra environment for the worker (never secrets other than the ticket).
    pub env: Vec<(String, String)>,
    /// Arguments after `tessera worker` (no ticket among them).
    pub worker_args: Vec<String>,
}

/// The provider's own handle on a launched node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub String);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node as its provider reports it. Whether its worker has joined the
/// farm is the coordinator's to say, not the provider's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// Accepted by the provider, not yet running (booting, pulling).
    Starting,
    Running,
    /// Paused or stopped by the provider with its disk kept (a Vast.ai
    /// instance outbid, a RunPod spot pod stopped); it may come back.
    Paused,
    /// About to be taken away (a Kubernetes node marked for preemption):
    /// drain it now.
    Preempting,
    /// Gone: destroyed, terminated or never to return. Billing has stopped.
    Gone,
}

/// Why a provider call failed, in the terms the fleet acts on.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The account's limit is reached: try another provider or offer.
    #[error("quota reached: {0}")]
    Quota(String),
    /// The offer was taken or withdrawn between listing and launch.
    #[error("offer {0} is no longer available")]
    OfferGone(String),
    /// Too many requests: wait before calling again.
    #[error("rate limited by the provider (retry after {retry_after:?})")]
    RateLimited { retry_after: Option<Duration> },
    /// The credential was refused: nothing will work until it is fixed.
    #[error("credentials refused: {0}")]
    Auth(String),
    /// The node named does not exist (any more).
    #[error("no such node: {0}")]
    NoSuchNode(NodeId),
    /// Anything else: a transport error, an unexpected response.
    #[error("{0}")]
    Other(String),
}

/// A place that rents worker nodes.
pub trait Provider: Send {
    /// The name this provider has in the fleet file, e.g. `vast`.
    fn name(&self) -> &str;

    /// What could be rented now, filtered by the provider where its API
    /// allows; the fleet filters again and ranks by price.
    fn offers(&mut self) -> Result<Vec<Offer>, ProviderError>;

    /// Rents a node for `offer` running `spec`.
    fn launch(&mut self, offer: &Offer, spec: &LaunchSpec) -> Result<NodeId, ProviderError>;

    /// The node's state as the provider sees it.
    fn state(&mut self, node: &NodeId) -> Result<NodeState, ProviderError>;

    /// Stops billing for the node: destroys or terminates it. Releasing a
    /// node already gone is not an error.
    fn release(&mut self, node: &NodeId) -> Result<(), ProviderError>;

    /// The nodes this provider holds whose names start with `prefix` (the
    /// fleet's own), as its own listing says, for a fleet that starts again
    /// after a crash. `None`: this adapter cannot list; the fleet then
    /// knows its nodes from its state file only.
    fn list(&mut self, prefix: &str) -> Result<Option<Vec<NodeId>>, ProviderError> {
        let _ = prefix;
        Ok(None)
    }

    /// Takes `node`, launched by an earlier run of the fleet, as this
    /// adapter's own, so that `state` and `release` reach it. Returns its
    /// state (`Gone` when it no longer exists).
    fn adopt(&mut self, node: &NodeId) -> Result<NodeState, ProviderError> {
        self.state(node)
    }
}

/// Variables of the fleet's own environment a node started on this machine
/// (`local`) inherits, by exact name or (ending in `*`) by prefix: the search
/// path, home, locale, time zone, temporary folder, logging, the display
/// and GPU device selection, the Blender to use, and the test hooks.
/// Everything else of the fleet's (a provider's key, the client ticket) is
/// dropped; the worker ticket goes in a file ([`write_ticket_file`]).
pub const NODE_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "LD_LIBRARY_PATH",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "EGL_PLATFORM",
    "CUDA_*",
    "NVIDIA_*",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ONEAPI_DEVICE_SELECTOR",
    "OCIO",
    "TESSERA_BLENDER",
    "TESSERA_BLENDER_PYTHON",
    "TESSERA_FAILPOINT",
    "TESSERA_TEST_*",
];

/// Whether a node started on this machine inherits the fleet's variable
/// `name`.
pub fn node_env_allowed(name: &str) -> bool {
    NODE_ENV.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *a,
    })
}

/// Writes the worker ticket to `path` with permissions `mode`, in a folder
/// only its owner may enter (created so), for a worker's `--ticket @FILE`.
/// A file mounted into a container whose worker runs as another user needs
/// to be readable by all (`0o444`): the folder keeps others on this machine
/// out.
pub fn write_ticket_file(
    path: &std::path::Path,
    ticket: &Secret,
    mode: u32,
) -> Result<(), ProviderError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let fail = |e: std::io::Error| {
        ProviderError::Other(format!(
            "cannot write the ticket file {}: {e}",
            path.display()
        ))
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    f.write_all(ticket.expose().as_bytes()).map_err(fail)?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)
}
