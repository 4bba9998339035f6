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
