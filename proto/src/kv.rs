//! The `KeyValue` service and an in-memory implementation.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use rpc_core::{bytes::Bytes, Request, Response, Status};

pub use crate::v1::{
    key_value_client, key_value_methods, key_value_server, DeleteReply, DeleteRequest, GetReply,
    GetRequest, IncrementReply, IncrementRequest, ListReply, ListRequest, PutReply, PutRequest,
};

/// An in-memory `KeyValue` store. Clones share the data.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    data: Arc<Mutex<BTreeMap<String, Bytes>>>,
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        // A handler that panicked while holding the lock left the map consistent (every
        // operation is a single map call), so poisoning is ignored.
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl key_value_server::KeyValue for MemoryStore {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetReply>, Status> {
        let key = &request.get_ref().key;
        match self.lock().get(key) {
            Some(value) => Ok(Response::new(GetReply {
                value: value.clone(),
            })),
            None => Err(Status::not_found(format!("no key {key:?}"))),
        }
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutReply>, Status> {
        let PutRequest { key, value } = request.into_inner();
        self.lock().insert(key, value);
        Ok(Response::new(PutReply {}))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteReply>, Status> {
        let existed = self.lock().remove(&request.get_ref().key).is_some();
        Ok(Response::new(DeleteReply { existed }))
    }

    async fn increment(
        &self,
        request: Request<IncrementRequest>,
    ) -> Result<Response<IncrementReply>, Status> {
        let IncrementRequest { key, delta } = request.into_inner();
        let mut data = self.lock();
        let current = match data.get(&key) {
            None => 0,
            Some(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    Status::failed_precondition(format!("value of {key:?} is not an integer"))
                })?,
        };
        let value = current
            .checked_add(delta)
            .ok_or_else(|| Status::out_of_range(format!("{current} + {delta} overflows")))?;
        data.insert(key, Bytes::from(value.to_string()));
        Ok(Response::new(IncrementReply { value }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        let ListRequest { prefix, limit } = request.into_inner();
        let limit = if limit == 0 {
            usize::MAX
        } else {
            limit as usize
        };
        let keys = self
            .lock()
            .range(prefix.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&prefix))
            .take(limit)
            .cloned()
            .collect();
        Ok(Response::new(ListReply { keys }))
    }
}
