//! The coordinator's data dir on disk: its identity (certificate and private
//! key, created on first start), and the worker and client tickets, which
//! keep their secrets across restarts (until rotated) and are readable by
//! their owner only.

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
    let [worker, client, viewer] = TICKET_FILES.map(|(role, file)| Ticket {
        role,
        addr,
        fingerprint: fingerprint.to_string(),
        secret: read_ticket(&dir.join(file))
            .filter(|t| t.role == role && !fresh)
            .map_or_else(Ticket::new_secret, |t| t.secret),
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
