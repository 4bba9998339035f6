//! [`RdmaConfig`]: every limit of RDMA links and of the soft provider.

use std::time::Duration;

use rpc_core::{Error, ErrorKind};

/// Default receive buffers posted per connection (the credits the peer gets).
pub const DEFAULT_RECV_BUFFERS: usize = 64;

/// Default length of each receive buffer: the largest message the peer may send
/// eagerly, link header included.
pub const DEFAULT_RECV_BUFFER_LEN: usize = 8 * 1024;

/// Most receive buffers a side may ask for: credits travel as a 16-bit count, and
/// the soft provider's peer must not make us post without bound.
pub const MAX_RECV_BUFFERS: usize = 4096;

/// Longest receive buffer a side may ask for (1 MiB): the soft provider's packet
/// decoder sizes its limit from the peer's buffers.
pub const MAX_RECV_BUFFER_LEN: usize = 1 << 20;

/// Shortest receive buffer: room for a rendezvous request with a few segments.
pub const MIN_RECV_BUFFER_LEN: usize = 512;

/// Settings of RDMA links and providers. Every field has a default.
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Receive buffers posted per connection: how many messages the peer may send
    /// before we give credits back. At least 4, at most [`MAX_RECV_BUFFERS`].
    /// Default: [`DEFAULT_RECV_BUFFERS`].
    pub recv_buffers: usize,
    /// Length of each receive buffer. At least [`MIN_RECV_BUFFER_LEN`], at most
    /// [`MAX_RECV_BUFFER_LEN`]. Default: [`DEFAULT_RECV_BUFFER_LEN`].
    pub recv_buffer_len: usize,
    /// Frames up to this long (core header and payload) are copied into a send and
    /// land in one of the peer's receive buffers; longer ones go by rendezvous (the
    /// receiver pulls them with a one-sided read). Capped by the peer's receive
    /// buffers. Default: 8 KiB less the link header.
    pub eager_threshold: usize,
    /// Frames this side has exposed for the peer to pull and that the peer has not
    /// released yet; past it, sends wait. Default: 16.
    pub max_rendezvous: usize,
    /// Rendezvous frames this side pulls or holds (pulled, not yet taken by the
    /// core) at once: with `max_frame_len` it bounds the memory a peer can make us
    /// allocate for large frames. Default: 4.
    pub max_pulls: usize,
    /// Frames the link queues while it waits for credits or rendezvous slots before
    /// `poll_ready` waits. Default: 64.
    pub max_pending_frames: usize,
    /// Operations posted and not completed per connection (the send queue depth).
    /// Default: 256.
    pub send_queue_depth: usize,
    /// Regions registered at once per connection (the soft provider's table size).
    /// `max_rendezvous` × 4 of them are kept for the link's rendezvous frames (4
    /// segments at most each), the rest is for bulk exposures; it must leave them
    /// some. Default: 1024.
    pub max_regions: u32,
    /// Soft provider: use cross-memory attach for one-sided operations when the
    /// peer is on this host (connected over `rdma+unix://`, its pid confirmed by the
    /// kernel; never over TCP) and lets us; otherwise (or when `false`) the peer's
    /// responder task serves them over the connection. Default: true.
    pub cross_memory_attach: bool,
    /// How long connection setup may take before it fails. Default: 10 s.
    pub handshake_timeout: Duration,
    /// Soft provider: how long one-sided operations served by the peer's responder
    /// may go without an answer before the connection fails (a peer that never
    /// answers would otherwise keep each rendezvous buffer, up to
    /// `max_pulls` × the largest frame, for the connection's life). Hardware has its
    /// own transport retry timeout. Default: 30 s.
    pub one_sided_timeout: Duration,
    /// Whether bulk transfers ([`rpc_core::bulk`]) over these links are one-sided
    /// reads and writes of registered memory (`true`: the exposing side runs no
    /// code for them), or BULK frames served by the core's connection task, as on
    /// TCP (`false`: for comparison, or for hardware where a refused access should
    /// not break the queue pair). Both sides decide for their own descriptors.
    /// Default: true.
    pub bulk_one_sided: bool,
    /// One-sided bulk operations this side runs at once per connection; more wait
    /// for a slot. Each holds a registered buffer of its piece (at most
    /// [`rpc_core::bulk::MAX_BULK_OP`], 1 MiB), so this bounds that memory; the soft
    /// provider copies one at a time anyway. Default: 32.
    pub max_bulk_ops: usize,
    /// Whether this side packs the eager frames it sends between two flushes into
    /// BATCH messages, several to a message, and accepts them (announced in its
    /// HELLO; frames go in batches only to a peer that announced it too). One message,
    /// one credit and one completion then carry a burst of small frames. `false`
    /// sends each frame in a message of its own, as peers before BATCH did.
    /// Default: true.
    pub batch_frames: bool,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            recv_buffers: DEFAULT_RECV_BUFFERS,
            recv_buffer_len: DEFAULT_RECV_BUFFER_LEN,
            eager_threshold: DEFAULT_RECV_BUFFER_LEN - crate::wire::HEADER_LEN,
            max_rendezvous: 16,
            max_pulls: 4,
            max_pending_frames: 64,
            send_queue_depth: 256,
            max_regions: 1024,
            cross_memory_attach: true,
            handshake_timeout: Duration::from_secs(10),
            one_sided_timeout: Duration::from_secs(30),
            bulk_one_sided: true,
            max_bulk_ops: 32,
            batch_frames: true,
        }
    }
}

impl RdmaConfig {
    /// Checks the settings against their limits.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::new(ErrorKind::InvalidAddress, what));
        if !(4..=MAX_RECV_BUFFERS).contains(&self.recv_buffers) {
            return bad(format!(
                "recv_buffers must be from 4 to {MAX_RECV_BUFFERS}, not {}",
                self.recv_buffers
            ));
        }
        if !(MIN_RECV_BUFFER_LEN..=MAX_RECV_BUFFER_LEN).contains(&self.recv_buffer_len) {
            return bad(format!(
                "recv_buffer_len must be from {MIN_RECV_BUFFER_LEN} to {MAX_RECV_BUFFER_LEN}, \
                 not {}",
                self.recv_buffer_len
            ));
        }
        if self.max_rendezvous == 0
            || self.max_pulls == 0
            || self.max_pending_frames == 0
            || self.max_bulk_ops == 0
        {
            return bad(
                "max_rendezvous, max_pulls, max_pending_frames and max_bulk_ops must be at \
                 least 1"
                    .into(),
            );
        }
        if self.one_sided_timeout.is_zero() {
            return bad("one_sided_timeout must be above zero".into());
        }
        if self.send_queue_depth < 8 {
            return bad(format!(
                "send_queue_depth must be at least 8, not {}",
                self.send_queue_depth
            ));
        }
        if self.max_regions == 0 || self.max_regions > 1 << 20 {
            return bad(format!(
                "max_regions must be from 1 to {}, not {}",
                1 << 20,
                self.max_regions
            ));
        }
        if self.max_bulk_regions() == 0 {
            return bad(format!(
                "max_regions ({}) must be above max_rendezvous × {} ({}): the link keeps \
                 that many regions for its rendezvous, and bulk exposures need the rest",
                self.max_regions,
                crate::wire::MAX_SEGMENTS,
                self.max_rendezvous
                    .saturating_mul(crate::wire::MAX_SEGMENTS)
            ));
        }
        Ok(())
    }

    /// The regions bulk exposures may hold at once: `max_regions` less what the
    /// link's rendezvous may need (`max_rendezvous` frames of up to `MAX_SEGMENTS`
    /// regions each), so that exposures never leave a frame without its regions.
    pub(crate) fn max_bulk_regions(&self) -> usize {
        (self.max_regions as usize).saturating_sub(
            self.max_rendezvous
                .saturating_mul(crate::wire::MAX_SEGMENTS),
        )
    }
}
