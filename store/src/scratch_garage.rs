//! A private S3-compatible server for tests and benchmarks: Garage (a
//! distributed object store), one node, in a folder of its own, on ports of
//! its own on loopback, with one bucket and one key. It dies with its owner
//! (`PR_SET_PDEATHSIG`), and is stopped and removed on drop.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::s3::{Bucket, Endpoint, Location};

/// The Garage release tests use (`.ci/run` builds it once and keeps it).
pub const VERSION: &str = "2.5.0";

/// What a test that needs Garage says when there is none.
pub const NEEDED: &str = "Garage, an S3-compatible object store (cargo install --locked \
     garage@2.5.0, or set TESSERA_TEST_GARAGE to its binary)";

/// The bucket every scratch server holds.
pub const BUCKET: &str = "tessera";

const REGION: &str = "garage";
/// A fixed key (Garage's form: `GK` and 24 hex digits, a 64-digit secret):
/// a scratch server is private to its test.
const KEY_ID: &str = "GK0123456789abcdef01234567";
const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// Where Garage is: `$TESSERA_TEST_GARAGE`, else the binary `.ci/run`
/// keeps under `~/.cache/tessera-ci`, else `garage` on the `PATH`.
pub fn binary() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("TESSERA_TEST_GARAGE") {
        return Some(PathBuf::from(bin));
    }
    let cached = std::env::var_os("HOME").map(|home| {
        Path::new(&home).join(format!(".cache/tessera-ci/garage-{VERSION}/bin/garage"))
    });
    if let Some(bin) = cached.filter(|b| b.exists()) {
        return Some(bin);
    }
    let on_path = Command::new("garage").arg("--version").output();
    on_path
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("garage"))
}

/// A running scratch server.
pub struct ScratchGarage {
    dir: PathBuf,
    bin: PathBuf,
    server: Child,
    s3_port: u16,
    /// The network namespace it runs in (`ip netns exec`), if not this
    /// process's, and the address it listens on there.
    netns: Option<String>,
    ip: String,
}

impl ScratchGarage {
    /// Starts a one-node cluster named after `name` (a folder under the
    /// temporary dir), gives it its layout, the key and the bucket; returns
    /// once the bucket takes requests.
    pub fn start(name: &str) -> Result<ScratchGarage, String> {
        ScratchGarage::start_in(name, None, "127.0.0.1")
    }

    /// [`ScratchGarage::start`] in the network namespace `netns` (with
    /// `ip netns exec`; root), listening on `ip` there.
    pub fn start_in(name: &str, netns: Option<&str>, ip: &str) -> Result<ScratchGarage, String> {
        let bin = binary().ok_or_else(|| format!("no Garage here: {NEEDED}"))?;
        let dir = std::env::temp_dir().join(format!(
            "tessera-garage-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let [rpc, s3, admin] = free_ports()?;
        let secret: String = (0..32)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let config = format!(
            "metadata_dir = \"{d}/meta\"\ndata_dir = \"{d}/data\"\ndb_engine = \"lmdb\"\n\
             metadata_fsync = false\ndata_fsync = false\nreplication_factor = 1\n\
             rpc_bind_addr = \"{ip}:{rpc}\"\nrpc_public_addr = \"{ip}:{rpc}\"\n\
             rpc_secret = \"{secret}\"\n\n[s3_api]\ns3_region = \"{REGION}\"\n\
             api_bind_addr = \"{ip}:{s3}\"\nroot_domain = \".s3.garage.localhost\"\n\n\
             [admin]\napi_bind_addr = \"{ip}:{admin}\"\n",
            d = dir.display(),
        );
        let file =
            |name: &str| std::fs::File::create(dir.join(name)).map_err(|e| format!("{name}: {e}"));
        std::fs::write(dir.join("garage.toml"), config).map_err(|e| e.to_string())?;
        let mut command = in_netns(netns, &bin);
        command
            .arg("-c")
            .arg(dir.join("garage.toml"))
            .arg("server")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(file("garage.log")?)
            .stderr(file("garage.err")?);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let server = command
            .spawn()
            .map_err(|e| format!("cannot start Garage: {e}"))?;
        let mut scratch = ScratchGarage {
            dir,
            bin,
            server,
            s3_port: s3,
            netns: netns.map(str::to_string),
            ip: ip.to_string(),
        };
        scratch.set_up()?;
        Ok(scratch)
    }

    /// `garage ARGS` against it, as its operator runs it (`bucket deny
    /// --write …`); its output.
    pub fn cli(&self, args: &[&str]) -> Result<String, String> {
        self.garage(args)
    }

    fn garage(&self, args: &[&str]) -> Result<String, String> {
        let out = in_netns(self.netns.as_deref(), &self.bin)
            .arg("-c")
            .arg(self.dir.join("garage.toml"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("garage {}: {e}", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "garage {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn set_up(&mut self) -> Result<(), String> {
        let began = Instant::now();
        // `status` asks the server (`node id` only reads its key file).
        while let Err(e) = self.garage(&["status"]) {
            if let Ok(Some(exit)) = self.server.try_wait() {
                let err = std::fs::read_to_string(self.dir.join("garage.err")).unwrap_or_default();
                return Err(format!("Garage exited ({exit}): {}", err.trim()));
            }
            if began.elapsed() > Duration::from_secs(30) {
                return Err(format!("Garage did not start within 30 s: {e}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let id = self.garage(&["node", "id", "-q"])?;
        let id = id.trim().split('@').next().unwrap_or_default().to_string();
        self.garage(&["layout", "assign", "-z", "dc1", "-c", "1G", &id])?;
        self.garage(&["layout", "apply", "--version", "1"])?;
        self.garage(&["key", "import", "--yes", "-n", "tessera", KEY_ID, SECRET])?;
        self.garage(&["bucket", "create", BUCKET])?;
        self.garage(&[
            "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", "tessera",
        ])?;
        // The layout takes a moment to reach the S3 side; asked from the
        // server's namespace.
        let bucket = self.bucket("ready")?;
        let netns = self.netns.clone();
        std::thread::spawn(move || -> Result<(), String> {
            if let Some(ns) = &netns {
                enter(ns)?;
            }
            loop {
                match bucket.put("ready", b"") {
                    Ok(()) => return Ok(()),
                    Err(e) if began.elapsed() > Duration::from_secs(30) => {
                        return Err(format!("Garage's bucket took no request within 30 s: {e}"))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })
        .join()
        .map_err(|_| "the readiness check panicked".to_string())?
    }

    /// Its S3 endpoint, region and key.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new(&self.url(), REGION, KEY_ID, SECRET)
    }

    /// Its S3 endpoint's URL.
    pub fn url(&self) -> String {
        format!("http://{}:{}", self.ip, self.s3_port)
    }

    /// The variables that point a coordinator at it (`AWS_ENDPOINT_URL`,
    /// `AWS_REGION`, the key).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.url()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ACCESS_KEY_ID", KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
        ]
    }

    /// The bucket under `prefix`.
    pub fn bucket(&self, prefix: &str) -> Result<Bucket, String> {
        let location = Location::parse(&format!("s3://{BUCKET}/{prefix}"))?;
        Bucket::new(location, &self.endpoint())
    }

    /// Its folder (configuration, logs, data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// `program`, run in network namespace `netns` if one is given.
fn in_netns(netns: Option<&str>, program: &Path) -> Command {
    match netns {
        None => Command::new(program),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(program);
            c
        }
    }
}

/// Moves this thread into the network namespace `ns` (made by `ip netns
/// add`): the sockets it opens from now on are there.
fn enter(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(Path::new("/var/run/netns").join(ns))
        .map_err(|e| format!("network namespace {ns}: {e}"))?;
    // SAFETY: a valid descriptor of a network namespace, for this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "entering {ns}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Three ports free on loopback now (the server binds them a moment
/// later; another test taking one then fails that start, not silently).
fn free_ports() -> Result<[u16; 3], String> {
    let bind = || std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string());
    let held = [bind()?, bind()?, bind()?];
    let port = |l: &std::net::TcpListener| l.local_addr().map(|a| a.port()).unwrap_or(0);
    Ok([port(&held[0]), port(&held[1]), port(&held[2])])
}

impl Drop for ScratchGarage {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
