//! The core's logs a user acts on, as a subscriber sees them: a connection opened, a
//! handler panic at ERROR with the method, and a graceful shutdown's GOAWAY sent and
//! received and the connection closed with its cause.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use rpc_core::{
    client::{Channel, Client},
    link::mem,
    method::{Idempotency, MethodDescriptor},
    server::{Server, ServerCall, ServerReply},
    Code, Request, Status,
};
use tracing::{
    field::{Field, Visit},
    Event, Level, Subscriber,
};
use tracing_subscriber::{layer::Context, prelude::*, Layer};

static BOOM: MethodDescriptor = MethodDescriptor {
    service: "demo.Panics",
    method: "Boom",
    path: "demo.Panics/Boom",
    idempotency: Idempotency::NoSideEffects,
};

/// One event: its level, message and other fields as text.
#[derive(Clone, Debug)]
struct Logged {
    level: Level,
    fields: Vec<(String, String)>,
}

impl Logged {
    fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Keeps every event.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Logged>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Logged {
            level: *event.metadata().level(),
            fields,
        });
    }
}

impl Events {
    fn find(&self, message: &str) -> Option<Logged> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|e| e.get("message").is_some_and(|m| m.starts_with(message)))
            .cloned()
    }

    /// Waits (yielding to the server's tasks) for an event, up to 10,000 yields.
    async fn wait_for(&self, message: &str) -> Logged {
        for _ in 0..10_000 {
            if let Some(found) = self.find(message) {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("no {message:?} in {:#?}", self.0.lock().unwrap());
    }
}

#[tokio::test]
async fn connections_and_panics_are_logged() {
    let events = Events::default();
    let _guard = tracing_subscriber::registry()
        .with(events.clone())
        .set_default();

    let (listener, connector) = mem::listener();
    let panics = tower::service_fn(|_call: ServerCall| async move {
        if true {
            panic!("boom");
        }
        Ok::<_, Status>(ServerReply::default())
    });
    let server = Server::builder().add_named_service("demo.Panics", panics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        server
            .serve_with_shutdown(listener, async {
                stopped.await.ok();
            })
            .await
    });

    let mut client = Client::new(Channel::builder().connect(connector).await.unwrap());
    let status = client
        .unary::<_, String>(Request::new("x".to_string()), &BOOM)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::INTERNAL);

    let opened = events.wait_for("connection opened").await;
    assert_eq!(opened.level, Level::DEBUG);
    assert!(opened.get("peer").is_some(), "{opened:?}");

    let panicked = events.wait_for("the handler panicked").await;
    assert_eq!(panicked.level, Level::ERROR);
    assert_eq!(
        panicked.get("method"),
        Some("demo.Panics/Boom"),
        "{panicked:?}"
    );

    // Graceful shutdown: GOAWAY to the client, then the connection closes.
    stop.send(()).unwrap();
    let goaway = events.wait_for("GOAWAY sent: draining").await;
    assert_eq!(goaway.level, Level::DEBUG);
    // The documented fields (docs/observability.md): the code and the reason apart.
    assert_eq!(goaway.get("code"), Some("NO_ERROR"), "{goaway:?}");
    assert_eq!(
        goaway.get("reason"),
        Some("server is shutting down"),
        "{goaway:?}"
    );
    let received = events.wait_for("GOAWAY received").await;
    assert_eq!(received.level, Level::DEBUG);
    let closed = events.wait_for("connection closed").await;
    assert_eq!(closed.level, Level::DEBUG);
    assert!(closed.get("cause").is_some(), "{closed:?}");
    serving.await.unwrap().unwrap();
    drop(client);
}

/// A client's GOAWAY reason is the peer's text: logged cut to 1 KiB and escaped, so a
/// reason with line ends cannot forge log lines, nor a 60 KiB one flood the log (from a
/// review: both went into a text log as sent).
#[tokio::test]
async fn a_clients_goaway_reason_is_logged_clipped_and_escaped() {
    use rpc_core::{
        frame::{self, GoAwayCode},
        link::{Connector, Link, LinkConfig},
        Payload,
    };
    use std::future::poll_fn;

    let events = Events::default();
    let _guard = tracing_subscriber::registry()
        .with(events.clone())
        .set_default();
    let (listener, connector) = mem::listener();
    let server = Server::builder()
        .add_named_service(
            "demo.Panics",
            tower::service_fn(|_call: ServerCall| async {
                Ok::<_, Status>(ServerReply::default())
            }),
        )
        .build();
    let serving = tokio::spawn(async move { server.serve(listener).await });
    let mut link = connector.connect(&LinkConfig::default()).await.unwrap();
    let reason = format!(
        "bye\n2026-12-07T00:00:00Z ERROR forged line{}",
        "x".repeat(60_000)
    );
    let mut goaway = bytes::BytesMut::new();
    frame::encode_goaway(&mut goaway, 0, GoAwayCode::NO_ERROR, &reason);
    poll_fn(|cx| link.poll_ready(cx)).await.unwrap();
    link.start_send(&goaway, Payload::new()).unwrap();
    poll_fn(|cx| link.poll_flush(cx)).await.unwrap();
    let logged = events.wait_for("client sent GOAWAY").await;
    let logged = logged.get("reason").expect("a reason field");
    assert!(!logged.contains('\n'), "a raw line end: {logged}");
    assert!(logged.contains("bye\\n2026"), "escaped: {logged}");
    assert!(logged.len() < 1_100, "{} bytes logged", logged.len());
    serving.abort();
}
