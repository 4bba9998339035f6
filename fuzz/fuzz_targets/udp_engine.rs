//! The UDP association engine (sans-IO, `rpc-transport-udp`'s `engine`), fed an
//! arbitrary sequence of events on a fake clock: datagrams of an honest peer's engine
//! (delivered, lost, copied, reordered or corrupted), datagrams made up outright,
//! frames to send either way, and time passing. Never a panic; every datagram sent
//! fits and decodes; reassembly memory stays within its budget and is all given back.

#![no_main]

use std::{collections::VecDeque, time::Duration};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rpc_fuzz::Input;
use rpc_transport_udp::fuzzing::Association;
use tokio::time::Instant;

const MAX_MESSAGE: usize = 64 * 1024;
const REASSEMBLY: usize = 160 * 1024;

/// A frame header of `kind` (REQUEST, RESPONSE, DATA, ...) with `flags` and `id`:
/// enough for the engine's own look at frames (streams, responses to requests).
fn frame(kind: u8, flags: u16, id: u64, len: usize) -> (Vec<u8>, Bytes) {
    let mut header = vec![1, kind];
    header.extend_from_slice(&flags.to_be_bytes());
    header.extend_from_slice(&id.to_be_bytes());
    let payload = Bytes::from((0..len).map(|i| i as u8).collect::<Vec<u8>>());
    (header, payload)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let max_datagram = 64 + usize::from(input.u16() % 1500);
    let mut a = Association::new(max_datagram, MAX_MESSAGE, REASSEMBLY);
    let mut b = Association::new(max_datagram, MAX_MESSAGE, REASSEMBLY);
    let mut now = Instant::now();
    let mut held: VecDeque<Bytes> = VecDeque::new();
    let mut steps = 0;
    while !input.is_empty() && steps < 512 {
        steps += 1;
        match input.u8() % 10 {
            0 => {
                // A datagram made up by the fuzzer.
                let len = usize::from(input.u16() % 2048);
                a.on_datagram(Bytes::copy_from_slice(input.bytes(len)), now);
            }
            op @ (1 | 2) => {
                let kind = [1, 2, 3, 4, 5, 7, 8, 9, 10][usize::from(input.u8() % 9)];
                let flags = u16::from(input.u8() % 16);
                let id = u64::from(input.u8() % 8);
                let len = usize::from(input.u16()) % (MAX_MESSAGE + 1024);
                let (header, payload) = frame(kind, flags, id, len);
                let side = if op == 1 { &mut b } else { &mut a };
                side.send_frame(&header, payload, now);
            }
            3 => {
                // The peer's next datagram, maybe corrupted on the way.
                if let Some(d) = b.poll_transmit(now) {
                    let (at, xor) = (usize::from(input.u8()), input.u8());
                    let mut d = d.to_vec();
                    if xor != 0 && at < d.len() && input.u8().is_multiple_of(4) {
                        d[at] ^= xor;
                    }
                    a.on_datagram(d.into(), now);
                }
            }
            4 => {
                if let Some(d) = a.poll_transmit(now) {
                    if !input.u8().is_multiple_of(8) {
                        b.on_datagram(d, now);
                    }
                }
            }
            5 => {
                // Lost.
                let _ = b.poll_transmit(now);
            }
            6 => {
                // Held back (reordered), or copied.
                if let Some(d) = b.poll_transmit(now) {
                    if input.u8().is_multiple_of(2) {
                        a.on_datagram(d.clone(), now);
                    }
                    if held.len() < 64 {
                        held.push_back(d);
                    }
                }
            }
            7 => {
                if let Some(d) = held.pop_front() {
                    a.on_datagram(d, now);
                }
            }
            8 => {
                now += Duration::from_millis(u64::from(input.u16()));
                for side in [&mut a, &mut b] {
                    if side.next_timeout().is_some_and(|at| at <= now) {
                        side.on_timeout(now);
                    }
                }
            }
            _ => {
                // Jump to the next timer of either side.
                let next = [a.next_timeout(), b.next_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
                if let Some(at) = next {
                    now = now.max(at);
                    a.on_timeout(now);
                    b.on_timeout(now);
                }
            }
        }
        while a.take_delivered().is_some() {}
        while b.take_delivered().is_some() {}
    }
    let _ = (a.failed(), a.is_idle(), a.stats());
});
