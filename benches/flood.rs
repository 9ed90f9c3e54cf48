//! A legitimate client under a spoofed QUIC Initial flood (`cargo bench
//! --profile dev --bench flood`): a flooder sends real Initials (fresh
//! connections' first datagrams, 1200 bytes) from 32 loopback source
//! addresses (127.0.0.2–127.0.0.33) at 300 per second and never answers
//! anything, while `tessera status --json` runs in a loop from 127.0.0.1
//! and a worker joins. Each attempt counts as a success when it exits 0
//! within 2 s (target: 100 % of attempts). Side by side in one run, each
//! on a fresh coordinator:
//!
//! - no flood;
//! - the flood against a coordinator without address validation
//!   (`TESSERA_BENCH_NO_ADDRESS_VALIDATION`: a place taken at the first
//!   Initial, the old behaviour);
//! - the flood against the default coordinator (QUIC Retry under pressure
//!   and from recently failed addresses);
//! - a flood whose every Initial comes from a new address (127.1.0.1
//!   upwards: a spoofer choosing addresses at random), default
//!   coordinator.
//!
//! `-- none|old|validation|fresh` runs one phase; `TESSERA_BENCH_LOG` is
//! the coordinator's `RUST_LOG`, whose log is kept when an attempt fails. `TESSERA_BENCH_SECS`
//! (default 20) is each phase's length,
//! `TESSERA_BENCH_FLOOD_RATE` (300) and `TESSERA_BENCH_FLOOD_SOURCES` (32)
//! the flood's.

#[path = "../tests/e2e/flood.rs"]
#[allow(dead_code)]
mod flood;
#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flood::{classify, Initials, Reply};
use harness::Farm;
use tessera_protocol::ticket::Ticket;

/// A legitimate attempt must end within this to count.
const WITHIN: Duration = Duration::from_secs(2);
/// The flood runs this long before the client starts.
const WARM_UP: Duration = Duration::from_secs(2);

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let secs = env("TESSERA_BENCH_SECS", 20);
    let rate = env("TESSERA_BENCH_FLOOD_RATE", 300) as u32;
    let sources = env("TESSERA_BENCH_FLOOD_SOURCES", 32).clamp(1, 250) as u8;
    let length = Duration::from_secs(secs);
    println!(
        "flood: {rate} Initials/s; client: `tessera status --json` in a loop for {secs} s; \
         success = exit 0 within {} s (target 100 %)",
        WITHIN.as_secs()
    );
    let fixed = Sources::loopback(sources);
    // (key to pick it with `-- KEY`, name, flood, validation)
    let phases = [
        ("none", "no flood", None, true),
        (
            "old",
            "flood, no validation (old)",
            Some(fixed.clone()),
            false,
        ),
        ("validation", "flood, validation", Some(fixed), true),
        (
            "fresh",
            "flood from a new address per Initial, validation",
            Some(Sources::Fresh(Ipv4Addr::new(127, 1, 0, 1))),
            true,
        ),
    ];
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let mut rows = Vec::new();
    for (i, (key, name, sources, validate)) in phases.into_iter().enumerate() {
        if only.as_deref().is_some_and(|o| o != key) {
            continue;
        }
        let row = phase(i, name, sources, validate, rate, length);
        row.print();
        rows.push(row);
    }
    println!();
    println!("| phase | attempts | ok within 2 s | median | slowest | worker joined after | flood sent | answered with Retry |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        r.row();
    }
}

struct Row {
    name: &'static str,
    attempts: usize,
    ok_within: usize,
    failed: usize,
    /// Attempts over `WITHIN` (failed or not).
    slow: usize,
    times: Vec<Duration>,
    first_error: Option<String>,
    worker_joined: Option<Duration>,
    flood: Option<(Counts, Duration)>,
    /// Where the coordinator's log was kept (an attempt failed or was slow).
    log_kept: Option<std::path::PathBuf>,
}

impl Row {
    fn rate(&self) -> f64 {
        100.0 * self.ok_within as f64 / self.attempts.max(1) as f64
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        t.get(((t.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or_default()
    }

    fn flood_figures(&self) -> (String, String) {
        match self.flood {
            None => ("-".into(), "-".into()),
            Some((c, took)) => (
                format!("{} ({:.0}/s)", c.sent, c.sent as f64 / took.as_secs_f64()),
                format!(
                    "{} ({:.1} %); {} other datagrams back",
                    c.retries,
                    100.0 * c.retries as f64 / c.sent.max(1) as f64,
                    c.other
                ),
            ),
        }
    }

    fn print(&self) {
        println!(
            "{}: {}/{} attempts ok within 2 s = {:.1} %; {} failed; median {:.0} ms, slowest {:.0} ms; worker joined after {}",
            self.name,
            self.ok_within,
            self.attempts,
            self.rate(),
            self.failed,
            ms(self.quantile(0.5)),
            ms(self.quantile(1.0)),
            self.worker_joined
                .map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
        );
        if let Some(e) = &self.first_error {
            println!("  first failure: {e}");
        }
        let (sent, retries) = self.flood_figures();
        if self.flood.is_some() {
            println!("  flood: {sent} Initials sent, {retries}");
        }
        if let Some(kept) = &self.log_kept {
            println!("  (the coordinator's log is kept in {})", kept.display());
        }
    }

    fn row(&self) {
        let (sent, retries) = self.flood_figures();
        println!(
            "| {} | {} | **{:.1} %** ({}) | {:.0} ms | {:.0} ms | {} | {} | {} |",
            self.name,
            self.attempts,
            self.rate(),
            self.ok_within,
            ms(self.quantile(0.5)),
            ms(self.quantile(1.0)),
            self.worker_joined
                .map_or("never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            sent,
            retries,
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn phase(
    i: usize,
    name: &'static str,
    sources: Option<Sources>,
    validate: bool,
    rate: u32,
    length: Duration,
) -> Row {
    let mut env = Vec::new();
    if !validate {
        env.push(("TESSERA_BENCH_NO_ADDRESS_VALIDATION", "1".to_string()));
    }
    if let Ok(log) = std::env::var("TESSERA_BENCH_LOG") {
        env.push(("RUST_LOG", log));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut farm = Farm::start_with_env(&format!("bench-flood-{i}"), &[], &env);
    let ticket: Ticket = std::fs::read_to_string(farm.data.join("client.ticket"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let flood = sources.map(|s| {
        let f = Flood::start(ticket.addr, &ticket.fingerprint, s, rate);
        std::thread::sleep(WARM_UP);
        f
    });
    let flood_start = Instant::now()
        - if flood.is_some() {
            WARM_UP
        } else {
            Duration::ZERO
        };

    let start = Instant::now();
    farm.add_worker("w");
    let mut row = Row {
        name,
        attempts: 0,
        ok_within: 0,
        failed: 0,
        slow: 0,
        times: Vec::new(),
        first_error: None,
        worker_joined: None,
        flood: None,
        log_kept: None,
    };
    while start.elapsed() < length {
        let began = Instant::now();
        let out = farm.run(&["status", "--json"]);
        let took = began.elapsed();
        row.attempts += 1;
        row.times.push(took);
        if took > WITHIN {
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            println!(
                "  an attempt took {:.3} s, ending at {:.3} s since the epoch",
                took.as_secs_f64(),
                at.as_secs_f64()
            );
            row.slow += 1;
        }
        if out.status.success() {
            if took <= WITHIN {
                row.ok_within += 1;
            }
            let joined = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|s| s["workers"].as_array().map(|w| !w.is_empty()))
                .unwrap_or(false);
            if joined && row.worker_joined.is_none() {
                row.worker_joined = Some(start.elapsed());
            }
        } else {
            row.failed += 1;
            if row.first_error.is_none() {
                let at = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                row.first_error = Some(format!(
                    "{} (ended at {:.3} s since the epoch)",
                    String::from_utf8_lossy(&out.stderr).trim(),
                    at.as_secs_f64()
                ));
            }
        }
    }
    row.flood = flood.map(|f| (f.stop(), flood_start.elapsed()));
    if row.failed + row.slow > 0 {
        let kept = std::env::temp_dir().join(format!("tessera-bench-flood-{i}.log"));
        if std::fs::write(&kept, farm.coordinator_log()).is_ok() {
            row.log_kept = Some(kept);
        }
    }
    row
}

/// Where a flood's Initials come from.
#[derive(Debug, Clone)]
enum Sources {
    /// These addresses, in turn.
    Fixed(Vec<IpAddr>),
    /// A new address for each Initial, counting up from this one; each
    /// socket is read for a while and then closed.
    Fresh(Ipv4Addr),
}

impl Sources {
    /// 127.0.0.2, 127.0.0.3, …: `n` loopback addresses beside 127.0.0.1.
    fn loopback(n: u8) -> Sources {
        Sources::Fixed((0..n).map(|i| IpAddr::from([127, 0, 0, 2 + i])).collect())
    }
}

/// What a flood sent and was answered so far.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    sent: u64,
    retries: u64,
    /// Datagrams other than Retries (handshakes going on, refusals, their
    /// retransmissions).
    other: u64,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    retries: AtomicU64,
    other: AtomicU64,
}

/// A flood running on its own thread until stopped (or dropped): one
/// Initial every 1/rate s, and between them every socket drained of what
/// came back, which is counted and never answered.
struct Flood {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
}

/// Sockets of fresh addresses read before they are closed.
const FRESH_KEPT: usize = 256;

impl Flood {
    fn start(target: SocketAddr, fingerprint: &str, sources: Sources, per_second: u32) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let mut initials = Initials::new(target, fingerprint);
        let thread = {
            let (stop, counters) = (stop.clone(), counters.clone());
            std::thread::spawn(move || {
                let bind = |ip: IpAddr| {
                    let s = UdpSocket::bind((ip, 0)).unwrap();
                    s.set_nonblocking(true).unwrap();
                    s
                };
                let mut sockets: VecDeque<UdpSocket> = match &sources {
                    Sources::Fixed(ips) => ips.iter().map(|&ip| bind(ip)).collect(),
                    Sources::Fresh(_) => VecDeque::new(),
                };
                let mut next_fresh = match sources {
                    Sources::Fresh(first) => u32::from(first),
                    Sources::Fixed(_) => 0,
                };
                let interval = Duration::from_secs(1) / per_second.max(1);
                let start = Instant::now();
                let mut buf = [0u8; 2048];
                let mut n: u32 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let socket = match sources {
                        Sources::Fixed(_) => &sockets[n as usize % sockets.len()],
                        Sources::Fresh(_) => {
                            if sockets.len() == FRESH_KEPT {
                                sockets.pop_front();
                            }
                            sockets.push_back(bind(IpAddr::V4(next_fresh.into())));
                            next_fresh += 1;
                            sockets.back().unwrap()
                        }
                    };
                    if socket.send_to(initials.next(), target).is_ok() {
                        counters.sent.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                    let due = start + interval * n;
                    loop {
                        for socket in &sockets {
                            while let Ok(len) = socket.recv(&mut buf) {
                                let counter = match classify(&buf[..len]) {
                                    Reply::Retry => &counters.retries,
                                    _ => &counters.other,
                                };
                                counter.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        let now = Instant::now();
                        if now >= due || stop.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep((due - now).min(Duration::from_millis(5)));
                    }
                }
            })
        };
        Flood {
            stop,
            counters,
            thread: Some(thread),
        }
    }

    /// Stops the flood; returns what it sent and was answered.
    fn stop(mut self) -> Counts {
        self.halt();
        Counts {
            sent: self.counters.sent.load(Ordering::Relaxed),
            retries: self.counters.retries.load(Ordering::Relaxed),
            other: self.counters.other.load(Ordering::Relaxed),
        }
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}
