//! One lookup of a name through hickory-resolver, as an [`Outcome`]: A and AAAA
//! records at a given port, or SRV records and their targets' addresses.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    time::Duration,
};

use hickory_resolver::{
    lookup::Lookup,
    proto::{
        op::ResponseCode,
        rr::{rdata::SRV, IntoName, Name, RData, RecordType},
        ProtoErrorKind,
    },
    ResolveError, TokioResolver,
};
use rpc_core::{endpoint::Scheme, Endpoint};

use crate::tracker::{Kept, Outcome};

/// Most SRV targets used from one answer: far more than a service has replicas, and a
/// bound on the follow-up lookups a hostile or broken answer can cause.
pub(crate) const MAX_SRV_TARGETS: usize = 256;

/// What to look up.
#[derive(Clone, Debug)]
pub(crate) enum Query {
    /// A and AAAA records of `name`, each address at `port`.
    Addresses {
        transport: Scheme,
        name: String,
        port: u16,
    },
    /// SRV records of `name`, each target's addresses at the record's port.
    Srv { transport: Scheme, name: String },
}

/// The answer to one query, or to the A and AAAA queries of one name.
enum Answer<T> {
    Found(T),
    /// What one of the A and AAAA queries found, the other having failed: true
    /// members, but maybe not all of them.
    Partial(T, Kept),
    /// `NXDOMAIN`, or no records of that type.
    Absent,
    /// Anything else: no answer, `SERVFAIL`, `REFUSED`, ...
    Failed,
}

/// Addresses with the shortest TTL of their records, in seconds.
#[derive(Clone, Debug)]
struct Addresses {
    ips: Vec<IpAddr>,
    ttl: u32,
}

/// The last addresses known of each SRV target of a name, kept between its lookups:
/// what a target whose lookup fails (or half fails) is taken to have meanwhile. So a
/// failed target keeps its own members and no one else's: the members of SRV records
/// deleted meanwhile go, even while some target's lookups keep failing (a resolver
/// that answers AAAA queries for IPv4-only names with `SERVFAIL`, for good).
#[derive(Debug, Default)]
pub(crate) struct Targets(HashMap<Name, Addresses>);

/// Looks `query` up once; `targets` carries what SRV lookups remember of their
/// targets from one lookup of the name to the next.
pub(crate) async fn look_up(
    resolver: &TokioResolver,
    query: &Query,
    targets: &mut Targets,
) -> Outcome {
    // Every lookup asks the name servers: the records may have changed since the
    // last one (that is why it is made), and the schedule already follows the TTLs.
    resolver.clear_cache();
    match query {
        Query::Addresses {
            transport,
            name,
            port,
        } => {
            if let Ok(ip) = name.parse::<IpAddr>() {
                return Outcome::Found {
                    members: HashSet::from([host(*transport, ip, *port)]),
                    ttl: Duration::MAX,
                };
            }
            let members = |found: Addresses| {
                found
                    .ips
                    .into_iter()
                    .map(|ip| host(*transport, ip, *port))
                    .collect()
            };
            match addresses(resolver, name.as_str()).await {
                Answer::Found(found) => Outcome::Found {
                    ttl: Duration::from_secs(found.ttl.into()),
                    members: members(found),
                },
                Answer::Partial(found, kept) => Outcome::Partial {
                    members: members(found),
                    kept,
                },
                Answer::Absent => Outcome::Absent,
                Answer::Failed => Outcome::Failed,
            }
        }
        Query::Srv { transport, name } => srv(resolver, *transport, name, targets).await,
    }
}

/// SRV records of `name`; the lowest priority's targets' addresses, from the answer's
/// additional section where it has them, else looked up.
async fn srv(
    resolver: &TokioResolver,
    transport: Scheme,
    name: &str,
    targets: &mut Targets,
) -> Outcome {
    let lookup = match answer(
        name,
        RecordType::SRV,
        resolver.lookup(name, RecordType::SRV).await,
    ) {
        Answer::Found(lookup) | Answer::Partial(lookup, _) => lookup,
        Answer::Absent => return Outcome::Absent,
        Answer::Failed => return Outcome::Failed,
    };
    let mut records = Vec::new();
    let mut ttl = u32::MAX;
    let mut additional: HashMap<Name, Addresses> = HashMap::new();
    for record in lookup.records() {
        let ip = match record.data() {
            RData::SRV(srv) => {
                records.push(srv.clone());
                ttl = ttl.min(record.ttl());
                continue;
            }
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
            _ => continue,
        };
        let entry = additional
            .entry(record.name().clone())
            .or_insert(Addresses {
                ips: Vec::new(),
                ttl: u32::MAX,
            });
        entry.ips.push(ip);
        entry.ttl = entry.ttl.min(record.ttl());
    }

    // Priority groups in order, lowest first (RFC 2782): the first whose targets
    // have addresses is used; a group whose every target has none falls back to the
    // next. A group with a failed target is used as it is (partial), with what is
    // remembered of that target; one that has nothing at all to show for it (its
    // targets failed, with nothing remembered) falls back too, and makes the answer
    // partial: a lower group's members stand in for now, and with none anywhere the
    // lookup failed (the set stays as it is; a failure is not an absence).
    let mut result = None;
    let mut failed_above = false;
    for group in priority_groups(&records) {
        match srv_group(
            resolver,
            transport,
            name,
            group,
            &mut additional,
            targets,
            ttl,
        )
        .await
        {
            Outcome::Absent => {}
            Outcome::Partial { members, .. } if members.is_empty() => failed_above = true,
            Outcome::Found { members, .. } if failed_above => {
                result = Some(Outcome::Partial {
                    members,
                    kept: Kept::Remembered,
                });
                break;
            }
            outcome => {
                result = Some(outcome);
                break;
            }
        }
    }
    let result = result.unwrap_or(if failed_above {
        Outcome::Failed
    } else {
        Outcome::Absent
    });
    // Only the targets of the records now: a deleted record's target is forgotten.
    targets
        .0
        .retain(|target, _| records.iter().any(|srv| srv.target() == target));
    result
}

/// The members of one priority group of SRV records (`ttl`: the SRV records'
/// shortest), its targets' addresses taken from `additional` where there, else
/// looked up; those of a target whose lookup failed (or half failed) from what
/// `targets` remembers of it.
async fn srv_group(
    resolver: &TokioResolver,
    transport: Scheme,
    name: &str,
    mut used: Vec<&SRV>,
    additional: &mut HashMap<Name, Addresses>,
    remember: &mut Targets,
    mut ttl: u32,
) -> Outcome {
    // hickory keeps the additional section's addresses of one target only (the last
    // SRV record's); the other targets are looked up below.
    if used.len() > MAX_SRV_TARGETS {
        tracing::warn!(%name, records = used.len(), "using the first {MAX_SRV_TARGETS} SRV records only");
        used.truncate(MAX_SRV_TARGETS);
    }
    let mut looking_up: Vec<&Name> = used
        .iter()
        .map(|srv| srv.target())
        .filter(|target| !additional.contains_key(*target))
        .collect();
    looking_up.sort();
    looking_up.dedup();
    let looked_up = futures::future::join_all(
        looking_up
            .iter()
            .map(|target| addresses(resolver, (*target).clone())),
    )
    .await;
    // A target that failed (or half failed) makes the answer partial (retried as a
    // failure): the part that failed keeps the addresses last known for it.
    let mut complete = true;
    for (target, found) in looking_up.into_iter().zip(looked_up) {
        match found {
            Answer::Found(found) => {
                additional.insert(target.clone(), found);
            }
            Answer::Partial(mut found, kept) => {
                complete = false;
                if let Some(known) = remember.0.get(target) {
                    found
                        .ips
                        .extend(known.ips.iter().filter(|ip| kept.holds_ip(**ip)));
                }
                additional.insert(target.clone(), found);
            }
            Answer::Absent => {
                tracing::debug!(%name, %target, "SRV target has no addresses");
                remember.0.remove(target);
            }
            Answer::Failed => {
                complete = false;
                if let Some(known) = remember.0.get(target) {
                    additional.insert(target.clone(), known.clone());
                }
            }
        }
    }
    // What each target has now (the additional section's addresses, a lookup's, or
    // those last known of one that failed) is what is remembered of it.
    for target in used.iter().map(|srv| srv.target()) {
        if let Some(found) = additional.get(target) {
            remember.0.insert(target.clone(), found.clone());
        }
    }

    let mut members = HashSet::new();
    for srv in used {
        if let Some(found) = additional.get(srv.target()) {
            ttl = ttl.min(found.ttl);
            members.extend(found.ips.iter().map(|ip| host(transport, *ip, srv.port())));
        }
    }
    if !complete {
        return Outcome::Partial {
            members,
            kept: Kept::Remembered,
        };
    }
    if members.is_empty() {
        return Outcome::Absent;
    }
    Outcome::Found {
        members,
        ttl: Duration::from_secs(ttl.into()),
    }
}

/// The SRV records by priority group, lowest priority first (a lower priority is
/// tried first; the others are fallbacks that a balancer over the first group does
/// not need while it has members), without targets of `.` (RFC 2782: "decidedly not
/// available"). Weights are ignored: the balancer spreads calls by load.
fn priority_groups(records: &[SRV]) -> Vec<Vec<&SRV>> {
    let mut available: Vec<&SRV> = records
        .iter()
        .filter(|srv| !srv.target().is_root())
        .collect();
    available.sort_by_key(|srv| srv.priority());
    available
        .chunk_by(|a, b| a.priority() == b.priority())
        .map(<[&SRV]>::to_vec)
        .collect()
}

/// A and AAAA records of `name`, looked up together. Found if either has records and
/// neither failed; partial if one has records and the other failed (a name whose
/// AAAA lookup failed must not lose its IPv6 members, and one whose AAAA lookups
/// always fail, as some resolvers' do for IPv4-only names, must still get its IPv4
/// ones).
async fn addresses(resolver: &TokioResolver, name: impl IntoName + Clone) -> Answer<Addresses> {
    let label = name
        .clone()
        .into_name()
        .map_or_else(|_| String::from("?"), |n| n.to_string());
    let (a, aaaa) = futures::join!(
        resolver.lookup(name.clone(), RecordType::A),
        resolver.lookup(name, RecordType::AAAA)
    );
    match (
        answer(&label, RecordType::A, a),
        answer(&label, RecordType::AAAA, aaaa),
    ) {
        (Answer::Failed, Answer::Failed | Answer::Absent) | (Answer::Absent, Answer::Failed) => {
            Answer::Failed
        }
        (Answer::Absent, Answer::Absent) => Answer::Absent,
        (a, aaaa) => {
            let failed = if matches!(a, Answer::Failed) {
                Some(Kept::V4)
            } else if matches!(aaaa, Answer::Failed) {
                Some(Kept::V6)
            } else {
                None
            };
            let mut found = Addresses {
                ips: Vec::new(),
                ttl: u32::MAX,
            };
            for lookup in [a, aaaa].into_iter().filter_map(|answer| match answer {
                Answer::Found(lookup) | Answer::Partial(lookup, _) => Some(lookup),
                Answer::Absent | Answer::Failed => None,
            }) {
                for record in lookup.records() {
                    let ip = match record.data() {
                        RData::A(a) => IpAddr::V4(a.0),
                        RData::AAAA(aaaa) => IpAddr::V6(aaaa.0),
                        _ => continue,
                    };
                    found.ips.push(ip);
                    found.ttl = found.ttl.min(record.ttl());
                }
            }
            match (found.ips.is_empty(), failed) {
                (true, None) => Answer::Absent,
                (true, Some(_)) => Answer::Failed,
                (false, None) => Answer::Found(found),
                (false, Some(kept)) => Answer::Partial(found, kept),
            }
        }
    }
}

/// Sorts a lookup's result into found, absent and failed.
fn answer(
    name: &str,
    record_type: RecordType,
    result: Result<Lookup, ResolveError>,
) -> Answer<Lookup> {
    match result {
        Ok(lookup) => Answer::Found(lookup),
        Err(err) if is_absence(&err) => {
            tracing::debug!(%name, %record_type, "no such records");
            Answer::Absent
        }
        Err(err) => {
            tracing::warn!(%name, %record_type, error = %err, "DNS lookup failed; keeping the last answer");
            Answer::Failed
        }
    }
}

/// Whether `err` says the records do not exist (`NXDOMAIN`, or `NOERROR` without
/// them), rather than that there was no usable answer (hickory reports `SERVFAIL` and
/// `REFUSED` as "no records found" too).
fn is_absence(err: &ResolveError) -> bool {
    err.proto().is_some_and(|proto| {
        matches!(
            proto.kind(),
            ProtoErrorKind::NoRecordsFound {
                response_code: ResponseCode::NXDomain | ResponseCode::NoError,
                ..
            }
        )
    })
}

/// A server address as [`rpc_core`] writes it (IPv6 in brackets).
fn host(scheme: Scheme, ip: IpAddr, port: u16) -> Endpoint {
    Endpoint::Host {
        scheme,
        host: match ip {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        },
        port,
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn srv(priority: u16, port: u16, target: &str) -> SRV {
        SRV::new(priority, 0, port, Name::from_str(target).unwrap())
    }

    fn ports(groups: Vec<Vec<&SRV>>) -> Vec<Vec<u16>> {
        groups
            .iter()
            .map(|g| g.iter().map(|s| s.port()).collect())
            .collect()
    }

    #[test]
    fn records_are_grouped_by_priority_lowest_first() {
        let records = [
            srv(20, 1, "backup.example."),
            srv(10, 2, "a.example."),
            srv(10, 3, "b.example."),
            srv(30, 4, "c.example."),
        ];
        assert_eq!(
            ports(priority_groups(&records)),
            vec![vec![2, 3], vec![1], vec![4]]
        );
    }

    #[test]
    fn root_targets_are_left_out() {
        let records = [srv(0, 1, "."), srv(5, 2, "a.example.")];
        assert_eq!(ports(priority_groups(&records)), vec![vec![2]]);
        assert!(priority_groups(&[srv(0, 1, ".")]).is_empty());
        assert!(priority_groups(&[]).is_empty());
    }

    #[test]
    fn addresses_are_written_as_endpoints_are() {
        assert_eq!(
            host(Scheme::Tcp, "10.0.0.1".parse().unwrap(), 7000),
            "tcp://10.0.0.1:7000".parse().unwrap()
        );
        assert_eq!(
            host(Scheme::Udp, "::1".parse().unwrap(), 7000),
            "udp://[::1]:7000".parse().unwrap()
        );
    }
}
