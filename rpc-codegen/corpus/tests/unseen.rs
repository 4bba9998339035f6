//! `rpc-codegen/tests/protos/unseen`: `.proto` files written to probe the generator.
//! That this file compiles shows the generated names and types are usable; the tests
//! call every generated client against the generated servers over the in-memory link.

use futures::{stream::BoxStream, StreamExt};
use rpc_codegen_corpus::probes::{self as gen, a::b::c::d, r#type::r#match as type_match, unseen};
use rpc_core::{
    client::Channel,
    codegen::{prost_types, NamedService, Streaming},
    link::mem,
    method::Idempotency,
    server::Server,
    Request, Response, Status,
};

type Reply<T> = Result<Response<T>, Status>;
type Stream<T> = BoxStream<'static, Result<T, Status>>;

/// Implements every rpc of a service as an echo that appends the Rust method name to
/// `M.text`, so that the tests see which handler ran.
macro_rules! tag_echo {
    ($($name:ident)*) => {$(
        async fn $name(&self, request: Request<unseen::keywords::M>) -> Reply<unseen::keywords::M> {
            let mut message = request.into_inner();
            message.text.push_str(concat!("/", stringify!($name)));
            Ok(Response::new(message))
        }
    )*};
}

/// Implements rpcs that answer with their request, each `name: Type`.
macro_rules! echo {
    ($($name:ident: $ty:ty),* $(,)?) => {$(
        async fn $name(&self, request: Request<$ty>) -> Reply<$ty> {
            Ok(Response::new(request.into_inner()))
        }
    )*};
}

/// Implements every service of the unseen files.
struct Impl;

impl unseen::keywords::service_server::Service for Impl {
    tag_echo!(r#type r#match self_ super_ crate_ extern_ r#async r#await r#try r#gen r#dyn
        r#fn r#impl r#loop new clone get_ref get_mut into_inner with_retries with_interceptor
        from_arc call poll_ready fmt ready all name inner request drop);
}

impl unseen::keywords::client_server::Client for Impl {
    tag_echo!(client server);
}

impl unseen::keywords::server_server::Server for Impl {
    tag_echo!(server);
}

impl unseen::keywords::type_server::Type for Impl {
    tag_echo!(get);
}

impl unseen::keywords::self_server::Self_ for Impl {
    tag_echo!(get);
}

impl unseen::keywords::async_server::Async for Impl {
    type GetStream = Stream<unseen::keywords::M>;

    async fn get(
        &self,
        request: Request<Streaming<unseen::keywords::M>>,
    ) -> Reply<Self::GetStream> {
        Ok(Response::new(request.into_inner().boxed()))
    }
}

impl unseen::streaming::calc_server::Calc for Impl {
    type CountStream = Stream<unseen::streaming::Num>;
    type EchoStream = Stream<unseen::streaming::Num>;
    type CountStreamStream = Stream<unseen::streaming::Num>;

    async fn add(&self, request: Request<unseen::streaming::Num>) -> Reply<unseen::streaming::Num> {
        let value = request.into_inner().value + 1;
        Ok(Response::new(unseen::streaming::Num { value }))
    }

    async fn count(&self, request: Request<unseen::streaming::Num>) -> Reply<Self::CountStream> {
        let n = request.into_inner().value;
        let numbers = futures::stream::iter(0..n).map(|value| Ok(unseen::streaming::Num { value }));
        Ok(Response::new(numbers.boxed()))
    }

    async fn sum(
        &self,
        request: Request<Streaming<unseen::streaming::Num>>,
    ) -> Reply<unseen::streaming::Num> {
        let mut numbers = request.into_inner();
        let mut value = 0;
        while let Some(number) = numbers.message().await? {
            value += number.value;
        }
        Ok(Response::new(unseen::streaming::Num { value }))
    }

    async fn echo(
        &self,
        request: Request<Streaming<unseen::streaming::Num>>,
    ) -> Reply<Self::EchoStream> {
        Ok(Response::new(request.into_inner().boxed()))
    }

    async fn count_stream(
        &self,
        _request: Request<unseen::streaming::Num>,
    ) -> Reply<Self::CountStreamStream> {
        Ok(Response::new(futures::stream::empty().boxed()))
    }
}

impl unseen::layout::empty_server::Empty for Impl {}

impl unseen::layout::nested_server::Nested for Impl {
    async fn down(
        &self,
        request: Request<unseen::layout::outer::Inner>,
    ) -> Reply<unseen::layout::outer::inner::Innermost> {
        Ok(Response::new(
            request.into_inner().innermost.unwrap_or_default(),
        ))
    }

    echo!(same: unseen::layout::Outer);
}

impl unseen::layout::well_known_server::WellKnown for Impl {
    type StreamStream = Stream<prost_types::Timestamp>;

    async fn nothing(&self, _request: Request<()>) -> Reply<()> {
        Ok(Response::new(()))
    }

    async fn when(&self, request: Request<prost_types::Timestamp>) -> Reply<prost_types::Duration> {
        let at = request.into_inner();
        Ok(Response::new(prost_types::Duration {
            seconds: at.seconds,
            nanos: at.nanos,
        }))
    }

    async fn anything(&self, request: Request<prost_types::Any>) -> Reply<prost_types::Struct> {
        let any = request.into_inner();
        let value = prost_types::Value {
            kind: Some(prost_types::value::Kind::StringValue(any.type_url)),
        };
        Ok(Response::new(prost_types::Struct {
            fields: [("type_url".to_owned(), value)].into_iter().collect(),
        }))
    }

    async fn value(&self, request: Request<prost_types::Value>) -> Reply<prost_types::ListValue> {
        Ok(Response::new(prost_types::ListValue {
            values: vec![request.into_inner(); 2],
        }))
    }

    async fn wrapped(&self, request: Request<String>) -> Reply<bool> {
        Ok(Response::new(request.into_inner().is_empty()))
    }

    async fn stream(&self, request: Request<Streaming<()>>) -> Reply<Self::StreamStream> {
        let times = request.into_inner().enumerate().map(|(i, empty)| {
            empty.map(|()| prost_types::Timestamp {
                seconds: i as i64,
                nanos: 0,
            })
        });
        Ok(Response::new(times.boxed()))
    }
}

impl unseen::layout::wrappers_server::Wrappers for Impl {
    type UintStream = Stream<u64>;

    async fn bool(&self, request: Request<bool>) -> Reply<Vec<u8>> {
        Ok(Response::new(vec![u8::from(request.into_inner())]))
    }

    async fn double(&self, request: Request<f64>) -> Reply<f32> {
        Ok(Response::new(request.into_inner() as f32))
    }

    async fn int(&self, request: Request<i32>) -> Reply<i64> {
        Ok(Response::new(i64::from(request.into_inner()) * 2))
    }

    async fn uint(&self, request: Request<u32>) -> Reply<Self::UintStream> {
        let n = u64::from(request.into_inner());
        Ok(Response::new(futures::stream::iter((0..n).map(Ok)).boxed()))
    }
}

impl unseen::layout::imported_server::Imported for Impl {
    async fn from_root(&self, request: Request<gen::Bare>) -> Reply<gen::bare::Child> {
        Ok(Response::new(
            request.into_inner().child.unwrap_or_default(),
        ))
    }

    echo!(from_deep: d::Deep);

    async fn from_keyword(
        &self,
        request: Request<type_match::Thing>,
    ) -> Reply<type_match::thing::Self_> {
        Ok(Response::new(
            request.into_inner().self_.unwrap_or_default(),
        ))
    }
}

impl gen::root_server::Root for Impl {
    async fn get(&self, request: Request<gen::Bare>) -> Reply<gen::bare::Child> {
        let mut child = request.into_inner().child.unwrap_or_default();
        child.name.push_str("/Root");
        Ok(Response::new(child))
    }
}

impl d::echo_server::Echo for Impl {
    echo!(echo: d::Deep, up: gen::Bare);
}

impl type_match::echo_server::Echo for Impl {
    async fn echo(&self, request: Request<type_match::Thing>) -> Reply<type_match::thing::Self_> {
        let mut inner = request.into_inner().self_.unwrap_or_default();
        inner.r#type.push_str("/type.match.Echo");
        Ok(Response::new(inner))
    }
}

impl unseen::same::echo_server::Echo for Impl {
    async fn echo(&self, _request: Request<unseen::same::Deep>) -> Reply<unseen::same::Deep> {
        Ok(Response::new(unseen::same::Deep {}))
    }

    async fn other(&self, _request: Request<d::Deep>) -> Reply<unseen::same::Deep> {
        Err(Status::not_found("unseen.same.Echo/Other"))
    }
}

impl unseen::proto2::legacy_server::Legacy for Impl {
    type DoManyStream = Stream<unseen::proto2::Resp>;

    async fn r#do(&self, request: Request<unseen::proto2::Req>) -> Reply<unseen::proto2::Resp> {
        let req = request.into_inner();
        Ok(Response::new(unseen::proto2::Resp {
            choice: Some(unseen::proto2::resp::Choice::Number(req.count())),
            echo: Some(req),
        }))
    }

    async fn do_many(
        &self,
        request: Request<Streaming<unseen::proto2::Req>>,
    ) -> Reply<Self::DoManyStream> {
        let replies = request.into_inner().map(|req| {
            req.map(|req| unseen::proto2::Resp {
                choice: Some(unseen::proto2::resp::Choice::Word(req.name)),
                echo: None,
            })
        });
        Ok(Response::new(replies.boxed()))
    }
}

impl unseen::optional::opt_server::Opt for Impl {
    echo!(same: unseen::optional::Maybe);
}

impl unseen::comments::docs_server::Docs for Impl {
    echo!(
        fenced: unseen::comments::Doc,
        unterminated: unseen::comments::Doc,
        nested: unseen::comments::Doc,
        inner: unseen::comments::Doc,
        outer: unseen::comments::Doc,
        block: unseen::comments::Doc,
        trailing: unseen::comments::Doc,
        hidden: unseen::comments::Doc,
    );
}

impl unseen::crlf::crlf_server::Crlf for Impl {
    echo!(get: unseen::crlf::Line);
}

impl gen::unseen::generic::t_server::T for Impl {
    type StreamStream = Stream<gen::unseen::generic::M>;

    async fn get(
        &self,
        request: Request<gen::unseen::generic::M>,
    ) -> Reply<gen::unseen::generic::M> {
        let mut message = request.into_inner();
        message.text.push_str("/T");
        Ok(Response::new(message))
    }

    async fn stream(
        &self,
        request: Request<Streaming<gen::unseen::generic::M>>,
    ) -> Reply<Self::StreamStream> {
        Ok(Response::new(request.into_inner().boxed()))
    }
}

impl gen::unseen::links::links_server::Links for Impl {
    echo!(get: gen::unseen::links::Note);
}

impl gen::unseen::seg::b::b_server::B for Impl {
    async fn b(
        &self,
        request: Request<gen::unseen::seg::b::B>,
    ) -> Reply<gen::unseen::seg::b::b::Seg> {
        Ok(Response::new(
            request.into_inner().inner.unwrap_or_default(),
        ))
    }

    async fn seg(&self, _request: Request<()>) -> Reply<gen::unseen::seg::b::B> {
        Ok(Response::new(gen::unseen::seg::b::B::default()))
    }
}

impl gen::unseen::prelude::none_server::None for Impl {
    type IntoStream = Stream<gen::unseen::prelude::auth::Some>;

    echo!(
        get: gen::unseen::prelude::Auth,
        try_into: gen::unseen::prelude::Auth,
        to_owned: gen::unseen::prelude::Auth,
        clone_into: gen::unseen::prelude::Auth,
    );

    async fn into(
        &self,
        _request: Request<gen::unseen::prelude::auth::None>,
    ) -> Reply<Self::IntoStream> {
        let items = [gen::unseen::prelude::auth::Some {}; 2].map(Ok);
        Ok(Response::new(futures::stream::iter(items).boxed()))
    }

    async fn default(
        &self,
        request: Request<Streaming<gen::unseen::prelude::auth::Ok>>,
    ) -> Reply<gen::unseen::prelude::auth::Err> {
        let n = request.into_inner().count().await;
        if n == 3 {
            Ok(Response::new(gen::unseen::prelude::auth::Err {}))
        } else {
            Err(Status::invalid_argument(format!("{n} messages")))
        }
    }
}

impl gen::my_company::api::v1::thing_api_server::ThingApi for Impl {
    echo!(
        get_thing: gen::my_company::api::v1::GetThing,
        http_get: gen::my_company::api::v1::GetThing,
    );
}

#[allow(deprecated)] // the messages, the enum and the service are deprecated
impl gen::unseen::dep::svc_server::Svc for Impl {
    type MoreStream = Stream<gen::unseen::dep::New>;

    echo!(get: gen::unseen::dep::Old);

    async fn more(
        &self,
        request: Request<Streaming<gen::unseen::dep::Old>>,
    ) -> Reply<Self::MoreStream> {
        use gen::unseen::dep::{new::KindOneOf, Mode, New, Version, Word};
        let replies = request.into_inner().map(|old| {
            old.map(|old| New {
                text: old.text.clone(),
                mode: Mode::Fast.into(),
                kind: Some(KindOneOf::OldKind(old)),
                version: Version::Version2.into(),
                word: Word::Self_.into(),
                ..New::default()
            })
        });
        Ok(Response::new(replies.boxed()))
    }
}

/// A server with every unseen service over the in-memory link, and a channel to it.
async fn channel() -> Channel {
    use unseen::{keywords, layout};
    let server = Server::builder()
        .add_service(keywords::service_server::ServiceServer::new(Impl))
        .add_service(keywords::client_server::ClientServer::new(Impl))
        .add_service(keywords::server_server::ServerServer::new(Impl))
        .add_service(keywords::type_server::TypeServer::new(Impl))
        .add_service(keywords::self_server::SelfServer::new(Impl))
        .add_service(keywords::async_server::AsyncServer::new(Impl))
        .add_service(unseen::streaming::calc_server::CalcServer::new(Impl))
        .add_service(layout::empty_server::EmptyServer::new(Impl))
        .add_service(layout::nested_server::NestedServer::new(Impl))
        .add_service(layout::well_known_server::WellKnownServer::new(Impl))
        .add_service(layout::wrappers_server::WrappersServer::new(Impl))
        .add_service(layout::imported_server::ImportedServer::new(Impl))
        .add_service(gen::root_server::RootServer::new(Impl))
        .add_service(d::echo_server::EchoServer::new(Impl))
        .add_service(type_match::echo_server::EchoServer::new(Impl))
        .add_service(unseen::same::echo_server::EchoServer::new(Impl))
        .add_service(unseen::proto2::legacy_server::LegacyServer::new(Impl))
        .add_service(unseen::optional::opt_server::OptServer::new(Impl))
        .add_service(unseen::comments::docs_server::DocsServer::new(Impl))
        .add_service(unseen::crlf::crlf_server::CrlfServer::new(Impl))
        .add_service(unseen::generic::t_server::TServer::new(Impl))
        .add_service(unseen::links::links_server::LinksServer::new(Impl))
        .add_service(unseen::seg::b::b_server::BServer::new(Impl))
        .add_service(unseen::prelude::none_server::NoneServer::new(Impl))
        .add_service(gen::my_company::api::v1::thing_api_server::ThingApiServer::new(Impl))
        .add_service(unseen::dep::svc_server::SvcServer::new(Impl))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder().connect(connector).await.unwrap()
}

#[tokio::test]
async fn keyword_and_clashing_method_names() {
    use unseen::keywords::{service_client::ServiceClient, M};
    let mut client = ServiceClient::new(channel().await);
    let m = || M { text: "x".into() };
    macro_rules! check {
        ($($method:ident => $handler:literal),* $(,)?) => {$(
            let reply = client.$method(m()).await.unwrap().into_inner();
            assert_eq!(reply.text, concat!("x/", $handler), stringify!($method));
        )*};
    }
    check!(
        r#type => "r#type", r#match => "r#match", self_ => "self_", super_ => "super_",
        crate_ => "crate_", extern_ => "extern_", r#async => "r#async", r#await => "r#await",
        r#try => "r#try", r#gen => "r#gen", r#dyn => "r#dyn", r#fn => "r#fn",
        r#impl => "r#impl", r#loop => "r#loop",
        // The client's own methods keep their names; the rpcs get a `_`.
        new_ => "new", clone_ => "clone", get_ref_ => "get_ref", get_mut_ => "get_mut",
        into_inner_ => "into_inner", with_retries_ => "with_retries",
        with_interceptor => "with_interceptor", from_arc => "from_arc", call => "call",
        poll_ready => "poll_ready", fmt => "fmt", ready => "ready", all => "all",
        name => "name", inner => "inner", request => "request", drop => "drop",
    );
    // ... and still work.
    let _channel: &Channel = client.clone().get_ref();
    let _channel: Channel = client.into_inner();

    let mut client = unseen::keywords::client_client::ClientClient::new(channel().await);
    assert_eq!(
        client.client(m()).await.unwrap().into_inner().text,
        "x/client"
    );
    assert_eq!(
        client.server(m()).await.unwrap().into_inner().text,
        "x/server"
    );
    let mut client = unseen::keywords::server_client::ServerClient::new(channel().await);
    assert_eq!(
        client.server(m()).await.unwrap().into_inner().text,
        "x/server"
    );
    let mut client = unseen::keywords::type_client::TypeClient::new(channel().await);
    assert_eq!(client.get(m()).await.unwrap().into_inner().text, "x/get");
    let mut client = unseen::keywords::self_client::SelfClient::new(channel().await);
    assert_eq!(client.get(m()).await.unwrap().into_inner().text, "x/get");
    let mut client = unseen::keywords::async_client::AsyncClient::new(channel().await);
    let replies: Vec<_> = client
        .get(futures::stream::iter([m(), m()]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(replies.len(), 2);

    use unseen::keywords::{self_methods, service_methods, type_methods};
    assert_eq!(service_methods::TYPE.path, "unseen.keywords.Service/type");
    assert_eq!(service_methods::SELF.path, "unseen.keywords.Service/Self");
    assert_eq!(
        service_methods::ALL_METHOD.path,
        "unseen.keywords.Service/ALL"
    );
    assert_eq!(service_methods::ALL.len(), 31);
    assert_eq!(type_methods::GET.path, "unseen.keywords.type/Get");
    assert_eq!(self_methods::GET.path, "unseen.keywords.Self/Get");
    assert_eq!(
        <unseen::keywords::self_server::SelfServer<Impl> as NamedService>::NAME,
        "unseen.keywords.Self"
    );
}

#[tokio::test]
#[allow(deprecated)] // `Add` is deprecated in the .proto
async fn every_streaming_kind_in_one_service() {
    use unseen::streaming::{calc_client::CalcClient, calc_methods, Num};
    let mut client = CalcClient::new(channel().await);
    let add = client.add(Num { value: 41 }).await.unwrap().into_inner();
    assert_eq!(add.value, 42);
    let counted: Vec<i64> = client
        .count(Num { value: 3 })
        .await
        .unwrap()
        .into_inner()
        .map(|n| n.unwrap().value)
        .collect()
        .await;
    assert_eq!(counted, [0, 1, 2]);
    let numbers = futures::stream::iter((1..=4).map(|value| Num { value }));
    let sum = client.sum(numbers).await.unwrap().into_inner();
    assert_eq!(sum.value, 10);
    let numbers = futures::stream::iter((1..=3).map(|value| Num { value }));
    let echoed: Vec<i64> = client
        .echo(Request::new(numbers))
        .await
        .unwrap()
        .into_inner()
        .map(|n| n.unwrap().value)
        .collect()
        .await;
    assert_eq!(echoed, [1, 2, 3]);
    let mut none = client
        .count_stream(Num::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.message().await.unwrap().is_none());

    // `idempotency_level` becomes the descriptor's idempotency; `deprecated` changes
    // nothing.
    assert_eq!(calc_methods::ADD.idempotency, Idempotency::NoSideEffects);
    assert_eq!(calc_methods::COUNT.idempotency, Idempotency::Idempotent);
    assert_eq!(calc_methods::SUM.idempotency, Idempotency::Unknown);
}

#[tokio::test]
async fn nested_well_known_and_wrapper_types() {
    use unseen::layout::{
        nested_client::NestedClient, outer, well_known_client::WellKnownClient,
        wrappers_client::WrappersClient, Outer,
    };
    let channel = channel().await;
    let mut nested = NestedClient::new(channel.clone());
    let inner = outer::Inner {
        innermost: Some(outer::inner::Innermost { depth: 3 }),
    };
    let innermost = nested.down(inner).await.unwrap().into_inner();
    assert_eq!(innermost.depth, 3);
    let outer = Outer { inner: Some(inner) };
    assert_eq!(nested.same(outer).await.unwrap().into_inner(), outer);

    let mut wkt = WellKnownClient::new(channel.clone());
    wkt.nothing(()).await.unwrap();
    let at = prost_types::Timestamp {
        seconds: 5,
        nanos: 6,
    };
    let duration = wkt.when(at).await.unwrap().into_inner();
    assert_eq!((duration.seconds, duration.nanos), (5, 6));
    let any = prost_types::Any {
        type_url: "type.example/x".into(),
        value: vec![1],
    };
    let fields = wkt.anything(any).await.unwrap().into_inner().fields;
    assert!(fields.contains_key("type_url"));
    let value = prost_types::Value {
        kind: Some(prost_types::value::Kind::BoolValue(true)),
    };
    assert_eq!(wkt.value(value).await.unwrap().into_inner().values.len(), 2);
    assert!(wkt.wrapped(String::new()).await.unwrap().into_inner());
    let times: Vec<_> = wkt
        .stream(futures::stream::iter([(), (), ()]))
        .await
        .unwrap()
        .into_inner()
        .map(|t| t.unwrap().seconds)
        .collect()
        .await;
    assert_eq!(times, [0, 1, 2]);

    let mut wrappers = WrappersClient::new(channel);
    assert_eq!(wrappers.bool(true).await.unwrap().into_inner(), [1]);
    assert_eq!(wrappers.double(0.5).await.unwrap().into_inner(), 0.5);
    assert_eq!(wrappers.int(21).await.unwrap().into_inner(), 42);
    let n = wrappers.uint(4).await.unwrap().into_inner().count().await;
    assert_eq!(n, 4);
}

#[tokio::test]
async fn packages_without_names_deep_and_keywords() {
    let channel = channel().await;
    let bare = gen::Bare {
        child: Some(gen::bare::Child { name: "c".into() }),
    };
    let mut root = gen::root_client::RootClient::new(channel.clone());
    assert_eq!(
        root.get(bare.clone()).await.unwrap().into_inner().name,
        "c/Root"
    );
    assert_eq!(gen::root_methods::GET.path, "Root/Get");

    let mut imported = unseen::layout::imported_client::ImportedClient::new(channel.clone());
    assert_eq!(
        imported
            .from_root(bare.clone())
            .await
            .unwrap()
            .into_inner()
            .name,
        "c"
    );
    let deep = d::Deep {
        bare: Some(bare.clone()),
    };
    assert_eq!(
        imported.from_deep(deep.clone()).await.unwrap().into_inner(),
        deep
    );
    let thing = type_match::Thing {
        self_: Some(type_match::thing::Self_ { r#type: "t".into() }),
    };
    let reply = imported.from_keyword(thing.clone()).await.unwrap();
    assert_eq!(reply.into_inner().r#type, "t");

    // Three services named `Echo`, in three packages.
    let mut deep_echo = d::echo_client::EchoClient::new(channel.clone());
    assert_eq!(
        deep_echo.echo(deep.clone()).await.unwrap().into_inner(),
        deep
    );
    assert_eq!(deep_echo.up(bare.clone()).await.unwrap().into_inner(), bare);
    let mut keyword_echo = type_match::echo_client::EchoClient::new(channel.clone());
    let reply = keyword_echo.echo(thing).await.unwrap().into_inner();
    assert_eq!(reply.r#type, "t/type.match.Echo");
    let mut same_echo = unseen::same::echo_client::EchoClient::new(channel);
    same_echo.echo(unseen::same::Deep {}).await.unwrap();
    let status = same_echo.other(deep).await.unwrap_err();
    assert_eq!(status.message(), "unseen.same.Echo/Other");
    assert_eq!(d::echo_methods::ECHO.path, "a.b.c.d.Echo/Echo");
    assert_eq!(type_match::echo_methods::ECHO.path, "type.match.Echo/Echo");
    assert_eq!(
        unseen::same::echo_methods::ECHO.path,
        "unseen.same.Echo/Echo"
    );
    assert!(unseen::layout::empty_methods::ALL.is_empty());
}

#[tokio::test]
async fn proto2_and_proto3_optional() {
    use unseen::proto2::{legacy_client::LegacyClient, req, resp::Choice, Req};
    let channel = channel().await;
    let mut legacy = LegacyClient::new(channel.clone());
    let request = Req {
        name: "n".into(),
        item: vec![req::Item { id: 1, label: None }],
        ..Req::default()
    };
    // Defaults of the `.proto`.
    assert_eq!(request.count(), 7);
    assert_eq!(request.mode(), "fast\"\\");
    assert_eq!(request.ratio(), f64::INFINITY);
    assert_eq!(request.raw(), b"\x01\x02");
    assert_eq!(request.kind(), req::Kind::Second);
    let reply = legacy.r#do(request.clone()).await.unwrap().into_inner();
    assert_eq!(reply.choice, Some(Choice::Number(7)));
    assert_eq!(reply.echo, Some(request.clone()));
    let words: Vec<_> = legacy
        .do_many(futures::stream::iter([request.clone(), request]))
        .await
        .unwrap()
        .into_inner()
        .map(|resp| resp.unwrap().choice)
        .collect()
        .await;
    assert_eq!(
        words,
        [
            Some(Choice::Word("n".into())),
            Some(Choice::Word("n".into()))
        ]
    );

    let mut opt = unseen::optional::opt_client::OptClient::new(channel);
    let maybe = unseen::optional::Maybe {
        name: Some(String::new()),
        count: None,
        next: Some(Box::default()),
    };
    assert_eq!(opt.same(maybe.clone()).await.unwrap().into_inner(), maybe);
}

#[tokio::test]
async fn commented_services() {
    use unseen::comments::{docs_client::DocsClient, Doc};
    let channel = channel().await;
    let mut docs = DocsClient::new(channel.clone());
    let doc = Doc {
        text: "*/ ``` \\".into(),
    };
    for reply in [
        docs.fenced(doc.clone()).await,
        docs.unterminated(doc.clone()).await,
        docs.nested(doc.clone()).await,
        docs.inner(doc.clone()).await,
        docs.outer(doc.clone()).await,
        docs.block(doc.clone()).await,
        docs.trailing(doc.clone()).await,
        docs.hidden(doc.clone()).await,
    ] {
        assert_eq!(reply.unwrap().into_inner(), doc);
    }
    let mut crlf = unseen::crlf::crlf_client::CrlfClient::new(channel);
    let line = unseen::crlf::Line { text: "l".into() };
    assert_eq!(crlf.get(line.clone()).await.unwrap().into_inner(), line);
}

#[tokio::test]
async fn names_like_generated_and_prelude_items() {
    use unseen::generic::{t_client::TClient, t_methods, M};
    let channel = channel().await;
    // A service `T`: its trait next to the server's type parameter `T`.
    let mut t = TClient::new(channel.clone());
    let m = M { text: "x".into() };
    assert_eq!(t.get(m.clone()).await.unwrap().into_inner().text, "x/T");
    let echoed: Vec<_> = t
        .stream(futures::stream::iter([m.clone(), m]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(echoed.len(), 2);
    assert_eq!(t_methods::GET.path, "unseen.generic.T/Get");
    assert_eq!(
        <unseen::generic::t_server::TServer<Impl> as NamedService>::NAME,
        "unseen.generic.T"
    );

    // A message and a service named like their package's last segment.
    use unseen::seg::b::{b, b_client::BClient, B};
    let mut client = BClient::new(channel.clone());
    let message = B {
        inner: Some(b::Seg { name: "s".into() }),
    };
    assert_eq!(client.b(message).await.unwrap().into_inner().name, "s");
    assert_eq!(client.seg(()).await.unwrap().into_inner(), B::default());
    assert_eq!(unseen::seg::b::b_methods::B.path, "unseen.seg.b.B/b");

    // Messages named like prelude items, a service `None` with rpcs `Into` (`into_` in
    // the client, as `Into::into` would be called), `Default`.
    use unseen::prelude::{auth, none_client::NoneClient, Auth};
    let mut none = NoneClient::new(channel.clone());
    let auth = Auth {
        kind: Some(auth::Kind::Str(auth::String {})),
        r#type: auth::Type::Some.into(),
        opt: Some(auth::Option {}),
        children: [(1, Auth::default())].into_iter().collect(),
        ..Auth::default()
    };
    assert_eq!(none.get(auth.clone()).await.unwrap().into_inner(), auth);
    for reply in [
        none.try_into_(auth.clone()).await,
        none.to_owned_(auth.clone()).await,
        none.clone_into_(auth.clone()).await,
    ] {
        assert_eq!(reply.unwrap().into_inner(), auth);
    }
    assert_eq!(
        auth::Type::from_str_name("TYPE_NONE"),
        Some(auth::Type::None)
    );
    let n = none
        .into_(auth::None {})
        .await
        .unwrap()
        .into_inner()
        .count()
        .await;
    assert_eq!(n, 2);
    let oks = futures::stream::iter([auth::Ok {}, auth::Ok {}, auth::Ok {}]);
    none.default(oks).await.unwrap();

    // An upper camel case package.
    use gen::my_company::api::v1::{thing_api_client::ThingApiClient, thing_api_methods, GetThing};
    let mut things = ThingApiClient::new(channel.clone());
    let thing = GetThing { id: "1".into() };
    assert_eq!(
        things.get_thing(thing.clone()).await.unwrap().into_inner(),
        thing
    );
    assert_eq!(
        things.http_get(thing.clone()).await.unwrap().into_inner(),
        thing
    );
    assert_eq!(
        thing_api_methods::HTTP_GET.path,
        "MyCompany.API.V1.ThingAPI/HTTPGet"
    );

    // Comments full of links still make a working service.
    let mut links = unseen::links::links_client::LinksClient::new(channel.clone());
    let note = unseen::links::Note {
        text: "[[Note]](Note)".into(),
        r#type: Some(unseen::links::note::Type::Name("n".into())),
    };
    assert_eq!(links.get(note.clone()).await.unwrap().into_inner(), note);
}

#[tokio::test]
#[allow(deprecated)] // the service, its method `Get` and fields are deprecated
async fn deprecated_items_and_enum_prefixes() {
    use unseen::dep::{new::KindOneOf, svc_client::SvcClient, Mode, Old, Version, Word};
    let mut client = SvcClient::new(channel().await);
    let old = Old { text: "o".into() };
    assert_eq!(client.get(old.clone()).await.unwrap().into_inner(), old);
    let replies: Vec<_> = client
        .more(futures::stream::iter([old.clone()]))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(replies.len(), 1);
    let reply = &replies[0];
    assert_eq!(reply.text, "o");
    assert_eq!(reply.mode(), Mode::Fast);
    assert_eq!(reply.kind, Some(KindOneOf::OldKind(old)));
    assert_eq!(reply.version(), Version::Version2);
    assert_eq!(reply.word(), Word::Self_);
    assert_eq!(Word::Word.as_str_name(), "WORD");
}

// Round 2: `round2_*.proto`.

use gen::round2;

/// Implements every round-2 service.
struct Round2;

/// A stream of one `Tick` carrying `n`, so that the tests see which handler ran.
fn one_tick(n: i64) -> Stream<round2::streams::Tick> {
    futures::stream::iter([Ok(round2::streams::Tick { n })]).boxed()
}

impl round2::streams::ticker_server::Ticker for Round2 {
    // `Tick_1` and `Tick1` would both have `Tick1Stream`: the second gets a `_`.
    type Tick1Stream = Stream<round2::streams::Tick>;
    type Tick1Stream_ = Stream<round2::streams::Tick>;
    type ABStream = Stream<round2::streams::Tick>;
    type AbStream = Stream<round2::streams::Tick>;
    type Tick1StreamStream = Stream<round2::streams::Tick>;
    type DoubleUnderStream = Stream<round2::streams::Tick>;

    async fn tick_1(&self, _request: Request<round2::streams::Tick>) -> Reply<Self::Tick1Stream> {
        Ok(Response::new(one_tick(1)))
    }

    async fn tick1(&self, _request: Request<round2::streams::Tick>) -> Reply<Self::Tick1Stream_> {
        Ok(Response::new(one_tick(2)))
    }

    async fn a_b(
        &self,
        _request: Request<Streaming<round2::streams::Tick>>,
    ) -> Reply<Self::ABStream> {
        Ok(Response::new(one_tick(3)))
    }

    async fn ab(
        &self,
        _request: Request<Streaming<round2::streams::Tick>>,
    ) -> Reply<Self::AbStream> {
        Ok(Response::new(one_tick(4)))
    }

    async fn tick1_stream(
        &self,
        _request: Request<round2::streams::Tick>,
    ) -> Reply<Self::Tick1StreamStream> {
        Ok(Response::new(one_tick(5)))
    }

    async fn leading(
        &self,
        _request: Request<round2::streams::Tick>,
    ) -> Reply<round2::streams::Tick> {
        Ok(Response::new(round2::streams::Tick { n: 6 }))
    }

    async fn trailing(
        &self,
        _request: Request<round2::streams::Tick>,
    ) -> Reply<round2::streams::Tick> {
        Ok(Response::new(round2::streams::Tick { n: 7 }))
    }

    async fn double_under(
        &self,
        _request: Request<round2::streams::Tick>,
    ) -> Reply<Self::DoubleUnderStream> {
        Ok(Response::new(one_tick(8)))
    }

    async fn v1_2(&self, _request: Request<round2::streams::Tick>) -> Reply<round2::streams::Tick> {
        Ok(Response::new(round2::streams::Tick { n: 9 }))
    }
}

impl round2::case_pkg::upper_svc_server::UpperSvc for Round2 {
    async fn get(
        &self,
        request: Request<round2::case_pkg::Upper>,
    ) -> Reply<round2::case_pkg::Lower> {
        let text = request.into_inner().text + "/UpperSvc";
        Ok(Response::new(round2::case_pkg::Lower { text }))
    }
}

impl round2::case_pkg::lower_svc_server::LowerSvc for Round2 {
    async fn get(
        &self,
        request: Request<round2::case_pkg::Lower>,
    ) -> Reply<round2::case_pkg::Lower> {
        let text = request.into_inner().text + "/LowerSvc";
        Ok(Response::new(round2::case_pkg::Lower { text }))
    }
}

impl round2::maps::registry_server::Registry for Round2 {
    async fn register(
        &self,
        request: Request<round2::maps::RegistryClient>,
    ) -> Reply<round2::maps::RegistryServer> {
        let client = request.into_inner();
        Ok(Response::new(round2::maps::RegistryServer {
            name: client.labels.get("name").cloned(),
            clients: [(1, client)].into_iter().collect(),
        }))
    }
}

/// Implements rpcs that append `/name` to `Msg.text`, each `name: Service`.
macro_rules! tag_msg {
    ($($name:ident)*) => {$(
        async fn $name(&self, request: Request<round2::names::Msg>) -> Reply<round2::names::Msg> {
            let mut message = request.into_inner();
            message.text.push_str(concat!("/", stringify!($name)));
            Ok(Response::new(message))
        }
    )*};
}

impl round2::names::v1_2service_server::V12service for Round2 {
    tag_msg!(get);
}

impl round2::names::leading_server::Leading for Round2 {
    tag_msg!(get);
}

impl round2::names::trailing_server::Trailing for Round2 {
    tag_msg!(get);
}

impl round2::names::service_x_server::ServiceX for Round2 {
    tag_msg!(get);
}

impl round2::names::result_server::Result for Round2 {
    type FutureStream = Stream<round2::names::Msg>;

    tag_msg!(result option r#box string vec send sync arc pin poll context ok err some none
        sized unpin self_);

    async fn future(&self, request: Request<round2::names::Msg>) -> Reply<Self::FutureStream> {
        let mut message = request.into_inner();
        message.text.push_str("/future");
        Ok(Response::new(futures::stream::iter([Ok(message)]).boxed()))
    }
}

impl round2::names::future_server::Future for Round2 {
    tag_msg!(poll);
}

impl round2::names::send_server::Send for Round2 {
    async fn send(
        &self,
        request: Request<Streaming<round2::names::Msg>>,
    ) -> Reply<round2::names::Msg> {
        let n = request.into_inner().count().await;
        Ok(Response::new(round2::names::Msg {
            text: format!("{n}/send"),
        }))
    }
}

impl round2::names::box_server::Box for Round2 {
    tag_msg!(new);
}

impl round2::names::option_server::Option for Round2 {
    tag_msg!(get);
}

impl round2::names::string_server::String for Round2 {
    tag_msg!(to_string);
}

impl round2::names::named_service_server::NamedService for Round2 {
    type StreamingStream = Stream<round2::names::Msg>;

    tag_msg!(name methods unary_methods file_descriptor_set connect from_channel balanced
        into_request status as_ref borrow eq hash type_id index_mut next clone_from);

    async fn streaming(
        &self,
        request: Request<Streaming<round2::names::Msg>>,
    ) -> Reply<Self::StreamingStream> {
        Ok(Response::new(request.into_inner().boxed()))
    }
}

use round2::names::a_very_long_service_name_that_goes_on_and_on_and_on_for_more_than_one_hundred_characters_to_see_whether_anything_breaks_with_it_server as long_server;

impl long_server::AVeryLongServiceNameThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersToSeeWhetherAnythingBreaksWithIt for Round2 {
    type AVeryLongMethodNameThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersToSeeWhetherAnythingBreaksWithItStream = Stream<round2::names::Msg>;

    async fn a_very_long_method_name_that_goes_on_and_on_and_on_for_more_than_one_hundred_characters_to_see_whether_anything_breaks_with_it(
        &self,
        request: Request<round2::names::Msg>,
    ) -> Reply<Self::AVeryLongMethodNameThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersToSeeWhetherAnythingBreaksWithItStream> {
        Ok(Response::new(futures::stream::iter([Ok(request.into_inner())]).boxed()))
    }
}

impl round2::wkt::types_server::Types for Round2 {
    type WatchStream = Stream<prost_types::Timestamp>;
    type ChatStream = Stream<prost_types::Any>;
    type FilesStream = Stream<prost_types::FileDescriptorProto>;
    type BytesStream = Stream<String>;

    async fn watch(&self, _request: Request<()>) -> Reply<Self::WatchStream> {
        let times = (1..=2).map(|seconds| Ok(prost_types::Timestamp { seconds, nanos: 0 }));
        Ok(Response::new(futures::stream::iter(times).boxed()))
    }

    async fn upload(&self, request: Request<Streaming<prost_types::Any>>) -> Reply<()> {
        let mut anys = request.into_inner();
        while let Some(any) = anys.message().await? {
            if any.type_url.is_empty() {
                return Err(Status::invalid_argument("no type URL"));
            }
        }
        Ok(Response::new(()))
    }

    async fn chat(
        &self,
        request: Request<Streaming<prost_types::Timestamp>>,
    ) -> Reply<Self::ChatStream> {
        let anys = request.into_inner().map(|time| {
            time.map(|time| prost_types::Any {
                type_url: format!("t/{}", time.seconds),
                value: Vec::new(),
            })
        });
        Ok(Response::new(anys.boxed()))
    }

    async fn mine(&self, request: Request<round2::wkt::Empty>) -> Reply<()> {
        match request.into_inner().inner {
            Some(()) => Ok(Response::new(())),
            None => Err(Status::invalid_argument("no inner Empty")),
        }
    }

    async fn mask(
        &self,
        request: Request<prost_types::FieldMask>,
    ) -> Reply<prost_types::source_code_info::Location> {
        Ok(Response::new(prost_types::source_code_info::Location {
            leading_detached_comments: request.into_inner().paths,
            ..Default::default()
        }))
    }

    async fn files(
        &self,
        request: Request<prost_types::FileDescriptorSet>,
    ) -> Reply<Self::FilesStream> {
        let files = request.into_inner().file.into_iter().map(Ok);
        Ok(Response::new(futures::stream::iter(files).boxed()))
    }

    async fn method(&self, request: Request<prost_types::Method>) -> Reply<prost_types::Api> {
        Ok(Response::new(prost_types::Api {
            methods: vec![request.into_inner()],
            ..Default::default()
        }))
    }

    async fn plugin(
        &self,
        request: Request<prost_types::compiler::CodeGeneratorRequest>,
    ) -> Reply<prost_types::compiler::CodeGeneratorResponse> {
        Ok(Response::new(
            prost_types::compiler::CodeGeneratorResponse {
                error: request.into_inner().parameter,
                ..Default::default()
            },
        ))
    }

    async fn bytes(&self, request: Request<Streaming<Vec<u8>>>) -> Reply<Self::BytesStream> {
        let strings = request
            .into_inner()
            .map(|bytes| bytes.map(|bytes| String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Response::new(strings.boxed()))
    }
}

impl round2::r#pub::fetch_server::Fetch for Round2 {
    type ManyStream = Stream<round2::r#pub::Wrapped>;

    async fn get(
        &self,
        request: Request<round2::dep::v1::Shared>,
    ) -> Reply<round2::r#pub::Wrapped> {
        Ok(Response::new(round2::r#pub::Wrapped {
            shared: Some(request.into_inner()),
        }))
    }

    async fn many(
        &self,
        request: Request<Streaming<round2::dep::v1::Shared>>,
    ) -> Reply<Self::ManyStream> {
        let wrapped = request.into_inner().map(|shared| {
            shared.map(|shared| round2::r#pub::Wrapped {
                shared: Some(shared),
            })
        });
        Ok(Response::new(wrapped.boxed()))
    }
}

impl round2::r#pub::nothing_server::Nothing for Round2 {}

impl gen::lonely_server::Lonely for Round2 {}

impl gen::bare2_server::Bare2 for Round2 {
    echo!(get: gen::Bare);
}

#[allow(deprecated)] // the service is deprecated, and so are some of its methods
impl round2::super_::self_::library_server::Library for Round2 {
    type StreamedStream = Stream<round2::super_::self_::Book>;

    echo!(
        get_book: round2::super_::self_::Book,
        create_book: round2::super_::self_::Book,
        empty: round2::super_::self_::Book,
        semicolon: round2::super_::self_::Book,
    );

    async fn streamed(
        &self,
        request: Request<Streaming<round2::super_::self_::Book>>,
    ) -> Reply<Self::StreamedStream> {
        Ok(Response::new(request.into_inner().boxed()))
    }
}

impl round2::groups::search_server::Search for Round2 {
    type RowsStream = Stream<round2::groups::query::result::Row>;

    async fn find(
        &self,
        request: Request<round2::groups::Query>,
    ) -> Reply<round2::groups::query::Result> {
        Ok(Response::new(
            request.into_inner().result.unwrap_or_default(),
        ))
    }

    async fn rows(
        &self,
        request: Request<round2::groups::query::Result>,
    ) -> Reply<Self::RowsStream> {
        let rows = request.into_inner().row.into_iter().map(Ok);
        Ok(Response::new(futures::stream::iter(rows).boxed()))
    }

    async fn options(
        &self,
        request: Request<Streaming<round2::groups::query::Option>>,
    ) -> Reply<round2::groups::Query> {
        let mut options = request.into_inner();
        let mut query = round2::groups::Query::default();
        while let Some(option) = options.message().await? {
            query.option.push(option);
        }
        Ok(Response::new(query))
    }
}

impl round2::unicode::bidi_server::Bidi for Round2 {
    echo!(get: round2::unicode::Text);
}

impl round2::blocks::blocks_server::Blocks for Round2 {
    echo!(
        get: round2::blocks::Quoted,
        empty_comment: round2::blocks::Quoted,
        table: round2::blocks::Quoted,
    );
}

/// A server with every round-2 service over the in-memory link, and a channel to it.
async fn round2_channel() -> Channel {
    use round2::names;
    let server = Server::builder()
        .add_service(round2::streams::ticker_server::TickerServer::new(Round2))
        .add_service(round2::case_pkg::upper_svc_server::UpperSvcServer::new(Round2))
        .add_service(round2::case_pkg::lower_svc_server::LowerSvcServer::new(Round2))
        .add_service(round2::maps::registry_server::RegistryServer::new(Round2))
        .add_service(names::v1_2service_server::V12serviceServer::new(Round2))
        .add_service(names::leading_server::LeadingServer::new(Round2))
        .add_service(names::trailing_server::TrailingServer::new(Round2))
        .add_service(names::service_x_server::ServiceXServer::new(Round2))
        .add_service(names::result_server::ResultServer::new(Round2))
        .add_service(names::future_server::FutureServer::new(Round2))
        .add_service(names::send_server::SendServer::new(Round2))
        .add_service(names::box_server::BoxServer::new(Round2))
        .add_service(names::option_server::OptionServer::new(Round2))
        .add_service(names::string_server::StringServer::new(Round2))
        .add_service(names::named_service_server::NamedServiceServer::new(Round2))
        .add_service(long_server::AVeryLongServiceNameThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersToSeeWhetherAnythingBreaksWithItServer::new(Round2))
        .add_service(round2::wkt::types_server::TypesServer::new(Round2))
        .add_service(round2::r#pub::fetch_server::FetchServer::new(Round2))
        .add_service(round2::r#pub::nothing_server::NothingServer::new(Round2))
        .add_service(gen::lonely_server::LonelyServer::new(Round2))
        .add_service(gen::bare2_server::Bare2Server::new(Round2))
        .add_service(round2::super_::self_::library_server::LibraryServer::new(Round2))
        .add_service(round2::groups::search_server::SearchServer::new(Round2))
        .add_service(round2::unicode::bidi_server::BidiServer::new(Round2))
        .add_service(round2::blocks::blocks_server::BlocksServer::new(Round2))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder().connect(connector).await.unwrap()
}

#[tokio::test]
async fn stream_types_that_would_clash_get_an_underscore() {
    use round2::streams::{ticker_client::TickerClient, ticker_methods as methods, Tick};
    let mut client = TickerClient::new(round2_channel().await);
    macro_rules! first_tick {
        ($call:expr) => {
            $call
                .await
                .unwrap()
                .into_inner()
                .message()
                .await
                .unwrap()
                .unwrap()
                .n
        };
    }
    assert_eq!(first_tick!(client.tick_1(Tick::default())), 1);
    assert_eq!(first_tick!(client.tick1(Tick::default())), 2);
    let ticks = || futures::stream::iter([Tick::default()]);
    assert_eq!(first_tick!(client.a_b(ticks())), 3);
    assert_eq!(first_tick!(client.ab(ticks())), 4);
    assert_eq!(first_tick!(client.tick1_stream(Tick::default())), 5);
    assert_eq!(
        client
            .leading(Tick::default())
            .await
            .unwrap()
            .into_inner()
            .n,
        6
    );
    assert_eq!(
        client
            .trailing(Tick::default())
            .await
            .unwrap()
            .into_inner()
            .n,
        7
    );
    assert_eq!(first_tick!(client.double_under(Tick::default())), 8);
    assert_eq!(
        client.v1_2(Tick::default()).await.unwrap().into_inner().n,
        9
    );

    // Paths keep the `.proto`'s spelling.
    for (method, path) in [
        (methods::TICK_1, "round2.streams.Ticker/Tick_1"),
        (methods::TICK1, "round2.streams.Ticker/Tick1"),
        (methods::A_B, "round2.streams.Ticker/a_b"),
        (methods::AB, "round2.streams.Ticker/AB"),
        (methods::TICK1_STREAM, "round2.streams.Ticker/Tick1Stream"),
        (methods::LEADING, "round2.streams.Ticker/_Leading"),
        (methods::TRAILING, "round2.streams.Ticker/Trailing_"),
        (methods::DOUBLE_UNDER, "round2.streams.Ticker/Double__Under"),
        (methods::V1_2, "round2.streams.Ticker/V1_2"),
    ] {
        assert_eq!(method.path, path);
    }
    assert_eq!(methods::ALL.len(), 9);
}

#[tokio::test]
async fn packages_that_differ_in_case_share_a_module() {
    use round2::case_pkg::{
        lower_svc_client::LowerSvcClient, lower_svc_server::LowerSvcServer,
        upper_svc_client::UpperSvcClient, upper_svc_methods, upper_svc_server::UpperSvcServer,
        Lower, Upper,
    };
    let channel = round2_channel().await;
    let mut upper = UpperSvcClient::new(channel.clone());
    let reply = upper.get(Upper { text: "u".into() }).await.unwrap();
    assert_eq!(reply.into_inner().text, "u/UpperSvc");
    let mut lower = LowerSvcClient::new(channel);
    let reply = lower.get(Lower { text: "l".into() }).await.unwrap();
    assert_eq!(reply.into_inner().text, "l/LowerSvc");
    assert_eq!(upper_svc_methods::GET.path, "round2.CasePkg.UpperSvc/Get");
    assert_eq!(
        <UpperSvcServer<Round2> as NamedService>::NAME,
        "round2.CasePkg.UpperSvc"
    );
    assert_eq!(
        <LowerSvcServer<Round2> as NamedService>::NAME,
        "round2.case_pkg.LowerSvc"
    );
    // One module, one descriptor set, with both packages' files.
    assert!(std::ptr::eq(
        <UpperSvcServer<Round2> as NamedService>::FILE_DESCRIPTOR_SET,
        <LowerSvcServer<Round2> as NamedService>::FILE_DESCRIPTOR_SET,
    ));
}

#[tokio::test]
async fn messages_named_like_service_modules_with_map_fields() {
    use round2::maps::{registry_client, RegistryClient};
    let mut client = registry_client::RegistryClient::new(round2_channel().await);
    let message = RegistryClient {
        labels: [("name".to_owned(), "r".to_owned())].into_iter().collect(),
    };
    let reply = client.register(message.clone()).await.unwrap().into_inner();
    assert_eq!(reply.name.as_deref(), Some("r"));
    assert_eq!(reply.clients[&1], message);
}

#[tokio::test]
async fn services_and_methods_named_like_std_and_generated_items() {
    use round2::names::{self as names, Msg};
    let channel = round2_channel().await;
    let msg = || Msg { text: "x".into() };

    let mut client = names::v1_2service_client::V12serviceClient::new(channel.clone());
    assert_eq!(client.get(msg()).await.unwrap().into_inner().text, "x/get");
    assert_eq!(
        names::v1_2service_methods::GET.path,
        "round2.names.V1_2Service/Get"
    );
    let mut client = names::leading_client::LeadingClient::new(channel.clone());
    assert_eq!(client.get(msg()).await.unwrap().into_inner().text, "x/get");
    assert_eq!(
        names::leading_methods::GET.path,
        "round2.names._Leading/Get"
    );
    let mut client = names::trailing_client::TrailingClient::new(channel.clone());
    assert_eq!(client.get(msg()).await.unwrap().into_inner().text, "x/get");
    assert_eq!(
        names::trailing_methods::GET.path,
        "round2.names.Trailing_/Get"
    );
    let mut client = names::service_x_client::ServiceXClient::new(channel.clone());
    assert_eq!(client.get(msg()).await.unwrap().into_inner().text, "x/get");
    assert_eq!(
        names::service_x_methods::GET.path,
        "round2.names.Service__x/Get"
    );

    let mut client = names::result_client::ResultClient::new(channel.clone());
    macro_rules! check {
        ($client:ident: $($method:ident => $handler:literal),* $(,)?) => {$(
            let reply = $client.$method(msg()).await.unwrap().into_inner();
            assert_eq!(reply.text, concat!("x/", $handler), stringify!($method));
        )*};
    }
    check!(client:
        result => "result", option => "option", r#box => "r#box", string => "string",
        vec => "vec", send => "send", sync => "sync", arc => "arc", pin => "pin",
        poll => "poll", context => "context", ok => "ok", err => "err", some => "some",
        none => "none", sized => "sized", unpin => "unpin", self_ => "self_",
    );
    let mut futures = client.future(msg()).await.unwrap().into_inner();
    assert_eq!(futures.message().await.unwrap().unwrap().text, "x/future");
    assert_eq!(
        names::result_methods::SELF.path,
        "round2.names.Result/Self_"
    );

    let mut client = names::future_client::FutureClient::new(channel.clone());
    assert_eq!(
        client.poll(msg()).await.unwrap().into_inner().text,
        "x/poll"
    );
    let mut client = names::send_client::SendClient::new(channel.clone());
    let reply = client.send(futures::stream::iter([msg(), msg()])).await;
    assert_eq!(reply.unwrap().into_inner().text, "2/send");
    let mut client = names::box_client::BoxClient::new(channel.clone());
    assert_eq!(client.new_(msg()).await.unwrap().into_inner().text, "x/new");
    let mut client = names::option_client::OptionClient::new(channel.clone());
    assert_eq!(client.get(msg()).await.unwrap().into_inner().text, "x/get");
    let mut client = names::string_client::StringClient::new(channel.clone());
    let reply = client.to_string(msg()).await.unwrap().into_inner();
    assert_eq!(reply.text, "x/to_string");

    let mut client = names::named_service_client::NamedServiceClient::new(channel.clone());
    check!(client:
        name => "name", methods => "methods", unary_methods => "unary_methods",
        file_descriptor_set => "file_descriptor_set", connect_ => "connect",
        from_channel => "from_channel", balanced_ => "balanced",
        into_request => "into_request", status => "status", as_ref => "as_ref",
        borrow => "borrow", eq => "eq", hash => "hash", type_id => "type_id",
        index_mut => "index_mut", next => "next", clone_from => "clone_from",
    );
    let echoed: Vec<_> = client
        .streaming(futures::stream::iter([msg()]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(echoed.len(), 1);
    type Named = names::named_service_server::NamedServiceServer<Round2>;
    assert_eq!(<Named as NamedService>::NAME, "round2.names.NamedService");
    assert_eq!(<Named as NamedService>::METHODS.len(), 18);
    assert_eq!(<Named as NamedService>::UNARY_METHODS.len(), 17);

    use names::a_very_long_service_name_that_goes_on_and_on_and_on_for_more_than_one_hundred_characters_to_see_whether_anything_breaks_with_it_client as long_client;
    let mut client = long_client::AVeryLongServiceNameThatGoesOnAndOnAndOnForMoreThanOneHundredCharactersToSeeWhetherAnythingBreaksWithItClient::new(channel);
    let mut replies = client
        .a_very_long_method_name_that_goes_on_and_on_and_on_for_more_than_one_hundred_characters_to_see_whether_anything_breaks_with_it(msg())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replies.message().await.unwrap().unwrap(), msg());
}

#[tokio::test]
async fn well_known_and_descriptor_types_in_every_streaming_kind() {
    use round2::wkt::{types_client::TypesClient, types_methods, Empty};
    let mut client = TypesClient::new(round2_channel().await);
    let times: Vec<i64> = client
        .watch(())
        .await
        .unwrap()
        .into_inner()
        .map(|time| time.unwrap().seconds)
        .collect()
        .await;
    assert_eq!(times, [1, 2]);
    let any = prost_types::Any {
        type_url: "t/x".into(),
        value: vec![1],
    };
    client
        .upload(futures::stream::iter([any.clone(), any]))
        .await
        .unwrap();
    let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
    let urls: Vec<String> = client
        .chat(futures::stream::iter([at(3), at(4)]))
        .await
        .unwrap()
        .into_inner()
        .map(|any| any.unwrap().type_url)
        .collect()
        .await;
    assert_eq!(urls, ["t/3", "t/4"]);
    client.mine(Empty { inner: Some(()) }).await.unwrap();
    let mask = prost_types::FieldMask {
        paths: vec!["a.b".into()],
    };
    let location = client.mask(mask).await.unwrap().into_inner();
    assert_eq!(location.leading_detached_comments, ["a.b"]);
    let set = prost_types::FileDescriptorSet {
        file: vec![prost_types::FileDescriptorProto {
            name: Some("f.proto".into()),
            ..Default::default()
        }],
    };
    let mut files = client.files(set).await.unwrap().into_inner();
    let file = files.message().await.unwrap().unwrap();
    assert_eq!(file.name(), "f.proto");
    let method = prost_types::Method {
        name: "M".into(),
        ..Default::default()
    };
    let api = client.method(method.clone()).await.unwrap().into_inner();
    assert_eq!(api.methods, [method]);
    let request = prost_types::compiler::CodeGeneratorRequest {
        parameter: Some("p".into()),
        ..Default::default()
    };
    let response = client.plugin(request).await.unwrap().into_inner();
    assert_eq!(response.error(), "p");
    let strings: Vec<String> = client
        .bytes(futures::stream::iter([b"ab".to_vec()]))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(strings, ["ab"]);
    assert_eq!(types_methods::PLUGIN.path, "round2.wkt.Types/Plugin");
}

#[tokio::test]
async fn public_imports_split_packages_and_files_without_a_package() {
    use round2::{dep::v1::Shared, r#pub::fetch_client::FetchClient};
    let channel = round2_channel().await;
    let mut fetch = FetchClient::new(channel.clone());
    let shared = Shared { id: "s".into() };
    let wrapped = fetch.get(shared.clone()).await.unwrap().into_inner();
    assert_eq!(wrapped.shared, Some(shared.clone()));
    let many: Vec<_> = fetch
        .many(futures::stream::iter([shared.clone(), shared]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(many.len(), 2);
    assert_eq!(
        round2::r#pub::fetch_methods::MANY.path,
        "round2.pub.Fetch/Many"
    );
    assert!(round2::r#pub::nothing_methods::ALL.is_empty());
    // A method-less service answers `Unimplemented`.
    static NOTHING_GET: rpc_core::method::MethodDescriptor = rpc_core::method::MethodDescriptor {
        service: "round2.pub.Nothing",
        method: "Get",
        path: "round2.pub.Nothing/Get",
        idempotency: Idempotency::Unknown,
    };
    let status = rpc_core::client::Client::new(channel.clone())
        .unary::<Shared, Shared>(Request::new(Shared::default()), &NOTHING_GET)
        .await
        .unwrap_err();
    assert_eq!(status.code(), rpc_core::Code::UNIMPLEMENTED);

    // A second file without a package.
    let mut bare = gen::bare2_client::Bare2Client::new(channel);
    let message = gen::Bare { child: None };
    assert_eq!(
        bare.get(message.clone()).await.unwrap().into_inner(),
        message
    );
    assert_eq!(gen::bare2_methods::GET.path, "Bare2/Get");
    assert_eq!(
        <gen::lonely_server::LonelyServer<Round2> as NamedService>::NAME,
        "Lonely"
    );
}

#[tokio::test]
#[allow(deprecated)] // the service and some methods are deprecated
async fn custom_options_deprecation_and_keyword_packages() {
    use round2::super_::self_::{library_client::LibraryClient, library_methods, Book};
    let mut client = LibraryClient::new(round2_channel().await);
    let book = || Book { name: "b".into() };
    for reply in [
        client.get_book(book()).await,
        client.create_book(book()).await,
        client.empty(book()).await,
        client.semicolon(book()).await,
    ] {
        assert_eq!(reply.unwrap().into_inner(), book());
    }
    let books: Vec<_> = client
        .streamed(futures::stream::iter([book()]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(books.len(), 1);
    assert_eq!(
        library_methods::GET_BOOK.path,
        "round2.super.self.Library/GetBook"
    );
    assert_eq!(
        library_methods::GET_BOOK.idempotency,
        Idempotency::NoSideEffects
    );
}

#[tokio::test]
async fn proto2_groups_as_rpc_types() {
    use round2::groups::{query, search_client::SearchClient, Query};
    let mut client = SearchClient::new(round2_channel().await);
    let result = query::Result {
        value: Some("v".into()),
        row: vec![query::result::Row { id: 1 }, query::result::Row { id: 2 }],
    };
    let query = Query {
        result: Some(result.clone()),
        option: Vec::new(),
    };
    assert_eq!(client.find(query).await.unwrap().into_inner(), result);
    let ids: Vec<i32> = client
        .rows(result)
        .await
        .unwrap()
        .into_inner()
        .map(|row| row.unwrap().id)
        .collect()
        .await;
    assert_eq!(ids, [1, 2]);
    let option = query::Option {
        key: Some("k".into()),
    };
    let reply = client
        .options(futures::stream::iter([option.clone()]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.option, [option]);
}

#[tokio::test]
async fn comments_with_bidi_controls_and_quoted_code_blocks() {
    let channel = round2_channel().await;
    let mut bidi = round2::unicode::bidi_client::BidiClient::new(channel.clone());
    let text = round2::unicode::Text { value: None };
    assert_eq!(text.value(), "\u{202E}default\u{202C}");
    assert_eq!(bidi.get(text.clone()).await.unwrap().into_inner(), text);
    let mut blocks = round2::blocks::blocks_client::BlocksClient::new(channel);
    let quoted = round2::blocks::Quoted {
        text: "q".into(),
        empty_comment: 1,
    };
    for reply in [
        blocks.get(quoted.clone()).await,
        blocks.empty_comment(quoted.clone()).await,
        blocks.table(quoted.clone()).await,
    ] {
        assert_eq!(reply.unwrap().into_inner(), quoted);
    }
}

/// Implements the round-8 services the tests call.
struct Round8;

impl gen::round8::names::echo_server_server::EchoServer for Round8 {
    echo!(echo: gen::round8::names::Msg, echo_server: gen::round8::names::Msg);
}

impl gen::round8::names::echo_client_server::EchoClient for Round8 {
    echo!(echo_client: gen::round8::names::Msg);
}

impl gen::round8::digits::digits_server::Digits for Round8 {
    async fn get(
        &self,
        request: Request<gen::round8::digits::_1>,
    ) -> Reply<gen::round8::digits::holder::_6> {
        Ok(Response::new(gen::round8::digits::holder::_6 {
            value: request.into_inner()._2,
        }))
    }
    type WatchStream = Stream<gen::round8::digits::_1>;
    async fn watch(
        &self,
        request: Request<gen::round8::digits::Double>,
    ) -> Reply<Self::WatchStream> {
        let n = request.into_inner().field;
        let one = gen::round8::digits::_1 {
            _2: n,
            _10: Some(n),
            items: vec![gen::round8::digits::_12 {}],
        };
        Ok(Response::new(futures::stream::iter([Ok(one)]).boxed()))
    }
}

impl gen::twice::twice::twice::twice2_server::Twice2 for Round8 {
    async fn twice(
        &self,
        request: Request<gen::twice::twice::twice::Twice>,
    ) -> Reply<gen::twice::twice::twice::twice::Twice> {
        Ok(Response::new(
            request.into_inner().twice.unwrap_or_default(),
        ))
    }
}

impl gen::google::google_server::Google for Round8 {
    async fn get(
        &self,
        request: Request<gen::google::protobuf::Timestamp>,
    ) -> Reply<prost_types::Timestamp> {
        Ok(Response::new(request.into_inner().at.unwrap_or_default()))
    }
    async fn nothing(&self, _request: Request<()>) -> Reply<gen::google::Protobuf> {
        Ok(Response::new(gen::google::Protobuf::default()))
    }
}

/// Services named as another's client or server module, names that start with a
/// digit, a package whose segments repeat and a package `google` beside the
/// well-known types.
#[tokio::test]
async fn round8_names_digits_and_packages() {
    use gen::round8::{digits, names};
    let server = Server::builder()
        .add_service(names::echo_server_server::EchoServerServer::new(Round8))
        .add_service(names::echo_client_server::EchoClientServer::new(Round8))
        .add_service(digits::digits_server::DigitsServer::new(Round8))
        .add_service(gen::twice::twice::twice::twice2_server::Twice2Server::new(
            Round8,
        ))
        .add_service(gen::google::google_server::GoogleServer::new(Round8))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();

    let msg = names::Msg { text: "m".into() };
    let mut echo = names::echo_server_client::EchoServerClient::new(channel.clone());
    assert_eq!(echo.echo(msg.clone()).await.unwrap().into_inner(), msg);
    assert_eq!(
        echo.echo_server(msg.clone()).await.unwrap().into_inner(),
        msg
    );
    let mut client = names::echo_client_client::EchoClientClient::new(channel.clone());
    assert_eq!(
        client.echo_client(msg.clone()).await.unwrap().into_inner(),
        msg
    );
    assert_eq!(
        names::echo_server_methods::ECHO_SERVER.path,
        "round8.names.EchoServer/EchoServer"
    );

    let mut digits = digits::digits_client::DigitsClient::new(channel.clone());
    let one = digits::_1 {
        _2: 7,
        ..Default::default()
    };
    assert_eq!(digits.get(one).await.unwrap().into_inner().value, 7);
    let watched: Vec<_> = digits
        .watch(digits::Double { field: 3 })
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(watched.len(), 1);
    assert_eq!(watched[0].as_ref().unwrap()._10, Some(3));

    let mut twice = gen::twice::twice::twice::twice2_client::Twice2Client::new(channel.clone());
    let inner = gen::twice::twice::twice::twice::Twice { text: "t".into() };
    let outer = gen::twice::twice::twice::Twice {
        twice: Some(inner.clone()),
    };
    assert_eq!(twice.twice(outer).await.unwrap().into_inner(), inner);

    let mut google = gen::google::google_client::GoogleClient::new(channel);
    let at = prost_types::Timestamp {
        seconds: 5,
        nanos: 6,
    };
    let nested = gen::google::protobuf::Timestamp { at: Some(at) };
    assert_eq!(google.get(nested).await.unwrap().into_inner(), at);
    assert_eq!(
        google.nothing(()).await.unwrap().into_inner(),
        gen::google::Protobuf::default()
    );
}

/// proto2 defaults at the edges of their types, and of enum values whose variants
/// are escaped, as prost-derive writes them.
#[test]
fn round8_proto2_defaults() {
    let edges = gen::round8::defaults::Edges::default();
    assert_eq!(edges.i64_min(), i64::MIN);
    assert_eq!(edges.u64_max(), u64::MAX);
    assert_eq!(edges.f64_max(), u64::MAX);
    assert_eq!(edges.u32_hex(), u32::MAX);
    assert_eq!(edges.octal(), 15);
    assert_eq!(edges.neg_hex(), i32::MIN);
    assert!(edges.nan().is_nan());
    assert_eq!(edges.neg_inf(), f64::NEG_INFINITY);
    assert_eq!(edges.fneg_inf(), f32::NEG_INFINITY);
    assert_eq!(edges.fsmall(), 0.0);
    assert!(edges
        .text()
        .starts_with("tab\there \"quoted\" {} {0} \\ é ☃ 𝄞"));
    assert_eq!(&edges.raw()[..3], b"\xff\x00\x80");
    assert_eq!(edges.sign(), gen::round8::defaults::Sign::Negative);
    use gen::round8::enumdefaults::{holder, other, Holder, Kind};
    let holder = Holder::default();
    assert_eq!(holder.self_kind(), Kind::Self_);
    assert_eq!(holder.digit(), Kind::Kind1);
    assert_eq!(holder.underscore(), Kind::_3);
    assert_eq!(holder.kindness(), Kind::Kindness);
    assert_eq!(holder.bare(), Kind::Kind);
    assert_eq!(holder.inner(), holder::Inner::Self_);
    assert_eq!(holder.nested(), other::Nested::Self_);
}

/// Editions files (round 12), read as proto3 (2023) and proto2 (2024 with a field
/// default): explicit presence round-trips (an empty name is not no name), implicit
/// presence is a plain value, defaults hold, and the services answer over a link.
#[tokio::test]
async fn editions_files_work_as_their_features_say() {
    use unseen::{ed2023, ed2024};

    struct Editions;
    impl ed2023::items_server::Items for Editions {
        echo!(put: ed2023::Item);

        type WatchStream = Stream<ed2023::Item>;
        async fn watch(&self, request: Request<ed2023::Item>) -> Reply<Self::WatchStream> {
            let item = request.into_inner();
            Ok(Response::new(
                futures::stream::iter([Ok(item.clone()), Ok(item)]).boxed(),
            ))
        }
    }
    impl ed2024::config_server::Config for Editions {
        echo!(get: ed2024::Settings);
    }

    let server = Server::builder()
        .add_service(ed2023::items_server::ItemsServer::new(Editions))
        .add_service(ed2024::config_server::ConfigServer::new(Editions))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();

    let mut items = ed2023::items_client::ItemsClient::new(channel.clone());
    let item = ed2023::Item {
        name: Some(String::new()),
        count: 0,
        ids: vec![1, 2],
        loose: vec![3],
        choice: Some(ed2023::item::Choice::Level(ed2023::Level::Unknown as i32)),
        rank: Some(0),
        ..ed2023::Item::default()
    };
    let answer = items.put(item.clone()).await.unwrap().into_inner();
    assert_eq!(answer, item);
    assert_eq!(answer.name.as_deref(), Some(""), "presence kept");
    let watched: Vec<_> = items
        .watch(item.clone())
        .await
        .unwrap()
        .into_inner()
        .map(|item| item.unwrap())
        .collect()
        .await;
    assert_eq!(watched, [item.clone(), item]);
    assert_eq!(ed2023::items_methods::PUT.path, "unseen.ed2023.Items/Put");

    let mut config = ed2024::config_client::ConfigClient::new(channel);
    let settings = ed2024::Settings {
        label: Some("l".into()),
        ..ed2024::Settings::default()
    };
    assert_eq!(settings.retries(), 3, "the field's default");
    assert_eq!(
        config.get(settings.clone()).await.unwrap().into_inner(),
        settings
    );
}
