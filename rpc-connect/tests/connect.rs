//! One server on every transport, reached by URI with `connect` and `balanced`.

use rpc_core::{server::Server, Request};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};

async fn say<T>(client: &mut EchoClient<T>, text: &str) -> String
where
    T: rpc_core::codegen::Service<
        rpc_core::client::ClientCall,
        Response = rpc_core::client::ClientReply,
        Error = rpc_core::Status,
    >,
{
    client
        .say(Request::new(SayRequest {
            message: text.into(),
            ..SayRequest::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_by_uri_one_server_and_balanced() {
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let unix = std::env::temp_dir().join(format!("rpc-connect-{}.sock", std::process::id()));
    let rdma_unix =
        std::env::temp_dir().join(format!("rpc-connect-rdma-{}.sock", std::process::id()));
    let mut bound = Vec::new();
    for uri in [
        "tcp://127.0.0.1:0".to_owned(),
        format!("unix://{}", unix.display()),
        "udp://127.0.0.1:0".to_owned(),
        "rdma://127.0.0.1:0".to_owned(),
        "grpc://127.0.0.1:0".to_owned(),
        format!("rdma+unix://{}", rdma_unix.display()),
    ] {
        let (uri, serving) = rpc_connect::serve(&server, &uri, std::future::pending())
            .await
            .unwrap();
        tokio::spawn(serving);
        bound.push(uri);
    }
    for uri in &bound {
        // Every address the listeners report is an `Endpoint` too (what a server
        // advertises and registers); `rdma+unix://` was not.
        let endpoint: rpc_core::Endpoint = uri.parse().unwrap();
        assert_eq!(endpoint.to_string(), *uri);
        let mut echo = EchoClient::new(rpc_connect::connect(uri).await.unwrap());
        assert_eq!(say(&mut echo, uri).await, *uri);
        let mut echo = EchoClient::new(rpc_connect::balanced(uri).await.unwrap());
        assert_eq!(say(&mut echo, uri).await, *uri);
    }
    // A static list across transports, balanced.
    let list = format!("static://{},{},{}", bound[0], bound[2], bound[5]);
    let balanced = rpc_connect::balanced(&list).await.unwrap();
    let mut echo = EchoClient::new(balanced.clone());
    for _ in 0..30 {
        assert_eq!(say(&mut echo, "many").await, "many");
    }
    assert_eq!(balanced.endpoints().len(), 3);
    // A UDP replica where nothing listens: its port refuses the datagrams (ICMP), so
    // the calls it got, unprocessed, go on to the live one; each call succeeds (most
    // failed, as lost connections).
    let dead = {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap()
    };
    let list = format!("static://udp://{dead},{}", bound[2]);
    let mut echo = EchoClient::new(rpc_connect::balanced(&list).await.unwrap());
    for _ in 0..8 {
        assert_eq!(
            say(&mut echo, "past the dead one").await,
            "past the dead one"
        );
    }
    // DNS A/AAAA records (localhost, through the system resolver). The server listens
    // on 127.0.0.1 only: the ::1 replica refuses, is ejected, and the call is retried
    // on the other (a refused connect certainly reached no handler).
    let port = bound[0].rsplit(':').next().unwrap();
    let balanced = rpc_connect::balanced(&format!("dns://localhost:{port}"))
        .await
        .unwrap();
    let mut echo = EchoClient::new(balanced).with_retries(rpc_core::retry::RetryPolicy::default());
    for _ in 0..5 {
        assert_eq!(say(&mut echo, "by name").await, "by name");
    }
}

/// Schemes are case-insensitive (wire.md 1.1): `TCP://` binds and connects as
/// `tcp://` does, with `connect`, `balanced` and `AnyListener` alike ("unknown scheme"
/// from `connect` and `AnyListener`, while `balanced` took it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemes_in_any_case_bind_and_connect() {
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    for uri in [
        "TCP://127.0.0.1:0",
        "Udp://127.0.0.1:0",
        "gRPC://127.0.0.1:0",
    ] {
        let (bound, serving) = rpc_connect::serve(&server, uri, std::future::pending())
            .await
            .unwrap_or_else(|err| panic!("{uri}: {err}"));
        tokio::spawn(serving);
        assert!(bound.starts_with(&uri[..uri.find("://").unwrap()].to_ascii_lowercase()));
        let shouted = format!(
            "{}{}",
            bound[..bound.find("://").unwrap()].to_ascii_uppercase(),
            &bound[bound.find("://").unwrap()..]
        );
        let mut echo = EchoClient::new(rpc_connect::connect(&shouted).await.unwrap());
        assert_eq!(say(&mut echo, &shouted).await, shouted);
        let mut echo = EchoClient::new(rpc_connect::balanced(&shouted).await.unwrap());
        assert_eq!(say(&mut echo, &shouted).await, shouted);
    }
}

#[tokio::test]
async fn service_names_and_unknown_schemes_get_clear_errors() {
    for name in [
        "dns://kv.example.com",
        "dns+tcp://kv.example.com:7000",
        "dns+rdma://kv.example.com:7000",
    ] {
        let err = rpc_connect::connect(name).await.unwrap_err();
        assert!(err.to_string().contains("balanced"), "{name}: {err}");
    }
    let err = rpc_connect::connect("http://x:1").await.unwrap_err();
    assert!(err.to_string().contains("unknown scheme"), "{err}");
    // gRPC's unix:/path target syntax: the Unix socket URI, not tcp://unix:/path.
    let err = rpc_connect::connect("unix:/tmp/a.sock").await.unwrap_err();
    assert!(
        err.to_string().contains("unix:///tmp/a.sock") && !err.to_string().contains("tcp://unix"),
        "{err}"
    );
    // Listening without a scheme gets the same advice as connecting.
    let err = rpc_connect::AnyListener::bind("127.0.0.1:0")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tcp://127.0.0.1:0"), "{err}");
    // grpcurl's style, host:port alone: the schemes it may have meant.
    let err = rpc_connect::connect("127.0.0.1:7000").await.unwrap_err();
    assert!(
        err.to_string().contains("write tcp://127.0.0.1:7000")
            && err.to_string().contains("grpc://127.0.0.1:7000"),
        "{err}"
    );
    // etcd:// is followed through rpc-discovery-etcd; a cluster nobody answers for
    // fails at once, saying so.
    let err = rpc_connect::balanced("etcd://127.0.0.1:1/kv")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("etcd"), "{err}");
}

/// The etcd cluster to test against (`RPC_ETCD_ENDPOINTS`, default 127.0.0.1:2379), or
/// `None` to skip; under CI (`CI` set) a missing etcd fails the test.
fn etcd() -> Option<String> {
    let at = std::env::var("RPC_ETCD_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:2379".into());
    let first = at.split(',').next().unwrap_or_default().to_owned();
    let reachable = first.parse().is_ok_and(|addr| {
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).is_ok()
    });
    if reachable {
        return Some(first);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "etcd is not reachable at {first}"
    );
    eprintln!("skipped: no etcd at {first} (set RPC_ETCD_ENDPOINTS)");
    None
}

/// A registration this client cannot use (an address of no transport: a service name)
/// is left out with a warning; the client by etcd name still works over the others
/// (the first listing's bad change failed the whole `balanced`, a review found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_unusable_registration_does_not_fail_a_client_by_etcd_name() {
    let Some(etcd) = etcd() else { return };
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .build();
    let (uri, serving) = rpc_connect::serve(&server, "tcp://127.0.0.1:0", std::future::pending())
        .await
        .unwrap();
    tokio::spawn(serving);
    let service = format!("connect-{}", rpc_core::frame::random_client_id() as u32);
    let ttl = std::time::Duration::from_secs(10);
    let cluster = [etcd.clone()];
    let bad: rpc_core::Endpoint = "dns://replica.example:7000".parse().unwrap();
    let _bad = rpc_discovery_etcd::register(&cluster, &service, &bad, ttl)
        .await
        .unwrap();
    let good: rpc_core::Endpoint = uri.parse().unwrap();
    let _good = rpc_discovery_etcd::register(&cluster, &service, &good, ttl)
        .await
        .unwrap();
    let balanced = rpc_connect::balanced(&format!("etcd://{etcd}/{service}"))
        .await
        .unwrap();
    let mut echo = EchoClient::new(balanced);
    assert_eq!(say(&mut echo, "despite it").await, "despite it");
}

/// `ConnectOptions::etcd_user` reaches the etcd behind an `etcd://` name: the etcd of
/// the tests has no users, so logging in is refused, and the error says as whom.
#[tokio::test]
async fn an_etcd_user_of_the_options_logs_in_to_the_cluster() {
    let Some(etcd) = etcd() else { return };
    let options = rpc_connect::ConnectOptions::new().etcd_user("root", "no-such-password");
    let err = rpc_connect::balanced_with(&format!("etcd://{etcd}/kv"), &options)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("authenticate as root"), "{err}");
    let shown = format!("{options:?}");
    assert!(!shown.contains("no-such-password"), "{shown}");
}

/// A `dns+grpc://` name's replicas are IP addresses, but the requests' HTTP/2
/// `:authority` is the name (and port), as gRPC clients send it: proxies and virtual
/// hosts route on it (from a review: it was the resolved address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_grpc_requests_carry_the_name_as_their_authority() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = tokio::sync::oneshot::channel::<String>();
    tokio::spawn(async move {
        let (io, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(io).await.unwrap();
        let (request, _respond): (_, h2::server::SendResponse<bytes::Bytes>) =
            conn.accept().await.unwrap().unwrap();
        let authority = request.uri().authority().map(|a| a.to_string());
        let _ = seen_tx.send(authority.unwrap_or_default());
        // The call is left unanswered; the connection goes on until the test ends.
        while conn.accept().await.is_some() {}
    });
    let balanced = rpc_connect::balanced(&format!("dns+grpc://localhost:{port}"))
        .await
        .unwrap();
    let mut client = EchoClient::new(balanced);
    let call = tokio::spawn(async move {
        client
            .say(SayRequest {
                message: "hi".into(),
                ..SayRequest::default()
            })
            .await
    });
    let authority = tokio::time::timeout(std::time::Duration::from_secs(30), seen)
        .await
        .expect("no request reached the server")
        .unwrap();
    assert_eq!(authority, format!("localhost:{port}"));
    call.abort();
}

/// A `grpc://` listener bound through `AnyListener::bind_with` takes its HTTP/2
/// settings from the options: a client learns the options' stream limit from the
/// server's SETTINGS, not the default (the options carried no gRPC settings before).
#[tokio::test]
async fn a_grpc_listener_takes_its_http2_settings_from_the_options() {
    use rpc_connect::{AnyListener, ListenOptions};
    use rpc_transport_grpc::GrpcConfig;

    for (options, expected) in [
        (
            ListenOptions::new(),
            rpc_transport_grpc::DEFAULT_MAX_CONCURRENT_STREAMS,
        ),
        (
            ListenOptions::new().grpc(GrpcConfig::default().max_concurrent_streams(7)),
            7,
        ),
    ] {
        let listener = AnyListener::bind_with("grpc://127.0.0.1:0", &options)
            .await
            .unwrap();
        let uri = listener.local_addr_uri();
        let server =
            tokio::spawn(listener.serve(&Server::builder().build(), std::future::pending()));
        let address = uri.trim_start_matches("grpc://");
        let io = tokio::net::TcpStream::connect(address).await.unwrap();
        let (_send, mut conn) = h2::client::handshake(io).await.unwrap();
        // The server's SETTINGS arrive as the connection is polled.
        let advertised = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                tokio::select! {
                    _ = &mut conn => panic!("the connection ended before the server's SETTINGS"),
                    _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                }
                let max = conn.max_concurrent_send_streams();
                if max != usize::MAX {
                    break max;
                }
            }
        })
        .await
        .expect("the server's SETTINGS");
        assert_eq!(advertised, expected as usize);
        server.abort();
    }
}
