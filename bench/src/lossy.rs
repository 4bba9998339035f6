//! The `lossy` workload: unary calls over `udp://` through a fault-injecting proxy
//! ([`fault_proxy::UdpProxy`]) that drops datagrams at a given rate each way, with a
//! deadline on every call.
//!
//! For each loss rate (always 0 first, then those of `--loss`, by default 5% and 20%)
//! the client thread starts a proxy in front of the server, connects a fresh channel
//! through it (default retransmission settings), makes a tenth as many unmeasured
//! calls, then the measured ones, [`LossyParams::in_flight`] at a time, each with a
//! [`LossyParams::deadline`] (3 s). A call that fails (in practice: its deadline
//! passes before one copy of the request and one of its response got through) is a
//! *deadline miss*; its latency, the time until it failed, stays among the samples, so
//! the percentiles are those of every call. The proxy's own counters (datagrams
//! received and dropped) go into the result, to show the loss it applied.
//!
//! Each loss rate is one result line, with the fields of every result and
//! `loss_each_way`, `deadline_ms`, `deadline_misses`, `proxy_received` and
//! `proxy_dropped`; after the run comes a table of medians per loss rate (see
//! [`table`]).

use std::{
    cell::Cell,
    fmt::Write as _,
    io,
    net::SocketAddr,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use bytes::Bytes;
use fault_proxy::{UdpFaults, UdpProxy};
use futures::{stream::FuturesUnordered, StreamExt};
use rpc_core::{client::Channel, Code, Request};
use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
use rpc_transport_udp::UdpConnector;

use crate::{
    report::BenchResult,
    stats,
    subjects::framework::{MAX_FRAME_LEN, MAX_IN_FLIGHT},
    threads::{Phase, ServerControl},
    workloads::{Measurement, Params},
};

/// The sizes of the lossy workload.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LossyParams {
    /// Loss rates each way, in the order measured; the first is always 0 (no loss, the
    /// reference of the same run).
    pub(crate) rates: Vec<f64>,
    /// Unmeasured calls per loss rate, first.
    pub(crate) warmup: usize,
    /// Measured calls per loss rate.
    pub(crate) calls: usize,
    /// Calls in flight at once.
    pub(crate) in_flight: usize,
    /// Every call's deadline.
    pub(crate) deadline: Duration,
    /// Bytes of payload per request.
    pub(crate) payload_bytes: usize,
}

/// The loss rates measured when `--loss` gives none: 5% and 20% each way.
pub(crate) const DEFAULT_RATES: [f64; 2] = [0.05, 0.20];

impl LossyParams {
    /// The full run: no loss, 5% and 20% each way; 4,000 unmeasured and 40,000
    /// measured calls per rate, 16 in flight, 32 bytes, a 3 s deadline each. (At the
    /// issue's 1 miss in 3,550 calls, 40,000 calls show about 11.)
    pub(crate) fn full() -> LossyParams {
        LossyParams {
            rates: LossyParams::with_reference(&DEFAULT_RATES),
            warmup: 4_000,
            calls: 40_000,
            in_flight: 16,
            deadline: Duration::from_secs(3),
            payload_bytes: 32,
        }
    }

    /// The smoke run: a tenth of the calls (the rates, concurrency and deadline of
    /// `self`).
    pub(crate) fn tenth(self) -> LossyParams {
        LossyParams {
            warmup: self.warmup / 10,
            calls: (self.calls / 10).max(1),
            ..self
        }
    }

    /// `rates` after a 0 (the no-loss reference), without repeats.
    pub(crate) fn with_reference(rates: &[f64]) -> Vec<f64> {
        let mut all = vec![0.0];
        for &rate in rates {
            if !all.contains(&rate) {
                all.push(rate);
            }
        }
        all
    }
}

/// What a lossy measurement adds to a [`Measurement`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LossOutcome {
    /// The proxy's drop probability, each way.
    pub(crate) loss_each_way: f64,
    /// Every call's deadline.
    pub(crate) deadline: Duration,
    /// Measured calls that failed.
    pub(crate) deadline_misses: u64,
    /// Datagrams the proxy received (both ways) during the measured calls.
    pub(crate) proxy_received: u64,
    /// Of those, the datagrams it dropped.
    pub(crate) proxy_dropped: u64,
}

impl LossOutcome {
    /// The extra JSON fields, without braces: `"loss_each_way":…,"deadline_ms":…,…`.
    pub(crate) fn json_fields(&self) -> String {
        format!(
            r#""loss_each_way":{},"deadline_ms":{},"deadline_misses":{},"proxy_received":{},"proxy_dropped":{}"#,
            self.loss_each_way,
            self.deadline.as_millis(),
            self.deadline_misses,
            self.proxy_received,
            self.proxy_dropped,
        )
    }
}

/// The server's socket address, from the `udp://host:port` URI it was bound at.
fn upstream(addr: &str) -> io::Result<SocketAddr> {
    addr.trim_start_matches("udp://")
        .parse()
        .map_err(|e| io::Error::other(format!("not a udp:// address {addr:?}: {e}")))
}

/// Runs the lossy workload against the `udp://` server at `addr`: one measurement per
/// loss rate of `params`.
pub(crate) async fn run(
    params: &Params,
    addr: &str,
    control: &ServerControl,
) -> io::Result<Vec<Measurement>> {
    let run = &params.lossy;
    let upstream = upstream(addr)?;
    let mut measurements = Vec::with_capacity(run.rates.len());
    for (i, &rate) in run.rates.iter().enumerate() {
        let proxy = UdpProxy::start(
            upstream,
            UdpFaults {
                drop: rate,
                seed: 0x1055 + i as u64,
                ..UdpFaults::default()
            },
        )
        .await?;
        let connector =
            UdpConnector::from_uri(&format!("udp://{}", proxy.addr())).map_err(io::Error::other)?;
        let channel = Channel::builder()
            .max_in_flight(MAX_IN_FLIGHT)
            .max_frame_len(MAX_FRAME_LEN)
            .connect(connector)
            .await
            .map_err(io::Error::other)?;
        let client = EchoClient::new(channel);
        let payload = Bytes::from(vec![0xa5; run.payload_bytes]);
        calls(&client, &payload, run, run.warmup).await;

        let (received, dropped) = counters(&proxy);
        let phase = Phase::begin(control).await?;
        let (mut samples, misses) = calls(&client, &payload, run, run.calls).await;
        let times = phase.end(control).await?;
        let (received_after, dropped_after) = counters(&proxy);
        samples.sort_unstable();
        measurements.push(Measurement {
            payload_bytes: run.payload_bytes,
            concurrency: run.in_flight,
            calls: samples.len() as u64,
            samples,
            wall: times.wall,
            server_cpu: times.server_cpu,
            client_cpu: times.client_cpu,
            loss: Some(LossOutcome {
                loss_each_way: rate,
                deadline: run.deadline,
                deadline_misses: misses,
                proxy_received: received_after - received,
                proxy_dropped: dropped_after - dropped,
            }),
            many: None,
        });
    }
    Ok(measurements)
}

/// The proxy's datagrams received and dropped so far.
fn counters(proxy: &UdpProxy) -> (u64, u64) {
    let c = proxy.counters();
    (
        c.received.load(Ordering::Relaxed),
        c.dropped.load(Ordering::Relaxed),
    )
}

/// Makes `count` calls, `run.in_flight` at a time, each with `run.deadline`: every
/// call's latency (failed ones included, up to their failure) and how many failed.
async fn calls(
    client: &EchoClient<Channel>,
    payload: &Bytes,
    run: &LossyParams,
    count: usize,
) -> (Vec<u32>, u64) {
    /// Failures reported on stderr, with when they started (the rest are only counted).
    const SHOWN: u64 = 20;
    let began = Instant::now();
    let left = Cell::new(count);
    let take = || {
        let n = left.get();
        left.set(n.saturating_sub(1));
        n > 0
    };
    let misses = Cell::new(0u64);
    let mut workers: FuturesUnordered<_> = (0..run.in_flight.max(1))
        .map(|_| {
            let mut client = client.clone();
            let (take, misses) = (&take, &misses);
            async move {
                let mut samples = Vec::new();
                while take() {
                    let request = Request::new(SayRequest {
                        message: String::new(),
                        payload: payload.clone(),
                    })
                    .with_timeout(run.deadline);
                    let start = Instant::now();
                    let result = client.say(request).await;
                    samples.push(stats::nanos(start.elapsed()));
                    if let Err(status) = result {
                        misses.set(misses.get() + 1);
                        if misses.get() <= SHOWN {
                            let code = status.code();
                            eprintln!(
                                "# lossy: a call started {:.3} s into the phase failed after \
                                 {:.3} s: {}",
                                start.duration_since(began).as_secs_f64(),
                                start.elapsed().as_secs_f64(),
                                if code == Code::DEADLINE_EXCEEDED {
                                    "DEADLINE_EXCEEDED".to_string()
                                } else {
                                    status.to_string()
                                }
                            );
                        }
                    }
                }
                samples
            }
        })
        .collect();
    let mut all = Vec::with_capacity(count);
    while let Some(samples) = workers.next().await {
        all.extend(samples);
    }
    (all, misses.get())
}

/// The markdown table of the lossy results: one row per loss rate, with the medians
/// over repeats of p50, p99, p99.9 and the largest latency, and the deadline misses
/// summed over repeats (out of every measured call). Empty when there are none.
pub(crate) fn table(results: &[BenchResult], repeats: usize) -> String {
    let mut rates: Vec<f64> = Vec::new();
    for loss in results.iter().filter_map(|r| r.loss.as_ref()) {
        if !rates.contains(&loss.loss_each_way) {
            rates.push(loss.loss_each_way);
        }
    }
    if rates.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Unary calls over udp:// through the fault proxy (median over {repeats} repeat(s); \
         misses: calls that failed, summed over repeats; dropped: datagrams the proxy \
         dropped, both ways).\n"
    );
    out.push_str(
        "| subject | loss each way | dropped | p50 | p99 | p99.9 | max | deadline misses |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut subjects: Vec<&str> = Vec::new();
    for r in results.iter().filter(|r| r.loss.is_some()) {
        if !subjects.contains(&r.subject) {
            subjects.push(r.subject);
        }
    }
    for subject in subjects {
        for &rate in &rates {
            let rows: Vec<(&BenchResult, &LossOutcome)> = results
                .iter()
                .filter(|r| r.subject == subject)
                .filter_map(|r| r.loss.as_ref().map(|l| (r, l)))
                .filter(|(_, l)| l.loss_each_way == rate)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let median = |f: fn(&BenchResult) -> f64| {
                let values: Vec<f64> = rows.iter().map(|(r, _)| f(r)).collect();
                stats::median(&values).map_or_else(|| "n/a".to_string(), format_us)
            };
            let received: u64 = rows.iter().map(|(_, l)| l.proxy_received).sum();
            let dropped: u64 = rows.iter().map(|(_, l)| l.proxy_dropped).sum();
            let misses: u64 = rows.iter().map(|(_, l)| l.deadline_misses).sum();
            let calls: u64 = rows.iter().map(|(r, _)| r.calls).sum();
            let _ = writeln!(
                out,
                "| {subject} | {:.0}% | {:.1}% | {} | {} | {} | {} | {misses} of {calls} |",
                rate * 100.0,
                100.0 * dropped as f64 / received.max(1) as f64,
                median(|r| r.lat.p50_us),
                median(|r| r.lat.p99_us),
                median(|r| r.lat.p999_us),
                median(|r| r.lat.max_us),
            );
        }
    }
    out
}

/// A latency in microseconds, printed in µs below 10 ms and in ms above.
fn format_us(us: f64) -> String {
    if us < 10_000.0 {
        format!("{us:.0} µs")
    } else {
        format!("{:.1} ms", us / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_comes_first_once() {
        assert_eq!(LossyParams::full().rates, [0.0, 0.05, 0.2]);
        assert_eq!(
            LossyParams::with_reference(&[0.2, 0.0, 0.2, 0.01]),
            [0.0, 0.2, 0.01]
        );
    }

    #[test]
    fn outcome_fields() {
        let outcome = LossOutcome {
            loss_each_way: 0.05,
            deadline: Duration::from_secs(3),
            deadline_misses: 2,
            proxy_received: 100,
            proxy_dropped: 5,
        };
        assert_eq!(
            outcome.json_fields(),
            r#""loss_each_way":0.05,"deadline_ms":3000,"deadline_misses":2,"proxy_received":100,"proxy_dropped":5"#
        );
        assert_eq!(format_us(512.4), "512 µs");
        assert_eq!(format_us(20_500.0), "20.5 ms");
    }
}
