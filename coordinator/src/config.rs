//! How a coordinator runs: addresses, heartbeat and lease timing, retries,
//! stragglers, cache affinity, retention, scrub rate and checkpoints.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the coordinator runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Keep the state (jobs, results, frames, identities…) in this
    /// PostgreSQL database instead of the data dir's SQLite file: a
    /// connection string, `postgres://USER@HOST:PORT/DB` or
    /// `host=… user=… dbname=…` (a password from `PGPASSWORD`).
    pub state_url: Option<String>,
    /// With `state_url`: when another coordinator serves the farm, wait
    /// and take over when its lease ends, instead of refusing to start.
    pub standby: bool,
    /// Where the assets are, when not in `DATA_DIR/blobs`: a folder every
    /// coordinator of a farm with a standby mounts, or a bucket.
    pub blobs: Option<BlobsAt>,
    pub listen: SocketAddr,
    /// The address written into tickets, when it differs from `listen`
    /// (a public address in front of `0.0.0.0`).
    pub advertise: Option<SocketAddr>,
    pub heartbeat_ms: u64,
    pub lease_ms: u64,
    pub max_attempts: u32,
    /// The wait before a failed task's first retry; doubles with each
    /// further failure.
    pub retry_backoff_ms: u64,
    /// A task running this many percent of its job's mean task time, when
    /// the job has nothing left to hand out, is started again on an idle
    /// worker (0: never).
    pub straggler_percent: u32,
    /// Prefer workers whose cache holds a task's assets.
    pub cache_affinity: bool,
    /// Pipelined leases: each worker slot also holds its next tasks
    /// (see `Scheduler::set_pipelining`).
    pub pipelining: bool,
    /// How long a finished job's assets and frames are kept.
    pub retention: Duration,
    /// How fast the background scrub re-reads the blob store, in bytes per
    /// second (0: no scrub).
    pub scrub_bytes_per_sec: u64,
    /// How often the database's WAL is checkpointed into its main file: at
    /// most this much acknowledged work is lost if the WAL file is lost.
    pub checkpoint_every: Duration,
    /// Serve the HTTP/JSON API and `/metrics` (see `crate::http`).
    pub http: Option<HttpListen>,
    /// The HTTP API's own certificate chain and key (PEM files), in place
    /// of the coordinator's self-signed certificate: one browsers trust.
    pub http_cert: Option<HttpCert>,
    /// POST job events to this receiver (see `crate::webhook`).
    pub webhook: Option<Webhook>,
    /// The time limit of a task whose job sets none (`--task-timeout`).
    pub task_timeout: Option<Duration>,
}

/// An operator's certificate for the HTTP API (`--http-cert`, `--http-key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCert {
    pub chain: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// Where the HTTP API listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpListen {
    /// TCP on the QUIC address's port: the client ticket names it.
    SamePort,
    Addr(SocketAddr),
}

/// A webhook receiver.
#[derive(Clone)]
pub struct Webhook {
    /// `http://HOST:PORT/PATH`.
    pub url: String,
    /// The HMAC-SHA256 key bodies are signed with.
    pub secret: Vec<u8>,
    /// The wait before the first retry; doubles up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .field("secret", &"(hidden)")
            .finish()
    }
}

impl Config {
    pub fn new(data_dir: PathBuf, listen: SocketAddr) -> Config {
        Config {
            data_dir,
            state_url: None,
            standby: false,
            blobs: None,
            listen,
            advertise: None,
            heartbeat_ms: 1000,
            lease_ms: 2500,
            max_attempts: 3,
            retry_backoff_ms: 1000,
            straggler_percent: 300,
            task_timeout: None,
            cache_affinity: true,
            pipelining: true,
            retention: Duration::from_secs(7 * 24 * 3600),
            scrub_bytes_per_sec: 16 << 20,
            checkpoint_every: Duration::from_secs(1),
            http: None,
            http_cert: None,
            webhook: None,
        }
    }
}

/// Where a farm keeps its assets and frames (`--blobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobsAt {
    /// A folder (mounted by every coordinator of the farm).
    Folder(PathBuf),
    /// A bucket of an S3-compatible object store, `s3://BUCKET/PREFIX`,
    /// with this machine's copy in `DATA_DIR/blobs`.
    Bucket(tessera_store::s3::Location),
}

impl BlobsAt {
    /// `s3://BUCKET/PREFIX` is a bucket; anything else a folder.
    pub fn parse(arg: &str) -> Result<BlobsAt, String> {
        // `S3://` too: never a folder named `S3:`.
        if arg
            .get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("s3://"))
        {
            return tessera_store::s3::Location::parse(&format!("s3://{}", &arg[5..]))
                .map(BlobsAt::Bucket);
        }
        if arg.is_empty() {
            return Err("--blobs: an empty folder name".into());
        }
        Ok(BlobsAt::Folder(PathBuf::from(arg)))
    }
}

impl std::fmt::Display for BlobsAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobsAt::Folder(path) => write!(f, "{}", path.display()),
            BlobsAt::Bucket(location) => write!(f, "{location}"),
        }
    }
}
