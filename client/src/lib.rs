//! The client library: everything a person's or a script's side of the
//! farm does, for the `tessera` CLI, its monitor and the tests. [`client`]
//! connects with a client ticket and speaks the client protocol (submit,
//! status, wait, cancel, fetch); [`blend`] and [`uproject`] find what a
//! scene needs, [`share`] decides what may be uploaded (project and asset
//! roots), [`openjd`] reads Open Job Description templates, [`follow`]
//! streams a job's progress and frames, [`frame_files`] names the files
//! frames are written to, [`report`] and [`shown`] print what users read,
//! and [`exit`] maps failures to the exit codes scripts rely on.

pub mod blend;
pub mod build;
pub mod client;
pub mod exit;
pub mod follow;
pub mod frame_files;
pub mod openjd;
pub mod progress;
pub mod report;
pub mod share;
pub mod shown;
pub mod unpack;
pub mod uproject;
