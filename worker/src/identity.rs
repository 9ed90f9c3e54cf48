//! The worker's own credential, kept in its cache folder as `identity`:
//! given by the coordinator the first time the worker joins with the shared
//! worker ticket, and shown instead of the ticket on every later join, so
//! the worker can be revoked on its own and keeps working when the tickets
//! are rotated. It is kept per coordinator (by certificate fingerprint).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use tessera_protocol::ticket::Ticket;

const FILE: &str = "identity";
/// A credential line is `ID.SECRET` in hex; anything longer is not one.
const MAX_CREDENTIAL: usize = 256;

/// The ticket to join with: the shared one, or the same address and
/// fingerprint with this worker's credential when it has one for this
/// coordinator.
pub fn join_ticket(cache_dir: &Path, ticket: &Ticket) -> Ticket {
    match credential(cache_dir, &ticket.fingerprint) {
        Some(secret) => Ticket {
            secret,
            ..ticket.clone()
        },
        None => ticket.clone(),
    }
}

fn credential(cache_dir: &Path, fingerprint: &str) -> Option<String> {
    let text = std::fs::read_to_string(cache_dir.join(FILE)).ok()?;
    let (fp, credential) = text.trim().split_once(' ')?;
    let valid = fp == fingerprint
        && credential.len() <= MAX_CREDENTIAL
        && credential.contains('.')
        && credential
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'.');
    valid.then(|| credential.to_string())
}

/// Keeps the credential the coordinator with `fingerprint` enrolled this
/// worker with, readable by its owner only.
pub fn save(cache_dir: &Path, fingerprint: &str, credential: &str) -> anyhow::Result<()> {
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let path = cache_dir.join(FILE);
    let temp = cache_dir.join("identity.writing");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts
        .open(&temp)
        .with_context(|| format!("cannot write {}", temp.display()))?;
    f.write_all(format!("{fingerprint} {credential}\n").as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&temp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::messages::Role;

    #[test]
    fn a_saved_credential_replaces_the_ticket_secret_for_its_coordinator_only() {
        let dir = std::env::temp_dir().join(format!("tessera-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ticket = Ticket {
            role: Role::Worker,
            addr: "127.0.0.1:7700".parse().unwrap(),
            also: Vec::new(),
            fingerprint: "ab".repeat(32),
            secret: "shared".into(),
        };
        assert_eq!(join_ticket(&dir, &ticket).secret, "shared");
        save(&dir, &ticket.fingerprint, "0123.abcd").unwrap();
        assert_eq!(join_ticket(&dir, &ticket).secret, "0123.abcd");
        let other = Ticket {
            fingerprint: "cd".repeat(32),
            ..ticket.clone()
        };
        assert_eq!(join_ticket(&dir, &other).secret, "shared");
        // Garbage in the file is no credential.
        std::fs::write(
            dir.join(FILE),
            format!("{} not a credential\n", ticket.fingerprint),
        )
        .unwrap();
        assert_eq!(join_ticket(&dir, &ticket).secret, "shared");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
