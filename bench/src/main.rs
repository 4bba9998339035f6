//! `rpc-bench`: measures the framework over TCP, Unix sockets, UDP and soft RDMA
//! against hand-written raw TCP and raw UDP echo baselines, in one run, on one
//! machine.
//!
//! The harness is the `rpc_bench` library (its crate documentation describes the
//! workloads, the output and the layout); this binary is its command line over the
//! built-in subjects.

use std::process::ExitCode;

use rpc_bench::{cli, Subject};

const USAGE: &str = "\
rpc-bench [all] [--subject S]... [--workload W]... [--repeat N] [--pin-cpus S,C|none]
          [--quick] [--calls N] [--duration-s F] [--concurrency N] [--plot FILE.svg]

  --subject S      tcp, unix, udp, rdma, raw-tcp, raw-udp or all (repeatable; default all)
  --workload W     latency, throughput, bulk or all (repeatable; default all)
  --repeat N       run the whole matrix N times; the table uses medians (default 1)
  --pin-cpus S,C   pin the server thread to CPU S and the client thread to CPU C
                   (default 0,1; 0,0 shares one CPU; none leaves them unpinned)
  --quick          counts divided by 10, throughput for 1 s (for smoke tests)
  --calls N        measured latency calls (warm-up: N/10)
  --duration-s F   measured seconds of the throughput workload (warm-up: F/10)
  --concurrency N  calls in flight in the throughput workload (default 256)
  --plot FILE.svg  write latency CDFs of the latency workload's subjects

Output: one JSON line per result on stdout, then a markdown table of ratios to raw-tcp.
calls_per_s = calls / wall_s; mib_per_s = request payload bytes per second / 2^20;
cpu_us_per_call = (server_cpu_s + client_cpu_s) * 1e6 / calls, each CPU time being that
thread's CLOCK_THREAD_CPUTIME_ID over the measured phase; lat_us percentiles are
nearest-rank over every measured call.
";

fn main() -> ExitCode {
    cli::main::<Subject>("rpc-bench", USAGE)
}
