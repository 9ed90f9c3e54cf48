//! The dashboard's sessions. Signing in with the client or the viewer
//! ticket's secret gives a session: a random token in a cookie
//! (`HttpOnly`, `Secure`, `SameSite=Strict`, for [`LIFETIME`]) and a CSRF
//! token the page sends with every request that changes something (in
//! [`CSRF_HEADER`]). Sessions live in the coordinator's memory only: a
//! restart or `rotate-tickets` ends them all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hyper::header::{HeaderMap, HeaderValue, COOKIE};
use tessera_protocol::ticket::Ticket;

use crate::identity::Access;
use crate::shared::relock;

/// The session cookie's name.
pub const COOKIE_NAME: &str = "tessera_session";
/// The header a signed-in page sends its CSRF token in.
pub const CSRF_HEADER: &str = "x-tessera-csrf";
/// How long a session lasts from its sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// The most sessions of one role kept at once: past it, the oldest of
/// that role is ended (so viewers signing in never end a client's).
pub const MAX_SESSIONS: usize = 1024;

/// A signed-in session, as a request finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub access: Access,
    pub csrf: String,
}

struct Entry {
    session: Session,
    began: Instant,
    /// The order sessions began in (instants can tie).
    seq: u64,
}

/// Every session, by the blake3 of its token (the token itself is kept by
/// the browser alone).
#[derive(Default)]
pub struct Sessions {
    by_token: Mutex<HashMap<[u8; 32], Entry>>,
    next_seq: std::sync::atomic::AtomicU64,
}

fn key(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

impl Sessions {
    /// A new session for `access`: its token (for the cookie) and what the
    /// page is told.
    pub fn begin(&self, access: Access) -> (String, Session) {
        let token = Ticket::new_secret();
        let session = Session {
            access,
            csrf: Ticket::new_secret(),
        };
        let mut all = relock(&self.by_token);
        let now = Instant::now();
        all.retain(|_, e| now.duration_since(e.began) < LIFETIME);
        let same = all.values().filter(|e| e.session.access == access).count();
        if same >= MAX_SESSIONS {
            let oldest = (all.iter())
                .filter(|(_, e)| e.session.access == access)
                .min_by_key(|(_, e)| e.seq)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                all.remove(&k);
            }
        }
        all.insert(
            key(&token),
            Entry {
                session: session.clone(),
                began: now,
                seq: (self.next_seq).fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            },
        );
        (token, session)
    }

    /// The live session `token` names, if any.
    pub fn find(&self, token: &str) -> Option<Session> {
        let mut all = relock(&self.by_token);
        let k = key(token);
        let entry = all.get(&k)?;
        if entry.began.elapsed() >= LIFETIME {
            all.remove(&k);
            return None;
        }
        Some(entry.session.clone())
    }

    /// Ends the session `token` names (signing out).
    pub fn end(&self, token: &str) {
        relock(&self.by_token).remove(&key(token));
    }

    /// Ends every session; returns how many there were.
    pub fn end_all(&self) -> usize {
        let mut all = relock(&self.by_token);
        let n = all.len();
        all.clear();
        n
    }
}

/// The session token the request's cookies carry, if any.
pub fn token(headers: &HeaderMap) -> Option<&str> {
    (headers.get_all(COOKIE).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim())
}

/// Whether the request carries `session`'s CSRF token (compared in
/// constant time).
pub fn csrf_ok(headers: &HeaderMap, session: &Session) -> bool {
    (headers.get(CSRF_HEADER))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| tessera_transport::constant_time_eq(v, &session.csrf))
}

/// The `Set-Cookie` value that gives the browser `token`.
pub fn set_cookie(token: &str) -> HeaderValue {
    let value = format!(
        "{COOKIE_NAME}={token}; Path=/; Max-Age={}; HttpOnly; Secure; SameSite=Strict",
        LIFETIME.as_secs()
    );
    HeaderValue::from_str(&value).expect("a hex token")
}

/// The `Set-Cookie` value that makes the browser forget its session.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{COOKIE_NAME}=; Path=/; Max-Age=0; HttpOnly; Secure; SameSite=Strict"
    ))
    .expect("ascii")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_found_by_its_token_until_it_ends() {
        let sessions = Sessions::default();
        let (token, session) = sessions.begin(Access::Look);
        assert_eq!(sessions.find(&token), Some(session.clone()));
        assert_eq!(sessions.find("not-a-token"), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_str(&format!("a=b; {COOKIE_NAME}={token}; c=d")).unwrap(),
        );
        assert_eq!(super::token(&headers), Some(token.as_str()));
        assert!(!csrf_ok(&headers, &session));
        headers.insert(CSRF_HEADER, HeaderValue::from_str(&session.csrf).unwrap());
        assert!(csrf_ok(&headers, &session));
        sessions.end(&token);
        assert_eq!(sessions.find(&token), None);
        let (a, _) = sessions.begin(Access::Act);
        let (b, _) = sessions.begin(Access::Act);
        assert_eq!(sessions.end_all(), 2);
        assert_eq!((sessions.find(&a), sessions.find(&b)), (None, None));
    }

    #[test]
    fn past_the_limit_the_oldest_session_of_that_role_ends() {
        let sessions = Sessions::default();
        let (client, _) = sessions.begin(Access::Act);
        let (first, _) = sessions.begin(Access::Look);
        for _ in 1..MAX_SESSIONS {
            sessions.begin(Access::Look);
        }
        assert!(sessions.find(&first).is_some());
        let (newest, _) = sessions.begin(Access::Look);
        assert!(sessions.find(&first).is_none());
        assert!(sessions.find(&newest).is_some());
        // Viewers signing in never end a client's session.
        for _ in 0..MAX_SESSIONS {
            sessions.begin(Access::Look);
        }
        assert!(sessions.find(&client).is_some());
    }
}
