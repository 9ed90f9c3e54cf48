//! The message enums. A connection opens one bidirectional *control* stream
//! and says `Hello`; after `Welcome::Accepted`, workers exchange
//! [`WorkerMsg`]/[`CoordMsg`] and clients send [`ClientRequest`]s, each
//! answered by one [`ClientResponse`]. Blob bytes travel on streams of their
//! own, each opened with a [`BlobRequest`] frame, so an upload never delays a
//! heartbeat.
//!
//! The types live in `worker`, `client`, `status` and `blob`; every one is
//! re-exported here, so `tessera_protocol::messages::X` names them all.

use serde::{Deserialize, Serialize};

mod blob;
mod client;
pub mod request;
mod status;
mod worker;

pub use blob::*;
pub use client::*;
pub use request::{answer, AnswerError, Request};
pub use status::*;
pub use worker::*;

/// Bumped whenever a message changes shape or meaning (11: a worker may
/// be assigned more tasks than it has slots, and renders at most its slots'
/// worth at once, the others queued in the order assigned; 12: job filters,
/// job details, retry and request-id conflicts for clients; 13: a job
/// may wait for others (`after`) or be submitted paused; 14: a manifest
/// file may belong to one frame, fetched only for that frame's tasks; 15:
/// a job's task time limit; 16: a joining worker says it is draining, and
/// a recorded failure is acknowledged; 17: a client's error carries its
/// [`ErrorKind`]; 19: every message after the handshake travels in a
/// versioned envelope of MessagePack with named fields, which skips the
/// fields it does not know, so a coordinator serves peers one version
/// behind (see [`crate::codec`]); 20: version 18's bincode peers are no
/// longer served, and fields are added with `#[serde(default)]`).
///
/// How to change a message. A version-19 peer reads and writes envelopes:
/// a field it does not know is skipped, one it does not send takes its
/// `#[serde(default)]`, so a new field needs no new version of its own
/// while [`MIN_PROTOCOL_VERSION`] is 19. The golden files in
/// `protocol/golden/v19/` (every message as version 19's envelope wrote
/// it) must keep decoding into today's types (`protocol/tests/golden.rs`,
/// and `tests/e2e/rolling_upgrade.rs` sends them to a real coordinator).
/// Never remove or rename a field, never change its type, and add an enum
/// variant only at the end and only where it is never sent to a peer that
/// does not know it. The next bump (to 21, dropping 19) takes three steps:
/// (1) write version 20's golden files (`TESSERA_WRITE_GOLDEN=1`, which
/// writes `PROTOCOL_VERSION`'s folder); (2) the tests then read
/// `MIN_PROTOCOL_VERSION`'s folder by themselves; (3) bump. `v18/` stays as
/// the record of version 18's bincode.
pub const PROTOCOL_VERSION: u32 = 20;

/// The oldest peer a coordinator of this release serves: one version
/// behind, so a farm upgrades node by node (coordinator first, then each
/// worker and client as it is restarted). An older one is refused with a
/// reason naming both versions.
pub const MIN_PROTOCOL_VERSION: u32 = PROTOCOL_VERSION - 1;

/// Whether a coordinator of this release serves a peer at `version`.
pub fn serves(version: u32) -> bool {
    (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Worker,
    Client,
    /// The dashboard's and the HTTP API's read-only role: it sees the farm
    /// and acts on nothing. Never admitted over QUIC.
    Viewer,
}

/// The first frame of every connection. Frozen forever in version 18's
/// layout (bincode, `version` first) so that any release reads any peer's
/// `Hello` and can say which version it speaks: never change it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub version: u32,
    pub role: Role,
    pub secret: String,
    pub name: String,
}

/// The answer to a [`Hello`]; frozen like it. `Accepted` names the
/// version the coordinator speaks on this connection from then on: the
/// peer's own, when it is one the coordinator serves.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Welcome {
    Accepted { version: u32 },
    Refused { reason: String },
}
