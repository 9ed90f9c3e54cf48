//! The object store of `deploy/`, set up as its files say: the Compose
//! file's Garage configuration and its one-time commands (the Kubernetes
//! manifests give the same), run as written against a real Garage server,
//! make a bucket a coordinator keeps a farm's assets and frames in.
//! (Docker cannot pull the images here; the Compose file and the
//! manifests are validated offline in `fleet/tests/cloud/manifests.rs`.)

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_store::s3::{Bucket, Endpoint, Location};
use tessera_store::scratch_garage;

use crate::harness::*;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The `garage` commands a file's comments tell the operator to run once,
/// each as its arguments (after `PREFIX/garage `).
fn setup_commands(file: &Path, prefix: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap();
    let lead = format!("#   {prefix} /garage ");
    (text.lines())
        .filter_map(|l| l.strip_prefix(&lead))
        .map(|rest| {
            let command = rest.split('#').next().unwrap();
            command.split_whitespace().map(str::to_string).collect()
        })
        .collect()
}

/// A Garage server started from the Compose file's `garage.toml`, its
/// folders and ports moved to this test's own (the rest as written), its
/// RPC secret in `GARAGE_RPC_SECRET` as the Compose file passes it.
struct Garage {
    dir: PathBuf,
    bin: PathBuf,
    server: Child,
    s3: u16,
    secret: String,
}

impl Garage {
    fn start(config: &str) -> Garage {
        let bin = scratch_garage::binary()
            .unwrap_or_else(|| panic!("no Garage here: {}", scratch_garage::NEEDED));
        let dir =
            std::env::temp_dir().join(format!("tessera-e2e-deploy-garage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let (rpc, s3) = (port(), port());
        let mut moved = config.to_string();
        for (from, to) in [
            ("/var/lib/garage", dir.to_str().unwrap().to_string()),
            ("[::]:3901", format!("127.0.0.1:{rpc}")),
            ("127.0.0.1:3901", format!("127.0.0.1:{rpc}")),
            ("[::]:3900", format!("127.0.0.1:{s3}")),
        ] {
            assert!(moved.contains(from), "garage.toml has no {from}");
            moved = moved.replace(from, &to);
        }
        assert!(!moved.contains("rpc_secret"), "the secret is in the file");
        std::fs::write(dir.join("garage.toml"), moved).unwrap();
        let secret: String = (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let log = std::fs::File::create(dir.join("garage.log")).unwrap();
        let mut command = Command::new(&bin);
        command
            .arg("-c")
            .arg(dir.join("garage.toml"))
            .arg("server")
            .env("GARAGE_RPC_SECRET", &secret)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let server = command.spawn().expect("start Garage");
        Garage {
            dir,
            bin,
            server,
            s3,
            secret,
        }
    }

    /// `garage ARGS` as the operator runs it (`exec` in the container: the
    /// same configuration and secret).
    fn run(&self, args: &[String]) -> Result<String, String> {
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(self.dir.join("garage.toml"))
            .args(args)
            .env("GARAGE_RPC_SECRET", &self.secret)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value after `label` on a line of `text` (`Key ID: GK…`).
fn labelled<'a>(text: &'a str, label: &str) -> &'a str {
    (text.lines())
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in {text}"))
        .trim()
}

#[test]
#[ignore = "needs Garage"]
fn the_deploy_files_store_set_up_as_written_keeps_a_farms_frames() {
    let compose = deploy().join("compose");
    let commands = setup_commands(&compose.join("compose.yaml"), "docker compose exec garage");
    let kubernetes = deploy().join("kubernetes/coordinators/garage.yaml");
    assert_eq!(
        setup_commands(&kubernetes, "kubectl -n tessera exec tessera-garage-0 --"),
        commands,
        "the Kubernetes manifests set the store up as the Compose file does"
    );
    assert_eq!(commands.len(), 6, "{commands:?}");
    // One configuration in both places.
    let config = std::fs::read_to_string(compose.join("garage.toml")).unwrap();
    let manifest = std::fs::read_to_string(&kubernetes).unwrap();
    let in_map: String = (manifest.lines())
        .skip_while(|l| !l.contains("garage.toml: |"))
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    let settings = |text: &str| -> Vec<String> {
        (text.lines())
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    assert_eq!(settings(&in_map), settings(&config));

    let garage = Garage::start(&config);
    let began = Instant::now();
    let status = loop {
        match garage.run(&commands[0]) {
            Ok(out) => break out,
            Err(e) => {
                assert!(
                    began.elapsed() < Duration::from_secs(30),
                    "garage status: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    // "prints the node's ID": the first word of the line below the header.
    let id = (status.lines())
        .skip_while(|l| !l.starts_with("ID"))
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no node ID in {status}"))
        .to_string();
    let mut key = String::new();
    for command in &commands[1..] {
        let args: Vec<String> = (command.iter())
            .map(|a| {
                if a == "NODE_ID" {
                    id.clone()
                } else {
                    a.clone()
                }
            })
            .collect();
        let out = garage
            .run(&args)
            .unwrap_or_else(|e| panic!("garage {args:?}: {e}"));
        if args[..2] == ["key", "create"] {
            key = out;
        }
    }
    let (key_id, secret) = (labelled(&key, "Key ID:"), labelled(&key, "Secret key:"));

    // The coordinator as the Compose file starts it: the bucket and prefix
    // it names, the region, the key the commands printed.
    let blobs = "s3://tessera/farm";
    let text = std::fs::read_to_string(compose.join("compose.yaml")).unwrap();
    assert!(text.contains(&format!("- {blobs}\n")), "{blobs}");
    assert!(text.contains("AWS_REGION: garage\n"));
    let endpoint = format!("http://127.0.0.1:{}", garage.s3);
    let env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "garage"),
        ("AWS_ACCESS_KEY_ID", key_id),
        ("AWS_SECRET_ACCESS_KEY", secret),
    ];
    let mut farm = Farm::start_with_env("deploy-garage", &["--blobs", blobs], &env);
    farm.add_worker("w1");
    let job = farm.submit_demo_frame("2x2");
    farm.wait_done(job, &farm.dir.join("out"));

    let bucket = Bucket::new(
        Location::parse(blobs).unwrap(),
        &Endpoint::new(&endpoint, "garage", key_id, secret),
    )
    .unwrap();
    farm.assert_frames_in(&bucket, job);
}
