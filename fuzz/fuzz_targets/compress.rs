//! A compressed message (`docs/wire.md` §6.10: a zstd frame or gzip members, told
//! apart by their magic bytes, so the input's own first bytes pick the algorithm; the
//! crate is built with both features): never a panic, never more output than the
//! receiver's limit, and no output buffer reserved beyond what the data really expands
//! to: a decompression bomb stops at the limit, a claimed size (zstd's content size,
//! gzip's `ISIZE`) alone buys nothing. Seeds of both formats are in
//! `seeds/compress/`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_core::fuzzing::{decompress, INITIAL_DECOMPRESS_OUTPUT};

/// Limits the receiver may be configured with: small ones the fuzzer can reach, and
/// the default maximum frame length.
const LIMITS: [usize; 4] = [1024, 64 * 1024, 1024 * 1024, 16 * 1024 * 1024];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let max_len = LIMITS[usize::from(pick % 4)];
    let mut largest = 0;
    let result = decompress(data, max_len, &mut |n| largest = largest.max(n));
    assert!(
        largest <= max_len,
        "reserved {largest} bytes over the limit of {max_len}"
    );
    match result {
        Ok(out) => {
            assert!(out.len() <= max_len);
            // Doubling from the first buffer: never more than twice the output.
            assert!(
                largest <= INITIAL_DECOMPRESS_OUTPUT.max(2 * out.len()),
                "reserved {largest} bytes for {} bytes of output",
                out.len()
            );
        }
        Err(status) => {
            let _ = status.to_string();
        }
    }
});
