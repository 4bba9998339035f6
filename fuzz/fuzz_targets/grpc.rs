//! What a gRPC peer sends: header lists (metadata within a limit, status,
//! `grpc-timeout`, `grpc-message`, `-bin` values, content type and encoding), a
//! stream's 5-byte message prefixes in DATA chunks of any size, and raw connection
//! bytes fed to the server's own HTTP/2 (`rpc_transport_grpc`'s `http2`) in reads of
//! any split (HPACK alone has the `hpack` target). Never a panic; metadata read within
//! the limit; messages within their maximum; codecs round-trip; the same events
//! whatever the reads.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_core::frame;
use rpc_fuzz::Input;
use rpc_transport_grpc::fuzzing as grpc;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    match input.u8() % 3 {
        0 => headers(&mut input),
        1 => messages(&mut input),
        _ => blocks(&mut input),
    }
});

fn headers(input: &mut Input) {
    let limit = match input.u8() {
        0..=127 => frame::DEFAULT_MAX_METADATA_LEN,
        n => usize::from(n),
    };
    let map = grpc::header_map(input.rest());
    let read = grpc::read_headers(&map, limit);
    if let Some(metadata) = &read.metadata {
        assert!(frame::metadata_encoded_len(metadata) <= limit);
    }
    assert!(!(read.too_large && read.metadata.is_some()));
    if let Some(timeout) = read.timeout {
        // What a client would send for it parses back to at least as much time.
        let again = grpc::parse_timeout(grpc::format_timeout(timeout).as_bytes());
        assert!(
            again.is_some_and(|t| t >= timeout),
            "{timeout:?} -> {again:?}"
        );
    }
    // A status message and details as a server writes them come back the same.
    assert_eq!(
        grpc::percent_decode(grpc::percent_encode(&read.message).as_bytes()),
        read.message
    );
    assert_eq!(
        grpc::base64_decode(grpc::base64_encode(&read.details).as_bytes()).as_deref(),
        Some(&read.details[..])
    );
    let _ = (read.code, read.codec, read.encoding_known);
}

fn messages(input: &mut Input) {
    let max = usize::from(input.u16());
    let mut chunks = Vec::new();
    while !input.is_empty() {
        let len = usize::from(input.u8());
        chunks.push(input.bytes(len));
    }
    let (got, end) = grpc::messages(&chunks, max);
    let total: usize = chunks.iter().map(|c| c.len()).sum();
    let taken: usize = got.iter().map(|&(_, len)| 5 + len).sum();
    assert!(taken <= total);
    assert!(got.iter().all(|&(_, len)| len <= max));
    if end.is_ok() {
        assert_eq!(taken, total, "bytes left over without an error");
    }
}

fn blocks(input: &mut Input) {
    let mut pieces = Vec::new();
    while !input.is_empty() {
        let len = usize::from(input.u8());
        pieces.push(input.bytes(len));
    }
    let events = grpc::http2_server(&pieces);
    // However the reads split the bytes, the connection tells the same events and ends
    // the same way.
    let whole: Vec<u8> = pieces.concat();
    assert_eq!(grpc::http2_server(&[&whole]), events);
}
