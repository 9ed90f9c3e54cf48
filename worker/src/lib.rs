//! The Tessera worker: joins a coordinator with a worker ticket, keeps a
//! content-addressed cache of job assets, and renders the tasks it is leased
//! with one of its engines.

pub mod builds;
pub mod cache;
pub mod child;
pub mod engine;
pub mod identity;
pub mod idle_exit;
pub mod run;
mod slots;
mod stamp;
pub mod tasks;
pub mod telemetry;

/// The congestion controller QUIC connections use (`--congestion`).
pub use tessera_transport::{use_congestion, Congestion};
