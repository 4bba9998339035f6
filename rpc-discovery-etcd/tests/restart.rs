//! etcd restarting, and compacting the history a watch needs, under a client that
//! keeps calling (issue 15 item 4): the client's calls go on meanwhile, and it sees
//! replicas registered and deregistered after the restarts.
//!
//! The test runs an etcd of its own (the `etcd` binary, on ports of its own, in a data
//! directory of its own) so that it can kill and restart it without disturbing the
//! shared etcd on 2379. Without the binary it is skipped with a message, except under
//! CI (`CI` set), where that fails it.

use std::{
    path::Path,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use rpc_core::{balance::Balanced, client::Channel, server::Server, Endpoint};
use rpc_discovery_etcd::{
    proto::etcdserverpb::{
        kv_client::KvClient, CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest,
    },
    Backoff, PREFIX,
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_tcp::StreamChannels;
use tokio::process::{Child, Command};

mod common;

use common::{free_port, have_etcd, TempDir};

/// Bound of each wait for etcd or for the client to see a change: far above what
/// either takes (about a second), only so that a failure ends the test.
const PATIENCE: Duration = Duration::from_secs(30);

/// The lease of the replica registered before the restarts: longer than etcd is away
/// (etcd renews every lease when it restarts), short enough that the test sees it
/// expire if the registration stopped renewing it.
const A_TTL: Duration = Duration::from_secs(5);

/// An etcd process of the test's own, killed when dropped.
struct Etcd {
    child: Option<Child>,
}

impl Etcd {
    /// Starts etcd serving clients on `client_port`, with the data in `dir` (new or
    /// left by an earlier run), and waits until it answers.
    async fn start(dir: &Path, client_port: u16, peer_port: u16) -> Etcd {
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--name=restart-test")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=restart-test={peer}"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start etcd");
        let etcd = Etcd { child: Some(child) };
        let ready = async {
            loop {
                if let Ok(mut kv) = kv(client_port).await {
                    let probe = RangeRequest {
                        key: "ready".into(),
                        ..Default::default()
                    };
                    if kv.range(probe).await.is_ok() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if tokio::time::timeout(PATIENCE, ready).await.is_err() {
            let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
            panic!("etcd did not start on {client}:\n{log}");
        }
        etcd
    }

    /// Kills it (SIGKILL: no clean shutdown) and waits until it is gone.
    async fn kill(mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().await.unwrap();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
    }
}

/// etcd's KV client (our gRPC client) on the etcd serving clients on `port`, for
/// what the test writes itself.
async fn kv(port: u16) -> Result<KvClient<Channel>, rpc_core::Error> {
    let channel = rpc_transport_grpc::connect(&format!("grpc://127.0.0.1:{port}")).await?;
    Ok(KvClient::new(channel))
}

async fn replica() -> (Endpoint, tokio::task::JoinHandle<()>) {
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let endpoint: Endpoint = listener.local_addr_uri().parse().unwrap();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let task = tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    (endpoint, task)
}

/// A balancer following `service` in `cluster`, quick to retry, and the task
/// following it.
async fn follow(cluster: &[String], service: &str) -> (Balanced, tokio::task::JoinHandle<()>) {
    let balanced = Balanced::new(StreamChannels::default());
    let backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    let changes = rpc_discovery_etcd::resolve_with(cluster, service, backoff)
        .await
        .unwrap();
    let following = tokio::spawn(balanced.follow(changes));
    (balanced, following)
}

/// Waits until the client knows exactly `expected`.
async fn wait_for(balanced: &Balanced, expected: &[&Endpoint], what: &str) {
    let mut expected: Vec<String> = expected.iter().map(|e| e.to_string()).collect();
    expected.sort();
    let known = || {
        let mut known: Vec<String> = balanced.endpoints().iter().map(|e| e.to_string()).collect();
        known.sort();
        known
    };
    let waiting = async {
        while known() != expected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, waiting).await.is_err() {
        panic!(
            "{what}: expected {expected:?}, the client knows {:?}",
            known()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_resumes_across_restarts_and_compaction() {
    if !have_etcd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rpc-etcd-restart-{}", common::unique("t")));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = TempDir(dir.clone());
    let (port, side_port, peer_port) = (free_port(), free_port(), free_port());
    let cluster = [format!("127.0.0.1:{port}")];
    let service = common::unique("restarted");

    let etcd = Etcd::start(&dir, port, peer_port).await;
    let (a, _a_task) = replica().await;
    let (b, _b_task) = replica().await;
    let (c, _c_task) = replica().await;
    // A short lease: it must be renewed across the restarts, or a goes.
    let _reg_a = rpc_discovery_etcd::register(&cluster, &service, &a, A_TTL)
        .await
        .unwrap();

    let (balanced, following) = follow(&cluster, &service).await;
    wait_for(&balanced, &[&a], "at the start").await;

    // A client that keeps calling throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let caller = tokio::spawn({
        let mut client = EchoClient::new(balanced.clone());
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                let said = client
                    .say(SayRequest {
                        message: "x".into(),
                        payload: Default::default(),
                    })
                    .await;
                let counter = if said.is_ok() { &ok } else { &failed };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });

    // Restart 1: etcd comes back where the client cannot reach it (another client
    // port, same data), b is registered and the history compacted; then it comes back
    // where the client can. The client's resume revision is gone: it lists again.
    etcd.kill().await;
    let side = Etcd::start(&dir, side_port, peer_port).await;
    let mut admin = kv(side_port).await.unwrap();
    let b_key = format!("{PREFIX}{service}/b-without-lease");
    let put = admin
        .put(PutRequest {
            key: b_key.clone().into(),
            value: b.to_string().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let revision = put.header.unwrap().revision;
    admin
        .compact(CompactionRequest {
            revision,
            physical: true,
        })
        .await
        .unwrap();
    drop(admin);
    side.kill().await;
    let etcd = Etcd::start(&dir, port, peer_port).await;
    wait_for(&balanced, &[&a, &b], "after a compacting restart").await;

    // Restart 2, plain: replicas registered and deregistered afterwards are seen.
    etcd.kill().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _etcd = Etcd::start(&dir, port, peer_port).await;
    let reg_c = rpc_discovery_etcd::register(&cluster, &service, &c, Duration::from_secs(60))
        .await
        .unwrap();
    wait_for(&balanced, &[&a, &b, &c], "c registered after the restart").await;
    reg_c.deregister().await.unwrap();
    let mut admin = kv(port).await.unwrap();
    admin
        .delete_range(DeleteRangeRequest {
            key: b_key.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_for(&balanced, &[&a], "c deregistered and b deleted").await;

    // a's registration renews its lease on the restarted etcd: a is still there
    // after two of its TTLs.
    tokio::time::sleep(2 * A_TTL + Duration::from_secs(1)).await;
    wait_for(&balanced, &[&a], "a's lease kept alive across the restarts").await;

    stop.store(true, Ordering::SeqCst);
    caller.await.unwrap();
    following.abort();
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert!(ok > 10, "the client kept calling: {ok} calls");
    assert_eq!(
        failed, 0,
        "no call failed while etcd was away ({ok} succeeded)"
    );
}

/// etcd's data wiped while the client was away: a new cluster at the same address,
/// its history started over and already past the client's revision when the client
/// is back. The client lists again and drops the replica the new cluster does not
/// have. (A review: the watch resumed from the old revision in the new history, so
/// the old cluster's replica stayed for good beside the new one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_etcd_past_the_clients_revision_is_listed_again() {
    if !have_etcd() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rpc-etcd-wiped-{}", common::unique("t")));
    let (old, new) = (dir.join("old"), dir.join("new"));
    std::fs::create_dir_all(&old).unwrap();
    std::fs::create_dir_all(&new).unwrap();
    let _cleanup = TempDir(dir.clone());
    let (port, side_port, peer_port) = (free_port(), free_port(), free_port());
    let cluster = [format!("127.0.0.1:{port}")];
    let service = common::unique("wiped");
    let (a, _a_task) = replica().await;
    let (b, _b_task) = replica().await;
    let put = |port: u16, name: String, value: String| async move {
        let mut admin = kv(port).await.unwrap();
        admin
            .put(PutRequest {
                key: name.into(),
                value: value.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    };

    let etcd = Etcd::start(&old, port, peer_port).await;
    put(port, format!("{PREFIX}{service}/a"), a.to_string()).await;
    let (balanced, following) = follow(&cluster, &service).await;
    wait_for(&balanced, &[&a], "at the start").await;

    // The new cluster, where the client cannot reach it yet: writes take its revision
    // past the client's, the last one registers b.
    etcd.kill().await;
    let side = Etcd::start(&new, side_port, peer_port).await;
    for i in 0..5 {
        put(side_port, format!("unrelated/{i}"), "x".into()).await;
    }
    put(side_port, format!("{PREFIX}{service}/b"), b.to_string()).await;
    side.kill().await;
    let _etcd = Etcd::start(&new, port, peer_port).await;
    wait_for(&balanced, &[&b], "after the wiped etcd came back").await;
    following.abort();
}
