use super::*;

fn steps_of(yaml: &str) -> Result<Imported, String> {
    import(yaml, Path::new("/shots"), &[])
}

const TEMPLATE: &str = r#"
specificationVersion: jobtemplate-2023-09
name: "{{Param.Title}}"
parameterDefinitions:
- name: Title
  type: STRING
  default: Tree shot
- name: SceneFile
  type: PATH
  objectType: FILE
  dataFlow: IN
  default: tree.blend
- name: Last
  type: INT
  default: 3
- name: OutputDir
  type: PATH
  objectType: DIRECTORY
  dataFlow: OUT
  default: /renders
steps:
- name: Final
  dependencies:
  - dependsOn: Preview
  parameterSpace:
    taskParameterDefinitions:
    - name: Frame
      type: INT
      range: "1-{{Param.Last}}"
  script:
    actions:
      onRun:
        command: blender
        args: ["--background", "{{Param.SceneFile}}", "--render-output", "{{Param.OutputDir}}/frames/f-####", "--use-extension", "1", "--render-frame", "{{Task.Param.Frame}}"]
- name: Preview
  script:
    actions:
      onRun:
        command: bash
        args: ["{{Task.File.Run}}"]
    embeddedFiles:
    - name: Run
      type: TEXT
      data: |
        #!/usr/bin/env bash
        set -euo pipefail
        blender -b '{{Param.SceneFile}}' \
          --render-frame 2
"#;

#[test]
fn a_blender_template_maps_to_jobs_in_dependency_order() {
    let got = steps_of(TEMPLATE).unwrap();
    assert_eq!(got.name, "Tree shot");
    assert_eq!(
        got.steps,
        vec![
            Step {
                name: "Preview".into(),
                scene: "/shots/tree.blend".into(),
                frames: Some("2".into()),
                after: vec![],
                output: None,
                format: None,
                encode: None,
                host: None,
            },
            Step {
                name: "Final".into(),
                scene: "/shots/tree.blend".into(),
                frames: Some("1-3".into()),
                after: vec![0],
                output: Some(RenderOutput {
                    root: Some("/renders".into()),
                    subdir: "frames".into(),
                    name: "f-####".into(),
                    extension: true,
                }),
                format: None,
                encode: None,
                host: None,
            },
        ]
    );
    assert_eq!(got.output_dir, Some(PathBuf::from("/renders")));
    assert!(got.notes.is_empty(), "{:?}", got.notes);
    let more = import(
        TEMPLATE,
        Path::new("/shots"),
        &["Last=5".into(), "SceneFile=/abs/x.blend".into()],
    )
    .unwrap();
    assert_eq!(more.steps[1].frames.as_deref(), Some("1-5"));
    assert_eq!(more.steps[1].scene, PathBuf::from("/abs/x.blend"));
}

#[test]
fn what_cannot_be_mapped_is_refused_naming_its_field() {
    let cases: &[(&str, &str, &str)] = &[
        ("command: blender", "command: convert", "steps[0] (Final).script.actions.onRun.command: `convert` is not Blender or ffmpeg"),
        ("        set -euo pipefail\n", "        set -euo pipefail\n        convert x.png out.jpg\n", "steps[1] (Preview).script.embeddedFiles (Run): `convert x.png out.jpg` is not a Blender or ffmpeg command"),
        ("        set -euo pipefail\n", "        set -euo pipefail\n        ffmpeg -i x.png out.mp4\n", "steps[1] (Preview).script.embeddedFiles (Run): runs two commands"),
        ("command: blender", "command: ffmpeg", "steps[0] (Final).parameterSpace: an ffmpeg step encodes once"),
        ("      type: INT\n      range", "      type: STRING\n      range", "taskParameterDefinitions[0] (Frame).type: a STRING task parameter cannot be mapped"),
        ("\"--render-frame\", \"{{Task.Param.Frame}}\"", "\"--render-frame\", \"1\"", "the task parameter Frame is not used"),
        ("\"--background\",", "\"--python-expr\", \"x\",", "`--python-expr` runs Python"),
        ("- name: Preview\n", "- name: Preview\n  hostRequirements:\n    attributes:\n    - name: attr.custom.renderer\n      anyOf: [x]\n", "steps[1] (Preview).hostRequirements.attributes[0] (attr.custom.renderer): `attr.custom.renderer` cannot be mapped"),
        ("steps:\n", "jobEnvironments: []\nsteps:\n", "jobEnvironments: environments run their own commands"),
        ("- dependsOn: Preview", "- dependsOn: Nothing", "no step is named `Nothing`"),
        ("  default: 3\n", "\n", "parameterDefinitions[2] (Last): no default; pass --job-param Last=VALUE"),
        ("jobtemplate-2023-09", "jobtemplate-2099-01", "specificationVersion: `jobtemplate-2099-01` is not supported"),
        ("{{Param.OutputDir}}/frames", "/tmp/out", "`/tmp/out/f-####` lies outside the template's output directory"),
        ("{{Param.OutputDir}}/frames", "{{Param.OutputDir}}/../x", "climbs out of the output directory"),
        ("\"--use-extension\", \"1\"", "\"--use-extension\", \"yes\"", "`--use-extension yes`: expected 0 or 1"),
    ];
    for (from, to, want) in cases {
        assert!(TEMPLATE.contains(from), "{from}");
        let err = steps_of(&TEMPLATE.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(want), "{from} → {err}");
    }
    let cycle = TEMPLATE.replacen(
        "- name: Preview\n",
        "- name: Preview\n  dependencies:\n  - dependsOn: Final\n",
        1,
    );
    assert!(steps_of(&cycle).unwrap_err().contains("form a cycle"));
    let unknown = import(TEMPLATE, Path::new("/"), &["Nope=1".into()]).unwrap_err();
    assert!(unknown.contains("--job-param Nope: the template defines no such parameter"));
}

#[test]
fn render_output_patterns_name_frames_under_the_output_directory() {
    let dirs = [PathBuf::from("/renders")];
    let out = |p: &str, ext| render_output("f", p, &dirs, ext);
    let named = |p: &str| {
        let o = out(p, true).unwrap();
        (
            o.root.map(|r| r.to_string_lossy().into_owned()),
            o.subdir,
            o.name,
        )
    };
    assert_eq!(
        named("/renders/output_####"),
        (Some("/renders".into()), "".into(), "output_####".into())
    );
    assert_eq!(
        named("./frames/f-##"),
        (None, "frames".into(), "f-##".into())
    );
    assert_eq!(
        named("//shots/a/b_"),
        (None, "shots/a".into(), "b_####".into())
    );
    assert_eq!(
        named("/renders/seq/"),
        (Some("/renders".into()), "seq".into(), "####".into())
    );
    assert!(!out("f_####", false).unwrap().extension);
    assert!(out("/elsewhere/f_####", true)
        .unwrap_err()
        .contains("outside"));
    assert!(out("/renders/../etc/f_####", true)
        .unwrap_err()
        .contains("`..`"));
    assert!(out("a/../../f_####", true).unwrap_err().contains("`..`"));
}

#[test]
fn int_range_expressions_and_blender_frames_become_frame_lists() {
    assert_eq!(int_range_expr("1 - 5").unwrap(), vec![1, 2, 3, 4, 5]);
    assert_eq!(int_range_expr("1-10:4").unwrap(), vec![1, 5, 9]);
    assert_eq!(
        int_range_expr("10-15:2,1-3").unwrap(),
        vec![10, 12, 14, 1, 2, 3]
    );
    assert_eq!(int_range_expr("7").unwrap(), vec![7]);
    assert!(int_range_expr("-1 - 1")
        .unwrap_err()
        .contains("out of range"));
    assert_eq!(blender_frames("1..4,9").unwrap(), "1-4,9");
    assert!(blender_frames("-1").is_err());
    assert_eq!(frame_list(&[5, 1, 2, 3, 9]), "1-3,5,9");
}

#[test]
fn the_json_form_reads_too() {
    let json = r#"{"specificationVersion": "jobtemplate-2023-09", "name": "j",
          "steps": [{"name": "s", "script": {"actions": {"onRun": {"command": "/usr/bin/blender",
          "args": ["-b", "a.blend", "-a"]}}}}]}"#;
    let got = import(json, Path::new("/p"), &[]).unwrap();
    assert_eq!(got.steps[0].scene, PathBuf::from("/p/a.blend"));
    assert_eq!(got.steps[0].frames, None, "the file's own range");
}

#[test]
fn shell_lines_split_as_posix_and_what_only_a_shell_evaluates_is_refused() {
    let ok = |l: &str| shell_words(l).unwrap();
    assert_eq!(
        ok(r#"blender -b 'my scene.blend' -o "/out/f_####" \-f 1 # a comment"#),
        [
            "blender",
            "-b",
            "my scene.blend",
            "-o",
            "/out/f_####",
            "-f",
            "1"
        ]
    );
    assert_eq!(ok("echo 'a;b|c$d'"), ["echo", "a;b|c$d"]);
    assert_eq!(ok(r#"echo "a;b""#), ["echo", "a;b"]);
    assert_eq!(ok("echo a#b"), ["echo", "a#b"]);
    let err = |l: &str| shell_words(l).unwrap_err();
    assert_eq!(err("blender -f $FRAME"), "shell expansion cannot be mapped");
    assert_eq!(
        err(r#"blender -f "$FRAME""#),
        "shell expansion cannot be mapped"
    );
    assert_eq!(
        err("blender -f `seq 1`"),
        "shell expansion cannot be mapped"
    );
    assert_eq!(
        err("blender x.blend; rm -rf /"),
        "`;`: only one plain command can be mapped"
    );
    assert_eq!(
        err("blender x.blend > log"),
        "`>`: only one plain command can be mapped"
    );
    assert_eq!(err("blender 'x.blend"), "an unclosed quote");
}

/// A Deadline-style template: frames as a task parameter, `--render-format`,
/// `--render-output` under the output directory, host requirements, and an
/// ffmpeg step over the render step's frames.
const DEADLINE: &str = r#"
specificationVersion: jobtemplate-2023-09
name: Deadline
parameterDefinitions:
- {name: BlenderSceneFile, type: PATH, objectType: FILE, dataFlow: IN, default: shot.blend}
- {name: OutputDir, type: PATH, objectType: DIRECTORY, dataFlow: OUT, default: /renders}
- {name: OutputPattern, type: STRING, default: output_####}
- {name: Format, type: STRING, default: JPEG}
- {name: Frames, type: STRING, default: 1-3}
steps:
- name: EncodeVideo
  dependencies:
  - dependsOn: RenderBlender
  script:
    actions:
      onRun:
        command: ffmpeg
        args: [-y, -r, "24", -start_number, "1", -f, image2, -i, "{{Param.OutputDir}}/output_%04d.jpg", -c:v, libx264, -pix_fmt, yuv420p, -crf, "18", "{{Param.OutputDir}}/movies/shot.mp4"]
- name: RenderBlender
  parameterSpace:
    taskParameterDefinitions:
    - {name: Frame, type: INT, range: "{{Param.Frames}}"}
  hostRequirements:
    amounts:
    - {name: amount.worker.gpu, min: 1, max: 2}
    - {name: amount.worker.memory, min: 8192}
    attributes:
    - {name: attr.worker.os.family, anyOf: [linux]}
    - {name: attr.worker.cpu.arch, allOf: [x86_64]}
  script:
    actions:
      onRun:
        command: blender
        args: [--background, "{{Param.BlenderSceneFile}}", --render-output, "{{Param.OutputDir}}/{{Param.OutputPattern}}", --render-format, "{{Param.Format}}", --use-extension, "1", --render-frame, "{{Task.Param.Frame}}"]
"#;

/// A relative OutputDir (`out`) of a template named relatively (its folder
/// `.`): the frames go to `./out/output_0001.jpg`, never `./out/out/`.
#[test]
fn a_relative_output_dir_of_a_template_named_relatively_is_the_frames_own_folder() {
    let relative = DEADLINE.replace("default: /renders", "default: out");
    let got = import(&relative, Path::new("."), &[]).unwrap();
    let out = std::env::current_dir().unwrap().join("out");
    assert_eq!(got.output_dir.as_deref(), Some(out.as_path()));
    let render = got.steps[0].output.as_ref().unwrap();
    assert_eq!(render.root.as_deref(), Some(out.as_path()));
    assert_eq!(
        (render.subdir.as_str(), render.name.as_str()),
        ("", "output_####")
    );
    let movie = &got.steps[1].encode.as_ref().unwrap().movie;
    assert_eq!(movie.root.as_deref(), Some(out.as_path()));
    assert_eq!(movie.subdir, "movies");
}

#[test]
fn a_deadline_style_template_maps_its_format_encode_and_host_requirements() {
    use tessera_protocol::host::{Amount, HostNeeds};
    let got = steps_of(DEADLINE).unwrap();
    let (render, encode) = (&got.steps[0], &got.steps[1]);
    assert_eq!(render.name, "RenderBlender", "ordered by dependency");
    assert_eq!(render.format, Some(ImageFormat::Jpeg));
    assert_eq!(render.frames.as_deref(), Some("1-3"));
    assert_eq!(
        render.output,
        Some(RenderOutput {
            root: Some("/renders".into()),
            subdir: "".into(),
            name: "output_####".into(),
            extension: true,
        })
    );
    assert_eq!(
        render.host,
        Some(HostNeeds {
            gpus: Some(Amount {
                min: 1,
                max: Some(2)
            }),
            memory_mib: Some(Amount {
                min: 8192,
                max: None
            }),
            os: vec!["linux".into()],
            arch: vec!["x86_64".into()],
            ..HostNeeds::default()
        })
    );
    assert_eq!(encode.after, vec![0]);
    assert_eq!(
        encode.encode,
        Some(Encode {
            input: RenderOutput {
                root: Some("/renders".into()),
                subdir: "".into(),
                name: "output_####.jpg".into(),
                extension: false,
            },
            input_options: vec!["-r".into(), "24".into()],
            output_options: ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", "18"]
                .map(String::from)
                .to_vec(),
            movie: RenderOutput {
                root: Some("/renders".into()),
                subdir: "movies".into(),
                name: "shot.mp4".into(),
                extension: false,
            },
        })
    );
    for (format, want) in [
        ("PNG", ImageFormat::Png),
        ("OPEN_EXR", ImageFormat::OpenExr),
    ] {
        let other = DEADLINE.replace(
            "output_%04d.jpg",
            &format!("output_%04d.{}", format_extension(want)),
        );
        let got = import(&other, Path::new("/shots"), &[format!("Format={format}")]).unwrap();
        assert_eq!(got.steps[0].format, Some(want));
    }
}

#[test]
fn what_a_deadline_style_template_cannot_map_is_refused_naming_it() {
    let cases: &[(&str, &str, &str)] = &[
        ("-pix_fmt, yuv420p", "-vf, \"movie=/etc/passwd\"", "ffmpeg's `-vf` cannot be mapped"),
        ("-crf, \"18\"", "-crf, \"99\"", "`-crf 99`: not a value"),
        ("\"{{Param.OutputDir}}/output_%04d.jpg\"", "\"{{Param.OutputDir}}/other_%04d.jpg\"", "ffmpeg's input `/renders/other_####.jpg` is not the frames of step RenderBlender (`/renders/output_####.jpg`)"),
        ("\"{{Param.OutputDir}}/output_%04d.jpg\"", "\"{{Param.OutputDir}}/output_%04d.png\"", "is not the frames of step RenderBlender"),
        ("\"{{Param.OutputDir}}/output_%04d.jpg\"", "\"/tmp/output_%04d.jpg\"", "ffmpeg's input `/tmp/output_%04d.jpg` lies outside the template's output directory"),
        ("\"{{Param.OutputDir}}/output_%04d.jpg\"", "\"{{Param.OutputDir}}/output_%d.jpg\"", "the pattern is `%0Nd`"),
        ("\"{{Param.OutputDir}}/movies/shot.mp4\"", "\"/tmp/shot.mp4\"", "ffmpeg's output `/tmp/shot.mp4` lies outside"),
        ("\"{{Param.OutputDir}}/movies/shot.mp4\"", "\"{{Param.OutputDir}}/../shot.mp4\"", "climbs out of the output directory"),
        ("\"{{Param.OutputDir}}/movies/shot.mp4\"", "\"{{Param.OutputDir}}/shot.sh\"", "the movie's file name ends in one of .mp4"),
        ("-c:v, libx264,", "-i, \"/renders/output_%04d.jpg\", -c:v, libx264,", "a second input `-i` cannot be mapped"),
        ("  dependencies:\n  - dependsOn: RenderBlender\n", "", "steps (EncodeVideo).dependencies: an ffmpeg step depends on exactly one step"),
        ("default: JPEG", "default: TIFF", "`--render-format` `TIFF` is not a format Tessera writes frames in: JPEG, PNG or OPEN_EXR"),
        ("amount.worker.memory", "amount.worker.disk.scratch", "`amount.worker.disk.scratch` cannot be mapped"),
        ("anyOf: [linux]", "anyOf: [beos]", "`beos` is not one of linux, windows, macos"),
        ("allOf: [x86_64]", "allOf: [x86_64, arm64]", "a machine has one attr.worker.cpu.arch"),
        ("min: 1, max: 2", "min: 3, max: 2", "max is below min"),
        ("min: 1, max: 2", "min: 0, max: 0", "(amount.worker.gpu).max: 0 allows no machine"),
        ("min: 8192}", "min: 1e308}", "(amount.worker.memory).min: expected a number from 0 to 4294967295"),
        ("  hostRequirements:\n    amounts:\n    - {name: amount.worker.gpu, min: 1, max: 2}\n    - {name: amount.worker.memory, min: 8192}\n    attributes:\n    - {name: attr.worker.os.family, anyOf: [linux]}\n    - {name: attr.worker.cpu.arch, allOf: [x86_64]}\n", "  hostRequirements: {}\n", "hostRequirements: lists neither amounts nor attributes"),
        ("\"{{Param.OutputDir}}/movies/shot.mp4\"", "\"http://127.0.0.1:9/leak.mp4\"", "`http://127.0.0.1:9/leak.mp4` is not a movie file"),
        ("\"{{Param.OutputDir}}/movies/shot.mp4\"", "\"{{Param.OutputDir}}/a\\nb.mp4\"", "is not a movie file"),
        ("steps:\n", "x: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\nsteps:\n", "line 10: brackets nest deeper than 64"),
    ];
    for (from, to, want) in cases {
        assert!(DEADLINE.contains(from), "{from}");
        let err = steps_of(&DEADLINE.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(want), "{from} → {err}");
    }
    // A template may have 100 steps (each a job), not more.
    let step = &DEADLINE[DEADLINE.find("- name: RenderBlender").unwrap()..];
    let many = |n: usize| {
        let mut t = DEADLINE[..DEADLINE.find("- name: EncodeVideo").unwrap()].to_string();
        for i in 0..n {
            t.push_str(&step.replacen("RenderBlender", &format!("R{i}"), 1));
        }
        t
    };
    assert_eq!(steps_of(&many(100)).unwrap().steps.len(), 100);
    let err = steps_of(&many(101)).unwrap_err();
    assert!(
        err.contains("101 steps; a template may have at most 100"),
        "{err}"
    );
}
