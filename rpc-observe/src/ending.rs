//! The end of a call, as the layers record it: a unary call ends with its reply, a
//! streaming call when its response stream does.
//!
//! Each layer's future builds a [`Watch`] when its call starts; when the inner future
//! returns a reply that carries a stream, the watch goes with the stream
//! ([`Reply::watch_stream`]) and is told how the stream ended, so that a download of
//! ten minutes counts ten minutes, with the status it ended with, and stays in flight
//! that long; otherwise the layer records the call at once.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use futures::Stream;
use rpc_core::{
    client::ClientReply,
    server::ServerReply,
    stream::{ReplyStream, StreamEnd, TakeOnce},
    Payload, Status,
};

/// What a layer records when a call ends.
pub(crate) trait Watch: Send + Sync + Unpin + 'static {
    /// Runs one poll of a server's response stream (the trace layer enters its span
    /// there, so that what the stream logs belongs to the call).
    fn around<R>(&self, poll: impl FnOnce() -> R) -> R {
        poll()
    }

    /// The call ended so.
    fn ended(self, end: StreamEnd<'_>);
}

/// Ends a layer's record of a call whose future gave `result`: at once for an error
/// or a reply without a stream, else when the reply's stream ends.
pub(crate) fn end_call<T: Reply, W: Watch>(result: &mut Result<T, Status>, watch: W) {
    match result {
        Ok(reply) => {
            if let Err(watch) = reply.watch_stream(watch) {
                watch.ended(StreamEnd::Ok);
            }
        }
        Err(status) => watch.ended(StreamEnd::Failed(status)),
    }
}

/// A reply a layer can follow to the end of its stream.
pub(crate) trait Reply {
    /// Hands `watch` to the reply's response stream, which tells it how the stream
    /// ended; gives `watch` back when the reply has no stream (the call has ended).
    fn watch_stream<W: Watch>(&mut self, watch: W) -> Result<(), W>;
}

impl Reply for ServerReply {
    fn watch_stream<W: Watch>(&mut self, watch: W) -> Result<(), W> {
        let Some(inner) = self.stream.as_ref().and_then(TakeOnce::take) else {
            return Err(watch);
        };
        let watched: ReplyStream = Box::pin(Watched {
            inner,
            watch: Some(watch),
        });
        self.stream = Some(TakeOnce::new(watched));
        Ok(())
    }
}

impl Reply for ClientReply {
    fn watch_stream<W: Watch>(&mut self, watch: W) -> Result<(), W> {
        let Some(mut stream) = self.stream.as_ref().and_then(TakeOnce::take) else {
            return Err(watch);
        };
        stream.on_end(move |end| watch.ended(end));
        self.stream = Some(TakeOnce::new(stream));
        Ok(())
    }
}

/// A server's response stream that tells its [`Watch`] how it ended: at its last
/// message, at the error that ends it, or when dropped before either (the client
/// cancelled, the deadline passed, the connection went away).
struct Watched<W: Watch> {
    inner: ReplyStream,
    /// `None` once the stream has ended.
    watch: Option<W>,
}

impl<W: Watch> Stream for Watched<W> {
    type Item = Result<Payload, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(watch) = &this.watch else {
            return Poll::Ready(None);
        };
        let poll = watch.around(|| this.inner.as_mut().poll_next(cx));
        let end = match &poll {
            Poll::Ready(None) => StreamEnd::Ok,
            Poll::Ready(Some(Err(status))) => StreamEnd::Failed(status),
            _ => return poll,
        };
        if let Some(watch) = this.watch.take() {
            watch.ended(end);
        }
        poll
    }
}

impl<W: Watch> Drop for Watched<W> {
    fn drop(&mut self) {
        if let Some(watch) = self.watch.take() {
            watch.ended(StreamEnd::Dropped);
        }
    }
}
