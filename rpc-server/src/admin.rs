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
//! address is not loopback.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

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
use tokio::{net::TcpListener, sync::Semaphore};

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

/// What the admin routes read.
pub(crate) struct Admin {
    pub(crate) board: StatusBoard,
    pub(crate) info: ServerInfo,
    pub(crate) server: Server,
    pub(crate) prometheus: PrometheusHandle,
}

/// The address `--admin` names: `HOST:PORT`, or a bare port on loopback
/// (`--admin 9000` is `127.0.0.1:9000`).
pub(crate) fn resolve(addr: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = addr.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    std::net::ToSocketAddrs::to_socket_addrs(addr)
        .map_err(|e| format!("--admin {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("--admin {addr}: no address"))
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

/// Serves `listener` until the process ends.
pub(crate) async fn serve(listener: TcpListener, admin: Arc<Admin>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return; // never closed
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of file descriptors, most likely: wait for some to close.
                tracing::warn!(error = %err, "admin: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let response = respond(&admin, request.method(), request.uri());
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                () = tokio::time::sleep(CONNECTION_LIFETIME) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(err) = result {
                tracing::debug!(error = %err, "admin: connection ended");
            }
            drop(slot);
        });
    }
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
/// then the command line's), one `--name value` (or a lone `--flag`) a line.
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
    lines
}
