//! Entry points for the fuzz targets in `fuzz/` to the crate's private protocol
//! engine. Compiled only with `--cfg fuzzing` (which `fuzz/run` sets) and in tests; not
//! part of the API.

use std::sync::{atomic::Ordering, Arc};

use bytes::Bytes;
use tokio::time::Instant;

use crate::{config::UdpConfig, engine::Engine, UdpStats};

/// One side of an association, sans-IO: the engine a link drives, with the checks a
/// target runs after every step.
pub struct Association {
    engine: Engine,
    stats: Arc<UdpStats>,
    max_datagram: usize,
    max_message_len: usize,
    max_reassembly: usize,
}

impl Association {
    /// An engine with datagrams of `max_datagram` bytes (at least 64), messages of at
    /// most `max_message_len` bytes and `max_reassembly` bytes of reassembly memory.
    pub fn new(max_datagram: usize, max_message_len: usize, max_reassembly: usize) -> Self {
        let max_datagram = max_datagram.max(64);
        let config = UdpConfig {
            max_datagram,
            max_message_len: Some(max_message_len),
            max_reassembly_bytes: max_reassembly,
            max_total_reassembly_bytes: max_reassembly,
            ..UdpConfig::default()
        };
        let stats = Arc::new(UdpStats::default());
        let engine = Engine::new(Arc::new(config), stats.clone(), max_message_len);
        let max_datagram = engine.max_datagram();
        Association {
            engine,
            stats,
            max_datagram,
            max_message_len,
            max_reassembly,
        }
    }

    /// The statistics the engine keeps.
    pub fn stats(&self) -> &UdpStats {
        &self.stats
    }

    /// A datagram arrives.
    pub fn on_datagram(&mut self, datagram: Bytes, now: Instant) {
        self.engine.on_datagram(datagram, now);
        self.check();
    }

    /// Queues a frame (`header` then `payload`), if the engine takes more.
    pub fn send_frame(&mut self, header: &[u8], payload: Bytes, now: Instant) -> bool {
        if !self.engine.can_send() {
            return false;
        }
        self.engine.send_frame(header, payload.into(), now);
        self.check();
        true
    }

    /// The next datagram to send; checks it fits one datagram and decodes.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Bytes> {
        let datagram = self.engine.poll_transmit(now)?;
        assert!(
            datagram.len() <= self.max_datagram,
            "sent a datagram of {} bytes, over {}",
            datagram.len(),
            self.max_datagram
        );
        assert!(
            crate::datagram::Datagram::decode(datagram.clone()).is_ok(),
            "sent a datagram its own decoder refuses"
        );
        Some(datagram)
    }

    /// A frame received (whole or reassembled); checks it is within the limit.
    pub fn take_delivered(&mut self) -> Option<Bytes> {
        let frame = self.engine.take_delivered()?;
        assert!(frame.len() <= self.max_message_len.max(65_535));
        Some(frame)
    }

    /// When the engine's next timer is due.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.engine.next_timeout()
    }

    /// Runs the timers due at `now`.
    pub fn on_timeout(&mut self, now: Instant) {
        self.engine.on_timeout(now);
        self.check();
    }

    /// Whether the association failed (peer restarted, peer silent).
    pub fn failed(&self) -> bool {
        self.engine.failure().is_some()
    }

    /// Whether nothing is in progress either way.
    pub fn is_idle(&self) -> bool {
        self.engine.is_idle()
    }

    fn check(&self) {
        let held = self.stats.reassembly_bytes.load(Ordering::Relaxed);
        assert!(
            held <= self.max_reassembly,
            "{held} bytes of reassembly memory, over the budget of {}",
            self.max_reassembly
        );
    }
}

impl Drop for Association {
    fn drop(&mut self) {
        // Every reserved byte is given back when the association goes (a leak would
        // starve the listener's other associations).
        let engine = std::mem::replace(
            &mut self.engine,
            Engine::new(Arc::new(UdpConfig::default()), self.stats.clone(), 0),
        );
        drop(engine);
        let held = self.stats.reassembly_bytes.load(Ordering::Relaxed);
        if !std::thread::panicking() {
            assert_eq!(held, 0, "reassembly memory leaked");
        }
    }
}
