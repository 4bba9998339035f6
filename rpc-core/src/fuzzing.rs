//! Entry points for the fuzz targets in `fuzz/` to the crate's private decoders.
//! Compiled only with `--cfg fuzzing` (which `fuzz/run` sets) and in tests; not part of
//! the API.

use bytes::Bytes;

use crate::Status;

/// [`compress::decompress`](crate::compress): a received compressed message, decoded
/// into at most `max_len` bytes. `reserved` is told the capacity of every output buffer
/// reserved on the way, so a target can check that a claim alone buys no memory.
pub fn decompress(
    data: &[u8],
    max_len: usize,
    reserved: &mut dyn FnMut(usize),
) -> Result<Bytes, Status> {
    crate::compress::decompress_reserving(data, max_len, reserved)
}

/// The most a decompression reserves before any data has decompressed.
pub const INITIAL_DECOMPRESS_OUTPUT: usize = crate::compress::INITIAL_OUTPUT;

/// Compresses `data` with `algorithm` as a sender does (forced: even when it does not
/// get smaller). `None` if this build does not have `algorithm`.
pub fn compress(algorithm: crate::compress::Algorithm, data: &[u8], level: i32) -> Option<Bytes> {
    crate::compress::compress(algorithm, &crate::Payload::from(data.to_vec()), level, true)
        .map(|p| p.to_bytes())
}
