//! The pending-call table: calls written to a connection and waiting for their
//! response, keyed by call id. Plain data, no I/O; owned by the connection driver.
//! Public so that benchmarks and custom drivers can use it.

use crate::idmap::IdMap;

/// Calls in flight on one connection. `T` is whatever completes a call (the driver
/// uses a oneshot sender).
///
/// A lone call, the sequential caller's, is kept beside the map rather than in it:
/// an insert and a removal in the map cost about 150 instructions, a fifth of what
/// the client's driver does to match an answer.
#[derive(Debug)]
pub struct PendingTable<T> {
    /// A call inserted while the table was empty; others may go into `calls`
    /// beside it.
    one: Option<(u64, T)>,
    calls: IdMap<T>,
}

impl<T> Default for PendingTable<T> {
    fn default() -> Self {
        PendingTable::new()
    }
}

impl<T> PendingTable<T> {
    /// An empty table.
    pub fn new() -> Self {
        PendingTable {
            one: None,
            calls: IdMap::default(),
        }
    }

    /// Records a call sent with `id`. Returns the call back if the id is already in
    /// flight (ids come from a per-channel counter, so that is a bug upstream).
    pub fn insert(&mut self, id: u64, call: T) -> Result<(), T> {
        use std::collections::hash_map::Entry;
        match &self.one {
            None if self.calls.is_empty() => {
                self.one = Some((id, call));
                return Ok(());
            }
            Some((one, _)) if *one == id => return Err(call),
            _ => {}
        }
        match self.calls.entry(id) {
            Entry::Occupied(_) => Err(call),
            Entry::Vacant(slot) => {
                slot.insert(call);
                Ok(())
            }
        }
    }

    /// Takes the call a response with `id` completes; `None` if no such call is waiting
    /// (it was cancelled, or the peer sent an id it was never given).
    pub fn complete(&mut self, id: u64) -> Option<T> {
        match &self.one {
            Some((one, _)) if *one == id => self.one.take().map(|(_, call)| call),
            _ if self.calls.is_empty() => None,
            _ => self.calls.remove(&id),
        }
    }

    /// Forgets a call (cancelled or timed out). Returns whether it was in flight.
    pub fn cancel(&mut self, id: u64) -> bool {
        self.complete(id).is_some()
    }

    /// Takes every waiting call (the connection is gone).
    pub fn drain(&mut self) -> impl Iterator<Item = (u64, T)> + '_ {
        self.one.take().into_iter().chain(self.calls.drain())
    }

    /// The ids in flight, in no particular order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.one
            .iter()
            .map(|(id, _)| *id)
            .chain(self.calls.keys().copied())
    }

    /// Number of calls in flight.
    pub fn len(&self) -> usize {
        usize::from(self.one.is_some()) + self.calls.len()
    }

    /// Whether no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.one.is_none() && self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_match_by_id_in_any_order() {
        let mut t = PendingTable::new();
        for id in 0..100u64 {
            t.insert(id, id * 10).unwrap();
        }
        for id in (0..100u64).rev().step_by(3) {
            assert_eq!(t.complete(id), Some(id * 10));
        }
        assert_eq!(t.complete(99), None, "completed twice");
        assert_eq!(t.len(), 100 - 34);
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let mut t = PendingTable::new();
        t.insert(1, "a").unwrap();
        assert_eq!(t.insert(1, "b"), Err("b"));
        assert_eq!(t.complete(1), Some("a"));
    }

    /// The lone call kept beside the map: a second call beside it, either completed
    /// first, a duplicate of either, and the lone slot used again once all are done.
    #[test]
    fn a_lone_call_and_the_calls_beside_it() {
        let mut t = PendingTable::new();
        t.insert(7, "seven").unwrap();
        assert_eq!(t.insert(7, "again"), Err("again"));
        t.insert(8, "eight").unwrap();
        assert_eq!(t.insert(8, "again"), Err("again"));
        assert_eq!(t.insert(7, "again"), Err("again"));
        assert_eq!(t.len(), 2);
        let mut ids: Vec<u64> = t.ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, [7, 8]);
        assert_eq!(t.complete(7), Some("seven"));
        assert_eq!(t.complete(7), None);
        // 8 is in the map; a new call goes there too while the map holds one.
        t.insert(9, "nine").unwrap();
        assert_eq!(t.insert(8, "again"), Err("again"));
        assert_eq!(t.complete(8), Some("eight"));
        assert!(t.cancel(9));
        assert!(t.is_empty());
        t.insert(10, "ten").unwrap();
        t.insert(11, "eleven").unwrap();
        let mut rest: Vec<_> = t.drain().collect();
        rest.sort_unstable();
        assert_eq!(rest, [(10, "ten"), (11, "eleven")]);
        assert!(t.is_empty());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn cancel_and_drain() {
        let mut t = PendingTable::new();
        t.insert(1, ()).unwrap();
        t.insert(2, ()).unwrap();
        assert!(t.cancel(1));
        assert!(!t.cancel(1));
        let rest: Vec<_> = t.drain().map(|(id, _)| id).collect();
        assert_eq!(rest, vec![2]);
        assert!(t.is_empty());
    }
}
