//! The HTTP API against idle sockets and huge declared bodies (issue 27):
//! a flood of TCP connections that never send a byte, from the client's own
//! address or from many, never keeps an authenticated request waiting
//! (idle sockets are closed, oldest first, to make room, and no more than
//! a few wait per address), and a body declared larger than the limit is
//! refused with 413 before any of it is sent.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_protocol::ticket::Ticket;
use tessera_transport as transport;

use crate::harness::Farm;
use crate::hostile::ticket;

/// The coordinator's handshake and header timeout (`http/mod.rs`): an
/// answer that came sooner than half of it waited on no idle socket.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Waiting connections per address, and in all (`http/places.rs`).
const WAITING_PER_ADDRESS: usize = 16;
const WAITING: usize = 256;

pub use crate::harness::{http_addr, http_call as call};

/// Sends `head` (a request's head, `\r\n\r\n` included) over TLS pinned to
/// the coordinator's certificate, and reads the answer until the
/// coordinator closes or `patience` passes. Returns the status code (0 if
/// none came) and how long the answer took.
fn request(ticket: &Ticket, addr: SocketAddr, head: &str, patience: Duration) -> (u16, Duration) {
    let mut tls = transport::client_tls(&ticket.fingerprint).unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(tls), name).unwrap();
    let started = Instant::now();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(patience)).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The status line is enough: stop reading once it is in.
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    let code = (text.strip_prefix("HTTP/1.1 "))
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, took)
}

fn status_head(secret: &str) -> String {
    format!(
        "GET /v1/status HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {secret}\r\nConnection: close\r\n\r\n"
    )
}

/// Opens `n` TCP connections to `addr` from `sources` in turn, sending
/// nothing.
fn idle_flood(addr: SocketAddr, sources: &[std::net::IpAddr], n: usize) -> Vec<TcpStream> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut held = Vec::new();
        for i in 0..n {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket
                .bind(SocketAddr::new(sources[i % sources.len()], 0))
                .unwrap();
            let stream = socket.connect(addr).await.unwrap();
            // Left non-blocking: `still_open` peeks without waiting.
            held.push(stream.into_std().unwrap());
        }
        held
    })
}

/// How many of `held` the coordinator has not closed, once the count stops
/// falling (it closes them as it accepts them).
fn still_open(held: &[TcpStream]) -> usize {
    let open = || {
        (held.iter())
            .filter(|s| {
                let mut b = [0u8; 1];
                matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = open();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = open();
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[test]
fn idle_sockets_never_keep_an_authenticated_request_waiting_and_a_huge_body_is_refused_at_once() {
    let farm = Farm::start("http-limits", &["--http"]);
    let client = ticket(&farm, "client.ticket");
    let addr = http_addr(&farm);
    let head = status_head(&client.secret);
    let (code, quiet) = request(&client, addr, &head, HANDSHAKE_TIMEOUT * 3);
    assert_eq!(code, 200);

    // 600 idle sockets from the client's own address: the request after
    // them is answered at once, and no more than a few of them are kept.
    let local = std::net::IpAddr::from([127, 0, 0, 1]);
    let held = idle_flood(addr, &[local], 600);
    let (code, one_address) = request(&client, addr, &head, HANDSHAKE_TIMEOUT * 3);
    assert_eq!(code, 200, "no answer with 600 idle sockets open");
    let open = still_open(&held);
    assert!(
        open <= WAITING_PER_ADDRESS,
        "{open} idle sockets of one address kept (bound {WAITING_PER_ADDRESS})"
    );
    drop(held);

    // 600 idle sockets from 40 other addresses, each under its own bound:
    // the bound on all waiting connections closes the oldest.
    let sources: Vec<std::net::IpAddr> = (1..=40u8)
        .map(|i| std::net::IpAddr::from([127, 0, 1, i]))
        .collect();
    let held = idle_flood(addr, &sources, 600);
    let (code, many_addresses) = request(&client, addr, &head, HANDSHAKE_TIMEOUT * 3);
    assert_eq!(code, 200, "no answer with 600 idle sockets open");
    let open = still_open(&held);
    assert!(
        open <= WAITING,
        "{open} idle sockets kept (bound {WAITING})"
    );
    println!(
        "authenticated GET /v1/status: {:.0} ms quiet, {:.0} ms with 600 idle sockets of its own address, {:.0} ms with 600 from 40 others ({open} of those kept open)",
        quiet.as_secs_f64() * 1e3,
        one_address.as_secs_f64() * 1e3,
        many_addresses.as_secs_f64() * 1e3,
    );
    // Not held up by any idle socket: those wait up to the handshake
    // timeout before they are closed for silence.
    for took in [one_address, many_addresses] {
        assert!(took < HANDSHAKE_TIMEOUT / 2, "answered after {took:?}");
    }
    drop(held);

    // A 10 GB body, declared and never sent: 413 without waiting for it
    // (a coordinator waiting for the body would answer nothing).
    let huge = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n",
        client.secret
    );
    let (code, _) = request(&client, addr, &huge, HANDSHAKE_TIMEOUT);
    assert_eq!(code, 413, "a 10 GB declared body was not refused at once");
    // Unauthenticated, it is a 401 first: nothing of a stranger's is read.
    let stranger = huge.replace(&client.secret, "not-the-secret");
    let (code, _) = request(&client, addr, &stranger, HANDSHAKE_TIMEOUT);
    assert_eq!(code, 401);
    // The farm still answers.
    assert_eq!(request(&client, addr, &head, HANDSHAKE_TIMEOUT * 3).0, 200);
}
