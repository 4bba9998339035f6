//! What the client does: sequential calls for latency and bulk, many calls in flight
//! for throughput, new connections (one call each) for connect. Each workload has a
//! warm-up whose calls are not measured.

use std::{
    cell::Cell,
    fmt,
    future::Future,
    io,
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{stream::FuturesUnordered, StreamExt};

pub use crate::many::many;
use crate::{
    lossy::{self, LossOutcome, LossyParams},
    many::{ManyOutcome, ManyParams},
    stats,
    subjects::{framework, raw_tcp, raw_udp, Caller, Subject},
    threads::{Phase, PhaseTimes, ServerControl},
};

/// One kind of load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    /// Sequential small calls on one connection.
    Latency,
    /// Many small calls in flight on one connection for a fixed time.
    Throughput,
    /// Sequential large calls (two sizes).
    Bulk,
    /// New connections, each making one small call and then dropped: one after
    /// another, then several at once. Over TLS every connection runs a full handshake.
    Connect,
    /// Small calls with a deadline over `udp://` through a proxy that drops datagrams
    /// (no loss, then each `--loss` rate): latency percentiles and deadline misses.
    /// Only when named: not part of `all` (see [`Workload::NAMED_ONLY`]).
    Lossy,
    /// Many connections (`--connections-many`, default 1,000) from a client process,
    /// each with `--in-flight` calls (default 8), against the server on a
    /// multi-thread runtime: peak throughput (closed loop), then latency at half of it
    /// (open loop), and the server's memory per connection. Only when named (see
    /// [`many`]).
    Many,
}

impl Workload {
    /// Every workload, in the order runs go through them.
    pub const ALL: [Workload; 4] = [
        Workload::Latency,
        Workload::Throughput,
        Workload::Bulk,
        Workload::Connect,
    ];

    /// The workloads of calls on one connection (every workload but
    /// [`Connect`](Workload::Connect)): what `all` selects for a subject set that does
    /// not implement connect (see [`BenchSubject::workloads`](crate::BenchSubject::workloads)).
    pub const CALLS: [Workload; 3] = [Workload::Latency, Workload::Throughput, Workload::Bulk];

    /// The workloads that run only when `--workload` names them (not with `all`):
    /// [`Lossy`](Workload::Lossy), which measures retransmission rather than the
    /// subjects against each other, and
    /// [`Many`](Workload::Many), which runs in two processes on both cores.
    pub const NAMED_ONLY: [Workload; 2] = [Workload::Lossy, Workload::Many];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Latency => "latency",
            Workload::Throughput => "throughput",
            Workload::Bulk => "bulk",
            Workload::Connect => "connect",
            Workload::Lossy => "lossy",
            Workload::Many => "many",
        }
    }

    /// The workload called `name`, if any.
    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL
            .into_iter()
            .chain(Workload::NAMED_ONLY)
            .find(|w| w.name() == name)
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A number of sequential calls of one payload size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sequential {
    /// Bytes of payload per request.
    pub(crate) payload_bytes: usize,
    /// Unmeasured calls first.
    pub(crate) warmup: usize,
    /// Measured calls.
    pub(crate) calls: usize,
}

/// The connect workload: how many connections, how many at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Connections {
    /// Bytes of payload of each connection's one call.
    pub(crate) payload_bytes: usize,
    /// Unmeasured connections first, one after another.
    pub(crate) warmup: usize,
    /// Measured connections, one after another.
    pub(crate) sequential: usize,
    /// Measured connections, [`in_flight`](Self::in_flight) at a time.
    pub(crate) concurrent: usize,
    /// Connections open (connecting, calling) at once in the concurrent phase.
    pub(crate) in_flight: usize,
}

impl Connections {
    /// Every connection the workload makes, warm-up included.
    pub(crate) fn total(&self) -> usize {
        self.warmup + self.sequential + self.concurrent
    }
}

/// The sizes of every workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// The latency workload.
    pub(crate) latency: Sequential,
    /// Payload of each throughput call.
    pub(crate) throughput_payload: usize,
    /// Calls the throughput workload keeps in flight.
    pub(crate) concurrency: usize,
    /// Measured time of the throughput workload (a tenth of it more warms up).
    pub(crate) duration: Duration,
    /// The bulk workload: one result per entry.
    pub(crate) bulk: [Sequential; 2],
    /// The connect workload.
    pub(crate) connect: Connections,
    /// The lossy workload.
    pub(crate) lossy: LossyParams,
    /// The many workload (its durations are [`duration`](Self::duration)'s).
    pub(crate) many: ManyParams,
}

/// Payload of the latency and throughput calls.
const SMALL_PAYLOAD: usize = 32;

impl Params {
    /// The full run: 2,000 + 20,000 latency calls; 256 in flight for 5 s; 200 echoes of
    /// 1 MiB and 20 of 16 MiB (each with a tenth as many warm-up calls); 100 + 1,000
    /// connections one after another, then 2,000 with 16 at a time.
    pub fn full() -> Params {
        Params {
            latency: Sequential {
                payload_bytes: SMALL_PAYLOAD,
                warmup: 2_000,
                calls: 20_000,
            },
            throughput_payload: SMALL_PAYLOAD,
            concurrency: 256,
            duration: Duration::from_secs(5),
            bulk: [
                Sequential {
                    payload_bytes: 1 << 20,
                    warmup: 20,
                    calls: 200,
                },
                Sequential {
                    payload_bytes: 16 << 20,
                    warmup: 2,
                    calls: 20,
                },
            ],
            connect: Connections {
                payload_bytes: SMALL_PAYLOAD,
                warmup: 100,
                sequential: 1_000,
                concurrent: 2_000,
                in_flight: 16,
            },
            lossy: LossyParams::full(),
            many: ManyParams::DEFAULT,
        }
    }

    /// A smoke run: every count divided by 10, throughput for 1 s.
    pub fn quick() -> Params {
        let full = Params::full();
        let tenth = |s: Sequential| Sequential {
            payload_bytes: s.payload_bytes,
            warmup: s.warmup / 10,
            calls: (s.calls / 10).max(1),
        };
        Params {
            latency: tenth(full.latency),
            duration: Duration::from_secs(1),
            bulk: full.bulk.map(tenth),
            connect: Connections {
                warmup: full.connect.warmup / 10,
                sequential: full.connect.sequential / 10,
                concurrent: full.connect.concurrent / 10,
                ..full.connect
            },
            lossy: full.lossy.tenth(),
            ..full
        }
    }
}

/// What one measured phase produced.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Bytes of payload per request.
    pub(crate) payload_bytes: usize,
    /// Calls in flight at once.
    pub(crate) concurrency: usize,
    /// Calls completed in the phase.
    pub(crate) calls: u64,
    /// Per-call latencies in nanoseconds, sorted ascending.
    pub(crate) samples: Vec<u32>,
    /// Wall-clock time of the phase.
    pub(crate) wall: Duration,
    /// CPU time of the server thread.
    pub(crate) server_cpu: Duration,
    /// CPU time of the client thread.
    pub(crate) client_cpu: Duration,
    /// The lossy workload's loss rate and deadline misses; `None` for the others.
    pub(crate) loss: Option<LossOutcome>,
    /// The many workload's phase, latency summaries and server memory; `None` for the
    /// others.
    pub(crate) many: Option<ManyOutcome>,
}

/// Runs `workload` against `subject`'s server at `addr` (on the client thread).
pub(crate) async fn run(
    subject: Subject,
    workload: Workload,
    params: &Params,
    addr: &str,
    control: &ServerControl,
) -> io::Result<Vec<Measurement>> {
    const FRAMEWORK: [Subject; 6] = [
        Subject::Tcp,
        Subject::Tls,
        Subject::Unix,
        Subject::Udp,
        Subject::Rdma,
        Subject::Grpc,
    ];
    match (subject, workload) {
        (Subject::Tls, Workload::Connect) => {
            // Settings of their own for every connection: a fresh session cache, so
            // each one runs a full handshake instead of resuming the previous session.
            // Made before any is measured.
            let settings = (0..params.connect.total())
                .map(|_| framework::client_tls())
                .collect::<io::Result<Vec<_>>>()?;
            let connect = |i: usize| framework::connect_with(addr, Some(settings[i].clone()));
            connections(connect, params, control).await
        }
        (Subject::Tcp | Subject::Unix, Workload::Connect) => {
            connections(|_| framework::connect(addr), params, control).await
        }
        (Subject::RawTcp, Workload::Connect) => {
            connections(|_| raw_tcp::connect_direct(addr), params, control).await
        }
        (_, Workload::Throughput) if FRAMEWORK.contains(&subject) => {
            let caller = framework::connect(addr).await?;
            Ok(vec![concurrent(caller, params, control).await?])
        }
        (_, Workload::Latency | Workload::Bulk) if FRAMEWORK.contains(&subject) => {
            let mut caller = framework::connect(addr).await?;
            sequential_all(&mut caller, workload, params, control).await
        }
        (Subject::RawTcp, Workload::Throughput) => {
            let caller = raw_tcp::connect_pipelined(addr).await?;
            Ok(vec![concurrent(caller, params, control).await?])
        }
        (Subject::RawTcp, Workload::Latency | Workload::Bulk) => {
            let mut caller = raw_tcp::connect_direct(addr).await?;
            sequential_all(&mut caller, workload, params, control).await
        }
        (Subject::RawUdp, Workload::Latency) => {
            let mut caller = raw_udp::connect(addr).await?;
            sequential_all(&mut caller, workload, params, control).await
        }
        (Subject::RawUdp, Workload::Throughput) => {
            let caller = raw_udp::connect_pipelined(addr).await?;
            Ok(vec![concurrent(caller, params, control).await?])
        }
        (Subject::Udp, Workload::Lossy) => lossy::run(params, addr, control).await,
        (Subject::RawTcp, Workload::Many) => {
            many(|_| raw_tcp::connect_pipelined(addr), params, control).await
        }
        (_, Workload::Many) if FRAMEWORK.contains(&subject) => {
            many(|_| framework::connect(addr), params, control).await
        }
        _ => Err(unsupported(subject, workload)),
    }
}

/// The error for a workload a subject does not implement.
fn unsupported(subject: impl fmt::Display, workload: Workload) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("{subject} has no {workload} workload"),
    )
}

/// The latency workload, or each size of the bulk workload, on one connection (other
/// workloads are an error).
///
/// Every size warms up before any is measured: the framework allocates fresh buffers
/// of each frame's size, and the first large ones change the allocator's state (glibc
/// raises its mmap threshold when one is freed). Warming up all sizes first measures
/// every size, and every subject, in that steady state.
pub async fn sequential_all<C: Caller>(
    caller: &mut C,
    workload: Workload,
    params: &Params,
    control: &ServerControl,
) -> io::Result<Vec<Measurement>> {
    let runs: &[Sequential] = match workload {
        Workload::Latency => std::slice::from_ref(&params.latency),
        Workload::Bulk => &params.bulk,
        Workload::Throughput | Workload::Connect | Workload::Lossy | Workload::Many => {
            return Err(unsupported("sequential_all", workload))
        }
    };
    for &run in runs {
        warm_up(caller, run).await?;
    }
    let mut measurements = Vec::with_capacity(runs.len());
    for &run in runs {
        measurements.push(measure_sequential(caller, run, control).await?);
    }
    Ok(measurements)
}

/// `run.warmup` unmeasured calls.
async fn warm_up<C: Caller>(caller: &mut C, run: Sequential) -> io::Result<()> {
    let payload = Bytes::from(vec![0xa5; run.payload_bytes]);
    for _ in 0..run.warmup {
        caller.call(&payload).await?;
    }
    Ok(())
}

/// `run.calls` measured calls, one at a time.
async fn measure_sequential<C: Caller>(
    caller: &mut C,
    run: Sequential,
    control: &ServerControl,
) -> io::Result<Measurement> {
    let payload = Bytes::from(vec![0xa5; run.payload_bytes]);
    let mut samples = Vec::with_capacity(run.calls);
    let phase = Phase::begin(control).await?;
    for _ in 0..run.calls {
        let start = Instant::now();
        caller.call(&payload).await?;
        samples.push(stats::nanos(start.elapsed()));
    }
    let times = phase.end(control).await?;
    samples.sort_unstable();
    Ok(Measurement {
        payload_bytes: run.payload_bytes,
        concurrency: 1,
        calls: samples.len() as u64,
        samples,
        wall: times.wall,
        server_cpu: times.server_cpu,
        client_cpu: times.client_cpu,
        loss: None,
        many: None,
    })
}

/// `params.concurrency` callers (clones sharing one connection) each making calls back
/// to back: first for a tenth of `params.duration` unmeasured, then for the duration.
pub async fn concurrent<C: Caller + Clone>(
    caller: C,
    params: &Params,
    control: &ServerControl,
) -> io::Result<Measurement> {
    let payload = Bytes::from(vec![0xa5; params.throughput_payload]);
    calls_for(&caller, &payload, params.concurrency, params.duration / 10).await?;
    let phase = Phase::begin(control).await?;
    let mut samples = calls_for(&caller, &payload, params.concurrency, params.duration).await?;
    let times = phase.end(control).await?;
    samples.sort_unstable();
    Ok(Measurement {
        payload_bytes: params.throughput_payload,
        concurrency: params.concurrency,
        calls: samples.len() as u64,
        samples,
        wall: times.wall,
        server_cpu: times.server_cpu,
        client_cpu: times.client_cpu,
        loss: None,
        many: None,
    })
}

/// Keeps `concurrency` calls in flight until `duration` has passed (calls started
/// before then finish), and returns every call's latency.
pub(crate) async fn calls_for<C: Caller + Clone>(
    caller: &C,
    payload: &Bytes,
    concurrency: usize,
    duration: Duration,
) -> io::Result<Vec<u32>> {
    let deadline = Instant::now() + duration;
    let mut workers: FuturesUnordered<_> = (0..concurrency)
        .map(|_| {
            let mut caller = caller.clone();
            async move {
                let mut samples = Vec::new();
                while Instant::now() < deadline {
                    let start = Instant::now();
                    caller.call(payload).await?;
                    samples.push(stats::nanos(start.elapsed()));
                }
                Ok::<_, io::Error>(samples)
            }
        })
        .collect();
    let mut all = Vec::new();
    while let Some(samples) = workers.next().await {
        all.extend(samples?);
    }
    Ok(all)
}

/// The connect workload: `params.connect.warmup` unmeasured connections, then two
/// measurements: `sequential` connections one after another, and `concurrent` ones
/// with `in_flight` open at a time. Each connection is `connect(i)` (`i` counts from 0
/// to the total of connections made, so a subject can prepare something per connection),
/// one call, and drop; its sample is the time of all three, and `calls` counts
/// connections.
pub async fn connections<C, F, Fut>(
    connect: F,
    params: &Params,
    control: &ServerControl,
) -> io::Result<Vec<Measurement>>
where
    C: Caller,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = io::Result<C>>,
{
    let run = params.connect;
    let payload = Bytes::from(vec![0xa5; run.payload_bytes]);
    let next = Cell::new(0);
    let one = || {
        let i = next.get();
        next.set(i + 1);
        one_connection(&connect, i, &payload)
    };
    for _ in 0..run.warmup {
        one().await?;
    }

    let mut samples = Vec::with_capacity(run.sequential);
    let phase = Phase::begin(control).await?;
    for _ in 0..run.sequential {
        samples.push(one().await?);
    }
    let times = phase.end(control).await?;
    let sequential = connect_measurement(run.payload_bytes, 1, samples, times);

    let left = Cell::new(run.concurrent);
    let take = || {
        let n = left.get();
        left.set(n.saturating_sub(1));
        n > 0
    };
    let in_flight = run.in_flight.clamp(1, run.concurrent.max(1));
    let phase = Phase::begin(control).await?;
    let mut workers: FuturesUnordered<_> = (0..in_flight)
        .map(|_| async {
            let mut samples = Vec::new();
            while take() {
                samples.push(one().await?);
            }
            Ok::<_, io::Error>(samples)
        })
        .collect();
    let mut samples = Vec::with_capacity(run.concurrent);
    while let Some(worker) = workers.next().await {
        samples.extend(worker?);
    }
    let times = phase.end(control).await?;
    let concurrent = connect_measurement(run.payload_bytes, in_flight, samples, times);
    Ok(vec![sequential, concurrent])
}

/// Opens connection `i`, makes one call on it, drops it; the time of all three.
async fn one_connection<C, F, Fut>(connect: &F, i: usize, payload: &Bytes) -> io::Result<u32>
where
    C: Caller,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = io::Result<C>>,
{
    let start = Instant::now();
    let mut caller = connect(i).await?;
    caller.call(payload).await?;
    drop(caller);
    Ok(stats::nanos(start.elapsed()))
}

fn connect_measurement(
    payload_bytes: usize,
    concurrency: usize,
    mut samples: Vec<u32>,
    times: PhaseTimes,
) -> Measurement {
    samples.sort_unstable();
    Measurement {
        payload_bytes,
        concurrency,
        calls: samples.len() as u64,
        samples,
        wall: times.wall,
        server_cpu: times.server_cpu,
        client_cpu: times.client_cpu,
        loss: None,
        many: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_is_a_tenth() {
        let quick = Params::quick();
        assert_eq!(quick.latency.warmup, 200);
        assert_eq!(quick.latency.calls, 2_000);
        assert_eq!(quick.duration, Duration::from_secs(1));
        assert_eq!(quick.concurrency, 256);
        assert_eq!(quick.bulk[0].calls, 20);
        assert_eq!(quick.bulk[1].calls, 2);
        assert_eq!(quick.bulk[1].payload_bytes, 16 << 20);
        assert_eq!((quick.connect.warmup, quick.connect.sequential), (10, 100));
        assert_eq!(
            (quick.connect.concurrent, quick.connect.in_flight),
            (200, 16)
        );
        assert_eq!(Params::full().connect.total(), 3_100);
    }

    #[test]
    fn names_round_trip() {
        for w in Workload::ALL.into_iter().chain(Workload::NAMED_ONLY) {
            assert_eq!(Workload::parse(w.name()), Some(w));
        }
        for s in Subject::ALL {
            assert_eq!(Subject::parse(s.name()), Some(s));
        }
    }
}
