//! etcd reached through a connection that goes silent (a host cut off: nothing is
//! refused or reset, bytes just stop arriving). Neither HTTP/2 nor TCP says anything,
//! so the follower must notice on its own (a progress request that gets no answer) and
//! move to new connections; the registration's renewals likewise (a renewal that gets
//! no answer). Against a real etcd, found (or skipped) as in `etcd.rs`; the silence is
//! a proxy of the test's own in front of it.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::StreamExt;
use rpc_core::{balance::Change, Endpoint};
use rpc_discovery_etcd::{
    proto::etcdserverpb::{kv_client::KvClient, RangeRequest},
    Backoff,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

mod common;
use common::{cluster, unique};

/// A TCP proxy whose connections can be silenced: what they carry afterwards is read
/// and dropped, in both directions, while the sockets stay open. Connections accepted
/// after [`Silencer::silence`] are forwarded.
struct Silencer {
    addr: SocketAddr,
    /// Connections with an index below this are silent.
    silent_below: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Silencer {
    async fn start(upstream: SocketAddr) -> Silencer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent_below = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (silent_below, accepted) = (silent_below.clone(), accepted.clone());
            async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let index = accepted.fetch_add(1, Ordering::SeqCst);
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        continue;
                    };
                    let (client_r, client_w) = client.into_split();
                    let (server_r, server_w) = server.into_split();
                    for (from, to) in [(client_r, server_w), (server_r, client_w)] {
                        let silent_below = silent_below.clone();
                        connections.spawn(forward(from, to, index, silent_below));
                    }
                }
            }
        });
        Silencer {
            addr,
            silent_below,
            accepted,
            task,
        }
    }

    /// Silences every connection open now.
    fn silence(&self) {
        self.silent_below
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

impl Drop for Silencer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    index: u64,
    silent_below: Arc<AtomicU64>,
) {
    let mut buf = vec![0; 64 << 10];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if index < silent_below.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

async fn next(changes: &mut (impl futures::Stream<Item = Change> + Unpin), within: Duration) {
    match tokio::time::timeout(within, changes.next()).await {
        Ok(Some(Change::Insert(_))) => {}
        other => panic!("expected an Insert within {within:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_and_a_registration_survive_their_connection_going_silent() {
    let Some(cluster) = cluster() else { return };
    let upstream: SocketAddr = cluster[0].parse().unwrap();
    let proxy = Silencer::start(upstream).await;
    let through_proxy = [proxy.addr.to_string()];
    let service = unique("silence");
    let backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    let mut changes = rpc_discovery_etcd::resolve_with(&through_proxy, &service, backoff)
        .await
        .unwrap();
    // Registered through the proxy, with a lease shorter than the silence lasts.
    let a: Endpoint = "tcp://127.0.0.1:1".parse().unwrap();
    let ttl = Duration::from_secs(5);
    let reg_a = rpc_discovery_etcd::register(&through_proxy, &service, &a, ttl)
        .await
        .unwrap();
    next(&mut changes, Duration::from_secs(10)).await;

    proxy.silence();
    // Registered directly: only a follower that left the silent connection sees it.
    let b: Endpoint = "tcp://127.0.0.1:2".parse().unwrap();
    let _reg_b = rpc_discovery_etcd::register(&cluster, &service, &b, Duration::from_secs(30))
        .await
        .unwrap();
    // 10 s of silence, 5 s for the progress answer, then a new watch.
    next(&mut changes, Duration::from_secs(30)).await;

    // a's renewals moved to new connections too: its key is still there, well past
    // its TTL.
    let mut kv = KvClient::new(
        rpc_transport_grpc::connect(&format!("grpc://{}", cluster[0]))
            .await
            .unwrap(),
    );
    let listed = kv
        .range(RangeRequest {
            key: reg_a.key().to_owned().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.kvs.len(), 1, "a's lease expired during the silence");
    reg_a.deregister().await.unwrap();
}
