//! Address validation tokens: what a listener sends in RETRY and expects back in HELLO
//! before it gives an address any state (docs/wire.md, "Opening an association").
//!
//! A token is stateless, as QUIC's Retry tokens and DTLS's cookies are: the time it was
//! made and a keyed hash of that time, the peer's address and the client id it was
//! made for, under a key random per listener. Only a peer that receives at the address
//! can echo it, only for that client id, and only for [`TOKEN_LIFETIME`]. The hash is
//! SipHash (std's `DefaultHasher` with the random keys of a `RandomState`): a 64-bit
//! tag an off-path sender cannot compute without the key, which never leaves the
//! process. No cryptographic strength beyond that is claimed, nor needed: a forged
//! token buys one association, which the listener's bounds and eviction contain.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hasher},
    net::SocketAddr,
    time::Duration,
};

use tokio::time::Instant;

use crate::datagram::TOKEN_LEN;

/// How long a token is good for: long enough for a HELLO to go out again after a
/// RETRY over a slow path, short enough that a token seen on the path is soon useless.
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(30);

/// Makes and checks the tokens of one listener.
#[derive(Debug)]
pub(crate) struct Validator {
    key: RandomState,
    epoch: Instant,
}

impl Validator {
    /// A validator with a fresh random key.
    pub(crate) fn new() -> Self {
        Validator {
            key: RandomState::new(),
            epoch: Instant::now(),
        }
    }

    /// Whole seconds since the validator was made, at `now`.
    fn seconds(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_secs()
    }

    fn mac(&self, issued: u64, addr: SocketAddr, client: u64) -> u64 {
        let mut h = self.key.build_hasher();
        h.write_u64(issued);
        match addr {
            SocketAddr::V4(a) => h.write(&a.ip().to_ipv6_mapped().octets()),
            SocketAddr::V6(a) => h.write(&a.ip().octets()),
        }
        h.write_u16(addr.port());
        h.write_u64(client);
        h.finish()
    }

    /// A token for `client` at `addr`, made at `now`: 8 bytes of issue time (seconds
    /// since the validator's start), 8 bytes of keyed hash.
    pub(crate) fn token(&self, addr: SocketAddr, client: u64, now: Instant) -> [u8; TOKEN_LEN] {
        let issued = self.seconds(now);
        let mut token = [0; TOKEN_LEN];
        token[..8].copy_from_slice(&issued.to_be_bytes());
        token[8..].copy_from_slice(&self.mac(issued, addr, client).to_be_bytes());
        token
    }

    /// Whether `token` was made by this validator for `client` at `addr`, at most
    /// [`TOKEN_LIFETIME`] before `now`.
    pub(crate) fn check(
        &self,
        token: &[u8; TOKEN_LEN],
        addr: SocketAddr,
        client: u64,
        now: Instant,
    ) -> bool {
        let issued = u64::from_be_bytes(token[..8].try_into().unwrap_or_default());
        let mac = u64::from_be_bytes(token[8..].try_into().unwrap_or_default());
        let age = self.seconds(now).checked_sub(issued);
        age.is_some_and(|age| age <= TOKEN_LIFETIME.as_secs())
            && mac == self.mac(issued, addr, client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokens_hold_for_their_address_client_and_lifetime_only() {
        let v = Validator::new();
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:4001".parse().unwrap();
        let now = Instant::now();
        let t = v.token(a, 7, now);
        assert!(v.check(&t, a, 7, now));
        assert!(!v.check(&t, b, 7, now), "another port");
        assert!(!v.check(&t, a, 8, now), "another client id");
        assert!(!v.check(&[0; TOKEN_LEN], a, 7, now), "no token");
        let mut forged = t;
        forged[15] ^= 1;
        assert!(!v.check(&forged, a, 7, now));
        assert!(v.check(&t, a, 7, now + TOKEN_LIFETIME));
        assert!(!v.check(&t, a, 7, now + TOKEN_LIFETIME + Duration::from_secs(1)));
        // Another listener's key.
        assert!(!Validator::new().check(&t, a, 7, now));
    }
}
