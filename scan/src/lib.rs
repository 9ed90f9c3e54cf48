//! What a scene needs, read on whichever machine holds it: the builtin
//! scene file format (`builtin`) and the `.blend` dependency scan that
//! Blender itself runs (`blender`). The client uses it to find what to
//! upload, the worker to render; neither reaches into the other.

pub mod blender;
pub mod blender_runtime;
pub mod builtin;
