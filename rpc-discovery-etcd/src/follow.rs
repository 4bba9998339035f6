//! The IO side of [`resolve`](crate::resolve): a watch of the service's prefix that,
//! whenever it fails, is opened again after a wait growing with [`Backoff`], from a
//! fresh listing of the prefix (see [`Follower::next_changes`] for why not from the
//! revision reached). What it learns goes through
//! [`Replicas`], which decides what to report.
//!
//! The watch is etcd's bidirectional `Watch` stream. A watch that hears nothing for
//! [`SILENCE`] asks etcd for a progress report on it, and is given up (then resumed)
//! if etcd does not answer within [`PROGRESS_ANSWER`]: a member that went silent, or
//! a connection that died without a word, is noticed without HTTP/2 PINGs. Silence
//! (no answer in time) moves the follower to new connections (`Etcd::reconnect`).

use std::time::Duration;

use rpc_core::{balance::Change, stream::Streaming, Code, Endpoint, Error, Request, Status};
use tokio::{sync::mpsc, time::Instant};

use crate::{
    backoff::Backoff,
    cluster::{etcd_error, prefix_end, Etcd},
    proto::{
        etcdserverpb::{
            watch_request::RequestUnion, RangeRequest, WatchCreateRequest, WatchProgressRequest,
            WatchRequest, WatchResponse,
        },
        mvccpb::event::EventType,
    },
    replicas::Replicas,
    unary,
};

/// How long a watch may hear nothing from etcd before it asks for a progress report.
/// etcd answers at once, so this is also about how long a silent member goes
/// unnoticed (plus [`PROGRESS_ANSWER`]).
const SILENCE: Duration = Duration::from_secs(10);

/// How long etcd has to answer a progress request before the watch is given up.
const PROGRESS_ANSWER: Duration = Duration::from_secs(5);

/// How long opening a watch (connecting included) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(3);

/// Requests queued for a watch stream: its creation, and at most one progress request
/// at a time.
const QUEUED_REQUESTS: usize = 2;

/// The `watch_id` of etcd's answers to progress requests: they are not about one
/// watch. (etcd 3.4 answers with the store's revision even while events up to it are
/// still on their way, so such an answer proves the stream alive but is not taken as
/// a revision reached.)
const PROGRESS_ANSWER_ID: i64 = -1;

/// Metadata that makes etcd refuse (and end) a watch on a member without a leader,
/// instead of leaving it silent: etcd's `WithRequireLeader`.
const REQUIRE_LEADER: (&str, &str) = ("hasleader", "true");

/// A watch in progress.
struct Watch {
    /// Kept open: the watch lives while its request stream does.
    requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
    /// When etcd must have said something by.
    deadline: Instant,
    /// A progress request is outstanding.
    asked: bool,
}

impl Watch {
    /// etcd said something: the stream is alive.
    fn heard(&mut self) {
        self.asked = false;
        self.deadline = Instant::now() + SILENCE;
    }

    /// Asks etcd to report progress, to learn whether the stream is alive.
    fn ask_progress(&mut self) {
        let request = WatchRequest {
            request_union: Some(RequestUnion::ProgressRequest(WatchProgressRequest {})),
        };
        // Full only if an earlier request is still queued: that one will do.
        let _ = self.requests.try_send(request);
        self.asked = true;
        self.deadline = Instant::now() + PROGRESS_ANSWER;
    }
}

/// Follows one service's prefix; see [`Follower::next_changes`].
pub(crate) struct Follower {
    etcd: Etcd,
    prefix: String,
    replicas: Replicas,
    backoff: Backoff,
    /// Failures in a row: of watching, of listing, of the watch stream.
    failures: u32,
    /// The watch in progress.
    watch: Option<Watch>,
    /// A watch failed since the last listing: list again before the next watch.
    stale: bool,
}

impl Follower {
    /// Lists the prefix once (an error here is returned: etcd unreachable at the
    /// start is the caller's to see), and returns the follower with the replicas
    /// found.
    pub(crate) async fn start(
        etcd: Etcd,
        prefix: String,
        backoff: Backoff,
    ) -> Result<(Follower, Vec<Change>), Error> {
        let mut follower = Follower {
            etcd,
            prefix,
            replicas: Replicas::default(),
            backoff,
            failures: 0,
            watch: None,
            stale: false,
        };
        let initial = follower.relist().await?;
        Ok((follower, initial))
    }

    /// The next changes to report. Never gives up: after a failed watch (etcd
    /// restarting, a leader election, a network cut) and a jittered, growing wait, the
    /// prefix is listed again, the difference reported, and a new watch follows from
    /// the listing's revision. (Resuming from the revision reached instead would miss
    /// an etcd whose history started over, a wiped or new cluster at the same address
    /// already past that revision: its watch would replay its own history from there,
    /// and a replica of the old cluster would stay for good.) A compacted history is
    /// listed again too.
    pub(crate) async fn next_changes(&mut self) -> Vec<Change> {
        loop {
            let Some(watch) = &mut self.watch else {
                if self.failures > 0 {
                    let delay = self.backoff.delay(self.failures, crate::backoff::unit());
                    tokio::time::sleep(delay).await;
                }
                if self.stale {
                    match self.relist_from_scratch().await {
                        Ok(changes) => {
                            self.stale = false;
                            if !changes.is_empty() {
                                return changes;
                            }
                        }
                        Err(err) => {
                            self.failed("list", &err);
                            continue;
                        }
                    }
                }
                match self.watch_from(self.replicas.resume_from()).await {
                    Ok(watch) => self.watch = Some(watch),
                    Err(err) => self.failed("watch", &err),
                }
                continue;
            };
            let response =
                match tokio::time::timeout_at(watch.deadline, watch.responses.message()).await {
                    Ok(Ok(Some(response))) => {
                        watch.heard();
                        response
                    }
                    Ok(Ok(None)) => {
                        self.failed("watch", &"the stream ended");
                        continue;
                    }
                    Ok(Err(status)) => {
                        self.failed("watch", &status);
                        continue;
                    }
                    Err(_) if !watch.asked => {
                        watch.ask_progress();
                        continue;
                    }
                    Err(_) => {
                        self.failed(
                            "watch",
                            &format!("no answer to a progress request within {PROGRESS_ANSWER:?}"),
                        );
                        self.etcd.reconnect();
                        continue;
                    }
                };
            if is_behind(&response, self.replicas.applied()) {
                // etcd is behind what this follower has applied: a new cluster, or
                // one restored from an older backup (or a member that lags). The watch
                // would wait for revisions the new history reaches late, missing
                // what happens meanwhile: list again, and follow from there.
                tracing::warn!(
                    prefix = %self.prefix,
                    applied = self.replicas.applied(),
                    etcd_revision = response.header.as_ref().map_or(0, |h| h.revision),
                    "etcd's revision is behind the one this follower reached (a new or \
                     restored cluster?); listing again"
                );
                self.watch = None;
                // Waits before the next watch, in case a lagging member says so again.
                self.failures = self.failures.saturating_add(1);
                // The listing's revision replaces the one reached only if the listing
                // comes: a failed one keeps it, so the next watch notices again.
                match self.relist_from_scratch().await {
                    Ok(changes) if !changes.is_empty() => return changes,
                    Ok(_) => {}
                    Err(err) => self.failed("list", &err),
                }
                continue;
            }
            if response.compact_revision > 0 {
                // The history after our revision is gone: list what is there now.
                tracing::info!(
                    prefix = %self.prefix,
                    resume_from = self.replicas.resume_from(),
                    compacted_to = response.compact_revision,
                    "etcd compacted the history the watch needed; listing again"
                );
                self.watch = None;
                match self.relist().await {
                    Ok(changes) => {
                        self.failures = 0;
                        if !changes.is_empty() {
                            return changes;
                        }
                    }
                    Err(err) => self.failed("list", &err),
                }
                continue;
            }
            if response.canceled {
                self.failed("watch", &format!("cancelled: {}", response.cancel_reason));
                continue;
            }
            // Events, or an answer about progress, show a watch that works; its
            // creation alone does not: a watch cancelled right after it was created
            // (etcd cancels watches that need a leader when it loses one; a proxy
            // that cuts streams) had its wait reset, and the prefix was listed again
            // about every 100 ms (from a review).
            if !response.created {
                self.failures = 0;
            }
            if response.events.is_empty() {
                if !response.created && response.watch_id != PROGRESS_ANSWER_ID {
                    // A progress notification of this watch: everything up to it has
                    // been sent.
                    if let Some(header) = &response.header {
                        self.replicas.progress(header.revision);
                    }
                }
                continue;
            }
            let mut changes = Vec::new();
            for event in response.events {
                let Some(kv) = event.kv else { continue };
                let revision = kv.mod_revision;
                let Some(key) = replica_key(&self.prefix, &kv.key) else {
                    // Another service's (one named below this one: `kv/canary` under
                    // `kv`), or no key of ours.
                    self.replicas.progress(revision);
                    continue;
                };
                changes.extend(match EventType::try_from(event.r#type) {
                    Ok(EventType::Put) => {
                        self.replicas
                            .put(key.to_owned(), endpoint(key, &kv.value), revision)
                    }
                    Ok(EventType::Delete) => self.replicas.delete(key, revision),
                    // An event type this etcd version does not know: skipped, but the
                    // revision is reached.
                    Err(_) => {
                        self.replicas.progress(revision);
                        Vec::new()
                    }
                });
            }
            if !changes.is_empty() {
                return changes;
            }
        }
    }

    /// Records a failure; the next attempt waits.
    fn failed(&mut self, what: &str, err: &dyn std::fmt::Display) {
        self.failures = self.failures.saturating_add(1);
        self.watch = None;
        self.stale = true;
        tracing::warn!(
            prefix = %self.prefix,
            failures = self.failures,
            error = %err,
            "etcd {what} failed; trying again"
        );
    }

    /// Opens a watch of the prefix from `revision` on.
    async fn watch_from(&mut self, revision: i64) -> Result<Watch, Error> {
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: self.prefix.clone().into(),
                range_end: prefix_end(self.prefix.as_bytes()).into(),
                start_revision: revision,
                progress_notify: true,
                ..Default::default()
            })),
        };
        let (requests, queued) = mpsc::channel(QUEUED_REQUESTS);
        // Queued before the call: etcd sends no response headers before the watch
        // is created.
        let _ = requests.try_send(create);
        let stream = futures::stream::unfold(queued, |mut queued| async move {
            queued.recv().await.map(|request| (request, queued))
        });
        let mut request = Request::new(stream);
        let (key, value) = REQUIRE_LEADER;
        request
            .metadata_mut()
            .insert(key, value)
            .expect("a valid metadata entry");
        let what = format!("watch {}", self.prefix);
        let responses =
            match tokio::time::timeout(OPEN_TIMEOUT, self.etcd.watch.watch(request)).await {
                Ok(Ok(response)) => response.into_inner(),
                Ok(Err(status)) => return Err(etcd_error(&what, status)),
                Err(_) => {
                    self.etcd.reconnect();
                    return Err(Error::new(
                        rpc_core::ErrorKind::TimedOut,
                        format!("etcd: {what}: no answer within {OPEN_TIMEOUT:?}"),
                    ));
                }
            };
        Ok(Watch {
            requests,
            responses,
            deadline: Instant::now() + SILENCE,
            asked: false,
        })
    }

    /// Lists the prefix and follows from the listing's revision, even if it is below
    /// the one reached (etcd's history started over); the difference from what was
    /// known.
    async fn relist_from_scratch(&mut self) -> Result<Vec<Change>, Error> {
        let reached = self.replicas.applied();
        self.replicas.forget_revision();
        let listed = self.relist().await;
        if listed.is_err() {
            self.replicas.progress(reached);
        }
        listed
    }

    /// Lists the prefix; the difference from what was known. In pages of at most
    /// [`LIST_PAGE`] keys, all read at the first page's revision (one snapshot): a
    /// listing in one response grew with the prefix (the keys of services named below
    /// this one too) until it passed the message limit, and failed for ever. A page
    /// too large for the limit (large values under the prefix) is asked for again
    /// with half as many keys.
    async fn relist(&mut self) -> Result<Vec<Change>, Error> {
        let prefix = self.prefix.clone();
        let range_end = prefix_end(prefix.as_bytes());
        let mut from = prefix.clone().into_bytes();
        let mut limit = LIST_PAGE;
        let mut revision = 0;
        let mut listing = Vec::new();
        loop {
            let listed = self
                .etcd
                .kv
                .range(unary(RangeRequest {
                    key: from.clone().into(),
                    range_end: range_end.clone().into(),
                    limit,
                    revision,
                    ..Default::default()
                }))
                .await;
            let listed = match listed {
                Ok(listed) => listed.into_inner(),
                Err(status) if status.code() == Code::RESOURCE_EXHAUSTED && limit > 1 => {
                    limit /= 2;
                    continue;
                }
                Err(status) => {
                    if status.code() == Code::DEADLINE_EXCEEDED {
                        self.etcd.reconnect();
                    }
                    return Err(etcd_error(&format!("list {prefix}"), status));
                }
            };
            if revision == 0 {
                revision = listed.header.as_ref().map_or(0, |h| h.revision);
            }
            let last = listed.kvs.last().map(|kv| kv.key.clone());
            listing.extend(listed.kvs.iter().filter_map(|kv| {
                let key = replica_key(&prefix, &kv.key)?;
                Some((key.to_owned(), endpoint(key, &kv.value)))
            }));
            if listing.len() > MAX_LISTED {
                return Err(etcd_error(
                    &format!("list {prefix}"),
                    Status::internal(format!(
                        "more than {MAX_LISTED} keys under the prefix: not a set of replicas"
                    )),
                ));
            }
            match last {
                // The next page starts just after the last key of this one, which
                // must be at or past where this page started: an etcd (or whatever
                // answers as one) that gave the same page with `more` for ever kept
                // this loop going, its listing growing without end.
                Some(last) if listed.more && last.as_ref() >= from.as_slice() => {
                    from = last.to_vec();
                    from.push(0);
                }
                Some(_) if listed.more => {
                    return Err(etcd_error(
                        &format!("list {prefix}"),
                        Status::internal("a page of the listing went back to keys already listed"),
                    ));
                }
                _ => break,
            }
        }
        Ok(self.replicas.relist(listing, revision))
    }
}

/// Most keys asked of etcd in one page of a listing.
const LIST_PAGE: i64 = 1000;

/// Most keys a listing of the prefix takes (in pages of [`LIST_PAGE`]): a service's
/// replicas are far fewer; past it the listing fails rather than grow.
const MAX_LISTED: usize = 100_000;

/// `key` if it is a replica of the service of `prefix`: the prefix and a lease id,
/// nothing more. The prefix's range also holds the keys of services named below this
/// one (`rpc/services/kv/canary/<lease>` under `kv`), which are not its replicas.
fn replica_key<'k>(prefix: &str, key: &'k [u8]) -> Option<&'k str> {
    let key = std::str::from_utf8(key).ok()?;
    let lease = key.strip_prefix(prefix)?;
    (!lease.is_empty() && !lease.contains('/')).then_some(key)
}

/// The endpoint a registration's value names, if it is one (whitespace around it, as
/// `echo ... | etcdctl put` leaves, is not part of it); a value that is none is
/// logged, naming its key, as its replica is left out.
fn endpoint(key: &str, value: &[u8]) -> Option<Endpoint> {
    let text = String::from_utf8_lossy(value);
    match text.trim().parse() {
        Ok(endpoint) => Some(endpoint),
        Err(err) => {
            tracing::warn!(%key, value = %text.escape_debug(), %err, "etcd key holds no replica address; left out");
            None
        }
    }
}

/// Whether a watch response shows etcd behind the revision `reached` (a new or
/// restored cluster). Not a compaction notice: etcd sends those with no revision in
/// their header (0), which is no sign of a cluster behind.
fn is_behind(response: &WatchResponse, reached: i64) -> bool {
    response.compact_revision == 0
        && response
            .header
            .as_ref()
            .is_some_and(|h| h.revision > 0 && h.revision < reached)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::etcdserverpb::ResponseHeader;

    /// A value written by hand with a newline (`echo ... | etcdctl put`) is the
    /// address it holds (it was dropped, silently); one that is no address is none.
    #[test]
    fn a_registrations_value_is_read_as_a_person_writes_it() {
        let at: Endpoint = "tcp://10.0.0.5:7000".parse().unwrap();
        assert_eq!(endpoint("k", b"tcp://10.0.0.5:7000\n"), Some(at.clone()));
        assert_eq!(endpoint("k", b" tcp://10.0.0.5:7000 "), Some(at));
        assert_eq!(endpoint("k", b"10.0.0.5:7000"), None);
    }

    #[test]
    fn only_keys_of_the_service_itself_are_replicas() {
        let prefix = "rpc/services/kv/";
        assert_eq!(
            replica_key(prefix, b"rpc/services/kv/694d"),
            Some("rpc/services/kv/694d")
        );
        assert_eq!(replica_key(prefix, b"rpc/services/kv/canary/694d"), None);
        assert_eq!(replica_key(prefix, b"rpc/services/kv/"), None);
        assert_eq!(replica_key(prefix, b"rpc/services/kvx/694d"), None);
    }

    fn response(revision: i64, compact_revision: i64) -> WatchResponse {
        WatchResponse {
            header: Some(ResponseHeader {
                revision,
                ..Default::default()
            }),
            compact_revision,
            ..Default::default()
        }
    }

    /// A compaction notice (its header without a revision, as etcd sends it) is a
    /// compaction, listed again at once, not a cluster behind, which was logged as a
    /// new or restored cluster, counted as a failure (the next watch waited) and
    /// listed from scratch (from a review).
    #[test]
    fn a_compaction_notice_is_not_a_cluster_behind() {
        assert!(!is_behind(&response(0, 40), 50));
        assert!(!is_behind(&response(45, 40), 50));
        assert!(is_behind(&response(45, 0), 50));
        assert!(!is_behind(&response(50, 0), 50));
        assert!(!is_behind(&response(0, 0), 50));
    }
}
