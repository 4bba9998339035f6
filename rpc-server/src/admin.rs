//! The admin server (`--admin HOST:PORT`): a read-only HTTP/1.1 server on hyper with the
//! live status page and the Prometheus text, on one address.
//!
//! | route | what |
//! | --- | --- |
//! | `GET /` | per method: calls/s, error rate, p50 and p99 over five minutes, as charts that update every second; version, uptime, listeners, configuration |
//! | `GET /status.json` | what the index page polls |
//! | `GET /connections` | each open connection: peer, wire, age, calls in flight, bytes and frames each way |
//! | `GET /rpcz` | recent and slow calls, slowest first, with their timing and status; `?method=&status=&min_ms=&limit=` |
//! | `GET /metrics` | Prometheus text |
//!
//! Anything but `GET` and `HEAD` gets 405, an unknown path 404. The pages come from
//! `rpc_observe::status`; this module only routes. The server has no authentication:
//! it binds where it is told, loopback when given a bare port, and warns when the
//! address is not loopback. Reached on a loopback address it answers only requests for `localhost` or
//! an IP address (421 otherwise: DNS rebinding).

use std::{collections::VecDeque, convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    body::Bytes,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
    Method, Response, StatusCode, Uri,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use rpc_core::server::Server;
use rpc_observe::status::{self, RpczFilter, ServerInfo, StatusBoard};
use tokio::{
    net::TcpListener,
    sync::{Notify, Semaphore},
};

/// Admin connections served at once: a browser opens a few, a scraper one; more wait
/// in the listener's backlog. Each costs a task and its buffers (a few KiB), so the
/// bound is set well above what the page and scrapers need: a local process that
/// holds connections with unfinished requests then has many to fill before a scrape
/// waits (a hostile-peer round stalled /metrics for 30 s with 190 of them at 32).
const MAX_CONNECTIONS: usize = 512;

/// Time a client has to send a request's headers before its connection is closed: a
/// browser or scraper sends them at once.
const HEADER_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one connection is served: then it is closed gracefully (after the response
/// in progress), so that a client keeping connections open cannot hold the
/// [`MAX_CONNECTIONS`] slots forever. A browser reconnects for its next poll.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// How long a connection past its lifetime has to finish the response in progress
/// before it is closed: a client that stopped reading kept it (and its slot) for good,
/// hyper's header timeout running only while a request is read.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The bounds [`serve`] keeps (the constants above; shorter in tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    max_connections: usize,
    header_timeout: Duration,
    lifetime: Duration,
    grace: Duration,
}

const LIMITS: Limits = Limits {
    max_connections: MAX_CONNECTIONS,
    header_timeout: HEADER_TIMEOUT,
    lifetime: CONNECTION_LIFETIME,
    grace: SHUTDOWN_GRACE,
};

/// What the admin routes read.
pub(crate) struct Admin {
    pub(crate) board: StatusBoard,
    pub(crate) info: ServerInfo,
    pub(crate) server: Server,
    pub(crate) prometheus: PrometheusHandle,
}

/// Why `--admin`'s address gave no socket address.
#[derive(Debug)]
pub(crate) enum AddressError {
    /// Not `HOST:PORT` or a port: a settings mistake (exit 2).
    Malformed(String),
    /// Well formed, but the host name did not resolve (now): a failure a restart may
    /// fix, as an unreachable etcd is (exit 1).
    Lookup(String),
}

/// The address `--admin` names: `HOST:PORT`, or a bare port on loopback
/// (`--admin 9000` is `127.0.0.1:9000`).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr, AddressError> {
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return Ok(socket);
    }
    // A name: its shape is checked here, so that only the lookup itself can fail below.
    let well_formed = addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains([':', '[', ']', '/']) && port.parse::<u16>().is_ok()
    });
    if !well_formed {
        return Err(AddressError::Malformed(format!(
            "--admin {addr}: expected HOST:PORT or a port"
        )));
    }
    std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| AddressError::Lookup(format!("--admin {addr}: {e}")))?
        .next()
        .ok_or_else(|| AddressError::Lookup(format!("--admin {addr}: no address")))
}

/// Binds the admin address; warns if it is reachable from other hosts.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    if !addr.ip().is_loopback() {
        tracing::warn!(
            admin = %addr,
            "the admin server has no authentication: anyone who reaches it sees the \
             status page, the connections, the recent calls and the metrics"
        );
    }
    TcpListener::bind(addr).await
}

/// The connections an admin server serves, oldest first: an id, and what closes it.
type OpenConnections = VecDeque<(u64, Arc<Notify>)>;

/// Serves `listener` until the process ends.
pub(crate) async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    serve_with(listener, admin, LIMITS).await;
}

async fn serve_with(listener: TcpListener, admin: Arc<Admin>, limits: Limits) {
    // Connections served, and those closing after they gave their place to a newer
    // one: at most as many again. The closing ones hold theirs until they end.
    let slots = Arc::new(Semaphore::new(2 * limits.max_connections));
    // The connections served, oldest first, each with what closes it gracefully.
    let open: Arc<std::sync::Mutex<OpenConnections>> = Arc::default();
    let mut next_id = 0u64;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, most likely: wait for some to close.
                tracing::warn!(error = %err, "admin: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // At capacity, the oldest connection is closed gracefully (after the answer in
        // progress; at once if it waits between requests) to make room: clients that
        // hold keep-alive connections and send a request now and then kept every slot
        // for their lifetime, and scrapes waited up to a minute (from a review). The
        // new connection is served at once, while the old one closes: waiting for it
        // let clients that read none of their answers hold each new connection for the
        // close's whole grace (5 s), and a scrape queued behind a few of them for 45 s
        // (from a review). Only when as many connections are closing as are served does
        // a new one wait, for the first of them to end.
        {
            let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= limits.max_connections {
                if let Some((_, close)) = open.pop_front() {
                    close.notify_one();
                }
            }
        }
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return; // never closed
                };
                slot
            }
        };
        let id = next_id;
        next_id += 1;
        let close = Arc::new(Notify::new());
        open.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((id, close.clone()));
        let open = open.clone();
        let admin = admin.clone();
        // Reached on a loopback address (bound there, or on a wildcard address): only
        // requests for localhost or an IP address (see `local_host`).
        let loopback = stream
            .local_addr()
            .is_ok_and(|addr| addr.ip().to_canonical().is_loopback());
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = if loopback && !local_request(&request) {
                    reply(
                        StatusCode::MISDIRECTED_REQUEST,
                        "text/plain; charset=utf-8",
                        "this loopback admin server answers requests for localhost or an IP \
                         address only\n"
                            .into(),
                    )
                } else {
                    respond(&admin, request.method(), request.uri())
                };
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                // A request head of some 16 to 32 KiB at most (hyper checks between
                // reads; its default allows ~400 KiB per connection, 200 MB over the
                // 512 connections served at once).
                .max_buf_size(16 << 10)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = close.notified() => {
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(limits.grace, connection).await {
                        Ok(result) => result,
                        Err(_) => Ok(()),
                    }
                }
                () = tokio::time::sleep(limits.lifetime) => {
                    connection.as_mut().graceful_shutdown();
                    match tokio::time::timeout(limits.grace, connection).await {
                        Ok(result) => result,
                        Err(_) => {
                            tracing::debug!("admin: a connection past its lifetime did not take its answer; closed");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(err) = result {
                tracing::debug!(error = %err, "admin: connection ended");
            }
            open.lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(open_id, _)| *open_id != id);
            drop(slot);
        });
    }
}

/// Whether a request reached on a loopback address is for this host: one `Host`
/// header, naming it ([`local_host`]), and, in the absolute form
/// (`GET http://name/metrics`), a local name there too (from a review: a second `Host`
/// header, or an absolute URI, named another host and was answered).
fn local_request<B>(request: &hyper::Request<B>) -> bool {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let (host, second) = (hosts.next(), hosts.next());
    if second.is_some() || !local_host(host) {
        return false;
    }
    match request.uri().authority() {
        None => true,
        Some(authority) => {
            HeaderValue::from_str(authority.as_str()).is_ok_and(|value| local_host(Some(&value)))
        }
    }
}

/// Whether a request's `Host` names this host as a loopback admin server is reached:
/// `localhost` or an IP address (any port). A page that rebinds its own name to
/// 127.0.0.1 (DNS rebinding) sends its name, and is refused: it would otherwise read
/// the status page, the recent calls and the metrics from a browser on this host.
fn local_host(host: Option<&HeaderValue>) -> bool {
    let Some(host) = host.and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        // [v6]:port or [v6]
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The response to `method` on `uri`.
fn respond(admin: &Admin, method: &Method, uri: &Uri) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut response = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "read-only: GET or HEAD\n".into(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    const HTML: &str = "text/html; charset=utf-8";
    let board = &admin.board;
    match uri.path() {
        "/" => reply(
            StatusCode::OK,
            HTML,
            status::render_index(board, &admin.info),
        ),
        "/status.json" => reply(
            StatusCode::OK,
            "application/json",
            status::render_json(board, &admin.info),
        ),
        "/connections" => reply(
            StatusCode::OK,
            HTML,
            status::render_connections(&admin.server.connections()),
        ),
        "/rpcz" => {
            let filter = RpczFilter::from_query(uri.query().unwrap_or(""));
            reply(StatusCode::OK, HTML, status::render_rpcz(board, &filter))
        }
        "/metrics" => {
            // The server's own counters as of this scrape, not of the last tick.
            rpc_observe::metrics::record_server_stats(&admin.server);
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                admin.prometheus.render(),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /, /connections, /rpcz, /metrics\n".into(),
        ),
    }
}

/// A response with `body`, never cached, and a policy that lets the page run its own
/// inline style and script and fetch from this address only.
fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

/// The configuration the index page lists: the options as given (the config file's,
/// then the command line's; an option given in both, once, as in force), one `--name
/// value` (or a lone `--flag`) a line.
pub(crate) fn config_lines(args: &[String]) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    let mut iter = args.iter().peekable();
    while let Some(arg) = iter.next() {
        let Some(name) = arg.strip_prefix("--") else {
            continue;
        };
        match name.split_once('=') {
            Some((name, value)) => lines.push((name.to_owned(), value.to_owned())),
            None => match iter.next_if(|next| !next.starts_with("--")) {
                Some(value) => lines.push((name.to_owned(), value.clone())),
                None => lines.push((name.to_owned(), "on".to_owned())),
            },
        }
    }
    // An option given in the config file and on the command line is the command
    // line's (the last): listed once, as it is in force (from a review: listed
    // twice). `--listen` and `--tls-client-ca` take several values, all in force.
    let repeatable = |name: &str| matches!(name, "listen" | "tls-client-ca");
    let mut kept: Vec<(String, String)> = Vec::with_capacity(lines.len());
    for (i, (name, value)) in lines.iter().enumerate() {
        let overridden = !repeatable(name) && lines[i + 1..].iter().any(|(later, _)| later == name);
        if !overridden {
            kept.push((name.clone(), value.clone()));
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn only_local_hosts_are_served_on_loopback() {
        let host = |h: &'static str| local_host(Some(&HeaderValue::from_static(h)));
        for ok in [
            "127.0.0.1:9100",
            "127.0.0.1",
            "localhost:9100",
            "LOCALHOST",
            "[::1]:9100",
            "[::1]",
            "10.0.0.5:80",
        ] {
            assert!(host(ok), "{ok}");
        }
        for refused in [
            "evil.example:9100",
            "evil.example",
            "127.0.0.1.evil.example",
            "[evil]:1",
            "",
        ] {
            assert!(!host(refused), "{refused}");
        }
        assert!(!local_host(None));
        // The whole request: one Host, and an absolute URI's name, both local.
        let request = |uri: &str, hosts: &[&'static str]| {
            let mut builder = hyper::Request::get(uri);
            for host in hosts {
                builder = builder.header(header::HOST, *host);
            }
            builder.body(()).unwrap()
        };
        assert!(local_request(&request("/metrics", &["127.0.0.1:9100"])));
        assert!(!local_request(&request(
            "/metrics",
            &["127.0.0.1", "evil.example"]
        )));
        assert!(!local_request(&request(
            "http://evil.example/metrics",
            &["127.0.0.1"]
        )));
        assert!(local_request(&request(
            "http://localhost:9100/metrics",
            &["localhost"]
        )));
    }

    /// An option from the config file given again on the command line is listed
    /// once, with the value in force; the repeatable ones keep every value.
    #[test]
    fn the_configuration_lists_what_is_in_force() {
        let args: Vec<String> = [
            "--auth-tokens",
            "/etc/a",
            "--listen",
            "tcp://a:1",
            "--listen",
            "tcp://b:2",
            "--auth-tokens",
            "/etc/b",
            "--no-reflection",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let lines = config_lines(&args);
        let shown: Vec<(&str, &str)> = lines
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("listen", "tcp://a:1"),
                ("listen", "tcp://b:2"),
                ("auth-tokens", "/etc/b"),
                ("no-reflection", "on")
            ]
        );
    }

    /// The answer to `GET /nope` on a connection of its own, closed after it.
    async fn get_nope(addr: SocketAddr) -> Vec<u8> {
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        next.read_to_end(&mut answer).await.unwrap();
        answer
    }

    /// An admin server with `limits` on a fresh loopback port: its address.
    async fn serve_limited(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_with(listener, test_admin(), limits));
        addr
    }

    /// A client of `addr` that pipelines requests and reads none of the answers (a
    /// 4 KiB receive buffer), until its writes fail.
    async fn hog(addr: SocketAddr) -> tokio::task::JoinHandle<()> {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut hog = socket.connect(addr).await.unwrap();
        tokio::spawn(async move {
            let request = b"GET /status.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
            while hog.write_all(request).await.is_ok() {}
        })
    }

    /// An admin state with nothing in it, for the HTTP tests.
    fn test_admin() -> Arc<Admin> {
        Arc::new(Admin {
            board: StatusBoard::new(),
            info: ServerInfo::new("test", "0"),
            server: Server::builder().build(),
            prometheus: metrics_exporter_prometheus::PrometheusBuilder::new()
                .build_recorder()
                .handle(),
        })
    }

    /// A request head of 80 KB is refused (431): hyper's default let each of the
    /// 512 connections hold about 400 KiB of one (from a review).
    #[tokio::test]
    async fn a_request_head_of_80_kb_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin = test_admin();
        tokio::spawn(serve(listener, admin));
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut request = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_vec();
        for i in 0..20 {
            request.extend_from_slice(format!("x-filler-{i}: {}\r\n", "a".repeat(4000)).as_bytes());
        }
        request.extend_from_slice(b"Connection: close\r\n\r\n");
        let _ = client.write_all(&request).await;
        let mut answer = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(30), client.read_to_end(&mut answer)).await;
        assert!(
            answer.starts_with(b"HTTP/1.1 431"),
            "{:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(200)])
        );
    }

    /// At capacity, a new connection closes the oldest (gracefully): clients holding
    /// keep-alive connections that send a request now and then no longer keep a scrape
    /// waiting for their lifetime (from a review: 56.8 s with 600 of them).
    #[tokio::test]
    async fn a_new_connection_at_capacity_closes_the_oldest() {
        let addr = serve_limited(Limits {
            max_connections: 2,
            header_timeout: Duration::from_secs(3),
            lifetime: Duration::from_secs(600),
            grace: Duration::from_secs(5),
        })
        .await;
        // Two keep-alive connections, each answered once and kept open.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            conn.write_all(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 512];
            let n = conn.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 404"));
            held.push(conn);
        }
        let answer = tokio::time::timeout(Duration::from_secs(20), get_nope(addr))
            .await
            .expect("the new connection waited for a slot");
        assert!(answer.starts_with(b"HTTP/1.1 404"), "{answer:?}");
        // The oldest was the one closed.
        let mut buf = [0u8; 16];
        let closed = tokio::time::timeout(Duration::from_secs(20), held[0].read(&mut buf))
            .await
            .expect("the oldest connection is still open");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }

    /// At capacity, a new connection is served while the oldest closes, not once it
    /// has closed: the oldest here pipeline requests and read none of the answers, so
    /// their graceful close lasts its whole grace (10 minutes here), which each new
    /// connection waited for (from a review: a scrape behind eight of them, 45 s).
    #[tokio::test]
    async fn a_new_connection_at_capacity_does_not_wait_for_the_oldest_to_close() {
        let addr = serve_limited(Limits {
            max_connections: 2,
            header_timeout: Duration::from_secs(3),
            lifetime: Duration::from_secs(600),
            grace: Duration::from_secs(600),
        })
        .await;
        let hogs = [hog(addr).await, hog(addr).await];
        // Let both fill their sockets.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..3 {
            let answer = tokio::time::timeout(Duration::from_secs(60), get_nope(addr))
                .await
                .expect("the new connection waited for the oldest to close");
            assert!(answer.starts_with(b"HTTP/1.1 404"), "{answer:?}");
        }
        for hog in hogs {
            hog.abort();
        }
    }

    /// A client that pipelines requests and reads none of the answers loses its
    /// connection, and the slot with it, once its lifetime and the grace after it are
    /// over: hyper's header timeout does not run while an answer is being written, and
    /// the graceful close waited for that answer for good (from a review: 512 such
    /// clients stopped the admin server until a restart).
    #[tokio::test]
    async fn a_client_that_stops_reading_does_not_keep_its_slot() {
        let addr = serve_limited(Limits {
            max_connections: 1,
            header_timeout: Duration::from_secs(3),
            lifetime: Duration::from_millis(300),
            grace: Duration::from_millis(300),
        })
        .await;
        let hogging = hog(addr).await;

        let answer = tokio::time::timeout(Duration::from_secs(60), get_nope(addr))
            .await
            .expect("the one slot freed once the reader-less connection was closed");
        assert!(answer.starts_with(b"HTTP/1.1 404"), "{answer:?}");
        // The hog's connection was closed under it.
        tokio::time::timeout(Duration::from_secs(60), hogging)
            .await
            .expect("its writes failed")
            .unwrap();
    }
}
