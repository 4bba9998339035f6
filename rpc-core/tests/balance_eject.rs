//! A replica that keeps failing is ejected for longer each time: a black hole (it
//! takes calls and never answers) costs a deadline per probe, so the probes thin out.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use rpc_core::{
    balance::{Balanced, Change, MAX_EJECTION_MULTIPLIER},
    client::{Channel, ClientCall},
    link::mem,
    server::{Server, ServerCall, ServerReply},
    Endpoint, Status,
};
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceExt};

const BASE: Duration = Duration::from_secs(1);

fn call() -> ClientCall {
    ClientCall {
        method: "t.Echo/Say".into(),
        idempotency: Default::default(),
        metadata: Default::default(),
        timeout: Some(Duration::from_millis(100)),
        call_key: None,
        payload: "hi".into(),
        stream: None,
        compress: None,
    }
}

fn serve(server: Server) -> mem::MemConnector {
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    connector
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_keeps_failing_is_left_out_longer_each_time() {
    // The black hole notes when each call reaches it.
    let reached = Arc::new(Mutex::new(Vec::new()));
    let log = reached.clone();
    let hole = service_fn(move |_: ServerCall| {
        log.lock().unwrap().push(Instant::now());
        std::future::pending::<Result<ServerReply, Status>>()
    });
    let hole = serve(Server::builder().add_named_service("t.Echo", hole).build());
    let echo = service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let echo = serve(Server::builder().add_named_service("t.Echo", echo).build());
    let hole_at: Endpoint = "tcp://10.0.0.1:7000".parse().unwrap();
    let echo_at: Endpoint = "tcp://10.0.0.2:7000".parse().unwrap();
    let holes = hole_at.clone();
    let balanced = Balanced::with_ejection(
        move |endpoint: &Endpoint| {
            let connector = if *endpoint == holes { &hole } else { &echo };
            Ok(Channel::builder().connect_lazy(connector.clone()))
        },
        BASE,
    );
    let ejected = Arc::new(Mutex::new(Vec::new()));
    let log = ejected.clone();
    let holes = hole_at.clone();
    balanced.on_ejection(move |endpoint| {
        assert_eq!(*endpoint, holes, "only the black hole is ejected");
        log.lock().unwrap().push(Instant::now());
    });
    balanced.apply(Change::Insert(hole_at)).unwrap();
    balanced.apply(Change::Insert(echo_at)).unwrap();

    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(40) {
        let mut client = balanced.clone();
        // The black hole's calls fail at their deadline; the others are answered.
        let _ = client.ready().await.unwrap().call(call()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let ejected = ejected.lock().unwrap().clone();
    let reached = reached.lock().unwrap().clone();
    assert!(ejected.len() >= 4, "ejected {} times", ejected.len());
    for (k, at) in ejected.iter().enumerate() {
        let Some(next) = reached.iter().find(|reached| *reached > at) else {
            break;
        };
        let nth = (k + 1) as u32;
        // Counted from the failure that ejected it, when the hook ran.
        let lasts = BASE * nth.min(MAX_EJECTION_MULTIPLIER);
        assert!(
            *next - *at >= lasts,
            "ejection {nth} lasted {:?}, not {lasts:?}",
            *next - *at
        );
    }
}

/// Calls in flight together to a replica that went away fail together: that is one
/// ejection, of the base time, not one per call (which made the first ejection of a
/// replica down for a second already the longest).
#[tokio::test(start_paused = true)]
async fn a_burst_of_failures_is_one_ejection() {
    let (listener, connector) = mem::listener();
    drop(listener); // nothing accepts: every call fails unprocessed
    let balanced = Balanced::with_ejection(
        move |_: &Endpoint| Ok(Channel::builder().connect_lazy(connector.clone())),
        BASE,
    );
    let ejected = Arc::new(Mutex::new(0));
    let count = ejected.clone();
    balanced.on_ejection(move |_| *count.lock().unwrap() += 1);
    balanced
        .apply(Change::Insert("tcp://10.0.0.1:7000".parse().unwrap()))
        .unwrap();
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let mut client = balanced.clone();
            tokio::spawn(async move { client.ready().await?.call(call()).await })
        })
        .collect();
    for call in calls {
        let status = call.await.unwrap().unwrap_err();
        assert!(status.is_unprocessed(), "{status:?}");
    }
    assert_eq!(*ejected.lock().unwrap(), 1, "one ejection");
}

/// Failures every replica shares (here every call fails `UNAVAILABLE` everywhere, as
/// with a dependency they all use) eject at most half of the set: the calls stay spread
/// over the rest. Before, all three were ejected in turn, and while they were every
/// call went to the one whose ejection ended first.
#[tokio::test(start_paused = true)]
async fn failures_every_replica_shares_do_not_eject_more_than_half() {
    let runs: Vec<Arc<Mutex<usize>>> = (0..3).map(|_| Arc::default()).collect();
    let connectors: Vec<mem::MemConnector> = runs
        .iter()
        .map(|runs| {
            let runs = runs.clone();
            let failing = service_fn(move |_: ServerCall| {
                *runs.lock().unwrap() += 1;
                std::future::ready(Err::<ServerReply, _>(Status::unavailable(
                    "a dependency is down",
                )))
            });
            serve(
                Server::builder()
                    .add_named_service("t.Echo", failing)
                    .build(),
            )
        })
        .collect();
    let at: Vec<Endpoint> = (1..=3)
        .map(|i| format!("tcp://10.0.0.{i}:7000").parse().unwrap())
        .collect();
    let ends = at.clone();
    let balanced = Balanced::with_ejection(
        move |endpoint: &Endpoint| {
            let i = ends.iter().position(|e| e == endpoint).unwrap();
            Ok(Channel::builder().connect_lazy(connectors[i].clone()))
        },
        Duration::from_secs(3600),
    );
    let ejections = Arc::new(Mutex::new(0));
    let log = ejections.clone();
    balanced.on_ejection(move |_| *log.lock().unwrap() += 1);
    for endpoint in &at {
        balanced.apply(Change::Insert(endpoint.clone())).unwrap();
    }
    for _ in 0..60 {
        let mut client = balanced.clone();
        let status = client
            .ready()
            .await
            .unwrap()
            .call(call())
            .await
            .unwrap_err();
        assert_eq!(status.code(), rpc_core::Code::UNAVAILABLE, "{status}");
    }
    assert_eq!(
        *ejections.lock().unwrap(),
        1,
        "one of three replicas ejected"
    );
    let served = runs.iter().filter(|r| *r.lock().unwrap() > 10).count();
    assert_eq!(served, 2, "the calls went on to the two replicas left in");
}

/// Calls a replica turns away with a graceful GOAWAY (NO_ERROR: a server's idle
/// timeout or connection rotation as well as a shutdown) on a connection it served
/// neither eject it nor count as its failures, however many one GOAWAY turns away:
/// every connection of a set aging out together ejected every healthy replica (from a
/// review; three calls counted as three failures did too). A replica really going away
/// refuses the next connection, which ejects it. (One that accepts each connection and
/// turns it away before serving it is a failing replica: `balance`'s unit tests.)
#[tokio::test]
async fn a_graceful_goaway_does_not_eject_its_replica_at_once() {
    use bytes::{Bytes, BytesMut};
    use rpc_core::{
        frame::{self, DecodeLimits, Frame, GoAwayCode},
        link::{Link, LinkConfig, Listener},
        Code, Metadata,
    };
    use std::future::poll_fn;
    let (mut listener, connector) = mem::listener();
    let at: Endpoint = "tcp://10.0.0.1:7000".parse().unwrap();
    let balanced =
        Balanced::new(move |_: &Endpoint| Ok(Channel::builder().connect_lazy(connector.clone())));
    let ejected = Arc::new(Mutex::new(0));
    let count = ejected.clone();
    balanced.on_ejection(move |_| *count.lock().unwrap() += 1);
    balanced.apply(Change::Insert(at)).unwrap();
    // The server: takes the connection, answers a first call, reads three requests,
    // and goes away gracefully without reading them (last_id the first call's),
    // keeping the connection open.
    let server = tokio::spawn(async move {
        let mut link = listener.accept(&LinkConfig::default()).await.unwrap();
        let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
        let Ok(Frame::Request(first)) = Frame::decode(bytes, &DecodeLimits::default()) else {
            panic!("expected the first request");
        };
        let mut answer = BytesMut::new();
        frame::encode_response_header(&mut answer, first.id, Code::OK, "", &[], &Metadata::new());
        poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
        link.start_send(&answer, Bytes::from_static(b"hi").into())
            .unwrap();
        poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
        for _ in 0..3 {
            let bytes = poll_fn(|cx| link.poll_recv(cx)).await.unwrap().unwrap();
            assert!(matches!(
                Frame::decode(bytes, &DecodeLimits::default()),
                Ok(Frame::Request(_))
            ));
        }
        let mut goaway = BytesMut::new();
        frame::encode_goaway(&mut goaway, first.id, GoAwayCode::NO_ERROR, "idle");
        poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
        link.start_send(&goaway, Bytes::new().into()).unwrap();
        poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
        link
    });
    let mut client = balanced.clone();
    let reply = client.ready().await.unwrap().call(call()).await.unwrap();
    assert_eq!(reply.payload, "hi");
    let mut calls = Vec::new();
    for _ in 0..3 {
        let mut client = balanced.clone();
        let mut slow = call();
        slow.timeout = Some(Duration::from_secs(10));
        calls.push(tokio::spawn(async move {
            client.ready().await.unwrap().call(slow).await
        }));
    }
    for call in calls {
        let status = call.await.unwrap().expect_err("nothing answered it");
        assert!(status.is_unprocessed(), "{status}");
    }
    let _link = server.await.unwrap();
    assert_eq!(
        *ejected.lock().unwrap(),
        0,
        "ejected at once for a graceful GOAWAY"
    );
}

/// A connector whose connections never complete: a replica still registered whose
/// host drops every packet (its SYNs unanswered).
struct Unreachable;

impl rpc_core::link::Connector for Unreachable {
    type Link = <mem::MemConnector as rpc_core::link::Connector>::Link;

    async fn connect(&self, _: &rpc_core::link::LinkConfig) -> Result<Self::Link, rpc_core::Error> {
        std::future::pending().await
    }

    fn target(&self) -> String {
        "tcp://10.0.0.9:7000".into()
    }
}

/// Calls go to the replicas that have a connection: one whose connection never comes
/// (a registered replica that drops every packet) takes none of them while another
/// is ready, and no call waits on its connect. Calls went to it as to any other: each
/// one sent its way waited for the connect timeout or failed at its deadline (a churn
/// review: 7 of 16 calls with a 3 s deadline failed, the others took 5 s).
#[tokio::test]
async fn calls_go_to_replicas_with_a_connection_not_to_one_still_connecting() {
    let echo = service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let echo = serve(Server::builder().add_named_service("t.Echo", echo).build());
    let hole_at: Endpoint = "tcp://10.0.0.9:7000".parse().unwrap();
    let echo_at: Endpoint = "tcp://10.0.0.2:7000".parse().unwrap();
    let holes = hole_at.clone();
    let balanced = Balanced::new(
        move |endpoint: &Endpoint| -> Result<Channel, rpc_core::Error> {
            Ok(if *endpoint == holes {
                Channel::builder().connect_lazy(Unreachable)
            } else {
                Channel::builder().connect_lazy(echo.clone())
            })
        },
    );
    balanced.apply(Change::Insert(hole_at)).unwrap();
    balanced.apply(Change::Insert(echo_at)).unwrap();
    // Both start connecting when added; the echo's connection comes at once.
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut client = balanced.clone();
        loop {
            if client.ready().await.unwrap().call(call()).await.is_ok() {
                break;
            }
        }
    })
    .await
    .expect("no call ever succeeded");
    let mut client = balanced.clone();
    for i in 0..200 {
        let reply = client.ready().await.unwrap().call(call()).await;
        assert!(reply.is_ok(), "call {i}: {reply:?}");
    }
}

/// A connector refused at once: a replica whose host is up but nothing listens.
struct Refused;

impl rpc_core::link::Connector for Refused {
    type Link = <mem::MemConnector as rpc_core::link::Connector>::Link;

    async fn connect(&self, _: &rpc_core::link::LinkConfig) -> Result<Self::Link, rpc_core::Error> {
        Err(rpc_core::Error::new(
            rpc_core::ErrorKind::Refused,
            "connection refused",
        ))
    }

    fn target(&self) -> String {
        "tcp://10.0.0.8:7000".into()
    }
}

/// A replica whose connection cannot be made takes no calls, and is still ejected,
/// its ejection hook called (for a DNS look-up again): its failed connects, made in the
/// background, count as a call that could not be sent did when calls went to it.
#[tokio::test]
async fn a_replica_that_cannot_be_connected_is_ejected_without_taking_calls() {
    let echo = service_fn(|call: ServerCall| async move {
        Ok::<_, Status>(ServerReply {
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let echo = serve(Server::builder().add_named_service("t.Echo", echo).build());
    let refused_at: Endpoint = "tcp://10.0.0.8:7000".parse().unwrap();
    let refused = refused_at.clone();
    let balanced = Balanced::new(
        move |endpoint: &Endpoint| -> Result<Channel, rpc_core::Error> {
            Ok(if *endpoint == refused {
                Channel::builder().connect_lazy(Refused)
            } else {
                Channel::builder().connect_lazy(echo.clone())
            })
        },
    );
    let ejected = Arc::new(Mutex::new(Vec::new()));
    let log = ejected.clone();
    balanced.on_ejection(move |endpoint| log.lock().unwrap().push(endpoint.clone()));
    balanced
        .apply(Change::Insert("tcp://10.0.0.2:7000".parse().unwrap()))
        .unwrap();
    balanced.apply(Change::Insert(refused_at.clone())).unwrap();
    let mut client = balanced.clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let reply = client.ready().await.unwrap().call(call()).await;
            if !ejected.lock().unwrap().is_empty() {
                break;
            }
            // Until then every call went to the replica with a connection, or (the
            // very first, before it had one) on to it from the refused one.
            assert!(reply.is_ok(), "{reply:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the unreachable replica was never ejected");
    assert_eq!(ejected.lock().unwrap().as_slice(), [refused_at]);
}
