//! The proxies against a real echo server on loopback.

use std::{net::SocketAddr, sync::atomic::Ordering, time::Duration};

use fault_proxy::{TcpFaults, TcpProxy, UdpFaults, UdpProxy};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, UdpSocket},
    sync::mpsc,
};

/// A TCP echo server that reports every chunk it receives.
async fn tcp_echo() -> (SocketAddr, mpsc::UnboundedReceiver<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let _ = tx.send(n);
                    if s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, rx)
}

async fn next_seen(seen: &mut mpsc::UnboundedReceiver<usize>) -> Option<usize> {
    tokio::time::timeout(Duration::from_secs(5), seen.recv())
        .await
        .expect("the server received nothing")
}

async fn read_some(s: &mut TcpStream) -> std::io::Result<usize> {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("read hung")
}

#[tokio::test]
async fn cut_before_response_delivers_the_request_and_loses_the_answer() {
    let (upstream, mut seen) = tcp_echo().await;
    let proxy = TcpProxy::start(
        upstream,
        TcpFaults {
            cut_before_response: true,
            faulty_connections: Some(1),
            ..TcpFaults::default()
        },
    )
    .await
    .unwrap();
    let mut first = TcpStream::connect(proxy.addr()).await.unwrap();
    first.write_all(b"request").await.unwrap();
    assert_eq!(
        next_seen(&mut seen).await,
        Some(7),
        "the server got the request"
    );
    assert_eq!(
        read_some(&mut first).await.unwrap_or(0),
        0,
        "the answer was cut"
    );
    assert_eq!(proxy.counters().cut.load(Ordering::SeqCst), 1);

    // Only the first connection is faulty.
    let mut second = TcpStream::connect(proxy.addr()).await.unwrap();
    second.write_all(b"again").await.unwrap();
    assert_eq!(read_some(&mut second).await.unwrap(), 5);
}

#[tokio::test]
async fn cut_after_n_bytes_and_reset() {
    let (upstream, mut seen) = tcp_echo().await;
    let proxy = TcpProxy::start(
        upstream,
        TcpFaults {
            cut_after_request_bytes: Some(3),
            reset: true,
            ..TcpFaults::default()
        },
    )
    .await
    .unwrap();
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"abcdef").await.unwrap();
    assert_eq!(
        next_seen(&mut seen).await,
        Some(3),
        "only 3 bytes went through"
    );
    let mut total = 0;
    let err = loop {
        match read_some(&mut s).await {
            Ok(0) => panic!("closed with FIN, expected a reset"),
            Ok(n) => total += n,
            Err(e) => break e,
        }
    };
    assert!(total <= 3);
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
}

async fn udp_echo() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        loop {
            let (n, from) = socket.recv_from(&mut buf).await.unwrap();
            let _ = socket.send_to(&buf[..n], from).await;
        }
    });
    addr
}

async fn udp_run(seed: u64) -> (u64, u64, u64, Vec<u32>) {
    let upstream = udp_echo().await;
    let proxy = UdpProxy::start(
        upstream,
        UdpFaults {
            drop: 0.2,
            duplicate: 0.1,
            reorder: 0.1,
            seed,
            ..UdpFaults::default()
        },
    )
    .await
    .unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.connect(proxy.addr()).await.unwrap();
    let mut got = Vec::new();
    for i in 0..300u32 {
        client.send(&i.to_be_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let mut buf = [0u8; 16];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(200), client.recv(&mut buf)).await
    {
        assert_eq!(n, 4);
        got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
    }
    let c = proxy.counters();
    (
        c.dropped.load(Ordering::SeqCst),
        c.duplicated.load(Ordering::SeqCst),
        c.reordered.load(Ordering::SeqCst),
        got,
    )
}

#[tokio::test]
async fn udp_faults_are_counted_and_seeded() {
    let (dropped, duplicated, reordered, got) = udp_run(7).await;
    // 300 datagrams each way: the faults hit a plausible share of them.
    assert!((60..=180).contains(&dropped), "dropped {dropped}");
    assert!(duplicated > 10, "duplicated {duplicated}");
    assert!(reordered > 10, "reordered {reordered}");
    let mut sorted = got.clone();
    sorted.sort_unstable();
    assert!(sorted != got, "nothing arrived out of order");
    sorted.dedup();
    assert!(sorted.len() < got.len(), "nothing arrived twice");
    assert!(sorted.len() < 300, "nothing was lost");

    // The same seed makes the same decisions for the same traffic.
    let (dropped2, duplicated2, _, _) = udp_run(7).await;
    assert_eq!((dropped, duplicated), (dropped2, duplicated2));
}
