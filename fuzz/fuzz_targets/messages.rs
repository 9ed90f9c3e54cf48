//! Every message type the wire carries, decoded from arbitrary frames: an
//! error, never a panic, and never an allocation beyond the frame cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tessera_protocol::chunk::{ChunkList, Recipe};
use tessera_protocol::codec;
use tessera_protocol::messages::{
    BlobReply, BlobRequest, ClientRequest, ClientResponse, CoordMsg, Hello, Welcome, WorkerMsg,
};

fuzz_target!(|data: &[u8]| {
    let _ = codec::decode_frame::<Hello>(data);
    let _ = codec::decode_payload::<Hello>(data);
    let _ = codec::decode_payload::<Welcome>(data);
    let _ = codec::decode_payload::<WorkerMsg>(data);
    let _ = codec::decode_payload::<CoordMsg>(data);
    let _ = codec::decode_payload::<ClientRequest>(data);
    let _ = codec::decode_payload::<ClientResponse>(data);
    let _ = codec::decode_payload::<BlobRequest>(data);
    let _ = codec::decode_payload::<BlobReply>(data);
    if let Ok(list) = codec::decode_payload::<ChunkList>(data) {
        let _ = list.check();
    }
    if let Ok(recipe) = codec::decode_payload::<Recipe>(data) {
        let _ = recipe.check();
    }
});
