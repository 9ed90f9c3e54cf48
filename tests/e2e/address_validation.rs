//! Address validation against a real coordinator process: a peer that has
//! not proved its address gets a QUIC Retry, and takes no pre-auth place,
//! while the places are under pressure and when its address failed
//! recently; a real client (and worker) answers the Retry and connects.
//! What the coordinator answered is read off the wire (a Retry's packet
//! type) and off its debug log (which peers were sent a Retry, which took
//! a place and whether they had proved their address).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use crate::flood::{classify, probe, Initials, Reply};
use crate::harness::Farm;
use crate::hostile::ticket;

/// The coordinator's pre-auth places (`conn/gate.rs`): a quarter of
/// `MAX_UNAUTHENTICATED` held is pressure; a quarter of the per-address
/// limit held by one address is pressure for that address.
const PRESSURE: usize = 512 / 4;
const PRESSURE_PER_ADDR: usize = 64 / 4;
/// The coordinator's hello deadline (`conn/handshake.rs`): how long a
/// place is held by a peer that never finishes its handshake.
const HELLO_DEADLINE: Duration = Duration::from_secs(5);

const LOG: &str = "info,tessera_coordinator::conn=debug";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// What the coordinator's log says of each peer from 127.0.0.1: whether
/// it was sent a Retry (and why), and whether it took a place having
/// proved its address.
#[derive(Debug, Default)]
struct Seen {
    retried: Vec<String>,
    validated_place: bool,
    unvalidated_place: bool,
}

fn seen_from_localhost(log: &str) -> HashMap<u16, Seen> {
    let mut peers: HashMap<u16, Seen> = HashMap::new();
    for line in log.lines() {
        let Some(port) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("peer=127.0.0.1:"))
            .and_then(|p| p.parse().ok())
        else {
            continue;
        };
        let seen = peers.entry(port).or_default();
        if let Some(rest) = line.split("Retry sent (").nth(1) {
            seen.retried
                .push(rest.split(')').next().unwrap_or_default().to_string());
        }
        if line.contains("pre-auth place taken") {
            if line.contains("validated=true") {
                seen.validated_place = true;
            } else {
                seen.unvalidated_place = true;
            }
        }
    }
    peers
}

/// Local ports of 127.0.0.1 peers that were sent a Retry for `why` and
/// then took a place with their address proved.
fn retried_then_validated(log: &str, why: &str) -> Vec<u16> {
    let mut ports: Vec<u16> = seen_from_localhost(log)
        .into_iter()
        .filter(|(_, s)| s.retried.iter().any(|r| r == why) && s.validated_place)
        .map(|(port, _)| port)
        .collect();
    ports.sort();
    ports
}

#[test]
fn an_address_that_failed_recently_must_prove_itself_and_its_client_connects() {
    let farm = Farm::start_with_env("retry-failed", &[], &[("RUST_LOG", LOG)]);
    let t = ticket(&farm, "client.ticket");

    // No pressure, no failure: the handshake starts at the first Initial.
    assert_eq!(
        probe(t.addr, &t.fingerprint, ip("127.0.0.1")),
        Some(Reply::Initial)
    );

    // A client with a wrong secret fails from 127.0.0.1 ...
    let mut wrong = t.clone();
    wrong.secret = "0".repeat(wrong.secret.len());
    let out = farm
        .command(&["status", "--json"])
        .env("TESSERA_TICKET", wrong.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success(), "a wrong secret was accepted");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("wrong client ticket secret"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // ... so the next Initial from 127.0.0.1 gets a Retry; another address
    // still gets the handshake at once.
    assert_eq!(
        probe(t.addr, &t.fingerprint, ip("127.0.0.1")),
        Some(Reply::Retry)
    );
    assert_eq!(
        probe(t.addr, &t.fingerprint, ip("127.0.0.70")),
        Some(Reply::Initial)
    );

    // The real client answers the Retry and gets in.
    let status = farm.json(&["status", "--json"]);
    assert!(status["workers"].is_array(), "{status}");
    let log = farm.coordinator_log();
    let ports = retried_then_validated(&log, "a recent failure from this address");
    assert!(
        !ports.is_empty(),
        "no client from 127.0.0.1 was sent a Retry and then admitted: {:?}",
        seen_from_localhost(&log)
    );
}

/// Sends one Initial from each of `per_source` sockets on each of
/// `sources` and returns what each was first answered. The sockets are
/// kept (returned) so that nothing tells the coordinator they are gone.
fn burst(
    target: SocketAddr,
    fingerprint: &str,
    sources: &[IpAddr],
    per_source: usize,
) -> (Vec<Option<Reply>>, Vec<UdpSocket>) {
    let mut initials = Initials::new(target, fingerprint);
    let mut sockets = Vec::new();
    for _ in 0..per_source {
        for &source in sources {
            let socket = UdpSocket::bind((source, 0)).unwrap();
            socket.send_to(initials.next(), target).unwrap();
            sockets.push(socket);
        }
    }
    let mut buf = [0u8; 2048];
    let replies = (sockets.iter())
        .map(|s| {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.recv(&mut buf).ok().map(|n| classify(&buf[..n]))
        })
        .collect();
    (replies, sockets)
}

/// The local port of worker `name`'s connection, from its join line.
fn worker_port(log: &str, name: &str) -> Option<u16> {
    let line = (log.lines())
        .find(|l| l.contains("worker joined") && l.contains(&format!("name={name} ")))?;
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("peer=127.0.0.1:"))
        .and_then(|p| p.parse().ok())
}

#[test]
fn under_pressure_a_place_is_taken_only_after_a_retry_and_a_client_and_worker_connect() {
    // Places are held for the hello deadline from when they are taken; a
    // trial that took longer than that (a loaded machine) says nothing,
    // and is made again on a fresh coordinator.
    for trial in 0..3u8 {
        let mut farm = Farm::start_with_env("retry-pressure", &[], &[("RUST_LOG", LOG)]);
        let t = ticket(&farm, "client.ticket");
        let start = Instant::now();
        // 10 addresses, 16 spoofed Initials each (160), none ever answered.
        let sources: Vec<IpAddr> = (0..10u8)
            .map(|i| IpAddr::from([127, 0, 10 + trial, 2 + i]))
            .collect();
        let (replies, _sockets) = burst(t.addr, &t.fingerprint, &sources, PRESSURE_PER_ADDR);
        let count = |r: Reply| replies.iter().filter(|x| **x == Some(r)).count();
        let (initial, retry) = (count(Reply::Initial), count(Reply::Retry));

        // A new address, and the real client and worker, under pressure.
        let probed = probe(
            t.addr,
            &t.fingerprint,
            IpAddr::from([127, 0, 20 + trial, 1]),
        );
        let status = farm.json(&["status", "--json"]);
        assert!(status["workers"].is_array(), "{status}");
        let worker = format!("under-pressure-{trial}");
        farm.add_worker(&worker);
        farm.wait_workers(1);
        if start.elapsed() >= HELLO_DEADLINE {
            println!(
                "trial {trial} took {:?}: the burst's places may have expired; again",
                start.elapsed()
            );
            continue;
        }

        println!(
            "{} spoofed Initials: {initial} got the handshake, {retry} a Retry",
            replies.len()
        );
        assert_eq!(
            (initial, retry),
            (PRESSURE, replies.len() - PRESSURE),
            "places are taken without validation up to the pressure mark, never past it"
        );
        assert_eq!(probed, Some(Reply::Retry), "a new address under pressure");
        let log = &farm.coordinator_log();
        let seen = seen_from_localhost(log);
        let ports = retried_then_validated(log, "pre-auth places under pressure");
        let worker_port = worker_port(log, &worker).expect("the worker's join is logged");
        assert!(
            ports.contains(&worker_port),
            "the worker was sent a Retry and then admitted: {seen:?}"
        );
        assert!(
            ports.iter().any(|p| *p != worker_port),
            "a client was sent a Retry and then admitted: {seen:?}"
        );
        let unvalidated: HashSet<_> = (seen.iter())
            .filter(|(_, s)| s.unvalidated_place)
            .map(|(p, _)| p)
            .collect();
        assert!(
            unvalidated.is_empty(),
            "a peer from 127.0.0.1 took a place without proving its address under pressure: {seen:?}"
        );
        return;
    }
    panic!("each trial took longer than the hello deadline: the machine is too loaded to tell");
}
