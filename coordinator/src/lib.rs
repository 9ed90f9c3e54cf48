//! The Tessera coordinator: splits jobs into tasks, leases them to workers,
//! keeps every acknowledged job and result durable, stores assets by digest
//! and stitches finished tiles into frames.
//!
//! `farm` and `scheduler` (the `tessera-farm` crate) decide (no I/O, time
//! passed in); `server` wires
//! the rest: `conn` (one task per connection), `dispatch`, `commit`,
//! `stitcher`, `gc`, `identity` (enrolled workers, revocation, ticket
//! rotation), `upkeep` (scrub, checkpoints), `submit`, `data_dir`. `service` is what
//! clients may ask, under both APIs (QUIC `conn::client`, HTTP `http`).

pub use tessera_farm::{cost, farm, scheduler};

pub mod backup;
mod builds;
pub mod commit;
pub mod compare;
pub mod config;
mod conn;
mod data_dir;
pub mod db;
mod dispatch;
pub mod encode;
pub mod exr;
mod gc;
pub mod http;
pub mod identity;
pub mod lease;
pub(crate) mod query;
pub(crate) mod retry;
pub mod scratch_postgres;
pub mod server;
pub(crate) mod service;
pub(crate) mod shared;
pub mod stitch;
mod stitcher;
pub mod submit;
mod upkeep;
pub mod watch;
pub mod webhook;

/// The congestion controller QUIC connections use (`--congestion`).
pub use tessera_transport::{use_congestion, Congestion};
