//! DNS discovery: a service's replicas from A/AAAA or SRV records, looked up again on a
//! schedule, after failures, and on demand, as a stream of [`Change`]s that a
//! [`Balanced`](rpc_core::balance::Balanced) client follows.
//!
//! [`DnsResolver::resolve`] takes an [`Endpoint`]:
//!
//! - `dns://name:port`: the name's A and AAAA records, each address at `port`.
//! - `dns://name` (no port): the name's SRV records, **with the name as given**:
//!   write the whole SRV name, e.g. `dns://_kv._tcp.example.com`. Each record's target
//!   is resolved to its addresses at the record's port: from the answer's additional
//!   section when the server put them there (a target given only A records there is
//!   not asked for AAAA), else with A and AAAA lookups. Only the records of the
//!   lowest priority value are used (the others are fallbacks; the balancer already
//!   avoids replicas that fail), unless none of their targets has an address, or
//!   their lookups failed with no address known from before (then the next
//!   priority's are, for now), and weights are ignored (the balancer spreads calls
//!   by load, not by static weight).
//! - `dns+udp://...` (and `dns+tcp`, `dns+rdma`): the same, giving `udp://` (...)
//!   addresses.
//! - anything else: [`rpc_core::discover::resolve`].
//!
//! # When names are looked up
//!
//! - Every [`interval`](DnsConfig::interval) (30 s by default), or sooner if the
//!   records' TTL is shorter (but not more often than once a second).
//! - After a failed lookup (no answer, `SERVFAIL`, `REFUSED`, a target that could
//!   not be resolved): the last known set is kept, and the lookup is retried after
//!   [`retry_min`](DnsConfig::retry_min), doubling up to
//!   [`retry_max`](DnsConfig::retry_max) while it keeps failing. A lookup that
//!   failed only in part (the AAAA query failed and the A query answered, or one SRV
//!   target failed) is the truth for the part that answered (A's answer for the
//!   IPv4 members, say), keeps the known members of the part that failed (for an
//!   SRV target, the addresses last known for that target, at the ports of its
//!   records now: the members of deleted records still go), and is retried the same
//!   way: a set starting
//!   empty, or a name whose AAAA queries a resolver fails for good, still gets and
//!   follows the members that answer.
//! - On [`Refresh::refresh`], e.g. when every replica has failed and the service may
//!   have moved.
//!
//! Only differences are reported (an `Insert` per new address, a `Remove` per address
//! gone). An answer that the name has no members (`NXDOMAIN`, no records, no target
//! with an address) removes the known members only if the next lookup,
//! [`retry_min`](DnsConfig::retry_min) later, says so too: one bad answer does not
//! empty the balancer.
//!
//! Lookups bypass hickory's cache (each one asks the name servers) and are made while
//! the returned stream is polled, on the Tokio runtime polling it: this crate spawns
//! no task, and dropping the stream stops them.
//!
//! # Example
//!
//! ```no_run
//! use rpc_core::balance::Balanced;
//! use rpc_discovery_dns::{DnsConfig, DnsResolver};
//!
//! # async fn f() -> Result<(), rpc_core::Error> {
//! let dns = DnsResolver::new(DnsConfig::default())?;
//! let (changes, refresh) = dns.resolve(&"dns://_kv._tcp.example.com".parse()?)?;
//! # let make = |_: &rpc_core::Endpoint| -> Result<rpc_core::client::Channel, rpc_core::Error> { unimplemented!() };
//! let balanced = Balanced::new(make); // e.g. rpc_transport_tcp::StreamChannels::default()
//! // Look again at once when a replica fails, not only at the next interval.
//! balanced.on_ejection(move |_| refresh.refresh());
//! tokio::spawn(balanced.follow(changes));
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - [`DnsConfig`] (`config.rs`): intervals, backoff, name servers.
//! - [`DnsResolver`], [`Refresh`] (`resolver.rs`): the stream's loop.
//! - `lookup.rs`: one lookup through hickory-resolver; SRV priority selection.
//! - `tracker.rs`: the known set, confirmation of absence and backoff, without IO.
//!
//! [`Change`]: rpc_core::balance::Change
//! [`Endpoint`]: rpc_core::Endpoint

mod config;
mod lookup;
mod resolver;
mod tracker;

pub use config::{DnsConfig, DEFAULT_RETRY_MIN, MIN_TTL_INTERVAL};
pub use resolver::{DnsResolver, Refresh};
