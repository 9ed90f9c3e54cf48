//! Unreal jobs through Movie Render Queue, against a STAND-IN: Unreal
//! cannot be installed here, so every test in this file drives
//! `tests/unreal_standin.py` (a Python script that accepts exactly the
//! documented MRQ arguments, refuses any other, writes the frames it is
//! asked for and prints the log lines the adapter reads). Nothing here
//! shows that a real Unreal behaves the same.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::harness::Farm;
use crate::requires::{require, Need};

/// The stand-in for `UnrealEditor-Cmd`.
fn standin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/unreal_standin.py")
}

const SHOTS: &str = "sh010=1-6,sh020=7-12,sh030=13-18";

/// A stand-in project: three shots of a sequence, a map, a preset with
/// four frames of temporal history, and folders Unreal makes itself
/// (which must not travel).
fn project(dir: &Path, plugins: &[&str]) -> PathBuf {
    let write = |rel: &str, body: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    let plugins: Vec<Value> = (plugins.iter())
        .map(|p| serde_json::json!({"Name": p, "Enabled": true}))
        .collect();
    write(
        "Film.uproject",
        serde_json::json!({"FileVersion": 3, "Plugins": plugins})
            .to_string()
            .as_bytes(),
    );
    write(
        "Content/Seq/Main.uasset",
        b"StandInLevelSequence\nshots=sh010:1-6,sh020:7-12,sh030:13-18\n",
    );
    write("Content/Maps/Main.umap", b"StandInMap\n");
    write(
        "Content/Cine/Config.uasset",
        b"StandInMoviePipelinePrimaryConfig\nformat=png\nfile_name_format={sequence_name}.{frame_number}\nzero_pad=4\nengine_warm_up=2\nrender_warm_up=1\nhistory=4\n",
    );
    write(
        "Config/DefaultEngine.ini",
        b"[/Script/Engine.RendererSettings]\n",
    );
    for junk in [
        "Saved/Logs/Film.log",
        "Intermediate/Build/x.bin",
        "DerivedDataCache/a.ddp",
    ] {
        write(junk, &vec![7u8; 100_000]);
    }
    dir.join("Film.uproject")
}

/// The stand-in's continuous render of the whole sequence (no Tessera):
/// the documented command line without an executor.
fn continuous_render(uproject: &Path) -> PathBuf {
    let out = Command::new(standin())
        .arg(uproject)
        .args([
            "/Game/Maps/Main",
            "-game",
            "-LevelSequence=/Game/Seq/Main",
            "-MoviePipelineConfig=/Game/Cine/Config",
            "-resx=24",
            "-resy=16",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    uproject.parent().unwrap().join("Saved/MovieRenders")
}

/// The stand-in project's sequence, map and config as a job names them.
fn standin_job() -> tessera_protocol::unreal::UnrealJob {
    tessera_protocol::unreal::UnrealJob {
        level_sequence: "/Game/Seq/Main".into(),
        map: "/Game/Maps/Main".into(),
        config: "/Game/Cine/Config".into(),
        shots: vec![],
        chunk: 0,
        warm_up: 0,
        file_name_format: "{sequence_name}.{frame_number}".into(),
        zero_pad: 4,
    }
}

fn submit(farm: &Farm, uproject: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "submit",
        uproject.to_str().unwrap(),
        "--level-sequence",
        "/Game/Seq/Main",
        "--map",
        "/Game/Maps/Main",
        "--mrq-config",
        "/Game/Cine/Config",
        "--shots",
        SHOTS,
        "--resolution",
        "24x16",
        "--json",
    ];
    args.extend_from_slice(extra);
    farm.json(&args)
}

fn unreal_worker(farm: &mut Farm, name: &str, env: &[(&str, &str)]) -> usize {
    let editor = standin();
    farm.add_worker_env(
        name,
        &[
            "--engine",
            "unreal",
            "--unreal-editor",
            editor.to_str().unwrap(),
        ],
        env,
    )
}

#[test]
#[ignore = "needs python3"]
fn a_three_shot_sequence_split_into_chunks_on_two_workers_equals_the_continuous_render() {
    require(Need::Python3);
    let mut farm = Farm::start("unreal-shots", &[]);
    let uproject = project(&farm.dir.join("Film"), &[]);
    // Each worker's first task compiles shaders for 4 s (a line every
    // 0.2 s) while the silence limit is 3 s: shader progress is not a hang.
    // The compiled shaders stay in the worker's derived data cache. (A
    // limit under a second was too short at load: the stand-in's start
    // alone outlasted it, each worker was stopped as hung until the job
    // blocklisted both and waited, blocked, for a third.)
    std::fs::write(farm.dir.join("Film/Content/StandIn/ShaderCompile"), "8000")
        .or_else(|_| {
            std::fs::create_dir_all(farm.dir.join("Film/Content/StandIn"))?;
            std::fs::write(farm.dir.join("Film/Content/StandIn/ShaderCompile"), "8000")
        })
        .unwrap();
    let reference = continuous_render(&uproject);
    let silence = [("TESSERA_UNREAL_SILENCE_MS", "3000")];
    unreal_worker(&mut farm, "ue-a", &silence);
    unreal_worker(&mut farm, "ue-b", &silence);
    farm.wait_workers(2);
    // Chunks of 4 frames with 4 frames of warm-up: sh010 → 1-4, 5-6 (5
    // warmed up from the cut at 1), sh020 → 7-10, 11-12, sh030 → 13-16, 17-18.
    let job = submit(&farm, &uproject, &["--chunk", "4", "--warm-up", "4"]);
    assert_eq!(job["tasks_total"], 6, "{job}");
    assert_eq!(job["frames_total"], 18, "{job}");
    // Saved/, Intermediate/ and DerivedDataCache/ never travel.
    let travels: u64 = [
        "Film.uproject",
        "Content/Seq/Main.uasset",
        "Content/Maps/Main.umap",
        "Content/Cine/Config.uasset",
        "Content/StandIn/ShaderCompile",
        "Config/DefaultEngine.ini",
    ]
    .iter()
    .map(|f| {
        std::fs::metadata(farm.dir.join("Film").join(f))
            .unwrap()
            .len()
    })
    .sum();
    assert_eq!(job["bytes_uploaded"].as_u64().unwrap(), travels, "{job}");
    let out = farm.dir.join("out");
    let id = job["id"].as_u64().unwrap();
    let done = farm.wait_done(id, &out);
    assert_eq!(done["frames_done"], 18, "{done}");
    for frame in 1..=18 {
        let name = format!("Main.{frame:04}.png");
        let got = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = std::fs::read(reference.join(&name)).unwrap();
        assert!(got == want, "{name} differs from the continuous render");
    }
    for (i, name) in ["ue-a", "ue-b"].iter().enumerate() {
        let log = farm.log_of(i);
        assert!(
            log.contains("task rendered"),
            "{name} rendered nothing: {log}"
        );
        let ddc = farm
            .dir
            .join(format!("cache-{name}/unreal-ddc/Film/ShaderCache.ddp"));
        assert!(ddc.is_file(), "{name} kept no derived data cache");
    }
}

#[test]
#[ignore = "needs python3"]
fn each_slot_of_an_unreal_worker_renders_on_its_own_gpu() {
    require(Need::Python3);
    let mut farm = Farm::start("unreal-slots", &[]);
    let uproject = project(&farm.dir.join("Film"), &[]);
    let reference = continuous_render(&uproject);
    // A (stand-in) machine with two GPUs; each stand-in process records
    // the adapter it was given, the GPU it rendered on and the CUDA
    // devices it could see, and the first two wait for each other, so both
    // slots are busy at once.
    let seen = farm.dir.join("seen");
    let editor = standin();
    farm.add_worker_env(
        "ue-2gpu",
        &[
            "--engine",
            "unreal",
            "--unreal-editor",
            editor.to_str().unwrap(),
            "--slots",
            "2",
        ],
        &[
            ("TESSERA_TEST_STANDIN_GPU", "gpu0,gpu1"),
            ("TESSERA_TEST_STANDIN_SEEN", seen.to_str().unwrap()),
            ("TESSERA_TEST_STANDIN_SEEN_TOGETHER", "2"),
            // Secrets of the worker's own: never in a renderer's environment.
            ("TESSERA_TICKET", "client-ticket-secret"),
            ("VAST_API_KEY", "provider-key-secret"),
        ],
    );
    farm.wait_workers(1);
    let job = submit(&farm, &uproject, &[]);
    assert_eq!(job["tasks_total"], 3, "{job}");
    let out = farm.dir.join("out");
    let done = farm.wait_done(job["id"].as_u64().unwrap(), &out);
    assert_eq!(done["frames_done"], 18, "{done}");
    for frame in 1..=18 {
        let name = format!("Main.{frame:04}.png");
        let got = std::fs::read(out.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            got == std::fs::read(reference.join(&name)).unwrap(),
            "{name}"
        );
    }
    let records: Vec<Value> = std::fs::read_dir(&seen)
        .unwrap()
        .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect();
    assert_eq!(records.len(), 3, "{records:?}");
    let mut gpus: Vec<&str> = Vec::new();
    for r in &records {
        let adapter = r["adapter"].as_str().expect("a -graphicsadapter per slot");
        assert_eq!(r["gpu"], format!("gpu{adapter}"), "{r}");
        assert_eq!(r["CUDA_VISIBLE_DEVICES"], adapter, "{r}");
        gpus.push(r["gpu"].as_str().unwrap());
        // The stand-in's environment is the worker's allow-list and what
        // the engine set for it, nothing else.
        for (name, value) in r["environ"].as_object().unwrap() {
            // What a shell or pyenv shim between the worker and the
            // stand-in's Python adds on its own way through.
            let launcher = ["PWD", "SHLVL", "_", "OLDPWD"].contains(&name.as_str())
                || name.starts_with("PYENV_")
                || name.starts_with("_PYENV_");
            if launcher {
                continue;
            }
            let set_for_it = [
                "HOME",
                "TESSERA_MRQ_TASK",
                "UE-LocalDataCachePath",
                "TESSERA_RENDERER_OF",
                "TESSERA_RENDERER_WORKER",
            ];
            assert!(
                tessera_worker::child::allowed(name) || set_for_it.contains(&name.as_str()),
                "{name} reached the renderer: {r}"
            );
            assert!(!value.as_str().unwrap().contains("secret"), "{name}: {r}");
        }
    }
    gpus.sort();
    gpus.dedup();
    assert_eq!(
        gpus,
        ["gpu0", "gpu1"],
        "both slots rendered, each on its own GPU"
    );
}

#[test]
#[ignore = "needs python3"]
fn a_shader_compile_shows_in_status_as_the_tasks_progress() {
    require(Need::Python3);
    let mut farm = Farm::start("unreal-shader-progress", &[]);
    let uproject = project(&farm.dir.join("Film"), &[]);
    // 8000 shaders: the stand-in prints "Shaders left to compile N" every
    // 0.2 s for about 4 s (400 a step) before the first frame.
    let marker = farm.dir.join("Film/Content/StandIn");
    std::fs::create_dir_all(&marker).unwrap();
    std::fs::write(marker.join("ShaderCompile"), "8000").unwrap();
    unreal_worker(&mut farm, "ue-cold", &[]);
    farm.wait_workers(1);
    let job = submit(&farm, &uproject, &[]);
    let id = job["id"].as_u64().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut stages = Vec::new();
    loop {
        let all = farm.json(&["status", "--json"]);
        for w in all["workers"].as_array().unwrap() {
            for t in w["tasks"].as_array().unwrap() {
                if let Some(stage) = t["progress"]["stage"].as_str() {
                    assert_eq!(t["job"], id, "{t}");
                    assert_eq!(t["progress"]["done"], 0, "{t}");
                    stages.push(stage.to_string());
                }
            }
        }
        let state = all["jobs"][0]["state"].as_str().unwrap_or("").to_string();
        if state == "done" || state == "failed" {
            assert_eq!(state, "done", "{all}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{all}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let compiling: Vec<u64> = (stages.iter())
        .filter_map(|s| {
            s.strip_prefix("compiling shaders: ")?
                .strip_suffix(" left")?
                .parse()
                .ok()
        })
        .collect();
    assert!(!compiling.is_empty(), "no shader compile shown: {stages:?}");
    assert!(
        compiling.iter().all(|n| *n <= 8000 && n % 400 == 0),
        "{stages:?}"
    );
}

#[test]
#[ignore = "needs python3"]
fn a_chunk_without_warm_up_differs_from_the_continuous_render_and_with_it_equals_it() {
    require(Need::Python3);
    let dir = std::env::temp_dir().join(format!("tessera-standin-warm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let uproject = project(&dir, &[]);
    let reference = continuous_render(&uproject);
    let plugin = dir.join("Plugins/TesseraMRQ/Content/Python");
    std::fs::create_dir_all(&plugin).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("worker/src/engine/unreal/tessera_mrq_executor.py"),
        plugin.join("init_unreal.py"),
    )
    .unwrap();
    // Frames 3-4 of shot sh010, rendered from `start` on, as the executor
    // would be asked for them.
    let chunk = |start: u32| -> Vec<u8> {
        let out = dir.join(format!("chunk-{start}"));
        let task = dir.join(format!("task-{start}.json"));
        std::fs::write(
            &task,
            serde_json::json!({
                "level_sequence": "/Game/Seq/Main", "map": "/Game/Maps/Main",
                "config": "/Game/Cine/Config", "start_frame": start, "end_frame": 4,
                "output_directory": out,
            })
            .to_string(),
        )
        .unwrap();
        let args: Vec<String> = tessera_worker::engine::unreal::mrq_arguments(
            &uproject,
            &standin_job(),
            (24, 16),
            None,
        )
        .into_iter()
        .map(|a| a.value)
        .collect();
        let run = Command::new(standin())
            .args(&args)
            .env("TESSERA_MRQ_TASK", &task)
            .output()
            .unwrap();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stdout)
        );
        std::fs::read(out.join("Main.0003.png")).unwrap()
    };
    let want = std::fs::read(reference.join("Main.0003.png")).unwrap();
    assert!(
        chunk(3) != want,
        "a chunk started cold at frame 3 should lack the history"
    );
    assert!(
        chunk(1) == want,
        "warmed up from the cut, frame 3 is the continuous render's"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs python3"]
fn the_stand_in_refuses_undocumented_arguments_and_the_adapter_sends_only_documented_ones() {
    require(Need::Python3);
    let dir = std::env::temp_dir().join(format!("tessera-standin-args-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let uproject = project(&dir, &[]);
    let job = standin_job();
    let args = tessera_worker::engine::unreal::mrq_arguments(&uproject, &job, (1280, 720), None);
    let shown: Vec<(String, &str)> = args
        .iter()
        .skip(2)
        .map(|a| (a.value.clone(), a.doc))
        .collect();
    let mrq = tessera_worker::engine::unreal::DOC_MRQ_COMMAND_LINE;
    let cli = tessera_worker::engine::unreal::DOC_COMMAND_LINE;
    let off = tessera_worker::engine::unreal::DOC_RENDER_OFFSCREEN;
    let expected: Vec<(&str, &str)> = vec![
        ("-game", mrq),
        ("-LevelSequence=/Game/Seq/Main", mrq),
        ("-MoviePipelineConfig=/Game/Cine/Config", mrq),
        (
            "-MoviePipelineLocalExecutorClass=/Script/MovieRenderPipelineCore.MoviePipelinePythonHostExecutor",
            mrq,
        ),
        (
            "-ExecutorPythonClass=/Engine/PythonTypes.TesseraMoviePipelineExecutor",
            mrq,
        ),
        ("-windowed", mrq),
        ("-resx=1280", mrq),
        ("-resy=720", mrq),
        ("-RenderOffscreen", off),
        ("-Unattended", cli),
        ("-StdOut", cli),
        ("-log", mrq),
    ];
    let shown_ref: Vec<(&str, &str)> = shown.iter().map(|(v, d)| (v.as_str(), *d)).collect();
    assert_eq!(shown_ref, expected);
    // A worker with one slot per GPU adds slot i's adapter, documented too.
    let pinned =
        tessera_worker::engine::unreal::mrq_arguments(&uproject, &job, (1280, 720), Some(1));
    let last = pinned.last().unwrap();
    assert_eq!(
        (last.value.as_str(), last.doc),
        (
            "-graphicsadapter=1",
            tessera_worker::engine::unreal::DOC_GRAPHICS_ADAPTER
        )
    );
    assert_eq!(pinned.len(), args.len() + 1);
    assert_eq!(args[0].value, uproject.display().to_string());
    assert_eq!(args[1].value, "/Game/Maps/Main");
    let values: Vec<String> = args.iter().map(|a| a.value.clone()).collect();
    // The documented line with one more argument: refused, naming it.
    for extra in [
        "-ExecCmds=py evil.py",
        "-nosplash",
        "-MoviePipelineConfig",
        "--frames=1-3",
    ] {
        let mut with = values.clone();
        with.push(extra.into());
        let run = Command::new(standin()).args(&with).output().unwrap();
        assert_eq!(run.status.code(), Some(2), "{extra} accepted");
        let said = String::from_utf8_lossy(&run.stdout);
        assert!(said.contains("undocumented argument"), "{extra}: {said}");
    }
    // Tessera's executor (which only a real Unreal runs) is at least
    // valid Python.
    let executor = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("worker/src/engine/unreal/tessera_mrq_executor.py");
    let parse = Command::new("python3")
        .args(["-c", "import ast, sys; ast.parse(open(sys.argv[1]).read())"])
        .arg(&executor)
        .output()
        .unwrap();
    assert!(
        parse.status.success(),
        "{}",
        String::from_utf8_lossy(&parse.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs python3"]
fn unreal_errors_reach_status_readably_and_a_lost_gpu_is_retried_on_another_worker() {
    require(Need::Python3);
    let mut farm = Farm::start("unreal-errors", &[]);
    // A worker whose (stand-in) GPU is lost mid-render, and a healthy one.
    // Silence for 2 s counts as a hang here (10 minutes by default).
    let silence = ("TESSERA_UNREAL_SILENCE_MS", "2000");
    unreal_worker(
        &mut farm,
        "ue-badgpu",
        &[("TESSERA_TEST_STANDIN_GPU", "badgpu"), silence],
    );
    unreal_worker(&mut farm, "ue-good", &[silence]);
    farm.wait_workers(2);
    let case = |name: &str, tweak: &dyn Fn(&Path), plugins: &[&str]| {
        let dir = farm.dir.join(name);
        let uproject = project(&dir, plugins);
        std::fs::create_dir_all(dir.join("Content/StandIn")).unwrap();
        tweak(&dir);
        let job = submit(&farm, &uproject, &[]);
        job["id"].as_u64().unwrap()
    };
    let lost = case(
        "lost",
        &|d| std::fs::write(d.join("Content/StandIn/DeviceLost"), "badgpu").unwrap(),
        &[],
    );
    let plugin = case("plugin", &|_| {}, &["ShotFX"]);
    let map = case(
        "map",
        &|d| std::fs::write(d.join("Content/Maps/Main.umap"), "corrupt").unwrap(),
        &[],
    );
    let shaders = case(
        "shaders",
        &|d| {
            std::fs::write(d.join("Content/StandIn/ShaderCompile"), "1200").unwrap();
            std::fs::write(d.join("Content/StandIn/ShaderCompileCrash"), "").unwrap();
        },
        &[],
    );
    let hung = case(
        "hung",
        &|d| std::fs::write(d.join("Content/StandIn/Hang"), "").unwrap(),
        &[],
    );
    let ended = |job: u64| {
        farm.wait_for(job, "the job to end", |s| {
            matches!(s["state"].as_str(), Some("done" | "failed"))
        })
    };
    // Each fails every attempt; once both workers failed it too often the
    // job waits, blocked, with the readable error (a job fails outright
    // when its attempts run out first).
    for (job, says) in [
        (
            plugin,
            "the project needs the plugin `ShotFX`, which this worker's Unreal does not have",
        ),
        (map, "Unreal could not load the map `/Game/Maps/Main`"),
        (shaders, "while it was still compiling shaders (400 left)"),
        (
            hung,
            "Unreal printed nothing for 2 s and was stopped as hung",
        ),
    ] {
        let said = |s: &Value| {
            [&s["error"], &s["blocked"]]
                .iter()
                .any(|v| v.as_str().is_some_and(|e| e.contains(says)))
        };
        // `status JOB --json`, polled until it says so.
        let s = farm.wait_for(job, says, said);
        assert_ne!(s["state"], "done", "{s}");
    }
    // Three shots, one task each: the bad GPU loses its task, which is
    // rendered again by the other worker; the job completes.
    let s = ended(lost);
    assert_eq!(s["state"], "done", "{s}");
    let logs = farm.json(&["logs", &lost.to_string(), "--json"]);
    let text = logs.to_string();
    assert!(
        text.contains("the GPU was lost during the render"),
        "{text}"
    );
    assert!(text.contains("retried on another worker"), "{text}");
    assert!(
        farm.log_of(1).contains("task rendered"),
        "the good worker rendered nothing"
    );
}

#[test]
#[ignore = "needs python3"]
fn an_unreal_project_with_its_map_changed_by_one_percent_sends_about_the_changes_both_ways() {
    require(Need::Python3);
    // 24 MiB here; `cargo bench --bench unreal` runs the same on 2 GiB.
    let f = crate::unreal_dedupe::resubmit_with_the_map_edited("unreal-dedupe", 24);
    f.print();
    assert_eq!(f.first_uploaded, f.project_bytes);
    assert!(f.resubmit_uploaded >= f.changed, "edits lost?");
    assert!(
        f.resubmit_uploaded <= 3 * f.changed,
        "resubmit uploaded {}",
        f.resubmit_uploaded
    );
    assert_eq!(f.first_to_worker, f.project_bytes);
    assert!(f.resubmit_to_worker >= f.changed);
    assert!(
        f.resubmit_to_worker <= 3 * f.changed,
        "worker fetched {}",
        f.resubmit_to_worker
    );
}

/// A hostile worker offering Unreal answers a chunk task with a bundle
/// whose second frame carries another name: refused before a byte is
/// stored, counted as its failed attempt; the stand-in worker then renders
/// the chunk, and the frames are the continuous render's.
#[test]
#[ignore = "needs python3"]
fn a_bundle_with_frames_the_chunk_did_not_ask_for_is_refused_and_rendered_elsewhere() {
    use tessera_protocol::messages::{CoordMsg, WorkerMsg};
    use tessera_protocol::unreal::{Bundle, BundleFrame};
    use tessera_protocol::Digest;

    use crate::hostile::{blob_files, runtime, ticket};
    use crate::hostile_worker::rogue;
    require(Need::Python3);
    let mut farm = Farm::start("unreal-rogue", &[]);
    let uproject = project(&farm.dir.join("Film"), &[]);
    let reference = continuous_render(&uproject);
    let rt = runtime();
    let mut info = rogue::info(1, 0.0);
    info.engines = vec![tessera_protocol::job::Engine::Unreal];
    let mut s = rt.block_on(rogue::join(&ticket(&farm, "worker.ticket"), "rogue", info));
    farm.wait_workers(1);
    let job = submit(&farm, &uproject, &["--frames", "1-2"]);
    assert_eq!(job["tasks_total"], 1, "{job}");
    let before = blob_files(&farm);
    let png = std::fs::read(reference.join("Main.0001.png")).unwrap();
    let reason = rt.block_on(async {
        let spec = rogue::assignment(&mut s).await;
        let frame = |frame: u32, name: &str| BundleFrame {
            frame,
            name: name.into(),
            bytes: png.clone(),
        };
        let bundle = Bundle {
            frames: vec![frame(1, "Main.0001.png"), frame(2, "Evil.0002.png")],
        }
        .encode();
        let done = WorkerMsg::Done {
            task: spec.task,
            output: Digest::of(&bundle),
            render_ms: 1,
            inline: Some(bundle),
        };
        s.control.send(&done).await.unwrap();
        loop {
            if let Some(CoordMsg::Ack {
                task,
                accepted,
                reason,
            }) = rogue::next(&mut s).await
            {
                if task == spec.task {
                    assert!(!accepted, "a bundle with a wrong frame was accepted");
                    return reason.unwrap_or_default();
                }
            }
        }
    });
    assert!(reason.contains("`Evil.0002.png`"), "{reason}");
    assert_eq!(blob_files(&farm), before, "the refused bundle was stored");
    drop(s);
    unreal_worker(&mut farm, "ue", &[]);
    let out = farm.dir.join("out");
    farm.wait_done(job["id"].as_u64().unwrap(), &out);
    for name in ["Main.0001.png", "Main.0002.png"] {
        let got = std::fs::read(out.join(name)).unwrap();
        assert!(
            got == std::fs::read(reference.join(name)).unwrap(),
            "{name}"
        );
    }
}
