//! The status part of a RESPONSE (`docs/wire.md` §2.6, §4): code, message, details and
//! metadata as a peer writes them, after a fixed header. Never a panic; an error
//! response becomes a `Status` that keeps every field, prints, and encodes back.

#![no_main]

use bytes::{BufMut, Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use rpc_core::{
    frame::{self, DecodeLimits, Frame},
    Code,
};

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::new();
    buf.put_slice(&[frame::VERSION, 2, 0, 0]); // RESPONSE, no flags
    buf.put_u64(1);
    buf.put_slice(data);
    let Ok(Frame::Response(response)) = Frame::decode(buf.freeze(), &DecodeLimits::default())
    else {
        return;
    };
    let (code, message, details, metadata) = (
        response.code,
        response.message.clone(),
        response.details.clone(),
        response.metadata.clone(),
    );
    let status = match response.into_result() {
        Ok(_) => {
            assert_eq!(code, Code::OK);
            return;
        }
        Err(status) => status,
    };
    assert_eq!(status.code(), code);
    assert_eq!(status.message(), message.as_str());
    assert_eq!(status.details(), &details);
    assert_eq!(status.metadata(), &metadata);
    let _ = (
        status.to_string(),
        format!("{status:?}"),
        status.is_unprocessed(),
    );
    // A server answering with this status writes the same fields.
    let mut again = BytesMut::new();
    frame::encode_response_header(
        &mut again,
        1,
        status.code(),
        status.message(),
        status.details(),
        status.metadata(),
    );
    let decoded = Frame::decode(again.freeze(), &DecodeLimits::default()).expect("decodes");
    let Frame::Response(decoded) = decoded else {
        panic!("not a response")
    };
    assert_eq!(decoded.code, code);
    assert_eq!(decoded.message, message);
    assert_eq!(decoded.details, details);
    assert_eq!(decoded.payload, Bytes::new());
});
