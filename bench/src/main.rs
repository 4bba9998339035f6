//! `rpc-bench`: measures the framework over TCP, TLS, Unix sockets, UDP, soft RDMA and
//! gRPC (HTTP/2)
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
          [--baseline S] [--connections N] [--connections-many N] [--in-flight K]
          [--open-load F]

  --subject S      tcp, tls, unix, udp, rdma, grpc, raw-tcp, raw-udp or all
                   (repeatable; default all; grpc is gRPC over HTTP/2, h2c)
  --workload W     latency, throughput, bulk, connect or all (repeatable; default all),
                   or lossy (only when named; udp only), or many (only when named;
                   tcp, tls, unix, grpc and raw-tcp)
  --repeat N       run the whole matrix N times; the table uses medians (default 1)
  --pin-cpus S,C   pin the server thread to CPU S and the client thread to CPU C
                   (default 0,1; 0,0 shares one CPU; none leaves them unpinned)
  --quick          counts divided by 10, throughput for 1 s (for smoke tests)
  --calls N        measured latency calls (warm-up: N/10); also the lossy workload's
                   calls per loss rate
  --duration-s F   measured seconds of the throughput workload (warm-up: F/10), and
                   of each phase of the many workload
  --concurrency N  calls in flight in the throughput workload (default 256), and in
                   the lossy workload (default 16)
  --connections N  connections per framework channel, a pool (ChannelBuilder::
                   connections; default 1): calls go to them in turn
  --loss P         a loss rate each way for the lossy workload, 0 <= P < 1 (repeatable;
                   default 0.05 and 0.2; no loss is always measured first)
  --lossy-payload B
                   bytes of payload per call in the lossy workload (default 32; above
                   a datagram's room, each request and answer is a message of fragments)
  --connections-many N
                   connections of the many workload (default 1000)
  --in-flight K    calls in flight on each of them in its closed loop (default 8)
  --open-load F    its open loop's rate as a fraction of the closed loop's, 0 < F <= 1
                   (default 0.5)
  --plot FILE.svg  write latency CDFs of the latency workload's subjects
  --baseline S     the subject a ratio table divides by (default raw-tcp;
                   repeatable: one table per baseline)

Workloads: latency (2,000 warm-up, 20,000 sequential 32-byte calls), throughput (256
calls in flight on one connection for 5 s), bulk (200 echoes of 1 MiB, 20 of 16 MiB),
connect (new connections, each one 32-byte call then dropped: 100 warm-up, 1,000 one
after another, 2,000 with 16 at a time; over tls each runs a full handshake, no
resumption; tcp, tls, unix and raw-tcp only). lossy, run only when named: 32-byte
calls (--lossy-payload) with a 3 s deadline over udp through a fault proxy that drops
datagrams each way (no loss, then each --loss rate), 16 in flight (--concurrency),
4,000 warm-up and 40,000 measured per rate; each result line adds loss_each_way,
deadline_ms, deadline_misses (calls that failed; their time until failing stays among
the latencies), proxy_received and proxy_dropped, and a table of medians per rate
follows. many, run only when named:
the server on a multi-thread runtime of 2 workers in a child process (this binary
again, a fresh one per measurement), the clients in another (2 threads) opening --connections-many connections
and making one call on each; then a closed loop (--in-flight calls in flight on every
connection, F/10 s warm-up, F s measured: peak throughput) and an open loop at half
the peak rate (--open-load; calls due on a schedule over the connections in turn, at
most --in-flight in flight on a connection, the others waiting in its backlog; F/10 s
warm-up, F s measured; lat_us from each call's scheduled time, sent_lat_us from its
send). Its lines add phase (closed or open), connections, in_flight_per_connection,
target_calls_per_s, open_load, sent_lat_us, server_rss_before_bytes, server_rss_load_bytes (the
median VmRSS during the phase), server_bytes_per_connection and
server_cpu_us_per_call; server_cpu_s and client_cpu_s are whole-process CPU times
(/proc/PID/stat for the server, getrusage for the client); a table of ratios to each baseline follows.

Environment: RPC_BENCH_OBSERVE=1 puts rpc-observe's trace and metrics layers on both
sides of the framework's subjects (no subscriber nor recorder is installed); =trace or
=metrics, only those. RPC_BENCH_SUBSCRIBER=drop installs a tracing subscriber that
enables every span and event and keeps none (the layers' own cost under a subscriber);
=off one that filters every span and event out.

Output: one JSON line per result on stdout, then a markdown table of ratios to each
baseline. In the connect workload a call is a connection (connect, call, drop):
calls_per_s is connections per second, lat_us the time of each connection.
calls_per_s = calls / wall_s; mib_per_s = request payload bytes per second / 2^20;
cpu_us_per_call = (server_cpu_s + client_cpu_s) * 1e6 / calls, each CPU time being that
thread's CLOCK_THREAD_CPUTIME_ID over the measured phase; lat_us percentiles are
nearest-rank over every measured call.
";

fn main() -> ExitCode {
    cli::main::<Subject>("rpc-bench", USAGE)
}
