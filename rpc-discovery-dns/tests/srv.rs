//! DNS discovery against a real DNS server on loopback UDP (`support::Responder`),
//! whose records change while the tests run.

mod support;

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use hickory_resolver::proto::rr::RecordType;
use support::{a, aaaa, name, set, srv, Follower, Responder};

const SERVICE: &str = "_kv._tcp.svc.test.";

fn ip(last: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, last)
}

/// Two targets of the same priority, one with an IPv4 and an IPv6 address.
fn two_targets() -> Vec<hickory_resolver::proto::rr::Record> {
    vec![
        srv(SERVICE, 10, 7001, "a.svc.test."),
        srv(SERVICE, 10, 7002, "b.svc.test."),
        a("a.svc.test.", ip(2)),
        aaaa("a.svc.test.", Ipv6Addr::LOCALHOST),
        a("b.svc.test.", ip(3)),
    ]
}

#[tokio::test]
async fn srv_names_resolve_to_the_targets_addresses_at_the_srv_ports() {
    let dns = Responder::start(two_targets()).await;
    let resolver = dns.resolver();

    let mut tcp = Follower::start(&resolver, "dns://_kv._tcp.svc.test");
    assert_eq!(
        tcp.batch().await,
        set(&[
            "+tcp://127.0.0.2:7001",
            "+tcp://[::1]:7001",
            "+tcp://127.0.0.3:7002"
        ])
    );

    let mut udp = Follower::start(&resolver, "dns+udp://_kv._tcp.svc.test");
    assert_eq!(
        udp.batch().await,
        set(&[
            "+udp://127.0.0.2:7001",
            "+udp://[::1]:7001",
            "+udp://127.0.0.3:7002"
        ])
    );
}

#[tokio::test]
async fn addresses_in_the_additional_section_are_used() {
    let dns = Responder::start(vec![
        srv(SERVICE, 0, 7001, "a.svc.test."),
        a("a.svc.test.", ip(2)),
        aaaa("a.svc.test.", Ipv6Addr::LOCALHOST),
    ])
    .await;
    dns.set_glue(true);
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(
        follower.batch().await,
        set(&["+tcp://127.0.0.2:7001", "+tcp://[::1]:7001"])
    );
    let asked_for_target = dns
        .log()
        .into_iter()
        .filter(|(n, _)| *n == name("a.svc.test."))
        .collect::<Vec<_>>();
    assert_eq!(
        asked_for_target,
        vec![],
        "the target was looked up separately"
    );
}

#[tokio::test]
async fn only_the_lowest_priority_is_used() {
    let dns = Responder::start(vec![
        srv(SERVICE, 20, 7002, "backup.svc.test."),
        srv(SERVICE, 10, 7001, "a.svc.test."),
        a("a.svc.test.", ip(2)),
        a("backup.svc.test.", ip(9)),
    ])
    .await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.2:7001"]));

    // With the priority-10 record gone, the backups are the lowest priority.
    dns.set_records(vec![
        srv(SERVICE, 20, 7002, "backup.svc.test."),
        a("a.svc.test.", ip(2)),
        a("backup.svc.test.", ip(9)),
    ]);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7001", "+tcp://127.0.0.9:7002"])
    );
}

/// A priority group whose every target has no address falls back to the next group
/// (RFC 2782: the lower priorities are tried first, not only). A review: the set was
/// emptied though the standby resolved.
#[tokio::test]
async fn a_priority_without_addresses_falls_back_to_the_next() {
    let dns = Responder::start(vec![
        srv(SERVICE, 10, 7001, "ghost.svc.test."),
        srv(SERVICE, 20, 7002, "standby.svc.test."),
        a("standby.svc.test.", ip(9)),
    ])
    .await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.9:7002"]));

    // The first group gets an address: it is used, and the standby left.
    dns.set_records(vec![
        srv(SERVICE, 10, 7001, "ghost.svc.test."),
        srv(SERVICE, 20, 7002, "standby.svc.test."),
        a("ghost.svc.test.", ip(2)),
        a("standby.svc.test.", ip(9)),
    ]);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&["+tcp://127.0.0.2:7001", "-tcp://127.0.0.9:7002"])
    );
}

#[tokio::test]
async fn changed_records_are_reported_as_differences_after_refresh() {
    let dns = Responder::start(two_targets()).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    // b leaves, c arrives, a moves to another port and loses its IPv6 address.
    dns.set_records(vec![
        srv(SERVICE, 10, 7005, "a.svc.test."),
        srv(SERVICE, 10, 7003, "c.svc.test."),
        a("a.svc.test.", ip(2)),
        a("c.svc.test.", ip(4)),
    ]);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&[
            "-tcp://127.0.0.2:7001",
            "-tcp://[::1]:7001",
            "-tcp://127.0.0.3:7002",
            "+tcp://127.0.0.2:7005",
            "+tcp://127.0.0.4:7003",
        ])
    );
}

#[tokio::test]
async fn a_silent_server_keeps_the_last_set_and_lookups_are_retried() {
    let dns = Responder::start(two_targets()).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    dns.set_silent(true);
    let before = dns.count(RecordType::SRV);
    follower.refresh.refresh();
    // One refresh starts one lookup, which sends at most 3 queries (hickory's
    // attempts); 7 unanswered queries take at least 3 lookups: backoff retries.
    follower
        .assert_no_changes_while(dns.wait_for(RecordType::SRV, before + 7))
        .await;

    // The server comes back with a new member; a retry (not a refresh, and not the
    // hour-long interval) finds it, and nothing was removed in between.
    dns.set_records(
        two_targets()
            .into_iter()
            .chain([
                srv(SERVICE, 10, 7003, "c.svc.test."),
                a("c.svc.test.", ip(4)),
            ])
            .collect(),
    );
    dns.set_silent(false);
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.4:7003"]));
}

#[tokio::test]
async fn servfail_is_a_failure_not_an_absence() {
    let dns = Responder::start(two_targets()).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    dns.set_servfail(&[RecordType::SRV]);
    let before = dns.count(RecordType::SRV);
    follower.refresh.refresh();
    follower
        .assert_no_changes_while(dns.wait_for(RecordType::SRV, before + 3))
        .await;

    dns.set_servfail(&[]);
    dns.set_records(vec![
        srv(SERVICE, 10, 7002, "b.svc.test."),
        a("b.svc.test.", ip(3)),
    ]);
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7001", "-tcp://[::1]:7001"])
    );
}

#[tokio::test]
async fn a_name_that_disappears_is_emptied_only_when_a_second_lookup_confirms_it() {
    let dns = Responder::start(two_targets()).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    // One NXDOMAIN, then the name is back (with one more member): the confirming
    // lookup sees it, and nothing is removed.
    dns.set_nxdomain_next(1);
    dns.set_records(
        two_targets()
            .into_iter()
            .chain([
                srv(SERVICE, 10, 7003, "c.svc.test."),
                a("c.svc.test.", ip(4)),
            ])
            .collect(),
    );
    let before = dns.count(RecordType::SRV);
    follower.refresh.refresh();
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.4:7003"]));
    assert!(dns.count(RecordType::SRV) >= before + 2, "{:?}", dns.log());

    // Gone for good: removed after the second NXDOMAIN.
    dns.set_records(vec![]);
    let before = dns.count(RecordType::SRV);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&[
            "-tcp://127.0.0.2:7001",
            "-tcp://[::1]:7001",
            "-tcp://127.0.0.3:7002",
            "-tcp://127.0.0.4:7003",
        ])
    );
    assert!(dns.count(RecordType::SRV) >= before + 2, "{:?}", dns.log());
}

/// A refresh while an absence waits for its confirmation (`retry_min` later) does
/// not hurry the confirming lookup: an outage shorter than `retry_min` (here, 200 ms
/// of NXDOMAIN) empties nothing, refresh or not. (A review: the balancer's ejection
/// hook refreshes, and the confirmation came from the same outage.)
#[tokio::test]
async fn a_refresh_does_not_hurry_the_confirmation_of_an_absence() {
    let dns = Responder::start(two_targets()).await;
    let resolver = dns.resolver_retrying_after(Duration::from_secs(1));
    let mut follower = Follower::start(&resolver, "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    dns.set_nxdomain_next(2);
    let before = dns.count(RecordType::SRV);
    follower.refresh.refresh();
    dns.wait_for(RecordType::SRV, before + 1).await;
    follower.refresh.refresh();
    let outage = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        dns.set_nxdomain_next(0);
        // The confirming lookup, a second after the first, finds the name again.
        dns.wait_for(RecordType::SRV, before + 2).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    follower.assert_no_changes_while(outage).await;
}

#[tokio::test]
async fn names_with_a_port_resolve_a_and_aaaa_records() {
    let dns = Responder::start(vec![
        a("kv.test.", ip(2)),
        aaaa("kv.test.", Ipv6Addr::LOCALHOST),
    ])
    .await;
    let resolver = dns.resolver();
    let mut follower = Follower::start(&resolver, "dns://kv.test:7000");
    assert_eq!(
        follower.batch().await,
        set(&["+tcp://127.0.0.2:7000", "+tcp://[::1]:7000"])
    );
    let mut udp = Follower::start(&resolver, "dns+udp://kv.test:7000");
    assert_eq!(
        udp.batch().await,
        set(&["+udp://127.0.0.2:7000", "+udp://[::1]:7000"])
    );

    dns.set_records(vec![
        a("kv.test.", ip(3)),
        aaaa("kv.test.", Ipv6Addr::LOCALHOST),
    ]);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7000", "+tcp://127.0.0.3:7000"])
    );
}

#[tokio::test]
async fn a_failed_aaaa_lookup_does_not_drop_the_ipv6_members() {
    let dns = Responder::start(vec![
        a("kv.test.", ip(2)),
        aaaa("kv.test.", Ipv6Addr::LOCALHOST),
    ])
    .await;
    let mut follower = Follower::start(&dns.resolver(), "dns://kv.test:7000");
    assert_eq!(follower.batch().await.len(), 2);

    // While AAAA fails, A's answer is the truth for the IPv4 members; the IPv6 one
    // stays.
    dns.set_servfail(&[RecordType::AAAA]);
    dns.set_records(vec![
        a("kv.test.", ip(3)),
        aaaa("kv.test.", Ipv6Addr::LOCALHOST),
    ]);
    follower.refresh.refresh();
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7000", "+tcp://127.0.0.3:7000"])
    );
    let before = dns.count(RecordType::AAAA);
    follower
        .assert_no_changes_while(dns.wait_for(RecordType::AAAA, before + 3))
        .await;

    // A whole answer again: the set is what it says.
    dns.set_servfail(&[]);
    dns.set_records(vec![a("kv.test.", ip(4))]);
    assert_eq!(
        follower.batch().await,
        set(&[
            "-tcp://127.0.0.3:7000",
            "-tcp://[::1]:7000",
            "+tcp://127.0.0.4:7000"
        ])
    );
}

/// While a target's lookups fail in part for good (AAAA answered with `SERVFAIL`),
/// every SRV lookup is partial: the failed part keeps that target's own last known
/// addresses, not every member, so a deleted record's replica still goes and a
/// target's changed IPv4 address is followed (a review: all were kept for good).
#[tokio::test]
async fn a_deleted_srv_record_goes_while_a_target_keeps_failing_in_part() {
    let dns = Responder::start(two_targets()).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await.len(), 3);

    dns.set_servfail(&[RecordType::AAAA]);
    dns.set_records(vec![
        srv(SERVICE, 10, 7001, "a.svc.test."),
        a("a.svc.test.", ip(2)),
        aaaa("a.svc.test.", Ipv6Addr::LOCALHOST),
        a("b.svc.test.", ip(3)),
    ]);
    follower.refresh.refresh();
    assert_eq!(follower.batch().await, set(&["-tcp://127.0.0.3:7002"]));

    dns.set_records(vec![
        srv(SERVICE, 10, 7001, "a.svc.test."),
        a("a.svc.test.", ip(4)),
        aaaa("a.svc.test.", Ipv6Addr::LOCALHOST),
    ]);
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7001", "+tcp://127.0.0.4:7001"])
    );
    // The IPv6 member stays while AAAA fails, and the partial answers change nothing.
    let before = dns.count(RecordType::AAAA);
    follower
        .assert_no_changes_while(dns.wait_for(RecordType::AAAA, before + 2))
        .await;
}

/// A higher priority whose only target fails, with nothing known of it, falls back
/// to the next priority's members for now instead of answering "no members" (a
/// review: the first version of the per-target memory emptied the set).
#[tokio::test]
async fn a_failed_priority_with_nothing_known_falls_back_to_the_next() {
    let dns = Responder::start(vec![
        srv(SERVICE, 10, 7001, "v6only.svc.test."),
        srv(SERVICE, 20, 7002, "b.svc.test."),
        aaaa("v6only.svc.test.", Ipv6Addr::LOCALHOST),
        a("b.svc.test.", ip(3)),
    ])
    .await;
    // The IPv6-only target's lookup fails (A: no records, AAAA: SERVFAIL), for good.
    dns.set_servfail(&[RecordType::AAAA]);
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.3:7002"]));
    // Its lookups go on failing: the fallback's members stay.
    let before = dns.count(RecordType::AAAA);
    follower
        .assert_no_changes_while(dns.wait_for(RecordType::AAAA, before + 4))
        .await;
}

/// Some resolvers answer AAAA queries for IPv4-only names with SERVFAIL, for good: the
/// name's IPv4 members are used all the same (the set stayed empty, and every call
/// failed "no replicas known").
#[tokio::test]
async fn a_name_whose_aaaa_lookups_always_fail_gets_its_ipv4_members() {
    let dns = Responder::start(vec![a("kv.test.", ip(2))]).await;
    dns.set_servfail(&[RecordType::AAAA]);
    let mut follower = Follower::start(&dns.resolver(), "dns://kv.test:7000");
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.2:7000"]));

    // SRV targets alike (no glue: each target's A and AAAA are looked up).
    let dns = Responder::start(vec![
        srv(SERVICE, 10, 7001, "a.svc.test."),
        srv(SERVICE, 10, 7002, "b.svc.test."),
        a("a.svc.test.", ip(2)),
        a("b.svc.test.", ip(3)),
    ])
    .await;
    dns.set_glue(false);
    dns.set_servfail(&[RecordType::AAAA]);
    let mut follower = Follower::start(&dns.resolver(), "dns://_kv._tcp.svc.test");
    assert_eq!(
        follower.batch().await,
        set(&["+tcp://127.0.0.2:7001", "+tcp://127.0.0.3:7002"])
    );
}

#[tokio::test]
async fn a_short_ttl_schedules_the_next_lookup() {
    let mut records = vec![a("kv.test.", ip(2))];
    records[0].set_ttl(1);
    let dns = Responder::start(records).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://kv.test:7000");
    assert_eq!(follower.batch().await, set(&["+tcp://127.0.0.2:7000"]));

    // No refresh, and the interval is an hour: only the 1 s TTL brings this.
    dns.set_records(vec![a("kv.test.", ip(3))]);
    assert_eq!(
        follower.batch().await,
        set(&["-tcp://127.0.0.2:7000", "+tcp://127.0.0.3:7000"])
    );
}

#[tokio::test]
async fn other_endpoints_are_resolved_by_rpc_core() {
    let dns = Responder::start(vec![]).await;
    let mut follower = Follower::start(&dns.resolver(), "static://a:1,udp://b:2");
    assert_eq!(follower.batch().await, set(&["+tcp://a:1", "+udp://b:2"]));
    assert!(dns.log().is_empty());
}

/// A name with more records than a 512-byte UDP answer holds: the server truncates it,
/// and the lookup asks again over TCP. With your own name servers it only ever asked
/// over UDP, and the name never resolved.
#[tokio::test]
async fn a_name_too_large_for_a_udp_answer_is_looked_up_over_tcp() {
    let records: Vec<_> = (1..=40).map(|i| a("many.test.", ip(i))).collect();
    let dns = Responder::start(records).await;
    let mut follower = Follower::start(&dns.resolver(), "dns://many.test:7000");
    let expected: Vec<String> = (1..=40).map(|i| format!("+tcp://{}:7000", ip(i))).collect();
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_eq!(follower.batch().await, set(&expected));
}
