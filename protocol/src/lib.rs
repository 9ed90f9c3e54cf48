//! The only crate that knows Tessera's wire: message enums, framing (a length
//! prefix plus bincode, with hard size caps), the blake3 [`Digest`], job
//! description types, join tickets, and the QUIC transport with its version
//! handshake. Everything else converts to and from these types.

pub mod blender;
pub mod blob;
pub mod build;
pub mod chunk;
pub mod codec;
pub mod congestion;
pub mod digest;
pub mod events;
pub mod float_tile;
pub mod job;
pub mod messages;
pub mod store;
pub mod sums;
pub mod telemetry;
pub mod text;
pub mod ticket;
pub mod transport;
pub mod unreal;

pub use digest::Digest;
