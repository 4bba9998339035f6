//! The connection to etcd: the generated KV, Lease and Watch clients over one
//! [`Balanced`] client of the cluster's members, each reached over `grpc://` (h2c) or
//! `grpcs://` (TLS) by `rpc-transport-grpc`, with the token of an etcd user when the
//! [`Cluster`] has one.

use std::{
    fmt,
    sync::{Arc, Mutex},
    time::Duration,
};

use rpc_core::{
    auth::{Credential, CredentialsLayer, WithCredentials},
    balance::Balanced,
    client::Channel,
    Endpoint, Error, ErrorKind, Metadata, MetadataValue, Request, Status,
};
use rpc_transport_grpc::{Address, GrpcConfig, GrpcConnector};
use tower::Layer;

use crate::proto::etcdserverpb::{
    auth_client::AuthClient, kv_client::KvClient, lease_client::LeaseClient,
    watch_client::WatchClient, AuthenticateRequest,
};

/// How long one attempt to connect to a member may take: a member that is down is
/// usually refused at once; this bounds one that went silent (its host gone, packets
/// dropped). Well under the renewal stream's 3 s to open (`lease.rs`): a call whose
/// connection cannot be made goes on to another member, which must have time to
/// answer before a short lease expires. At 3 s (the open timeout itself), a renewal
/// stream reopened toward a dead member of three (a third of the time: a fresh set
/// picks at random) timed out whole, and a 5 s lease was lost (from a review).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// HTTP/2 keepalive toward each member: a PING every 10 s (etcd's
/// `--grpc-keepalive-min-time` allows one every 5 s), and a member that leaves one
/// unanswered for 5 s has its connection closed and its calls failed at once.
const KEEPALIVE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(5));

/// Waits between attempts to reconnect to a member (doubling from the first to the
/// second): etcd restarts within a second or two, and a registration must renew its
/// lease on the restarted member well within the lease's TTL.
const RECONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_millis(500));

/// The deadline of every unary call to etcd (grant, put, revoke, list): etcd answers in
/// milliseconds; a member that does not answer within this is treated as failed.
pub(crate) const UNARY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a token from etcd's `Authenticate` is used before asking for a new one:
/// under the 5 minutes etcd's tokens last by default (`--auth-token-ttl`, or the
/// `ttl` of its JWT tokens). A token etcd refuses before that (a shorter TTL, an etcd
/// that restarted and forgot it) is replaced after the first call it fails
/// ([`CredentialsLayer::refresh_when_rejected`]; a watch refused for it is followed
/// by a listing, which is refused the same way). Each `Authenticate` costs etcd a
/// bcrypt check and a write through Raft, from every registration and every
/// follower: not more often.
const TOKEN_LIFETIME: Duration = Duration::from_secs(240);

/// The metadata key etcd reads a caller's token from.
const TOKEN_KEY: &str = "token";

/// An etcd cluster: its members, and how to reach them when they are secured.
///
/// A member is `host:port` (as etcd's clients write it), etcd's own client URL
/// (`http://host:port`, `https://host:port`) or a gRPC URI (`grpc://`, `grpcs://`).
/// `https://` and `grpcs://` members are reached over TLS (with the `tls` feature),
/// trusting the system's roots unless `Cluster::tls` gives other settings;
/// with those settings, a bare `host:port` is reached over TLS too, as `etcdctl
/// --cacert` does. [`user`](Cluster::user) authenticates as an etcd user (etcd's
/// `auth enable`): the token etcd gives goes with every call, and is renewed before
/// etcd's default TTL and whenever etcd refuses it.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use rpc_discovery_etcd::Cluster;
/// let password = std::fs::read_to_string("/run/secrets/etcd-password")?;
/// let cluster = Cluster::new(&["https://etcd-0:2379", "https://etcd-1:2379"])?
///     .user("kv-server", password.trim());
/// // With the `tls` feature: .tls(ClientTls::builder().ca_file("/etc/etcd/ca.pem").build()?)
/// let me: rpc_core::Endpoint = "tcp://10.0.0.5:7000".parse()?;
/// let registration = cluster.register("kv", &me, Duration::from_secs(5)).await?;
/// # drop(registration); Ok(()) }
/// ```
#[derive(Clone)]
pub struct Cluster {
    /// The members as given (checked by [`Cluster::new`]).
    members: Vec<String>,
    #[cfg(feature = "tls")]
    tls: Option<rpc_transport_tcp::tls::ClientTls>,
    /// The etcd user and its password.
    user: Option<(String, Arc<str>)>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Cluster");
        d.field("members", &self.members);
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.is_some());
        // Not the password.
        d.field("user", &self.user.as_ref().map(|(name, _)| name))
            .finish()
    }
}

impl Cluster {
    /// The cluster of `members` (see [`Cluster`] for their forms), reached without
    /// TLS unless a member's scheme asks for it, and without authenticating. Fails if
    /// a member is not an address, or none is given.
    pub fn new(members: &[impl AsRef<str>]) -> Result<Cluster, Error> {
        let cluster = Cluster {
            members: members.iter().map(|m| m.as_ref().to_owned()).collect(),
            #[cfg(feature = "tls")]
            tls: None,
            user: None,
        };
        if cluster.members.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                "etcd: no cluster member given",
            ));
        }
        cluster.endpoints()?;
        Ok(cluster)
    }

    /// TLS settings for the members (trusted CAs, a client certificate for etcd's
    /// `--client-cert-auth`, a server name): `https://` and `grpcs://` members, and
    /// bare `host:port` ones, are reached over TLS with them.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: rpc_transport_tcp::tls::ClientTls) -> Cluster {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as etcd user `name` with `password` (etcd with `auth enable`).
    /// A wrong password, or a cluster without authentication enabled, fails every
    /// call with etcd's status (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`).
    pub fn user(mut self, name: impl Into<String>, password: impl AsRef<str>) -> Cluster {
        self.user = Some((name.into(), password.as_ref().into()));
        self
    }

    /// Registers `advertise` as a replica of `service` in this cluster: see
    /// [`register`](crate::register).
    pub async fn register(
        &self,
        service: &str,
        advertise: &Endpoint,
        ttl: Duration,
    ) -> Result<crate::Registration, Error> {
        crate::register_in(self, service, advertise, ttl).await
    }

    /// The replicas of `service` in this cluster, then changes as they happen: see
    /// [`resolve_with`](crate::resolve_with).
    pub async fn resolve(
        &self,
        service: &str,
        backoff: crate::Backoff,
    ) -> Result<futures::stream::BoxStream<'static, rpc_core::balance::Change>, Error> {
        crate::resolve_in(self, service, backoff).await
    }

    /// Whether bare `host:port` members are reached over TLS.
    fn tls_by_default(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The members as `grpc://` or `grpcs://` endpoints.
    fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        self.members
            .iter()
            .map(|member| endpoint(member, self.tls_by_default()))
            .collect()
    }
}

/// The service etcd's clients call through: the balanced members, with the caller's
/// token when the cluster has a user.
pub(crate) type Members = WithCredentials<Balanced>;

/// etcd's clients, sharing one balanced set of connections to the cluster's members.
#[derive(Clone)]
pub(crate) struct Etcd {
    pub(crate) kv: KvClient<Members>,
    pub(crate) lease: LeaseClient<Members>,
    pub(crate) watch: WatchClient<Members>,
    cluster: Cluster,
    /// Adds the token; shared by every reconnection, so the token outlives them.
    credentials: CredentialsLayer,
    /// The connections in use, which `Authenticate` goes over.
    current: Arc<Mutex<Option<Balanced>>>,
}

impl Etcd {
    /// Clients of the members of `cluster`. Connects lazily: an unreachable cluster
    /// shows in the first call.
    pub(crate) fn connect(cluster: &Cluster) -> Result<Etcd, Error> {
        let current: Arc<Mutex<Option<Balanced>>> = Arc::default();
        let credentials = match &cluster.user {
            None => CredentialsLayer::fixed(Credential::new(Metadata::new())),
            Some((name, password)) => {
                let (name, password, members) = (name.clone(), password.clone(), current.clone());
                CredentialsLayer::new(move || {
                    authenticate(members.clone(), name.clone(), password.clone())
                })
                .refresh_when_rejected()
            }
        };
        Etcd::on(cluster.clone(), credentials, current)
    }

    /// The same members on new connections, for when etcd stopped answering on the
    /// ones in use. A connection whose peer went silent (a host cut off, packets
    /// lost without a reset) fails no call by itself: the gRPC link sends no HTTP/2
    /// PINGs, so only a deadline shows it, and calls made on it again would wait as
    /// long. The old connections close as their last calls go.
    pub(crate) fn reconnect(&mut self) {
        // Cannot fail: these members made channels before.
        if let Ok(fresh) = Etcd::on(
            self.cluster.clone(),
            self.credentials.clone(),
            self.current.clone(),
        ) {
            *self = fresh;
        }
    }

    /// Clients of `cluster`'s members, on channels of their own.
    fn on(
        cluster: Cluster,
        credentials: CredentialsLayer,
        current: Arc<Mutex<Option<Balanced>>>,
    ) -> Result<Etcd, Error> {
        let builder = Channel::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .reconnect_backoff(RECONNECT_BACKOFF.0, RECONNECT_BACKOFF.1);
        #[cfg(feature = "tls")]
        let tls = cluster.tls.clone();
        let make = move |endpoint: &Endpoint| -> Result<Channel, Error> {
            // HTTP/2 keepalive: a member gone silent fails every call on its
            // connection at once (etcd permits a PING every 5 s by default).
            let config = GrpcConfig::default()
                .keepalive_interval(Some(KEEPALIVE.0))
                .keepalive_timeout(KEEPALIVE.1);
            let connector = GrpcConnector::new(Address::try_from(endpoint)?, config);
            #[cfg(feature = "tls")]
            let connector = match &tls {
                Some(tls) => connector.tls(tls.clone()),
                None => connector,
            };
            Ok(builder.clone().connect_lazy(connector))
        };
        let balanced = Balanced::from_endpoints(make, cluster.endpoints()?)?;
        *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(balanced.clone());
        let members = credentials.layer(balanced);
        Ok(Etcd {
            kv: KvClient::new(members.clone()),
            lease: LeaseClient::new(members.clone()),
            watch: WatchClient::new(members),
            cluster,
            credentials,
            current,
        })
    }
}

/// A token from etcd's `Authenticate` for `name`, over the connections in use.
async fn authenticate(
    current: Arc<Mutex<Option<Balanced>>>,
    name: String,
    password: Arc<str>,
) -> Result<Credential, Status> {
    let members = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let members = members.ok_or_else(|| Status::unavailable("etcd: not connected"))?;
    let request = AuthenticateRequest {
        name: name.clone(),
        password: password.to_string(),
    };
    let reply = AuthClient::new(members)
        .authenticate(Request::new(request).with_timeout(UNARY_TIMEOUT))
        .await
        .map_err(|status| {
            Status::new(
                status.code(),
                format!("etcd: authenticate as {name}: {}", status.message()),
            )
        })?;
    let mut metadata = Metadata::new();
    metadata
        .insert(TOKEN_KEY, MetadataValue::from(reply.into_inner().token))
        .map_err(|e| Status::internal(format!("etcd: its token is not metadata: {e}")))?;
    Ok(Credential::new(metadata).expires_in(TOKEN_LIFETIME))
}

/// A member's `grpc://` or `grpcs://` endpoint: `host:port` (over TLS if `tls`),
/// etcd's `http://` and `https://` client URLs, or a gRPC URI.
fn endpoint(member: &str, tls: bool) -> Result<Endpoint, Error> {
    let member = member.trim().trim_end_matches('/');
    let uri = match member.split_once("://") {
        None if tls => format!("grpcs://{member}"),
        None => format!("grpc://{member}"),
        Some(("http", rest)) => format!("grpc://{rest}"),
        Some(("https", rest)) => format!("grpcs://{rest}"),
        Some(_) => member.to_owned(),
    };
    let endpoint: Endpoint = uri.parse()?;
    let address = Address::try_from(&endpoint).map_err(|e| {
        Error::new(
            ErrorKind::InvalidAddress,
            format!("etcd member {member}: {e}"),
        )
    })?;
    if address.is_secure() && cfg!(not(feature = "tls")) {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "etcd member {member}: TLS is not built in (rpc-discovery-etcd's `tls` feature)"
            ),
        ));
    }
    Ok(endpoint)
}

/// A failed call to etcd as this crate's error.
pub(crate) fn etcd_error(context: &str, status: Status) -> Error {
    Error::new(ErrorKind::Io, format!("etcd: {context}")).with_source(status)
}

/// The end of the key range of every key that starts with `prefix` (etcd's
/// `range_end`): the prefix with its last byte that is not 0xff incremented, and what
/// follows it dropped; `\0` (every key) if there is no such byte.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_of_a_prefix_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"rpc/services/kv/"), b"rpc/services/kv0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn members_are_grpc_endpoints() {
        let plain = |member| endpoint(member, false).map(|e| e.to_string());
        assert_eq!(plain("127.0.0.1:2379").unwrap(), "grpc://127.0.0.1:2379");
        assert_eq!(plain("grpc://etcd-0:2379").unwrap(), "grpc://etcd-0:2379");
        assert_eq!(plain("http://etcd-0:2379/").unwrap(), "grpc://etcd-0:2379");
        assert!(plain("tcp://127.0.0.1:2379").is_err());
        assert!(plain("no port").is_err());
        assert!(Cluster::new(&[] as &[&str]).is_err());
        assert!(Cluster::new(&["127.0.0.1:2379", "nope"]).is_err());
    }

    #[test]
    fn secure_members_are_grpcs_endpoints_or_refused_without_tls() {
        for member in ["https://etcd-0:2379", "grpcs://etcd-0:2379"] {
            let found = endpoint(member, false).map(|e| e.to_string());
            if cfg!(feature = "tls") {
                assert_eq!(found.unwrap(), "grpcs://etcd-0:2379");
            } else {
                let err = found.unwrap_err();
                assert!(err.to_string().contains("`tls` feature"), "{err}");
            }
        }
        if cfg!(feature = "tls") {
            // With TLS settings a bare member is secure; an explicit http:// is not.
            let bare = endpoint("etcd-0:2379", true).unwrap();
            assert_eq!(bare.to_string(), "grpcs://etcd-0:2379");
            let plain = endpoint("http://etcd-0:2379", true).unwrap();
            assert_eq!(plain.to_string(), "grpc://etcd-0:2379");
        }
    }

    #[test]
    fn a_clusters_debug_does_not_show_the_password() {
        let cluster = Cluster::new(&["127.0.0.1:2379"])
            .unwrap()
            .user("root", "hunter2");
        let shown = format!("{cluster:?}");
        assert!(
            shown.contains("root") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
