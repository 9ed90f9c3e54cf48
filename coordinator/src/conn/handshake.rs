//! The handshake: a `Hello` on the first stream within a deadline, checked
//! against the tickets' secrets and the enrolled workers' credentials
//! ([`crate::identity`]), answered with `Welcome`.

use std::time::Duration;

use anyhow::Context;
use tessera_protocol::messages::{Hello, Welcome, PROTOCOL_VERSION};
use tessera_protocol::transport::Channel;

use crate::identity::Admission;
use crate::server::Shared;

/// How long a peer has to open its first stream.
const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Admits a peer: how (client, worker to enroll, enrolled worker), its name
/// and control stream, or `None` when it was refused (it has been told why).
pub(super) async fn handshake(
    shared: &Shared,
    conn: &quinn::Connection,
) -> anyhow::Result<Option<(Admission, String, Channel)>> {
    let mut control = Channel::new(
        tokio::time::timeout(HELLO_DEADLINE, conn.accept_bi())
            .await
            .context("no hello within 10 s")??,
    );
    let hello: Hello = control.recv().await?.context("closed before hello")?;
    let admitted = {
        let db = shared.db();
        shared.identities.admit(db.conn(), &hello)
    };
    let admission = match admitted {
        Ok(admission) => admission,
        Err(reason) => {
            tracing::warn!(peer = %conn.remote_address(), "refused: {reason}");
            control.send(&Welcome::Refused { reason }).await?;
            let _ = control.send.finish();
            let _ = tokio::time::timeout(Duration::from_secs(2), control.send.stopped()).await;
            conn.close(1u32.into(), b"refused");
            return Ok(None);
        }
    };
    control
        .send(&Welcome::Accepted {
            version: PROTOCOL_VERSION,
        })
        .await?;
    Ok(Some((admission, hello.name, control)))
}
