//! Streaming flow control and cancellation over real sockets (TCP, Unix, UDP): a server
//! streams 1 GiB to a reader that pauses, and never runs more than the window ahead of
//! it; dropping a bidirectional stream drops the server's handler.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::{stream, StreamExt};
use rpc_core::{
    client::{Channel, ClientCall},
    link::{Connector, Listener},
    server::{Server, ServerCall, ServerReply},
    stream::{RawStreaming, TakeOnce},
    Metadata, Payload, Status,
};
use tower::{service_fn, Service, ServiceExt};

const MESSAGE: usize = 1 << 20;
const WINDOW: u32 = 2 << 20;

#[derive(Default)]
struct Counters {
    produced: AtomicUsize,
    dropped: AtomicUsize,
}

struct DropCount(Arc<Counters>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

fn server(counters: Arc<Counters>) -> Server {
    let handler = service_fn(move |call: ServerCall| {
        let counters = counters.clone();
        async move {
            let messages = match call.method.as_str() {
                // 1 GiB, each message made only when the stream is polled.
                "t.S/Produce" => stream::iter(0..1024usize)
                    .map(move |i| {
                        counters.produced.fetch_add(1, Ordering::SeqCst);
                        Ok(Payload::from(vec![i as u8; MESSAGE]))
                    })
                    .boxed(),
                // Echoes the first message, then holds until dropped.
                _ => {
                    let guard = DropCount(counters);
                    let mut requests = call.stream.and_then(|s| s.take()).unwrap();
                    let first = requests.next().await.unwrap()?;
                    stream::once(async move { Ok(Payload::from(first)) })
                        .chain(stream::pending())
                        .map(move |m| {
                            let _ = &guard;
                            m
                        })
                        .boxed()
                }
            };
            Ok::<_, Status>(ServerReply {
                stream: Some(TakeOnce::new(messages)),
                ..ServerReply::default()
            })
        }
    });
    Server::builder()
        .max_frame_len(4 << 20)
        .add_named_service("t.S", handler)
        .build()
}

async fn open(channel: &mut Channel, method: &'static str, messages: Vec<Payload>) -> RawStreaming {
    let call = ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: Some(Duration::from_secs(120)),
        call_key: None,
        payload: Payload::new(),
        stream: Some(TakeOnce::new(
            stream::iter(messages).chain(stream::pending()).boxed(),
        )),
        compress: None,
    };
    let reply = channel.ready().await.unwrap().call(call).await.unwrap();
    reply.stream.unwrap().take().unwrap()
}

async fn check<L: Listener, C: Connector>(listener: L, connector: C, name: &str) {
    let counters = Arc::new(Counters::default());
    let server = server(counters.clone());
    tokio::spawn(async move { server.serve(listener).await });
    let mut channel = Channel::builder()
        .max_frame_len(4 << 20)
        .stream_window(WINDOW)
        .connect(connector)
        .await
        .unwrap();

    // A slow reader: the producer may run ahead by the window plus a message (plus the
    // one the server task holds), whatever the socket buffers.
    let mut answers = open(&mut channel, "t.S/Produce", Vec::new()).await;
    let bound = WINDOW as usize / MESSAGE + 3;
    let mut read = 0;
    while let Some(message) = answers.next().await {
        assert_eq!(message.unwrap().len(), MESSAGE, "{name}");
        read += 1;
        if read % 128 == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let produced = counters.produced.load(Ordering::SeqCst);
        assert!(
            produced - read <= bound,
            "{name}: {produced} messages produced when {read} were read"
        );
        assert!(
            answers.buffered_bytes() <= WINDOW as usize + MESSAGE,
            "{name}"
        );
    }
    assert_eq!(read, 1024, "{name}: the whole GiB arrived");

    // Cancelling a bidirectional stream mid-way drops the server's handler.
    let mut held = open(&mut channel, "t.S/Hold", vec![Payload::from("first")]).await;
    assert_eq!(&held.next().await.unwrap().unwrap()[..], b"first");
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), async {
        while counters.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name}: the handler was not dropped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp() {
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let connector =
        rpc_transport_tcp::StreamConnector::from_uri(&listener.local_addr_uri()).unwrap();
    check(listener, connector, "tcp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix() {
    let path = std::env::temp_dir().join(format!("rpc-streaming-{}.sock", std::process::id()));
    let listener = rpc_transport_tcp::bind(&format!("unix://{}", path.display()))
        .await
        .unwrap();
    let connector =
        rpc_transport_tcp::StreamConnector::from_uri(&listener.local_addr_uri()).unwrap();
    check(listener, connector, "unix").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp() {
    // Loopback settings: large datagrams, so 1 GiB is not a million fragments.
    let config = rpc_transport_udp::UdpConfig {
        max_datagram: 60_000,
        window: 1 << 20,
        ..rpc_transport_udp::UdpConfig::default()
    };
    let listener = rpc_transport_udp::bind_with("udp://127.0.0.1:0", config.clone())
        .await
        .unwrap();
    let connector =
        rpc_transport_udp::UdpConnector::with_config(&listener.local_addr_uri(), config).unwrap();
    check(listener, connector, "udp").await;
}
