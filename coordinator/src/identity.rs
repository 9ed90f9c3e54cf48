//! Worker identities and the tickets' secrets. A worker joins once with the
//! shared worker ticket and is *enrolled*: it gets a credential of its own
//! (`ID.SECRET`, the secret stored here only as its blake3), which it keeps
//! in its cache folder and shows on every later join instead of the ticket.
//! That makes a worker revocable on its own (`tessera worker revoke NAME`:
//! its connections are closed at once and its credential is refused from
//! then on, across restarts) and lets the tickets be rotated while enrolled
//! workers go on working.
//!
//! A revoked name cannot be enrolled again. The shared ticket still admits
//! a *new* name until it is rotated, so revoke a machine you no longer
//! trust and rotate the tickets.

use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use tessera_protocol::messages::{serves, Hello, Role};
use tessera_protocol::ticket::Ticket;

use crate::data_dir::Tickets;
use crate::db::sql::{args, Sql};
use crate::db::DbError;

/// How a peer was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Client,
    /// A worker with the shared ticket: to be enrolled under its name.
    Enroll,
    /// An enrolled worker: its identity and the name it enrolled with.
    Enrolled {
        id: String,
        name: String,
    },
}

/// A fresh identity's credential, as the worker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub id: String,
    pub name: String,
    /// `ID.SECRET`: what the worker sends as its hello's secret.
    pub line: String,
}

/// The tickets' current secrets, and which connections each enrolled
/// identity has open (so a revocation can close them).
pub(crate) struct Identities {
    secrets: RwLock<Secrets>,
    connected: Mutex<HashMap<String, Vec<(u64, quinn::Connection)>>>,
    next_conn: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone)]
struct Secrets {
    worker: String,
    client: String,
    viewer: String,
}

/// What a secret shown to the HTTP API (a bearer, or a dashboard sign-in)
/// may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The client ticket's: everything a client may.
    Act,
    /// The viewer ticket's: look, never change anything.
    Look,
}

impl Access {
    pub fn name(self) -> &'static str {
        match self {
            Access::Act => "client",
            Access::Look => "viewer",
        }
    }
}

impl Secrets {
    fn of(t: &Tickets) -> Secrets {
        Secrets {
            worker: t.worker.secret.clone(),
            client: t.client.secret.clone(),
            viewer: t.viewer.secret.clone(),
        }
    }
}

/// Removes a registered connection when its session ends.
pub(crate) struct Registered<'a> {
    identities: &'a Identities,
    id: String,
    conn: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut connected = self.identities.connected();
        if let Some(conns) = connected.get_mut(&self.id) {
            conns.retain(|(c, _)| *c != self.conn);
            if conns.is_empty() {
                connected.remove(&self.id);
            }
        }
    }
}

impl Identities {
    pub fn new(tickets: &Tickets) -> Identities {
        Identities {
            secrets: RwLock::new(Secrets::of(tickets)),
            connected: Mutex::new(HashMap::new()),
            next_conn: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn connected(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(u64, quinn::Connection)>>> {
        self.connected.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn secrets(&self) -> Secrets {
        self.secrets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What `secret` may do over HTTP: the client ticket's acts, the
    /// viewer ticket's looks (each compared in constant time); `None` for
    /// any other.
    pub fn http_access(&self, secret: &str) -> Option<Access> {
        let secrets = self.secrets();
        let client = tessera_transport::constant_time_eq(secret, &secrets.client);
        let viewer = tessera_transport::constant_time_eq(secret, &secrets.viewer);
        match (client, viewer) {
            (true, _) => Some(Access::Act),
            (false, true) => Some(Access::Look),
            (false, false) => None,
        }
    }

    /// Replaces the tickets' secrets (the ticket files are written by the
    /// caller first).
    pub fn rotate(&self, tickets: &Tickets) {
        *self.secrets.write().unwrap_or_else(|e| e.into_inner()) = Secrets::of(tickets);
    }

    /// Checks a hello: the protocol version, then the secret against the
    /// tickets and, for a worker, the enrolled credentials. Returns how it
    /// was admitted, or the reason to send back.
    pub fn admit(&self, db: &Sql, hello: &Hello) -> Result<Admission, String> {
        let secrets = self.secrets();
        // The version and the tickets, as before identities.
        match tessera_transport::check_hello(hello, &secrets.worker, &secrets.client) {
            Ok(Role::Client) => Ok(Admission::Client),
            // check_hello refuses a viewer's hello; the arm keeps it so.
            Ok(Role::Viewer) => Err("a viewer ticket opens no QUIC session".into()),
            Ok(Role::Worker) => match revoked_name(db, &hello.name) {
                Ok(false) => Ok(Admission::Enroll),
                Ok(true) => Err(format!(
                    "worker name `{}` was revoked: it may not join this farm again",
                    hello.name
                )),
                Err(e) => Err(format!("cannot check the worker's name: {e}")),
            },
            Err(reason) if !serves(hello.version) || hello.role == Role::Client => Err(reason),
            Err(reason) => {
                let Some((id, secret)) = hello.secret.split_once('.') else {
                    return Err(reason);
                };
                match lookup(db, id, secret) {
                    Ok(Some(Lookup::Valid { name })) => Ok(Admission::Enrolled {
                        id: id.to_string(),
                        name,
                    }),
                    Ok(Some(Lookup::Revoked { name })) => Err(format!(
                        "worker `{name}` was revoked: it may not join this farm again"
                    )),
                    Ok(None) => Err(format!(
                        "{reason} (or an enrolled worker's credential, kept in its cache \
                         folder as `identity`; this one is unknown here)"
                    )),
                    Err(e) => Err(format!("cannot check the worker's credential: {e}")),
                }
            }
        }
    }

    /// Remembers an enrolled worker's connection until the returned guard
    /// drops.
    pub fn register(&self, id: &str, conn: quinn::Connection) -> Registered<'_> {
        let n = (self.next_conn).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.connected()
            .entry(id.to_string())
            .or_default()
            .push((n, conn));
        Registered {
            identities: self,
            id: id.to_string(),
            conn: n,
        }
    }

    /// Closes every connection of `ids` and waits (at most `within`) for
    /// their sessions to end. Returns how many were closed.
    pub async fn disconnect(&self, ids: &[String], within: Duration) -> u32 {
        let mut closed = 0;
        for id in ids {
            for (_, conn) in self.connected().get(id).into_iter().flatten() {
                conn.close(REVOKED.into(), b"this worker was revoked");
                closed += 1;
            }
        }
        let deadline = tokio::time::Instant::now() + within;
        while ids.iter().any(|id| self.connected().contains_key(id))
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        closed
    }
}

/// The QUIC close code of a revoked worker's connection.
pub const REVOKED: u32 = 3;

/// Enrolls a worker named `name`: a new identity and its credential.
pub fn enroll(db: &Sql, name: &str, now_ms: u64) -> Result<Credential, DbError> {
    let id = Ticket::new_secret()[..32].to_string();
    let secret = Ticket::new_secret();
    db.execute(
        "INSERT INTO worker_identities (id, name, secret_hash, enrolled_ms) VALUES (?1, ?2, ?3, ?4)",
        &args![&id, name, blake3::hash(secret.as_bytes()).as_bytes().as_slice(), now_ms as i64],
    )?;
    Ok(Credential {
        line: format!("{id}.{secret}"),
        id,
        name: name.to_string(),
    })
}

/// Revokes every identity enrolled as `name` (and the name itself); returns
/// their ids, empty when no worker was ever enrolled under that name.
pub fn revoke(db: &Sql, name: &str, now_ms: u64) -> Result<Vec<String>, DbError> {
    let rows = db.query(
        "SELECT id FROM worker_identities WHERE name = ?1",
        &args![name],
    )?;
    let ids = rows
        .iter()
        .map(|r| r.text(0))
        .collect::<Result<Vec<_>, _>>()?;
    db.execute(
        "UPDATE worker_identities SET revoked_ms = ?2 WHERE name = ?1 AND revoked_ms IS NULL",
        &args![name, now_ms as i64],
    )?;
    Ok(ids)
}

enum Lookup {
    Valid { name: String },
    Revoked { name: String },
}

fn lookup(db: &Sql, id: &str, secret: &str) -> Result<Option<Lookup>, DbError> {
    let row = db.query_opt(
        "SELECT name, secret_hash, revoked_ms FROM worker_identities WHERE id = ?1",
        &args![id],
    )?;
    let Some(row) = row else {
        return Ok(None);
    };
    let (name, hash, revoked) = (row.text(0)?, row.blob(1)?, row.opt_int(2)?);
    let given = blake3::hash(secret.as_bytes());
    // blake3::Hash compares in constant time.
    if hash.len() != 32 || given != blake3::Hash::from_bytes(hash.try_into().expect("32 bytes")) {
        return Ok(None);
    }
    Ok(Some(match revoked {
        Some(_) => Lookup::Revoked { name },
        None => Lookup::Valid { name },
    }))
}

fn revoked_name(db: &Sql, name: &str) -> Result<bool, DbError> {
    Ok(db
        .query_opt(
            "SELECT 1 FROM worker_identities WHERE name = ?1 AND revoked_ms IS NOT NULL LIMIT 1",
            &args![name],
        )?
        .is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(role: Role, secret: &str, name: &str) -> Hello {
        Hello {
            version: tessera_protocol::messages::PROTOCOL_VERSION,
            role,
            secret: secret.into(),
            name: name.into(),
        }
    }

    fn ticket(role: Role) -> Ticket {
        Ticket {
            role,
            addr: "127.0.0.1:1".parse().unwrap(),
            also: Vec::new(),
            fingerprint: "ab".repeat(32),
            secret: Ticket::new_secret(),
        }
    }

    fn tickets(w: &Ticket, c: &Ticket, v: &Ticket) -> Tickets {
        Tickets {
            worker: w.clone(),
            client: c.clone(),
            viewer: v.clone(),
        }
    }

    #[test]
    fn enroll_join_revoke_and_rotate() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::db::migrate(&mut conn).unwrap();
        let db = Sql::Sqlite(conn);
        let (w, c, v) = (
            ticket(Role::Worker),
            ticket(Role::Client),
            ticket(Role::Viewer),
        );
        let ids = Identities::new(&tickets(&w, &c, &v));
        assert_eq!(
            ids.admit(&db, &hello(Role::Worker, &w.secret, "a")),
            Ok(Admission::Enroll)
        );
        assert_eq!(
            ids.admit(&db, &hello(Role::Client, &c.secret, "x")),
            Ok(Admission::Client)
        );
        let cred = enroll(&db, "a", 1).unwrap();
        // The credential admits the worker under its enrolled name,
        // whatever name it says.
        assert_eq!(
            ids.admit(&db, &hello(Role::Worker, &cred.line, "other")),
            Ok(Admission::Enrolled {
                id: cred.id.clone(),
                name: "a".into()
            })
        );
        // A wrong secret for a real id, a credential as a client, garbage.
        let forged = format!("{}.{}", cred.id, Ticket::new_secret());
        assert!(ids.admit(&db, &hello(Role::Worker, &forged, "a")).is_err());
        assert!(ids
            .admit(&db, &hello(Role::Client, &cred.line, "a"))
            .is_err());
        assert!(ids.admit(&db, &hello(Role::Worker, "nope", "a")).is_err());
        // Rotation: the old tickets are refused, the credential still works.
        assert_eq!(ids.http_access(&c.secret), Some(Access::Act));
        assert_eq!(ids.http_access(&v.secret), Some(Access::Look));
        assert_eq!(ids.http_access(&w.secret), None);
        // A viewer ticket opens no QUIC session.
        assert!(ids
            .admit(&db, &hello(Role::Viewer, &v.secret, "v"))
            .is_err());
        let (w2, c2, v2) = (
            ticket(Role::Worker),
            ticket(Role::Client),
            ticket(Role::Viewer),
        );
        ids.rotate(&tickets(&w2, &c2, &v2));
        assert_eq!(ids.http_access(&v.secret), None);
        assert_eq!(ids.http_access(&c.secret), None);
        assert_eq!(ids.http_access(&v2.secret), Some(Access::Look));
        assert!(ids
            .admit(&db, &hello(Role::Worker, &w.secret, "b"))
            .is_err());
        assert!(ids
            .admit(&db, &hello(Role::Client, &c.secret, "x"))
            .is_err());
        assert_eq!(
            ids.admit(&db, &hello(Role::Worker, &w2.secret, "b")),
            Ok(Admission::Enroll)
        );
        assert!(ids
            .admit(&db, &hello(Role::Worker, &cred.line, "a"))
            .is_ok());
        // Revocation: the credential and the name are refused from now on.
        assert_eq!(revoke(&db, "a", 2).unwrap(), vec![cred.id.clone()]);
        let e = ids
            .admit(&db, &hello(Role::Worker, &cred.line, "a"))
            .unwrap_err();
        assert!(e.contains("revoked"), "{e}");
        let e = ids
            .admit(&db, &hello(Role::Worker, &w2.secret, "a"))
            .unwrap_err();
        assert!(e.contains("revoked"), "{e}");
        assert!(revoke(&db, "nobody", 3).unwrap().is_empty());
    }
}
