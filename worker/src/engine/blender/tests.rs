//! The Blender engine's unit tests: progress lines, replies, evidence
//! checks and tile crops, without a real Blender.

use super::*;
use tessera_protocol::messages::StitchedPasses;

#[test]
fn progress_lines_are_parsed() {
    let line = "Fra:1 Mem:21.36M (Peak 23.04M) | Time:00:00.57 | Remaining:00:00.42 | Mem:3.07M, Peak:3.07M | Scene, ViewLayer | Sample 12/64";
    assert_eq!(parse_progress(line), Some((12, 64)));
    assert_eq!(
        parse_progress("Fra:1 Mem:21.36M | Scene | Synchronizing object | Cube"),
        None
    );
}

fn task(frame: u32, tile: [u32; 4], samples: (u32, u32)) -> TaskSpec {
    TaskSpec {
        task: tessera_protocol::messages::TaskRef {
            job: 1,
            index: 0,
            epoch: 1,
        },
        frame,
        tile: tessera_protocol::job::TileRect {
            x: tile[0],
            y: tile[1],
            width: tile[2],
            height: tile[3],
        },
        samples,
        total_samples: samples.1,
        unreal: None,
        finish: None,
    }
}

fn reply(json: &str) -> Rendered {
    let r: Reply = serde_json::from_str(json).unwrap();
    assert!(r.ok);
    r.rendered.unwrap()
}

#[test]
fn a_render_is_accepted_only_on_blenders_evidence() {
    let t = task(3, [8, 4, 40, 30], (0, 16));
    let good = r#"{"ok":true,"width":40,"height":30,"samples":16,"engine":"CYCLES","crop":[8,4,40,30],
        "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{"ViewLayer":16},"stamped":true}}"#;
    check_evidence(&reply(good), &t, (96, 64)).unwrap();
    let cases = [
        // The stamp names another frame, or none (an empty render).
        (
            good.replace(r#""frame":3"#, r#""frame":2"#),
            "stamped frame 2",
        ),
        (
            good.replace(r#""frame":3"#, r#""frame":null"#),
            "stamped frame (none)",
        ),
        // Cycles reports fewer samples than asked, or none at all.
        (
            good.replace(r#"{"ViewLayer":16}"#, r#"{"ViewLayer":4}"#),
            "samples per view layer",
        ),
        (
            good.replace(r#"{"ViewLayer":16}"#, "{}"),
            "samples per view layer",
        ),
        // The written file is not the frame's size.
        (
            good.replace(r#""width":96"#, r#""width":40"#),
            "output is 40x64",
        ),
        (
            good.replace(r#""channels":4"#, r#""channels":0"#),
            "no colour channels",
        ),
    ];
    for (json, want) in cases {
        let err = check_evidence(&reply(&json), &t, (96, 64)).unwrap_err();
        assert!(err.to_string().contains(want), "{err} / {want}");
    }
    // A sample range rendered as a subset (Blender 4.5+) is stamped with
    // the full render's count; one rendered from an offset, with its own.
    let range = task(3, [8, 4, 40, 30], (8, 16));
    let subset = good.replace(r#""samples":16,"#, r#""samples":8,"subset":true,"#);
    check_evidence(&reply(&subset), &range, (96, 64)).unwrap();
    let offset = good
        .replace(r#""samples":16,"#, r#""samples":8,"#)
        .replace(r#"{"ViewLayer":16}"#, r#"{"ViewLayer":8}"#);
    check_evidence(&reply(&offset), &range, (96, 64)).unwrap();
    let offset_claiming_all = good.replace(r#""samples":16,"#, r#""samples":8,"#);
    let err = check_evidence(&reply(&offset_claiming_all), &range, (96, 64)).unwrap_err();
    assert!(err.to_string().contains("samples per view layer"), "{err}");
    // Every pass the scene asks for must be in the file; passes Blender
    // adds of its own are no error.
    let ml = |held: &str| {
        good.replace(
            r#""stamped":true}"#,
            &format!(r#""stamped":true,"passes":{held}}},"asked_passes":["ViewLayer.Combined","ViewLayer.Depth","Second.Combined"]"#),
        )
    };
    let all =
        ml(r#"["Second.Combined","ViewLayer.Combined","ViewLayer.Depth","ViewLayer.Noisy Image"]"#);
    check_evidence(&reply(&all), &t, (96, 64)).unwrap();
    for (held, want) in [
        (
            r#"["Second.Combined","ViewLayer.Combined"]"#,
            "lacks the passes ViewLayer.Depth that the scene asks for (it holds Second.Combined, ViewLayer.Combined)",
        ),
        (
            r#"["ViewLayer.Combined"]"#,
            "lacks the passes ViewLayer.Depth, Second.Combined",
        ),
        ("null", "(it holds none)"),
    ] {
        let err = check_evidence(&reply(&ml(held)), &t, (96, 64)).unwrap_err();
        assert!(err.to_string().contains(want), "{err} / {want}");
    }
    // Eevee and Workbench stamp no samples; the frame still counts.
    let eevee = r#"{"ok":true,"width":96,"height":64,"samples":8,"engine":"BLENDER_EEVEE","crop":null,
        "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{},"stamped":true}}"#;
    check_evidence(&reply(eevee), &task(3, [0, 0, 96, 64], (0, 8)), (96, 64)).unwrap();
    let failed: Reply =
        serde_json::from_str(r#"{"ok":false,"error":"x","unsupported":true}"#).unwrap();
    assert!(failed.rendered.is_none() && failed.unsupported);
}

#[test]
fn a_finished_frame_is_accepted_without_a_samples_stamp_only_for_a_finishing_task() {
    let mut t = task(3, [0, 0, 96, 64], (0, 16));
    t.finish = Some(StitchedPasses {
        digest: tessera_protocol::Digest::of(b"passes"),
        size: 6,
    });
    // Composited, not rendered: Cycles stamps no samples.
    let finished = r#"{"ok":true,"width":96,"height":64,"samples":0,"engine":"CYCLES","crop":null,"finished":true,
        "evidence":{"width":96,"height":64,"channels":4,"frame":3,"samples":{},"stamped":true}}"#;
    check_evidence(&reply(finished), &t, (96, 64)).unwrap();
    let cases = [
        (
            finished.replace(r#""frame":3"#, r#""frame":2"#),
            "stamped frame 2",
        ),
        (
            finished.replace(
                r#""width":96,"height":64,"c"#,
                r#""width":48,"height":64,"c"#,
            ),
            "output is 48x64",
        ),
        // A render's reply to a finishing task, and the other way round.
        (
            finished.replace(r#""finished":true"#, r#""finished":false"#),
            "finishing task",
        ),
    ];
    for (json, want) in cases {
        let err = check_evidence(&reply(&json), &t, (96, 64)).unwrap_err();
        assert!(err.to_string().contains(want), "{want}: {err}");
    }
    t.finish = None;
    let err = check_evidence(&reply(finished), &t, (96, 64)).unwrap_err();
    assert!(err.to_string().contains("a finished frame"), "{err}");
}

#[test]
fn tiles_are_cut_out_of_the_frame_exactly() {
    let (w, h) = (9u32, 5u32);
    let px: Vec<u8> = (0..w * h * 2).map(|i| (i * 7 % 251) as u8).collect();
    let mut frame = Vec::new();
    {
        let mut e = png::Encoder::new(&mut frame, w, h);
        e.set_color(png::ColorType::GrayscaleAlpha);
        e.set_depth(png::BitDepth::Eight);
        e.write_header().unwrap().write_image_data(&px).unwrap();
    }
    let tile = crop_png(&frame, 2, 1, 4, 3).unwrap();
    let mut reader = png::Decoder::new(std::io::Cursor::new(tile))
        .read_info()
        .unwrap();
    let mut out = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut out).unwrap();
    assert_eq!(
        (info.width, info.height, info.color_type),
        (4, 3, png::ColorType::GrayscaleAlpha)
    );
    for row in 0..3usize {
        let src = ((1 + row) * w as usize + 2) * 2;
        assert_eq!(&out[row * 8..row * 8 + 8], &px[src..src + 8]);
    }
    assert!(crop_png(&frame, 6, 0, 4, 3)
        .unwrap_err()
        .to_string()
        .contains("outside"));
}

#[test]
fn gpu_slots_are_pinned_one_gpu_each() {
    assert_eq!(Device::Cpu.pin_env(1), None);
    assert_eq!(
        Device::Cuda.pin_env(1),
        Some(("CUDA_VISIBLE_DEVICES", "1".into()))
    );
    assert_eq!(
        Device::Optix.pin_env(0),
        Some(("CUDA_VISIBLE_DEVICES", "0".into()))
    );
    assert_eq!(
        Device::Hip.pin_env(2),
        Some(("HIP_VISIBLE_DEVICES", "2".into()))
    );
    assert_eq!("optix".parse::<Device>(), Ok(Device::Optix));
    assert_eq!(Device::Cpu.slot_env(3), vec![]);
    assert_eq!(
        Device::Optix.slot_env(3),
        vec![
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
            ("CUDA_VISIBLE_DEVICES", "3".to_string())
        ]
    );
    assert!("metal"
        .parse::<Device>()
        .unwrap_err()
        .contains("expected auto, CPU, CUDA, OPTIX, HIP or ONEAPI"));
}
