//! `rpc-bench`: the benchmark harness. It measures the framework over TCP, TLS, Unix
//! sockets, UDP, (soft) RDMA and gRPC's HTTP/2 wire against hand-written raw TCP and
//! raw UDP echo baselines, in one run, on one machine.
//!
//! ```text
//! rpc-bench [all] [--subject S]... [--workload W]... [--repeat N] [--pin-cpus S,C|none]
//!           [--quick] [--calls N] [--duration-s F] [--concurrency N] [--plot FILE.svg]
//!           [--baseline S] [--connections N] [--connections-many N] [--in-flight K]
//!           [--open-load F]
//! ```
//!
//! - subjects: `tcp`, `tls`, `unix`, `udp`, `rdma`, `grpc` (the framework; `tls` is TLS
//!   over TCP with the test certificates of `testdata/tls`, `grpc` gRPC over HTTP/2
//!   (h2c) with our client and server, `rdma` the soft provider on a Unix
//!   socket), `raw-tcp`, `raw-udp` (baselines), `all`;
//! - workloads: `latency` (2,000 warm-up then 20,000 sequential 32-byte calls),
//!   `throughput` (256 calls in flight on one connection for 5 s, 32 bytes), `bulk`
//!   (200 echoes of 1 MiB, 20 of 16 MiB), `connect` (new connections, each one
//!   32-byte call then dropped: 100 warm-up, 1,000 one after another, 2,000 with 16 at
//!   a time; over TLS each runs a full handshake; `tcp`, `tls`, `unix` and `raw-tcp`
//!   only), `all`; and `lossy`, only when named (`udp` only: calls with a 3 s deadline
//!   through a proxy dropping datagrams at each `--loss` rate each way, default 5% and
//!   20%, against no loss; latency percentiles and deadline misses); and `many`, only
//!   when named (`tcp`, `tls`, `unix`, `grpc`, `raw-tcp`: `--connections-many`
//!   connections, default 1,000, from a client process, `--in-flight` calls on each,
//!   default 8, against the server on a 2-worker multi-thread runtime in a process of
//!   its own: peak
//!   throughput in a closed loop, then p50/p99 in an open loop at half of it, and the
//!   server's memory per connection; see `many`);
//! - no subject or workload (or `all`) means all of them.
//!
//! Each measurement starts a fresh server on its own OS thread with a `current_thread`
//! runtime, and a client on another; `--pin-cpus S,C` pins them (default `0,1`).
//! Runs interleave: for each repeat, for each workload, for each subject. Every result
//! is one JSON line on stdout (see `report` for the definitions); then comes a
//! markdown table of ratios to `raw-tcp`, or one to each `--baseline` subject (medians
//! over repeats). Progress goes to stderr.
//!
//! # Layout
//!
//! - `main.rs`: the `rpc-bench` binary, [`cli::main`] over [`Subject`].
//! - [`cli`]: arguments and the run loop, generic over a [`BenchSubject`] set.
//! - `threads`: the pinned server and client threads, CPU clocks per phase.
//! - [`subjects`]: the framework (`framework`), `raw_tcp`, `raw_udp`, and the shared
//!   pipelined caller (`pipeline`): servers and callers;
//!   [`BenchSubject`], what a subject provides to the harness.
//! - [`workloads`]: latency, throughput and bulk, as loops over a `Caller`; connect, as
//!   a loop over a function that makes one.
//! - `stats`: percentiles, medians, thread CPU time, CPU pinning.
//! - `report`: JSON lines, the ratio table, the latency CDF SVG.
//! - `lossy`: the lossy workload (UDP through the fault proxy) and its table.
//! - `many`: the many workload: its two processes (`many/process.rs`), the open-loop
//!   schedule (`many/schedule.rs`) and its table (`many/table.rs`).

//!
//! # As a library
//!
//! The `rpc-bench` binary is [`cli::main`] over [`Subject`]. Another binary can reuse
//! the harness with subjects of its own: an enum implementing [`BenchSubject`] (which
//! may wrap [`Subject`] and delegate to it), whose clients implement [`Caller`] and
//! run [`workloads::sequential_all`] and [`workloads::concurrent`] (and
//! [`workloads::connections`] if it implements the connect workload: then its
//! [`BenchSubject::workloads`] returns [`Workload::ALL`]; and [`workloads::many`]
//! for the many workload, whose client process runs the same binary); its `main` is
//! `cli::main::<ItsSubject>(name, usage)`. The `rpc-bench-compare` crate (outside the
//! workspace, next to this one) does this for tonic and tarpc.

pub mod cli;
mod lossy;
mod many;
mod quiet_subscriber;
mod report;
mod stats;
pub mod subjects;
mod threads;
pub mod workloads;

pub use stats::rss_bytes;
pub use subjects::{BenchSubject, Caller, ServeFuture, Subject};
pub use threads::ServerControl;
pub use workloads::{Measurement, Params, Workload};
