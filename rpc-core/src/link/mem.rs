//! An in-memory transport: links made of two bounded channels, for deterministic tests
//! of the core without sockets (it works under `tokio::time::pause()`).

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use futures::{channel::mpsc, SinkExt, StreamExt};
use tokio::sync::Mutex;

use super::{Connector, Link, LinkConfig, Listener};
use crate::{Error, ErrorKind, Payload};

/// Frames buffered per direction before the sender waits.
const CHANNEL_FRAMES: usize = 64;

/// One end of an in-memory link.
pub struct MemLink {
    tx: mpsc::Sender<Bytes>,
    rx: mpsc::Receiver<Bytes>,
    max_frame_len: usize,
    name: String,
}

/// Two connected links.
pub fn pair(config: &LinkConfig) -> (MemLink, MemLink) {
    let (a_tx, a_rx) = mpsc::channel(CHANNEL_FRAMES);
    let (b_tx, b_rx) = mpsc::channel(CHANNEL_FRAMES);
    (
        MemLink {
            tx: a_tx,
            rx: b_rx,
            max_frame_len: config.max_frame_len,
            name: "mem://a".into(),
        },
        MemLink {
            tx: b_tx,
            rx: a_rx,
            max_frame_len: config.max_frame_len,
            name: "mem://b".into(),
        },
    )
}

fn closed() -> Error {
    Error::new(ErrorKind::Closed, "in-memory peer closed")
}

impl Link for MemLink {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Error>>> {
        match self.rx.poll_next_unpin(cx) {
            Poll::Ready(Some(frame)) if frame.len() > self.max_frame_len => {
                Poll::Ready(Some(Err(Error::new(
                    ErrorKind::FrameTooLarge,
                    format!(
                        "frame of {} bytes exceeds the maximum of {} bytes",
                        frame.len(),
                        self.max_frame_len
                    ),
                ))))
            }
            Poll::Ready(Some(frame)) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.tx.poll_ready(cx).map_err(|_| closed())
    }

    fn start_send(&mut self, header: &[u8], payload: Payload) -> Result<(), Error> {
        let mut frame = BytesMut::with_capacity(header.len() + payload.len());
        frame.extend_from_slice(header);
        for segment in payload.segments() {
            frame.extend_from_slice(segment);
        }
        self.tx.start_send(frame.freeze()).map_err(|_| closed())
    }

    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.tx.poll_flush_unpin(cx).map_err(|_| closed())
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.tx.poll_close_unpin(cx).map_err(|_| closed())
    }

    fn peer(&self) -> String {
        self.name.clone()
    }

    /// The two directions are separate channels.
    fn reads_while_writing(&self) -> bool {
        false
    }
}

/// Accepts in-memory links made by its [`MemConnector`]s.
pub struct MemListener {
    incoming: mpsc::Receiver<MemLink>,
}

/// Opens in-memory links to one [`MemListener`]. Cheap to clone.
#[derive(Clone)]
pub struct MemConnector {
    to_listener: Arc<Mutex<mpsc::Sender<MemLink>>>,
}

/// A listener and a connector that reaches it.
pub fn listener() -> (MemListener, MemConnector) {
    let (tx, rx) = mpsc::channel(CHANNEL_FRAMES);
    (
        MemListener { incoming: rx },
        MemConnector {
            to_listener: Arc::new(Mutex::new(tx)),
        },
    )
}

impl Listener for MemListener {
    type Link = MemLink;

    async fn accept(&mut self, _config: &LinkConfig) -> Result<MemLink, Error> {
        self.incoming
            .next()
            .await
            .ok_or_else(|| Error::new(ErrorKind::Closed, "every in-memory connector is gone"))
    }

    fn local_addr(&self) -> String {
        "mem://listener".into()
    }
}

impl Connector for MemConnector {
    type Link = MemLink;

    async fn connect(&self, config: &LinkConfig) -> Result<MemLink, Error> {
        let (client, server) = pair(config);
        self.to_listener
            .lock()
            .await
            .send(server)
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Io,
                    "connection refused: in-memory listener is gone",
                )
            })?;
        Ok(client)
    }

    fn target(&self) -> String {
        "mem://listener".into()
    }
}
