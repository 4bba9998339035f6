//! The TLS record layer (`rpc-transport-tcp`'s `TlsStream` after the handshake): the
//! records a peer sends, sealed with the right keys or not, with key updates, alerts
//! and post-handshake messages, read in pieces of any size while the stream writes.
//! Never a panic; never more plaintext than was sealed as data; every script ends
//! cleanly or with an error, never a hang; buffers within bounds
//! (`rpc_transport_tcp::tls::fuzzing`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rpc_transport_tcp::tls::fuzzing::records(data);
});
