//! The soft provider's packets on its byte stream (Unix socket or TCP), without I/O.
//!
//! Every packet is a 4-byte big-endian length (of what follows), a type byte and a
//! body; all integers are big-endian.
//!
//! | type | packet | body |
//! | --- | --- | --- |
//! | 1 | HELLO | see [`Hello`] (64 bytes) |
//! | 2 | TABLE_ACK | `mapped: u8` (1 if this side mapped the peer's region table) |
//! | 3 | SEND | the message (into one posted receive buffer) |
//! | 4 | READ_REQ | `id: u64, key: u64, offset: u64, len: u32` |
//! | 5 | READ_RESP | `id: u64, status: u8`, then the data when status is 0 |
//! | 6 | WRITE_REQ | `id: u64, key: u64, offset: u64`, then the data |
//! | 7 | WRITE_RESP | `id: u64, status: u8` |
//!
//! Status: 0 ok, 1 unknown key, 2 revoked, 3 out of bounds, 4 access denied.
//! The decoder checks the announced length against the configured maximum before it
//! keeps a byte for the packet, and every body length against its type.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rpc_core::{Error, ErrorKind};

/// Bytes of the length prefix.
pub(crate) const PREFIX_LEN: usize = 4;
/// Packet header bytes past the prefix, at most (type and a request header): what a
/// packet adds to its data.
pub(crate) const MAX_OVERHEAD: usize = 1 + 28;

const MAGIC: [u8; 8] = *b"RPCSOFT1";
/// The version of these packets.
pub(crate) const VERSION: u8 = 1;
const HELLO_LEN: usize = 64;

const T_HELLO: u8 = 1;
const T_TABLE_ACK: u8 = 2;
const T_SEND: u8 = 3;
const T_READ_REQ: u8 = 4;
const T_READ_RESP: u8 = 5;
const T_WRITE_REQ: u8 = 6;
const T_WRITE_RESP: u8 = 7;

/// The first packet each way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The sender's process id (in its pid namespace).
    pub(crate) pid: i32,
    /// `/proc/sys/kernel/random/boot_id` of the sender's host.
    pub(crate) boot_id: [u8; 16],
    /// The inode of the sender's pid namespace.
    pub(crate) pidns: u64,
    /// The sender's region table: its descriptor number in the sender's process, or
    /// -1 if it offers none (cross-memory attach disabled).
    pub(crate) table_fd: i32,
    /// Entries in the table.
    pub(crate) table_capacity: u32,
    /// The value in the table's header that proves it is this table.
    pub(crate) table_nonce: u64,
    /// Receive buffers the sender posted.
    pub(crate) recv_count: u32,
    /// Their length.
    pub(crate) recv_len: u32,
    /// The address, in the sender's memory, of 16 random bytes a peer that says it
    /// mapped the sender's table must read by cross-memory attach and send back in
    /// its TABLE_ACK (a proof that it can attach, not only say so); 0 if none is
    /// offered. After the 64 bytes of version 1's HELLO: a HELLO without it reads
    /// as 0.
    pub(crate) proof_addr: u64,
}

/// The length of a HELLO's proof (see [`Hello::proof_addr`]).
pub(crate) const PROOF_LEN: usize = 16;

/// One decoded packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Packet {
    Hello(Hello),
    TableAck {
        mapped: bool,
        /// What the sender read at our [`Hello::proof_addr`], when it says it mapped
        /// our table: after the flag (a TABLE_ACK without it reads as `None`).
        proof: Option<[u8; PROOF_LEN]>,
    },
    Send(Bytes),
    ReadReq {
        id: u64,
        key: u64,
        offset: u64,
        len: u32,
    },
    ReadResp {
        id: u64,
        status: u8,
        data: Bytes,
    },
    WriteReq {
        id: u64,
        key: u64,
        offset: u64,
        data: Bytes,
    },
    WriteResp {
        id: u64,
        status: u8,
    },
}

fn protocol(message: String) -> Error {
    Error::new(ErrorKind::Protocol, message)
}

impl Packet {
    /// The packet's type, as docs/rdma.md names it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Packet::Hello(_) => "HELLO",
            Packet::TableAck { .. } => "TABLE_ACK",
            Packet::Send(_) => "SEND",
            Packet::ReadReq { .. } => "READ_REQ",
            Packet::ReadResp { .. } => "READ_RESP",
            Packet::WriteReq { .. } => "WRITE_REQ",
            Packet::WriteResp { .. } => "WRITE_RESP",
        }
    }
}

/// Takes one whole packet off the front of `buf`: `Ok(None)` until it is all there.
/// A packet longer than `max_len` (type and body) is an error before anything is kept.
pub(crate) fn decode(buf: &mut BytesMut, max_len: usize) -> Result<Option<Packet>, Error> {
    if buf.len() < PREFIX_LEN {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len == 0 {
        return Err(protocol("empty soft-RDMA packet".into()));
    }
    if len > max_len {
        return Err(Error::new(
            ErrorKind::FrameTooLarge,
            format!("soft-RDMA packet of {len} bytes exceeds the maximum of {max_len} bytes"),
        ));
    }
    if buf.len() < PREFIX_LEN + len {
        buf.reserve(PREFIX_LEN + len - buf.len());
        return Ok(None);
    }
    buf.advance(PREFIX_LEN);
    let mut body = buf.split_to(len).freeze();
    let kind = body.get_u8();
    let need = |n: usize, what: &str| {
        if body.len() < n {
            Err(protocol(format!(
                "soft-RDMA {what} packet of {} bytes, expected at least {n}",
                body.len() + 1
            )))
        } else {
            Ok(())
        }
    };
    let packet = match kind {
        T_HELLO => {
            need(HELLO_LEN, "HELLO")?;
            let mut magic = [0u8; 8];
            body.copy_to_slice(&mut magic);
            if magic != MAGIC {
                return Err(protocol(
                    "the peer does not speak the soft RDMA provider's protocol".into(),
                ));
            }
            let version = body.get_u8();
            if version != VERSION {
                return Err(Error::new(
                    ErrorKind::UnsupportedVersion,
                    format!("soft RDMA provider version {version}, this side speaks {VERSION}"),
                ));
            }
            body.advance(3);
            let pid = body.get_i32();
            let mut boot_id = [0u8; 16];
            body.copy_to_slice(&mut boot_id);
            Packet::Hello(Hello {
                pid,
                boot_id,
                pidns: body.get_u64(),
                table_fd: body.get_i32(),
                table_capacity: body.get_u32(),
                table_nonce: body.get_u64(),
                recv_count: body.get_u32(),
                recv_len: body.get_u32(),
                proof_addr: if body.len() >= 8 { body.get_u64() } else { 0 },
            })
        }
        T_TABLE_ACK => {
            need(1, "TABLE_ACK")?;
            let mapped = body.get_u8() == 1;
            let proof = (body.len() >= PROOF_LEN).then(|| {
                let mut proof = [0u8; PROOF_LEN];
                body.copy_to_slice(&mut proof);
                proof
            });
            Packet::TableAck { mapped, proof }
        }
        T_SEND => Packet::Send(body),
        T_READ_REQ => {
            need(28, "READ_REQ")?;
            Packet::ReadReq {
                id: body.get_u64(),
                key: body.get_u64(),
                offset: body.get_u64(),
                len: body.get_u32(),
            }
        }
        T_READ_RESP => {
            need(9, "READ_RESP")?;
            Packet::ReadResp {
                id: body.get_u64(),
                status: body.get_u8(),
                data: body,
            }
        }
        T_WRITE_REQ => {
            need(24, "WRITE_REQ")?;
            Packet::WriteReq {
                id: body.get_u64(),
                key: body.get_u64(),
                offset: body.get_u64(),
                data: body,
            }
        }
        T_WRITE_RESP => {
            need(9, "WRITE_RESP")?;
            Packet::WriteResp {
                id: body.get_u64(),
                status: body.get_u8(),
            }
        }
        other => return Err(protocol(format!("unknown soft-RDMA packet type {other}"))),
    };
    Ok(Some(packet))
}

fn prefix(out: &mut BytesMut, body_len: usize, kind: u8) {
    out.put_u32((body_len + 1) as u32);
    out.put_u8(kind);
}

pub(crate) fn put_hello(out: &mut BytesMut, hello: &Hello) {
    prefix(out, HELLO_LEN + 8, T_HELLO);
    out.put_slice(&MAGIC);
    out.put_u8(VERSION);
    out.put_slice(&[0; 3]);
    out.put_i32(hello.pid);
    out.put_slice(&hello.boot_id);
    out.put_u64(hello.pidns);
    out.put_i32(hello.table_fd);
    out.put_u32(hello.table_capacity);
    out.put_u64(hello.table_nonce);
    out.put_u32(hello.recv_count);
    out.put_u32(hello.recv_len);
    out.put_u64(hello.proof_addr);
}

pub(crate) fn put_table_ack(out: &mut BytesMut, mapped: bool, proof: Option<&[u8; PROOF_LEN]>) {
    prefix(out, 1 + proof.map_or(0, |p| p.len()), T_TABLE_ACK);
    out.put_u8(u8::from(mapped));
    if let Some(proof) = proof {
        out.put_slice(proof);
    }
}

pub(crate) fn put_send(out: &mut BytesMut, message: &[u8]) {
    prefix(out, message.len(), T_SEND);
    out.put_slice(message);
}

pub(crate) fn put_read_req(out: &mut BytesMut, id: u64, key: u64, offset: u64, len: u32) {
    prefix(out, 28, T_READ_REQ);
    out.put_u64(id);
    out.put_u64(key);
    out.put_u64(offset);
    out.put_u32(len);
}

/// A READ_RESP header for `data_len` bytes of data that the caller appends.
pub(crate) fn put_read_resp_header(out: &mut BytesMut, id: u64, status: u8, data_len: usize) {
    prefix(out, 9 + data_len, T_READ_RESP);
    out.put_u64(id);
    out.put_u8(status);
}

pub(crate) fn put_write_req(out: &mut BytesMut, id: u64, key: u64, offset: u64, data: &[u8]) {
    prefix(out, 24 + data.len(), T_WRITE_REQ);
    out.put_u64(id);
    out.put_u64(key);
    out.put_u64(offset);
    out.put_slice(data);
}

pub(crate) fn put_write_resp(out: &mut BytesMut, id: u64, status: u8) {
    prefix(out, 9, T_WRITE_RESP);
    out.put_u64(id);
    out.put_u8(status);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hello() -> Hello {
        Hello {
            pid: 42,
            boot_id: [7; 16],
            pidns: 4026531836,
            table_fd: 9,
            table_capacity: 1024,
            table_nonce: 0xfeed,
            recv_count: 64,
            recv_len: 8192,
            proof_addr: 0x7f00_1234_5678,
        }
    }

    #[test]
    fn every_packet_round_trips() {
        let mut buf = BytesMut::new();
        put_hello(&mut buf, &hello());
        put_table_ack(&mut buf, true, Some(&[7; PROOF_LEN]));
        put_send(&mut buf, b"message");
        put_read_req(&mut buf, 1, 2, 3, 4);
        put_read_resp_header(&mut buf, 5, 0, 3);
        buf.put_slice(b"abc");
        put_write_req(&mut buf, 6, 7, 8, b"data");
        put_write_resp(&mut buf, 9, 2);
        let want = [
            Packet::Hello(hello()),
            Packet::TableAck {
                mapped: true,
                proof: Some([7; PROOF_LEN]),
            },
            Packet::Send(Bytes::from_static(b"message")),
            Packet::ReadReq {
                id: 1,
                key: 2,
                offset: 3,
                len: 4,
            },
            Packet::ReadResp {
                id: 5,
                status: 0,
                data: Bytes::from_static(b"abc"),
            },
            Packet::WriteReq {
                id: 6,
                key: 7,
                offset: 8,
                data: Bytes::from_static(b"data"),
            },
            Packet::WriteResp { id: 9, status: 2 },
        ];
        for packet in want {
            assert_eq!(decode(&mut buf, 1 << 20).unwrap(), Some(packet));
        }
        assert_eq!(decode(&mut buf, 1 << 20).unwrap(), None);
    }

    #[test]
    fn a_packet_over_the_limit_is_refused_before_it_arrives() {
        let mut buf = BytesMut::from(&[0u8, 0x10, 0, 0, T_SEND][..]);
        let err = decode(&mut buf, 4096).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::FrameTooLarge);
        assert!(buf.capacity() < 1 << 20, "nothing reserved for it");
    }

    #[test]
    fn short_bodies_and_wrong_versions_are_errors() {
        let mut buf = BytesMut::new();
        put_read_req(&mut buf, 1, 2, 3, 4);
        buf[3] = 10; // claims 10 bytes: type and 9 of the 28 body bytes
        buf.truncate(PREFIX_LEN + 10);
        assert!(decode(&mut buf, 4096).is_err());
        let mut buf = BytesMut::new();
        put_hello(&mut buf, &hello());
        buf[PREFIX_LEN + 1 + 8] = 9;
        assert_eq!(
            decode(&mut buf, 4096).unwrap_err().kind(),
            ErrorKind::UnsupportedVersion
        );
    }

    /// The limit the tests decode with: larger than any generated packet.
    const MAX: usize = 4096;

    fn data() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Bytes::from)
    }

    fn packet() -> impl Strategy<Value = Packet> {
        prop_oneof![
            (
                any::<i32>(),
                any::<[u8; 16]>(),
                any::<u64>(),
                any::<i32>(),
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(
                    |(pid, boot_id, pidns, table_fd, cap, nonce, count, len, proof_addr)| {
                        Packet::Hello(Hello {
                            pid,
                            boot_id,
                            pidns,
                            table_fd,
                            table_capacity: cap,
                            table_nonce: nonce,
                            recv_count: count,
                            recv_len: len,
                            proof_addr,
                        })
                    }
                ),
            (any::<bool>(), any::<Option<[u8; PROOF_LEN]>>())
                .prop_map(|(mapped, proof)| Packet::TableAck { mapped, proof }),
            data().prop_map(Packet::Send),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
                |(id, key, offset, len)| Packet::ReadReq {
                    id,
                    key,
                    offset,
                    len
                }
            ),
            (any::<u64>(), any::<u8>(), data()).prop_map(|(id, status, data)| Packet::ReadResp {
                id,
                status,
                data
            }),
            (any::<u64>(), any::<u64>(), any::<u64>(), data()).prop_map(
                |(id, key, offset, data)| Packet::WriteReq {
                    id,
                    key,
                    offset,
                    data
                }
            ),
            (any::<u64>(), any::<u8>()).prop_map(|(id, status)| Packet::WriteResp { id, status }),
        ]
    }

    fn encode(packet: &Packet, out: &mut BytesMut) {
        match packet {
            Packet::Hello(hello) => put_hello(out, hello),
            Packet::TableAck { mapped, proof } => put_table_ack(out, *mapped, proof.as_ref()),
            Packet::Send(message) => put_send(out, message),
            Packet::ReadReq {
                id,
                key,
                offset,
                len,
            } => put_read_req(out, *id, *key, *offset, *len),
            Packet::ReadResp { id, status, data } => {
                put_read_resp_header(out, *id, *status, data.len());
                out.put_slice(data);
            }
            Packet::WriteReq {
                id,
                key,
                offset,
                data,
            } => put_write_req(out, *id, *key, *offset, data),
            Packet::WriteResp { id, status } => put_write_resp(out, *id, *status),
        }
    }

    /// The least a packet's type and body must hold (what `decode` checks).
    fn least_len(packet: &Packet) -> usize {
        1 + match packet {
            Packet::Hello(_) => HELLO_LEN,
            Packet::TableAck { .. } => 1,
            Packet::Send(_) => 0,
            Packet::ReadReq { .. } => 28,
            Packet::ReadResp { .. } | Packet::WriteResp { .. } => 9,
            Packet::WriteReq { .. } => 24,
        }
    }

    /// Decodes everything `buf` holds: the packets, and how it ended.
    fn decode_all(buf: &mut BytesMut, max_len: usize) -> (Vec<Packet>, Result<(), Error>) {
        let mut packets = Vec::new();
        loop {
            match decode(buf, max_len) {
                Ok(Some(packet)) => packets.push(packet),
                Ok(None) => return (packets, Ok(())),
                Err(err) => return (packets, Err(err)),
            }
        }
    }

    /// Edge values for a field of `width` bytes.
    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX),
            Just(MAX as u64),
            Just(MAX as u64 + 1),
            any::<u64>(),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = decode(&mut buf, 128) {}
        }

        /// Packets round-trip, also when they arrive a few bytes at a time: until a
        /// packet is whole the decoder answers `None` and keeps every byte.
        #[test]
        fn packets_round_trip_in_any_pieces(
            packets in proptest::collection::vec(packet(), 1..6),
            piece in 1usize..80,
        ) {
            let mut wire = BytesMut::new();
            for packet in &packets {
                encode(packet, &mut wire);
            }
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for chunk in wire.chunks(piece) {
                buf.extend_from_slice(chunk);
                loop {
                    let before = buf.len();
                    match decode(&mut buf, MAX).unwrap() {
                        Some(packet) => got.push(packet),
                        None => {
                            prop_assert_eq!(buf.len(), before, "nothing consumed");
                            break;
                        }
                    }
                }
            }
            prop_assert_eq!(got, packets);
            prop_assert!(buf.is_empty());
        }

        /// A packet whose length prefix is cut short (its body truncated at every
        /// position, the prefix saying so) is an error when its fixed part no longer
        /// fits, and a shorter packet of the same type otherwise.
        #[test]
        fn truncated_bodies_are_errors(packet in packet()) {
            let mut wire = BytesMut::new();
            encode(&packet, &mut wire);
            let least = least_len(&packet);
            for len in 0..wire.len() - PREFIX_LEN {
                let mut buf = BytesMut::new();
                buf.put_u32(len as u32);
                buf.extend_from_slice(&wire[PREFIX_LEN..PREFIX_LEN + len]);
                let result = decode(&mut buf, MAX);
                if len < least {
                    let err = result.unwrap_err();
                    prop_assert_eq!(err.kind(), ErrorKind::Protocol, "{}", err);
                } else {
                    prop_assert!(result.unwrap().is_some(), "a whole packet of {} bytes", len);
                }
            }
        }

        /// One field (any 1, 4 or 8 bytes, the length prefix included) set to an edge
        /// value: a packet, a clear error, or a wait for more bytes; never a panic, and
        /// a claimed length over the limit is refused before anything is reserved.
        #[test]
        fn mutated_fields_never_panic(
            packet in packet(),
            at in any::<prop::sample::Index>(),
            width in prop_oneof![Just(1usize), Just(4), Just(8)],
            value in edge(),
        ) {
            let mut wire = BytesMut::new();
            encode(&packet, &mut wire);
            let at = at.index(wire.len());
            let width = width.min(wire.len() - at);
            wire[at..at + width].copy_from_slice(&value.to_be_bytes()[8 - width..]);
            let claimed = u32::from_be_bytes([wire[0], wire[1], wire[2], wire[3]]) as usize;
            let (_, end) = decode_all(&mut wire, MAX);
            if claimed > MAX {
                let err = end.unwrap_err();
                prop_assert_eq!(err.kind(), ErrorKind::FrameTooLarge);
                prop_assert!(wire.capacity() < 2 * MAX, "reserved {}", wire.capacity());
            } else if let Err(err) = end {
                // A prefix mutated shorter leaves the rest of the packet to be read as
                // another one, whose "length" may be anything: over the limit too.
                prop_assert!(
                    matches!(
                        err.kind(),
                        ErrorKind::Protocol | ErrorKind::UnsupportedVersion | ErrorKind::FrameTooLarge
                    ),
                    "{}", err
                );
            }
        }

        #[test]
        fn a_claimed_length_over_the_limit_reserves_nothing(
            len in (MAX as u32 + 1)..=u32::MAX,
            kind in any::<u8>(),
        ) {
            let mut buf = BytesMut::new();
            buf.put_u32(len);
            buf.put_u8(kind);
            let err = decode(&mut buf, MAX).unwrap_err();
            prop_assert_eq!(err.kind(), ErrorKind::FrameTooLarge);
            prop_assert!(buf.capacity() < MAX, "reserved {}", buf.capacity());
        }
    }

    #[test]
    fn empty_packets_and_unknown_types_are_errors() {
        for bytes in [
            &[0u8, 0, 0, 0][..],
            &[0, 0, 0, 1, 0],
            &[0, 0, 0, 1, 8],
            &[0, 0, 0, 1, 255],
        ] {
            let err = decode(&mut BytesMut::from(bytes), MAX).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Protocol, "{bytes:?}");
        }
        let mut buf = BytesMut::new();
        put_hello(&mut buf, &hello());
        buf[PREFIX_LEN + 1] = b'X';
        let err = decode(&mut buf, MAX).unwrap_err();
        assert!(err.to_string().contains("does not speak"), "{err}");
    }
}
