//! The fleet: rents worker nodes from GPU providers when the queue needs
//! them, watches them, and returns them when it does not, within a budget.
//!
//! `provider` is the one boundary every provider adapter implements (local
//! processes, Docker containers, Vast.ai, RunPod, Lambda, Paperspace,
//! Kubernetes). The policy that decides what to rent never talks to a
//! provider directly; it sees offers and node states and asks for launches
//! and releases. `config` reads the fleet file, `policy` is the pure
//! autoscaling core, `sim` plays it on virtual time against a recorded
//! market, `local` and `docker` are
//! the adapters for this machine (the cloud adapters are in `providers`).

pub mod config;
pub mod docker;
pub mod local;
pub mod policy;
pub mod provider;
pub mod sim;
