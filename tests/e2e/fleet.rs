//! `tessera fleet` end to end: the fleet process rents nodes for a submit on
//! an empty farm, replaces a node killed mid-job and releases idle nodes;
//! on Docker, a worker image is built here from this machine's files
//! (`fleet/image/build-local.sh`: one `docker import`, nothing downloaded,
//! no registry; `TESSERA_TEST_WORKER_IMAGE=release` takes the release
//! image of `fleet/image/build.sh` instead, as `.ci/nightly` does) and the
//! providers' lifecycles are played on its
//! containers for real: `docker pause`/`unpause` (a Vast.ai instance
//! outbid and resumed), `docker stop` with a grace period (a RunPod spot
//! stop, a Kubernetes eviction: SIGTERM, drain), `docker kill` (a node that
//! vanishes) and `docker network disconnect` (a partition). Budgets reached
//! mid-job stop dispatch or cancel, and `status` says why.
//!
//! What is real: the coordinator, the workers (processes or containers of
//! the image), the fleet process and its policy, Docker. What stands in:
//! the price a node is billed at (the fleet file says it; no provider bills
//! these nodes).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{assert_frames_match_reference_samples, field, scenes, tessera, Farm};
use crate::requires::{require, Need};

/// A `tessera fleet run` process and its status file.
struct Fleet {
    child: Child,
    status: PathBuf,
    log: PathBuf,
}

impl Fleet {
    fn start(farm: &Farm, toml: &str) -> Fleet {
        let config = farm.dir.join("fleet.toml");
        std::fs::write(&config, toml).unwrap();
        let status = farm.dir.join("fleet.json");
        let log = farm.dir.join("fleet.log");
        let child = tessera()
            .args(["fleet", "run", "--tick-ms", "250", "--config"])
            .arg(&config)
            .arg("--status-file")
            .arg(&status)
            .env("TESSERA_TICKET", farm.client_ticket())
            // A provider's key in the fleet's environment: it must reach
            // no node.
            .env("VAST_API_KEY", "provider-key-secret")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Fleet { child, status, log }
    }

    fn status(&self) -> Value {
        std::fs::read(&self.status)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null)
    }

    /// Polls the status file until `pred` holds (120 s at most).
    fn wait(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = self.status();
            if !s.is_null() && pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the fleet to {what}; status {s}; log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the fleet with SIGKILL, as a crash or a dead machine would:
    /// it releases nothing.
    fn kill(mut self) {
        signal(self.child.id() as i32, "-KILL");
        let _ = self.child.wait();
    }

    /// Stops the fleet as a user would (SIGTERM): it releases its nodes.
    fn stop(mut self) -> Value {
        signal(self.child.id() as i32, "-TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "fleet exited with {status}");
        self.status()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // The fleet releases its nodes on SIGTERM.
            signal(self.child.id() as i32, "-TERM");
            let _ = self.child.wait();
        }
    }
}

/// Sends a signal to a process this test started (directly or through
/// the fleet it started).
fn signal(pid: i32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

fn nodes(s: &Value) -> Vec<String> {
    (s["nodes"].as_array().into_iter().flatten())
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect()
}

fn released(s: &Value, reason: &str) -> Vec<String> {
    (s["released"].as_array().into_iter().flatten())
        .filter(|r| r["reason"] == reason)
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

/// Whether worker `name` holds a task now (the coordinator says so).
fn rendering(farm: &Farm, name: &str) -> bool {
    let all = farm.json(&["status", "--json"]);
    (all["workers"].as_array().unwrap().iter())
        .any(|w| w["name"] == name && w["running"].as_u64().unwrap_or(0) > 0)
}

fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pred() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (job, task) of every "result accepted" line in these logs: each must
/// appear once.
fn assert_accepted_once(logs: &[String], tasks_total: u64) {
    let mut seen = HashSet::new();
    for text in logs {
        for line in text.lines().filter(|l| l.contains("result accepted")) {
            let key = (field(line, "job").unwrap(), field(line, "task").unwrap());
            assert!(seen.insert(key), "task {key:?} accepted twice");
        }
    }
    assert_eq!(seen.len() as u64, tasks_total, "every task accepted once");
}

/// A builtin job due in a few seconds: the fleet rents as many nodes as it
/// may, and keeps them while there is work.
fn submit(farm: &Farm, frames: &str, tiles: &str, samples: &str) -> u64 {
    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        frames,
        "--tiles",
        tiles,
        "--samples",
        samples,
        "--deadline",
        "5s",
        "--json",
    ]);
    job["id"].as_u64().unwrap()
}

/// The pid of the `tessera worker --name NAME` process (started by the
/// fleet this test started).
fn worker_pid(name: &str) -> Option<i32> {
    let want = format!("worker\0--name\0{name}\0");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(&want) {
                return Some(pid);
            }
        }
    }
    None
}

#[test]
fn a_local_fleet_starts_nodes_for_a_submit_replaces_a_killed_one_and_stops_them_when_idle() {
    let farm = Farm::start("t15a-fleet-local", &["--http"]);
    let fleet = Fleet::start(
        &farm,
        r#"
        worker_ticket = { file = "data/worker.ticket" }
        max_nodes = 2
        idle_timeout_secs = 3
        name_prefix = "t15a-local-"
        worker_args = ["--engine", "builtin", "--slots", "1"]
        [[provider]]
        kind = "local"
        usd_per_hour = 0.36
        work_dir = "fleet-workers"
        "#,
    );
    // An empty farm rents nothing.
    let s = fleet.wait("start", |_| true);
    assert!(nodes(&s).is_empty(), "nodes rented for nothing: {s}");

    let job = submit(&farm, "1-4", "2x2", "128");
    let s = fleet.wait("rent two nodes", |s| nodes(s).len() == 2);
    let first = nodes(&s)[0].clone();
    // The coordinator has the fleet's report too: the dashboard's farm
    // page shows the rented nodes and what they are billed.
    let client = crate::hostile::ticket(&farm, "client.ticket");
    let addr = crate::harness::http_addr(&farm);
    wait_until("the fleet's report on the coordinator", || {
        let (code, body) = crate::harness::http_call(&client, addr, "GET", "/v1/fleet", "");
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let named: Vec<&str> = (v["report"]["nodes"].as_array().into_iter().flatten())
            .filter_map(|n| n["name"].as_str())
            .collect();
        code == 200 && named.len() == 2 && named.contains(&first.as_str())
    });
    wait_until("a fleet node mid-render", || rendering(&farm, &first));
    let pid = worker_pid(&first).expect("the node's worker process");
    assert_node_gets_no_secret(&farm, pid as u32);
    // The worker the fleet (started by this test) started.
    signal(pid, "-KILL");
    let s = fleet.wait("replace the killed node", |s| {
        s["replaced"].as_u64() >= Some(1) && nodes(s).len() == 2 && !nodes(s).contains(&first)
    });
    assert!(released(&s, "vanished").contains(&first), "{s}");

    let out = farm.dir.join("out");
    let done = farm.wait_done(job, &out);
    assert_frames_match_reference_samples(
        &out,
        &scenes().join("demo.scene.json"),
        &[1, 2, 3, 4],
        128,
    );
    // Nothing queued: every node is released by the idle timeout.
    let s = fleet.wait("release idle nodes", |s| nodes(s).is_empty());
    assert!(released(&s, "idle").len() >= 2, "{s}");
    let names: Vec<String> = (s["released"].as_array().unwrap().iter())
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    for name in &names {
        assert_eq!(
            worker_pid(name),
            None,
            "{name} still runs after its release"
        );
    }
    let logs: Vec<String> = (names.iter())
        .map(|n| {
            std::fs::read_to_string(farm.dir.join("fleet-workers").join(n).join("worker.log"))
                .unwrap_or_default()
        })
        .collect();
    assert_accepted_once(&logs, done["tasks_total"].as_u64().unwrap());
    // Billed from launch to release, beside what the leases cost.
    assert!(s["billed_usd"].as_f64().unwrap() > 0.0, "{s}");
    assert!(
        s["billed_usd"].as_f64().unwrap() + 1e-9 >= s["attributed_to_jobs_usd"].as_f64().unwrap(),
        "{s}"
    );
    fleet.stop();
}

#[test]
fn a_budget_reached_mid_job_stops_dispatch_or_cancels_and_status_says_why() {
    let mut farm = Farm::start("t15a-budget", &[]);
    // $360/h is $0.10 a second of lease: a budget of $0.30 lasts a few tasks.
    farm.add_worker_with(
        "w1",
        &[
            "--engine",
            "builtin",
            "--price-per-hour",
            "360",
            "--slots",
            "1",
        ],
    );
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let submit_budget = |action: &str| {
        farm.json(&[
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-8",
            "--tiles",
            "2x2",
            "--samples",
            "64",
            "--budget-usd",
            "0.3",
            "--on-budget",
            action,
            "--json",
        ])["id"]
            .as_u64()
            .unwrap()
    };
    let job = submit_budget("stop-dispatch");
    let s = farm.wait_for(job, "the budget to stop dispatch", |s| {
        s["blocked"].as_str().is_some_and(|b| b.contains("budget")) && s["tasks_running"] == 0
    });
    assert!(
        s["tasks_done"].as_u64().unwrap() < s["tasks_total"].as_u64().unwrap(),
        "{s}"
    );
    assert!(s["cost_usd"].as_f64().unwrap() >= 0.3, "{s}");
    assert_eq!(s["budget_usd"], 0.3);
    let why = s["blocked"].as_str().unwrap();
    assert!(why.contains("no more tasks are handed out"), "{why}");
    // Nothing more starts: the worker goes idle (its own count follows its
    // next report) while the job waits. A task it had begun before the
    // budget was reached may still finish (the coordinator can learn of
    // its start after it counted it as not running), so the count is
    // taken once the worker is idle, and holds over its next reports.
    wait_until("the worker to be idle", || {
        farm.json(&["status", "--json"])["workers"][0]["running"] == 0
    });
    let done_then = farm.status(job)["tasks_done"].clone();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert_eq!(farm.status(job)["tasks_done"], done_then);
    let text = farm.run(&["status", &job.to_string()]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("budget"),
        "plain status says why"
    );
    farm.run(&["cancel", &job.to_string()]);

    let job = submit_budget("cancel");
    let s = farm.wait_for(job, "the budget to cancel the job", |s| {
        s["state"] == "canceled"
    });
    assert!(
        s["error"]
            .as_str()
            .unwrap()
            .contains("budget of $0.30 is reached"),
        "{s}"
    );
    assert!(
        s["tasks_done"].as_u64().unwrap() < s["tasks_total"].as_u64().unwrap(),
        "{s}"
    );
}

/// The docker bridge's gateway: an address of this machine the containers
/// reach (the coordinator listens there).
fn bridge_gateway() -> String {
    let inspect = |format: &str| {
        let out = Command::new("docker")
            .args(["network", "inspect", "bridge", "--format", format])
            .output()
            .unwrap();
        assert!(out.status.success(), "docker network inspect bridge failed");
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let gateway = inspect("{{range .IPAM.Config}}{{.Gateway}}{{end}}");
    if !gateway.is_empty() {
        return gateway;
    }
    // Some daemons leave Gateway empty: the bridge's address is then the
    // first of its subnet (172.17.0.0/16 → 172.17.0.1).
    let subnet = inspect("{{range .IPAM.Config}}{{.Subnet}}{{end}}");
    let net: std::net::Ipv4Addr = subnet.split('/').next().unwrap().parse().unwrap();
    std::net::Ipv4Addr::from(u32::from(net) + 1).to_string()
}

/// `docker pause`: the cgroup freezer gives up ("unable to freeze") when
/// it cannot stop every process of the container in time, as when one is
/// in an uninterruptible disk wait on a loaded machine; freezing again
/// then succeeds, as an operator's second try would.
fn docker_pause(name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("docker")
            .args(["pause", name])
            .output()
            .unwrap();
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unable to freeze") && Instant::now() < deadline,
            "docker pause {name}: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Builds the worker image the Docker tests run: by default the small one
/// of `fleet/image/build-local.sh` (this binary and its libraries, one
/// `docker import`, cached by content: seconds, nothing downloaded); with
/// `TESSERA_TEST_WORKER_IMAGE=release`, the release image of
/// `fleet/image/build.sh` (a Debian base by debootstrap, cached by its
/// content tag once built; needs root and debootstrap).
fn build_image() -> String {
    let release = match std::env::var("TESSERA_TEST_WORKER_IMAGE").as_deref() {
        Err(_) | Ok("") | Ok("local") => false,
        Ok("release") => true,
        Ok(other) => panic!("TESSERA_TEST_WORKER_IMAGE={other}: expected `local` or `release`"),
    };
    let script = if release {
        "build.sh"
    } else {
        "build-local.sh"
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fleet/image")
        .join(script);
    let out = Command::new(&script)
        .arg(env!("CARGO_BIN_EXE_tessera"))
        .arg("t15a-tessera-worker")
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the worker image did not build ({})",
        script.display()
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A fleet node rendering now, other than `not`, and not one the fleet is
/// scaling down (draining): taking that one away would need no replacement.
fn busy_node(farm: &Farm, fleet: &Fleet, not: &[&String]) -> String {
    let mut found = None;
    wait_until("a fleet node mid-render", || {
        let live = nodes(&fleet.status());
        let all = farm.json(&["status", "--json"]);
        let busy = |name: &String| {
            (all["workers"].as_array().unwrap().iter())
                .any(|w| w["name"] == name.as_str() && w["state"] == "busy")
        };
        found = live.into_iter().find(|n| !not.contains(&n) && busy(n));
        found.is_some()
    });
    found.unwrap()
}

#[test]
#[ignore = "needs Docker"]
fn docker_fleet_plays_pause_stop_kill_and_partition_on_worker_containers() {
    require(Need::Docker);
    let image = build_image();
    let gateway = bridge_gateway();
    let farm = Farm::start_in("t15a-fleet-docker", &[], None, &gateway);
    let fleet = Fleet::start(
        &farm,
        &format!(
            r#"
            worker_ticket = {{ file = "data/worker.ticket" }}
            image = "{image}"
            max_nodes = 2
            idle_timeout_secs = 3
            name_prefix = "t15a-dock-"
            worker_args = ["--engine", "builtin", "--slots", "1"]
            [[provider]]
            kind = "docker"
            usd_per_hour = 0.5
            work_dir = "container-logs"
            options = {{ stop_timeout_secs = 10 }}
            "#
        ),
    );
    let job = submit(&farm, "1-4", "2x2", "512");
    let s = fleet.wait("rent two containers", |s| nodes(s).len() == 2);
    let (a, b) = (nodes(&s)[0].clone(), nodes(&s)[1].clone());
    let _ = &b;
    // The ticket is in a file mounted read-only, never in the container's
    // arguments or environment; nothing of the fleet's environment (a
    // provider's key, the client ticket) is either.
    let ticket = std::fs::read_to_string(farm.data.join("worker.ticket")).unwrap();
    let secret = ticket.trim().rsplit("secret=").next().unwrap().to_string();
    let inspect = docker(&["inspect", &a]);
    for leak in [
        secret.as_str(),
        "provider-key-secret",
        farm.client_ticket().trim(),
    ] {
        assert!(
            !inspect.contains(leak),
            "docker inspect shows a secret: {inspect}"
        );
    }
    let env = docker(&["inspect", "--format", "{{json .Config.Env}}", &a]);
    assert!(!env.contains("TICKET"), "a ticket variable: {env}");
    assert!(!env.contains("VAST_API_KEY"), "the fleet's key: {env}");

    // 1. Outbid (Vast.ai): paused without notice, disk kept. Its lease
    // expires and its task renders elsewhere; the fleet counts it gone and
    // rents another; resumed, it is taken back with its cache.
    wait_until("a mid-render", || rendering(&farm, &a));
    docker_pause(&a);
    let s = fleet.wait("count the paused node gone and rent another", |s| {
        nodes(s).len() == 3
            && (s["nodes"].as_array().unwrap().iter())
                .any(|n| n["name"] == a.as_str() && n["state"] == "paused")
    });
    let _replacement = nodes(&s).into_iter().find(|n| *n != a && *n != b).unwrap();
    docker(&["unpause", &a]);
    fleet.wait("take the resumed node back", |s| {
        (s["nodes"].as_array().unwrap().iter())
            .any(|n| n["name"] == a.as_str() && n["state"] == "running")
    });
    wait_until("the resumed worker to rejoin", || {
        let all = farm.json(&["status", "--json"]);
        (all["workers"].as_array().unwrap().iter())
            .any(|w| w["name"] == a.as_str() && w["state"] != "silent")
    });
    let cached = docker(&["exec", &a, "sh", "-c", "ls /home/tessera/cache | wc -l"]);
    assert!(
        cached.parse::<u32>().unwrap() > 0,
        "the resumed node lost its cache"
    );

    // 2. Spot stop / eviction: SIGTERM with a grace period; the worker
    // hands its leases back and leaves; the fleet replaces it.
    let b = busy_node(&farm, &fleet, &[&a]);
    docker(&["stop", "--time", "10", &b]);
    fleet.wait("replace the stopped node", |s| !nodes(s).contains(&b));

    // 3. Vanishes: SIGKILL, no goodbye.
    let c = busy_node(&farm, &fleet, &[&a, &b]);
    docker(&["kill", &c]);
    fleet.wait("replace the killed node", |s| !nodes(s).contains(&c));

    // 4. Partition: a node drops off the network, its leases expire, and
    // when it is back it rejoins.
    let d = busy_node(&farm, &fleet, &[&b, &c]);
    docker(&["network", "disconnect", "bridge", &d]);
    wait_until("the partitioned node's lease to expire", || {
        !rendering(&farm, &d)
    });
    docker(&["network", "connect", "bridge", &d]);

    let out = farm.dir.join("out");
    let done = farm.wait_done(job, &out);
    assert_frames_match_reference_samples(
        &out,
        &scenes().join("demo.scene.json"),
        &[1, 2, 3, 4],
        512,
    );
    let s = fleet.wait("release every container", |s| nodes(s).is_empty());
    assert!(s["replaced"].as_u64().unwrap() >= 2, "{s}");
    let mut logs = Vec::new();
    for r in s["released"].as_array().unwrap() {
        let name = r["name"].as_str().unwrap();
        assert!(
            Command::new("docker")
                .args(["inspect", name])
                .output()
                .unwrap()
                .status
                .code()
                != Some(0),
            "container {name} left behind"
        );
        logs.push(
            std::fs::read_to_string(farm.dir.join("container-logs").join(format!("{name}.log")))
                .unwrap_or_default(),
        );
    }
    assert_accepted_once(&logs, done["tasks_total"].as_u64().unwrap());
    fleet.stop();
}

/// Ends what a failed crash test may leave (workers of `prefix` outside any
/// fleet): their own bound would end them too, later.
struct Leftovers {
    prefix: &'static str,
    docker: bool,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if self.docker {
            let names = Command::new("docker")
                .args(["ps", "--all", "--format", "{{.Names}}"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
                .unwrap_or_default();
            for n in names.lines().filter(|n| n.starts_with(self.prefix)) {
                let _ = Command::new("docker").args(["rm", "--force", n]).output();
            }
            return;
        }
        for i in 1..=16 {
            if let Some(pid) = worker_pid(&format!("{}{i}", self.prefix)) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
    }
}

/// The fleet file of the crash tests: two nodes, released after 3 s idle,
/// their workers leaving by themselves after 15 s idle.
fn crash_fleet_file(prefix: &str, provider: &str) -> String {
    format!(
        r#"
        worker_ticket = {{ file = "data/worker.ticket" }}
        max_nodes = 2
        idle_timeout_secs = 3
        node_exit_after_idle_secs = 15
        name_prefix = "{prefix}"
        worker_args = ["--engine", "builtin", "--slots", "1"]
        {provider}
        "#
    )
}

/// `kill -9` of `tessera fleet run` with two nodes rendering: the nodes go
/// on; the fleet started again lists both as its own (adopted) and
/// releases them when idle. Then, with no fleet started again, the nodes'
/// workers leave by themselves once idle for the bound. `alive` says
/// whether a node's worker runs, as the test sees it from outside.
fn crash_and_adopt(farm: &Farm, toml: &str, alive: &dyn Fn(&str) -> bool) -> Vec<String> {
    // Each step says how long it took, and a job that never finishes fails
    // its step with the farm's status rather than the whole test's clock.
    let began = Instant::now();
    let step = |what: &str| eprintln!("{:6.1} s  {what}", began.elapsed().as_secs_f64());
    let wait_done = |job: u64, out: &str| {
        let out = farm.dir.join(out);
        // Generous: two nodes in containers on a shared 2-core machine.
        let args = ["wait", &job.to_string(), "--json", "--timeout", "300s"];
        let mut args = args.to_vec();
        args.extend(["--output", out.to_str().unwrap()]);
        let done = farm.run(&args);
        assert!(
            done.status.success(),
            "job {job} not done: {}; status {}; workers {}",
            String::from_utf8_lossy(&done.stderr),
            farm.status(job),
            farm.json(&["status", "--json"])["workers"]
        );
    };
    let fleet = Fleet::start(farm, toml);
    let job = submit(farm, "1-4", "2x2", "128");
    let s = fleet.wait("rent two nodes", |s| nodes(s).len() == 2);
    let first = nodes(&s);
    step("rented two nodes");
    wait_until("both nodes mid-render", || {
        first.iter().all(|n| rendering(farm, n))
    });
    step("both render; killing the fleet");
    fleet.kill();
    for n in &first {
        assert!(alive(n), "{n} died with its fleet");
    }
    let again = Fleet::start(farm, toml);
    let s = again.wait("adopt both nodes", |s| {
        let adopted: Vec<String> = (s["nodes"].as_array().into_iter().flatten())
            .filter(|n| n["adopted"] == true)
            .map(|n| n["name"].as_str().unwrap().to_string())
            .collect();
        adopted == first
    });
    step(&format!("adopted after the crash: {}", s["nodes"]));
    wait_done(job, "out1");
    step("the job is done");
    let s = again.wait("release the adopted nodes when idle", |s| {
        nodes(s).is_empty()
    });
    let idle = released(&s, "idle");
    for n in &first {
        assert!(idle.contains(n), "{n} not released as idle: {s}");
        wait_until("the released node to stop", || !alive(n));
    }
    step("released both when idle");

    // No fleet comes back: the nodes stop by themselves.
    let job = submit(farm, "1-4", "2x2", "128");
    let s = again.wait("rent two new nodes", |s| nodes(s).len() == 2);
    let second = nodes(&s);
    step("rented two new nodes");
    assert!(
        second.iter().all(|n| !first.contains(n)),
        "names reused: {s}"
    );
    wait_until("both new nodes mid-render", || {
        second.iter().all(|n| rendering(farm, n))
    });
    step("both render; killing the fleet");
    again.kill();
    let killed = Instant::now();
    for n in &second {
        assert!(alive(n), "{n} died with its fleet");
    }
    wait_done(job, "out2");
    let done = killed.elapsed();
    for n in &second {
        wait_until("the orphaned node's worker to leave by itself", || {
            !alive(n)
        });
    }
    eprintln!(
        "fleet killed; job done {:.1} s later; orphaned workers gone {:.1} s after the kill (bound 15 s idle)",
        done.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    second
}

#[test]
fn a_fleet_killed_with_sigkill_adopts_its_local_nodes_and_orphans_leave_by_themselves() {
    let farm = Farm::start("t25-fleet-crash-local", &[]);
    let _left = Leftovers {
        prefix: "t25-local-",
        docker: false,
    };
    let provider = r#"
        [[provider]]
        kind = "local"
        usd_per_hour = 0.36
        work_dir = "fleet-workers"
        "#;
    let toml = crash_fleet_file("t25-local-", provider);
    crash_and_adopt(&farm, &toml, &|n| worker_pid(n).is_some());
}

#[test]
#[ignore = "needs Docker"]
fn a_fleet_killed_with_sigkill_adopts_its_containers_and_orphans_leave_by_themselves() {
    require(Need::Docker);
    let image = build_image();
    let gateway = bridge_gateway();
    let farm = Farm::start_in("t25-fleet-crash-docker", &[], None, &gateway);
    let _left = Leftovers {
        prefix: "t25-dock-",
        docker: true,
    };
    let provider = format!(
        r#"
        image = "{image}"
        [[provider]]
        kind = "docker"
        usd_per_hour = 0.5
        work_dir = "container-logs"
        options = {{ stop_timeout_secs = 10 }}
        "#
    );
    let toml = crash_fleet_file("t25-dock-", &provider);
    let running = |n: &str| {
        let out = Command::new("docker")
            .args(["inspect", "--format", "{{.State.Running}}", n])
            .output()
            .unwrap();
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "true"
    };
    let orphans = crash_and_adopt(&farm, &toml, &running);
    for n in &orphans {
        // Stopped by its own worker's clean exit, not killed.
        assert_eq!(
            docker(&["inspect", "--format", "{{.State.ExitCode}}", n]),
            "0"
        );
    }
}

/// A local node's worker (pid `pid`): its ticket comes in a file named on
/// its command line, and its environment holds only the allow-listed part
/// of the fleet's: no worker ticket, no client ticket, no provider key.
fn assert_node_gets_no_secret(farm: &Farm, pid: u32) {
    let ticket = std::fs::read_to_string(farm.data.join("worker.ticket")).unwrap();
    let secret = ticket.trim().rsplit("secret=").next().unwrap().to_string();
    let client = farm.client_ticket();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    for var in environ.split(|b| *b == 0).filter(|v| !v.is_empty()) {
        let var = String::from_utf8_lossy(var);
        let (name, value) = var.split_once('=').unwrap_or((&var, ""));
        assert!(
            tessera_fleet::provider::node_env_allowed(name),
            "{name} reached a fleet node"
        );
        assert!(!value.contains(&secret), "{name} carries the worker ticket");
        assert!(
            !value.contains(client.trim()),
            "{name} carries the client ticket"
        );
        assert!(
            !value.contains("provider-key-secret"),
            "{name} carries a key"
        );
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(&secret),
        "the ticket is on the node's command line"
    );
}
