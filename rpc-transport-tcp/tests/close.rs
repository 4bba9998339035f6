//! `Channel::close` over a real socket: what the channel queued for the server (the
//! `CANCEL` of a call past its deadline) is on the wire, and the connection closed,
//! when it returns, as a process that exits right after its last call needs.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rpc_core::{
    client::Client,
    frame::{DecodeLimits, Frame},
    method::{Idempotency, MethodDescriptor},
    Code, Request,
};
use tokio::net::TcpListener;

static SAY: MethodDescriptor = MethodDescriptor {
    service: "demo.Echo",
    method: "Say",
    path: "demo.Echo/Say",
    idempotency: Idempotency::NoSideEffects,
};

/// The frames in `bytes` (length-prefixed), and whether the stream ended there.
fn frames(mut bytes: BytesMut) -> Vec<Frame> {
    let mut frames = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert!(bytes.len() >= 4 + len, "a frame cut short");
        bytes.advance(4);
        let frame: Bytes = bytes.split_to(len).freeze();
        frames.push(Frame::decode(frame, &DecodeLimits::default()).unwrap());
    }
    assert!(bytes.is_empty(), "a length prefix cut short");
    frames
}

#[tokio::test(flavor = "current_thread")]
async fn close_returns_with_the_cancel_of_an_expired_call_written_and_the_connection_closed() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let channel = rpc_transport_tcp::connect(&format!("tcp://{addr}"))
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();

    // The server never answers: the call ends at its deadline.
    let mut client = Client::new(channel.clone());
    let request = Request::new("hi".to_string()).with_timeout(Duration::from_millis(50));
    let status = client.unary::<_, String>(request, &SAY).await.unwrap_err();
    assert_eq!(status.code(), Code::DEADLINE_EXCEEDED, "{status}");
    drop(client);

    tokio::time::timeout(Duration::from_secs(10), channel.close())
        .await
        .expect("close hung");

    // Everything is in the server's socket now (loopback delivers at the write):
    // read it without waiting, as a process that exited would have left it.
    let mut received = BytesMut::new();
    let mut ended = false;
    let mut buf = [0u8; 4096];
    loop {
        match server.try_read(&mut buf) {
            Ok(0) => {
                ended = true;
                break;
            }
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(err) => panic!("read: {err}"),
        }
    }
    let frames = frames(received);
    let id = match frames.first() {
        Some(Frame::Request(request)) => request.id,
        other => panic!("expected the REQUEST first, got {other:?}"),
    };
    assert!(
        frames
            .iter()
            .any(|frame| matches!(frame, Frame::Cancel { id: cancelled } if *cancelled == id)),
        "no CANCEL of call {id} when close returned: {frames:?}"
    );
    assert!(ended, "the connection is still open after close");
}
