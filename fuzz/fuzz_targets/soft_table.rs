//! The soft RDMA provider's region tables: a peer's table as a hostile peer may write
//! it (header and entries), checked with arbitrary keys, offsets and lengths; and this
//! side's table under arbitrary registrations, deregistrations and the responder's
//! lookups of keys the peer sends. Never a panic; nothing allowed that the table does
//! not grant.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rpc_fuzz::Input;
use rpc_transport_rdma::fuzzing::{soft_local_table, soft_peer_table, LocalOp, Query};

const MAGIC: [u8; 8] = *b"RPCRDMA1";

fn query(input: &mut Input<'_>) -> Query {
    let key = match input.u8() % 4 {
        // A key the table's few entries may hold: small generation and index.
        0 | 1 => (u64::from(input.u8() % 4) << 32) | u64::from(input.u8() % 6),
        _ => input.u64(),
    };
    let offset = match input.u8() % 3 {
        0 => u64::from(input.u8()),
        1 => u64::MAX - u64::from(input.u8()),
        _ => input.u64(),
    };
    let len = if input.u8().is_multiple_of(2) {
        usize::from(input.u8())
    } else {
        input.u64() as usize
    };
    Query {
        key,
        offset,
        len,
        want: input.u8() % 4,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    if input.u8().is_multiple_of(2) {
        // A peer's table: capacity and nonce as announced, then the file's bytes.
        let capacity = match input.u8() {
            255 => input.u32(),
            n => u32::from(n % 8),
        };
        let nonce = input.u64();
        let file_len = usize::from(input.u16() % 1024);
        let fix_header = input.u8();
        let mut file = input.bytes(file_len).to_vec();
        file.resize(file_len, 0);
        // Mostly a header that is the announced one, so the entries get checked.
        if !fix_header.is_multiple_of(4) && file.len() >= 24 {
            file[0..8].copy_from_slice(&u64::from_be_bytes(MAGIC).to_ne_bytes());
            file[8..16].copy_from_slice(&nonce.to_ne_bytes());
            file[16..24].copy_from_slice(&u64::from(capacity).to_ne_bytes());
        }
        let mut queries = Vec::new();
        while !input.is_empty() && queries.len() < 64 {
            queries.push(query(&mut input));
        }
        soft_peer_table(&file, capacity, nonce, &queries);
    } else {
        // This side's table.
        let capacity = input.u8() % 8;
        let mut ops = Vec::new();
        while !input.is_empty() && ops.len() < 128 {
            ops.push(match input.u8() % 3 {
                0 => LocalOp::Register {
                    len: input.u8(),
                    access: input.u8() % 4,
                },
                1 => LocalOp::Deregister {
                    key: (u64::from(input.u8() % 4) << 32) | u64::from(input.u8() % 8),
                },
                _ => LocalOp::Lookup(query(&mut input)),
            });
        }
        soft_local_table(capacity, &ops);
    }
});
