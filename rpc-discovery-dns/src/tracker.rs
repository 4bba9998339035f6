//! The set of a name's members between lookups, sans-IO: each lookup's [`Outcome`]
//! goes in, the [`Change`]s to report and the delay before the next lookup come out.
//!
//! - An answer with members replaces the set; the differences are reported.
//! - A failed lookup keeps the set and is retried after `retry_min`, doubling up to
//!   `retry_max` while lookups keep failing.
//! - A partial answer (the AAAA query failed and the A query answered, or one SRV
//!   target failed) is the truth for the part that answered (its IPv4 members, say)
//!   and keeps the failed part's known members (the IPv6 ones; for SRV, the lookup
//!   puts the addresses it last knew for a failed target in the answer itself), and
//!   is retried as a failure: a set
//!   starting empty, or one whose resolver fails one query type for good, still gets
//!   and follows the members that do answer.
//! - An answer that the name has no members (`NXDOMAIN`, or no records) empties a set
//!   that had members only when the next lookup, `retry_min` later, says so too: one
//!   bad answer (a zone being reloaded, a misconfigured secondary) does not take every
//!   replica away at once.

use std::{collections::HashSet, time::Duration};

use rpc_core::{balance::Change, Endpoint};

use crate::config::{Schedule, MIN_TTL_INTERVAL};

/// What one lookup of a name found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The name's members now; `ttl` is the shortest TTL of the records used.
    Found {
        members: HashSet<Endpoint>,
        ttl: Duration,
    },
    /// The name has no members: `NXDOMAIN`, no records of the type asked for, or SRV
    /// targets without addresses.
    Absent,
    /// Some of the name's members: part of the lookup failed (a timeout, `SERVFAIL`,
    /// ...), so others may be missing.
    Partial {
        members: HashSet<Endpoint>,
        kept: Kept,
    },
    /// No usable answer: a timeout, `SERVFAIL`, `REFUSED`, an I/O error.
    Failed,
}

/// Which known members a partial answer leaves alone: those the part that failed
/// would have answered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kept {
    /// IPv4 members (the A query failed).
    V4,
    /// IPv6 members (the AAAA query failed).
    V6,
    /// None: an SRV target failed, and the members of the partial answer include
    /// the addresses last known for it (the lookup remembers each target's).
    Remembered,
}

impl Kept {
    fn holds(self, member: &Endpoint) -> bool {
        let v6 = matches!(member, Endpoint::Host { host, .. } if host.starts_with('['));
        match self {
            Kept::V4 => !v6,
            Kept::V6 => v6,
            Kept::Remembered => false,
        }
    }

    /// Whether an address is of the kept family.
    pub(crate) fn holds_ip(self, ip: std::net::IpAddr) -> bool {
        match self {
            Kept::V4 => ip.is_ipv4(),
            Kept::V6 => ip.is_ipv6(),
            Kept::Remembered => false,
        }
    }
}

/// What to do after a lookup: report `changes`, look up again after `next`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) changes: Vec<Change>,
    pub(crate) next: Duration,
}

/// A name's last known members and the state of its retries. See the
/// [module docs](self).
#[derive(Debug)]
pub(crate) struct Tracker {
    schedule: Schedule,
    known: HashSet<Endpoint>,
    /// The last conclusive answer said the name has no members, and `known` is not
    /// empty: the next such answer empties it.
    absent_once: bool,
    /// Lookups in a row that failed.
    failures: u32,
    /// Conclusive lookups in a row that left the set empty.
    empty: u32,
}

impl Tracker {
    pub(crate) fn new(schedule: Schedule) -> Tracker {
        Tracker {
            schedule,
            known: HashSet::new(),
            absent_once: false,
            failures: 0,
            empty: 0,
        }
    }

    /// Whether the next lookup confirms an absence (the last conclusive answer said
    /// the name has no members, and members are known).
    pub(crate) fn confirming(&self) -> bool {
        self.absent_once
    }

    /// Takes in one lookup's outcome.
    pub(crate) fn apply(&mut self, outcome: Outcome) -> Step {
        match outcome {
            Outcome::Found { members, ttl } if !members.is_empty() => {
                self.failures = 0;
                self.empty = 0;
                self.absent_once = false;
                let changes = self.replace(members);
                let next = self.schedule.interval.min(ttl.max(MIN_TTL_INTERVAL));
                Step { changes, next }
            }
            Outcome::Found { .. } | Outcome::Absent => {
                self.failures = 0;
                if self.known.is_empty() || self.absent_once {
                    self.absent_once = false;
                    let changes = self.replace(HashSet::new());
                    // With no members every call fails: asked again soon, then less
                    // often, as a failed lookup is (a name answered empty for a moment,
                    // a rollout with every pod not ready, was not asked again for the
                    // whole interval; from a review).
                    self.empty = self.empty.saturating_add(1);
                    let doublings = (self.empty - 1).min(31);
                    let next = self
                        .schedule
                        .retry_min
                        .saturating_mul(1 << doublings)
                        .min(self.schedule.retry_max)
                        .min(self.schedule.interval);
                    Step { changes, next }
                } else {
                    self.absent_once = true;
                    Step {
                        changes: Vec::new(),
                        next: self.schedule.retry_min,
                    }
                }
            }
            Outcome::Partial { mut members, kept } => {
                // The part that answered is the truth for its members; the failed
                // part's known members stay. Members answered: the name exists, and
                // an absence before this one is not confirmed by one after.
                self.absent_once &= members.is_empty();
                members.extend(self.known.iter().filter(|m| kept.holds(m)).cloned());
                let changes = self.replace(members);
                Step {
                    changes,
                    next: self.failed(),
                }
            }
            Outcome::Failed => Step {
                changes: Vec::new(),
                next: self.failed(),
            },
        }
    }

    /// Counts a failed lookup; the delay before the next one.
    fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let doublings = (self.failures - 1).min(31);
        self.schedule
            .retry_min
            .saturating_mul(1 << doublings)
            .min(self.schedule.retry_max)
    }

    /// Makes `members` the known set; returns the removals, then the insertions.
    fn replace(&mut self, members: HashSet<Endpoint>) -> Vec<Change> {
        let changes = self
            .known
            .difference(&members)
            .cloned()
            .map(Change::Remove)
            .chain(members.difference(&self.known).cloned().map(Change::Insert))
            .collect();
        self.known = members;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn schedule() -> Schedule {
        Schedule {
            interval: 30 * SECOND,
            retry_min: SECOND,
            retry_max: 10 * SECOND,
        }
    }

    fn found(members: &[&str], ttl: Duration) -> Outcome {
        Outcome::Found {
            members: members.iter().map(|m| m.parse().unwrap()).collect(),
            ttl,
        }
    }

    fn insert(e: &str) -> Change {
        Change::Insert(e.parse().unwrap())
    }

    fn remove(e: &str) -> Change {
        Change::Remove(e.parse().unwrap())
    }

    fn sorted(mut changes: Vec<Change>) -> Vec<Change> {
        changes.sort_by_key(|c| format!("{c:?}"));
        changes
    }

    #[test]
    fn answers_are_reported_as_differences() {
        let mut t = Tracker::new(schedule());
        let step = t.apply(found(
            &["tcp://10.0.0.1:1", "tcp://10.0.0.2:1"],
            300 * SECOND,
        ));
        assert_eq!(
            sorted(step.changes),
            vec![insert("tcp://10.0.0.1:1"), insert("tcp://10.0.0.2:1")]
        );
        assert_eq!(step.next, 30 * SECOND);

        let step = t.apply(found(
            &["tcp://10.0.0.2:1", "tcp://10.0.0.3:1"],
            300 * SECOND,
        ));
        assert_eq!(
            step.changes,
            vec![remove("tcp://10.0.0.1:1"), insert("tcp://10.0.0.3:1")]
        );

        let step = t.apply(found(
            &["tcp://10.0.0.2:1", "tcp://10.0.0.3:1"],
            300 * SECOND,
        ));
        assert!(step.changes.is_empty());
    }

    #[test]
    fn a_shorter_ttl_is_honoured_down_to_one_second() {
        let mut t = Tracker::new(schedule());
        assert_eq!(t.apply(found(&["tcp://a:1"], 5 * SECOND)).next, 5 * SECOND);
        assert_eq!(t.apply(found(&["tcp://a:1"], Duration::ZERO)).next, SECOND);
        assert_eq!(
            t.apply(found(&["tcp://a:1"], 3600 * SECOND)).next,
            30 * SECOND
        );
    }

    #[test]
    fn failures_keep_the_set_and_back_off_exponentially() {
        let mut t = Tracker::new(schedule());
        t.apply(found(&["tcp://a:1"], 300 * SECOND));
        let delays: Vec<Duration> = (0..6)
            .map(|_| {
                let step = t.apply(Outcome::Failed);
                assert!(step.changes.is_empty(), "{:?}", step.changes);
                step.next
            })
            .collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 10, 10].map(|s| s * SECOND).to_vec(),
            "retry_min doubling up to retry_max"
        );
        // An answer ends the backoff.
        let step = t.apply(found(&["tcp://a:1", "tcp://b:1"], 300 * SECOND));
        assert_eq!(step.changes, vec![insert("tcp://b:1")]);
        assert_eq!(t.apply(Outcome::Failed).next, SECOND);
    }

    #[test]
    fn a_partial_answer_is_the_truth_for_the_part_that_answered() {
        let mut tracker = Tracker::new(schedule());
        let partial = |members: &[&str], kept| Outcome::Partial {
            members: members.iter().map(|m| m.parse().unwrap()).collect(),
            kept,
        };
        // From nothing: what answered is used.
        let step = tracker.apply(partial(&["tcp://10.0.0.1:1"], Kept::V6));
        assert_eq!(step.changes, vec![insert("tcp://10.0.0.1:1")]);
        assert_eq!(step.next, SECOND);
        let step = tracker.apply(found(&["tcp://10.0.0.1:1", "tcp://[::1]:1"], 60 * SECOND));
        assert_eq!(step.changes, vec![insert("tcp://[::1]:1")]);
        // AAAA fails for good: the IPv4 members follow A's answers (no pile-up of
        // gone ones), the IPv6 ones stay; retried as failures are.
        let step = tracker.apply(partial(&["tcp://10.0.0.2:1"], Kept::V6));
        assert_eq!(
            sorted(step.changes),
            sorted(vec![remove("tcp://10.0.0.1:1"), insert("tcp://10.0.0.2:1")])
        );
        assert_eq!(step.next, SECOND);
        let step = tracker.apply(partial(&["tcp://10.0.0.3:1"], Kept::V6));
        assert_eq!(
            sorted(step.changes),
            sorted(vec![remove("tcp://10.0.0.2:1"), insert("tcp://10.0.0.3:1")])
        );
        assert_eq!(step.next, 2 * SECOND);
        // An SRV target failed: the answer carries what the lookup remembers of it,
        // and keeps nothing else; retried as a failure.
        let step = tracker.apply(partial(
            &["tcp://10.0.0.4:1", "tcp://[::1]:1"],
            Kept::Remembered,
        ));
        assert_eq!(
            sorted(step.changes),
            sorted(vec![remove("tcp://10.0.0.3:1"), insert("tcp://10.0.0.4:1")])
        );
        assert_eq!(step.next, 4 * SECOND);
        // A whole answer replaces the set and ends the backoff.
        let step = tracker.apply(found(&["tcp://10.0.0.4:1"], 60 * SECOND));
        assert_eq!(step.changes, vec![remove("tcp://[::1]:1")]);
        assert_eq!(step.next, 30 * SECOND);
        let step = tracker.apply(Outcome::Failed);
        assert_eq!(step.next, SECOND);
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let mut t = Tracker::new(Schedule {
            retry_max: Duration::MAX,
            ..schedule()
        });
        for _ in 0..100 {
            t.apply(Outcome::Failed);
        }
        assert_eq!(t.failures, 100);
    }

    #[test]
    fn absence_removes_members_only_when_confirmed() {
        let mut t = Tracker::new(schedule());
        t.apply(found(&["tcp://a:1", "tcp://b:1"], 300 * SECOND));

        let step = t.apply(Outcome::Absent);
        assert!(step.changes.is_empty(), "one answer is not enough");
        assert_eq!(step.next, SECOND, "confirmed soon");

        let step = t.apply(Outcome::Absent);
        assert_eq!(
            sorted(step.changes),
            vec![remove("tcp://a:1"), remove("tcp://b:1")]
        );
        // With no members left, asked again soon, then less often (it waited the
        // whole interval: every call failed for 30 s after the members came back).
        assert_eq!(step.next, SECOND);

        // Absent again: nothing left to remove, nothing to confirm.
        let step = t.apply(Outcome::Absent);
        assert!(step.changes.is_empty());
        assert_eq!(step.next, 2 * SECOND);
        for _ in 0..10 {
            t.apply(Outcome::Absent);
        }
        assert_eq!(t.apply(Outcome::Absent).next, 10 * SECOND, "retry_max");
        // Members again: the interval (or the TTL) as before, and the wait starts over.
        let step = t.apply(found(&["tcp://a:1"], 300 * SECOND));
        assert_eq!(step.changes, vec![insert("tcp://a:1")]);
        assert_eq!(step.next, 30 * SECOND);
        t.apply(Outcome::Absent);
        assert_eq!(t.apply(Outcome::Absent).next, SECOND);
    }

    #[test]
    fn an_empty_answer_counts_as_absence() {
        let mut t = Tracker::new(schedule());
        t.apply(found(&["tcp://a:1"], 300 * SECOND));
        assert!(t.apply(found(&[], SECOND)).changes.is_empty());
        assert_eq!(
            t.apply(found(&[], SECOND)).changes,
            vec![remove("tcp://a:1")]
        );
    }

    #[test]
    fn a_single_absence_between_answers_changes_nothing() {
        let mut t = Tracker::new(schedule());
        t.apply(found(&["tcp://a:1"], 300 * SECOND));
        assert!(t.apply(Outcome::Absent).changes.is_empty());
        assert!(t
            .apply(found(&["tcp://a:1"], 300 * SECOND))
            .changes
            .is_empty());
        // The confirmation starts over: one more absence is again not enough.
        assert!(t.apply(Outcome::Absent).changes.is_empty());
        // So it does after a partial answer with members (a review: an absence on
        // each side of one emptied the set).
        let partial = Outcome::Partial {
            members: ["tcp://a:1".parse().unwrap()].into_iter().collect(),
            kept: Kept::V6,
        };
        assert!(t.apply(partial).changes.is_empty());
        assert!(t.apply(Outcome::Absent).changes.is_empty());
    }

    #[test]
    fn a_failure_neither_confirms_nor_cancels_an_absence() {
        let mut t = Tracker::new(schedule());
        t.apply(found(&["tcp://a:1"], 300 * SECOND));
        assert!(t.apply(Outcome::Absent).changes.is_empty());
        assert!(t.apply(Outcome::Failed).changes.is_empty());
        assert_eq!(t.apply(Outcome::Absent).changes, vec![remove("tcp://a:1")]);
    }
}
