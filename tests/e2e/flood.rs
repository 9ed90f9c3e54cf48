//! A spoofed QUIC Initial flood, as on the open internet: each Initial is
//! a real client's first datagram (a fresh connection, a ClientHello,
//! padded to 1200 bytes), made with quinn-proto and sent from a loopback
//! source address (127.0.0.0/8 can all be bound here); nothing it receives
//! is ever answered, as a sender of packets with someone else's address
//! never could. The replies are only counted: a Retry, or anything else.
//!
//! Shared by the address validation tests and `cargo bench --bench flood`
//! (which sends them at a steady rate).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::crypto::rustls::QuicClientConfig;
use tessera_transport as transport;

/// Makes Initials of fresh connections to one coordinator.
pub struct Initials {
    endpoint: quinn_proto::Endpoint,
    made: u32,
    config: quinn_proto::ClientConfig,
    target: SocketAddr,
    buf: Vec<u8>,
}

/// Connections one endpoint makes before a new one replaces it (it keeps
/// each connection's state, which the flood never drives).
const PER_ENDPOINT: u32 = 1024;

fn endpoint() -> quinn_proto::Endpoint {
    quinn_proto::Endpoint::new(Default::default(), None, false, None)
}

impl Initials {
    /// Initials to the coordinator at `target` whose certificate has
    /// `fingerprint` (public: every ticket has it).
    pub fn new(target: SocketAddr, fingerprint: &str) -> Initials {
        let tls = transport::client_tls(fingerprint).unwrap();
        let quic = QuicClientConfig::try_from(tls).unwrap();
        Initials {
            endpoint: endpoint(),
            made: 0,
            config: quinn_proto::ClientConfig::new(Arc::new(quic)),
            target,
            buf: Vec::new(),
        }
    }

    /// The first datagram of a new connection.
    pub fn next(&mut self) -> &[u8] {
        if self.made == PER_ENDPOINT {
            self.endpoint = endpoint();
            self.made = 0;
        }
        self.made += 1;
        let now = Instant::now();
        let (_, mut conn) = (self.endpoint)
            .connect(now, self.config.clone(), self.target, transport::CERT_NAME)
            .unwrap();
        self.buf.clear();
        let transmit = conn
            .poll_transmit(now, 1, &mut self.buf)
            .expect("an Initial");
        &self.buf[..transmit.size]
    }
}

/// What a datagram from the coordinator is, by its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// A Retry: the coordinator wants the sender to prove its address.
    Retry,
    /// An Initial: the handshake goes on (or a refusal, which is also sent
    /// in an Initial).
    Initial,
    /// Anything else (a Handshake packet, a short header).
    Other,
}

pub fn classify(datagram: &[u8]) -> Reply {
    match datagram.first() {
        // Long header (0x80); its type in bits 4–5: 0 Initial, 3 Retry.
        Some(b) if b & 0x80 != 0 => match (b >> 4) & 0x3 {
            0 => Reply::Initial,
            3 => Reply::Retry,
            _ => Reply::Other,
        },
        _ => Reply::Other,
    }
}

/// Sends one Initial from `source` and returns what the coordinator first
/// answered, or `None` when nothing came within 5 s.
pub fn probe(target: SocketAddr, fingerprint: &str, source: IpAddr) -> Option<Reply> {
    let socket = UdpSocket::bind((source, 0)).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut initials = Initials::new(target, fingerprint);
    socket.send_to(initials.next(), target).unwrap();
    let mut buf = [0u8; 2048];
    let n = socket.recv(&mut buf).ok()?;
    Some(classify(&buf[..n]))
}
