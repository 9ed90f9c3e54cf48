//! Render engines. Each engine turns one task (frame, tile rectangle, sample
//! range) of a job whose files are laid out in a local folder into bytes.

pub mod builtin;
