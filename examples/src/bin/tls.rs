//! TLS with mutual authentication (`tls://`): the server presents its certificate and
//! asks for the client's; the client trusts only the given CA and presents its own.
//! The server sees the client's verified identity (the names of its certificate) on
//! every call (`Request::peer`, `ServerCall::peer`), which authorization layers use
//! (`rpc_core::auth`). A client without a certificate is refused at the handshake.
//! Uses the repository's test certificates (`testdata/tls`); more in
//! `docs/security.md` (certificate reload, `grpcs://`, SPIFFE ids).
//!
//! `cargo run -p rpc-examples --bin tls`

use rpc_connect::{Connect, ConnectOptions, ListenOptions};
use rpc_core::{
    auth::AuthorizeLayer,
    server::{Server, ServerCall},
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use rpc_transport_tcp::tls::{ClientTls, ServerTls};

const CA: &[u8] = include_bytes!("../../../testdata/tls/ca.pem");
const SERVER_CERT: &[u8] = include_bytes!("../../../testdata/tls/server.pem");
const SERVER_KEY: &[u8] = include_bytes!("../../../testdata/tls/server.key");
const CLIENT_CERT: &[u8] = include_bytes!("../../../testdata/tls/client.pem");
const CLIENT_KEY: &[u8] = include_bytes!("../../../testdata/tls/client.key");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server: its certificate, and client certificates required (signed by CA).
    let server_tls = ServerTls::builder()
        .cert_pem(SERVER_CERT, SERVER_KEY)
        .client_ca_pem(CA)
        .build()?;
    // Authorization by certificate identity: only the client's SPIFFE id may call.
    let only_client = AuthorizeLayer::from_fn(|call: &ServerCall| {
        let tls = call.peer.as_ref().and_then(|peer| peer.tls());
        println!(
            "server: {} from {:?}",
            call.method,
            tls.map(|tls| &tls.uris)
        );
        tls.is_some_and(|tls| {
            tls.uris
                .iter()
                .any(|uri| uri == "spiffe://example.org/client")
        })
    });
    let server = Server::builder()
        .layer(only_client)
        .add_service(EchoServer::new(EchoService))
        .build();
    let listen = ListenOptions::new().tls(server_tls);
    let (uri, serving) = rpc_connect::serve_with(
        &server,
        "tls://127.0.0.1:0",
        &listen,
        std::future::pending(),
    )
    .await?;
    tokio::spawn(serving);

    // The client: trusts the test CA only, and proves who it is.
    let client_tls = ClientTls::builder()
        .system_roots(false)
        .ca_pem(CA)
        .identity_pem(CLIENT_CERT, CLIENT_KEY)
        .build()?;
    let mut echo = EchoClient::connect_with(&uri, &ConnectOptions::new().tls(client_tls)).await?;
    let request = SayRequest {
        message: "hello over mTLS".into(),
        ..SayRequest::default()
    };
    println!("client: {}", echo.say(request).await?.get_ref().message);

    // Without a client certificate the server refuses the connection.
    let anonymous = ClientTls::builder()
        .system_roots(false)
        .ca_pem(CA)
        .build()?;
    let options = ConnectOptions::new().tls(anonymous);
    let outcome = match EchoClient::connect_with(&uri, &options).await {
        Err(err) => format!("refused ({err})"),
        Ok(mut echo) => match echo.say(SayRequest::default()).await {
            Err(status) => format!("refused ({:?})", status.code()),
            Ok(_) => "ACCEPTED".to_owned(),
        },
    };
    println!("client without a certificate: {outcome}");
    assert!(outcome.starts_with("refused"));
    Ok(())
}
