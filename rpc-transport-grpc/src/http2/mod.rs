//! HTTP/2 of our own (RFC 9113, HPACK RFC 7541), sans-IO, driven by the gRPC links from
//! their own task: no task of its own, no header maps, DATA payloads as slices of the
//! read buffer.
//!
//! - `frame`: reading and writing frames, checked as the RFC requires of each type.
//! - `hpack`: header compression (encoder, decoder, Huffman, tables).
//! - `conn`: one connection's state: settings, streams, both directions' flow control,
//!   header blocks joined and decoded, connection and stream errors.
//! - `fields`: the rules a decoded header block must keep (pseudo-header fields,
//!   connection-specific fields, field names and values).

pub(crate) mod conn;
pub(crate) mod fields;
pub(crate) mod frame;
pub(crate) mod hpack;
#[cfg(test)]
mod interop_tests;
