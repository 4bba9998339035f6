//! The IO side of [`resolve`](crate::resolve): a watch of the service's prefix that is
//! resumed, with [`Backoff`], whenever it fails, and a fresh listing when etcd no
//! longer has the history to resume from. What it learns goes through
//! [`Replicas`], which decides what to report.

use etcd_client::{Client, EventType, GetOptions, WatchOptions, WatchStream, Watcher};
use rpc_core::{balance::Change, Endpoint, Error};

use crate::{backoff::Backoff, etcd_error, replicas::Replicas};

/// Follows one service's prefix; see [`Follower::next_changes`].
pub(crate) struct Follower {
    client: Client,
    prefix: String,
    replicas: Replicas,
    backoff: Backoff,
    /// Failures in a row: of watching, of listing, of the watch stream.
    failures: u32,
    /// The watch in progress. The watcher is kept so the watch lives as long as
    /// its stream.
    watch: Option<(Watcher, WatchStream)>,
}

impl Follower {
    /// Lists the prefix once (an error here is returned: etcd unreachable at the
    /// start is the caller's to see), and returns the follower with the replicas
    /// found.
    pub(crate) async fn start(
        client: Client,
        prefix: String,
        backoff: Backoff,
    ) -> Result<(Follower, Vec<Change>), Error> {
        let mut follower = Follower {
            client,
            prefix,
            replicas: Replicas::default(),
            backoff,
            failures: 0,
            watch: None,
        };
        let initial = follower.relist().await?;
        Ok((follower, initial))
    }

    /// The next changes to report. Never gives up: a failed watch is resumed from the
    /// revision after the last one applied, after a jittered, growing wait (etcd
    /// restarting, a leader election, a network cut); if etcd has compacted that
    /// revision away, the prefix is listed again and the difference reported.
    pub(crate) async fn next_changes(&mut self) -> Vec<Change> {
        loop {
            let Some((_, stream)) = &mut self.watch else {
                if self.failures > 0 {
                    let delay = self.backoff.delay(self.failures, crate::backoff::unit());
                    tokio::time::sleep(delay).await;
                }
                match self.watch_from(self.replicas.resume_from()).await {
                    Ok(watch) => self.watch = Some(watch),
                    Err(err) => self.failed("watch", &err),
                }
                continue;
            };
            let response = match stream.message().await {
                Ok(Some(response)) => response,
                Ok(None) => {
                    self.failed("watch", &"the stream ended");
                    continue;
                }
                Err(err) => {
                    self.failed("watch", &err);
                    continue;
                }
            };
            if response.compact_revision() > 0 {
                // The history after our revision is gone: list what is there now.
                tracing::info!(
                    prefix = %self.prefix,
                    resume_from = self.replicas.resume_from(),
                    compacted_to = response.compact_revision(),
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
            if response.canceled() {
                self.failed("watch", &format!("cancelled: {}", response.cancel_reason()));
                continue;
            }
            self.failures = 0;
            if response.events().is_empty() {
                if !response.created() {
                    // A progress notification: everything up to it has been sent.
                    if let Some(header) = response.header() {
                        self.replicas.progress(header.revision());
                    }
                }
                continue;
            }
            let mut changes = Vec::new();
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                let revision = kv.mod_revision();
                changes.extend(match event.event_type() {
                    EventType::Put => {
                        self.replicas
                            .put(key.to_owned(), endpoint(kv.value_str()), revision)
                    }
                    EventType::Delete => self.replicas.delete(key, revision),
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
        tracing::warn!(
            prefix = %self.prefix,
            failures = self.failures,
            error = %err,
            "etcd {what} failed; trying again"
        );
    }

    async fn watch_from(&mut self, revision: i64) -> Result<(Watcher, WatchStream), Error> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision)
            .with_progress_notify();
        self.client
            .watch(self.prefix.clone(), Some(options))
            .await
            .map_err(|e| etcd_error(&format!("watch {}", self.prefix), e))
    }

    /// Lists the prefix; the difference from what was known.
    async fn relist(&mut self) -> Result<Vec<Change>, Error> {
        let listed = self
            .client
            .get(self.prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd_error(&format!("list {}", self.prefix), e))?;
        let revision = listed.header().map_or(0, |h| h.revision());
        let listing = listed.kvs().iter().filter_map(|kv| {
            let key = kv.key_str().ok()?;
            Some((key.to_owned(), endpoint(kv.value_str())))
        });
        Ok(self.replicas.relist(listing, revision))
    }
}

/// The endpoint a registration's value names, if it is one.
fn endpoint<E>(value: Result<&str, E>) -> Option<Endpoint> {
    value.ok()?.parse().ok()
}
