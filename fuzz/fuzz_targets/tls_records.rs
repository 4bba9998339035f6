//! The TLS record layer (`rpc-transport-tcp`'s `TlsStream` after the handshake), as a
//! client or a server: the records a peer sends, sealed with the right keys or not
//! (TLS 1.3 inner plaintexts of any type, 0 too, with or without padding; plaintexts
//! past 2^14), with key updates, alerts and post-handshake messages, read in pieces of
//! any size while the stream writes. Never a panic; never more plaintext than was
//! sealed as data; every script ends cleanly or with an error, never a hang, and every
//! read after an error fails the same way; every record the stream sends opens, and
//! nothing follows its fatal alert; buffers within bounds
//! (`rpc_transport_tcp::tls::fuzzing`, whose docs give the input's layout).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rpc_transport_tcp::tls::fuzzing::records(data);
});
