//! A secured etcd: TLS with client certificates (`--client-cert-auth`) and etcd's
//! own users (`auth enable`). A server registers and a client follows through a
//! [`Cluster`] with TLS settings and a user; the follower goes on after etcd
//! restarts, though etcd has dropped the token it gave it.
//!
//! The test runs an etcd of its own (the `etcd` binary, on ports of its own, with the
//! test certificates of `testdata/tls`). Without the binary it is skipped with a
//! message, except under CI (`CI` set), where that fails it.

#![cfg(feature = "tls")]

use std::{path::Path, process::Stdio, time::Duration};

use futures::StreamExt;
use rpc_core::{balance::Change, client::Channel, Code, Endpoint};
use rpc_discovery_etcd::{
    proto::etcdserverpb::{
        auth_client::AuthClient, kv_client::KvClient, AuthEnableRequest, AuthRoleAddRequest,
        AuthUserAddRequest, AuthUserGrantRoleRequest, RangeRequest,
    },
    Backoff, Cluster,
};
use rpc_transport_grpc::{GrpcConfig, GrpcConnector};
use rpc_transport_tcp::tls::ClientTls;
use tokio::process::{Child, Command};

mod common;

use common::{free_port, have_etcd, TempDir};

/// Bound of each wait: far above what etcd takes to start or a change to arrive.
const PATIENCE: Duration = Duration::from_secs(30);

const ROOT_PASSWORD: &str = "root-secret";

fn testdata(file: &str) -> String {
    format!("{}/../testdata/tls/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// TLS settings that trust the test CA and present the test client certificate.
fn client_tls() -> ClientTls {
    ClientTls::builder()
        .system_roots(false)
        .ca_file(testdata("ca.pem"))
        .identity_files(testdata("client.pem"), testdata("client.key"))
        .build()
        .unwrap()
}

/// An etcd serving clients over TLS only, requiring client certificates, killed
/// when dropped.
struct SecuredEtcd {
    child: Child,
    port: u16,
}

impl SecuredEtcd {
    async fn start(dir: &Path, port: u16, peer_port: u16) -> SecuredEtcd {
        let client = format!("https://127.0.0.1:{port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--name=secured-test")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=secured-test={peer}"))
            .arg(format!("--cert-file={}", testdata("server.pem")))
            .arg(format!("--key-file={}", testdata("server.key")))
            .arg(format!("--trusted-ca-file={}", testdata("ca.pem")))
            .arg("--client-cert-auth")
            // Its tokens go after a second without use (etcd's default: 5 minutes).
            .arg("--auth-token-ttl=1")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start etcd");
        let etcd = SecuredEtcd { child, port };
        let ready = async {
            loop {
                let probe = RangeRequest {
                    key: "ready".into(),
                    ..Default::default()
                };
                match KvClient::new(etcd.channel()).range(probe).await {
                    // Once auth is on, an anonymous range is refused: etcd is up.
                    Ok(_) => return,
                    Err(status) if status.code() != Code::UNAVAILABLE => return,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        };
        if tokio::time::timeout(PATIENCE, ready).await.is_err() {
            let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
            panic!("etcd did not start on {client}:\n{log}");
        }
        etcd
    }

    /// A channel of the test's own to it, over TLS with the client certificate.
    fn channel(&self) -> Channel {
        let address = format!("grpcs://127.0.0.1:{}", self.port).parse().unwrap();
        let connector = GrpcConnector::new(address, GrpcConfig::default()).tls(client_tls());
        Channel::builder().connect_lazy(connector)
    }

    /// Adds the root user and role, and turns authentication on.
    async fn enable_auth(&self) {
        let mut auth = AuthClient::new(self.channel());
        auth.role_add(AuthRoleAddRequest {
            name: "root".into(),
        })
        .await
        .unwrap();
        auth.user_add(AuthUserAddRequest {
            name: "root".into(),
            password: ROOT_PASSWORD.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        auth.user_grant_role(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        })
        .await
        .unwrap();
        auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    }

    async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The endpoints `changes` has inserted and not removed, once it has some.
async fn next_set(
    changes: &mut futures::stream::BoxStream<'static, Change>,
    known: &mut Vec<Endpoint>,
    until: impl Fn(&[Endpoint]) -> bool,
) {
    let waiting = async {
        while !until(known) {
            match changes.next().await.expect("the follower never ends") {
                Change::Insert(endpoint) => known.push(endpoint),
                Change::Remove(endpoint) => known.retain(|e| *e != endpoint),
            }
        }
    };
    if tokio::time::timeout(PATIENCE, waiting).await.is_err() {
        panic!("the follower knows {known:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_and_follow_in_an_etcd_with_tls_client_certificates_and_users() {
    if !have_etcd() {
        return;
    }
    let dir = TempDir::new("rpc-etcd-secured");
    let (port, peer_port) = (free_port(), free_port());
    let etcd = SecuredEtcd::start(&dir.0, port, peer_port).await;
    etcd.enable_auth().await;
    let members = [format!("127.0.0.1:{port}")];
    let service = common::unique("secured");
    let a: Endpoint = "tcp://10.1.0.1:7000".parse().unwrap();
    let b: Endpoint = "tcp://10.1.0.2:7000".parse().unwrap();

    // Plain HTTP/2 to a TLS-only etcd, and TLS without a user, are both refused.
    let plain = Cluster::new(&members).unwrap();
    let ttl = Duration::from_secs(30);
    assert!(plain.register(&service, &a, ttl).await.is_err());
    let anonymous = Cluster::new(&members).unwrap().tls(client_tls());
    assert!(anonymous.register(&service, &a, ttl).await.is_err());
    // A wrong password says so.
    let wrong = anonymous.clone().user("root", "not-the-password");
    let err = wrong.register(&service, &a, ttl).await.err().unwrap();
    assert!(err.to_string().contains("authenticate as root"), "{err:?}");

    let cluster = anonymous.user("root", ROOT_PASSWORD);
    let registration = cluster.register(&service, &a, ttl).await.unwrap();
    let backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    let mut changes = cluster.resolve(&service, backoff).await.unwrap();
    let mut known = Vec::new();
    next_set(&mut changes, &mut known, |k| k == [a.clone()]).await;

    // The follower's token goes unused (its watch stream carries it only when it
    // opens) until etcd has dropped it; etcd restarts, the follower lists again
    // with the token it has, is refused, gets a new one, and sees a replica
    // registered after the restart. (etcd 3.4 keeps accepting a live token across
    // its restarts; the newer ones forget them, which ends the same way.)
    tokio::time::sleep(Duration::from_millis(2500)).await;
    etcd.kill().await;
    let etcd = SecuredEtcd::start(&dir.0, port, peer_port).await;
    let later = Cluster::new(&members)
        .unwrap()
        .tls(client_tls())
        .user("root", ROOT_PASSWORD);
    let second = later.register(&service, &b, ttl).await.unwrap();
    next_set(&mut changes, &mut known, |k| k.contains(&b)).await;
    assert!(known.contains(&a), "{known:?}");

    second.deregister().await.unwrap();
    registration.deregister().await.unwrap();
    next_set(&mut changes, &mut known, |k| k.is_empty()).await;
    drop(etcd);
}
