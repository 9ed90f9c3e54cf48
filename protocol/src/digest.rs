//! `Digest`: the blake3 hash that names every blob Tessera stores or sends.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A blake3 content hash. Displayed and parsed as 64 lowercase hex digits.
/// In JSON (any human-readable format) it is that hex string, and an array
/// of 32 numbers is read too (job specs stored before); on the wire
/// (bincode) it is its 32 bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

/// The derived shape, for formats that are not human-readable.
#[derive(Serialize, Deserialize)]
#[serde(rename = "Digest")]
struct Raw([u8; 32]);

impl Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            Raw(self.0).serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        if !d.is_human_readable() {
            return Raw::deserialize(d).map(|r| Digest(r.0));
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Hex(String),
            Bytes([u8; 32]),
        }
        match Either::deserialize(d)? {
            Either::Hex(h) => h.parse().map_err(serde::de::Error::custom),
            Either::Bytes(b) => Ok(Digest(b)),
        }
    }
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    /// The digest of everything `reader` yields, read in large blocks.
    pub fn of_reader(mut reader: impl std::io::Read) -> std::io::Result<(Digest, u64)> {
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut len = 0u64;
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        Ok((Digest(*hasher.finalize().as_bytes()), len))
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        s
    }
}

impl From<blake3::Hash> for Digest {
    fn from(h: blake3::Hash) -> Self {
        Digest(*h.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.to_hex()[..12])
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a digest: expected 64 hex digits")]
pub struct ParseDigestError(String);

impl FromStr for Digest {
    type Err = ParseDigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDigestError(s.chars().take(80).collect());
        if s.len() != 64 {
            return Err(err());
        }
        let mut out = [0u8; 32];
        for (i, pair) in s.as_bytes().chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16).ok_or_else(err)?;
            let lo = (pair[1] as char).to_digit(16).ok_or_else(err)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Ok(Digest(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_hex_and_old_arrays_still_read() {
        let d = Digest::of(b"x");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{}\"", d.to_hex()));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        let old = serde_json::to_string(&d.0).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&old).unwrap(), d);
        let wire = crate::codec::encode(&d).unwrap();
        assert_eq!(wire.len(), 4 + 32, "the wire shape is unchanged");
        assert_eq!(crate::codec::decode_frame::<Digest>(&wire).unwrap(), d);
    }

    #[test]
    fn hex_round_trip() {
        let d = Digest::of(b"tessera");
        let s = d.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(s, blake3::hash(b"tessera").to_hex().as_str());
        assert_eq!(s.parse::<Digest>().unwrap(), d);
        assert_eq!(s.to_uppercase().parse::<Digest>().unwrap(), d);
    }

    #[test]
    fn bad_hex_is_refused() {
        assert!("abc".parse::<Digest>().is_err());
        let bad = "g".repeat(64);
        let e = bad.parse::<Digest>().unwrap_err();
        assert!(e.to_string().contains("expected 64 hex digits"));
    }

    #[test]
    fn reader_matches_bytes() {
        let data = vec![7u8; 1_000_000];
        let (d, n) = Digest::of_reader(&data[..]).unwrap();
        assert_eq!(n, 1_000_000);
        assert_eq!(d, Digest::of(&data));
    }
}
