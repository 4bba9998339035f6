//! Credit accounting, without I/O: a sender never sends into a receive buffer the
//! peer has not posted.
//!
//! Each side posts `window` receive buffers; a credit is the right to fill one.
//! Every message uses one credit and carries, in its header, the number of buffers
//! its sender posted again since its previous message (credits piggybacked on
//! traffic). When there is no traffic to carry them, a CREDIT message does.
//!
//! Rules, and why they cannot deadlock or loop:
//!
//! - **Data** messages (EAGER, RTS) need two credits: the last one is kept for
//!   **control** messages (CREDIT, FIN), so a side can always give credits back.
//! - A control message may use the last credit only if it returns at least one: so
//!   whenever a side reaches zero, the message that got it there hands the peer a
//!   credit, and some credit is always held or in flight.
//! - A CREDIT message is sent when the returned-buffer count reaches half the
//!   window, or when the peer is (by our count) short of credits and at least one
//!   returned buffer held a data message. Buffers that held control messages alone
//!   never trigger one: a CREDIT answered by a CREDIT answered by a CREDIT would
//!   otherwise go on forever.
//!
//! The simulation in the tests runs two sides against each other with random
//! delivery, stalled consumers and both sides sending, and checks that no message
//! ever finds its buffers full, that everything sent arrives, and that credit
//! messages stay few.

use rpc_core::{Error, ErrorKind};

/// The kind of message, for the credit rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// EAGER and RTS: held until the core takes the frame.
    Data,
    /// HELLO, FIN and CREDIT: handled by the link at once.
    Control,
}

/// One side's credits.
#[derive(Clone, Debug)]
pub(crate) struct Credits {
    /// Credits we hold: buffers of the peer we may fill.
    avail: u32,
    /// The peer's window, once its HELLO arrived.
    peer_window: Option<u32>,
    /// Messages sent before the peer's HELLO (our HELLO).
    sent_before_hello: u32,
    /// Our window.
    own_window: u32,
    /// Our buffers posted again and not yet announced, by what they held.
    freed_data: u32,
    freed_control: u32,
    /// Credits the peer holds for our buffers, by our count.
    peer_avail: u32,
}

impl Credits {
    /// Before the peer's HELLO: one credit, for our own HELLO (every side posts its
    /// buffers before it can receive anything).
    pub(crate) fn new(own_window: u32) -> Credits {
        Credits {
            avail: 1,
            peer_window: None,
            sent_before_hello: 0,
            own_window,
            freed_data: 0,
            freed_control: 0,
            peer_avail: own_window,
        }
    }

    /// The peer's HELLO told its window.
    pub(crate) fn on_peer_hello(&mut self, peer_window: u32) -> Result<(), Error> {
        if self.peer_window.is_some() {
            return Err(Error::new(ErrorKind::Protocol, "the peer sent HELLO twice"));
        }
        self.peer_window = Some(peer_window);
        // The HELLO credit was ours to use once; now we know the real number.
        self.avail = peer_window.saturating_sub(self.sent_before_hello);
        Ok(())
    }

    pub(crate) fn started(&self) -> bool {
        self.peer_window.is_some()
    }

    /// Credits we hold.
    pub(crate) fn available(&self) -> u32 {
        self.avail
    }

    fn freed(&self) -> u32 {
        self.freed_data + self.freed_control
    }

    /// Whether a message of `class` may go now.
    pub(crate) fn can_send(&self, class: Class) -> bool {
        if !self.started() {
            // Only our HELLO, on the credit every side starts with.
            return class == Class::Control && self.avail >= 1;
        }
        match class {
            Class::Data => self.avail >= 2,
            Class::Control => self.avail >= 2 || (self.avail == 1 && self.freed() > 0),
        }
    }

    /// A message is going out: takes its credit and returns the credits it carries.
    pub(crate) fn on_send(&mut self) -> u16 {
        debug_assert!(self.avail >= 1, "sent without a credit");
        self.avail = self.avail.saturating_sub(1);
        if !self.started() {
            self.sent_before_hello += 1;
        }
        let returned = self.freed().min(u32::from(u16::MAX));
        // Data buffers are announced first (they are what the peer waits for).
        let from_data = returned.min(self.freed_data);
        self.freed_data -= from_data;
        self.freed_control -= returned - from_data;
        self.peer_avail += returned;
        returned as u16
    }

    /// A message arrived carrying `returned` credits.
    pub(crate) fn on_receive(&mut self, returned: u16) -> Result<(), Error> {
        self.peer_avail = self.peer_avail.saturating_sub(1);
        self.avail += u32::from(returned);
        if let Some(window) = self.peer_window {
            if self.avail > window {
                return Err(Error::new(
                    ErrorKind::Protocol,
                    format!(
                        "the peer returned more credits ({}) than it has receive buffers ({window})",
                        self.avail
                    ),
                ));
            }
        }
        Ok(())
    }

    /// We posted one of our buffers again.
    pub(crate) fn on_repost(&mut self, held: Class) {
        match held {
            Class::Data => self.freed_data += 1,
            Class::Control => self.freed_control += 1,
        }
    }

    /// Whether a CREDIT message should go (if no other message is about to carry
    /// the credits).
    pub(crate) fn credit_due(&self) -> bool {
        let freed = self.freed();
        if freed == 0 || !self.started() {
            return false;
        }
        let batch = (self.own_window / 2).max(1);
        let low = (self.own_window / 4).max(1);
        freed >= batch || (self.peer_avail <= low && self.freed_data >= 1)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Copy, Debug)]
    struct Msg {
        class: Class,
        credits: u16,
    }

    struct Side {
        credits: Credits,
        /// Buffers posted now.
        posted: u32,
        /// Data messages received and not yet consumed (each holds a buffer).
        held: u32,
        /// Data messages still to send.
        to_send: u32,
        received_data: u32,
        credit_messages: u32,
    }

    impl Side {
        fn new(window: u32, to_send: u32) -> Side {
            Side {
                credits: Credits::new(window),
                posted: window,
                held: 0,
                to_send,
                received_data: 0,
                credit_messages: 0,
            }
        }
    }

    /// Runs two sides with a random schedule; returns false on a deadlock.
    fn run(window_a: u32, window_b: u32, sends: (u32, u32), schedule: &[u8], stall: u8) -> bool {
        let mut sides = [Side::new(window_a, sends.0), Side::new(window_b, sends.1)];
        let mut wires: [VecDeque<Msg>; 2] = [VecDeque::new(), VecDeque::new()];
        let windows = [window_a, window_b];
        // HELLOs.
        for i in 0..2 {
            assert!(sides[i].credits.can_send(Class::Control));
            let credits = sides[i].credits.on_send();
            wires[i].push_back(Msg {
                class: Class::Control,
                credits,
            });
        }
        let mut hello_seen = [false, false];
        let mut idle = 0;
        for step in 0..200_000u32 {
            // Random choices interleaved with a round robin, so that every action
            // keeps getting its turn (a schedule that never delivers is no deadlock).
            let choice = if step % 2 == 0 {
                schedule[(step / 2) as usize % schedule.len()]
            } else {
                ((step / 2) % 8) as u8
            };
            let i = usize::from(choice & 1);
            let j = 1 - i;
            let mut progressed = false;
            match (choice >> 1) % 4 {
                // Deliver a message to side j.
                0 => {
                    if let Some(msg) = wires[i].pop_front() {
                        let side = &mut sides[j];
                        assert!(side.posted >= 1, "a message found no posted buffer");
                        side.posted -= 1;
                        side.credits.on_receive(msg.credits).unwrap();
                        if !hello_seen[j] {
                            hello_seen[j] = true;
                            side.credits.on_peer_hello(windows[i]).unwrap();
                        }
                        match msg.class {
                            Class::Data => {
                                side.held += 1;
                                side.received_data += 1;
                            }
                            Class::Control => {
                                side.posted += 1;
                                side.credits.on_repost(Class::Control);
                            }
                        }
                        progressed = true;
                    }
                }
                // Side i's consumer takes a frame (unless stalled early on).
                1 => {
                    let stalled = step < u32::from(stall) * 50 && i == 0;
                    if !stalled && sides[i].held > 0 {
                        sides[i].held -= 1;
                        sides[i].posted += 1;
                        sides[i].credits.on_repost(Class::Data);
                        progressed = true;
                    }
                }
                // Side i sends data.
                2 => {
                    let side = &mut sides[i];
                    if side.to_send > 0 && side.credits.can_send(Class::Data) {
                        side.to_send -= 1;
                        let credits = side.credits.on_send();
                        wires[i].push_back(Msg {
                            class: Class::Data,
                            credits,
                        });
                        progressed = true;
                    }
                }
                // Side i gives credits back if due.
                _ => {
                    let side = &mut sides[i];
                    if side.credits.credit_due() && side.credits.can_send(Class::Control) {
                        let credits = side.credits.on_send();
                        side.credit_messages += 1;
                        wires[i].push_back(Msg {
                            class: Class::Control,
                            credits,
                        });
                        progressed = true;
                    }
                }
            }
            idle = if progressed { 0 } else { idle + 1 };
            let done = sides.iter().all(|s| s.to_send == 0 && s.held == 0)
                && wires.iter().all(VecDeque::is_empty);
            if done {
                break;
            }
            if idle > 10_000 {
                return false;
            }
        }
        assert_eq!(sides[0].received_data, sends.1, "everything B sent arrived");
        assert_eq!(sides[1].received_data, sends.0, "everything A sent arrived");
        for side in &sides {
            let data = sends.0 + sends.1;
            assert!(
                side.credit_messages <= data + 2,
                "credit messages ({}) stay proportional to data ({data})",
                side.credit_messages
            );
        }
        true
    }

    #[test]
    fn a_one_way_flood_drains() {
        let schedule: Vec<u8> = (0..=255).collect();
        assert!(run(4, 4, (1000, 0), &schedule, 0));
        assert!(run(64, 8, (5000, 3000), &schedule, 20));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn random_schedules_never_overrun_deadlock_or_lose(
            window_a in 4u32..20,
            window_b in 4u32..20,
            sends_a in 0u32..300,
            sends_b in 0u32..300,
            stall in 0u8..40,
            schedule in proptest::collection::vec(any::<u8>(), 16..256),
        ) {
            prop_assert!(run(window_a, window_b, (sends_a, sends_b), &schedule, stall), "deadlock");
        }
    }
}
