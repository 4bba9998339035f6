//! [`SourceSlots`]: connection setups in progress per source address, so that one
//! host cannot take every setup slot of a listener.
//!
//! A listener runs a bounded number of setups (TLS handshakes, the soft RDMA
//! provider's exchange) at once, each cut off at a timeout. Without a share per
//! source, one host that opens connections and says nothing holds every slot (1,024
//! slots and a 10 s timeout: about 100 connections a second) and no other client gets
//! in. Here each source runs at most its share of setups at once; its further
//! connections wait their turn (within their own setup timeout) up to a bound, past
//! which they are closed. A burst of connections from one well-behaved host (a pool
//! opening, a thousand clients behind one address) is served in turn; a stalling host
//! delays only itself. A source is an IPv4 address or an IPv6 /64 (a host usually owns
//! a whole /64); over a Unix socket, the peer's user id ([`SourceSlots::admit_uid`]:
//! one local process could fill the listener's every slot; from a review), or nothing
//! when the credentials cannot be read.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Setups per source: at most `running` at once and `admitted` in all (running and
/// waiting); clones share the counts.
#[derive(Clone, Debug)]
pub struct SourceSlots {
    sources: Arc<Mutex<HashMap<u128, Source>>>,
    running: usize,
    admitted: usize,
}

#[derive(Debug)]
struct Source {
    admitted: usize,
    running: Arc<Semaphore>,
}

/// One admitted setup: wait for [`turn`](Self::turn), then run it; its place is given
/// back when this is dropped.
#[derive(Debug)]
pub struct SourceSlot {
    slots: SourceSlots,
    /// `None` for a Unix-socket peer (not counted).
    source: Option<(u128, Arc<Semaphore>)>,
}

/// A setup's turn to run (see [`SourceSlot::turn`]).
#[derive(Debug)]
pub struct Turn(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

impl SourceSlots {
    /// At most `running` setups at once from one source, and `admitted` (at least
    /// `running`) running or waiting.
    pub fn new(running: usize, admitted: usize) -> SourceSlots {
        let running = running.max(1);
        SourceSlots {
            sources: Arc::default(),
            running,
            admitted: admitted.max(running),
        }
    }

    /// A place for a setup from `peer` (`None`: a Unix-socket peer, always given
    /// one), or `None` if its source has as many admitted as it may.
    pub fn admit(&self, peer: Option<SocketAddr>) -> Option<SourceSlot> {
        let Some(peer) = peer else {
            return Some(SourceSlot {
                slots: self.clone(),
                source: None,
            });
        };
        self.admit_key(source_key(peer.ip()))
    }

    fn admit_key(&self, key: u128) -> Option<SourceSlot> {
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let source = sources.entry(key).or_insert_with(|| Source {
            admitted: 0,
            running: Arc::new(Semaphore::new(self.running)),
        });
        if source.admitted >= self.admitted {
            return None;
        }
        source.admitted += 1;
        Some(SourceSlot {
            slots: self.clone(),
            source: Some((key, source.running.clone())),
        })
    }

    /// A place for a setup from the Unix-socket peer of user id `uid` (every process
    /// of one user is one source), or `None` if that user has as many admitted as it
    /// may.
    pub fn admit_uid(&self, uid: u32) -> Option<SourceSlot> {
        self.admit_key(UID_KEY | u128::from(uid))
    }

    /// Setups admitted (running or waiting) from the source of `peer`.
    pub fn admitted(&self, peer: SocketAddr) -> usize {
        let sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        sources
            .get(&source_key(peer.ip()))
            .map_or(0, |source| source.admitted)
    }
}

impl SourceSlot {
    /// Waits until fewer than the share of the source's setups run, and holds the
    /// turn until the returned value is dropped.
    pub async fn turn(&self) -> Turn {
        match &self.source {
            None => Turn(None),
            // The semaphore is never closed.
            Some((_, running)) => Turn(running.clone().acquire_owned().await.ok()),
        }
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let Some((key, _)) = &self.source else { return };
        let mut sources = self.slots.sources.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(source) = sources.get_mut(key) {
            source.admitted -= 1;
            if source.admitted == 0 {
                sources.remove(key);
            }
        }
    }
}

/// An IPv4 address (IPv4-mapped IPv6 ones too), or an IPv6 address's /64.
/// Keys of Unix-socket users: apart from IPv4's (below 2^32) and IPv6's (bit 127).
const UID_KEY: u128 = 1 << 126;

fn source_key(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => u128::from(u32::from(v4)),
            None => (u128::from(v6) & !u128::from(u64::MAX)) | 1 << 127,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(addr: &str) -> Option<SocketAddr> {
        Some(addr.parse().unwrap())
    }

    #[test]
    fn each_source_has_its_share_and_gets_it_back() {
        let slots = SourceSlots::new(1, 2);
        let a = slots.admit(at("10.0.0.1:1000")).unwrap();
        let _b = slots.admit(at("10.0.0.1:1001")).unwrap();
        assert!(
            slots.admit(at("10.0.0.1:1002")).is_none(),
            "a third from one host"
        );
        assert!(
            slots.admit(at("[::ffff:10.0.0.1]:1003")).is_none(),
            "mapped: the same"
        );
        assert!(slots.admit(at("10.0.0.2:1000")).is_some(), "another host");
        let _v6 = slots.admit(at("[2001:db8::1]:1")).unwrap();
        let _v6b = slots.admit(at("[2001:db8::2]:1")).unwrap();
        assert!(slots.admit(at("[2001:db8::3]:1")).is_none(), "one /64");
        assert!(
            slots.admit(at("[2001:db8:0:1::1]:1")).is_some(),
            "another /64"
        );
        for _ in 0..10 {
            assert!(
                slots.admit(None).is_some(),
                "unknown Unix peers are not counted"
            );
        }
        // A Unix-socket user is a source of its own, apart from every address (from a
        // review: one local process filled a tls+unix listener's every slot).
        let _u = slots.admit_uid(1000).unwrap();
        let _u2 = slots.admit_uid(1000).unwrap();
        assert!(slots.admit_uid(1000).is_none(), "a third from one user");
        assert!(slots.admit_uid(1001).is_some(), "another user");
        assert!(
            slots.admit(at("0.0.3.232:1")).is_some(),
            "IPv4 keys are apart"
        );
        drop(a);
        assert_eq!(slots.admitted("10.0.0.1:1".parse().unwrap()), 1);
        assert!(slots.admit(at("10.0.0.1:1004")).is_some(), "given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_runs_its_share_at_once_and_the_rest_in_turn() {
        let slots = SourceSlots::new(2, 10);
        let admitted: Vec<_> = (0..3)
            .map(|i| slots.admit(at(&format!("10.0.0.1:{i}"))).unwrap())
            .collect();
        let first = admitted[0].turn().await;
        let _second = admitted[1].turn().await;
        let third = admitted[2].turn();
        tokio::pin!(third);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut third)
                .await
                .is_err(),
            "a third ran beside two"
        );
        // Another source is not held up.
        let other = slots.admit(at("10.0.0.9:1")).unwrap();
        let _ = other.turn().await;
        drop(first);
        let _third = third.await;
    }
}
