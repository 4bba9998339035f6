//! HTTP/2 keepalive, the server's and the client's: a PING once an interval passed
//! without reading anything from the peer, the connection closed when one goes
//! unanswered for the timeout. Driven from the link's own task, on a [`LazySleep`].

use std::{task::Context, time::Duration};

use rpc_core::link::LazySleep;

use crate::http2::conn::Connection;

/// How many times per interval the keepalive looks whether the peer was heard from:
/// the PING goes between 1 and 1 + 1/8 intervals after the last bytes read. Looking
/// once per interval, a peer heard from just after a look was PINGed only at the
/// second look after it (a silent client closed at 140 s rather than 80 s by default,
/// from a review).
const LOOKS_PER_INTERVAL: u32 = 8;

/// One connection's keepalive (see the module docs).
pub(crate) struct Keepalive {
    interval: Duration,
    timeout: Duration,
    /// Who is PINGed (`client`, `server`), for the cause.
    peer: &'static str,
    timer: LazySleep,
    /// The PING in flight.
    waiting: Option<[u8; 8]>,
    /// Bytes read when last looked, and when that count last moved (or the last
    /// answer came).
    seen: u64,
    heard: tokio::time::Instant,
    /// PINGs sent.
    pings: u64,
}

impl Keepalive {
    /// A keepalive PINGing `peer` after `interval` of silence, waiting `timeout` for
    /// the answer.
    pub(crate) fn new(interval: Duration, timeout: Duration, peer: &'static str) -> Keepalive {
        Keepalive {
            interval,
            timeout,
            peer,
            timer: LazySleep::new(interval / LOOKS_PER_INTERVAL),
            waiting: None,
            seen: 0,
            heard: tokio::time::Instant::now(),
            pings: 0,
        }
    }

    /// Whether a PING was ever sent.
    pub(crate) fn pinged(&self) -> bool {
        self.pings > 0
    }

    /// Sends PINGs on time, `read` being the bytes read so far; a PING is due only
    /// while `due` (a client PINGs only while calls are in flight). `Err` with the
    /// cause once one went unanswered.
    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        read: u64,
        due: bool,
        conn: &mut Connection,
    ) -> Result<(), String> {
        while self.timer.poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            if self.waiting.is_some() {
                return Err(format!(
                    "keepalive: the {} did not answer a PING within {:?}",
                    self.peer, self.timeout
                ));
            }
            if read != self.seen || !due {
                // Heard from (or idle, with nothing to watch for): the interval starts
                // again.
                self.seen = read;
                self.heard = now;
            }
            let at = self.heard + self.interval;
            if now < at {
                let next = (now + self.interval / LOOKS_PER_INTERVAL).min(at);
                self.timer.reset(next);
                continue;
            }
            self.pings += 1;
            let payload = self.pings.to_be_bytes();
            conn.ping(payload);
            self.waiting = Some(payload);
            self.timer.reset(now + self.timeout);
        }
        Ok(())
    }

    /// A PING's answer came.
    pub(crate) fn pong(&mut self, payload: [u8; 8], read: u64) {
        if self.waiting == Some(payload) {
            self.waiting = None;
            self.seen = read;
            self.heard = tokio::time::Instant::now();
            self.timer
                .reset(self.heard + self.interval / LOOKS_PER_INTERVAL);
        }
    }
}
