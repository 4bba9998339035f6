//! The processes of the many workload, each this binary started again with the
//! harness's own arguments and a hidden flag or two.
//!
//! - The harness ([`measure`]) starts both children, reads their lines (stdout) and
//!   the server's CPU time and memory (`/proc/PID/stat`, `/proc/PID/status`).
//! - The server process ([`server_main`], `--many-server NAME`): the subject's server
//!   on a multi-thread runtime; `many listening ADDR`, then it serves until its stdin
//!   closes. A fresh process per measurement, so that its memory is the subject's
//!   alone: in a process that has run other servers, the allocator's reuse of their
//!   freed memory changes the figure (raw-tcp: 14.6 KiB per connection in a fresh
//!   process, 67 KiB after tcp's run).
//! - The client process ([`client_main`], `--many-client ADDR --many-subject NAME`):
//!   [`CLIENT_THREADS`] threads, each running the subject's [`BenchSubject::run`] for
//!   [`Workload::Many`] with its [`Shard`]. Its lines: `many connected`, `many begin
//!   PHASE` and `many end PHASE` (the harness reads the server's CPU time and samples
//!   its `VmRSS` in between), and one `many result phase=…` per phase
//!   ([`ChildReport`]).

use std::{
    io::{self, BufRead as _, Write as _},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use super::{Coordinator, ManyOutcome, ManyPhase, Shard, CLIENT_THREADS, SERVER_WORKERS};
use crate::{
    stats::{rss_bytes, LatencySummary},
    subjects::BenchSubject,
    threads::ServerControl,
    workloads::{Measurement, Params, Workload},
};

/// File descriptors each process needs beyond one per connection: the runtime, the
/// listener, stdio, the child's pipe.
const FD_HEADROOM: usize = 256;

/// How often the parent samples its `VmRSS` during a phase.
const RSS_EVERY: Duration = Duration::from_millis(50);

/// What every line between the processes starts with.
const PREFIX: &str = "many ";

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, and fails with a
/// clear message if `connections` (plus headroom) still do not fit.
pub(crate) fn raise_fd_limit(connections: usize) -> io::Result<()> {
    #![allow(unsafe_code)]
    let needed = (connections + FD_HEADROOM) as u64;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the struct we pass, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if limit.rlim_cur < needed {
        return Err(io::Error::other(format!(
            "--connections-many {connections} needs {needed} file descriptors per process, \
             but RLIMIT_NOFILE's hard limit is {} (raise it, e.g. `ulimit -Hn`, or ask for \
             fewer connections)",
            limit.rlim_max
        )));
    }
    Ok(())
}

/// CPU time (user + system) of every thread of this process so far.
pub(crate) fn cpu_time() -> io::Result<Duration> {
    #![allow(unsafe_code)]
    // SAFETY: all-zeroes is a valid `rusage` (plain integers and timevals).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we pass, which lives for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    Ok(tv(usage.ru_utime) + tv(usage.ru_stime))
}

/// CPU time (user + system, every thread) of process `pid` so far, from
/// `/proc/PID/stat` (in clock ticks: 10 ms on Linux, fine over phases of seconds).
fn cpu_time_of(pid: u32) -> io::Result<Duration> {
    #![allow(unsafe_code)]
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces) in parentheses;
    // utime and stime are the 14th and 15th of the line, the 12th and 13th of these.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
        return Err(io::Error::other(format!("cannot parse /proc/{pid}/stat")));
    };
    // SAFETY: sysconf only reads a configuration value.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / per_second,
    ))
}

/// The child's side of the pipe: one line to the parent.
pub(crate) fn tell_parent(what: &str) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    writeln!(stdout, "{PREFIX}{what}")?;
    stdout.flush()
}

/// What the child reports of one phase.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ChildReport {
    pub(crate) phase: ManyPhase,
    /// Calls completed.
    pub(crate) calls: u64,
    pub(crate) wall: Duration,
    /// The client process's CPU time in the phase.
    pub(crate) client_cpu: Duration,
    pub(crate) target_calls_per_s: f64,
    pub(crate) lat: LatencySummary,
    pub(crate) sent_lat: LatencySummary,
}

fn summary_to_field(s: &LatencySummary) -> String {
    format!(
        "{},{},{},{},{},{},{}",
        s.p50_us, s.p90_us, s.p99_us, s.p999_us, s.max_us, s.mean_us, s.samples
    )
}

fn summary_from_field(v: &str) -> Option<LatencySummary> {
    let f: Vec<&str> = v.split(',').collect();
    let [p50, p90, p99, p999, max, mean, samples] = f.as_slice() else {
        return None;
    };
    Some(LatencySummary {
        p50_us: p50.parse().ok()?,
        p90_us: p90.parse().ok()?,
        p99_us: p99.parse().ok()?,
        p999_us: p999.parse().ok()?,
        max_us: max.parse().ok()?,
        mean_us: mean.parse().ok()?,
        samples: samples.parse().ok()?,
    })
}

impl ChildReport {
    /// The line after [`PREFIX`]: `result phase=… calls=… wall_ns=… client_cpu_ns=…
    /// target=… lat=p50,p90,p99,p999,max,mean,samples sent=…`.
    fn to_line(&self) -> String {
        format!(
            "result phase={} calls={} wall_ns={} client_cpu_ns={} target={} lat={} sent={}",
            self.phase,
            self.calls,
            self.wall.as_nanos(),
            self.client_cpu.as_nanos(),
            self.target_calls_per_s,
            summary_to_field(&self.lat),
            summary_to_field(&self.sent_lat),
        )
    }

    /// Parses [`to_line`](Self::to_line)'s output.
    fn from_line(line: &str) -> Option<ChildReport> {
        let rest = line.strip_prefix("result ")?;
        let field = |key: &str| {
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        };
        let nanos = |key: &str| field(key)?.parse::<u64>().ok().map(Duration::from_nanos);
        Some(ChildReport {
            phase: ManyPhase::parse(field("phase")?)?,
            calls: field("calls")?.parse().ok()?,
            wall: nanos("wall_ns")?,
            client_cpu: nanos("client_cpu_ns")?,
            target_calls_per_s: field("target")?.parse().ok()?,
            lat: summary_from_field(field("lat")?)?,
            sent_lat: summary_from_field(field("sent")?)?,
        })
    }
}

/// The child process: runs the many workload of `subject` against `addr` on
/// [`CLIENT_THREADS`] threads, then reports each phase on stdout.
pub(crate) fn client_main<S: BenchSubject>(
    subject: S,
    addr: &str,
    params: &Params,
) -> io::Result<()> {
    let connections = params.many.connections;
    raise_fd_limit(connections)?;
    let threads = CLIENT_THREADS.clamp(1, connections.max(1));
    let coordinator = Arc::new(Coordinator::new(threads, connections));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut first = 0;
    for index in 0..threads {
        // The first `connections % threads` threads take one more.
        let share = connections / threads + usize::from(index < connections % threads);
        let control = ServerControl::for_shard(Shard {
            first,
            connections: share,
            coordinator: coordinator.clone(),
        });
        first += share;
        let (done, params, addr) = (done_tx.clone(), params.clone(), addr.to_string());
        thread::Builder::new()
            .name(format!("many-client-{index}"))
            .spawn(move || {
                let result = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .and_then(|runtime| {
                        runtime.block_on(subject.run(Workload::Many, &params, &addr, &control))
                    });
                let _ = done.send(result.map(drop));
            })?;
    }
    drop(done_tx);
    for _ in 0..threads {
        // A failed thread ends the process (returning from `main` stops the others,
        // which may be waiting for it at a barrier).
        done_rx
            .recv()
            .map_err(|_| io::Error::other("a client thread panicked"))??;
    }
    for phase in ManyPhase::BOTH {
        let mut record = coordinator.take(phase);
        record.samples.sort_unstable();
        record.sent.sort_unstable();
        let lat = LatencySummary::from_sorted(&record.samples);
        let report = ChildReport {
            phase,
            calls: record.samples.len() as u64,
            wall: record.wall,
            client_cpu: record.client_cpu,
            target_calls_per_s: record.target_calls_per_s,
            sent_lat: if record.sent.is_empty() {
                lat.clone()
            } else {
                LatencySummary::from_sorted(&record.sent)
            },
            lat,
        };
        tell_parent(&report.to_line())?;
    }
    Ok(())
}

/// The subject's server on a multi-thread runtime in its own thread.
struct MultiThreadServer {
    addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MultiThreadServer {
    /// Starts `subject`'s server and waits until it listens.
    fn start<S: BenchSubject>(subject: S) -> io::Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<String>>();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = thread::Builder::new()
            .name(format!("many-server-{subject}"))
            .spawn(move || {
                let run = || -> io::Result<()> {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(SERVER_WORKERS)
                        .enable_all()
                        .build()?;
                    // The accept loop runs here (it is not `Send`); the connection
                    // tasks it spawns run on the workers.
                    runtime.block_on(async move {
                        let (addr, serve) = subject.start_server().await?;
                        let _ = ready_tx.send(Ok(addr));
                        tokio::select! {
                            result = serve => result,
                            _ = stopped => Ok(()),
                        }
                    })
                };
                if let Err(e) = run() {
                    eprintln!("{subject} server: {e}");
                }
            })?;
        let addr = ready_rx
            .recv()
            .map_err(|_| io::Error::other("the server did not start"))??;
        Ok(MultiThreadServer {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for MultiThreadServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Samples a process's `VmRSS` on a thread of its own until stopped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<u64>>,
}

impl RssSampler {
    fn start(pid: u32) -> io::Result<RssSampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::Builder::new()
            .name("many-rss".into())
            .spawn(move || {
                let mut samples = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    samples.extend(rss_bytes(pid).ok());
                    thread::sleep(RSS_EVERY);
                }
                samples
            })?;
        Ok(RssSampler { stop, thread })
    }

    /// Stops sampling: the median sample (0 if none).
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = self.thread.join().unwrap_or_default();
        samples.sort_unstable();
        samples.get(samples.len() / 2).copied().unwrap_or(0)
    }
}

/// What the parent measured of one phase.
#[derive(Default)]
struct ServerPhase {
    cpu_start: Option<Duration>,
    cpu: Duration,
    rss: Option<RssSampler>,
    rss_load: u64,
}

/// The server process ([`measure`] starts it with `--many-server NAME`): `subject`'s
/// server on a multi-thread runtime; tells the parent its address (`many listening
/// ADDR`), then serves until its stdin closes.
pub(crate) fn server_main<S: BenchSubject>(subject: S, params: &Params) -> io::Result<()> {
    raise_fd_limit(params.many.connections)?;
    let server = MultiThreadServer::start(subject)?;
    tell_parent(&format!("listening {}", server.addr))?;
    // Until the parent closes our stdin (or exits).
    let mut sink = Vec::new();
    let _ = io::Read::read_to_end(&mut io::stdin(), &mut sink);
    drop(server);
    Ok(())
}

/// A child process that is killed if it is still running when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Starts this binary again with the parent's arguments and `extra`, its stdout piped.
fn spawn_self(extra: &[&str], stdin: Stdio) -> io::Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .args(extra)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .spawn()
        .map(Child)
}

/// Runs the many workload against `subject`: its server in one child process (a
/// fresh one, so that its memory is its own), the clients in another; this process
/// reads the server's CPU time and memory from `/proc`. One measurement per phase.
pub(crate) fn measure<S: BenchSubject>(
    subject: S,
    params: &Params,
) -> io::Result<Vec<Measurement>> {
    let run = params.many;
    raise_fd_limit(run.connections)?;
    let mut server = spawn_self(&["--many-server", subject.name()], Stdio::piped())?;
    let server_pid = server.0.id();
    let mut server_out = io::BufReader::new(
        server
            .0
            .stdout
            .take()
            .ok_or_else(|| io::Error::other("no stdout from the server process"))?,
    );
    let mut line = String::new();
    server_out.read_line(&mut line)?;
    let addr = line
        .trim()
        .strip_prefix(PREFIX)
        .and_then(|l| l.strip_prefix("listening "))
        .ok_or_else(|| io::Error::other(format!("the server process failed: {line:?}")))?
        .to_string();
    thread::sleep(Duration::from_millis(200));
    let rss_before = rss_bytes(server_pid)?;

    let mut client = spawn_self(
        &["--many-client", &addr, "--many-subject", subject.name()],
        Stdio::null(),
    )?;
    let stdout = client
        .0
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout from the client process"))?;
    let mut phases: [ServerPhase; 2] = Default::default();
    let mut reports: Vec<ChildReport> = Vec::new();
    for line in io::BufReader::new(stdout).lines() {
        let line = line?;
        let Some(what) = line.strip_prefix(PREFIX) else {
            eprintln!("# many client: {line}");
            continue;
        };
        if let Some(phase) = what.strip_prefix("begin ").and_then(ManyPhase::parse) {
            let p = &mut phases[phase as usize];
            p.cpu_start = Some(cpu_time_of(server_pid)?);
            p.rss = Some(RssSampler::start(server_pid)?);
        } else if let Some(phase) = what.strip_prefix("end ").and_then(ManyPhase::parse) {
            let now = cpu_time_of(server_pid)?;
            let p = &mut phases[phase as usize];
            p.cpu = now.saturating_sub(p.cpu_start.unwrap_or(now));
            p.rss_load = p.rss.take().map_or(0, RssSampler::stop);
        } else if what == "connected" {
            eprintln!("# many: {} connections open", run.connections);
        } else if let Some(report) = ChildReport::from_line(what) {
            reports.push(report);
        } else {
            eprintln!("# many client: {line}");
        }
    }
    let status = client.0.wait()?;
    // Closing its stdin stops the server process.
    drop(server.0.stdin.take());
    let server_status = server.0.wait()?;
    if !status.success() {
        return Err(io::Error::other(format!(
            "the client process failed: {status}"
        )));
    }
    if !server_status.success() {
        return Err(io::Error::other(format!(
            "the server process failed: {server_status}"
        )));
    }
    let mut measurements = Vec::with_capacity(reports.len());
    for report in reports {
        let server = &phases[report.phase as usize];
        measurements.push(Measurement {
            payload_bytes: run.payload_bytes,
            concurrency: run.connections * run.in_flight,
            calls: report.calls,
            samples: Vec::new(),
            wall: report.wall,
            server_cpu: server.cpu,
            client_cpu: report.client_cpu,
            loss: None,
            many: Some(ManyOutcome {
                phase: report.phase,
                connections: run.connections,
                in_flight: run.in_flight,
                target_calls_per_s: report.target_calls_per_s,
                open_load: run.open_load,
                lat: report.lat,
                sent_lat: report.sent_lat,
                server_rss_before: rss_before,
                server_rss_load: server.rss_load,
            }),
        });
    }
    if measurements.len() != ManyPhase::BOTH.len() {
        return Err(io::Error::other(
            "the client process did not report every phase",
        ));
    }
    Ok(measurements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip() {
        let report = ChildReport {
            phase: ManyPhase::Open,
            calls: 123_456,
            wall: Duration::from_nanos(5_000_123_456),
            client_cpu: Duration::from_millis(4_321),
            target_calls_per_s: 61_728.25,
            lat: LatencySummary::from_sorted(&[1_000, 2_000, 40_000]),
            sent_lat: LatencySummary::from_sorted(&[500, 1_500]),
        };
        let line = report.to_line();
        assert!(
            line.starts_with("result phase=open calls=123456 "),
            "{line}"
        );
        assert_eq!(ChildReport::from_line(&line), Some(report));
        assert_eq!(ChildReport::from_line("result phase=open"), None);
        assert_eq!(ChildReport::from_line("begin open"), None);
    }

    #[test]
    fn the_fd_limit_fits_a_few_connections() {
        raise_fd_limit(10).unwrap();
        assert!(raise_fd_limit(usize::MAX / 2).is_err());
    }

    #[test]
    fn process_clocks() {
        let me = std::process::id();
        assert!(rss_bytes(me).unwrap() > 0);
        let (before, before_of) = (cpu_time().unwrap(), cpu_time_of(me).unwrap());
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(cpu_time().unwrap() >= before, "{x}");
        assert!(cpu_time_of(me).unwrap() >= before_of);
    }
}
