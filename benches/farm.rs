//! Farm benchmarks, run as real processes on 127.0.0.1 (`cargo bench --bench
//! farm`). Each prints its measured figures and the ratio to its target;
//! nothing here asserts a wall-clock time.
//!
//! (a) farm efficiency: (Σ task render time ÷ workers) ÷ makespan, for a
//!     builtin job of 128 tiles on 2 workers; and end to end, as the user
//!     sees it: the ideal (Σ task time ÷ workers) against the time from
//!     starting `tessera submit --wait --output` to its last frame
//!     downloaded, for 128 builtin tiles of about 1 s on 2 workers. Each
//!     with pipelined leases off (`coordinator --no-pipelining`) and on,
//!     side by side in one run;
//! (b) dispatch throughput: tasks per second through the coordinator with a
//!     no-op engine and 32 connected workers over real QUIC, pipelining
//!     off and on alternately;
//! (b2) dispatch-state: the same throughput (pipelining on) with the
//!     coordinator's state in SQLite and in PostgreSQL (`--state`, a
//!     scratch server here), alternating; target PostgreSQL >= 0.8x SQLite;
//! (c) Blender sessions: 16 tiles of one frame with a persistent Blender
//!     session vs one Blender process per task, both against a single
//!     full-frame render (needs `blender`);
//! (c2) Blender 4.5 sessions: the same on the official 4.5 LTS as the `bpy`
//!     module (`TESSERA_TEST_BPY`, default the CI venv), with the sample
//!     count raised until the full frame takes at least 5 s;
//! (d) recovery: the makespan of a job on 4 workers when one is SIGKILLed
//!     at half way, against the same job undisturbed and against the ideal
//!     (the work left, on 3 workers). The workers run the no-op engine with
//!     a fixed time per task, so that, like separate GPUs, they do not
//!     share this machine's 2 cores.
//! (e) memory: 10,000 one-task jobs through a coordinator; its resident
//!     memory once they are done against its resident memory after a
//!     restart on the same data dir (target: within 1.5x), and how long
//!     `status` for one job takes (target: under 50 ms);
//! (f) fan-out: a 1 GiB scene (a shared file and per-frame files, `submit
//!     --frame-files`) to 8 workers behind 100 Mbit/s WAN-bench paths: the
//!     time to the first finished frame against the bytes that frame needs
//!     over one link plus one task time (target: within 1.2x; needs root).
//! (g) idle sessions: the CPU a Blender 4.5 (`bpy`) worker's processes use
//!     while it has no task, for twice the idle window after a job, with
//!     sessions kept (`--session-idle 0`, the old behaviour) and ended after
//!     the window (`--session-idle 10s`), side by side.

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../tests/e2e/requires.rs"]
#[allow(dead_code)]
mod requires;
#[path = "../tests/e2e/wan.rs"]
#[allow(unused)]
mod wan;

use std::path::Path;
use std::time::Instant;

use harness::{rss_mib, scenes, Farm, State};

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    if run("efficiency") {
        efficiency();
    }
    if run("dispatch") {
        dispatch();
    }
    if run("dispatch-state") {
        dispatch_state();
    }
    if run("blender") {
        blender_sessions();
    }
    if run("blender45") {
        blender45_sessions();
    }
    if run("recovery") {
        recovery();
    }
    if run("memory") {
        memory();
    }
    if run("fanout") {
        fanout();
    }
    if run("fanout-store") {
        fanout_store();
    }
    if run("idle") {
        idle_sessions();
    }
}

/// CPU time (clock ticks) of `pid` and its children, reaped ones included,
/// and of every live process below it.
fn tree_ticks(pid: u32) -> u64 {
    let mut stats = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let f: Vec<u64> = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            // ppid; utime, stime, cutime, cstime (fields 4, 14-17).
            stats.push((p, f[1] as u32, f[11] + f[12] + f[13] + f[14]));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(stats.iter().filter(|s| s.1 == parent).map(|s| s.0));
        i += 1;
    }
    (stats.iter())
        .filter(|s| tree.contains(&s.0))
        .map(|s| s.2)
        .sum()
}

/// Idle sessions: a `bpy` 4.5 worker renders one small job, then has no
/// task for twice the idle window; the cores its processes keep busy
/// meanwhile, with sessions kept and with them ended after the window.
fn idle_sessions() {
    let bpy = std::env::var("TESSERA_TEST_BPY").unwrap_or_else(|_| {
        format!(
            "{}/.cache/tessera-ci/bpy-4.5.4/bin/python",
            std::env::var("HOME").unwrap_or_default()
        )
    });
    if !std::process::Command::new(&bpy)
        .args(["-c", "import bpy"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        println!("idle sessions: skipped (no bpy at {bpy}; set TESSERA_TEST_BPY)");
        return;
    }
    let window = std::time::Duration::from_secs(10);
    let tick = 100.0; // clock ticks per second (USER_HZ)
    let mut rows = Vec::new();
    for (mode, idle) in [
        ("kept (--session-idle 0)", "0"),
        ("ended (--session-idle 10s)", "10s"),
    ] {
        let mut farm = Farm::start("bench-idle", &[]);
        let blend = farm.dir.join("idle.blend");
        let src = format!(
            "import bpy\ns = bpy.context.scene\ns.render.engine = 'CYCLES'\ns.cycles.samples = 16\ns.render.resolution_x = 64\ns.render.resolution_y = 48\nbpy.ops.wm.save_as_mainfile(filepath={:?})\n",
            blend.to_str().unwrap()
        );
        let made = std::process::Command::new(&bpy)
            .args(["-I", "-c", &src])
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "{}",
            String::from_utf8_lossy(&made.stderr)
        );
        farm.add_worker_with(
            "b1",
            &[
                "--engine",
                "blender",
                "--blender-python",
                &bpy,
                "--session-idle",
                idle,
            ],
        );
        farm.wait_workers(1);
        let job = farm.json(&["submit", blend.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(job["state"], "done", "{job}");
        let pid = farm.worker_pid(0);
        let t0 = Instant::now();
        let at0 = tree_ticks(pid);
        std::thread::sleep(window);
        let (t1, at1) = (Instant::now(), tree_ticks(pid));
        std::thread::sleep(window);
        let at2 = tree_ticks(pid);
        let cores =
            |ticks: u64, since: Instant| ticks as f64 / tick / since.elapsed().as_secs_f64();
        let whole = cores(at2 - at0, t0);
        let after = cores(at2 - at1, t1);
        let sessions = farm
            .log_of(0)
            .matches("ending an idle blender session")
            .count();
        rows.push((mode, whole, after, sessions));
    }
    println!("idle sessions: a bpy 4.5 worker idle for {} s after one job (2x the 10 s window), CPU of its processes", 2 * window.as_secs());
    for (mode, whole, after, ended) in &rows {
        println!("  sessions {mode:28} {whole:6.3} cores busy over 20 s, {after:6.3} in its last 10 s   idle sessions ended: {ended}");
    }
    println!(
        "  ended / kept, over 20 s {:6.3}, in the last 10 s {:6.3}",
        rows[1].1 / rows[0].1.max(1e-9),
        rows[1].2 / rows[0].2.max(1e-9)
    );
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Fan-out: one scene of `TESSERA_BENCH_FANOUT_MIB` MiB (default 1024) to
/// 8 workers, each behind its own WAN-bench path of 100 Mbit/s and 20 ms
/// RTT. The scene is one file every task needs (1/16 of it) and a cache
/// of 60 per-frame files (`submit --frame-files`); the no-op engine takes
/// 1 s a task. The job is submitted paused (so the upload is done), then
/// resumed: the time from the resume to the first finished frame, against
/// the physical limit: the bytes that frame needs over one link plus one
/// task time (target: within 1.2x). `TESSERA_BENCH_FANOUT_WORKERS=N` for
/// another number of workers. Needs root for the bench.
fn fanout() {
    if let Some(why) = wan::unavailable() {
        println!("fan-out: skipped ({why})");
        return;
    }
    let workers = env_u64("TESSERA_BENCH_FANOUT_WORKERS").unwrap_or(8) as usize;
    const FRAMES: u64 = 60;
    let (mbit, rtt_ms, task_ms) = (100, 20, 1000);
    let total = env_u64("TESSERA_BENCH_FANOUT_MIB").unwrap_or(1024) << 20;
    let shared_len = total / 16;
    let frame_len = (total - shared_len) / FRAMES;
    let bench = wan::Bench::start(&vec![wan::Link::new(rtt_ms, 0.0, mbit); workers]);
    let mut farm = Farm::start_in(
        "bench-fanout",
        &[],
        Some(&bench.coordinator_ns),
        wan::COORDINATOR_IP,
    );
    let (scene, needs) = fanout_scene(&farm.dir.join("scene"), total);
    for (i, path) in bench.paths.iter().enumerate() {
        farm.add_worker_in(
            Some(&path.ns),
            &format!("w{i}"),
            &["--engine", "noop", "--noop-ms", &task_ms.to_string()],
            &[],
        );
    }
    farm.wait_workers(workers);
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--engine",
        "noop",
        "--frame-files",
        "cache/f_####.bin",
        "--paused",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap().to_string();
    // The job's events on one connection, so that nothing polls the
    // coordinator while the workers fetch (a `status` a few times a second
    // is a process and a QUIC handshake each: CPU the workers need here).
    let mut events = farm
        .command(&["events", "--job", &id, "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (finished_tx, finished) = std::sync::mpsc::channel();
    let stdout = events.stdout.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let event: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if event["type"] == "task.finished" && finished_tx.send(()).is_err() {
                return;
            }
        }
    });
    // Subscribed before the job starts.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let started = Instant::now();
    farm.run(&["resume", &id]);
    // Progress, and the mark a profiler of the fetch waits for.
    eprintln!("fan-out: job {id} resumed, waiting for its first frame");
    finished
        .recv_timeout(std::time::Duration::from_secs(900))
        .expect("fan-out never finished a task");
    // A frame of one tile is done once its task's result is in; the
    // figure is when `status` says so.
    let mut first = None;
    let eighth = loop {
        let status = farm.json(&["status", &id, "--json"]);
        let done = status["frames_done"].as_u64().unwrap();
        if done >= 1 && first.is_none() {
            first = Some(started.elapsed().as_secs_f64());
        }
        if done >= workers as u64 {
            break started.elapsed().as_secs_f64();
        }
        assert!(
            started.elapsed().as_secs() < 900,
            "fan-out never finished: {status}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = events.kill();
    let _ = events.wait();
    let first = first.unwrap();
    let rate = mbit as f64 * 1e6 / 8.0;
    let limit = needs as f64 / rate + task_ms as f64 / 1000.0;
    let whole = (total as f64) / rate + task_ms as f64 / 1000.0;
    println!(
        "fan-out: {:.0} MiB scene ({:.0} MiB every task needs, {FRAMES} frame files of {:.1} MiB, --frame-files), {workers} workers, each path {}",
        total as f64 / 1048576.0,
        shared_len as f64 / 1048576.0,
        frame_len as f64 / 1048576.0,
        bench.paths[0].link
    );
    println!(
        "  a frame needs             {:8.1} MiB  ({:.2} s over one link)",
        needs as f64 / 1048576.0,
        needs as f64 / rate
    );
    println!("  resume to first frame     {first:8.2} s");
    println!("  resume to {workers} frames done   {eighth:8.2} s");
    println!("  limit (bytes ÷ link + one {task_ms} ms task) {limit:8.2} s; waiting for the whole scene: {whole:.2} s");
    println!(
        "  first frame ÷ limit       {:8.3}  target <= 1.2  ({:.2}x target)",
        first / limit,
        1.2 / (first / limit)
    );
    // The job's other frames are not part of the figure.
    farm.run(&["cancel", &id]);
}

/// Fan-out from an object store: the same scene and workers as
/// [`fanout`], on a star whose hub is an S3-compatible store (Garage): each
/// worker behind its own 100 Mbit/s, 20 ms path to it, and the coordinator
/// behind one more such path (its uplink). Twice, side by side: the
/// assets in the coordinator's folder (every byte a worker needs crosses
/// the coordinator's uplink, shared by all), then in a bucket of the store
/// (`--blobs s3://…`: the workers fetch by the URLs the coordinator hands
/// out, each on its own path). The upload (and the copy to the bucket) is
/// done before the clock starts: the job is submitted paused. Printed:
/// resume to first frame against the limit (a frame's bytes over one link
/// plus one task): store-served target ≤ 1.3×, coordinator-served expected
/// near 8× at 8 workers. Needs root and Garage
/// (`TESSERA_TEST_GARAGE`); `TESSERA_BENCH_FANOUT_MIB` as for `fanout`.
fn fanout_store() {
    use tessera_store::scratch_garage::{self, ScratchGarage, BUCKET};
    if let Some(why) = wan::unavailable() {
        println!("fan-out from a store: skipped ({why})");
        return;
    }
    if scratch_garage::binary().is_none() {
        println!("fan-out from a store: skipped ({})", scratch_garage::NEEDED);
        return;
    }
    let workers = env_u64("TESSERA_BENCH_FANOUT_WORKERS").unwrap_or(8) as usize;
    let (mbit, rtt_ms, task_ms) = (100, 20, 1000);
    let total = env_u64("TESSERA_BENCH_FANOUT_MIB").unwrap_or(1024) << 20;
    let mut figures = Vec::new();
    for served_by in ["coordinator", "store"] {
        // One path more than workers: the last is the coordinator's.
        let bench = wan::Bench::start(&vec![wan::Link::new(rtt_ms, 0.0, mbit); workers + 1]);
        bench.route_between_paths();
        let uplink = &bench.paths[workers];
        let garage =
            ScratchGarage::start_in("fanout", Some(&bench.coordinator_ns), wan::COORDINATOR_IP)
                .expect("Garage starts in the hub");
        let mut args: Vec<String> = Vec::new();
        let mut env: Vec<(String, String)> = Vec::new();
        if served_by == "store" {
            args.extend(["--blobs".to_string(), format!("s3://{BUCKET}/fanout")]);
            env.extend(garage.env().into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut farm = Farm::start_in_with_env(
            &format!("bench-fanout-{served_by}"),
            &args,
            Some(&uplink.ns),
            &uplink.ip,
            &env,
        );
        let (scene, needs) = fanout_scene(&farm.dir.join("scene"), total);
        for (i, path) in bench.paths[..workers].iter().enumerate() {
            farm.add_worker_in(
                Some(&path.ns),
                &format!("w{i}"),
                &["--engine", "noop", "--noop-ms", &task_ms.to_string()],
                &[],
            );
        }
        farm.wait_workers(workers);
        let prepared = Instant::now();
        let job = farm.json(&[
            "submit",
            scene.to_str().unwrap(),
            "--engine",
            "noop",
            "--frame-files",
            "cache/f_####.bin",
            "--paused",
            "--json",
        ]);
        let id = job["id"].as_u64().unwrap().to_string();
        eprintln!(
            "fan-out ({served_by}-served): submitted in {:.1} s; resuming",
            prepared.elapsed().as_secs_f64()
        );
        let carried = |p: &wan::PathEnd| {
            use std::sync::atomic::Ordering::Relaxed;
            p.up.bytes.load(Relaxed) + p.down.bytes.load(Relaxed)
        };
        let carried_before = carried(&bench.paths[workers]);
        let started = Instant::now();
        farm.run(&["resume", &id]);
        let first = loop {
            let status = farm.json(&["status", &id, "--json"]);
            if status["frames_done"].as_u64().unwrap() >= 1 {
                break started.elapsed().as_secs_f64();
            }
            assert!(
                started.elapsed().as_secs() < 1200,
                "fan-out never finished: {status}"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        // What crossed the coordinator's uplink (both ways, frames with
        // their headers) from the resume to the first frame.
        let uplink_bytes = carried(&bench.paths[workers]) - carried_before;
        farm.run(&["cancel", &id]);
        figures.push((served_by, first, needs, uplink_bytes));
        drop(farm);
        drop(garage);
    }
    let rate = mbit as f64 * 1e6 / 8.0;
    println!(
        "fan-out from a store: {:.0} MiB scene, {workers} workers each behind {mbit} Mbit/s {rtt_ms} ms to the store, the coordinator behind one more such path",
        total as f64 / 1048576.0
    );
    for (served_by, first, needs, uplink) in &figures {
        let limit = *needs as f64 / rate + task_ms as f64 / 1000.0;
        println!(
            "  {served_by:>11}-served: resume to first frame {first:7.2} s = {:5.2} x the limit ({limit:.2} s: {:.1} MiB over one link + one task); coordinator's uplink carried {:.1} MiB meanwhile",
            first / limit,
            *needs as f64 / 1048576.0,
            *uplink as f64 / 1048576.0
        );
    }
    if let [(_, coordinator, ..), (_, store, needs, _)] = figures[..] {
        let limit = needs as f64 / rate + task_ms as f64 / 1000.0;
        println!(
            "  store-served ÷ limit {:.3} (target <= 1.3); coordinator-served ÷ store-served {:.2}",
            store / limit,
            coordinator / store
        );
    }
}

/// The fan-out scene in `dir`: one shared file of 1/16 of `total` and 60
/// per-frame files; returns the scene and the bytes one frame needs.
fn fanout_scene(dir: &std::path::Path, total: u64) -> (std::path::PathBuf, u64) {
    const FRAMES: u64 = 60;
    let shared_len = total / 16;
    let frame_len = (total - shared_len) / FRAMES;
    std::fs::create_dir_all(dir.join("cache")).unwrap();
    let mut textures = vec!["shared.bin".to_string()];
    std::fs::write(
        dir.join("shared.bin"),
        harness::noise(shared_len as usize, 1),
    )
    .unwrap();
    for f in 1..=FRAMES {
        let name = format!("cache/f_{f:04}.bin");
        std::fs::write(dir.join(&name), harness::noise(frame_len as usize, 100 + f)).unwrap();
        textures.push(name);
    }
    let materials: Vec<String> = (textures.iter().enumerate())
        .map(|(i, t)| format!(r#""m{i}": {{ "kind": "diffuse", "texture": "{t}" }}"#))
        .collect();
    let scene = dir.join("fanout.scene.json");
    std::fs::write(
        &scene,
        format!(
            r#"{{ "resolution": [64, 36], "samples": 1, "max_bounces": 1, "seed": 1,
  "frames": {{ "start": 1, "end": {FRAMES} }},
  "background": {{ "sky": {{ "horizon": [0.9, 0.9, 0.9], "zenith": [0.4, 0.6, 1.0] }} }},
  "camera": [{{ "frame": 1, "position": [0.0, 1.0, 6.0], "look_at": [0.0, 0.5, 0.0], "fov_deg": 40 }}],
  "materials": {{ {} }}, "objects": [] }}"#,
            materials.join(", ")
        ),
    )
    .unwrap();
    let needs = shared_len + frame_len + std::fs::metadata(&scene).unwrap().len();
    (scene, needs)
}

/// Asks for each job's status over one connection until all are done;
/// returns each request's latency in milliseconds.
async fn statuses_until_done(ch: &mut tessera_transport::Channel, ids: &[u64]) -> Vec<f64> {
    use tessera_protocol::messages::{ClientRequest, ClientResponse, JobState};
    let deadline = Instant::now() + std::time::Duration::from_secs(1800);
    let mut latencies = Vec::with_capacity(ids.len());
    for &id in ids {
        loop {
            let asked = Instant::now();
            ch.send(&ClientRequest::Status(Some(id))).await.unwrap();
            let answer = ch.recv::<ClientResponse>().await.unwrap();
            latencies.push(asked.elapsed().as_secs_f64() * 1000.0);
            match answer {
                Some(ClientResponse::Status { jobs, .. }) if jobs[0].state == JobState::Done => {
                    break
                }
                Some(ClientResponse::Status { .. }) => {
                    assert!(Instant::now() < deadline, "job {id} never finished");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                other => panic!("status of job {id}: {other:?}"),
            }
        }
    }
    latencies
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn memory() {
    use tessera_protocol::job::{Engine, JobSpec, ManifestEntry};
    use tessera_protocol::messages::{ClientRequest, ClientResponse};
    use tessera_transport::blob::{self, BlobSource};
    use tessera_transport::{self as transport, Timing};

    let jobs: u32 = std::env::var("TESSERA_BENCH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut farm = Farm::start("bench-memory", &[]);
    for i in 0..2 {
        farm.add_worker_with(&format!("noop-{i}"), &["--engine", "noop", "--slots", "8"]);
    }
    farm.wait_workers(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ticket = std::fs::read_to_string(farm.data.join("client.ticket")).unwrap();
    let ticket: tessera_protocol::ticket::Ticket = ticket.trim().parse().unwrap();
    let started = Instant::now();
    let ids: Vec<u64> = rt.block_on(async {
        let session = transport::connect(&ticket, "bench", Timing::default())
            .await
            .unwrap();
        // A scene and seven textures, as a small real job would name.
        let mut manifest = Vec::new();
        for f in 0..8u8 {
            let bytes = vec![f; 4096 + usize::from(f) * 1000];
            let digest = tessera_protocol::Digest::of(&bytes);
            let len = bytes.len() as u64;
            blob::put(&session.connection, digest, len, BlobSource::Bytes(&bytes))
                .await
                .unwrap();
            let path = if f == 0 {
                "shot/scene.json".to_string()
            } else {
                format!("shot/textures/texture_{f:02}.png")
            };
            manifest.push(ManifestEntry {
                path,
                digest,
                size: len,
                origin: Some(format!("/home/artist/projects/shot/file_{f}")),
                frame: None,
            });
        }
        let mut ch = session.control;
        let mut ids = Vec::new();
        for i in 0..jobs {
            let spec = JobSpec {
                manifest: manifest.clone(),
                resolution: (320, 180),
                ..JobSpec::new(format!("one-{i}"), Engine::Noop, "shot/scene.json")
            };
            ch.send(&ClientRequest::Submit(spec)).await.unwrap();
            match ch.recv::<ClientResponse>().await.unwrap() {
                Some(ClientResponse::Submitted(status)) => ids.push(status.id),
                other => panic!("submit: {other:?}"),
            }
        }
        statuses_until_done(&mut ch, &ids).await;
        ids
    });
    let all_done = started.elapsed().as_secs_f64();
    let pid = farm.coordinator_pid();
    let rss_done = rss_mib(pid);
    farm.kill_coordinator();
    farm.start_coordinator();
    // The same status pass on the restarted coordinator, timed.
    let mut latencies = rt.block_on(async {
        let session = transport::connect(&ticket, "bench", Timing::default())
            .await
            .unwrap();
        let mut ch = session.control;
        statuses_until_done(&mut ch, &ids).await
    });
    let rss_restarted = rss_mib(farm.coordinator_pid());
    latencies.sort_by(|a, b| a.total_cmp(b));
    // And as a script runs it: one `tessera status JOB --json` process.
    let mut cli: Vec<f64> = (0..10)
        .map(|i| {
            let id = ids[i * ids.len() / 10];
            let t = Instant::now();
            let out = farm.run(&["status", &id.to_string(), "--json"]);
            assert!(out.status.success());
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    cli.sort_by(|a, b| a.total_cmp(b));
    let ratio = rss_done / rss_restarted;
    println!("memory: {jobs} one-task jobs of 8 files, 320x180 (no-op engine, 2 workers x 8 slots), all done in {all_done:.1} s");
    println!("  coordinator RSS, all done        {rss_done:8.1} MiB");
    println!("  coordinator RSS, restarted       {rss_restarted:8.1} MiB");
    println!(
        "  done / restarted                 {ratio:8.2}x   target <= 1.5x  ({:.2}x target)",
        ratio / 1.5
    );
    println!(
        "  status JOB over a connection     median {:.2} ms, p99 {:.2} ms, max {:.2} ms  target < 50 ms",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        percentile(&latencies, 1.0)
    );
    println!(
        "  tessera status JOB --json        median {:.1} ms, max {:.1} ms (a whole process: start, QUIC handshake, answer)",
        percentile(&cli, 0.5),
        percentile(&cli, 1.0)
    );
}

/// Makespan (seconds) of a 256-task job on 4 workers taking 100 ms a task;
/// with `kill_at`, the first worker is SIGKILLed once that fraction of the
/// tasks is done. Returns the makespan and the fraction done at the kill.
fn makespan_on_four(name: &str, kill_at: Option<f64>) -> (f64, f64) {
    let mut farm = Farm::start(name, &[]);
    for i in 0..4 {
        farm.add_worker_with(
            &format!("gpu-{i}"),
            &["--engine", "noop", "--noop-ms", "100"],
        );
    }
    farm.wait_workers(4);
    let scene = scenes().join("spheres.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--engine",
        "noop",
        "--frames",
        "1",
        "--tiles",
        "16x16",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    let total = job["tasks_total"].as_u64().unwrap() as f64;
    let mut done_at_kill = 0.0;
    if let Some(fraction) = kill_at {
        let s = farm.wait_for(id, "half of the tasks", |s| {
            s["tasks_done"].as_u64().unwrap() as f64 >= fraction * total
        });
        farm.kill_worker(0);
        done_at_kill = s["tasks_done"].as_u64().unwrap() as f64 / total;
    }
    let done = farm.json(&["wait", &id.to_string(), "--json"]);
    assert_eq!(done["state"], "done");
    let secs = (done["finished_unix_ms"].as_u64().unwrap()
        - done["submitted_unix_ms"].as_u64().unwrap()) as f64
        / 1000.0;
    (secs, done_at_kill)
}

fn recovery() {
    let (undisturbed, _) = makespan_on_four("bench-recovery-calm", None);
    let (disturbed, f) = makespan_on_four("bench-recovery-kill", Some(0.5));
    // The ideal: the work done before the kill at the pace of 4 workers,
    // the rest at the pace of 3.
    let ideal = undisturbed * (f + (1.0 - f) * 4.0 / 3.0);
    let ratio = disturbed / ideal;
    println!("recovery: 256 tasks x 100 ms on 4 workers (no-op engine), 1 worker SIGKILLed");
    println!("  undisturbed makespan      {undisturbed:8.2} s");
    println!(
        "  killed at {:3.0}% done       {disturbed:8.2} s  ({:.3}x undisturbed)",
        f * 100.0,
        disturbed / undisturbed
    );
    println!(
        "  ideal (rest on 3 workers)  {ideal:7.2} s  ({:.3}x undisturbed)",
        ideal / undisturbed
    );
    println!("  measured / ideal          {ratio:8.3}  target <= 1.10");
}

/// The coordinator's arguments for pipelined leases on or off.
fn pipelining_args(on: bool) -> &'static [&'static str] {
    if on {
        &[]
    } else {
        &["--no-pipelining"]
    }
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on "
    } else {
        "off"
    }
}

fn efficiency() {
    for on in [false, true] {
        efficiency_makespan(on);
    }
    let samples = one_second_samples();
    let mut loopback = [0.0; 2];
    let mut far = [None; 2];
    let wan_missing = wan::unavailable();
    for on in [false, true] {
        loopback[usize::from(on)] = end_to_end(on, samples, None);
        if wan_missing.is_none() {
            far[usize::from(on)] = Some(end_to_end(on, samples, Some(80)));
        }
    }
    for on in [false, true] {
        let (near, far) = (loopback[usize::from(on)], far[usize::from(on)]);
        println!(
            "end to end, loopback, pipelining {}: {near:.3} of ideal  target >= 0.95",
            on_off(on),
        );
        match far {
            Some(f) => println!(
                "end to end, 80 ms RTT, pipelining {}: {f:.3} of ideal = {:.3} x loopback  target >= 0.95 x loopback",
                on_off(on),
                f / near
            ),
            None => println!(
                "end to end, 80 ms RTT: skipped ({})",
                wan_missing.as_deref().unwrap_or("")
            ),
        }
    }
}

/// Samples that make a demo-scene tile of a 4x4 grid render for about a
/// second on one thread here: 16 tiles of frame 1 at 32 samples, timed.
fn one_second_samples() -> u32 {
    if let Some(s) = std::env::var("TESSERA_BENCH_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return s;
    }
    let mut farm = Farm::start("bench-calibrate", &[]);
    farm.add_worker("w1");
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "4x4",
        "--samples",
        "32",
        "--wait",
        "--json",
    ]);
    let per_tile = job["render_ms"].as_u64().unwrap() as f64 / 16.0;
    ((32.0 * 1000.0 / per_tile.max(1.0)).round() as u32).max(1)
}

/// Submit to last frame downloaded, for 128 builtin tiles (8 frames x
/// 4x4) of about a second on 2 workers; returns the ideal over it.
fn end_to_end(on: bool, samples: u32, rtt_ms: Option<u64>) -> f64 {
    // Declared before the farm: its processes end before the namespaces.
    let bench = rtt_ms.map(|rtt| wan::Bench::start(&[wan::Link::new(rtt, 0.0, 1000); 2]));
    let mut farm = match &bench {
        Some(b) => Farm::start_in(
            "bench-e2e-wan",
            pipelining_args(on),
            Some(&b.coordinator_ns),
            wan::COORDINATOR_IP,
        ),
        None => Farm::start("bench-e2e", pipelining_args(on)),
    };
    for (i, name) in ["w1", "w2"].into_iter().enumerate() {
        let ns = bench.as_ref().map(|b| b.paths[i].ns.clone());
        farm.add_worker_in(ns.as_deref(), name, &[], &[]);
    }
    farm.wait_workers(2);
    let path = rtt_ms.map_or("loopback".to_string(), |r| format!("{r} ms RTT"));
    let scene = scenes().join("demo.scene.json");
    let out = farm.dir.join("frames");
    let samples = samples.to_string();
    let started = Instant::now();
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--tiles",
        "4x4",
        "--samples",
        &samples,
        "--wait",
        "--output",
        out.to_str().unwrap(),
        "--json",
    ]);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(job["state"], "done");
    let frames = std::fs::read_dir(&out).unwrap().count();
    assert_eq!(frames, 8, "every frame downloaded");
    let tasks = job["tasks_done"].as_u64().unwrap();
    let busy = job["render_ms"].as_u64().unwrap() as f64 / 1000.0;
    let ideal = busy / 2.0;
    let ratio = ideal / wall;
    println!(
        "end to end, {path}, pipelining {}: {tasks} tiles at {samples} samples, 2 workers x 1 thread",
        on_off(on)
    );
    println!(
        "  sum of task time {busy:8.2} s ({:.2} s a tile), ideal (sum / 2) {ideal:7.2} s",
        busy / tasks as f64
    );
    println!("  submit to last frame downloaded {wall:8.2} s  ideal / that {ratio:6.3}");
    ratio
}

fn efficiency_makespan(on: bool) {
    let mut farm = Farm::start("bench-efficiency", pipelining_args(on));
    farm.add_worker("w1");
    farm.add_worker("w2");
    farm.wait_workers(2);
    let scene = scenes().join("demo.scene.json");
    let started = Instant::now();
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--tiles",
        "4x4",
        "--wait",
        "--json",
    ]);
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(job["state"], "done");
    let tasks = job["tasks_done"].as_u64().unwrap();
    let busy = job["render_ms"].as_u64().unwrap() as f64 / 1000.0;
    let makespan = (job["finished_unix_ms"].as_u64().unwrap()
        - job["submitted_unix_ms"].as_u64().unwrap()) as f64
        / 1000.0;
    let efficiency = busy / 2.0 / makespan;
    println!(
        "farm efficiency, pipelining {}: builtin demo scene, {tasks} tiles (8 frames x 4x4), 2 workers x 1 thread",
        on_off(on)
    );
    println!("  sum of task render time   {busy:8.2} s");
    println!("  ideal makespan (sum / 2)  {:8.2} s", busy / 2.0);
    println!(
        "  measured makespan         {makespan:8.2} s  (client wall time incl. upload {wall:.2} s)"
    );
    println!(
        "  efficiency                {efficiency:8.3}  target >= 0.95  ({:.2}x target)",
        efficiency / 0.95
    );
}

fn dispatch() {
    let rounds: usize = std::env::var("TESSERA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for on in [false, true] {
            rates[usize::from(on)].push(dispatch_once(on));
        }
    }
    let mut far = [Vec::new(), Vec::new()];
    let wan_missing = wan::unavailable();
    if wan_missing.is_none() {
        for on in [false, true] {
            far[usize::from(on)].push(dispatch_once_at(on, Some(80), State::Sqlite));
        }
    }
    for on in [false, true] {
        let r = &rates[usize::from(on)];
        let best = r.iter().copied().fold(0.0, f64::max);
        println!(
            "dispatch, loopback, pipelining {}: best {best:.0} tasks/s of {r:.0?}  target >= 10000  ({:.2}x target)",
            on_off(on),
            best / 10_000.0
        );
        match &wan_missing {
            None => {
                let r = &far[usize::from(on)];
                let best = r.iter().copied().fold(0.0, f64::max);
                println!(
                    "dispatch, 80 ms RTT, pipelining {}: {best:.0} tasks/s  target >= 5000  ({:.2}x target)",
                    on_off(on),
                    best / 5_000.0
                );
            }
            Some(why) => println!("dispatch, 80 ms RTT: skipped ({why})"),
        }
    }
}

fn dispatch_once(on: bool) -> f64 {
    dispatch_once_at(on, None, State::Sqlite)
}

/// (b2) dispatch throughput with the state in SQLite and in PostgreSQL (a
/// scratch server on this machine, as `--state`), pipelining on, the two
/// alternating: target PostgreSQL >= 0.8x SQLite.
fn dispatch_state() {
    if tessera_coordinator::scratch_postgres::bin_dir().is_none() {
        println!(
            "dispatch, SQLite vs PostgreSQL: skipped (needs {})",
            tessera_coordinator::scratch_postgres::NEEDED
        );
        return;
    }
    let rounds: usize = std::env::var("TESSERA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let (mut lite, mut pg) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        lite.push(dispatch_once_at(true, None, State::Sqlite));
        pg.push(dispatch_once_at(true, None, State::Postgres));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (l, p) = (median(&mut lite), median(&mut pg));
    println!(
        "dispatch, state in SQLite vs PostgreSQL (pipelining on, loopback): SQLite {l:.0} tasks/s of {lite:.0?}, PostgreSQL {p:.0} of {pg:.0?}: {:.2}x  target >= 0.8x",
        p / l
    );
}

/// Tasks per second through one farm of 32 no-op workers; with `rtt_ms`,
/// all of them behind one WAN-bench path of that round trip (1 Gbit/s).
fn dispatch_once_at(on: bool, rtt_ms: Option<u64>, state: State) -> f64 {
    const WORKERS: usize = 32;
    let bench = rtt_ms.map(|rtt| wan::Bench::start(&[wan::Link::new(rtt, 0.0, 1000)]));
    let mut farm = match &bench {
        Some(b) => Farm::start_in(
            "bench-dispatch-wan",
            pipelining_args(on),
            Some(&b.coordinator_ns),
            wan::COORDINATOR_IP,
        ),
        None => Farm::start_with_state("bench-dispatch", pipelining_args(on), state),
    };
    let ns = bench.as_ref().map(|b| b.paths[0].ns.clone());
    for i in 0..WORKERS {
        farm.add_worker_in(
            ns.as_deref(),
            &format!("noop-{i}"),
            &["--engine", "noop", "--slots", "4"],
            &[],
        );
    }
    farm.wait_workers(WORKERS);
    let scene = scenes().join("spheres.scene.json");
    // 6 frames x 64x64 tiles = 24,576 tasks per job.
    let mut total_tasks = 0;
    let mut total_secs = 0.0;
    for _ in 0..2 {
        let job = farm.json(&[
            "submit",
            scene.to_str().unwrap(),
            "--engine",
            "noop",
            "--tiles",
            "64x64",
            "--json",
        ]);
        let id = job["id"].as_u64().unwrap().to_string();
        let done = farm.json(&["wait", &id, "--json"]);
        assert_eq!(done["state"], "done");
        let tasks = done["tasks_done"].as_u64().unwrap();
        let secs = (done["finished_unix_ms"].as_u64().unwrap()
            - done["submitted_unix_ms"].as_u64().unwrap()) as f64
            / 1000.0;
        total_tasks += tasks;
        total_secs += secs;
    }
    let rate = total_tasks as f64 / total_secs;
    let path = rtt_ms.map_or("loopback".to_string(), |r| format!("{r} ms RTT"));
    println!(
        "dispatch throughput, pipelining {}: no-op engine, {WORKERS} worker processes x 4 slots over QUIC, {path}, state in {state:?}",
        on_off(on)
    );
    println!("  tasks                     {total_tasks}");
    println!("  submit to job done        {total_secs:8.2} s");
    println!("  throughput                {rate:8.0} tasks/s");
    rate
}

/// Σ task render time (seconds) of a finished job.
fn job_seconds(farm: &Farm, args: &[&str]) -> f64 {
    let job = farm.json(args);
    assert_eq!(job["state"], "done", "{job}");
    job["render_ms"].as_u64().unwrap() as f64 / 1000.0
}

/// Σ of 16 tile tasks ÷ one full-frame task, persistent sessions on Blender
/// 4.5 (`bpy`), on a frame that takes at least 5 s whole.
fn blender45_sessions() {
    let py = std::env::var_os("TESSERA_TEST_BPY")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/tessera-ci/bpy-4.5.4/bin/python"))
        })
        .filter(|p| p.exists());
    let Some(py) = py else {
        println!("blender 4.5 sessions: skipped (set TESSERA_TEST_BPY to a Python with bpy 4.5)");
        return;
    };
    let py = py.to_str().unwrap();
    let mut farm = Farm::start("bench-blender45", &[]);
    let project = farm.dir.join("project");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/make_scenes.py");
    let out = std::process::Command::new(py)
        .arg("-I")
        .arg("-c")
        .arg(format!(
            "import bpy\nP = {:?}\nexec(compile(open(P).read(), P, 'exec'))",
            script.to_str().unwrap()
        ))
        .args(["--", "--project"])
        .arg(&project)
        .arg("--external")
        .arg(farm.dir.join("external"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    farm.add_worker_with("b1", &["--engine", "blender", "--blender-python", py]);
    let blend = project.join("shot.blend");
    let blend = blend.to_str().unwrap();
    let job = |samples: &str, tiles: &str| {
        job_seconds(
            &farm,
            &[
                "submit",
                blend,
                "--frames",
                "1",
                "--tiles",
                tiles,
                "--samples",
                samples,
                "--blender-python",
                py,
                "--wait",
                "--json",
            ],
        )
    };
    // Warm the worker's cache and the file's session first.
    job("16", "1x1");
    let mut samples = 1024u32;
    let mut whole = job(&samples.to_string(), "1x1");
    while whole < 5.0 && samples < 1 << 20 {
        samples = (f64::from(samples) * (5.5 / whole.max(0.05)))
            .ceil()
            .min(f64::from(1u32 << 20)) as u32;
        whole = job(&samples.to_string(), "1x1");
    }
    let tiles = job(&samples.to_string(), "4x4");
    println!("blender 4.5 sessions (bpy 4.5, persistent): shot.blend frame 1, {samples} samples, 16 tiles (4x4) vs one full frame, 1 worker");
    println!("  full frame (one task)                           {whole:6.2} s");
    println!("  sum of 16 tile tasks                            {tiles:6.2} s");
    println!(
        "  sum of tiles / full frame                       {:6.3}  target <= 1.10",
        tiles / whole
    );
}

fn blender_sessions() {
    if std::process::Command::new("blender")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("blender sessions: skipped (no blender on this machine)");
        return;
    }
    let samples = "128";
    let mut results = Vec::new();
    for (mode, args) in [
        ("persistent", vec!["--engine", "blender"]),
        ("cold", vec!["--engine", "blender", "--blender-cold"]),
    ] {
        let mut farm = Farm::start(&format!("bench-blender-{mode}"), &[]);
        let project = farm.dir.join("project");
        let status = std::process::Command::new("blender")
            .args(["-b", "--factory-startup", "--python"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes/blender/make_scenes.py"))
            .args(["--", "--project"])
            .arg(&project)
            .arg("--external")
            .arg(farm.dir.join("external"))
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        farm.add_worker_with("b1", &args);
        let blend = project.join("shot.blend");
        let blend = blend.to_str().unwrap();
        let whole = job_seconds(
            &farm,
            &[
                "submit",
                blend,
                "--frames",
                "1",
                "--samples",
                samples,
                "--wait",
                "--json",
            ],
        );
        let tiles = job_seconds(
            &farm,
            &[
                "submit",
                blend,
                "--frames",
                "1",
                "--tiles",
                "4x4",
                "--samples",
                samples,
                "--wait",
                "--json",
            ],
        );
        results.push((mode, whole, tiles));
    }
    let (_, whole_p, tiles_p) = results[0];
    let (_, whole_c, tiles_c) = results[1];
    let overhead_p = (tiles_p - whole_p) / 16.0;
    let overhead_c = (tiles_c - whole_c) / 16.0;
    println!("blender sessions: shot.blend frame 1, {samples} samples, 16 tiles (4x4) vs one full frame, 1 worker, 1 render thread");
    println!("  full frame (one task, includes Blender start)   persistent {whole_p:6.2} s   cold {whole_c:6.2} s");
    println!("  sum of 16 tile tasks                            persistent {tiles_p:6.2} s   cold {tiles_c:6.2} s");
    println!("  per-task overhead ((sum - full) / 16)           persistent {overhead_p:6.3} s   cold {overhead_c:6.3} s");
    println!(
        "  persistent overhead / cold overhead             {:6.3}  target <= 0.20",
        overhead_p / overhead_c
    );
    println!(
        "  persistent sum of tiles / full frame            {:6.3}  target <= 1.25",
        tiles_p / whole_p
    );
}
