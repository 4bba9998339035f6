//! Authentication and authorization layers over the in-memory transport: bearer tokens
//! checked before the handler runs, allow-lists by role, principal and peer identity,
//! and the client's credentials layer fetching, caching and refreshing a token.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use futures::{stream, StreamExt};
use rpc_core::{
    auth::{
        AuthorizeLayer, BearerLayer, Credential, CredentialsLayer, Policy, Principal, SharedTokens,
        TokenSet, WithCredentials,
    },
    client::{Channel, ClientCall, ClientReply},
    codegen,
    link::mem,
    peer::TlsIdentity,
    server::{Server, ServerCall, ServerReply},
    stream::TakeOnce,
    Code, Metadata, Payload, Peer, Status,
};
use tower::{util::MapRequestLayer, Service, ServiceBuilder, ServiceExt};

/// The test service, `t.S`. Counts the calls that reached it, and answers a unary call
/// with `principal=<name> roles=<a,b> authorization=<value>` as it saw them through
/// [`rpc_core::Request`]; `t.S/Echo` is a streaming echo that reports the principal in
/// its headers.
#[derive(Clone, Default)]
struct Handler {
    runs: Arc<AtomicUsize>,
}

impl Service<ServerCall> for Handler {
    type Response = ServerReply;
    type Error = Status;
    type Future = Pin<Box<dyn Future<Output = Result<ServerReply, Status>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: ServerCall) -> Self::Future {
        self.runs.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if call.method.as_str() == "t.S/Echo" {
                let mut metadata = Metadata::new();
                let name = call.principal.as_ref().map(|p| p.name().to_owned());
                metadata
                    .insert("x-principal", name.unwrap_or_default())
                    .unwrap();
                let messages = call.stream.and_then(|s| s.take()).expect("a stream");
                return Ok(ServerReply {
                    metadata,
                    stream: Some(TakeOnce::new(
                        messages.map(|m| m.map(Payload::from)).boxed(),
                    )),
                    ..ServerReply::default()
                });
            }
            let request = codegen::decode_request::<String>(call)?;
            let principal = request.principal();
            let text = format!(
                "principal={} roles={} authorization={}",
                principal.map_or("-", |p| p.name()),
                principal.map(|p| p.roles().join(",")).unwrap_or_default(),
                request.metadata().get_str("authorization").unwrap_or("-"),
            );
            Ok(ServerReply {
                payload: Payload::from(text.into_bytes()),
                ..ServerReply::default()
            })
        })
    }
}

/// Serves `server` over a fresh in-memory listener and connects a channel to it.
async fn connect(server: Server) -> Channel {
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder().connect(connector).await.unwrap()
}

fn call(method: &'static str) -> ClientCall {
    ClientCall {
        method: method.into(),
        idempotency: Default::default(),
        metadata: Metadata::new(),
        timeout: None,
        call_key: None,
        payload: codegen::encode(&String::new()),
        stream: None,
        compress: None,
    }
}

fn with_authorization(method: &'static str, value: &'static str) -> ClientCall {
    let mut call = call(method);
    call.metadata.insert("authorization", value).unwrap();
    call
}

async fn send<S>(service: &mut S, call: ClientCall) -> Result<ClientReply, Status>
where
    S: Service<ClientCall, Response = ClientReply, Error = Status>,
{
    service.ready().await?.call(call).await
}

fn text(reply: &ClientReply) -> &str {
    std::str::from_utf8(&reply.payload).unwrap()
}

fn tokens() -> TokenSet {
    TokenSet::parse(
        "# token       name   roles\n\
         alice-token   alice  reader\n\
         bob-token     bob    reader,writer\n\
         carol-token   carol\n",
    )
    .unwrap()
}

fn policy() -> Policy {
    Policy::new()
        .allow_anyone(["grpc.health.v1.Health/*"])
        .allow_role("reader", ["t.S/Get", "t.S/Echo"])
        .allow_role("writer", ["t.S/*"])
        .allow_principal("carol", ["t.S/Get"])
        .allow_identity("spiffe://example.org/backup", ["t.S/Get"])
}

/// A server with the bearer layer over the authorization layer over [`Handler`], at
/// `t.S` and `grpc.health.v1.Health`.
async fn secured() -> (Channel, Handler) {
    let handler = Handler::default();
    let server = Server::builder()
        .layer(BearerLayer::new(tokens()).exempt(["grpc.health.v1.Health/*"]))
        .layer(AuthorizeLayer::new(policy()))
        .add_named_service("t.S", handler.clone())
        .add_named_service("grpc.health.v1.Health", handler.clone())
        .build();
    (connect(server).await, handler)
}

#[tokio::test]
async fn a_call_without_a_token_is_unauthenticated_and_never_reaches_the_handler() {
    let (mut channel, handler) = secured().await;
    let status = send(&mut channel, call("t.S/Get")).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    assert!(
        status.message().contains("t.S/Get needs a bearer token"),
        "{status}"
    );
    let status = send(
        &mut channel,
        with_authorization("t.S/Get", "Basic YWxpY2U6cHc="),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_wrong_token_is_unauthenticated_and_never_reaches_the_handler() {
    let (mut channel, handler) = secured().await;
    for value in [
        "Bearer mallory-token",
        "Bearer alice-toke",
        "Bearer alice-token2",
    ] {
        let status = send(&mut channel, with_authorization("t.S/Get", value))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::UNAUTHENTICATED, "{value}: {status}");
        assert!(
            !status.message().contains("token2"),
            "the token is not echoed: {status}"
        );
    }
    assert_eq!(handler.runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_valid_token_reaches_the_handler_which_sees_the_principal() {
    let (mut channel, handler) = secured().await;
    let reply = send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer bob-token"),
    )
    .await
    .unwrap();
    assert_eq!(
        text(&reply),
        "principal=bob roles=reader,writer authorization=Bearer bob-token"
    );
    // The scheme is case-insensitive.
    let reply = send(
        &mut channel,
        with_authorization("t.S/Get", "bearer alice-token"),
    )
    .await
    .unwrap();
    assert!(
        text(&reply).starts_with("principal=alice roles=reader "),
        "{}",
        text(&reply)
    );
    assert_eq!(handler.runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_method_outside_the_allow_list_is_permission_denied_and_an_allowed_one_succeeds() {
    let (mut channel, handler) = secured().await;
    // alice is a reader: Get, not Put.
    send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer alice-token"),
    )
    .await
    .unwrap();
    let status = send(
        &mut channel,
        with_authorization("t.S/Put", "Bearer alice-token"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    assert_eq!(status.message(), "\"alice\" may not call t.S/Put");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1, "Put never ran");

    // bob is also a writer: `t.S/*`.
    let reply = send(
        &mut channel,
        with_authorization("t.S/Put", "Bearer bob-token"),
    )
    .await
    .unwrap();
    assert!(text(&reply).starts_with("principal=bob "));

    // carol has no role; a rule names her for Get only.
    send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer carol-token"),
    )
    .await
    .unwrap();
    let status = send(
        &mut channel,
        with_authorization("t.S/Put", "Bearer carol-token"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn exempt_methods_need_no_token() {
    let (mut channel, handler) = secured().await;
    let reply = send(&mut channel, call("grpc.health.v1.Health/Check"))
        .await
        .unwrap();
    assert_eq!(text(&reply), "principal=- roles= authorization=-");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn authorization_by_peer_identity_without_a_token() {
    // Stands in for an mTLS transport: the peer's verified certificate names the
    // identity in `x-test-identity`.
    let fake_mtls = MapRequestLayer::new(|mut call: ServerCall| {
        if let Some(uri) = call.metadata.get_str("x-test-identity") {
            let peer = Peer::new("tls://10.0.0.9:4000").with_tls(TlsIdentity {
                uris: vec![uri.to_owned()],
                certificate: vec![0x30],
                ..TlsIdentity::default()
            });
            call.peer = Some(Arc::new(peer));
        }
        call
    });
    let handler = Handler::default();
    let server = Server::builder()
        .layer(fake_mtls)
        .layer(AuthorizeLayer::new(policy()))
        .add_named_service("t.S", handler.clone())
        .build();
    let mut channel = connect(server).await;
    let as_identity = |method, identity| {
        let mut call = call(method);
        call.metadata.insert("x-test-identity", identity).unwrap();
        call
    };

    send(
        &mut channel,
        as_identity("t.S/Get", "spiffe://example.org/backup"),
    )
    .await
    .unwrap();
    let status = send(
        &mut channel,
        as_identity("t.S/Put", "spiffe://example.org/backup"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    assert!(
        status.message().contains("spiffe://example.org/backup"),
        "{status}"
    );
    let status = send(
        &mut channel,
        as_identity("t.S/Get", "spiffe://example.org/web"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    // No certificate and no token: nobody to deny, so UNAUTHENTICATED.
    let status = send(&mut channel, call("t.S/Get")).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn shared_tokens_replaced_while_serving_check_the_next_calls() {
    let tokens = SharedTokens::new(tokens());
    let handler = Handler::default();
    let server = Server::builder()
        .layer(BearerLayer::shared(tokens.clone()))
        .add_named_service("t.S", handler.clone())
        .build();
    let mut channel = connect(server).await;
    let reply = send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer bob-token"),
    )
    .await
    .unwrap();
    assert!(text(&reply).starts_with("principal=bob roles=reader,writer "));

    // bob's token revoked, dana's added, alice's role changed.
    tokens.replace(TokenSet::parse("alice-token alice writer\ndana-token dana\n").unwrap());
    let status = send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer bob-token"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    let reply = send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer dana-token"),
    )
    .await
    .unwrap();
    assert!(
        text(&reply).starts_with("principal=dana "),
        "{}",
        text(&reply)
    );
    let reply = send(
        &mut channel,
        with_authorization("t.S/Get", "Bearer alice-token"),
    )
    .await
    .unwrap();
    assert!(text(&reply).starts_with("principal=alice roles=writer "));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_async_validator_decides_and_its_status_fails_the_call() {
    let validator = BearerLayer::from_fn(|token: String| async move {
        tokio::task::yield_now().await;
        match token.strip_prefix("user-") {
            Some(name) => Ok(Principal::new(name).with_role("writer")),
            None if token == "down" => Err(Status::unavailable("token store down")),
            None => Err(Status::unauthenticated("unknown token")),
        }
    });
    let handler = Handler::default();
    let server = Server::builder()
        .layer(validator)
        .layer(AuthorizeLayer::new(policy()))
        .add_named_service("t.S", handler.clone())
        .build();
    let mut channel = connect(server).await;
    let reply = send(
        &mut channel,
        with_authorization("t.S/Put", "Bearer user-dana"),
    )
    .await
    .unwrap();
    assert!(text(&reply).starts_with("principal=dana roles=writer "));
    let status = send(&mut channel, with_authorization("t.S/Put", "Bearer who"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    let status = send(&mut channel, with_authorization("t.S/Put", "Bearer down"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAVAILABLE, "{status}");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_streaming_call_is_checked_when_it_opens() {
    let (mut channel, handler) = secured().await;
    let open = |authorization: Option<&'static str>| {
        let mut call = call("t.S/Echo");
        call.payload = Payload::new();
        call.stream = Some(TakeOnce::new(
            stream::iter([Payload::from("one"), Payload::from("two")]).boxed(),
        ));
        if let Some(value) = authorization {
            call.metadata.insert("authorization", value).unwrap();
        }
        call
    };
    let status = send(&mut channel, open(None)).await.unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    let status = send(&mut channel, open(Some("Bearer nope")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    let status = send(&mut channel, open(Some("Bearer carol-token")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    assert_eq!(handler.runs.load(Ordering::SeqCst), 0);

    let reply = send(&mut channel, open(Some("Bearer alice-token")))
        .await
        .unwrap();
    assert_eq!(reply.metadata.get_str("x-principal"), Some("alice"));
    let echoed: Vec<_> = reply
        .stream
        .and_then(|s| s.take())
        .unwrap()
        .map(|m| m.unwrap())
        .collect()
        .await;
    assert_eq!(echoed, ["one", "two"]);
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
}

/// A server accepting any token `tokN` (principal `tokN`), and a client stack whose
/// credentials source counts its calls and gives `tok1`, `tok2`, ... each good for a
/// minute (after `delay`), or fails while `fail` is set.
struct Refreshing {
    client: rpc_core::auth::WithCredentials<Channel>,
    refreshes: Arc<AtomicUsize>,
    fail: Arc<AtomicBool>,
    handler: Handler,
}

const TTL: Duration = Duration::from_secs(60);

async fn refreshing(delay: Duration) -> Refreshing {
    let handler = Handler::default();
    let server = Server::builder()
        .layer(BearerLayer::from_fn(|token: String| async move {
            if token.starts_with("tok") {
                Ok(Principal::new(token))
            } else {
                Err(Status::unauthenticated("not a tok"))
            }
        }))
        .add_named_service("t.S", handler.clone())
        .build();
    let channel = connect(server).await;
    let refreshes = Arc::new(AtomicUsize::new(0));
    let fail = Arc::new(AtomicBool::new(false));
    let (counter, failing) = (refreshes.clone(), fail.clone());
    let credentials = CredentialsLayer::new(move || {
        let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
        let failing = failing.load(Ordering::SeqCst);
        async move {
            tokio::time::sleep(delay).await;
            if failing {
                return Err(Status::unauthenticated("the token service said no"));
            }
            Ok(Credential::bearer(format!("tok{n}")).expires_in(TTL))
        }
    });
    Refreshing {
        client: ServiceBuilder::new().layer(credentials).service(channel),
        refreshes,
        fail,
        handler,
    }
}

async fn principal_seen(client: &mut rpc_core::auth::WithCredentials<Channel>) -> String {
    let reply = send(client, call("t.S/Get")).await.unwrap();
    let text = text(&reply);
    text.split(' ')
        .next()
        .unwrap()
        .trim_start_matches("principal=")
        .to_owned()
}

#[tokio::test(start_paused = true)]
async fn client_credentials_are_sent_and_refreshed_after_expiry() {
    let mut t = refreshing(Duration::ZERO).await;
    assert_eq!(principal_seen(&mut t.client).await, "tok1");
    assert_eq!(principal_seen(&mut t.client).await, "tok1", "cached");
    tokio::time::advance(TTL - Duration::from_secs(1)).await;
    assert_eq!(
        principal_seen(&mut t.client).await,
        "tok1",
        "not expired yet"
    );
    assert_eq!(t.refreshes.load(Ordering::SeqCst), 1);

    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(principal_seen(&mut t.client).await, "tok2", "refreshed");
    assert_eq!(principal_seen(&mut t.client).await, "tok2");
    assert_eq!(t.refreshes.load(Ordering::SeqCst), 2);

    // A token the caller set itself is replaced, not sent twice.
    let reply = send(&mut t.client, with_authorization("t.S/Get", "Bearer stale"))
        .await
        .unwrap();
    assert!(
        text(&reply).ends_with("authorization=Bearer tok2"),
        "{}",
        text(&reply)
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_wait_for_one_refresh() {
    let t = refreshing(Duration::from_secs(1)).await;
    for round in 1..=2 {
        let calls = (0..8).map(|_| {
            let mut client = t.client.clone();
            async move { principal_seen(&mut client).await }
        });
        let seen = futures::future::join_all(calls).await;
        assert_eq!(seen, vec![format!("tok{round}"); 8], "round {round}");
        assert_eq!(
            t.refreshes.load(Ordering::SeqCst),
            round,
            "one refresh per expiry"
        );
        tokio::time::advance(TTL).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_failed_refresh_fails_the_calls_waiting_for_it_and_sends_nothing() {
    let t = refreshing(Duration::from_secs(1)).await;
    t.fail.store(true, Ordering::SeqCst);
    let calls = (0..4).map(|_| {
        let mut client = t.client.clone();
        async move { send(&mut client, call("t.S/Get")).await }
    });
    for outcome in futures::future::join_all(calls).await {
        let status = outcome.unwrap_err();
        assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
        assert_eq!(status.message(), "the token service said no");
    }
    assert_eq!(
        t.refreshes.load(Ordering::SeqCst),
        1,
        "the waiters shared its error"
    );
    assert_eq!(t.handler.runs.load(Ordering::SeqCst), 0, "nothing was sent");

    // The next call tries again.
    t.fail.store(false, Ordering::SeqCst);
    let mut client = t.client.clone();
    assert_eq!(principal_seen(&mut client).await, "tok2");
    assert_eq!(t.handler.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_fixed_bearer_token_on_the_client() {
    let (channel, handler) = secured().await;
    let mut client = ServiceBuilder::new()
        .layer(CredentialsLayer::bearer("bob-token"))
        .service(channel);
    let reply = send(&mut client, call("t.S/Put")).await.unwrap();
    assert!(
        text(&reply).starts_with("principal=bob "),
        "{}",
        text(&reply)
    );
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1);
}

/// The duplicate cache answers repeats before any layer authenticates them, so a call
/// key (which traces record: not a secret) must not open another caller's recorded
/// answer: a repeat of Bob's keyed call with no token, or with Alice's, is another
/// call, refused as theirs would be, and Bob's own repeat still gets his answer from
/// the cache. Before, both got Bob's answer (his token in it) without running.
#[tokio::test]
async fn a_call_key_repeated_by_another_caller_does_not_get_the_recorded_answer() {
    use rpc_core::frame::CallKey;
    let (mut channel, handler) = secured().await;
    let key = CallKey {
        client: 0x5eed,
        call: 1,
        attempt: 1,
    };
    let keyed = |mut call: ClientCall, attempt: u32| {
        call.call_key = Some(CallKey { attempt, ..key });
        call
    };
    let bobs = send(
        &mut channel,
        keyed(with_authorization("t.S/Put", "Bearer bob-token"), 1),
    )
    .await
    .unwrap();
    assert!(text(&bobs).starts_with("principal=bob"), "{}", text(&bobs));

    let status = send(&mut channel, keyed(call("t.S/Put"), 2))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
    let status = send(
        &mut channel,
        keyed(with_authorization("t.S/Put", "Bearer alice-token"), 2),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");

    let again = send(
        &mut channel,
        keyed(with_authorization("t.S/Put", "Bearer bob-token"), 2),
    )
    .await
    .unwrap();
    assert_eq!(
        text(&again),
        text(&bobs),
        "Bob's repeat gets his recorded answer"
    );
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1, "the call ran once");
}

/// Keyed calls the auth layers refuse never reached a handler, so the duplicate cache
/// keeps no outcome for them: a peer without a token sending keyed calls cannot push
/// another caller's recorded outcome out of a small cache (whose retry would then be
/// refused `ABORTED`, as possibly run, instead of getting its answer).
#[tokio::test]
async fn refused_keyed_calls_take_no_room_in_the_duplicate_cache() {
    use rpc_core::{frame::CallKey, server::DedupeConfig};
    let handler = Handler::default();
    let server = Server::builder()
        .duplicate_cache(Some(DedupeConfig {
            max_entries: 4,
            ..DedupeConfig::default()
        }))
        .layer(BearerLayer::new(tokens()))
        .layer(AuthorizeLayer::new(policy()))
        .add_named_service("t.S", handler.clone())
        .build();
    let mut channel = connect(server).await;
    let keyed = |mut call: ClientCall, client: u128, number: u64, attempt: u32| {
        call.call_key = Some(CallKey {
            client,
            call: number,
            attempt,
        });
        call
    };
    let bobs = || with_authorization("t.S/Put", "Bearer bob-token");
    let first = send(&mut channel, keyed(bobs(), 0xb0b, 1, 1))
        .await
        .unwrap();
    for number in 1..=20 {
        let status = send(&mut channel, keyed(call("t.S/Put"), 0xbad, number, 1))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::UNAUTHENTICATED, "{status}");
        let status = send(
            &mut channel,
            keyed(
                with_authorization("t.S/Put", "Bearer alice-token"),
                0xa11ce,
                number,
                1,
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::PERMISSION_DENIED, "{status}");
    }
    let again = send(&mut channel, keyed(bobs(), 0xb0b, 1, 2))
        .await
        .expect("Bob's retry gets his recorded answer");
    assert_eq!(text(&again), text(&first));
    assert_eq!(handler.runs.load(Ordering::SeqCst), 1, "the call ran once");
}

/// A server that stops accepting `tok1` once `revoked` is set (as etcd forgets its
/// tokens when it restarts), and a client whose credentials never expire by time.
async fn revoking(refresh_when_rejected: bool) -> (WithCredentials<Channel>, Arc<AtomicBool>) {
    let revoked = Arc::new(AtomicBool::new(false));
    let gone = revoked.clone();
    let server = Server::builder()
        .layer(BearerLayer::from_fn(move |token: String| {
            let refused = token == "tok1" && gone.load(Ordering::SeqCst);
            async move {
                if refused {
                    Err(Status::unauthenticated("invalid auth token"))
                } else {
                    Ok(Principal::new(token))
                }
            }
        }))
        .add_named_service("t.S", Handler::default())
        .build();
    let channel = connect(server).await;
    let issued = Arc::new(AtomicUsize::new(0));
    let mut credentials = CredentialsLayer::new(move || {
        let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok(Credential::bearer(format!("tok{n}"))) }
    });
    if refresh_when_rejected {
        credentials = credentials.refresh_when_rejected();
    }
    (
        ServiceBuilder::new().layer(credentials).service(channel),
        revoked,
    )
}

#[tokio::test]
async fn a_credential_refused_by_the_server_is_refreshed_for_the_next_call() {
    let (mut client, revoked) = revoking(true).await;
    assert_eq!(principal_seen(&mut client).await, "tok1");
    revoked.store(true, Ordering::SeqCst);
    let refused = send(&mut client, call("t.S/Get")).await.unwrap_err();
    assert_eq!(refused.code(), Code::UNAUTHENTICATED, "{refused}");
    assert_eq!(principal_seen(&mut client).await, "tok2", "refreshed");
    assert_eq!(principal_seen(&mut client).await, "tok2", "and cached");

    // Without the option the refused credential stays until it expires (never).
    let (mut client, revoked) = revoking(false).await;
    assert_eq!(principal_seen(&mut client).await, "tok1");
    revoked.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        let refused = send(&mut client, call("t.S/Get")).await.unwrap_err();
        assert_eq!(refused.code(), Code::UNAUTHENTICATED, "{refused}");
    }
}
