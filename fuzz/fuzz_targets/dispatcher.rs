//! A generated dispatcher under hostile frames: a `Server` with `rpc-proto`'s `Echo`
//! service (unary, server-, client- and bidirectional streams) and compression, over
//! the in-memory link, fed arbitrary frames (the input as TCP-style length-prefixed
//! frames, so the wire document's examples are seeds). Never a panic, never a hang
//! (a virtual-time guard), and every frame the server sends back decodes.

#![no_main]

use std::{future::poll_fn, sync::OnceLock, task::Poll, time::Duration};

use libfuzzer_sys::fuzz_target;
use rpc_core::{
    compress::Compression,
    frame::{DecodeLimits, Frame},
    link::{mem, Connector, Link, LinkConfig},
    server::Server,
};
use rpc_proto::echo::{echo_server::EchoServer, EchoService};
use tokio::runtime::Runtime;

/// Frames read back at most per input: a stream of counts could go on for long.
const MAX_REPLIES: usize = 2000;

/// Virtual time an exchange may take (the clock is paused and jumps when all is idle).
const GUARD: Duration = Duration::from_secs(3600);

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let frames = rpc_fuzz::split_prefixed(data);
    runtime().block_on(async {
        let (listener, connector) = mem::listener();
        let server = Server::builder()
            .add_service(EchoServer::new(EchoService))
            .compression(Some(Compression::default()))
            .expect("the fuzz crate builds rpc-core with zstd")
            .build();
        let task = tokio::spawn(async move { server.serve(listener).await });
        let mut link = connector
            .connect(&LinkConfig::default())
            .await
            .expect("in-memory connect");
        let mut sent = 0;
        let mut closed = false;
        let mut replies = 0;
        let exchange = poll_fn(|cx| {
            loop {
                match link.poll_recv(cx) {
                    Poll::Ready(Some(Ok(reply))) => {
                        if let Err(e) = Frame::decode(reply.clone(), &DecodeLimits::default()) {
                            panic!("the server sent a frame it cannot decode: {e}: {reply:?}");
                        }
                        replies += 1;
                        if replies >= MAX_REPLIES {
                            return Poll::Ready(());
                        }
                    }
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            while sent < frames.len() {
                match link.poll_ready(cx) {
                    Poll::Ready(Ok(())) => {
                        let frame = frames[sent];
                        sent += 1;
                        if link.start_send(frame, Default::default()).is_err() {
                            return Poll::Ready(());
                        }
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if !closed {
                match link.poll_close(cx) {
                    Poll::Ready(Ok(())) => closed = true,
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => {}
                }
            }
            Poll::Pending
        });
        let _ = tokio::time::timeout(GUARD, exchange).await;
        drop(link);
        task.abort();
        let _ = task.await;
    });
});
