//! Fault-injecting proxies for tests, on loopback.
//!
//! - [`TcpProxy`]: forwards TCP connections to an upstream address and can delay data,
//!   cut a connection after N bytes in either direction, cut it after the request
//!   reached the server but before the first byte of the response came back, or reset
//!   it instead of closing.
//! - [`UdpProxy`]: forwards datagrams to an upstream address and drops, duplicates,
//!   reorders and delays them from a seeded random generator, counting what it did.
//!
//! Each proxy runs in a task owned by the proxy value: dropping it stops the proxy.
//! Faults can be changed while it runs.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use fault_proxy::{TcpFaults, TcpProxy};
//! let upstream: std::net::SocketAddr = "127.0.0.1:7000".parse().unwrap();
//! let proxy = TcpProxy::start(upstream, TcpFaults {
//!     cut_before_response: true,
//!     faulty_connections: Some(1), // only the first connection is cut
//!     ..TcpFaults::default()
//! }).await?;
//! // point the client at proxy.addr()
//! # Ok(()) }
//! ```

mod rng;
mod tcp;
mod udp;

pub use rng::Rng;
pub use tcp::{TcpCounters, TcpFaults, TcpProxy};
pub use udp::{UdpCounters, UdpFaults, UdpProxy};
