//! Framing: every message on a stream is a `u32` big-endian length followed by
//! that many bytes of bincode. This is the only place that knows the encoding,
//! so it could be swapped. Lengths are checked against a hard cap *before*
//! anything is allocated, and bincode decodes with the same limit.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest control frame either side accepts (manifests of large scenes
/// fit; a hostile length prefix does not).
pub const MAX_FRAME: u32 = 16 * 1024 * 1024;

/// The largest frame read before the peer has proved a secret: a `Hello`
/// (version, role, a 64-character secret and a name) fits many times over,
/// so an unauthenticated peer can make the coordinator hold at most this
/// much of what it sends.
pub const MAX_HELLO_FRAME: u32 = 4 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u32 },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("stream closed")]
    Closed,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME as usize }>()
}

/// Encodes `msg` as one frame: length prefix plus payload.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(msg, &mut out, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    let len = out.len() - 4;
    if len > MAX_FRAME as usize {
        return Err(CodecError::TooLarge {
            len: len as u64,
            max: MAX_FRAME,
        });
    }
    out[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(out)
}

/// Checks a length prefix against the cap; called before any allocation.
pub fn check_len(prefix: [u8; 4]) -> Result<usize, CodecError> {
    check_len_within(prefix, MAX_FRAME)
}

/// Checks a length prefix against `max` (at most [`MAX_FRAME`]).
fn check_len_within(prefix: [u8; 4], max: u32) -> Result<usize, CodecError> {
    let len = u32::from_be_bytes(prefix);
    let max = max.min(MAX_FRAME);
    if len > max {
        return Err(CodecError::TooLarge {
            len: u64::from(len),
            max,
        });
    }
    Ok(len as usize)
}

/// Decodes one payload (without its length prefix).
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    let (msg, used) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(CodecError::Malformed(format!(
            "{} trailing bytes after message",
            payload.len() - used
        )));
    }
    Ok(msg)
}

/// Decodes one complete frame held in memory (length prefix included).
pub fn decode_frame<T: DeserializeOwned>(frame: &[u8]) -> Result<T, CodecError> {
    let prefix: [u8; 4] = frame
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| CodecError::Malformed("frame shorter than its length prefix".into()))?;
    let len = check_len(prefix)?;
    let payload = &frame[4..];
    if payload.len() != len {
        return Err(CodecError::Malformed(format!(
            "length prefix says {len} bytes, frame has {}",
            payload.len()
        )));
    }
    decode_payload(payload)
}

/// Reads one frame from `r`. `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<T>, CodecError> {
    read_frame_within(r, MAX_FRAME).await
}

/// Reads one frame of at most `max` bytes from `r` (the `Hello` is read
/// with [`MAX_HELLO_FRAME`]): a longer prefix is refused before anything
/// past it is read or allocated.
pub async fn read_frame_within<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<T>, CodecError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = r.read(&mut prefix[got..]).await?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(CodecError::Closed)
            };
        }
        got += n;
    }
    let len = check_len_within(prefix, max)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CodecError::Closed
        } else {
            CodecError::Io(e)
        }
    })?;
    decode_payload(&payload).map(Some)
}

/// Writes one frame to `w`.
pub async fn write_frame<T: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &T,
) -> Result<(), CodecError> {
    let frame = encode(msg)?;
    w.write_all(&frame).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ClientRequest, Hello, Role};
    use crate::Digest;

    #[test]
    fn round_trip() {
        let msg = ClientRequest::MissingBlobs(vec![Digest::of(b"a"), Digest::of(b"b")]);
        let frame = encode(&msg).unwrap();
        let back: ClientRequest = decode_frame(&frame).unwrap();
        assert_eq!(format!("{back:?}"), format!("{msg:?}"));
    }

    #[test]
    fn four_gib_length_is_refused_before_allocating() {
        // A frame that claims 4 GiB - 1 bytes: refused from the prefix alone.
        let prefix = u32::MAX.to_be_bytes();
        match check_len(prefix) {
            Err(CodecError::TooLarge { len, max }) => {
                assert_eq!(len, u64::from(u32::MAX));
                assert_eq!(max, MAX_FRAME);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        // The async reader refuses it too, reading only the 4 prefix bytes.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut input: &[u8] = &[0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        let err = rt.block_on(read_frame::<Hello, _>(&mut input)).unwrap_err();
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
        assert_eq!(input, &[1, 2, 3], "nothing past the prefix was consumed");
    }

    #[test]
    fn a_hello_sized_read_refuses_a_full_size_frame_from_its_prefix() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // A 16 MiB frame is within MAX_FRAME but not within MAX_HELLO_FRAME.
        let mut input: Vec<u8> = MAX_FRAME.to_be_bytes().to_vec();
        input.extend_from_slice(&[7; 16]);
        let mut reader: &[u8] = &input;
        let err = rt
            .block_on(read_frame_within::<Hello, _>(&mut reader, MAX_HELLO_FRAME))
            .unwrap_err();
        match err {
            CodecError::TooLarge { len, max } => {
                assert_eq!((len, max), (u64::from(MAX_FRAME), MAX_HELLO_FRAME))
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert_eq!(reader.len(), 16, "nothing past the prefix was consumed");
        // A real Hello fits.
        let hello = Hello {
            version: 1,
            role: Role::Worker,
            secret: "ab".repeat(32),
            name: "w".repeat(255),
        };
        let frame = encode(&hello).unwrap();
        let mut reader: &[u8] = &frame;
        let back = rt
            .block_on(read_frame_within::<Hello, _>(&mut reader, MAX_HELLO_FRAME))
            .unwrap()
            .unwrap();
        assert_eq!(back.secret, hello.secret);
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors() {
        let hello = Hello {
            version: 1,
            role: Role::Client,
            secret: "s".into(),
            name: "n".into(),
        };
        let frame = encode(&hello).unwrap();
        assert!(decode_frame::<Hello>(&frame[..frame.len() - 1]).is_err());
        let garbage = [0u8, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(
            decode_frame::<Hello>(&garbage),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn clean_eof_between_frames_is_none() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut input: &[u8] = &[];
        assert!(rt
            .block_on(read_frame::<Hello, _>(&mut input))
            .unwrap()
            .is_none());
        let mut cut: &[u8] = &[0, 0];
        assert!(matches!(
            rt.block_on(read_frame::<Hello, _>(&mut cut)),
            Err(CodecError::Closed)
        ));
    }
}
