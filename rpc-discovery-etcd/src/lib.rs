//! Service discovery in etcd.
//!
//! A server [`register`]s its advertised address under
//! `rpc/services/<service>/<lease id>`, attached to a lease that a task owned by the
//! returned [`Registration`] keeps alive. [`Registration::deregister`] revokes the
//! lease at once (do it first when draining); if the process dies instead, the lease
//! expires after its TTL and etcd deletes the key.
//!
//! A client [`resolve`]s a service: it lists the prefix, then watches it, and reports
//! [`Change`]s that a [`Balanced`](rpc_core::balance::Balanced) client follows. The
//! watch outlives etcd's failures: it resumes from the last revision seen, with
//! [`Backoff`], and lists again if etcd compacted that revision away.
//!
//! Layout: this file registers and starts following; `follow.rs` is the watch that
//! resumes (IO); `replicas.rs` the known set and its changes (no IO); `backoff.rs` the
//! waits between attempts.
//!
//! Building this crate needs `protoc` (etcd-client generates its gRPC code): install
//! Debian's `protobuf-compiler` or point `PROTOC` at one.
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! use std::time::Duration;
//! let cluster = ["127.0.0.1:2379"];
//! let me: rpc_core::Endpoint = "tcp://10.0.0.5:7000".parse()?;
//! let registration = rpc_discovery_etcd::register(&cluster, "kv", &me, Duration::from_secs(5)).await?;
//! // ... serve; on SIGTERM:
//! registration.deregister().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};
use futures::{stream::BoxStream, StreamExt};
use rpc_core::{balance::Change, Endpoint, Error, ErrorKind};
use tokio::task::JoinHandle;

mod backoff;
mod follow;
mod replicas;

pub use backoff::Backoff;

/// Key prefix under which services register.
pub const PREFIX: &str = "rpc/services/";

/// How long a registration waits for etcd to answer a lease renewal before it opens a
/// new renewal stream (and between attempts to open one).
const KEEP_ALIVE_ANSWER: Duration = Duration::from_secs(1);

/// How long a follower's attempt to connect to etcd may take.
const FOLLOW_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How often a follower pings etcd on an idle connection: a watch on a host that went
/// silent fails (and is resumed elsewhere) within this plus the timeout below. Not
/// under etcd's default `--grpc-keepalive-min-time` of 5 s, which would refuse it.
const FOLLOW_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// How long a follower waits for etcd to answer a ping.
const FOLLOW_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) fn etcd_error(context: &str, err: etcd_client::Error) -> Error {
    Error::new(ErrorKind::Io, format!("etcd: {context}")).with_source(err)
}

fn service_prefix(service: &str) -> String {
    format!("{PREFIX}{service}/")
}

fn endpoints(cluster: &[impl AsRef<str>]) -> Vec<String> {
    cluster
        .iter()
        .map(|e| format!("http://{}", e.as_ref()))
        .collect()
}

async fn connect(cluster: &[impl AsRef<str>]) -> Result<Client, Error> {
    let endpoints = endpoints(cluster);
    Client::connect(&endpoints, None)
        .await
        .map_err(|e| etcd_error(&format!("connect to {}", endpoints.join(",")), e))
}

/// A server's registration; keeps its lease alive until dropped or deregistered.
pub struct Registration {
    client: Client,
    lease: i64,
    key: String,
    keep_alive: JoinHandle<()>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.key)
            .field("lease", &self.lease)
            .finish()
    }
}

/// Registers `advertise` as a replica of `service`, under a lease of `ttl` that is kept
/// alive (renewed every third of the TTL) until the registration is dropped or
/// deregistered. Renewal survives etcd restarting (a new renewal stream is opened);
/// a lease that expired meanwhile (etcd away for longer than the TTL) is logged as an
/// error, and the replica is then no longer registered.
pub async fn register(
    cluster: &[impl AsRef<str>],
    service: &str,
    advertise: &Endpoint,
    ttl: Duration,
) -> Result<Registration, Error> {
    let mut client = connect(cluster).await?;
    let ttl_s = ttl.as_secs().max(1) as i64;
    let lease = client
        .lease_grant(ttl_s, None)
        .await
        .map_err(|e| etcd_error("grant a lease", e))?
        .id();
    let key = format!("{}{lease:x}", service_prefix(service));
    client
        .put(
            key.clone(),
            advertise.to_string(),
            Some(PutOptions::new().with_lease(lease)),
        )
        .await
        .map_err(|e| etcd_error(&format!("put {key}"), e))?;
    let (mut keeper, mut responses) = client
        .lease_keep_alive(lease)
        .await
        .map_err(|e| etcd_error("keep the lease alive", e))?;
    let every = Duration::from_secs_f64(ttl_s as f64 / 3.0);
    let mut renewing = client.clone();
    let keep_alive = tokio::spawn(async move {
        loop {
            // A renewal counts once etcd has answered it with the lease still alive.
            let answer = match keeper.keep_alive().await {
                Ok(()) => tokio::time::timeout(KEEP_ALIVE_ANSWER, responses.message()).await,
                Err(err) => Ok(Err(err)),
            };
            match answer {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    tokio::time::sleep(every).await;
                    continue;
                }
                Ok(Ok(Some(_))) => {
                    tracing::error!(
                        lease,
                        "etcd lease expired: this replica is no longer registered"
                    );
                    return;
                }
                Ok(Ok(None)) => tracing::warn!("etcd lease keep-alive stream ended"),
                Ok(Err(err)) => tracing::warn!(error = %err, "etcd lease keep-alive failed"),
                Err(_) => tracing::warn!("etcd did not answer a lease keep-alive"),
            }
            // The stream is broken (etcd restarted, the network): open another one,
            // and renew on it at once.
            tokio::time::sleep(every.min(KEEP_ALIVE_ANSWER)).await;
            match renewing.lease_keep_alive(lease).await {
                Ok((k, r)) => (keeper, responses) = (k, r),
                Err(err) => tracing::warn!(error = %err, "etcd lease keep-alive: reconnecting"),
            }
        }
    });
    tracing::info!(%key, %advertise, "registered in etcd");
    Ok(Registration {
        client,
        lease,
        key,
        keep_alive,
    })
}

impl Registration {
    /// The key this replica is registered under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Removes the registration now (revokes the lease): clients watching the service
    /// see the replica go before it stops serving.
    pub async fn deregister(mut self) -> Result<(), Error> {
        self.keep_alive.abort();
        self.client
            .lease_revoke(self.lease)
            .await
            .map_err(|e| etcd_error("revoke the lease", e))?;
        tracing::info!(key = %self.key, "deregistered from etcd");
        Ok(())
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Without a revoke, the key goes when the lease expires.
        self.keep_alive.abort();
    }
}

/// The replicas of `service`: the ones registered now, then changes as they happen,
/// with the default [`Backoff`]; see [`resolve_with`].
pub async fn resolve(
    cluster: &[impl AsRef<str>],
    service: &str,
) -> Result<BoxStream<'static, Change>, Error> {
    resolve_with(cluster, service, Backoff::default()).await
}

/// The replicas of `service`: the ones registered now, then changes as they happen.
///
/// Fails only if the first listing does (etcd unreachable at the start). After that
/// the stream never ends on its own: when the watch fails (etcd restarting, a leader
/// election, the network) it is resumed from the revision after the last one seen,
/// after a wait given by `backoff`; meanwhile the last known replicas stay as they
/// are. If etcd has compacted its history past that revision, the prefix is listed
/// again and the difference reported as `Insert`s and `Remove`s, then the watch
/// resumes from the listing's revision. Drop the stream to stop following.
pub async fn resolve_with(
    cluster: &[impl AsRef<str>],
    service: &str,
    backoff: Backoff,
) -> Result<BoxStream<'static, Change>, Error> {
    let client = connect_following(cluster).await?;
    let (follower, initial) =
        follow::Follower::start(client, service_prefix(service), backoff).await?;
    let updates = futures::stream::unfold(follower, |mut follower| async move {
        let changes = follower.next_changes().await;
        Some((futures::stream::iter(changes), follower))
    })
    .flatten();
    Ok(futures::stream::iter(initial).chain(updates).boxed())
}

/// A client for following: its connections time out, and a watch on a member that
/// has lost its leader fails (and is resumed) instead of going silent.
async fn connect_following(cluster: &[impl AsRef<str>]) -> Result<Client, Error> {
    let endpoints = endpoints(cluster);
    let options = ConnectOptions::new()
        .with_connect_timeout(FOLLOW_CONNECT_TIMEOUT)
        .with_keep_alive(FOLLOW_KEEP_ALIVE, FOLLOW_KEEP_ALIVE_TIMEOUT)
        .with_require_leader(true);
    Client::connect(&endpoints, Some(options))
        .await
        .map_err(|e| etcd_error(&format!("connect to {}", endpoints.join(",")), e))
}
