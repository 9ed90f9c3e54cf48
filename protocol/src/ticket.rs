//! Join tickets: one line that lets a machine reach the coordinator and prove
//! its role. `tessera://ROLE@ADDR/?fp=FINGERPRINT&secret=SECRET`, where the
//! fingerprint pins the coordinator's self-signed certificate. A farm with
//! a standby coordinator names every coordinator's address, comma
//! separated (`ROLE@ADDR,ADDR2`): they share the certificate and secrets,
//! and a machine joins whichever one serves.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::messages::Role;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub role: Role,
    pub addr: SocketAddr,
    /// The other coordinators' addresses (standbys), tried beside `addr`.
    pub also: Vec<SocketAddr>,
    /// blake3 of the coordinator certificate (DER), hex.
    pub fingerprint: String,
    pub secret: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a Tessera ticket: {0} (a ticket looks like tessera://worker@203.0.113.5:7700/?fp=…&secret=…)")]
pub struct TicketError(String);

/// The most coordinator addresses one ticket names.
pub const MAX_ADDRS: usize = 8;

impl Ticket {
    /// Every address the ticket names, `addr` first.
    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        std::iter::once(self.addr).chain(self.also.iter().copied())
    }

    /// A fresh random secret (256 bits, hex).
    pub fn new_secret() -> String {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let role = match self.role {
            Role::Worker => "worker",
            Role::Client => "client",
            Role::Viewer => "viewer",
        };
        write!(f, "tessera://{role}@{}", self.addr)?;
        for addr in &self.also {
            write!(f, ",{addr}")?;
        }
        write!(f, "/?fp={}&secret={}", self.fingerprint, self.secret)
    }
}

/// A piece of a bad ticket, cut to 40 characters for an error message.
fn shown(part: &str) -> String {
    match part.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &part[..end]),
        None => part.to_string(),
    }
}

impl FromStr for Ticket {
    type Err = TicketError;

    fn from_str(s: &str) -> Result<Self, TicketError> {
        let s = s.trim();
        let rest = s
            .strip_prefix("tessera://")
            .ok_or_else(|| TicketError("it does not start with tessera://".into()))?;
        let (role, rest) = rest
            .split_once('@')
            .ok_or_else(|| TicketError("no ROLE@ part".into()))?;
        let role = match role {
            "worker" => Role::Worker,
            "client" => Role::Client,
            "viewer" => Role::Viewer,
            other => return Err(TicketError(format!("unknown role `{}`", shown(other)))),
        };
        let (addr, query) = rest
            .split_once("/?")
            .ok_or_else(|| TicketError("no /?fp=… part".into()))?;
        let mut addrs = Vec::new();
        for addr in addr.split(',') {
            if addrs.len() == MAX_ADDRS {
                return Err(TicketError(format!(
                    "more than {MAX_ADDRS} coordinator addresses"
                )));
            }
            let addr: SocketAddr = addr
                .parse()
                .map_err(|_| TicketError(format!("bad address `{}`", shown(addr))))?;
            addrs.push(addr);
        }
        let addr = addrs.remove(0);
        let (mut fingerprint, mut secret) = (None, None);
        for pair in query.split('&') {
            match pair.split_once('=') {
                Some(("fp", v)) => fingerprint = Some(v.to_string()),
                Some(("secret", v)) => secret = Some(v.to_string()),
                // The key only: a misspelt `secret=` must not print the secret.
                _ => {
                    let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                    return Err(TicketError(format!("unexpected `{}=…`", shown(key))));
                }
            }
        }
        let fingerprint = fingerprint.ok_or_else(|| TicketError("no fp=".into()))?;
        let secret = secret.ok_or_else(|| TicketError("no secret=".into()))?;
        if fingerprint.len() != 64 || !fingerprint.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TicketError("the fingerprint is not 64 hex digits".into()));
        }
        if secret.is_empty() {
            return Err(TicketError("the secret is empty".into()));
        }
        Ok(Ticket {
            role,
            addr,
            also: addrs,
            fingerprint: fingerprint.to_ascii_lowercase(),
            secret,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = Ticket {
            role: Role::Worker,
            addr: "127.0.0.1:7700".parse().unwrap(),
            also: Vec::new(),
            fingerprint: "ab".repeat(32),
            secret: Ticket::new_secret(),
        };
        let line = t.to_string();
        assert!(!line.contains('\n'));
        assert_eq!(line.parse::<Ticket>().unwrap(), t);
        let v6 = Ticket {
            addr: "[::1]:9".parse().unwrap(),
            ..t
        };
        assert_eq!(v6.to_string().parse::<Ticket>().unwrap(), v6);
        let two = Ticket {
            also: vec![
                "10.0.0.2:7700".parse().unwrap(),
                "[::1]:7701".parse().unwrap(),
            ],
            ..v6
        };
        let line = two.to_string();
        assert!(
            line.contains("@[::1]:9,10.0.0.2:7700,[::1]:7701/?"),
            "{line}"
        );
        let back: Ticket = line.parse().unwrap();
        assert_eq!(back, two);
        assert_eq!(back.addrs().count(), 3);
    }

    #[test]
    fn errors_never_repeat_a_secret_or_a_megabyte() {
        let fp = "ab".repeat(32);
        let secret = "s3cr3t".repeat(10);
        let e = format!("tessera://worker@127.0.0.1:1/?fp={fp}&secrett={secret}")
            .parse::<Ticket>()
            .unwrap_err()
            .to_string();
        assert!(e.contains("secrett") && !e.contains("s3cr3t"), "{e}");
        let junk = "x".repeat(3 << 20);
        for line in [
            format!("tessera://worker@127.0.0.1:1/?fp={fp}&secret=a&{junk}=1"),
            format!("tessera://{junk}@127.0.0.1:1/?fp={fp}&secret=a"),
            format!("tessera://worker@{junk}/?fp={fp}&secret=a"),
        ] {
            let e = line.parse::<Ticket>().unwrap_err().to_string();
            assert!(e.len() < 300, "{} bytes", e.len());
        }
    }

    #[test]
    fn a_ticket_names_at_most_eight_coordinators() {
        let addrs = ["127.0.0.1:1"; 9].join(",");
        let line = format!("tessera://worker@{addrs}/?fp={}&secret=x", "ab".repeat(32));
        let e = line.parse::<Ticket>().unwrap_err().to_string();
        assert!(e.contains("more than 8"), "{e}");
        assert!(format!(
            "tessera://worker@127.0.0.1:1,/?fp={}&secret=x",
            "ab".repeat(32)
        )
        .parse::<Ticket>()
        .is_err());
    }

    #[test]
    fn garbage_is_refused_clearly() {
        let e = "hello".parse::<Ticket>().unwrap_err().to_string();
        assert!(e.starts_with("not a Tessera ticket"), "{e}");
        assert!("tessera://boss@127.0.0.1:1/?fp=00&secret=x"
            .parse::<Ticket>()
            .is_err());
    }
}
