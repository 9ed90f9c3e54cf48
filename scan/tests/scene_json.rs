//! Property tests of the builtin scene format: arbitrary text and mutated
//! real scenes parse or are refused with a reason, never a panic; what
//! parses can be asked for its frames, resolution and camera.

use proptest::prelude::*;
use tessera_scan::builtin::Scene;

const DEMO: &str = include_str!("../../scenes/demo.scene.json");
const TEXTURED: &str = include_str!("../../scenes/textured.scene.json");

fn use_parsed(text: &str) {
    if let Ok(scene) = Scene::parse(text) {
        let (first, last) = scene.frame_range();
        let _ = scene.resolution();
        let _ = scene.samples();
        let _ = scene.texture_paths();
        let _ = scene.camera_at(first);
        let _ = scene.camera_at(last);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_is_refused_or_parsed(text in "\\PC{0,200}") {
        use_parsed(&text);
    }

    #[test]
    fn mutated_scenes_are_refused_or_parsed(
        textured in any::<bool>(),
        edits in proptest::collection::vec((any::<usize>(), "[-0-9.e\"{}\\[\\],:a-z ]{0,4}"), 1..4),
    ) {
        let mut text = if textured { TEXTURED } else { DEMO }.to_string();
        // The scenes and the edits are ASCII: every index is a boundary.
        for (at, insert) in edits {
            let at = at % (text.len() + 1);
            let end = (at + insert.len()).min(text.len());
            text.replace_range(at..end, &insert);
        }
        use_parsed(&text);
    }

    #[test]
    fn any_numbers_in_a_real_scene_are_refused_or_parsed(
        width in any::<u32>(), height in any::<u32>(), samples in any::<u32>(),
        first in any::<u32>(), last in any::<u32>(), bounces in any::<u32>(),
    ) {
        let mut v: serde_json::Value = serde_json::from_str(DEMO).unwrap();
        v["resolution"] = serde_json::json!([width, height]);
        v["samples"] = serde_json::json!(samples);
        v["frames"] = serde_json::json!({ "start": first, "end": last });
        v["max_bounces"] = serde_json::json!(bounces);
        use_parsed(&v.to_string());
    }
}
