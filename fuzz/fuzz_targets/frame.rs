//! A whole frame as a transport delivers it: `Frame::decode` never panics, and a frame
//! it accepts encodes to bytes that decode to the same frame.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rpc_core::frame::{DecodeLimits, Frame, MAX_GOAWAY_REASON_LEN};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    let Ok(frame) = Frame::decode(Bytes::copy_from_slice(data), &limits) else {
        return;
    };
    if let Frame::GoAway(g) = &frame {
        if g.reason.len() > MAX_GOAWAY_REASON_LEN {
            return; // the encoder cuts long reasons, by design
        }
    }
    let again = Frame::decode(frame.encode().freeze(), &limits).expect("re-encoded frame decodes");
    assert_eq!(again, frame);
});
