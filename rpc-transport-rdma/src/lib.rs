//! RDMA transport: messages sent into receive buffers posted in advance, with credits;
//! large messages pulled by the receiver with one-sided reads.
//!
//! Addresses are `rdma://host:port` (the connection is set up over TCP, as
//! async-rdma and RDMA CM do) and, for the soft provider on one host,
//! `rdma+unix:///path` (a Unix socket). The same generated clients and servers work
//! over it unchanged: [`connect`] gives a [`Channel`], [`bind`] a listener for
//! [`Server::serve`](rpc_core::server::Server::serve).
//!
//! # Providers
//!
//! One internal interface ([`provider::Endpoint`]: register memory and get a remote
//! key; send a message; receive into pre-posted buffers; one-sided read and write of
//! a remote region; completions matched by id) has two implementations:
//!
//! - [`soft`] (always built, used by [`bind`] and [`connect`]): RDMA semantics on any
//!   Linux machine. Messages travel over the socket; one-sided reads and writes
//!   between processes on one host are real copies of the peer's registered memory by
//!   cross-memory attach (`process_vm_readv`/`writev`), checked against the peer's
//!   region table (key, bounds, rights, revocation) and run without any code of the
//!   peer process; across hosts a responder task inside the peer's transport (never
//!   its application) serves them.
//! - `verbs` (cargo feature `verbs`, off by default): real RDMA hardware through
//!   [async-rdma](https://crates.io/crates/async-rdma) 0.5. **async-rdma is licensed
//!   GPL-3.0**: enabling the feature links GPL code into your program. It needs
//!   `libibverbs`, `librdmacm` and libclang to build, and an RDMA device (or
//!   Soft-RoCE) to run; without one, connecting fails at once with "no RDMA device".
//!
//! # The link
//!
//! [`RdmaLink`] moves the core's frames: frames up to the eager threshold are copied
//! into a pooled send buffer and land in one of the peer's receive buffers, those
//! queued between two flushes packed together into one message (BATCH) when both
//! sides announce it; credits (one per posted buffer, given back piggybacked on
//! traffic or in a CREDIT message) mean no message is ever sent into a missing buffer,
//! and a core that stops reading stops its peer after `recv_buffers` messages. Longer frames go by rendezvous: the
//! sender exposes the payload (without a copy on the soft provider), the receiver
//! checks the announced length against `max_frame_len`, pulls it with one-sided
//! reads, and answers FIN, which releases the sender's regions. The link is reliable
//! and ordered. The message formats are in [`wire`] and `docs/rdma.md`.
//!
//! # Bulk transfers
//!
//! The core's bulk-transfer API ([`rpc_core::bulk`]) is one-sided over these links:
//! [`RdmaLink`] hands the core (`Link::one_sided`) an adapter that exposes buffers as
//! registered regions (the descriptor carries the 32-byte [`provider::RegionDesc`])
//! and reads and writes the peer's with one-sided operations, run by the task that
//! asks through the endpoint's [`provider::Handle`]. The exposing side's application
//! and its core connection task run no code for them; no BULK frame crosses the
//! link. A refused access ([`provider::Refusal`]) gets the status it gets over TCP.
//! [`RdmaConfig::bulk_one_sided`] turns it off.
//!
//! # Layout
//!
//! - [`provider`]: the interface; [`soft`]: the software provider (`soft::packet`
//!   its stream packets, `soft::table` the shared region table, `soft::driver` its
//!   connection task and responder, `soft::sys` the system calls).
//! - `bulk`: the core's bulk transfers as one-sided operations (`OneSided`).
//! - `credit`: credit accounting, without I/O; [`wire`]: the link's messages.
//! - [`RdmaLink`]: the link over any endpoint; [`RdmaConnector`] /
//!   [`RdmaListener`]: open and accept soft-provider links; [`RdmaConfig`]: every
//!   limit.
//!
//! # Example
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! let listener = rpc_transport_rdma::bind("rdma://127.0.0.1:0").await?;
//! let addr = listener.local_addr_uri();
//! // Server::builder().add_service(..).serve(listener) in a task, then:
//! let channel = rpc_transport_rdma::connect(&addr).await?;
//! # drop(channel); Ok(()) }
//! ```

mod address;
mod bulk;
mod config;
mod credit;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
mod link;
pub mod provider;
pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;
pub mod wire;

use rpc_core::{
    client::Channel,
    link::{Connector, LinkConfig, Listener},
    Endpoint as Uri, Error,
};

pub use address::Address;
pub use config::{
    RdmaConfig, DEFAULT_RECV_BUFFERS, DEFAULT_RECV_BUFFER_LEN, MAX_RECV_BUFFERS,
    MAX_RECV_BUFFER_LEN, MIN_RECV_BUFFER_LEN,
};
pub use link::{LinkStats, LinkTotals, RdmaLink};
use soft::{SoftEndpoint, SoftListener};

/// Opens soft-provider links to one `rdma://` or `rdma+unix://` address.
#[derive(Clone, Debug)]
pub struct RdmaConnector {
    address: Address,
    config: RdmaConfig,
}

impl RdmaConnector {
    /// A connector for `address`.
    pub fn new(address: Address, config: RdmaConfig) -> Self {
        RdmaConnector { address, config }
    }

    /// A connector for a URI with default settings.
    pub fn from_uri(uri: &str) -> Result<Self, Error> {
        Self::with_config(uri, RdmaConfig::default())
    }

    /// A connector for a URI.
    pub fn with_config(uri: &str, config: RdmaConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(RdmaConnector::new(uri.parse()?, config))
    }
}

impl Connector for RdmaConnector {
    type Link = RdmaLink<SoftEndpoint>;

    async fn connect(&self, config: &LinkConfig) -> Result<Self::Link, Error> {
        let ep = soft::connect(&self.address, &self.config).await?;
        RdmaLink::new(ep, &self.config, config.max_frame_len)
    }

    fn target(&self) -> String {
        self.address.to_string()
    }
}

/// Accepts soft-provider links. Each connection is set up (a short handshake)
/// before `accept` returns it, within `handshake_timeout`.
#[derive(Debug)]
pub struct RdmaListener {
    inner: SoftListener,
    config: RdmaConfig,
    links: LinkTotals,
}

impl RdmaListener {
    /// Binds to `address`. Port 0 picks a free port; [`local_addr_uri`] tells which.
    ///
    /// [`local_addr_uri`]: RdmaListener::local_addr_uri
    pub async fn bind(address: &Address, config: RdmaConfig) -> Result<Self, Error> {
        let inner = SoftListener::bind(address, config.clone()).await?;
        Ok(RdmaListener {
            inner,
            config,
            links: LinkTotals::default(),
        })
    }

    /// The bound address as a URI (`rdma://127.0.0.1:41234`), ready for a client.
    pub fn local_addr_uri(&self) -> String {
        self.inner.address().to_string()
    }

    /// What the links this listener accepted did, summed (eager and rendezvous
    /// frames, waits for credit, bulk transfers): a handle to keep before the listener
    /// moves into a server.
    pub fn link_stats(&self) -> LinkTotals {
        self.links.clone()
    }
}

/// A connection whose setup failed (a peer that sent another protocol's bytes, a
/// provider HELLO of another version, or left): logged at INFO within the bound of
/// refusals, as the server logs the refusals of connections it serves
/// (docs/observability.md), and past it at DEBUG; the listener goes on. Such a
/// connection never reaches the server, so it is not in
/// `rpc_server_refused_connections_total`.
pub(crate) fn setup_refused(peer: Option<&dyn std::fmt::Display>, err: &Error) {
    static REFUSALS: rpc_core::logs::LogLimiter = rpc_core::logs::LogLimiter::for_refusals();
    let peer = peer.map(|peer| peer.to_string()).unwrap_or_default();
    match REFUSALS.allow() {
        Some(suppressed) => {
            tracing::info!(%peer, cause = %err, suppressed, "RDMA connection refused during its setup")
        }
        None => tracing::debug!(%peer, cause = %err, "RDMA connection refused during its setup"),
    }
}

impl Listener for RdmaListener {
    type Link = RdmaLink<SoftEndpoint>;

    async fn accept(&mut self, config: &LinkConfig) -> Result<Self::Link, Error> {
        loop {
            let ep = self.inner.accept().await?;
            match RdmaLink::new(ep, &self.config, config.max_frame_len) {
                Ok(link) => {
                    self.links.track(link.stats().clone());
                    return Ok(link);
                }
                // The connection failed right after its setup (a peer that sent garbage
                // or left): its error is not the listener's, whose `Closed` would stop
                // a server.
                Err(err) => setup_refused(None, &err),
            }
        }
    }

    fn local_addr(&self) -> String {
        self.local_addr_uri()
    }
}

/// Makes channels to `rdma://` replicas for a
/// [`Balanced`](rpc_core::balance::Balanced) client; each connects on its first call.
#[derive(Clone, Debug, Default)]
pub struct RdmaChannels {
    builder: rpc_core::client::ChannelBuilder,
    config: RdmaConfig,
}

impl RdmaChannels {
    /// Channels built with `builder`'s and `config`'s settings.
    pub fn new(builder: rpc_core::client::ChannelBuilder, config: RdmaConfig) -> Self {
        RdmaChannels { builder, config }
    }
}

impl rpc_core::balance::MakeChannel for RdmaChannels {
    fn make_channel(&self, endpoint: &Uri) -> Result<Channel, Error> {
        let connector = RdmaConnector::new(Address::try_from(endpoint)?, self.config.clone());
        Ok(self.builder.clone().connect_lazy(connector))
    }
}

/// Binds a listener to an `rdma://` or `rdma+unix://` URI with default settings.
pub async fn bind(uri: &str) -> Result<RdmaListener, Error> {
    RdmaListener::bind(&uri.parse()?, RdmaConfig::default()).await
}

/// Connects a [`Channel`] to an `rdma://` or `rdma+unix://` URI with default
/// settings. For other settings use [`Channel::builder()`] with an
/// [`RdmaConnector`].
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    Channel::builder()
        .connect(RdmaConnector::from_uri(uri)?)
        .await
}

/// A [`Channel`] to `uri` that connects on its first call.
pub fn connect_lazy(uri: &str) -> Result<Channel, Error> {
    Ok(Channel::builder().connect_lazy(RdmaConnector::from_uri(uri)?))
}
