//! [`StatusLayer`]: records every call of a server stack into a [`StatusBoard`].

use std::{
    future::Future,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};

use pin_project_lite::pin_project;
use tower::{Layer, Service};

use super::{CallSample, Ended, MethodEntry, StatusBoard};
use crate::{
    dropped_code,
    ending::{end_call, Watch},
};
use rpc_core::{
    server::{ServerCall, ServerReply},
    stream::StreamEnd,
    ByteStr, Code, Peer, Status,
};

/// Wraps server services in [`StatusService`]: each call's method, status, handler
/// time, time queued and sizes go to the board. Put it first in the stack, so that it
/// times the other layers too and counts the calls they refuse.
///
/// ```
/// use rpc_core::server::{Server, ServerCall, ServerReply};
/// use rpc_observe::status::{StatusBoard, StatusLayer};
/// # let echo = tower::service_fn(|_call: ServerCall| async { Ok::<_, rpc_core::Status>(ServerReply::default()) });
/// let board = StatusBoard::new();
/// let server = Server::builder()
///     .layer(StatusLayer::new(board.clone()))
///     .add_named_service("demo.Echo", echo)
///     .build();
/// ```
#[derive(Clone, Debug)]
pub struct StatusLayer {
    board: StatusBoard,
}

impl StatusLayer {
    /// A layer recording into `board`.
    pub fn new(board: StatusBoard) -> StatusLayer {
        StatusLayer { board }
    }
}

impl<S> Layer<S> for StatusLayer {
    type Service = StatusService<S>;

    fn layer(&self, inner: S) -> StatusService<S> {
        StatusService {
            inner,
            board: self.board.clone(),
            last: None,
        }
    }
}

/// A server service that records its calls on a [`StatusBoard`] (see
/// [`StatusLayer`]).
#[derive(Clone, Debug)]
pub struct StatusService<S> {
    inner: S,
    board: StatusBoard,
    /// The last method served and its entry: most calls repeat it, and a comparison
    /// of names is cheaper than the board's lock and hash.
    last: Option<(ByteStr, Arc<MethodEntry>)>,
}

impl<S> Service<ServerCall> for StatusService<S>
where
    S: Service<ServerCall, Response = ServerReply, Error = Status>,
{
    type Response = ServerReply;
    type Error = Status;
    type Future = StatusFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        let method = match &self.last {
            Some((name, entry)) if *name == call.method => entry.clone(),
            _ => {
                let entry = self.board.method(&call.method);
                self.last = Some((call.method.clone(), entry.clone()));
                entry
            }
        };
        let started = Instant::now();
        let queued = call
            .received
            .map(|at| started.saturating_duration_since(at));
        let peer = call.peer.clone();
        let request_bytes = call.payload.len();
        let timeout = call.timeout;
        method.in_flight.fetch_add(1, Ordering::Relaxed);
        StatusFuture {
            inner: self.inner.call(call),
            end: Some(StatusEnd {
                board: self.board.clone(),
                method,
                started,
                started_wall: SystemTime::now(),
                queued,
                peer,
                request_bytes,
                response_bytes: None,
                timeout,
                streamed: false,
            }),
        }
    }
}

pin_project! {
    /// The future of a recorded call: hands the board its outcome when it ends (a
    /// streaming call when its response stream ends), and `CANCELLED` (or
    /// `DEADLINE_EXCEEDED`, or `INTERNAL` in a panic) if it is dropped before.
    pub struct StatusFuture<F> {
        #[pin]
        inner: F,
        // `None` once the call's end is recorded or handed to its stream.
        end: Option<StatusEnd>,
    }

    impl<F> PinnedDrop for StatusFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(end) = this.project().end.take() {
                end.ended(StreamEnd::Dropped);
            }
        }
    }
}

/// What a recorded call hands the board when it ends.
struct StatusEnd {
    board: StatusBoard,
    method: Arc<MethodEntry>,
    started: Instant,
    started_wall: SystemTime,
    queued: Option<Duration>,
    peer: Option<Arc<Peer>>,
    request_bytes: usize,
    /// A unary reply's size, once it is known.
    response_bytes: Option<usize>,
    // The call's time budget, to tell a deadline from a cancellation.
    timeout: Option<Duration>,
    // Its answer is a stream: timed to the stream's end, which for a watch is its
    // client's leaving, so it is kept out of `/rpcz`'s slowest calls.
    streamed: bool,
}

impl StatusEnd {
    fn record(self, code: Code, message: Option<&str>) {
        self.method.in_flight.fetch_sub(1, Ordering::Relaxed);
        let now = Instant::now();
        let handler = now.saturating_duration_since(self.started);
        self.board.ended(
            &self.method,
            now,
            Ended {
                peer: self.peer,
                code,
                message: message.map(CallSample::cut_message),
                started: self.started_wall,
                queued: self.queued,
                handler,
                request_bytes: self.request_bytes,
                response_bytes: self.response_bytes.filter(|_| code == Code::OK),
                streamed: self.streamed,
            },
        );
    }
}

impl Watch for StatusEnd {
    fn ended(self, end: StreamEnd<'_>) {
        match end {
            StreamEnd::Ok => self.record(Code::OK, None),
            StreamEnd::Failed(status) => self.record(status.code(), Some(status.message())),
            StreamEnd::Dropped => {
                let handler = self.started.elapsed();
                let code = dropped_code(handler, self.timeout);
                self.record(code, None);
            }
        }
    }
}

impl<F> Future for StatusFuture<F>
where
    F: Future<Output = Result<ServerReply, Status>>,
{
    type Output = Result<ServerReply, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = std::task::ready!(this.inner.poll(cx));
        if let Some(mut end) = this.end.take() {
            if let Ok(reply) = &result {
                end.response_bytes = reply.stream.is_none().then(|| reply.payload.len());
                end.streamed = reply.stream.is_some();
            }
            end_call(&mut result, end);
        }
        Poll::Ready(result)
    }
}
