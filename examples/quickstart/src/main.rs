use std::time::Duration;

use rpc_connect::Connect; // `KeyValueClient::connect(uri)`, for any scheme
use rpc_core::{server::Server, Request, Response, Status};

// The generated code: one module per `.proto` package, nested as its name says.
rpc_core::include_protos!();
use kv::v1::key_value_client::KeyValueClient;
use kv::v1::key_value_server::{KeyValue, KeyValueServer};
use kv::v1::{GetReply, GetRequest};

/// The service: the generated trait, implemented with plain `async fn`s.
struct Store;

impl KeyValue for Store {
    async fn get(&self, req: Request<GetRequest>) -> Result<Response<GetReply>, Status> {
        match req.get_ref().key.as_str() {
            "hello" => Ok(Response::new(GetReply {
                value: "world".into(),
            })),
            key => Err(Status::not_found(format!("no key {key:?}"))),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server, on a port the system picks, in a task of its own.
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    let server = Server::builder().add_service(KeyValueServer::new(Store));
    tokio::spawn(server.serve(listener));

    // A client: one call, with a deadline.
    let mut kv = KeyValueClient::connect(&uri).await?;
    let key = "hello".to_string();
    let request = Request::new(GetRequest { key }).with_timeout(Duration::from_secs(1));
    let reply = kv.get(request).await?;
    let value = String::from_utf8_lossy(&reply.get_ref().value);
    println!("hello => {value}");
    Ok(())
}
