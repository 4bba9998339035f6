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
    sync::{Arc, RwLock},
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

/// The health of a server's services; clones share it. The empty name `""` is the
/// server as a whole.
#[derive(Clone, Debug)]
pub struct HealthReporter {
    statuses: Arc<RwLock<BTreeMap<String, ServingStatus>>>,
    /// Bumped on every change, for `Watch` streams.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for HealthReporter {
    fn default() -> Self {
        HealthReporter {
            statuses: Arc::default(),
            changes: Arc::new(tokio::sync::watch::Sender::new(0)),
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

    /// Sets the status of `service` (`""`: the whole server).
    pub fn set(&self, service: &str, status: ServingStatus) {
        self.statuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(service.to_owned(), status);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Marks every known service, and the server, `NOT_SERVING` (for draining).
    pub fn set_all_not_serving(&self) {
        for status in self
            .statuses
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .values_mut()
        {
            *status = ServingStatus::NotServing;
        }
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
    /// the call stays open), then every change.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use futures::StreamExt;
        let service = request.into_inner().service;
        let reporter = self.clone();
        let changes = self.changes.subscribe();
        let statuses = futures::stream::unfold(
            (reporter, changes, None::<ServingStatus>),
            move |(reporter, mut changes, last)| {
                let service = service.clone();
                async move {
                    loop {
                        changes.borrow_and_update();
                        let now = reporter
                            .get(&service)
                            .unwrap_or(ServingStatus::ServiceUnknown);
                        if last != Some(now) {
                            let message = HealthCheckResponse { status: now as i32 };
                            return Some((Ok(message), (reporter, changes, Some(now))));
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
            None => Err(Status::not_found(format!("unknown service {service:?}"))),
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
