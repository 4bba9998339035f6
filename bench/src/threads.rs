//! The two OS threads of a measurement, each with its own `current_thread` Tokio
//! runtime and optionally pinned to a CPU: the server thread (everything the server
//! does, handler tasks included, runs there) and the client thread. A control channel
//! lets the client tell the server when the measured phase begins and ends, so each
//! thread reads its own CPU clock.

use std::{
    future::Future,
    io,
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use tokio::sync::{mpsc, oneshot};

use crate::{stats, subjects::BenchSubject};

/// Messages from the client thread to the server thread.
#[derive(Debug)]
enum Control {
    /// Read the CPU clock now (the measured phase starts), then acknowledge.
    Begin(oneshot::Sender<()>),
    /// Reply with the CPU time used since `Begin`.
    End(oneshot::Sender<Duration>),
}

/// The client's handle on the server thread's CPU clock; in the many workload's
/// client process, the client thread's share of the connections instead.
#[derive(Clone, Debug)]
pub struct ServerControl {
    tx: mpsc::UnboundedSender<Control>,
    /// The many workload's client thread: its connections and the coordinator of the
    /// process's client threads (`None` on the harness's client thread).
    pub(crate) shard: Option<crate::many::Shard>,
}

fn server_gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the server thread stopped")
}

impl ServerControl {
    /// The control of a many-workload client thread: no server thread to talk to
    /// (measured phases that need one fail), only `shard`.
    pub(crate) fn for_shard(shard: crate::many::Shard) -> ServerControl {
        let (tx, _) = mpsc::unbounded_channel();
        ServerControl {
            tx,
            shard: Some(shard),
        }
    }

    async fn begin(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Control::Begin(tx))
            .map_err(|_| server_gone())?;
        rx.await.map_err(|_| server_gone())
    }

    async fn end(&self) -> io::Result<Duration> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Control::End(tx)).map_err(|_| server_gone())?;
        rx.await.map_err(|_| server_gone())
    }
}

/// A measured phase in progress, started on the client thread.
#[derive(Debug)]
pub(crate) struct Phase {
    start: Instant,
    client_cpu: Duration,
}

/// Wall and CPU times of one measured phase.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PhaseTimes {
    /// Wall-clock time.
    pub(crate) wall: Duration,
    /// CPU time of the server thread.
    pub(crate) server_cpu: Duration,
    /// CPU time of the client thread.
    pub(crate) client_cpu: Duration,
}

impl Phase {
    /// Starts the phase: the server reads its CPU clock, then the client does.
    pub(crate) async fn begin(control: &ServerControl) -> io::Result<Phase> {
        control.begin().await?;
        Ok(Phase {
            start: Instant::now(),
            client_cpu: stats::thread_cpu_time(),
        })
    }

    /// Ends the phase and collects both threads' CPU time.
    pub(crate) async fn end(self, control: &ServerControl) -> io::Result<PhaseTimes> {
        let wall = self.start.elapsed();
        let client_cpu = stats::thread_cpu_time().saturating_sub(self.client_cpu);
        let server_cpu = control.end().await?;
        Ok(PhaseTimes {
            wall,
            server_cpu,
            client_cpu,
        })
    }
}

/// A running server thread. It stops once every [`ServerControl`] clone is dropped
/// ([`stop`](ServerThread::stop) drops this handle's and waits).
#[derive(Debug)]
pub(crate) struct ServerThread {
    /// Where clients connect.
    pub(crate) addr: String,
    /// The CPU-clock channel, to hand to the client thread.
    pub(crate) control: ServerControl,
    thread: JoinHandle<()>,
}

impl ServerThread {
    /// Starts `subject`'s server on a new thread (pinned to `cpu` if given) and waits
    /// until it listens.
    pub(crate) fn spawn<S: BenchSubject>(subject: S, cpu: Option<usize>) -> io::Result<Self> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let thread = thread::Builder::new()
            .name(format!("server-{subject}"))
            .spawn(move || {
                let ready = &ready_tx;
                let run = || -> io::Result<()> {
                    let runtime = pinned_runtime(cpu)?;
                    runtime.block_on(async move {
                        let (addr, serve) = subject.start_server().await?;
                        let _ = ready.send(Ok(addr));
                        tokio::select! {
                            result = serve => result,
                            () = control_loop(control_rx) => Ok(()),
                        }
                    })
                };
                if let Err(e) = run() {
                    // Before the server listens, `spawn` reports the error; after, the
                    // client sees the control channel close, and stderr says why.
                    if let Err(std::sync::mpsc::SendError(Err(e))) = ready_tx.send(Err(e)) {
                        eprintln!("{subject} server: {e}");
                    }
                }
            })?;
        let addr = ready_rx.recv().map_err(|_| server_gone())??;
        Ok(ServerThread {
            addr,
            control: ServerControl {
                tx: control_tx,
                shard: None,
            },
            thread,
        })
    }

    /// Stops the server and waits for its thread.
    pub(crate) fn stop(self) {
        drop(self.control);
        let _ = self.thread.join();
    }
}

/// Answers the client's phase messages until every [`ServerControl`] is dropped.
async fn control_loop(mut control: mpsc::UnboundedReceiver<Control>) {
    let mut start = stats::thread_cpu_time();
    while let Some(message) = control.recv().await {
        match message {
            Control::Begin(ack) => {
                start = stats::thread_cpu_time();
                let _ = ack.send(());
            }
            Control::End(reply) => {
                let _ = reply.send(stats::thread_cpu_time().saturating_sub(start));
            }
        }
    }
}

/// Runs `client` on a new thread (pinned to `cpu` if given) with its own
/// `current_thread` runtime, and waits for its result.
pub(crate) fn run_client<T, F, Fut>(cpu: Option<usize>, client: F) -> io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = io::Result<T>>,
{
    thread::Builder::new()
        .name("client".into())
        .spawn(move || pinned_runtime(cpu)?.block_on(client()))?
        .join()
        .map_err(|_| io::Error::other("the client thread panicked"))?
}

/// Pins the calling thread to `cpu` (if given) and builds a `current_thread` runtime.
fn pinned_runtime(cpu: Option<usize>) -> io::Result<tokio::runtime::Runtime> {
    if let Some(cpu) = cpu {
        stats::pin_current_thread(cpu)
            .map_err(|e| io::Error::new(e.kind(), format!("pin to cpu {cpu}: {e}")))?;
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}
