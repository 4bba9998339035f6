//! The router: fully qualified service name to the service that handles it.

use std::{
    any::Any,
    collections::HashMap,
    future::Future,
    hash::{BuildHasherDefault, Hasher},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tower::Service;

use super::{ServerCall, ServerReply};
use crate::{status, Status};

/// The future of a routed call: what generated servers return
/// (`codegen::BoxFuture<Result<ServerReply, Status>>`).
pub(crate) type CallFuture = Pin<Box<dyn Future<Output = Result<ServerReply, Status>> + Send>>;

/// A type-erased service as the router stores it: tower's `BoxCloneSyncService`,
/// except that a future that is a [`CallFuture`] already (every generated server's,
/// when no layer wraps it) is handed on as it is instead of boxed a second time, which
/// saves an allocation per call (`examples/tests/work_per_call.rs` counts them).
pub(crate) struct BoxService(Box<dyn ErasedService>);

impl BoxService {
    pub(crate) fn new<S>(service: S) -> BoxService
    where
        S: Service<ServerCall, Response = ServerReply, Error = Status>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        BoxService(Box::new(Erased(service)))
    }
}

impl Clone for BoxService {
    fn clone(&self) -> Self {
        BoxService(self.0.clone_box())
    }
}

impl Service<ServerCall> for BoxService {
    type Response = ServerReply;
    type Error = Status;
    type Future = CallFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> CallFuture {
        self.0.call(call)
    }
}

/// The object-safe part of a service that [`BoxService`] erases.
trait ErasedService: Send + Sync {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>>;
    fn call(&mut self, call: ServerCall) -> CallFuture;
    fn clone_box(&self) -> Box<dyn ErasedService>;
}

struct Erased<S>(S);

impl<S> ErasedService for Erased<S>
where
    S: Service<ServerCall, Response = ServerReply, Error = Status> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
{
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, call: ServerCall) -> CallFuture {
        let mut future = Some(self.0.call(call));
        // A type check, not a conversion: `S::Future` either is `CallFuture` or is not.
        if let Some(boxed) = (&mut future as &mut dyn Any).downcast_mut::<Option<CallFuture>>() {
            if let Some(boxed) = boxed.take() {
                return boxed;
            }
        }
        match future {
            Some(future) => Box::pin(future),
            None => unreachable!("the future was taken only if it was already boxed"),
        }
    }

    fn clone_box(&self) -> Box<dyn ErasedService> {
        Box::new(Erased(self.0.clone()))
    }
}

/// FNV-1a: the router hashes a service name per call, and SipHash, made to resist
/// flooding, cost about 1% of a server's CPU there. Flooding needs colliding keys *in*
/// the table; its keys are the server's own few service names, so a peer choosing the
/// names it looks up can make a lookup compare against at most those.
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = self.0;
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

/// A service's place in the router: its index, and its methods' names when it listed
/// them ([`NamedService::METHODS`](super::NamedService::METHODS); empty: any name).
type Route = (usize, &'static [&'static str]);

/// Services by name. Each connection gets its own clone, so services are polled for
/// readiness without sharing a lock between connections.
#[derive(Clone, Default)]
pub(crate) struct Router {
    names: Arc<HashMap<String, Route, BuildHasherDefault<Fnv>>>,
    services: Vec<BoxService>,
}

impl Router {
    /// Adds (or replaces) the service for `name`; with `methods` not empty, calls of
    /// other names under `name` are refused here.
    pub(crate) fn add(
        &mut self,
        name: String,
        methods: &'static [&'static str],
        service: BoxService,
    ) {
        let names = Arc::make_mut(&mut self.names);
        match names.get_mut(&name) {
            Some(route) => {
                route.1 = methods;
                self.services[route.0] = service;
            }
            None => {
                names.insert(name, (self.services.len(), methods));
                self.services.push(service);
            }
        }
    }

    /// The index of the service that handles `method` (`package.Service/Method`).
    /// Connections remember a method's route (`frame::MethodCache`), so this runs
    /// once per method name on a connection, not once per call.
    pub(crate) fn route(&self, method: &str) -> Result<usize, Status> {
        // A byte loop: names are short, and a `memchr` costs more to set up.
        let (service, name) = match method.bytes().position(|b| b == b'/') {
            Some(at) => (&method[..at], &method[at + 1..]),
            None => (method, ""),
        };
        let &(index, methods) = self.names.get(service).ok_or_else(|| {
            Status::unimplemented(format!("unknown service {}", status::quoted(service)))
        })?;
        if !methods.is_empty() && !methods.contains(&name) {
            // What a generated server answers itself (`codegen::unimplemented`).
            return Err(Status::unimplemented(format!(
                "unknown method {}",
                status::quoted(method)
            )));
        }
        Ok(index)
    }

    pub(crate) fn service(&mut self, index: usize) -> &mut BoxService {
        &mut self.services[index]
    }

    /// The names of the services served.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    use futures::FutureExt;

    use super::*;

    fn call() -> ServerCall {
        ServerCall {
            method: "t.S/M".into(),
            metadata: crate::Metadata::new(),
            timeout: None,
            payload: bytes::Bytes::new(),
            stream: None,
            compressed: false,
            received: None,
            bulk: None,
            peer: None,
            principal: None,
            extensions: crate::Extensions::new(),
        }
    }

    /// The address of a boxed future's state.
    fn address(future: &CallFuture) -> usize {
        &**future as *const (dyn Future<Output = Result<ServerReply, Status>> + Send) as *const ()
            as usize
    }

    /// A service shaped like a generated server: its future is a `CallFuture`, whose
    /// address it records.
    #[derive(Clone, Default)]
    struct Generated(Arc<AtomicUsize>);

    impl Service<ServerCall> for Generated {
        type Response = ServerReply;
        type Error = Status;
        type Future = CallFuture;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: ServerCall) -> CallFuture {
            let future: CallFuture = Box::pin(async { Ok(ServerReply::default()) });
            self.0.store(address(&future), Ordering::SeqCst);
            future
        }
    }

    #[test]
    fn a_boxed_future_is_not_boxed_again() {
        let made = Arc::new(AtomicUsize::new(0));
        let mut service = BoxService::new(Generated(made.clone())).clone();
        let future = service.call(call());
        assert_eq!(address(&future), made.load(Ordering::SeqCst));
        assert!(future.now_or_never().unwrap().is_ok());
    }

    #[test]
    fn other_futures_are_boxed() {
        let service = tower::service_fn(|_: ServerCall| async {
            Err::<ServerReply, _>(Status::not_found("nothing"))
        });
        let mut service = BoxService::new(service);
        let waker = futures::task::noop_waker();
        assert!(service
            .poll_ready(&mut Context::from_waker(&waker))
            .is_ready());
        let outcome = service.call(call()).now_or_never().unwrap();
        assert_eq!(outcome.unwrap_err().code(), crate::Code::NOT_FOUND);
    }

    #[test]
    fn a_service_that_lists_its_methods_gets_only_those() {
        let mut router = Router::default();
        router.add(
            "t.Listed".into(),
            &["A", "B"],
            BoxService::new(Generated::default()),
        );
        router.add("t.Open".into(), &[], BoxService::new(Generated::default()));
        assert_eq!(router.route("t.Listed/B"), Ok(0));
        assert_eq!(router.route("t.Open/Anything"), Ok(1));
        for (method, message) in [
            ("t.Listed/C", "unknown method t.Listed/C"),
            ("t.Listed/", "unknown method t.Listed/"),
            ("t.Listed", "unknown method t.Listed"),
            ("t.Other/A", "unknown service t.Other"),
        ] {
            let status = router.route(method).unwrap_err();
            assert_eq!(status.code(), crate::Code::UNIMPLEMENTED, "{method}");
            assert_eq!(status.message(), message, "{method}");
        }
        // A name of any length (the framework's wire carries up to 64 KiB, gRPC's a
        // `:path` within the header list limit) is quoted cut short: echoed whole, a
        // 60 KB name went back in the status message.
        for method in [
            format!("{}/M", "s".repeat(60_000)),
            format!("t.Listed/{}", "m".repeat(60_000)),
        ] {
            let message = router.route(&method).unwrap_err().message().to_owned();
            assert!(message.len() < 250, "{} bytes", message.len());
            assert!(message.ends_with('…'), "{message}");
        }
        // Replacing a service replaces its list.
        router.add(
            "t.Listed".into(),
            &["C"],
            BoxService::new(Generated::default()),
        );
        assert_eq!(router.route("t.Listed/C"), Ok(0));
        assert!(router.route("t.Listed/A").is_err());
    }
}
