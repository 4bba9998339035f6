//! A whole frame as a transport delivers it: `Frame::decode` never panics, a frame it
//! accepts encodes to bytes that decode to the same frame, and `Frame::decode_cached`
//! (a server's, with its method cache cold and then warm) decides exactly as it does.
//! The input is also read as several frames separated by `0xFF` bytes, decoded in turn
//! through one cache, so that hits on another frame's method and evictions are checked
//! too.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rpc_core::frame::{DecodeLimits, Frame, MethodCache, MAX_GOAWAY_REASON_LEN};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits::default();
    let decoded = Frame::decode(Bytes::copy_from_slice(data), &limits);
    let mut methods = MethodCache::default();
    for _ in 0..2 {
        let cached = Frame::decode_cached(Bytes::copy_from_slice(data), &limits, &mut methods);
        assert_eq!(cached, decoded);
    }
    let mut methods = MethodCache::default();
    for piece in data.split(|&b| b == 0xFF) {
        let cached = Frame::decode_cached(Bytes::copy_from_slice(piece), &limits, &mut methods);
        assert_eq!(
            cached,
            Frame::decode(Bytes::copy_from_slice(piece), &limits)
        );
    }
    let Ok(frame) = decoded else {
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
