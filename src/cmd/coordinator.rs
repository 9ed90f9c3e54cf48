//! `tessera coordinator`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub admin: Option<CoordinatorAdmin>,
    /// Where state, assets, the certificate and the tickets live.
    #[arg(long, required = true)]
    pub data_dir: Option<PathBuf>,
    /// Keep the farm's state (jobs, results, frames, worker identities,
    /// webhooks) in this PostgreSQL database instead of DATA_DIR's SQLite
    /// file: `postgres://USER@HOST:PORT/DB` or `host=… user=… dbname=…`.
    /// Put a password in PGPASSWORD, not here (a command line is seen by
    /// every user of the machine). Assets stay in DATA_DIR (or --blobs).
    #[arg(long, env = "TESSERA_STATE", value_name = "URL")]
    pub state: Option<String>,
    /// With --state: when another coordinator serves the farm, stand by
    /// and take over when it stops (within seconds of a crash). Without
    /// it, a second coordinator on one farm is refused.
    #[arg(long)]
    pub standby: bool,
    /// Keep assets and frames in this folder instead of DATA_DIR/blobs (a
    /// folder every coordinator of a farm with a standby mounts), or in a
    /// bucket of an S3-compatible store, s3://BUCKET/PREFIX: its endpoint
    /// and keys from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY or ~/.aws/credentials, never this line.
    #[arg(long, value_name = "DIR|s3://BUCKET/PREFIX", value_parser = tessera_coordinator::config::BlobsAt::parse)]
    pub blobs: Option<tessera_coordinator::config::BlobsAt>,
    /// Address to listen on (UDP). Port 0 picks a free port, and keeps it
    /// across restarts with the same data dir.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Address written into tickets, when workers reach this machine by
    /// another address than --listen (e.g. a public IP).
    #[arg(long)]
    pub advertise: Option<SocketAddr>,
    /// How often workers send heartbeats, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub heartbeat_ms: u64,
    /// How long a lease lives without a heartbeat, in milliseconds. Keep
    /// it under three heartbeats: a lost worker's tasks then restart
    /// elsewhere within three heartbeat intervals.
    #[arg(long, default_value_t = 2500)]
    pub lease_ms: u64,
    /// Hand tasks out without preferring workers that already hold
    /// their assets (for comparisons).
    #[arg(long)]
    pub no_cache_affinity: bool,
    /// Hand each worker slot only the task it renders, not its next
    /// ones too (pipelined leases are on by default; for comparisons).
    #[arg(long)]
    pub no_pipelining: bool,
    /// The congestion controller for what this process sends:
    /// `cubic-veno` (the default: CUBIC that cuts its window less for a
    /// loss seen with no queue behind it), quinn's `cubic` or `newreno`,
    /// or `bbr` (fast on paths that drop packets at random, but it
    /// resends much more where a slow link's queue overflows; see
    /// BENCHMARKS.md).
    #[arg(long, default_value = "cubic-veno", value_parser = tessera_coordinator::Congestion::parse)]
    pub congestion: tessera_coordinator::Congestion,
    /// How long a finished job's assets and frames are kept before
    /// garbage collection may remove them (e.g. 7d, 12h, 30m, 0s).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    pub retention: std::time::Duration,
    /// How fast the background scrub re-reads stored blobs to catch
    /// ones that rotted on disk, in MB/s (0: no scrub).
    #[arg(long, default_value_t = 16.0)]
    pub scrub_mb_per_sec: f64,
    /// End any task that runs longer than this (e.g. 2h) in jobs
    /// submitted without their own --task-timeout; the attempt fails
    /// with that reason and is retried like any failure.
    #[arg(long, value_parser = parse_duration)]
    pub task_timeout: Option<std::time::Duration>,
    /// Serve the HTTP/JSON API, /metrics and the web dashboard (at /) over
    /// TLS (the coordinator's certificate; the client ticket's secret as
    /// bearer, the viewer ticket's to look only). Alone: on
    /// TCP at the --listen port, so the client ticket names it; or at
    /// HOST:PORT. The URL is written to DATA_DIR/http.url.
    #[arg(long, num_args = 0..=1, default_missing_value = "ticket", value_name = "HOST:PORT")]
    pub http: Option<String>,
    /// With --http: serve it with this certificate chain (PEM, the server's
    /// first) instead of the coordinator's self-signed one, so that
    /// browsers trust the dashboard. Clients then verify it as browsers do
    /// (the Python client: Client(cafile=…)); QUIC keeps its own.
    #[arg(long, value_name = "PEM", requires = "http_key", requires = "http")]
    pub http_cert: Option<PathBuf>,
    /// The private key of --http-cert (PEM).
    #[arg(long, value_name = "PEM", requires = "http_cert")]
    pub http_key: Option<PathBuf>,
    /// POST job done, failed and blocked events to this http:// URL,
    /// signed with HMAC-SHA256 (X-Tessera-Signature); retried with
    /// backoff until the receiver answers 2xx, across restarts.
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// The file holding the webhook's signing secret (else the
    /// TESSERA_WEBHOOK_SECRET environment variable).
    #[arg(long, value_name = "FILE")]
    pub webhook_secret_file: Option<PathBuf>,
    /// The first wait before a failed webhook delivery is retried, in
    /// milliseconds; it doubles with each failure, up to
    /// --webhook-max-backoff-ms.
    #[arg(long, default_value_t = 500, hide = true)]
    pub webhook_backoff_ms: u64,
    /// The longest wait between webhook retries, in milliseconds.
    #[arg(long, default_value_t = 30_000, hide = true)]
    pub webhook_max_backoff_ms: u64,
}

pub(crate) async fn run(mut args: Args) -> anyhow::Result<i32> {
    match args.admin.take() {
        Some(CoordinatorAdmin::Backup { data_dir, dest }) => backup(data_dir, dest),
        Some(CoordinatorAdmin::RotateTickets { json, ticket }) => {
            rotate_tickets(json, ticket).await
        }
        None => serve(args).await,
    }
}

fn backup(data_dir: PathBuf, dest: PathBuf) -> anyhow::Result<i32> {
    let copied = tessera_coordinator::backup::backup(&data_dir, &dest)?;
    println!(
        "backed up {} into {}: the database and {} blob files ({} bytes)",
        data_dir.display(),
        dest.display(),
        copied.blobs,
        copied.bytes
    );
    Ok(0)
}

async fn rotate_tickets(json: bool, ticket: TicketArg) -> anyhow::Result<i32> {
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let (worker, client_ticket) = client.rotate_tickets().await?;
    if json {
        let tickets = serde_json::json!({ "worker": worker, "client": client_ticket });
        println!("{tickets}");
    } else {
        println!("worker ticket: {worker}\nclient ticket: {client_ticket}");
        eprintln!("the old tickets are refused from now on; the data dir's ticket files hold the new ones");
    }
    Ok(0)
}

/// Runs until SIGINT or SIGTERM.
async fn serve(args: Args) -> anyhow::Result<i32> {
    let Args {
        admin: _,
        data_dir,
        state,
        standby,
        blobs,
        listen,
        advertise,
        heartbeat_ms,
        lease_ms,
        no_cache_affinity,
        no_pipelining,
        congestion,
        retention,
        scrub_mb_per_sec,
        task_timeout,
        http,
        http_cert,
        http_key,
        webhook,
        webhook_secret_file,
        webhook_backoff_ms,
        webhook_max_backoff_ms,
    } = args;
    // Required by clap unless a subcommand is given.
    let data_dir = data_dir.context("pass --data-dir")?;
    let mut config = tessera_coordinator::server::Config::new(data_dir.clone(), listen);
    config.state_url = state;
    config.standby = standby;
    config.blobs = blobs;
    config.scrub_bytes_per_sec = (scrub_mb_per_sec.max(0.0) * 1e6) as u64;
    config.advertise = advertise;
    config.heartbeat_ms = heartbeat_ms;
    config.lease_ms = lease_ms.max(heartbeat_ms);
    config.cache_affinity = !no_cache_affinity;
    config.pipelining = !no_pipelining;
    tessera_coordinator::use_congestion(congestion);
    config.retention = retention;
    config.task_timeout = task_timeout.filter(|t| !t.is_zero());
    config.http = match http.as_deref() {
        None => None,
        Some("ticket") => Some(HttpListen::SamePort),
        Some(addr) => Some(HttpListen::Addr(addr.parse().with_context(|| {
            format!("--http {addr}: expected HOST:PORT, e.g. 127.0.0.1:7701")
        })?)),
    };
    if let (Some(chain), Some(key)) = (http_cert, http_key) {
        config.http_cert = Some(tessera_coordinator::server::HttpCert { chain, key });
    }
    if let Some(url) = webhook {
        tessera_coordinator::webhook::parse_url(&url)?;
        let secret = match webhook_secret_file {
        Some(file) => std::fs::read(&file)
            .with_context(|| format!("cannot read {}", file.display()))?,
        None => std::env::var("TESSERA_WEBHOOK_SECRET")
            .map(String::into_bytes)
            .map_err(|_| {
                anyhow::anyhow!("--webhook needs a signing secret: pass --webhook-secret-file FILE or set TESSERA_WEBHOOK_SECRET")
            })?,
    };
        let secret = String::from_utf8_lossy(&secret).trim().as_bytes().to_vec();
        if secret.is_empty() {
            anyhow::bail!("the webhook's signing secret is empty");
        }
        config.webhook = Some(Webhook {
            url,
            secret,
            first_backoff: std::time::Duration::from_millis(webhook_backoff_ms.max(1)),
            max_backoff: std::time::Duration::from_millis(
                webhook_max_backoff_ms.max(webhook_backoff_ms),
            ),
        });
    }
    let coordinator = tessera_coordinator::server::start(config).await?;
    // Scripts read the first line to learn the address; a closed
    // stdout must not stop the coordinator.
    let mut banner = format!(
        "tessera coordinator listening on {}\nworker ticket: {}\nclient ticket: {}\n",
        coordinator.addr,
        data_dir.join("worker.ticket").display(),
        data_dir.join("client.ticket").display()
    );
    if coordinator.http_addr.is_some() {
        let url = std::fs::read_to_string(data_dir.join("http.url")).unwrap_or_default();
        banner += &format!(
            "http api: {}\ndashboard: {}/ (sign in with the client ticket, or {} to look only)\n",
            url.trim(),
            url.trim().trim_end_matches('/'),
            data_dir.join("viewer.ticket").display()
        );
    }
    let mut stdout = std::io::stdout();
    let _ = stdout
        .write_all(banner.as_bytes())
        .and_then(|()| stdout.flush());
    match coordinator.run_until(shutdown_signal()).await {
        tessera_coordinator::server::Stopped::Asked => Ok(0),
        tessera_coordinator::server::Stopped::LostLease(taker) => {
            let by = taker.map_or_else(String::new, |t| {
                format!(" (generation {} at {})", t.generation, t.addr)
            });
            eprintln!(
                "tessera coordinator: stopped: another coordinator{by} took the farm over while \
                 this one could not renew its lease; start this one again with --standby"
            );
            Ok(3)
        }
    }
}

/// What is done to a coordinator besides running it.
#[derive(Subcommand)]
pub(crate) enum CoordinatorAdmin {
    /// Copy the data dir (database, blobs, identity, tickets) into DEST,
    /// consistently, while the coordinator runs; start a coordinator with
    /// `--data-dir DEST` to restore it.
    Backup {
        /// The running coordinator's data dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// A new (or empty) folder.
        dest: PathBuf,
    },
    /// Issue new worker and client tickets on the running coordinator: the
    /// old ones are refused for new connections from now on; enrolled
    /// workers keep working with their own credentials.
    RotateTickets {
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        ticket: TicketArg,
    },
}
