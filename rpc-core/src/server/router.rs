//! The router: fully qualified service name to the service that handles it.

use std::{collections::HashMap, sync::Arc};

use tower::util::BoxCloneSyncService;

use super::{ServerCall, ServerReply};
use crate::Status;

/// A type-erased service as the router stores it.
pub(crate) type BoxService = BoxCloneSyncService<ServerCall, ServerReply, Status>;

/// Services by name. Each connection gets its own clone, so services are polled for
/// readiness without sharing a lock between connections.
#[derive(Clone, Default)]
pub(crate) struct Router {
    names: Arc<HashMap<String, usize>>,
    services: Vec<BoxService>,
}

impl Router {
    /// Adds (or replaces) the service for `name`.
    pub(crate) fn add(&mut self, name: String, service: BoxService) {
        let names = Arc::make_mut(&mut self.names);
        match names.get(&name) {
            Some(&index) => self.services[index] = service,
            None => {
                names.insert(name, self.services.len());
                self.services.push(service);
            }
        }
    }

    /// The index of the service that handles `method` (`package.Service/Method`).
    pub(crate) fn route(&self, method: &str) -> Result<usize, Status> {
        let service = method
            .split_once('/')
            .map_or(method, |(service, _)| service);
        self.names
            .get(service)
            .copied()
            .ok_or_else(|| Status::unimplemented(format!("unknown service {service}")))
    }

    pub(crate) fn service(&mut self, index: usize) -> &mut BoxService {
        &mut self.services[index]
    }

    /// The names of the services served.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.keys().map(String::as_str)
    }
}
