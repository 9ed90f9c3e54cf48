//! The QUIC transport: the coordinator's self-signed certificate, endpoints
//! for both sides, certificate pinning by fingerprint, the `Hello` handshake,
//! and [`Channel`], which turns a QUIC stream pair into typed messages
//! ([`framing`] reads and writes them). [`blob`] carries blobs over QUIC
//! streams; [`congestion`] is the congestion controller rented links need.

pub mod blob;
pub mod congestion;
mod connect;
pub mod framing;

mod pem;
pub use connect::{connect, connect_at};
pub use pem::server_tls_pem;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::QuicServerConfig;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use serde::de::DeserializeOwned;
use serde::Serialize;

use tessera_protocol::codec::{Codec, CodecError, MAX_HELLO_FRAME};
use tessera_protocol::messages::{Hello, Role};

const ALPN: &[u8] = b"tessera/1";
const SERVER_NAME: &str = "tessera-coordinator";

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot reach the coordinator at {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("the coordinator refused this connection: {0}")]
    Refused(String),
    #[error("protocol version mismatch: {0}")]
    Version(String),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("connection lost: {0}")]
    Lost(String),
    #[error("tls setup failed: {0}")]
    Tls(String),
}

/// A coordinator certificate and its private key, both DER.
pub struct Identity {
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

impl Identity {
    pub fn generate() -> Result<Identity, TransportError> {
        let cert = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| TransportError::Tls(e.to_string()))?;
        Ok(Identity {
            cert_der: cert.cert.der().to_vec(),
            key_der: cert.signing_key.serialize_der(),
        })
    }

    /// blake3 of the certificate, hex: what tickets pin.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.cert_der)
    }
}

pub fn fingerprint(cert_der: &[u8]) -> String {
    blake3::hash(cert_der).to_hex().to_string()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Timings both sides agree on. Keep-alives keep an idle control connection
/// open; the idle timeout is how long a silent peer is tolerated.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub keep_alive: Duration,
    pub idle_timeout: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            keep_alive: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10),
        }
    }
}

/// UDP socket buffer size asked for.
const SOCKET_BUFFER: usize = 8 * 1024 * 1024;

/// How the transport moves bulk data: congestion control, flow-control
/// windows, acknowledgement frequency, segmentation offload, datagram size.
/// [`Tuning::default`] is what Tessera runs with, chosen by measurement on
/// the WAN bench at MTU 1500 (`cargo bench --bench wan -- goodput`,
/// BENCHMARKS.md, where the alternatives' figures are); benchmarks try
/// others with [`set_tuning`]. quinn always paces its sending: there is no
/// pacing knob to try.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    pub congestion: Congestion,
    /// Bytes one stream may have in flight ahead of the reader.
    pub stream_receive_window: u32,
    /// Bytes a whole connection may have in flight ahead of the reader.
    pub receive_window: u32,
    /// Bytes queued for sending per connection.
    pub send_window: u64,
    /// Acknowledge every `n`th ack-eliciting packet (or after 10 ms)
    /// instead of every other one (None: QUIC's default).
    pub ack_every: Option<u32>,
    /// Hand the kernel runs of datagrams in one call (UDP GSO).
    pub segmentation_offload: bool,
    /// The largest UDP payload accepted and probed for by path MTU
    /// discovery (see [`MAX_UDP_PAYLOAD`]).
    pub max_udp_payload: u16,
}

/// The congestion controllers: Tessera's own (the default) and quinn's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Congestion {
    /// CUBIC that cuts its window less for a loss seen with no queue
    /// behind it ([`crate::congestion`]).
    CubicVeno,
    Cubic,
    NewReno,
    Bbr,
}

impl Congestion {
    /// `--congestion cubic-veno|cubic|newreno|bbr`.
    pub fn parse(s: &str) -> Result<Congestion, String> {
        match s {
            "cubic-veno" => Ok(Congestion::CubicVeno),
            "cubic" => Ok(Congestion::Cubic),
            "newreno" => Ok(Congestion::NewReno),
            "bbr" => Ok(Congestion::Bbr),
            _ => Err(format!("`{s}`: expected cubic-veno, cubic, newreno or bbr")),
        }
    }
}

/// Every endpoint and connection of this process from now on sends with
/// `congestion` (`--congestion`); the rest of the tuning is the default.
pub fn use_congestion(congestion: Congestion) {
    set_tuning(Tuning {
        congestion,
        ..Tuning::default()
    });
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            congestion: Congestion::CubicVeno,
            stream_receive_window: 16 * 1024 * 1024,
            receive_window: RECEIVE_WINDOW,
            send_window: 64 * 1024 * 1024,
            ack_every: Some(16),
            segmentation_offload: true,
            max_udp_payload: MAX_UDP_PAYLOAD,
        }
    }
}

static TUNING: std::sync::Mutex<Option<Tuning>> = std::sync::Mutex::new(None);

/// Sets the tuning every endpoint and connection made from now on in this
/// process uses (benchmarks comparing alternatives; nothing else calls it).
pub fn set_tuning(tuning: Tuning) {
    *TUNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(tuning);
}

/// The tuning in force: [`Tuning::default`] unless [`set_tuning`] said
/// otherwise.
pub fn tuning() -> Tuning {
    TUNING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_default()
}

/// The largest UDP payload an endpoint accepts and that path MTU discovery
/// probes for. QUIC starts at 1200 bytes and quinn stops probing at 1452 by
/// default; where the path carries more (loopback, jumbo-frame networks in a
/// datacenter) a bigger datagram spreads the per-packet cost (encryption
/// calls, acknowledgements, stream bookkeeping) over more bytes: 1 GiB over
/// loopback went from about 0.75× to about 1.05× the goodput of TCP+TLS. On
/// an ordinary 1500-byte path the probes above it are lost and the MTU stays
/// at 1472. Above about 6000 bytes, bursts that overran the receiving
/// socket's buffer on loopback looked like an MTU black hole to quinn, which
/// then fell back to 1200 bytes; 4096 never did in our runs (BENCHMARKS.md).
pub const MAX_UDP_PAYLOAD: u16 = 4096;

/// A UDP socket for an endpoint. Bulk transfers overrun the default socket
/// buffers (≈200 KiB) and lose packets; ask for more (the kernel caps it at
/// net.core.rmem_max).
fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let state = quinn::udp::UdpSocketState::new((&socket).into())?;
    let _ = state.set_recv_buffer_size((&socket).into(), SOCKET_BUFFER);
    let _ = state.set_send_buffer_size((&socket).into(), SOCKET_BUFFER);
    Ok(socket)
}

/// Moves `endpoint` to a fresh, tuned UDP socket on a new port (same
/// address family, any local address), as a NAT that forgot its mapping or
/// a restarted network would: QUIC connection migration carries every
/// connection over, and the peer sees packets from a new address. Returns
/// the new local address.
pub fn rebind(endpoint: &quinn::Endpoint) -> std::io::Result<SocketAddr> {
    let any: SocketAddr = if endpoint.local_addr()?.is_ipv6() {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .expect("a socket address");
    let socket = bind_udp(any)?;
    let local = socket.local_addr()?;
    endpoint.rebind(socket)?;
    Ok(local)
}

/// An endpoint on a fresh, tuned UDP socket bound to `addr`.
fn endpoint(
    addr: SocketAddr,
    server: Option<quinn::ServerConfig>,
) -> std::io::Result<quinn::Endpoint> {
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(tuning().max_udp_payload)
        .expect("a payload size within QUIC's bounds");
    quinn::Endpoint::new(
        config,
        server,
        bind_udp(addr)?,
        Arc::new(quinn::TokioRuntime),
    )
}

fn transport_config(timing: Timing) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(timing.keep_alive));
    t.max_idle_timeout(Some(
        timing.idle_timeout.try_into().expect("idle timeout fits"),
    ));
    let tuning = tuning();
    // Blob streams move gigabytes: windows wide enough for one stream to
    // fill a fast path.
    t.stream_receive_window(tuning.stream_receive_window.into());
    t.receive_window(tuning.receive_window.into());
    t.send_window(tuning.send_window);
    t.max_concurrent_bidi_streams(MAX_STREAMS.into());
    t.max_concurrent_uni_streams(0u32.into());
    // Fewer acknowledgements than every other packet: bulk transfers then
    // spend far less CPU on them, which is where QUIC's per-packet cost goes.
    if let Some(n) = tuning.ack_every {
        let mut acks = quinn::AckFrequencyConfig::default();
        acks.ack_eliciting_threshold((n.max(1) - 1).into());
        acks.max_ack_delay(Some(Duration::from_millis(10)));
        t.ack_frequency_config(Some(acks));
    }
    t.enable_segmentation_offload(tuning.segmentation_offload);
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(tuning.max_udp_payload);
    t.mtu_discovery_config(Some(mtu));
    match tuning.congestion {
        Congestion::CubicVeno => {
            t.congestion_controller_factory(Arc::new(crate::congestion::CubicVenoConfig));
        }
        Congestion::Cubic => {}
        Congestion::NewReno => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::NewRenoConfig::default()));
        }
        Congestion::Bbr => {
            t.congestion_controller_factory(Arc::new(quinn::congestion::BbrConfig::default()));
        }
    }
    Arc::new(t)
}

/// What an unauthenticated peer may have in flight on one connection: the
/// bytes it may send ahead of the coordinator's reads, and the streams it
/// may open (just the control stream). Raised by [`admit`] once its
/// `Hello` proved a secret.
const PRE_AUTH_RECEIVE_WINDOW: u32 = 64 * 1024;
const PRE_AUTH_STREAMS: u32 = 1;
/// The same after authentication (`transport_config`'s values).
const RECEIVE_WINDOW: u32 = 64 * 1024 * 1024;
const MAX_STREAMS: u32 = 256;

/// The coordinator's transport: `transport_config` narrowed to what an
/// unauthenticated peer may have in flight (see [`admit`]).
fn server_transport_config(timing: Timing) -> Arc<quinn::TransportConfig> {
    let mut t = Arc::try_unwrap(transport_config(timing)).expect("not shared yet");
    t.receive_window(PRE_AUTH_RECEIVE_WINDOW.into());
    t.max_concurrent_bidi_streams(PRE_AUTH_STREAMS.into());
    Arc::new(t)
}

/// Gives an authenticated peer's connection the normal windows and stream
/// count (the coordinator calls this once the `Hello` proved a secret).
pub fn admit(conn: &quinn::Connection) {
    conn.set_receive_window(tuning().receive_window.into());
    conn.set_max_concurrent_bi_streams(MAX_STREAMS.into());
}

/// The coordinator side's TLS 1.3 configuration (also used by the TCP+TLS
/// baseline of the transfer benchmark).
pub fn server_tls(identity: &Identity) -> Result<rustls::ServerConfig, TransportError> {
    let cert = CertificateDer::from(identity.cert_der.clone());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(identity.key_der.clone()));
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .map_err(|e| TransportError::Tls(e.to_string()))?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// The connecting side's TLS 1.3 configuration: accepts exactly the
/// certificate with this blake3 `fingerprint`.
pub fn client_tls(fingerprint: &str) -> Result<rustls::ClientConfig, TransportError> {
    let provider = provider();
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinnedCert {
            fingerprint: fingerprint.to_string(),
            provider,
        }))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// The name the coordinator's certificate is issued for.
pub const CERT_NAME: &str = SERVER_NAME;

/// A server endpoint bound to `addr` presenting `identity`.
pub fn server_endpoint(
    addr: SocketAddr,
    identity: &Identity,
    timing: Timing,
) -> Result<quinn::Endpoint, TransportError> {
    let tls = server_tls(identity)?;
    let quic = QuicServerConfig::try_from(tls).map_err(|e| TransportError::Tls(e.to_string()))?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(server_transport_config(timing));
    let cannot_listen = |e: std::io::Error| TransportError::Connect {
        addr,
        reason: format!("cannot listen: {e}"),
    };
    let socket = bind_udp(addr).map_err(cannot_listen)?;
    // The same after a restart (see `ResetKey`): the reset key, and the key
    // that lets the endpoint recognise its own connection ids.
    let reset_key = ResetKey(blake3::derive_key(
        "tessera 2026 coordinator stateless reset key",
        &identity.key_der,
    ));
    let cid_key = blake3::derive_key(
        "tessera 2026 coordinator connection id key",
        &identity.key_der,
    );
    let mut endpoint_config = quinn::EndpointConfig::new(Arc::new(reset_key));
    endpoint_config.cid_generator(move || Box::new(CidGenerator { key: cid_key }));
    endpoint_config
        .max_udp_payload_size(tuning().max_udp_payload)
        .expect("a payload size within QUIC's bounds");
    quinn::Endpoint::new(
        endpoint_config,
        Some(config),
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(cannot_listen)
}

/// The coordinator's connection ids: [`CID_NONCE`] random bytes and
/// [`CID_SIGNATURE`] bytes of their keyed hash. The key is derived from the
/// coordinator's private key, so that after a restart the endpoint still
/// recognises the ids it issued (and answers their packets with a stateless
/// reset, see `ResetKey`); the random part is long enough that an id is
/// never issued twice in practice. quinn checks a new connection's ids
/// against the live ones, but not the id it puts in a Retry: with quinn's
/// `HashedConnectionIdGenerator` (3 random bytes), a Retry's id matched a
/// live connection's about once in 2,000 Retries with ~1,000 connections
/// open (the flood bench), and the client's next Initial went to that
/// connection and was dropped, for seconds at a time.
struct CidGenerator {
    key: [u8; 32],
}

const CID_NONCE: usize = 7;
const CID_SIGNATURE: usize = 5;

impl CidGenerator {
    fn signature(&self, nonce: &[u8]) -> [u8; CID_SIGNATURE] {
        let hash = blake3::keyed_hash(&self.key, nonce);
        hash.as_bytes()[..CID_SIGNATURE]
            .try_into()
            .expect("a prefix of the hash")
    }
}

impl quinn_proto::ConnectionIdGenerator for CidGenerator {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        use rand::RngCore;
        let mut cid = [0u8; CID_NONCE + CID_SIGNATURE];
        rand::rng().fill_bytes(&mut cid[..CID_NONCE]);
        let signature = self.signature(&cid[..CID_NONCE]);
        cid[CID_NONCE..].copy_from_slice(&signature);
        quinn::ConnectionId::new(&cid)
    }

    fn validate(&self, cid: &quinn::ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        if cid.len() != CID_NONCE + CID_SIGNATURE {
            return Err(quinn_proto::InvalidCid);
        }
        let (nonce, signature) = cid.split_at(CID_NONCE);
        if self.signature(nonce) == signature {
            Ok(())
        } else {
            Err(quinn_proto::InvalidCid)
        }
    }

    fn cid_len(&self) -> usize {
        CID_NONCE + CID_SIGNATURE
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// The key of the coordinator's stateless resets, derived from its private
/// key so that it is the same after a restart. A worker still holding a
/// connection to the previous run then learns from its next packet that
/// the connection is gone, and reconnects at once instead of waiting out
/// the idle timeout.
struct ResetKey([u8; 32]);

impl quinn::crypto::HmacKey for ResetKey {
    fn sign(&self, data: &[u8], signature_out: &mut [u8]) {
        let mac = blake3::keyed_hash(&self.0, data);
        signature_out.copy_from_slice(&mac.as_bytes()[..signature_out.len()]);
    }

    fn signature_len(&self) -> usize {
        32
    }

    fn verify(&self, data: &[u8], signature: &[u8]) -> Result<(), quinn::crypto::CryptoError> {
        // blake3::Hash compares in constant time.
        let mac = blake3::keyed_hash(&self.0, data);
        let given: [u8; 32] = signature
            .try_into()
            .map_err(|_| quinn::crypto::CryptoError)?;
        if mac == blake3::Hash::from_bytes(given) {
            Ok(())
        } else {
            Err(quinn::crypto::CryptoError)
        }
    }
}

/// Accepts exactly the certificate whose blake3 fingerprint the ticket names.
#[derive(Debug)]
struct PinnedCert {
    fingerprint: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for PinnedCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if fingerprint(end_entity.as_ref()) == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the coordinator's certificate does not match the ticket's fingerprint".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A typed message channel over one QUIC bidirectional stream. It writes
/// in the encoding its connection negotiated ([`Channel::codec`]; this
/// release's own until told otherwise) and reads either encoding, noting
/// which one the peer last used ([`Channel::peer_codec`]).
pub struct Channel {
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
    codec: Codec,
    peer_codec: Option<Codec>,
    budget: Option<framing::FrameBudget>,
}

impl Channel {
    pub fn new((send, recv): (quinn::SendStream, quinn::RecvStream)) -> Channel {
        Channel::with_codec((send, recv), Codec::CURRENT)
    }

    /// A channel that writes in `codec`.
    pub fn with_codec(
        (send, recv): (quinn::SendStream, quinn::RecvStream),
        codec: Codec,
    ) -> Channel {
        Channel {
            send,
            recv,
            codec,
            peer_codec: None,
            budget: None,
        }
    }

    /// Reads count their unfinished frames against `budget`, the one its
    /// connection's other streams share ([`framing::frame_budget`]).
    pub fn with_budget(mut self, budget: framing::FrameBudget) -> Channel {
        self.budget = Some(budget);
        self
    }

    /// The encoding this channel writes.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Writes `codec` from now on (after the handshake agreed on it).
    pub fn set_codec(&mut self, codec: Codec) {
        self.codec = codec;
    }

    /// The encoding of the last frame received, if any: a server answers a
    /// stream in the encoding it was asked in.
    pub fn peer_codec(&self) -> Option<Codec> {
        self.peer_codec
    }

    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), CodecError> {
        framing::write_frame_as(&mut self.send, self.codec, msg).await
    }

    /// Sends a `Hello` or `Welcome`: always in version 18's layout, which
    /// every release reads.
    pub async fn send_handshake<T: Serialize>(&mut self, msg: &T) -> Result<(), CodecError> {
        framing::write_frame_as(&mut self.send, Codec::Legacy, msg).await
    }

    /// Reads a `Hello` or `Welcome` (at most [`MAX_HELLO_FRAME`] bytes, in
    /// version 18's layout only).
    pub async fn recv_handshake<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        let msg = self.recv_within(MAX_HELLO_FRAME).await?;
        if msg.is_some() && self.peer_codec != Some(Codec::Legacy) {
            return Err(CodecError::Malformed(
                "a handshake frame must be in version 18's layout".into(),
            ));
        }
        Ok(msg)
    }

    /// The next message, or `None` when the peer finished the stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, CodecError> {
        self.recv_within(tessera_protocol::codec::MAX_FRAME).await
    }

    /// The next message of at most `max` bytes (see
    /// [`framing::read_frame_within`]).
    pub async fn recv_within<T: DeserializeOwned>(
        &mut self,
        max: u32,
    ) -> Result<Option<T>, CodecError> {
        match framing::read_budgeted_frame(&mut self.recv, max, self.budget.as_ref()).await? {
            Some((codec, msg)) => {
                self.peer_codec = Some(codec);
                Ok(Some(msg))
            }
            None => Ok(None),
        }
    }

    pub fn split(self) -> (quinn::SendStream, quinn::RecvStream) {
        (self.send, self.recv)
    }
}

/// An authenticated connection to the coordinator.
pub struct Session {
    pub endpoint: quinn::Endpoint,
    pub connection: quinn::Connection,
    pub control: Channel,
}

/// Server side of the handshake: checks the version (this release's or
/// the one before, [`MIN_PROTOCOL_VERSION`]) and which role the secret
/// proves. Returns the role, or the reason to send back, which names both
/// sides' versions when they do not match.
pub fn check_hello(
    hello: &Hello,
    worker_secret: &str,
    client_secret: &str,
) -> Result<Role, String> {
    if let Some(refusal) = tessera_protocol::codec::version_refusal(hello.version) {
        return Err(refusal);
    }
    let secret_ok = match hello.role {
        Role::Worker => constant_time_eq(&hello.secret, worker_secret),
        Role::Client => constant_time_eq(&hello.secret, client_secret),
        Role::Viewer => false,
    };
    if !secret_ok {
        return Err(match hello.role {
            Role::Viewer => {
                "a viewer ticket opens the dashboard and the HTTP API to look, not a QUIC session: use the client ticket".into()
            }
            Role::Worker => {
                "wrong worker ticket secret: use DATA_DIR/worker.ticket of this coordinator".into()
            }
            Role::Client => {
                "wrong client ticket secret: use DATA_DIR/client.ticket of this coordinator".into()
            }
        });
    }
    Ok(hello.role)
}

/// Whether two secrets are equal, in time that does not depend on where
/// they differ.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn congestion_names_parse_and_a_wrong_one_says_what_is_expected() {
        assert_eq!(Congestion::parse("bbr"), Ok(Congestion::Bbr));
        assert_eq!(Congestion::parse("cubic"), Ok(Congestion::Cubic));
        assert_eq!(Congestion::parse("newreno"), Ok(Congestion::NewReno));
        assert_eq!(Congestion::parse("cubic-veno"), Ok(Congestion::CubicVeno));
        assert_eq!(Tuning::default().congestion, Congestion::CubicVeno);
        let e = Congestion::parse("reno").unwrap_err();
        assert!(
            e.contains("expected cubic-veno, cubic, newreno or bbr"),
            "{e}"
        );
    }

    #[test]
    fn connection_ids_are_recognised_by_the_same_key_only() {
        use quinn_proto::ConnectionIdGenerator;
        let mut ours = CidGenerator { key: [7; 32] };
        let theirs = CidGenerator { key: [8; 32] };
        let ids: std::collections::HashSet<_> = (0..1000).map(|_| ours.generate_cid()).collect();
        assert_eq!(ids.len(), 1000, "no id twice");
        for id in &ids {
            assert_eq!(id.len(), ours.cid_len());
            assert!(ours.validate(id).is_ok());
            assert!(theirs.validate(id).is_err());
        }
        assert!(ours.validate(&quinn::ConnectionId::new(&[0; 8])).is_err());
    }

    #[test]
    fn version_and_role_are_checked() {
        use tessera_protocol::messages::PROTOCOL_VERSION;
        let hello = |version, role, secret: &str| Hello {
            version,
            role,
            secret: secret.into(),
            name: "t".into(),
        };
        assert_eq!(
            check_hello(&hello(PROTOCOL_VERSION, Role::Worker, "w"), "w", "c"),
            Ok(Role::Worker)
        );
        assert_eq!(
            check_hello(&hello(PROTOCOL_VERSION, Role::Client, "c"), "w", "c"),
            Ok(Role::Client)
        );
        // A worker secret does not make a client.
        let e = check_hello(&hello(PROTOCOL_VERSION, Role::Client, "w"), "w", "c").unwrap_err();
        assert!(e.contains("wrong client ticket secret"), "{e}");
        let e = check_hello(&hello(99, Role::Worker, "w"), "w", "c").unwrap_err();
        assert!(
            e.contains("protocol version mismatch") && e.contains("99"),
            "{e}"
        );
        // One version behind is served; two behind is refused, both named.
        assert_eq!(
            check_hello(&hello(PROTOCOL_VERSION - 1, Role::Worker, "w"), "w", "c"),
            Ok(Role::Worker)
        );
        let e = check_hello(&hello(PROTOCOL_VERSION - 2, Role::Worker, "w"), "w", "c").unwrap_err();
        assert!(
            e.contains(&format!(
                "speaks versions {PROTOCOL_VERSION} and {}",
                PROTOCOL_VERSION - 1
            )) && e.contains(&format!("the peer speaks version {}", PROTOCOL_VERSION - 2)),
            "{e}"
        );
    }
}
