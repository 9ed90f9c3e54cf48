//! Rolling upgrades: a coordinator at protocol version N serves workers and
//! clients at N−1 and refuses N−2 with both versions named. The old peers
//! here speak version 18 over real QUIC to a real coordinator process:
//! their `Hello` says 18, they send the golden bytes version 18 wrote
//! (`protocol/golden/v18/`) where a fixed message does, and version 18's
//! bincode for the rest; every answer must come back in version 18's
//! encoding and decode into today's types.

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

/// What version 18 wrote for `name` (`Enum.Variant`).
fn golden(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("protocol/golden/v18")
        .join(format!("{name}.bin"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Connects saying `Hello` at version 18; the session speaks bincode.
async fn connect_v18(farm: &Farm, file: &str, name: &str) -> Session {
    let s = transport::connect_at(&ticket(farm, file), name, Timing::default(), 18)
        .await
        .unwrap();
    assert_eq!(s.control.codec(), Codec::Legacy, "accepted at version 18");
    s
}

/// Sends frames exactly as version 18 wrote them.
async fn send_golden(ch: &mut Channel, name: &str) {
    ch.send.write_all(&golden(name)).await.unwrap();
}

/// The next message, which must have come in version 18's encoding.
async fn recv_v18<T: serde::de::DeserializeOwned>(ch: &mut Channel) -> T {
    let msg = tokio::time::timeout(Duration::from_secs(30), ch.recv::<T>())
        .await
        .expect("an answer within 30 s")
        .expect("a message version 18 decodes")
        .expect("the stream open");
    assert_eq!(ch.peer_codec(), Some(Codec::Legacy), "answered in bincode");
    msg
}

async fn ask_v18(s: &mut Session, request: &ClientRequest) -> ClientResponse {
    s.control.send(request).await.unwrap();
    recv_v18(&mut s.control).await
}

/// Uploads `bytes` on a blob stream of its own, in version 18's encoding.
async fn put_v18(s: &Session, bytes: &[u8]) -> Digest {
    let digest = Digest::of(bytes);
    let mut ch = Channel::with_codec(s.connection.open_bi().await.unwrap(), Codec::Legacy);
    ch.send(&BlobRequest::Put {
        digest,
        len: bytes.len() as u64,
    })
    .await
    .unwrap();
    ch.send.write_all(bytes).await.unwrap();
    ch.send.finish().unwrap();
    match recv_v18::<BlobReply>(&mut ch).await {
        BlobReply::Stored => digest,
        other => panic!("upload: {other:?}"),
    }
}

/// Downloads a blob on a stream of its own, in version 18's encoding.
async fn get_v18(s: &Session, digest: Digest) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut ch = Channel::with_codec(s.connection.open_bi().await.unwrap(), Codec::Legacy);
    ch.send(&BlobRequest::Get { digest, job: None })
        .await
        .unwrap();
    ch.send.finish().unwrap();
    let len = match recv_v18::<BlobReply>(&mut ch).await {
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

/// A version 18 client submits (golden bytes first: refused with its kind,
/// then a real job), a version 18 worker joins with golden bytes, takes the
/// task and returns a result the coordinator accepts, the client sees the
/// job done and downloads its frame; a version 19 CLI works beside them.
#[test]
fn a_coordinator_serves_a_worker_and_a_client_one_version_behind() {
    assert_eq!(MIN_PROTOCOL_VERSION, 18, "these peers speak 18");
    let farm = Farm::start("rolling-v18", &[]);
    let rt = runtime();
    let scene = std::fs::read(scenes().join("spheres.scene.json")).unwrap();
    let (mut client, job) = rt.block_on(async {
        let mut c = connect_v18(&farm, "client.ticket", "artist-v18").await;
        // Version 18's own bytes of a submit whose files were never
        // uploaded: refused, and the refusal keeps its kind.
        send_golden(&mut c.control, "ClientRequest.Submit").await;
        match recv_v18::<ClientResponse>(&mut c.control).await {
            ClientResponse::Error(e) => assert_eq!(e.kind, ErrorKind::Invalid, "{e:?}"),
            other => panic!("{other:?}"),
        }
        send_golden(&mut c.control, "ClientRequest.Status").await;
        match recv_v18::<ClientResponse>(&mut c.control).await {
            ClientResponse::Status { jobs, .. } => assert!(jobs.is_empty(), "{jobs:?}"),
            ClientResponse::Error(e) => assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}"),
            other => panic!("{other:?}"),
        }
        // A real job: its scene uploaded on a version 18 blob stream.
        let digest = Digest::of(&scene);
        match ask_v18(&mut c, &ClientRequest::MissingBlobs(vec![digest])).await {
            ClientResponse::Missing(m) => assert_eq!(m, vec![digest]),
            other => panic!("{other:?}"),
        }
        assert_eq!(put_v18(&c, &scene).await, digest);
        let spec = JobSpec {
            request_id: None,
            name: "from-v18".into(),
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
        };
        let job = match ask_v18(&mut c, &ClientRequest::Submit(spec)).await {
            ClientResponse::Submitted(s) => s.id,
            other => panic!("{other:?}"),
        };
        (c, job)
    });

    // The version 18 worker: golden `Join` and `Heartbeat`, then a result.
    rt.block_on(async {
        let mut w = connect_v18(&farm, "worker.ticket", "worker-v18").await;
        send_golden(&mut w.control, "WorkerMsg.Join").await;
        send_golden(&mut w.control, "WorkerMsg.Heartbeat").await;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut joined = false;
        loop {
            assert!(Instant::now() < deadline, "no accepted result within 60 s");
            match recv_v18::<CoordMsg>(&mut w.control).await {
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

    // The version 18 client sees it done and downloads the frame; the
    // version 19 CLI beside it agrees.
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match ask_v18(&mut client, &ClientRequest::Status(Some(job))).await {
                ClientResponse::Status { jobs, .. } if jobs[0].state == JobState::Done => break,
                ClientResponse::Status { .. } => {}
                other => panic!("{other:?}"),
            }
            assert!(Instant::now() < deadline, "job {job} not done within 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let frames = match ask_v18(&mut client, &ClientRequest::Frames(job)).await {
            ClientResponse::Frames(f) => f,
            other => panic!("{other:?}"),
        };
        assert_eq!(frames.len(), 1, "{frames:?}");
        let bytes = get_v18(&client, frames[0].digest).await;
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
