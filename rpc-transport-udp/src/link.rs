//! [`UdpLink`]: the [`Link`] over one association, client or server side.

use std::{
    collections::{HashSet, VecDeque},
    io,
    net::SocketAddr,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use rpc_core::{
    frame::FrameKind,
    link::{LazySleep, Link},
    Error, ErrorKind, Payload,
};
use tokio::{net::UdpSocket, time::Instant};

use crate::{
    batch,
    config::{UdpConfig, UdpStats},
    engine::{frame_tag, Engine},
    listener::{PeerActivity, PeerGuard, PeerQueue},
    socket::Connected,
};

/// Datagrams read per call before the link yields to other tasks.
const RECV_BUDGET: usize = 256;
/// Datagrams written per call before the link yields to other tasks.
const SEND_BUDGET: usize = 256;
/// Calls tracked as open per server association (to tell an idle peer from one whose
/// handler is running); past it the association counts as busy until some end.
const MAX_OPEN_CALLS: usize = 4096;
/// How late an idle check may come before it is taken for a stopped or starved
/// process rather than a silent peer ([`UdpLink::idle_due`]), and the grace given then.
const LATE_CHECK_GRACE: Duration = Duration::from_secs(1);

/// Where a link's datagrams come from and go to.
enum Io {
    /// A client's own connected socket: the kernel filters other senders and reports
    /// ICMP errors (port unreachable) on it.
    Connected { socket: Connected },
    /// One peer of a listener. The peer's datagrams arrive on its own connected socket
    /// (`own`, see [`UdpConfig::peer_sockets`](crate::UdpConfig::peer_sockets)) and,
    /// for those that reached the listener's socket first or when there is no own
    /// socket, through the listener's routing task (`datagrams`). Replies go out
    /// through `own`, else through the shared socket.
    Peer {
        datagrams: PeerQueue,
        own: Option<Connected>,
        socket: Arc<UdpSocket>,
        addr: SocketAddr,
        /// The table entry; dropped (with `own`) as soon as the peer is gone, so that
        /// a new client at the address opens a new association at once.
        guard: Option<PeerGuard>,
        activity: Arc<PeerActivity>,
    },
}

impl Io {
    /// Hands what has arrived to `each`: `Ready(Ok(n))` after `n` datagrams,
    /// `Ready(Ok(0))` when the listener forgot this peer (the end), `Pending` when
    /// nothing is there.
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        stats: &UdpStats,
        each: &mut dyn FnMut(Bytes),
    ) -> Poll<io::Result<usize>> {
        let (socket, only_from) = match self {
            Io::Connected { socket } => (socket, None),
            Io::Peer {
                datagrams,
                own,
                addr,
                ..
            } => {
                match datagrams.poll_recv(cx) {
                    Poll::Ready(Some(datagram)) => {
                        each(datagram);
                        return Poll::Ready(Ok(1));
                    }
                    Poll::Ready(None) => return Poll::Ready(Ok(0)),
                    Poll::Pending => {}
                }
                match own {
                    Some(socket) => (socket, Some(*addr)),
                    None => return Poll::Pending,
                }
            }
        };
        loop {
            let received = std::task::ready!(socket.poll_recv(cx, only_from, each))?;
            if received.strays > 0 {
                UdpStats::add(&stats.strays, received.strays as u64);
            }
            if received.datagrams > 0 {
                return Poll::Ready(Ok(received.datagrams));
            }
        }
    }

    /// Whether nothing waits to be received, taking nothing: `false` when a datagram
    /// (or the listener's end of this peer) may be there. A `true` leaves the task
    /// registered for what comes next (the sockets' readiness; the queue registered
    /// it when a pump found it empty).
    fn nothing_arrived(&self, cx: &mut Context<'_>) -> bool {
        let socket = match self {
            Io::Connected { socket } => Some(socket),
            Io::Peer { datagrams, own, .. } => {
                if !datagrams.is_idle() {
                    return false;
                }
                own.as_ref()
            }
        };
        socket.is_none_or(|socket| socket.nothing_to_read(cx))
    }

    /// Sends the first of `datagrams`, or as many as one system call takes: how many
    /// went.
    fn poll_send(&mut self, cx: &mut Context<'_>, datagrams: &[Bytes]) -> Poll<io::Result<usize>> {
        loop {
            let result = match self {
                Io::Connected { socket }
                | Io::Peer {
                    own: Some(socket), ..
                } => std::task::ready!(socket.poll_send(cx, datagrams)),
                Io::Peer {
                    own: None,
                    socket,
                    addr,
                    ..
                } => {
                    std::task::ready!(socket.poll_send_ready(cx))?;
                    socket.try_send_to(&datagrams[0], *addr).map(|_| 1)
                }
            };
            match result {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

/// A [`Link`] over UDP: one frame per datagram, larger frames fragmented and
/// delivered reliably (see the crate docs). Not [reliable](Link::is_reliable) as a
/// whole: single-datagram frames may be lost, duplicated or reordered, and the core
/// copes.
pub struct UdpLink {
    engine: Engine,
    io: Io,
    stats: Arc<UdpStats>,
    peer: String,
    /// Datagrams taken from the engine, not yet taken by the socket.
    outgoing: VecDeque<Bytes>,
    timer: LazySleep,
    timer_at: Option<Instant>,
    /// Server side: the peer is forgotten after this long without a datagram.
    idle_timeout: Option<Duration>,
    last_heard: Instant,
    /// Server side: with `new_peer_idle_timeout`, the idle limit until a call is
    /// answered.
    new_idle_timeout: Option<Duration>,
    /// Server side: ids of the requests handed to the core and not answered yet.
    open_calls: HashSet<u64>,
    /// Server side: a call has been answered on this association.
    answered: bool,
    closed: bool,
    /// Server side, with per-peer sockets: how to make the peer's own socket again
    /// after it was closed for idleness (the settings and the cap on such sockets).
    renewal: Option<(Arc<UdpConfig>, usize)>,
    /// The peer's own socket was closed for idleness.
    socket_released: bool,
    /// The last pump left nothing to do: the sockets and the queue were empty, every
    /// datagram the engine had was sent, and the timer was armed (or not needed). Until
    /// a frame is queued, something arrives or the timer fires, a pump would only
    /// find that out again, at the cost of a clock read and the engine's timers.
    quiet: bool,
    /// Client side: whether the peer was heard from, for the connector that chose its
    /// address (taken once told).
    reached: Option<Arc<Reach>>,
}

/// Whether a client link heard from the address its connector chose: not yet, yes,
/// or never (the link ended first).
#[derive(Debug, Default)]
pub(crate) struct Reach(std::sync::atomic::AtomicU8);

impl Reach {
    const REACHED: u8 = 1;
    const NEVER: u8 = 2;

    /// Whether the link ended without hearing from its peer.
    pub(crate) fn never(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) == Reach::NEVER
    }

    fn set(&self, state: u8) {
        self.0.store(state, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::fmt::Debug for UdpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpLink")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl UdpLink {
    fn new(engine: Engine, io: Io, stats: Arc<UdpStats>, peer: String) -> Self {
        UdpLink {
            engine,
            io,
            stats,
            peer,
            outgoing: VecDeque::with_capacity(batch::SEND_MAX),
            timer: LazySleep::new(Duration::ZERO),
            timer_at: None,
            idle_timeout: None,
            last_heard: Instant::now(),
            new_idle_timeout: None,
            open_calls: HashSet::new(),
            answered: false,
            closed: false,
            renewal: None,
            socket_released: false,
            quiet: false,
            reached: None,
        }
    }

    /// Client side: `reached` tells whether the peer was heard from.
    pub(crate) fn reporting_reach(mut self, reached: Arc<Reach>) -> Self {
        self.reached = Some(reached);
        self
    }

    /// Server side: close the peer's own socket when it idles
    /// ([`UdpConfig::peer_socket_idle_timeout`]) and make it again when the peer has
    /// calls in flight, within `max_sockets` per-peer sockets.
    pub(crate) fn with_own_socket_renewal(
        mut self,
        config: Arc<UdpConfig>,
        max_sockets: usize,
    ) -> Self {
        if config.peer_sockets {
            self.renewal = Some((config, max_sockets));
        }
        self
    }

    /// When the peer's own socket is to be closed if nothing happens before.
    fn socket_release_at(&self) -> Option<Instant> {
        let (config, _) = self.renewal.as_ref()?;
        match &self.io {
            Io::Peer { own: Some(_), .. } => {
                Some(self.last_heard + config.peer_socket_idle_timeout)
            }
            _ => None,
        }
    }

    /// Server side: closes the peer's own socket once it has idled long enough with
    /// nothing in flight; its datagrams then arrive through the listener's socket.
    fn release_idle_socket(&mut self, now: Instant) {
        let Some(at) = self.socket_release_at() else {
            return;
        };
        if now >= at && self.engine.is_idle() && self.open_calls.is_empty() {
            if let Io::Peer { own, .. } = &mut self.io {
                *own = None;
                self.socket_released = true;
                UdpStats::add(&self.stats.peer_sockets_released, 1);
            }
        }
    }

    /// Server side: a peer whose socket was released has calls in flight again: it
    /// gets a socket of its own again, if the cap allows. (Not on any datagram: a new
    /// client on the same port, opening an association of its own, must not find the
    /// old one's socket connected to it.) Datagrams of other peers that reach the new
    /// socket before it is connected are dropped (their senders repeat them); the
    /// peer's own go to the engine.
    fn renew_socket(&mut self, now: Instant) {
        if !self.socket_released || self.closed || self.open_calls.is_empty() {
            return;
        }
        let Some((config, max)) = &self.renewal else {
            return;
        };
        let Io::Peer {
            own, socket, addr, ..
        } = &mut self.io
        else {
            return;
        };
        self.socket_released = false;
        self.quiet = false;
        let Some(permit) = crate::socket::SocketPermit::take(&self.stats, *max) else {
            return;
        };
        match crate::socket::connected_to(socket, *addr, config, permit) {
            Ok(fresh) => {
                UdpStats::add(&self.stats.peer_sockets, 1);
                for (datagram, source) in crate::socket::drain_strays(&fresh) {
                    if source == *addr {
                        self.engine.on_datagram(datagram, now);
                    } else {
                        UdpStats::add(&self.stats.strays, 1);
                    }
                }
                *own = Some(fresh);
            }
            Err(err) => {
                tracing::debug!(peer = %addr, error = %err, "peer keeps sharing the listener's socket");
            }
        }
    }

    pub(crate) fn connected(engine: Engine, socket: Connected, stats: Arc<UdpStats>) -> Self {
        let peer = match socket.peer_addr() {
            Ok(addr) => format!("udp://{addr}"),
            Err(_) => "udp://?".to_owned(),
        };
        let io = Io::Connected { socket };
        UdpLink::new(engine, io, stats, peer)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn peer_of(
        engine: Engine,
        socket: Arc<UdpSocket>,
        own: Option<Connected>,
        addr: SocketAddr,
        datagrams: PeerQueue,
        guard: PeerGuard,
        activity: Arc<PeerActivity>,
        stats: Arc<UdpStats>,
        idle_timeouts: (Duration, Duration),
    ) -> Self {
        let io = Io::Peer {
            datagrams,
            own,
            socket,
            addr,
            guard: Some(guard),
            activity,
        };
        let mut link = UdpLink::new(engine, io, stats, format!("udp://{addr}"));
        link.idle_timeout = Some(idle_timeouts.0);
        link.new_idle_timeout = Some(idle_timeouts.1.min(idle_timeouts.0));
        link
    }

    /// Server side: the peer is gone (CLOSE, or a new client at its address). Its
    /// socket and table entry go at once, so that the address is free for a new
    /// association; the core sees the end.
    fn peer_left(&mut self) {
        self.closed = true;
        if let Io::Peer { own, guard, .. } = &mut self.io {
            *own = None;
            if guard.take().is_some() {
                UdpStats::add(&self.stats.peers_closed, 1);
            }
        }
    }

    /// Server side: what the listener needs to choose an association to evict.
    fn report_activity(&self, heard: bool, now: Instant) {
        if let Io::Peer { activity, .. } = &self.io {
            if heard {
                activity.heard(now);
            }
            // Busy with what the server owes, not with what the peer is sending: a few
            // hosts sending one fragment of a two-fragment message every few seconds
            // on each association kept the whole table busy, and every new client was
            // refused.
            activity.set_busy(!self.open_calls.is_empty() || self.engine.owes());
            if self.answered {
                activity.set_answered();
            }
        }
    }

    pub(crate) fn engine_mut(&mut self) -> &mut Engine {
        self.quiet = false;
        &mut self.engine
    }

    fn io_error(&self, what: &str, err: io::Error) -> Error {
        // Nothing but HELLOs went before the association opened (frames wait for
        // ACCEPT): calls then are unprocessed, whatever the peer answered (a RETRY, by
        // a server that then went away).
        let nothing_sent = self.reached.is_some() || !self.engine.is_open();
        if err.kind() == io::ErrorKind::ConnectionRefused {
            // A client's link that never heard from its peer: nothing listens there,
            // and nothing sent on the link was taken, so its calls are unprocessed (a
            // balanced call goes on to another replica, as after a refused TCP
            // connect). After the peer answered, it may have taken calls before it went.
            let kind = if nothing_sent {
                ErrorKind::Refused
            } else {
                ErrorKind::Closed
            };
            return Error::new(
                kind,
                format!(
                    "{} refused the datagram (nothing listens on that port)",
                    self.peer
                ),
            );
        }
        if nothing_sent && is_icmp_error(&err) {
            return unreachable_before_open(what, &self.peer, err);
        }
        Error::io(format!("{what} {}", self.peer), err)
    }

    /// Reads what has arrived, runs the timers and sends what the engine has.
    fn pump(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        let mut budget_spent = true;
        let mut received = 0;
        let mut heard = false;
        // One clock reading for the datagrams of this pump and its first timer check.
        let mut now = Instant::now();
        while received < RECV_BUDGET {
            let engine = &mut self.engine;
            match self.io.poll_recv(cx, &self.stats, &mut |datagram| {
                engine.on_datagram(datagram, now)
            }) {
                Poll::Pending => {
                    budget_spent = false;
                    break;
                }
                Poll::Ready(Ok(0)) => {
                    self.closed = true;
                    budget_spent = false;
                    break;
                }
                Poll::Ready(Ok(n)) => {
                    self.last_heard = now;
                    heard = true;
                    received += n;
                    // Heard: told at once, so that an ICMP error later in this batch
                    // is judged as one after the peer answered.
                    if let Some(reached) = self.reached.take() {
                        reached.set(Reach::REACHED);
                    }
                }
                Poll::Ready(Err(err)) if self.is_transient(&err) => {
                    // An ICMP error the kernel reports on the connected socket: the
                    // datagram it answers is lost (and the engine repairs it), the
                    // path may well be fine (a router's "fragmentation needed", after
                    // which the kernel fragments to the path's MTU). Counted against
                    // the budget: a stream of them must not keep the pump spinning.
                    tracing::debug!(peer = %self.peer, error = %err, "ICMP error ignored");
                    received += 1;
                }
                Poll::Ready(Err(err)) => return Err(self.io_error("receive from", err)),
            }
        }
        if self.engine.peer_left() && !self.closed {
            self.peer_left();
        }
        // Whether the timer is armed with this task's waker (or none is needed). The
        // engine never asks again for an instant it has just been run at, so the timer
        // fires again only when the clock moved on meanwhile, and rarely four times.
        let mut timer_waits = false;
        let mut drained = false;
        // Past the idle deadline, every pump checks it (below): none may be skipped.
        let mut idle_due = false;
        for round in 0..4 {
            if round > 0 {
                now = Instant::now();
            }
            self.engine.on_timeout(now);
            if let Some((kind, why)) = self.engine.failure() {
                return Err(Error::new(kind, format!("{}: {why}", self.peer)));
            }
            let idle_timeout = self.current_idle_timeout();
            if let Some(idle) = idle_timeout {
                if self.engine.is_idle()
                    && self.open_calls.is_empty()
                    && now.saturating_duration_since(self.last_heard) >= idle
                {
                    self.idle_due(now, idle);
                }
            }
            self.release_idle_socket(now);
            drained = self.send(cx, now)?;
            let mut next = self.engine.next_timeout();
            if let Some(at) = self.socket_release_at() {
                if at > now {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            if let Some(idle) = idle_timeout {
                // Once passed, the idle deadline is checked at every pump (above) and
                // needs no timer: one would stay due while the engine is busy.
                let at = self.last_heard + idle;
                if at > now {
                    next = Some(next.map_or(at, |n| n.min(at)));
                } else {
                    idle_due = true;
                }
            }
            let Some(at) = next else {
                self.timer_at = None;
                timer_waits = true;
                break;
            };
            // A timer armed earlier than needed stays: it fires, finds nothing due and
            // is armed again. The idle deadline moves with every datagram, and moving a
            // timer costs more than an early wake-up every few minutes.
            if self.timer_at.is_none_or(|armed| at < armed) {
                self.timer.reset(at);
                self.timer_at = Some(at);
            }
            if self.timer.poll(cx).is_pending() {
                timer_waits = true;
                break;
            }
            self.timer_at = None;
        }
        // A timer still due after the last round has no waker: come back for it.
        if budget_spent || !timer_waits {
            cx.waker().wake_by_ref();
        }
        self.quiet = !budget_spent && timer_waits && drained && !idle_due && !self.closed;
        self.report_activity(heard, now);
        Ok(())
    }

    /// Whether this round can skip the pump: the last one left nothing to do (`quiet`),
    /// and since then nothing arrived and the timer did not fire.
    fn can_skip_pump(&mut self, cx: &mut Context<'_>) -> bool {
        self.quiet
            && self.io.nothing_arrived(cx)
            && (self.timer_at.is_none() || self.timer.poll(cx).is_pending())
    }

    /// Server side: the peer has been silent for `idle` with nothing in flight: the
    /// association ends, unless this check comes more than [`LATE_CHECK_GRACE`] after
    /// it was due. A late check means the process was stopped or starved, and the
    /// peer's datagrams of meanwhile may wait unread (in the listener's socket, or in
    /// a socket whose readiness the runtime has not taken in yet): the peer gets that
    /// grace, counted from now, to be heard. (From a review: a server stopped for 15 s
    /// forgot a new association whose client had been sending its request all along;
    /// the call was reported as possibly run, and never ran.)
    fn idle_due(&mut self, now: Instant, idle: Duration) {
        let due = self.last_heard + idle;
        if now.saturating_duration_since(due) > LATE_CHECK_GRACE {
            self.last_heard = now
                .checked_sub(idle.saturating_sub(LATE_CHECK_GRACE))
                .unwrap_or(now);
        } else {
            self.closed = true;
        }
    }

    /// Server side: how long the peer may stay silent with nothing in flight.
    fn current_idle_timeout(&self) -> Option<Duration> {
        if self.answered {
            self.idle_timeout
        } else {
            self.new_idle_timeout.or(self.idle_timeout)
        }
    }

    /// Sends what the engine has, within a budget. `Ok(true)` when it sent it all.
    fn send(&mut self, cx: &mut Context<'_>, now: Instant) -> Result<bool, Error> {
        let mut sent = 0;
        while sent < SEND_BUDGET {
            while self.outgoing.len() < batch::SEND_MAX {
                match self.engine.poll_transmit(now) {
                    Some(datagram) => self.outgoing.push_back(datagram),
                    None => break,
                }
            }
            if self.outgoing.is_empty() {
                return Ok(true);
            }
            match self.io.poll_send(cx, self.outgoing.make_contiguous()) {
                Poll::Pending => return Ok(false),
                Poll::Ready(Ok(n)) => {
                    let bytes: usize = self.outgoing.drain(..n).map(|d| d.len()).sum();
                    UdpStats::add(&self.stats.datagrams_sent, n as u64);
                    UdpStats::add(&self.stats.bytes_sent, bytes as u64);
                    sent += n;
                }
                // An ICMP error may be reported by the next call, a send as well as a
                // receive: judged alike (see `is_transient`).
                Poll::Ready(Err(err))
                    if err.kind() == io::ErrorKind::ConnectionRefused
                        || (is_icmp_error(&err) && !self.is_transient(&err)) =>
                {
                    return Err(self.io_error("send to", err));
                }
                Poll::Ready(Err(err)) => {
                    // ENOBUFS and the like: the datagram is lost, as on the network.
                    tracing::debug!(peer = %self.peer, error = %err, "datagram not sent");
                    self.outgoing.pop_front();
                    sent += 1;
                }
            }
        }
        cx.waker().wake_by_ref();
        Ok(false)
    }
}

impl UdpLink {
    /// Whether a receive error is one the kernel reports for an ICMP message about an
    /// earlier datagram that says nothing final about the peer: a path MTU smaller
    /// than the datagram, always; a host or network not reachable, once the peer has
    /// been heard from (a route that flaps; a vanished peer is found by the engine's
    /// own timers). Before that, an unreachable address is final: the connector then
    /// tries the name's next address at once. A port with nothing behind it
    /// (ECONNREFUSED) is final, and reported.
    fn is_transient(&self, err: &io::Error) -> bool {
        let heard = self.reached.is_none();
        match err.raw_os_error() {
            Some(libc::EMSGSIZE) => true,
            _ if is_icmp_error(err) => heard,
            _ => false,
        }
    }
}

/// A host or network unreachable (a firewall's REJECT, say) before anything but a
/// HELLO went: as a refused connection, the calls never left (they failed as possibly
/// run, and a balanced call did not go on elsewhere).
#[cold]
#[inline(never)]
fn unreachable_before_open(what: &str, peer: &str, err: io::Error) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!("{what} {peer}: {err} (before the association opened: no call was sent)"),
    )
}

/// Whether `err` is what the kernel reports for an ICMP host or network unreachable
/// (or a parameter problem) about an earlier datagram.
fn is_icmp_error(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(
            libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::ENETDOWN
                | libc::EPROTO
        )
    )
}

impl Drop for UdpLink {
    fn drop(&mut self) {
        if let Some(reached) = self.reached.take() {
            reached.set(Reach::NEVER);
        }
        // A client tells the server it is done, so the server forgets the association
        // now instead of at an idle timeout (best effort: one datagram, not waited for).
        if let (Io::Connected { socket }, Some(close)) = (&self.io, self.engine.close_datagram()) {
            if socket.try_send(&close).is_ok() {
                UdpStats::add(&self.stats.datagrams_sent, 1);
            }
        }
    }
}

impl Link for UdpLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        // Frames an earlier pump delivered go first, without another pump each: the
        // pump after the last of them reads, acknowledges and arms the timer.
        let mut frame = self.engine.take_delivered();
        if frame.is_none() && !self.can_skip_pump(cx) {
            let pumped = self.pump(cx);
            frame = self.engine.take_delivered();
            if let Err(err) = pumped {
                // A client's answers that came in the same read as what ended the
                // association go first, if the end is the engine's (it stays, and the
                // next poll reports it); a socket's error is reported once, at once. A
                // server starts no call from an association that has failed.
                let client = matches!(self.io, Io::Connected { .. });
                if frame.is_none() || !client || self.engine.failure().is_none() {
                    return Poll::Ready(Some(Err(err)));
                }
                // The next poll must pump (and so report the failure): `quiet` is
                // still the last good pump's.
                self.quiet = false;
                cx.waker().wake_by_ref();
            }
        }
        if let Some(frame) = frame {
            if self.idle_timeout.is_some() {
                // Server side: the calls in flight (cheap: one header read).
                match frame_tag(&frame) {
                    Some((FrameKind::REQUEST, id)) if self.open_calls.len() < MAX_OPEN_CALLS => {
                        self.open_calls.insert(id);
                    }
                    Some((FrameKind::CANCEL, id)) => {
                        self.open_calls.remove(&id);
                    }
                    _ => {}
                }
                if self.socket_released {
                    self.renew_socket(Instant::now());
                }
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.closed {
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    /// Server side, while the core stopped reading at its limits: pumps as
    /// [`poll_recv`](Link::poll_recv) does, so that the association goes on (its
    /// acknowledgements, even of nothing, tell the client the server is there; its
    /// timers run) and the client's CLOSE is seen, and reports that, or the
    /// association's failure. What arrives meanwhile waits for the core within the
    /// engine's bounds: 1024 frames, and the reassembly budgets for messages and for
    /// whole frames past a small allowance.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<Error> {
        if !self.closed {
            if let Err(err) = self.pump(cx) {
                return Poll::Ready(err);
            }
        }
        if self.closed {
            return Poll::Ready(Error::new(
                ErrorKind::Closed,
                format!(
                    "{} is gone: it closed the association, or went silent past the idle \
                     timeout",
                    self.peer
                ),
            ));
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // Room now: take the frame without pumping, so that frames written back to back
        // leave together (one `sendmmsg`) at the flush.
        if self.engine.can_send() {
            return Poll::Ready(Ok(()));
        }
        self.pump(cx)?;
        if self.engine.can_send() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending // acknowledgements make room; the pump is waiting for them
        }
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        if self.idle_timeout.is_some() {
            if let Some((FrameKind::RESPONSE, id)) = frame_tag(header) {
                self.open_calls.remove(&id);
                self.answered = true;
            }
        }
        self.engine.send_frame(header, payload, Instant::now());
        self.quiet = false;
        Ok(())
    }

    fn withdraw(&mut self, id: u64) -> bool {
        self.engine.withdraw_unopened(id)
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.pump(cx)?;
        if self.outgoing.is_empty() && self.engine.is_flushed() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.poll_flush(cx)
    }

    /// Fragments of the peer's messages in reassembly, and messages waiting for an
    /// earlier one.
    fn receiving(&self) -> u64 {
        self.engine.receiving()
    }

    /// One more than the count of our fragments the peer acknowledged: it moves only as
    /// the peer takes them, and stays once all is taken (0 before the first message).
    fn unsent(&self) -> u64 {
        self.engine.unsent()
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn peer_info(&self) -> rpc_core::Peer {
        let peer = rpc_core::Peer::new(self.peer.clone());
        match &self.io {
            Io::Peer { addr, .. } => peer.with_addr(*addr),
            _ => peer,
        }
    }

    fn is_reliable(&self) -> bool {
        false
    }

    fn delivers(&self, frame_len: usize) -> bool {
        frame_len > self.engine.max_datagram()
    }
}
