//! Blob streams: one QUIC stream per blob, a `BlobRequest` header frame
//! then raw bytes; every receiver re-hashes what it receives.

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::Channel;
use tessera_protocol::chunk::Recipe;
use tessera_protocol::messages::{BlobReply, BlobRequest, MAX_GET_MANY};
use tessera_protocol::Digest;
use tessera_store::blob::BLOCK;
pub use tessera_store::blob::{BlobDir, BlobError, MAX_BLOB};

/// Copies `len` bytes of the file at `path` to `dst`.
pub async fn send_file<W: AsyncWrite + Unpin>(path: &Path, dst: &mut W) -> Result<u64, BlobError> {
    let mut file = tokio::fs::File::open(path).await?;
    let mut buf = vec![0u8; BLOCK];
    let mut sent = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(sent);
        }
        dst.write_all(&buf[..n])
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?;
        sent += n as u64;
    }
}

/// A stored blob whose bytes no longer hash to its digest (rotted on
/// disk) is removed, so the store reports it missing and the next upload
/// brings it back; the error to end its stream with.
fn forget_corrupt(dir: &BlobDir, digest: &Digest) -> BlobError {
    tracing::warn!(%digest, "stored blob is corrupt: removed, it will be asked for again");
    match dir.remove(digest) {
        Ok(()) => BlobError::Corrupt(*digest),
        Err(e) => e.into(),
    }
}

/// Streams the stored blob `digest` of `dir` (larger than a block) to
/// `dst`, hashing it on the way; rotted bytes end it with
/// [`forget_corrupt`]'s error. Returns the bytes sent.
async fn send_stored<W: AsyncWrite + Unpin>(
    dir: &BlobDir,
    digest: &Digest,
    dst: &mut W,
) -> Result<u64, BlobError> {
    let mut file = tokio::fs::File::open(dir.path(digest)).await?;
    let mut buf = vec![0u8; BLOCK];
    let mut hasher = blake3::Hasher::new();
    let mut sent = 0u64;
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        dst.write_all(&buf[..n])
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?;
        sent += n as u64;
    }
    if Digest::from(hasher.finalize()) != *digest {
        return Err(forget_corrupt(dir, digest));
    }
    Ok(sent)
}

/// What a blob upload sends: a file on disk or bytes in memory.
pub enum BlobSource<'a> {
    File(&'a Path),
    Bytes(&'a [u8]),
}

/// Uploads one blob on a new stream of `conn`; returns once the receiver
/// verified and stored it.
pub async fn put(
    conn: &quinn::Connection,
    digest: Digest,
    len: u64,
    source: BlobSource<'_>,
) -> Result<(), BlobError> {
    let mut ch = Channel::new(
        conn.open_bi()
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?,
    );
    ch.send(&BlobRequest::Put { digest, len }).await?;
    match source {
        BlobSource::File(path) => {
            send_file(path, &mut ch.send).await?;
        }
        BlobSource::Bytes(bytes) => {
            ch.send
                .write_all(bytes)
                .await
                .map_err(|e| BlobError::Lost(e.to_string()))?;
        }
    }
    ch.send
        .finish()
        .map_err(|e| BlobError::Lost(e.to_string()))?;
    match ch.recv::<BlobReply>().await? {
        Some(BlobReply::Stored) => Ok(()),
        Some(BlobReply::Refused { reason }) => Err(BlobError::Refused { digest, reason }),
        Some(other) => Err(BlobError::Lost(format!("unexpected reply {other:?}"))),
        None => Err(BlobError::Lost(
            "stream closed before the receiver answered".into(),
        )),
    }
}

/// Uploads one blob whose bytes `read` produces (a chunk of a file, read
/// again for every try). When the receiver refuses the bytes (they do not
/// hash to `digest`: flipped in memory, on disk or in flight), they are read
/// and sent again, up to `tries` times in all. Returns the bytes sent,
/// retries included.
pub async fn put_retrying(
    conn: &quinn::Connection,
    digest: Digest,
    tries: u32,
    mut read: impl FnMut() -> std::io::Result<Vec<u8>>,
) -> Result<u64, BlobError> {
    let mut sent = 0u64;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let bytes = read()?;
        sent += bytes.len() as u64;
        match put(conn, digest, bytes.len() as u64, BlobSource::Bytes(&bytes)).await {
            Ok(()) => return Ok(sent),
            Err(BlobError::Refused { reason, .. }) if attempt < tries => {
                tracing::warn!(%digest, attempt, "blob refused, sending it again: {reason}");
            }
            Err(e) => return Err(e),
        }
    }
}

/// What [`answer`] did on one blob stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered {
    /// A put: `stored` bytes were new and verified (0 when the store already
    /// held the blob); `refused` when they did not match the digest.
    Put {
        digest: Digest,
        stored: u64,
        refused: bool,
    },
    /// A recipe was asked for.
    Recipe { digest: Digest },
    /// A get: `sent` bytes served (0 when not found), for `job`.
    Get {
        digest: Digest,
        job: Option<u64>,
        sent: u64,
    },
    /// A get of several blobs: `sent` bytes served in all, for `job`.
    GetMany { job: Option<u64>, sent: u64 },
    /// Where to fetch blobs: `located` bytes the peer may now fetch from
    /// the object store, for `job`.
    Locate { job: Option<u64>, located: u64 },
}

/// Where a store keeps what its folder lacks (the bucket behind the
/// coordinator's folder). Asked from the blocking pool.
pub trait Backing: Send + Sync {
    /// Copies `digest` into the folder if it is kept; whether the folder
    /// holds it now.
    fn fetch(&self, digest: &Digest) -> bool;
    /// The recipe of `file`, if one is kept.
    fn recipe(&self, file: &Digest) -> Option<Recipe>;
    /// A short-lived URL a peer fetches `digest` from itself, and its size.
    fn presign(&self, digest: &Digest) -> Option<(String, u64)>;
}

/// Which blobs a peer may read: asked before a `Get` or a `Recipe` is
/// answered (a refused one is answered `Refused`).
pub trait ReadGate {
    fn may_read(&self, digest: &Digest) -> bool;
    /// A recipe was served to the peer.
    fn recipe_served(&self, _recipe: &Recipe) {}
    /// Where blobs the folder lacks are kept, if anywhere.
    fn backing(&self) -> Option<std::sync::Arc<dyn Backing>> {
        None
    }
}

/// Every blob may be read.
pub struct Open;

impl ReadGate for Open {
    fn may_read(&self, _digest: &Digest) -> bool {
        true
    }
}

/// Serves one blob stream against `dir`: stores a `Put` after verifying it,
/// answers a `Get` with the blob's bytes. New bytes stored are added to
/// `stored` before the sender hears `Stored`, so a submit that follows the
/// upload counts them.
pub async fn answer(
    dir: &BlobDir,
    ch: &mut Channel,
    stored: &std::sync::atomic::AtomicU64,
) -> Result<Answered, BlobError> {
    answer_gated(dir, ch, stored, &Open).await
}

/// [`answer`], reading only what `gate` allows.
pub async fn answer_gated(
    dir: &BlobDir,
    ch: &mut Channel,
    stored: &std::sync::atomic::AtomicU64,
    gate: &(dyn ReadGate + Sync),
) -> Result<Answered, BlobError> {
    let lost = |e: quinn::ClosedStream| BlobError::Lost(e.to_string());
    let request = ch
        .recv::<BlobRequest>()
        .await?
        .ok_or_else(|| BlobError::Lost("empty blob stream".into()))?;
    // Answered in the encoding it was asked in (a version 18 peer's
    // request in bincode, a newer one's in an envelope).
    if let Some(codec) = ch.peer_codec() {
        ch.set_codec(codec);
    }
    let answered = match request {
        BlobRequest::Put { digest, len } => {
            let (reply, answered) = if dir.contains(&digest) {
                // Drain and discard: the store already holds these bytes.
                let mut rest = AsyncReadExt::take(&mut ch.recv, len);
                tokio::io::copy(&mut rest, &mut tokio::io::sink()).await?;
                let a = Answered::Put {
                    digest,
                    stored: 0,
                    refused: false,
                };
                (BlobReply::Stored, a)
            } else {
                match dir.receive(digest, len, &mut ch.recv).await {
                    Ok(()) => {
                        stored.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                        let a = Answered::Put {
                            digest,
                            stored: len,
                            refused: false,
                        };
                        (BlobReply::Stored, a)
                    }
                    Err(e) => {
                        tracing::warn!("upload refused: {e}");
                        let a = Answered::Put {
                            digest,
                            stored: 0,
                            refused: true,
                        };
                        let reply = BlobReply::Refused {
                            reason: e.to_string(),
                        };
                        (reply, a)
                    }
                }
            };
            ch.send(&reply).await?;
            ch.send.finish().map_err(lost)?;
            answered
        }
        BlobRequest::Recipe { digest } if !gate.may_read(&digest) => {
            let reason = format!("file {digest} is not needed by a task this peer holds");
            ch.send(&BlobReply::Refused { reason }).await?;
            ch.send.finish().map_err(lost)?;
            Answered::Recipe { digest }
        }
        BlobRequest::Get { digest, job } => {
            let sent = send_many(dir, ch, &[digest], gate).await?;
            ch.send.finish().map_err(lost)?;
            Answered::Get { digest, job, sent }
        }
        BlobRequest::GetMany { digests, job } => {
            let sent = if digests.len() > MAX_GET_MANY {
                let reason = format!(
                    "at most {MAX_GET_MANY} blobs a request, not {}",
                    digests.len()
                );
                ch.send(&BlobReply::Refused { reason }).await?;
                0
            } else {
                send_many(dir, ch, &digests, gate).await?
            };
            ch.send.finish().map_err(lost)?;
            Answered::GetMany { job, sent }
        }
        BlobRequest::Locate { digests, job } => {
            let located = locate_many(ch, &digests, gate).await?;
            ch.send.finish().map_err(lost)?;
            Answered::Locate { job, located }
        }
        BlobRequest::Recipe { digest } => {
            let kept = match (dir.recipe(&digest), gate.backing()) {
                (None, Some(backing)) => {
                    tokio::task::spawn_blocking(move || backing.recipe(&digest))
                        .await
                        .map_err(std::io::Error::other)?
                }
                (found, _) => found,
            };
            let reply = match kept {
                Some(r) => {
                    gate.recipe_served(&r);
                    BlobReply::Recipe(r)
                }
                None => BlobReply::NotFound,
            };
            ch.send(&reply).await?;
            ch.send.finish().map_err(lost)?;
            Answered::Recipe { digest }
        }
    };
    let _ = ch.send.stopped().await;
    Ok(answered)
}

/// Answers a [`BlobRequest::Locate`]: each blob's URL, up to the first one
/// `gate` refuses. Returns the bytes located.
async fn locate_many(
    ch: &mut Channel,
    digests: &[Digest],
    gate: &(dyn ReadGate + Sync),
) -> Result<u64, BlobError> {
    if digests.len() > MAX_GET_MANY {
        let reason = format!(
            "at most {MAX_GET_MANY} blobs a request, not {}",
            digests.len()
        );
        ch.send(&BlobReply::Refused { reason }).await?;
        return Ok(0);
    }
    let allowed = digests.iter().take_while(|d| gate.may_read(d)).count();
    let urls = match gate.backing() {
        Some(backing) => {
            let run = digests[..allowed].to_vec();
            tokio::task::spawn_blocking(move || run.iter().map(|d| backing.presign(d)).collect())
                .await
                .map_err(std::io::Error::other)?
        }
        None => vec![None; allowed],
    };
    let mut located = 0;
    for url in urls {
        match url {
            Some((url, len)) => {
                located += len;
                ch.send(&BlobReply::At { url, len }).await?;
            }
            None => ch.send(&BlobReply::NotFound).await?,
        }
    }
    if let Some(refused) = digests.get(allowed) {
        let reason = format!("blob {refused} is not needed by a task this peer holds");
        ch.send(&BlobReply::Refused { reason }).await?;
    }
    Ok(located)
}

/// Answers a `Get` (one digest) or a [`BlobRequest::GetMany`]: each blob
/// in order, `Found` and its bytes or `NotFound`, up to the first one
/// `gate` refuses. Runs of small blobs (chunks) are read and checked
/// together, up to [`READ_AHEAD`] bytes in one blocking-pool trip, rather
/// than a trip (and a thread hand-off) per chunk. Returns the bytes sent.
async fn send_many(
    dir: &BlobDir,
    ch: &mut Channel,
    digests: &[Digest],
    gate: &(dyn ReadGate + Sync),
) -> Result<u64, BlobError> {
    let mut sent = 0;
    let mut rest = digests;
    while !rest.is_empty() {
        let allowed = rest.iter().take_while(|d| gate.may_read(d)).count();
        if allowed == 0 {
            let reason = format!("blob {} is not needed by a task this peer holds", rest[0]);
            ch.send(&BlobReply::Refused { reason }).await?;
            break;
        }
        let (dir2, run, backing) = (dir.clone(), rest[..allowed].to_vec(), gate.backing());
        let read = tokio::task::spawn_blocking(move || read_run(&dir2, &run, backing.as_deref()))
            .await
            .map_err(std::io::Error::other)?;
        rest = &rest[read.len()..];
        for got in read {
            match got? {
                Stored::Missing => ch.send(&BlobReply::NotFound).await?,
                Stored::Small(bytes) => {
                    ch.send(&BlobReply::Found {
                        len: bytes.len() as u64,
                    })
                    .await?;
                    ch.send
                        .write_all(&bytes)
                        .await
                        .map_err(|e| BlobError::Lost(e.to_string()))?;
                    sent += bytes.len() as u64;
                }
                Stored::Corrupt(digest) => {
                    // The receiver must not take a clean end for good
                    // bytes (it would re-hash and refuse them anyway).
                    let _ = ch.send.reset(1u32.into());
                    return Err(forget_corrupt(dir, &digest));
                }
                Stored::Large(digest, len) => {
                    ch.send(&BlobReply::Found { len }).await?;
                    match send_stored(dir, &digest, &mut ch.send).await {
                        Ok(n) => sent += n,
                        Err(e) => {
                            if matches!(e, BlobError::Corrupt(_)) {
                                let _ = ch.send.reset(1u32.into());
                            }
                            return Err(e);
                        }
                    }
                }
            }
        }
    }
    Ok(sent)
}

/// Bytes of small blobs [`send_many`] reads in one blocking-pool trip.
const READ_AHEAD: u64 = 1 << 20;

/// What [`read_run`] found of one stored blob.
enum Stored {
    Missing,
    /// A blob of at most one block, read whole and checked.
    Small(Vec<u8>),
    /// Its bytes no longer hash to its digest.
    Corrupt(Digest),
    /// Larger than a block: streamed by [`send_stored`].
    Large(Digest, u64),
}

/// Reads the stored blobs `run` in order, until [`READ_AHEAD`] bytes or a
/// blob larger than a block (which ends the run unread); one the folder
/// lacks is copied in from `backing` first. Blocking.
fn read_run(
    dir: &BlobDir,
    run: &[Digest],
    backing: Option<&dyn Backing>,
) -> Vec<std::io::Result<Stored>> {
    let mut out = Vec::new();
    let mut bytes_read = 0;
    for digest in run {
        if bytes_read >= READ_AHEAD {
            break;
        }
        let size = (dir.size(digest)).or_else(|| {
            let fetched = backing.is_some_and(|b| b.fetch(digest));
            fetched.then(|| dir.size(digest)).flatten()
        });
        let got = match size {
            None => Ok(Stored::Missing),
            Some(len) if len > BLOCK as u64 => {
                out.push(Ok(Stored::Large(*digest, len)));
                break;
            }
            Some(_) => match std::fs::read(dir.path(digest)) {
                Ok(bytes) if Digest::of(&bytes) == *digest => {
                    bytes_read += bytes.len() as u64;
                    Ok(Stored::Small(bytes))
                }
                Ok(_) => Ok(Stored::Corrupt(*digest)),
                // Removed since it was listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Stored::Missing),
                Err(e) => Err(e),
            },
        };
        out.push(got);
    }
    out
}

/// A bare blob server: accepts connections on `endpoint` whose `Hello`
/// carries `secret` (either role) and answers their blob streams against
/// `dir`. For tests and benchmarks of the transport; the coordinator serves
/// blobs itself, with its job accounting.
pub async fn serve(endpoint: quinn::Endpoint, dir: BlobDir, secret: String) {
    use tessera_protocol::messages::{Hello, Welcome};
    while let Some(incoming) = endpoint.accept().await {
        let (dir, secret) = (dir.clone(), secret.clone());
        tokio::spawn(async move {
            let conn = incoming.await.ok()?;
            let mut control = Channel::new(conn.accept_bi().await.ok()?);
            let hello: Hello = control.recv_handshake().await.ok()??;
            if let Err(reason) = crate::check_hello(&hello, &secret, &secret) {
                control
                    .send_handshake(&Welcome::Refused { reason })
                    .await
                    .ok()?;
                return None;
            }
            crate::admit(&conn);
            let welcome = Welcome::Accepted {
                version: hello.version,
            };
            control.send_handshake(&welcome).await.ok()?;
            let stored = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            while let Ok(streams) = conn.accept_bi().await {
                let (dir, stored) = (dir.clone(), stored.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer(&dir, &mut Channel::new(streams), &stored).await {
                        tracing::debug!("blob stream: {e}");
                    }
                });
            }
            Some(())
        });
    }
}

/// The chunks of the large file `digest`, if the sender stored it from
/// chunks.
pub async fn get_recipe(
    conn: &quinn::Connection,
    digest: Digest,
) -> Result<Option<Recipe>, BlobError> {
    let mut ch = Channel::new(
        conn.open_bi()
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?,
    );
    ch.send(&BlobRequest::Recipe { digest }).await?;
    ch.send
        .finish()
        .map_err(|e| BlobError::Lost(e.to_string()))?;
    match ch.recv::<BlobReply>().await? {
        Some(BlobReply::Recipe(r)) if r.digest == digest => {
            r.check().map_err(|reason| BlobError::Recipe {
                file: digest,
                reason,
            })?;
            Ok(Some(r))
        }
        Some(BlobReply::NotFound) => Ok(None),
        Some(BlobReply::Refused { reason }) => Err(BlobError::Refused { digest, reason }),
        Some(other) => Err(BlobError::Lost(format!("unexpected reply {other:?}"))),
        None => Err(BlobError::Lost(
            "stream closed before the sender answered".into(),
        )),
    }
}

/// The blobs of one `GetMany` request, received into memory in the order
/// asked for (see [`get_many_in_memory`]).
pub struct ManyInMemory {
    ch: Channel,
    digests: std::vec::IntoIter<Digest>,
    max_len: u64,
}

/// Asks for `digests` (at most [`MAX_GET_MANY`]) on one stream of `conn`,
/// to be received into memory with [`ManyInMemory::next`]: for chunks a
/// caller places itself (a worker writes them straight into the file they
/// make up), with no file per blob. A blob the sender announces as longer
/// than `max_len` is refused before a byte of it is read.
pub async fn get_many_in_memory(
    conn: &quinn::Connection,
    digests: &[Digest],
    job: Option<u64>,
    max_len: u64,
) -> Result<ManyInMemory, BlobError> {
    if digests.len() > MAX_GET_MANY {
        return Err(BlobError::Lost(format!(
            "at most {MAX_GET_MANY} blobs a request"
        )));
    }
    let mut ch = Channel::new(
        conn.open_bi()
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?,
    );
    let digests = digests.to_vec();
    let request = BlobRequest::GetMany {
        digests: digests.clone(),
        job,
    };
    ch.send(&request).await?;
    ch.send
        .finish()
        .map_err(|e| BlobError::Lost(e.to_string()))?;
    Ok(ManyInMemory {
        ch,
        digests: digests.into_iter(),
        max_len,
    })
}

impl ManyInMemory {
    /// The next blob asked for and its bytes, verified against its digest;
    /// None once every one has come. A blob the sender lacks or refuses is
    /// an error (the ones before it were handed out).
    pub async fn next(&mut self) -> Result<Option<(Digest, Vec<u8>)>, BlobError> {
        let Some(digest) = self.digests.next() else {
            return Ok(None);
        };
        let len = match self.ch.recv::<BlobReply>().await? {
            Some(BlobReply::Found { len }) => len,
            Some(BlobReply::NotFound) => return Err(BlobError::NotFound(digest)),
            Some(BlobReply::Refused { reason }) => {
                return Err(BlobError::Refused { digest, reason })
            }
            Some(other) => return Err(BlobError::Lost(format!("unexpected reply {other:?}"))),
            None => {
                return Err(BlobError::Lost(
                    "stream closed before the sender answered".into(),
                ))
            }
        };
        if len > self.max_len {
            return Err(BlobError::TooLarge { digest, len });
        }
        let mut bytes = vec![0u8; len as usize];
        match self.ch.recv.read_exact(&mut bytes).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::FinishedEarly(got)) => {
                return Err(BlobError::Short {
                    digest,
                    expected: len,
                    got: got as u64,
                })
            }
            Err(quinn::ReadExactError::ReadError(e)) => return Err(BlobError::Lost(e.to_string())),
        }
        let actual = Digest::of(&bytes);
        if actual != digest {
            return Err(BlobError::Mismatch {
                expected: digest,
                actual,
            });
        }
        Ok(Some((digest, bytes)))
    }
}

/// Asks where to fetch `digests` from the farm's object store: for each, in
/// order, a URL and its size or `None` (not kept there); an error when the
/// coordinator refused one.
pub async fn locate(
    conn: &quinn::Connection,
    digests: &[Digest],
    job: Option<u64>,
) -> Result<Vec<Option<(String, u64)>>, BlobError> {
    let mut ch = Channel::new(
        conn.open_bi()
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?,
    );
    let request = BlobRequest::Locate {
        digests: digests.to_vec(),
        job,
    };
    ch.send(&request).await?;
    ch.send
        .finish()
        .map_err(|e| BlobError::Lost(e.to_string()))?;
    let mut out = Vec::with_capacity(digests.len());
    for digest in digests {
        match ch.recv::<BlobReply>().await? {
            Some(BlobReply::At { url, len }) => out.push(Some((url, len))),
            Some(BlobReply::NotFound) => out.push(None),
            Some(BlobReply::Refused { reason }) => {
                return Err(BlobError::Refused {
                    digest: *digest,
                    reason,
                })
            }
            Some(other) => return Err(BlobError::Lost(format!("unexpected reply {other:?}"))),
            None => return Err(BlobError::Lost("stream closed before every answer".into())),
        }
    }
    Ok(out)
}

/// Downloads one blob from `conn` into `dir`, verifying it. Returns its size.
/// A worker names the `job` it fetches for.
pub async fn get(
    conn: &quinn::Connection,
    digest: Digest,
    job: Option<u64>,
    dir: &BlobDir,
) -> Result<u64, BlobError> {
    let mut ch = Channel::new(
        conn.open_bi()
            .await
            .map_err(|e| BlobError::Lost(e.to_string()))?,
    );
    ch.send(&BlobRequest::Get { digest, job }).await?;
    ch.send
        .finish()
        .map_err(|e| BlobError::Lost(e.to_string()))?;
    match ch.recv::<BlobReply>().await? {
        Some(BlobReply::Found { len }) => {
            dir.receive(digest, len, &mut ch.recv).await?;
            Ok(len)
        }
        Some(BlobReply::NotFound) => Err(BlobError::NotFound(digest)),
        Some(BlobReply::Refused { reason }) => Err(BlobError::Refused { digest, reason }),
        Some(other) => Err(BlobError::Lost(format!("unexpected reply {other:?}"))),
        None => Err(BlobError::Lost(
            "stream closed before the sender answered".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tessera-blobq-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A real QUIC server on 127.0.0.1 answering blob streams against `dir`,
    /// and a client connection to it.
    async fn loopback(dir: BlobDir) -> crate::Session {
        use crate as transport;
        use crate::{Identity, Timing};
        use tessera_protocol::messages::Role;
        use tessera_protocol::ticket::Ticket;
        let identity = Identity::generate().unwrap();
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
            secret: "s".into(),
        };
        tokio::spawn(serve(endpoint, dir, "s".into()));
        transport::connect(&ticket, "test", Timing::default())
            .await
            .unwrap()
    }

    #[test]
    fn a_chunk_flipped_on_the_way_is_refused_and_sent_again() {
        let rt = runtime();
        let dir = BlobDir::open(temp_dir("retry")).unwrap();
        let chunk: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let digest = Digest::of(&chunk);
        rt.block_on(async {
            let session = loopback(dir.clone()).await;
            let conn = &session.connection;
            // The first read comes back with one byte flipped.
            let mut reads = 0;
            let sent = put_retrying(conn, digest, 3, || {
                reads += 1;
                let mut bytes = chunk.clone();
                if reads == 1 {
                    bytes[4321] ^= 0x10;
                }
                Ok(bytes)
            })
            .await
            .unwrap();
            assert_eq!(reads, 2);
            assert_eq!(sent, 2 * chunk.len() as u64);
            assert_eq!(dir.read(&digest).unwrap(), chunk);

            // Bytes that never match: refused every time, nothing stored.
            let other = Digest::of(b"other");
            let err = put_retrying(conn, other, 3, || Ok(chunk.clone()))
                .await
                .unwrap_err();
            assert!(
                err.to_string().contains("does not match its digest"),
                "{err}"
            );
            assert!(!dir.contains(&other));
        });
        std::fs::remove_dir_all(dir.root()).unwrap();
    }

    /// Refuses one digest.
    struct AllBut(Digest);

    impl ReadGate for AllBut {
        fn may_read(&self, digest: &Digest) -> bool {
            *digest != self.0
        }
    }

    #[test]
    fn many_blobs_come_in_order_on_one_stream_up_to_one_missing_or_refused() {
        let rt = runtime();
        let src = BlobDir::open(temp_dir("many-src")).unwrap();
        let blobs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 20_000 + usize::from(i)]).collect();
        let digests: Vec<Digest> = blobs.iter().map(|b| Digest::of(b)).collect();
        for b in &blobs {
            src.put_bytes(b).unwrap();
        }
        let refused = digests[3];
        let missing = Digest::of(b"not stored");
        rt.block_on(async {
            let session = loopback(src.clone()).await;
            // A second server, gated, for the refusal.
            let identity = crate::Identity::generate().unwrap();
            let endpoint = crate::server_endpoint(
                "127.0.0.1:0".parse().unwrap(),
                &identity,
                crate::Timing::default(),
            )
            .unwrap();
            let addr = endpoint.local_addr().unwrap();
            let served = src.clone();
            tokio::spawn(async move {
                use tessera_protocol::messages::{Hello, Welcome, PROTOCOL_VERSION};
                let conn = endpoint.accept().await.unwrap().await.unwrap();
                let mut control = crate::Channel::new(conn.accept_bi().await.unwrap());
                let _: Option<Hello> = control.recv_handshake().await.unwrap();
                crate::admit(&conn);
                let welcome = Welcome::Accepted {
                    version: PROTOCOL_VERSION,
                };
                control.send_handshake(&welcome).await.unwrap();
                let stored = std::sync::atomic::AtomicU64::new(0);
                while let Ok(pair) = conn.accept_bi().await {
                    let mut ch = crate::Channel::new(pair);
                    let _ = answer_gated(&served, &mut ch, &stored, &AllBut(refused)).await;
                }
            });
            let conn = &session.connection;
            // Everything a request hands out, and how it ended.
            async fn fetch(
                conn: &quinn::Connection,
                digests: &[Digest],
                max_len: u64,
            ) -> (Vec<(Digest, Vec<u8>)>, Result<(), BlobError>) {
                let mut got = Vec::new();
                let mut many = match get_many_in_memory(conn, digests, Some(1), max_len).await {
                    Ok(many) => many,
                    Err(e) => return (got, Err(e)),
                };
                loop {
                    match many.next().await {
                        Ok(Some(blob)) => got.push(blob),
                        Ok(None) => return (got, Ok(())),
                        Err(e) => return (got, Err(e)),
                    }
                }
            }
            let (got, end) = fetch(conn, &digests[..3], 1 << 20).await;
            end.unwrap();
            let want: Vec<(Digest, Vec<u8>)> =
                (0..3).map(|i| (digests[i], blobs[i].clone())).collect();
            assert_eq!(got, want, "in order, each whole");
            let (got, end) = fetch(conn, &[digests[4], missing], 1 << 20).await;
            let err = end.unwrap_err();
            assert!(
                matches!(err, BlobError::NotFound(d) if d == missing),
                "{err}"
            );
            assert_eq!(got.len(), 1, "the one before the missing one comes");
            let (got, end) = fetch(conn, &digests[..2], 20_000).await;
            let err = end.unwrap_err();
            assert!(
                matches!(err, BlobError::TooLarge { digest, len: 20_001 } if digest == digests[1]),
                "{err}"
            );
            assert_eq!(
                got.len(),
                1,
                "refused before a byte of the long one is read"
            );
            let too_many = vec![digests[0]; tessera_protocol::messages::MAX_GET_MANY + 1];
            assert!(fetch(conn, &too_many, 1 << 20).await.1.is_err());

            let ticket = tessera_protocol::ticket::Ticket {
                role: tessera_protocol::messages::Role::Client,
                addr,
                also: Vec::new(),
                fingerprint: identity.fingerprint(),
                secret: "s".into(),
            };
            let gated = crate::connect(&ticket, "test", crate::Timing::default())
                .await
                .unwrap();
            let (got, end) = fetch(&gated.connection, &digests[2..5], 1 << 20).await;
            let err = end.unwrap_err();
            assert!(
                matches!(err, BlobError::Refused { digest, .. } if digest == refused),
                "{err}"
            );
            let got: Vec<Digest> = got.into_iter().map(|(d, _)| d).collect();
            assert_eq!(got, vec![digests[2]], "served up to the refused one");
        });
        std::fs::remove_dir_all(src.root()).unwrap();
    }

    #[test]
    fn a_blob_over_loopback_travels_in_datagrams_larger_than_ethernet_allows() {
        let rt = runtime();
        let dir = BlobDir::open(temp_dir("mtu")).unwrap();
        let data: Vec<u8> = (0..32_000_000u32).map(|i| (i ^ (i >> 11)) as u8).collect();
        let digest = Digest::of(&data);
        rt.block_on(async {
            let session = loopback(dir.clone()).await;
            put(
                &session.connection,
                digest,
                data.len() as u64,
                BlobSource::Bytes(&data),
            )
            .await
            .unwrap();
            // Path MTU discovery found that loopback carries more than the
            // 1452-byte payloads quinn stops at by default.
            let path = session.connection.stats().path;
            assert!(
                path.current_mtu > 1472,
                "MTU {} after {} packets",
                path.current_mtu,
                path.sent_packets
            );
            assert!(
                path.sent_packets < data.len() as u64 / 2000,
                "{} packets for {} bytes",
                path.sent_packets,
                data.len()
            );
        });
        assert_eq!(dir.read(&digest).unwrap(), data);
        std::fs::remove_dir_all(dir.root()).unwrap();
    }
}
