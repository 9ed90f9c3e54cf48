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
