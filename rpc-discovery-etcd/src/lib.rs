//! Service discovery in etcd.
//!
//! A server [`register`]s its advertised address under
//! `rpc/services/<service>/<lease id>`, attached to a lease that a task owned by the
//! returned [`Registration`] keeps alive. [`Registration::deregister`] revokes the
//! lease at once (do it first when draining); if the process dies instead, the lease
//! expires after its TTL and etcd deletes the key.
//!
//! A client [`resolve`]s a service: it lists the prefix, then watches it, and reports
//! [`Change`]s that a [`Balanced`](rpc_core::balance::Balanced) client follows.
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

use std::{collections::HashMap, time::Duration};

use etcd_client::{Client, EventType, GetOptions, PutOptions, WatchOptions};
use futures::{stream::BoxStream, StreamExt};
use rpc_core::{balance::Change, Endpoint, Error, ErrorKind};
use tokio::task::JoinHandle;

/// Key prefix under which services register.
pub const PREFIX: &str = "rpc/services/";

fn etcd_error(context: &str, err: etcd_client::Error) -> Error {
    Error::new(ErrorKind::Io, format!("etcd: {context}")).with_source(err)
}

fn service_prefix(service: &str) -> String {
    format!("{PREFIX}{service}/")
}

async fn connect(cluster: &[impl AsRef<str>]) -> Result<Client, Error> {
    let endpoints: Vec<String> = cluster
        .iter()
        .map(|e| format!("http://{}", e.as_ref()))
        .collect();
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
/// deregistered.
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
    let keep_alive = tokio::spawn(async move {
        loop {
            if let Err(err) = keeper.keep_alive().await {
                tracing::warn!(error = %err, "etcd lease keep-alive failed");
            }
            // Drain the answers so the stream does not back up.
            let _ = tokio::time::timeout(Duration::from_secs(1), responses.message()).await;
            tokio::time::sleep(every).await;
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

/// The replicas of `service`: the ones registered now, then changes as they happen.
/// The stream ends if the watch fails.
pub async fn resolve(
    cluster: &[impl AsRef<str>],
    service: &str,
) -> Result<BoxStream<'static, Change>, Error> {
    let mut client = connect(cluster).await?;
    let prefix = service_prefix(service);
    let listed = client
        .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| etcd_error(&format!("list {prefix}"), e))?;
    let revision = listed.header().map_or(0, |h| h.revision());
    let mut known: HashMap<String, Endpoint> = HashMap::new();
    let mut initial = Vec::new();
    for kv in listed.kvs() {
        if let (Ok(key), Ok(Ok(endpoint))) =
            (kv.key_str(), kv.value_str().map(str::parse::<Endpoint>))
        {
            known.insert(key.to_owned(), endpoint.clone());
            initial.push(Change::Insert(endpoint));
        }
    }
    let (watcher, watch) = client
        .watch(
            prefix.clone(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        )
        .await
        .map_err(|e| etcd_error(&format!("watch {prefix}"), e))?;
    let updates = futures::stream::unfold(
        (watch, watcher, known, client),
        |(mut watch, watcher, mut known, client)| async move {
            let response = match watch.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return None,
                Err(err) => {
                    tracing::warn!(error = %err, "etcd watch failed");
                    return None;
                }
            };
            let mut changes = Vec::new();
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                match event.event_type() {
                    EventType::Put => {
                        if let Ok(Ok(endpoint)) = kv.value_str().map(str::parse::<Endpoint>) {
                            if let Some(old) = known.insert(key.to_owned(), endpoint.clone()) {
                                changes.push(Change::Remove(old));
                            }
                            changes.push(Change::Insert(endpoint));
                        }
                    }
                    EventType::Delete => {
                        if let Some(old) = known.remove(key) {
                            changes.push(Change::Remove(old));
                        }
                    }
                }
            }
            Some((
                futures::stream::iter(changes),
                (watch, watcher, known, client),
            ))
        },
    )
    .flatten();
    Ok(futures::stream::iter(initial).chain(updates).boxed())
}
