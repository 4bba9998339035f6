//! The TCP/Unix framing (`docs/wire.md` §1.1): a byte stream of frames, each after its
//! 4-byte big-endian length, read by `StreamLink` in pieces of any size. Never a
//! panic; the frames come out exactly as a reference parser cuts them; a length over
//! the maximum is an error; a stream cut in a frame is an error, never a hang.

#![no_main]

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use libfuzzer_sys::fuzz_target;
use rpc_core::link::Link;
use rpc_fuzz::{noop_context, Input};
use rpc_transport_tcp::StreamLink;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A peer that sends `data` in pieces of the sizes given (cycled), sometimes making
/// the reader wait, and swallows what it is sent.
struct Peer {
    data: Vec<u8>,
    at: usize,
    pieces: Vec<u8>,
    next: usize,
    waited: bool,
}

impl AsyncRead for Peer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let piece = self.pieces.get(self.next).copied().unwrap_or(255);
        let piece = if self.waited { piece.max(1) } else { piece };
        self.next = (self.next + 1) % self.pieces.len().max(1);
        if piece == 0 && !self.waited {
            // Nothing yet (a real socket would wake the reader later); the next poll
            // gets data.
            self.waited = true;
            return Poll::Pending;
        }
        self.waited = false;
        let n = usize::from(piece)
            .min(buf.remaining())
            .min(self.data.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Peer {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// What a correct reader yields: the frames, then whether the stream ended cleanly
/// (`Ok`) or with an error (a length over `max`, a cut frame, or a first frame that is
/// the soft RDMA provider's HELLO: type 1 and the magic `RPCSOFT1`, another
/// protocol's first bytes).
fn reference(mut data: &[u8], max: usize) -> (Vec<&[u8]>, Result<(), ()>) {
    let mut frames = Vec::new();
    loop {
        if data.is_empty() {
            return (frames, Ok(()));
        }
        if data.len() < 4 {
            return (frames, Err(()));
        }
        let len = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if len > max || data.len() - 4 < len {
            return (frames, Err(()));
        }
        if frames.is_empty() && len >= 9 && data[4] == 1 && &data[5..13] == b"RPCSOFT1" {
            return (frames, Err(()));
        }
        frames.push(&data[4..4 + len]);
        data = &data[4 + len..];
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let max = match input.u8() {
        0..=127 => rpc_core::link::DEFAULT_MAX_FRAME_LEN,
        n => usize::from(n),
    };
    let count = usize::from(input.u8() % 17);
    let pieces = input.bytes(count).to_vec();
    let stream = input.rest();
    let mut link = StreamLink::new(
        Peer {
            data: stream.to_vec(),
            at: 0,
            pieces,
            next: 0,
            waited: false,
        },
        "fuzz".into(),
        max,
    );
    let (expected, end) = reference(stream, max);
    let mut cx = noop_context();
    let mut got = Vec::new();
    // The peer makes the reader wait at most once per byte it sends.
    let mut waits = 0;
    let outcome = loop {
        match link.poll_recv(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => {
                assert!(frame.len() <= max);
                got.push(frame);
            }
            Poll::Ready(Some(Err(_))) => break Err(()),
            Poll::Ready(None) => break Ok(()),
            Poll::Pending => {
                waits += 1;
                assert!(waits <= stream.len() + 1, "reader stuck");
            }
        }
    };
    assert_eq!(got.len(), expected.len());
    for (a, b) in got.iter().zip(&expected) {
        assert_eq!(&a[..], *b);
    }
    assert_eq!(outcome, end);
});
