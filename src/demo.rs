//! `tessera demo`: a whole farm on this machine in one command — a
//! coordinator and N workers as real processes on loopback, the sample scene
//! submitted in tiles, the stitched frames left in the output folder, and a
//! summary of how well the farm kept its workers busy.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use tessera_protocol::job::TileGrid;
use tessera_protocol::messages::JobState;

use crate::client::{self, Client, SubmitOptions};
use crate::progress::human_bytes;

/// The sample scene and its textures, built into the binary so the demo
/// runs from any folder.
const SCENE: (&str, &[u8]) = (
    "demo.scene.json",
    include_bytes!("../scenes/demo.scene.json"),
);
const TEXTURES: [(&str, &[u8]); 3] = [
    (
        "textures/bricks.png",
        include_bytes!("../scenes/textures/bricks.png"),
    ),
    (
        "textures/checker.png",
        include_bytes!("../scenes/textures/checker.png"),
    ),
    (
        "textures/wood.png",
        include_bytes!("../scenes/textures/wood.png"),
    ),
];

/// Kills the farm's processes and removes its scratch folder, however the
/// demo ends.
struct Farm {
    root: PathBuf,
    children: Vec<Child>,
}

impl Drop for Farm {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The Blender test-scene generator, built in for the Blender demo.
const MAKE_BLENDER_SCENES: &str = include_str!("../scenes/blender/make_scenes.py");

/// Makes the Blender sample project under `root` with the local Blender;
/// returns its `.blend`, or `None` when Blender is missing or fails.
fn blender_scene(root: &Path) -> Option<PathBuf> {
    let (exe, _) = tessera_worker::engine::blender::detect()?;
    let script = root.join("make_scenes.py");
    std::fs::create_dir_all(root).ok()?;
    std::fs::write(&script, MAKE_BLENDER_SCENES).ok()?;
    let project = root.join("blender-project");
    let status = Command::new(exe)
        .args(["-b", "--factory-startup", "--python"])
        .arg(&script)
        .args(["--", "--project"])
        .arg(&project)
        .arg("--external")
        .arg(root.join("blender-external"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()?;
    let blend = project.join("shot.blend");
    (status.success() && blend.is_file()).then_some(blend)
}

// Long because: the demo as a script (start a coordinator, start the
// workers, submit, wait, report), each step printing what it did.
pub async fn run(
    workers: u32,
    output: &Path,
    tiles: TileGrid,
    builtin_only: bool,
) -> anyhow::Result<i32> {
    let root = std::env::temp_dir().join(format!("tessera-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let mut farm = Farm {
        root: root.clone(),
        children: Vec::new(),
    };
    let scene_dir = root.join("scene");
    for (path, bytes) in std::iter::once(SCENE).chain(TEXTURES) {
        let dest = scene_dir.join(path);
        std::fs::create_dir_all(dest.parent().expect("has parent"))?;
        std::fs::write(&dest, bytes)?;
    }
    let exe = std::env::current_exe().context("cannot find the tessera executable")?;
    let data = root.join("coordinator");
    let log = |name: &str| -> anyhow::Result<Stdio> {
        Ok(std::fs::File::create(root.join(name))?.into())
    };

    let mut coordinator = Command::new(&exe)
        .args(["coordinator", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(log("coordinator.log")?)
        .spawn()
        .context("cannot start the coordinator")?;
    let stdout = coordinator.stdout.take().expect("piped");
    farm.children.push(coordinator);
    let mut first = String::new();
    let mut stdout = BufReader::new(stdout);
    stdout.read_line(&mut first)?;
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let Some(addr) = first
        .trim()
        .strip_prefix("tessera coordinator listening on ")
    else {
        bail!(
            "the coordinator did not start; see {}",
            root.join("coordinator.log").display()
        );
    };
    eprintln!("coordinator on {addr}");

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / workers as usize).max(1);
    for i in 1..=workers {
        let worker = Command::new(&exe)
            .args(["worker", "--ticket"])
            .arg(format!("@{}", data.join("worker.ticket").display()))
            .args([
                "--name",
                &format!("demo-worker-{i}"),
                "--threads",
                &threads.to_string(),
                "--cache-dir",
            ])
            .arg(root.join(format!("cache-{i}")))
            .stdout(Stdio::null())
            .stderr(log(&format!("worker-{i}.log"))?)
            .spawn()
            .context("cannot start a worker")?;
        farm.children.push(worker);
    }
    // Blender when it is installed, the builtin engine otherwise.
    let blend = if builtin_only {
        None
    } else {
        blender_scene(&root)
    };
    let (scene, engine) = match blend {
        Some(b) => (b, "blender"),
        None => (scene_dir.join(SCENE.0), "builtin"),
    };
    eprintln!("{workers} workers started ({threads} render threads each); engine: {engine}");

    let ticket =
        client::resolve_ticket(Some(&format!("@{}", data.join("client.ticket").display())))?;
    let mut client = Client::connect(&ticket).await?;
    let opts = SubmitOptions {
        scene,
        frames: None,
        tiles,
        sample_ranges: 1,
        samples: None,
        verify: 0,
        deadline: None,
        budget: None,
        task_timeout: None,
        name: Some("demo".into()),
        priority: 0,
        request_id: None,
        engine: None,
        allow_missing: false,
        builtin_frame_names: true,
        output_pattern: None,
        render_format: None,
        host: None,
        progress: true,
        blender: None,
        blender_python: None,
        unreal: Default::default(),
        after: Vec::new(),
        after_failure: Default::default(),
        paused: false,
        frame_files: Vec::new(),
        // The sample project's linked library and texture live in a folder
        // beside it, a studio's shared assets: named as an asset root.
        share: crate::share::ShareOptions {
            asset_roots: vec![(root.join("blender-external"), "the demo".into())],
            ..Default::default()
        },
    };
    let started = Instant::now();
    let submitted = client::submit(&mut client, &opts).await?.status;
    eprintln!(
        "job {} submitted: {} frames in {} tiles each",
        submitted.id, submitted.frames_total, tiles
    );
    let opts = crate::follow::WaitOptions {
        output: Some((output.to_path_buf(), true)),
        partial: false,
        timeout: None,
        progress: true,
    };
    let waited = crate::follow::wait(&ticket, Some(client), &[submitted.id], &opts).await?;
    let (status, files) = waited
        .jobs
        .into_iter()
        .next()
        .context("the demo job vanished")?;
    if status.state != JobState::Done {
        bail!(
            "the demo job ended {}: {}",
            status.state.name(),
            status.error.unwrap_or_default()
        );
    }
    let wall = started.elapsed().as_secs_f64();
    let makespan_ms =
        status.finished_unix_ms.unwrap_or(status.submitted_unix_ms) - status.submitted_unix_ms;
    let makespan = (makespan_ms as f64 / 1000.0).max(1e-3);
    let busy = status.render_ms as f64 / 1000.0;
    let efficiency = busy / f64::from(workers) / makespan;
    println!("Tessera demo");
    println!(
        "  frames            {} ({} in {})",
        files.len(),
        output.display(),
        human_bytes(
            files
                .iter()
                .filter_map(|f| f.metadata().ok())
                .map(|m| m.len())
                .sum()
        )
    );
    println!(
        "  tasks             {} ({} tiles per frame)",
        status.tasks_done,
        tiles.count()
    );
    println!("  workers           {workers}");
    println!("  wall time         {wall:.2} s (makespan {makespan:.2} s)");
    println!("  render time       {busy:.2} s summed over tasks");
    println!("  farm efficiency   {efficiency:.2} (Σ task time ÷ workers ÷ makespan)");
    Ok(0)
}
