//! The standard `grpc.health.v1.Health` service (`Check` and `List`; `Watch` comes
//! with streaming support), and [`HealthReporter`], which a server updates as its
//! services go up and down.
//!
//! ```
//! use rpc_proto::health::{HealthReporter, ServingStatus};
//! let health = HealthReporter::new();
//! health.set("rpc.examples.v1.KeyValue", ServingStatus::Serving);
//! // Server::builder().add_service(health.service()) ...
//! ```

use std::{
    collections::BTreeMap,
    sync::{Arc, RwLock},
};

use rpc_core::{Request, Response, Status};

pub use crate::grpc_health_v1::{
    health_check_response::ServingStatus, health_client, health_methods, health_server,
    HealthCheckRequest, HealthCheckResponse, HealthListRequest, HealthListResponse,
};

/// Most services `List` reports before answering `RESOURCE_EXHAUSTED`, as the
/// protocol allows: it bounds the size of one answer.
pub const MAX_LISTED_SERVICES: usize = 1000;

/// The health of a server's services; clones share it. The empty name `""` is the
/// server as a whole.
#[derive(Clone, Debug, Default)]
pub struct HealthReporter {
    statuses: Arc<RwLock<BTreeMap<String, ServingStatus>>>,
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
