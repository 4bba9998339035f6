//! HPACK (RFC 7541), our own HTTP/2's header compression: header blocks read in order
//! by one decoder, with a table size and a small list limit from the input. Never a
//! panic; fields handed out within the list limit; Huffman coding of what was read
//! round-trips; what was read, encoded again by our encoder and decoded by a fresh
//! decoder, comes back the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_transport_grpc::fuzzing as grpc;

fuzz_target!(|data: &[u8]| grpc::hpack(data));
