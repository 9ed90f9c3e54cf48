//! Frames over async streams: the length prefix is read and checked against
//! its cap before anything past it is read or allocated; the payload is
//! decoded by `tessera_protocol::codec`, in whichever encoding its prefix
//! names (version 18's bincode or version 19's envelope). Writers say which
//! encoding their connection negotiated.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tessera_protocol::codec::{
    check_prefix, decode_payload_as, encode_as, Codec, CodecError, MAX_FRAME,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
    Ok(read_tagged_frame_within(r, max).await?.map(|(_, msg)| msg))
}

/// Reads one frame of at most `max` bytes, and the encoding it came in.
pub async fn read_tagged_frame_within<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
) -> Result<Option<(Codec, T)>, CodecError> {
    read_budgeted_frame(r, max, None).await
}

/// The bytes of unfinished frames one connection may have the reader hold
/// at once, over all its streams. A peer that opens streams and leaves
/// each frame one byte short would otherwise make the reader keep every
/// such frame (16 MiB each, 256 streams); past this budget a frame is
/// refused instead. Frames of at most [`UNBUDGETED_FRAME`] bytes are not
/// counted.
pub const CONNECTION_FRAME_BUDGET: u32 = 64 * 1024 * 1024;
/// Frames this small need no share of the budget (256 streams of them are
/// 16 MiB).
pub const UNBUDGETED_FRAME: usize = 64 * 1024;

/// A connection's budget of unfinished frame bytes (shared by its
/// streams' [`crate::Channel`]s).
pub type FrameBudget = std::sync::Arc<tokio::sync::Semaphore>;

/// A full budget for a new connection.
pub fn frame_budget() -> FrameBudget {
    std::sync::Arc::new(tokio::sync::Semaphore::new(
        CONNECTION_FRAME_BUDGET as usize,
    ))
}

/// Reads one frame of at most `max` bytes; a payload over
/// [`UNBUDGETED_FRAME`] takes its length from `budget` while it is read
/// and decoded, and is refused when the budget has not that much left.
pub async fn read_budgeted_frame<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    max: u32,
    budget: Option<&FrameBudget>,
) -> Result<Option<(Codec, T)>, CodecError> {
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
    let (codec, len) = check_prefix(prefix, max)?;
    let _held = match budget {
        Some(budget) if len > UNBUDGETED_FRAME => {
            Some(budget.try_acquire_many(len as u32).map_err(|_| {
                CodecError::Io(std::io::Error::other(format!(
                    "a frame of {len} bytes would take this connection past its \
                     {} MiB of unfinished frames",
                    CONNECTION_FRAME_BUDGET / (1024 * 1024)
                )))
            })?)
        }
        _ => None,
    };
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            CodecError::Closed
        } else {
            CodecError::Io(e)
        }
    })?;
    decode_payload_as(codec, &payload).map(|msg| Some((codec, msg)))
}

/// Writes one frame to `w` in this release's own encoding.
pub async fn write_frame<T: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &T,
) -> Result<(), CodecError> {
    write_frame_as(w, Codec::CURRENT, msg).await
}

/// Writes one frame to `w` in `codec` (the one its connection negotiated).
pub async fn write_frame_as<T: Serialize, W: AsyncWrite + Unpin>(
    w: &mut W,
    codec: Codec,
    msg: &T,
) -> Result<(), CodecError> {
    let frame = encode_as(codec, msg)?;
    w.write_all(&frame).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::codec::MAX_HELLO_FRAME;
    use tessera_protocol::messages::{Hello, Role};

    #[test]
    fn four_gib_length_is_refused_by_the_async_reader_from_its_prefix() {
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
        let frame = tessera_protocol::codec::encode(&hello).unwrap();
        let mut reader: &[u8] = &frame;
        let back = rt
            .block_on(read_frame_within::<Hello, _>(&mut reader, MAX_HELLO_FRAME))
            .unwrap()
            .unwrap();
        assert_eq!(back.secret, hello.secret);
    }

    #[test]
    fn unfinished_frames_of_one_connection_share_one_budget() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let budget = frame_budget();
            let per_frame = MAX_FRAME; // 16 MiB: four fill the budget
            let mut held = Vec::new();
            for _ in 0..CONNECTION_FRAME_BUDGET / per_frame {
                // A peer announces a full-size frame and sends one byte of it.
                let (mut peer, mut ours) = tokio::io::duplex(64);
                peer.write_all(&per_frame.to_be_bytes()).await.unwrap();
                peer.write_all(&[0]).await.unwrap();
                let budget = budget.clone();
                held.push((
                    peer,
                    tokio::spawn(async move {
                        read_budgeted_frame::<Hello, _>(&mut ours, MAX_FRAME, Some(&budget)).await
                    }),
                ));
            }
            while budget.available_permits() > 0 {
                tokio::task::yield_now().await;
            }
            // The next unfinished frame is refused at once, before its body.
            let mut input: Vec<u8> = per_frame.to_be_bytes().to_vec();
            input.push(0);
            let mut reader: &[u8] = &input;
            let err = read_budgeted_frame::<Hello, _>(&mut reader, MAX_FRAME, Some(&budget))
                .await
                .unwrap_err();
            assert!(matches!(err, CodecError::Io(_)), "{err:?}");
            assert_eq!(reader.len(), 1, "nothing past the prefix was read");
            // Small frames need no share of it.
            let hello = Hello {
                version: 19,
                role: Role::Client,
                secret: "ab".repeat(32),
                name: "c".into(),
            };
            let frame = tessera_protocol::codec::encode(&hello).unwrap();
            let mut reader: &[u8] = &frame;
            let back = read_budgeted_frame::<Hello, _>(&mut reader, MAX_FRAME, Some(&budget))
                .await
                .unwrap();
            assert!(back.is_some());
            // A stream that ends gives its share back.
            let (peer, reading) = held.pop().unwrap();
            drop(peer);
            assert!(matches!(reading.await.unwrap(), Err(CodecError::Closed)));
            assert_eq!(budget.available_permits(), per_frame as usize);
        });
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
