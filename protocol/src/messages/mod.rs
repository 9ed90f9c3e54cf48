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
/// behind (see [`crate::codec`]).
///
/// How to change a message. While [`MIN_PROTOCOL_VERSION`] is 18, no
/// message may change its version-18 (bincode) shape: 18's peers are served
/// in bincode, which has no room for a new field, and the golden files in
/// `protocol/golden/v18/` fail (`UnexpectedEnd`) when a shape moved. A new
/// enum variant may be added at the end if it is never sent to a version-18
/// peer (see `conn/feed.rs`). So the first new field goes with the bump to
/// 20, which drops 18 (`MIN_PROTOCOL_VERSION` is always one behind), and
/// takes three steps: (1) before changing any message, write version 19's
/// golden files (`protocol/golden/v19/`: every message as this release's
/// envelope encodes it; the writer in `protocol/tests/golden.rs` writes
/// v18 today — point it at 19 and `Codec::Envelope`, never rerun it for
/// 18); (2) make the golden test and `tests/e2e/rolling_upgrade.rs` read
/// `MIN_PROTOCOL_VERSION`'s folder and codec; (3) bump, then add the field
/// with `#[serde(default)]` (the envelope skips fields it does not know and
/// defaults missing ones). From then on each change is just step 3, with
/// the previous version's golden files written first.
pub const PROTOCOL_VERSION: u32 = 19;

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
