//! Benchmarks across the WAN bench (`tests/e2e/wan.rs`: network
//! namespaces, veth pairs at MTU 1500, a user-space relay for delay and
//! rate, nftables for loss), run as root:
//! `cargo bench --bench wan [goodput|goodput-quick]` (fan-out is in the
//! farm benchmark: `cargo bench --bench farm -- fanout`).
//! Each prints every run and the ratio to its target; nothing here asserts
//! a wall-clock time. Without root it says why and measures nothing.
//!
//! (a) goodput: one blob of `TESSERA_BENCH_MIB` MiB (default 256; the
//!     `goodput-quick` variant 32) put into a verifying `BlobDir` over the
//!     project's QUIC transport (`blob::put`, fresh connection each run),
//!     ÷ the same bytes over TCP + rustls TLS 1.3 (same certificate, the
//!     kernel's CUBIC, fresh connection each run), on two paths: 40 ms RTT
//!     with 0.5 % loss each way, and 80 ms with none, both at
//!     `TESSERA_BENCH_MBIT` Mbit/s (default 1000). Runs alternate: TCP,
//!     then each QUIC tuning, three times; each figure is the best of its
//!     three. The tunings are the congestion controllers (the default,
//!     `cubic-veno`; quinn's Cubic, NewReno, BBR), window sizes,
//!     acknowledgement frequency and
//!     segmentation offload (quinn always paces); `TESSERA_BENCH_TUNINGS`
//!     picks some by name, `TESSERA_BENCH_RTTS=40` or `80` one path.
//!     Targets: the default
//!     tuning ≥ 1.0 × TCP+TLS at 40 ms / 0.5 %, ≥ 0.9 × at 80 ms / 0 %.

#[path = "../tests/e2e/wan.rs"]
mod wan;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_protocol::messages::Role;
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_transport::blob::{self, BlobDir, BlobSource};
use tessera_transport::{self as transport, Congestion, Identity, Timing, Tuning};

const MIB: u64 = 1 << 20;
const BLOCK: usize = 256 * 1024;

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    if let Some(why) = wan::unavailable() {
        println!("wan benchmarks skipped: {why}");
        return;
    }
    if run("goodput") {
        goodput(env_u64("TESSERA_BENCH_MIB").unwrap_or(256), "full");
    }
    if only.as_deref() == Some("goodput-quick") {
        goodput(env_u64("TESSERA_BENCH_MIB").unwrap_or(32), "quick");
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn bench_dir() -> PathBuf {
    let base = std::env::var_os("TESSERA_BENCH_DIR")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tessera-bench-wan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_noise(path: &Path, len: u64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut block = vec![0u8; BLOCK];
    let mut left = len;
    while left > 0 {
        for w in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(BLOCK as u64) as usize;
        out.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    out.flush().unwrap();
}

fn mbit(bytes: u64, d: Duration) -> f64 {
    bytes as f64 * 8.0 / 1e6 / d.as_secs_f64()
}

/// The QUIC tunings tried, the default first.
fn tunings() -> Vec<(&'static str, Tuning)> {
    let d = Tuning::default();
    let mut all = vec![("default", d)];
    let mut add = |name, t: Tuning| {
        if t != d {
            all.push((name, t));
        }
    };
    add(
        "cubic",
        Tuning {
            congestion: Congestion::Cubic,
            ..d
        },
    );
    add(
        "newreno",
        Tuning {
            congestion: Congestion::NewReno,
            ..d
        },
    );
    add(
        "bbr",
        Tuning {
            congestion: Congestion::Bbr,
            ..d
        },
    );
    add(
        "acks-every-2",
        Tuning {
            ack_every: None,
            ..d
        },
    );
    add(
        "no-gso",
        Tuning {
            segmentation_offload: false,
            ..d
        },
    );
    add(
        "windows/4",
        Tuning {
            stream_receive_window: d.stream_receive_window / 4,
            receive_window: d.receive_window / 4,
            send_window: d.send_window / 4,
            ..d
        },
    );
    add(
        "payload-1452",
        Tuning {
            max_udp_payload: 1452,
            ..d
        },
    );
    if let Ok(only) = std::env::var("TESSERA_BENCH_TUNINGS") {
        let keep: Vec<&str> = only.split(',').collect();
        all.retain(|(n, _)| keep.contains(n));
    }
    all
}

fn goodput(mib: u64, variant: &str) {
    let rate = env_u64("TESSERA_BENCH_MBIT").unwrap_or(1000);
    let mut links = vec![wan::Link::new(40, 0.5, rate), wan::Link::new(80, 0.0, rate)];
    // `TESSERA_BENCH_RTTS=80` measures one of the two paths (the lossy one
    // takes about 7 minutes a run at 256 MiB).
    if let Ok(only) = std::env::var("TESSERA_BENCH_RTTS") {
        let keep: Vec<&str> = only.split(',').collect();
        links.retain(|l| keep.contains(&l.rtt.as_millis().to_string().as_str()));
    }
    let bench = wan::Bench::start(&links);
    let dir = bench_dir();
    let file = dir.join("blob.bin");
    let len = mib * MIB;
    write_noise(&file, len);
    let (digest, _) = Digest::of_reader(std::fs::File::open(&file).unwrap()).unwrap();
    println!(
        "goodput ({variant} variant): a {mib} MiB blob, worker namespace → coordinator namespace, best of 3 alternating runs, fresh connection each run"
    );
    let identity = Arc::new(Identity::generate().unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let quic_store = BlobDir::open(dir.join("quic-store")).unwrap();
    let tcp = TcpSink::start(&bench.coordinator_ns, &identity, dir.join("tcp-received"));

    for (p, path) in bench.paths.iter().enumerate() {
        println!("path {p}: {}", path.link);
        let tunings = tunings();
        // A server per tuning (its receive windows and acknowledgement
        // requests are the tuning's too).
        let servers: Vec<Ticket> = (tunings.iter())
            .map(|(_, t)| {
                transport::set_tuning(*t);
                let (identity, handle, store) =
                    (identity.clone(), rt.handle().clone(), quic_store.clone());
                wan::in_netns(&bench.coordinator_ns, move || {
                    let _g = handle.enter();
                    let endpoint = transport::server_endpoint(
                        format!("{}:0", wan::COORDINATOR_IP).parse().unwrap(),
                        &identity,
                        Timing::default(),
                    )
                    .unwrap();
                    let addr = endpoint.local_addr().unwrap();
                    handle.spawn(blob::serve(endpoint, store, "bench".into()));
                    Ticket {
                        role: Role::Client,
                        addr,
                        also: Vec::new(),
                        fingerprint: identity.fingerprint(),
                        secret: "bench".into(),
                    }
                })
            })
            .collect();
        let mut best = vec![Duration::MAX; tunings.len()];
        let mut best_tcp = Duration::MAX;
        let mut stats = vec![String::new(); tunings.len()];
        for round in 1..=3 {
            let d = tcp.send(&path.ns, &file, len, digest);
            println!("  run {round}: TCP+TLS {:7.1} Mbit/s", mbit(len, d));
            best_tcp = best_tcp.min(d);
            for (i, (name, tuning)) in tunings.iter().enumerate() {
                transport::set_tuning(*tuning);
                let _ = std::fs::remove_file(quic_store.path(&digest));
                let (ticket, handle, file2) =
                    (servers[i].clone(), rt.handle().clone(), file.clone());
                let (d, s) = wan::in_netns(&path.ns, move || {
                    handle.block_on(async move {
                        let started = Instant::now();
                        let session = transport::connect(&ticket, "bench", Timing::default())
                            .await
                            .unwrap();
                        blob::put(&session.connection, digest, len, BlobSource::File(&file2))
                            .await
                            .unwrap();
                        let d = started.elapsed();
                        let s = session.connection.stats();
                        let veno = tessera_transport::congestion::losses(&session.connection)
                            .map(|(r, c)| format!(" ({r} taken as random, {c} congestive)"))
                            .unwrap_or_default();
                        session.connection.close(0u32.into(), b"done");
                        (
                            d,
                            format!(
                                "MTU {}, {} packets, {} lost, {} congestion events{veno}, RTT {} ms",
                                s.path.current_mtu,
                                s.path.sent_packets,
                                s.path.lost_packets,
                                s.path.congestion_events,
                                s.path.rtt.as_millis(),
                            ),
                        )
                    })
                });
                assert_eq!(quic_store.size(&digest), Some(len));
                println!(
                    "  run {round}: QUIC {name:<13} {:7.1} Mbit/s ({s})",
                    mbit(len, d)
                );
                if d < best[i] {
                    best[i] = d;
                    stats[i] = s;
                }
            }
        }
        let t = mbit(len, best_tcp);
        let target = if path.link.loss_percent > 0.0 {
            1.0
        } else {
            0.9
        };
        for (i, (name, _)) in tunings.iter().enumerate() {
            let q = mbit(len, best[i]);
            let mark = if i == 0 {
                format!(" (target >= {target})")
            } else {
                String::new()
            };
            println!(
                "  best: QUIC {name:<13} {q:7.1} Mbit/s ÷ TCP+TLS {t:7.1} Mbit/s = {:.2}{mark}",
                q / t
            );
        }
        println!(
            "  relay: {} frames down, {} up, {} queue drops, {} send errors",
            path.down.frames.load(std::sync::atomic::Ordering::Relaxed),
            path.up.frames.load(std::sync::atomic::Ordering::Relaxed),
            path.up
                .queue_drops
                .load(std::sync::atomic::Ordering::Relaxed)
                + path
                    .down
                    .queue_drops
                    .load(std::sync::atomic::Ordering::Relaxed),
            path.up
                .send_errors
                .load(std::sync::atomic::Ordering::Relaxed)
                + path
                    .down
                    .send_errors
                    .load(std::sync::atomic::Ordering::Relaxed),
        );
    }
    transport::set_tuning(Tuning::default());
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The TCP+TLS receiver in the coordinator's namespace: each connection
/// sends `len` and digest, then the bytes, hashed while written to a file;
/// it answers 1 on a match.
struct TcpSink {
    addr: std::net::SocketAddr,
    client_tls: Arc<rustls::ClientConfig>,
}

impl TcpSink {
    fn start(ns: &str, identity: &Identity, dest: PathBuf) -> TcpSink {
        let server_tls = Arc::new(transport::server_tls(identity).unwrap());
        let listener = wan::in_netns(ns, || {
            std::net::TcpListener::bind(format!("{}:0", wan::COORDINATOR_IP)).unwrap()
        });
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                stream.set_nodelay(true).unwrap();
                let conn = rustls::ServerConnection::new(server_tls.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                receive_tls(&mut tls, &dest);
            }
        });
        TcpSink {
            addr,
            client_tls: Arc::new(transport::client_tls(&identity.fingerprint()).unwrap()),
        }
    }

    /// Sends `file` from namespace `ns` over a fresh connection; returns
    /// the time from connecting to the receiver's answer.
    fn send(&self, ns: &str, file: &Path, len: u64, digest: Digest) -> Duration {
        let (addr, client_tls, file) = (self.addr, self.client_tls.clone(), file.to_path_buf());
        wan::in_netns(ns, move || {
            let started = Instant::now();
            let stream = std::net::TcpStream::connect(addr).unwrap();
            stream.set_nodelay(true).unwrap();
            set_cubic(&stream);
            let name = rustls::pki_types::ServerName::try_from(transport::CERT_NAME).unwrap();
            let conn = rustls::ClientConnection::new(client_tls, name).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut want = [0u8; 40];
            want[..8].copy_from_slice(&len.to_be_bytes());
            want[8..].copy_from_slice(&digest.0);
            tls.write_all(&want).unwrap();
            let mut src = std::fs::File::open(&file).unwrap();
            let mut buf = vec![0u8; BLOCK];
            loop {
                let n = src.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                tls.write_all(&buf[..n]).unwrap();
            }
            tls.flush().unwrap();
            let mut ack = [0u8; 1];
            tls.read_exact(&mut ack).unwrap();
            assert_eq!(ack[0], 1, "the TCP receiver refused the blob");
            started.elapsed()
        })
    }
}

/// The sender's congestion control: CUBIC, whatever the machine's
/// default (BBR here).
fn set_cubic(stream: &std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let name = b"cubic";
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "TCP_CONGESTION cubic: {}",
        std::io::Error::last_os_error()
    );
}

fn receive_tls(tls: &mut (impl Read + Write), dest: &PathBuf) {
    let mut head = [0u8; 40];
    tls.read_exact(&mut head).unwrap();
    let len = u64::from_be_bytes(head[..8].try_into().unwrap());
    let mut out = std::fs::File::create(dest).unwrap();
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; BLOCK];
    let mut got = 0u64;
    while got < len {
        let want = (len - got).min(BLOCK as u64) as usize;
        let n = tls.read(&mut buf[..want]).unwrap();
        assert!(n > 0, "tcp stream cut short");
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).unwrap();
        got += n as u64;
    }
    out.flush().unwrap();
    let ok = hasher.finalize().as_bytes() == &head[8..];
    tls.write_all(&[u8::from(ok)]).unwrap();
    tls.flush().unwrap();
}
