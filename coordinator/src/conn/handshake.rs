//! The handshake: the QUIC handshake and a `Hello` on the first stream,
//! both within [`HELLO_DEADLINE`], the `Hello` read with the small
//! [`tessera_protocol::codec::MAX_HELLO_FRAME`] cap, checked against the tickets' secrets and the
//! enrolled workers' credentials ([`crate::identity`]), answered with
//! `Welcome`. A peer of this release's version or the one before is
//! accepted at its own version, and its control stream (and the blob
//! streams it opens) speak that version's encoding from then on. Until then the peer has the narrow pre-authentication
//! windows (see `transport::admit`); nothing it sent outlives the deadline.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tessera_protocol::codec::Codec;
use tessera_protocol::messages::{Hello, Welcome};
use tessera_protocol::text::{self, MAX_NAME};
use tessera_transport::{self as transport, Channel};

use super::gate::Pass;
use crate::identity::Admission;
use crate::server::Shared;

/// How long a peer has from its first packet to a checked `Hello`.
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// An admitted peer: its connection, how it was admitted (client, worker to
/// enroll, enrolled worker), its name (cut to [`MAX_NAME`]) and control
/// stream.
pub(super) struct Admitted {
    pub conn: quinn::Connection,
    pub admission: Admission,
    pub name: String,
    pub control: Channel,
}

/// Admits a peer, or `None` when it was refused (it has been told why) or
/// did not finish in time (its connection is closed). A refused peer's
/// `pass` is marked failed before it is told (its address must prove
/// itself at once, even to a client that reconnects the moment it reads
/// the refusal).
pub(super) async fn handshake(
    shared: &Arc<Shared>,
    incoming: quinn::Incoming,
    pass: &mut Option<Pass>,
) -> anyhow::Result<Option<Admitted>> {
    let conn = tokio::time::timeout(HELLO_DEADLINE, incoming)
        .await
        .context("no QUIC handshake within the hello deadline")??;
    match tokio::time::timeout(HELLO_DEADLINE, admit(shared, &conn, pass)).await {
        Ok(Ok(admitted)) => Ok(admitted),
        Ok(Err(e)) => {
            conn.close(1u32.into(), b"bad hello");
            Err(e)
        }
        Err(_) => {
            conn.close(1u32.into(), b"no hello in time");
            tracing::debug!(peer = %conn.remote_address(), "no hello within the deadline");
            Ok(None)
        }
    }
}

async fn admit(
    shared: &Arc<Shared>,
    conn: &quinn::Connection,
    pass: &mut Option<Pass>,
) -> anyhow::Result<Option<Admitted>> {
    let mut control = Channel::new(conn.accept_bi().await?);
    // At most MAX_HELLO_FRAME bytes, in version 18's layout.
    let hello: Hello = control
        .recv_handshake()
        .await?
        .context("closed before hello")?;
    let admitted = {
        let hello = hello.clone();
        shared
            .blocking(move |s| s.identities.admit(s.db().sql(), &hello))
            .await?
    };
    let admission = match admitted {
        Ok(admission) => admission,
        Err(reason) => {
            tracing::warn!(peer = %conn.remote_address(), "refused: {reason}");
            if let Some(pass) = pass.take() {
                pass.failed(std::time::Instant::now());
            }
            control.send_handshake(&Welcome::Refused { reason }).await?;
            let _ = control.send.finish();
            let _ = tokio::time::timeout(Duration::from_secs(2), control.send.stopped()).await;
            conn.close(1u32.into(), b"refused");
            return Ok(None);
        }
    };
    transport::admit(conn);
    // Admitted, so its version is one this release serves.
    let codec = Codec::for_version(hello.version).context("a version admitted unserved")?;
    control
        .send_handshake(&Welcome::Accepted {
            version: hello.version,
        })
        .await?;
    control.set_codec(codec);
    Ok(Some(Admitted {
        conn: conn.clone(),
        admission,
        name: text::truncate(&hello.name, MAX_NAME),
        control,
    }))
}
