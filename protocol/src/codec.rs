//! Framing: every message on a stream is a `u32` big-endian length followed by
//! that many bytes of bincode. This is the only place that knows the encoding,
//! so it could be swapped; the async reader and writer over QUIC streams are
//! `tessera_transport::framing`. Lengths are checked against a hard cap *before*
//! anything is allocated, and bincode decodes with the same limit.

use serde::de::DeserializeOwned;
use serde::Serialize;

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
pub fn check_len_within(prefix: [u8; 4], max: u32) -> Result<usize, CodecError> {
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
}
