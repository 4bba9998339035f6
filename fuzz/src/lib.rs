//! Helpers shared by the fuzz targets in `fuzz_targets/`: reading structured values off
//! the fuzzer's bytes, and polling futures and links without a runtime.

use std::task::{Context, Waker};

/// Reads values off the front of the fuzzer's input; past the end every read gives
/// zeros, so a target never has to handle a short input itself.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Wraps the fuzzer's input.
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// One byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// A big-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    /// A big-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A big-endian u64.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }

    /// Up to `n` bytes (fewer at the end).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// Everything left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// A context whose waker does nothing: for polling sans-IO code and in-memory streams
/// that are always ready.
pub fn noop_context() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// Splits a byte stream of TCP-style frames (4-byte big-endian length, then the frame)
/// into frames; bytes that do not make a whole frame end up as one last frame. Seeds
/// written as the wire document's TCP examples are thus frames.
pub fn split_prefixed(mut data: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while data.len() >= 4 {
        let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if data.len() - 4 < len {
            break;
        }
        frames.push(&data[4..4 + len]);
        data = &data[4 + len..];
    }
    if !data.is_empty() {
        frames.push(data);
    }
    frames
}
