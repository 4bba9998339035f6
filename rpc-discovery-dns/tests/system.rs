//! The system's configuration (`nameservers: None`). Only `localhost` is looked up:
//! `/etc/hosts` and hickory's rule that `localhost` is the loopback address answer
//! it, so no query leaves the machine.

mod support;

use rpc_discovery_dns::{DnsConfig, DnsResolver};
use support::Follower;

#[tokio::test]
async fn localhost_resolves_with_the_system_configuration() {
    let resolver = DnsResolver::new(DnsConfig::default()).unwrap();
    let mut follower = Follower::start(&resolver, "dns://localhost:7000");
    let batch = follower.batch().await;
    assert!(batch.contains("+tcp://127.0.0.1:7000"), "{batch:?}");
    assert!(
        batch
            .iter()
            .all(|c| c.starts_with("+tcp://") && c.ends_with(":7000")),
        "{batch:?}"
    );
}
