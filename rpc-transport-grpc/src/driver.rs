//! The task that drives one HTTP/2 connection, owned by its link.
//!
//! h2 moves bytes only while its `Connection` is polled, and must keep doing so
//! (answer PINGs and SETTINGS, take WINDOW_UPDATEs, write queued frames) whether or
//! not the core is reading at that moment. So each link spawns one task for its
//! connection and keeps the handle: dropping the link aborts the task. The link's
//! stream handles (h2's `SendStream`/`RecvStream`) talk to that task through h2's
//! own shared state, and wake the core's task.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use h2::{server::SendResponse, RecvStream};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::mpsc,
    task::JoinHandle,
};
use tokio_util::sync::PollSender;

use crate::meter::Meter;

/// A connection's byte stream: TCP for `grpc://`, TLS over TCP for `grpcs://`.
pub(crate) type Io = Box<dyn IoStream>;

/// What h2 needs of a connection's byte stream.
pub(crate) trait IoStream: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> IoStream for T {}

/// An incoming call: its request head and body, and the handle to answer it.
pub(crate) type Accepted = (http::Request<RecvStream>, SendResponse<Bytes>);

/// Accepted calls waiting for the link: beyond it the driver leaves new streams in
/// h2, where `max_concurrent_streams` and the reset limits bound them.
pub(crate) const ACCEPT_QUEUE: usize = 16;

/// What the link asks of the server driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Command {
    /// GOAWAY, finish the open streams, then close.
    Graceful,
    /// GOAWAY with this error code, then close.
    Abrupt(h2::Reason),
}

/// The link's side of the driver: commands in, the driver's waker out.
#[derive(Default)]
pub(crate) struct Control {
    inner: Mutex<(Option<Command>, Option<Waker>)>,
}

impl Control {
    /// Asks the driver for `command` (an abrupt one wins over a graceful one).
    pub(crate) fn send(&self, command: Command) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.0.is_none() || command != Command::Graceful {
            inner.0 = Some(command);
        }
        if let Some(waker) = inner.1.take() {
            waker.wake();
        }
    }

    fn take(&self, waker: &Waker) -> Option<Command> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if !inner.1.as_ref().is_some_and(|w| w.will_wake(waker)) {
            inner.1 = Some(waker.clone());
        }
        inner.0.take()
    }
}

/// A spawned driver, aborted when dropped.
pub(crate) struct Driver {
    handle: JoinHandle<Result<(), String>>,
    finished: Option<Result<(), String>>,
}

impl Driver {
    pub(crate) fn spawn<E: std::fmt::Display>(
        future: impl Future<Output = Result<(), E>> + Send + 'static,
    ) -> Driver {
        Driver {
            handle: tokio::spawn(async move { future.await.map_err(|e| e.to_string()) }),
            finished: None,
        }
    }

    /// Ready when the connection is over, with its error if it failed.
    pub(crate) fn poll_finished(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), String>> {
        if let Some(result) = &self.finished {
            return Poll::Ready(result.clone());
        }
        let result = match std::task::ready!(Pin::new(&mut self.handle).poll(cx)) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(err),
            Err(err) => Err(format!("the connection task failed: {err}")),
        };
        self.finished = Some(result.clone());
        Poll::Ready(result)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// A client connection's keepalive settings.
pub(crate) struct ClientKeepalive {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    /// The link's calls in flight: PINGs go only while there are some (gRPC clients'
    /// default, `keepalive_permit_without_calls` off; servers police PINGs on idle
    /// connections hardest).
    pub(crate) calls: Arc<std::sync::atomic::AtomicUsize>,
    /// Raised when the server closes the connection with GOAWAY `ENHANCE_YOUR_CALM`
    /// (`too_many_pings`): the connector's next connections PING half as often.
    pub(crate) calm_downs: Arc<std::sync::atomic::AtomicU32>,
    /// What the connection read: a PING goes only after an interval that read nothing.
    pub(crate) meter: Arc<Meter>,
}

/// Drives a client connection; with `keepalive`, PINGs the server every interval
/// while calls are in flight and ends the connection when a PING goes unanswered for
/// the timeout ([`Keepalive`], as the server's).
pub(crate) async fn client(
    conn: h2::client::Connection<Io, Bytes>,
    keepalive: Option<ClientKeepalive>,
) -> Result<(), String> {
    let mut conn = conn;
    let settings = keepalive.as_ref().map(|k| (k.interval, k.timeout));
    let meter = keepalive.as_ref().map(|k| k.meter.clone());
    let mut pinging = Keepalive::new(settings, || conn.ping_pong(), "server", meter);
    if let (Some(pinging), Some(settings)) = (&mut pinging, &keepalive) {
        pinging.only_while = Some(settings.calls.clone());
    }
    tokio::pin!(conn);
    std::future::poll_fn(|cx| {
        if let Some(pinging) = &mut pinging {
            if let Poll::Ready(cause) = pinging.poll(cx) {
                tracing::debug!(%cause, "closing the gRPC connection");
                return Poll::Ready(Err(cause));
            }
        }
        conn.as_mut().poll(cx).map_err(|err| {
            // Only a connection that PINGed: servers send ENHANCE_YOUR_CALM for other
            // floods too (stream resets: the rapid-reset defence).
            let pinged = pinging.as_ref().is_some_and(|p| p.pinged);
            if let Some(keepalive) = keepalive.as_ref().filter(|_| pinged) {
                if err.is_go_away()
                    && err.is_remote()
                    && err.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM)
                {
                    let n = keepalive
                        .calm_downs
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                        + 1;
                    tracing::warn!(
                        interval = ?keepalive.interval.saturating_mul(2),
                        "the gRPC server closed the connection for too many PINGs \
                         (ENHANCE_YOUR_CALM): new connections PING half as often ({n} \
                         times now)"
                    );
                }
            }
            err.to_string()
        })
    })
    .await
}

/// Serves one accepted TCP connection: the HTTP/2 handshake (within `timeout`), then
/// accepted streams into `accepted` while the link has room for them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    io: Io,
    builder: h2::server::Builder,
    timeout: Duration,
    keepalive: Option<(Duration, Duration)>,
    accepted: mpsc::Sender<Accepted>,
    control: Arc<Control>,
    peer: String,
    meter: Arc<Meter>,
) -> Result<(), h2::Error> {
    let mut conn = match tokio::time::timeout(timeout, builder.handshake::<_, Bytes>(io)).await {
        Ok(conn) => conn?,
        Err(_) => {
            tracing::debug!("gRPC client did not finish the HTTP/2 handshake in time");
            return Ok(());
        }
    };
    let keepalive = Keepalive::new(keepalive, || conn.ping_pong(), "client", Some(meter));
    let mut running = Running {
        conn,
        accepted: PollSender::new(accepted),
        control,
        keepalive,
        refusing: false,
        shutting_down: false,
    };
    let result = std::future::poll_fn(|cx| running.poll(cx)).await;
    if let Err(err) = &result {
        if err.is_library() {
            // h2 found the peer breaking HTTP/2 and sent GOAWAY itself: the one trace of
            // a refused peer, as the core's own wire logs its GOAWAY refusals.
            tracing::info!(%peer, cause = %err, "HTTP/2 GOAWAY sent: refusing the peer, closing the connection");
        } else if err
            .get_io()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
        {
            // A header block left unfinished (`crate::meter`).
            tracing::info!(%peer, cause = %err, "closing the connection");
        }
    }
    result
}

/// How often, per interval, a keepalive that follows what the connection reads looks
/// whether it read anything: the PING goes between 1 and 1 + 1/8 intervals after the
/// last bytes read. Looking once per interval, a client heard from just after a look
/// was PINGed only at the second look after it: up to two intervals (a silent client
/// closed at 140 s rather than 80 s by default, from a review). A timer firing every
/// 7.5 s per connection (the default interval) costs nothing to speak of.
const LOOKS_PER_INTERVAL: u32 = 8;

/// A keepalive, the client's or the server's: a PING once `interval` passed without
/// reading anything (or every `interval`, when it does not follow the reads), the
/// connection closed when one goes unanswered for `timeout`. h2 allows one PING of ours
/// in flight at a time, which this is.
struct Keepalive {
    pings: h2::PingPong,
    /// Who is PINGed (`client`, `server`), for the cause.
    peer: &'static str,
    interval: Duration,
    timeout: Duration,
    /// The next PING's time, or while `waiting`, the answer's deadline.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// The timer was polled since it was last set: it holds the task's waker (which
    /// does not change: the driver is a task of its own) and wakes it when due, so
    /// until then a look at its state does (a poll of a timer on each of the task's
    /// turns costs about a quarter of a percent of a call).
    armed: bool,
    waiting: bool,
    /// A PING is due only while this count (calls in flight) is above zero, if set.
    only_while: Option<Arc<std::sync::atomic::AtomicUsize>>,
    /// A PING was sent on this connection.
    pinged: bool,
    /// What the connection has read, and the count when last looked at: a PING goes
    /// only after an interval in which nothing was read, as grpc-go's keepalive ("if
    /// the server doesn't see any activity"). Else a PING sent behind a large answer
    /// to a slow client (or a large request to a slow server) waited in the socket's
    /// buffer, and a healthy peer was dropped for not answering it in time.
    activity: Option<(Arc<Meter>, u64)>,
    /// When the count of bytes read was last seen to move (or the keepalive started,
    /// or the last PONG came): no earlier than the last read, and at most an eighth
    /// of the interval after it.
    heard: tokio::time::Instant,
}

impl Keepalive {
    /// A keepalive with `settings` (interval, timeout), over the PINGs `pings` takes
    /// from h2 (once per connection, and only when there are settings); `None` without
    /// either.
    fn new(
        settings: Option<(Duration, Duration)>,
        pings: impl FnOnce() -> Option<h2::PingPong>,
        peer: &'static str,
        meter: Option<Arc<Meter>>,
    ) -> Option<Keepalive> {
        let (interval, timeout) = settings?;
        // Following the reads, the first look comes an eighth of the interval in.
        let first = if meter.is_some() {
            interval / LOOKS_PER_INTERVAL
        } else {
            interval
        };
        Some(Keepalive {
            activity: meter.map(|meter| {
                let read = meter.bytes_read();
                (meter, read)
            }),
            heard: tokio::time::Instant::now(),
            pings: pings()?,
            peer,
            interval,
            timeout,
            timer: Box::pin(tokio::time::sleep(first)),
            armed: false,
            waiting: false,
            only_while: None,
            pinged: false,
        })
    }

    /// Sends PINGs on time and takes their answers. `Ready` when one went unanswered
    /// (or h2 could not send it): the peer is gone.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<String> {
        loop {
            if self.waiting {
                match self.pings.poll_pong(cx) {
                    Poll::Ready(Ok(_)) => {
                        self.waiting = false;
                        self.heard = tokio::time::Instant::now();
                        if let Some((meter, seen)) = &mut self.activity {
                            *seen = meter.bytes_read();
                        }
                        let next = self.heard + self.interval;
                        self.timer.as_mut().reset(next);
                        self.armed = false;
                        continue;
                    }
                    Poll::Ready(Err(err)) => return Poll::Ready(err.to_string()),
                    Poll::Pending => {}
                }
            }
            if self.armed && !self.timer.is_elapsed() {
                return Poll::Pending;
            }
            self.armed = true;
            std::task::ready!(self.timer.as_mut().poll(cx));
            if self.waiting {
                return Poll::Ready(format!(
                    "keepalive: the {} did not answer a PING within {:?}",
                    self.peer, self.timeout
                ));
            }
            if let Some((meter, seen)) = &mut self.activity {
                let now = tokio::time::Instant::now();
                let read = meter.bytes_read();
                if read != *seen {
                    // The peer was heard from since the last look.
                    *seen = read;
                    self.heard = now;
                }
                let due = self.heard + self.interval;
                if now < due {
                    // Not an interval of silence yet: look again soon.
                    let next = (now + self.interval / LOOKS_PER_INTERVAL).min(due);
                    self.timer.as_mut().reset(next);
                    self.armed = false;
                    continue;
                }
            }
            if self
                .only_while
                .as_ref()
                .is_some_and(|calls| calls.load(std::sync::atomic::Ordering::Relaxed) == 0)
            {
                // Idle: no PING, look again an interval later.
                let next = tokio::time::Instant::now() + self.interval;
                self.timer.as_mut().reset(next);
                self.armed = false;
                continue;
            }
            if let Err(err) = self.pings.send_ping(h2::Ping::opaque()) {
                return Poll::Ready(err.to_string());
            }
            self.pinged = true;
            self.waiting = true;
            let deadline = tokio::time::Instant::now() + self.timeout;
            self.timer.as_mut().reset(deadline);
            self.armed = false;
        }
    }
}

struct Running {
    conn: h2::server::Connection<Io, Bytes>,
    accepted: PollSender<Accepted>,
    control: Arc<Control>,
    keepalive: Option<Keepalive>,
    /// The link is gone: new streams are refused, open ones finish.
    refusing: bool,
    shutting_down: bool,
}

impl Running {
    fn shut_down(&mut self, command: Command) {
        match command {
            Command::Graceful if !self.shutting_down => self.conn.graceful_shutdown(),
            Command::Graceful => {}
            Command::Abrupt(reason) => self.conn.abrupt_shutdown(reason),
        }
        self.shutting_down = true;
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), h2::Error>> {
        if let Some(command) = self.control.take(cx.waker()) {
            self.shut_down(command);
        }
        if let Some(keepalive) = &mut self.keepalive {
            if let Poll::Ready(cause) = keepalive.poll(cx) {
                // Nothing can reach a peer that does not answer: the connection is
                // dropped (its socket closed), which ends every call on it.
                tracing::info!(%cause, "closing the gRPC connection");
                return Poll::Ready(Ok(()));
            }
        }
        loop {
            if !self.refusing {
                match self.accepted.poll_reserve(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => {
                        self.refusing = true;
                        self.shut_down(Command::Graceful);
                    }
                    // No room in the link: keep the connection moving without taking
                    // new streams (h2 holds them, within its limits).
                    Poll::Pending => return self.conn.poll_closed(cx),
                }
            }
            match std::task::ready!(self.conn.poll_accept(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(err)) => return Poll::Ready(Err(err)),
                Some(Ok((request, mut respond))) => {
                    if self.refusing {
                        respond.send_reset(h2::Reason::REFUSED_STREAM);
                        drop(request);
                    } else if let Err(err) = self.accepted.send_item((request, respond)) {
                        if let Some((_, mut respond)) = err.into_inner() {
                            respond.send_reset(h2::Reason::REFUSED_STREAM);
                        }
                        self.refusing = true;
                    }
                }
            }
        }
    }
}
