//! Property tests of the chunker: any bytes give a recipe that checks out
//! and covers them exactly (the decoders' properties are in the protocol
//! crate's tests).

use proptest::prelude::*;
use tessera_store::chunk::chunk_bytes;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn chunk_lists_of_any_bytes_check_out_and_cover_them(bytes in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        let recipe = chunk_bytes(&bytes);
        prop_assert!(recipe.check().is_ok());
        prop_assert_eq!(recipe.size, bytes.len() as u64);
        let covered: u64 = recipe.chunks.iter().map(|c| u64::from(c.len)).sum();
        prop_assert_eq!(covered, bytes.len() as u64);
    }
}
