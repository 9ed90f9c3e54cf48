//! End-to-end tests: real coordinator and worker processes on 127.0.0.1,
//! real QUIC, real SQLite, real signals, real scenes. One binary; the cases
//! live in the modules below and share the harness.

mod addon;
mod address_validation;
mod after;
mod assets;
mod bad_input;
mod blender;
mod blender_builds;
mod blender_control;
mod blender_versions;
mod bounds;
mod contract;
mod doc_scripts;
mod durability;
mod faithful;
mod faults;
mod finishing;
mod fleet;
mod fleet_preempt;
mod flood;
mod formats;
mod harness;
mod hostile;
mod hostile_worker;
mod http_api;
mod http_limits;
mod identity;
mod job_events;
mod migration;
mod monitor;
mod openjd;
mod operate;
mod partition;
mod passes;
mod requires;
mod rolling_upgrade;
mod scripting;
mod sharing;
mod tiles;
mod trust;
mod unreal;
mod unreal_dedupe;
mod wan;
mod wan_check;
mod wan_faults;
