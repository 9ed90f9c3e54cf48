//! The Tessera coordinator: splits jobs into tasks, leases them to workers,
//! keeps every acknowledged job and result durable, stores assets by digest
//! and stitches finished tiles into frames.

pub mod cost;
pub mod db;
pub mod exr;
pub mod scheduler;
pub mod server;
pub mod stitch;
