//! Prometheus metrics of the server: the `rpc-observe` layers (calls, status codes,
//! latency histograms and handlers in flight per method), the server's own counters
//! (connections, duplicate cache) and the TLS listeners' handshakes, recorded by
//! `metrics-exporter-prometheus` and rendered on the admin server's `GET /metrics`
//! (`src/admin.rs`); and [`ServedByLayer`], which names the replica in every reply.

use std::{
    sync::atomic::Ordering,
    task::{Context, Poll},
    time::Duration,
};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use rpc_core::{
    server::{Server, ServerCall, ServerReply},
    Status,
};
use rpc_transport_tcp::tls::ServerTls;

/// Upper bounds of the latency histograms, in seconds: 50 µs to 5 minutes, in steps
/// of 2 to 2.5 up to 10 s (a p99 target of 250 or 500 ms falls on a bound), then 30 s,
/// a minute and five for streaming calls, which count until their stream ends.
const BUCKETS: [f64; 20] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// How often the server's own counters (connections, duplicate cache, TLS) are read
/// into the exporter: a scrape sees them at most this old.
const STATS_INTERVAL: Duration = Duration::from_secs(1);

/// `rpc_tls_handshakes_total`: TLS handshakes completed.
const TLS_HANDSHAKES: &str = "rpc_tls_handshakes_total";
/// `rpc_tls_handshakes_failed_total`: TLS handshakes failed.
const TLS_FAILED: &str = "rpc_tls_handshakes_failed_total";
/// `rpc_tls_handshakes_timed_out_total`: TLS handshakes cut off at the timeout.
const TLS_TIMED_OUT: &str = "rpc_tls_handshakes_timed_out_total";
/// `rpc_tls_refused_busy_source_total`: connections closed because their source had
/// its most handshakes running or waiting.
const TLS_REFUSED_BUSY_SOURCE: &str = "rpc_tls_refused_busy_source_total";
/// `rpc_tls_reloads_total`: certificate reloads (SIGHUP) that succeeded.
const TLS_RELOADS: &str = "rpc_tls_reloads_total";

/// Installs the Prometheus recorder as the process's recorder and returns the handle
/// that renders its text (the admin server's `GET /metrics`). Must run before the
/// server's first call: the layers register their metrics with the recorder of the
/// moment.
pub(crate) fn install() -> Result<PrometheusHandle, Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_duration_seconds".into()), &BUCKETS)?
        .install_recorder()?;
    rpc_observe::metrics::describe();
    crate::transport_metrics::describe();
    use metrics::{describe_counter, Unit};
    describe_counter!(
        TLS_HANDSHAKES,
        Unit::Count,
        "TLS handshakes completed by the server's TLS listeners."
    );
    describe_counter!(TLS_FAILED, Unit::Count, "TLS handshakes that failed (a refused or absent client certificate, a peer that does not speak TLS or the right ALPN).");
    describe_counter!(
        TLS_TIMED_OUT,
        Unit::Count,
        "TLS handshakes cut off at the handshake timeout."
    );
    describe_counter!(
        TLS_REFUSED_BUSY_SOURCE,
        Unit::Count,
        "Connections closed before their TLS handshake: their source (an IPv4 address, an IPv6 /64) had 1,024 handshakes running or waiting."
    );
    describe_counter!(
        TLS_RELOADS,
        Unit::Count,
        "Successful reloads of the TLS certificate, key and client CAs (SIGHUP)."
    );
    Ok(handle)
}

/// Reads the server's own counters into the recorder every [`STATS_INTERVAL`], and
/// runs the recorder's upkeep (which keeps its histograms from growing between
/// scrapes), until the process ends.
pub(crate) async fn record_stats(
    server: Server,
    tls: Option<ServerTls>,
    handle: PrometheusHandle,
    transports: Vec<crate::transport_metrics::Listened>,
) {
    let mut interval = tokio::time::interval(STATS_INTERVAL);
    loop {
        interval.tick().await;
        handle.run_upkeep();
        rpc_observe::metrics::record_server_stats(&server);
        crate::transport_metrics::record(&transports);
        if let Some(tls) = &tls {
            let stats = tls.stats();
            for (name, value) in [
                (TLS_HANDSHAKES, &stats.handshakes),
                (TLS_FAILED, &stats.failed),
                (TLS_TIMED_OUT, &stats.timed_out),
                (TLS_REFUSED_BUSY_SOURCE, &stats.refused_busy_source),
                (TLS_RELOADS, &stats.reloads),
            ] {
                metrics::counter!(name).absolute(value.load(Ordering::Relaxed));
            }
        }
    }
}

/// Wraps every service in [`ServedBy`].
#[derive(Clone)]
pub(crate) struct ServedByLayer(pub(crate) &'static str);

impl<S> tower::Layer<S> for ServedByLayer {
    type Service = ServedBy<S>;
    fn layer(&self, inner: S) -> ServedBy<S> {
        ServedBy {
            inner,
            name: self.0,
        }
    }
}

/// Stamps each reply, an error's included, with `x-served-by` so that clients and tests
/// see which replica answered. (A stream's headers get it from the reply too; a call
/// refused before its handler, an unknown method say, has none.)
#[derive(Clone)]
pub(crate) struct ServedBy<S> {
    inner: S,
    name: &'static str,
}

impl<S> tower::Service<ServerCall> for ServedBy<S>
where
    S: tower::Service<ServerCall, Response = ServerReply, Error = Status>,
    S::Future: Send + 'static,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = futures::future::BoxFuture<'static, Result<ServerReply, Status>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let name = self.name;
        let reply = self.inner.call(call);
        Box::pin(async move {
            let mut result = reply.await;
            let metadata = match &mut result {
                Ok(reply) => &mut reply.metadata,
                Err(status) => status.metadata_mut(),
            };
            let _ = metadata.insert("x-served-by", name);
            result
        })
    }
}
