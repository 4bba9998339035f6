//! The server-wide budget for the bytes of large unary requests held at once
//! ([`ServerBuilder::max_large_request_bytes`](super::ServerBuilder::max_large_request_bytes)).
//!
//! Each connection bounds its own large requests (4 × `max_frame_len`, then it stops
//! reading), but many connections together could still make the server hold more than
//! its memory: a few kilobytes of gzip that stand for 16 MiB each, pipelined on
//! thousands of connections that never read their answers. So a large request (from a
//! 256th of `max_frame_len`, and every compressed one, as decompressed) is charged here
//! too, for as long as its bytes live and its call lasts: the charge is dropped with
//! the last of its payload's clones (the handler's, or an echoed answer's being
//! written) and the connection's record of the call (until its answer goes to the
//! link, or the call is dropped). The bytes alone were not enough: a handler that
//! decodes the request copies its string fields and drops the payload at once, and
//! then holds the copy, and its answer, uncharged (15 MiB strings of 500 bytes of zstd
//! each, on connections that never read, held 1.3 GB past the budget: a review).

use std::sync::{
    atomic::{AtomicUsize, Ordering::Relaxed},
    Arc,
};

use bytes::Bytes;

/// The large request bytes a server holds at once, across all its connections; and,
/// apart, the request-stream bytes its handlers have not read yet ([`Queued`]), and
/// the unary answers its connections hold for clients that do not read them
/// ([`Unsent`]).
#[derive(Debug)]
pub(crate) struct LargeBudget {
    held: AtomicUsize,
    max: usize,
    /// The sum of every connection's [`Queued`] bytes, at most `max` too.
    queued: AtomicUsize,
    /// The sum of every connection's [`Unsent`] bytes.
    unsent: AtomicUsize,
    /// Connections holding some.
    unsent_holders: AtomicUsize,
    /// [`ServerBuilder::max_unsent_answer_bytes`](super::ServerBuilder::max_unsent_answer_bytes).
    unsent_max: usize,
}

impl LargeBudget {
    pub(crate) fn new(max: usize, unsent_max: usize) -> Arc<LargeBudget> {
        Arc::new(LargeBudget {
            held: AtomicUsize::new(0),
            max,
            queued: AtomicUsize::new(0),
            unsent: AtomicUsize::new(0),
            unsent_holders: AtomicUsize::new(0),
            unsent_max,
        })
    }

    /// `payload`, charged against the budget until its last clone and the returned
    /// [`Charge`] are dropped; `Err` with the bytes held now if it does not fit.
    pub(crate) fn charge(self: &Arc<Self>, payload: Bytes) -> Result<(Bytes, Arc<Charge>), usize> {
        let len = payload.len();
        self.held
            .fetch_update(Relaxed, Relaxed, |held| {
                held.checked_add(len).filter(|&total| total <= self.max)
            })
            .map(|_| {
                let charge = Arc::new(Charge {
                    len,
                    budget: self.clone(),
                });
                let payload = Bytes::from_owner(Charged {
                    payload,
                    _charge: charge.clone(),
                });
                (payload, charge)
            })
    }

    /// Bytes charged now.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Relaxed)
    }

    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Decompresses a received `data` into at most `max_len` bytes, and no more than
    /// the budget has room for now (what it makes is charged here next): with the
    /// budget spent, a bomb was inflated whole (16 MiB for 16 KiB) and only then
    /// refused, and clients pipelining them kept both cores busy (from a review).
    /// Stopped by the room, the status is `RESOURCE_EXHAUSTED` with what
    /// `refused` makes of the budget's words; `reserved` as in
    /// [`decompress_reserving`](crate::compress::decompress_reserving).
    pub(crate) fn decompress(
        &self,
        data: &[u8],
        max_len: usize,
        reserved: &mut dyn FnMut(usize),
        refused: impl FnOnce(String) -> String,
    ) -> Result<Bytes, crate::Status> {
        let room = self.max.saturating_sub(self.held.load(Relaxed));
        let limit = max_len.min(room);
        crate::compress::decompress_reserving(data, limit, reserved).map_err(|status| {
            if limit < max_len && status.code() == crate::Code::RESOURCE_EXHAUSTED {
                crate::Status::resource_exhausted(refused(format!(
                    "the server holds {} bytes of large requests, its limit being {} bytes; \
                     decompressed no further than the {room} bytes left",
                    self.max - room,
                    self.max
                )))
            } else {
                status
            }
        })
    }
}

/// A connection's request-stream bytes that their handlers have not read yet (what
/// the client's credit lets it send ahead), counted server-wide as well: each
/// connection stops reading at its own bound (4 × `max_frame_len`), but messages under
/// the large requests' 256th of a frame, on many connections whose stream handlers do
/// not read, were bounded by nothing else (36 connections held 2.1 GB; a review). A
/// message that would take the server's total past the budget's `max` is refused.
/// What is left is given back when the connection goes.
#[derive(Debug)]
pub(crate) struct Queued {
    here: usize,
    budget: Arc<LargeBudget>,
}

impl Queued {
    pub(crate) fn new(budget: Arc<LargeBudget>) -> Queued {
        Queued { here: 0, budget }
    }

    /// This connection's bytes.
    pub(crate) fn get(&self) -> usize {
        self.here
    }

    /// Adds `len` bytes, if the server's total stays within the budget; `Err` with the
    /// server's total now if not.
    pub(crate) fn add(&mut self, len: usize) -> Result<(), usize> {
        let max = self.budget.max;
        self.budget
            .queued
            .fetch_update(Relaxed, Relaxed, |queued| {
                queued.checked_add(len).filter(|&total| total <= max)
            })?;
        self.here += len;
        Ok(())
    }

    /// Takes `len` of this connection's bytes away (read, refused, or their stream
    /// gone).
    pub(crate) fn sub(&mut self, len: usize) {
        let len = len.min(self.here);
        self.here -= len;
        self.budget.queued.fetch_sub(len, Relaxed);
    }

    /// The budget's bound.
    pub(crate) fn max(&self) -> usize {
        self.budget.max
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.budget.queued.fetch_sub(self.here, Relaxed);
    }
}

/// A connection's finished unary answers that its link could not take yet (the client
/// reads them slower than they come, or not at all), counted server-wide. Each
/// connection holds at most its limit of calls in flight (256), but answers of up to
/// `max_frame_len` each: a request of 62 bytes can have an answer of a megabyte, and
/// eight connections pipelining such requests and reading nothing held 2.1 GB for the
/// 140 s until their write stall was noticed (from a review). Answers cannot be
/// refused once their handlers ran, so the bound ends connections instead: while the
/// server's total is over its bound, a connection that holds more than its share of
/// it (the bound over the connections holding any) is ended, its answers dropped,
/// when it finds its link full again. Counted only while a connection's link is full
/// (nothing on the path of answers that leave at once).
#[derive(Debug)]
pub(crate) struct Unsent {
    here: usize,
    budget: Arc<LargeBudget>,
}

impl Unsent {
    pub(crate) fn new(budget: Arc<LargeBudget>) -> Unsent {
        Unsent { here: 0, budget }
    }

    /// This connection's bytes, as last set.
    pub(crate) fn get(&self) -> usize {
        self.here
    }

    /// Sets this connection's bytes to `now`. `Err` with why, when the server's
    /// total is over its bound and `now` over this connection's share of it: the
    /// connection is to end.
    pub(crate) fn set(&mut self, now: usize) -> Result<(), String> {
        let budget = &self.budget;
        match (self.here, now) {
            (0, 0) => return Ok(()),
            (0, _) => {
                budget.unsent_holders.fetch_add(1, Relaxed);
            }
            (_, 0) => {
                budget.unsent_holders.fetch_sub(1, Relaxed);
            }
            _ => {}
        }
        let total = if now >= self.here {
            budget.unsent.fetch_add(now - self.here, Relaxed) + (now - self.here)
        } else {
            budget.unsent.fetch_sub(self.here - now, Relaxed) - (self.here - now)
        };
        self.here = now;
        let holders = budget.unsent_holders.load(Relaxed).max(1);
        let share = budget.unsent_max / holders;
        if total > budget.unsent_max && now > share {
            return Err(format!(
                "the client has not read {now} bytes of answers, more than its share \
                 ({share} bytes) of the server's bound on unread answers, {} bytes, which \
                 {holders} connections together exceed ({total} bytes; \
                 ServerBuilder::max_unsent_answer_bytes)",
                budget.unsent_max
            ));
        }
        Ok(())
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        let _ = self.set(0);
    }
}

/// Bytes charged to the budget, given back when the last holder (the payload's
/// owner, the call's record) drops it.
#[derive(Debug)]
pub(crate) struct Charge {
    len: usize,
    budget: Arc<LargeBudget>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.len, Relaxed);
    }
}

/// A charged payload.
struct Charged {
    payload: Bytes,
    _charge: Arc<Charge>,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.payload
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_lasts_as_long_as_the_last_clone_of_its_bytes_and_its_call() {
        let budget = LargeBudget::new(100, 100);
        let (a, call_a) = budget.charge(Bytes::from(vec![1u8; 60])).unwrap();
        assert_eq!(budget.held(), 60);
        assert_eq!(&a[..], &[1u8; 60][..]);
        // Over the limit: refused, with what is held.
        assert!(matches!(budget.charge(Bytes::from(vec![2u8; 41])), Err(60)));
        let (b, call_b) = budget.charge(Bytes::from(vec![3u8; 40])).unwrap();
        assert_eq!(budget.held(), 100);
        drop(call_a);
        let part = a.slice(10..20);
        drop(a);
        assert_eq!(budget.held(), 100, "a slice keeps the whole charge");
        drop(part);
        assert_eq!(budget.held(), 40);
        // The bytes gone (a handler decoded them and dropped the payload): the call
        // keeps the charge until it ends.
        drop(b);
        assert_eq!(budget.held(), 40);
        drop(call_b);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn unread_answers_end_the_connections_over_their_share_of_an_exceeded_bound() {
        let budget = LargeBudget::new(100, 100);
        let mut a = Unsent::new(budget.clone());
        let mut b = Unsent::new(budget.clone());
        // Under the bound, any share.
        assert!(a.set(90).is_ok());
        // Over it: b holds 20 of 110, under its share of 50; a, holding 90, is not
        // checked until it counts again.
        assert!(b.set(20).is_ok());
        let why = a.set(90).unwrap_err();
        assert!(
            why.contains("90 bytes") && why.contains("(50 bytes)"),
            "{why}"
        );
        // A's answers leaving bring the total back: nobody is over.
        assert!(a.set(10).is_ok());
        assert!(b.set(60).is_ok());
        drop(a);
        drop(b);
        assert_eq!(budget.unsent.load(Relaxed), 0);
        assert_eq!(budget.unsent_holders.load(Relaxed), 0);
    }
}
