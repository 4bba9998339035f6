//! Against a real etcd server (`.ci/run` starts one on 127.0.0.1:2379; set
//! `RPC_ETCD_ENDPOINTS` to use another). Without one, the tests are skipped with a
//! message, except under CI (`CI` set), where a missing etcd fails them. The last
//! one needs no etcd.

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::StreamExt;
use rpc_core::{
    balance::{Balanced, Change},
    retry::RetryPolicy,
    server::Server,
    Endpoint, Request, Response, Status,
};
use rpc_proto::echo::{
    echo_client::EchoClient,
    echo_server::{Echo, EchoServer},
    CountRequest, EchoService, FailReply, FailRequest, SayReply, SayRequest, SleepReply,
    SleepRequest, SumReply, SumRequest,
};
use rpc_transport_tcp::StreamChannels;

mod common;
use common::{cluster, unique};

/// Echo that counts its calls.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicUsize>);

impl Echo for Counted {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        EchoService.say(request).await
    }
    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<SleepReply>, Status> {
        EchoService.sleep(request).await
    }
    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<FailReply>, Status> {
        EchoService.fail(request).await
    }

    type CountStream = <EchoService as Echo>::CountStream;

    async fn count(
        &self,
        request: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        EchoService.count(request).await
    }

    async fn sum(
        &self,
        request: Request<rpc_core::stream::Streaming<SumRequest>>,
    ) -> Result<Response<SumReply>, Status> {
        EchoService.sum(request).await
    }

    type ChatStream = <EchoService as Echo>::ChatStream;

    async fn chat(
        &self,
        request: Request<rpc_core::stream::Streaming<SayRequest>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        EchoService.chat(request).await
    }
}

async fn replica() -> (Endpoint, Counted, tokio::task::JoinHandle<()>) {
    let counted = Counted::default();
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
    let endpoint: Endpoint = listener.local_addr_uri().parse().unwrap();
    let server = Server::builder()
        .add_service(EchoServer::new(counted.clone()))
        .build();
    let task = tokio::spawn(async move {
        let _ = server.serve(listener).await;
    });
    (endpoint, counted, task)
}

async fn say_n(client: &EchoClient<rpc_core::retry::Retry<Balanced>>, n: usize) -> usize {
    futures::stream::iter(0..n)
        .map(|_| {
            let mut c = client.clone();
            async move {
                c.say(SayRequest {
                    message: "x".into(),
                    payload: Default::default(),
                })
                .await
            }
        })
        .buffer_unordered(8)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await
}

async fn wait_for(balanced: &Balanced, n: usize) {
    for _ in 0..500 {
        if balanced.endpoints().len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} replicas, have {:?}", balanced.endpoints());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_replicas_are_found_and_a_deregistered_one_stops_getting_calls() {
    let Some(cluster) = cluster() else { return };
    let service = unique("echo");
    let (a, a_count, _a_task) = replica().await;
    let (b, b_count, _b_task) = replica().await;
    let ttl = Duration::from_secs(5);
    let reg_a = rpc_discovery_etcd::register(&cluster, &service, &a, ttl)
        .await
        .unwrap();
    let _reg_b = rpc_discovery_etcd::register(&cluster, &service, &b, ttl)
        .await
        .unwrap();

    let balanced = Balanced::new(StreamChannels::default());
    let changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    let following = tokio::spawn(balanced.follow(changes));
    wait_for(&balanced, 2).await;
    let client = EchoClient::new(balanced.clone()).with_retries(RetryPolicy::default());
    assert_eq!(say_n(&client, 200).await, 200);
    assert!(a_count.0.load(Ordering::SeqCst) >= 40 && b_count.0.load(Ordering::SeqCst) >= 40);

    // Deregister first (as a draining server does): clients stop choosing it.
    reg_a.deregister().await.unwrap();
    wait_for(&balanced, 1).await;
    let before = a_count.0.load(Ordering::SeqCst);
    assert_eq!(say_n(&client, 100).await, 100, "no caller sees an error");
    assert_eq!(
        a_count.0.load(Ordering::SeqCst),
        before,
        "calls still went to a"
    );
    following.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_that_is_not_kept_alive_expires() {
    let Some(cluster) = cluster() else { return };
    let service = unique("expiring");
    let (a, _count, _task) = replica().await;
    let registration = rpc_discovery_etcd::register(&cluster, &service, &a, Duration::from_secs(2))
        .await
        .unwrap();
    let mut changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    assert_eq!(changes.next().await, Some(Change::Insert(a.clone())));
    // As if the process died: no keep-alive, no revoke.
    drop(registration);
    let removed = tokio::time::timeout(Duration::from_secs(15), changes.next())
        .await
        .expect("the lease did not expire");
    assert_eq!(removed, Some(Change::Remove(a)));
}

/// Needs no etcd: nothing listens on the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_fails_registering_and_resolving_at_once() {
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let cluster = [nobody.local_addr().unwrap().to_string()];
    drop(nobody);
    let me: Endpoint = "tcp://127.0.0.1:7000".parse().unwrap();
    let ttl = Duration::from_secs(5);
    let within = Duration::from_secs(10);
    let registered = tokio::time::timeout(
        within,
        rpc_discovery_etcd::register(&cluster, "nobody", &me, ttl),
    )
    .await
    .expect("register waited");
    assert!(registered.is_err(), "{registered:?}");
    let resolved = tokio::time::timeout(within, rpc_discovery_etcd::resolve(&cluster, "nobody"))
        .await
        .expect("resolve waited");
    assert!(resolved.is_err());
    let bad = rpc_discovery_etcd::resolve(&["tcp://127.0.0.1:2379"], "kv").await;
    assert!(bad.is_err(), "etcd is reached over grpc:// only");
}
