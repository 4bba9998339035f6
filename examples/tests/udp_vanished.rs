//! UDP per-peer sockets of clients that vanished without a CLOSE, in a process of its
//! own (the test counts this process's descriptors).

use std::{sync::atomic::Ordering, time::Duration};

use rpc_core::server::Server;
use rpc_proto::echo::{echo_server::EchoServer, EchoService};
use rpc_transport_udp::{UdpConfig, UdpListener};
use tokio::net::UdpSocket;

mod common;
use common::udp::{open_association, raw_say};

/// Hang guard; never a measure of speed.
const GUARD: Duration = Duration::from_secs(120);

/// How many descriptors this process has open.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Clients that made a call and vanished without a CLOSE (killed processes) keep
/// their associations for the idle timeout, but not their sockets: each per-peer
/// socket closes once its peer has idled `peer_socket_idle_timeout`, and a peer that
/// calls again gets one back, its calls answered as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_clients_hold_no_descriptors_and_a_returning_one_is_served() {
    const VANISHED: usize = 300;
    let config = UdpConfig {
        peer_socket_idle_timeout: Duration::from_millis(300),
        ..UdpConfig::default()
    };
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let listener = UdpListener::bind("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let addr = listener.local_socket_addr();
    let stats = listener.stats().clone();
    let _serving = tokio::spawn(async move { server.serve(listener).await });
    let before = open_descriptors();

    // One that stays, and calls again after idling past the socket's timeout.
    let returning = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    returning.connect(addr).await.unwrap();
    open_association(&returning).await;
    raw_say(&returning, 1, "first", false).await;

    tokio::time::timeout(GUARD, async {
        for i in 0..VANISHED {
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            socket.connect(addr).await.unwrap();
            open_association(&socket).await;
            raw_say(&socket, 1, &format!("call {i}"), false).await;
            // Dropped without a CLOSE.
        }
        // Every per-peer socket closes once its peer idles, the returning one's too.
        while stats.peer_sockets_live.load(Ordering::Relaxed) > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("per-peer sockets were not released");
    let associations = stats.peers_live.load(Ordering::Relaxed);
    let descriptors = open_descriptors();
    eprintln!(
        "associations {associations}, descriptors {before} -> {descriptors}, released {}",
        stats.peer_sockets_released.load(Ordering::Relaxed)
    );
    // The associations stay (until the idle timeout, or evicted when the table is
    // full); their descriptors do not (the returning client's raw socket is one).
    assert!(associations > VANISHED / 2, "{associations}");
    assert!(
        descriptors <= before + 8,
        "descriptors grew from {before} to {descriptors}"
    );
    // Each vanished client's socket was released for idleness, but for the few whose
    // port the kernel handed to a later client (that association was replaced, its
    // socket closed with it).
    let released = stats.peer_sockets_released.load(Ordering::Relaxed);
    assert!(released >= VANISHED as u64 * 9 / 10, "{released} released");

    // The returning client is answered (through the listener's socket at first), and
    // its association gets its own socket again.
    let made = stats.peer_sockets.load(Ordering::Relaxed);
    tokio::time::timeout(GUARD, raw_say(&returning, 2, "again", false))
        .await
        .expect("the returning client's call hung");
    assert!(stats.peer_sockets.load(Ordering::Relaxed) > made);
}
