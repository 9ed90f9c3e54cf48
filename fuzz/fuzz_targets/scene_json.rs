//! Builtin scene files: parsed or refused, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_scan::builtin::Scene;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(scene) = Scene::parse(text) {
        let _ = scene.frame_range();
        let _ = scene.resolution();
        let _ = scene.texture_paths();
        let (first, _) = scene.frame_range();
        let _ = scene.camera_at(first);
    }
});
