//! Property tests of everything the protocol crate decodes from a peer or a
//! file: arbitrary and mutated bytes give an error, never a panic, and what
//! is accepted keeps its promises. The same inputs run for millions of
//! cases under `cargo fuzz` (FUZZING.md); here a few thousand run in CI.

use proptest::prelude::*;
use tessera_protocol::chunk::{ChunkList, ChunkRef, Recipe};
use tessera_protocol::codec;
use tessera_protocol::float_tile::FloatTile;
use tessera_protocol::job::sanitize_manifest_path;
use tessera_protocol::messages::{
    BlobReply, BlobRequest, ClientRequest, ClientResponse, CoordMsg, Hello, Role, Welcome,
    WorkerMsg, PROTOCOL_VERSION,
};
use tessera_protocol::sums::SumTile;
use tessera_protocol::ticket::Ticket;
use tessera_protocol::Digest;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Decodes `payload` as every message type the wire carries.
fn decode_all(payload: &[u8]) {
    let _ = codec::decode_payload::<Hello>(payload);
    let _ = codec::decode_payload::<Welcome>(payload);
    let _ = codec::decode_payload::<WorkerMsg>(payload);
    let _ = codec::decode_payload::<CoordMsg>(payload);
    let _ = codec::decode_payload::<ClientRequest>(payload);
    let _ = codec::decode_payload::<ClientResponse>(payload);
    let _ = codec::decode_payload::<BlobRequest>(payload);
    let _ = codec::decode_payload::<BlobReply>(payload);
    if let Ok(list) = codec::decode_payload::<ChunkList>(payload) {
        let _ = list.check();
    }
    if let Ok(recipe) = codec::decode_payload::<Recipe>(payload) {
        let _ = recipe.check();
    }
}

/// Real messages, encoded: the seeds mutations start from.
fn seeds() -> Vec<Vec<u8>> {
    let hello = Hello {
        version: PROTOCOL_VERSION,
        role: Role::Worker,
        secret: "s".repeat(64),
        name: "w1".into(),
    };
    let whole = [7u8; 5000];
    let recipe = Recipe {
        digest: Digest::of(&whole),
        size: whole.len() as u64,
        chunks: vec![ChunkRef {
            digest: Digest::of(&whole),
            len: whole.len() as u32,
        }],
    };
    let payload = |frame: Vec<u8>| frame[4..].to_vec();
    vec![
        payload(codec::encode(&hello).unwrap()),
        payload(codec::encode(&ClientRequest::MissingBlobs(vec![Digest::of(b"x")])).unwrap()),
        payload(codec::encode(&ClientRequest::Status(Some(3))).unwrap()),
        payload(codec::encode(&WorkerMsg::Heartbeat { telemetry: None }).unwrap()),
        payload(codec::encode(&recipe).unwrap()),
        payload(codec::encode(&CoordMsg::Drain).unwrap()),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_payloads_decode_to_errors_not_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        decode_all(&bytes);
        let _ = codec::decode_frame::<Hello>(&bytes);
    }

    #[test]
    fn mutated_messages_decode_to_errors_not_panics(
        seed in 0usize..6,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = seeds().swap_remove(seed);
        for (at, value) in flips {
            let len = bytes.len();
            bytes[at % len] = value;
        }
        decode_all(&bytes);
    }

    #[test]
    fn a_length_prefix_over_the_cap_is_refused_before_allocating(len in (codec::MAX_FRAME + 1)..=u32::MAX) {
        prop_assert!(codec::check_len(len.to_be_bytes()).is_err());
    }

    #[test]
    fn tickets_parse_or_say_why_and_round_trip(line in "\\PC{0,120}", secret in "[a-f0-9]{1,64}", port in 1u16..) {
        let _ = line.parse::<Ticket>();
        let t = Ticket {
            role: Role::Client,
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            also: Vec::new(),
            fingerprint: "0f".repeat(32),
            secret,
        };
        prop_assert_eq!(t.to_string().parse::<Ticket>().unwrap(), t);
    }

    #[test]
    fn accepted_manifest_paths_stay_inside_the_job_folder(path in "[a-z./\\\\:\\x00-]{0,24}") {
        if let Ok(parts) = sanitize_manifest_path(&path) {
            for part in parts {
                prop_assert!(!part.is_empty() && part != "." && part != "..");
                prop_assert!(!part.contains(['/', '\\', ':', '\0']));
            }
        }
    }

    #[test]
    fn tile_formats_parse_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..128), w in 0u32..4, h in 0u32..4) {
        let _ = FloatTile::parse(&bytes);
        let _ = SumTile::parse(&bytes);
        // A header that fits, then arbitrary pixels.
        let mut tile = SumTile::new(w, h);
        tile.samples = 1;
        let mut encoded = tile.encode();
        let n = encoded.len().min(bytes.len());
        encoded[16.min(n)..n].copy_from_slice(&bytes[16.min(n)..n]);
        let _ = SumTile::parse(&encoded);
    }


    #[test]
    fn chunk_lists_with_lying_sizes_are_refused(size in any::<u64>(), lens in proptest::collection::vec(any::<u32>(), 0..8)) {
        let chunks: Vec<ChunkRef> = lens.iter().map(|&len| ChunkRef { digest: Digest::of(&len.to_le_bytes()), len }).collect();
        let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
        let list = ChunkList { size, chunks };
        if size != total {
            prop_assert!(list.check().is_err());
        }
    }
}
