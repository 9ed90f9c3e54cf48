//! The test farm: a coordinator and workers as real `tessera` processes on
//! 127.0.0.1, client commands run as a user would run them, and helpers that
//! read what the processes logged and rendered.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_coordinator::scratch_postgres::ScratchPostgres;
use tessera_store::scratch_garage::{ScratchGarage, BUCKET};
use tessera_worker::engine::builtin;

// Also included by the benches (`#[path]`): a path from this file.
#[path = "reference.rs"]
mod reference;

/// Farms are heavy on a 2-core machine: one at a time.
static ONE_FARM: Mutex<()> = Mutex::new(());

/// The `tessera` binary farms run: this build's, or another a benchmark
/// names ([`use_binary`]) to measure two builds side by side.
static BINARY: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Runs farms started from now on with `binary` (`None`: this build's).
#[allow(dead_code)]
pub fn use_binary(binary: Option<PathBuf>) {
    *BINARY.lock().unwrap_or_else(|e| e.into_inner()) = binary;
}

pub fn binary() -> PathBuf {
    (BINARY.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tessera")))
}

pub fn tessera() -> Command {
    Command::new(binary())
}

/// The `tessera` binary, run in network namespace `netns` when given
/// (`ip netns exec` execs it: the child's pid is tessera's).
fn in_netns(netns: Option<&str>) -> Command {
    match netns {
        None => tessera(),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(binary());
            c
        }
    }
}

pub fn scenes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenes")
}

pub struct Worker {
    pub log: PathBuf,
    child: Option<Child>,
}

pub struct Farm {
    pub dir: PathBuf,
    pub data: PathBuf,
    coordinator: Option<Child>,
    coordinator_args: Vec<String>,
    /// Environment variables for the next coordinator start.
    pub coordinator_env: Vec<(String, String)>,
    coordinator_starts: u32,
    pub workers: Vec<Worker>,
    /// The network namespace the coordinator and client commands run in,
    /// and the address the coordinator listens on there.
    netns: Option<String>,
    /// The one client commands run in (the coordinator's unless
    /// [`Farm::run_clients_in`] says otherwise).
    client_netns: Option<String>,
    listen_ip: String,
    /// The PostgreSQL server holding the coordinator's state, when it is
    /// not the data dir's SQLite file (dropped after the coordinator).
    postgres: Option<ScratchPostgres>,
    /// The farm's object store, if its assets are in a bucket.
    garage: Option<ScratchGarage>,
    /// The farm's name (its prefix in the bucket).
    name: String,
    _lock: MutexGuard<'static, ()>,
}

/// Where a farm's coordinator keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The data dir's SQLite file (the default).
    Sqlite,
    /// A scratch PostgreSQL server of the test's own (`--state`).
    Postgres,
    /// PostgreSQL as above, and the assets in a bucket of a scratch Garage
    /// server (an S3-compatible object store) of the test's own (`--blobs
    /// s3://…`, its endpoint and key in the AWS variables).
    PostgresS3,
}

impl Farm {
    /// A coordinator with `args` added to its command line (e.g. lease timing).
    pub fn start(name: &str, args: &[&str]) -> Farm {
        Farm::start_in(name, args, None, "127.0.0.1")
    }

    /// A coordinator with `args` and environment variables `env`.
    pub fn start_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Farm {
        let mut farm = Farm::start_in_stopped(name, args, None, "127.0.0.1");
        farm.coordinator_env = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        farm.start_coordinator();
        farm
    }

    /// A farm whose coordinator and client commands run in network
    /// namespace `netns` (`ip netns exec`), listening on `listen_ip`.
    pub fn start_in(name: &str, args: &[&str], netns: Option<&str>, listen_ip: &str) -> Farm {
        Farm::start_in_state(name, args, netns, listen_ip, State::Sqlite)
    }

    /// A coordinator in network namespace `netns`, listening on
    /// `listen_ip`, with `args` and environment variables `env`.
    #[allow(dead_code)]
    pub fn start_in_with_env(
        name: &str,
        args: &[&str],
        netns: Option<&str>,
        listen_ip: &str,
        env: &[(&str, &str)],
    ) -> Farm {
        let mut farm = Farm::start_in_stopped(name, args, netns, listen_ip);
        farm.coordinator_env = (env.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        farm.start_coordinator();
        farm
    }

    /// A coordinator with `args`, its state kept as `state` says.
    pub fn start_with_state(name: &str, args: &[&str], state: State) -> Farm {
        Farm::start_in_state(name, args, None, "127.0.0.1", state)
    }

    /// As [`Farm::start_in`], the state kept as `state` says.
    pub fn start_in_state(
        name: &str,
        args: &[&str],
        netns: Option<&str>,
        listen_ip: &str,
        state: State,
    ) -> Farm {
        let mut farm = Farm::start_in_stopped(name, args, netns, listen_ip);
        if matches!(state, State::Postgres | State::PostgresS3) {
            // Without PostgreSQL here this fails, naming what to install.
            let server = ScratchPostgres::start(name).expect("a scratch PostgreSQL");
            farm.coordinator_env
                .push(("TESSERA_STATE".into(), server.url()));
            farm.postgres = Some(server);
        }
        if state == State::PostgresS3 {
            // Without Garage here this fails, naming what to install.
            // In the coordinator's network namespace, on its address.
            let garage = ScratchGarage::start_in(name, netns, listen_ip).expect("a scratch Garage");
            (farm.coordinator_env).extend(garage.env().into_iter().map(|(k, v)| (k.into(), v)));
            (farm.coordinator_args).extend(["--blobs".into(), format!("s3://{BUCKET}/{name}")]);
            farm.garage = Some(garage);
        }
        farm.start_coordinator();
        farm
    }

    /// As [`Farm::start_in`], its state in `server`, which the
    /// coordinator reaches at `url` (over TCP, say, where a Unix socket
    /// would cross the namespace).
    pub fn start_in_on_postgres(
        name: &str,
        args: &[&str],
        netns: Option<&str>,
        listen_ip: &str,
        server: ScratchPostgres,
        url: String,
    ) -> Farm {
        let mut farm = Farm::start_in_stopped(name, args, netns, listen_ip);
        farm.coordinator_env.push(("TESSERA_STATE".into(), url));
        farm.postgres = Some(server);
        farm.start_coordinator();
        farm
    }

    /// Client commands run in network namespace `netns` from now on
    /// (None: this process's).
    pub fn run_clients_in(&mut self, netns: Option<&str>) {
        self.client_netns = netns.map(str::to_string);
    }

    /// The farm's folders, its coordinator not started yet.
    fn start_in_stopped(name: &str, args: &[&str], netns: Option<&str>, listen_ip: &str) -> Farm {
        let lock = ONE_FARM.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("tessera-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Farm {
            data: dir.join("data"),
            dir,
            coordinator: None,
            coordinator_args: args.iter().map(|s| s.to_string()).collect(),
            coordinator_env: Vec::new(),
            coordinator_starts: 0,
            workers: Vec::new(),
            netns: netns.map(str::to_string),
            client_netns: netns.map(str::to_string),
            listen_ip: listen_ip.to_string(),
            postgres: None,
            garage: None,
            name: name.to_string(),
            _lock: lock,
        }
    }

    pub fn start_coordinator(&mut self) {
        assert!(self.coordinator.is_none(), "coordinator already running");
        self.coordinator_starts += 1;
        let log = std::fs::File::create(
            self.dir
                .join(format!("coordinator-{}.log", self.coordinator_starts)),
        )
        .unwrap();
        let listen = format!("{}:0", self.listen_ip);
        let mut child = in_netns(self.netns.as_deref())
            .args(["coordinator", "--listen", &listen, "--data-dir"])
            .arg(&self.data)
            .args(&self.coordinator_args)
            .env("RUST_LOG", "info")
            .envs(self.coordinator_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start coordinator");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        // Keep reading so the coordinator never writes into a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        assert!(
            line.starts_with(&format!(
                "tessera coordinator listening on {}:",
                self.listen_ip
            )),
            "coordinator said {line:?}"
        );
        if self.postgres.is_some() {
            assert!(
                !self.data.join("state.sqlite").exists(),
                "the state is in PostgreSQL, not in the data dir"
            );
        }
        self.coordinator = Some(child);
    }

    /// On a farm whose assets are in a bucket, removes the coordinator's
    /// own copy (`DATA_DIR/blobs`) while it is stopped: it starts again as
    /// a coordinator on another machine would, with only the bucket.
    #[allow(dead_code)]
    pub fn forget_local_blobs_if_in_a_bucket(&mut self) {
        assert!(self.coordinator.is_none(), "the coordinator is stopped");
        if self.garage.is_some() {
            std::fs::remove_dir_all(self.data.join("blobs")).expect("the folder goes");
        }
    }

    /// On a farm whose assets are in a bucket: every frame of `job` is in
    /// the bucket, not only in the coordinator's folder.
    #[allow(dead_code)]
    /// The farm's object store, on a farm whose assets are in a bucket.
    #[allow(dead_code)]
    pub fn garage(&self) -> &ScratchGarage {
        self.garage
            .as_ref()
            .expect("a farm with its assets in a bucket")
    }

    pub fn assert_frames_in_the_bucket(&self, job: u64) {
        let Some(garage) = &self.garage else {
            return;
        };
        self.assert_frames_in(&garage.bucket(&self.name).expect("the farm's bucket"), job);
    }

    /// Every frame of `job` is in `bucket`, whole.
    pub fn assert_frames_in(&self, bucket: &tessera_store::s3::Bucket, job: u64) {
        let frames = self.db().frames(job).expect("the job's frames");
        assert!(!frames.is_empty(), "job {job} has no frames");
        for f in frames {
            let kept = bucket.head(&format!("blobs/{}", f.digest.to_hex()));
            assert_eq!(
                kept.expect("the bucket answers"),
                Some(f.size),
                "frame {} of job {job}",
                f.frame
            );
        }
    }

    /// Restarts the farm's PostgreSQL server (a fast shutdown: every
    /// connection closed, every commit kept).
    #[allow(dead_code)]
    pub fn restart_postgres(&mut self) {
        (self.postgres.as_mut().expect("a farm on PostgreSQL"))
            .restart()
            .expect("PostgreSQL starts again");
    }

    /// Stops the farm's PostgreSQL server until [`Farm::start_postgres`].
    #[allow(dead_code)]
    pub fn stop_postgres(&mut self) {
        (self.postgres.as_mut().expect("a farm on PostgreSQL")).stop_for_now();
    }

    /// Starts the farm's PostgreSQL server again.
    #[allow(dead_code)]
    pub fn start_postgres(&mut self) {
        (self.postgres.as_mut().expect("a farm on PostgreSQL"))
            .start_again()
            .expect("PostgreSQL starts again");
    }

    /// The coordinator's database, opened beside it (SQLite in the data
    /// dir, or the farm's PostgreSQL server).
    #[allow(dead_code)]
    pub fn db(&self) -> tessera_coordinator::db::Db {
        let url = self.postgres.as_ref().map(ScratchPostgres::url);
        tessera_coordinator::db::Db::open_state(&self.data, url.as_deref())
            .expect("the state opens")
    }

    /// The running coordinator's process id (for the memory benchmark).
    #[allow(dead_code)]
    pub fn coordinator_pid(&self) -> u32 {
        self.coordinator.as_ref().expect("coordinator running").id()
    }

    /// Waits for the coordinator to end by itself (a failpoint), at most
    /// `limit`.
    pub fn wait_coordinator_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let mut child = self.coordinator.take().expect("coordinator running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the coordinator is still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill_coordinator(&mut self) {
        let mut child = self.coordinator.take().expect("coordinator running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn worker_ticket(&self) -> String {
        format!("@{}", self.data.join("worker.ticket").display())
    }

    pub fn client_ticket(&self) -> String {
        format!("@{}", self.data.join("client.ticket").display())
    }

    /// Starts a worker process with one render thread.
    pub fn add_worker(&mut self, name: &str) -> usize {
        self.add_worker_with(name, &[])
    }

    pub fn add_worker_with(&mut self, name: &str, args: &[&str]) -> usize {
        self.add_worker_env(name, args, &[])
    }

    /// A worker with extra arguments and environment variables.
    pub fn add_worker_env(&mut self, name: &str, args: &[&str], env: &[(&str, &str)]) -> usize {
        let netns = self.netns.clone();
        self.add_worker_in(netns.as_deref(), name, args, env)
    }

    /// A worker in network namespace `netns` (None: this process's).
    pub fn add_worker_in(
        &mut self,
        netns: Option<&str>,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let log = self.dir.join(format!("worker-{name}.log"));
        let child = in_netns(netns)
            .args([
                "worker",
                "--ticket",
                &self.worker_ticket(),
                "--name",
                name,
                "--threads",
                "1",
                "--cache-dir",
            ])
            .arg(self.dir.join(format!("cache-{name}")))
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start worker");
        self.workers.push(Worker {
            log,
            child: Some(child),
        });
        self.workers.len() - 1
    }

    pub fn worker_pid(&self, i: usize) -> u32 {
        self.workers[i].child.as_ref().expect("worker running").id()
    }

    /// Waits for a worker process to exit by itself.
    pub fn wait_worker_exit(&mut self, i: usize, limit: Duration) -> std::process::ExitStatus {
        let child = self.workers[i].child.as_mut().expect("worker running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.workers[i].child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "worker {i} did not exit");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL a worker.
    pub fn kill_worker(&mut self, i: usize) {
        let mut child = self.workers[i].child.take().expect("worker running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// A client command with the client ticket, to spawn. The test
    /// studio's asset library is shared: the scene generator's
    /// `--external` folders (`DIR/external`, `DIR/v45/external`,
    /// `DIR/v34/external`), as a studio names its library in
    /// `TESSERA_ASSET_ROOTS`; a missing one is left out.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = in_netns(self.client_netns.as_deref());
        let roots = ["external", "v45/external", "v34/external"].map(|r| self.dir.join(r));
        c.args(args)
            .env("TESSERA_TICKET", self.client_ticket())
            .env("TESSERA_ASSET_ROOTS", std::env::join_paths(roots).unwrap());
        c
    }

    /// Runs a client command with the client ticket.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs a client command that must succeed and print one JSON object.
    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "tessera {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "tessera {args:?} printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Submits frame 1 of `demo.scene.json` in `tiles` at 256 samples, so
    /// that each tile renders for a good fraction of a second; returns the
    /// job id.
    pub fn submit_demo_frame(&self, tiles: &str) -> u64 {
        let scene = scenes().join("demo.scene.json");
        let job = self.json(&[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1",
            "--tiles",
            tiles,
            "--samples",
            "256",
            "--json",
        ]);
        job["id"].as_u64().unwrap()
    }

    /// `wait JOB --json --output OUT`: blocks until the job ends, checks
    /// that it is done, and returns its final status.
    pub fn wait_done(&self, job: u64, out: &Path) -> Value {
        let done = self.json(&[
            "wait",
            &job.to_string(),
            "--json",
            "--output",
            out.to_str().unwrap(),
        ]);
        assert_eq!(done["state"], "done", "job {job} did not finish: {done}");
        done
    }

    pub fn status(&self, job: u64) -> Value {
        self.json(&["status", &job.to_string(), "--json"])
    }

    /// Waits until `n` workers have joined. A worker joins once it has
    /// probed its Blender: importing `bpy` took over 60 s on the 2-core
    /// machine under a load of 12, hence the long deadline.
    pub fn wait_workers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let s = self.json(&["status", "--json"]);
            if s["workers"].as_array().unwrap().len() >= n {
                return;
            }
            assert!(Instant::now() < deadline, "workers did not join: {s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until worker `i` (named `name`) has rendered a task of `job`
    /// and is caught in the middle of another: the coordinator counts a
    /// task running on it (with pipelined leases, its next one is counted
    /// too), and no render of it ends around the check.
    pub fn wait_mid_render(&self, job: u64, i: usize, name: &str) {
        let running = || {
            let all = self.json(&["status", "--json"]);
            (all["workers"].as_array().unwrap().iter())
                .any(|w| w["name"] == name && w["running"].as_u64().is_some_and(|r| r >= 1))
        };
        self.wait_for(job, &format!("{name} mid-render"), |s| {
            assert!(
                s["state"] != "done",
                "job {job} finished before {name} was caught mid-render \
                 (its tasks are too short for this test): {s}"
            );
            let rendered = self.log_of(i).matches("task rendered").count();
            let holds = rendered > 0 && running();
            std::thread::sleep(Duration::from_millis(50));
            holds && running() && self.log_of(i).matches("task rendered").count() == rendered
        });
    }

    /// Polls the job until `pred` holds.
    pub fn wait_for(&self, job: u64, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = self.status(job);
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last status {s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (job, task) of every "task rendered" line any worker logged.
    pub fn renders(&self) -> Vec<(u64, u32)> {
        self.log_events("task rendered")
    }

    /// (job, task) of every result the coordinator acknowledged as accepted.
    pub fn accepted(&self) -> Vec<(u64, u32)> {
        self.log_events("result accepted")
    }

    /// Results a worker held across a coordinator restart and was told the
    /// task was already done (its acknowledgement died with the old run).
    /// A coordinator that a worker rejoins holding a finished task that is
    /// done tells it to drop the task; killed before it answered the
    /// result sent again, only its own log says so.
    pub fn refused_as_already_done(&self) -> Vec<(u64, u32)> {
        let event = "is already done; this duplicate result was dropped";
        let mut out = self.log_events(event);
        for line in (self.coordinator_log().lines())
            .filter(|l| l.contains("not re-adopted") && l.contains(event))
        {
            out.push((
                field(line, "job").unwrap(),
                field(line, "task").unwrap() as u32,
            ));
        }
        out
    }

    fn log_events(&self, event: &str) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        for w in &self.workers {
            let text = std::fs::read_to_string(&w.log).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains(event)) {
                out.push((
                    field(line, "job").unwrap(),
                    field(line, "task").unwrap() as u32,
                ));
            }
        }
        out
    }

    /// Everything every coordinator run of this farm logged.
    pub fn coordinator_log(&self) -> String {
        (1..=self.coordinator_starts)
            .map(|i| {
                std::fs::read_to_string(self.dir.join(format!("coordinator-{i}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    pub fn log_of(&self, i: usize) -> String {
        std::fs::read_to_string(&self.workers[i].log).unwrap_or_default()
    }
}

/// The number after ` NAME=` in a log line.
pub fn field(line: &str, name: &str) -> Option<u64> {
    let start = line.find(&format!(" {name}="))? + name.len() + 2;
    line[start..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

impl Drop for Farm {
    fn drop(&mut self) {
        for w in &mut self.workers {
            if let Some(c) = &mut w.child {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(c) = &mut self.coordinator {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("farm files kept for inspection in {}", self.dir.display());
        }
    }
}

pub fn png_pixels(path: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    builtin::decode_png_rgb(&bytes).unwrap()
}

/// Asserts `dir` holds exactly the scene's `frames`, each pixel-identical to
/// a whole-frame render made here.
pub fn assert_frames_match_reference(dir: &Path, scene: &Path, frames: &[u32]) {
    check_frames(dir, scene, frames, None)
}

/// The same, for a job submitted with `--samples`.
pub fn assert_frames_match_reference_samples(
    dir: &Path,
    scene: &Path,
    frames: &[u32],
    samples: u32,
) {
    check_frames(dir, scene, frames, Some(samples))
}

fn check_frames(dir: &Path, scene: &Path, frames: &[u32], samples: Option<u32>) {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let want: Vec<_> = frames.iter().map(|f| format!("frame_{f:04}.png")).collect();
    assert_eq!(names, want);
    for &f in frames {
        let got = png_pixels(&dir.join(format!("frame_{f:04}.png")));
        assert!(
            reference::matches(scene, f, samples, &got),
            "frame {f} differs from the whole-frame render"
        );
    }
}

/// Deterministic bytes that do not repeat (xorshift64).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn http_addr(farm: &Farm) -> std::net::SocketAddr {
    let url = std::fs::read_to_string(farm.data.join("http.url")).unwrap();
    let host = url.trim().trim_start_matches("https://");
    host.trim_end_matches('/').parse().unwrap()
}

/// An HTTP/1.1 connection over TLS pinned to the coordinator's certificate
/// (`ticket`'s fingerprint), reads timing out after 60 s.
pub fn pinned_tls(
    ticket: &tessera_protocol::ticket::Ticket,
    addr: std::net::SocketAddr,
) -> rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream> {
    let mut tls = tessera_transport::client_tls(&ticket.fingerprint).unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(tls), name).unwrap();
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    rustls::StreamOwned::new(conn, tcp)
}

/// `METHOD PATH` with `body` (JSON) and the client ticket's secret, over
/// pinned TLS: the status code and the answer's body.
pub fn http_call(
    ticket: &tessera_protocol::ticket::Ticket,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = pinned_tls(ticket, addr);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        ticket.secret,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = Vec::new();
    // The coordinator closes after answering; TLS may end without a
    // close_notify, which is an error here but not a lost answer.
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = (text.strip_prefix("HTTP/1.1 "))
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

/// (bytes written to storage, write syscalls) of process `pid`, from
/// `/proc/PID/io`.
#[allow(dead_code)]
pub fn io_writes(pid: u32) -> (u64, u64) {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let field = |name: &str| -> u64 {
        (io.lines())
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    (field("write_bytes:"), field("syscw:"))
}

/// Resident memory of process `pid`, MiB.
#[allow(dead_code)]
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: f64 = (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}

/// Whether process `pid` has ended: gone, or a zombie not yet reaped.
#[allow(dead_code)]
pub fn process_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'),
    }
}
