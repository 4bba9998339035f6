//! One-line connect and serve by URI, across every transport and discovery scheme:
//! the crate that knows them all, so that `rpc-core` and the transports need not
//! know each other.
//!
//! - [`connect`]: a [`Channel`] to one server: `tcp://`, `unix://`, `udp://`,
//!   `rdma://`, `rdma+unix://`, `grpc://` (gRPC's own wire, h2c), and with the `tls`
//!   feature `tls://`, `tls+unix://` and `grpcs://` (trusting the system's roots; [`connect_with`] and
//!   [`ConnectOptions`] for channel settings, CA files and client certificates).
//! - [`balanced`]: a [`Balanced`] client over a service's replicas, from any URI:
//!   one address, `static://a,b,c`, `dns://name:port` (A/AAAA) or `dns://name`
//!   (SRV; `dns+tls://` and `dns+grpcs://` for TLS replicas, whose certificates are
//!   checked for `name`), each re-resolved as `rpc-discovery-dns` does and looked up again at once
//!   when a replica fails. `etcd://` needs `rpc-discovery-etcd` (it builds with
//!   `protoc`, so it is not linked here): see `docs/deploy.md`.
//! - [`serve`]: serves a [`Server`] on a listener bound by URI ([`AnyListener`] when
//!   the bound address is needed before serving).
//!
//! [`connect`], [`balanced`] and [`AnyListener::bind`] use the transports' defaults;
//! [`connect_with`], [`balanced_with`] and [`AnyListener::bind_with`] take channel
//! settings and TLS; anything else, build the transport's connector or listener
//! directly.
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
    connect_with(uri, &ConnectOptions::default()).await
}

/// How [`connect_with`], [`balanced_with`] and [`AnyChannels`] make channels: the
/// channel settings, and the TLS settings for `tls://`, `tls+unix://` and `grpcs://`.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    channel: rpc_core::client::ChannelBuilder,
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ClientTls>,
}

impl ConnectOptions {
    /// The defaults: [`Channel::builder()`]'s settings, and for TLS the system's roots.
    pub fn new() -> Self {
        ConnectOptions::default()
    }

    /// The channel settings (timeouts, limits, compression, retransmission).
    /// Default: [`Channel::builder()`].
    pub fn channel(mut self, builder: rpc_core::client::ChannelBuilder) -> Self {
        self.channel = builder;
        self
    }

    /// TLS settings for `tls://`, `tls+unix://` and `grpcs://` (trusted CAs, client certificate,
    /// server name). Default: [`ClientTls::system`](rpc_transport_tcp::tls::ClientTls::system).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: rpc_transport_tcp::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    #[cfg(feature = "tls")]
    fn client_tls(&self) -> Result<rpc_transport_tcp::tls::ClientTls, Error> {
        match &self.tls {
            Some(tls) => Ok(tls.clone()),
            None => rpc_transport_tcp::tls::ClientTls::system(),
        }
    }
}

/// A channel to the one server at `uri`, by its scheme, made with `options`. The
/// channel connects now (for UDP: opens its socket; nothing is sent).
pub async fn connect_with(uri: &str, options: &ConnectOptions) -> Result<Channel, Error> {
    let builder = options.channel.clone();
    match scheme(uri) {
        "tcp" | "unix" => {
            builder
                .connect(rpc_transport_tcp::StreamConnector::from_uri(uri)?)
                .await
        }
        "udp" => {
            builder
                .connect(rpc_transport_udp::UdpConnector::from_uri(uri)?)
                .await
        }
        "rdma" | "rdma+unix" => {
            builder
                .connect(rpc_transport_rdma::RdmaConnector::from_uri(uri)?)
                .await
        }
        "grpc" => {
            builder
                .connect(rpc_transport_grpc::GrpcConnector::from_uri(uri)?)
                .await
        }
        #[cfg(feature = "tls")]
        "grpcs" => {
            let connector =
                rpc_transport_grpc::GrpcConnector::from_uri(uri)?.tls(options.client_tls()?);
            builder.connect(connector).await
        }
        #[cfg(not(feature = "tls"))]
        "grpcs" => Err(no_tls(uri)),
        #[cfg(feature = "tls")]
        "tls" | "tls+unix" => {
            let connector = rpc_transport_tcp::tls::TlsConnector::new(uri, options.client_tls()?)?;
            builder.connect(connector).await
        }
        #[cfg(not(feature = "tls"))]
        "tls" | "tls+unix" => Err(no_tls(uri)),
        "static" | "dns" | "dns+udp" | "dns+tls" | "dns+grpc" | "dns+grpcs" | "etcd" => {
            Err(Error::new(
            ErrorKind::InvalidAddress,
                format!("{uri} names a service, not one server: use rpc_connect::balanced"),
            ))
        }
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{uri}: unknown scheme {other:?} (tcp, tls, grpc, grpcs, unix, tls+unix, udp, \
                 rdma, rdma+unix; or a service name for balanced: static, dns, dns+udp, \
                 dns+tls, dns+grpc, dns+grpcs)"
            ),
        )),
    }
}

#[cfg(not(feature = "tls"))]
fn no_tls(uri: &str) -> Error {
    Error::new(
        ErrorKind::InvalidAddress,
        format!("{uri}: TLS is not built in (enable rpc-connect's `tls` feature)"),
    )
}

fn scheme(uri: &str) -> &str {
    uri.split_once("://").map_or("", |(scheme, _)| scheme)
}

/// Makes a channel to each replica by its scheme (`tcp`, `unix`, `udp`, `rdma`, `grpc`, and
/// with the `tls` feature `tls`, `tls+unix`); for [`Balanced`].
#[derive(Clone, Debug, Default)]
pub struct AnyChannels {
    tcp: rpc_transport_tcp::StreamChannels,
    udp: rpc_transport_udp::UdpChannels,
    rdma: rpc_transport_rdma::RdmaChannels,
    options: ConnectOptions,
}

impl AnyChannels {
    /// Channels made with `options` (channel settings, TLS).
    pub fn new(options: ConnectOptions) -> Self {
        let builder = options.channel.clone();
        AnyChannels {
            tcp: rpc_transport_tcp::StreamChannels::new(builder.clone()),
            udp: rpc_transport_udp::UdpChannels::new(builder.clone(), Default::default()),
            rdma: rpc_transport_rdma::RdmaChannels::new(builder, Default::default()),
            options,
        }
    }
}

impl MakeChannel for AnyChannels {
    fn make_channel(&self, endpoint: &Endpoint) -> Result<Channel, Error> {
        match endpoint {
            Endpoint::Host {
                scheme: Scheme::Tls,
                ..
            }
            | Endpoint::TlsUnix(_) => {
                #[cfg(feature = "tls")]
                {
                    let connector = rpc_transport_tcp::tls::TlsConnector::for_endpoint(
                        endpoint,
                        self.options.client_tls()?,
                    )?;
                    Ok(self.options.channel.clone().connect_lazy(connector))
                }
                #[cfg(not(feature = "tls"))]
                Err(no_tls(&endpoint.to_string()))
            }
            Endpoint::Host {
                scheme: Scheme::Udp,
                ..
            } => self.udp.make_channel(endpoint),
            Endpoint::Host {
                scheme: Scheme::Rdma,
                ..
            } => self.rdma.make_channel(endpoint),
            Endpoint::Host {
                scheme: Scheme::Grpc,
                ..
            } => {
                let address = rpc_transport_grpc::Address::try_from(endpoint)?;
                let connector = rpc_transport_grpc::GrpcConnector::new(address, Default::default());
                Ok(self.options.channel.clone().connect_lazy(connector))
            }
            Endpoint::Host {
                scheme: Scheme::Grpcs,
                ..
            } => {
                #[cfg(feature = "tls")]
                {
                    let address = rpc_transport_grpc::Address::try_from(endpoint)?;
                    let connector =
                        rpc_transport_grpc::GrpcConnector::new(address, Default::default())
                            .tls(self.options.client_tls()?);
                    Ok(self.options.channel.clone().connect_lazy(connector))
                }
                #[cfg(not(feature = "tls"))]
                Err(no_tls(&endpoint.to_string()))
            }
            _ => self.tcp.make_channel(endpoint),
        }
    }
}

/// A balanced client over the servers `uri` names (see the [crate docs](crate)):
/// calls go to the less loaded of two replicas, failing replicas are left out for a
/// while, and with `dns://` the set follows discovery (a task on the current Tokio
/// runtime).
pub async fn balanced(uri: &str) -> Result<Balanced, Error> {
    balanced_with(uri, &ConnectOptions::default()).await
}

/// [`balanced`], with channels made with `options`.
pub async fn balanced_with(uri: &str, options: &ConnectOptions) -> Result<Balanced, Error> {
    let endpoint: Endpoint = uri.parse()?;
    #[allow(unused_mut)]
    let mut options = options.clone();
    #[cfg(feature = "tls")]
    if let Endpoint::Dns {
        transport: Scheme::Tls | Scheme::Grpcs,
        name,
        ..
    } = &endpoint
    {
        // The replicas found are IP addresses; their certificates carry the name.
        options.tls = Some(options.client_tls()?.default_server_name(name));
    }
    let channels = AnyChannels::new(options);
    match &endpoint {
        Endpoint::Host { .. } | Endpoint::Unix(_) | Endpoint::TlsUnix(_) => {
            Balanced::from_endpoints(channels, [endpoint])
        }
        Endpoint::Static(members) => Balanced::from_endpoints(channels, members.iter().cloned()),
        Endpoint::Dns { .. } => {
            use futures::StreamExt;
            let balanced = Balanced::new(channels);
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
    /// `tls://` or `tls+unix://`.
    #[cfg(feature = "tls")]
    Tls(rpc_transport_tcp::tls::TlsListener),
    /// `grpc://`: gRPC's own wire (HTTP/2 with prior knowledge).
    Grpc(rpc_transport_grpc::GrpcListener),
}

/// How [`AnyListener::bind_with`] binds: the TLS settings for `tls://`,
/// `tls+unix://` and `grpcs://` (required for those schemes).
#[derive(Clone, Debug, Default)]
pub struct ListenOptions {
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ServerTls>,
}

impl ListenOptions {
    /// No TLS: `tls://` URIs are refused.
    pub fn new() -> Self {
        ListenOptions::default()
    }

    /// The certificate, key and client CAs for `tls://`, `tls+unix://` and `grpcs://` listeners.
    /// Default: none.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: rpc_transport_tcp::tls::ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }
}

impl AnyListener {
    /// Binds `uri` (`tcp://`, `unix://`, `udp://`, `rdma://`, `rdma+unix://`, `grpc://`; for
    /// `tls://`, `tls+unix://` and `grpcs://` see [`bind_with`](Self::bind_with)).
    pub async fn bind(uri: &str) -> Result<AnyListener, Error> {
        AnyListener::bind_with(uri, &ListenOptions::default()).await
    }

    /// Binds `uri` with `options`: any scheme of [`bind`](Self::bind), and `tls://`,
    /// `tls+unix://` and `grpcs://` with the options' TLS settings.
    pub async fn bind_with(uri: &str, options: &ListenOptions) -> Result<AnyListener, Error> {
        let _ = options;
        Ok(match scheme(uri) {
            "udp" => AnyListener::Udp(rpc_transport_udp::bind(uri).await?),
            "rdma" | "rdma+unix" => AnyListener::Rdma(rpc_transport_rdma::bind(uri).await?),
            "tcp" | "unix" => AnyListener::Stream(rpc_transport_tcp::bind(uri).await?),
            "grpc" => AnyListener::Grpc(rpc_transport_grpc::bind(uri).await?),
            #[cfg(feature = "tls")]
            "grpcs" => {
                let tls = options.tls.clone().ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidAddress,
                        format!("{uri}: a TLS listener needs a certificate and key"),
                    )
                })?;
                let address = uri.parse()?;
                AnyListener::Grpc(
                    rpc_transport_grpc::GrpcListener::bind_tls(&address, Default::default(), tls)
                        .await?,
                )
            }
            #[cfg(not(feature = "tls"))]
            "grpcs" => return Err(no_tls(uri)),
            #[cfg(feature = "tls")]
            "tls" | "tls+unix" => {
                let tls = options.tls.clone().ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidAddress,
                        format!("{uri}: a TLS listener needs a certificate and key"),
                    )
                })?;
                AnyListener::Tls(rpc_transport_tcp::tls::bind(uri, tls).await?)
            }
            #[cfg(not(feature = "tls"))]
            "tls" | "tls+unix" => return Err(no_tls(uri)),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidAddress,
                    format!(
                        "{uri}: cannot listen on scheme {other:?} (tcp, tls, grpc, grpcs, unix, \
                         tls+unix, udp, rdma, rdma+unix)"
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
            #[cfg(feature = "tls")]
            AnyListener::Tls(l) => l.local_addr_uri(),
            AnyListener::Grpc(l) => l.local_addr_uri(),
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
                #[cfg(feature = "tls")]
                AnyListener::Tls(l) => server.serve_with_shutdown(l, shutdown).await,
                AnyListener::Grpc(l) => server.serve_with_shutdown(l, shutdown).await,
            }
        })
    }
}

/// Binds a listener to `uri` by its scheme (`tcp://`, `unix://`, `udp://`, `rdma://`,
/// `rdma+unix://`, `grpc://`; RDMA with the soft provider, which needs no hardware) and returns
/// the bound URI (`tcp://host:0` becomes the port picked) with `server` serving the
/// listener until `shutdown` completes, for the caller to spawn.
pub async fn serve(
    server: &Server,
    uri: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(String, Serving), Error> {
    serve_with(server, uri, &ListenOptions::default(), shutdown).await
}

/// [`serve`], binding with `options` (TLS settings for `tls://`, `tls+unix://` and `grpcs://`).
pub async fn serve_with(
    server: &Server,
    uri: &str,
    options: &ListenOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(String, Serving), Error> {
    let listener = AnyListener::bind_with(uri, options).await?;
    Ok((listener.local_addr_uri(), listener.serve(server, shutdown)))
}
