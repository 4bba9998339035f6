//! [`TcpProxy`]: forwards TCP connections and injects faults.

use std::{
    io,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    task::{JoinHandle, JoinSet},
};

/// What to do to the connections going through a [`TcpProxy`].
#[derive(Clone, Debug, Default)]
pub struct TcpFaults {
    /// Wait this long before forwarding each chunk (in both directions).
    pub delay: Duration,
    /// Cut the connection once this many client-to-server bytes were forwarded.
    pub cut_after_request_bytes: Option<u64>,
    /// Cut the connection once this many server-to-client bytes were forwarded.
    pub cut_after_response_bytes: Option<u64>,
    /// Forward what the client sends, then cut the connection when the first byte of
    /// the server's answer arrives, without forwarding it: the request was processed,
    /// the response is lost.
    pub cut_before_response: bool,
    /// Cut with a reset (RST) instead of a normal close (FIN).
    pub reset: bool,
    /// Apply the faults to the first this-many connections only; `None`: to all.
    pub faulty_connections: Option<u64>,
}

/// What a [`TcpProxy`] did.
#[derive(Debug, Default)]
pub struct TcpCounters {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections cut by a fault.
    pub cut: AtomicU64,
    /// Client-to-server bytes forwarded.
    pub bytes_up: AtomicU64,
    /// Server-to-client bytes forwarded.
    pub bytes_down: AtomicU64,
}

/// A TCP proxy on a loopback port. Dropping it stops it and closes its connections.
pub struct TcpProxy {
    addr: SocketAddr,
    faults: Arc<Mutex<TcpFaults>>,
    counters: Arc<TcpCounters>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy on `127.0.0.1:0` that forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, faults: TcpFaults) -> io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let faults = Arc::new(Mutex::new(faults));
        let counters = Arc::new(TcpCounters::default());
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            faults.clone(),
            counters.clone(),
        ));
        Ok(TcpProxy {
            addr,
            faults,
            counters,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the faults for connections accepted from now on.
    pub fn set_faults(&self, faults: TcpFaults) {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// What the proxy did so far.
    pub fn counters(&self) -> &TcpCounters {
        &self.counters
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    faults: Arc<Mutex<TcpFaults>>,
    counters: Arc<TcpCounters>,
) {
    // Owned here: aborting this task drops the set, which aborts every connection.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let index = counters.connections.fetch_add(1, Ordering::SeqCst);
                let plan = faults.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let plan = match plan.faulty_connections {
                    Some(n) if index >= n => TcpFaults::default(),
                    _ => plan,
                };
                connections.spawn(forward(client, upstream, plan, counters.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Why a pump stopped.
enum End {
    /// End of stream or an I/O error: close normally.
    Closed,
    /// A fault fired: cut the connection.
    Cut,
}

async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    plan: TcpFaults,
    counters: Arc<TcpCounters>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if plan.reset {
        // SO_LINGER 0: closing sends RST instead of FIN. Set before the split, since the
        // halves close the socket when the connection ends. (tokio deprecates set_linger
        // because a non-zero linger blocks the closing thread; a zero one does not.)
        #[allow(deprecated)]
        let _ = client.set_linger(Some(Duration::ZERO));
        #[allow(deprecated)]
        let _ = server.set_linger(Some(Duration::ZERO));
    }
    let (mut client_read, client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let (mut client_write, mut server_write) = (Some(client_write), Some(server_write));
    let end = {
        let up = pump(
            &mut client_read,
            server_write.as_mut().unwrap(),
            &plan,
            Direction::Up,
            &counters,
        );
        let down = pump(
            &mut server_read,
            client_write.as_mut().unwrap(),
            &plan,
            Direction::Down,
            &counters,
        );
        // Either direction ending ends the connection (the protocols under test do not
        // half-close).
        tokio::select! {
            end = up => end,
            end = down => end,
        }
    };
    if matches!(end, End::Cut) {
        counters.cut.fetch_add(1, Ordering::SeqCst);
        if plan.reset {
            // Dropping a write half sends FIN; forgetting it leaves the close to the
            // read half, which with SO_LINGER 0 resets the connection.
            if let Some(w) = client_write.take() {
                w.forget();
            }
            if let Some(w) = server_write.take() {
                w.forget();
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Up,
    Down,
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    plan: &TcpFaults,
    direction: Direction,
    counters: &TcpCounters,
) -> End {
    let (limit, counter) = match direction {
        Direction::Up => (plan.cut_after_request_bytes, &counters.bytes_up),
        Direction::Down => (plan.cut_after_response_bytes, &counters.bytes_down),
    };
    let mut forwarded = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        if direction == Direction::Down && plan.cut_before_response {
            return End::Cut;
        }
        if !plan.delay.is_zero() {
            tokio::time::sleep(plan.delay).await;
        }
        let mut chunk = &buf[..n];
        let mut cut = false;
        if let Some(limit) = limit {
            let room = limit.saturating_sub(forwarded) as usize;
            if chunk.len() >= room {
                chunk = &chunk[..room];
                cut = true;
            }
        }
        if to.write_all(chunk).await.is_err() {
            return End::Closed;
        }
        forwarded += chunk.len() as u64;
        counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        if cut {
            return End::Cut;
        }
    }
}
