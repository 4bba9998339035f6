//! The region table: which regions of this side the peer may access, in a memfd
//! that a peer on the same host maps read-only, so that it can check a remote key,
//! bounds and rights itself before it copies with cross-memory attach, while this
//! side runs no code.
//!
//! # Layout (all words native-endian `u64`, accessed atomically)
//!
//! ```text
//! header, 128 bytes:   0 magic "RPCRDMA1"   8 nonce   16 capacity
//!                      64 lane: this side's one-sided operations on the PEER's memory
//!                         (odd while one is running)
//! entry i at 128 + 32 i:  0 state = generation << 32 | read << 1 | write << 2 | valid
//!                         8 address   16 length   24 unused
//! ```
//!
//! A remote key is `generation << 32 | index`. A key whose generation is older than
//! the entry's, or equal to it on an invalid entry, was revoked; a newer one, or an
//! index past the table, is unknown. Each slot's first generation is random, so that
//! a key of another table (another connection's) does not name a region of this one.
//!
//! # Revocation without a check-then-use window
//!
//! The requester increments its lane (to an odd value), checks the entry, copies,
//! and increments the lane again. The owner, deregistering, stores the invalid state
//! and then loads the requester's lane, both sequentially consistent: either the
//! requester's check sees the invalid entry, or the owner sees the odd lane, and
//! then keeps the memory (quarantined, not freed or reused) until the lane moves on.
//! So a well-behaved peer never touches memory after its region is gone. A peer
//! that can attach to our memory at all can of course write anywhere in it: the
//! table protects against mistakes (stale descriptors, wrong offsets), not against
//! a hostile process of the same user.

use std::{
    fs::File,
    sync::{
        atomic::{fence, AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use rpc_core::{Error, ErrorKind};

use super::{memory::Mem, sys};
use crate::provider::{Access, Refusal, Refused, RegionDesc};

const MAGIC: u64 = u64::from_be_bytes(*b"RPCRDMA1");
const HEADER_LEN: usize = 128;
const ENTRY_LEN: usize = 32;
const OFF_NONCE: usize = 8;
const OFF_CAPACITY: usize = 16;
const OFF_LANE: usize = 64;
const VALID: u64 = 1;
/// The most entries a peer's table may announce: `RdmaConfig::max_regions` allows no
/// more, and a larger claim would only map a larger (peer-sized) file.
const MAX_PEER_CAPACITY: u32 = 1 << 20;

/// Bytes of a table with `capacity` entries.
pub(crate) fn table_len(capacity: u32) -> usize {
    HEADER_LEN + ENTRY_LEN * capacity as usize
}

fn state(generation: u32, access: Access, valid: bool) -> u64 {
    (u64::from(generation) << 32) | (u64::from(access.bits()) << 1) | u64::from(valid)
}

fn split_key(key: u64) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

/// Why an access was refused. Travels as a status byte in the responder's replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reject {
    UnknownKey,
    Revoked,
    OutOfBounds,
    Denied,
}

impl Reject {
    pub(crate) fn code(self) -> u8 {
        match self {
            Reject::UnknownKey => 1,
            Reject::Revoked => 2,
            Reject::OutOfBounds => 3,
            Reject::Denied => 4,
        }
    }

    pub(crate) fn from_code(code: u8) -> Reject {
        match code {
            2 => Reject::Revoked,
            3 => Reject::OutOfBounds,
            4 => Reject::Denied,
            _ => Reject::UnknownKey,
        }
    }

    /// The error the requester sees: of kind `Protocol`, with the typed reason
    /// ([`Refusal::of`](crate::provider::Refusal::of)).
    pub(crate) fn error(self, key: u64, offset: u64, len: usize, want: Access) -> Error {
        let reason = match self {
            Reject::UnknownKey => Refusal::UnknownKey,
            Reject::Revoked => Refusal::Revoked,
            Reject::OutOfBounds => Refusal::OutOfBounds,
            Reject::Denied => Refusal::Denied,
        };
        let detail = match self {
            Reject::UnknownKey => format!("unknown remote key {key:#x}"),
            Reject::Revoked => {
                format!("remote key {key:#x} was revoked (the region was deregistered)")
            }
            Reject::OutOfBounds => format!(
                "remote access out of bounds: {len} bytes at offset {offset} do not fit the \
                 region of key {key:#x}"
            ),
            Reject::Denied => format!(
                "remote {} access denied: the region of key {key:#x} does not grant it",
                if want.contains(Access::WRITE) {
                    "write"
                } else {
                    "read"
                }
            ),
        };
        Refused::error(reason, detail)
    }
}

fn check(
    key: u64,
    state_word: u64,
    region_len: u64,
    offset: u64,
    len: usize,
    want: Access,
) -> Result<(), Reject> {
    let (key_gen, _) = split_key(key);
    let entry_gen = (state_word >> 32) as u32;
    let valid = state_word & VALID != 0;
    if key_gen == 0 || key_gen > entry_gen {
        return Err(Reject::UnknownKey);
    }
    if key_gen < entry_gen || !valid {
        return Err(Reject::Revoked);
    }
    let granted = Access::from_bits((state_word >> 1) as u8);
    if !granted.contains(want) {
        return Err(Reject::Denied);
    }
    if offset
        .checked_add(len as u64)
        .is_none_or(|end| end > region_len)
    {
        return Err(Reject::OutOfBounds);
    }
    Ok(())
}

struct Slot {
    generation: u32,
    /// What the region grants (the table's copy is for the peer to read).
    access: Access,
    mem: Option<Arc<Mem>>,
}

/// This side's table: the memfd the peer maps, and the memory behind each entry.
pub(crate) struct LocalTable {
    file: File,
    map: sys::Mapping,
    capacity: u32,
    nonce: u64,
    slots: Mutex<Slots>,
}

struct Slots {
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
}

impl LocalTable {
    pub(crate) fn new(capacity: u32) -> Result<LocalTable, Error> {
        let len = table_len(capacity);
        let file = sys::memfd(c"rpc-rdma-regions", len)
            .map_err(|e| Error::io("create the region table (memfd_create)", e))?;
        let map = sys::Mapping::map(&file, len, true)
            .map_err(|e| Error::io("map the region table", e))?;
        // Ours to write alone from now on: a process of the same user may open the
        // file through /proc, but no longer map it writable.
        sys::seal_writes(&file).map_err(|e| Error::io("seal the region table", e))?;
        let nonce = sys::random_u64();
        map.atomic_at(0).store(MAGIC, Ordering::Relaxed);
        map.atomic_at(OFF_NONCE).store(nonce, Ordering::Relaxed);
        map.atomic_at(OFF_CAPACITY)
            .store(u64::from(capacity), Ordering::Release);
        Ok(LocalTable {
            file,
            map,
            capacity,
            nonce,
            slots: Mutex::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
                live: 0,
            }),
        })
    }

    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    pub(crate) fn nonce(&self) -> u64 {
        self.nonce
    }

    pub(crate) fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Regions registered now.
    pub(crate) fn live(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).live
    }

    /// Our lane, counting our one-sided operations on the peer's memory.
    pub(crate) fn lane(&self) -> &AtomicU64 {
        self.map.atomic_at(OFF_LANE)
    }

    fn entry(&self, index: u32, word: usize) -> &AtomicU64 {
        self.map
            .atomic_at(HEADER_LEN + ENTRY_LEN * index as usize + 8 * word)
    }

    /// Registers `mem` with `access`; fails when the table is full.
    pub(crate) fn register(&self, mem: Arc<Mem>, access: Access) -> Result<RegionDesc, Error> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let index = match slots.free.pop() {
            Some(index) => index,
            None if slots.slots.len() < self.capacity as usize => {
                slots.slots.push(Slot {
                    // A random first generation (below 2^31, far from wrapping): a key
                    // of another connection's table, whose first regions have the same
                    // indexes, is unknown here rather than naming our region of that
                    // index (a stale descriptor after a reconnection).
                    generation: (sys::random_u64() as u32) >> 1,
                    access: Access::NONE,
                    mem: None,
                });
                (slots.slots.len() - 1) as u32
            }
            None => {
                return Err(Error::new(
                    ErrorKind::LimitReached,
                    format!(
                        "region table full: {} regions registered on this connection \
                         (raise max_regions)",
                        self.capacity
                    ),
                ))
            }
        };
        let slot = &mut slots.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1).max(1);
        let generation = slot.generation;
        let (addr, len) = (mem.addr(), mem.len() as u64);
        slot.mem = Some(mem);
        slot.access = access;
        slots.live += 1;
        // The entry is invalid now; readers that saw the old state will see a new one.
        fence(Ordering::Release);
        self.entry(index, 1).store(addr, Ordering::Relaxed);
        self.entry(index, 2).store(len, Ordering::Relaxed);
        self.entry(index, 0)
            .store(state(generation, access, true), Ordering::SeqCst);
        Ok(RegionDesc {
            key: (u64::from(generation) << 32) | u64::from(index),
            addr,
            len,
            access,
        })
    }

    /// Invalidates the entry of `key` and hands back its memory. The caller must then
    /// look at the peer's lane (see the module docs) before the memory is reused.
    pub(crate) fn deregister(&self, key: u64) -> Option<Arc<Mem>> {
        let (generation, index) = split_key(key);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let slot = slots.slots.get_mut(index as usize)?;
        if slot.generation != generation || slot.mem.is_none() {
            return None;
        }
        let mem = slot.mem.take();
        self.entry(index, 0)
            .store(state(generation, Access::NONE, false), Ordering::SeqCst);
        slots.free.push(index);
        slots.live -= 1;
        mem
    }

    /// The memory behind `key` if it grants `want` over `[offset, offset + len)`: the
    /// responder's check. It reads this side's own records, never the shared table,
    /// which another process of the same user could have written (sealed against
    /// that where the kernel can).
    pub(crate) fn lookup(
        &self,
        key: u64,
        offset: u64,
        len: usize,
        want: Access,
    ) -> Result<Arc<Mem>, Reject> {
        let (_, index) = split_key(key);
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = slots.slots.get(index as usize) else {
            return Err(Reject::UnknownKey);
        };
        let (word, region_len) = match &slot.mem {
            Some(mem) => (state(slot.generation, slot.access, true), mem.len() as u64),
            None => (state(slot.generation, Access::NONE, false), 0),
        };
        check(key, word, region_len, offset, len, want)?;
        slot.mem.clone().ok_or(Reject::Revoked)
    }
}

/// The peer's table, mapped read-only.
pub(crate) struct PeerTable {
    map: sys::Mapping,
    capacity: u32,
}

impl PeerTable {
    /// Opens the peer's table through `/proc/<pid>/fd/<fd>` (allowed to processes that
    /// may attach to the peer, the same permission cross-memory attach needs) and
    /// checks that it is the table the peer announced (`nonce`).
    pub(crate) fn open(pid: i32, fd: i32, capacity: u32, nonce: u64) -> std::io::Result<PeerTable> {
        use std::os::unix::fs::OpenOptionsExt;
        if capacity > MAX_PEER_CAPACITY {
            return Err(std::io::Error::other(format!(
                "the peer announces a region table of {capacity} entries (at most \
                 {MAX_PEER_CAPACITY})"
            )));
        }
        // Non-blocking: a peer naming a FIFO must not hang the handshake; and never
        // a controlling terminal, should the peer name one.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(format!("/proc/{pid}/fd/{fd}"))?;
        let len = table_len(capacity);
        if !file.metadata()?.is_file() {
            return Err(std::io::Error::other(
                "the peer's region table is not a file",
            ));
        }
        // A table that could shrink under our mapping would crash us (SIGBUS). The seal
        // is checked before the length: checked after, a peer that shrank the file and
        // then sealed it in between had us map past its end.
        if !sys::cannot_shrink(&file) {
            return Err(std::io::Error::other(
                "the peer's region table is not sealed against shrinking",
            ));
        }
        if file.metadata()?.len() < len as u64 {
            return Err(std::io::Error::other(
                "the peer's region table is too short",
            ));
        }
        let map = sys::Mapping::map(&file, len, false)?;
        let ok = map.atomic_at(0).load(Ordering::Acquire) == MAGIC
            && map.atomic_at(OFF_NONCE).load(Ordering::Acquire) == nonce
            && map.atomic_at(OFF_CAPACITY).load(Ordering::Acquire) == u64::from(capacity);
        if !ok {
            return Err(std::io::Error::other(
                "the file is not the region table the peer announced",
            ));
        }
        Ok(PeerTable { map, capacity })
    }

    /// The peer's lane (its one-sided operations on our memory).
    pub(crate) fn lane(&self) -> u64 {
        self.map.atomic_at(OFF_LANE).load(Ordering::SeqCst)
    }

    /// Checks an access to the peer's memory against its table; the address to copy
    /// at. Call between the two increments of our lane.
    pub(crate) fn check(
        &self,
        key: u64,
        offset: u64,
        len: usize,
        want: Access,
    ) -> Result<u64, Reject> {
        let (_, index) = split_key(key);
        if index >= self.capacity {
            return Err(Reject::UnknownKey);
        }
        let base = HEADER_LEN + ENTRY_LEN * index as usize;
        let s1 = self.map.atomic_at(base).load(Ordering::SeqCst);
        let addr = self.map.atomic_at(base + 8).load(Ordering::Relaxed);
        let region_len = self.map.atomic_at(base + 16).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let s2 = self.map.atomic_at(base).load(Ordering::Relaxed);
        if s1 != s2 {
            // Changed while we read it: it was deregistered.
            return Err(Reject::Revoked);
        }
        check(key, s1, region_len, offset, len, want)?;
        // The address is the peer's word: a range that wraps past u64::MAX is refused.
        addr.checked_add(offset)
            .filter(|at| at.checked_add(len as u64).is_some())
            .ok_or(Reject::OutOfBounds)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    /// The responder checks a request against its own record of the region, not the
    /// shared table, which another process of the same user could open through /proc
    /// and rewrite. (A hostile-peer round set an entry's length to u64::MAX and read
    /// past the region: a panic, or, with an offset near 2^64 wrapping a sum in a
    /// release build, a read of other memory.) The table is sealed against that too.
    #[test]
    fn the_responder_trusts_its_own_records_not_the_shared_table() {
        let table = LocalTable::new(4).unwrap();
        let mem = Arc::new(Mem::Shared(Bytes::from(vec![1u8; 100])));
        let desc = table.register(mem, Access::READ).unwrap();
        let index = desc.key as u32;
        table.entry(index, 2).store(u64::MAX, Ordering::Relaxed);
        table.entry(index, 0).store(
            state((desc.key >> 32) as u32, Access::READ | Access::WRITE, true),
            Ordering::SeqCst,
        );
        assert_eq!(
            table.lookup(desc.key, 64, 100, Access::READ).err(),
            Some(Reject::OutOfBounds)
        );
        assert_eq!(
            table.lookup(desc.key, 0, 1, Access::WRITE).err(),
            Some(Reject::Denied)
        );
        assert!(table.lookup(desc.key, 0, 100, Access::READ).is_ok());
        // Nobody else may write the file: not through a new writable mapping.
        #[allow(unsafe_code)]
        // SAFETY: fcntl on an open descriptor, no argument.
        let seals = unsafe { libc::fcntl(table.file().as_raw_fd(), libc::F_GET_SEALS) };
        assert_ne!(seals & libc::F_SEAL_FUTURE_WRITE, 0, "seals {seals:#x}");
        assert!(sys::Mapping::map(table.file(), table_len(4), true).is_err());
    }

    #[test]
    fn keys_bounds_rights_and_revocation_are_checked_by_both_sides() {
        let table = LocalTable::new(4).unwrap();
        let peer = PeerTable::open(
            sys::pid(),
            table.file().as_raw_fd(),
            table.capacity(),
            table.nonce(),
        )
        .unwrap();
        let mem = Arc::new(Mem::Shared(Bytes::from_static(b"0123456789")));
        let desc = table.register(mem, Access::READ).unwrap();
        assert_eq!(desc.len, 10);
        assert_eq!(peer.check(desc.key, 2, 8, Access::READ), Ok(desc.addr + 2));
        assert!(table.lookup(desc.key, 2, 8, Access::READ).is_ok());
        for (key, offset, len, want, reject) in [
            (desc.key, 3, 8, Access::READ, Reject::OutOfBounds),
            (desc.key, u64::MAX, 2, Access::READ, Reject::OutOfBounds),
            (desc.key, 0, 1, Access::WRITE, Reject::Denied),
            (desc.key + (1 << 32), 0, 1, Access::READ, Reject::UnknownKey),
            (desc.key + 1, 0, 1, Access::READ, Reject::UnknownKey),
            (desc.key + 9, 0, 1, Access::READ, Reject::UnknownKey),
            (
                desc.key & 0xffff_ffff,
                0,
                1,
                Access::READ,
                Reject::UnknownKey,
            ),
        ] {
            assert_eq!(peer.check(key, offset, len, want), Err(reject), "{key:#x}");
            assert_eq!(table.lookup(key, offset, len, want).err(), Some(reject));
        }
        assert!(table.deregister(desc.key).is_some());
        assert!(table.deregister(desc.key).is_none(), "only once");
        assert_eq!(
            peer.check(desc.key, 0, 1, Access::READ),
            Err(Reject::Revoked)
        );
        // The slot is reused with a new generation; the old key stays revoked.
        let again = table
            .register(
                Arc::new(Mem::Shared(Bytes::from_static(b"x"))),
                Access::READ,
            )
            .unwrap();
        assert_eq!(again.key & 0xffff_ffff, desc.key & 0xffff_ffff);
        assert_eq!(
            peer.check(desc.key, 0, 1, Access::READ),
            Err(Reject::Revoked)
        );
        assert!(peer.check(again.key, 0, 1, Access::READ).is_ok());
    }

    /// A table as a (possibly hostile) peer might lay it out: a memfd of `file_len`
    /// bytes with the header words given, mapped writable so the test can forge
    /// entries. Returns the file (which the peer table is opened through) and the map.
    fn forged(file_len: usize, magic: u64, nonce: u64, capacity: u64) -> (File, sys::Mapping) {
        let file = sys::memfd(c"forged-table", file_len).unwrap();
        let map = sys::Mapping::map(&file, file_len, true).unwrap();
        map.atomic_at(0).store(magic, Ordering::SeqCst);
        map.atomic_at(OFF_NONCE).store(nonce, Ordering::SeqCst);
        map.atomic_at(OFF_CAPACITY)
            .store(capacity, Ordering::SeqCst);
        (file, map)
    }

    /// The announced table in an ordinary file, whose size the peer could change under
    /// our mapping.
    fn unsealed(file_len: usize, nonce: u64, capacity: u64) -> File {
        let path = std::env::temp_dir().join(format!("rpc-rdma-unsealed-{}", sys::pid()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        file.set_len(file_len as u64).unwrap();
        let map = sys::Mapping::map(&file, file_len, true).unwrap();
        map.atomic_at(0).store(MAGIC, Ordering::SeqCst);
        map.atomic_at(OFF_NONCE).store(nonce, Ordering::SeqCst);
        map.atomic_at(OFF_CAPACITY)
            .store(capacity, Ordering::SeqCst);
        file
    }

    fn open(file: &File, capacity: u32, nonce: u64) -> std::io::Result<PeerTable> {
        PeerTable::open(sys::pid(), file.as_raw_fd(), capacity, nonce)
    }

    #[test]
    fn a_table_that_is_not_the_announced_one_is_refused() {
        let len = table_len(4);
        let (good, _map) = forged(len, MAGIC, 7, 4);
        assert!(open(&good, 4, 7).is_ok());
        for (what, result) in [
            ("wrong nonce", open(&good, 4, 8)),
            ("wrong capacity", open(&good, 3, 7)),
            ("longer than the file", open(&good, 5, 7)),
            ("wrong magic", open(&forged(len, 1, 7, 4).0, 4, 7)),
            ("too short", open(&forged(64, MAGIC, 7, 4).0, 4, 7)),
            (
                "not sealed against shrinking",
                open(&unsealed(len, 7, 4), 4, 7),
            ),
            (
                "not a descriptor of the peer",
                PeerTable::open(sys::pid(), -1, 4, 7),
            ),
            (
                "a pid that names nobody",
                PeerTable::open(-1, good.as_raw_fd(), 4, 7),
            ),
        ] {
            assert!(result.is_err(), "{what}");
        }
        // A claim past what any peer may configure is refused before the file is
        // looked at (it would map up to 128 GiB of the peer's choosing).
        for capacity in [MAX_PEER_CAPACITY + 1, u32::MAX] {
            let err = open(&good, capacity, 7).err().expect("refused");
            assert!(err.to_string().contains("entries"), "{err}");
        }
    }

    #[test]
    fn an_address_that_would_wrap_is_out_of_bounds() {
        // The peer's entry says: a valid readable region of 16 bytes at the very end
        // of the address space. Adding the offset used to overflow (a panic in debug
        // builds, a wrapped address in release).
        let (file, map) = forged(table_len(1), MAGIC, 3, 1);
        let base = HEADER_LEN;
        map.atomic_at(base)
            .store(state(1, Access::READ, true), Ordering::SeqCst);
        map.atomic_at(base + 8)
            .store(u64::MAX - 3, Ordering::SeqCst);
        map.atomic_at(base + 16).store(16, Ordering::SeqCst);
        let peer = open(&file, 1, 3).unwrap();
        let key = 1 << 32;
        assert_eq!(peer.check(key, 0, 3, Access::READ), Ok(u64::MAX - 3));
        for (offset, len) in [(0, 4), (4, 1), (8, 8), (15, 1)] {
            assert_eq!(
                peer.check(key, offset, len, Access::READ),
                Err(Reject::OutOfBounds),
                "{offset} + {len}"
            );
        }
    }

    proptest! {
        /// Whatever the peer writes into its entries, a check never panics (nor wraps
        /// an address), and an access it allows lies inside the entry's region.
        #[test]
        fn forged_entries_never_panic_the_check(
            entries in proptest::collection::vec((state_word(), edge(), edge()), 4),
            key_index in 0u64..6,
            key_generation in prop_oneof![Just(1u64), 0u64..4, any::<u32>().prop_map(u64::from)],
            offset in edge(),
            len in prop_oneof![0usize..64, any::<usize>()],
            want in 0u8..4,
        ) {
            let capacity = 4u32;
            let (file, map) = forged(table_len(capacity), MAGIC, 9, u64::from(capacity));
            for (i, (state, addr, region_len)) in entries.iter().enumerate() {
                let base = HEADER_LEN + ENTRY_LEN * i;
                map.atomic_at(base).store(*state, Ordering::SeqCst);
                map.atomic_at(base + 8).store(*addr, Ordering::SeqCst);
                map.atomic_at(base + 16).store(*region_len, Ordering::SeqCst);
            }
            let peer = open(&file, capacity, 9).unwrap();
            let key = (key_generation << 32) | key_index;
            let want = Access::from_bits(want);
            if let Ok(at) = peer.check(key, offset, len, want) {
                let (state, addr, region_len) = entries[key_index as usize];
                prop_assert!(state & VALID != 0);
                prop_assert_eq!(state >> 32, key_generation);
                prop_assert!(Access::from_bits((state >> 1) as u8).contains(want));
                let end = offset.checked_add(len as u64);
                prop_assert!(end.is_some_and(|end| end <= region_len));
                prop_assert_eq!(Some(at), addr.checked_add(offset));
                prop_assert!(at.checked_add(len as u64).is_some());
            }
        }

        /// The responder's check of a key the peer sent against this side's table.
        #[test]
        fn arbitrary_keys_are_checked_by_the_responder(
            // Arbitrary, or near a registered one (its generation give or take one,
            // another index): first generations are random, so keys built from small
            // generations would never be found.
            key in prop_oneof![
                any::<u64>().prop_map(Err),
                (0usize..2, -1i64..=1, 0u64..4).prop_map(Ok),
            ],
            offset in edge(),
            len in prop_oneof![0usize..16, any::<usize>()],
            write in any::<bool>(),
        ) {
            let table = LocalTable::new(4).unwrap();
            let mem = || Arc::new(Mem::Shared(Bytes::from_static(b"0123456789")));
            let a = table.register(mem(), Access::READ).unwrap();
            let b = table.register(mem(), Access::READ_WRITE).unwrap();
            let key = match key {
                Err(key) => key,
                Ok((which, generation, index)) => {
                    let near = [a.key, b.key][which];
                    let generation = ((near >> 32) as i64 + generation) as u64 & 0xffff_ffff;
                    (generation << 32) | index
                }
            };
            let want = if write { Access::WRITE } else { Access::READ };
            if let Ok(found) = table.lookup(key, offset, len, want) {
                prop_assert!(key == a.key || key == b.key);
                prop_assert!(offset.checked_add(len as u64).is_some_and(|end| end <= 10));
                prop_assert_eq!(found.len(), 10);
            }
        }
    }

    /// An entry's state word: arbitrary, or one of the few generations and rights
    /// the keys name (so that checks also pass).
    fn state_word() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            (0u64..4, 0u64..8).prop_map(|(generation, bits)| (generation << 32) | bits),
        ]
    }

    fn edge() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(10),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX - 1),
            Just(u64::MAX),
            any::<u64>(),
        ]
    }

    #[test]
    fn a_full_table_is_a_clear_error() {
        let table = LocalTable::new(1).unwrap();
        let mem = || Arc::new(Mem::Shared(Bytes::from_static(b"x")));
        table.register(mem(), Access::READ).unwrap();
        let err = table.register(mem(), Access::READ).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LimitReached);
        assert!(err.to_string().contains("max_regions"), "{err}");
    }
}
