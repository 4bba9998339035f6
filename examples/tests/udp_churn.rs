//! The interop suite over `udp://` among thousands of dead associations, in a process
//! of its own (the other UDP tests count this process's descriptors and memory).

use std::{sync::atomic::Ordering, time::Duration};

use rpc_core::server::Server;
use rpc_transport_udp::{UdpConfig, UdpListener};
use tokio::net::UdpSocket;

mod common;
use common::udp::open_association;

/// Hang guard; never a measure of speed.
const GUARD: Duration = Duration::from_secs(120);

/// The interop suite over `udp://` passes 50 runs in a row, each a new client, while
/// 2,000 dead associations exist (clients that opened one and vanished without a
/// CLOSE, as killed processes do): the kernel hands new clients ports of dead ones,
/// and none may inherit anything of its predecessor (issue 18's one run in eight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interop_suite_passes_50_runs_among_2000_dead_associations() {
    use rpc_examples::interop::{
        client::{Target, TestCase},
        server::InteropService,
    };
    const DEAD: usize = 2000;
    const RUNS: usize = 50;
    let server = Server::builder()
        .compression(Some(rpc_core::compress::Compression::default()))
        .unwrap()
        .add_service(InteropService::default().into_service())
        .build();
    // Dead associations that never completed a call are forgotten after
    // `new_peer_idle_timeout`; here they must outlive the 50 runs.
    let config = UdpConfig {
        new_peer_idle_timeout: Duration::from_secs(600),
        ..UdpConfig::default()
    };
    let listener = UdpListener::bind("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let addr = listener.local_socket_addr();
    let stats = listener.stats().clone();
    let _serving = tokio::spawn(async move { server.serve(listener).await });
    tokio::time::timeout(GUARD, async {
        for _ in 0..DEAD {
            // Opened, then dropped without a word.
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            socket.connect(addr).await.unwrap();
            open_association(&socket).await;
        }
    })
    .await
    .expect("opening the dead associations hung");
    assert!(stats.peers_live.load(Ordering::Relaxed) >= DEAD / 2);
    let uri = format!("udp://{addr}");
    for run in 0..RUNS {
        let target = Target::connect(&uri).await.unwrap();
        for &case in TestCase::ALL {
            if let Some(why) = case.unavailable() {
                eprintln!("skipped {case}: {why}");
                continue;
            }
            let result = tokio::time::timeout(GUARD, case.run(&target))
                .await
                .unwrap_or_else(|_| panic!("run {run}: {case} hung"));
            if let Err(why) = result {
                panic!("run {run}: {case} failed: {why}");
            }
        }
    }
}
