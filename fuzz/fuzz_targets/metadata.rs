//! A metadata block (`docs/wire.md` §5.1), as it arrives in a DATA frame flagged
//! HAS_METADATA: never a panic; a block accepted is within the limit, every key valid,
//! and it encodes back to the same bytes.

#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use rpc_core::{
    frame::{self, DecodeLimits, Frame, FLAG_HAS_METADATA, FLAG_NO_MESSAGE},
    metadata::validate_key,
};
use rpc_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    // The limit: the default, or small enough for the fuzzer to hit.
    let max_metadata_len = match input.u8() {
        0..=127 => frame::DEFAULT_MAX_METADATA_LEN,
        n => usize::from(n) * 4,
    };
    let block = input.rest();
    let mut buf = BytesMut::new();
    frame::encode_data_header(&mut buf, 1, FLAG_NO_MESSAGE, None);
    buf[2..4].copy_from_slice(&(FLAG_HAS_METADATA | FLAG_NO_MESSAGE).to_be_bytes());
    buf.put_u32(block.len() as u32);
    buf.put_slice(block);
    let limits = DecodeLimits { max_metadata_len };
    let Ok(Frame::Data(data_frame)) = Frame::decode(buf.freeze(), &limits) else {
        return;
    };
    let metadata = data_frame.metadata.expect("flagged HAS_METADATA");
    assert!(block.len() <= max_metadata_len);
    for (key, _) in metadata.iter() {
        validate_key(key).expect("decoded key is valid");
    }
    assert_eq!(frame::metadata_encoded_len(&metadata), block.len());
    let mut again = BytesMut::new();
    frame::encode_data_header(&mut again, 1, FLAG_HAS_METADATA, Some(&metadata));
    assert_eq!(&again[frame::HEADER_LEN + 4..], block);
});
