//! The tour: one generated service, called over every transport.
//!
//! With no arguments it starts a server in-process on ephemeral addresses (TCP, TLS
//! with mutual authentication, UDP, RDMA and gRPC's own wire (`grpc://`, HTTP/2) on
//! loopback, and a Unix socket), then over each one calls every example method (over
//! TLS the handler greets the caller by the identity in its verified certificate),
//! shows a deadline expiring and a call being cancelled (and the server dropping the
//! handler in both cases), an unknown method, and many calls in flight on one
//! connection. It prints one line per step with its latency. When Python's grpcio is
//! installed, a grpcio client (stubs generated from `echo.proto` at run time) calls
//! the same server over `grpc://`. Then it moves a blob through the bulk-transfer API
//! with the same function over TCP (the connection serves it) and RDMA (one-sided
//! reads and writes; the soft provider, so no RDMA hardware is needed; gRPC has no
//! bulk transfer); shows at-most-once execution: a non-idempotent call whose response
//! a proxy loses is retried and answered from the server's duplicate cache; and UDP
//! through a proxy that drops, copies and reorders datagrams.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};

use fault_proxy::{TcpFaults, TcpProxy, UdpFaults, UdpProxy};
use futures::StreamExt;
use rpc_core::retry::RetryPolicy;
use rpc_core::{
    client::{Channel, Client},
    codegen::{Idempotency, MethodDescriptor},
    server::Server,
    Request, Response, Status,
};
use rpc_examples::{connect, fmt_latency};
use rpc_proto::{
    blob::{self, blob_server::BlobServer, checksum, pattern, BlobService},
    echo::{
        echo_client::EchoClient,
        echo_server::{Echo, EchoServer},
        CountRequest, EchoService, FailReply, FailRequest, SayReply, SayRequest, SleepReply,
        SleepRequest, SumReply, SumRequest,
    },
    kv::{
        key_value_client::KeyValueClient, key_value_server::KeyValueServer, DeleteRequest,
        GetRequest, IncrementRequest, ListRequest, MemoryStore, PutRequest,
    },
};
use tokio::sync::mpsc;

/// The example `Echo` service, instrumented so the tour can show what the server saw:
/// a `Sleep` handler that is dropped before it finishes reports it.
#[derive(Clone)]
struct TourEcho {
    inner: EchoService,
    dropped: mpsc::UnboundedSender<Duration>,
}

/// Reports its age when dropped before `done`.
struct DropReport {
    started: Instant,
    done: bool,
    tx: mpsc::UnboundedSender<Duration>,
}

impl Drop for DropReport {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(self.started.elapsed());
        }
    }
}

impl Echo for TourEcho {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        let user = request
            .metadata()
            .get_str("x-user")
            .unwrap_or("anonymous")
            .to_owned();
        // Over mTLS, the identity the client's certificate proves: its one URI (a
        // SPIFFE id counts only alone, `Peer::has_identity`). The greeting keeps the
        // claimed name (metadata anyone can send) apart from it, quoted, so that a name
        // claiming an identity cannot read as one (from a review).
        let verified = request
            .peer()
            .and_then(|peer| peer.tls())
            .filter(|tls| tls.uris.len() == 1)
            .map(|tls| tls.uris[0].clone());
        let mut response = self.inner.say(request).await?;
        let greeting = match verified {
            Some(id) => format!("hello, {id} (verified; says its user is {user:?})"),
            None => format!("hello {user:?} (unverified)"),
        };
        response
            .metadata_mut()
            .insert("x-greeting", greeting)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(response)
    }

    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<SleepReply>, Status> {
        let mut guard = DropReport {
            started: Instant::now(),
            done: false,
            tx: self.dropped.clone(),
        };
        let response = self.inner.sleep(request).await;
        guard.done = true;
        response
    }

    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<FailReply>, Status> {
        self.inner.fail(request).await
    }

    type CountStream = <EchoService as Echo>::CountStream;

    async fn count(
        &self,
        request: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        self.inner.count(request).await
    }

    async fn sum(
        &self,
        request: Request<rpc_core::stream::Streaming<SumRequest>>,
    ) -> Result<Response<SumReply>, Status> {
        self.inner.sum(request).await
    }

    type ChatStream = <EchoService as Echo>::ChatStream;

    async fn chat(
        &self,
        request: Request<rpc_core::stream::Streaming<SayRequest>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        self.inner.chat(request).await
    }
}

/// Runs one step, timing it, and prints `label -> outcome  latency`.
async fn step<T, F>(transport: &str, label: &str, fut: F) -> Option<T>
where
    F: Future<Output = Result<(T, String), Status>>,
{
    let start = Instant::now();
    let result = fut.await;
    let took = fmt_latency(start.elapsed());
    match result {
        Ok((value, shown)) => {
            println!("[{transport:<4}] {label:<44} -> {shown:<38} {took:>9}");
            Some(value)
        }
        Err(status) => {
            println!(
                "[{transport:<4}] {label:<44} -> {:<38} {took:>9}",
                status.to_string()
            );
            None
        }
    }
}

async fn server_saw(transport: &str, dropped: &mut mpsc::UnboundedReceiver<Duration>) {
    match tokio::time::timeout(Duration::from_secs(2), dropped.recv()).await {
        Ok(Some(age)) => println!(
            "[{transport:<4}]   server: Sleep handler dropped after {} (never finished)",
            fmt_latency(age)
        ),
        _ => println!("[{transport:<4}]   server: handler was NOT dropped within 2 s"),
    }
}

async fn tour(
    transport: &str,
    channel: Channel,
    dropped: &mut mpsc::UnboundedReceiver<Duration>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut echo = EchoClient::new(channel.clone());
    let mut kv = KeyValueClient::new(channel.clone());
    let t = transport;

    step(t, "Echo/Say \"hello tour\" (x-user: ada)", async {
        let mut request = Request::new(SayRequest {
            message: "hello tour".into(),
            payload: Default::default(),
        });
        request
            .metadata_mut()
            .insert("x-user", "ada")
            .map_err(|e| Status::internal(e.to_string()))?;
        let reply = echo.say(request).await?;
        let greeting = reply
            .metadata()
            .get_str("x-greeting")
            .unwrap_or("")
            .to_owned();
        Ok((
            (),
            format!("{:?} (x-greeting: {greeting})", reply.get_ref().message),
        ))
    })
    .await;

    step(t, "KeyValue/Put greeting = \"hi\"", async {
        kv.put(PutRequest {
            key: "greeting".into(),
            value: "hi".into(),
        })
        .await?;
        Ok(((), "ok".to_owned()))
    })
    .await;

    step(t, "KeyValue/Get greeting", async {
        let reply = kv
            .get(GetRequest {
                key: "greeting".into(),
            })
            .await?;
        Ok((
            (),
            format!("{:?}", String::from_utf8_lossy(&reply.get_ref().value)),
        ))
    })
    .await;

    step(t, "KeyValue/Increment visits by 5", async {
        let reply = kv
            .increment(IncrementRequest {
                key: "visits".into(),
                delta: 5,
            })
            .await?;
        Ok(((), format!("visits = {}", reply.get_ref().value)))
    })
    .await;

    step(t, "KeyValue/List all keys", async {
        let reply = kv
            .list(ListRequest {
                prefix: String::new(),
                limit: 0,
            })
            .await?;
        Ok(((), format!("{:?}", reply.get_ref().keys)))
    })
    .await;

    step(t, "KeyValue/Delete greeting", async {
        let reply = kv
            .delete(DeleteRequest {
                key: "greeting".into(),
            })
            .await?;
        Ok(((), format!("existed = {}", reply.get_ref().existed)))
    })
    .await;

    step(t, "KeyValue/Get greeting (deleted)", async {
        kv.get(GetRequest {
            key: "greeting".into(),
        })
        .await?;
        Ok(((), "found?!".to_owned()))
    })
    .await;

    step(t, "Echo/Fail code 9 \"precondition\"", async {
        echo.fail(FailRequest {
            code: 9,
            message: "precondition".into(),
        })
        .await?;
        Ok(((), "ok?!".to_owned()))
    })
    .await;

    step(t, "Echo/Sleep 1 s with a 100 ms deadline", async {
        echo.sleep(
            Request::new(SleepRequest { delay_ms: 1000 }).with_timeout(Duration::from_millis(100)),
        )
        .await?;
        Ok(((), "finished?!".to_owned()))
    })
    .await;
    server_saw(t, dropped).await;

    step(t, "Echo/Sleep 10 s, call dropped after 50 ms", async {
        let call = echo.sleep(SleepRequest { delay_ms: 10_000 });
        match tokio::time::timeout(Duration::from_millis(50), call).await {
            Ok(result) => result.map(|_| ((), "finished?!".to_owned())),
            Err(_) => Ok(((), "cancelled: future dropped, CANCEL sent".to_owned())),
        }
    })
    .await;
    server_saw(t, dropped).await;

    step(t, "rpc.examples.v1.Echo/Shout (no such method)", async {
        const SHOUT: MethodDescriptor = MethodDescriptor {
            service: "rpc.examples.v1.Echo",
            method: "Shout",
            path: "rpc.examples.v1.Echo/Shout",
            idempotency: Idempotency::Unknown,
        };
        let mut raw = Client::new(channel.clone());
        raw.unary::<_, SayReply>(Request::new(SayRequest::default()), &SHOUT)
            .await?;
        Ok(((), "answered?!".to_owned()))
    })
    .await;

    step(t, "Echo/Count to 5, 20 ms apart (server stream)", async {
        let mut replies = echo
            .count(CountRequest {
                count: 5,
                interval_ms: 20,
            })
            .await?
            .into_inner();
        let mut seen = Vec::new();
        while let Some(reply) = replies.message().await? {
            seen.push(reply.n.to_string());
        }
        Ok(((), format!("received {}", seen.join(" "))))
    })
    .await;

    step(t, "Echo/Sum of 1..=1000 (client stream)", async {
        let values = futures::stream::iter(1..=1000).map(|value| SumRequest { value });
        let reply = echo.sum(values).await?;
        Ok((
            (),
            format!(
                "total {} of {} messages",
                reply.get_ref().total,
                reply.get_ref().count
            ),
        ))
    })
    .await;

    step(t, "Echo/Chat, 3 messages (bidirectional stream)", async {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let send = |word: &str| {
            tx.unbounded_send(SayRequest {
                message: word.into(),
                payload: Default::default(),
            })
            .map_err(|e| Status::internal(e.to_string()))
        };
        // The first request goes before the call is awaited: a server may send its
        // headers only with its first answer (docs/streaming.md, "Client").
        send("ping")?;
        let mut replies = echo.chat(rx).await?.into_inner();
        let mut seen = Vec::new();
        for (i, word) in ["ping", "pong", "bye"].into_iter().enumerate() {
            if i > 0 {
                send(word)?;
            }
            // Each answer arrives before the next message is sent.
            match replies.message().await? {
                Some(reply) => seen.push(format!("{:?}", reply.message)),
                None => break,
            }
        }
        drop(tx); // half-close: the server's stream ends too
        let end = replies.message().await?;
        Ok((
            (),
            format!(
                "{}, then {}",
                seen.join(" "),
                if end.is_none() { "end" } else { "more?!" }
            ),
        ))
    })
    .await;

    step(t, "1000 Echo/Say calls, all in flight at once", async {
        let calls = (0..1000).map(|i| {
            let mut echo = echo.clone();
            async move {
                let reply = echo
                    .say(SayRequest {
                        message: format!("{i}"),
                        payload: Default::default(),
                    })
                    .await?;
                Ok::<_, Status>(reply.get_ref().message == format!("{i}"))
            }
        });
        let results = futures::future::join_all(calls).await;
        let matched = results.iter().filter(|r| matches!(r, Ok(true))).count();
        Ok((
            (),
            format!("{matched}/1000 answered, each with its own reply"),
        ))
    })
    .await;
    Ok(())
}

/// Size of the blob the tour moves each way.
const BLOB: usize = 64 << 20;

/// Moves a blob each way through `Blob` and the bulk-transfer API: the same code on
/// every transport. Over TCP the client's connection serves the server's reads and
/// writes of the exposed buffers; over RDMA they are one-sided and the client runs
/// no code for them.
async fn blob_transfer(t: &str, channel: Channel) {
    let how = if channel.bulk().is_one_sided() {
        "one-sided"
    } else {
        "served by the connection"
    };
    let rate = |start: Instant| {
        let mib = (BLOB >> 20) as f64 / start.elapsed().as_secs_f64();
        format!("{mib:.0} MiB/s, {how}")
    };

    step(t, "Blob/Upload 64 MiB: server reads it", async {
        let data = pattern(1, BLOB);
        let expected = checksum(&data);
        let start = Instant::now();
        let reply = blob::upload(&channel, data, Duration::from_secs(60)).await?;
        if reply.checksum != expected {
            return Err(Status::data_loss("upload checksum mismatch"));
        }
        Ok(((), rate(start)))
    })
    .await;

    step(t, "Blob/Download 64 MiB: server writes it", async {
        let start = Instant::now();
        let (reply, data) = blob::download(&channel, BLOB, 2, Duration::from_secs(60)).await?;
        let shown = rate(start);
        if checksum(&data) != reply.checksum {
            return Err(Status::data_loss("download checksum mismatch"));
        }
        Ok(((), shown))
    })
    .await;
}

/// Retries and at-most-once: a non-idempotent call whose first response is lost in
/// transit (a fault-injecting proxy cuts the connection after the request reached the
/// server) is retried on a new connection and answered from the server's duplicate
/// cache: it ran once.
async fn at_most_once(server: &Server, tcp_uri: &str) -> Result<(), Box<dyn std::error::Error>> {
    let upstream: std::net::SocketAddr = tcp_uri.trim_start_matches("tcp://").parse()?;
    let proxy = TcpProxy::start(
        upstream,
        TcpFaults {
            cut_before_response: true,
            faulty_connections: Some(1),
            ..TcpFaults::default()
        },
    )
    .await?;
    println!(
        "[tcp ] via a proxy on {} that loses the first response",
        proxy.addr()
    );
    let channel = rpc_transport_tcp::connect(&format!("tcp://{}", proxy.addr())).await?;
    let policy = RetryPolicy {
        initial_backoff: Duration::from_millis(10),
        ..RetryPolicy::default()
    };
    let mut kv = KeyValueClient::new(channel).with_retries(policy);
    // Read the counter directly, not through the proxy (whose first answer is lost).
    let before = KeyValueClient::new(rpc_transport_tcp::connect(tcp_uri).await?)
        .get(GetRequest {
            key: "visits".into(),
        })
        .await
        .ok()
        .and_then(|r| {
            String::from_utf8_lossy(&r.get_ref().value)
                .parse::<i64>()
                .ok()
        });
    step(
        "tcp",
        "KeyValue/Increment visits by 1 (not idempotent)",
        async {
            let reply = kv
                .increment(IncrementRequest {
                    key: "visits".into(),
                    delta: 1,
                })
                .await?;
            let hits = server
                .dedupe_stats()
                .map_or(0, |s| s.hits.load(std::sync::atomic::Ordering::Relaxed));
            Ok((
                (),
                format!(
                    "visits = {} (was {}); retried, ran once, {hits} cache hit",
                    reply.get_ref().value,
                    before.map_or("?".into(), |b| b.to_string())
                ),
            ))
        },
    )
    .await;
    Ok(())
}

/// UDP through a proxy that drops 20% of datagrams each way, copies 10% and reorders
/// 10%: calls that are not safe to repeat still run once each, and a large message is
/// repaired by re-sending only the fragments lost.
async fn lossy_udp(udp_uri: &str) -> Result<(), Box<dyn std::error::Error>> {
    let upstream: std::net::SocketAddr = udp_uri.trim_start_matches("udp://").parse()?;
    let proxy = UdpProxy::start(
        upstream,
        UdpFaults {
            drop: 0.2,
            duplicate: 0.1,
            reorder: 0.1,
            seed: 1,
            ..UdpFaults::default()
        },
    )
    .await?;
    println!(
        "[udp ] via a proxy on {} that drops 20%, copies 10% and reorders 10% of datagrams",
        proxy.addr()
    );
    let connector = rpc_transport_udp::UdpConnector::from_uri(&format!("udp://{}", proxy.addr()))?;
    let stats = connector.stats().clone();
    let channel = Channel::builder()
        .timeout(Duration::from_secs(30))
        .connect(connector)
        .await?;
    let kv = KeyValueClient::new(channel.clone());
    step(
        "udp",
        "200 KeyValue/Increment lossy +1 (not idempotent)",
        async {
            let calls = (0..200).map(|_| {
                let mut kv = kv.clone();
                async move {
                    kv.increment(IncrementRequest {
                        key: "lossy".into(),
                        delta: 1,
                    })
                    .await
                }
            });
            let results = futures::future::join_all(calls).await;
            let ok = results.iter().filter(|r| r.is_ok()).count();
            let value = kv
                .clone()
                .get(GetRequest {
                    key: "lossy".into(),
                })
                .await?;
            let dropped = proxy
                .counters()
                .dropped
                .load(std::sync::atomic::Ordering::Relaxed);
            Ok((
                (),
                format!(
                    "{ok}/200 ok, lossy = {}, {dropped} datagrams dropped",
                    String::from_utf8_lossy(&value.get_ref().value)
                ),
            ))
        },
    )
    .await;
    proxy.set_faults(UdpFaults {
        drop: 0.05,
        seed: 2,
        ..UdpFaults::default()
    });
    let lost_before = proxy
        .counters()
        .dropped_bytes
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut echo = EchoClient::new(channel);
    step("udp", "Echo/Say 1 MiB through 5% loss", async {
        let message = "u".repeat(1 << 20);
        let reply = echo
            .say(SayRequest {
                message: message.clone(),
                payload: Default::default(),
            })
            .await?;
        let lost = proxy
            .counters()
            .dropped_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
            - lost_before;
        let resent = stats
            .bytes_resent
            .load(std::sync::atomic::Ordering::Relaxed);
        Ok((
            (),
            format!(
                "{} (client re-sent {} KiB, {} KiB lost both ways)",
                if reply.get_ref().message == message {
                    "intact"
                } else {
                    "CORRUPT"
                },
                resent / 1024,
                lost / 1024
            ),
        ))
    })
    .await;
    Ok(())
}

/// `echo.proto`, from which the grpcio step generates its Python stubs (built into
/// the binary, so the tour runs from anywhere).
const ECHO_PROTO: &str = include_str!("../../../proto/proto/rpc/examples/v1/echo.proto");

/// The grpcio client of [`grpcio_client`]: arguments `TARGET STUB_DIR`; prints one
/// line per step, `label<TAB>outcome<TAB>seconds`.
const GRPCIO_SCRIPT: &str = r#"
import json, sys, time
sys.path.insert(0, sys.argv[2])
import grpc
from rpc.examples.v1 import echo_pb2 as pb, echo_pb2_grpc as pb_grpc

def step(label, shown, start):
    print(f"{label}	{shown}	{time.perf_counter() - start}", flush=True)

start = time.perf_counter()
with grpc.insecure_channel(sys.argv[1]) as channel:
    grpc.channel_ready_future(channel).result(timeout=10)
    step(f"grpcio {grpc.__version__}: channel ready", "connected", start)
    echo = pb_grpc.EchoStub(channel)
    start = time.perf_counter()
    reply, call = echo.Say.with_call(
        pb.SayRequest(message="hello from python"), metadata=[("x-user", "grace")], timeout=10)
    sent = dict(call.initial_metadata()) | dict(call.trailing_metadata())
    greeting = sent.get("x-greeting", "")
    step('Echo/Say "hello from python" (x-user: grace)',
         f"{json.dumps(reply.message)} (x-greeting: {greeting})", start)
    start = time.perf_counter()
    seen = [str(r.n) for r in echo.Count(pb.CountRequest(count=5, interval_ms=20), timeout=10)]
    step("Echo/Count to 5, 20 ms apart (server stream)", "received " + " ".join(seen), start)
"#;

/// Prints one tour line for a step another process ran and timed.
fn print_line(transport: &str, label: &str, shown: &str, took: Duration) {
    let took = fmt_latency(took);
    println!("[{transport:<4}] {label:<44} -> {shown:<38} {took:>9}");
}

/// A Python grpcio client calling the tour's server at `grpc_uri`, if `python3` has
/// `grpc` and `grpc_tools`: the stubs are generated from `echo.proto` into a temporary
/// directory, then a unary `Say` and a server-streaming `Count`, one line each.
/// Otherwise one line saying how to enable it.
async fn grpcio_client(grpc_uri: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::process::{Command, Output, Stdio};
    let t = "py";
    let have_grpcio = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have_grpcio {
        println!(
            "[{t:<4}] grpcio client skipped: no Python grpcio (enable: python3 -m pip install grpcio grpcio-tools)"
        );
        return Ok(());
    }
    let target = grpc_uri.trim_start_matches("grpc://").to_owned();
    let dir = std::env::temp_dir().join(format!("rpc-tour-grpcio-{}", std::process::id()));
    let run = move |dir: std::path::PathBuf| -> std::io::Result<(Duration, Output)> {
        let start = Instant::now();
        let proto = dir.join("rpc/examples/v1/echo.proto");
        std::fs::create_dir_all(proto.parent().expect("a parent directory"))?;
        std::fs::write(&proto, ECHO_PROTO)?;
        let out = format!("{}", dir.display());
        let protoc = Command::new("python3")
            .args(["-m", "grpc_tools.protoc", "-I", &out])
            .arg(format!("--python_out={out}"))
            .arg(format!("--grpc_python_out={out}"))
            .arg("rpc/examples/v1/echo.proto")
            .output()?;
        if !protoc.status.success() {
            return Ok((start.elapsed(), protoc));
        }
        let generated = start.elapsed();
        let client = Command::new("python3")
            .args(["-c", GRPCIO_SCRIPT, &target, &out])
            .output()?;
        Ok((generated, client))
    };
    let result = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || run(dir)).await?
    };
    let _ = std::fs::remove_dir_all(&dir);
    let (generated, output) = result?;
    print_line(
        t,
        "stubs from echo.proto (grpc_tools.protoc)",
        "generated",
        generated,
    );
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let mut fields = line.split('\t');
        if let (Some(label), Some(shown), Some(secs)) =
            (fields.next(), fields.next(), fields.next())
        {
            let took = Duration::from_secs_f64(secs.parse().unwrap_or(0.0));
            print_line(t, label, shown, took);
        }
    }
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        println!(
            "[{t:<4}] grpcio client FAILED: {}",
            stderr.lines().last().unwrap_or("(no output)")
        );
    }
    Ok(())
}

/// The test CA, a server certificate for `localhost`/127.0.0.1, and a client
/// certificate for `spiffe://example.org/client` (`testdata/tls/gen.sh`).
const TLS_CA: &[u8] = include_bytes!("../../../testdata/tls/ca.pem");
const TLS_SERVER_CERT: &[u8] = include_bytes!("../../../testdata/tls/server.pem");
const TLS_SERVER_KEY: &[u8] = include_bytes!("../../../testdata/tls/server.key");
const TLS_CLIENT_CERT: &[u8] = include_bytes!("../../../testdata/tls/client.pem");
const TLS_CLIENT_KEY: &[u8] = include_bytes!("../../../testdata/tls/client.key");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (dropped_tx, mut dropped) = mpsc::unbounded_channel();
    let server = Server::builder()
        .add_service(EchoServer::new(TourEcho {
            inner: EchoService,
            dropped: dropped_tx,
        }))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(BlobServer::new(BlobService))
        .build();

    let tcp = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let socket = std::env::temp_dir().join(format!("rpc-tour-{}.sock", std::process::id()));
    let unix = rpc_transport_tcp::bind(&format!("unix://{}", socket.display())).await?;
    // TLS with mutual authentication, with the repository's test certificates
    // (testdata/tls), built into the binary so the tour runs from anywhere.
    let server_tls = rpc_transport_tcp::tls::ServerTls::builder()
        .cert_pem(TLS_SERVER_CERT, TLS_SERVER_KEY)
        .client_ca_pem(TLS_CA)
        .build()?;
    let tls = rpc_transport_tcp::tls::bind("tls://127.0.0.1:0", server_tls).await?;
    let client_tls = rpc_connect::ConnectOptions::new().tls(
        rpc_transport_tcp::tls::ClientTls::builder()
            .system_roots(false)
            .ca_pem(TLS_CA)
            .identity_pem(TLS_CLIENT_CERT, TLS_CLIENT_KEY)
            .build()?,
    );
    let udp = rpc_transport_udp::bind("udp://127.0.0.1:0").await?;
    // RDMA with the soft provider: works on any Linux machine.
    let rdma = rpc_transport_rdma::bind("rdma://127.0.0.1:0").await?;
    // gRPC's own wire (HTTP/2 with prior knowledge): any gRPC client can call it.
    let grpc = rpc_connect::AnyListener::bind("grpc://127.0.0.1:0").await?;
    let endpoints = [
        ("tcp", tcp.local_addr_uri()),
        ("unix", unix.local_addr_uri()),
        ("tls", tls.local_addr_uri()),
        ("udp", udp.local_addr_uri()),
        ("rdma", rdma.local_addr_uri()),
        ("grpc", grpc.local_addr_uri()),
    ];
    println!(
        "server: serving rpc.examples.v1.Echo, rpc.examples.v1.KeyValue and rpc.examples.v1.Blob"
    );
    let grpc_uri = endpoints[5].1.clone();
    for (name, uri) in &endpoints {
        println!("server: {name:<4} listening on {uri}");
    }
    let shutdown = Arc::new(tokio::sync::Notify::new());
    let mut serving = tokio::task::JoinSet::new();
    for listener in [tcp, unix] {
        let server = server.clone();
        let shutdown = shutdown.clone();
        serving.spawn(async move {
            server
                .serve_with_shutdown(listener, async move { shutdown.notified().await })
                .await
        });
    }
    {
        let server = server.clone();
        let shutdown = shutdown.clone();
        serving.spawn(async move {
            server
                .serve_with_shutdown(tls, async move { shutdown.notified().await })
                .await
        });
    }
    {
        let server = server.clone();
        let shutdown = shutdown.clone();
        serving.spawn(async move {
            server
                .serve_with_shutdown(udp, async move { shutdown.notified().await })
                .await
        });
    }
    {
        let server = server.clone();
        let shutdown = shutdown.clone();
        serving.spawn(async move {
            server
                .serve_with_shutdown(rdma, async move { shutdown.notified().await })
                .await
        });
    }
    serving.spawn(grpc.serve(&server, {
        let shutdown = shutdown.clone();
        async move { shutdown.notified().await }
    }));

    for (name, uri) in &endpoints {
        println!();
        let start = Instant::now();
        let channel = if *name == "tls" {
            rpc_connect::connect_with(uri, &client_tls).await?
        } else {
            connect(uri).await?
        };
        println!(
            "[{name:<4}] connected to {uri:<70} {:>9}",
            fmt_latency(start.elapsed())
        );
        tour(name, channel, &mut dropped).await?;
    }

    println!();
    println!("a Python grpcio client calling the same server over {grpc_uri}");
    grpcio_client(&grpc_uri).await?;

    println!();
    println!(
        "blob transfer: the same function over tcp:// and rdma:// (not grpc://: gRPC has no bulk transfer)"
    );
    for (name, uri) in [&endpoints[0], &endpoints[4]] {
        blob_transfer(name, connect(uri).await?).await;
    }

    println!();
    at_most_once(&server, &endpoints[0].1).await?;
    println!();
    lossy_udp(&endpoints[3].1).await?;

    println!();
    let start = Instant::now();
    shutdown.notify_waiters();
    while let Some(result) = serving.join_next().await {
        result??;
    }
    println!(
        "server: graceful shutdown complete {:>69}",
        fmt_latency(start.elapsed())
    );
    Ok(())
}
