//! Bad input gets a clear one-line error and loses nothing.

use std::process::Output;

use tessera_protocol::job::{Engine, JobSpec, ManifestEntry};
use tessera_protocol::messages::{ClientRequest, ClientResponse, ErrorKind};
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_transport::blob::{self, BlobError, BlobSource};
use tessera_transport::{self as transport, Timing};

use crate::harness::{scenes, tessera, Farm};

/// The command failed with exactly one line on stderr containing `needle`.
fn assert_one_line_error(out: &Output, needle: &str) {
    assert!(!out.status.success(), "expected failure, got success");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    assert!(err.contains(needle), "expected {needle:?} in {err:?}");
}

fn blob_files(farm: &Farm) -> usize {
    walk(&farm.data.join("blobs"))
}

fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let p = e.unwrap().path();
                if p.is_dir() {
                    if p.ends_with("tmp") {
                        0
                    } else {
                        walk(&p)
                    }
                } else {
                    1
                }
            })
            .sum()
        })
        .unwrap_or(0)
}

fn ticket(farm: &Farm, file: &str) -> Ticket {
    std::fs::read_to_string(farm.data.join(file))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn wrong_tickets_are_refused_with_one_line() {
    let farm = Farm::start("tickets", &[]);
    let scene = scenes().join("textured.scene.json");
    let scene = scene.to_str().unwrap();

    // A wrong secret.
    let mut bad = ticket(&farm, "client.ticket");
    bad.secret = "00".repeat(32);
    let out = tessera()
        .args(["status", "--ticket", &bad.to_string()])
        .output()
        .unwrap();
    assert_one_line_error(&out, "wrong client ticket secret");

    // The worker ticket cannot submit, checked before anything is sent...
    let out = tessera()
        .args(["submit", scene, "--ticket", &farm.worker_ticket()])
        .output()
        .unwrap();
    assert_one_line_error(&out, "this is a worker ticket");
    // ...and by the coordinator, for a client that claims the client role
    // with the worker secret.
    let mut forged = ticket(&farm, "client.ticket");
    forged.secret = ticket(&farm, "worker.ticket").secret;
    let out = tessera()
        .args(["submit", scene, "--ticket", &forged.to_string()])
        .output()
        .unwrap();
    assert_one_line_error(&out, "wrong client ticket secret");

    // A certificate other than the pinned one.
    let mut moved = ticket(&farm, "client.ticket");
    moved.fingerprint = "ab".repeat(32);
    let out = tessera()
        .args(["status", "--ticket", &moved.to_string()])
        .output()
        .unwrap();
    assert_one_line_error(&out, "cannot reach the coordinator");

    // No ticket at all.
    let out = tessera()
        .args(["status"])
        .env_remove("TESSERA_TICKET")
        .output()
        .unwrap();
    assert_one_line_error(&out, "no ticket");

    // A worker with a wrong secret stops with the reason instead of retrying forever.
    let mut bad_worker = ticket(&farm, "worker.ticket");
    bad_worker.secret = "11".repeat(32);
    let out = tessera()
        .args(["worker", "--ticket", &bad_worker.to_string(), "--cache-dir"])
        .arg(farm.dir.join("bad-cache"))
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_one_line_error(&out, "wrong worker ticket secret");
    assert_eq!(blob_files(&farm), 0, "nothing was uploaded");
}

#[test]
fn frames_outside_the_scene_are_refused_before_any_upload() {
    let farm = Farm::start("frames-out", &[]);
    let scene = scenes().join("textured.scene.json");
    let out = farm.run(&["submit", scene.to_str().unwrap(), "--frames", "3-9"]);
    assert_one_line_error(&out, "frame 5 is outside the scene's frame range 1-4");
    assert_eq!(blob_files(&farm), 0);
    let out = farm.run(&["submit", scene.to_str().unwrap(), "--frames", "two"]);
    assert_one_line_error(&out, "not a frame list");
    let out = farm.run(&["submit", scene.to_str().unwrap(), "--tiles", "4"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("COLSxROWS"));
    let out = farm.run(&["submit", "/nonexistent/x.scene.json"]);
    assert_one_line_error(&out, "does not exist");
    let out = farm.run(&["status", "99"]);
    assert_one_line_error(&out, "no job 99");
    // Nothing was created by any of it.
    let all = farm.json(&["status", "--json"]);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 0);
}

#[test]
fn corrupt_uploads_and_hostile_manifests_are_rejected_and_nothing_is_stored() {
    let farm = Farm::start("hostile", &[]);
    let ticket = ticket(&farm, "client.ticket");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut s = transport::connect(&ticket, "test", Timing::default())
            .await
            .unwrap();

        // Bytes that do not match the digest they claim.
        let claimed = Digest::of(b"the real texture");
        let err = blob::put(
            &s.connection,
            claimed,
            14,
            BlobSource::Bytes(b"a fake texture"),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, BlobError::Refused { .. }), "{err}");
        assert!(
            err.to_string().contains("does not match its digest"),
            "{err}"
        );
        s.control
            .send(&ClientRequest::MissingBlobs(vec![claimed]))
            .await
            .unwrap();
        match s.control.recv::<ClientResponse>().await.unwrap().unwrap() {
            ClientResponse::Missing(m) => {
                assert_eq!(m, vec![claimed], "the corrupt blob was not stored")
            }
            other => panic!("{other:?}"),
        }

        // A good blob, then manifests that try to leave the job folder.
        let good = b"{}".to_vec();
        let digest = Digest::of(&good);
        blob::put(&s.connection, digest, 2, BlobSource::Bytes(&good))
            .await
            .unwrap();
        for (path, needle) in [
            ("../../x", "climbs out of the job folder"),
            ("/etc/x", "is absolute"),
            ("a/\0/b", "NUL"),
            ("a//b", "empty"),
        ] {
            let spec = JobSpec {
                manifest: vec![ManifestEntry {
                    path: path.into(),
                    digest,
                    size: 2,
                    origin: None,
                    frame: None,
                }],
                resolution: (8, 8),
                ..JobSpec::new("hostile", Engine::Builtin, path)
            };
            s.control.send(&ClientRequest::Submit(spec)).await.unwrap();
            match s.control.recv::<ClientResponse>().await.unwrap().unwrap() {
                ClientResponse::Error(e) => {
                    assert_eq!(e.kind, ErrorKind::Invalid, "{path:?}: {e}");
                    assert!(e.message.contains(needle), "{path:?}: {e}")
                }
                other => panic!("{path:?} was accepted: {other:?}"),
            }
        }
        s.control.send(&ClientRequest::Status(None)).await.unwrap();
        match s.control.recv::<ClientResponse>().await.unwrap().unwrap() {
            ClientResponse::Status { jobs, .. } => {
                assert!(jobs.is_empty(), "no hostile job was created")
            }
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(blob_files(&farm), 1, "only the good blob is stored");
}
