//! The coordinator's data dir on disk: its identity (certificate and private
//! key, created on first start), and the worker and client tickets, which
//! keep their secrets across restarts (until rotated) and are readable by
//! their owner only.

use crate::config::BlobsAt;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Context;
use tessera_protocol::messages::Role;
use tessera_protocol::ticket::Ticket;
use tessera_transport::Identity;

/// The certificate and key in `dir`, generated on first start.
pub fn load_identity(dir: &Path) -> anyhow::Result<Identity> {
    let (cert, key) = (
        dir.join("coordinator.crt.der"),
        dir.join("coordinator.key.der"),
    );
    if cert.exists() && key.exists() {
        return Ok(Identity {
            cert_der: std::fs::read(&cert)
                .with_context(|| format!("reading {}", cert.display()))?,
            key_der: std::fs::read(&key).with_context(|| format!("reading {}", key.display()))?,
        });
    }
    let identity = Identity::generate()?;
    std::fs::write(&cert, &identity.cert_der)?;
    write_secret_file(&key, "")?;
    std::fs::write(&key, &identity.key_der)?;
    Ok(identity)
}

/// The worker ticket of the previous run, if any (its port is reused).
pub fn previous_worker_ticket(dir: &Path) -> Option<Ticket> {
    read_ticket(&dir.join("worker.ticket"))
}

fn read_ticket(path: &Path) -> Option<Ticket> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The coordinator's three tickets: the worker's, the client's, and the
/// viewer's (the dashboard's and the HTTP API's read-only role).
#[derive(Debug, Clone)]
pub struct Tickets {
    pub worker: Ticket,
    pub client: Ticket,
    pub viewer: Ticket,
}

/// The roles with a ticket file, and its name in the data dir.
const TICKET_FILES: [(Role, &str); 3] = [
    (Role::Worker, "worker.ticket"),
    (Role::Client, "client.ticket"),
    (Role::Viewer, "viewer.ticket"),
];

/// Writes `worker.ticket`, `client.ticket` and `viewer.ticket` for `addr`
/// and `fingerprint`, keeping each one's secret from the previous run
/// (`fresh`: new secrets for all three, as `rotate-tickets` asks).
pub fn write_tickets(
    dir: &Path,
    addr: SocketAddr,
    fingerprint: &str,
    fresh: bool,
) -> anyhow::Result<Tickets> {
    write_tickets_for(dir, &[addr], fingerprint, ticket_secrets(dir, fresh))
}

/// The secrets of the data dir's tickets (worker, client, viewer), a new
/// one for each missing, or for all three when `fresh`.
pub fn ticket_secrets(dir: &Path, fresh: bool) -> [String; 3] {
    TICKET_FILES.map(|(role, file)| {
        read_ticket(&dir.join(file))
            .filter(|t| t.role == role && !fresh)
            .map_or_else(Ticket::new_secret, |t| t.secret)
    })
}

/// The names the tickets' secrets are shared under in a shared state.
pub const SECRET_NAMES: [&str; 3] = ["ticket.worker", "ticket.client", "ticket.viewer"];

/// Writes the three tickets naming every coordinator in `addrs` (this one's
/// first) with `secrets` (worker, client, viewer).
pub fn write_tickets_for(
    dir: &Path,
    addrs: &[SocketAddr],
    fingerprint: &str,
    secrets: [String; 3],
) -> anyhow::Result<Tickets> {
    let (addr, also) = addrs
        .split_first()
        .context("a ticket needs a coordinator address")?;
    let mut secrets = secrets.into_iter();
    let [worker, client, viewer] = TICKET_FILES.map(|(role, _)| Ticket {
        role,
        addr: *addr,
        also: also.to_vec(),
        fingerprint: fingerprint.to_string(),
        secret: secrets.next().unwrap_or_default(),
    });
    let tickets = Tickets {
        worker,
        client,
        viewer,
    };
    for (ticket, (_, file)) in [&tickets.worker, &tickets.client, &tickets.viewer]
        .into_iter()
        .zip(TICKET_FILES)
    {
        write_secret_file(&dir.join(file), &format!("{ticket}\n"))?;
    }
    Ok(tickets)
}

/// Writes a file readable by its owner only, whole: a temporary file
/// renamed over it, so a reader never sees half a ticket.
fn write_secret_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let temp = path.with_extension("writing");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts
        .open(&temp)
        .with_context(|| format!("cannot write {}", temp.display()))?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&temp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Locks the data dir for this process (`coordinator.lock`, released when
/// the process ends, however it ends): two coordinators never share one.
pub fn lock(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join("coordinator.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
            "another coordinator runs on the data dir {}: stop it first, or give this one a \
             data dir of its own",
            dir.display()
        ),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

/// What a data dir remembers of the farm it serves: the state URL it was
/// started with (`state`; masked when it carries a password) and the
/// asset folder (`blobs.path`). A start that leaves either out uses the one
/// remembered, saying so, rather than starting an empty farm in SQLite or
/// an empty asset folder beside the real ones; a remembered URL that was
/// masked must be given again.
pub fn remember(
    dir: &Path,
    state_url: &mut Option<String>,
    blobs: &mut Option<BlobsAt>,
) -> anyhow::Result<()> {
    let read = |name: &str| {
        let text = std::fs::read_to_string(dir.join(name)).ok()?;
        let line = text.trim().to_string();
        (!line.is_empty()).then_some(line)
    };
    match (state_url.as_deref(), read("state")) {
        (None, Some(recorded)) if recorded.contains("***") => anyhow::bail!(
            "the data dir {} belongs to a farm whose state is in PostgreSQL ({recorded}): pass \
             --state (or TESSERA_STATE) with its URL",
            dir.display(),
        ),
        (None, Some(recorded)) => {
            tracing::info!(state = %recorded, "the state this data dir was started with");
            *state_url = Some(recorded);
        }
        (Some(url), recorded) => {
            let shown = crate::db::sql::redact(url);
            match recorded {
                Some(recorded) if recorded != shown => anyhow::bail!(
                    "the data dir {} serves the farm whose state is at {recorded}, not {shown}: \
                     a data dir serves one farm (to move it to this database, remove {})",
                    dir.display(),
                    dir.join("state").display()
                ),
                Some(_) => {}
                None if dir.join("state.sqlite").exists() => anyhow::bail!(
                    "the data dir {} holds a farm in SQLite (state.sqlite): with --state it \
                     would serve an empty farm beside it. Give the PostgreSQL farm a data dir \
                     of its own",
                    dir.display()
                ),
                None => write_secret_file(&dir.join("state"), &format!("{shown}\n"))?,
            }
        }
        (None, None) => {}
    }
    match (blobs.as_ref(), read("blobs.path")) {
        (None, Some(recorded)) => {
            tracing::info!(blobs = %recorded, "the asset store this data dir was started with");
            *blobs = Some(BlobsAt::parse(&recorded).map_err(anyhow::Error::msg)?);
        }
        (Some(at), recorded) => {
            let at = match at {
                BlobsAt::Folder(path) => BlobsAt::Folder(
                    std::path::absolute(path)
                        .with_context(|| format!("--blobs {}", path.display()))?,
                ),
                BlobsAt::Bucket(_) => at.clone(),
            };
            let shown = at.to_string();
            if shown.contains('\n') {
                anyhow::bail!("--blobs {shown:?}: a folder name with a line break");
            }
            if recorded.as_deref() != Some(shown.as_str()) {
                write_secret_file(&dir.join("blobs.path"), &format!("{shown}\n"))?;
            }
            *blobs = Some(at);
        }
        (None, None) => {}
    }
    Ok(())
}
