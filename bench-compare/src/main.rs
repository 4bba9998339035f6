//! `rpc-bench-compare`: the `rpc-bench` workloads against tonic and tarpc, next to
//! the framework over its own wire (`tcp`) and over gRPC's (`grpc`), and the raw TCP
//! baseline (`raw-tcp`), in one run, on one machine.
//!
//! It is `rpc-bench`'s harness (the `rpc_bench` library: same flags, workloads, JSON
//! lines and ratio table, measured against `raw-tcp` from the same run) with two more
//! subjects:
//!
//! - `tonic` ([`tonic_subject`]): a unary gRPC echo over HTTP/2;
//! - `tarpc` ([`tarpc_subject`]): a tarpc echo over its serde transport with bincode.
//!
//! Its crate is outside the main workspace (its own `[workspace]`, `Cargo.lock` and
//! `target/`), so building the framework never builds tonic or tarpc.

mod tarpc_subject;
mod tonic_subject;

use std::{fmt, io, process::ExitCode};

use rpc_bench::{
    cli,
    workloads::{concurrent, many, sequential_all},
    BenchSubject, Measurement, Params, ServeFuture, ServerControl, Subject, Workload,
};

const USAGE: &str = "\
rpc-bench-compare [all] [--subject S]... [--workload W]... [--repeat N]
                  [--pin-cpus S,C|none] [--quick] [--calls N] [--duration-s F]
                  [--concurrency N] [--plot FILE.svg] [--connections-many N]
                  [--in-flight K] [--open-load F]

  --subject S      raw-tcp, tcp, grpc, tonic, tarpc or all (repeatable; default
                   all); grpc is our client and server over grpc:// (HTTP/2, h2c);
                   rpc-bench's other subjects (unix, tls, ...) are accepted too
  --workload W     latency, throughput, bulk or all (repeatable; default all), or
                   many (only when named: many connections from a client process
                   against the server on a 2-worker multi-thread runtime)
  --repeat N       run the whole matrix N times; the table uses medians (default 1)
  --pin-cpus S,C   pin the server thread to CPU S and the client thread to CPU C
                   (default 0,1; 0,0 shares one CPU; none leaves them unpinned)
  --quick          counts divided by 10, throughput for 1 s (for smoke tests)
  --calls N        measured latency calls (warm-up: N/10)
  --duration-s F   measured seconds of the throughput workload (warm-up: F/10), and
                   of each phase of the many workload
  --concurrency N  calls in flight in the throughput workload (default 256)
  --connections-many N
                   connections of the many workload (default 1000)
  --in-flight K    calls in flight on each of them in its closed loop (default 8)
  --open-load F    its open loop's rate as a fraction of the peak (default 0.5)
  --plot FILE.svg  write latency CDFs of the latency workload's subjects
  --baseline S     the subject the ratio table divides by (default raw-tcp; tonic
                   for the gRPC comparison)

Output: one JSON line per result on stdout, then a markdown table of ratios to the
baseline.
calls_per_s = calls / wall_s; mib_per_s = request payload bytes per second / 2^20;
cpu_us_per_call = (server_cpu_s + client_cpu_s) * 1e6 / calls, each CPU time being that
thread's CLOCK_THREAD_CPUTIME_ID over the measured phase; lat_us percentiles are
nearest-rank over every measured call. The many workload is rpc-bench's (see
`rpc-bench --help`): a closed loop for peak throughput, an open loop at half of it
for p50/p99, the server's memory per connection, whole-process CPU times.
";

/// The subjects of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compared {
    /// One of `rpc-bench`'s own subjects.
    Builtin(Subject),
    /// tonic (gRPC over HTTP/2 over TCP).
    Tonic,
    /// tarpc (serde transport, bincode, over TCP).
    Tarpc,
}

/// `all`: the baseline, the framework over TCP and over gRPC, then the two others.
const ALL: [Compared; 5] = [
    Compared::Builtin(Subject::RawTcp),
    Compared::Builtin(Subject::Tcp),
    Compared::Builtin(Subject::Grpc),
    Compared::Tonic,
    Compared::Tarpc,
];

impl fmt::Display for Compared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl BenchSubject for Compared {
    fn all() -> &'static [Self] {
        &ALL
    }

    fn name(self) -> &'static str {
        match self {
            Compared::Builtin(subject) => subject.name(),
            Compared::Tonic => "tonic",
            Compared::Tarpc => "tarpc",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        match name {
            "tonic" => Some(Compared::Tonic),
            "tarpc" => Some(Compared::Tarpc),
            name => Subject::parse(name).map(Compared::Builtin),
        }
    }

    fn supports(self, workload: Workload) -> bool {
        match self {
            Compared::Builtin(subject) => subject.supports(workload),
            // Not the connect workload (new connections) nor lossy (UDP only).
            Compared::Tonic | Compared::Tarpc => {
                !matches!(workload, Workload::Connect | Workload::Lossy)
            }
        }
    }

    async fn start_server(self) -> io::Result<(String, ServeFuture)> {
        match self {
            Compared::Builtin(subject) => BenchSubject::start_server(subject).await,
            Compared::Tonic => tonic_subject::serve().await,
            Compared::Tarpc => tarpc_subject::serve().await,
        }
    }

    async fn run(
        self,
        workload: Workload,
        params: &Params,
        addr: &str,
        control: &ServerControl,
    ) -> io::Result<Vec<Measurement>> {
        match (self, workload) {
            (Compared::Builtin(subject), _) => {
                BenchSubject::run(subject, workload, params, addr, control).await
            }
            (Compared::Tonic, Workload::Many) => {
                many(|_| tonic_subject::connect(addr), params, control).await
            }
            (Compared::Tarpc, Workload::Many) => {
                many(|_| tarpc_subject::connect(addr), params, control).await
            }
            (Compared::Tonic, Workload::Throughput) => {
                let caller = tonic_subject::connect(addr).await?;
                Ok(vec![concurrent(caller, params, control).await?])
            }
            (Compared::Tonic, _) => {
                let mut caller = tonic_subject::connect(addr).await?;
                sequential_all(&mut caller, workload, params, control).await
            }
            (Compared::Tarpc, Workload::Throughput) => {
                let caller = tarpc_subject::connect(addr).await?;
                Ok(vec![concurrent(caller, params, control).await?])
            }
            (Compared::Tarpc, _) => {
                let mut caller = tarpc_subject::connect(addr).await?;
                sequential_all(&mut caller, workload, params, control).await
            }
        }
    }
}

fn main() -> ExitCode {
    // tarpc turns on tracing's `log` feature for the whole binary. Until a subscriber is
    // installed, that feature hands every span and event, disabled ones included, to
    // `log`'s checks: measured, 10-15% of the instructions of a gRPC call (ours and
    // tonic's alike), which neither carries in a build without tarpc. A subscriber that
    // takes nothing turns that path off; `RPC_BENCH_SUBSCRIBER` still picks another.
    if std::env::var_os("RPC_BENCH_SUBSCRIBER").is_none() {
        let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::new());
    }
    cli::main::<Compared>("rpc-bench-compare", USAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(Compared::parse(s.name()), Some(s));
        }
        assert_eq!(
            Compared::parse("unix"),
            Some(Compared::Builtin(Subject::Unix))
        );
        assert_eq!(
            Compared::parse("grpc"),
            Some(Compared::Builtin(Subject::Grpc))
        );
        assert_eq!(Compared::parse("grpcio"), None);
    }
}
