//! The fleet: rents worker nodes from GPU providers when the queue needs
//! them, watches them, and returns them when it does not, within a budget.
//!
//! `provider` is the one boundary every provider adapter implements (local
//! processes, Docker containers, Vast.ai, RunPod, Lambda, Paperspace,
//! Kubernetes). The policy that decides what to rent never talks to a
//! provider directly; it sees offers and node states and asks for launches
//! and releases. `config` reads the fleet file, `policy` is the pure
//! autoscaling core, `sim` plays it on virtual time against a recorded
//! market, `local` and `docker` are the adapters for this machine.
//!
//! `providers` holds the cloud adapters, each on the shared blocking client
//! in `http`; `boot` launches until a node boots, trying the next offer when
//! one never does; `preempt` drains the workers of nodes marked for
//! preemption.

pub mod boot;
pub mod config;
pub mod docker;
pub mod http;
pub mod local;
pub mod policy;
pub mod preempt;
pub mod provider;
pub mod providers;
pub mod sim;
pub mod state;
