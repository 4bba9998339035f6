//! The X.509 readers of `rpc-transport-tcp`'s TLS: the subject alternative names of
//! a peer's certificate (an mTLS client's identity) and the checks of a server's own
//! leaf certificate (validity, CA, extended key usage), on any bytes. Never a panic;
//! an expired certificate has a readable end before now; names within the input
//! (`rpc_transport_tcp::tls::fuzzing::certificate`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rpc_transport_tcp::tls::fuzzing::certificate(data);
});
