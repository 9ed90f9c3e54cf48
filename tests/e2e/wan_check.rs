//! The WAN bench ([`crate::wan`]) itself, checked with plain sockets: a path is never
//! faster than its round-trip time or its rate (lower bounds only, which
//! no load can break), and drops about the share of packets asked for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::requires::{require, Need};
use crate::wan::{in_netns, Bench, Link, COORDINATOR_IP};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};

#[test]
#[ignore = "needs root, iproute2 and nftables"]
fn a_path_delays_limits_and_drops_what_it_carries() {
    require(Need::WanBench);
    let bench = Bench::start(&[Link::new(80, 0.0, 100), Link::new(20, 2.0, 1000)]);
    let server: SocketAddr = format!("{COORDINATOR_IP}:0").parse().unwrap();
    // UDP echo in the coordinator's namespace.
    let echo = in_netns(&bench.coordinator_ns, move || {
        UdpSocket::bind(server).unwrap()
    });
    let echo_addr = echo.local_addr().unwrap();
    echo.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let echo_stop = Arc::new(AtomicBool::new(false));
    let echoed = Arc::new(AtomicU64::new(0));
    let echo_thread = {
        let (stop, echoed) = (echo_stop.clone(), echoed.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = echo.recv_from(&mut buf) {
                    echoed.fetch_add(1, Ordering::Relaxed);
                    if buf[0] == b'p' {
                        echo.send_to(&buf[..n], from).unwrap();
                    }
                }
            }
        })
    };
    // Path 0: every round trip takes at least 80 ms.
    let slow = bench.paths[0].ns.clone();
    let rtts = in_netns(&slow, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (0..5)
            .map(|_| {
                let sent = Instant::now();
                s.send_to(b"ping", echo_addr).unwrap();
                let mut buf = [0u8; 16];
                s.recv_from(&mut buf).expect("an echo over a lossless path");
                sent.elapsed()
            })
            .collect::<Vec<_>>()
    });
    eprintln!("80 ms path: round trips {rtts:?}");
    assert!(
        rtts.iter().all(|r| *r >= Duration::from_millis(80)),
        "{rtts:?}"
    );
    // ... and 4 MB over TCP take at least what 100 Mbit/s allows.
    let listener = in_netns(&bench.coordinator_ns, move || {
        TcpListener::bind(format!("{COORDINATOR_IP}:0")).unwrap()
    });
    let tcp_addr = listener.local_addr().unwrap();
    const LEN: usize = 4_000_000;
    let sink = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = 0;
        while got < LEN {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the TCP stream ended after {got} bytes");
            got += n;
        }
        s.write_all(b"k").unwrap();
    });
    let took = in_netns(&slow, move || {
        let started = Instant::now();
        let mut s = TcpStream::connect(tcp_addr).unwrap();
        s.write_all(&vec![7u8; LEN]).unwrap();
        let mut ack = [0u8; 1];
        s.read_exact(&mut ack).unwrap();
        started.elapsed()
    });
    sink.join().unwrap();
    eprintln!("80 ms path at 100 Mbit/s: {LEN} bytes over TCP in {took:?}");
    assert!(
        took >= Duration::from_secs_f64(LEN as f64 * 8.0 / 100e6),
        "{LEN} bytes in {took:?} over 100 Mbit/s"
    );
    assert_eq!(bench.paths[0].down.send_errors.load(Ordering::Relaxed), 0);
    assert_eq!(bench.paths[0].up.send_errors.load(Ordering::Relaxed), 0);

    // Path 1 drops about 2 % of what the worker sends.
    let fast = bench.paths[1].ns.clone();
    let before = echoed.load(Ordering::Relaxed);
    const SENT: u64 = 4000;
    in_netns(&fast, move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..SENT {
            s.send_to(&[b'x'; 1000], echo_addr).unwrap();
            // Well under the path's rate and the relay's queue.
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    // Everything not dropped arrives within a round trip or two.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = u64::MAX;
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = echoed.load(Ordering::Relaxed);
        if now == last || Instant::now() > deadline {
            break;
        }
        last = now;
    }
    let got = echoed.load(Ordering::Relaxed) - before;
    let lost = SENT - got;
    eprintln!("2 % path: {lost} of {SENT} datagrams lost");
    // Binomial(4000, 0.02): mean 80, sd 8.9; outside 30..=160 has odds
    // below one in a million.
    assert!((30..=160).contains(&lost), "{lost} of {SENT} lost at 2 %");
    echo_stop.store(true, Ordering::Relaxed);
    echo_thread.join().unwrap();

    // Dropping the bench removes every namespace it made.
    let names: Vec<String> = std::iter::once(bench.coordinator_ns.clone())
        .chain(
            bench
                .paths
                .iter()
                .flat_map(|p| [p.ns.clone(), p.relay_ns.clone()]),
        )
        .collect();
    drop(bench);
    for ns in names {
        assert!(
            !std::path::Path::new(&format!("/run/netns/{ns}")).exists(),
            "{ns} left behind"
        );
    }
}
