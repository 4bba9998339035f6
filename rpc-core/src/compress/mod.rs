//! Per-message compression (zstd, gzip), negotiated with each peer.
//!
//! Each algorithm is a cargo feature of rpc-core: `zstd` (builds the zstd C library) and
//! `gzip` (flate2 on miniz_oxide, pure Rust; what gRPC peers speak). Compression is off
//! unless a channel or server turns it on
//! (`.compression(Some(Compression::default()))?`); asking there for an algorithm this
//! build does not have is an error of kind [`Unsupported`](crate::ErrorKind::Unsupported)
//! at that line, not a silent no-op.
//!
//! **Negotiation** (`docs/wire.md` §6.10): a side that can decompress says so with the
//! metadata entry `rpc-accept-encoding`, a comma-separated list of the algorithms it
//! has, most preferred first (`zstd,gzip`: its own configured algorithm first): the
//! client on the first requests of each connection, the server on its answers to them.
//! A side compresses only toward a peer that has said so, with its own configured
//! algorithm if the peer listed it, else with the first one of the peer's list that it
//! has; names it does not know or have are skipped. A peer that does not support
//! compression is never sent compressed data. The entry is consumed by the framework;
//! applications do not see it.
//!
//! **What is compressed**: a message (a unary payload or a stream's DATA message) at
//! least [`Compression::threshold`] bytes long, when compressing makes it smaller.
//! `Request::set_compress` / `Response::set_compress` force it on or off for one unary
//! message (still only toward a peer that accepts it). The frame is flagged
//! `FLAG_COMPRESSED`; the message names its own format by its first bytes (a zstd
//! frame's or a gzip member's magic number). The receiver decompresses before anything
//! else sees the message, and never into more than its maximum frame length.
//!
//! Layout: this file holds the settings, the negotiation and the choice of algorithm;
//! `zstd_frame.rs` and `gzip_member.rs` each compress and (boundedly) decompress one
//! format.

use std::fmt;

use bytes::Bytes;

use crate::{Error, ErrorKind, Payload, Status};

#[cfg(feature = "gzip")]
mod gzip_member;
#[cfg(feature = "zstd")]
mod zstd_frame;

/// The metadata key that advertises decompression support.
pub const ACCEPT_ENCODING: &str = "rpc-accept-encoding";

/// The name of zstd in `rpc-accept-encoding`: zstd frames with their content size.
pub const ZSTD: &str = "zstd";

/// The name of gzip in `rpc-accept-encoding`: gzip members (RFC 1952).
pub const GZIP: &str = "gzip";

/// Default smallest message compressed, in bytes.
pub const DEFAULT_THRESHOLD: usize = 1024;

/// A compression algorithm of the wire (`docs/wire.md` §6.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// zstd ([`ZSTD`]), the cargo feature `zstd`: faster and smaller than gzip, so
    /// preferred when both are built.
    Zstd,
    /// gzip ([`GZIP`]), the cargo feature `gzip`: what gRPC peers speak.
    Gzip,
}

impl Algorithm {
    /// Every algorithm of the wire, in this implementation's order of preference.
    pub const ALL: [Algorithm; 2] = [Algorithm::Zstd, Algorithm::Gzip];

    /// Its name in `rpc-accept-encoding` (and of the cargo feature that builds it).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Zstd => ZSTD,
            Algorithm::Gzip => GZIP,
        }
    }

    /// The algorithm of an `rpc-accept-encoding` name (ASCII case ignored), if the
    /// wire knows it.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }

    /// Whether this build has it (its cargo feature is on).
    pub const fn is_available(self) -> bool {
        match self {
            Algorithm::Zstd => cfg!(feature = "zstd"),
            Algorithm::Gzip => cfg!(feature = "gzip"),
        }
    }

    /// The format of a compressed message, by its magic number: a zstd frame starts
    /// with `28 B5 2F FD`, a gzip member with `1F 8B`. (A wire that names the algorithm
    /// of each message, like gRPC's `grpc-encoding`, checks it against this.)
    pub fn of_message(data: &[u8]) -> Option<Algorithm> {
        if data.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Algorithm::Zstd)
        } else if data.starts_with(&[0x1f, 0x8b]) {
            Some(Algorithm::Gzip)
        } else {
            None
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Compression settings of a channel or server.
///
/// ```
/// use rpc_core::compress::{Algorithm, Compression};
/// # fn f() -> Result<(), rpc_core::Error> {
/// // gzip, for peers that speak gRPC's algorithms (needs rpc-core's `gzip` feature:
/// // without it, `compression` answers `ErrorKind::Unsupported`).
/// let gzip = Compression::new(Algorithm::Gzip);
/// let builder = rpc_core::client::Channel::builder().compression(Some(gzip));
/// # let _ = builder; Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    /// The algorithm this side compresses with when the peer accepts it (else the
    /// first one of the peer's list this build has). Default: zstd if built, else
    /// gzip if built, else zstd (which the builders then refuse as not built).
    pub algorithm: Algorithm,
    /// Smallest message compressed, in bytes. Default: [`DEFAULT_THRESHOLD`].
    pub threshold: usize,
    /// Level, on the algorithm's own scale (clamped into it): zstd 1 (fast) to 22,
    /// 3 being zstd's default; gzip 0 (stored) to 9, 6 being gzip's default.
    /// Default: 1 (fast, for both).
    pub level: i32,
}

impl Default for Compression {
    fn default() -> Self {
        let algorithm = if Algorithm::Gzip.is_available() && !Algorithm::Zstd.is_available() {
            Algorithm::Gzip
        } else {
            Algorithm::Zstd
        };
        Compression::new(algorithm)
    }
}

impl Compression {
    /// `algorithm` with the default threshold and level.
    pub fn new(algorithm: Algorithm) -> Compression {
        Compression {
            algorithm,
            threshold: DEFAULT_THRESHOLD,
            level: 1,
        }
    }

    /// Whether this build can compress at all (the `zstd` or `gzip` feature).
    pub const fn is_available() -> bool {
        cfg!(any(feature = "zstd", feature = "gzip"))
    }

    /// Checks that this build has the algorithm: what `ChannelBuilder::compression`
    /// and `ServerBuilder::compression` do. An error of kind
    /// [`Unsupported`](ErrorKind::Unsupported) names the missing cargo feature.
    pub fn check(&self) -> Result<(), Error> {
        if self.algorithm.is_available() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "compression with {0} asked for, but this build has no {0}: enable \
                 rpc-core's `{0}` cargo feature",
                self.algorithm
            ),
        ))
    }

    /// Whether to compress a message of `len` bytes given a per-message `hint`.
    fn wants(&self, hint: Option<bool>, len: usize) -> bool {
        match hint {
            Some(force) => force,
            None => len >= self.threshold,
        }
    }
}

/// The algorithms a peer advertised it can decompress, in its order of preference:
/// those of its `rpc-accept-encoding` list that the wire knows, without repeats; and
/// whether it sent a list at all (one of unknown names only is a list too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Accepted([Option<Algorithm>; Algorithm::ALL.len()], bool);

impl Accepted {
    /// Whether no algorithm the wire knows is listed (nothing advertised, or only
    /// names this side does not know).
    pub(crate) fn is_empty(&self) -> bool {
        self.0[0].is_none()
    }

    /// Whether a non-empty list was sent (`docs/wire.md` §6.10: it replaces the last).
    pub(crate) fn is_listed(&self) -> bool {
        self.1
    }

    /// Takes a newer advertisement: a non-empty list replaces the last one, even one
    /// whose names are all unknown (the peer no longer takes what it listed before);
    /// silence changes nothing.
    pub(crate) fn update(&mut self, newer: Accepted) {
        if newer.is_listed() {
            *self = newer;
        }
    }

    fn push(&mut self, algorithm: Algorithm) {
        for slot in &mut self.0 {
            match slot {
                Some(a) if *a == algorithm => return,
                Some(_) => {}
                None => {
                    *slot = Some(algorithm);
                    return;
                }
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = Algorithm> + '_ {
        self.0.iter().map_while(|a| *a)
    }

    /// What to compress with toward this peer: `preferred` if it accepts that, else
    /// the first algorithm of its list that this build has.
    fn choose(&self, preferred: Algorithm) -> Option<Algorithm> {
        if preferred.is_available() && self.iter().any(|a| a == preferred) {
            return Some(preferred);
        }
        self.iter().find(|a| a.is_available())
    }
}

/// The `rpc-accept-encoding` value a side with these settings advertises: every
/// algorithm this build has, its configured one first. Empty if it has none.
pub(crate) fn advertisement(config: &Compression) -> &'static str {
    match (
        Algorithm::Zstd.is_available(),
        Algorithm::Gzip.is_available(),
        config.algorithm,
    ) {
        (true, true, Algorithm::Gzip) => "gzip,zstd",
        (true, true, _) => "zstd,gzip",
        (true, false, _) => ZSTD,
        (false, true, _) => GZIP,
        (false, false, _) => "",
    }
}

/// The payload to send and its extra frame flags: `payload` compressed if the settings
/// (`config`), the peer (`peer_accepts`) and the per-message `hint` say so and it
/// helps, else unchanged. The one place either side decides.
pub(crate) fn encode(
    config: Option<&Compression>,
    peer_accepts: Accepted,
    payload: Payload,
    hint: Option<bool>,
) -> (Payload, u16) {
    let Some(config) = config else {
        return (payload, 0);
    };
    let Some(algorithm) = peer_accepts.choose(config.algorithm) else {
        return (payload, 0);
    };
    if !config.wants(hint, payload.len()) {
        return (payload, 0);
    }
    match compress(algorithm, &payload, config.level, hint == Some(true)) {
        Some(packed) => (packed, crate::frame::FLAG_COMPRESSED),
        None => (payload, 0),
    }
}

/// Compresses `payload` with `algorithm`. `None` if this build does not have it, or if
/// it would not make the message smaller and was not `forced`.
pub(crate) fn compress(
    algorithm: Algorithm,
    payload: &Payload,
    level: i32,
    forced: bool,
) -> Option<Payload> {
    let input = payload.to_bytes();
    let output = compress_bytes(algorithm, &input, level)?;
    if output.len() >= input.len() && !forced {
        return None;
    }
    Some(Payload::from(Bytes::from(output)))
}

/// `input` compressed with `algorithm`, if this build has it.
fn compress_bytes(algorithm: Algorithm, input: &[u8], level: i32) -> Option<Vec<u8>> {
    match algorithm {
        #[cfg(feature = "zstd")]
        Algorithm::Zstd => zstd_frame::compress(input, level),
        #[cfg(feature = "gzip")]
        Algorithm::Gzip => gzip_member::compress(input, level),
        #[allow(unreachable_patterns)]
        _ => {
            let _ = (input, level);
            None
        }
    }
}

/// Output reserved by the first decompression attempt, at most: what a message of a
/// few kilobytes needs in one go, and all a peer's claimed content size can make the
/// receiver reserve before any data has actually decompressed.
#[cfg_attr(not(any(feature = "zstd", feature = "gzip")), allow(dead_code))]
pub(crate) const INITIAL_OUTPUT: usize = 64 * 1024;

/// The status of a message that expands to `size` bytes, over `max_len`.
#[cfg_attr(not(feature = "zstd"), allow(dead_code))]
fn over_limit(size: usize, max_len: usize) -> Status {
    Status::resource_exhausted(format!(
        "compressed message expands to {size} bytes, over the limit of {max_len}"
    ))
}

/// Decompresses a received message into at most `max_len` bytes, in the format its
/// first bytes name. Whatever the data claims, no output is reserved beyond what it
/// really expands to (rounded up to a doubling, from 64 KiB).
pub fn decompress(data: &[u8], max_len: usize) -> Result<Bytes, Status> {
    decompress_reserving(data, max_len, &mut |_| {})
}

/// [`decompress`], telling `reserved` the capacity of each output buffer it reserves.
pub(crate) fn decompress_reserving(
    data: &[u8],
    max_len: usize,
    reserved: &mut dyn FnMut(usize),
) -> Result<Bytes, Status> {
    let _ = (max_len, &reserved);
    match Algorithm::of_message(data) {
        #[cfg(feature = "zstd")]
        Some(Algorithm::Zstd) => zstd_frame::decompress(data, max_len, reserved),
        #[cfg(feature = "gzip")]
        Some(Algorithm::Gzip) => gzip_member::decompress(data, max_len, reserved),
        #[allow(unreachable_patterns)]
        Some(algorithm) => Err(Status::unimplemented(format!(
            "received a message compressed with {algorithm}, which this build does not \
             have (rpc-core's `{algorithm}` feature), and never advertised"
        ))),
        None => Err(Status::internal(
            "compressed message in no known format (neither a zstd frame nor a gzip member)",
        )),
    }
}

/// The algorithms metadata advertises (see [`Accepted`]); removes the entry.
pub(crate) fn take_accepts(metadata: &mut crate::Metadata) -> Accepted {
    let mut accepted = Accepted::default();
    if metadata.get(ACCEPT_ENCODING).is_none() {
        return accepted;
    }
    for value in metadata.get_all(ACCEPT_ENCODING) {
        let Some(list) = value.as_str() else { continue };
        for name in list.split(',').map(str::trim) {
            accepted.1 |= !name.is_empty();
            if let Some(algorithm) = Algorithm::from_name(name) {
                accepted.push(algorithm);
            }
        }
    }
    metadata.remove(ACCEPT_ENCODING);
    accepted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts(list: &str) -> Accepted {
        let mut metadata = crate::Metadata::new();
        metadata.append(ACCEPT_ENCODING, list.to_owned()).unwrap();
        let accepted = take_accepts(&mut metadata);
        assert!(metadata.get(ACCEPT_ENCODING).is_none(), "consumed");
        accepted
    }

    #[test]
    fn the_list_keeps_the_peers_order_and_skips_unknown_names() {
        let list = |a: Accepted| a.iter().collect::<Vec<_>>();
        assert_eq!(list(accepts("zstd")), [Algorithm::Zstd]);
        assert_eq!(
            list(accepts(" br, GZIP ,zstd,gzip")),
            [Algorithm::Gzip, Algorithm::Zstd]
        );
        assert!(accepts("br, identity").is_empty());
        assert!(take_accepts(&mut crate::Metadata::new()).is_empty());
        let mut peer = accepts("gzip");
        peer.update(Accepted::default());
        assert_eq!(list(peer), [Algorithm::Gzip], "silence changes nothing");
        peer.update(accepts(" , "));
        assert_eq!(
            list(peer),
            [Algorithm::Gzip],
            "an empty list changes nothing"
        );
        peer.update(accepts("br"));
        assert!(
            peer.is_empty(),
            "a later list of unknown names replaces the earlier one"
        );
    }

    #[test]
    fn a_sender_uses_its_own_algorithm_if_accepted_else_the_peers_first_it_has() {
        let both = Algorithm::Zstd.is_available() && Algorithm::Gzip.is_available();
        if both {
            assert_eq!(
                accepts("zstd,gzip").choose(Algorithm::Gzip),
                Some(Algorithm::Gzip)
            );
            assert_eq!(
                accepts("gzip,zstd").choose(Algorithm::Zstd),
                Some(Algorithm::Zstd)
            );
            assert_eq!(
                accepts("gzip").choose(Algorithm::Zstd),
                Some(Algorithm::Gzip)
            );
            assert_eq!(
                advertisement(&Compression::new(Algorithm::Gzip)),
                "gzip,zstd"
            );
            assert_eq!(advertisement(&Compression::default()), "zstd,gzip");
        }
        for algorithm in Algorithm::ALL {
            let accepted = accepts(algorithm.name());
            let expected = algorithm.is_available().then_some(algorithm);
            assert_eq!(accepted.choose(Algorithm::Zstd), expected);
            assert_eq!(accepted.choose(Algorithm::Gzip), expected);
            assert_eq!(
                Compression::new(algorithm).check().is_ok(),
                algorithm.is_available()
            );
            if let Err(err) = Compression::new(algorithm).check() {
                assert_eq!(err.kind(), ErrorKind::Unsupported);
                assert!(err.to_string().contains(algorithm.name()), "{err}");
            }
        }
        assert_eq!(Accepted::default().choose(Algorithm::Zstd), None);
    }

    #[test]
    fn round_trip_and_limits_for_every_algorithm_built() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        for algorithm in Algorithm::ALL.into_iter().filter(|a| a.is_available()) {
            let payload = Payload::from(vec![7u8; 100_000]);
            let packed = compress(algorithm, &payload, 1, false).expect("compressible");
            assert!(packed.len() < 1000);
            let bytes = packed.to_bytes();
            assert_eq!(Algorithm::of_message(&bytes), Some(algorithm));
            assert_eq!(decompress(&bytes, 100_000).unwrap().len(), 100_000);
            let err = decompress(&bytes, 99_999).unwrap_err();
            assert_eq!(err.code(), crate::Code::RESOURCE_EXHAUSTED, "{algorithm}");
            // Incompressible data is sent as it is unless forced.
            assert!(compress(algorithm, &Payload::from(noise.clone()), 1, false).is_none());
            assert!(compress(algorithm, &Payload::from(noise.clone()), 1, true).is_some());
        }
        assert_eq!(
            decompress(b"not zstd at all", 1000).unwrap_err().code(),
            crate::Code::INTERNAL
        );
    }

    #[test]
    fn a_format_not_built_is_unimplemented() {
        for (algorithm, magic) in [
            (Algorithm::Zstd, &[0x28, 0xb5, 0x2f, 0xfd, 0][..]),
            (Algorithm::Gzip, &[0x1f, 0x8b, 8, 0][..]),
        ] {
            let code = decompress(magic, 1000).unwrap_err().code();
            if algorithm.is_available() {
                assert_eq!(code, crate::Code::INTERNAL);
            } else {
                assert_eq!(code, crate::Code::UNIMPLEMENTED);
            }
        }
    }
}
