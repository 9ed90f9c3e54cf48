//! The farm core: what the coordinator decides, with no I/O. Events come in
//! (a job submitted, a worker joined, a heartbeat, a result, the time
//! passing), actions go out (leases to send, frames to stitch, records to
//! write); `now` is always passed in. The coordinator shell moves data
//! between sockets, disk and this core; tests drive it on virtual time.
//!
//! [`scheduler`] picks tasks for slots (priorities, affinity, leases and
//! epochs); [`farm`] holds jobs, workers, dependencies, verification and
//! the events they raise; [`cost`] keeps the money.

pub mod cost;
pub mod farm;
pub mod scheduler;
