//! What is measured: the framework over TCP, TLS, Unix sockets, UDP, soft RDMA and
//! gRPC's HTTP/2 wire, and two hand-written baselines (raw TCP, raw UDP) that do the
//! least an echo over each socket can do.
//!
//! Every subject has a server half ([`BenchSubject::start_server`], run on the server
//! thread) and client halves that implement [`Caller`] (built in
//! [`BenchSubject::run`], run on the client thread).

pub(crate) mod framework;
pub(crate) mod pipeline;
pub(crate) mod raw_tcp;
pub(crate) mod raw_udp;

use std::{fmt, future::Future, io, pin::Pin};

use bytes::Bytes;

use crate::{
    threads::ServerControl,
    workloads::{self, Measurement, Params, Workload},
};

/// One system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// The framework (`rpc_proto::echo`) over `tcp://127.0.0.1`.
    Tcp,
    /// The framework over `tls://127.0.0.1`: TLS (rustls, `ring`) over TCP with the
    /// test certificates of `testdata/tls` (ECDSA P-256), served and measured like
    /// `tcp`.
    Tls,
    /// The framework over a `unix://` socket in the temporary directory.
    Unix,
    /// The framework over `udp://127.0.0.1` (default UDP settings: 1200-byte
    /// datagrams, larger messages fragmented).
    Udp,
    /// The framework over the soft RDMA provider on a Unix socket (`rdma+unix://`):
    /// eager sends into posted buffers, rendezvous reads of large frames by
    /// cross-memory attach. The provider emulates RDMA's semantics, not its speed.
    Rdma,
    /// The framework over `grpc://127.0.0.1` (gRPC's own protocol: HTTP/2 with prior
    /// knowledge, `application/grpc` messages, statuses in trailers), our client and
    /// our server. The bulk workload is 1 MiB and 16 MiB message echoes, as for the
    /// other subjects (the bulk-transfer API is not mapped over gRPC and is not used).
    Grpc,
    /// Hand-written length-prefixed echo over TCP.
    RawTcp,
    /// One datagram per request over UDP (latency workload only).
    RawUdp,
}

impl Subject {
    /// Every subject, in the order runs interleave them.
    pub const ALL: [Subject; 8] = [
        Subject::Tcp,
        Subject::Tls,
        Subject::Unix,
        Subject::Udp,
        Subject::Rdma,
        Subject::Grpc,
        Subject::RawTcp,
        Subject::RawUdp,
    ];

    /// The name used on the command line and in the output.
    pub fn name(self) -> &'static str {
        match self {
            Subject::Tcp => "tcp",
            Subject::Tls => "tls",
            Subject::Unix => "unix",
            Subject::Udp => "udp",
            Subject::Rdma => "rdma",
            Subject::Grpc => "grpc",
            Subject::RawTcp => "raw-tcp",
            Subject::RawUdp => "raw-udp",
        }
    }

    /// The subject called `name`, if any.
    pub fn parse(name: &str) -> Option<Subject> {
        Subject::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether this subject has an implementation of `workload`: raw UDP has no
    /// fragmentation, so no bulk workload; the connect workload (new connections)
    /// is for the connection-oriented stream subjects: `tcp`, `tls`, `unix` and
    /// `raw-tcp`; the many workload for those and `grpc`.
    pub fn supports(self, workload: Workload) -> bool {
        match workload {
            Workload::Bulk => self != Subject::RawUdp,
            Workload::Connect => matches!(
                self,
                Subject::Tcp | Subject::Tls | Subject::Unix | Subject::RawTcp
            ),
            Workload::Latency | Workload::Throughput => true,
            // Through a proxy that drops datagrams: the UDP transport's retransmission.
            Workload::Lossy => self == Subject::Udp,
            // Many connections: the connection-oriented subjects.
            Workload::Many => matches!(
                self,
                Subject::Tcp | Subject::Tls | Subject::Unix | Subject::Grpc | Subject::RawTcp
            ),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A server's accept-and-echo loop; it runs until dropped. Not `Send`: it stays on
/// the server thread.
pub type ServeFuture = Pin<Box<dyn Future<Output = io::Result<()>>>>;

/// Binds a server for `subject` on loopback and returns its address (a URI for the
/// framework, `host:port` for the baselines) and the future that serves it.
async fn start_server(subject: Subject) -> io::Result<(String, ServeFuture)> {
    match subject {
        Subject::Tcp => framework::serve("tcp://127.0.0.1:0").await,
        Subject::Tls => framework::serve("tls://127.0.0.1:0").await,
        Subject::Unix => framework::serve(&framework::socket_uri("unix")).await,
        Subject::Udp => framework::serve("udp://127.0.0.1:0").await,
        Subject::Rdma => framework::serve(&framework::socket_uri("rdma+unix")).await,
        Subject::Grpc => framework::serve("grpc://127.0.0.1:0").await,
        Subject::RawTcp => raw_tcp::serve().await,
        Subject::RawUdp => raw_udp::serve().await,
    }
}

/// The client side of one subject: sends `payload`, waits for its echo, checks it.
///
/// Callers run on the client thread's `current_thread` runtime, so the call future
/// need not be `Send`.
#[allow(async_fn_in_trait)]
pub trait Caller {
    /// One echo call.
    async fn call(&mut self, payload: &Bytes) -> io::Result<()>;
}

/// The error for an echo whose length differs from the request's.
pub fn wrong_length(expected: usize, got: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("echo of {expected} bytes came back with {got}"),
    )
}

/// A set of systems under test, as the command line ([`crate::cli`]) and the run loop
/// see it. [`Subject`] is `rpc-bench`'s; another binary can define its own (wrapping
/// [`Subject`] to keep the built-in ones).
///
/// Both futures run on the harness's `current_thread` runtimes (the server's on the
/// server thread, the client's on the client thread), so neither need be `Send`.
#[allow(async_fn_in_trait)]
pub trait BenchSubject: Copy + PartialEq + fmt::Display + Send + 'static {
    /// The subjects that `all`, `--subject all` and no `--subject` select, in the
    /// order runs interleave them.
    fn all() -> &'static [Self];

    /// The workloads that `all`, `--workload all` and no `--workload` select. By
    /// default the call workloads ([`Workload::CALLS`]: latency, throughput, bulk);
    /// a set whose subjects implement [`Workload::Connect`] (as [`Subject`]'s do)
    /// returns [`Workload::ALL`].
    fn workloads() -> &'static [Workload] {
        &Workload::CALLS
    }

    /// The name used on the command line and in the output.
    fn name(self) -> &'static str;

    /// The subject called `name`, if any (by default: one of [`all`](Self::all)).
    fn parse(name: &str) -> Option<Self> {
        Self::all().iter().copied().find(|s| s.name() == name)
    }

    /// Whether this subject has an implementation of `workload` (runs skip the others).
    fn supports(self, workload: Workload) -> bool;

    /// Binds the subject's server on loopback and returns its address and the future
    /// that serves it (called on the server thread, inside its runtime).
    async fn start_server(self) -> io::Result<(String, ServeFuture)>;

    /// Runs `workload` against the server at `addr`, from connecting to the last
    /// measurement (called on the client thread, inside its runtime): usually a
    /// [`Caller`] handed to [`workloads::sequential_all`] or [`workloads::concurrent`],
    /// or a way to make new ones handed to [`workloads::connections`].
    async fn run(
        self,
        workload: Workload,
        params: &Params,
        addr: &str,
        control: &ServerControl,
    ) -> io::Result<Vec<Measurement>>;
}

impl BenchSubject for Subject {
    fn all() -> &'static [Self] {
        &Subject::ALL
    }

    fn workloads() -> &'static [Workload] {
        &Workload::ALL
    }

    fn name(self) -> &'static str {
        Subject::name(self)
    }

    fn parse(name: &str) -> Option<Self> {
        Subject::parse(name)
    }

    fn supports(self, workload: Workload) -> bool {
        Subject::supports(self, workload)
    }

    async fn start_server(self) -> io::Result<(String, ServeFuture)> {
        start_server(self).await
    }

    async fn run(
        self,
        workload: Workload,
        params: &Params,
        addr: &str,
        control: &ServerControl,
    ) -> io::Result<Vec<Measurement>> {
        workloads::run(self, workload, params, addr, control).await
    }
}
