//! Prometheus metrics of the server: calls, errors and latencies per method,
//! connections, duplicate-cache hits and evictions, served as text on `GET /metrics`;
//! and [`Observed`], the layer that records calls (and names the replica in replies).

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, RwLock,
    },
    time::Instant,
};

use rpc_core::{
    server::{Server, ServerCall, ServerReply},
    Code, Status,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0,
];

#[derive(Default)]
struct MethodStats {
    by_code: RwLock<HashMap<u32, AtomicU64>>,
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

/// Per-method statistics, shared by every connection.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    methods: Arc<RwLock<HashMap<String, Arc<MethodStats>>>>,
}

impl Metrics {
    fn method(&self, name: &str) -> Arc<MethodStats> {
        if let Some(stats) = self
            .methods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return stats.clone();
        }
        self.methods
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.to_owned())
            .or_default()
            .clone()
    }

    fn record(&self, method: &str, code: Code, started: Instant) {
        let stats = self.method(method);
        let elapsed = started.elapsed();
        stats.count.fetch_add(1, Ordering::Relaxed);
        stats
            .sum_us
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        let secs = elapsed.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&stats.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        let code = code.as_u32();
        if let Some(n) = stats
            .by_code
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&code)
        {
            n.fetch_add(1, Ordering::Relaxed);
            return;
        }
        stats
            .by_code
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(code)
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of everything recorded, plus the server's own
    /// counters.
    pub(crate) fn render(&self, server: &Server) -> String {
        let mut out = String::new();
        out.push_str("# TYPE rpc_server_calls_total counter\n");
        let methods = self.methods.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = methods.keys().collect();
        names.sort();
        for name in &names {
            let stats = &methods[*name];
            let by_code = stats.by_code.read().unwrap_or_else(|e| e.into_inner());
            for (code, n) in by_code.iter() {
                let code = Code::from_u32(*code);
                let _ = writeln!(
                    out,
                    "rpc_server_calls_total{{method=\"{name}\",code=\"{code}\"}} {}",
                    n.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# TYPE rpc_server_call_duration_seconds histogram\n");
        for name in &names {
            let stats = &methods[*name];
            for (bound, bucket) in BUCKETS.iter().zip(&stats.buckets) {
                let _ = writeln!(
                    out,
                    "rpc_server_call_duration_seconds_bucket{{method=\"{name}\",le=\"{bound}\"}} {}",
                    bucket.load(Ordering::Relaxed)
                );
            }
            let count = stats.count.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "rpc_server_call_duration_seconds_bucket{{method=\"{name}\",le=\"+Inf\"}} {count}\n\
                 rpc_server_call_duration_seconds_sum{{method=\"{name}\"}} {}\n\
                 rpc_server_call_duration_seconds_count{{method=\"{name}\"}} {count}",
                stats.sum_us.load(Ordering::Relaxed) as f64 / 1e6
            );
        }
        let _ = writeln!(
            out,
            "# TYPE rpc_server_connections gauge\nrpc_server_connections {}",
            server.open_connections()
        );
        if let Some(stats) = server.dedupe_stats() {
            let _ = writeln!(
                out,
                "# TYPE rpc_dedupe_hits_total counter\nrpc_dedupe_hits_total {}\n\
                 # TYPE rpc_dedupe_attached_total counter\nrpc_dedupe_attached_total {}\n\
                 # TYPE rpc_dedupe_evictions_total counter\nrpc_dedupe_evictions_total {}\n\
                 # TYPE rpc_server_retried_requests_total counter\n\
                 rpc_server_retried_requests_total {}",
                stats.hits.load(Ordering::Relaxed),
                stats.attached.load(Ordering::Relaxed),
                stats.evictions.load(Ordering::Relaxed),
                stats.retries.load(Ordering::Relaxed)
            );
        }
        out
    }
}

/// Wraps every service in [`Observed`].
#[derive(Clone)]
pub(crate) struct ObservedLayer {
    pub(crate) metrics: Metrics,
    pub(crate) served_by: &'static str,
}

impl<S> tower::Layer<S> for ObservedLayer {
    type Service = Observed<S>;
    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            layer: self.clone(),
        }
    }
}

/// Records every call of the service it wraps, and stamps each reply with
/// `x-served-by` so that clients and tests see which replica answered.
#[derive(Clone)]
pub(crate) struct Observed<S> {
    inner: S,
    layer: ObservedLayer,
}

impl<S> tower::Service<ServerCall> for Observed<S>
where
    S: tower::Service<ServerCall, Response = ServerReply, Error = Status>,
    S::Future: Send + 'static,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = futures::future::BoxFuture<'static, Result<ServerReply, Status>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let started = Instant::now();
        let method = call.method.clone();
        let ObservedLayer { metrics, served_by } = self.layer.clone();
        let reply = self.inner.call(call);
        Box::pin(async move {
            let mut result = reply.await;
            let code = result.as_ref().map_or_else(Status::code, |_| Code::OK);
            metrics.record(&method, code, started);
            if let Ok(reply) = &mut result {
                let _ = reply.metadata.insert("x-served-by", served_by);
            }
            result
        })
    }
}

/// Serves `GET /metrics` (any other path: 404) until the process ends.
pub(crate) async fn serve(listener: TcpListener, metrics: Metrics, server: Server) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let Ok(n) = stream.read(&mut request).await else {
                return;
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let (status, body) = if head.starts_with("GET /metrics ") {
                ("200 OK", metrics.render(&server))
            } else {
                ("404 Not Found", "not found\n".to_owned())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
