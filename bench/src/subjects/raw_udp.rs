//! The raw UDP baseline: one datagram per request (`[u64 BE id][payload]`), echoed
//! as is. Latency workload only: the payload must fit one datagram and nothing is
//! pipelined.

use std::{io, time::Duration};

use bytes::Bytes;
use tokio::net::UdpSocket;

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
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
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
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
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
