//! Interceptors and authentication: the server checks bearer tokens
//! (`BearerLayer`, tokens from a `TokenSet`) and allows methods by role
//! (`AuthorizeLayer`); the client adds its token to every call (`CredentialsLayer`)
//! and a request id with an interceptor of its own (`interceptor_fn`). A client
//! without a token is refused with `UNAUTHENTICATED` before any handler runs. Tokens
//! travel in the clear over `tcp://`: use `tls://` off a trusted network (see the
//! `tls` example and `docs/security.md`).
//!
//! `cargo run -p rpc-examples --bin auth`

use rpc_connect::Connect;
use rpc_core::{
    auth::{AuthorizeLayer, BearerLayer, CredentialsLayer, Policy, TokenSet},
    intercept::{interceptor_fn, InterceptLayer},
    server::Server,
    Metadata, Status,
};
use rpc_proto::echo::{echo_client::EchoClient, echo_server::EchoServer, EchoService, SayRequest};
use tower::ServiceBuilder;

fn say(message: &str) -> SayRequest {
    SayRequest {
        message: message.into(),
        ..SayRequest::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Server: authentication first (outermost), then authorization by role.
    let tokens = TokenSet::parse("s3cret alice echoer\n")?; // or TokenSet::load(path)
    let policy = Policy::new().allow_role("echoer", ["rpc.examples.v1.Echo/*"]);
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .layer(BearerLayer::new(tokens))
        .layer(AuthorizeLayer::new(policy))
        .add_service(EchoServer::new(EchoService));
    tokio::spawn(server.serve(listener));

    // Without credentials: refused before the handler.
    let mut anonymous = EchoClient::connect(&uri).await?;
    let refused = anonymous.say(say("hi")).await.unwrap_err();
    println!(
        "without a token: {:?} {}",
        refused.code(),
        refused.message()
    );

    // With credentials, and an interceptor that tags every call.
    let request_id = interceptor_fn(|method: &str, metadata: &mut Metadata| {
        println!("interceptor: {method}");
        let added = metadata.insert("x-request-id", "42");
        added.map_err(|err| Status::internal(err.to_string()))
    });
    let channel = rpc_connect::connect(&uri).await?;
    let stack = ServiceBuilder::new()
        .layer(CredentialsLayer::bearer("s3cret"))
        .layer(InterceptLayer::new(request_id))
        .service(channel);
    let mut echo = EchoClient::new(stack);
    let reply = echo.say(say("hi, as alice")).await?;
    println!("with a token: {}", reply.get_ref().message);
    Ok(())
}
