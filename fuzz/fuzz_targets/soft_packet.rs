//! The soft RDMA provider's packets on its byte stream, arriving in pieces of any
//! size: never a panic, every packet decoded encodes back to its bytes, and a claimed
//! length over the maximum reserves nothing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_fuzz::Input;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let max_len = match input.u8() {
        0..=127 => 1 << 20,
        n => usize::from(n),
    };
    let count = usize::from(input.u8() % 9);
    let sizes: Vec<usize> = (0..count).map(|_| usize::from(input.u8()) + 1).collect();
    let stream = input.rest();
    let mut pieces = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < stream.len() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(stream.len());
        let end = (at + n).min(stream.len());
        pieces.push(&stream[at..end]);
        at = end;
        i += 1;
    }
    rpc_transport_rdma::fuzzing::soft_packets(&pieces, max_len);
});
