//! Keeping a registration's lease alive: renewals on etcd's bidirectional
//! `LeaseKeepAlive` stream, each of which must be answered, and a new stream whenever
//! one breaks (etcd restarting, the network).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use rpc_core::Request;
use tokio::sync::mpsc;

use crate::{
    backoff::Backoff,
    cluster::{Etcd, Members},
    proto::etcdserverpb::{lease_client::LeaseClient, LeaseKeepAliveRequest},
    Registered,
};

/// How long a registration waits for etcd to answer a lease renewal before it opens a
/// new renewal stream (and between attempts to open one).
const KEEP_ALIVE_ANSWER: Duration = Duration::from_secs(1);

/// How long opening a renewal stream may take (connecting included).
const OPEN_TIMEOUT: Duration = Duration::from_secs(3);

/// Renewals queued for the stream: one at a time is ever outstanding.
const QUEUED_RENEWALS: usize = 1;

/// Why renewing on one stream stopped.
enum Stopped {
    /// etcd says the lease is gone (it expired while etcd was unreachable).
    Expired,
    /// The stream broke; a new one may renew it.
    Broken(String),
    /// etcd did not answer in time: a new stream goes on new connections.
    Silent(String),
}

/// Keeps `registered` in etcd until the task is aborted: renews its lease every
/// `every`, and when etcd says the lease expired (etcd was away, stalled or paused for
/// longer than the TTL, or this process was; or etcd lost its data), registers again
/// under a new lease, retrying with a growing wait until etcd takes it. `current`
/// holds the lease and key registered now.
pub(crate) async fn keep_registered(
    mut etcd: Etcd,
    registered: Registered,
    current: Arc<Mutex<(i64, String)>>,
    every: Duration,
) {
    let backoff = Backoff::default();
    loop {
        let (lease, key) = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match renew_on_one_stream(&mut etcd, &registered, lease, &key, every).await {
            Stopped::Expired => {
                tracing::warn!(
                    lease,
                    "etcd lease expired: this replica was not registered for a while; \
                     registering again"
                );
                let mut failures = 0;
                let again = loop {
                    let granted = |lease, key: &str| {
                        *current.lock().unwrap_or_else(|e| e.into_inner()) = (lease, key.to_owned())
                    };
                    match registered.put(&mut etcd, granted).await {
                        Ok(again) => break again,
                        Err(err) => {
                            failures += 1;
                            tracing::warn!(%err, failures, "registering again in etcd failed");
                            if failures % 3 == 0 {
                                etcd.reconnect();
                            }
                            tokio::time::sleep(backoff.delay(failures, crate::backoff::unit()))
                                .await;
                        }
                    }
                };
                tracing::info!(key = %again.1, "registered in etcd again");
                *current.lock().unwrap_or_else(|e| e.into_inner()) = again;
            }
            Stopped::Broken(reason) => {
                tracing::warn!(lease, %reason, "etcd lease keep-alive failed; reconnecting");
                tokio::time::sleep(every.min(KEEP_ALIVE_ANSWER)).await;
            }
            // Waited already: renew at once, on new connections.
            Stopped::Silent(reason) => {
                tracing::warn!(lease, %reason, "etcd lease keep-alive failed; reconnecting");
                etcd.reconnect();
            }
        }
    }
}

/// Opens a renewal stream and renews on it (at once, then every `every`) until it
/// breaks or etcd says the lease expired; after each renewal etcd answered, checks
/// that `key` is still there under `lease` ([`check_key`]).
async fn renew_on_one_stream(
    etcd: &mut Etcd,
    registered: &Registered,
    lease: i64,
    key: &str,
    every: Duration,
) -> Stopped {
    let client: &mut LeaseClient<Members> = &mut etcd.lease;
    let renewal = LeaseKeepAliveRequest { id: lease };
    let (requests, queued) = mpsc::channel(QUEUED_RENEWALS);
    // The first renewal is queued before the call: etcd answers nothing (not even the
    // response headers) before a request arrives.
    let _ = requests.try_send(renewal);
    let stream = futures::stream::unfold(queued, |mut queued| async move {
        queued.recv().await.map(|request| (request, queued))
    });
    let mut responses =
        match tokio::time::timeout(OPEN_TIMEOUT, client.lease_keep_alive(Request::new(stream)))
            .await
        {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => return Stopped::Broken(format!("opening the stream: {status}")),
            Err(_) => {
                return Stopped::Silent(format!("opening the stream took over {OPEN_TIMEOUT:?}"))
            }
        };
    let mut first = true;
    loop {
        if !first && requests.send(renewal).await.is_err() {
            return Stopped::Broken("the request stream closed".into());
        }
        first = false;
        // Renewals keep their cadence, counted from when each was sent: the wait for
        // etcd's answer comes out of it, and the key's check gets at most the same
        // time again (with a TTL of a few seconds, 1 s for each on top of a third of
        // the TTL let the lease lapse). So renewals are at most etcd's answer time
        // plus a third of the TTL apart.
        let next = tokio::time::Instant::now() + every;
        // A renewal counts once etcd has answered it with the lease still alive.
        match tokio::time::timeout(KEEP_ALIVE_ANSWER, responses.message()).await {
            Ok(Ok(Some(answer))) if answer.ttl > 0 => {
                // Bounded: a slow check (a silent member, up to its calls' 5 s timeouts
                // twice) must not hold the next renewal back for long; a check cut
                // short is made again after the next renewal. It gets a third of the
                // TTL even when the answer came late: cut at `next`, it could be cut
                // every time.
                let check = check_key(etcd, registered, lease, key);
                let _ = tokio::time::timeout(every.min(KEEP_ALIVE_ANSWER), check).await;
                tokio::time::sleep_until(next).await;
            }
            Ok(Ok(Some(_))) => return Stopped::Expired,
            Ok(Ok(None)) => return Stopped::Broken("the stream ended".into()),
            Ok(Err(status)) => return Stopped::Broken(status.to_string()),
            Err(_) => {
                return Stopped::Silent(format!(
                    "etcd did not answer a renewal within {KEEP_ALIVE_ANSWER:?}"
                ))
            }
        }
    }
}

/// Puts the registration's key back if it was deleted or replaced while its lease
/// lived (renewals alone never notice), saying so.
async fn check_key(etcd: &mut Etcd, registered: &Registered, lease: i64, key: &str) {
    match registered.restore(etcd, lease, key).await {
        Ok(true) => tracing::warn!(
            %key,
            "the registration's key was deleted or replaced in etcd while its lease lived: \
             put it back"
        ),
        Ok(false) => {}
        // The renewals notice an etcd that cannot be reached.
        Err(err) => tracing::debug!(%key, %err, "checking the registration's key failed"),
    }
}
