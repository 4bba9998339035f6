//! What is measured: the framework over TCP and Unix sockets, and two hand-written
//! baselines (raw TCP, raw UDP) that do the least an echo over each socket can do.
//!
//! Every subject has a server half ([`start_server`], run on the server thread) and
//! client halves that implement [`Caller`] (built in [`crate::workloads`], run on the
//! client thread).

pub(crate) mod framework;
pub(crate) mod raw_tcp;
pub(crate) mod raw_udp;

use std::{fmt, future::Future, io, pin::Pin};

use bytes::Bytes;

use crate::workloads::Workload;

/// One system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Subject {
    /// The framework (`rpc_proto::echo`) over `tcp://127.0.0.1`.
    Tcp,
    /// The framework over a `unix://` socket in the temporary directory.
    Unix,
    /// Hand-written length-prefixed echo over TCP.
    RawTcp,
    /// One datagram per request over UDP (latency workload only).
    RawUdp,
}

impl Subject {
    /// Every subject, in the order runs interleave them.
    pub(crate) const ALL: [Subject; 4] = [
        Subject::Tcp,
        Subject::Unix,
        Subject::RawTcp,
        Subject::RawUdp,
    ];

    /// The name used on the command line and in the output.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Subject::Tcp => "tcp",
            Subject::Unix => "unix",
            Subject::RawTcp => "raw-tcp",
            Subject::RawUdp => "raw-udp",
        }
    }

    /// The subject called `name`, if any.
    pub(crate) fn parse(name: &str) -> Option<Subject> {
        Subject::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether this subject has an implementation of `workload` (raw UDP has no
    /// pipelining and no fragmentation, so only the latency workload).
    pub(crate) fn supports(self, workload: Workload) -> bool {
        self != Subject::RawUdp || workload == Workload::Latency
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A server's accept-and-echo loop; it runs until dropped. Not `Send`: it stays on
/// the server thread.
pub(crate) type ServeFuture = Pin<Box<dyn Future<Output = io::Result<()>>>>;

/// Binds a server for `subject` on loopback and returns its address (a URI for the
/// framework, `host:port` for the baselines) and the future that serves it.
pub(crate) async fn start_server(subject: Subject) -> io::Result<(String, ServeFuture)> {
    match subject {
        Subject::Tcp => framework::serve("tcp://127.0.0.1:0").await,
        Subject::Unix => framework::serve(&framework::unix_socket_uri()).await,
        Subject::RawTcp => raw_tcp::serve().await,
        Subject::RawUdp => raw_udp::serve().await,
    }
}

/// The client side of one subject: sends `payload`, waits for its echo, checks it.
pub(crate) trait Caller {
    /// One echo call.
    async fn call(&mut self, payload: &Bytes) -> io::Result<()>;
}

/// The error for an echo whose length differs from the request's.
pub(crate) fn wrong_length(expected: usize, got: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("echo of {expected} bytes came back with {got}"),
    )
}
