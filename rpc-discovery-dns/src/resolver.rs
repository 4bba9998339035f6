//! [`DnsResolver`]: endpoints as streams of changes, looked up again on a schedule,
//! after failures, and on [`Refresh::refresh`].

use std::{fmt, sync::Arc, time::Duration};

use futures::{stream::BoxStream, StreamExt};
use hickory_resolver::{
    config::{NameServerConfig, ResolveHosts, ResolverConfig},
    name_server::TokioConnectionProvider,
    proto::xfer::Protocol,
    TokioResolver,
};
use rpc_core::{balance::Change, Endpoint, Error, ErrorKind};
use tokio::sync::Notify;

use crate::{
    config::{DnsConfig, Schedule},
    lookup::{self, Query, Targets},
    tracker::Tracker,
};

/// Resolves endpoints into streams of replica [`Change`]s, with SRV support. See the
/// [crate docs](crate). Cheap to clone; clones share the hickory resolver.
#[derive(Clone)]
pub struct DnsResolver {
    resolver: Arc<TokioResolver>,
    schedule: Schedule,
}

impl fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsResolver")
            .field("schedule", &self.schedule)
            .field("nameservers", &self.resolver.config().name_servers())
            .finish_non_exhaustive()
    }
}

/// Asks one stream made by [`DnsResolver::resolve`] to look its name up again now, for
/// example when every replica it reported has failed. Cheap to clone. Does nothing for
/// endpoints that are not DNS names, or once the stream is dropped.
#[derive(Clone, Debug)]
pub struct Refresh(Arc<Notify>);

impl Refresh {
    fn new() -> Refresh {
        Refresh(Arc::new(Notify::new()))
    }

    /// Starts a lookup now (or right after the one in progress); the changes it finds
    /// come out of the stream as usual. Several calls before that lookup starts make one
    /// lookup.
    pub fn refresh(&self) {
        self.0.notify_one();
    }
}

impl DnsResolver {
    /// A resolver with `config`. Fails if `config.nameservers` is `None` and the
    /// system's configuration (`/etc/resolv.conf`) cannot be read.
    pub fn new(config: DnsConfig) -> Result<DnsResolver, Error> {
        let mut builder = match &config.nameservers {
            None => TokioResolver::builder_tokio().map_err(|err| {
                Error::new(ErrorKind::Io, "reading the system's DNS configuration").with_source(err)
            })?,
            Some(servers) => {
                // UDP first, and TCP for an answer too large for a datagram (its
                // truncated UDP answer is otherwise a failed lookup: a name with
                // a few dozen records never resolved), as with the system's servers.
                let servers: Vec<NameServerConfig> = servers
                    .iter()
                    .flat_map(|addr| {
                        [
                            NameServerConfig::new(*addr, Protocol::Udp),
                            NameServerConfig::new(*addr, Protocol::Tcp),
                        ]
                    })
                    .collect();
                let mut builder = TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), servers),
                    TokioConnectionProvider::default(),
                );
                builder.options_mut().use_hosts_file = ResolveHosts::Never;
                builder
            }
        };
        let options = builder.options_mut();
        // The schedule decides when to ask again; a cache would only hide changes.
        options.cache_size = 0;
        if let Some(timeout) = config.query_timeout {
            options.timeout = timeout;
        }
        Ok(DnsResolver {
            resolver: Arc::new(builder.build()),
            schedule: Schedule::from(&config),
        })
    }

    /// The changes that make up `endpoint`'s set of servers, as they happen, and a
    /// handle that makes the stream look its name up again at once.
    ///
    /// - `dns://name:port`: A and AAAA records, each address at `port`.
    /// - `dns://name`: SRV records of `name` as given (write the whole name, e.g.
    ///   `dns://_kv._tcp.example.com`); only the lowest priority's records are used,
    ///   weights are ignored, and each target's addresses are taken from the answer's
    ///   additional section if there, else looked up (A and AAAA).
    /// - `dns+udp://...` (and `+tcp`, `+tls`, `+grpc`, `+grpcs`, `+rdma`): the same,
    ///   with that transport.
    /// - Any other endpoint: [`rpc_core::discover::resolve`] (its `Refresh` does
    ///   nothing).
    ///
    /// DNS names are looked up when the stream is first polled, then again after the
    /// configured interval (or a shorter record TTL), after failures with backoff, and
    /// on [`Refresh::refresh`]. The lookups run in the stream: nothing happens unless
    /// it is polled (hand it to `Balanced::follow` and spawn that), and dropping it
    /// stops them. Only differences are reported; see the [crate docs](crate) for what
    /// failures and "does not exist" answers do.
    pub fn resolve(
        &self,
        endpoint: &Endpoint,
    ) -> Result<(BoxStream<'static, Change>, Refresh), Error> {
        let query = match endpoint {
            Endpoint::Dns {
                transport,
                name,
                port: Some(port),
            } => Query::Addresses {
                transport: *transport,
                name: name.clone(),
                port: *port,
            },
            Endpoint::Dns {
                transport,
                name,
                port: None,
            } => Query::Srv {
                transport: *transport,
                name: name.clone(),
            },
            _ => {
                let changes = rpc_core::discover::resolve(endpoint, self.schedule.interval)?;
                return Ok((changes, Refresh::new()));
            }
        };
        let refresh = Refresh::new();
        let changes = watch(Watch {
            resolver: self.resolver.clone(),
            query,
            tracker: Tracker::new(self.schedule),
            targets: Targets::default(),
            refresh: refresh.0.clone(),
            wait: None,
        });
        Ok((changes, refresh))
    }
}

/// One name being followed: what to look up, what is known, when to look again.
struct Watch {
    resolver: Arc<TokioResolver>,
    query: Query,
    tracker: Tracker,
    /// What SRV lookups remember of the name's targets.
    targets: Targets,
    refresh: Arc<Notify>,
    /// Delay before the next lookup; `None` before the first.
    wait: Option<Duration>,
}

/// Looks `watch.query` up now, then whenever the tracker's delay has passed or
/// `refresh` is notified, and yields the changes.
fn watch(watch: Watch) -> BoxStream<'static, Change> {
    futures::stream::unfold(watch, |mut watch| async move {
        loop {
            if let Some(delay) = watch.wait {
                if watch.tracker.confirming() {
                    // The lookup that confirms an absence waits its whole delay: a
                    // refresh (a replica's ejection, say) would otherwise draw the
                    // second answer from the same outage as the first.
                    tokio::time::sleep(delay).await;
                } else {
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = watch.refresh.notified() => {}
                    }
                }
            }
            let outcome = lookup::look_up(&watch.resolver, &watch.query, &mut watch.targets).await;
            tracing::trace!(query = ?watch.query, ?outcome, "DNS lookup");
            let step = watch.tracker.apply(outcome);
            watch.wait = Some(step.next);
            if !step.changes.is_empty() {
                return Some((futures::stream::iter(step.changes), watch));
            }
        }
    })
    .flatten()
    .boxed()
}
