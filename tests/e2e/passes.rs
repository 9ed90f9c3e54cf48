//! Sample ranges of an OpenEXR scene end in the scene's own file: every
//! view layer and pass, its codec and its metadata, as Blender writes it
//! after a full render. Real Blender (Debian's 3.4), `#[ignore = "needs
//! blender"]` like the other Blender tests.

use crate::blender::{enabled, Project};
use crate::faithful::{derive, exr_content};
use crate::harness::Farm;

/// The `cycles.*.samples` stamps of an OpenEXR's header.
fn sample_stamps(path: &std::path::Path) -> Vec<(String, String)> {
    use exr::meta::attribute::AttributeValue;
    let meta = exr::meta::MetaData::read_from_file(path, false)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = &meta.headers[0];
    let mut stamps: Vec<(String, String)> = (header.shared_attributes.other.iter())
        .chain(header.own_attributes.other.iter())
        .filter_map(|(k, v)| match v {
            AttributeValue::Text(t) => Some((k.to_string(), t.to_string())),
            _ => None,
        })
        .filter(|(k, _)| k.starts_with("cycles.") && k.ends_with(".samples"))
        .collect();
    stamps.sort();
    stamps
}

#[test]
#[ignore = "needs blender"]
fn sample_ranges_of_a_multilayer_exr_arrive_with_every_pass_codec_and_metadata() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("blender-ranged-layers", &[]);
    let project = Project::make(&farm.dir, &[]);
    let name = "ranged.blend";
    derive(
        &project,
        name,
        &[
            "im = s.render.image_settings",
            "im.file_format = 'OPEN_EXR_MULTILAYER'",
            "im.color_depth = '32'",
            "im.exr_codec = 'PIZ'",
            "s.render.filepath = '//render/rg_####'",
            "second = s.view_layers.new('Second')",
            "for vl in s.view_layers:\n    vl.use_pass_z = True\n    vl.use_pass_normal = True",
        ],
    );
    let refs = farm.dir.join("refs");
    project.reference(name, &refs, &[2]);
    farm.add_worker_with("b1", &["--engine", "blender"]);
    farm.add_worker_with("b2", &["--engine", "blender"]);
    let out = farm.dir.join("out");
    let job = farm.json(&[
        "submit",
        &project.blend(name),
        "--frames",
        "2",
        "--tiles",
        "2x1",
        "--sample-ranges",
        "4",
        "--wait",
        "--json",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["tasks_total"], 8, "{job}");
    let (got, want) = (out.join("rg_0002.exr"), refs.join("ref_0002.exr"));
    let (got_ch, got_codec, got_keys) = exr_content(&got);
    let (want_ch, want_codec, want_keys) = exr_content(&want);
    let names = |c: &[(String, Vec<u32>)]| c.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got_ch), names(&want_ch), "channels");
    assert!(names(&want_ch).iter().any(|n| n == "Second.Depth.Z"));
    assert_eq!(got_codec, want_codec, "codec");
    assert_eq!(got_keys, want_keys, "metadata keys");
    assert_eq!(sample_stamps(&got), sample_stamps(&want), "samples stamped");
    // Merged ranges equal the full render up to float rounding in every
    // pass: the beauty and normals are means over the samples, depth is
    // sample 0's (Cycles' Z pass uses one sample).
    for ((n, g), (_, w)) in got_ch.iter().zip(&want_ch) {
        let max = (g.iter().zip(w))
            .map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs())
            .fold(0f32, f32::max);
        eprintln!("{n}: max abs difference {max:e}");
        assert!(max <= 1e-5, "{n}: max abs difference {max}");
        if n.contains(".Combined.") {
            assert!(w.iter().any(|&v| f32::from_bits(v) > 0.05), "{n} is black");
        }
    }
}
