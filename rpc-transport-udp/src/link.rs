//! [`UdpLink`]: the [`Link`] over one association, client or server side.

use std::{
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use rpc_core::{link::Link, Error, ErrorKind, Payload};
use tokio::{
    net::UdpSocket,
    time::{Instant, Sleep},
};

use crate::{
    config::UdpStats,
    engine::Engine,
    listener::{PeerGuard, PeerQueue},
};

/// Datagrams read per call before the link yields to other tasks.
const RECV_BUDGET: usize = 256;
/// Datagrams written per call before the link yields to other tasks.
const SEND_BUDGET: usize = 256;
/// Receive buffer: the largest UDP payload.
const RECV_BUF: usize = 65_536;

/// Where a link's datagrams come from and go to.
enum Io {
    /// A client's own connected socket: the kernel filters other senders and reports
    /// ICMP errors (port unreachable) on it.
    Connected { socket: UdpSocket, buf: Box<[u8]> },
    /// One peer of a listener's shared socket: the listener's task routes this peer's
    /// datagrams here; replies go out through the shared socket.
    Peer {
        datagrams: PeerQueue,
        socket: Arc<UdpSocket>,
        addr: SocketAddr,
        _guard: PeerGuard,
    },
}

impl Io {
    /// The next datagram; `Ready(Ok(None))` when the listener forgot this peer.
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        match self {
            Io::Connected { socket, buf } => loop {
                std::task::ready!(socket.poll_recv_ready(cx))?;
                match socket.try_recv(buf) {
                    // A copy of exactly the datagram's size: received data must not pin
                    // a 64 KiB buffer each.
                    Ok(n) => return Poll::Ready(Ok(Some(Bytes::copy_from_slice(&buf[..n])))),
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(err) => return Poll::Ready(Err(err)),
                }
            },
            Io::Peer { datagrams, .. } => datagrams.poll_recv(cx).map(Ok),
        }
    }

    fn poll_send(&mut self, cx: &mut Context<'_>, datagram: &[u8]) -> Poll<io::Result<()>> {
        loop {
            let (socket, result) = match self {
                Io::Connected { socket, .. } => {
                    std::task::ready!(socket.poll_send_ready(cx))?;
                    (&*socket, socket.try_send(datagram))
                }
                Io::Peer { socket, addr, .. } => {
                    std::task::ready!(socket.poll_send_ready(cx))?;
                    (&**socket, socket.try_send_to(datagram, *addr))
                }
            };
            let _ = socket;
            match result {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => continue,
                Err(err) => return Poll::Ready(Err(err)),
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
    /// A datagram the socket would not take yet.
    stalled: Option<Bytes>,
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    /// Server side: the peer is forgotten after this long without a datagram.
    idle_timeout: Option<Duration>,
    last_heard: Instant,
    closed: bool,
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
            stalled: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            timer_at: None,
            idle_timeout: None,
            last_heard: Instant::now(),
            closed: false,
        }
    }

    pub(crate) fn connected(engine: Engine, socket: UdpSocket, stats: Arc<UdpStats>) -> Self {
        let peer = match socket.peer_addr() {
            Ok(addr) => format!("udp://{addr}"),
            Err(_) => "udp://?".to_owned(),
        };
        let io = Io::Connected {
            socket,
            buf: vec![0; RECV_BUF].into_boxed_slice(),
        };
        UdpLink::new(engine, io, stats, peer)
    }

    pub(crate) fn peer_of(
        engine: Engine,
        socket: Arc<UdpSocket>,
        addr: SocketAddr,
        datagrams: PeerQueue,
        guard: PeerGuard,
        stats: Arc<UdpStats>,
        idle_timeout: Duration,
    ) -> Self {
        let io = Io::Peer {
            datagrams,
            socket,
            addr,
            _guard: guard,
        };
        let mut link = UdpLink::new(engine, io, stats, format!("udp://{addr}"));
        link.idle_timeout = Some(idle_timeout);
        link
    }

    pub(crate) fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    fn io_error(&self, what: &str, err: io::Error) -> Error {
        if err.kind() == io::ErrorKind::ConnectionRefused {
            return Error::new(
                ErrorKind::Closed,
                format!(
                    "{} refused the datagram (nothing listens on that port)",
                    self.peer
                ),
            );
        }
        Error::io(format!("{what} {}", self.peer), err)
    }

    /// Reads what has arrived, runs the timers and sends what the engine has.
    fn pump(&mut self, cx: &mut Context<'_>) -> Result<(), Error> {
        let mut budget_spent = true;
        for _ in 0..RECV_BUDGET {
            match self.io.poll_recv(cx) {
                Poll::Pending => {
                    budget_spent = false;
                    break;
                }
                Poll::Ready(Ok(Some(datagram))) => {
                    let now = Instant::now();
                    self.last_heard = now;
                    self.engine.on_datagram(datagram, now);
                }
                Poll::Ready(Ok(None)) => {
                    self.closed = true;
                    budget_spent = false;
                    break;
                }
                Poll::Ready(Err(err)) => return Err(self.io_error("receive from", err)),
            }
        }
        for _ in 0..4 {
            let now = Instant::now();
            self.engine.on_timeout(now);
            if let Some(why) = self.engine.failure() {
                return Err(Error::new(
                    ErrorKind::TimedOut,
                    format!("{}: {why}", self.peer),
                ));
            }
            if let Some(idle) = self.idle_timeout {
                if self.engine.is_idle() && now.saturating_duration_since(self.last_heard) >= idle {
                    self.closed = true;
                }
            }
            self.send(cx, now)?;
            let mut next = self.engine.next_timeout();
            if let Some(idle) = self.idle_timeout {
                let at = self.last_heard + idle;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            let Some(at) = next else {
                self.timer_at = None;
                break;
            };
            if self.timer_at != Some(at) {
                self.timer.as_mut().reset(at);
                self.timer_at = Some(at);
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                break;
            }
            self.timer_at = None;
        }
        if budget_spent {
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    fn send(&mut self, cx: &mut Context<'_>, now: Instant) -> Result<(), Error> {
        for _ in 0..SEND_BUDGET {
            let datagram = match self.stalled.take() {
                Some(d) => d,
                None => match self.engine.poll_transmit(now) {
                    Some(d) => d,
                    None => return Ok(()),
                },
            };
            match self.io.poll_send(cx, &datagram) {
                Poll::Pending => {
                    self.stalled = Some(datagram);
                    return Ok(());
                }
                Poll::Ready(Ok(())) => {
                    UdpStats::add(&self.stats.datagrams_sent, 1);
                    UdpStats::add(&self.stats.bytes_sent, datagram.len() as u64);
                }
                Poll::Ready(Err(err)) if err.kind() == io::ErrorKind::ConnectionRefused => {
                    return Err(self.io_error("send to", err));
                }
                Poll::Ready(Err(err)) => {
                    // ENOBUFS and the like: the datagram is lost, as on the network.
                    tracing::debug!(peer = %self.peer, error = %err, "datagram not sent");
                }
            }
        }
        cx.waker().wake_by_ref();
        Ok(())
    }
}

impl Link for UdpLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        if let Err(err) = self.pump(cx) {
            return Poll::Ready(Some(Err(err)));
        }
        if let Some(frame) = self.engine.take_delivered() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if self.closed {
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.pump(cx)?;
        if self.engine.can_send() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending // acknowledgements make room; the pump is waiting for them
        }
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        self.engine.send_frame(header, payload, Instant::now());
        Ok(())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.pump(cx)?;
        if self.stalled.is_none() && self.engine.is_flushed() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.poll_flush(cx)
    }

    fn peer(&self) -> String {
        self.peer.clone()
    }

    fn is_reliable(&self) -> bool {
        false
    }

    fn delivers(&self, frame_len: usize) -> bool {
        frame_len > self.engine.max_datagram()
    }
}
