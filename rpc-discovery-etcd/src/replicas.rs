//! A service's replicas as etcd last said, sans-IO: listings and watch events go in,
//! the [`Change`]s to report come out, and the revision to resume watching from.
//!
//! Keys map to endpoints; an endpoint is reported once however many keys name it (a
//! replica that re-registered under a new lease before its old one expired), inserted
//! when its first key appears and removed when its last key goes. A value that is not
//! an endpoint counts as no endpoint.

use std::collections::HashMap;

use rpc_core::{balance::Change, Endpoint};

/// The known replicas and how far etcd's history has been applied. See the
/// [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Replicas {
    /// Key → the endpoint its value names.
    keys: HashMap<String, Endpoint>,
    /// Endpoint → how many keys name it (never 0: the entry goes with its last key).
    names: HashMap<Endpoint, usize>,
    /// Every change at or below this revision has been applied.
    revision: i64,
}

impl Replicas {
    /// The revision to watch from: the one after everything applied.
    pub(crate) fn resume_from(&self) -> i64 {
        // Revisions come from etcd (or whatever answers as one): saturating, so that
        // one of i64::MAX neither panics nor wraps to a watch from i64::MIN.
        self.revision.saturating_add(1)
    }

    /// The revision every change at or below which has been applied.
    pub(crate) fn applied(&self) -> i64 {
        self.revision
    }

    /// A full listing of the prefix at `revision`: replaces what was known, and
    /// returns the difference (what the watch missed, after a compaction).
    pub(crate) fn relist(
        &mut self,
        listing: impl IntoIterator<Item = (String, Option<Endpoint>)>,
        revision: i64,
    ) -> Vec<Change> {
        let listing: HashMap<String, Option<Endpoint>> = listing.into_iter().collect();
        let mut changes = Vec::new();
        let gone: Vec<String> = self
            .keys
            .keys()
            .filter(|k| !listing.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            changes.extend(self.set(key, None));
        }
        for (key, endpoint) in listing {
            changes.extend(self.set(key, endpoint));
        }
        self.revision = self.revision.max(revision);
        cancel_out(changes)
    }

    /// A put of `key` at `revision`.
    pub(crate) fn put(
        &mut self,
        key: String,
        endpoint: Option<Endpoint>,
        revision: i64,
    ) -> Vec<Change> {
        self.revision = self.revision.max(revision);
        self.set(key, endpoint)
    }

    /// A delete of `key` (or its lease's expiry) at `revision`.
    pub(crate) fn delete(&mut self, key: &str, revision: i64) -> Vec<Change> {
        self.revision = self.revision.max(revision);
        self.set(key.to_owned(), None)
    }

    /// Forgets how far etcd's history was applied, so that the next listing sets it
    /// even if lower: etcd's history started over (a new or restored cluster).
    pub(crate) fn forget_revision(&mut self) {
        self.revision = 0;
    }

    /// etcd says every event up to `revision` has been sent (a progress notification).
    pub(crate) fn progress(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
    }

    /// Sets `key` to name `endpoint` (or nothing); the resulting changes.
    fn set(&mut self, key: String, endpoint: Option<Endpoint>) -> Vec<Change> {
        let old = match &endpoint {
            Some(endpoint) => self.keys.insert(key, endpoint.clone()),
            None => self.keys.remove(&key),
        };
        if old == endpoint {
            return Vec::new();
        }
        let mut changes = Vec::new();
        if let Some(old) = old {
            if let Some(count) = self.names.get_mut(&old) {
                *count -= 1;
                if *count == 0 {
                    self.names.remove(&old);
                    changes.push(Change::Remove(old));
                }
            }
        }
        if let Some(endpoint) = endpoint {
            // Also when another key names it already: a replica that registered
            // again (restarted before its old lease expired), which a balancer then
            // stops holding ejected.
            *self.names.entry(endpoint.clone()).or_insert(0) += 1;
            changes.push(Change::Insert(endpoint));
        }
        changes
    }
}

/// Drops a `Remove` and `Insert` of the same endpoint within one batch (a key moved
/// from one lease to another during a relist): the endpoint never left.
fn cancel_out(changes: Vec<Change>) -> Vec<Change> {
    let removed: Vec<&Endpoint> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Remove(e) => Some(e),
            Change::Insert(_) => None,
        })
        .collect();
    let both: Vec<Endpoint> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Insert(e) if removed.contains(&e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    changes
        .into_iter()
        .filter(|c| match c {
            Change::Insert(e) | Change::Remove(e) => !both.contains(e),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16) -> Endpoint {
        format!("tcp://127.0.0.1:{port}").parse().unwrap()
    }

    fn kv(key: &str, port: u16) -> (String, Option<Endpoint>) {
        (key.to_owned(), Some(ep(port)))
    }

    /// Revisions are etcd's word: one of i64::MAX (from a broken or hostile etcd)
    /// neither panics nor wraps the revision to watch from.
    #[test]
    fn the_largest_revision_saturates() {
        let mut r = Replicas::default();
        r.progress(i64::MAX);
        assert_eq!(r.resume_from(), i64::MAX);
        assert_eq!(r.applied(), i64::MAX);
        assert_eq!(
            r.put("a".into(), Some(ep(1)), i64::MAX),
            [Change::Insert(ep(1))]
        );
        assert_eq!(r.resume_from(), i64::MAX);
    }

    #[test]
    fn events_report_an_endpoint_until_no_key_names_it() {
        let mut r = Replicas::default();
        assert_eq!(
            r.relist([kv("a", 1)], 10),
            [Change::Insert(ep(1))],
            "the first listing"
        );
        assert_eq!(r.resume_from(), 11);
        // The same endpoint under a second lease: it registered again (restarted
        // before its old lease expired), which a balancer takes as a fresh replica.
        assert_eq!(r.put("a2".into(), Some(ep(1)), 12), [Change::Insert(ep(1))]);
        assert_eq!(r.delete("a", 13), [], "a2 still names it");
        assert_eq!(r.delete("a2", 14), [Change::Remove(ep(1))]);
        // A key that changes its endpoint; one rewritten with the same value.
        assert_eq!(r.put("b".into(), Some(ep(2)), 15), [Change::Insert(ep(2))]);
        assert_eq!(r.put("b".into(), Some(ep(2)), 16), []);
        assert_eq!(
            r.put("b".into(), Some(ep(3)), 17),
            [Change::Remove(ep(2)), Change::Insert(ep(3))]
        );
        // A value that is no endpoint is no replica.
        assert_eq!(r.put("b".into(), None, 18), [Change::Remove(ep(3))]);
        assert_eq!(r.delete("unknown", 19), []);
        assert_eq!(r.resume_from(), 20);
        r.progress(25);
        assert_eq!(r.resume_from(), 26);
        r.progress(3);
        assert_eq!(r.resume_from(), 26, "never backwards");
    }

    #[test]
    fn a_relist_reports_what_the_watch_missed() {
        let mut r = Replicas::default();
        r.relist([kv("a", 1), kv("b", 2), kv("c", 3)], 10);
        // While the watch was down: b went, d came, c's replica moved to a new lease.
        let mut changes = r.relist([kv("a", 1), kv("c-new-lease", 3), kv("d", 4)], 40);
        changes.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(changes, [Change::Insert(ep(4)), Change::Remove(ep(2))]);
        assert_eq!(r.resume_from(), 41);
        assert_eq!(r.delete("c-new-lease", 41), [Change::Remove(ep(3))]);
        let mut changes = r.relist(Vec::new(), 50);
        changes.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(changes, [Change::Remove(ep(1)), Change::Remove(ep(4))]);
        assert_eq!(r.resume_from(), 51);
        // etcd's history started over (a new or restored cluster): a listing at a lower
        // revision is followed from there once the old revision is forgotten.
        assert_eq!(r.relist([kv("e", 5)], 7), [Change::Insert(ep(5))]);
        assert_eq!(r.resume_from(), 51, "never backwards by itself");
        r.forget_revision();
        assert_eq!(r.relist([kv("e", 5)], 7), []);
        assert_eq!(r.resume_from(), 8);
    }
}
