//! Asset benchmarks (`cargo bench --bench assets [goodput|ingest]`), each
//! measured side by side in one run on 127.0.0.1 and printed as a ratio to
//! its baseline; nothing here asserts a wall-clock time.
//!
//! (a) blob goodput: one blob of `TESSERA_BENCH_MIB` (default 1024) MiB put
//!     into a verifying `BlobDir` over the project's QUIC transport
//!     (`blob::put` / `blob::answer`), ÷ the same bytes over TCP + rustls
//!     TLS 1.3 with the same certificate and TLS configuration, received the
//!     same way (hashed while written to a file). Files live on tmpfs
//!     (`/dev/shm`) when present, so the disk does not set the pace.
//!     Target ≥ 0.8.
//! (b) ingest: chunk + hash (`chunk::list_file`, what `submit` runs on a
//!     large file: FastCDC cut points and blake3 of every chunk, on every
//!     core) ÷ plain blake3 of the same file (what submit did before
//!     chunking), both reading it from the page cache. Target ≥ 0.7. Also
//!     printed: `chunk::chunk_file`, which adds the whole-file digest (the
//!     coordinator computes that one as it joins the chunks).
//!
//! Each figure is the best of three alternating runs.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_protocol::messages::Role;
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;
use tessera_store::chunk;
use tessera_transport::blob::{self, BlobDir, BlobSource};
use tessera_transport::{self as transport, Identity, Timing};

const MIB: u64 = 1 << 20;
const BLOCK: usize = 256 * 1024;

fn main() {
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let run = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    let mib: u64 = std::env::var("TESSERA_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    // Stores on tmpfs when there is one, so the figures are the transport's
    // and not the disk's; TESSERA_BENCH_DIR chooses another folder.
    let base = std::env::var_os("TESSERA_BENCH_DIR")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from("/dev/shm")).filter(|p| p.is_dir()))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tessera-bench-assets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("blob.bin");
    write_noise(&file, mib * MIB);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "assets benchmarks: {mib} MiB of noise in {}, {cores} cores",
        base.display()
    );
    if run("goodput") {
        goodput(&dir, &file);
    }
    if run("ingest") {
        ingest(&file);
    }
    let _ = std::fs::remove_dir_all(&dir);
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

fn rate(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn goodput(dir: &Path, file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let (digest, _) = Digest::of_reader(std::fs::File::open(file).unwrap()).unwrap();
    let identity = Identity::generate().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();

    // QUIC: the project's endpoints, handshake and blob streams.
    let quic_store = BlobDir::open(dir.join("quic-store")).unwrap();
    let session = rt.block_on(async {
        let endpoint = transport::server_endpoint(
            "127.0.0.1:0".parse().unwrap(),
            &identity,
            Timing::default(),
        )
        .unwrap();
        let ticket = Ticket {
            role: Role::Client,
            addr: endpoint.local_addr().unwrap(),
            also: Vec::new(),
            fingerprint: identity.fingerprint(),
            secret: "bench".into(),
        };
        tokio::spawn(blob::serve(endpoint, quic_store.clone(), "bench".into()));
        transport::connect(&ticket, "bench", Timing::default())
            .await
            .unwrap()
    });
    let quic = || {
        let _ = std::fs::remove_file(quic_store.path(&digest));
        let started = Instant::now();
        rt.block_on(blob::put(
            &session.connection,
            digest,
            len,
            BlobSource::File(file),
        ))
        .unwrap();
        let d = started.elapsed();
        assert_eq!(quic_store.size(&digest), Some(len));
        d
    };

    // TCP + TLS 1.3: same certificate and TLS configuration, rustls over
    // std sockets, the receiver hashing while it writes a file.
    let server_tls = Arc::new(transport::server_tls(&identity).unwrap());
    let client_tls = Arc::new(transport::client_tls(&identity.fingerprint()).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let tcp_dest = dir.join("tcp-received");
    {
        let tcp_dest = tcp_dest.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let stream = stream.unwrap();
                stream.set_nodelay(true).unwrap();
                let conn = rustls::ServerConnection::new(server_tls.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                receive_tls(&mut tls, &tcp_dest);
            }
        });
    }
    let tcp = || {
        let started = Instant::now();
        let stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_nodelay(true).unwrap();
        let name = rustls::pki_types::ServerName::try_from(transport::CERT_NAME).unwrap();
        let conn = rustls::ClientConnection::new(client_tls.clone(), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, stream);
        let mut want = [0u8; 40];
        want[..8].copy_from_slice(&len.to_be_bytes());
        want[8..].copy_from_slice(&digest.0);
        tls.write_all(&want).unwrap();
        let mut src = std::fs::File::open(file).unwrap();
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
    };

    let (mut best_quic, mut best_tcp) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        best_quic = best_quic.min(quic());
        best_tcp = best_tcp.min(tcp());
    }
    let (q, t) = (rate(len, best_quic), rate(len, best_tcp));
    let stats = session.connection.stats();
    println!(
        "  QUIC path: MTU {} bytes, {} packets sent, {} lost, {} congestion events",
        stats.path.current_mtu,
        stats.path.sent_packets,
        stats.path.lost_packets,
        stats.path.congestion_events
    );
    println!(
        "goodput: QUIC {q:.0} MiB/s, TCP+TLS {t:.0} MiB/s for {} MiB: ratio {:.2} (target >= 0.8)",
        len / MIB,
        q / t
    );
}

/// The TCP side of one blob: `len` and digest, then the bytes, hashed while
/// written to `dest`; answers 1 on a match.
fn receive_tls(tls: &mut impl ReadWrite, dest: &PathBuf) {
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

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn ingest(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let plain = || {
        let started = Instant::now();
        // 256 KiB reads straight from the file into the hasher (a buffered
        // reader in front would add a copy and slow the baseline down).
        let (digest, _) = Digest::of_reader(std::fs::File::open(file).unwrap()).unwrap();
        (started.elapsed(), digest)
    };
    let (mut best_plain, mut best_list, mut best_whole) =
        (Duration::MAX, Duration::MAX, Duration::MAX);
    let mut chunks = 0;
    for _ in 0..3 {
        let (d, digest) = plain();
        best_plain = best_plain.min(d);
        let started = Instant::now();
        let list = chunk::list_file(file).unwrap();
        best_list = best_list.min(started.elapsed());
        let started = Instant::now();
        let recipe = chunk::chunk_file(file).unwrap();
        best_whole = best_whole.min(started.elapsed());
        assert_eq!(recipe.digest, digest, "chunked ingest must hash the same");
        assert_eq!(list.chunks, recipe.chunks);
        chunks = list.chunks.len();
    }
    let (p, c, w) = (
        rate(len, best_plain),
        rate(len, best_list),
        rate(len, best_whole),
    );
    println!(
        "ingest: chunk+hash {c:.0} MiB/s ({chunks} chunks, mean {} KiB), plain blake3 {p:.0} MiB/s: ratio {:.2} (target >= 0.7); with the whole-file digest too {w:.0} MiB/s ({:.2})",
        len / chunks.max(1) as u64 / 1024,
        c / p,
        w / p
    );
}
