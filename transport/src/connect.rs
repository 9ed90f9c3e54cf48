//! Connecting to a coordinator: the QUIC handshake with the ticket's pinned
//! certificate, `Hello` and its answer; with a ticket that names several
//! coordinators (a farm with a standby), all of them at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicClientConfig;
use tessera_protocol::codec::{Codec, CodecError};
use tessera_protocol::messages::{Hello, Welcome, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};
use tessera_protocol::ticket::Ticket;

use crate::{
    client_tls, endpoint, transport_config, Channel, Session, Timing, TransportError, SERVER_NAME,
};

/// Connects with `ticket`, pins the certificate, and says `Hello`.
pub async fn connect(
    ticket: &Ticket,
    name: &str,
    timing: Timing,
) -> Result<Session, TransportError> {
    connect_at(ticket, name, timing, PROTOCOL_VERSION).await
}

/// [`connect`], saying `Hello` at protocol `version` (an older peer's, for
/// tests of rolling upgrades): the session then speaks the encoding of the
/// version the coordinator accepts.
pub async fn connect_at(
    ticket: &Ticket,
    name: &str,
    timing: Timing,
    version: u32,
) -> Result<Session, TransportError> {
    if ticket.also.is_empty() {
        return connect_one(ticket, ticket.addr, name, timing, version).await;
    }
    // A farm with a standby: every coordinator at once, the first to
    // accept wins. A standby refuses at once (and is asked again every
    // half second: it may be taking over), a dead coordinator never
    // answers, so neither delays the one that serves.
    let deadline = tokio::time::Instant::now() + CONNECT_WITHIN;
    let mut attempts = tokio::task::JoinSet::new();
    for addr in ticket.addrs() {
        let (ticket, name) = (ticket.clone(), name.to_string());
        attempts.spawn(async move {
            let again = async {
                loop {
                    match connect_one(&ticket, addr, &name, timing, version).await {
                        Err(TransportError::Connect { .. })
                            if tokio::time::Instant::now() + ASK_AGAIN < deadline =>
                        {
                            tokio::time::sleep(ASK_AGAIN).await;
                        }
                        outcome => return outcome,
                    }
                }
            };
            tokio::time::timeout_at(deadline, again)
                .await
                .unwrap_or_else(|_| {
                    Err(TransportError::Connect {
                        addr,
                        reason: format!("no answer within {} s", CONNECT_WITHIN.as_secs()),
                    })
                })
        });
    }
    let mut failures = Vec::new();
    while let Some(attempt) = attempts.join_next().await {
        match attempt {
            Ok(Ok(session)) => return Ok(session),
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(TransportError::Lost(e.to_string())),
        }
    }
    // What a person can act on first: a refusal says more than silence.
    failures.sort_by_key(|e| match e {
        TransportError::Version(_) => 0,
        TransportError::Refused(_) => 1,
        _ => 2,
    });
    // None could be reached: say so of each.
    let unreachable: Vec<String> = (failures.iter())
        .filter_map(|e| match e {
            TransportError::Connect { addr, reason } => Some(format!("{addr}: {reason}")),
            _ => None,
        })
        .collect();
    if unreachable.len() == failures.len() && failures.len() > 1 {
        return Err(TransportError::Connect {
            addr: ticket.addr,
            reason: format!(
                "none of the ticket's {} coordinators answered ({})",
                failures.len(),
                unreachable.join("; ")
            ),
        });
    }
    Err(failures
        .into_iter()
        .next()
        .unwrap_or_else(|| TransportError::Lost("no coordinator address".into())))
}

/// How long a connection may take to be accepted.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// How soon a coordinator of several that refused is asked again.
const ASK_AGAIN: Duration = Duration::from_millis(500);

/// [`connect_at`] to one of the ticket's addresses.
async fn connect_one(
    ticket: &Ticket,
    addr: SocketAddr,
    name: &str,
    timing: Timing,
    version: u32,
) -> Result<Session, TransportError> {
    let fail = |reason: String| TransportError::Connect { addr, reason };
    let tls = client_tls(&ticket.fingerprint)?;
    let quic = QuicClientConfig::try_from(tls).map_err(|e| TransportError::Tls(e.to_string()))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport_config(timing));
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .unwrap();
    let mut endpoint = endpoint(bind, None).map_err(|e| fail(e.to_string()))?;
    endpoint.set_default_client_config(config);
    let connecting = endpoint
        .connect(addr, SERVER_NAME)
        .map_err(|e| fail(e.to_string()))?;
    let connection = tokio::time::timeout(CONNECT_WITHIN, connecting)
        .await
        .map_err(|_| fail("timed out after 10 s".into()))?
        .map_err(|e| fail(e.to_string()))?;
    let mut control = Channel::new(
        connection
            .open_bi()
            .await
            .map_err(|e| TransportError::Lost(e.to_string()))?,
    );
    control
        .send_handshake(&Hello {
            version,
            role: ticket.role,
            secret: ticket.secret.clone(),
            name: name.to_string(),
        })
        .await?;
    let welcome: Welcome = tokio::time::timeout(Duration::from_secs(10), control.recv_handshake())
        .await
        .map_err(|_| fail("no answer to hello within 10 s".into()))?
        .map_err(|e| match e {
            // A refusal closes the connection right after the reason.
            CodecError::Closed => TransportError::Refused("connection closed during hello".into()),
            other => TransportError::Codec(other),
        })?
        .ok_or_else(|| TransportError::Refused("connection closed during hello".into()))?;
    match welcome {
        Welcome::Accepted { version } => {
            // The coordinator speaks our version (or, were it to choose
            // an older one it knows we read, that one).
            let codec = Codec::for_version(version).ok_or_else(|| {
                TransportError::Version(format!(
                    "the coordinator accepted us at protocol version {version}, which this \
                     release does not speak (it speaks {PROTOCOL_VERSION} and \
                     {MIN_PROTOCOL_VERSION})"
                ))
            })?;
            control.set_codec(codec);
            Ok(Session {
                endpoint,
                connection,
                control,
            })
        }
        Welcome::Refused { reason } if reason.contains("version") => {
            Err(TransportError::Version(reason))
        }
        Welcome::Refused { reason } => Err(TransportError::Refused(reason)),
    }
}
