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

/// Decompresses a received message into at most `max_len` bytes.
pub(crate) fn decompress(data: &[u8], max_len: usize) -> Result<Bytes, Status> {
    #[cfg(feature = "zstd")]
    {
        let size = match zstd::zstd_safe::get_frame_content_size(data) {
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
        let output = zstd::bulk::decompress(data, size)
            .map_err(|e| Status::invalid_argument(format!("corrupt compressed message: {e}")))?;
        if output.len() != size {
            return Err(Status::invalid_argument(
                "compressed message shorter than its content size",
            ));
        }
        Ok(Bytes::from(output))
    }
    #[cfg(not(feature = "zstd"))]
    {
        let _ = (data, max_len);
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
}
