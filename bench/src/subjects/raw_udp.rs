//! The raw UDP baseline: one datagram per request (`[u64 BE id][payload]`), echoed
//! as is, with one `send`/`recv` system call per datagram. Latency (one call at a
//! time) and throughput (calls pipelined through an id demultiplexer, as raw-tcp's)
//! workloads; no bulk: the payload must fit one datagram.

use std::{io, sync::Arc, time::Duration};

use bytes::Bytes;
use tokio::net::UdpSocket;

pub(crate) use super::pipeline::PipelinedCaller;

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

/// How long a pipelined call waits for its echo: nothing is resent, so a lost datagram
/// fails its call (and the run).
const PIPELINED_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects a [`PipelinedCaller`] to `addr` and spawns its writer and reader tasks on
/// the current runtime: one datagram per request, one `send` each.
pub(crate) async fn connect_pipelined(addr: &str) -> io::Result<PipelinedCaller> {
    let socket = bind().await?;
    socket.connect(addr).await?;
    let socket = Arc::new(socket);
    let (caller, mut queue, waiting) =
        PipelinedCaller::new("raw-udp socket", Some(PIPELINED_TIMEOUT));
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
            if let Some(id) = buf.get(..8) {
                let id = u64::from_be_bytes(id.try_into().unwrap_or_default());
                waiting.answer(id, n - 8);
            }
        }
        waiting.fail_all();
    });
    Ok(caller)
}
