//! etcd as an independent gRPC server for our own client (`rpc-transport-grpc`), on
//! what discovery leans on: responses larger than HTTP/2's windows, in a listing and
//! on a long-lived bidirectional `Watch` stream, and the progress requests that tell a
//! follower its watch is alive. Against a real etcd, found (or skipped) as in
//! `etcd.rs`.

use std::time::Duration;

use futures::StreamExt;
use rpc_core::{balance::Change, client::Channel, Endpoint, Request};
use rpc_discovery_etcd::{
    proto::etcdserverpb::{
        kv_client::KvClient, watch_client::WatchClient, watch_request::RequestUnion,
        DeleteRangeRequest, PutRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest,
    },
    PREFIX,
};

mod common;
use common::{cluster, unique};

/// Size of each large value: etcd takes requests up to 1.5 MiB by default.
const VALUE: usize = 128 << 10;

/// Large values per batch: 6 MiB, past the 1 MiB stream and 4 MiB connection windows.
const LARGE_KEYS: usize = 48;

async fn channel(cluster: &[String]) -> Channel {
    rpc_transport_grpc::connect(&format!("grpc://{}", cluster[0]))
        .await
        .unwrap()
}

async fn put_large(kv: &mut KvClient<Channel>, prefix: &str, batch: &str) {
    for i in 0..LARGE_KEYS {
        kv.put(PutRequest {
            key: format!("{prefix}{batch}-{i}").into(),
            value: vec![b'x'; VALUE].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
}

/// Deletes every key under `prefix`, in one request.
async fn delete_prefix(kv: &mut KvClient<Channel>, prefix: &str) {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    kv.delete_range(DeleteRangeRequest {
        key: prefix.to_owned().into(),
        range_end: end.into(),
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn next(changes: &mut (impl futures::Stream<Item = Change> + Unpin)) -> Change {
    tokio::time::timeout(Duration::from_secs(20), changes.next())
        .await
        .expect("no change within 20 s")
        .expect("the stream of changes ended")
}

/// `replica` registered as a new service (named after `name`) with a TTL of 3 s, and
/// a follower of that service that has seen it come.
async fn registered_and_followed(
    cluster: &[String],
    name: &str,
    replica: &Endpoint,
) -> (
    rpc_discovery_etcd::Registration,
    futures::stream::BoxStream<'static, Change>,
) {
    let service = unique(name);
    let registration =
        rpc_discovery_etcd::register(cluster, &service, replica, Duration::from_secs(3))
            .await
            .unwrap();
    let mut changes = rpc_discovery_etcd::resolve(cluster, &service)
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(replica.clone()));
    (registration, changes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_and_watch_events_larger_than_the_http2_windows() {
    let Some(cluster) = cluster() else { return };
    let service = unique("large");
    let prefix = format!("{PREFIX}{service}/");
    let mut kv = KvClient::new(channel(&cluster).await);
    let (a, b): (Endpoint, Endpoint) = (
        "tcp://127.0.0.1:1".parse().unwrap(),
        "tcp://127.0.0.1:2".parse().unwrap(),
    );

    // A listing of 6 MiB: the large values name no replica, one key does.
    put_large(&mut kv, &prefix, "before").await;
    kv.put(PutRequest {
        key: format!("{prefix}a").into(),
        value: a.to_string().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(a.clone()));

    // 6 MiB of events on the watch, then the one that matters.
    put_large(&mut kv, &prefix, "after").await;
    kv.put(PutRequest {
        key: format!("{prefix}b").into(),
        value: b.to_string().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(b.clone()));

    // One delete of the whole prefix: one watch response with every event.
    delete_prefix(&mut kv, &prefix).await;
    let mut removed = vec![next(&mut changes).await, next(&mut changes).await];
    removed.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(removed, [Change::Remove(a), Change::Remove(b)]);
}

/// A prefix holding more than the client takes in one message (16 MiB: here 18 MiB
/// of values that name no replica, and one that does) is listed in pages, each read
/// at the first one's revision: a listing in one response failed for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_past_the_message_limit_is_read_in_pages() {
    let Some(cluster) = cluster() else { return };
    let service = unique("paged");
    let prefix = format!("{PREFIX}{service}/");
    let mut kv = KvClient::new(channel(&cluster).await);
    let a: Endpoint = "tcp://127.0.0.1:1".parse().unwrap();
    for batch in ["one", "two", "three"] {
        put_large(&mut kv, &prefix, batch).await;
    }
    kv.put(PutRequest {
        key: format!("{prefix}a").into(),
        value: a.to_string().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(a));
    delete_prefix(&mut kv, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_answers_a_progress_request_on_an_open_watch() {
    let Some(cluster) = cluster() else { return };
    let prefix = format!("{PREFIX}{}/", unique("progress"));
    let mut watch = WatchClient::new(channel(&cluster).await);
    let (requests, queued) = tokio::sync::mpsc::channel(2);
    let create = WatchCreateRequest {
        key: prefix.into(),
        ..Default::default()
    };
    requests
        .try_send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        })
        .unwrap();
    let stream = futures::stream::unfold(queued, |mut queued| async move {
        queued.recv().await.map(|request| (request, queued))
    });
    let mut responses = watch
        .watch(Request::new(stream))
        .await
        .unwrap()
        .into_inner();
    let within = Duration::from_secs(5);
    let created = tokio::time::timeout(within, responses.message())
        .await
        .expect("no answer to the watch's creation")
        .unwrap()
        .unwrap();
    assert!(created.created, "{created:?}");

    // Idle, then asked: etcd answers at once, on the same stream.
    tokio::time::sleep(Duration::from_secs(1)).await;
    requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
        })
        .await
        .unwrap();
    let progress = tokio::time::timeout(within, responses.message())
        .await
        .expect("no answer to the progress request")
        .unwrap()
        .unwrap();
    assert!(
        progress.events.is_empty() && !progress.created,
        "{progress:?}"
    );
    assert_eq!(progress.watch_id, -1, "{progress:?}");
    assert!(progress.header.unwrap().revision > 0);
}

/// A registration whose lease etcd let go (etcd or this process stalled for longer
/// than the TTL, or etcd lost its data: here the lease is revoked behind its back)
/// registers again under a new lease, and followers see the replica come back. (Found
/// by a discovery round: such a replica stayed up, healthy and invisible for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_lease_expired_registers_again() {
    use rpc_discovery_etcd::proto::etcdserverpb::{lease_client::LeaseClient, LeaseRevokeRequest};
    let Some(cluster) = cluster() else { return };
    let replica: Endpoint = "tcp://10.1.2.3:7000".parse().unwrap();
    let (registration, mut changes) =
        registered_and_followed(&cluster, "lease-lost", &replica).await;
    let first = registration.key();
    let lease = i64::from_str_radix(first.rsplit('/').next().unwrap(), 16).unwrap();
    let mut leases = LeaseClient::new(channel(&cluster).await);
    leases
        .lease_revoke(Request::new(LeaseRevokeRequest { id: lease }))
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Remove(replica.clone()));
    // The next renewal (a third of the TTL) learns the lease is gone.
    assert_eq!(next(&mut changes).await, Change::Insert(replica.clone()));
    // The registration records its new lease and key as soon as the lease is granted,
    // before the put: a deregistration while the put is on its way (or its answer)
    // revokes the new lease, and its key goes with it. (It recorded them once etcd
    // had answered the put, and such a deregistration revoked the old, expired lease,
    // leaving the new key for a TTL.)
    assert_ne!(
        registration.key(),
        first,
        "the new lease is recorded before the put"
    );
    registration.deregister().await.unwrap();
    assert_eq!(next(&mut changes).await, Change::Remove(replica));
}

/// A registration whose key is deleted (or overwritten) while its lease lives on puts
/// it back under the same lease after its next renewal: renewals alone kept succeeding
/// on the key-less lease, and the replica stayed invisible until it restarted (from a
/// review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_overwritten_key_is_put_back() {
    let Some(cluster) = cluster() else { return };
    let replica: Endpoint = "tcp://10.1.2.4:7000".parse().unwrap();
    let (registration, mut changes) =
        registered_and_followed(&cluster, "key-deleted", &replica).await;
    let key = registration.key();
    let mut kv = KvClient::new(channel(&cluster).await);
    kv.delete_range(DeleteRangeRequest {
        key: key.clone().into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(next(&mut changes).await, Change::Remove(replica.clone()));
    // Within a renewal (a third of the TTL): back, under the same lease and key.
    assert_eq!(next(&mut changes).await, Change::Insert(replica.clone()));
    assert_eq!(registration.key(), key);

    // Overwritten without the lease (its value another address): put back too.
    kv.put(PutRequest {
        key: key.clone().into(),
        value: "tcp://10.9.9.9:1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let moved: Endpoint = "tcp://10.9.9.9:1".parse().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(next(&mut changes).await);
    }
    assert_eq!(
        seen,
        [
            Change::Remove(replica.clone()),
            Change::Insert(moved.clone()),
            Change::Remove(moved),
            Change::Insert(replica.clone()),
        ]
    );
    registration.deregister().await.unwrap();
    assert_eq!(next(&mut changes).await, Change::Remove(replica));
}

/// A registration whose put fails after its lease was granted revokes that lease: a
/// put that timed out may still have been applied, and a retry under a new lease
/// would leave a second key for the same replica until the first lease ran out. (From
/// a review.) Here the put fails for sure (a value over etcd's 1.5 MiB request
/// limit); the lease is recognised by its TTL, which no other test uses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_put_revokes_its_lease() {
    use rpc_discovery_etcd::proto::etcdserverpb::{
        lease_client::LeaseClient, LeaseLeasesRequest, LeaseTimeToLiveRequest,
    };
    const TTL_S: i64 = 997;
    let Some(cluster) = cluster() else { return };
    let too_large: Endpoint = format!("tcp://{}:7000", "x".repeat(2 << 20))
        .parse()
        .unwrap();
    let registered = rpc_discovery_etcd::register(
        &cluster,
        &unique("put-fails"),
        &too_large,
        Duration::from_secs(TTL_S as u64),
    )
    .await;
    assert!(registered.is_err(), "etcd took a 2 MiB value");
    let mut leases = LeaseClient::new(channel(&cluster).await);
    let all = leases
        .lease_leases(Request::new(LeaseLeasesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .leases;
    for lease in all {
        let granted = leases
            .lease_time_to_live(Request::new(LeaseTimeToLiveRequest {
                id: lease.id,
                keys: false,
            }))
            .await
            .unwrap()
            .into_inner()
            .granted_ttl;
        assert_ne!(granted, TTL_S, "the lease {:x} was left behind", lease.id);
    }
}

/// A service named below another (`svc/canary` under `svc`) is not among the other's
/// replicas, listed or watched: its keys are in the other's key range, and a client of
/// `svc` sent calls to the canary (a review of address parsing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_named_below_another_is_not_among_its_replicas() {
    let Some(cluster) = cluster() else { return };
    let service = unique("nested");
    let main: Endpoint = "tcp://10.1.2.3:7000".parse().unwrap();
    let canary: Endpoint = "tcp://10.1.2.4:7000".parse().unwrap();
    let ttl = Duration::from_secs(10);
    let _canary =
        rpc_discovery_etcd::register(&cluster, &format!("{service}/canary"), &canary, ttl)
            .await
            .unwrap();
    let _main = rpc_discovery_etcd::register(&cluster, &service, &main, ttl)
        .await
        .unwrap();
    // Listed: the main replica only.
    let mut changes = rpc_discovery_etcd::resolve(&cluster, &service)
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(main.clone()));
    // Watched: a second canary, then a second main replica; only the latter comes.
    let again: Endpoint = "tcp://10.1.2.5:7000".parse().unwrap();
    let _canary2 =
        rpc_discovery_etcd::register(&cluster, &format!("{service}/canary"), &again, ttl)
            .await
            .unwrap();
    let second: Endpoint = "tcp://10.1.2.6:7000".parse().unwrap();
    let _second = rpc_discovery_etcd::register(&cluster, &service, &second, ttl)
        .await
        .unwrap();
    assert_eq!(next(&mut changes).await, Change::Insert(second));
}
