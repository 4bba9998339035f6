//! The link over the soft provider: floods of small frames against credits, large
//! frames by rendezvous, limits, and the real core (server and channel) on top.

mod common;

use std::{future::poll_fn, sync::atomic::Ordering, time::Duration};

use bytes::Bytes;
use common::{flush, link_pair, no_cma, pattern, recv, send, GUARD};
use rpc_core::{link::Link, server::Server, ErrorKind, Request};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_rdma::{RdmaConfig, RdmaConnector, RdmaListener};

const MAX_FRAME: usize = 64 << 20;

fn small() -> RdmaConfig {
    RdmaConfig {
        recv_buffers: 8,
        ..RdmaConfig::default()
    }
}

/// Sends `n` numbered frames from `a` and receives them on `b`, with the receiver
/// stalling now and then so that the sender runs out of credits; checks order,
/// count and that no message ever found the receiver without a posted buffer.
async fn flood(config: RdmaConfig, tcp: bool, n: u32) {
    let (mut a, mut b) = link_pair(&config, &config, MAX_FRAME, tcp).await;
    let sender = tokio::spawn(async move {
        for i in 0..n {
            let body = Bytes::from(i.to_be_bytes().repeat((i % 50) as usize + 1));
            send(&mut a, &i.to_be_bytes(), body).await;
            if i % 64 == 0 {
                flush(&mut a).await;
            }
        }
        flush(&mut a).await;
        a
    });
    for i in 0..n {
        if i % 1000 == 0 {
            // A slow consumer: the sender must wait for credits, not overrun.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let frame = recv(&mut b).await.expect("a frame").expect("ok");
        assert_eq!(&frame[..4], &i.to_be_bytes(), "frame {i} in order");
        assert_eq!(frame.len(), 4 + 4 * ((i % 50) as usize + 1));
    }
    let a = tokio::time::timeout(GUARD, sender).await.unwrap().unwrap();
    let provider = b.endpoint().stats();
    assert_eq!(
        provider.rnr.load(Ordering::Relaxed),
        0,
        "no receiver-not-ready"
    );
    let messages = provider.recvs.load(Ordering::Relaxed);
    if config.batch_frames {
        // Frames queued between two flushes share messages (and credits).
        assert!(
            messages < u64::from(n) / 4,
            "{messages} messages carried {n} frames"
        );
        assert!(a.stats().batches_sent.load(Ordering::Relaxed) > 0);
    } else {
        assert!(messages >= u64::from(n));
        assert_eq!(a.stats().batches_sent.load(Ordering::Relaxed), 0);
    }
    let held_peak = b.stats().recv_held_peak.load(Ordering::Relaxed);
    assert!(
        held_peak <= config.recv_buffers,
        "held {held_peak} frames with {} buffers",
        config.recv_buffers
    );
    assert!(held_peak >= 2, "the receiver did fall behind");
    assert_eq!(a.stats().eager_sent.load(Ordering::Relaxed), u64::from(n));
    assert!(
        a.stats().send_waits.load(Ordering::Relaxed) > 0,
        "the sender waited for credits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_small_frames_never_overruns_the_receive_buffers() {
    flood(unbatched(small()), false, 20_000).await;
    flood(unbatched(RdmaConfig::default()), true, 5_000).await;
    flood(small(), false, 50_000).await;
    flood(RdmaConfig::default(), true, 50_000).await;
}

/// Frames queued between flushes travel together, in order, between two sides that
/// announced BATCH; a side that did not (as peers before it) gets each frame in a
/// message of its own, and its frames reach the other side as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_travel_in_batches_only_to_a_peer_that_takes_them() {
    for (a_batches, b_batches) in [(true, true), (true, false), (false, true)] {
        let config = |batch_frames| RdmaConfig {
            batch_frames,
            ..RdmaConfig::default()
        };
        let (mut a, mut b) =
            link_pair(&config(a_batches), &config(b_batches), MAX_FRAME, false).await;
        let case = format!("a batches: {a_batches}, b batches: {b_batches}");
        // 40 frames (a 4-byte header and a body) of the sizes at a batch's edges:
        // small ones; one that fills an empty send buffer to its last byte (8 + 4 +
        // frame = 8,192); one a byte longer and the longest eager one, which have no
        // room for an entry's length and go alone as EAGER; one past the eager limit
        // (rendezvous); one of a single byte.
        let largest = RdmaConfig::default().eager_threshold;
        let sizes = [
            20,
            largest - 8,
            20,
            largest - 7,
            1,
            largest - 4,
            20,
            largest - 3,
        ];
        let body = |i: u32| Bytes::from(vec![i as u8; sizes[i as usize % sizes.len()]]);
        for a_to_b in [true, false] {
            let (from, to) = if a_to_b {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            for i in 0u32..40 {
                send(from, &i.to_be_bytes(), body(i)).await;
            }
            flush(from).await;
            for i in 0u32..40 {
                let frame = recv(to).await.expect("a frame").expect("ok");
                assert_eq!(&frame[..4], &i.to_be_bytes(), "{case}: frame {i} in order");
                assert_eq!(frame[4..], body(i)[..], "{case}: frame {i}");
            }
        }
        let batches =
            |link: &rpc_transport_rdma::RdmaLink| link.stats().batches_sent.load(Ordering::Relaxed);
        // Of each 8 frames: 5 batched (the full one alone), 2 EAGER, 1 rendezvous.
        if a_batches && b_batches {
            for link in [&a, &b] {
                assert!(
                    (10..=25).contains(&batches(link)),
                    "{case}: {}",
                    batches(link)
                );
            }
        } else {
            assert_eq!((batches(&a), batches(&b)), (0, 0), "{case}");
        }
        assert_eq!(a.stats().eager_sent.load(Ordering::Relaxed), 35, "{case}");
        assert_eq!(
            a.stats().rendezvous_sent.load(Ordering::Relaxed),
            5,
            "{case}"
        );
        assert_eq!(
            b.stats().eager_received.load(Ordering::Relaxed),
            35,
            "{case}"
        );
    }
}

/// Each frame in a message of its own, as before BATCH: what the credit tests need.
fn unbatched(config: RdmaConfig) -> RdmaConfig {
    RdmaConfig {
        batch_frames: false,
        ..config
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_directions_at_once_with_few_buffers() {
    let config = RdmaConfig {
        recv_buffers: 4,
        ..RdmaConfig::default()
    };
    let (mut a, mut b) = link_pair(&config, &config, MAX_FRAME, false).await;
    let n = 5_000u32;
    let pump = |mut link: rpc_transport_rdma::RdmaLink| async move {
        let mut sent = 0u32;
        let mut got = 0u32;
        poll_fn(|cx| {
            loop {
                let mut progress = false;
                while sent < n {
                    match link.poll_ready(cx) {
                        std::task::Poll::Ready(Ok(())) => {
                            link.start_send(&sent.to_be_bytes(), Bytes::from_static(b"x").into())
                                .unwrap();
                            sent += 1;
                            progress = true;
                        }
                        std::task::Poll::Ready(Err(e)) => panic!("{e}"),
                        std::task::Poll::Pending => break,
                    }
                }
                let flushed = matches!(link.poll_flush(cx), std::task::Poll::Ready(Ok(())));
                while let std::task::Poll::Ready(frame) = link.poll_recv(cx) {
                    let frame = frame.expect("open").expect("ok");
                    assert_eq!(&frame[..4], &got.to_be_bytes());
                    got += 1;
                    progress = true;
                }
                // Done only once everything queued went out: a link that is not
                // polled sends nothing.
                if sent == n && got == n && flushed {
                    return std::task::Poll::Ready(());
                }
                if !progress {
                    return std::task::Poll::Pending;
                }
            }
        })
        .await;
        link
    };
    let watch = [
        (a.stats().clone(), a.endpoint().stats().clone()),
        (b.stats().clone(), b.endpoint().stats().clone()),
    ];
    let Ok((a2, b2)) = tokio::time::timeout(GUARD, async {
        tokio::join!(tokio::spawn(pump(a)), tokio::spawn(pump(b)))
    })
    .await
    else {
        panic!("deadlock: {watch:#?}");
    };
    a = a2.unwrap();
    b = b2.unwrap();
    for link in [&a, &b] {
        assert_eq!(link.endpoint().stats().rnr.load(Ordering::Relaxed), 0);
        assert!(link.stats().recv_held_peak.load(Ordering::Relaxed) <= 4);
    }
}

async fn rendezvous(config: RdmaConfig, tcp: bool) {
    let (mut a, mut b) = link_pair(&config, &config, MAX_FRAME, tcp).await;
    let big = Bytes::from(pattern(8 << 20, 5));
    send(&mut a, b"frame-header", big.clone()).await;
    // A small frame right behind it must not overtake it.
    send(&mut a, b"after", Bytes::new()).await;
    flush(&mut a).await;
    assert_eq!(a.stats().rendezvous_outstanding.load(Ordering::Relaxed), 1);
    assert_eq!(
        a.endpoint().stats().regions_live.load(Ordering::Relaxed),
        1,
        "exposed"
    );
    let frame = recv(&mut b).await.unwrap().unwrap();
    assert_eq!(&frame[..12], b"frame-header");
    assert!(frame[12..] == big[..], "8 MiB intact");
    assert_eq!(&recv(&mut b).await.unwrap().unwrap()[..], b"after");
    // An answer makes the sender handle the FIN that came before it.
    send(&mut b, b"ack", Bytes::new()).await;
    flush(&mut b).await;
    assert_eq!(&recv(&mut a).await.unwrap().unwrap()[..], b"ack");
    assert_eq!(
        a.stats().rendezvous_outstanding.load(Ordering::Relaxed),
        0,
        "released"
    );
    assert_eq!(
        a.endpoint().stats().regions_live.load(Ordering::Relaxed),
        0,
        "deregistered"
    );
    assert_eq!(b.stats().rendezvous_received.load(Ordering::Relaxed), 1);
    assert_eq!(b.stats().pulled_bytes.load(Ordering::Relaxed), 8 << 20);
    // Multi-segment payloads, and a header too long to go inline.
    let mut payload = rpc_core::Payload::new();
    for i in 0..7u8 {
        payload.push(Bytes::from(pattern(100_000 + usize::from(i), i)));
    }
    let header = vec![9u8; 1000];
    poll_fn(|cx| a.poll_ready(cx)).await.unwrap();
    a.start_send(&header, payload.clone()).unwrap();
    flush(&mut a).await;
    let frame = recv(&mut b).await.unwrap().unwrap();
    assert_eq!(&frame[..1000], &header[..]);
    assert!(frame[1000..] == payload.to_bytes()[..], "segments in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_frames_go_by_rendezvous_and_are_released() {
    rendezvous(RdmaConfig::default(), false).await;
    rendezvous(no_cma(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_over_the_limit_are_refused_before_allocation() {
    let config = RdmaConfig::default();
    // Eager: 5 KiB against a 4 KiB limit.
    let (mut a, mut b) = link_pair(&config, &config, 4096, false).await;
    send(&mut a, b"h", Bytes::from(vec![0u8; 5000])).await;
    flush(&mut a).await;
    let err = recv(&mut b).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FrameTooLarge, "{err}");
    // Rendezvous: 100 MiB announced against 1 MiB; nothing is pulled.
    let (mut a, mut b) = link_pair(&config, &config, 1 << 20, false).await;
    send(&mut a, b"h", Bytes::from(vec![0u8; 100 << 20])).await;
    flush(&mut a).await;
    let err = recv(&mut b).await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::FrameTooLarge, "{err}");
    assert!(err.to_string().contains("max_frame_len"), "{err}");
    assert_eq!(b.stats().pulled_bytes.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_close_ends_the_stream() {
    let config = RdmaConfig::default();
    let (mut a, mut b) = link_pair(&config, &config, MAX_FRAME, false).await;
    send(&mut a, b"last", Bytes::from(pattern(1 << 20, 1))).await;
    // Close waits until the peer has pulled the exposed frame.
    let closing = tokio::spawn(async move {
        poll_fn(|cx| a.poll_close(cx)).await.unwrap();
        a
    });
    assert_eq!(recv(&mut b).await.unwrap().unwrap().len(), 4 + (1 << 20));
    let a = tokio::time::timeout(GUARD, closing).await.unwrap().unwrap();
    assert!(recv(&mut b).await.is_none(), "clean end of stream");
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_server_and_channel_work_over_rdma() {
    for uri in [
        "rdma://127.0.0.1:0".to_string(),
        format!("rdma+unix://{}", common::socket_path("e2e").display()),
    ] {
        let listener = RdmaListener::bind(&uri.parse().unwrap(), RdmaConfig::default())
            .await
            .unwrap();
        let addr = listener.local_addr_uri();
        let server = Server::builder()
            .add_service(EchoServer::new(EchoService))
            .build();
        let task = tokio::spawn(async move { server.serve(listener).await });
        let channel = rpc_core::client::Channel::builder()
            .connect(RdmaConnector::from_uri(&addr).unwrap())
            .await
            .unwrap();
        let mut client = EchoClient::new(channel);
        for size in [0usize, 100, 8000, 9000, 3 << 20] {
            let payload = Bytes::from(pattern(size, 3));
            let reply = tokio::time::timeout(
                GUARD,
                client.say(Request::new(SayRequest {
                    message: format!("{size} bytes"),
                    payload: payload.clone(),
                })),
            )
            .await
            .unwrap()
            .unwrap()
            .into_inner();
            assert_eq!(reply.message, format!("{size} bytes"));
            assert!(reply.payload == payload, "{size}: payload intact");
        }
        // Many calls in flight at once over one connection.
        let calls = (0..200).map(|i| {
            let mut client = client.clone();
            async move {
                client
                    .say(Request::new(SayRequest {
                        message: i.to_string(),
                        payload: Bytes::from(vec![i as u8; i * 100]),
                    }))
                    .await
                    .unwrap()
                    .into_inner()
            }
        });
        let replies = tokio::time::timeout(GUARD, futures_join_all(calls))
            .await
            .unwrap();
        for (i, reply) in replies.into_iter().enumerate() {
            assert_eq!(reply.message, i.to_string());
            assert_eq!(reply.payload.len(), i * 100);
        }
        task.abort();
    }
}

/// Runs futures concurrently (the crate has no `futures` dependency).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_silent_clients_neither_stop_nor_hold_up_the_listener() {
    let listener = RdmaListener::bind(
        &"rdma://127.0.0.1:0".parse().unwrap(),
        RdmaConfig::default(),
    )
    .await
    .unwrap();
    let addr = listener.local_addr_uri();
    let tcp = addr.trim_start_matches("rdma://").to_owned();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let task = tokio::spawn(async move { server.serve(listener).await });
    // One client closes during setup, one sends garbage, one says nothing at all.
    drop(tokio::net::TcpStream::connect(&tcp).await.unwrap());
    let mut garbage = tokio::net::TcpStream::connect(&tcp).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut garbage, &[0, 0, 0, 3, 9, 9, 9])
        .await
        .unwrap();
    let _silent = tokio::net::TcpStream::connect(&tcp).await.unwrap();
    let channel = rpc_core::client::Channel::builder()
        .connect(RdmaConnector::from_uri(&addr).unwrap())
        .await
        .unwrap();
    let reply = tokio::time::timeout(
        GUARD,
        EchoClient::new(channel).say(Request::new(SayRequest {
            message: "still serving".into(),
            payload: Bytes::new(),
        })),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(reply.into_inner().message, "still serving");
    assert!(!task.is_finished(), "the server keeps serving");
    task.abort();
}

/// A server that stopped reading at its limit of calls in flight (four `Sleep`s that
/// do not end) sees its client go all the same: the connection ends, and its calls
/// with it. It used to learn of the close only by reading, and kept the connection
/// and its calls as long as the handlers ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_the_server_stopped_reading_ends_its_calls() {
    const CALLS: usize = 4;
    let path = common::socket_path("gone");
    let uri = format!("rdma+unix://{}", path.display());
    let listener = RdmaListener::bind(&uri.parse().unwrap(), RdmaConfig::default())
        .await
        .unwrap();
    let server = Server::builder()
        .max_concurrent_requests(CALLS)
        .add_service(EchoServer::new(EchoService))
        .build();
    let serving = server.clone();
    let task = tokio::spawn(async move { serving.serve(listener).await });
    let channel = rpc_core::client::Channel::builder()
        .connect(RdmaConnector::from_uri(&uri).unwrap())
        .await
        .unwrap();
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            let mut client = EchoClient::new(channel.clone());
            tokio::spawn(async move {
                client
                    .sleep(Request::new(rpc_proto::echo::SleepRequest {
                        delay_ms: u32::MAX,
                    }))
                    .await
            })
        })
        .collect();
    let in_flight = || -> usize { server.connections().iter().map(|c| c.in_flight).sum() };
    tokio::time::timeout(GUARD, async {
        while in_flight() < CALLS {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the calls never started");
    // The client goes: its calls, then its connection.
    for call in calls {
        call.abort();
    }
    drop(channel);
    tokio::time::timeout(GUARD, async {
        while server.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} calls outlived their client", in_flight()));
    task.abort();
}

/// What a sender out of credits reports to the server's eviction at its connection
/// limit (`Link::unsent`): not 0 while frames wait, moving as the peer takes frames
/// and returns credit (a slow reader keeps its place while it reads), and 0 once
/// everything went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsent_moves_as_the_peer_takes_frames() {
    use std::sync::{atomic::AtomicBool, Arc, Mutex};
    // One frame a message: 32 of them wait for 8 buffers' credit.
    let config = unbatched(small());
    let (mut a, mut b) = link_pair(&config, &config, MAX_FRAME, false).await;
    assert_eq!(a.unsent(), 0);
    for i in 0u32..32 {
        send(&mut a, &i.to_be_bytes(), Bytes::from_static(b"x")).await;
    }
    // The sender's task: sends what its credits allow, noting its measure each time.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn({
        let (seen, stop) = (seen.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                poll_fn(|cx| {
                    let _ = a.poll_flush(cx);
                    std::task::Poll::Ready(())
                })
                .await;
                seen.lock().unwrap().push(a.unsent());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            flush(&mut a).await;
            a
        }
    });
    // 32 frames against 8 receive buffers: the receiver takes them a few at a time.
    for i in 0..32 {
        if i % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        recv(&mut b).await.expect("a frame").expect("ok");
    }
    stop.store(true, Ordering::SeqCst);
    let a = tokio::time::timeout(GUARD, sender).await.unwrap().unwrap();
    assert_eq!(a.unsent(), 0, "everything went");
    let mut waiting: Vec<u64> = seen.lock().unwrap().clone();
    assert_ne!(waiting.first(), Some(&0), "frames waited for credit");
    waiting.retain(|&n| n != 0);
    waiting.dedup();
    assert!(
        waiting.len() >= 2,
        "the measure stayed at {waiting:?} while the peer took frames"
    );
}

/// `unsent` counts what only the peer's reading moves: while a large frame waits for
/// the peer to pull it, this side's own CREDIT messages (sent as it reads what the
/// peer sends) leave the measure where it was. They moved it, so a peer that sent a
/// few frames now and then and never pulled the answers kept its place at the
/// server's connection limit, and the answers held, for good (from a review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsent_does_not_move_with_this_sides_own_credit_messages() {
    let (mut a, mut b) = link_pair(&small(), &small(), MAX_FRAME, false).await;
    // b sends small frames, as many as a's credit lets through.
    for i in 0u32..4 {
        send(&mut b, &i.to_be_bytes(), Bytes::from_static(b"x")).await;
        flush(&mut b).await;
    }
    // a exposes a large frame, which b (not reading) never pulls.
    send(&mut a, b"large", Bytes::from(vec![7u8; 1 << 20])).await;
    poll_fn(|cx| {
        let _ = a.poll_flush(cx);
        std::task::Poll::Ready(())
    })
    .await;
    let before = a.unsent();
    assert_ne!(before, 0, "the large frame waits for its pull");
    // a reads b's frames: its receive buffers go back to b, with CREDIT messages.
    for _ in 0..4 {
        recv(&mut a).await.expect("a frame").expect("ok");
    }
    for _ in 0..10 {
        poll_fn(|cx| {
            let _ = a.poll_flush(cx);
            std::task::Poll::Ready(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        a.stats().credit_messages.load(Ordering::Relaxed) > 0,
        "no CREDIT was sent: the case is not made"
    );
    assert_eq!(a.unsent(), before, "moved by this side's own sends");
    drop(b);
}

/// The soft provider as a verbs queue pair would behave, for what the tests check:
/// its operations posted and not completed are counted as a send queue bounds them
/// (hardware refuses a post past its depth; the soft provider does not, so the most
/// seen at once is kept for the test to check), and while `hold` is set its send
/// completions are held back, as sends still on the wire.
struct Watched {
    ep: rpc_transport_rdma::soft::SoftEndpoint,
    posted: usize,
    peak: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    hold: std::sync::Arc<std::sync::atomic::AtomicBool>,
    held: Vec<
        rpc_transport_rdma::provider::Completion<
            <Self as rpc_transport_rdma::provider::Endpoint>::Buf,
        >,
    >,
}

impl Watched {
    fn new(ep: rpc_transport_rdma::soft::SoftEndpoint) -> Watched {
        Watched {
            ep,
            posted: 0,
            peak: Default::default(),
            hold: Default::default(),
            held: Vec::new(),
        }
    }

    fn post(&mut self) {
        self.posted += 1;
        self.peak.fetch_max(self.posted, Ordering::Relaxed);
    }
}

impl rpc_transport_rdma::provider::Endpoint for Watched {
    type Buf =
        <rpc_transport_rdma::soft::SoftEndpoint as rpc_transport_rdma::provider::Endpoint>::Buf;
    type Region =
        <rpc_transport_rdma::soft::SoftEndpoint as rpc_transport_rdma::provider::Endpoint>::Region;
    type Handle =
        <rpc_transport_rdma::soft::SoftEndpoint as rpc_transport_rdma::provider::Endpoint>::Handle;

    fn caps(&self) -> rpc_transport_rdma::provider::Caps {
        self.ep.caps()
    }
    fn recv_buffers(&self) -> usize {
        self.ep.recv_buffers()
    }
    fn recv_buffer_len(&self) -> usize {
        self.ep.recv_buffer_len()
    }
    fn alloc(&self, len: usize) -> Result<Self::Buf, rpc_core::Error> {
        self.ep.alloc(len)
    }
    fn expose(&self, bytes: Bytes) -> Result<Self::Region, rpc_core::Error> {
        self.ep.expose(bytes)
    }
    fn register(
        &self,
        buf: Self::Buf,
        access: rpc_transport_rdma::provider::Access,
    ) -> Result<Self::Region, rpc_core::Error> {
        self.ep.register(buf, access)
    }
    fn post_recv(&mut self, wr: u64, buf: Self::Buf) -> Result<(), rpc_core::Error> {
        self.ep.post_recv(wr, buf)
    }
    fn post_send(
        &mut self,
        wr: u64,
        buf: Self::Buf,
        len: usize,
        signaled: bool,
    ) -> Result<(), rpc_core::Error> {
        self.post();
        self.ep.post_send(wr, buf, len, signaled)
    }
    fn post_read(
        &mut self,
        wr: u64,
        dst: Self::Buf,
        dst_offset: usize,
        src: rpc_transport_rdma::provider::RemoteSlice,
    ) -> Result<(), rpc_core::Error> {
        self.post();
        self.ep.post_read(wr, dst, dst_offset, src)
    }
    fn post_write(
        &mut self,
        wr: u64,
        src: Self::Buf,
        src_offset: usize,
        dst: rpc_transport_rdma::provider::RemoteSlice,
    ) -> Result<(), rpc_core::Error> {
        self.post();
        self.ep.post_write(wr, src, src_offset, dst)
    }
    fn poll_completion(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<rpc_transport_rdma::provider::Completion<Self::Buf>, rpc_core::Error>>
    {
        use rpc_transport_rdma::provider::Op;
        let hold = self.hold.load(Ordering::SeqCst);
        let polled = match self.held.pop() {
            Some(c) if !hold => std::task::Poll::Ready(Ok(c)),
            held => {
                self.held.extend(held);
                loop {
                    match self.ep.poll_completion(cx) {
                        std::task::Poll::Ready(Ok(c)) if hold && matches!(c.op, Op::Send) => {
                            self.held.push(c)
                        }
                        other => break other,
                    }
                }
            }
        };
        if let std::task::Poll::Ready(Ok(c)) = &polled {
            if !matches!(c.op, Op::Recv) {
                self.posted -= 1;
            }
        }
        polled
    }
    fn poll_close(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), rpc_core::Error>> {
        self.ep.poll_close(cx)
    }
    fn peer(&self) -> String {
        self.ep.peer()
    }
    fn handle(&self) -> Self::Handle {
        self.ep.handle()
    }
}

/// Small frames (batched) and large ones (rendezvous: the receiver's reads) both
/// ways at once on the shallowest send queue: an open batch holds its place in the
/// queue, so a read started before it is sealed never makes one operation too many
/// (it did: the batch was counted only when posted, from a review). Each side is
/// polled until the peer released every frame it exposed, not only until its own
/// flush: see the pump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_pulls_keep_within_the_send_queue() {
    for depth in [8, 9, 13] {
        for recv_buffers in [4, 16] {
            for batch_frames in [true, false] {
                let config = RdmaConfig {
                    send_queue_depth: depth,
                    recv_buffers,
                    batch_frames,
                    ..RdmaConfig::default()
                };
                mixed_traffic_within_the_send_queue(config).await;
            }
        }
    }
}

async fn mixed_traffic_within_the_send_queue(config: RdmaConfig) {
    let (a, b) = common::endpoint_pair(&config, &config, false).await;
    let (a, b) = (Watched::new(a), Watched::new(b));
    let peaks = [a.peak.clone(), b.peak.clone()];
    let a = rpc_transport_rdma::RdmaLink::new(a, &config, MAX_FRAME).unwrap();
    let b = rpc_transport_rdma::RdmaLink::new(b, &config, MAX_FRAME).unwrap();
    let n = 3_000u32;
    let large = Bytes::from(vec![7u8; 20_000]);
    let pump = |mut link: rpc_transport_rdma::RdmaLink<Watched>| {
        let large = large.clone();
        async move {
            let (mut sent, mut got) = (0u32, 0u32);
            poll_fn(|cx| loop {
                let mut progress = false;
                while sent < n {
                    match link.poll_ready(cx) {
                        std::task::Poll::Ready(Ok(())) => {
                            let body = if sent % 7 == 3 {
                                large.clone()
                            } else {
                                Bytes::from_static(b"small")
                            };
                            link.start_send(&sent.to_be_bytes(), body.into()).unwrap();
                            sent += 1;
                            progress = true;
                            if sent % 5 == 0 {
                                break;
                            }
                        }
                        std::task::Poll::Ready(Err(e)) => panic!("{e}"),
                        std::task::Poll::Pending => break,
                    }
                }
                let flushed = matches!(link.poll_flush(cx), std::task::Poll::Ready(Ok(())));
                while let std::task::Poll::Ready(frame) = link.poll_recv(cx) {
                    let frame = frame.expect("open").expect("ok");
                    assert_eq!(&frame[..4], &got.to_be_bytes(), "in order");
                    got += 1;
                    progress = true;
                }
                // Done only once the peer also released every frame this side
                // exposed. The peer's last FINs may wait for credit that only this
                // side gives back, by handling the FINs before them (its receive
                // buffers): a pump that stopped at its own flush left those in its
                // queue, unread, and the peer waited for ever with FINs to send
                // (about 1 run in 12 under load). A connection's task polls its
                // link for as long as it lives; a pump must too.
                let released = link.stats().rendezvous_outstanding.load(Ordering::Relaxed) == 0;
                if sent == n && got == n && flushed && released {
                    return std::task::Poll::Ready(());
                }
                if !progress {
                    return std::task::Poll::Pending;
                }
            })
            .await;
            link
        }
    };
    let watch = [a.stats().clone(), b.stats().clone()];
    let (mut a, mut b) = (tokio::spawn(pump(a)), tokio::spawn(pump(b)));
    let Ok((a, b)) = tokio::time::timeout(GUARD, async { tokio::join!(&mut a, &mut b) }).await
    else {
        panic!(
            "the exchange hung with {config:?} (pumps finished: {:?}): {watch:?}",
            [a.is_finished(), b.is_finished()]
        );
    };
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(
        a.stats().batches_sent.load(Ordering::Relaxed) > 0,
        config.batch_frames
    );
    assert!(b.stats().rendezvous_received.load(Ordering::Relaxed) > 0);
    let peak = peaks
        .iter()
        .map(|p| p.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    assert!(
        peak <= config.send_queue_depth,
        "{peak} operations in flight on a send queue of {}",
        config.send_queue_depth
    );
}

/// A link closes its endpoint only once its sends have completed: a verbs queue
/// pair torn down with sends on the wire drops them, and the last frames (an
/// answer, a GOAWAY) with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_the_sends_in_flight() {
    let config = RdmaConfig::default();
    let (a, b) = common::endpoint_pair(&config, &config, false).await;
    let a = Watched::new(a);
    let hold = a.hold.clone();
    hold.store(true, Ordering::SeqCst);
    let mut a = rpc_transport_rdma::RdmaLink::new(a, &config, MAX_FRAME).unwrap();
    let mut b = rpc_transport_rdma::RdmaLink::new(b, &config, MAX_FRAME).unwrap();
    send(&mut a, b"last", Bytes::from_static(b" words")).await;
    flush(&mut a).await;
    assert_eq!(
        &recv(&mut b).await.expect("a frame").unwrap()[..],
        b"last words"
    );
    // Its sends' completions held back: the close waits (a wait that does not end
    // is what is checked; it ended at once before).
    let closing =
        tokio::time::timeout(Duration::from_millis(300), poll_fn(|cx| a.poll_close(cx))).await;
    assert!(closing.is_err(), "closed with sends in flight: {closing:?}");
    hold.store(false, Ordering::SeqCst);
    tokio::time::timeout(GUARD, poll_fn(|cx| a.poll_close(cx)))
        .await
        .expect("the close ends once the sends complete")
        .unwrap();
}
