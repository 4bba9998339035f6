//! UDP transport: one frame per datagram, larger frames fragmented, one server socket
//! for every client.
//!
//! Addresses are `udp://host:port`. The same generated clients and servers work over
//! it unchanged: [`connect`] gives a [`Channel`], [`bind`] a listener for
//! [`Server::serve`](rpc_core::server::Server::serve).
//!
//! # What UDP gives you
//!
//! - **Small frames** (up to [`UdpConfig::max_datagram`](UdpConfig#structfield.max_datagram), 1200 bytes by default) go
//!   out as one datagram, once. The network may lose, copy or reorder them. The
//!   client's channel retransmits a request that gets no answer (same id, same call
//!   key; see [`ChannelBuilder::retransmission`](rpc_core::client::ChannelBuilder::retransmission)),
//!   gives call keys to methods that are not safe to repeat, and the server's duplicate
//!   cache runs those at most once. A repeat of a request still running is dropped.
//! - **Large frames** are fragmented and delivered reliably by the link: the receiver
//!   acknowledges fragments (a cumulative count and a bitmap), the sender re-sends
//!   only the ones lost, with at most a window of fragments in flight. A response to a
//!   request that came fragmented is sent reliably too.
//! - **Limits**: reassembly memory per peer, per source address and per listener, a
//!   reassembly timeout, a maximum message length (a fragment claiming more is
//!   refused, and a refused request is answered `RESOURCE_EXHAUSTED`), a bound on
//!   peers and on the datagrams queued for each. Malformed datagrams are dropped and counted in [`UdpStats`].
//! - **A server that is not there**: the client's socket is connected, so an ICMP
//!   port-unreachable fails the calls with `UNAVAILABLE` at once instead of at their
//!   deadline.
//! - **Streams, bulk transfers and GOAWAY**: every frame of a streaming call (its
//!   REQUEST, DATA, WINDOW, and its RESPONSE or CANCEL), BULK and BULK_REPLY, and every
//!   GOAWAY go as acknowledged messages even when they fit one datagram: never lost or
//!   copied, and handed over in the order sent. So does the client's keepalive PING
//!   while no message of its own is on its way: a server that forgot the association
//!   answers it with GOAWAY instead of a PONG (`docs/wire.md`, 2.9). That GOAWAY, the
//!   listener's to an address it has no association for and the only one sent whole,
//!   ends the client's association as a lost connection: the server may have run the
//!   calls in flight before it forgot them, so they fail as possibly run, not as
//!   unprocessed.
//! - **Best effort**: a unary call's CANCEL (a lost one lets the handler run to
//!   completion; the CANCEL of a request that went fragmented goes as a message after
//!   it, so it cannot overtake the request), PING (the server's, and the client's
//!   while messages of its own are on their way) and PONG. One of these sent as a
//!   message that the peer refuses or gives up ends alone, never the association.
//!   A call cancelled before the handshake ends is never sent. There is **no ordering**
//!   between whole frames. Give
//!   calls a deadline: a request to a host that has vanished silently is retransmitted
//!   until it expires.
//!
//! The datagram formats are in `docs/wire.md` ("UDP").
//!
//! # Layout
//!
//! - `datagram`: encoding and decoding of the four datagram types (whole frame,
//!   fragment, acknowledgement, control).
//! - `engine`: the protocol of one association without I/O (fragmentation,
//!   acknowledgements, loss detection, reassembly and its limits).
//! - [`UdpLink`]: the engine over a connected socket (client) or over one peer of a
//!   listener's socket (server).
//! - [`UdpListener`]: the shared socket and the task that routes datagrams by source
//!   address to peers, opening an association only for an address that has passed the
//!   handshake (`validate`: stateless tokens); each peer then gets its own connected
//!   socket on the same port ([`UdpConfig::peer_sockets`]). [`UdpConnector`] opens
//!   client links, each starting with the handshake.
//! - `socket`: binding and the per-peer sockets; `batch`: `recvmmsg`/`sendmmsg`, many
//!   datagrams per system call, with UDP segmentation offload (GSO, GRO) on Linux.
//!
//! # Example
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! let listener = rpc_transport_udp::bind("udp://127.0.0.1:0").await?;
//! let addr = listener.local_addr_uri();
//! // Server::builder().add_service(..).serve(listener) in a task, then:
//! let channel = rpc_transport_udp::connect(&addr).await?;
//! # drop(channel); Ok(()) }
//! ```

mod batch;
mod config;
pub mod datagram;
mod engine;
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
mod link;
mod listener;
mod socket;
mod validate;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use rpc_core::{
    client::Channel,
    endpoint::{Endpoint, Scheme},
    link::{Connector, LinkConfig},
    Error, ErrorKind,
};

pub use config::{UdpConfig, UdpStats, DEFAULT_MAX_DATAGRAM, DEFAULT_SOCKET_BUFFER};
pub use link::UdpLink;
pub use listener::UdpListener;

/// Parses a `udp://host:port` URI into its host and port.
fn parse(uri: &str) -> Result<(String, u16), Error> {
    match uri.parse::<Endpoint>()? {
        Endpoint::Host {
            scheme: Scheme::Udp,
            host,
            port,
        } => Ok((host, port)),
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{other} is not a udp:// address"),
        )),
    }
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, Error> {
    Ok(resolve_all(host, port).await?[0])
}

/// Every address of `host`, in the resolver's order of preference; at least one.
async fn resolve_all(host: &str, port: u16) -> Result<Vec<SocketAddr>, Error> {
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
        .await
        .map_err(|e| Error::io(format!("resolve udp://{host}:{port}"), e))?
        .collect();
    if addresses.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("udp://{host}:{port}: the name has no address"),
        ));
    }
    Ok(addresses)
}

/// Which of a name's addresses a connector uses: the one it used last, unless that
/// link ended without hearing from the peer, then the next in the resolver's order.
#[derive(Debug, Default)]
struct Choice {
    /// The address of the last link made, and whether it heard from its peer.
    last: Option<(SocketAddr, Arc<link::Reach>)>,
}

impl Choice {
    /// The address to try first among `peers` (never empty).
    fn first(&self, peers: &[SocketAddr]) -> usize {
        let Some((last, reached)) = &self.last else {
            return 0;
        };
        match peers.iter().position(|p| p == last) {
            // Links made while the last one is new (a pool's) go to the same address.
            Some(at) if !reached.never() => at,
            Some(at) => (at + 1) % peers.len(),
            None => 0,
        }
    }
}

/// Opens UDP links to one server. Every link gets its own connected socket (a new
/// local port), so a reconnect is a new association for the server.
#[derive(Clone, Debug)]
pub struct UdpConnector {
    host: String,
    port: u16,
    config: Arc<UdpConfig>,
    stats: Arc<UdpStats>,
    /// Shared by clones: a name with several addresses (IPv6 and IPv4, say) is tried
    /// one address per connection, moving on from one that never answered.
    choice: Arc<Mutex<Choice>>,
}

impl UdpConnector {
    /// A connector for a `udp://host:port` URI with default settings.
    pub fn from_uri(uri: &str) -> Result<Self, Error> {
        Self::with_config(uri, UdpConfig::default())
    }

    /// A connector for a `udp://host:port` URI.
    pub fn with_config(uri: &str, config: UdpConfig) -> Result<Self, Error> {
        let (host, port) = parse(uri)?;
        Ok(UdpConnector {
            host,
            port,
            config: Arc::new(config),
            stats: Arc::default(),
            choice: Arc::default(),
        })
    }

    /// What the links of this connector did (shared by its clones).
    pub fn stats(&self) -> &Arc<UdpStats> {
        &self.stats
    }
}

impl Connector for UdpConnector {
    type Link = UdpLink;

    /// Connects to one of the name's addresses: the one that answered last time, or,
    /// if the last link never heard from its peer (nothing listens there, or the
    /// address is unreachable), the next one. A TCP connect learns that during the
    /// connect; over UDP the association learns it, so a name whose first address is
    /// dead costs one failed link, not every link.
    async fn connect(&self, config: &LinkConfig) -> Result<UdpLink, Error> {
        let peers = resolve_all(&self.host, self.port).await?;
        self.connect_among(&peers, config)
    }

    fn target(&self) -> String {
        format!("udp://{}:{}", self.host, self.port)
    }
}

impl UdpConnector {
    /// A link to one of `peers` (a name's addresses; see `connect`).
    fn connect_among(&self, peers: &[SocketAddr], config: &LinkConfig) -> Result<UdpLink, Error> {
        let mut choice = self.choice.lock().unwrap_or_else(|e| e.into_inner());
        let first = choice.first(peers);
        let mut failed = None;
        // An address whose socket cannot even be connected (no route to it, no IPv6
        // on this host) is passed over at once for the next.
        for peer in peers.iter().cycle().skip(first).take(peers.len()) {
            match socket::connect(*peer, &self.config) {
                Ok(socket) => {
                    let reached = Arc::<link::Reach>::default();
                    choice.last = Some((*peer, reached.clone()));
                    let engine = engine::Engine::client(
                        self.config.clone(),
                        self.stats.clone(),
                        config.max_frame_len,
                    );
                    return Ok(UdpLink::connected(engine, socket, self.stats.clone())
                        .reporting_reach(reached));
                }
                Err(err) => {
                    tracing::debug!(%peer, %err, "UDP address passed over");
                    failed = Some(err);
                }
            }
        }
        Err(failed.expect("at least one address"))
    }
}

/// Binds a listener to a `udp://host:port` URI with default settings.
pub async fn bind(uri: &str) -> Result<UdpListener, Error> {
    bind_with(uri, UdpConfig::default()).await
}

/// Binds a listener to a `udp://host:port` URI.
pub async fn bind_with(uri: &str, config: UdpConfig) -> Result<UdpListener, Error> {
    let (host, port) = parse(uri)?;
    UdpListener::bind(resolve(&host, port).await?, config).await
}

/// Connects a [`Channel`] to a `udp://` URI with default settings. Nothing is sent:
/// the first call opens the association (the handshake) and finds out whether a
/// server is there.
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    Channel::builder()
        .connect(UdpConnector::from_uri(uri)?)
        .await
}

/// A [`Channel`] to `uri` that opens its socket on the first call.
pub fn connect_lazy(uri: &str) -> Result<Channel, Error> {
    Ok(Channel::builder().connect_lazy(UdpConnector::from_uri(uri)?))
}

/// Makes channels to `udp://` replicas for a
/// [`Balanced`](rpc_core::balance::Balanced) client.
#[derive(Clone, Debug, Default)]
pub struct UdpChannels {
    builder: rpc_core::client::ChannelBuilder,
    config: UdpConfig,
}

impl UdpChannels {
    /// Channels built with `builder`'s and `config`'s settings.
    pub fn new(builder: rpc_core::client::ChannelBuilder, config: UdpConfig) -> Self {
        UdpChannels { builder, config }
    }
}

impl rpc_core::balance::MakeChannel for UdpChannels {
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error> {
        let connector = UdpConnector::with_config(&endpoint.to_string(), self.config.clone())?;
        Ok(self.builder.clone().connect_lazy(connector))
    }
}

#[cfg(test)]
mod tests {
    use rpc_core::{
        client::{Channel, ClientCall},
        server::{Server, ServerCall, ServerReply},
        Status,
    };
    use tower::{Service, ServiceExt};

    use super::*;

    /// A connector to fixed addresses, as if a name resolved to them.
    #[derive(Clone)]
    struct Resolved(UdpConnector, Vec<SocketAddr>);

    impl Connector for Resolved {
        type Link = UdpLink;

        async fn connect(&self, config: &LinkConfig) -> Result<UdpLink, Error> {
            self.0.connect_among(&self.1, config)
        }

        fn target(&self) -> String {
            self.0.target()
        }
    }

    /// A name whose first address has nothing behind it (an IPv6 address of a host
    /// that serves IPv4 only, say) costs one failed link: the next connection goes
    /// to the next address, and stays there. (A multi-host round: `udp://name` used
    /// the first address only, so every call failed.)
    #[tokio::test]
    async fn a_name_whose_first_address_is_dead_is_served_by_the_next() {
        let listener = bind("udp://127.0.0.1:0").await.unwrap();
        let live: SocketAddr = listener.local_socket_addr();
        let echo = tower::service_fn(|call: ServerCall| async move {
            Ok::<_, Status>(ServerReply {
                payload: call.payload.into(),
                ..ServerReply::default()
            })
        });
        let server = Server::builder().add_named_service("t.E", echo).build();
        tokio::spawn(async move { server.serve(listener).await });
        // A port nothing listens on: the kernel refuses datagrams to it.
        let dead = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let connector = UdpConnector::from_uri(&format!("udp://{live}")).unwrap();
        let mut channel = Channel::builder().connect_lazy(Resolved(connector, vec![dead, live]));
        let call = || ClientCall {
            method: "t.E/Say".into(),
            idempotency: Default::default(),
            metadata: Default::default(),
            timeout: Some(std::time::Duration::from_secs(5)),
            call_key: None,
            payload: "hi".into(),
            stream: None,
            compress: None,
        };
        let mut answered = 0;
        let mut failed = 0;
        for _ in 0..20 {
            match channel.ready().await.unwrap().call(call()).await {
                Ok(reply) => {
                    assert_eq!(reply.payload, "hi");
                    answered += 1;
                }
                Err(status) => {
                    assert!(status.message().contains("refused"), "{status}");
                    failed += 1;
                }
            }
        }
        assert!(failed <= 2, "{failed} calls failed");
        assert_eq!(answered + failed, 20);
    }

    /// Links made while the last one has not been heard from yet (a pool's, all at
    /// once) go to the same address; only a link that ended unheard moves the
    /// connector on.
    #[tokio::test]
    async fn only_a_link_that_ended_unheard_moves_to_the_next_address() {
        let a: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:9".parse().unwrap();
        let connector = UdpConnector::from_uri("udp://127.0.0.1:9").unwrap();
        let config = LinkConfig::default();
        let peer = |link: &UdpLink| format!("{link:?}");
        let first = connector.connect_among(&[a, b], &config).unwrap();
        let second = connector.connect_among(&[a, b], &config).unwrap();
        assert!(peer(&first).contains("127.0.0.1:9"), "{first:?}");
        assert!(peer(&second).contains("127.0.0.1:9"), "{second:?}");
        drop(first);
        // `second` is the one the connector watches: still pending.
        let third = connector.connect_among(&[a, b], &config).unwrap();
        assert!(peer(&third).contains("127.0.0.1:9"), "{third:?}");
        drop(second);
        drop(third);
        let fourth = connector.connect_among(&[a, b], &config).unwrap();
        assert!(peer(&fourth).contains("127.0.0.2:9"), "{fourth:?}");
    }

    /// An address whose socket cannot even be connected is passed over in the same
    /// connect, and is not where the next links go. (From a review: the connector
    /// stayed on such an address for good, since no link was made to report it.)
    #[tokio::test]
    async fn an_address_that_cannot_be_connected_is_passed_over_at_once() {
        // Broadcast, without SO_BROADCAST: the kernel refuses the connect (EACCES).
        let refused: SocketAddr = "255.255.255.255:9".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:9".parse().unwrap();
        let connector = UdpConnector::from_uri("udp://127.0.0.1:9").unwrap();
        let config = LinkConfig::default();
        for _ in 0..3 {
            let link = connector.connect_among(&[refused, b], &config).unwrap();
            assert!(format!("{link:?}").contains("127.0.0.2:9"), "{link:?}");
        }
        let err = connector.connect_among(&[refused], &config).unwrap_err();
        assert!(err.to_string().contains("255.255.255.255"), "{err}");
    }
}
