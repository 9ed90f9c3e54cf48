//! The builtin engine's scene file (`*.scene.json`): its parser and checks
//! (`scene.rs`) and the vector math its values are in (`math.rs`). The
//! client reads a scene's frame range and textures from it before
//! uploading; the worker's builtin engine renders it.

pub mod math;
pub mod scene;

pub use scene::Scene;

/// Why a scene or one of its textures cannot be used; each says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum SceneError {
    /// The scene file could not be read.
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The JSON is malformed, or a field is unknown, missing or of the wrong type.
    #[error("{origin}: line {line}, column {column}: {message}")]
    Syntax {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    /// The scene parsed but a value makes no sense (e.g. an unknown material name).
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    /// A texture named by the scene could not be read or decoded.
    #[error("texture `{path}` (looked for {resolved}): {message}")]
    Texture {
        path: String,
        resolved: String,
        message: String,
    },
    /// Bytes that should be a PNG are not one.
    #[error("not a valid PNG: {0}")]
    Png(String),
}
