//! A balanced client over three replicas on loopback: calls spread over all of them,
//! and when one goes away the others take its calls without a caller seeing an error.

mod common;

use std::time::Duration;

use common::{TestEcho, TestServer};
use futures::StreamExt;
use rpc_core::{balance::Balanced, retry::RetryPolicy, server::Server, Endpoint};
use rpc_proto::echo::{echo_client::EchoClient, CountRequest, SleepRequest, SumRequest};
use rpc_transport_tcp::StreamChannels;

/// Turns a wait for the balancer to notice a change into a failure, never a bound on
/// how fast it does.
const GUARD: Duration = Duration::from_secs(60);

/// Makes batches of 10 calls until `done` holds (within [`GUARD`]): what the balancer
/// learns in the background (a new replica's connection, a health check's answer)
/// takes its own time on a loaded machine, and a share measured before it is a share
/// of luck.
async fn calls_until(
    client: &EchoClient<rpc_core::retry::Retry<Balanced>>,
    what: &str,
    mut done: impl FnMut() -> bool,
) {
    tokio::time::timeout(GUARD, async {
        while !done() {
            calls(client, 10).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: never happened"));
}

async fn calls(client: &EchoClient<rpc_core::retry::Retry<Balanced>>, n: usize) -> usize {
    futures::stream::iter(0..n)
        .map(|_| {
            let mut c = client.clone();
            async move { c.sleep(SleepRequest { delay_ms: 1 }).await }
        })
        .buffer_unordered(16)
        .filter(|r| futures::future::ready(r.is_ok()))
        .count()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_spread_over_replicas_and_survive_one_going_away() {
    let mut servers = Vec::new();
    let mut probes = Vec::new();
    for _ in 0..3 {
        let (echo, probe) = TestEcho::new(None);
        servers.push(TestServer::start(Server::builder(), echo).await);
        probes.push(probe);
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.uri.parse().unwrap()).collect();
    let balanced = Balanced::from_endpoints(StreamChannels::default(), endpoints).unwrap();
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    // Ejections are reported (a discovery resolver would be told to look again).
    let ejected = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = ejected.clone();
    balanced.on_ejection(move |endpoint| log.lock().unwrap().push(endpoint.to_string()));
    let client = EchoClient::new(balanced).with_retries(policy);

    // Calls go to the replicas with a connection: until every one has its own (each
    // has taken a call), a share is a measure of the connects' race on a loaded machine.
    calls_until(&client, "every replica took a call", || {
        probes.iter().all(|p| p.started() >= 1)
    })
    .await;
    let before: Vec<usize> = probes.iter().map(|p| p.started()).collect();
    assert_eq!(calls(&client, 300).await, 300);
    assert!(ejected.lock().unwrap().is_empty());
    for (i, probe) in probes.iter().enumerate() {
        assert!(
            probe.started() - before[i] >= 30,
            "replica {i} got {} of 300",
            probe.started() - before[i]
        );
    }

    // One replica goes away: no caller sees an error, the others take the calls.
    let gone_uri = servers[0].uri.clone();
    drop(servers.remove(0));
    let gone_before = probes[0].started();
    let others_before = probes[1].started() + probes[2].started();
    assert_eq!(
        calls(&client, 300).await,
        300,
        "a call failed after a replica went away"
    );
    // Dropping a server aborts its tasks, which takes effect at their next wake-up: a
    // few calls already on their way may still start there (and, their answer lost,
    // run again elsewhere). The others took the rest, and afterwards everything.
    let late = probes[0].started() - gone_before;
    assert!(probes[1].started() + probes[2].started() >= others_before + 300 - late);
    let gone_now = probes[0].started();
    assert_eq!(calls(&client, 300).await, 300);
    assert_eq!(
        probes[0].started(),
        gone_now,
        "the replica that went away got calls"
    );
    let ejected = ejected.lock().unwrap();
    assert!(
        ejected.contains(&gone_uri),
        "the replica that went away was reported ejected: {ejected:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_replica_gets_few_calls() {
    // Replica 0 never finishes a call (its handlers wait on a gate, opened at the
    // end); load is calls in flight, so power of two choices sends it a call only
    // while its stuck calls are fewer than the fine replica's in flight: with 8 calls
    // in flight at most, it holds 4 (5 when a tie goes its way), however long the run
    // takes. (A balancer blind to load jams all 8 and the guard fails.)
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (stuck, stuck_probe) = TestEcho::new(Some(gate.clone()));
    let (fine, fine_probe) = TestEcho::new(None);
    let servers = [
        TestServer::start(Server::builder(), stuck).await,
        TestServer::start(Server::builder(), fine).await,
    ];
    // The fine replica first, with its connection made (a call answered): had the
    // stuck one connected first, the 8 calls would all have gone to it, the only
    // replica with a connection, and jammed. It is added then, and takes calls once
    // its own connection is made.
    let balanced = Balanced::new(StreamChannels::default());
    balanced
        .apply(rpc_core::balance::Change::Insert(
            servers[1].uri.parse().unwrap(),
        ))
        .unwrap();
    let mut client = EchoClient::new(balanced.clone());
    client.sleep(SleepRequest { delay_ms: 1 }).await.unwrap();
    let first = fine_probe.started();
    balanced
        .apply(rpc_core::balance::Change::Insert(
            servers[0].uri.parse().unwrap(),
        ))
        .unwrap();
    let calls = tokio::spawn(
        futures::stream::iter(0..200)
            .map(move |_| {
                let mut c = client.clone();
                async move { c.sleep(SleepRequest { delay_ms: 1 }).await }
            })
            .buffer_unordered(8)
            .filter(|r| futures::future::ready(r.is_ok()))
            .count(),
    );
    tokio::time::timeout(GUARD, async {
        while fine_probe.started() - first + stuck_probe.started() < 200 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the calls jammed: {} on the stuck replica, {} on the fine one",
            stuck_probe.started(),
            fine_probe.started()
        )
    });
    assert!(
        stuck_probe.started() <= 5,
        "the stuck replica got {} of 200 calls",
        stuck_probe.started()
    );
    gate.add_permits(1000);
    let done = tokio::time::timeout(GUARD, calls).await.unwrap().unwrap();
    assert_eq!(done, 200, "a call failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_by_dns_name_finds_the_server() {
    let (echo, probe) = TestEcho::new(None);
    let server = TestServer::start(Server::builder(), echo).await;
    let port = server.uri.rsplit(':').next().unwrap();
    // localhost resolves to 127.0.0.1 (where the server is) and maybe ::1 (where it is
    // not: that replica is ejected and calls retried elsewhere).
    let endpoint: Endpoint = format!("dns://localhost:{port}").parse().unwrap();
    let balanced = Balanced::new(StreamChannels::default());
    let changes =
        rpc_core::discover::resolve(&endpoint, rpc_core::discover::DEFAULT_DNS_INTERVAL).unwrap();
    let following = tokio::spawn(balanced.follow(changes));
    for _ in 0..100 {
        if !balanced.endpoints().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!balanced.endpoints().is_empty(), "DNS gave no address");
    let client = EchoClient::new(balanced).with_retries(RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    });
    assert_eq!(calls(&client, 50).await, 50);
    assert_eq!(probe.started(), 50);
    following.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_added_later_starts_receiving_calls() {
    let (first, first_probe) = TestEcho::new(None);
    let (later, later_probe) = TestEcho::new(None);
    let servers = [
        TestServer::start(Server::builder(), first).await,
        TestServer::start(Server::builder(), later).await,
    ];
    let balanced = Balanced::from_endpoints(
        StreamChannels::default(),
        [servers[0].uri.parse::<Endpoint>().unwrap()],
    )
    .unwrap();
    let client = EchoClient::new(balanced.clone()).with_retries(RetryPolicy::default());
    assert_eq!(calls(&client, 50).await, 50);
    assert_eq!((first_probe.started(), later_probe.started()), (50, 0));

    balanced
        .apply(rpc_core::balance::Change::Insert(
            servers[1].uri.parse().unwrap(),
        ))
        .unwrap();
    // Its connection opens in the background: until then the calls sent its way
    // count as its load, and the first replica takes the rest.
    calls_until(&client, "a call reached the new replica", || {
        later_probe.started() > 0
    })
    .await;
    let before = later_probe.started();
    assert_eq!(calls(&client, 200).await, 200);
    assert!(
        later_probe.started() - before >= 40,
        "the new replica got {} of 200",
        later_probe.started() - before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_take_a_not_serving_replica_out_and_back() {
    use rpc_proto::health::{HealthReporter, ServingStatus};

    let mut probes = Vec::new();
    let mut healths = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..2 {
        let (echo, probe) = TestEcho::new(None);
        let health = HealthReporter::new();
        let server = Server::builder()
            .add_service(rpc_proto::echo::echo_server::EchoServer::new(echo))
            .add_service(health.service())
            .build();
        servers.push(TestServer::serve(server).await);
        probes.push(probe);
        healths.push(health);
    }
    let endpoints: Vec<Endpoint> = servers.iter().map(|s| s.uri.parse().unwrap()).collect();
    let balanced = Balanced::from_endpoints(StreamChannels::default(), endpoints).unwrap();
    let checking =
        tokio::spawn(balanced.health_checks("", Duration::from_millis(20), Duration::from_secs(1)));
    let client = EchoClient::new(balanced).with_retries(RetryPolicy::default());

    healths[0].set("", ServingStatus::NotServing);
    // Until a batch goes to the other replica alone: the health checks' answer has
    // come.
    let mut last = usize::MAX;
    calls_until(&client, "the NOT_SERVING replica left the rotation", || {
        let now = probes[0].started();
        std::mem::replace(&mut last, now) == now
    })
    .await;
    let before = probes[0].started();
    assert_eq!(calls(&client, 100).await, 100);
    assert_eq!(
        probes[0].started(),
        before,
        "a NOT_SERVING replica got calls"
    );

    healths[0].set("", ServingStatus::Serving);
    calls_until(&client, "the replica came back", || {
        probes[0].started() > before
    })
    .await;
    let back = probes[0].started();
    assert_eq!(calls(&client, 200).await, 200);
    assert!(
        probes[0].started() - back >= 40,
        "the replica came back to {} calls of 200",
        probes[0].started() - back
    );
    checking.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_counts_as_load_until_it_ends() {
    let (echo, _probe) = TestEcho::new(None);
    let server = TestServer::start(Server::builder(), echo).await;
    let balanced =
        Balanced::from_endpoints(StreamChannels::default(), vec![server.uri.parse().unwrap()])
            .unwrap();
    let mut client = EchoClient::new(balanced.clone());
    let load = || balanced.loads()[0].1;
    let mut counts = client
        .count(rpc_proto::echo::CountRequest {
            count: 3,
            interval_ms: 20,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(load(), 1, "the open stream is load");
    while counts.message().await.unwrap().is_some() {}
    assert_eq!(load(), 0, "the ended stream is not");
}

/// A server of `echo`, and two endpoints: a port nobody listens on, then the server.
async fn a_dead_and_a_live_replica(echo: TestEcho) -> (TestServer, Vec<Endpoint>) {
    let server = TestServer::start(Server::builder(), echo).await;
    let dead = {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", socket.local_addr().unwrap())
    };
    let endpoints = [dead.as_str(), server.uri.as_str()]
        .iter()
        .map(|uri| uri.parse().unwrap())
        .collect();
    (server, endpoints)
}

/// A unary call whose replica cannot be reached goes on to a live one: with no retry
/// layer, a fresh client over a dead and a live replica never fails, whichever it
/// picks first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_reached_no_replica_goes_on_to_a_live_one() {
    let (echo, probe) = TestEcho::new(None);
    let (_server, endpoints) = a_dead_and_a_live_replica(echo).await;
    for round in 0..20 {
        // A fresh client each time: no ejection learned yet.
        let mut client = EchoClient::new(
            Balanced::from_endpoints(StreamChannels::default(), endpoints.clone()).unwrap(),
        );
        client
            .sleep(SleepRequest { delay_ms: 0 })
            .await
            .unwrap_or_else(|status| panic!("call {round} failed: {status}"));
    }
    assert_eq!(probe.started(), 20);
}

/// A streaming call whose replica cannot be reached goes on to a live one too: its
/// connection failed before any of its messages was taken, so they are sent whole to
/// the other replica (found by the `rpc` CLI, whose reflection is a stream, failing
/// half the time over `static://` with one replica down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_reached_no_replica_goes_on_to_a_live_one() {
    let (echo, _probe) = TestEcho::new(None);
    let (_server, endpoints) = a_dead_and_a_live_replica(echo).await;
    for round in 0..20 {
        // A fresh client each time: no ejection learned yet.
        let mut client = EchoClient::new(
            Balanced::from_endpoints(StreamChannels::default(), endpoints.clone()).unwrap(),
        );
        let values = futures::stream::iter(1..=4).map(|value| SumRequest { value });
        let sum = client
            .sum(values)
            .await
            .unwrap_or_else(|status| panic!("client stream {round} failed: {status}"));
        assert_eq!((sum.get_ref().total, sum.get_ref().count), (10, 4));
        let counts = client
            .count(CountRequest {
                count: 3,
                interval_ms: 0,
            })
            .await
            .unwrap_or_else(|status| panic!("server stream {round} failed: {status}"))
            .into_inner();
        let got: Vec<_> = counts.map(|reply| reply.unwrap().n).collect().await;
        assert_eq!(got, [1, 2, 3], "round {round}");
    }
}

/// Counts the health checks a server is asked (`grpc.health.v1.Health/...`).
struct CountHealthLayer(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl<S> tower::Layer<S> for CountHealthLayer {
    type Service = CountHealth<S>;

    fn layer(&self, inner: S) -> CountHealth<S> {
        CountHealth {
            inner,
            checks: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct CountHealth<S> {
    inner: S,
    checks: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<S> tower::Service<rpc_core::server::ServerCall> for CountHealth<S>
where
    S: tower::Service<rpc_core::server::ServerCall>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: rpc_core::server::ServerCall) -> S::Future {
        if call.method.starts_with("grpc.health.v1.Health/") {
            self.checks
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.call(call)
    }
}

/// `ConnectOptions::health_check`: a balanced client made by URI checks its replicas'
/// health and leaves out one that is up but says it is not serving (without it, such a
/// replica, still registered, takes its share of the calls); the checks stop when the
/// client is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_by_option_leave_a_not_serving_replica_out() {
    use rpc_proto::health::{HealthReporter, ServingStatus};
    use std::sync::{atomic::Ordering, Arc};

    let mut probes = Vec::new();
    let mut checks = Vec::new();
    let mut servers = Vec::new();
    for i in 0..2 {
        let (echo, probe) = TestEcho::new(None);
        let health = HealthReporter::new();
        if i == 0 {
            health.set("", ServingStatus::NotServing);
        }
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = Server::builder()
            .layer(CountHealthLayer(count.clone()))
            .add_service(rpc_proto::echo::echo_server::EchoServer::new(echo))
            .add_service(health.service())
            .build();
        servers.push((TestServer::serve(server).await, health));
        probes.push(probe);
        checks.push(count);
    }
    let uri = format!("static://{},{}", servers[0].0.uri, servers[1].0.uri);
    let options = rpc_connect::ConnectOptions::new().health_check(
        "",
        Duration::from_millis(20),
        Duration::from_secs(1),
    );
    let client = <EchoClient<Balanced> as rpc_connect::Connect>::balanced_with(&uri, &options)
        .await
        .unwrap();
    // Until a second round of checks has begun on the replica: the first one's
    // verdict is in.
    tokio::time::timeout(GUARD, async {
        while checks[0].load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no health checks");
    for _ in 0..60 {
        client
            .clone()
            .sleep(SleepRequest { delay_ms: 0 })
            .await
            .unwrap();
    }
    assert_eq!(probes[0].started(), 0, "the NOT_SERVING replica got calls");
    assert_eq!(probes[1].started(), 60);
    // Dropped, the client checks no more (a round in progress may end).
    drop(client);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after: Vec<usize> = checks.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (count, before) in checks.iter().zip(after) {
        assert_eq!(count.load(Ordering::SeqCst), before, "checks went on");
    }
}
