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
//!   when a replica fails; or `etcd://host:port[,host:port]/service`, the replicas
//!   registered in etcd (`rpc-discovery-etcd`), listed and then watched (a secured
//!   etcd: [`ConnectOptions::etcd_user`], and `etcd_tls` with the `tls` feature).
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
//!
//! # One line: `FooClient::connect(uri)`
//!
//! With the [`Connect`] trait in scope, every generated client connects itself, as
//! tonic's do: `EchoClient::connect(uri)` (one server), `EchoClient::balanced(uri)`
//! (a service's replicas), and `connect_with` / `balanced_with` with
//! [`ConnectOptions`].
//!
//! Why a trait here rather than a `connect` method generated into every client:
//! `rpc-connect` depends on `rpc-core` and on every transport, so generated code that
//! called `::rpc_connect::connect` would make every crate with generated code depend
//! on all the transports (and fail to build without `rpc-connect`). Instead each
//! generated client implements one small trait of `rpc-core`,
//! [`FromChannel<T>`](rpc_core::client::FromChannel) ("I can be made from a `T`"),
//! and this crate implements [`Connect`] for every type that does: generated code
//! names only `rpc_core::codegen`, clients over [`Balanced`] work the same way, and a
//! crate that does not want `rpc-connect` does not get it.
//!
//! # One set of settings for every scheme
//!
//! [`ConnectOptions`] applies to every scheme, and to every replica of a service name
//! (`static://`, `dns://`): the [`ChannelBuilder`]'s
//! settings (default timeout, limits, compression, keepalive, streams, a pool of
//! connections), TLS (`tls://`, `tls+unix://`, `grpcs://`, `dns+tls://`), keepalive on
//! `grpc://` too ([`ConnectOptions::keepalive`]), TCP keepalive, and wait-for-ready.
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! use std::time::Duration;
//!
//! use rpc_connect::{Connect, ConnectOptions};
//! use rpc_core::{client::Channel, compress::Compression, retry::RetryPolicy};
//! use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
//!
//! // One server, default settings: any scheme.
//! let mut echo = EchoClient::connect("tcp://127.0.0.1:7000").await?;
//!
//! // Settings once, for any URI.
//! let options = ConnectOptions::new()
//!     .channel(
//!         Channel::builder()
//!             .timeout(Duration::from_secs(2)) // calls' default deadline
//!             .max_in_flight(256)
//!             .max_frame_len(4 << 20)
//!             .compression(Some(Compression::default()))?,
//!     )
//!     .keepalive(Some(Duration::from_secs(10)), Duration::from_secs(5))
//!     .wait_for_ready(Some(Duration::from_secs(3)));
//! let mut udp = EchoClient::connect_with("udp://10.0.0.5:7000", &options).await?;
//! let mut grpc = EchoClient::connect_with("grpc://10.0.0.6:50051", &options).await?;
//! let mut replicas = EchoClient::balanced_with("dns://_echo._tcp.example.com", &options)
//!     .await?
//!     .with_retries(RetryPolicy::default());
//! # let _ = (echo.say(SayRequest::default()).await, udp.say(SayRequest::default()).await,
//! #     grpc.say(SayRequest::default()).await, replicas.say(SayRequest::default()).await);
//! # Ok(()) }
//! ```

use std::{future::Future, pin::Pin, time::Duration};

use rpc_core::{
    balance::{Balanced, MakeChannel},
    client::{Channel, ChannelBuilder, FromChannel},
    endpoint::{Endpoint, Scheme},
    link::Connector,
    server::Server,
    Error, ErrorKind,
};
use rpc_transport_grpc::GrpcConfig;
use rpc_transport_tcp::TcpKeepalive;

/// The TLS settings [`ConnectOptions::tls`] and [`ListenOptions::tls`] take
/// (`rpc_transport_tcp::tls`'s), here so that a crate that connects or listens by URI
/// needs no dependency on the TCP transport to name them.
#[cfg(feature = "tls")]
pub use rpc_transport_tcp::tls::{ClientTls, ServerTls};

/// `FooClient::connect(uri)` for every generated client (and `balanced`, and both
/// with [`ConnectOptions`]): implemented for every type, usable by those that are
/// [`FromChannel`] (every generated client is). See the [crate docs](crate) for why
/// this is a trait of this crate and not generated code.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use rpc_connect::Connect;
/// use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
///
/// let mut echo = EchoClient::connect("tcp://127.0.0.1:7000").await?;
/// let reply = echo.say(SayRequest { message: "hi".into(), ..Default::default() }).await?;
/// let mut many = EchoClient::balanced("static://10.0.0.1:7000,10.0.0.2:7000").await?;
/// # let _ = (reply, many.say(SayRequest::default()).await);
/// # Ok(()) }
/// ```
///
/// A service with an rpc called `Connect` (or `Balanced`, `ConnectWith`,
/// `BalancedWith`) keeps these names: the generator calls that rpc's client method
/// `connect_` (`balanced_`, ...), so `FooClient::connect(uri)` is still this one.
pub trait Connect: Sized {
    /// The client over a channel to the one server at `uri` ([`connect`]).
    fn connect(uri: &str) -> impl Future<Output = Result<Self, Error>> + Send
    where
        Self: FromChannel<Channel>,
    {
        async move { connect(uri).await.map(Self::from_channel) }
    }

    /// The client over a channel to `uri` made with `options` ([`connect_with`]).
    fn connect_with(
        uri: &str,
        options: &ConnectOptions,
    ) -> impl Future<Output = Result<Self, Error>> + Send
    where
        Self: FromChannel<Channel>,
    {
        async move { connect_with(uri, options).await.map(Self::from_channel) }
    }

    /// The client over a [`Balanced`] channel to the replicas `uri` names
    /// ([`balanced`]).
    fn balanced(uri: &str) -> impl Future<Output = Result<Self, Error>> + Send
    where
        Self: FromChannel<Balanced>,
    {
        async move { balanced(uri).await.map(Self::from_channel) }
    }

    /// The client over a [`Balanced`] channel made with `options` ([`balanced_with`]).
    fn balanced_with(
        uri: &str,
        options: &ConnectOptions,
    ) -> impl Future<Output = Result<Self, Error>> + Send
    where
        Self: FromChannel<Balanced>,
    {
        async move { balanced_with(uri, options).await.map(Self::from_channel) }
    }
}

impl<C> Connect for C {}

/// A channel to the one server at `uri`, by its scheme, with default settings. The
/// channel connects now (for UDP: opens its socket; nothing is sent).
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    connect_with(uri, &ConnectOptions::default()).await
}

/// How [`connect_with`], [`balanced_with`], [`Connect`] and [`AnyChannels`] make
/// channels, for every scheme: the channel settings, keepalive (the core's PINGs, and
/// HTTP/2 PINGs on `grpc://`), TCP keepalive, wait-for-ready, and the TLS settings for
/// `tls://`, `tls+unix://` and `grpcs://`; for balanced channels, health checks. The
/// [crate docs](crate) have an example.
#[derive(Clone, Debug, Default)]
pub struct ConnectOptions {
    channel: ChannelBuilder,
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ClientTls>,
    grpc: GrpcConfig,
    /// Set by [`keepalive`](Self::keepalive): applied over the channel builder's and
    /// the gRPC settings whatever order the setters ran in.
    keepalive: Option<(Option<Duration>, Duration)>,
    tcp_keepalive: Option<TcpKeepalive>,
    /// `None`: each kind's default (a balanced channel waits
    /// [`DEFAULT_WAIT_FOR_READY`](rpc_core::balance::DEFAULT_WAIT_FOR_READY), `connect`
    /// does not).
    wait_for_ready: Option<Option<Duration>>,
    /// Set by [`health_check`](Self::health_check): the service, interval and timeout.
    health_check: Option<(String, Duration, Duration)>,
    /// TLS settings for the members of an `etcd://` cluster.
    #[cfg(feature = "tls")]
    etcd_tls: Option<rpc_transport_tcp::tls::ClientTls>,
    /// The etcd user an `etcd://` resolution logs in as.
    etcd_user: Option<EtcdUser>,
}

/// An etcd user and its password (not shown by `Debug`).
#[derive(Clone)]
struct EtcdUser {
    name: String,
    password: std::sync::Arc<str>,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ConnectOptions {
    /// The defaults: [`Channel::builder()`]'s settings, and for TLS the system's roots.
    pub fn new() -> Self {
        ConnectOptions::default()
    }

    /// The channel settings, for every scheme: default timeout, limits (in-flight
    /// calls, frame and metadata sizes), compression, keepalive, stream windows,
    /// reconnection backoff, retransmission (UDP), a pool of connections per server
    /// ([`ChannelBuilder::connections`]). Default: [`Channel::builder()`].
    pub fn channel(mut self, builder: ChannelBuilder) -> Self {
        self.channel = builder;
        self
    }

    /// Keepalive on every scheme: after `interval` without a frame from the server
    /// while calls are in flight, a PING; no answer within `timeout` and the
    /// connection is declared dead (its calls fail with `UNAVAILABLE`, the next call
    /// reconnects). Sets the channel builder's
    /// [`keepalive_interval`](ChannelBuilder::keepalive_interval) and
    /// [`keepalive_timeout`](ChannelBuilder::keepalive_timeout) (TCP, Unix, TLS, UDP,
    /// RDMA) and gRPC's HTTP/2 PINGs on `grpc://` and `grpcs://`
    /// ([`GrpcConfig::keepalive_interval`]; keep `interval` above what the gRPC
    /// server permits, 5 minutes by default for grpc-go, or it closes the
    /// connection). `None` turns keepalive off everywhere. Default: the channel
    /// builder's (30 s, 20 s) and, on `grpc://`, off (as gRPC's).
    pub fn keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.keepalive = Some((interval, timeout));
        self
    }

    /// TCP keepalive (`SO_KEEPALIVE` probes by the kernel) on the TCP connections of
    /// `tcp://`, `tls://` and their replicas. Default: `None` (off).
    pub fn tcp_keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.tcp_keepalive = keepalive;
        self
    }

    /// gRPC's HTTP/2 settings on `grpc://` and `grpcs://` (windows, stream limits,
    /// handshake timeout). Default: [`GrpcConfig::default`].
    pub fn grpc(mut self, config: GrpcConfig) -> Self {
        self.grpc = config;
        self
    }

    /// Wait-for-ready: how long a call waits for a server instead of failing at once
    /// with `UNAVAILABLE`. For a balanced channel ([`balanced_with`]) it is
    /// [`Balanced::wait_for_ready`]: each call waits while no replica is known yet.
    /// For one server ([`connect_with`]) it is how long connecting keeps trying (with
    /// backoff) while the server is not reachable yet, so that a client started
    /// beside its server does not fail its start. `None` fails at once. Default:
    /// [`DEFAULT_WAIT_FOR_READY`](rpc_core::balance::DEFAULT_WAIT_FOR_READY) for
    /// balanced channels, `None` for one server.
    pub fn wait_for_ready(mut self, wait: Option<Duration>) -> Self {
        self.wait_for_ready = Some(wait);
        self
    }

    /// Health checks on balanced channels ([`balanced_with`] and the clients' `balanced_with`):
    /// every `interval`, each replica is asked the standard
    /// `grpc.health.v1.Health/Check` for `service` (`""`: the server as a whole), and
    /// left out while it does not answer `SERVING` within `timeout`
    /// ([`Balanced::health_checks`]; the checks run on the current Tokio runtime and
    /// end with the set). This finds a replica that is up but not serving (its health
    /// service says so, or it answers nothing at all) before calls do: without it, a
    /// replica still registered but not answering is ejected only after calls to it
    /// time out, and is tried again with real calls when each ejection ends. The
    /// servers must serve the health service (`rpc-server` does; `rpc_services`
    /// has it). Not for [`connect_with`]: one server has no other to take the calls.
    /// Default: off.
    pub fn health_check(mut self, service: &str, interval: Duration, timeout: Duration) -> Self {
        self.health_check = Some((service.to_owned(), interval, timeout));
        self
    }

    /// The channel builder, with [`keepalive`](Self::keepalive) applied.
    fn channel_builder(&self) -> ChannelBuilder {
        match self.keepalive {
            Some((interval, timeout)) => self
                .channel
                .clone()
                .keepalive_interval(interval)
                .keepalive_timeout(timeout),
            None => self.channel.clone(),
        }
    }

    /// The gRPC settings, with [`keepalive`](Self::keepalive) applied.
    fn grpc_config(&self) -> GrpcConfig {
        match self.keepalive {
            Some((interval, timeout)) => self
                .grpc
                .clone()
                .keepalive_interval(interval)
                .keepalive_timeout(timeout),
            None => self.grpc.clone(),
        }
    }

    /// TLS settings for `tls://`, `tls+unix://` and `grpcs://` (trusted CAs, client certificate,
    /// server name). Default: [`ClientTls::system`](rpc_transport_tcp::tls::ClientTls::system).
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: rpc_transport_tcp::tls::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// TLS settings for reaching the members of an `etcd://` cluster (its CAs, a
    /// client certificate for etcd's `--client-cert-auth`): its members are then
    /// reached over TLS (`rpc_discovery_etcd::Cluster::tls`). Default: plain text.
    #[cfg(feature = "tls")]
    pub fn etcd_tls(mut self, tls: rpc_transport_tcp::tls::ClientTls) -> Self {
        self.etcd_tls = Some(tls);
        self
    }

    /// Logs in to an `etcd://` cluster as etcd user `name` (etcd's `auth enable`;
    /// `rpc_discovery_etcd::Cluster::user`). Default: no user.
    pub fn etcd_user(mut self, name: impl Into<String>, password: impl AsRef<str>) -> Self {
        self.etcd_user = Some(EtcdUser {
            name: name.into(),
            password: password.as_ref().into(),
        });
        self
    }

    /// The etcd cluster of `members`, with these options' etcd settings.
    fn etcd_cluster(&self, members: &[String]) -> Result<rpc_discovery_etcd::Cluster, Error> {
        let mut cluster = rpc_discovery_etcd::Cluster::new(members)?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.etcd_tls {
            cluster = cluster.tls(tls.clone());
        }
        if let Some(user) = &self.etcd_user {
            cluster = cluster.user(user.name.clone(), &*user.password);
        }
        Ok(cluster)
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
    let builder = options.channel_builder();
    let wait = options.wait_for_ready.flatten();
    let uri = &*rpc_core::endpoint::lowercase_scheme(uri);
    match scheme(uri) {
        "tcp" | "unix" => {
            let connector = rpc_transport_tcp::StreamConnector::from_uri(uri)?
                .tcp_keepalive(options.tcp_keepalive);
            connect_waiting(builder, connector, wait).await
        }
        "udp" => {
            let connector = rpc_transport_udp::UdpConnector::from_uri(uri)?;
            connect_waiting(builder, connector, wait).await
        }
        "rdma" | "rdma+unix" => {
            let connector = rpc_transport_rdma::RdmaConnector::from_uri(uri)?;
            connect_waiting(builder, connector, wait).await
        }
        "grpc" => {
            let connector =
                rpc_transport_grpc::GrpcConnector::new(uri.parse()?, options.grpc_config());
            connect_waiting(builder, connector, wait).await
        }
        #[cfg(feature = "tls")]
        "grpcs" => {
            let connector =
                rpc_transport_grpc::GrpcConnector::new(uri.parse()?, options.grpc_config())
                    .tls(options.client_tls()?);
            connect_waiting(builder, connector, wait).await
        }
        #[cfg(not(feature = "tls"))]
        "grpcs" => Err(no_tls(uri)),
        #[cfg(feature = "tls")]
        "tls" | "tls+unix" => {
            let connector = rpc_transport_tcp::tls::TlsConnector::new(uri, options.client_tls()?)?
                .tcp_keepalive(options.tcp_keepalive);
            connect_waiting(builder, connector, wait).await
        }
        #[cfg(not(feature = "tls"))]
        "tls" | "tls+unix" => Err(no_tls(uri)),
        "static" | "dns" | "dns+tcp" | "dns+udp" | "dns+tls" | "dns+grpc" | "dns+grpcs"
        | "dns+rdma" | "etcd" => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!("{uri} names a service, not one server: use rpc_connect::balanced"),
        )),
        "" => Err(no_scheme(uri)),
        other => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{uri}: unknown scheme {other:?} (tcp, tls, grpc, grpcs, unix, tls+unix, udp, \
                 rdma, rdma+unix; or a service name for balanced: static, dns, dns+tcp, \
                 dns+udp, dns+tls, dns+grpc, dns+grpcs, dns+rdma, etcd)"
            ),
        )),
    }
}

/// First delay between connection attempts while waiting for a server to be ready
/// ([`ConnectOptions::wait_for_ready`]); it doubles up to [`WAIT_BACKOFF_MAX`].
const WAIT_BACKOFF_MIN: Duration = Duration::from_millis(20);

/// Longest delay between connection attempts while waiting for a server: short, so
/// that a server that comes up is found soon after.
const WAIT_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Connects with `builder`, trying again with backoff for up to `wait` while the
/// attempts fail (the last attempt's error if none succeeds).
async fn connect_waiting<C: Connector + Clone>(
    builder: ChannelBuilder,
    connector: C,
    wait: Option<Duration>,
) -> Result<Channel, Error> {
    let Some(wait) = wait else {
        return builder.connect(connector).await;
    };
    let until = tokio::time::Instant::now() + wait;
    let mut backoff = WAIT_BACKOFF_MIN;
    loop {
        match builder.clone().connect(connector.clone()).await {
            Ok(channel) => return Ok(channel),
            Err(err) if tokio::time::Instant::now() + backoff >= until => return Err(err),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(WAIT_BACKOFF_MAX);
            }
        }
    }
}

/// A TLS listener asked for without a certificate and key.
#[cfg(feature = "tls")]
fn no_certificate(uri: &str) -> Error {
    Error::new(
        ErrorKind::InvalidAddress,
        format!(
            "{uri}: a TLS listener needs a certificate and key \
             (ListenOptions::tls; rpc-server: --tls-cert and --tls-key)"
        ),
    )
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
/// with the `tls` feature `tls`, `tls+unix`, `grpcs`), every one with the same
/// [`ConnectOptions`]; for [`Balanced`].
#[derive(Clone, Debug, Default)]
pub struct AnyChannels {
    udp: rpc_transport_udp::UdpChannels,
    rdma: rpc_transport_rdma::RdmaChannels,
    /// The options' channel builder, keepalive applied.
    builder: ChannelBuilder,
    grpc: GrpcConfig,
    options: ConnectOptions,
}

impl AnyChannels {
    /// Channels made with `options` (channel settings, keepalive, TLS).
    pub fn new(options: ConnectOptions) -> Self {
        let builder = options.channel_builder();
        AnyChannels {
            udp: rpc_transport_udp::UdpChannels::new(builder.clone(), Default::default()),
            rdma: rpc_transport_rdma::RdmaChannels::new(builder.clone(), Default::default()),
            builder,
            grpc: options.grpc_config(),
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
                    )?
                    .tcp_keepalive(self.options.tcp_keepalive);
                    Ok(self.builder.clone().connect_lazy(connector))
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
            }
            | Endpoint::RdmaUnix(_) => self.rdma.make_channel(endpoint),
            Endpoint::Host {
                scheme: Scheme::Grpc,
                ..
            } => {
                let address = rpc_transport_grpc::Address::try_from(endpoint)?;
                let connector = rpc_transport_grpc::GrpcConnector::new(address, self.grpc.clone());
                Ok(self.builder.clone().connect_lazy(connector))
            }
            Endpoint::Host {
                scheme: Scheme::Grpcs,
                ..
            } => {
                #[cfg(feature = "tls")]
                {
                    let address = rpc_transport_grpc::Address::try_from(endpoint)?;
                    let connector =
                        rpc_transport_grpc::GrpcConnector::new(address, self.grpc.clone())
                            .tls(self.options.client_tls()?);
                    Ok(self.builder.clone().connect_lazy(connector))
                }
                #[cfg(not(feature = "tls"))]
                Err(no_tls(&endpoint.to_string()))
            }
            _ => {
                let address = rpc_transport_tcp::Address::try_from(endpoint)?;
                let connector = rpc_transport_tcp::StreamConnector::new(address)
                    .tcp_keepalive(self.options.tcp_keepalive);
                Ok(self.builder.clone().connect_lazy(connector))
            }
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

/// The domain of an SRV name: `example.com` for `_grpc._tcp.example.com` (its
/// leading `_service` and `_proto` labels left out), the name itself otherwise.
fn srv_domain(name: &str) -> &str {
    let mut rest = name;
    while let Some(tail) = rest.strip_prefix('_').and_then(|r| r.split_once('.')) {
        rest = tail.1;
    }
    if rest.is_empty() || rest.starts_with('_') {
        name // no domain after the `_` labels
    } else {
        rest
    }
}

/// [`balanced`], with channels made with `options` (and health checks, if they ask
/// for them: [`ConnectOptions::health_check`]).
pub async fn balanced_with(uri: &str, options: &ConnectOptions) -> Result<Balanced, Error> {
    let balanced = replicas(uri, options).await?;
    if let Some((service, interval, timeout)) = &options.health_check {
        let checks = balanced.health_checks(service, *interval, *timeout);
        balanced.stop_with(tokio::spawn(checks).abort_handle());
    }
    Ok(balanced)
}

/// The set of replicas `uri` names, following discovery, for [`balanced_with`].
async fn replicas(uri: &str, options: &ConnectOptions) -> Result<Balanced, Error> {
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
    if let Endpoint::Dns {
        transport: Scheme::Grpc | Scheme::Grpcs,
        name,
        port,
    } = &endpoint
    {
        // HTTP/2's `:authority` is the name too, as gRPC clients send it (proxies and
        // virtual hosts route on it), not the address each replica resolved to; for an
        // SRV name (`_grpc._tcp.example.com`), its domain. One the options set wins.
        if options.grpc.authority_override().is_none() {
            let authority = match port {
                Some(port) => format!("{name}:{port}"),
                None => srv_domain(name).to_owned(),
            };
            options.grpc = options.grpc.clone().authority(authority);
        }
    }
    let wait = options.wait_for_ready;
    let with_wait = move |balanced: Balanced| match wait {
        Some(wait) => balanced.wait_for_ready(wait),
        None => balanced,
    };
    let etcd = match &endpoint {
        Endpoint::Etcd { cluster, .. } => Some(options.etcd_cluster(cluster)?),
        _ => None,
    };
    let channels = AnyChannels::new(options);
    match &endpoint {
        Endpoint::Host { .. }
        | Endpoint::Unix(_)
        | Endpoint::TlsUnix(_)
        | Endpoint::RdmaUnix(_) => Balanced::from_endpoints(channels, [endpoint]).map(with_wait),
        Endpoint::Static(members) => {
            Balanced::from_endpoints(channels, members.iter().cloned()).map(with_wait)
        }
        Endpoint::Dns { .. } => {
            use futures::StreamExt;
            let balanced = with_wait(Balanced::new(channels));
            let resolver = rpc_discovery_dns::DnsResolver::new(Default::default())?;
            let (mut changes, refresh) = resolver.resolve(&endpoint)?;
            // Wait (a little) for the first answer, so that the first call has a
            // replica; the rest follows in the background.
            if let Ok(Some(first)) = tokio::time::timeout(FIRST_LOOKUP, changes.next()).await {
                let mut answer = FirstAnswer::default();
                answer.apply(&balanced, first);
                // The rest of that answer is ready too.
                while let Some(Some(change)) = futures::FutureExt::now_or_never(changes.next()) {
                    answer.apply(&balanced, change);
                }
                answer.result()?;
            }
            // Look again at once when a replica fails, not only at the next interval.
            balanced.on_ejection(move |_| refresh.refresh());
            // Ends with the set: its lookups stop when the client is dropped.
            balanced.stop_with(tokio::spawn(balanced.follow(changes)).abort_handle());
            Ok(balanced)
        }
        Endpoint::Etcd { service, .. } => {
            use futures::StreamExt;
            let balanced = with_wait(Balanced::new(channels));
            let cluster = etcd.expect("an etcd:// endpoint's cluster, made above");
            let mut changes = cluster
                .resolve(service, rpc_discovery_etcd::Backoff::default())
                .await?;
            // The first listing is there already: the first call has its replicas.
            let mut answer = FirstAnswer::default();
            while let Some(Some(change)) = futures::FutureExt::now_or_never(changes.next()) {
                answer.apply(&balanced, change);
            }
            answer.result()?;
            // Ends with the set: its watch of etcd closes when the client is dropped.
            balanced.stop_with(tokio::spawn(balanced.follow(changes)).abort_handle());
            Ok(balanced)
        }
    }
}

/// The error for an address written without `scheme://`: what to write instead
/// (`unix:/path`, gRPC's target syntax, is a Unix socket's).
fn no_scheme(uri: &str) -> Error {
    let advice = match uri.strip_prefix("unix:") {
        Some(path) if path.starts_with('/') => format!("write unix://{path} for a Unix socket"),
        Some(_) => "write unix:///absolute/path for a Unix socket".to_owned(),
        None => format!(
            "write tcp://{uri} for the framework's own wire, grpc://{uri} for a gRPC server"
        ),
    };
    Error::new(
        ErrorKind::InvalidAddress,
        format!(
            "{uri:?} has no scheme: {advice} (or another of tcp, tls, grpc, grpcs, unix, \
             tls+unix, udp, rdma, rdma+unix)"
        ),
    )
}

/// Discovery's first answer as it is applied: a replica this client cannot reach (a
/// registered address of a transport it lacks, say) is logged and left out, as
/// [`Balanced::follow`] does later, so one bad registration does not fail the client;
/// an answer none of whose replicas could be used is the first one's error.
#[derive(Default)]
struct FirstAnswer {
    applied: bool,
    failed: Option<Error>,
}

impl FirstAnswer {
    fn apply(&mut self, balanced: &Balanced, change: rpc_core::balance::Change) {
        match balanced.apply(change) {
            Ok(()) => self.applied = true,
            Err(err) => {
                tracing::warn!(error = %err, "discovery reported a replica this client cannot reach; left out");
                self.failed.get_or_insert(err);
            }
        }
    }

    fn result(self) -> Result<(), Error> {
        match self.failed {
            Some(err) if !self.applied => Err(err),
            _ => Ok(()),
        }
    }
}

/// How long [`balanced`] waits for the first DNS answer before returning (until one
/// comes, each call then waits for a replica up to the balancer's wait for ready,
/// 5 s by default, or its own deadline, and fails `UNAVAILABLE`).
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

/// A listener's transport counters ([`AnyListener::transport_stats`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum TransportStats {
    /// `udp://`: datagrams, retransmissions, reassembly, associations, the round-trip
    /// estimate.
    Udp(std::sync::Arc<rpc_transport_udp::UdpStats>),
    /// `rdma://`: the accepted links' eager and rendezvous frames, waits for credit,
    /// bulk transfers, summed.
    Rdma(rpc_transport_rdma::LinkTotals),
}

/// How [`AnyListener::bind_with`] binds: the TLS settings for `tls://`,
/// `tls+unix://` and `grpcs://` (required for those schemes), and the HTTP/2 settings
/// of `grpc://` and `grpcs://` listeners.
#[derive(Clone, Debug, Default)]
pub struct ListenOptions {
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ServerTls>,
    grpc: GrpcConfig,
}

impl ListenOptions {
    /// No TLS: `tls://`, `tls+unix://` and `grpcs://` URIs are refused.
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

    /// The HTTP/2 settings of `grpc://` and `grpcs://` listeners: streams per
    /// connection, windows, frame and header sizes, the server's keepalive PINGs. Keep its
    /// [`max_concurrent_streams`](GrpcConfig::max_concurrent_streams) at or below the
    /// server's own ([`ServerBuilder::max_concurrent_streams`](rpc_core::server::ServerBuilder::max_concurrent_streams)),
    /// so that a gRPC client waits for a stream at the HTTP/2 level instead of meeting
    /// `RESOURCE_EXHAUSTED` from the server. Default: [`GrpcConfig::default`].
    pub fn grpc(mut self, config: GrpcConfig) -> Self {
        self.grpc = config;
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
    /// `tls+unix://` and `grpcs://` with the options' TLS settings; `grpc://` and
    /// `grpcs://` with its HTTP/2 settings.
    pub async fn bind_with(uri: &str, options: &ListenOptions) -> Result<AnyListener, Error> {
        let uri = &*rpc_core::endpoint::lowercase_scheme(uri);
        Ok(match scheme(uri) {
            "udp" => AnyListener::Udp(rpc_transport_udp::bind(uri).await?),
            "rdma" | "rdma+unix" => AnyListener::Rdma(rpc_transport_rdma::bind(uri).await?),
            "tcp" | "unix" => AnyListener::Stream(rpc_transport_tcp::bind(uri).await?),
            "grpc" => AnyListener::Grpc(
                rpc_transport_grpc::GrpcListener::bind(&uri.parse()?, options.grpc.clone()).await?,
            ),
            #[cfg(feature = "tls")]
            "grpcs" => {
                let tls = options.tls.clone().ok_or_else(|| no_certificate(uri))?;
                let address = uri.parse()?;
                AnyListener::Grpc(
                    rpc_transport_grpc::GrpcListener::bind_tls(&address, options.grpc.clone(), tls)
                        .await?,
                )
            }
            #[cfg(not(feature = "tls"))]
            "grpcs" => return Err(no_tls(uri)),
            #[cfg(feature = "tls")]
            "tls" | "tls+unix" => {
                let tls = options.tls.clone().ok_or_else(|| no_certificate(uri))?;
                AnyListener::Tls(rpc_transport_tcp::tls::bind(uri, tls).await?)
            }
            #[cfg(not(feature = "tls"))]
            "tls" | "tls+unix" => return Err(no_tls(uri)),
            "" => return Err(no_scheme(uri)),
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

    /// The transport's own counters below the core, where it keeps them: a handle
    /// to read them after the listener moved into a server (for metrics). `None` for
    /// the stream transports and gRPC, whose connections the server counts itself
    /// ([`Server::connections`](rpc_core::server::Server::connections)).
    pub fn transport_stats(&self) -> Option<TransportStats> {
        match self {
            AnyListener::Udp(l) => Some(TransportStats::Udp(l.stats().clone())),
            AnyListener::Rdma(l) => Some(TransportStats::Rdma(l.link_stats())),
            _ => None,
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

/// [`serve`], binding with `options` (TLS settings for `tls://`, `tls+unix://` and
/// `grpcs://`; HTTP/2 settings for `grpc://` and `grpcs://`).
pub async fn serve_with(
    server: &Server,
    uri: &str,
    options: &ListenOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(String, Serving), Error> {
    let listener = AnyListener::bind_with(uri, options).await?;
    Ok((listener.local_addr_uri(), listener.serve(server, shutdown)))
}

#[cfg(test)]
mod tests {
    /// An SRV name's `:authority` is its domain (from a review: the whole
    /// `_grpc._tcp.` name, which no virtual host routes on).
    #[test]
    fn an_srv_names_domain_is_its_authority() {
        assert_eq!(super::srv_domain("_grpc._tcp.example.com"), "example.com");
        assert_eq!(super::srv_domain("_api._udp.svc.local"), "svc.local");
        assert_eq!(super::srv_domain("example.com"), "example.com");
        assert_eq!(super::srv_domain("_only"), "_only");
        assert_eq!(super::srv_domain("_a._b"), "_a._b");
    }
}
