//! Per-message compression (zstd), negotiated with each peer.
//!
//! Built with the cargo feature `zstd`, and off unless a channel or server turns it on
//! (`.compression(Some(Compression::default()))`). Without the feature nothing is ever
//! compressed, nothing is advertised, and a compressed message received anyway is
//! refused with a clear status.
//!
//! **Negotiation** (`docs/wire.md` §6.10): a side that can decompress says so with the
//! metadata entry `rpc-accept-encoding: zstd`: the client on the first requests of each
//! connection, the server on its answers to them. A side compresses only toward a peer
//! that has said so: a peer that does not support compression is never sent compressed
//! data. The entry is consumed by the framework; applications do not see it.
//!
//! **What is compressed**: a message (a unary payload or a stream's DATA message) at
//! least [`Compression::threshold`] bytes long, when compressing makes it smaller.
//! `Request::set_compress` / `Response::set_compress` force it on or off for one unary
//! message (still only toward a peer that accepts it). The frame is flagged
//! `FLAG_COMPRESSED`; the receiver decompresses before anything else sees the message,
//! and never into more than its maximum frame length.

use bytes::Bytes;

use crate::{Payload, Status};

/// The metadata key that advertises decompression support.
pub const ACCEPT_ENCODING: &str = "rpc-accept-encoding";

/// The only encoding: zstd frames with their content size.
pub const ZSTD: &str = "zstd";

/// Default smallest message compressed, in bytes.
pub const DEFAULT_THRESHOLD: usize = 1024;

/// Compression settings of a channel or server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    /// Smallest message compressed, in bytes. Default: [`DEFAULT_THRESHOLD`].
    pub threshold: usize,
    /// zstd level (1 is fast; 3 is zstd's default; up to 22). Default: 1.
    pub level: i32,
}

impl Default for Compression {
    fn default() -> Self {
        Compression {
            threshold: DEFAULT_THRESHOLD,
            level: 1,
        }
    }
}

impl Compression {
    /// Whether this build can compress (the `zstd` feature).
    pub const fn is_available() -> bool {
        cfg!(feature = "zstd")
    }

    /// Whether to compress a message of `len` bytes given a per-message `hint`, toward
    /// a peer that accepts compression or not.
    fn wants(
        config: Option<&Compression>,
        peer_accepts: bool,
        hint: Option<bool>,
        len: usize,
    ) -> bool {
        if !Compression::is_available() {
            return false;
        }
        match (config, peer_accepts, hint) {
            (None, ..) | (_, false, _) | (_, _, Some(false)) => false,
            (Some(_), true, Some(true)) => true,
            (Some(config), true, None) => len >= config.threshold,
        }
    }
}

/// The payload to send and its extra frame flags: `payload` compressed if the settings
/// (`config`), the peer (`peer_accepts`) and the per-message `hint` say so and it
/// helps, else unchanged. The one place either side decides.
pub(crate) fn encode(
    config: Option<&Compression>,
    peer_accepts: bool,
    payload: Payload,
    hint: Option<bool>,
) -> (Payload, u16) {
    let Some(level) = config.map(|c| c.level) else {
        return (payload, 0);
    };
    if !Compression::wants(config, peer_accepts, hint, payload.len()) {
        return (payload, 0);
    }
    match compress(&payload, level, hint == Some(true)) {
        Some(packed) => (packed, crate::frame::FLAG_COMPRESSED),
        None => (payload, 0),
    }
}

/// Compresses `payload`. `None` if compression is not built, or if it would not make
/// the message smaller and was not `forced`.
pub(crate) fn compress(payload: &Payload, level: i32, forced: bool) -> Option<Payload> {
    #[cfg(feature = "zstd")]
    {
        let input = payload.to_bytes();
        let output = zstd::bulk::compress(&input, level).ok()?;
        if output.len() >= input.len() && !forced {
            return None;
        }
        Some(Payload::from(Bytes::from(output)))
    }
    #[cfg(not(feature = "zstd"))]
    {
        let _ = (payload, level, forced);
        None
    }
}

/// Output reserved by the first decompression attempt, at most: what a message of a
/// few kilobytes needs in one go, and all a peer's claimed content size can make the
/// receiver reserve before any data has actually decompressed.
#[cfg_attr(not(feature = "zstd"), allow(dead_code))]
pub(crate) const INITIAL_OUTPUT: usize = 64 * 1024;

/// Decompresses a received message into at most `max_len` bytes.
///
/// The content size in the zstd frame header is the peer's claim: it is checked against
/// `max_len` but never reserved up front (nine bytes of header could otherwise claim
/// 16 MiB). The output starts at [`INITIAL_OUTPUT`] (or the claimed size, if smaller)
/// and doubles, up to the claimed size, only when decompression ran out of room, that
/// is when the data really expands that far. zstd decompresses in one pass into the
/// output (no window buffer of the frame's choosing); a retry decompresses again from
/// the start, which at most doubles the work for messages that expand a lot.
pub(crate) fn decompress(data: &[u8], max_len: usize) -> Result<Bytes, Status> {
    decompress_reserving(data, max_len, &mut |_| {})
}

/// [`decompress`], telling `reserved` the capacity of each output buffer it reserves.
pub(crate) fn decompress_reserving(
    data: &[u8],
    max_len: usize,
    reserved: &mut dyn FnMut(usize),
) -> Result<Bytes, Status> {
    #[cfg(feature = "zstd")]
    {
        use zstd::zstd_safe::{self, zstd_sys::ZSTD_ErrorCode};

        let size = match zstd_safe::get_frame_content_size(data) {
            Ok(Some(size)) => size,
            Ok(None) => {
                return Err(Status::invalid_argument(
                    "compressed message without its content size (write zstd frames with it)",
                ))
            }
            Err(_) => return Err(Status::invalid_argument("compressed message is not zstd")),
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size > max_len {
            return Err(Status::resource_exhausted(format!(
                "compressed message expands to {size} bytes, over the limit of {max_len}"
            )));
        }
        let too_small = (ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall as usize).wrapping_neg();
        let mut dctx = zstd_safe::DCtx::create();
        let mut capacity = size.min(INITIAL_OUTPUT);
        let output = loop {
            let mut output = Vec::with_capacity(capacity);
            reserved(output.capacity());
            match dctx.decompress(&mut output, data) {
                Ok(_) => break output,
                Err(code) if code == too_small && capacity < size => {
                    drop(output);
                    capacity = capacity.saturating_mul(2).min(size);
                }
                Err(code) => {
                    return Err(Status::invalid_argument(format!(
                        "corrupt compressed message: {}",
                        zstd_safe::get_error_name(code)
                    )))
                }
            }
        };
        if output.len() != size {
            return Err(Status::invalid_argument(
                "compressed message shorter than its content size",
            ));
        }
        Ok(Bytes::from(output))
    }
    #[cfg(not(feature = "zstd"))]
    {
        let _ = (data, max_len, reserved);
        Err(Status::unimplemented(
            "received a compressed message, but this peer never advertised compression \
             (built without the zstd feature)",
        ))
    }
}

/// Whether metadata advertises zstd support; removes the entry.
pub(crate) fn take_accepts(metadata: &mut crate::Metadata) -> bool {
    if metadata.get(ACCEPT_ENCODING).is_none() {
        return false;
    }
    let accepts = metadata.get_all(ACCEPT_ENCODING).any(|v| {
        v.as_str()
            .is_some_and(|s| s.split(',').any(|e| e.trim() == ZSTD))
    });
    metadata.remove(ACCEPT_ENCODING);
    accepts
}

#[cfg(all(test, feature = "zstd"))]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let payload = Payload::from(vec![7u8; 100_000]);
        let packed = compress(&payload, 1, false).expect("compressible");
        assert!(packed.len() < 1000);
        let bytes = packed.to_bytes();
        assert_eq!(decompress(&bytes, 100_000).unwrap().len(), 100_000);
        let err = decompress(&bytes, 99_999).unwrap_err();
        assert_eq!(err.code(), crate::Code::RESOURCE_EXHAUSTED);
        assert_eq!(
            decompress(b"not zstd at all", 1000).unwrap_err().code(),
            crate::Code::INVALID_ARGUMENT
        );
        // Incompressible data is sent as it is unless forced.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        assert!(compress(&Payload::from(noise.clone()), 1, false).is_none());
        assert!(compress(&Payload::from(noise), 1, true).is_some());
    }

    /// Decompresses `data` with a limit of 16 MiB; the result and the largest output
    /// buffer reserved on the way.
    fn decompress_measured(data: &[u8]) -> (Result<Bytes, Status>, usize) {
        let mut largest = 0;
        let result =
            decompress_reserving(data, 16 * 1024 * 1024, &mut |n| largest = largest.max(n));
        (result, largest)
    }

    #[test]
    fn a_claimed_content_size_buys_no_allocation() {
        // Issue 19 item 10: a zstd frame header claiming 16,777,215 bytes of content
        // (single segment, 4-byte content size), and no block at all.
        let bomb = [0x28, 0xb5, 0x2f, 0xfd, 0xb4, 0xff, 0xff, 0xff, 0x00];
        assert!(matches!(
            zstd::zstd_safe::get_frame_content_size(&bomb),
            Ok(Some(16_777_215))
        ));
        let (result, largest) = decompress_measured(&bomb);
        assert_eq!(result.unwrap_err().code(), crate::Code::INVALID_ARGUMENT);
        assert!(largest <= INITIAL_OUTPUT, "reserved {largest} bytes");
    }

    #[test]
    fn output_grows_with_what_really_decompresses() {
        // Honest messages of every size come back whole; the largest buffer reserved
        // is never more than twice what the message really expands to.
        for len in [
            0,
            1,
            1000,
            INITIAL_OUTPUT,
            INITIAL_OUTPUT + 1,
            3 * 1024 * 1024,
        ] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let packed = compress(&Payload::from(payload.clone()), 1, true).unwrap();
            let (result, largest) = decompress_measured(&packed.to_bytes());
            assert_eq!(result.unwrap(), payload, "{len}");
            assert!(largest <= (2 * len).max(INITIAL_OUTPUT), "{len}: {largest}");
        }
        // A frame that claims more than its blocks hold reserves no more than they
        // hold (rounded up to a doubling), then fails.
        let payload = vec![1u8; 200_000];
        let mut packed = compress(&Payload::from(payload), 1, true)
            .unwrap()
            .to_bytes()
            .to_vec();
        // Content size is the 4 bytes after the magic and the descriptor (FCS 4 bytes,
        // single segment at level 1 for 200 kB): claim 8 MiB instead.
        assert_eq!(
            packed[4] & 0xe0,
            0xa0,
            "single segment, 4-byte content size"
        );
        packed[5..9].copy_from_slice(&(8u32 * 1024 * 1024).to_le_bytes());
        let (result, largest) = decompress_measured(&packed);
        assert!(result.is_err());
        assert!(largest <= 512 * 1024, "reserved {largest} bytes");
    }
}
