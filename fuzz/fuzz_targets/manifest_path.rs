//! Manifest paths: whatever is accepted stays inside the job folder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_protocol::job::sanitize_manifest_path;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(parts) = sanitize_manifest_path(path) {
        assert!(!parts.is_empty());
        for part in parts {
            assert!(!part.is_empty() && part != "." && part != "..", "{path:?}");
            assert!(!part.contains('/') && !part.contains('\\') && !part.contains('\0'));
        }
    }
});
