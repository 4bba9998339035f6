//! Server behaviour over the in-memory transport: handlers that finish at once (run
//! inline) and handlers that wait (run as tasks), panics in either.

use std::time::Duration;

use rpc_core::{
    client::{Channel, ClientCall},
    link::mem,
    server::{Server, ServerCall, ServerReply},
    Code, Metadata, Status,
};
use tower::{service_fn, Service, ServiceExt};

fn call(method: &'static str) -> ClientCall {
    ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: "x".into(),
        stream: None,
        compress: None,
    }
}

#[tokio::test(start_paused = true)]
async fn immediate_and_waiting_handlers_and_their_panics() {
    let (listener, connector) = mem::listener();
    let handler = service_fn(|call: ServerCall| async move {
        match call.method.as_str() {
            "t.S/Now" => {}
            "t.S/Later" => tokio::time::sleep(Duration::from_millis(10)).await,
            "t.S/PanicNow" => panic!("at once"),
            "t.S/PanicLater" => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                panic!("after waiting")
            }
            _ => return Err(Status::unimplemented("no")),
        }
        Ok::<_, Status>(ServerReply {
            metadata: Metadata::new(),
            payload: call.payload.into(),
            ..ServerReply::default()
        })
    });
    let server = Server::builder().add_named_service("t.S", handler).build();
    tokio::spawn(async move { server.serve(listener).await });
    let mut channel = Channel::builder().connect(connector).await.unwrap();

    for method in ["t.S/Now", "t.S/Later"] {
        let reply = channel
            .ready()
            .await
            .unwrap()
            .call(call(method))
            .await
            .unwrap();
        assert_eq!(reply.payload, "x", "{method}");
    }
    for method in ["t.S/PanicNow", "t.S/PanicLater"] {
        let err = channel
            .ready()
            .await
            .unwrap()
            .call(call(method))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::INTERNAL, "{method}: {err}");
        assert!(err.message().contains("panicked"), "{err}");
    }
    // The connection survived both panics.
    let reply = channel
        .ready()
        .await
        .unwrap()
        .call(call("t.S/Now"))
        .await
        .unwrap();
    assert_eq!(reply.payload, "x");
}
