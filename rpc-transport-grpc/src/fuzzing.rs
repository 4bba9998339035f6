//! Entry points for the fuzz targets in `fuzz/` to the crate's private decoders of
//! peer bytes: the headers and trailers a peer sends (metadata, status, timeout,
//! encodings), the 5-byte message prefix, HPACK, and the server's HTTP/2 connection
//! over raw bytes. Compiled only with `--cfg fuzzing` (which `fuzz/run` sets) and
//! in tests; not part of the API.

use std::time::Duration;

use bytes::Bytes;
use rpc_core::{Code, Metadata};

use crate::{codec, headers};

/// Reads `data` as a header list after HPACK: pairs of a name (a length byte, then the
/// name) and a value (a length byte, then the value); a pair HTTP/2 could not carry (a
/// block the link's rules refuse: upper case, separators, control characters) is
/// skipped.
pub fn header_map(data: &[u8]) -> Vec<(Bytes, Bytes)> {
    let mut fields = Vec::new();
    let mut rest = data;
    let take = |rest: &mut &[u8]| -> Option<Vec<u8>> {
        let (&len, tail) = rest.split_first()?;
        let len = usize::from(len).min(tail.len());
        let (taken, tail) = tail.split_at(len);
        *rest = tail;
        Some(taken.to_vec())
    };
    while let (Some(name), Some(value)) = (take(&mut rest), take(&mut rest)) {
        let field = (Bytes::from(name), Bytes::from(value));
        if crate::http2::fields::trailers(std::slice::from_ref(&field)).is_ok() {
            fields.push(field);
        }
    }
    fields
}

/// What a server or client reads of a peer's headers.
#[derive(Debug)]
pub struct HeadersRead {
    /// The metadata read within `limit`, or `None` where reading stopped.
    pub metadata: Option<Metadata>,
    /// Reading stopped at the limit (not a malformed value).
    pub too_large: bool,
    /// `grpc-status`, as a client reads it.
    pub code: Code,
    /// `grpc-message`, decoded.
    pub message: String,
    /// `grpc-status-details-bin`, decoded.
    pub details: Bytes,
    /// `grpc-timeout`, if present and well-formed.
    pub timeout: Option<Duration>,
    /// The codec of a gRPC `content-type`.
    pub codec: Option<String>,
    /// `grpc-encoding` is one this build has (`Ok`), or the error for it.
    pub encoding_known: bool,
}

/// Reads `headers` as the links do, the metadata within `limit` bytes (as the core
/// encodes it).
pub fn read_headers(headers: &[(Bytes, Bytes)], limit: usize) -> HeadersRead {
    let mut metadata = Metadata::new();
    let (metadata, too_large) = match headers::read_metadata(headers, &mut metadata, limit) {
        Ok(()) => (Some(metadata), false),
        Err(headers::MetadataError::TooLarge) => (None, true),
        Err(headers::MetadataError::Malformed(_)) => (None, false),
    };
    let status = headers::read_status(headers);
    HeadersRead {
        metadata,
        too_large,
        code: status.code,
        message: status.message,
        details: status.details,
        timeout: crate::http2::fields::get(headers, "grpc-timeout")
            .and_then(|v| codec::parse_timeout(v)),
        codec: headers::grpc_codec(headers).map(str::to_owned),
        encoding_known: headers::encoding(headers).is_ok(),
    }
}

/// `grpc-timeout`'s parser.
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    codec::parse_timeout(value)
}

/// `grpc-timeout`'s formatter (what a client sends for `timeout`).
pub fn format_timeout(timeout: Duration) -> String {
    codec::format_timeout(timeout)
}

/// `grpc-message`'s decoder.
pub fn percent_decode(value: &[u8]) -> String {
    codec::percent_decode(value)
}

/// `grpc-message`'s encoder.
pub fn percent_encode(message: &str) -> String {
    codec::percent_encode(message)
}

/// `-bin` values' decoder (padded or not).
pub fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    codec::base64_decode(text)
}

/// `-bin` values' encoder.
pub fn base64_encode(data: &[u8]) -> String {
    codec::base64_encode(data)
}

/// A stream's messages, decoded from DATA chunks: each message's compressed flag and
/// length, then `Err` with the reason the stream was refused, if it was. The decoder
/// assembles messages of `max / 4` bytes and more once 16 bytes of one came (as it
/// does 2 MiB ones once 256 KiB came), within a bound of `max / 2` reserved bytes; each
/// message is checked against a plain reading of the chunks put together (panics if
/// the bytes, the flag or the outcome differ).
pub fn messages(chunks: &[&[u8]], max: usize) -> (Vec<(bool, usize)>, Result<(), String>) {
    // A bound of half the limit: messages longer than that stay in their chunks.
    let reservations = codec::Reservations::new(max / 8);
    let mut decoder = codec::MessageDecoder::with_thresholds(max, (max / 4).max(1), 16);
    let whole: Vec<u8> = chunks.concat();
    let mut at = 0;
    let mut got = Vec::new();
    let mut check = |message: &codec::Message| {
        let prefix = &whole[at..at + codec::PREFIX_LEN];
        let len = codec::announced_len(prefix);
        let body = &whole[at + codec::PREFIX_LEN..at + codec::PREFIX_LEN + len];
        assert_eq!(
            message.compressed,
            prefix[0] == 1,
            "flag of the message at {at}"
        );
        assert!(message.data == *body, "bytes of the message at {at}");
        at += codec::PREFIX_LEN + len;
    };
    for chunk in chunks {
        decoder.push(Bytes::copy_from_slice(chunk), &reservations);
        loop {
            match decoder.next() {
                Ok(Some(message)) => {
                    check(&message);
                    got.push((message.compressed, message.data.len()));
                }
                Ok(None) => break,
                Err(err) => return (got, Err(format!("{err:?}"))),
            }
        }
    }
    let end = decoder.finish().map_err(|err| format!("{err:?}"));
    // Whole messages all came out; what is left is a message cut off, or nothing.
    let left = &whole[at..];
    if let Some(prefix) = left.get(..codec::PREFIX_LEN) {
        let len = codec::announced_len(prefix);
        assert!(
            left.len() < codec::PREFIX_LEN + len,
            "a whole message not taken at {at}"
        );
    }
    assert_eq!(end.is_err(), !left.is_empty(), "{} bytes left", left.len());
    (got, end)
}

/// A server's HTTP/2 connection (`crate::http2::conn`) fed `pieces` as reads would
/// bring them, after a client preface and an empty SETTINGS frame: every event it
/// reported and how it ended, written out, so that a caller can check that the split
/// of the bytes into reads changes nothing. Also checks that what the connection
/// queued to write stays within what the input could make it queue.
pub fn http2_server(pieces: &[&[u8]]) -> String {
    use crate::http2::conn::{Config, Connection, Role};
    use std::fmt::Write as _;
    let mut conn = Connection::new(Role::Server, Config::default(), None);
    let mut input = bytes::BytesMut::new();
    input.extend_from_slice(crate::http2::frame::PREFACE);
    input.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut log = String::new();
    let mut fed = 0;
    let step = |conn: &mut Connection, input: &mut bytes::BytesMut, log: &mut String| loop {
        match conn.next_event(input) {
            Ok(Some(event)) => {
                let _ = writeln!(log, "{event:?}");
            }
            Ok(None) => return true,
            Err(err) => {
                let _ = writeln!(log, "error {err:?}");
                return false;
            }
        }
    };
    for piece in pieces {
        input.extend_from_slice(piece);
        fed += piece.len();
        if !step(&mut conn, &mut input, &mut log) {
            break;
        }
    }
    // Answers (SETTINGS and PING acknowledgements, resets, WINDOW_UPDATEs) are at most a
    // few times what came in, plus the connection's own opening.
    assert!(
        conn.out_len() <= 1024 + 4 * (fed + 24 + 9),
        "{} bytes queued for {fed} read",
        conn.out_len()
    );
    log
}

/// HPACK's decoder (our HTTP/2's, `http2::hpack`) over `data` read as a connection's
/// header blocks: a byte for our SETTINGS_HEADER_TABLE_SIZE (times 32), a byte for the
/// list limit (times 16), then blocks, each a length byte and that many bytes (fewer
/// at the end). One decoder reads them in order, as a connection would, until a
/// connection error, beside a second decoder without the list limit. Checks: no panic;
/// the fields handed out for a block stay within the list limit, and are the first of
/// what the unlimited decoder reads (so the tables stay in step past the limit), the
/// errors the same but for the limit's; Huffman coding of every string read
/// round-trips (and decodes into half the room as its first half); and the fields read, encoded again by our encoder (with the peer's
/// setting and each kind of indexing) and decoded by a fresh decoder, come back the
/// same.
pub fn hpack(data: &[u8]) {
    use crate::http2::hpack::{huffman, DecodeError, Decoder, Encoder, Indexing};

    let (&table, rest) = data.split_first().unwrap_or((&0, &[]));
    let (&limit, mut rest) = rest.split_first().unwrap_or((&0, &[]));
    let table_size = usize::from(table) * 32;
    let limit = usize::from(limit) * 16;
    let mut decoder = Decoder::new(table_size);
    let mut unlimited = Decoder::new(table_size);
    let mut lists: Vec<Vec<(Bytes, Bytes)>> = Vec::new();
    while let Some((&len, tail)) = rest.split_first() {
        let (block, tail) = tail.split_at(usize::from(len).min(tail.len()));
        rest = tail;
        let block = Bytes::copy_from_slice(block);
        let mut list = Vec::new();
        let mut size = 0usize;
        let result = decoder.decode(&block, limit, |name, value| {
            size += name.len() + value.len() + 32;
            list.push((name, value));
        });
        let mut all = Vec::new();
        let all_result = unlimited.decode(&block, usize::MAX, |name, value| {
            all.push((name, value));
        });
        assert!(size <= limit, "{size} bytes handed out, limit {limit}");
        assert!(list.len() <= all.len() && list[..] == all[..list.len()]);
        match (result, all_result) {
            (Ok(()), Ok(())) => assert_eq!(list.len(), all.len()),
            (Err(DecodeError::ListTooLarge), Ok(())) => {
                let total: usize = all.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
                assert!(total > limit);
            }
            (result, all_result) => assert_eq!(result, all_result),
        }
        lists.push(list);
        if result.is_err_and(|err| err.is_connection_error()) {
            break;
        }
    }
    for (name, value) in lists.iter().flatten() {
        for text in [name, value] {
            let mut code = bytes::BytesMut::new();
            huffman::encode(text, &mut code);
            assert_eq!(code.len(), huffman::encoded_len(text));
            let mut back = Vec::new();
            assert_eq!(huffman::decode(&code, usize::MAX, &mut back), Ok(true));
            assert_eq!(back, &text[..]);
            // Decoded into half the room: the first half, and not whole.
            let half = text.len() / 2;
            let mut part = Vec::new();
            let whole = huffman::decode(&code, half, &mut part);
            assert_eq!((whole, &part[..]), (Ok(half == text.len()), &text[..half]));
        }
    }
    let mut encoder = Encoder::new();
    encoder.set_max_table_size(u32::from(table) * 32);
    let mut again = Decoder::new(4096);
    for (n, list) in lists.iter().enumerate() {
        let mut block = bytes::BytesMut::new();
        encoder.begin_block(&mut block);
        for (i, (name, value)) in list.iter().enumerate() {
            let indexing = match (n + i) % 4 {
                0 | 1 => Indexing::Incremental,
                2 => Indexing::No,
                _ => Indexing::Never,
            };
            encoder.encode(name, value, indexing, &mut block);
        }
        let mut got = Vec::new();
        let result = again.decode(&block.freeze(), usize::MAX, |name, value| {
            got.push((name, value));
        });
        assert_eq!(result, Ok(()));
        assert_eq!(&got, list);
    }
}
