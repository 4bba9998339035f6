//! How the core's stream credit (docs/wire.md §6.9) is counted on this wire: both links
//! count a message's cost as the core does, and bound what a connection's calls hold of
//! unfinished messages together.
//!
//! **Receiving**: a call's DATA window is released to the peer while the core has
//! credit for the call's messages; past it, the bytes that came are held with their
//! window closed, and released as the core takes those messages (all of them once only
//! part of a message is left, which completes only once its window is released). A
//! core that stops reading a stream therefore stops the window, and the peer stops
//! sending: what one stream holds is at most its window, the core's credit and one
//! message.
//!
//! **Sending**: the core may send messages while its credit lasts; the link hands them
//! to the connection, which writes them as the peer's windows allow, and gives the core
//! its credit back, with a WINDOW, for each message that left the stream's queue for
//! the socket's. A peer that stops reading so stops the core's producer after one
//! window's worth, as over the core's own wire.

/// The least a message costs in the core's stream credit, however short
/// (docs/wire.md §6.9, `MIN_MESSAGE_COST`): both halves count credit as the core does.
pub(crate) const MIN_MESSAGE_COST: usize = 64;

/// What one message of `len` bytes costs in stream credit.
pub(crate) fn message_cost(len: usize) -> u32 {
    u32::try_from(len.max(MIN_MESSAGE_COST)).unwrap_or(u32::MAX)
}

/// A connection's bound on the bytes of unfinished messages its calls hold together,
/// in largest messages: a message's window is released as its bytes come (it may be
/// longer than the window), so without it a peer could leave a message unfinished on
/// every stream (256 streams of 16 MiB, 4 GiB a connection). A call whose bytes would
/// take the sum past it fails `RESOURCE_EXHAUSTED` (unless it holds at most 64 KiB):
/// failing is deadlock-free where holding its window back is not, as the streams share
/// the connection's window. The server link also holds new calls back at this many
/// largest messages of answers waiting for the peer's windows.
pub(crate) const UNFINISHED_MESSAGES: usize = 4;

/// [`UNFINISHED_MESSAGES`] times a connection's largest message, in bytes.
pub(crate) fn connection_bound(max_message: usize) -> usize {
    max_message.saturating_mul(UNFINISHED_MESSAGES)
}

/// A call whose unfinished message holds at most this much is never refused for the
/// connection's bound (a small message split over two DATA frames, next to large
/// transfers that fill the bound): 256 streams of it are 16 MiB.
const UNFINISHED_SPARED: usize = 64 * 1024;

/// What a connection's calls hold of unfinished messages together, against
/// [`UNFINISHED_MESSAGES`] times the largest message.
#[derive(Debug)]
pub(crate) struct Unfinished {
    held: usize,
    max: usize,
}

impl Unfinished {
    /// The bound of a connection whose largest message is `max_message` bytes.
    pub(crate) fn new(max_message: usize) -> Unfinished {
        Unfinished {
            held: 0,
            max: connection_bound(max_message),
        }
    }

    /// What the calls hold now, together.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// A call that had `counted` of its bytes counted now holds `now` of an unfinished
    /// message: counted too, and an error if that takes the connection past its bound
    /// (unless the call holds at most 64 KiB).
    pub(crate) fn count(
        &mut self,
        counted: &mut usize,
        now: usize,
    ) -> Result<(), crate::codec::MessageError> {
        if now > *counted {
            self.held += now - *counted;
            *counted = now;
            if self.held > self.max && now > UNFINISHED_SPARED {
                return Err(crate::codec::MessageError::ConnectionFull {
                    held: self.held,
                    max: self.max,
                });
            }
        }
        Ok(())
    }

    /// A call's unfinished bytes are a message now: its count starts again.
    pub(crate) fn forget(&mut self, counted: &mut usize) {
        self.uncount(std::mem::take(counted));
    }

    /// A call that had `counted` bytes counted is gone.
    pub(crate) fn uncount(&mut self, counted: usize) {
        self.held -= counted;
    }
}
