//! The connection to etcd: the generated KV, Lease and Watch clients over one
//! [`Balanced`] client of the cluster's members, each reached over `grpc://` (h2c) by
//! `rpc-transport-grpc`.

use std::time::Duration;

use rpc_core::{balance::Balanced, client::Channel, Endpoint, Error, ErrorKind, Status};
use rpc_transport_grpc::{Address, GrpcConfig, GrpcConnector};

use crate::proto::etcdserverpb::{
    kv_client::KvClient, lease_client::LeaseClient, watch_client::WatchClient,
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

/// etcd's clients, sharing one balanced set of connections to the cluster's members.
#[derive(Clone)]
pub(crate) struct Etcd {
    pub(crate) kv: KvClient<Balanced>,
    pub(crate) lease: LeaseClient<Balanced>,
    pub(crate) watch: WatchClient<Balanced>,
    members: Vec<Endpoint>,
}

impl Etcd {
    /// Clients of the members `cluster` names (`host:port` each, or `grpc://host:port`).
    /// Connects lazily: an unreachable cluster shows in the first call.
    pub(crate) fn connect(cluster: &[impl AsRef<str>]) -> Result<Etcd, Error> {
        let endpoints = cluster
            .iter()
            .map(|member| endpoint(member.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidAddress,
                "etcd: no cluster member given",
            ));
        }
        Etcd::on(endpoints)
    }

    /// The same members on new connections, for when etcd stopped answering on the
    /// ones in use. A connection whose peer went silent (a host cut off, packets
    /// lost without a reset) fails no call by itself: the gRPC link sends no HTTP/2
    /// PINGs, so only a deadline shows it, and calls made on it again would wait as
    /// long. The old connections close as their last calls go.
    pub(crate) fn reconnect(&mut self) {
        // Cannot fail: these members made channels before.
        if let Ok(fresh) = Etcd::on(self.members.clone()) {
            *self = fresh;
        }
    }

    /// Clients of `members`, on channels of their own.
    fn on(members: Vec<Endpoint>) -> Result<Etcd, Error> {
        let builder = Channel::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .reconnect_backoff(RECONNECT_BACKOFF.0, RECONNECT_BACKOFF.1);
        let make = move |endpoint: &Endpoint| -> Result<Channel, Error> {
            // HTTP/2 keepalive: a member gone silent fails every call on its
            // connection at once (etcd permits a PING every 5 s by default).
            let config = GrpcConfig::default()
                .keepalive_interval(Some(KEEPALIVE.0))
                .keepalive_timeout(KEEPALIVE.1);
            let connector = GrpcConnector::new(Address::try_from(endpoint)?, config);
            Ok(builder.clone().connect_lazy(connector))
        };
        let balanced = Balanced::from_endpoints(make, members.iter().cloned())?;
        Ok(Etcd {
            kv: KvClient::new(balanced.clone()),
            lease: LeaseClient::new(balanced.clone()),
            watch: WatchClient::new(balanced),
            members,
        })
    }
}

/// A member's `grpc://` endpoint: `host:port` as etcd's clients write it, or a
/// `grpc://` URI.
fn endpoint(member: &str) -> Result<Endpoint, Error> {
    let uri = if member.contains("://") {
        member.to_owned()
    } else {
        format!("grpc://{member}")
    };
    let endpoint: Endpoint = uri.parse()?;
    Address::try_from(&endpoint)?;
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
        assert_eq!(
            endpoint("127.0.0.1:2379").unwrap().to_string(),
            "grpc://127.0.0.1:2379"
        );
        assert_eq!(
            endpoint("grpc://etcd-0:2379").unwrap().to_string(),
            "grpc://etcd-0:2379"
        );
        assert!(endpoint("tcp://127.0.0.1:2379").is_err());
        assert!(endpoint("no port").is_err());
    }
}
