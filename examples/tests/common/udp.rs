//! Raw UDP clients of the framework's `udp://` wire, for tests that play a client by
//! hand.

use std::time::Duration;

use tokio::net::UdpSocket;

/// Opens an association from a raw, connected socket as docs/wire.md says: HELLO,
/// RETRY with a token, HELLO with it, ACCEPT. Returns the client id.
pub async fn open_association(socket: &UdpSocket) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u16(socket.local_addr().unwrap().port());
    let client = h.finish().max(1);
    match hello(socket, client).await {
        rpc_transport_udp::datagram::ControlKind::ACCEPT => client,
        other => panic!("{other:?} to a HELLO"),
    }
}

/// Sends HELLOs as `client` from `socket` until the server answers one with ACCEPT
/// or REFUSE (after a RETRY, with its token): that answer.
pub async fn hello(socket: &UdpSocket, client: u64) -> rpc_transport_udp::datagram::ControlKind {
    use rpc_transport_udp::datagram::{Control, ControlKind, Datagram};
    let mut hello = Control::new(ControlKind::HELLO, 0, client);
    let mut buf = vec![0u8; 65_536];
    for _ in 0..100 {
        socket.send(&hello.to_bytes()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            match Datagram::decode(bytes::Bytes::copy_from_slice(&buf[..n])) {
                Ok(Datagram::Control(c)) if c.client == client => match c.kind {
                    ControlKind::RETRY => {
                        hello.token = c.token;
                        break;
                    }
                    kind => return kind,
                },
                _ => {} // anything else is not ours before ACCEPT
            }
        }
    }
    panic!("no answer to HELLO");
}

/// Calls Echo/Say from a raw socket with an open association, advertising compression
/// or not: whether the RESPONSE came compressed, and whether it advertised in turn.
pub async fn raw_say(socket: &UdpSocket, id: u64, text: &str, advertise: bool) -> (bool, bool) {
    let frame = say_frame(id, text, advertise);
    let mut buf = vec![0u8; 65_536];
    for _ in 0..50 {
        socket.send(&frame).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(300);
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            let d = &buf[..n];
            if n >= 12 && d[0] == 1 && d[1] == 2 && d[4..12] == id.to_be_bytes() {
                let flags = u16::from_be_bytes([d[2], d[3]]);
                let advertised = d.windows(19).any(|w| w == b"rpc-accept-encoding");
                return (flags & rpc_core::frame::FLAG_COMPRESSED != 0, advertised);
            }
        }
    }
    panic!("no RESPONSE to call {id}");
}

/// A whole REQUEST datagram of Echo/Say with `text` (under 16 KiB), advertising
/// compression or not.
pub fn say_frame(id: u64, text: &str, advertise: bool) -> bytes::BytesMut {
    let mut metadata = rpc_core::metadata::Metadata::new();
    if advertise {
        metadata.insert("rpc-accept-encoding", "zstd").unwrap();
    }
    let mut frame = bytes::BytesMut::new();
    rpc_core::frame::encode_request_header_with_key(
        &mut frame,
        id,
        "rpc.examples.v1.Echo/Say",
        Some(Duration::from_secs(5)),
        None,
        &metadata,
    );
    // SayRequest { message: text }: field 1, length-delimited (text < 16 KiB).
    let len = text.len();
    frame.extend_from_slice(&[0x0a, (len as u8 & 0x7f) | 0x80, (len >> 7) as u8]);
    frame.extend_from_slice(text.as_bytes());
    frame
}
