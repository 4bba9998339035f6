//! The deployable `rpc-server` as real processes registered in a real etcd: a client
//! that knows only the service name spreads calls over the replicas, and keeps working
//! when one is killed (SIGKILL: its lease expires) or drained (SIGTERM: it deregisters
//! first), and when one is added later.

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{cluster, start, unique};
use futures::StreamExt;
use rpc_core::{balance::Balanced, retry::RetryPolicy, Request};
use rpc_proto::echo::{echo_client::EchoClient, SayRequest, SleepRequest};
use rpc_transport_tcp::StreamChannels;

type Client = EchoClient<rpc_core::retry::Retry<Balanced>>;

/// Makes `n` Say calls, 8 at a time; returns how many each replica served, and the
/// number of failures.
async fn say_n(client: &Client, n: usize) -> (HashMap<String, usize>, usize) {
    let served = Arc::new(Mutex::new(HashMap::new()));
    let failures = futures::stream::iter(0..n)
        .map(|_| {
            let mut c = client.clone();
            let served = served.clone();
            async move {
                let reply = c
                    .say(SayRequest {
                        message: "hi".into(),
                        payload: Default::default(),
                    })
                    .await?;
                let by = reply
                    .metadata()
                    .get_str("x-served-by")
                    .unwrap_or("?")
                    .to_owned();
                *served.lock().unwrap().entry(by).or_insert(0) += 1;
                Ok::<_, rpc_core::Status>(())
            }
        })
        .buffer_unordered(8)
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await;
    let served = served.lock().unwrap().clone();
    (served, failures)
}

async fn wait_for(balanced: &Balanced, n: usize) {
    for _ in 0..1500 {
        if balanced.endpoints().len() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} replicas, have {:?}", balanced.endpoints());
}

async fn client_for(
    cluster: &[String],
    service: &str,
) -> (Balanced, Client, tokio::task::JoinHandle<()>) {
    let balanced = Balanced::new(StreamChannels::default());
    let changes = rpc_discovery_etcd::resolve(cluster, service).await.unwrap();
    let following = tokio::spawn(balanced.follow(changes));
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(20),
        max_attempts: 5,
        ..RetryPolicy::default()
    };
    let client = EchoClient::new(balanced.clone()).with_retries(policy);
    (balanced, client, following)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_a_kill_a_drain_and_a_newcomer() {
    let Some(cluster) = cluster() else { return };
    let service = unique("kv");
    let mut replicas = Vec::new();
    for name in ["r0", "r1", "r2"] {
        replicas.push(start(&cluster, &service, name).await);
    }
    let (balanced, client, following) = client_for(&cluster, &service).await;
    wait_for(&balanced, 3).await;

    // Calls spread over all three.
    let (served, failures) = say_n(&client, 300).await;
    assert_eq!(failures, 0);
    for name in ["r0", "r1", "r2"] {
        assert!(served.get(name).copied().unwrap_or(0) >= 30, "{served:?}");
    }

    // SIGKILL r0 while calls run: those are safe to repeat and succeed elsewhere; its
    // lease expires and the client stops choosing it.
    let during = tokio::spawn({
        let client = client.clone();
        async move { say_n(&client, 400).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    replicas[0].start_kill().unwrap();
    replicas[0].wait().await.unwrap();
    let (_, failures) = during.await.unwrap();
    assert_eq!(failures, 0, "a call failed when r0 was killed");
    wait_for(&balanced, 2).await;
    let (served, failures) = say_n(&client, 100).await;
    assert_eq!(failures, 0, "a call failed after the client saw r0 go");
    assert!(!served.contains_key("r0"), "{served:?}");

    // SIGTERM r1 with slow calls in flight: it deregisters first, finishes them, exits.
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { c.sleep(Request::new(SleepRequest { delay_ms: 300 })).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pid = replicas[1].id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    for call in slow {
        call.await.unwrap().expect("a call failed while r1 drained");
    }
    let status = tokio::time::timeout(Duration::from_secs(15), replicas[1].wait())
        .await
        .expect("r1 did not exit after draining")
        .unwrap();
    assert!(status.success(), "{status:?}");
    wait_for(&balanced, 1).await;

    // A replica added later starts receiving calls.
    replicas.push(start(&cluster, &service, "r3").await);
    wait_for(&balanced, 2).await;
    let (served, failures) = say_n(&client, 200).await;
    assert_eq!(failures, 0);
    assert!(served.get("r3").copied().unwrap_or(0) >= 40, "{served:?}");
    following.abort();
}
