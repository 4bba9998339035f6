//! HTTP/2 of our own (RFC 9113, HPACK RFC 7541), sans-IO: the frame layer, header
//! compression and one connection's state, driven by the gRPC links from their own task
//! (no task of its own, no header maps, DATA payloads as slices of the read buffer).
//!
//! Being built (issue 13): not yet used by the links, which still run on the `h2`
//! crate. `docs/grpc.md` will say when it replaces it.

#![allow(dead_code)]

pub(crate) mod hpack;
