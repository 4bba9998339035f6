//! The raw UDP baseline: one datagram per request (`[u64 BE id][payload]`), echoed
//! as is, with one `send`/`recv` system call per datagram. Latency (one call at a
//! time) and throughput (calls pipelined through an id demultiplexer, as raw-tcp's)
//! workloads; no bulk: the payload must fit one datagram.

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
use tokio::{
    net::UdpSocket,
    sync::{mpsc, oneshot},
};

use super::{wrong_length, Caller, ServeFuture};

/// Largest datagram either end receives.
const MAX_DATAGRAM: usize = 64 * 1024;

/// A request unanswered for this long is sent again (loopback rarely drops, but a
/// full socket buffer can).
const RESEND_AFTER: Duration = Duration::from_millis(200);

/// Sends of one request before the call fails.
const MAX_SENDS: u32 = 10;

/// Binds `127.0.0.1:0` and returns the bound `host:port` and the echo loop.
pub(crate) async fn serve() -> io::Result<(String, ServeFuture)> {
    let socket = bind().await?;
    let addr = socket.local_addr()?.to_string();
    let serve = async move {
        let mut buf = vec![0; MAX_DATAGRAM];
        loop {
            let (n, peer) = socket.recv_from(&mut buf).await?;
            socket.send_to(&buf[..n], peer).await?;
        }
    };
    Ok((addr, Box::pin(serve)))
}

/// Socket buffers of both ends: as the framework's default, so that 256 calls in
/// flight are not dropped by a full receive buffer.
const SOCKET_BUFFER: usize = 4 << 20;

/// A socket on `127.0.0.1:0` with [`SOCKET_BUFFER`]s.
async fn bind() -> io::Result<UdpSocket> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let options = socket2::SockRef::from(&socket);
    options.set_recv_buffer_size(SOCKET_BUFFER)?;
    options.set_send_buffer_size(SOCKET_BUFFER)?;
    Ok(socket)
}

/// A connected UDP socket doing one call at a time.
#[derive(Debug)]
pub(crate) struct UdpCaller {
    socket: UdpSocket,
    next_id: u64,
    request: Vec<u8>,
    response: Vec<u8>,
}

/// Connects a [`UdpCaller`] to `addr` (`host:port`).
pub(crate) async fn connect(addr: &str) -> io::Result<UdpCaller> {
    let socket = bind().await?;
    socket.connect(addr).await?;
    Ok(UdpCaller {
        socket,
        next_id: 0,
        request: Vec::new(),
        response: vec![0; MAX_DATAGRAM],
    })
}

impl Caller for UdpCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        if payload.len() + 8 > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "payload does not fit a datagram",
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.request.clear();
        self.request.extend_from_slice(&id.to_be_bytes());
        self.request.extend_from_slice(payload);
        for _ in 0..MAX_SENDS {
            self.socket.send(&self.request).await?;
            let deadline = tokio::time::Instant::now() + RESEND_AFTER;
            // Skips late echoes of earlier (resent) requests.
            while let Ok(n) =
                tokio::time::timeout_at(deadline, self.socket.recv(&mut self.response)).await
            {
                let n = n?;
                if n >= 8 && self.response[..8] == id.to_be_bytes() {
                    return if n - 8 == payload.len() {
                        Ok(())
                    } else {
                        Err(wrong_length(payload.len(), n - 8))
                    };
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no echo of datagram {id} after {MAX_SENDS} sends"),
        ))
    }
}

/// Callers waiting for their echo, by id; each gets the echoed payload length.
type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<usize>>>>;

/// Many calls in flight on one connected socket; clones share it. A writer task sends
/// one datagram per request, a reader task hands each echo to its caller. Nothing is
/// resent: a lost datagram fails its call after [`PIPELINED_TIMEOUT`] (and the run).
#[derive(Clone, Debug)]
pub(crate) struct PipelinedCaller {
    requests: mpsc::Sender<(u64, Bytes)>,
    waiting: Waiting,
    next_id: Arc<AtomicU64>,
}

/// How long a pipelined call waits for its echo.
const PIPELINED_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects a [`PipelinedCaller`] to `addr` and spawns its writer and reader tasks on
/// the current runtime.
pub(crate) async fn connect_pipelined(addr: &str) -> io::Result<PipelinedCaller> {
    let socket = bind().await?;
    socket.connect(addr).await?;
    let socket = Arc::new(socket);
    let (requests, mut queue) = mpsc::channel::<(u64, Bytes)>(1024);
    let waiting = Waiting::default();
    let writer = Arc::clone(&socket);
    tokio::spawn(async move {
        let mut datagram = Vec::with_capacity(MAX_DATAGRAM);
        while let Some((id, payload)) = queue.recv().await {
            datagram.clear();
            datagram.extend_from_slice(&id.to_be_bytes());
            datagram.extend_from_slice(&payload);
            if let Err(e) = writer.send(&datagram).await {
                eprintln!("raw-udp client: {e}");
                return;
            }
        }
    });
    let table = Arc::clone(&waiting);
    tokio::spawn(async move {
        let mut buf = vec![0; MAX_DATAGRAM];
        loop {
            let n = match socket.recv(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("raw-udp client: {e}");
                    break;
                }
            };
            let Some(id) = buf
                .get(..8)
                .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
            else {
                continue;
            };
            let caller = table.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            if let Some(caller) = caller {
                let _ = caller.send(n - 8);
            }
        }
        table.lock().unwrap_or_else(|e| e.into_inner()).clear();
    });
    Ok(PipelinedCaller {
        requests,
        waiting,
        next_id: Arc::new(AtomicU64::new(0)),
    })
}

impl Caller for PipelinedCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        if payload.len() + 8 > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "payload does not fit a datagram",
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, "raw-udp socket closed");
        self.requests
            .send((id, payload.clone()))
            .await
            .map_err(|_| closed())?;
        let got = tokio::time::timeout(PIPELINED_TIMEOUT, rx)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no echo of datagram {id} (lost: raw-udp does not resend)"),
                )
            })?
            .map_err(|_| closed())?;
        if got != payload.len() {
            return Err(wrong_length(payload.len(), got));
        }
        Ok(())
    }
}
