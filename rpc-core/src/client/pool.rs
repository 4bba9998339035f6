//! The connections of one [`Channel`](super::Channel): one by default, several with
//! [`ChannelBuilder::connections`](super::ChannelBuilder::connections).
//!
//! Each connection has its own driver task (and so its own socket, write batching and
//! reconnection with backoff); a pooled channel hands its calls to them in turn
//! (round-robin). Round-robin rather than least-in-flight: every connection goes to the
//! same server, so their loads differ only by the calls' own lengths, and a counter is
//! one atomic add per call where a load comparison would touch every connection's
//! counters. A connection that is reconnecting fails the calls it is handed at once
//! with `UNAVAILABLE` (marked unprocessed, so a retry policy sends them again, most
//! likely over another connection) while the others carry on.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

/// Most connections one channel opens: a pool is for a few connections' worth of
/// throughput (one per server core, say), not for thousands of sockets per client.
pub const MAX_CONNECTIONS: usize = 64;

/// The members of a channel's pool, handed out in turn.
pub(crate) struct Members<T> {
    members: Box<[Arc<T>]>,
    next: AtomicUsize,
}

impl<T> Members<T> {
    /// A pool of `members` (at least one).
    pub(crate) fn new(members: Vec<Arc<T>>) -> Self {
        assert!(!members.is_empty(), "a channel has at least one connection");
        Members {
            members: members.into_boxed_slice(),
            next: AtomicUsize::new(0),
        }
    }

    /// The member the next call goes to.
    pub(crate) fn pick(&self) -> &Arc<T> {
        if self.members.len() == 1 {
            return &self.members[0];
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        &self.members[turn % self.members.len()]
    }

    /// The first member (bulk transfers and the target name go through it).
    pub(crate) fn first(&self) -> &Arc<T> {
        &self.members[0]
    }

    /// How many members there are.
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Every member.
    pub(crate) fn all(&self) -> &[Arc<T>] {
        &self.members
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_takes_turns() {
        let pool = Members::new((0..3).map(Arc::new).collect());
        let picked: Vec<i32> = (0..7).map(|_| *pool.pick().as_ref()).collect();
        assert_eq!(picked, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(pool.len(), 3);
        assert_eq!(**pool.first(), 0);
    }

    #[test]
    fn one_member_is_always_picked() {
        let pool = Members::new(vec![Arc::new("only")]);
        assert!((0..3).all(|_| **pool.pick() == "only"));
    }
}
