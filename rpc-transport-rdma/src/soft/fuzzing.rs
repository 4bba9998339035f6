//! The soft provider's decoders of peer bytes, for the fuzz targets (see
//! [`crate::fuzzing`]).

use std::{os::fd::AsRawFd, os::unix::fs::FileExt, sync::Arc};

use bytes::{BufMut, Bytes, BytesMut};

use super::{
    memory::Mem,
    packet::{self, Packet},
    sys,
    table::{self, LocalTable, PeerTable},
};
use crate::provider::Access;

/// Feeds a byte stream to the packet decoder in the given pieces, as the driver
/// does, until it fails or runs out of bytes; checks that every packet decoded
/// encodes to bytes that decode to the same packet, and that no claimed length reserves more than
/// `max_len` allows. Returns the number of packets decoded.
pub fn soft_packets(pieces: &[&[u8]], max_len: usize) -> usize {
    let mut buf = BytesMut::new();
    let mut fed = 0usize;
    let mut decoded = 0;
    for piece in pieces {
        buf.extend_from_slice(piece);
        fed += piece.len();
        loop {
            match packet::decode(&mut buf, max_len) {
                Ok(Some(packet)) => {
                    decoded += 1;
                    // Receivers are lenient (bytes after a fixed body, any byte for a
                    // flag), so check the meaning, not the bytes: what the encoder
                    // writes for the packet decodes to the same packet.
                    let mut again = BytesMut::new();
                    encode(&packet, &mut again);
                    let same = packet::decode(&mut again, usize::MAX).expect("re-encoded packet");
                    assert_eq!(same, Some(packet));
                    assert!(again.is_empty());
                }
                Ok(None) => break,
                Err(_) => return decoded,
            }
            assert!(
                buf.capacity() <= 2 * (packet::PREFIX_LEN + max_len + fed) + 64,
                "{} bytes reserved after {fed} bytes fed (limit {max_len})",
                buf.capacity()
            );
        }
    }
    decoded
}

fn encode(packet: &Packet, out: &mut BytesMut) {
    match packet {
        Packet::Hello(hello) => packet::put_hello(out, hello),
        Packet::TableAck { mapped, proof } => packet::put_table_ack(out, *mapped, proof.as_ref()),
        Packet::Send(message) => packet::put_send(out, message),
        Packet::ReadReq {
            id,
            key,
            offset,
            len,
        } => packet::put_read_req(out, *id, *key, *offset, *len),
        Packet::ReadResp { id, status, data } => {
            packet::put_read_resp_header(out, *id, *status, data.len());
            out.put_slice(data);
        }
        Packet::WriteReq {
            id,
            key,
            offset,
            data,
        } => packet::put_write_req(out, *id, *key, *offset, data),
        Packet::WriteResp { id, status } => packet::put_write_resp(out, *id, *status),
    }
}

/// One access a fuzz target checks against a table.
#[derive(Clone, Copy, Debug)]
pub struct Query {
    /// The remote key.
    pub key: u64,
    /// Where in the region.
    pub offset: u64,
    /// How many bytes.
    pub len: usize,
    /// Access bits wanted (read 1, write 2).
    pub want: u8,
}

/// A peer's region table with the bytes `file` (as a hostile peer may write them,
/// header included), opened as announced by `capacity` and `nonce`, then checked
/// with every query. Checks what an allowed access promises: the entry is valid, of
/// the key's generation, grants the rights, holds the range, and the address does
/// not wrap. Returns how many queries were allowed (`None`: the table was refused).
pub fn soft_peer_table(file: &[u8], capacity: u32, nonce: u64, queries: &[Query]) -> Option<usize> {
    let memfd = sys::memfd(c"fuzz-peer-table", file.len()).ok()?;
    memfd.write_all_at(file, 0).ok()?;
    let peer = PeerTable::open(sys::pid(), memfd.as_raw_fd(), capacity, nonce).ok()?;
    let word = |at: usize| {
        file.get(at..at + 8)
            .map(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")))
    };
    let mut allowed = 0;
    for q in queries {
        let want = Access::from_bits(q.want);
        let Ok(at) = peer.check(q.key, q.offset, q.len, want) else {
            continue;
        };
        allowed += 1;
        let index = (q.key & 0xffff_ffff) as usize;
        assert!(index < capacity as usize);
        let base = table::table_len(0) + 32 * index;
        let (state, addr, region_len) = (
            word(base).expect("entry in the file"),
            word(base + 8).expect("entry in the file"),
            word(base + 16).expect("entry in the file"),
        );
        assert!(state & 1 != 0, "allowed on an invalid entry");
        assert_eq!(state >> 32, q.key >> 32, "allowed with another generation");
        assert!(Access::from_bits((state >> 1) as u8).contains(want));
        let end = q.offset.checked_add(q.len as u64);
        assert!(end.is_some_and(|end| end <= region_len), "out of bounds");
        assert_eq!(Some(at), addr.checked_add(q.offset));
        assert!(at.checked_add(q.len as u64).is_some(), "address wraps");
    }
    Some(allowed)
}

/// One step against this side's table: register a region of `len` bytes with
/// `access`, deregister a key, or look a key up as the responder does.
#[derive(Clone, Copy, Debug)]
pub enum LocalOp {
    /// Register a region.
    Register {
        /// Its length.
        len: u8,
        /// Its rights (read 1, write 2).
        access: u8,
    },
    /// Deregister the region of a key.
    Deregister {
        /// The key (one of those registered, picked by index, or made up).
        key: u64,
    },
    /// The responder's check of an access the peer asks for.
    Lookup(Query),
}

/// Runs `ops` against a table of `capacity` entries; checks that a lookup succeeds
/// only for a live region's key, with rights and bounds it grants.
pub fn soft_local_table(capacity: u8, ops: &[LocalOp]) {
    let Ok(table) = LocalTable::new(u32::from(capacity)) else {
        return;
    };
    // Live regions: key, length, rights.
    let mut live: Vec<(u64, u64, Access)> = Vec::new();
    for op in ops {
        match *op {
            LocalOp::Register { len, access } => {
                let access = Access::from_bits(access);
                let mem = Arc::new(Mem::Shared(Bytes::from(vec![0u8; usize::from(len)])));
                if let Ok(desc) = table.register(mem, access) {
                    assert_eq!(desc.len, u64::from(len));
                    live.push((desc.key, desc.len, access));
                } else {
                    assert_eq!(live.len(), usize::from(capacity), "refused below capacity");
                }
            }
            LocalOp::Deregister { key } => {
                let found = live.iter().position(|r| r.0 == key);
                let mem = table.deregister(key);
                assert_eq!(mem.is_some(), found.is_some(), "deregistered {key:#x}");
                if let Some(i) = found {
                    live.swap_remove(i);
                }
            }
            LocalOp::Lookup(q) => {
                let want = Access::from_bits(q.want);
                if let Ok(mem) = table.lookup(q.key, q.offset, q.len, want) {
                    let &(_, len, access) = live
                        .iter()
                        .find(|r| r.0 == q.key)
                        .expect("a lookup found a key that is not live");
                    assert!(access.contains(want));
                    assert_eq!(mem.len() as u64, len);
                    assert!(q.offset.checked_add(q.len as u64).is_some_and(|e| e <= len));
                }
            }
        }
        assert_eq!(table.live(), live.len());
    }
}
