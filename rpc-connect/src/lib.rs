//! One-line connect and serve by URI, across every transport and discovery scheme:
//! the crate that knows them all, so that `rpc-core` and the transports need not
//! know each other.
//!
//! - [`connect`]: a [`Channel`] to one server: `tcp://`, `unix://`, `udp://`,
//!   `rdma://`, `rdma+unix://`.
//! - [`balanced`]: a [`Balanced`] client over a service's replicas, from any URI:
//!   one address, `static://a,b,c`, `dns://name:port` (A/AAAA) or `dns://name`
//!   (SRV), each re-resolved as `rpc-discovery-dns` does and looked up again at once
//!   when a replica fails. `etcd://` needs `rpc-discovery-etcd` (it builds with
//!   `protoc`, so it is not linked here): see `docs/deploy.md`.
//! - [`serve`]: serves a [`Server`] on a listener bound by URI ([`AnyListener`] when
//!   the bound address is needed before serving).
//!
//! Settings are the defaults of each transport; for others, build the transport's
//! connector or listener directly.
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
//!
//! let mut echo = EchoClient::new(rpc_connect::connect("udp://127.0.0.1:7000").await?);
//! let mut kv = EchoClient::new(rpc_connect::balanced("dns://_echo._tcp.example.com").await?);
//! # let _ = (echo.say(SayRequest::default()).await, kv.say(SayRequest::default()).await);
//! # Ok(()) }
//! ```

use std::{future::Future, pin::Pin};

use rpc_core::{
    balance::{Balanced, MakeChannel},
    client::Channel,
    endpoint::{Endpoint, Scheme},
    server::Server,
    Error, ErrorKind,
};

/// A channel to the one server at `uri`, by its scheme, with default settings. The
/// channel connects now (for UDP: opens its socket; nothing is sent).
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    match scheme(uri) {
        "tcp" | "unix" => rpc_transport_tcp::connect(uri).await,
        "udp" => rpc_transport_udp::connect(uri).await,
        "rdma" | "rdma+unix" => rpc_transport_rdma::connect(uri).await,
        "static" | "dns" | "dns+udp" | "etcd" => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{uri} names a service, not one server: use rpc_connect::balanced"),
        )),
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{uri}: unknown scheme {other:?} (tcp, unix, udp, rdma, rdma+unix; or a \
                 service name for balanced: static, dns, dns+udp)"
            ),
        )),
    }
}

fn scheme(uri: &str) -> &str {
    uri.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// Makes a channel to each replica by its scheme (`tcp`, `unix`, `udp`, `rdma`), with
/// the transports' default settings; for [`Balanced`].
#[derive(Clone, Debug, Default)]
pub struct AnyChannels {
    tcp: rpc_transport_tcp::StreamChannels,
    udp: rpc_transport_udp::UdpChannels,
    rdma: rpc_transport_rdma::RdmaChannels,
}

impl MakeChannel for AnyChannels {
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error> {
        match endpoint {
            Endpoint::Host {
                scheme: Scheme::Udp,
                ..
            } => self.udp.make_channel(endpoint),
            Endpoint::Host {
                scheme: Scheme::Rdma,
                ..
            } => self.rdma.make_channel(endpoint),
            _ => self.tcp.make_channel(endpoint),
        }
    }
}

/// A balanced client over the servers `uri` names (see the [crate docs](crate)):
/// calls go to the less loaded of two replicas, failing replicas are left out for a
/// while, and with `dns://` the set follows discovery (a task on the current Tokio
/// runtime).
pub async fn balanced(uri: &str) -> Result<Balanced, Error> {
    let endpoint: Endpoint = uri.parse()?;
    match &endpoint {
        Endpoint::Host { .. } | Endpoint::Unix(_) => {
            Balanced::from_endpoints(AnyChannels::default(), [endpoint])
        }
        Endpoint::Static(members) => {
            Balanced::from_endpoints(AnyChannels::default(), members.iter().cloned())
        }
        Endpoint::Dns { .. } => {
            use futures::StreamExt;
            let balanced = Balanced::new(AnyChannels::default());
            let resolver = rpc_discovery_dns::DnsResolver::new(Default::default())?;
            let (mut changes, refresh) = resolver.resolve(&endpoint)?;
            // Wait (a little) for the first answer, so that the first call has a
            // replica; the rest follows in the background.
            if let Ok(Some(first)) = tokio::time::timeout(FIRST_LOOKUP, changes.next()).await {
                balanced.apply(first)?;
                // The rest of that answer is ready too.
                while let Some(Some(change)) = futures::FutureExt::now_or_never(changes.next()) {
                    balanced.apply(change)?;
                }
            }
            // Look again at once when a replica fails, not only at the next interval.
            balanced.on_ejection(move |_| refresh.refresh());
            tokio::spawn(balanced.follow(changes));
            Ok(balanced)
        }
        Endpoint::Etcd { .. } => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{uri}: follow etcd with rpc_discovery_etcd::resolve and Balanced::follow \
                 (that crate needs protoc to build, so it is not linked here)"
            ),
        )),
    }
}

/// How long [`balanced`] waits for the first DNS answer before returning (the client
/// then fails fast with `UNAVAILABLE` until one comes).
pub const FIRST_LOOKUP: std::time::Duration = std::time::Duration::from_secs(5);

/// A server's serving of one listener, until its shutdown signal.
pub type Serving = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// A listener of any transport, bound by URI scheme with the transport's default
/// settings: for servers that must know their bound addresses before they serve (to
/// advertise them, for instance). [`serve`] is bind-then-serve in one call.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per listening socket, made once
pub enum AnyListener {
    /// `tcp://` or `unix://`.
    Stream(rpc_transport_tcp::StreamListener),
    /// `udp://`.
    Udp(rpc_transport_udp::UdpListener),
    /// `rdma://` or `rdma+unix://`, with the soft provider (no hardware needed).
    Rdma(rpc_transport_rdma::RdmaListener),
}

impl AnyListener {
    /// Binds `uri` (`tcp://`, `unix://`, `udp://`, `rdma://`, `rdma+unix://`).
    pub async fn bind(uri: &str) -> Result<AnyListener, Error> {
        Ok(match scheme(uri) {
            "udp" => AnyListener::Udp(rpc_transport_udp::bind(uri).await?),
            "rdma" | "rdma+unix" => AnyListener::Rdma(rpc_transport_rdma::bind(uri).await?),
            "tcp" | "unix" => AnyListener::Stream(rpc_transport_tcp::bind(uri).await?),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidAddress,
                    format!(
                        "{uri}: cannot listen on scheme {other:?} (tcp, unix, udp, rdma, \
                         rdma+unix)"
                    ),
                ))
            }
        })
    }

    /// The bound address as a URI (`tcp://host:0` becomes the port picked).
    pub fn local_addr_uri(&self) -> String {
        match self {
            AnyListener::Stream(l) => l.local_addr_uri(),
            AnyListener::Udp(l) => l.local_addr_uri(),
            AnyListener::Rdma(l) => l.local_addr_uri(),
        }
    }

    /// `server` serving this listener until `shutdown` completes, for the caller to
    /// spawn.
    pub fn serve(
        self,
        server: &Server,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Serving {
        let server = server.clone();
        Box::pin(async move {
            match self {
                AnyListener::Stream(l) => server.serve_with_shutdown(l, shutdown).await,
                AnyListener::Udp(l) => server.serve_with_shutdown(l, shutdown).await,
                AnyListener::Rdma(l) => server.serve_with_shutdown(l, shutdown).await,
            }
        })
    }
}

/// Binds a listener to `uri` by its scheme (`tcp://`, `unix://`, `udp://`, `rdma://`,
/// `rdma+unix://`; RDMA with the soft provider, which needs no hardware) and returns
/// the bound URI (`tcp://host:0` becomes the port picked) with `server` serving the
/// listener until `shutdown` completes, for the caller to spawn.
pub async fn serve(
    server: &Server,
    uri: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(String, Serving), Error> {
    let listener = AnyListener::bind(uri).await?;
    Ok((listener.local_addr_uri(), listener.serve(server, shutdown)))
}
