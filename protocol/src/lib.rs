//! The only crate that knows Tessera's wire: message enums, framing (a length
//! prefix plus bincode, with hard size caps), the blake3 [`Digest`], job
//! description types and join tickets. Everything else converts to and from
//! these types. No I/O: the QUIC transport that carries these messages is
//! `tessera-transport`, the stores that keep blobs `tessera-store`.

pub mod blender;
pub mod build;
pub mod chunk;
pub mod codec;
pub mod digest;
pub mod encode;
pub mod events;
pub mod float_tile;
pub mod host;
pub mod job;
pub mod messages;
pub mod names;
pub mod sums;
pub mod telemetry;
pub mod text;
pub mod ticket;
pub mod unreal;

pub use digest::Digest;
