//! A Deadline-style OpenJD template on a real farm with Debian's Blender
//! and real ffmpeg (`scenes/openjd/blender-ffmpeg.template.yaml`): frames
//! as a task parameter, `--render-format`, `--render-output
//! '{{Param.OutputDir}}/output_####'` with `--use-extension 1`, and an
//! ffmpeg step after the render step. The frames arrive in the asked
//! format under the template's output folder with the pattern's names;
//! the movie is encoded on the worker that has ffmpeg (never on the one
//! without) and decodes to one frame per rendered frame. PNG and OpenEXR
//! (tiled too) render with the same template less its encode step; tiled
//! JPEG is refused naming what works.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::blender_versions::make_project;
use crate::harness::{field, scenes, Farm};
use crate::requires::{require, Need};

/// `ffprobe`'s `-show_entries stream=ENTRIES` of the first video stream of
/// `path`, as `key=value` pairs.
fn probe(path: &Path, entries: &str, count: bool) -> Vec<(String, String)> {
    let mut cmd = Command::new("ffprobe");
    cmd.args(["-v", "error", "-select_streams", "v:0"]);
    if count {
        cmd.arg("-count_frames");
    }
    let out = cmd
        .args(["-show_entries", &format!("stream={entries}")])
        .args(["-of", "default=noprint_wrappers=1"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "ffprobe {}: {out:?}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn entry(probed: &[(String, String)], key: &str) -> String {
    (probed.iter())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no {key} in {probed:?}"))
}

/// One final status per step, as `submit --wait --json` prints them.
fn finals(out: &std::process::Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[ignore = "needs blender and ffmpeg"]
fn a_deadline_style_template_renders_jpeg_frames_and_encodes_them_with_ffmpeg() {
    require(Need::Blender);
    require(Need::Ffmpeg);
    let mut farm = Farm::start("openjd-encode", &[]);
    let project = make_project(None, &farm.dir);
    let template = project.join("blender-ffmpeg.template.yaml");
    std::fs::copy(
        scenes().join("openjd/blender-ffmpeg.template.yaml"),
        &template,
    )
    .unwrap();
    // Both render; only the first has ffmpeg.
    let with = farm.add_worker_with("b1", &["--engine", "blender"]);
    let without = farm.add_worker_env(
        "no-ffmpeg",
        &["--engine", "blender"],
        &[("TESSERA_FFMPEG", "/nonexistent/ffmpeg")],
    );
    farm.wait_workers(2);

    // No --output: under the template's OutputDir (project/renders).
    let got = finals(&farm.run(&["submit", template.to_str().unwrap(), "--wait", "--json"]));
    assert_eq!(got.len(), 2, "one final status per step");
    let (render, encode) = (&got[0], &got[1]);
    assert_eq!(
        (render["state"].as_str(), encode["state"].as_str()),
        (Some("done"), Some("done"))
    );
    assert_eq!(render["frames_total"], 3);
    assert_eq!(encode["after"][0], render["id"], "the step dependency");
    let renders = project.join("renders");
    for f in 1..=3 {
        let frame = renders.join(format!("output_{f:04}.jpg"));
        let bytes = std::fs::read(&frame).unwrap();
        assert!(
            bytes.starts_with(&[0xff, 0xd8, 0xff]),
            "{}: a JPEG",
            frame.display()
        );
        let p = probe(&frame, "codec_name,width,height", false);
        assert_eq!(
            (
                entry(&p, "codec_name"),
                entry(&p, "width"),
                entry(&p, "height")
            ),
            ("mjpeg".into(), "96".into(), "64".into()),
            "{}",
            frame.display()
        );
    }
    let movie = renders.join("shot.mp4");
    let p = probe(
        &movie,
        "codec_name,pix_fmt,nb_read_frames,width,height",
        true,
    );
    assert_eq!(entry(&p, "codec_name"), "h264");
    assert_eq!(entry(&p, "pix_fmt"), "yuv420p");
    assert_eq!(
        entry(&p, "nb_read_frames"),
        "3",
        "one movie frame per frame"
    );
    assert_eq!(
        (entry(&p, "width"), entry(&p, "height")),
        ("96".into(), "64".into())
    );
    // The encode ran on the worker with ffmpeg, never on the other.
    let encode_id = encode["id"].as_u64().unwrap();
    let ran_on = |i: usize| {
        (farm.log_of(i).lines())
            .filter(|l| l.contains("task rendered"))
            .any(|l| field(l, "job") == Some(encode_id))
    };
    assert!(ran_on(with) && !ran_on(without));

    // PNG and OpenEXR frames (one frame, the render step alone), whole and
    // tiled: named with their own extensions and in their own formats.
    let text = std::fs::read_to_string(&template).unwrap();
    let render_only = project.join("render-only.template.yaml");
    let cut = text.find("- name: EncodeVideo").unwrap();
    std::fs::write(&render_only, &text[..cut]).unwrap();
    for (format, tiles, ext, magic) in [
        ("PNG", "1x1", "png", &b"\x89PNG"[..]),
        ("OPEN_EXR", "1x1", "exr", &[0x76, 0x2f, 0x31, 0x01][..]),
        ("PNG", "2x1", "png", &b"\x89PNG"[..]),
        ("OPEN_EXR", "2x1", "exr", &[0x76, 0x2f, 0x31, 0x01][..]),
    ] {
        let out_dir = farm.dir.join(format!("out-{format}-{tiles}"));
        let got = finals(&farm.run(&[
            "submit",
            render_only.to_str().unwrap(),
            "--job-param",
            &format!("Format={format}"),
            "--job-param",
            "Frames=2",
            "--tiles",
            tiles,
            "--wait",
            "--json",
            "--output",
            out_dir.to_str().unwrap(),
        ]));
        assert_eq!(got[0]["state"], "done", "{format} {tiles}");
        let frame = out_dir.join(format!("output_0002.{ext}"));
        let bytes = std::fs::read(&frame).unwrap_or_else(|e| panic!("{}: {e}", frame.display()));
        assert!(bytes.starts_with(magic), "{}: a {format}", frame.display());
        let p = probe(&frame, "width,height", false);
        assert_eq!(
            (entry(&p, "width"), entry(&p, "height")),
            ("96".into(), "64".into())
        );
    }
    // JPEG cannot be stitched: tiled, it is refused naming what works.
    let out = farm.run(&["submit", render_only.to_str().unwrap(), "--tiles", "2x1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--render-format JPEG") && err.contains("--render-format PNG or OPEN_EXR"),
        "{err}"
    );
}
