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

/// The longest key [`MemoryStore`] takes, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// The most keys one `List` answers with: a larger `limit`, or 0, is lowered to it. A
/// request of a few bytes made the answer of every key (a hostile peer's round: 8 MB
/// each, pipelined and never read, took a server to gigabytes).
pub const MAX_LIST: usize = 1000;

/// The most bytes, keys and values together, [`MemoryStore`] holds: past it a `Put` or
/// `Increment` of a new key fails `RESOURCE_EXHAUSTED` (the store is reachable by
/// every client of a server, `rpc-server`'s included). Each entry counts
/// [`ENTRY_COST`] bytes besides its key and value.
pub const MAX_STORE_BYTES: usize = 256 << 20;

/// What an entry costs [`MemoryStore`] besides its key's and value's bytes (the key's
/// and the value's allocations, and the map's node share), counted against
/// [`MAX_STORE_BYTES`]: 300,000 empty values under 8-byte keys counted 2.3 MiB and
/// took 25 MiB (a hostile peer's round).
pub const ENTRY_COST: usize = 96;

/// An in-memory `KeyValue` store of at most [`MAX_STORE_BYTES`], keys of at most
/// [`MAX_KEY_LEN`]. Clones share the data.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    data: Arc<Mutex<Store>>,
}

#[derive(Debug, Default)]
struct Store {
    map: BTreeMap<String, Bytes>,
    /// Keys' and values' bytes.
    bytes: usize,
}

impl Store {
    /// Puts `value` under `key` if the store has room for it.
    fn insert(&mut self, key: String, value: Bytes) -> Result<(), Status> {
        let old = self.map.get(&key).map_or(0, |v| cost(&key, v));
        let new = cost(&key, &value);
        if self.bytes - old + new > MAX_STORE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "the store is full ({MAX_STORE_BYTES} bytes of keys, values and entries)"
            )));
        }
        self.bytes = self.bytes - old + new;
        self.map.insert(key, value);
        Ok(())
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.map.remove(key) {
            Some(value) => {
                self.bytes -= cost(key, &value);
                true
            }
            None => false,
        }
    }
}

/// What an entry counts against [`MAX_STORE_BYTES`].
fn cost(key: &str, value: &[u8]) -> usize {
    key.len() + value.len() + ENTRY_COST
}

impl MemoryStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        // A handler that panicked while holding the lock left the map consistent (every
        // operation is a single map call), so poisoning is ignored.
        self.data.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Refuses a key longer than [`MAX_KEY_LEN`].
fn check_key(key: &str) -> Result<(), Status> {
    if key.len() > MAX_KEY_LEN {
        return Err(Status::invalid_argument(format!(
            "a key of {} bytes: at most {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(())
}

impl key_value_server::KeyValue for MemoryStore {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetReply>, Status> {
        let key = &request.get_ref().key;
        // Checked here too: the NOT_FOUND below quotes the key (a 16 MB one made a 16 MB
        // status message, a hostile peer's round).
        check_key(key)?;
        match self.lock().map.get(key) {
            Some(value) => Ok(Response::new(GetReply {
                value: value.clone(),
            })),
            None => Err(Status::not_found(format!("no key {key:?}"))),
        }
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutReply>, Status> {
        let PutRequest { key, value } = request.into_inner();
        check_key(&key)?;
        // A copy: the decoded value is a slice of the request's frame, which it would
        // keep whole in the store (a byte stored from a 16 MiB request held 16 MiB).
        self.lock().insert(key, Bytes::copy_from_slice(&value))?;
        Ok(Response::new(PutReply {}))
    }

    async fn delete(
        &self,
        request: Request<DeleteRequest>,
    ) -> Result<Response<DeleteReply>, Status> {
        let key = &request.get_ref().key;
        check_key(key)?;
        let existed = self.lock().remove(key);
        Ok(Response::new(DeleteReply { existed }))
    }

    async fn increment(
        &self,
        request: Request<IncrementRequest>,
    ) -> Result<Response<IncrementReply>, Status> {
        let IncrementRequest { key, delta } = request.into_inner();
        check_key(&key)?;
        let mut data = self.lock();
        let current = match data.map.get(&key) {
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
        data.insert(key, Bytes::from(value.to_string()))?;
        Ok(Response::new(IncrementReply { value }))
    }

    async fn list(&self, request: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        let ListRequest { prefix, limit } = request.into_inner();
        let limit = match limit as usize {
            0 => MAX_LIST,
            limit => limit.min(MAX_LIST),
        };
        let keys = self
            .lock()
            .map
            .range(prefix.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&prefix))
            .take(limit)
            .cloned()
            .collect();
        Ok(Response::new(ListReply { keys }))
    }
}

#[cfg(test)]
mod tests {
    use super::{key_value_server::KeyValue, *};

    fn put(key: &str, value: &[u8]) -> Request<PutRequest> {
        Request::new(PutRequest {
            key: key.into(),
            value: Bytes::copy_from_slice(value),
        })
    }

    /// The example store's bounds (a hostile peer's round): a `List` answers at most
    /// `MAX_LIST` keys, keys are at most `MAX_KEY_LEN` bytes, the store at most
    /// `MAX_STORE_BYTES`, and a stored value does not keep its request's buffer.
    #[tokio::test]
    async fn the_store_is_bounded() {
        let store = MemoryStore::default();
        for i in 0..MAX_LIST + 5 {
            store.put(put(&format!("k{i:05}"), b"v")).await.unwrap();
        }
        for limit in [0, 2_000] {
            let reply = store
                .list(Request::new(ListRequest {
                    prefix: "k".into(),
                    limit,
                }))
                .await
                .unwrap();
            assert_eq!(reply.get_ref().keys.len(), MAX_LIST, "limit {limit}");
        }
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let err = store.put(put(&long, b"v")).await.unwrap_err();
        assert_eq!(err.code(), rpc_core::Code::INVALID_ARGUMENT);
        let err = store
            .increment(Request::new(IncrementRequest {
                key: long,
                delta: 1,
            }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), rpc_core::Code::INVALID_ARGUMENT);

        // Full: a new key is refused, a smaller value for a key there is taken.
        store.lock().bytes = MAX_STORE_BYTES - 10;
        let err = store.put(put("big", &[0; 64])).await.unwrap_err();
        assert_eq!(err.code(), rpc_core::Code::RESOURCE_EXHAUSTED);
        store.put(put("k00000", b"")).await.unwrap();
        store
            .delete(Request::new(DeleteRequest {
                key: "k00001".into(),
            }))
            .await
            .unwrap();
        assert_eq!(
            store.lock().bytes,
            MAX_STORE_BYTES - 10 - 1 - 7 - ENTRY_COST
        );
        // Each entry counts its cost beside its bytes: empty values under short keys
        // took ten times what they counted.
        let fresh = MemoryStore::default();
        fresh.put(put("a", b"")).await.unwrap();
        assert_eq!(fresh.lock().bytes, 1 + ENTRY_COST);
        // A long key is refused by Get and Delete too (a NOT_FOUND quoted it whole).
        let long = "x".repeat(MAX_KEY_LEN + 1);
        let err = store
            .get(Request::new(GetRequest { key: long.clone() }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), rpc_core::Code::INVALID_ARGUMENT);
        assert!(err.message().len() < 100, "{}", err.message().len());
        let err = store
            .delete(Request::new(DeleteRequest { key: long }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), rpc_core::Code::INVALID_ARGUMENT);

        // A value is stored as a copy, not as a slice of the request's buffer.
        let frame = Bytes::from(vec![9u8; 1 << 20]);
        let value = frame.slice(10..11);
        store
            .put(Request::new(PutRequest {
                key: "small".into(),
                value,
            }))
            .await
            .unwrap();
        let stored = store
            .get(Request::new(GetRequest {
                key: "small".into(),
            }))
            .await
            .unwrap()
            .into_inner()
            .value;
        let inside = frame.as_ptr_range().contains(&stored.as_ptr());
        assert!(!inside, "the stored byte keeps its 1 MiB request buffer");
    }
}
