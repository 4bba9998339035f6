//! A hash map keyed by call id, with a hasher made for ids.
//!
//! SipHash costs more than the rest of a table lookup, and call ids are usually
//! sequential. The mixer below is splitmix64's bijective finalizer: cheap, and it spreads
//! sequential and strided ids over the table. On the server the ids are chosen by the
//! client, so a hostile client could aim them at one bucket; the server's map holds at
//! most `max_concurrent_requests` entries, which bounds what that can cost.

use std::{
    collections::{HashMap, HashSet},
    hash::{BuildHasherDefault, Hasher},
};

/// A hasher for call ids and other integer ids (HTTP/2 stream identifiers): the key
/// itself, mixed by splitmix64's finalizer at [`Hasher::finish`]. For maps whose keys
/// a peer may choose only where the map's size is bounded (see the module's docs).
/// Links use it as [`crate::link::IdHasher`].
///
/// ```
/// use std::{collections::HashMap, hash::BuildHasherDefault};
/// use rpc_core::link::IdHasher;
/// let mut streams: HashMap<u32, &str, BuildHasherDefault<IdHasher>> = HashMap::default();
/// streams.insert(1, "first");
/// assert_eq!(streams.get(&1), Some(&"first"));
/// ```
#[derive(Default, Clone, Copy, Debug)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u32(&mut self, id: u32) {
        self.0 = u64::from(id);
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

/// A map from call id to `V`.
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

/// A set of call ids.
pub(crate) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;
