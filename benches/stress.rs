//! The coordinator under stress (issue 26), run on real processes on
//! 127.0.0.1 (`cargo bench --bench stress`): nothing here asserts a time,
//! each run prints what it measured.
//!
//! (a) stress: 10,000 queued jobs no worker can take (builtin jobs; the
//!     workers offer only the no-op engine), a webhook receiver, a
//!     1,000,000-frame job that 8 no-op workers (200 ms a task) render
//!     while a client `wait`s on it, a garbage collection and a scrub, all
//!     at once. Printed: `GET /v1/jobs/ID` latency (p50, p99, max, over 30
//!     s of polling every 100 ms), heartbeat gaps and runtime stalls (from
//!     `/metrics`, where the build has them), lease expiries; then, with
//!     the job paused and the webhook outbox delivered (nothing changing),
//!     the database's write syscalls and bytes per second over 30 s
//!     (`/proc/PID/io`); coordinator RSS; and SIGTERM with the job running
//!     again: how long the coordinator takes to end, and whether every
//!     result a worker was told was accepted is there after a restart.
//!     With `TESSERA_BENCH_BEFORE=/path/to/an/older/tessera`, the same on
//!     that build first, and both side by side.
//! (b) memory: 2,000 `tessera status --json` calls, 4 at a time, on an
//!     empty coordinator (RSS after ÷ RSS before, target 1.5x); and 2,000
//!     one-task jobs submitted by `tessera submit`, 4 at a time, all done
//!     by 2 no-op workers: RSS then ÷ RSS after a restart on the same data
//!     dir (target 1.5x). Both builds too, when the older one is given.
//!
//! `TESSERA_BENCH_STRESS_JOBS` and `TESSERA_BENCH_STRESS_FRAMES` scale (a)
//! down for a quick look.

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::{http_addr, http_call, io_writes as io, process_ended, rss_mib, scenes, Farm};
use serde_json::Value;

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    let before = std::env::var_os("TESSERA_BENCH_BEFORE").map(PathBuf::from);
    let builds: Vec<(&str, Option<PathBuf>)> = match before {
        Some(b) => vec![("before", Some(b)), ("after", None)],
        None => {
            println!("(TESSERA_BENCH_BEFORE unset: this build only)");
            vec![("after", None)]
        }
    };
    if run("stress") {
        let rows: Vec<(&str, Stress)> = (builds.iter())
            .map(|(label, bin)| {
                harness::use_binary(bin.clone());
                (*label, stress(label))
            })
            .collect();
        print_stress(&rows);
    }
    if run("memory") {
        for (label, bin) in &builds {
            harness::use_binary(bin.clone());
            memory(label);
        }
    }
    harness::use_binary(None);
}

/// What one stress run measured.
#[derive(Default)]
struct Stress {
    jobs: usize,
    frames: u32,
    submit_s: f64,
    status_ms: Vec<f64>,
    status_failed: usize,
    metrics: Option<Value>,
    lease_expiries: Option<f64>,
    webhooks: u64,
    rest_syscw_per_s: f64,
    rest_bytes_per_s: f64,
    rest_db_changed: bool,
    rss_mib: f64,
    sigterm_ms: f64,
    acked: usize,
    acked_kept: usize,
    /// Client commands the coordinator did not carry out, with why.
    refused: Vec<String>,
}

fn env_or(name: &str, default: u64) -> u64 {
    (std::env::var(name).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn stress(label: &str) -> Stress {
    let jobs = env_or("TESSERA_BENCH_STRESS_JOBS", 10_000) as usize;
    let frames = env_or("TESSERA_BENCH_STRESS_FRAMES", 1_000_000) as u32;
    let receiver = Receiver::start();
    let hook = format!("http://127.0.0.1:{}/hook", receiver.port);
    let mut farm = Farm::start_with_env(
        &format!("stress-{label}"),
        &[
            "--http",
            "127.0.0.1:0",
            "--webhook",
            &hook,
            "--scrub-mb-per-sec",
            "200",
        ],
        &[("TESSERA_WEBHOOK_SECRET", "stress-secret")],
    );
    let ticket: tessera_protocol::ticket::Ticket =
        std::fs::read_to_string(farm.data.join("client.ticket"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    let addr = http_addr(&farm);
    let mut out = Stress {
        jobs,
        frames,
        ..Stress::default()
    };
    for i in 0..8 {
        farm.add_worker_with(
            &format!("noop-{i}"),
            &["--engine", "noop", "--noop-ms", "200", "--slots", "1"],
        );
    }
    farm.wait_workers(8);
    let scene = long_scene(&farm.dir, frames);
    let scene = scene.to_str().unwrap();

    // The long job, rendering while everything else happens.
    let big = farm.json(&[
        "submit",
        scene,
        "--engine",
        "noop",
        "--frames",
        &format!("1-{frames}"),
        "--name",
        "million",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    // The blocked jobs: builtin, which no worker here offers.
    let spec = farm.json(&["submit", scene, "--frames", "1", "--upload-only"]);
    let started = Instant::now();
    let failed = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (spec, ticket, failed) = (&spec, &ticket, &failed);
            s.spawn(move || {
                for i in (t..jobs).step_by(4) {
                    let mut spec = spec.clone();
                    spec["name"] = Value::from(format!("blocked-{i}"));
                    let (code, _) = http_call(ticket, addr, "POST", "/v1/jobs", &spec.to_string());
                    if code != 201 {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    out.submit_s = started.elapsed().as_secs_f64();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "a blocked job's submit failed"
    );

    // 30 s of load: a client waits on the long job, another polls its
    // status, a garbage collection runs, the scrub goes on.
    let waited = farm.dir.join("waited");
    let mut wait = farm
        .command(&["wait", &big.to_string(), "--output"])
        .arg(&waited)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let gc = farm.command(&["gc", "--json"]).output().unwrap();
    let polled = poll_status(&ticket, addr, big, Duration::from_secs(30));
    out.status_ms = polled.0;
    out.status_failed = polled.1;
    let _ = wait.kill();
    let _ = wait.wait();
    assert!(
        gc.status.success(),
        "gc failed: {}",
        String::from_utf8_lossy(&gc.stderr)
    );
    let metrics = http_call(&ticket, addr, "GET", "/metrics", "").1;
    out.metrics = Some(parse_metrics(&metrics));
    out.lease_expiries = metric(&metrics, "tessera_lease_expiries_total");
    let pid = farm.coordinator_pid();
    out.rss_mib = rss_mib(pid);

    // At rest: the long job paused, its running tasks finished, and the
    // webhook outbox delivered (or, where it never is, two minutes gone).
    let paused = farm.run(&["pause", &big.to_string()]);
    if !paused.status.success() {
        out.refused.push(format!(
            "pause: {}",
            String::from_utf8_lossy(&paused.stderr).trim()
        ));
    }
    std::thread::sleep(Duration::from_secs(3));
    let settle = Instant::now();
    let mut last = (receiver.count(), Instant::now());
    while settle.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(500));
        let n = receiver.count();
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(5) {
            break;
        }
    }
    out.webhooks = receiver.count();
    let files = || {
        ["state.sqlite", "state.sqlite-wal"].map(|f| {
            std::fs::metadata(farm.data.join(f))
                .map(|m| (m.len(), m.modified().unwrap()))
                .ok()
        })
    };
    let (io0, db0, t0) = (io(pid), files(), Instant::now());
    std::thread::sleep(Duration::from_secs(30));
    let (io1, db1) = (io(pid), files());
    let secs = t0.elapsed().as_secs_f64();
    out.rest_bytes_per_s = (io1.0 - io0.0) as f64 / secs;
    out.rest_syscw_per_s = (io1.1 - io0.1) as f64 / secs;
    out.rest_db_changed = db0 != db1;

    // SIGTERM while it renders again.
    let resumed = farm.run(&["resume", &big.to_string()]);
    if !resumed.status.success() {
        out.refused.push(format!(
            "resume: {}",
            String::from_utf8_lossy(&resumed.stderr).trim()
        ));
    }
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: a signal to the coordinator this bench started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let asked = Instant::now();
    let ended = || process_ended(pid);
    while !ended() && asked.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    out.sigterm_ms = asked.elapsed().as_secs_f64() * 1000.0;
    if !ended() {
        farm.kill_coordinator();
    } else {
        let _ = farm.wait_coordinator_exit(Duration::from_secs(5));
    }
    // Every result a worker was told was accepted, kept: the job's done
    // tasks after a restart cover them.
    let acked: std::collections::BTreeSet<u32> = (farm.accepted().into_iter())
        .filter(|(j, _)| *j == big)
        .map(|(_, t)| t)
        .collect();
    farm.start_coordinator();
    let addr = http_addr(&farm);
    // A task is a frame here (one tile, one sample range): each acked
    // task's frame is stitched, at the latest by the restarted run.
    let kept = || {
        let (code, body) = http_call(&ticket, addr, "GET", &format!("/v1/jobs/{big}/frames"), "");
        assert_eq!(code, 200, "{body}");
        let frames: Vec<Value> = serde_json::from_str(&body).unwrap();
        let stitched: std::collections::BTreeSet<u64> =
            frames.iter().filter_map(|f| f["frame"].as_u64()).collect();
        (acked.iter())
            .filter(|t| stitched.contains(&(u64::from(**t) + 1)))
            .count()
    };
    let since = Instant::now();
    let mut kept_now = kept();
    while kept_now < acked.len() && since.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(500));
        kept_now = kept();
    }
    out.acked_kept = kept_now;
    out.acked = acked.len();
    receiver.stop();
    out
}

/// The demo scene with its textures, in `dir`, `frames` frames long.
fn long_scene(dir: &std::path::Path, frames: u32) -> PathBuf {
    let textures = dir.join("textures");
    std::fs::create_dir_all(&textures).unwrap();
    for t in std::fs::read_dir(scenes().join("textures")).unwrap() {
        let t = t.unwrap().path();
        std::fs::copy(&t, textures.join(t.file_name().unwrap())).unwrap();
    }
    let text = std::fs::read_to_string(scenes().join("demo.scene.json")).unwrap();
    let mut scene: Value = serde_json::from_str(&text).unwrap();
    scene["frames"]["end"] = Value::from(frames);
    let path = dir.join("long.scene.json");
    std::fs::write(&path, scene.to_string()).unwrap();
    path
}

/// `GET /v1/jobs/ID` every 100 ms for `for_`: each latency (ms) and the
/// number of failed calls.
fn poll_status(
    ticket: &tessera_protocol::ticket::Ticket,
    addr: std::net::SocketAddr,
    job: u64,
    for_: Duration,
) -> (Vec<f64>, usize) {
    let (mut took, mut failed) = (Vec::new(), 0);
    let start = Instant::now();
    while start.elapsed() < for_ {
        let t = Instant::now();
        let (code, _) = http_call(ticket, addr, "GET", &format!("/v1/jobs/{job}"), "");
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        if code != 200 {
            failed += 1;
        }
        std::thread::sleep(Duration::from_millis(100).saturating_sub(t.elapsed()));
    }
    took.sort_by(f64::total_cmp);
    (took, failed)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One unlabelled sample of `/metrics` (or with `labels`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn parse_metrics(text: &str) -> Value {
    let q = |quantile: &str| {
        (text.lines())
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "tessera_heartbeat_gap_seconds{{quantile=\"{quantile}\"}} "
                ))?
                .trim()
                .parse::<f64>()
                .ok()
            })
            .map(|s| s * 1000.0)
    };
    serde_json::json!({
        "gap_p50_ms": q("0.5"),
        "gap_p99_ms": q("0.99"),
        "gap_max_ms": q("1"),
        "stalls": metric(text, "tessera_runtime_stalls_total"),
        "worst_late_ms": metric(text, "tessera_runtime_worst_lateness_seconds").map(|s| s * 1000.0),
        "blocking_calls": metric(text, "tessera_runtime_blocking_calls_total"),
    })
}

fn print_stress(rows: &[(&str, Stress)]) {
    let Some((_, first)) = rows.first() else {
        return;
    };
    println!(
        "stress: {} blocked jobs, a {}-frame job on 8 no-op workers (200 ms a task, heartbeat 1 s), a webhook receiver, gc and scrub at once",
        first.jobs, first.frames
    );
    let header: Vec<String> = rows.iter().map(|(l, _)| format!("{l:>14}")).collect();
    println!("  {:<44}{}", "", header.join(""));
    let line = |name: &str, f: &dyn Fn(&Stress) -> String| {
        let cells: Vec<String> = rows.iter().map(|(_, s)| format!("{:>14}", f(s))).collect();
        println!("  {name:<44}{}", cells.join(""));
    };
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    line("submit the blocked jobs (s)", &|s| {
        format!("{:.1}", s.submit_s)
    });
    line("status p50 (ms)", &|s| {
        format!("{:.1}", percentile(&s.status_ms, 0.5))
    });
    line("status p99 (ms)   target < 100", &|s| {
        format!("{:.1}", percentile(&s.status_ms, 0.99))
    });
    line("status max (ms)", &|s| {
        format!("{:.1}", percentile(&s.status_ms, 1.0))
    });
    line("status calls failed", &|s| {
        format!("{}/{}", s.status_failed, s.status_ms.len())
    });
    let m = |s: &Stress, k: &str| s.metrics.as_ref().and_then(|m| m[k].as_f64());
    line("heartbeat gap p50 (ms)", &|s| opt(m(s, "gap_p50_ms"), 0));
    line("heartbeat gap p99 (ms)", &|s| opt(m(s, "gap_p99_ms"), 0));
    line("heartbeat gap max (ms)   target < 2000", &|s| {
        opt(m(s, "gap_max_ms"), 0)
    });
    line("runtime stalls >= 200 ms", &|s| opt(m(s, "stalls"), 0));
    line("runtime worst lateness (ms)", &|s| {
        opt(m(s, "worst_late_ms"), 0)
    });
    line("blocking calls on runtime threads", &|s| {
        opt(m(s, "blocking_calls"), 0)
    });
    line("lease expiries   target 0", &|s| opt(s.lease_expiries, 0));
    line("webhook deliveries", &|s| s.webhooks.to_string());
    line("at rest: write syscalls/s   target ~0", &|s| {
        format!("{:.1}", s.rest_syscw_per_s)
    });
    line("at rest: bytes written/s", &|s| {
        format!("{:.0}", s.rest_bytes_per_s)
    });
    line("at rest: database files changed", &|s| {
        s.rest_db_changed.to_string()
    });
    line("coordinator RSS under load (MiB)", &|s| {
        format!("{:.1}", s.rss_mib)
    });
    line("SIGTERM to exit (ms)   target < 2000", &|s| {
        format!("{:.0}", s.sigterm_ms)
    });
    line("acknowledged results kept", &|s| {
        format!("{}/{}", s.acked_kept, s.acked)
    });
}

/// (b): status calls and CLI submits against RSS.
fn memory(label: &str) {
    const CALLS: usize = 2_000;
    let farm = Farm::start(&format!("stress-memory-{label}"), &[]);
    let pid = farm.coordinator_pid();
    std::thread::sleep(Duration::from_secs(1));
    let before = rss_mib(pid);
    parallel(CALLS, 4, |_| {
        let out = farm.run(&["status", "--json"]);
        assert!(out.status.success());
    });
    // What lingers past the connections' idle timeout, and what is trimmed.
    std::thread::sleep(Duration::from_secs(12));
    let after = rss_mib(pid);
    println!("memory ({label}): {CALLS} `tessera status --json`, 4 at a time, empty coordinator");
    println!(
        "  RSS {before:.1} -> {after:.1} MiB: {:.2}x   target <= 1.5x  ({:.2}x target)",
        after / before,
        after / before / 1.5
    );
    drop(farm);

    let mut farm = Farm::start(&format!("stress-submits-{label}"), &[]);
    for i in 0..2 {
        farm.add_worker_with(&format!("noop-{i}"), &["--engine", "noop", "--slots", "4"]);
    }
    farm.wait_workers(2);
    let scene = scenes().join("demo.scene.json");
    let scene = scene.to_str().unwrap();
    let started = Instant::now();
    parallel(CALLS, 4, |i| {
        let out = farm.run(&[
            "submit",
            scene,
            "--engine",
            "noop",
            "--frames",
            "1",
            "--name",
            &format!("one-{i}"),
            "--json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    let ticket: tessera_protocol::ticket::Ticket =
        std::fs::read_to_string(farm.data.join("client.ticket"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    // All done: the farm's status says so.
    loop {
        let status = farm.json(&["status", "--json"]);
        let jobs = status["jobs"].as_array().map_or(&[][..], |j| j.as_slice());
        let done = jobs.iter().filter(|j| j["state"] == "done").count();
        if done >= CALLS {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(900), "{done} done");
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = ticket;
    std::thread::sleep(Duration::from_secs(12));
    let done = rss_mib(farm.coordinator_pid());
    farm.kill_coordinator();
    farm.start_coordinator();
    farm.wait_workers(2);
    std::thread::sleep(Duration::from_secs(2));
    let restarted = rss_mib(farm.coordinator_pid());
    println!(
        "memory ({label}): {CALLS} one-task jobs by `tessera submit`, 4 at a time, all done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!(
        "  RSS all done {done:.1} MiB, restarted {restarted:.1} MiB: {:.2}x   target <= 1.5x  ({:.2}x target)",
        done / restarted,
        done / restarted / 1.5
    );
}

/// Runs `f(0..n)` on `threads` threads.
fn parallel(n: usize, threads: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    break;
                }
                f(i);
            });
        }
    });
}

/// A webhook receiver: answers 200 to every request and counts them.
struct Receiver {
    port: u16,
    count: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, st) = (count.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut req = Vec::new();
                let mut buf = [0u8; 8192];
                // The head, then as much body as it declares.
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    req.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&req);
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = (head.lines())
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                }
                c.fetch_add(1, Ordering::Relaxed);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        Receiver { port, count, stop }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
