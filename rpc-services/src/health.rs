//! The standard `grpc.health.v1.Health` service (`Check`, `List` and the
//! server-streaming `Watch`), and [`HealthReporter`], which a server updates as its
//! services go up and down.
//!
//! ```
//! use rpc_services::health::{HealthReporter, ServingStatus};
//! let health = HealthReporter::new();
//! health.set("rpc.examples.v1.KeyValue", ServingStatus::Serving);
//! // Server::builder().add_service(health.service()) ...
//! ```

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, RwLock,
    },
};

use rpc_core::{Request, Response, Status};

/// Everything generated for the protobuf package `grpc.health.v1`; the items a user
/// needs are re-exported here.
#[allow(missing_docs, unreachable_pub)]
pub mod v1 {
    rpc_core::include_proto!("grpc.health.v1");
}

pub use v1::{
    health_check_response::ServingStatus, health_client, health_methods, health_server,
    HealthCheckRequest, HealthCheckResponse, HealthListRequest, HealthListResponse,
};

/// Most services `List` reports before answering `RESOURCE_EXHAUSTED`, as the
/// protocol allows: it bounds the size of one answer.
pub const MAX_LISTED_SERVICES: usize = 1000;

/// Longest service name `Watch` takes for a service not known: a `Watch` keeps its
/// name for as long as the stream is open, and a peer (health checks are usually
/// exempt from authentication) could otherwise have a server keep a name as long as a
/// whole message for each of its streams. A longer name is `INVALID_ARGUMENT`.
pub const MAX_SERVICE_NAME_LEN: usize = 1024;

/// The health of a server's services; clones share it. The empty name `""` is the
/// server as a whole.
#[derive(Clone, Debug)]
pub struct HealthReporter {
    statuses: Arc<RwLock<BTreeMap<String, ServingStatus>>>,
    /// Bumped on every change, for `Watch` streams.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// Set by [`HealthReporter::shutdown`]: statuses no longer change, and `Watch`
    /// streams end once they have sent the last one.
    shut_down: Arc<AtomicBool>,
}

impl Default for HealthReporter {
    fn default() -> Self {
        HealthReporter {
            statuses: Arc::default(),
            changes: Arc::new(tokio::sync::watch::Sender::new(0)),
            shut_down: Arc::default(),
        }
    }
}

impl HealthReporter {
    /// A reporter where the server as a whole (`""`) is `SERVING` and nothing else is
    /// known.
    pub fn new() -> HealthReporter {
        let reporter = HealthReporter::default();
        reporter.set("", ServingStatus::Serving);
        reporter
    }

    /// Sets the status of `service` (`""`: the whole server). Ignored after
    /// [`shutdown`](Self::shutdown).
    pub fn set(&self, service: &str, status: ServingStatus) {
        let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
        if self.shut_down.load(Ordering::SeqCst) {
            return;
        }
        statuses.insert(service.to_owned(), status);
        drop(statuses);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Marks every known service, and the server, `NOT_SERVING` (for draining:
    /// health checks and `Watch` streams see it while the server still answers).
    /// `Watch` streams stay open; [`shutdown`](Self::shutdown) ends them.
    pub fn set_all_not_serving(&self) {
        self.mark_all_not_serving(false);
    }

    /// Marks every service `NOT_SERVING` for good (later [`set`](Self::set)s are
    /// ignored, as grpc-go's health server does) and ends every `Watch` stream, with
    /// `OK`, once it has sent the last status (`NOT_SERVING`; `SERVICE_UNKNOWN` for a
    /// service not known); a `Watch` made after this sends the status and ends. Call
    /// it as the server sends GOAWAY (gRPC's health clients watch again at once after a
    /// stream that ended): a `Watch` stream never ends on its own, so open ones would
    /// otherwise hold a graceful shutdown for its whole drain timeout, and then be cut
    /// off with their connection.
    pub fn shutdown(&self) {
        self.mark_all_not_serving(true);
    }

    /// Every status `NOT_SERVING`, and `for_good` the shutdown flag set, under the
    /// statuses' lock: a `Watch` that sees the flag sees `NOT_SERVING` too.
    fn mark_all_not_serving(&self, for_good: bool) {
        let mut statuses = self.statuses.write().unwrap_or_else(|e| e.into_inner());
        if for_good {
            self.shut_down.store(true, Ordering::SeqCst);
        }
        for status in statuses.values_mut() {
            *status = ServingStatus::NotServing;
        }
        drop(statuses);
        self.changes.send_modify(|n| *n += 1);
    }

    /// The status of `service`, if known.
    pub fn get(&self, service: &str) -> Option<ServingStatus> {
        self.statuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(service)
            .copied()
    }

    /// The service to add to a server.
    pub fn service(&self) -> health_server::HealthServer<HealthReporter> {
        health_server::HealthServer::new(self.clone())
    }
}

impl health_server::Health for HealthReporter {
    type WatchStream = futures::stream::BoxStream<'static, Result<HealthCheckResponse, Status>>;

    /// The current status at once (`SERVICE_UNKNOWN` for a service not known yet, and
    /// the call stays open), then every change, until [`HealthReporter::shutdown`]. A
    /// name longer than [`MAX_SERVICE_NAME_LEN`] that no service has is
    /// `INVALID_ARGUMENT`.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use futures::StreamExt;
        let service = request.into_inner().service;
        if service.len() > MAX_SERVICE_NAME_LEN && self.get(&service).is_none() {
            return Err(Status::invalid_argument(format!(
                "a service name of {} bytes, longer than the {MAX_SERVICE_NAME_LEN} a watched \
                 service not known may have",
                service.len()
            )));
        }
        let reporter = self.clone();
        let changes = self.changes.subscribe();
        let statuses = futures::stream::unfold(
            (reporter, changes, None::<ServingStatus>),
            move |(reporter, mut changes, last)| {
                let service = service.clone();
                async move {
                    loop {
                        changes.borrow_and_update();
                        let (now, ending) = {
                            let statuses =
                                reporter.statuses.read().unwrap_or_else(|e| e.into_inner());
                            (
                                statuses
                                    .get(&service)
                                    .copied()
                                    .unwrap_or(ServingStatus::ServiceUnknown),
                                reporter.shut_down.load(Ordering::SeqCst),
                            )
                        };
                        if last != Some(now) {
                            let message = HealthCheckResponse { status: now as i32 };
                            return Some((Ok(message), (reporter, changes, Some(now))));
                        }
                        if ending {
                            return None;
                        }
                        // The reporter lives in this stream, so the sender never closes.
                        changes.changed().await.ok()?;
                    }
                }
            },
        );
        Ok(Response::new(statuses.boxed()))
    }

    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match self.get(service) {
            Some(status) => Ok(Response::new(HealthCheckResponse {
                status: status as i32,
            })),
            None => Err(Status::not_found(format!(
                "unknown service {:?}{}",
                shown(service),
                if shown(service).len() < service.len() {
                    "..."
                } else {
                    ""
                }
            ))),
        }
    }

    async fn list(
        &self,
        _request: Request<HealthListRequest>,
    ) -> Result<Response<HealthListResponse>, Status> {
        let statuses = self.statuses.read().unwrap_or_else(|e| e.into_inner());
        if statuses.len() > MAX_LISTED_SERVICES {
            return Err(Status::resource_exhausted(format!(
                "{} services, more than the {MAX_LISTED_SERVICES} one answer lists",
                statuses.len()
            )));
        }
        let statuses = statuses
            .iter()
            .map(|(name, status)| {
                (
                    name.clone(),
                    HealthCheckResponse {
                        status: *status as i32,
                    },
                )
            })
            .collect();
        Ok(Response::new(HealthListResponse { statuses }))
    }
}

/// The first bytes of a name for an error message (a peer's name can be as long as
/// a message), cut at a character boundary.
fn shown(name: &str) -> &str {
    let mut end = name.len().min(200);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}
