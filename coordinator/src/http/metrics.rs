//! `/metrics`: the farm in Prometheus's text format (version 0.0.4). Job and
//! task figures are summed from the same snapshot `tessera status --json`
//! shows (every retained job), so the two agree; failures, lease expiries,
//! dispatch latency and HTTP bytes are counted since the coordinator
//! started; per-worker gauges carry `worker` (its id) and `name` labels.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tessera_protocol::messages::JobState;

use crate::server::Shared;

/// Upper bounds of the dispatch latency histogram's buckets, seconds.
const BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// What the coordinator counts since it started.
#[derive(Default)]
pub(crate) struct Counters {
    pub task_failures: AtomicU64,
    pub http_bytes_out: AtomicU64,
    /// QUIC connections ended (what [`crate::upkeep::trim_memory`] follows).
    pub connections_closed: AtomicU64,
    dispatch: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Counters {
    /// One dispatch pass, from the wake-up that asked for it (a submit, a
    /// freed slot, a result) to the assignments going out.
    pub fn observe_dispatch(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let mut h = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += secs;
    }
}

/// A label value, escaped as the text format wants.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.0, "{name} {value}");
        } else {
            let _ = writeln!(self.0, "{name}{{{labels}}} {value}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }
}

/// The whole page.
pub(crate) fn render(shared: &Shared) -> anyhow::Result<String> {
    // The live jobs from the core; the finished ones as totals SQLite adds
    // up, never read one by one (a scrape costs no memory per job).
    let snapshot = shared.read(|core, now| core.snapshot(now));
    // A database out of reach is said (tessera_state_reachable 0), not an
    // error: the scrape is how an operator learns of it.
    let (finished, reachable) = match shared.db().finished_totals() {
        Ok(finished) => (finished, true),
        Err(e) if e.is_unreachable() => (Vec::new(), false),
        Err(e) => return Err(e.into()),
    };
    let total = |f: fn(&crate::db::FinishedTotals) -> u64| -> u64 {
        finished.iter().map(|(_, t)| f(t)).sum()
    };
    let lease_expiries = shared.read(|core, _| core.lease_expiries);
    let mut o = Out(String::new());
    // Jobs the core holds are live; one that just finished may still be
    // there before its record is written: counted once, as live.
    let jobs: Vec<_> = (snapshot.jobs.iter())
        .filter(|j| !j.state.is_final())
        .collect();

    health(&mut o, reachable, shared.lease.valid());
    jobs_by_state(&mut o, &jobs, &finished);
    let active = || jobs.iter();
    let queued: u64 = active()
        .map(|j| u64::from(j.tasks_total.saturating_sub(j.tasks_done + j.tasks_running)))
        .sum();
    o.one(
        "tessera_queue_depth",
        "gauge",
        "Tasks of queued and running jobs waiting for a worker (paused jobs' included).",
        queued,
    );
    let running: u64 = jobs.iter().map(|j| u64::from(j.tasks_running)).sum();
    o.one(
        "tessera_tasks_running",
        "gauge",
        "Tasks running now.",
        running,
    );
    let done: u64 =
        jobs.iter().map(|j| u64::from(j.tasks_done)).sum::<u64>() + total(|t| t.tasks_done);
    o.one(
        "tessera_tasks_done_total",
        "counter",
        "Tasks done, over every retained job.",
        done,
    );
    o.one(
        "tessera_task_failures_total",
        "counter",
        "Failed task attempts since the coordinator started.",
        shared.metrics.task_failures.load(Ordering::Relaxed),
    );
    o.one(
        "tessera_lease_expiries_total",
        "counter",
        "Leases that expired (a worker went silent) since the coordinator started.",
        lease_expiries,
    );
    dispatch_latency(&mut o, &shared.metrics);
    let sum = |f: fn(&tessera_protocol::messages::JobStatus) -> u64| -> u64 {
        jobs.iter().map(|j| f(j)).sum()
    };
    o.one(
        "tessera_bytes_uploaded_total",
        "counter",
        "Bytes clients uploaded for retained jobs (bytes in).",
        sum(|j| j.bytes_uploaded) + total(|t| t.bytes_uploaded),
    );
    o.one(
        "tessera_bytes_deduplicated_total",
        "counter",
        "Bytes of retained jobs' files the store already held.",
        sum(|j| j.bytes_deduplicated) + total(|t| t.bytes_deduplicated),
    );
    o.one(
        "tessera_bytes_to_workers_total",
        "counter",
        "Asset bytes sent to workers for retained jobs since the coordinator started (bytes out).",
        sum(|j| j.bytes_to_workers) + total(|t| t.bytes_to_workers),
    );
    o.one(
        "tessera_http_bytes_out_total",
        "counter",
        "Frame bytes downloaded over the HTTP API since the coordinator started.",
        shared.metrics.http_bytes_out.load(Ordering::Relaxed),
    );
    runtime(&mut o, &shared.watch);
    o.one(
        "tessera_cost_usd_total",
        "counter",
        "Cost of every retained job's leases, USD.",
        jobs.iter().map(|j| j.cost_usd).sum::<f64>()
            + finished.iter().map(|(_, t)| t.cost_usd).sum::<f64>(),
    );
    o.one(
        "tessera_burn_usd_per_hour",
        "gauge",
        "What the connected workers cost per hour.",
        snapshot.farm.burn_usd_per_hour,
    );
    o.one(
        "tessera_idle_usd_per_hour",
        "gauge",
        "What the connected workers with nothing to do cost per hour.",
        snapshot.farm.idle_usd_per_hour,
    );

    workers(&mut o, &snapshot.workers);
    Ok(o.0)
}

/// The page of a standby, which holds no farm yet: its lease gauge, 0.
pub(crate) fn render_standby() -> String {
    let mut o = Out(String::new());
    lease_held(&mut o, false);
    o.0
}

/// Whether the state's database answers and this coordinator holds the
/// farm's lease.
fn health(o: &mut Out, reachable: bool, lease_held_now: bool) {
    o.one(
        "tessera_state_reachable",
        "gauge",
        "1 while the coordinator's database answers (0: PostgreSQL out of reach; finished jobs' totals are left out of this scrape).",
        u64::from(reachable),
    );
    lease_held(o, lease_held_now);
}

fn lease_held(o: &mut Out, lease_held: bool) {
    o.one(
        "tessera_farm_lease_held",
        "gauge",
        "1 while this coordinator holds the farm's lease and dispatches (always 1 without a shared state; 0 on a standby, or on a coordinator whose lease ended).",
        u64::from(lease_held),
    );
}

/// `tessera_jobs`: the live jobs and the finished ones' totals, by state.
fn jobs_by_state(
    o: &mut Out,
    jobs: &[&tessera_protocol::messages::JobStatus],
    finished: &[(JobState, crate::db::FinishedTotals)],
) {
    o.family(
        "tessera_jobs",
        "gauge",
        "Jobs the coordinator holds, by state.",
    );
    for state in [
        JobState::Queued,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Canceled,
    ] {
        let live = jobs.iter().filter(|j| j.state == state).count() as u64;
        let done = (finished.iter())
            .filter(|(s, _)| *s == state)
            .map(|(_, t)| t.jobs)
            .sum::<u64>();
        o.sample(
            "tessera_jobs",
            &format!("state=\"{}\"", state.name()),
            live + done,
        );
    }
}

/// The dispatch latency histogram.
fn dispatch_latency(o: &mut Out, metrics: &Counters) {
    let h = (metrics.dispatch.lock()).unwrap_or_else(|e| e.into_inner());
    o.family(
        "tessera_dispatch_latency_seconds",
        "histogram",
        "From a wake-up (submit, freed slot, result) to the dispatch pass having handed out work.",
    );
    for (bound, count) in BUCKETS.iter().zip(h.counts) {
        o.sample(
            "tessera_dispatch_latency_seconds_bucket",
            &format!("le=\"{bound}\""),
            count,
        );
    }
    o.sample(
        "tessera_dispatch_latency_seconds_bucket",
        "le=\"+Inf\"",
        h.count,
    );
    o.sample("tessera_dispatch_latency_seconds_sum", "", h.sum);
    o.sample("tessera_dispatch_latency_seconds_count", "", h.count);
}

/// How the async runtime fares: blocking calls, stalls, heartbeat gaps.
fn runtime(o: &mut Out, watch: &crate::watch::Watch) {
    o.one(
        "tessera_runtime_blocking_calls_total",
        "counter",
        "Database calls made on an async runtime thread (each may stall every connection; 0 is right).",
        watch.blocking_calls.load(Ordering::Relaxed),
    );
    o.one(
        "tessera_runtime_stalls_total",
        "counter",
        "Times the async runtime woke a ticker 0.2 s or more late: no thread was free to serve.",
        watch.stalls.load(Ordering::Relaxed),
    );
    o.one(
        "tessera_runtime_worst_lateness_seconds",
        "gauge",
        "The latest the async runtime ever woke its 50 ms ticker.",
        watch.worst_late_us.load(Ordering::Relaxed) as f64 / 1e6,
    );
    let gaps = watch.gap_figures();
    o.family(
        "tessera_heartbeat_gap_seconds",
        "summary",
        "Time between two heartbeats of one worker as the coordinator handled them (recent ones; a worker sends one each heartbeat interval).",
    );
    o.sample(
        "tessera_heartbeat_gap_seconds",
        "quantile=\"0.5\"",
        gaps.p50.as_secs_f64(),
    );
    o.sample(
        "tessera_heartbeat_gap_seconds",
        "quantile=\"0.99\"",
        gaps.p99.as_secs_f64(),
    );
    o.sample(
        "tessera_heartbeat_gap_seconds",
        "quantile=\"1\"",
        gaps.max.as_secs_f64(),
    );
    o.sample(
        "tessera_heartbeat_gap_seconds_sum",
        "",
        gaps.sum.as_secs_f64(),
    );
    o.sample("tessera_heartbeat_gap_seconds_count", "", gaps.count);
}

/// The per-worker families: slots, state, host and GPU telemetry.
fn workers(o: &mut Out, workers: &[tessera_protocol::messages::WorkerStatus]) {
    o.one(
        "tessera_workers",
        "gauge",
        "Connected workers.",
        workers.len(),
    );
    let wl = |w: &tessera_protocol::messages::WorkerStatus| {
        format!("worker=\"{}\",name=\"{}\"", w.id, label(&w.name))
    };
    type WorkerFigure = fn(&tessera_protocol::messages::WorkerStatus) -> f64;
    let per_worker: [(&str, &str, &str, WorkerFigure); 6] = [
        ("tessera_worker_slots", "gauge", "Task slots.", |w| {
            f64::from(w.slots)
        }),
        ("tessera_worker_running", "gauge", "Tasks running.", |w| {
            f64::from(w.running)
        }),
        (
            "tessera_worker_utilisation",
            "gauge",
            "Running tasks over slots (0 to 1).",
            |w| f64::from(w.running) / f64::from(w.slots.max(1)),
        ),
        (
            "tessera_worker_tasks_done_total",
            "counter",
            "Tasks done by this worker since it joined.",
            |w| w.tasks_done as f64,
        ),
        (
            "tessera_worker_price_usd_per_hour",
            "gauge",
            "What the worker costs per hour.",
            |w| w.price_per_hour,
        ),
        (
            "tessera_worker_connected_seconds",
            "gauge",
            "Seconds since the worker joined.",
            |w| w.connected_secs as f64,
        ),
    ];
    for (name, kind, help, f) in per_worker {
        o.family(name, kind, help);
        for w in workers {
            o.sample(name, &wl(w), f(w));
        }
    }
    o.family(
        "tessera_worker_state",
        "gauge",
        "1 for the state each worker is in.",
    );
    for w in workers {
        o.sample(
            "tessera_worker_state",
            &format!("{},state=\"{}\"", wl(w), w.state.name()),
            1,
        );
    }
    type Host = fn(&tessera_protocol::telemetry::HostTelemetry) -> f64;
    let host: [(&str, &str, Host); 3] = [
        (
            "tessera_host_load1",
            "The host's 1-minute load average.",
            |h| f64::from(h.load_1m),
        ),
        (
            "tessera_host_memory_used_bytes",
            "The host's memory in use.",
            |h| h.memory_used_bytes as f64,
        ),
        (
            "tessera_host_memory_total_bytes",
            "The host's memory.",
            |h| h.memory_total_bytes as f64,
        ),
    ];
    for (name, help, f) in host {
        o.family(name, "gauge", help);
        for w in workers {
            if let Some(t) = &w.telemetry {
                o.sample(name, &wl(w), f(&t.host));
            }
        }
    }
    type Gpu = fn(&tessera_protocol::telemetry::GpuTelemetry) -> f64;
    let gpu: [(&str, &str, Gpu); 6] = [
        ("tessera_gpu_utilisation_percent", "GPU busy time.", |g| {
            f64::from(g.utilization_pct)
        }),
        ("tessera_gpu_memory_used_bytes", "GPU memory in use.", |g| {
            g.memory_used_bytes as f64
        }),
        ("tessera_gpu_memory_total_bytes", "GPU memory.", |g| {
            g.memory_total_bytes as f64
        }),
        ("tessera_gpu_temperature_celsius", "GPU temperature.", |g| {
            f64::from(g.temperature_c)
        }),
        ("tessera_gpu_power_watts", "GPU power draw.", |g| {
            f64::from(g.power_draw_w)
        }),
        ("tessera_gpu_power_limit_watts", "GPU power limit.", |g| {
            f64::from(g.power_limit_w)
        }),
    ];
    for (name, help, f) in gpu {
        o.family(name, "gauge", help);
        for w in workers {
            for g in w.telemetry.iter().flat_map(|t| &t.gpus) {
                let labels = format!("{},gpu=\"{}\",model=\"{}\"", wl(w), g.index, label(&g.name));
                o.sample(name, &labels, f(g));
            }
        }
    }
}
