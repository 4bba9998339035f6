//! Our metadata and statuses as HTTP/2 headers and trailers, and back.
//!
//! - Entries become headers of the same name; `-bin` values go base64-encoded
//!   (unpadded), and are decoded from padded or unpadded base64, one value per
//!   comma-separated element.
//! - Headers that belong to HTTP/2 or to gRPC itself (`content-type`, `te`, every
//!   `grpc-*`) never become metadata, nor does the framework's reserved
//!   `rpc-accept-encoding`: on this wire the links translate it to and from gRPC's
//!   `grpc-accept-encoding` (see [`accepted`] and [`encoding`]).
//! - A text value that is not printable ASCII cannot be an HTTP/2 header value that
//!   every gRPC peer accepts; it is left out (with a debug log), as are headers whose
//!   names are not valid metadata keys.

use bytes::Bytes;
use rpc_core::{
    compress::Algorithm, frame::CallKey, status::quoted, Code, Metadata, MetadataValue,
};

use crate::codec;

/// Request header carrying a call key (`docs/grpc.md`): 28 bytes, client id (16),
/// call number (8) and attempt (4), big-endian, base64 as any `-bin` value.
pub(crate) const CALL_KEY_HEADER: &str = "rpc-call-key-bin";

/// The content type of gRPC requests and responses.
pub(crate) const CONTENT_TYPE: &str = "application/grpc";

/// A header block to read: a block our own HTTP/2 decoded (a list of fields, checked by `http2::fields`).
pub(crate) trait HeaderSource {
    /// The first value of the field `name` (lower case).
    fn first(&self, name: &str) -> Option<&[u8]>;
    /// Every regular field in order (pseudo-header fields left out). Names are bytes:
    /// most fields of a call are gRPC's own and are told apart as they are, and only
    /// those that become metadata are read as text.
    fn each(&self) -> impl Iterator<Item = (&[u8], &[u8])>;
}

#[cfg(test)]
impl HeaderSource for http::HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }

    fn each(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.iter()
            .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
    }
}

impl HeaderSource for [(Bytes, Bytes)] {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| &v[..])
    }

    fn each(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.iter()
            .filter(|(n, _)| n.first() != Some(&b':'))
            .map(|(n, v)| (&n[..], &v[..]))
    }
}

/// A header block to write: our own HTTP/2's block writer (and, in tests, an `http`
/// header map).
pub(crate) trait HeaderSink {
    /// Appends a field; `name` is a lower-case token, `value` a valid field value.
    fn put(&mut self, name: &str, value: &[u8]);
}

#[cfg(test)]
impl HeaderSink for http::HeaderMap {
    fn put(&mut self, name: &str, value: &[u8]) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            self.append(name, value);
        }
    }
}

/// Whether a header is the transport's own, never application metadata: HTTP/2's
/// connection headers, gRPC's protocol headers and this crate's own. Other `grpc-`
/// headers are metadata, as grpc-go passes them: `grpc-trace-bin` and `grpc-tags-bin`
/// of census-instrumented clients, `grpc-previous-rpc-attempts` of a retrying one
/// (gRFC A6), and gRPC's retry pushback, which goes in a failed call's status metadata,
/// where `rpc_core::retry::RetryLayer` reads it, on every wire.
fn is_reserved(name: &[u8]) -> bool {
    matches!(
        name,
        b"content-type"
            | b"te"
            | b"content-length"
            | b"connection"
            | b"host"
            | b"keep-alive"
            | b"transfer-encoding"
            | b"upgrade"
            | b"proxy-connection"
            | b"grpc-status"
            | b"grpc-message"
            | b"grpc-status-details-bin"
            | b"grpc-timeout"
            | b"grpc-encoding"
            | b"grpc-accept-encoding"
            | b"grpc-message-type"
            | b"rpc-accept-encoding"
    ) || name == CALL_KEY_HEADER.as_bytes()
}

/// What an application's metadata may not set on a request or response: the headers
/// of [`is_reserved`], and `grpc-previous-rpc-attempts`, which the client writes itself
/// from the call key's attempt (metadata forwarded from an incoming call would say
/// another call's count).
pub(crate) fn is_reserved_for_writing(name: &str) -> bool {
    is_reserved(name.as_bytes()) || name == PREVIOUS_ATTEMPTS
}

/// gRFC A6's count of a retried call's earlier attempts.
pub(crate) const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

/// The codec a request's `content-type` names, if it is gRPC's: `proto` for
/// `application/grpc` (with `;` parameters or not), else what follows
/// `application/grpc+`. `None`: not a gRPC content type.
pub(crate) fn grpc_codec<H: HeaderSource + ?Sized>(headers: &H) -> Option<&str> {
    let value = std::str::from_utf8(headers.first("content-type")?).ok()?;
    // Media types are case-insensitive (RFC 9110 8.3.1): `Application/gRPC` too.
    let rest = value
        .get(..CONTENT_TYPE.len())
        .filter(|head| head.eq_ignore_ascii_case(CONTENT_TYPE))
        .map(|_| &value[CONTENT_TYPE.len()..])?;
    if rest.is_empty() || rest.starts_with(';') {
        return Some("proto");
    }
    let codec = rest.strip_prefix('+')?;
    Some(codec.split(';').next().unwrap_or(codec).trim())
}

/// Why [`read_metadata`] stopped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum MetadataError {
    /// A `-bin` header whose value is not base64 (the message names it).
    Malformed(String),
    /// More than the limit, as this framework encodes metadata
    /// ([`frame::metadata_encoded_len`](rpc_core::frame::metadata_encoded_len)).
    TooLarge,
}

/// Appends the application metadata found in `headers` to `metadata`, stopping once
/// the metadata would exceed `limit` bytes as this framework encodes it: a `-bin` value
/// of many commas (each an entry with a copy of its key) must not cost more than the
/// limit allows before it is refused. A `-bin` header whose value is not base64 is an
/// error naming it: gRPC's implementations fail such a call with `INTERNAL` rather than
/// hand the application metadata with a value missing. Headers that are not metadata
/// (not ASCII, not a metadata key) are left out.
pub(crate) fn read_metadata<H: HeaderSource + ?Sized>(
    headers: &H,
    metadata: &mut Metadata,
    limit: usize,
) -> Result<(), MetadataError> {
    let mut size = rpc_core::frame::metadata_encoded_len(metadata);
    let mut entries = metadata.len();
    // The framework's wire's bound on entries too: each costs ~80 bytes decoded.
    let max_entries = rpc_core::frame::max_metadata_entries(limit);
    // An entry adds its key's length, the key, its value's length and the value; the
    // entry is counted before its value is decoded.
    let mut add = |n: usize, entry: bool| {
        size += n;
        entries += usize::from(entry);
        if size > limit || entries > max_entries {
            Err(MetadataError::TooLarge)
        } else {
            Ok(())
        }
    };
    for (key, value) in headers.each() {
        if is_reserved(key) {
            continue;
        }
        // Names were checked to be lower-case ASCII tokens (`http2::fields`).
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        if rpc_core::metadata::is_binary_key(key) {
            for part in value.split(|&b| b == b',') {
                let part = part.trim_ascii();
                add(1 + key.len() + 4, true)?;
                match codec::base64_decode(part) {
                    Some(bytes) => {
                        add(bytes.len(), false)?;
                        let _ = metadata.append(key.to_owned(), Bytes::from(bytes));
                    }
                    None => {
                        return Err(MetadataError::Malformed(format!(
                            "malformed binary metadata: {:?} is not base64",
                            quoted(key)
                        )))
                    }
                }
            }
        } else {
            // Visible ASCII (and tabs), as `HeaderValue::to_str` reads it.
            let visible = value
                .iter()
                .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
            match std::str::from_utf8(value).ok().filter(|_| visible) {
                Some(text) => {
                    add(1 + key.len() + 4 + text.len(), true)?;
                    if metadata.append(key.to_owned(), text.to_owned()).is_err() {
                        tracing::debug!(key, "dropped a header that is not a metadata key");
                    }
                }
                None => tracing::debug!(key, "dropped a header that is not ASCII"),
            }
        }
    }
    Ok(())
}

/// Appends `metadata` to `headers`. A text value HTTP/2 cannot carry (gRPC allows
/// printable ASCII; our own wires carry any UTF-8) is left out, and the first such key
/// is returned as an error, for the caller to fail the call or log it.
pub(crate) fn write_metadata(
    metadata: &Metadata,
    headers: &mut impl HeaderSink,
) -> Result<(), String> {
    let mut left_out = Ok(());
    for (key, value) in metadata.iter() {
        if is_reserved_for_writing(key) || !crate::http2::fields::valid_name(key.as_bytes()) {
            continue;
        }
        match value {
            MetadataValue::Binary(bytes) => {
                headers.put(key, codec::base64_encode(bytes).as_bytes());
            }
            MetadataValue::Text(text) => {
                if !printable(text) {
                    if left_out.is_ok() {
                        left_out = Err(unprintable(key));
                    }
                    continue;
                }
                headers.put(key, text.as_bytes());
            }
        }
    }
    left_out
}

/// Whether HTTP/2 carries `text` as gRPC's peers accept it: printable ASCII.
fn printable(text: &str) -> bool {
    text.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

fn unprintable(key: &str) -> String {
    format!(
        "metadata {key:?} has a value that is not printable ASCII, which gRPC cannot carry \
         (send text as ASCII, or bytes under a -bin key)"
    )
}

/// What [`write_metadata`] would refuse of `metadata`, without writing (or encoding)
/// anything: the first text value HTTP/2 cannot carry.
pub(crate) fn check_metadata(metadata: &Metadata) -> Result<(), String> {
    for (key, value) in metadata.iter() {
        if let MetadataValue::Text(text) = value {
            let written =
                !is_reserved_for_writing(key) && crate::http2::fields::valid_name(key.as_bytes());
            if written && !printable(text) {
                return Err(unprintable(key));
            }
        }
    }
    Ok(())
}

/// The `rpc-call-key-bin` header's value for `key`.
pub(crate) fn call_key_value(key: &CallKey) -> String {
    let mut raw = [0u8; rpc_core::frame::CALL_KEY_LEN];
    raw[..16].copy_from_slice(&key.client.to_be_bytes());
    raw[16..24].copy_from_slice(&key.call.to_be_bytes());
    raw[24..].copy_from_slice(&key.attempt.to_be_bytes());
    codec::base64_encode(&raw)
}

/// The call key a request carries, if it has a well-formed one.
pub(crate) fn read_call_key<H: HeaderSource + ?Sized>(headers: &H) -> Option<CallKey> {
    let raw = codec::base64_decode(headers.first(CALL_KEY_HEADER)?)?;
    if raw.len() != rpc_core::frame::CALL_KEY_LEN {
        return None;
    }
    Some(CallKey {
        client: u128::from_be_bytes(raw[..16].try_into().ok()?),
        call: u64::from_be_bytes(raw[16..24].try_into().ok()?),
        attempt: u32::from_be_bytes(raw[24..].try_into().ok()?),
    })
}

/// The `grpc-accept-encoding` this build sends: every algorithm it can decompress, in
/// its order of preference, then `identity`.
pub(crate) fn accept_encoding_value() -> &'static str {
    match (
        Algorithm::Zstd.is_available(),
        Algorithm::Gzip.is_available(),
    ) {
        (true, true) => "zstd,gzip,identity",
        (true, false) => "zstd,identity",
        (false, true) => "gzip,identity",
        (false, false) => "identity",
    }
}

/// The algorithms of a `grpc-accept-encoding` header that this build has, in the
/// peer's order, without repeats (`identity` and names the framework does not know,
/// such as `deflate`, are left out).
pub(crate) fn accepted<H: HeaderSource + ?Sized>(headers: &H) -> Vec<Algorithm> {
    available_in(
        headers
            .each()
            .filter(|(name, _)| *name == b"grpc-accept-encoding")
            .filter_map(|(_, v)| std::str::from_utf8(v).ok()),
    )
}

/// The algorithms that comma-separated lists of encoding names (`grpc-accept-encoding`
/// headers, or the core's `rpc-accept-encoding` values) name and this build has, in
/// their order, without repeats.
pub(crate) fn available_in<'a>(lists: impl Iterator<Item = &'a str>) -> Vec<Algorithm> {
    let mut accepted = Vec::new();
    for algorithm in lists
        .flat_map(|list| list.split(','))
        // An entry may carry parameters (`gzip;q=1.0`): the name is before them.
        .filter_map(|entry| Algorithm::from_name(entry.split(';').next().unwrap_or("").trim()))
        .filter(|a| a.is_available())
    {
        if !accepted.contains(&algorithm) {
            accepted.push(algorithm);
        }
    }
    accepted
}

/// A list of algorithms as the framework's `rpc-accept-encoding` metadata value.
pub(crate) fn accept_list(algorithms: &[Algorithm]) -> String {
    let names: Vec<&str> = algorithms.iter().map(|a| a.name()).collect();
    names.join(",")
}

/// The algorithm a `grpc-encoding` header names: `Ok(None)` for none or `identity`,
/// `Err(name)` for one this build cannot decompress.
pub(crate) fn encoding<H: HeaderSource + ?Sized>(headers: &H) -> Result<Option<Algorithm>, String> {
    let Some(value) = headers.first("grpc-encoding") else {
        return Ok(None);
    };
    let name = String::from_utf8_lossy(value).trim().to_owned();
    if name.eq_ignore_ascii_case("identity") {
        return Ok(None);
    }
    match Algorithm::from_name(&name) {
        Some(algorithm) if algorithm.is_available() => Ok(Some(algorithm)),
        _ => Err(name),
    }
}

/// What to compress with toward a peer that accepts `peer` when this side prefers
/// `preferred`: the core's own rule (`docs/wire.md` §6.10), so that a link can name
/// in its headers the algorithm the core is about to use.
pub(crate) fn choose(preferred: Option<Algorithm>, peer: &[Algorithm]) -> Option<Algorithm> {
    match preferred {
        Some(p) if peer.contains(&p) => Some(p),
        _ => peer.first().copied(),
    }
}

/// A message the core compressed, made fit for a call whose headers named `named` as
/// its `grpc-encoding`: kept compressed if it is in that algorithm, else sent
/// decompressed (flag 0). The core negotiates per connection and may start
/// compressing a call whose headers already left naming nothing, or another
/// algorithm. Returns the payload and its compressed flag.
pub(crate) fn fit_encoding(
    named: Option<Algorithm>,
    payload: rpc_core::Payload,
    max_len: usize,
) -> Result<(rpc_core::Payload, bool), rpc_core::Status> {
    let first = payload.segments().find(|s| !s.is_empty());
    if named.is_some() && first.and_then(|s| Algorithm::of_message(s)) == named {
        return Ok((payload, true));
    }
    let plain = rpc_core::compress::decompress(&payload.to_bytes(), max_len)?;
    Ok((plain.into(), false))
}

/// Most bytes of a `grpc-message` value, percent-encoded: a longer message is cut (at a
/// character) and ends in `…`. grpcio refuses header lists past 8 KiB at random and
/// past 16 KiB always (RESOURCE_EXHAUSTED instead of the call's code; from a review,
/// with 2,000 "é", 12 KB encoded); 4 KiB leaves room for the trailing metadata.
pub(crate) const MAX_MESSAGE_ENCODED: usize = 4096;

/// Writes a call's status into trailers (or a trailers-only response's headers):
/// `grpc-status`, then `grpc-message` (percent-encoded, at most
/// [`MAX_MESSAGE_ENCODED`] bytes) and `grpc-status-details-bin` when not empty, then
/// the trailing metadata. A code of `i32::MAX` or more, which gRPC's implementations
/// cannot parse (grpcio reports "Error parsing 'grpc-status'"), goes as `UNKNOWN`; the
/// message is kept.
pub(crate) fn write_status(
    code: Code,
    message: &str,
    details: &[u8],
    metadata: &Metadata,
    headers: &mut impl HeaderSink,
) {
    let number = match code.as_u32() {
        n if n >= i32::MAX as u32 => Code::UNKNOWN.as_u32(),
        n => n,
    };
    let mut digits = [0u8; 10];
    headers.put("grpc-status", decimal(number, &mut digits));
    if !message.is_empty() {
        // Percent-encoded: printable ASCII, a valid value.
        headers.put(
            "grpc-message",
            codec::percent_encode_within(message, MAX_MESSAGE_ENCODED).as_bytes(),
        );
    }
    if !details.is_empty() {
        // gRPC's peers read this header as a `google.rpc.Status` whose code must be
        // `grpc-status` (grpc-go fails the call INTERNAL, grpc-java and grpcio raise,
        // on a mismatch): the core's details are any bytes, and other bytes go only
        // over the framework's own wires.
        if status_code_of(details) == Some(i64::from(number)) {
            headers.put(
                "grpc-status-details-bin",
                codec::base64_encode(details).as_bytes(),
            );
        } else {
            tracing::debug!(
                code = number,
                "status details that are not a google.rpc.Status of the call's code: not \
                 sent as grpc-status-details-bin"
            );
        }
    }
    if let Err(message) = write_metadata(metadata, headers) {
        tracing::debug!("trailers: {message}; left out");
    }
}

/// `n` in decimal digits, written into `buf`.
pub(crate) fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The `code` (field 1) of `bytes` read as a `google.rpc.Status`, 0 when absent (as
/// protobuf reads it), or `None` if `bytes` is no protobuf message of that shape.
fn status_code_of(bytes: &[u8]) -> Option<i64> {
    /// A `google.rpc.Status` of which only the code is read (prost skips the rest).
    #[derive(Clone, PartialEq, ::rpc_core::codegen::prost::Message)]
    #[prost(prost_path = "::rpc_core::codegen::prost")]
    struct StatusCode {
        #[prost(int32, tag = "1")]
        code: i32,
    }
    use ::rpc_core::codegen::prost::Message as _;
    StatusCode::decode(bytes).ok().map(|s| i64::from(s.code))
}

/// A call's status as trailers (or a trailers-only response) carry it.
#[derive(Debug, PartialEq)]
pub(crate) struct TrailerStatus {
    /// `grpc-status`; `UNKNOWN` when missing or not a number.
    pub(crate) code: Code,
    /// `grpc-message`, percent-decoded.
    pub(crate) message: String,
    /// `grpc-status-details-bin`, base64-decoded.
    pub(crate) details: Bytes,
}

/// Reads `grpc-status`, `grpc-message` and `grpc-status-details-bin`.
pub(crate) fn read_status<H: HeaderSource + ?Sized>(headers: &H) -> TrailerStatus {
    let raw = headers.first("grpc-status");
    // A status code is a non-negative int32 in plain digits, as gRPC's implementations
    // read it (`+5`, or one past i32::MAX, is malformed there too).
    let code = raw
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<i32>().ok())
        .map(|v| v as u32);
    if let (Some(raw), None) = (raw, code) {
        // Present but not a status number: the server is broken, as grpc-go and
        // grpc-core say it (INTERNAL), not an unknown outcome.
        return TrailerStatus {
            code: Code::INTERNAL,
            message: format!(
                "malformed grpc-status {:?} from the server",
                quoted(&String::from_utf8_lossy(raw))
            ),
            details: Bytes::new(),
        };
    }
    let message = headers
        .first("grpc-message")
        .map(codec::percent_decode)
        .unwrap_or_default();
    let details = match headers.first("grpc-status-details-bin") {
        None => Bytes::new(),
        Some(value) => match codec::base64_decode(value) {
            Some(details) => Bytes::from(details),
            // As a malformed binary header elsewhere, and as grpc-go: not a status
            // whose details went missing without a word.
            None => {
                return TrailerStatus {
                    code: Code::INTERNAL,
                    message: "malformed grpc-status-details-bin from the server (not base64)"
                        .to_owned(),
                    details: Bytes::new(),
                }
            }
        },
    };
    match code {
        Some(code) => TrailerStatus {
            code: Code::from_u32(code),
            message,
            details,
        },
        None => TrailerStatus {
            code: Code::UNKNOWN,
            message: if message.is_empty() {
                "the response ended without grpc-status".to_owned()
            } else {
                message
            },
            details,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderName, HeaderValue};

    /// `grpc-status-details-bin` goes only when it is a `google.rpc.Status` of the
    /// call's code: gRPC's peers fail or raise on a mismatch (from a review against
    /// grpc-go, grpc-java and grpcio).
    #[test]
    fn status_details_go_only_as_a_status_of_the_calls_code() {
        // google.rpc.Status { code: 5, message: "x" }
        let status = [0x08, 0x05, 0x12, 0x01, b'x'];
        let written = |code: Code, details: &[u8]| {
            let mut headers = HeaderMap::new();
            write_status(code, "m", details, &Metadata::new(), &mut headers);
            headers.get("grpc-status-details-bin").is_some()
        };
        assert!(written(Code::NOT_FOUND, &status));
        assert!(!written(Code::INTERNAL, &status), "another code");
        // An ErrorInfo alone (reason in field 1, a string): code 0 as a Status.
        assert!(!written(Code::NOT_FOUND, &[0x0a, 0x01, b'r']));
        assert!(!written(Code::NOT_FOUND, b"\xff\xff not protobuf"));
        assert_eq!(
            status_code_of(&[0x08, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Some(-1)
        );
        assert_eq!(status_code_of(&[]), Some(0));
        assert_eq!(status_code_of(&[0x0a, 0x05, b'a']), None, "truncated");
    }

    /// `content-type` is compared as a media type (case-insensitive), and
    /// `grpc-accept-encoding` entries may carry parameters.
    #[test]
    fn content_types_in_any_case_and_encodings_with_parameters() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("Application/gRPC+proto"),
        );
        assert_eq!(grpc_codec(&headers), Some("proto"));
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc-web"),
        );
        assert_eq!(grpc_codec(&headers), None);
        let accepted = available_in(["identity;q=0.5, gzip;q=1.0"].into_iter());
        assert!(
            accepted.contains(&Algorithm::from_name("gzip").unwrap()),
            "{accepted:?}"
        );
    }

    #[test]
    fn metadata_round_trips_through_headers() {
        let mut metadata = Metadata::new();
        metadata.append("x-user", "alice").unwrap();
        metadata.append("x-user", "bob").unwrap();
        metadata
            .append("trace-bin", Bytes::from_static(&[0, 1, 2, 255]))
            .unwrap();
        metadata.append("rpc-accept-encoding", "zstd").unwrap();
        metadata.append("x-utf8", "héllo").unwrap();
        let mut headers = HeaderMap::new();
        assert!(
            write_metadata(&metadata, &mut headers).is_err(),
            "x-utf8 is left out"
        );
        assert_eq!(headers.get("trace-bin").unwrap(), "AAEC/w");
        assert!(headers.get("rpc-accept-encoding").is_none());
        assert!(headers.get("x-utf8").is_none());
        headers.insert("content-type", HeaderValue::from_static(CONTENT_TYPE));
        headers.insert("grpc-timeout", HeaderValue::from_static("1S"));
        headers.append("multi-bin", HeaderValue::from_static("AQ==, Ag"));
        let mut back = Metadata::new();
        read_metadata(&headers, &mut back, usize::MAX).unwrap();
        let users: Vec<_> = back.get_all("x-user").filter_map(|v| v.as_str()).collect();
        assert_eq!(users, ["alice", "bob"]);
        assert_eq!(back.get("trace-bin").unwrap().as_bytes(), &[0, 1, 2, 255]);
        let multi: Vec<_> = back
            .get_all("multi-bin")
            .map(|v| v.as_bytes().to_vec())
            .collect();
        assert_eq!(multi, [vec![1], vec![2]]);
        assert!(back.get("content-type").is_none() && back.get("grpc-timeout").is_none());
    }

    /// gRPC's protocol headers are not metadata, but other `grpc-` headers are, as
    /// grpc-go passes them (from a review: every `grpc-` header was dropped, so a
    /// census client's `grpc-trace-bin` and a retrying one's
    /// `grpc-previous-rpc-attempts` never reached a handler). An application cannot set
    /// `grpc-previous-rpc-attempts`: the client writes it from the call key.
    #[test]
    fn other_grpc_headers_are_metadata_but_the_protocols_own_are_not() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("grpc-trace-bin", "AAEC"),
            ("grpc-tags-bin", "AQ"),
            ("grpc-previous-rpc-attempts", "2"),
            ("grpc-timeout", "1S"),
            ("grpc-encoding", "gzip"),
            ("grpc-accept-encoding", "gzip"),
            ("grpc-message-type", "x"),
            ("grpc-status", "0"),
            ("grpc-message", "m"),
            ("te", "trailers"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let mut metadata = Metadata::new();
        read_metadata(&headers, &mut metadata, usize::MAX).unwrap();
        let mut keys: Vec<&str> = metadata.iter().map(|(key, _)| key).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "grpc-previous-rpc-attempts",
                "grpc-tags-bin",
                "grpc-trace-bin"
            ]
        );
        let mut written = HeaderMap::new();
        write_metadata(&metadata, &mut written).unwrap();
        assert!(written.get("grpc-trace-bin").is_some());
        assert!(written.get("grpc-tags-bin").is_some());
        assert!(written.get(PREVIOUS_ATTEMPTS).is_none(), "the client's own");
    }

    /// A `grpc-status-details-bin` that is not base64 fails the call `INTERNAL`, as
    /// any malformed binary header does and as grpc-go says it, rather than leaving the
    /// status without its details (from a review).
    #[test]
    fn malformed_status_details_are_internal() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static("not base64!"),
        );
        let status = read_status(&trailers);
        assert_eq!(status.code, Code::INTERNAL);
        assert!(
            status.message.contains("grpc-status-details-bin"),
            "{}",
            status.message
        );
        trailers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_static("CAUSAXg"),
        );
        let status = read_status(&trailers);
        assert_eq!(status.code, Code::NOT_FOUND);
        assert_eq!(&status.details[..], [0x08, 0x05, 0x12, 0x01, b'x']);
    }

    #[test]
    fn a_binary_header_that_is_not_base64_is_an_error() {
        for value in ["not base64!", "AQ==, %%", "A"] {
            let mut headers = HeaderMap::new();
            headers.insert("x-user", HeaderValue::from_static("alice"));
            headers.insert("trace-bin", HeaderValue::from_static(value));
            let error = read_metadata(&headers, &mut Metadata::new(), usize::MAX).unwrap_err();
            let MetadataError::Malformed(error) = error else {
                panic!("{value}: {error:?}");
            };
            assert!(
                error.contains("\"trace-bin\" is not base64"),
                "{value}: {error}"
            );
        }
    }

    /// A `-bin` value of many commas is many entries, each with a copy of its key:
    /// reading stops at the metadata limit, not after making them all.
    #[test]
    fn metadata_is_read_only_up_to_the_limit() {
        let key = format!("{}-bin", "k".repeat(200));
        let mut headers = HeaderMap::new();
        let commas = HeaderValue::from_str(&",".repeat(4_000)).unwrap();
        headers.insert(HeaderName::from_bytes(key.as_bytes()).unwrap(), commas);
        let mut metadata = Metadata::new();
        let limit = 16 * 1024;
        assert_eq!(
            read_metadata(&headers, &mut metadata, limit),
            Err(MetadataError::TooLarge)
        );
        let made = metadata.len();
        assert!(
            made <= limit / key.len(),
            "{made} entries made for a limit of {limit} bytes"
        );
        // Tiny entries within the byte limit are bounded in number too.
        let mut headers = HeaderMap::new();
        for _ in 0..600 {
            headers.append("a", HeaderValue::from_static(""));
        }
        assert_eq!(
            read_metadata(&headers, &mut Metadata::new(), limit),
            Err(MetadataError::TooLarge)
        );
        let mut fewer = HeaderMap::new();
        for _ in 0..500 {
            fewer.append("a", HeaderValue::from_static(""));
        }
        read_metadata(&fewer, &mut Metadata::new(), limit).unwrap();
        // At the limit exactly, it is read.
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("12345"));
        headers.insert("x-b-bin", HeaderValue::from_static("AQID"));
        let exact = (1 + 3 + 4 + 5) + (1 + 7 + 4 + 3);
        let mut metadata = Metadata::new();
        read_metadata(&headers, &mut metadata, exact).unwrap();
        assert_eq!(metadata.len(), 2);
        assert_eq!(
            read_metadata(&headers, &mut Metadata::new(), exact - 1),
            Err(MetadataError::TooLarge)
        );
    }

    #[test]
    fn status_numbers_grpc_cannot_parse_are_neither_sent_nor_taken() {
        let mut headers = HeaderMap::new();
        write_status(
            Code::from_u32(u32::MAX),
            "odd",
            &[],
            &Metadata::new(),
            &mut headers,
        );
        assert_eq!(headers.get("grpc-status").unwrap(), "2");
        assert_eq!(read_status(&headers).message, "odd");
        // i32::MAX itself too: grpcio refuses it (from a review).
        let mut headers = HeaderMap::new();
        let max = Code::from_u32(i32::MAX as u32);
        write_status(max, "", &[], &Metadata::new(), &mut headers);
        assert_eq!(headers.get("grpc-status").unwrap(), "2");
        let mut headers = HeaderMap::new();
        write_status(
            Code::from_u32(1000),
            "",
            &[],
            &Metadata::new(),
            &mut headers,
        );
        assert_eq!(headers.get("grpc-status").unwrap(), "1000");
        // As gRPC's implementations read it: a non-negative int32 in plain digits.
        for bad in ["x", "-1", "99999999999", "", "+5", "2147483648", " 5"] {
            let mut headers = HeaderMap::new();
            headers.insert("grpc-status", HeaderValue::from_str(bad).unwrap());
            let status = read_status(&headers);
            assert_eq!(status.code, Code::INTERNAL, "{bad:?}");
            assert!(status.message.contains("malformed grpc-status"), "{bad:?}");
        }
    }

    /// A long message is cut to fit what gRPC clients take (grpcio turned a 12 KB
    /// `grpc-message` into RESOURCE_EXHAUSTED; from a review), at a character, with
    /// an ellipsis; a short one goes whole.
    #[test]
    fn long_status_messages_are_cut_to_fit() {
        for message in [
            "é".repeat(3000),
            "x".repeat(9000),
            format!("{}é", "a".repeat(4094)),
        ] {
            let mut headers = HeaderMap::new();
            write_status(
                Code::FAILED_PRECONDITION,
                &message,
                &[],
                &Metadata::new(),
                &mut headers,
            );
            let sent = headers.get("grpc-message").unwrap();
            assert!(sent.len() <= MAX_MESSAGE_ENCODED, "{}", sent.len());
            assert!(sent.len() > MAX_MESSAGE_ENCODED - 12, "{}", sent.len());
            let read = read_status(&headers).message;
            let kept = read.strip_suffix('\u{2026}').expect("ends in an ellipsis");
            assert!(message.starts_with(kept), "{kept:?}");
        }
        let mut headers = HeaderMap::new();
        let short = "not now: é";
        write_status(
            Code::FAILED_PRECONDITION,
            short,
            &[],
            &Metadata::new(),
            &mut headers,
        );
        assert_eq!(read_status(&headers).message, short);
    }

    #[test]
    fn status_round_trips_through_trailers() {
        let mut trailers = HeaderMap::new();
        write_status(
            Code::NOT_FOUND,
            "no such user: ünïcode\n",
            b"\x08\x05",
            &Metadata::new(),
            &mut trailers,
        );
        assert_eq!(trailers.get("grpc-status").unwrap(), "5");
        let status = read_status(&trailers);
        assert_eq!(status.code, Code::NOT_FOUND);
        assert_eq!(status.message, "no such user: ünïcode\n");
        assert_eq!(status.details, &b"\x08\x05"[..]);
        assert_eq!(read_status(&HeaderMap::new()).code, Code::UNKNOWN);
    }

    #[test]
    fn call_keys_round_trip() {
        let key = CallKey {
            client: u128::MAX - 5,
            call: 42,
            attempt: 3,
        };
        let mut headers = HeaderMap::new();
        headers.insert(
            CALL_KEY_HEADER,
            HeaderValue::try_from(call_key_value(&key)).unwrap(),
        );
        assert_eq!(read_call_key(&headers), Some(key));
        headers.insert(CALL_KEY_HEADER, HeaderValue::from_static("AAAA"));
        assert_eq!(read_call_key(&headers), None);
    }
}
