//! Chunking: any bytes cut into chunks that join back into the same bytes,
//! whose list checks out; a recipe's list id is its list's id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_store::chunk::{chunk_bytes, ChunkList};

fuzz_target!(|data: &[u8]| {
    let recipe = chunk_bytes(data);
    recipe.check().expect("a recipe of real bytes checks out");
    assert_eq!(recipe.size, data.len() as u64);
    let list = ChunkList {
        size: recipe.size,
        chunks: recipe.chunks.clone(),
    };
    list.check().expect("its list checks out");
    assert_eq!(list.id(), recipe.list_id());
    let mut at = 0usize;
    for (offset, chunk) in recipe.offsets() {
        assert_eq!(offset as usize, at);
        at += chunk.len as usize;
    }
    assert_eq!(at, data.len());
});
