//! Shared pieces of the end-to-end tests: an instrumented `Echo` service and an
//! in-process server on a loopback port.

#![allow(dead_code, unreachable_pub)]

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use rpc_core::{
    server::{Server, ServerBuilder},
    Request, Response, Status,
};
use rpc_proto::{
    echo::{
        echo_server::{Echo, EchoServer},
        CountRequest, EchoService, FailReply, FailRequest, SayReply, SayRequest, SleepReply,
        SleepRequest, SumReply, SumRequest,
    },
    kv::{key_value_server::KeyValueServer, MemoryStore},
};
use tokio::sync::{mpsc, Semaphore};

pub mod udp;

/// A value a server layer puts in a call's extensions; `Say` echoes it back as
/// `x-tenant-seen` metadata.
#[derive(Clone, Debug)]
pub struct Tenant(pub String);

/// What the test service saw.
#[derive(Default)]
pub struct Counters {
    /// Handlers started.
    pub started: AtomicUsize,
    /// Handlers dropped before they finished.
    pub dropped: AtomicUsize,
}

/// `Echo` with counters, a drop report for unfinished handlers, and an optional gate
/// that `Sleep` waits on (so tests can hold handlers and release them one by one).
#[derive(Clone)]
pub struct TestEcho {
    pub counters: Arc<Counters>,
    pub dropped_tx: mpsc::UnboundedSender<()>,
    pub gate: Option<Arc<Semaphore>>,
}

pub struct Probe {
    pub counters: Arc<Counters>,
    pub dropped_rx: mpsc::UnboundedReceiver<()>,
}

impl TestEcho {
    pub fn new(gate: Option<Arc<Semaphore>>) -> (TestEcho, Probe) {
        let counters = Arc::new(Counters::default());
        let (dropped_tx, dropped_rx) = mpsc::unbounded_channel();
        (
            TestEcho {
                counters: counters.clone(),
                dropped_tx,
                gate,
            },
            Probe {
                counters,
                dropped_rx,
            },
        )
    }
}

impl Probe {
    /// Waits (up to 60 s) for a handler-dropped report.
    pub async fn handler_dropped(&mut self) -> bool {
        tokio::time::timeout(Duration::from_secs(60), self.dropped_rx.recv())
            .await
            .is_ok()
    }

    pub fn started(&self) -> usize {
        self.counters.started.load(Ordering::SeqCst)
    }
}

struct DropGuard {
    done: bool,
    counters: Arc<Counters>,
    tx: mpsc::UnboundedSender<()>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.done {
            self.counters.dropped.fetch_add(1, Ordering::SeqCst);
            let _ = self.tx.send(());
        }
    }
}

impl Echo for TestEcho {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        // Scramble the order of answers: each call waits a pseudo-random 0-1.5 ms.
        let message = &request.get_ref().message;
        let h = message.bytes().fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
        });
        tokio::time::sleep(Duration::from_micros(h % 1500)).await;
        // Echo the metadata too, so tests can check it both ways.
        let mut metadata = request.metadata().clone();
        // And what a server layer handed over in the extensions.
        if let Some(Tenant(tenant)) = request.extensions().get::<Tenant>() {
            metadata
                .insert("x-tenant-seen", tenant.clone())
                .expect("a valid metadata value");
        }
        let (_, reply) = EchoService.say(request).await?.into_parts();
        Ok(Response::from_parts(metadata, reply))
    }

    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<SleepReply>, Status> {
        self.counters.started.fetch_add(1, Ordering::SeqCst);
        let mut guard = DropGuard {
            done: false,
            counters: self.counters.clone(),
            tx: self.dropped_tx.clone(),
        };
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate closed").forget();
        }
        let result = EchoService.sleep(request).await;
        guard.done = true;
        result
    }

    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<FailReply>, Status> {
        EchoService.fail(request).await
    }

    type CountStream = <EchoService as Echo>::CountStream;

    async fn count(
        &self,
        request: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        EchoService.count(request).await
    }

    async fn sum(
        &self,
        request: Request<rpc_core::stream::Streaming<SumRequest>>,
    ) -> Result<Response<SumReply>, Status> {
        EchoService.sum(request).await
    }

    type ChatStream = <EchoService as Echo>::ChatStream;

    async fn chat(
        &self,
        request: Request<rpc_core::stream::Streaming<SayRequest>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        EchoService.chat(request).await
    }
}

/// A server on a loopback port, stopped (gracefully) by [`TestServer::shutdown`] or
/// aborted on drop.
pub struct TestServer {
    pub uri: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), rpc_core::Error>>>,
}

impl TestServer {
    pub async fn start(builder: ServerBuilder, echo: TestEcho) -> TestServer {
        let server = builder
            .add_service(EchoServer::new(echo))
            .add_service(KeyValueServer::new(MemoryStore::default()))
            .build();
        TestServer::serve(server).await
    }

    /// Serves an already built server on a loopback port.
    pub async fn serve(server: Server) -> TestServer {
        let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await.unwrap();
        let uri = listener.local_addr_uri();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve_with_shutdown(listener, async move {
                    let _ = stopped.await;
                })
                .await
        });
        TestServer {
            uri,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts graceful shutdown and returns a handle that completes when it is done.
    pub fn shutdown(&mut self) -> tokio::task::JoinHandle<Result<(), rpc_core::Error>> {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
