//! What protocol 19's encoding costs against version 18's, side by side in
//! one run: encode and decode time per message and bytes per message, for
//! a mix of what the farm sends (a heartbeat with telemetry, a task, a float
//! tile result inline, a status of 100 jobs, a manifest of 10,000 files).
//!
//! `cargo bench -p tessera-protocol --bench protocol`

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tessera_protocol::codec::{decode_frame_as, encode_as, Codec};
use tessera_protocol::job::{
    AfterFailure, Engine, JobSpec, ManifestEntry, OutputFormat, TileGrid, TileRect,
};
use tessera_protocol::messages::*;
use tessera_protocol::telemetry::{GpuTelemetry, HostTelemetry, Telemetry};
use tessera_protocol::Digest;

/// Runs `f` for about `budget`, returns ns per call.
fn time(budget: Duration, mut f: impl FnMut()) -> f64 {
    let mut n = 1u64;
    loop {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        let took = start.elapsed();
        if took >= budget {
            return took.as_nanos() as f64 / n as f64;
        }
        n = (n * 2).max(1);
    }
}

struct Row {
    name: &'static str,
    bytes: [usize; 2],
    encode_ns: [f64; 2],
    decode_ns: [f64; 2],
}

fn measure<T: Serialize + DeserializeOwned>(name: &'static str, msg: &T) -> Row {
    let budget = Duration::from_millis(300);
    let mut row = Row {
        name,
        bytes: [0; 2],
        encode_ns: [0.0; 2],
        decode_ns: [0.0; 2],
    };
    for (i, codec) in [Codec::Legacy, Codec::Envelope].into_iter().enumerate() {
        let frame = encode_as(codec, msg).unwrap();
        row.bytes[i] = frame.len();
        row.encode_ns[i] = time(budget, || {
            black_box(encode_as(codec, black_box(msg)).unwrap());
        });
        row.decode_ns[i] = time(budget, || {
            black_box(decode_frame_as::<T>(codec, black_box(&frame)).unwrap());
        });
    }
    row
}

fn d(i: u64) -> Digest {
    Digest::of(&i.to_le_bytes())
}

fn heartbeat() -> WorkerMsg {
    let gpu = |index| GpuTelemetry {
        index,
        name: "NVIDIA H100 80GB HBM3".into(),
        utilization_pct: 97,
        memory_used_bytes: 40 << 30,
        memory_total_bytes: 80 << 30,
        temperature_c: 71,
        power_draw_w: 612.5,
        power_limit_w: 700.0,
        sm_clock_mhz: 1980,
        memory_clock_mhz: 2619,
    };
    WorkerMsg::Heartbeat {
        telemetry: Some(Telemetry {
            host: HostTelemetry {
                cpu_model: "AMD EPYC 7B13 64-Core Processor".into(),
                cores: 64,
                load_1m: 7.5,
                memory_used_bytes: 100 << 30,
                memory_total_bytes: 512 << 30,
            },
            gpus: (0..8).map(gpu).collect(),
            gpu_note: None,
        }),
    }
}

fn task() -> CoordMsg {
    CoordMsg::Assign(TaskSpec {
        task: TaskRef {
            job: 1234,
            index: 5678,
            epoch: 3,
        },
        frame: 120,
        tile: TileRect {
            x: 960,
            y: 540,
            width: 480,
            height: 270,
        },
        samples: (0, 256),
        total_samples: 1024,
        unreal: None,
        finish: None,
    })
}

/// The largest float tile that travels inline (64 KiB): 64 × 64 RGBA f32.
fn float_tile() -> WorkerMsg {
    let mut bytes = b"TFLT".to_vec();
    for w in [64u32, 63, 4, 256] {
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    while bytes.len() < MAX_INLINE_OUTPUT {
        bytes.extend_from_slice(&(bytes.len() as f32 * 0.001).to_le_bytes());
    }
    bytes.truncate(MAX_INLINE_OUTPUT);
    WorkerMsg::Done {
        task: TaskRef {
            job: 1234,
            index: 5678,
            epoch: 3,
        },
        output: Digest::of(&bytes),
        render_ms: 81_234,
        inline: Some(bytes),
    }
}

fn job_status(id: u64) -> JobStatus {
    JobStatus {
        id,
        name: format!("sh{id:03}-lighting-v2"),
        engine: Engine::Blender,
        state: JobState::Running,
        priority: 0,
        frames_total: 250,
        frames_done: 120,
        tasks_total: 1000,
        tasks_done: 480,
        tasks_running: 8,
        bytes_uploaded: 1 << 30,
        bytes_deduplicated: 3 << 28,
        bytes_to_workers: 5 << 30,
        render_ms: 9_876_543,
        submitted_unix_ms: 1_760_000_000_000 + id,
        finished_unix_ms: None,
        error: None,
        blocked: None,
        cost_usd: 3.75,
        cost_to_finish_usd: Some(4.0),
        eta_secs: Some(1800.5),
        paused: false,
        verification: None,
        after: vec![],
        after_failure: AfterFailure::Fail,
        waiting_for: vec![],
        deadline_unix_ms: None,
        budget_usd: None,
    }
}

fn status() -> ClientResponse {
    ClientResponse::Status {
        jobs: (1..=100).map(job_status).collect(),
        workers: vec![],
    }
}

fn manifest() -> ClientRequest {
    ClientRequest::Submit(JobSpec {
        request_id: Some("req-7f3a".into()),
        name: "sh010".into(),
        engine: Engine::Blender,
        scene: "shots/sh010/sh010.blend".into(),
        manifest: (0..10_000)
            .map(|i| ManifestEntry {
                path: format!("textures/set_{:02}/tex_{i:05}.exr", i % 40),
                digest: d(i),
                size: 1_000_000 + i,
                origin: Some(format!(
                    "/mnt/lib/textures/set_{:02}/tex_{i:05}.exr",
                    i % 40
                )),
                frame: None,
            })
            .collect(),
        frames: (1..=250).collect(),
        tiles: TileGrid { cols: 2, rows: 2 },
        sample_ranges: 1,
        samples: 1024,
        resolution: (1920, 1080),
        priority: 0,
        output: OutputFormat::Exr,
        blender: None,
        output_name: None,
        unreal: None,
        finish: false,
        verify_percent: 0,
        after: vec![],
        after_failure: AfterFailure::Fail,
        paused: false,
        deadline_unix_ms: None,
        budget: None,
        task_timeout_ms: None,
        render_format: None,
        encode: None,
        host: None,
        warnings: Vec::new(),
    })
}

fn main() {
    let rows = [
        measure("heartbeat, 8 GPUs", &heartbeat()),
        measure("task (Assign)", &task()),
        measure("float tile, 64 KiB", &float_tile()),
        measure("status, 100 jobs", &status()),
        measure("manifest, 10k files", &manifest()),
    ];
    println!("protocol 18 (bincode) vs 19 (MessagePack envelope, named fields); per message\n");
    println!(
        "{:<20} {:>10} {:>10} {:>6}   {:>11} {:>11} {:>6}   {:>11} {:>11} {:>6}",
        "message",
        "v18 B",
        "v19 B",
        "×",
        "v18 enc ns",
        "v19 enc ns",
        "×",
        "v18 dec ns",
        "v19 dec ns",
        "×"
    );
    for r in &rows {
        println!(
            "{:<20} {:>10} {:>10} {:>6.2}   {:>11.0} {:>11.0} {:>6.2}   {:>11.0} {:>11.0} {:>6.2}",
            r.name,
            r.bytes[0],
            r.bytes[1],
            r.bytes[1] as f64 / r.bytes[0] as f64,
            r.encode_ns[0],
            r.encode_ns[1],
            r.encode_ns[1] / r.encode_ns[0],
            r.decode_ns[0],
            r.decode_ns[1],
            r.decode_ns[1] / r.decode_ns[0],
        );
    }
}
