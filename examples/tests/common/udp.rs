//! Raw UDP clients of the framework's `udp://` wire, for tests that play a client by
//! hand.

use std::time::Duration;

use tokio::net::UdpSocket;

/// Opens an association from a raw, connected socket as docs/wire.md says: HELLO,
/// RETRY with a token, HELLO with it, ACCEPT. Returns the client id.
pub async fn open_association(socket: &UdpSocket) -> u64 {
    use rpc_transport_udp::datagram::{Control, ControlKind, Datagram};
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u16(socket.local_addr().unwrap().port());
    let client = h.finish().max(1);
    let mut hello = Control::new(ControlKind::HELLO, 0, client);
    let mut buf = vec![0u8; 65_536];
    for _ in 0..100 {
        socket.send(&hello.to_bytes()).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            match Datagram::decode(bytes::Bytes::copy_from_slice(&buf[..n])) {
                Ok(Datagram::Control(c)) if c.client == client => match c.kind {
                    ControlKind::ACCEPT => return client,
                    ControlKind::RETRY => {
                        hello.token = c.token;
                        break;
                    }
                    other => panic!("{other:?} to a HELLO"),
                },
                _ => {} // anything else is not ours before ACCEPT
            }
        }
    }
    panic!("no ACCEPT");
}
