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

/// Writes `worker.ticket` and `client.ticket` for `addr` and `fingerprint`,
/// keeping each one's secret from the previous run. Returns (worker, client).
pub fn write_tickets(
    dir: &Path,
    addr: SocketAddr,
    fingerprint: &str,
) -> anyhow::Result<(Ticket, Ticket)> {
    let ticket = |role, file: &str| Ticket {
        role,
        addr,
        fingerprint: fingerprint.to_string(),
        secret: read_ticket(&dir.join(file))
            .filter(|t| t.role == role)
            .map_or_else(Ticket::new_secret, |t| t.secret),
    };
    let worker = ticket(Role::Worker, "worker.ticket");
    let client = ticket(Role::Client, "client.ticket");
    write_secret_file(&dir.join("worker.ticket"), &format!("{worker}\n"))?;
    write_secret_file(&dir.join("client.ticket"), &format!("{client}\n"))?;
    Ok((worker, client))
}

/// Writes `worker.ticket` and `client.ticket` with fresh secrets. Returns
/// (worker, client).
pub fn rotate_tickets(
    dir: &Path,
    addr: SocketAddr,
    fingerprint: &str,
) -> anyhow::Result<(Ticket, Ticket)> {
    let ticket = |role| Ticket {
        role,
        addr,
        fingerprint: fingerprint.to_string(),
        secret: Ticket::new_secret(),
    };
    let (worker, client) = (ticket(Role::Worker), ticket(Role::Client));
    write_secret_file(&dir.join("worker.ticket"), &format!("{worker}\n"))?;
    write_secret_file(&dir.join("client.ticket"), &format!("{client}\n"))?;
    Ok((worker, client))
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
