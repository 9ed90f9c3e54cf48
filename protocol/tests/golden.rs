//! Golden files: every message exactly as a protocol version encoded it,
//! in `protocol/golden/vN/`. A coordinator at version N serves peers at
//! N−1 (`MIN_PROTOCOL_VERSION`), so that version's bytes must keep
//! decoding into today's types, to the values below: the normal run reads
//! `MIN_PROTOCOL_VERSION`'s folder in that version's codec. `v18/` is
//! bincode, written from commit 4519774; `v19/` is version 19's envelope
//! (MessagePack with named fields; `Hello` and `Welcome` stay bincode),
//! written before the bump to 20. Each was written once, at the release
//! whose encoding it freezes, by
//! `TESSERA_WRITE_GOLDEN=1 cargo test -p tessera-protocol --test golden -- --ignored`,
//! which writes `PROTOCOL_VERSION`'s folder: run it before a bump, never
//! again for a folder that exists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_protocol::blender::{BlenderNeeds, BlenderOffer, BlenderVersion, VersionReq};
use tessera_protocol::build::{BuildInfo, BuildKind};
use tessera_protocol::chunk::{ChunkList, ChunkRef, Recipe};
use tessera_protocol::codec::Codec;
use tessera_protocol::job::{
    AfterFailure, Budget, Engine, JobSpec, ManifestEntry, OnBudget, OutputFormat, TileGrid,
    TileRect,
};
use tessera_protocol::messages::*;
use tessera_protocol::telemetry::{GpuTelemetry, HostTelemetry, Telemetry};
use tessera_protocol::unreal::{RenderRange, UnrealTask};
use tessera_protocol::Digest;

/// Decodes a golden frame into its value's `Debug`.
type Decoder = dyn Fn(&[u8]) -> Result<String, String>;

/// One golden message: its file name (`Enum.Variant`), the codec its
/// version wrote it in, the bytes of its frame as this build encodes it in
/// that codec, its value as `Debug` shows it, and a decoder of a golden
/// frame back into that value's `Debug`.
struct Sample {
    name: String,
    codec: Codec,
    encode: Box<dyn Fn() -> Vec<u8>>,
    debug: String,
    decode: Box<Decoder>,
    /// The value through this release's envelope and back, as `Debug`.
    envelope: Box<dyn Fn() -> Result<String, String>>,
}

/// A message of the golden set's version, in that version's codec.
fn sample<T>(name: &str, value: T) -> Sample
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    sample_in(message_codec(), name, value)
}

/// `Hello` and `Welcome`: bincode in every version.
fn handshake<T>(name: &str, value: T) -> Sample
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    sample_in(Codec::Legacy, name, value)
}

fn sample_in<T>(codec: Codec, name: &str, value: T) -> Sample
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    let debug = format!("{value:?}");
    let value = std::rc::Rc::new(value);
    let again = value.clone();
    Sample {
        name: name.to_string(),
        codec,
        debug,
        envelope: Box::new(move || {
            let frame = tessera_protocol::codec::encode_as(Codec::Envelope, &*again)
                .map_err(|e| e.to_string())?;
            tessera_protocol::codec::decode_frame_as::<T>(Codec::Envelope, &frame)
                .map(|v| format!("{v:?}"))
                .map_err(|e| e.to_string())
        }),
        encode: Box::new(move || tessera_protocol::codec::encode_as(codec, &*value).unwrap()),
        decode: Box::new(move |bytes| {
            tessera_protocol::codec::decode_frame_as::<T>(codec, bytes)
                .map(|v| format!("{v:?}"))
                .map_err(|e| e.to_string())
        }),
    }
}

/// The version whose golden files a run reads (`MIN_PROTOCOL_VERSION`),
/// or, with `TESSERA_WRITE_GOLDEN` set, writes (`PROTOCOL_VERSION`).
fn golden_version() -> u32 {
    if std::env::var_os("TESSERA_WRITE_GOLDEN").is_some() {
        PROTOCOL_VERSION
    } else {
        MIN_PROTOCOL_VERSION
    }
}

/// The codec messages after the handshake travel in at that version.
fn message_codec() -> Codec {
    Codec::for_version(golden_version()).expect("a served version")
}

fn d(n: u8) -> Digest {
    Digest::of(&[n])
}

fn task(job: u64, index: u32) -> TaskRef {
    TaskRef {
        job,
        index,
        epoch: 3,
    }
}

fn telemetry() -> Telemetry {
    Telemetry {
        host: HostTelemetry {
            cpu_model: "AMD EPYC 7B13".into(),
            cores: 32,
            load_1m: 4.25,
            memory_used_bytes: 12 << 30,
            memory_total_bytes: 128 << 30,
        },
        gpus: vec![GpuTelemetry {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            utilization_pct: 97,
            memory_used_bytes: 40 << 30,
            memory_total_bytes: 80 << 30,
            temperature_c: 71,
            power_draw_w: 612.5,
            power_limit_w: 700.0,
            sm_clock_mhz: 1980,
            memory_clock_mhz: 2619,
        }],
        gpu_note: None,
    }
}

fn offer() -> BlenderOffer {
    BlenderOffer {
        version: BlenderVersion::new(4, 5, 1),
        name: "Blender 4.5.1 (/usr/bin/blender)".into(),
        device_types: vec!["CUDA".into(), "OPTIX".into()],
        devices: vec!["NVIDIA H100 80GB HBM3".into()],
        render_device: "OPTIX".into(),
        oidn: true,
        osl: false,
        eevee: false,
    }
}

fn needs() -> BlenderNeeds {
    BlenderNeeds {
        saved_by: Some(BlenderVersion::new(4, 2, 0)),
        version: VersionReq::AtLeast(4, 2),
        denoise: true,
        osl: false,
        eevee: false,
    }
}

fn manifest() -> Vec<ManifestEntry> {
    vec![
        ManifestEntry {
            path: "cornell.scene.json".into(),
            digest: d(1),
            size: 1234,
            origin: None,
            frame: None,
        },
        ManifestEntry {
            path: "textures/wood.png".into(),
            digest: d(2),
            size: 4 << 20,
            origin: Some("/home/artist/lib/wood.png".into()),
            frame: Some(7),
        },
    ]
}

fn build_info() -> BuildInfo {
    BuildInfo {
        digest: d(9),
        version: BlenderVersion::new(4, 5, 1),
        kind: BuildKind::Executable,
        size: 400 << 20,
        files: 2311,
        features: vec!["OpenImageDenoise".into(), "OSL".into()],
        added_unix_ms: 1_760_000_000_000,
        holders: vec!["gpu-1".into()],
    }
}

fn job_spec() -> JobSpec {
    JobSpec {
        request_id: Some("req-7f3a".into()),
        name: "sh010-lighting".into(),
        engine: Engine::Builtin,
        scene: "cornell.scene.json".into(),
        manifest: manifest(),
        frames: vec![1, 2, 3],
        tiles: TileGrid { cols: 2, rows: 2 },
        sample_ranges: 1,
        samples: 16,
        resolution: (64, 48),
        priority: 5,
        output: OutputFormat::Png,
        blender: None,
        output_name: Some("sh010_####.png".into()),
        unreal: None,
        finish: false,
        verify_percent: 10,
        after: vec![2],
        after_failure: AfterFailure::Hold,
        paused: false,
        deadline_unix_ms: Some(1_760_000_600_000),
        budget: Some(Budget {
            usd: 12.5,
            on_reached: OnBudget::StopDispatch,
        }),
        task_timeout_ms: Some(600_000),
        render_format: None,
        encode: None,
        host: None,
        warnings: Vec::new(),
    }
}

fn job_status(id: u64) -> JobStatus {
    JobStatus {
        id,
        name: format!("sh{id:03}"),
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
        submitted_unix_ms: 1_760_000_000_000,
        finished_unix_ms: None,
        error: None,
        blocked: Some("no connected worker offers Blender 4.2 or newer".into()),
        cost_usd: 3.75,
        cost_to_finish_usd: Some(4.0),
        eta_secs: Some(1800.5),
        paused: false,
        verification: Some(Verification {
            percent: 10,
            agreed: 40,
            mismatched: 1,
            pending: 2,
            rerendered: 1,
            quarantined: vec!["bad-node".into()],
            inconclusive: 0,
        }),
        after: vec![1],
        after_failure: AfterFailure::Fail,
        waiting_for: vec![],
        deadline_unix_ms: Some(1_760_003_600_000),
        budget_usd: Some(20.0),
    }
}

fn tile() -> TileRect {
    TileRect {
        x: 32,
        y: 0,
        width: 32,
        height: 24,
    }
}

fn worker_status() -> WorkerStatus {
    WorkerStatus {
        id: 4,
        name: "gpu-1".into(),
        hostname: "vast-12345".into(),
        engines: vec![Engine::Builtin, Engine::Blender],
        slots: 2,
        state: WorkerState::Busy,
        running: 1,
        tasks_done: 77,
        price_per_hour: 2.49,
        connected_secs: 3600,
        tasks: vec![RunningTask {
            job: 1,
            index: 5,
            frame: 2,
            tile: tile(),
            progress: Some((8, 16)),
            stage: Some("compiling shaders: 1200 left".into()),
        }],
        telemetry: Some(telemetry()),
        interruptible: true,
        blenders: vec![offer()],
    }
}

fn frame_output(frame: u32) -> FrameOutput {
    FrameOutput {
        frame,
        digest: d(frame as u8),
        size: 98_765,
        format: OutputFormat::Png,
        name: Some(format!("frame_{frame:04}.png")),
    }
}

fn task_log() -> TaskLog {
    TaskLog {
        task: 5,
        worker: 4,
        unix_ms: 1_760_000_100_000,
        error: "blender exited with status 11".into(),
        log: "Fra:1 Mem:120M | Sample 3/16\nSegmentation fault\n".into(),
    }
}

fn chunks() -> Vec<ChunkRef> {
    vec![
        ChunkRef {
            digest: d(20),
            len: 65536,
        },
        ChunkRef {
            digest: d(21),
            len: 1000,
        },
    ]
}

/// Every golden message, with representative values.
fn samples() -> Vec<Sample> {
    let mut s = vec![
        handshake(
            "Hello.Worker",
            Hello {
                version: golden_version(),
                role: Role::Worker,
                secret: "ab".repeat(32),
                name: "gpu-1".into(),
            },
        ),
        handshake(
            "Hello.Client",
            Hello {
                version: golden_version(),
                role: Role::Client,
                secret: "cd".repeat(32),
                name: "artist".into(),
            },
        ),
        handshake(
            "Welcome.Accepted",
            Welcome::Accepted {
                version: golden_version(),
            },
        ),
        handshake(
            "Welcome.Refused",
            Welcome::Refused {
                reason: "wrong worker ticket secret".into(),
            },
        ),
    ];
    // Worker → coordinator.
    s.extend([
        sample(
            "WorkerMsg.Join",
            WorkerMsg::Join(WorkerInfo {
                engines: vec![Engine::Builtin, Engine::Blender],
                slots: 2,
                price_per_hour: 2.49,
                hostname: "vast-12345".into(),
                holding: vec![task(1, 4)],
                interruptible: true,
                cached: vec![d(1), d(2)],
                blenders: vec![offer()],
                fetches_builds: true,
                draining: false,
                host: None,
            }),
        ),
        sample(
            "WorkerMsg.Heartbeat",
            WorkerMsg::Heartbeat {
                telemetry: Some(telemetry()),
            },
        ),
        sample(
            "WorkerMsg.Done",
            WorkerMsg::Done {
                task: task(1, 5),
                output: Digest::of(&[1, 2, 3, 4, 5, 6, 7, 8]),
                render_ms: 1234,
                inline: Some(vec![1, 2, 3, 4, 5, 6, 7, 8]),
            },
        ),
        sample(
            "WorkerMsg.Failed",
            WorkerMsg::Failed {
                task: task(1, 6),
                error: "blender exited with status 11".into(),
                log: "Segmentation fault\n".into(),
                unsupported: false,
            },
        ),
        sample("WorkerMsg.Draining", WorkerMsg::Draining),
        sample(
            "WorkerMsg.Cached",
            WorkerMsg::Cached {
                added: vec![d(3)],
                removed: vec![d(1)],
            },
        ),
        sample(
            "WorkerMsg.Progress",
            WorkerMsg::Progress {
                task: task(1, 5),
                done: 8,
                total: 16,
                stage: Some("compiling shaders".into()),
            },
        ),
        sample(
            "WorkerMsg.Scanned",
            WorkerMsg::Scanned {
                id: 3,
                result: Ok("{\"files\":[]}".into()),
            },
        ),
    ]);
    // Coordinator → worker.
    s.extend([
        sample(
            "CoordMsg.Enrolled",
            CoordMsg::Enrolled {
                credential: format!("17.{}", "ef".repeat(32)),
            },
        ),
        sample(
            "CoordMsg.Joined",
            CoordMsg::Joined {
                worker_id: 17,
                heartbeat_ms: 1000,
                lease_ms: 5000,
                store_urls: false,
            },
        ),
        sample(
            "CoordMsg.Job",
            CoordMsg::Job(JobInfo {
                job: 1,
                engine: Engine::Blender,
                scene: "shot.blend".into(),
                manifest: manifest(),
                resolution: (1920, 1080),
                output: OutputFormat::Exr,
                blender: Some(needs()),
                unreal: None,
                finish: true,
                task_timeout_ms: Some(600_000),
                render_format: None,
                encode: None,
            }),
        ),
        sample(
            "CoordMsg.Assign",
            CoordMsg::Assign(TaskSpec {
                task: task(1, 5),
                frame: 2,
                tile: tile(),
                samples: (0, 16),
                total_samples: 16,
                unreal: Some(UnrealTask {
                    shot: 1,
                    range: RenderRange {
                        from: 10,
                        keep_from: 12,
                        to: 20,
                    },
                }),
                finish: Some(StitchedPasses {
                    digest: d(30),
                    size: 1 << 20,
                }),
            }),
        ),
        sample("CoordMsg.Cancel", CoordMsg::Cancel(task(1, 5))),
        sample("CoordMsg.Drain", CoordMsg::Drain),
        sample(
            "CoordMsg.Ack",
            CoordMsg::Ack {
                task: task(1, 5),
                accepted: false,
                reason: Some("stale lease epoch".into()),
            },
        ),
        sample("CoordMsg.Builds", CoordMsg::Builds(vec![build_info()])),
        sample(
            "CoordMsg.Scan",
            CoordMsg::Scan {
                id: 3,
                blend: d(40),
                path: "/home/artist/shot.blend".into(),
                version: BlenderVersion::new(4, 2, 3),
            },
        ),
    ]);
    // Client → coordinator.
    s.extend([
        sample(
            "ClientRequest.MissingBlobs",
            ClientRequest::MissingBlobs(vec![d(1), d(2)]),
        ),
        sample(
            "ClientRequest.KnownLists",
            ClientRequest::KnownLists(vec![d(5)]),
        ),
        sample(
            "ClientRequest.Assemble",
            ClientRequest::Assemble(ChunkList {
                size: 66536,
                chunks: chunks(),
            }),
        ),
        sample("ClientRequest.Submit", ClientRequest::Submit(job_spec())),
        sample("ClientRequest.Status", ClientRequest::Status(Some(1))),
        sample("ClientRequest.Cancel", ClientRequest::Cancel(1)),
        sample("ClientRequest.Frames", ClientRequest::Frames(1)),
        sample(
            "ClientRequest.Logs",
            ClientRequest::Logs {
                job: 1,
                task: Some(5),
            },
        ),
        sample("ClientRequest.Subscribe", ClientRequest::Subscribe),
        sample(
            "ClientRequest.Tiles",
            ClientRequest::Tiles { job: 1, frame: 2 },
        ),
        sample(
            "ClientRequest.Pause",
            ClientRequest::Pause {
                job: 1,
                paused: true,
            },
        ),
        sample("ClientRequest.Drain", ClientRequest::Drain { worker: 4 }),
        sample(
            "ClientRequest.CollectGarbage",
            ClientRequest::CollectGarbage,
        ),
        sample("ClientRequest.AddBuild", ClientRequest::AddBuild(d(9))),
        sample("ClientRequest.Builds", ClientRequest::Builds),
        sample(
            "ClientRequest.RevokeWorker",
            ClientRequest::RevokeWorker {
                name: "bad-node".into(),
            },
        ),
        sample("ClientRequest.RotateTickets", ClientRequest::RotateTickets),
        sample(
            "ClientRequest.StatusPage",
            ClientRequest::StatusPage {
                after_job: 0,
                after_worker: 3,
            },
        ),
        sample(
            "ClientRequest.LogsPage",
            ClientRequest::LogsPage {
                job: 1,
                task: None,
                after: 10,
            },
        ),
        sample(
            "ClientRequest.FramesPage",
            ClientRequest::FramesPage {
                job: 1,
                after: Some(4),
            },
        ),
        sample(
            "ClientRequest.Scan",
            ClientRequest::Scan {
                blend: d(40),
                path: "/home/artist/shot.blend".into(),
                version: BlenderVersion::new(4, 2, 3),
            },
        ),
        sample("ClientRequest.Retry", ClientRequest::Retry(1)),
        sample("ClientRequest.JobDetail", ClientRequest::JobDetail(1)),
        sample(
            "ClientRequest.JobsPage",
            ClientRequest::JobsPage {
                filter: JobFilter {
                    states: vec![JobState::Failed, JobState::Canceled],
                    name: Some("sh0*".into()),
                    since_unix_ms: Some(1_760_000_000_000),
                    ids: vec![1, 2],
                },
                after: 0,
            },
        ),
        sample(
            "ClientRequest.NewFrames",
            ClientRequest::NewFrames { job: 1, after: 0 },
        ),
    ]);
    // Coordinator → client.
    let snapshot = Snapshot {
        unix_ms: 1_760_000_200_000,
        jobs: vec![job_status(1)],
        workers: vec![worker_status()],
        farm: FarmStatus {
            burn_usd_per_hour: 4.98,
            idle_usd_per_hour: 0.0,
        },
    };
    s.extend([
        sample(
            "ClientResponse.Missing",
            ClientResponse::Missing(vec![d(2)]),
        ),
        sample(
            "ClientResponse.Known",
            ClientResponse::Known(vec![Some(d(6)), None]),
        ),
        sample("ClientResponse.Assembled", ClientResponse::Assembled(d(6))),
        sample(
            "ClientResponse.Submitted",
            ClientResponse::Submitted(job_status(1)),
        ),
        sample(
            "ClientResponse.Status",
            ClientResponse::Status {
                jobs: vec![job_status(1), job_status(2)],
                workers: vec![worker_status()],
            },
        ),
        sample(
            "ClientResponse.Canceled",
            ClientResponse::Canceled(job_status(1)),
        ),
        sample(
            "ClientResponse.Frames",
            ClientResponse::Frames(vec![frame_output(1), frame_output(2)]),
        ),
        sample(
            "ClientResponse.Logs",
            ClientResponse::Logs(vec![task_log()]),
        ),
        sample(
            "ClientResponse.Snapshot",
            ClientResponse::Snapshot(snapshot),
        ),
        sample(
            "ClientResponse.Event",
            ClientResponse::Event {
                unix_ms: 1_760_000_300_000,
                event: FarmEvent::TaskFinished {
                    job: 1,
                    index: 5,
                    worker: 4,
                    render_ms: 1234,
                },
            },
        ),
        sample(
            "ClientResponse.Tiles",
            ClientResponse::Tiles(vec![
                TileStatus {
                    tile: tile(),
                    state: TileState::Rendering(Some((8, 16))),
                },
                TileStatus {
                    tile: TileRect {
                        x: 0,
                        y: 0,
                        width: 32,
                        height: 24,
                    },
                    state: TileState::Done,
                },
            ]),
        ),
        sample(
            "ClientResponse.Collected",
            ClientResponse::Collected(Collected {
                removed_blobs: 3,
                removed_bytes: 3 << 20,
                kept_blobs: 10,
                kept_bytes: 10 << 20,
            }),
        ),
        sample(
            "ClientResponse.Revoked",
            ClientResponse::Revoked {
                identities: 1,
                disconnected: 1,
            },
        ),
        sample(
            "ClientResponse.Tickets",
            ClientResponse::Tickets {
                worker: "tessera-worker-ticket-line".into(),
                client: "tessera-client-ticket-line".into(),
            },
        ),
        sample("ClientResponse.Done", ClientResponse::Done),
        sample(
            "ClientResponse.Error",
            ClientResponse::Error(ClientError::not_found("no job 99: see `tessera status`")),
        ),
        sample(
            "ClientResponse.BuildAdded",
            ClientResponse::BuildAdded(build_info()),
        ),
        sample(
            "ClientResponse.Builds",
            ClientResponse::Builds(vec![build_info()]),
        ),
        sample(
            "ClientResponse.StatusPage",
            ClientResponse::StatusPage {
                jobs: vec![job_status(1)],
                workers: vec![worker_status()],
                more: true,
            },
        ),
        sample(
            "ClientResponse.LogsPage",
            ClientResponse::LogsPage {
                logs: vec![task_log()],
                next: Some(11),
            },
        ),
        sample(
            "ClientResponse.FramesPage",
            ClientResponse::FramesPage {
                frames: vec![frame_output(5)],
                next: None,
            },
        ),
        sample(
            "ClientResponse.Scanned",
            ClientResponse::Scanned {
                worker: "gpu-1".into(),
                json: "{\"files\":[]}".into(),
            },
        ),
        sample(
            "ClientResponse.JobDetail",
            ClientResponse::JobDetail(Box::new(JobDetail {
                status: job_status(1),
                frames: vec![
                    FrameRun {
                        first: 1,
                        last: 120,
                        count: 120,
                        state: FrameState::Done,
                    },
                    FrameRun {
                        first: 121,
                        last: 250,
                        count: 130,
                        state: FrameState::Waiting,
                    },
                ],
                frames_cut: false,
                attempts: vec![Attempt {
                    task: 5,
                    frame: Some(2),
                    worker: 4,
                    worker_name: Some("gpu-1".into()),
                    unix_ms: 1_760_000_100_000,
                    error: "blender exited with status 11".into(),
                }],
                attempts_total: 1,
                workers: vec![JobWorker {
                    name: "gpu-1".into(),
                    tasks_done: 480,
                    render_ms: 9_876_543,
                    running: 1,
                }],
                warnings: vec![],
            })),
        ),
        sample(
            "ClientResponse.Retried",
            ClientResponse::Retried(job_status(1)),
        ),
        sample(
            "ClientResponse.JobsPage",
            ClientResponse::JobsPage {
                jobs: vec![job_status(1)],
                next: Some(1),
            },
        ),
        sample(
            "ClientResponse.NewFrames",
            ClientResponse::NewFrames {
                frames: vec![frame_output(3)],
                next: 3,
                more: false,
            },
        ),
    ]);
    // Blob streams.
    s.extend([
        sample(
            "BlobRequest.Put",
            BlobRequest::Put {
                digest: d(1),
                len: 1234,
            },
        ),
        sample(
            "BlobRequest.Get",
            BlobRequest::Get {
                digest: d(1),
                job: Some(1),
            },
        ),
        sample("BlobRequest.Recipe", BlobRequest::Recipe { digest: d(6) }),
        sample(
            "BlobRequest.GetMany",
            BlobRequest::GetMany {
                digests: vec![d(20), d(21)],
                job: None,
            },
        ),
        sample("BlobReply.Stored", BlobReply::Stored),
        sample(
            "BlobReply.Refused",
            BlobReply::Refused {
                reason: "digest mismatch".into(),
            },
        ),
        sample("BlobReply.Found", BlobReply::Found { len: 1234 }),
        sample(
            "BlobReply.Recipe",
            BlobReply::Recipe(Recipe {
                digest: d(6),
                size: 66536,
                chunks: chunks(),
            }),
        ),
        sample("BlobReply.NotFound", BlobReply::NotFound),
    ]);
    s
}

/// Variants added after the golden version: no peer of that version sends
/// or is sent them (a client asks them only of a coordinator of its own
/// version or newer), so they have no golden file yet. They must survive
/// the envelope, and the next golden set (written at `PROTOCOL_VERSION`)
/// includes them.
fn newer() -> Vec<Sample> {
    vec![
        sample(
            "ClientRequest.SetPriority",
            ClientRequest::SetPriority {
                job: 1,
                priority: -3,
            },
        ),
        sample(
            "ClientRequest.FleetReport",
            ClientRequest::FleetReport(FleetReport {
                nodes: vec![FleetNode {
                    name: "tessera-fleet-1".into(),
                    node: "i-1".into(),
                    gpu: "RTX 4090".into(),
                    usd_per_hour: 0.45,
                    state: "joined".into(),
                    secs: 600.0,
                    usd: 0.075,
                }],
                replaced: 1,
                billed_usd: 0.1,
                attributed_to_jobs_usd: 0.06,
                farm_overhead_usd: 0.04,
                billed_gpu_hours: 0.2,
                rendered_gpu_hours: 0.12,
            }),
        ),
        sample(
            "ClientResponse.Prioritized",
            ClientResponse::Prioritized(job_status(1)),
        ),
        // A worker asks it only of a coordinator whose `Joined` said
        // `store_urls`, which no coordinator of the golden version says.
        sample(
            "BlobRequest.Locate",
            BlobRequest::Locate {
                digests: vec![Digest::of(b"scene")],
                job: Some(3),
            },
        ),
        sample(
            "BlobReply.At",
            BlobReply::At {
                url: "http://127.0.0.1:3900/tessera/farm/blobs/ab?X-Amz-Signature=00".into(),
                len: 4096,
            },
        ),
    ]
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("golden/v{}", golden_version()))
}

/// Writes `PROTOCOL_VERSION`'s golden files. Run once, at the release
/// whose encoding they freeze (before the next bump); never by the normal
/// test run, and never over a folder that exists.
#[test]
#[ignore = "writes protocol/golden/vPROTOCOL_VERSION: run once with TESSERA_WRITE_GOLDEN=1"]
fn write_golden_files() {
    if std::env::var_os("TESSERA_WRITE_GOLDEN").is_none() {
        eprintln!("TESSERA_WRITE_GOLDEN is not set: nothing written");
        return;
    }
    assert!(
        !dir().exists(),
        "{} exists: golden files are written once",
        dir().display()
    );
    std::fs::create_dir_all(dir()).unwrap();
    for s in samples() {
        std::fs::write(dir().join(format!("{}.bin", s.name)), (s.encode)()).unwrap();
    }
}

fn golden(name: &str) -> Vec<u8> {
    let path = dir().join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every golden file of `MIN_PROTOCOL_VERSION` decodes in its codec into
/// today's types, to the value it was written from (a field added since
/// takes its default). Bincode (version 18) has no room for change, so
/// today's bincode must write the same bytes; an envelope names the
/// version that wrote it, which must be the golden one.
#[test]
fn every_golden_file_decodes_to_its_value() {
    assert_eq!(golden_version(), MIN_PROTOCOL_VERSION);
    for s in samples() {
        let bytes = golden(&s.name);
        let got = (s.decode)(&bytes).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert_eq!(got, s.debug, "{}", s.name);
        match s.codec {
            Codec::Legacy => assert_eq!(
                (s.encode)(),
                bytes,
                "{}: bincode encodes it differently now",
                s.name
            ),
            Codec::Envelope => assert_eq!(
                u32::from(u16::from_be_bytes([bytes[4], bytes[5]])),
                MIN_PROTOCOL_VERSION,
                "{}: the envelope's version",
                s.name
            ),
        }
    }
}

/// Every message also survives this release's envelope unchanged.
#[test]
fn every_message_round_trips_through_the_envelope() {
    for s in samples().into_iter().chain(newer()) {
        let got = (s.envelope)().unwrap_or_else(|e| panic!("{}: {e}", s.name));
        assert_eq!(got, s.debug, "{}", s.name);
    }
}

/// The variant names serde knows for an enum, read from its derived
/// `Deserialize` (which names them all when it asks for an enum).
fn variants<'de, T: serde::Deserialize<'de>>() -> &'static [&'static str] {
    struct Names(Option<&'static [&'static str]>);
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("stop")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Stop {
            Stop
        }
    }
    impl<'de> serde::Deserializer<'de> for &mut Names {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_enum<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            variants: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0 = Some(variants);
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map struct identifier ignored_any
        }
    }
    let mut names = Names(None);
    let _ = T::deserialize(&mut names);
    names.0.expect("an enum")
}

/// Every variant of every message enum has a golden file (and a sample): a
/// new variant without one fails here.
#[test]
fn every_message_variant_has_a_golden_file() {
    let named: BTreeMap<String, ()> = samples().into_iter().map(|s| (s.name, ())).collect();
    let newer: BTreeMap<String, ()> = newer().into_iter().map(|s| (s.name, ())).collect();
    let enums: [(&str, &[&str]); 7] = [
        ("Welcome", variants::<Welcome>()),
        ("WorkerMsg", variants::<WorkerMsg>()),
        ("CoordMsg", variants::<CoordMsg>()),
        ("ClientRequest", variants::<ClientRequest>()),
        ("ClientResponse", variants::<ClientResponse>()),
        ("BlobRequest", variants::<BlobRequest>()),
        ("BlobReply", variants::<BlobReply>()),
    ];
    let mut missing = Vec::new();
    for (name, variants) in enums {
        for v in variants {
            let file = format!("{name}.{v}");
            if newer.contains_key(&file) {
                continue;
            }
            if !named.contains_key(&file) || !dir().join(format!("{file}.bin")).exists() {
                missing.push(file);
            }
        }
    }
    // A viewer ticket never sends a Hello: it is the HTTP API's and the
    // dashboard's alone, and the client refuses to connect with it.
    for role in variants::<Role>().iter().filter(|r| **r != "Viewer") {
        if !dir().join(format!("Hello.{role}.bin")).exists() {
            missing.push(format!("Hello.{role}"));
        }
    }
    assert!(missing.is_empty(), "no golden file for {missing:?}");
}
