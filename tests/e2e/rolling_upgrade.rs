//! Rolling upgrades: a coordinator at protocol version N serves workers and
//! clients at N−1 and refuses N−2 with both versions named. The old peers
//! here speak `MIN_PROTOCOL_VERSION` over real QUIC to a real coordinator
//! process: their `Hello` says it, they send the golden bytes that version
//! wrote (`protocol/golden/vN/`) where a fixed message does, and that
//! version's codec for the rest; every answer must come back in that
//! version's encoding and decode into today's types.

use std::time::{Duration, Instant};

use tessera_protocol::codec::Codec;
use tessera_protocol::job::{Engine, JobSpec, ManifestEntry, OutputFormat, TileGrid};
use tessera_protocol::messages::{
    BlobReply, BlobRequest, ClientRequest, ClientResponse, CoordMsg, ErrorKind, JobState,
    WorkerMsg, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use tessera_protocol::Digest;
use tessera_transport::{self as transport, Channel, Session, Timing, TransportError};

use crate::harness::{scenes, Farm};
use crate::hostile::{runtime, ticket};

/// The old peers' version: the oldest the coordinator serves.
const OLD: u32 = MIN_PROTOCOL_VERSION;

/// The codec the old version speaks after its handshake.
fn old_codec() -> Codec {
    Codec::for_version(OLD).expect("served")
}

/// What the old version wrote for `name` (`Enum.Variant`).
fn golden(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("protocol/golden/v{OLD}"))
        .join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Connects saying `Hello` at the old version; the session speaks its codec.
async fn connect_old(farm: &Farm, file: &str, name: &str) -> Session {
    let s = transport::connect_at(&ticket(farm, file), name, Timing::default(), OLD)
        .await
        .unwrap();
    assert_eq!(s.control.codec(), old_codec(), "accepted at version {OLD}");
    s
}

/// Sends frames exactly as the old version wrote them.
async fn send_golden(ch: &mut Channel, name: &str) {
    ch.send.write_all(&golden(name)).await.unwrap();
}

/// The next message, which must have come in the old version's encoding.
async fn recv_old<T: serde::de::DeserializeOwned>(ch: &mut Channel) -> T {
    let msg = tokio::time::timeout(Duration::from_secs(30), ch.recv::<T>())
        .await
        .expect("an answer within 30 s")
        .expect("a message the old version decodes")
        .expect("the stream open");
    assert_eq!(ch.peer_codec(), Some(old_codec()), "answered in its codec");
    msg
}

async fn ask_old(s: &mut Session, request: &ClientRequest) -> ClientResponse {
    s.control.send(request).await.unwrap();
    recv_old(&mut s.control).await
}

/// Uploads `bytes` on a blob stream of its own, in the old encoding.
async fn put_old(s: &Session, bytes: &[u8]) -> Digest {
    let digest = Digest::of(bytes);
    let mut ch = Channel::with_codec(s.connection.open_bi().await.unwrap(), old_codec());
    ch.send(&BlobRequest::Put {
        digest,
        len: bytes.len() as u64,
    })
    .await
    .unwrap();
    ch.send.write_all(bytes).await.unwrap();
    ch.send.finish().unwrap();
    match recv_old::<BlobReply>(&mut ch).await {
        BlobReply::Stored => digest,
        other => panic!("upload: {other:?}"),
    }
}

/// Downloads a blob on a stream of its own, in the old encoding.
async fn get_old(s: &Session, digest: Digest) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut ch = Channel::with_codec(s.connection.open_bi().await.unwrap(), old_codec());
    ch.send(&BlobRequest::Get { digest, job: None })
        .await
        .unwrap();
    ch.send.finish().unwrap();
    let len = match recv_old::<BlobReply>(&mut ch).await {
        BlobReply::Found { len } => len,
        other => panic!("download: {other:?}"),
    };
    let mut bytes = Vec::new();
    (&mut ch.recv)
        .take(len)
        .read_to_end(&mut bytes)
        .await
        .unwrap();
    bytes
}

/// An RGB PNG of `width` × `height`: what a builtin tile result is.
fn png(width: u32, height: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.write_header()
        .unwrap()
        .write_image_data(&vec![128; (width * height * 3) as usize])
        .unwrap();
    out
}

/// A client one version behind submits (golden bytes first: refused with
/// its kind, then a real job), a worker one version behind joins with
/// golden bytes, takes the task and returns a result the coordinator
/// accepts, the client sees the job done and downloads its frame; today's
/// CLI works beside them.
#[test]
fn a_coordinator_serves_a_worker_and_a_client_one_version_behind() {
    assert_eq!(
        OLD,
        PROTOCOL_VERSION - 1,
        "these peers are one version behind"
    );
    let farm = Farm::start("rolling-old", &[]);
    let rt = runtime();
    let scene = std::fs::read(scenes().join("spheres.scene.json")).unwrap();
    let (mut client, job) = rt.block_on(async {
        let mut c = connect_old(&farm, "client.ticket", "artist-old").await;
        // The old version's own bytes of a submit whose files were never
        // uploaded: refused, and the refusal keeps its kind.
        send_golden(&mut c.control, "ClientRequest.Submit").await;
        match recv_old::<ClientResponse>(&mut c.control).await {
            ClientResponse::Error(e) => assert_eq!(e.kind, ErrorKind::Invalid, "{e:?}"),
            other => panic!("{other:?}"),
        }
        send_golden(&mut c.control, "ClientRequest.Status").await;
        match recv_old::<ClientResponse>(&mut c.control).await {
            ClientResponse::Status { jobs, .. } => assert!(jobs.is_empty(), "{jobs:?}"),
            ClientResponse::Error(e) => assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}"),
            other => panic!("{other:?}"),
        }
        // A real job: its scene uploaded on an old version's blob stream.
        let digest = Digest::of(&scene);
        match ask_old(&mut c, &ClientRequest::MissingBlobs(vec![digest])).await {
            ClientResponse::Missing(m) => assert_eq!(m, vec![digest]),
            other => panic!("{other:?}"),
        }
        assert_eq!(put_old(&c, &scene).await, digest);
        let spec = JobSpec {
            request_id: None,
            name: "from-old".into(),
            engine: Engine::Builtin,
            scene: "spheres.scene.json".into(),
            manifest: vec![ManifestEntry {
                path: "spheres.scene.json".into(),
                digest,
                size: scene.len() as u64,
                origin: None,
                frame: None,
            }],
            frames: vec![1],
            tiles: TileGrid { cols: 1, rows: 1 },
            sample_ranges: 1,
            samples: 1,
            resolution: (192, 108),
            priority: 0,
            output: OutputFormat::Png,
            blender: None,
            output_name: None,
            unreal: None,
            finish: false,
            verify_percent: 0,
            after: vec![],
            after_failure: Default::default(),
            paused: false,
            deadline_unix_ms: None,
            budget: None,
            task_timeout_ms: None,
            render_format: None,
            encode: None,
            host: None,
            warnings: Vec::new(),
        };
        let job = match ask_old(&mut c, &ClientRequest::Submit(spec)).await {
            ClientResponse::Submitted(s) => s.id,
            other => panic!("{other:?}"),
        };
        (c, job)
    });

    // The old worker: golden `Join` and `Heartbeat`, then a result.
    rt.block_on(async {
        let mut w = connect_old(&farm, "worker.ticket", "worker-old").await;
        send_golden(&mut w.control, "WorkerMsg.Join").await;
        send_golden(&mut w.control, "WorkerMsg.Heartbeat").await;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut joined = false;
        loop {
            assert!(Instant::now() < deadline, "no accepted result within 60 s");
            match recv_old::<CoordMsg>(&mut w.control).await {
                CoordMsg::Joined { .. } => joined = true,
                CoordMsg::Assign(spec) => {
                    assert!(joined, "joined before its first task");
                    assert_eq!(spec.task.job, job);
                    send_golden(&mut w.control, "WorkerMsg.Heartbeat").await;
                    let bytes = png(spec.tile.width, spec.tile.height);
                    let done = WorkerMsg::Done {
                        task: spec.task,
                        output: Digest::of(&bytes),
                        render_ms: 5,
                        inline: Some(bytes),
                    };
                    w.control.send(&done).await.unwrap();
                }
                CoordMsg::Ack {
                    accepted, reason, ..
                } => {
                    assert!(accepted, "refused: {reason:?}");
                    break;
                }
                _ => {}
            }
        }
    });

    // The old client sees it done and downloads the frame; today's CLI
    // beside it agrees.
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match ask_old(&mut client, &ClientRequest::Status(Some(job))).await {
                ClientResponse::Status { jobs, .. } if jobs[0].state == JobState::Done => break,
                ClientResponse::Status { .. } => {}
                other => panic!("{other:?}"),
            }
            assert!(Instant::now() < deadline, "job {job} not done within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let frames = match ask_old(&mut client, &ClientRequest::Frames(job)).await {
            ClientResponse::Frames(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(frames.len(), 1, "{frames:?}");
        let bytes = get_old(&client, frames[0].digest).await;
        assert_eq!(Digest::of(&bytes), frames[0].digest);
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG frame");
    });
    assert_eq!(farm.status(job)["state"], "done");
}

/// A peer two versions behind is refused, told both sides' versions; so is
/// one newer than the coordinator.
#[test]
fn a_peer_two_versions_behind_is_refused_with_both_versions_named() {
    let farm = Farm::start("rolling-v17", &[]);
    let rt = runtime();
    for (file, version) in [
        ("worker.ticket", PROTOCOL_VERSION - 2),
        ("client.ticket", PROTOCOL_VERSION - 2),
        ("client.ticket", PROTOCOL_VERSION + 1),
    ] {
        let t = ticket(&farm, file);
        let got = rt.block_on(transport::connect_at(&t, "old", Timing::default(), version));
        let reason = match got {
            Err(TransportError::Version(reason)) => reason,
            Err(e) => panic!("{file} at {version}: {e}"),
            Ok(_) => panic!("{file} at {version} was accepted"),
        };
        let both = format!("speaks versions {PROTOCOL_VERSION} and {MIN_PROTOCOL_VERSION}");
        assert!(
            reason.contains(&both) && reason.contains(&format!("peer speaks version {version}")),
            "{reason}"
        );
    }
}
