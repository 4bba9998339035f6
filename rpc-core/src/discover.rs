//! Discovery: turns an [`Endpoint`] into a stream of [`Change`]s that a
//! [`Balanced`](crate::balance::Balanced) client follows.
//!
//! - A server address (`tcp://`, `unix://`, ...) is one `Insert`.
//! - `static://a,b,c` is one `Insert` per member.
//! - `dns://name:port` looks the name up (A and AAAA records, through the system
//!   resolver) now and then every `interval`, and reports the differences; a failed
//!   lookup keeps the last known set and is retried at the next interval.
//! - `dns://name` (SRV records) is refused here: the `rpc-discovery-dns` crate's
//!   `DnsResolver` resolves it (and `dns://name:port` too, with record TTLs, backoff
//!   after failures, and an on-demand refresh), and hands every other endpoint to
//!   this function.
//! - `etcd://` is refused too: use the `rpc-discovery-etcd` crate.

use std::{collections::HashSet, time::Duration};

use futures::{stream::BoxStream, StreamExt};

use crate::{
    balance::Change,
    endpoint::{Endpoint, Scheme},
    Error, ErrorKind,
};

/// Default time between two DNS lookups of the same name.
pub const DEFAULT_DNS_INTERVAL: Duration = Duration::from_secs(30);

/// The changes that make up `endpoint`'s set of servers, as they happen. See the
/// [module docs](self).
pub fn resolve(
    endpoint: &Endpoint,
    dns_interval: Duration,
) -> Result<BoxStream<'static, Change>, Error> {
    match endpoint {
        Endpoint::Host { .. }
        | Endpoint::Unix(_)
        | Endpoint::TlsUnix(_)
        | Endpoint::RdmaUnix(_) => {
            Ok(futures::stream::iter([Change::Insert(endpoint.clone())]).boxed())
        }
        Endpoint::Static(members) => Ok(futures::stream::iter(
            members
                .iter()
                .cloned()
                .map(Change::Insert)
                .collect::<Vec<_>>(),
        )
        .boxed()),
        Endpoint::Dns {
            transport,
            name,
            port: Some(port),
        } => Ok(dns_a(*transport, name.clone(), *port, dns_interval)),
        Endpoint::Dns { port: None, .. } => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{endpoint}: SRV records are not looked up here; use rpc_discovery_dns::DnsResolver \
                 (crate rpc-discovery-dns), or give a port (dns://name:port)"
            ),
        )),
        Endpoint::Etcd { .. } => Err(Error::new(
            ErrorKind::InvalidAddress,
            format!(
                "{endpoint}: etcd is not resolved here; use rpc_discovery_etcd::resolve \
                 (crate rpc-discovery-etcd)"
            ),
        )),
    }
}

/// A and AAAA lookups of `name`, repeated every `interval`, as differences.
fn dns_a(
    transport: Scheme,
    name: String,
    port: u16,
    interval: Duration,
) -> BoxStream<'static, Change> {
    let state = (HashSet::<Endpoint>::new(), true);
    futures::stream::unfold(state, move |(known, first)| {
        let name = name.clone();
        async move {
            if !first {
                tokio::time::sleep(interval).await;
            }
            let found: HashSet<Endpoint> = match tokio::net::lookup_host((name.as_str(), port))
                .await
            {
                Ok(addrs) => addrs
                    .map(|addr| Endpoint::Host {
                        scheme: transport,
                        host: match addr.ip() {
                            std::net::IpAddr::V4(ip) => ip.to_string(),
                            std::net::IpAddr::V6(ip) => format!("[{ip}]"),
                        },
                        port: addr.port(),
                    })
                    .collect(),
                Err(err) => {
                    tracing::warn!(%name, error = %err, "DNS lookup failed; keeping the last answer");
                    known.clone()
                }
            };
            let changes: Vec<Change> = known
                .difference(&found)
                .cloned()
                .map(Change::Remove)
                .chain(found.difference(&known).cloned().map(Change::Insert))
                .collect();
            Some((futures::stream::iter(changes), (found, false)))
        }
    })
    .flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_and_static_lists_are_inserts() {
        let e: Endpoint = "static://a:1,b:2".parse().unwrap();
        let changes: Vec<Change> = resolve(&e, DEFAULT_DNS_INTERVAL).unwrap().collect().await;
        assert_eq!(
            changes,
            vec![
                Change::Insert("tcp://a:1".parse().unwrap()),
                Change::Insert("tcp://b:2".parse().unwrap())
            ]
        );
    }

    #[tokio::test]
    async fn dns_names_resolve_to_addresses() {
        let e: Endpoint = "dns://localhost:7000".parse().unwrap();
        let mut changes = resolve(&e, DEFAULT_DNS_INTERVAL).unwrap();
        let first = changes.next().await.expect("localhost resolves");
        let Change::Insert(Endpoint::Host { port, host, .. }) = first else {
            panic!("{first:?}");
        };
        assert_eq!(port, 7000);
        assert!(host == "127.0.0.1" || host == "[::1]", "{host}");
    }

    #[test]
    fn srv_and_etcd_name_the_crate_that_resolves_them() {
        for (uri, resolver) in [
            ("dns://kv.example.com", "rpc-discovery-dns"),
            ("etcd://127.0.0.1:2379/kv", "rpc-discovery-etcd"),
        ] {
            let err = resolve(&uri.parse().unwrap(), DEFAULT_DNS_INTERVAL)
                .err()
                .unwrap();
            assert!(err.to_string().contains(resolver), "{err}");
        }
    }
}
