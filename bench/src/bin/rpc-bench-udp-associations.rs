//! The server-side cost of UDP associations, and what short-lived clients leave behind.
//!
//! ```text
//! rpc-bench-udp-associations [--clients N] [--running R] [--wait-s S]
//!                            (defaults: 1000, 10, 10)
//! ```
//!
//! Starts the framework's UDP server (`udp://127.0.0.1`, default [`UdpConfig`], the
//! generated `Echo` service) on its own `current_thread` runtime and thread; every
//! client runs in a child process, so the process's descriptors (`/proc/self/fd`) and
//! resident memory (`VmRSS`) are the server's alone. Four phases, each against a fresh
//! server, each printing one JSON line:
//!
//! 1. `idle`: the child opens N channels and makes one call on each, then keeps them
//!    open and idle: the server's descriptors and memory per idle association (the
//!    difference from `before`, divided by N). Then the child drops them (each sends
//!    CLOSE) and exits, and the associations left a second later are counted (memory
//!    freed then stays with the allocator: `VmRSS` does not fall back).
//! 2. `channel`: the child opens R channels that stay open (the clients still
//!    running), then N short-lived clients one after another: a channel, one call,
//!    dropped (it sends CLOSE).
//! 3. `raw-opened`: as 2, but each short-lived client is a raw socket that opens an
//!    association (HELLO, RETRY, HELLO with the token, ACCEPT; `docs/wire.md` §1.2)
//!    and is closed without a word, as a killed process's socket is.
//! 4. `raw-called`: as 3, with one `Echo/Say` call answered before the socket is
//!    closed.
//!
//! Every phase samples `before` once the child has started (its two pipes are among
//! the descriptors, as in every later sample but `closed`) and before it opens
//! anything. For 2 to 4 the line holds the server's descriptors, memory and
//! associations `before`, with the R running clients, when the last short-lived client has exited,
//! S seconds later (the issue's "10 s after"), and one second after that; the target is
//! that S seconds later the server holds about as many associations and descriptors
//! as clients still run (R) above what it held before.
//!
//! Keys: `phase`, `clients`, `running`, `wait_s`, `churn_s` (seconds the N
//! short-lived clients took), then per moment (`before`, `running`, `exited`,
//! `after_wait`, `after_wait_1s`; `idle` and `closed` for the idle phase)
//! `descriptors`, `rss_kib`, `associations` (the listener's `peers_live`) and
//! `peer_sockets` (`peer_sockets_live`); last `left_after_wait` (descriptors and
//! associations at `after_wait` above `before`), or for the idle phase
//! `descriptors_per_association` and `kib_per_association`.

use std::{
    io::{BufRead, BufReader, Write as _},
    net::SocketAddr,
    process::{Child, ChildStdout, Command, Stdio},
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use bytes::BytesMut;
use rpc_core::{client::Channel, frame, server::Server, Metadata, Request};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_udp::{
    datagram::{Control, ControlKind, Datagram},
    UdpConfig, UdpConnector, UdpListener, UdpStats,
};
use tokio::net::UdpSocket;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Deadline of every call a client makes (none should come near it on loopback).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The short-lived clients' kinds, in the order measured.
const KINDS: [&str; 3] = ["channel", "raw-opened", "raw-called"];

/// What the command line asked for.
#[derive(Clone, Copy, Debug)]
struct Args {
    clients: usize,
    running: usize,
    wait: Duration,
}

fn parse_args(args: &[String]) -> Result<Args, BoxError> {
    let value = |flag: &str| -> Result<Option<&str>, BoxError> {
        match args.iter().position(|a| a == flag) {
            Some(i) => Ok(Some(
                args.get(i + 1)
                    .ok_or_else(|| format!("{flag} needs a value"))?
                    .as_str(),
            )),
            None => Ok(None),
        }
    };
    Ok(Args {
        clients: value("--clients")?.map_or(Ok(1000), str::parse)?,
        running: value("--running")?.map_or(Ok(10), str::parse)?,
        wait: Duration::from_secs_f64(value("--wait-s")?.map_or(Ok(10.0), str::parse)?),
    })
}

fn main() -> Result<(), BoxError> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = parse_args(&argv)?;
    if let Some(i) = argv.iter().position(|a| a == "--client-of") {
        let addr: SocketAddr = argv
            .get(i + 1)
            .ok_or("--client-of needs an address")?
            .parse()?;
        let kind = argv
            .iter()
            .position(|a| a == "--kind")
            .and_then(|i| argv.get(i + 1))
            .ok_or("--kind needs a value")?;
        return child(addr, kind, args);
    }
    println!("{}", idle_phase(args)?);
    for kind in KINDS {
        println!("{}", short_lived_phase(kind, args)?);
    }
    Ok(())
}

/// The server's figures at one moment.
#[derive(Clone, Copy, Debug)]
struct Sample {
    descriptors: usize,
    rss_kib: u64,
    associations: usize,
    peer_sockets: usize,
}

impl Sample {
    fn take(stats: &UdpStats) -> Sample {
        Sample {
            descriptors: std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
            rss_kib: rpc_bench::rss_bytes(std::process::id()).unwrap_or(0) / 1024,
            associations: stats.peers_live.load(Ordering::Relaxed),
            peer_sockets: stats.peer_sockets_live.load(Ordering::Relaxed),
        }
    }

    /// `"name":{"descriptors":…,…}`.
    fn json(&self, name: &str) -> String {
        format!(
            r#""{name}":{{"descriptors":{},"rss_kib":{},"associations":{},"peer_sockets":{}}}"#,
            self.descriptors, self.rss_kib, self.associations, self.peer_sockets
        )
    }
}

/// A UDP server on its own thread and `current_thread` runtime; it stops on drop.
struct ServerThread {
    addr: SocketAddr,
    stats: Arc<UdpStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    fn start() -> Result<ServerThread, BoxError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            runtime.block_on(async move {
                let listener =
                    match UdpListener::bind("127.0.0.1:0".parse().unwrap(), UdpConfig::default())
                        .await
                    {
                        Ok(listener) => listener,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                let _ = ready_tx.send(Ok((listener.local_socket_addr(), listener.stats().clone())));
                let server = Server::builder()
                    .add_service(EchoServer::new(EchoService))
                    .build();
                tokio::select! {
                    _ = server.serve(listener) => {}
                    _ = stopped => {}
                }
            });
        });
        let (addr, stats) = ready_rx.recv()??;
        // Let the runtime settle before the first sample.
        std::thread::sleep(Duration::from_millis(300));
        Ok(ServerThread {
            addr,
            stats,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    fn sample(&self) -> Sample {
        Sample::take(&self.stats)
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The child process running the clients, and its stdout.
struct ClientProcess {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl ClientProcess {
    fn spawn(server: SocketAddr, kind: &str, args: Args) -> Result<ClientProcess, BoxError> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                "--client-of",
                &server.to_string(),
                "--kind",
                kind,
                "--clients",
                &args.clients.to_string(),
                "--running",
                &args.running.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = BufReader::new(child.stdout.take().ok_or("no child stdout")?);
        Ok(ClientProcess { child, out })
    }

    /// Spawns the child and waits until it has started, then samples the server (so
    /// that `before` counts the pipes to the child, as every later sample does) and
    /// lets the child begin.
    fn start(
        server: &ServerThread,
        kind: &str,
        args: Args,
    ) -> Result<(ClientProcess, Sample), BoxError> {
        let mut child = ClientProcess::spawn(server.addr, kind, args)?;
        child.expect("started")?;
        let before = server.sample();
        child.go()?;
        Ok((child, before))
    }

    /// Waits for the child to print `line`.
    fn expect(&mut self, line: &str) -> Result<(), BoxError> {
        let mut got = String::new();
        self.out.read_line(&mut got)?;
        if got.trim() != line {
            return Err(format!("client process: expected {line:?}, got {got:?}").into());
        }
        Ok(())
    }

    /// Tells the child to go on.
    fn go(&mut self) -> Result<(), BoxError> {
        let stdin = self.child.stdin.as_mut().ok_or("no child stdin")?;
        writeln!(stdin, "go")?;
        stdin.flush()?;
        Ok(())
    }

    /// Closes the child's stdin (it drops its clients and exits) and waits for it.
    fn finish(mut self) -> Result<(), BoxError> {
        drop(self.child.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("client process failed: {status}").into());
        }
        Ok(())
    }
}

/// Phase 1: memory and descriptors per idle association.
fn idle_phase(args: Args) -> Result<String, BoxError> {
    let server = ServerThread::start()?;
    let (mut child, before) = ClientProcess::start(&server, "idle", args)?;
    child.expect("ready")?;
    std::thread::sleep(Duration::from_millis(500));
    let idle = server.sample();
    child.finish()?;
    std::thread::sleep(Duration::from_secs(1));
    let closed = server.sample();
    let n = args.clients.max(1) as f64;
    Ok(format!(
        r#"{{"kind":"udp_associations","phase":"idle","clients":{},{},{},{},"descriptors_per_association":{:.3},"kib_per_association":{:.2}}}"#,
        args.clients,
        before.json("before"),
        idle.json("idle"),
        closed.json("closed"),
        (idle.descriptors as f64 - before.descriptors as f64) / n,
        (idle.rss_kib as f64 - before.rss_kib as f64) / n,
    ))
}

/// Phases 2 to 4: what `args.clients` short-lived clients of `kind` leave behind,
/// `args.wait` after the last has exited, beside `args.running` that still run.
fn short_lived_phase(kind: &str, args: Args) -> Result<String, BoxError> {
    let server = ServerThread::start()?;
    let (mut child, before) = ClientProcess::start(&server, kind, args)?;
    child.expect("running")?;
    std::thread::sleep(Duration::from_millis(300));
    let running = server.sample();
    let started = Instant::now();
    child.go()?;
    child.expect("exited")?;
    let exited_at = Instant::now();
    let churn_s = exited_at.duration_since(started).as_secs_f64();
    let exited = server.sample();
    std::thread::sleep(args.wait.saturating_sub(exited_at.elapsed()));
    let after_wait = server.sample();
    std::thread::sleep(Duration::from_secs(1));
    let after_wait_1s = server.sample();
    child.finish()?;
    Ok(format!(
        r#"{{"kind":"udp_associations","phase":"{kind}","clients":{},"running":{},"wait_s":{},"churn_s":{churn_s:.3},{},{},{},{},{},"left_after_wait":{{"descriptors":{},"associations":{}}}}}"#,
        args.clients,
        args.running,
        args.wait.as_secs_f64(),
        before.json("before"),
        running.json("running"),
        exited.json("exited"),
        after_wait.json("after_wait"),
        after_wait_1s.json("after_wait_1s"),
        after_wait.descriptors as i64 - before.descriptors as i64,
        after_wait.associations as i64 - before.associations as i64,
    ))
}

/// The child: runs the clients of `kind` against `server`, telling the parent where
/// it is on stdout and waiting for it on stdin.
fn child(server: SocketAddr, kind: &str, args: Args) -> Result<(), BoxError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let uri = format!("udp://{server}");
        say_to_parent("started")?;
        wait_for_parent().await?;
        if kind == "idle" {
            let idle = open_channels(&uri, args.clients).await?;
            say_to_parent("ready")?;
            wait_for_parent().await?;
            drop(idle); // each sends CLOSE
            return Ok(());
        }
        let running = open_channels(&uri, args.running).await?;
        say_to_parent("running")?;
        wait_for_parent().await?;
        for i in 0..args.clients {
            match kind {
                "channel" => drop(open_channels(&uri, 1).await?),
                "raw-opened" => drop(raw_open(server).await?),
                "raw-called" => {
                    let socket = raw_open(server).await?;
                    raw_call(&socket, i as u64 + 1).await?;
                    drop(socket);
                }
                other => return Err(format!("unknown kind {other:?}").into()),
            }
        }
        say_to_parent("exited")?;
        wait_for_parent().await?;
        drop(running);
        Ok::<_, BoxError>(())
    })
}

fn say_to_parent(line: &str) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Reads a line from stdin (empty at its end) without blocking the runtime.
async fn wait_for_parent() -> Result<(), BoxError> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| ())
    })
    .await??;
    Ok(())
}

/// `n` channels to `uri`, each after one answered call.
async fn open_channels(uri: &str, n: usize) -> Result<Vec<EchoClient<Channel>>, BoxError> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let channel = Channel::builder()
            .connect(UdpConnector::from_uri(uri)?)
            .await?;
        let mut client = EchoClient::new(channel);
        client
            .say(
                Request::new(SayRequest {
                    message: "hello".into(),
                    ..SayRequest::default()
                })
                .with_timeout(CALL_TIMEOUT),
            )
            .await?;
        clients.push(client);
    }
    Ok(clients)
}

/// A raw socket connected to `server` with an association opened as `docs/wire.md`
/// §1.2 says: HELLO, RETRY with a token, HELLO with it, ACCEPT.
async fn raw_open(server: SocketAddr) -> Result<UdpSocket, BoxError> {
    use std::hash::{BuildHasher, Hasher};
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    socket.connect(server).await?;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u16(socket.local_addr()?.port());
    let client = h.finish().max(1);
    let mut hello = Control::new(ControlKind::HELLO, 0, client);
    let mut buf = vec![0u8; 65_536];
    for _ in 0..50 {
        socket.send(&hello.to_bytes()).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(received) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            let n = received?;
            if let Ok(Datagram::Control(c)) =
                Datagram::decode(bytes::Bytes::copy_from_slice(&buf[..n]))
            {
                if c.client != client {
                    continue;
                }
                match c.kind {
                    ControlKind::ACCEPT => return Ok(socket),
                    ControlKind::RETRY => {
                        hello.token = c.token;
                        break;
                    }
                    other => return Err(format!("{other:?} to a HELLO").into()),
                }
            }
        }
    }
    Err("no ACCEPT".into())
}

/// Calls `Echo/Say` as call `id` from a raw socket with an open association (one
/// whole datagram each way) and waits for the RESPONSE.
async fn raw_call(socket: &UdpSocket, id: u64) -> Result<(), BoxError> {
    let mut datagram = BytesMut::new();
    frame::encode_request_header(
        &mut datagram,
        id,
        "rpc.examples.v1.Echo/Say",
        Some(CALL_TIMEOUT),
        &Metadata::new(),
    );
    let payload = rpc_core::payload::encode(&SayRequest {
        message: "bye".into(),
        ..SayRequest::default()
    })
    .to_bytes();
    datagram.extend_from_slice(&payload);
    let mut buf = vec![0u8; 65_536];
    for _ in 0..50 {
        socket.send(&datagram).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(received) = tokio::time::timeout_at(deadline, socket.recv(&mut buf)).await {
            let d = &buf[..received?];
            // A RESPONSE to call `id`: version, kind, flags, then the id.
            if d.len() >= 12
                && d[0] == frame::VERSION
                && d[1] == frame::FrameKind::RESPONSE.0
                && d[4..12] == id.to_be_bytes()
            {
                return Ok(());
            }
        }
    }
    Err(format!("no RESPONSE to call {id}").into())
}
