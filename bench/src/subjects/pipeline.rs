//! The caller half shared by the raw baselines' throughput workload: many calls in
//! flight through a minimal id demultiplexer. A transport-specific writer task takes
//! the queued requests, a reader task hands each echo to its caller by id.

use std::{
    collections::HashMap,
    io,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::{wrong_length, Caller};

/// Requests queued for the writer task: as many as the throughput workload keeps in
/// flight, and then some.
const QUEUE_LEN: usize = 1024;

/// Callers waiting for their echo, by id; each gets the echoed payload length.
#[derive(Clone, Debug, Default)]
pub(crate) struct Waiting(Arc<Mutex<HashMap<u64, oneshot::Sender<usize>>>>);

impl Waiting {
    /// Hands the echo of request `id` (`len` payload bytes) to its caller, if any.
    pub(crate) fn answer(&self, id: u64, len: usize) {
        let caller = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        if let Some(caller) = caller {
            let _ = caller.send(len);
        }
    }

    /// Fails every caller still waiting (the connection is gone).
    pub(crate) fn fail_all(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Many calls in flight on one connection; clones share it. The writer task ends
/// when the last clone is dropped.
#[derive(Clone, Debug)]
pub(crate) struct PipelinedCaller {
    name: &'static str,
    requests: mpsc::Sender<(u64, Bytes)>,
    waiting: Waiting,
    next_id: Arc<AtomicU64>,
    /// How long a call waits for its echo (`None`: until the connection closes).
    timeout: Option<Duration>,
}

impl PipelinedCaller {
    /// A caller named `name` in errors; the writer task takes requests from the
    /// returned queue, the reader task answers through the returned table.
    pub(crate) fn new(
        name: &'static str,
        timeout: Option<Duration>,
    ) -> (Self, mpsc::Receiver<(u64, Bytes)>, Waiting) {
        let (requests, queue) = mpsc::channel(QUEUE_LEN);
        let waiting = Waiting::default();
        let caller = PipelinedCaller {
            name,
            requests,
            waiting: waiting.clone(),
            next_id: Arc::new(AtomicU64::new(0)),
            timeout,
        };
        (caller, queue, waiting)
    }
}

impl Caller for PipelinedCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let name = self.name;
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, format!("{name} closed"));
        self.requests
            .send((id, payload.clone()))
            .await
            .map_err(|_| closed())?;
        let got = match self.timeout {
            None => rx.await,
            Some(limit) => tokio::time::timeout(limit, rx).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{name}: no echo of request {id} (lost; nothing is resent)"),
                )
            })?,
        }
        .map_err(|_| closed())?;
        if got != payload.len() {
            return Err(wrong_length(payload.len(), got));
        }
        Ok(())
    }
}
