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
//! - [`serve`]: serves a [`Server`] on a listener bound by URI.
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

/// Binds a listener to `uri` by its scheme (`tcp://`, `unix://`, `udp://`, `rdma://`,
/// `rdma+unix://`; RDMA with the soft provider, which needs no hardware) and returns
/// the bound URI (`tcp://host:0` becomes the port picked) with `server` serving the
/// listener until `shutdown` completes, for the caller to spawn.
pub async fn serve(
    server: &Server,
    uri: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(String, Serving), Error> {
    let server = server.clone();
    Ok(match scheme(uri) {
        "udp" => {
            let listener = rpc_transport_udp::bind(uri).await?;
            let bound = listener.local_addr_uri();
            let serving = async move { server.serve_with_shutdown(listener, shutdown).await };
            (bound, Box::pin(serving))
        }
        "rdma" | "rdma+unix" => {
            let listener = rpc_transport_rdma::bind(uri).await?;
            let bound = listener.local_addr_uri();
            let serving = async move { server.serve_with_shutdown(listener, shutdown).await };
            (bound, Box::pin(serving))
        }
        "tcp" | "unix" => {
            let listener = rpc_transport_tcp::bind(uri).await?;
            let bound = listener.local_addr_uri();
            let serving = async move { server.serve_with_shutdown(listener, shutdown).await };
            (bound, Box::pin(serving))
        }
        other => {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                format!(
                    "{uri}: cannot listen on scheme {other:?} (tcp, unix, udp, rdma, rdma+unix)"
                ),
            ))
        }
    })
}
