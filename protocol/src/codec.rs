//! Framing and encodings: this is the only place that knows how a message
//! becomes bytes. Every frame is a `u32` big-endian prefix and a payload;
//! the prefix says which of two encodings the payload is in:
//!
//! - **Version 18 ([`Codec::Legacy`])**: the prefix is the payload's length
//!   and the payload bincode (serde, standard configuration). Strict: both
//!   sides must have the same types. `Hello` and `Welcome` travel this way
//!   forever, so any release can read any peer's `Hello`; the blob store
//!   keeps its recipes on disk this way too.
//! - **Version 19 on ([`Codec::Envelope`])**: the prefix's top bit
//!   ([`ENVELOPE`]) is set, its other bits are the length; the payload is a
//!   `u16` big-endian version (the sender's) and MessagePack with named
//!   fields. A field the reader does not know is skipped, a field it knows
//!   that the writer left out takes its `#[serde(default)]`: a coordinator
//!   at version N reads and is read by peers at N−1.
//!
//! A receiver reads either (the prefix says which); a sender writes the one
//! its connection negotiated in the handshake. A version 18 peer never gets
//! an envelope; if it did, its reader would refuse the prefix as too long.
//!
//! Every size is bounded before it is used: a length prefix is checked
//! against its cap *before* anything is allocated, bincode decodes with the
//! same limit, and MessagePack is read from the frame in memory (a string or
//! list is borrowed from or checked against what is left of the frame, and a
//! list's preallocation is capped by serde), nested at most
//! [`MAX_DEPTH`] deep. The async reader and writer over QUIC streams are
//! `tessera_transport::framing`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::messages::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// The largest control frame either side accepts (manifests of large scenes
/// fit; a hostile length prefix does not).
pub const MAX_FRAME: u32 = 16 * 1024 * 1024;

/// The largest frame read before the peer has proved a secret: a `Hello`
/// (version, role, a 64-character secret and a name) fits many times over,
/// so an unauthenticated peer can make the coordinator hold at most this
/// much of what it sends.
pub const MAX_HELLO_FRAME: u32 = 4 * 1024;

/// The prefix's bit that marks an envelope (version 19 on). No legacy length
/// has it: they are at most [`MAX_FRAME`].
pub const ENVELOPE: u32 = 1 << 31;

/// The deepest a MessagePack payload may nest (the deepest message nests
/// about 8 levels).
pub const MAX_DEPTH: usize = 32;

/// The first version whose messages travel in envelopes.
pub const FIRST_ENVELOPE_VERSION: u32 = 19;

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

/// How a frame's payload is encoded; chosen per connection from the version
/// its handshake agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Version 18: bincode, strict.
    Legacy,
    /// Version 19 on: a versioned envelope of MessagePack, named fields.
    Envelope,
}

impl Codec {
    /// What this release writes to a peer of its own version.
    pub const CURRENT: Codec = Codec::Envelope;

    /// The codec to speak with a peer at `version`, if this release serves
    /// it ([`MIN_PROTOCOL_VERSION`] ..= [`PROTOCOL_VERSION`]).
    pub fn for_version(version: u32) -> Option<Codec> {
        if !crate::messages::serves(version) {
            return None;
        }
        Some(if version < FIRST_ENVELOPE_VERSION {
            Codec::Legacy
        } else {
            Codec::Envelope
        })
    }
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME as usize }>()
}

/// Encodes `msg` as one version 18 frame (length prefix plus bincode): the
/// layout of `Hello`, `Welcome` and of what the store keeps on disk.
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, CodecError> {
    encode_as(Codec::Legacy, msg)
}

/// Encodes `msg` as one frame in `codec`.
pub fn encode_as<T: Serialize>(codec: Codec, msg: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; 4];
    let tag = match codec {
        Codec::Legacy => {
            bincode::serde::encode_into_std_write(msg, &mut out, config())
                .map_err(|e| CodecError::Malformed(e.to_string()))?;
            0
        }
        Codec::Envelope => {
            out.extend_from_slice(&(PROTOCOL_VERSION as u16).to_be_bytes());
            rmp_serde::encode::write_named(&mut out, msg)
                .map_err(|e| CodecError::Malformed(e.to_string()))?;
            ENVELOPE
        }
    };
    let len = out.len() - 4;
    if len > MAX_FRAME as usize {
        return Err(CodecError::TooLarge {
            len: len as u64,
            max: MAX_FRAME,
        });
    }
    out[..4].copy_from_slice(&(len as u32 | tag).to_be_bytes());
    Ok(out)
}

/// Checks a version 18 length prefix against the cap; called before any
/// allocation.
pub fn check_len(prefix: [u8; 4]) -> Result<usize, CodecError> {
    check_len_within(prefix, MAX_FRAME)
}

/// Checks a version 18 length prefix against `max` (at most [`MAX_FRAME`]).
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

/// Reads a prefix of either encoding: the payload's codec and length,
/// checked against `max` (at most [`MAX_FRAME`]) before any allocation.
pub fn check_prefix(prefix: [u8; 4], max: u32) -> Result<(Codec, usize), CodecError> {
    let word = u32::from_be_bytes(prefix);
    let codec = if word & ENVELOPE != 0 {
        Codec::Envelope
    } else {
        Codec::Legacy
    };
    let len = check_len_within((word & !ENVELOPE).to_be_bytes(), max)?;
    Ok((codec, len))
}

/// Decodes one version 18 payload (without its length prefix).
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    decode_payload_as(Codec::Legacy, payload)
}

/// Decodes one payload (without its prefix) in `codec`.
pub fn decode_payload_as<T: DeserializeOwned>(
    codec: Codec,
    payload: &[u8],
) -> Result<T, CodecError> {
    let trailing = |n: usize| CodecError::Malformed(format!("{n} trailing bytes after message"));
    match codec {
        Codec::Legacy => {
            let (msg, used) = bincode::serde::decode_from_slice(payload, config())
                .map_err(|e| CodecError::Malformed(e.to_string()))?;
            if used != payload.len() {
                return Err(trailing(payload.len() - used));
            }
            Ok(msg)
        }
        Codec::Envelope => {
            let (version, body) = payload
                .split_first_chunk::<2>()
                .ok_or_else(|| CodecError::Malformed("envelope without its version".into()))?;
            let version = u32::from(u16::from_be_bytes(*version));
            if version < FIRST_ENVELOPE_VERSION {
                return Err(CodecError::Malformed(format!(
                    "an envelope from version {version}: envelopes begin at version \
                     {FIRST_ENVELOPE_VERSION}"
                )));
            }
            // Read from the frame in memory: a length inside is never
            // trusted past what is left of it.
            let mut rest: &[u8] = body;
            let mut de = rmp_serde::Deserializer::new(&mut rest);
            de.set_max_depth(MAX_DEPTH);
            let msg = T::deserialize(&mut de)
                .map_err(|e| CodecError::Malformed(format!("version {version} envelope: {e}")))?;
            match rest.len() {
                0 => Ok(msg),
                n => Err(trailing(n)),
            }
        }
    }
}

/// Decodes one complete version 18 frame held in memory (length prefix
/// included).
pub fn decode_frame<T: DeserializeOwned>(frame: &[u8]) -> Result<T, CodecError> {
    decode_frame_as(Codec::Legacy, frame)
}

/// Decodes one complete frame held in memory, which must be in `codec`.
pub fn decode_frame_as<T: DeserializeOwned>(codec: Codec, frame: &[u8]) -> Result<T, CodecError> {
    let (got, msg) = decode_any_frame(frame)?;
    if got != codec {
        return Err(CodecError::Malformed(format!(
            "a {got:?} frame where a {codec:?} one was expected"
        )));
    }
    Ok(msg)
}

/// Decodes one complete frame held in memory in whichever encoding its
/// prefix names.
pub fn decode_any_frame<T: DeserializeOwned>(frame: &[u8]) -> Result<(Codec, T), CodecError> {
    let prefix: [u8; 4] = frame
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| CodecError::Malformed("frame shorter than its length prefix".into()))?;
    let (codec, len) = check_prefix(prefix, MAX_FRAME)?;
    let payload = &frame[4..];
    if payload.len() != len {
        return Err(CodecError::Malformed(format!(
            "length prefix says {len} bytes, frame has {}",
            payload.len()
        )));
    }
    decode_payload_as(codec, payload).map(|m| (codec, m))
}

/// Why a peer's version is refused, naming both sides' versions; `None`
/// when this release serves it.
pub fn version_refusal(peer: u32) -> Option<String> {
    if crate::messages::serves(peer) {
        return None;
    }
    let advice = if peer < MIN_PROTOCOL_VERSION {
        "upgrade the peer"
    } else {
        "upgrade the coordinator first"
    };
    Some(format!(
        "protocol version mismatch: this coordinator speaks versions {PROTOCOL_VERSION} and \
         {MIN_PROTOCOL_VERSION}, the peer speaks version {peer}: {advice}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ClientRequest, Hello, Role};
    use crate::Digest;

    #[test]
    fn round_trip() {
        let msg = ClientRequest::MissingBlobs(vec![Digest::of(b"a"), Digest::of(b"b")]);
        for codec in [Codec::Legacy, Codec::Envelope] {
            let frame = encode_as(codec, &msg).unwrap();
            let (got, back): (_, ClientRequest) = decode_any_frame(&frame).unwrap();
            assert_eq!(got, codec);
            assert_eq!(format!("{back:?}"), format!("{msg:?}"));
        }
    }

    /// What rolling upgrades rest on: a reader skips the fields it does not
    /// know and defaults the ones the writer did not send.
    #[test]
    fn an_envelope_skips_unknown_fields_and_defaults_missing_ones() {
        #[derive(serde::Serialize)]
        struct Newer {
            job: u64,
            added_in_a_later_version: Vec<String>,
            state: &'static str,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Older {
            job: u64,
            state: String,
            #[serde(default)]
            unknown_to_the_writer: Option<u32>,
        }
        let frame = encode_as(
            Codec::Envelope,
            &Newer {
                job: 7,
                added_in_a_later_version: vec!["x".into()],
                state: "done",
            },
        )
        .unwrap();
        let old: Older = decode_frame_as(Codec::Envelope, &frame).unwrap();
        assert_eq!(
            old,
            Older {
                job: 7,
                state: "done".into(),
                unknown_to_the_writer: None
            }
        );
    }

    #[test]
    fn an_envelope_is_tagged_versioned_and_bounded() {
        let frame = encode_as(Codec::Envelope, &Role::Worker).unwrap();
        assert_eq!(frame[0] & 0x80, 0x80, "the prefix's top bit marks it");
        assert_eq!(
            u16::from_be_bytes([frame[4], frame[5]]) as u32,
            PROTOCOL_VERSION
        );
        // A version 18 reader refuses it from the prefix.
        assert!(matches!(
            check_len(frame[..4].try_into().unwrap()),
            Err(CodecError::TooLarge { .. })
        ));
        // An envelope from before envelopes, trailing bytes, a string that
        // claims more than the frame holds, and nesting past the limit.
        let mut old = frame.clone();
        old[4..6].copy_from_slice(&18u16.to_be_bytes());
        assert!(decode_frame_as::<Role>(Codec::Envelope, &old).is_err());
        let mut long = frame[4..].to_vec();
        long.push(0);
        assert!(decode_payload_as::<Role>(Codec::Envelope, &long).is_err());
        let mut liar = 19u16.to_be_bytes().to_vec();
        liar.extend_from_slice(&[0xdb, 0xff, 0xff, 0xff, 0xff, b'a']);
        assert!(decode_payload_as::<String>(Codec::Envelope, &liar).is_err());
        let mut deep = 19u16.to_be_bytes().to_vec();
        deep.extend(std::iter::repeat_n(0x91u8, 10_000));
        deep.push(0xc0);
        assert!(decode_payload_as::<serde::de::IgnoredAny>(Codec::Envelope, &deep).is_err());
        // A list that claims 4 billion entries allocates nothing much.
        let mut many = 19u16.to_be_bytes().to_vec();
        many.extend_from_slice(&[0xdd, 0xff, 0xff, 0xff, 0xff, 1]);
        assert!(decode_payload_as::<Vec<u64>>(Codec::Envelope, &many).is_err());
    }

    #[test]
    fn versions_one_behind_are_served_and_older_ones_refused_by_name() {
        assert_eq!(PROTOCOL_VERSION, 20);
        assert_eq!(Codec::for_version(20), Some(Codec::Envelope));
        assert_eq!(Codec::for_version(19), Some(Codec::Envelope));
        assert_eq!(
            Codec::for_version(18),
            None,
            "bincode peers are no longer served"
        );
        assert_eq!(version_refusal(20), None);
        assert_eq!(version_refusal(19), None);
        let r = version_refusal(18).unwrap();
        assert!(
            r.contains("20 and 19") && r.contains("18") && r.contains("upgrade the peer"),
            "{r}"
        );
        let r = version_refusal(21).unwrap();
        assert!(r.contains("21") && r.contains("coordinator first"), "{r}");
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
