//! The `many` workload: many connections, both cores.
//!
//! The subject's server runs on a multi-thread Tokio runtime with [`SERVER_WORKERS`]
//! worker threads (not pinned), in a child process of its own (a fresh one for each
//! measurement); the clients run in another child process (both are the same
//! binary, re-executed with hidden flags, see `process.rs`), which opens
//! `--connections-many` connections (default 1,000) over [`CLIENT_THREADS`] client
//! threads, each a `current_thread` runtime with its share of the connections. The
//! harness's callers are not `Send` (see [`Caller`]), so they cannot move between a
//! multi-thread runtime's workers; one runtime per core is how a load generator uses
//! both cores anyway.
//!
//! Each connection makes one call, then the phases run:
//!
//! 1. **closed loop** (peak throughput): `--in-flight` calls (default 8) kept in
//!    flight on every connection, back to back, for a tenth of `--duration-s`
//!    unmeasured, then for `--duration-s` measured; latency from each call's start;
//! 2. **open loop** at half the measured peak rate (`--open-load`, default 0.5, sets
//!    the fraction): calls due on a schedule
//!    ([`schedule::OpenLoop`]), spread over the connections in turn, whether or not
//!    earlier calls have come back (up to `--in-flight` in flight on a connection; a
//!    call due while its connection has that many waits in the connection's backlog);
//!    latency from each call's *scheduled* time (no coordinated omission: a backlog
//!    wait counts, and so does the scheduler's own lateness, up to the 1 ms of
//!    Tokio's timer), and also from when it was sent. A tenth of the duration
//!    unmeasured, then the duration.
//!
//! The client process tells the harness when each measured phase begins and ends
//! (lines on its stdout), so that the harness reads the server process's CPU time
//! (every thread) and samples its resident memory (`VmRSS`) during the phase; after
//! the last phase the client process reports its figures in one line per phase. The
//! harness prints one result per phase (see [`ManyOutcome`] for the fields it adds)
//! and, after the run, a table ([`table`]).

mod process;
pub(crate) mod schedule;
mod table;

use std::{
    collections::VecDeque,
    fmt,
    future::Future,
    io,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{stream::FuturesUnordered, StreamExt};

pub(crate) use process::{client_main, measure, server_main};
pub(crate) use table::{server_cpu_us_per_call, table};

use crate::{
    stats::{self, LatencySummary},
    subjects::Caller,
    threads::ServerControl,
    workloads::{calls_for, Measurement, Params},
};

use schedule::OpenLoop;

/// Worker threads of the server's multi-thread runtime: the machine's two cores.
pub(crate) const SERVER_WORKERS: usize = 2;

/// Threads (each a `current_thread` runtime) of the client process.
pub(crate) const CLIENT_THREADS: usize = 2;

/// The sizes of the many workload (its durations are `--duration-s`'s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct ManyParams {
    /// Connections from the client process (`--connections-many`).
    pub(crate) connections: usize,
    /// Calls in flight on each connection in the closed loop (`--in-flight`).
    pub(crate) in_flight: usize,
    /// Bytes of payload per request.
    pub(crate) payload_bytes: usize,
    /// The open loop's rate as a fraction of the closed loop's (`--open-load`).
    pub(crate) open_load: f64,
}

impl ManyParams {
    /// 1,000 connections, 8 calls in flight on each, 32 bytes, the open loop at half
    /// the peak.
    pub(crate) const DEFAULT: ManyParams = ManyParams {
        connections: 1_000,
        in_flight: 8,
        payload_bytes: 32,
        open_load: 0.5,
    };
}

/// The two measured phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ManyPhase {
    /// Every connection keeps its calls in flight: peak throughput.
    Closed,
    /// Calls on a schedule at half the peak rate: latency under load.
    Open,
}

impl ManyPhase {
    /// Both, in the order they run.
    pub(crate) const BOTH: [ManyPhase; 2] = [ManyPhase::Closed, ManyPhase::Open];

    /// The name in the output and in the child's lines.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ManyPhase::Closed => "closed",
            ManyPhase::Open => "open",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The phase called `name`.
    pub(crate) fn parse(name: &str) -> Option<ManyPhase> {
        ManyPhase::BOTH.into_iter().find(|p| p.name() == name)
    }
}

impl fmt::Display for ManyPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a many result adds to a [`Measurement`]: its latency summaries (computed in
/// the client process, which has the samples) and the server's memory.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ManyOutcome {
    /// Which phase.
    pub(crate) phase: ManyPhase,
    /// Connections open.
    pub(crate) connections: usize,
    /// Calls in flight per connection in the closed loop.
    pub(crate) in_flight: usize,
    /// The open loop's rate (half the closed loop's); 0 for the closed loop.
    pub(crate) target_calls_per_s: f64,
    /// The open loop's rate as a fraction of the peak (`--open-load`).
    pub(crate) open_load: f64,
    /// Latency: from each call's start (closed loop) or its scheduled time (open).
    pub(crate) lat: LatencySummary,
    /// Latency from when each call was sent (the open loop; the closed loop's `lat`).
    pub(crate) sent_lat: LatencySummary,
    /// The server process's `VmRSS` before any client connected.
    pub(crate) server_rss_before: u64,
    /// The median of its `VmRSS` samples during the phase.
    pub(crate) server_rss_load: u64,
}

impl ManyOutcome {
    /// Server memory per connection under load: (`VmRSS` during the phase − before) /
    /// connections.
    pub(crate) fn bytes_per_connection(&self) -> f64 {
        self.server_rss_load.saturating_sub(self.server_rss_before) as f64
            / self.connections.max(1) as f64
    }

    /// The extra JSON fields, without braces.
    pub(crate) fn json_fields(&self, server_cpu_us_per_call: f64) -> String {
        let s = &self.sent_lat;
        format!(
            concat!(
                r#""phase":"{}","connections":{},"in_flight_per_connection":{},"#,
                r#""target_calls_per_s":{:.1},"open_load":{},"sent_lat_us":{{"p50_us":{:.3},"p99_us":{:.3},"#,
                r#""p999_us":{:.3}}},"server_rss_before_bytes":{},"server_rss_load_bytes":{},"#,
                r#""server_bytes_per_connection":{:.1},"server_cpu_us_per_call":{:.3}"#
            ),
            self.phase,
            self.connections,
            self.in_flight,
            self.target_calls_per_s,
            self.open_load,
            s.p50_us,
            s.p99_us,
            s.p999_us,
            self.server_rss_before,
            self.server_rss_load,
            self.bytes_per_connection(),
            server_cpu_us_per_call,
        )
    }
}

/// One client thread's part of the many workload, handed to
/// [`BenchSubject::run`](crate::BenchSubject::run) through its [`ServerControl`].
#[derive(Clone, Debug)]
pub(crate) struct Shard {
    /// The index of this thread's first connection among all of the process's.
    pub(crate) first: usize,
    /// Connections this thread opens.
    pub(crate) connections: usize,
    /// What the client threads share.
    pub(crate) coordinator: Arc<Coordinator>,
}

/// What one measured phase collected over every client thread.
#[derive(Debug, Default)]
pub(crate) struct PhaseRecord {
    /// When the phase began, and the process's CPU time then.
    start: Option<(Instant, Duration)>,
    /// Wall-clock time of the phase: from every thread starting it to the last one
    /// finishing its calls.
    pub(crate) wall: Duration,
    /// CPU time of the client process in the phase.
    pub(crate) client_cpu: Duration,
    /// The open loop's rate over all threads.
    pub(crate) target_calls_per_s: f64,
    /// Latency samples (ns): from start (closed) or from the scheduled time (open).
    pub(crate) samples: Vec<u32>,
    /// Latency samples (ns) from when each call was sent (open loop only).
    pub(crate) sent: Vec<u32>,
}

/// The client threads' meeting point: a barrier at every phase boundary, and the
/// phases' figures. The thread that the barrier elects does the process's work: it
/// tells the parent (a line on stdout) and reads the process's CPU clock.
#[derive(Debug)]
pub(crate) struct Coordinator {
    barrier: tokio::sync::Barrier,
    /// Connections over all threads.
    connections: usize,
    phases: Mutex<[PhaseRecord; 2]>,
}

impl Coordinator {
    /// A coordinator of `threads` client threads opening `connections` in all.
    pub(crate) fn new(threads: usize, connections: usize) -> Coordinator {
        Coordinator {
            barrier: tokio::sync::Barrier::new(threads),
            connections,
            phases: Mutex::new(Default::default()),
        }
    }

    fn phases(&self) -> MutexGuard<'_, [PhaseRecord; 2]> {
        self.phases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the figures of `phase` (after every thread has finished).
    pub(crate) fn take(&self, phase: ManyPhase) -> PhaseRecord {
        std::mem::take(&mut self.phases()[phase.index()])
    }

    /// Waits for every thread; then one of them tells the parent `what`.
    async fn meet(&self, what: &str) -> io::Result<()> {
        if self.barrier.wait().await.is_leader() {
            process::tell_parent(what)?;
        }
        Ok(())
    }

    /// Waits for every thread, then starts `phase`.
    async fn begin(&self, phase: ManyPhase) -> io::Result<()> {
        if self.barrier.wait().await.is_leader() {
            self.phases()[phase.index()].start = Some((Instant::now(), process::cpu_time()?));
            process::tell_parent(&format!("begin {phase}"))?;
        }
        Ok(())
    }

    /// Adds this thread's samples to `phase`, waits for every thread, and ends it.
    async fn end(&self, phase: ManyPhase, samples: Vec<u32>, sent: Vec<u32>) -> io::Result<()> {
        {
            let mut phases = self.phases();
            let record = &mut phases[phase.index()];
            record.samples.extend(samples);
            record.sent.extend(sent);
        }
        if self.barrier.wait().await.is_leader() {
            let (now, cpu) = (Instant::now(), process::cpu_time()?);
            let mut phases = self.phases();
            let record = &mut phases[phase.index()];
            if let Some((start, start_cpu)) = record.start {
                record.wall = now - start;
                record.client_cpu = cpu.saturating_sub(start_cpu);
            }
            drop(phases);
            process::tell_parent(&format!("end {phase}"))?;
        }
        // Everyone sees the figures the leader wrote.
        self.barrier.wait().await;
        Ok(())
    }

    /// The closed loop's calls per second, over every thread.
    fn peak_calls_per_s(&self) -> f64 {
        let phases = self.phases();
        let closed = &phases[ManyPhase::Closed.index()];
        closed.samples.len() as f64 / closed.wall.as_secs_f64().max(1e-9)
    }

    fn set_target(&self, rate: f64) {
        self.phases()[ManyPhase::Open.index()].target_calls_per_s = rate;
    }
}

/// The many workload on one client thread of the client process: opens
/// `connect(i)` for this thread's share of the connections, makes one call on each,
/// then runs the closed and open loops in step with the other threads. Its figures go
/// to the process's coordinator (through `control`), which merges the threads', so it
/// returns no measurement of its own; outside the client process (a `control` of the
/// harness's server thread) it is an error.
///
/// A subject implements the workload by calling this from
/// [`BenchSubject::run`](crate::BenchSubject::run) with a way to connect callers.
pub async fn many<C, F, Fut>(
    connect: F,
    params: &Params,
    control: &ServerControl,
) -> io::Result<Vec<Measurement>>
where
    C: Caller + Clone,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = io::Result<C>>,
{
    let shard = control.shard.as_ref().ok_or_else(|| {
        io::Error::other("the many workload runs in the client process the harness starts")
    })?;
    let coordinator = &*shard.coordinator;
    let run = params.many;
    let payload = Bytes::from(vec![0xa5; run.payload_bytes]);
    let mut callers = Vec::with_capacity(shard.connections);
    for i in shard.first..shard.first + shard.connections {
        let mut caller = connect(i)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("connection {i}: {e}")))?;
        caller.call(&payload).await?;
        callers.push(caller);
    }
    coordinator.meet("connected").await?;

    closed_loop(&callers, &payload, run.in_flight, params.duration / 10).await?;
    coordinator.begin(ManyPhase::Closed).await?;
    let samples = closed_loop(&callers, &payload, run.in_flight, params.duration).await?;
    coordinator
        .end(ManyPhase::Closed, samples, Vec::new())
        .await?;

    // Half the peak (or `--open-load` of it), shared among the threads as the
    // connections are.
    let rate = coordinator.peak_calls_per_s() * run.open_load;
    coordinator.set_target(rate);
    let share = rate * shard.connections as f64 / coordinator.connections.max(1) as f64;
    open_loop(
        &callers,
        &payload,
        share,
        run.in_flight,
        params.duration / 10,
    )
    .await?;
    coordinator.begin(ManyPhase::Open).await?;
    let (samples, sent) =
        open_loop(&callers, &payload, share, run.in_flight, params.duration).await?;
    coordinator.end(ManyPhase::Open, samples, sent).await?;
    Ok(Vec::new())
}

/// `in_flight` calls on each of `callers`, back to back, for `duration`: every call's
/// latency.
async fn closed_loop<C: Caller + Clone>(
    callers: &[C],
    payload: &Bytes,
    in_flight: usize,
    duration: Duration,
) -> io::Result<Vec<u32>> {
    let per_connection = callers
        .iter()
        .map(|caller| calls_for(caller, payload, in_flight, duration));
    let samples = futures::future::try_join_all(per_connection).await?;
    Ok(samples.concat())
}

/// Calls at `rate` per second for `duration`, call `i` on connection `i % len`, each
/// due at its scheduled time whatever the calls before it are doing; at most
/// `in_flight` in flight on a connection, later ones waiting in its backlog (their
/// wait counts: latencies run from the scheduled times). Returns the latencies from
/// the scheduled times, and from the sends.
async fn open_loop<C: Caller + Clone>(
    callers: &[C],
    payload: &Bytes,
    rate: f64,
    in_flight: usize,
    duration: Duration,
) -> io::Result<(Vec<u32>, Vec<u32>)> {
    let Some(schedule) = OpenLoop::new(rate, duration).filter(|_| !callers.is_empty()) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let total = schedule.total();
    let mut samples = Vec::with_capacity(total as usize);
    let mut sent = Vec::with_capacity(total as usize);
    // Per connection: calls in flight, and due calls waiting for one to come back.
    let mut outstanding = vec![0usize; callers.len()];
    let mut backlog: Vec<VecDeque<Instant>> = vec![VecDeque::new(); callers.len()];
    let mut pending = FuturesUnordered::new();
    let start = tokio::time::Instant::now();
    let mut issued = 0;
    let sleep = tokio::time::sleep_until(start);
    tokio::pin!(sleep);
    loop {
        let due = schedule.due(start.elapsed());
        for i in issued..due {
            let scheduled = (start + schedule.at(i)).into_std();
            let conn = i as usize % callers.len();
            if outstanding[conn] < in_flight {
                outstanding[conn] += 1;
                pending.push(timed_call(callers[conn].clone(), payload, conn, scheduled));
            } else {
                backlog[conn].push_back(scheduled);
            }
        }
        issued = issued.max(due);
        if issued >= total && pending.is_empty() {
            break;
        }
        if issued < total {
            let next = start + schedule.at(issued);
            if sleep.deadline() != next {
                sleep.as_mut().reset(next);
            }
        }
        tokio::select! {
            biased;
            Some(result) = pending.next() => {
                let (conn, from_schedule, from_send) = result?;
                samples.push(stats::nanos(from_schedule));
                sent.push(stats::nanos(from_send));
                match backlog[conn].pop_front() {
                    Some(scheduled) => {
                        pending.push(timed_call(callers[conn].clone(), payload, conn, scheduled));
                    }
                    None => outstanding[conn] -= 1,
                }
            }
            () = &mut sleep, if issued < total => {}
        }
    }
    Ok((samples, sent))
}

/// One call on `caller` (connection `conn`) that was due at `scheduled`: the
/// connection, and the latencies from the scheduled time and from the send.
async fn timed_call<C: Caller>(
    mut caller: C,
    payload: &Bytes,
    conn: usize,
    scheduled: Instant,
) -> io::Result<(usize, Duration, Duration)> {
    let sent_at = Instant::now();
    caller.call(payload).await?;
    let done = Instant::now();
    Ok((
        conn,
        done.saturating_duration_since(scheduled),
        done - sent_at,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip() {
        for p in ManyPhase::BOTH {
            assert_eq!(ManyPhase::parse(p.name()), Some(p));
        }
        assert_eq!(ManyPhase::parse("half"), None);
    }

    #[test]
    fn memory_per_connection() {
        let outcome = ManyOutcome {
            phase: ManyPhase::Closed,
            connections: 1_000,
            in_flight: 8,
            target_calls_per_s: 0.0,
            open_load: 0.5,
            lat: LatencySummary::default(),
            sent_lat: LatencySummary::default(),
            server_rss_before: 10 << 20,
            server_rss_load: (10 << 20) + 16_384_000,
        };
        assert_eq!(outcome.bytes_per_connection(), 16_384.0);
        let json = outcome.json_fields(2.5);
        assert!(
            json.starts_with(r#""phase":"closed","connections":1000,"#),
            "{json}"
        );
        assert!(
            json.ends_with(
                r#""server_bytes_per_connection":16384.0,"server_cpu_us_per_call":2.500"#
            ),
            "{json}"
        );
        let shrunk = ManyOutcome {
            server_rss_load: 1,
            ..outcome
        };
        assert_eq!(shrunk.bytes_per_connection(), 0.0);
    }
}
