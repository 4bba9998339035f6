//! Round 10's probes (`rpc-codegen/tests/protos/unseen/round10_*.proto`) over the
//! in-memory link: maps keyed by every key type, googleapis-style annotated services
//! streaming well-known types, proto2 groups and extension-bearing messages, keyword
//! oneofs and messages named like primitives; and the proto2 defaults protoc accepts.

use std::collections::HashMap;

use futures::{stream::BoxStream, StreamExt};
use rpc_codegen_corpus::probes::round10::{defaults, library::v1 as library, maps, names, p2};
use rpc_core::{
    client::Channel,
    codegen::{prost_types, NamedService, Streaming},
    link::mem,
    server::Server,
    Request, Response, Status,
};

type Reply<T> = Result<Response<T>, Status>;
type Stream<T> = BoxStream<'static, Result<T, Status>>;

/// Echoes what it is sent, in every service.
struct Echo;

/// Every message of `stream`, in a reply stream.
fn echo_stream<T>(stream: Streaming<T>) -> Stream<T>
where
    T: rpc_core::codegen::prost::Message + Default + Send + 'static,
{
    stream.boxed()
}

impl maps::map_service_server::MapService for Echo {
    async fn echo(&self, request: Request<maps::Maps>) -> Reply<maps::Maps> {
        Ok(Response::new(request.into_inner()))
    }
    type StreamStream = Stream<maps::Maps>;
    async fn stream(&self, request: Request<Streaming<maps::Maps>>) -> Reply<Self::StreamStream> {
        Ok(Response::new(echo_stream(request.into_inner())))
    }
}

impl library::library_server::Library for Echo {
    async fn get_book(&self, request: Request<library::GetBookRequest>) -> Reply<library::Book> {
        Ok(Response::new(library::Book {
            name: request.into_inner().name,
        }))
    }
    async fn update_book(
        &self,
        request: Request<library::UpdateBookRequest>,
    ) -> Reply<library::Book> {
        Ok(Response::new(request.into_inner().book.unwrap_or_default()))
    }
    async fn delete_book(&self, _request: Request<library::DeleteBookRequest>) -> Reply<()> {
        Ok(Response::new(()))
    }
    type WatchBooksStream = Stream<prost_types::Any>;
    async fn watch_books(&self, _request: Request<()>) -> Reply<Self::WatchBooksStream> {
        let any = prost_types::Any {
            type_url: "type.googleapis.com/round10.library.v1.Book".into(),
            value: vec![10, 1, b'b'],
        };
        Ok(Response::new(futures::stream::iter([Ok(any)]).boxed()))
    }
    async fn import_books(
        &self,
        request: Request<Streaming<prost_types::Struct>>,
    ) -> Reply<prost_types::Timestamp> {
        let count = request.into_inner().count().await;
        Ok(Response::new(prost_types::Timestamp {
            seconds: count as i64,
            nanos: 0,
        }))
    }
    type SyncBooksStream = Stream<()>;
    async fn sync_books(
        &self,
        request: Request<Streaming<prost_types::Any>>,
    ) -> Reply<Self::SyncBooksStream> {
        let stream = request.into_inner().map(|any| any.map(|_| ()));
        Ok(Response::new(stream.boxed()))
    }
}

impl p2::p2_server::P2 for Echo {
    async fn call(&self, request: Request<p2::Extendable>) -> Reply<p2::UsesGroup> {
        let header = request.into_inner().header.unwrap_or_default();
        Ok(Response::new(p2::UsesGroup {
            g: Some(p2::GroupExt { a: Some(1) }),
            n: Some(p2::scope::Nested {
                s: Some(header.key),
            }),
            sub: header.sub.first().copied(),
        }))
    }
    async fn group(&self, request: Request<p2::GroupExt>) -> Reply<p2::scope::Nested> {
        let a = request.into_inner().a();
        Ok(Response::new(p2::scope::Nested {
            s: Some(a.to_string()),
        }))
    }
    type DeepStream = Stream<p2::extendable::Header>;
    async fn deep(
        &self,
        request: Request<Streaming<p2::extendable::header::Sub>>,
    ) -> Reply<Self::DeepStream> {
        let stream = request.into_inner().map(|sub| {
            sub.map(|sub| p2::extendable::Header {
                key: sub.x().to_string(),
                value: None,
                sub: vec![sub],
            })
        });
        Ok(Response::new(stream.boxed()))
    }
}

impl names::names_server::Names for Echo {
    async fn keyword(&self, request: Request<names::Keywords>) -> Reply<names::Keywords> {
        Ok(Response::new(request.into_inner()))
    }
    async fn flag(&self, request: Request<bool>) -> Reply<u32> {
        Ok(Response::new(u32::from(request.into_inner())))
    }
    async fn prims(&self, request: Request<names::Bool>) -> Reply<names::Primitives> {
        let boxed = request.into_inner();
        Ok(Response::new(names::Primitives {
            flag: boxed.value,
            count: 2,
            ratio: 0.5,
            boxed: Some(boxed),
            range: Some(names::f64::Range { lo: 1.0, hi: 2.0 }),
        }))
    }
    type ValuesStream = Stream<names::Value>;
    async fn values(&self, request: Request<Streaming<names::Value>>) -> Reply<Self::ValuesStream> {
        Ok(Response::new(echo_stream(request.into_inner())))
    }
}

async fn channel() -> Channel {
    let server = Server::builder()
        .add_service(maps::map_service_server::MapServiceServer::new(Echo))
        .add_service(library::library_server::LibraryServer::new(Echo))
        .add_service(p2::p2_server::P2Server::new(Echo))
        .add_service(names::names_server::NamesServer::new(Echo))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder().connect(connector).await.unwrap()
}

/// A map of every key type, with enum, message, bytes, well-known and wrapper values,
/// comes back as sent, unary and in a bidirectional stream.
#[tokio::test]
async fn maps_of_every_key_type_round_trip() {
    use maps::{Leaf, Level, Maps};
    let leaf = |name: &str| Leaf { name: name.into() };
    let high = Level::High as i32;
    let sent = Maps {
        i32_enum: HashMap::from([(-1, high), (i32::MAX, 0)]),
        i64_msg: HashMap::from([(i64::MIN, leaf("min"))]),
        u32_bytes: HashMap::from([(u32::MAX, vec![0, 255].into())]),
        u64_enum: HashMap::from([(u64::MAX, high)]),
        s32_msg: HashMap::from([(-7, leaf("s32"))]),
        s64_bytes: HashMap::from([(-8, b"s64".to_vec().into())]),
        f32_enum: HashMap::from([(9, high)]),
        f64_msg: HashMap::from([(10, leaf("f64"))]),
        sf32_bytes: HashMap::from([(-11, Default::default())]),
        sf64_enum: HashMap::from([(-12, 7)]), // an unknown value stays a number
        bool_msg: HashMap::from([(true, leaf("yes")), (false, Leaf::default())]),
        str_bytes: HashMap::from([("é".into(), b"\0".to_vec().into())]),
        str_enum: HashMap::from([(String::new(), high)]),
        str_any: HashMap::from([(
            "any".into(),
            prost_types::Any {
                type_url: "t/x".into(),
                value: vec![1],
            },
        )]),
        str_value: HashMap::from([(
            "v".into(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(1.5)),
            },
        )]),
        str_bytes_value: HashMap::from([("bv".into(), vec![3])]),
        str_empty: HashMap::from([("e".into(), ())]),
        recursive: HashMap::from([(
            true,
            Maps {
                str_double: HashMap::from([("d".into(), -0.25)]),
                ..Maps::default()
            },
        )]),
        str_double: HashMap::from([("nan-free".into(), f64::MAX)]),
        str_i64v: HashMap::from([("i".into(), i64::MIN)]),
        str_sv: HashMap::from([("s".into(), "text".into())]),
        i32_null: HashMap::from([(1, prost_types::NullValue::NullValue as i32)]),
    };
    let mut client = maps::map_service_client::MapServiceClient::new(channel().await);
    assert_eq!(client.echo(sent.clone()).await.unwrap().into_inner(), sent);
    let back: Vec<Maps> = client
        .stream(futures::stream::iter([sent.clone(), Maps::default()]))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(back, [sent, Maps::default()]);
}

/// The annotated service works over the link, streaming well-known types, and its
/// embedded descriptor set keeps the custom options (the HTTP rule's path).
#[tokio::test]
async fn annotated_service_streams_well_known_types() {
    let mut client = library::library_client::LibraryClient::new(channel().await);
    let book = client
        .get_book(library::GetBookRequest {
            name: "shelves/1/books/2".into(),
            read_mask: Some(prost_types::FieldMask {
                paths: vec!["name".into()],
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(book.name, "shelves/1/books/2");
    client
        .delete_book(library::DeleteBookRequest {
            name: "b".into(),
            kind: library::Kind::Unspecified as i32,
        })
        .await
        .unwrap();
    let watched: Vec<_> = client
        .watch_books(())
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(watched.len(), 1);
    assert!(watched[0].as_ref().unwrap().type_url.ends_with("Book"));
    let structs = futures::stream::iter(vec![prost_types::Struct::default(); 3]);
    let stamp = client.import_books(structs).await.unwrap().into_inner();
    assert_eq!(stamp.seconds, 3);
    let synced: Vec<_> = client
        .sync_books(futures::stream::iter(vec![prost_types::Any::default(); 2]))
        .await
        .unwrap()
        .into_inner()
        .collect()
        .await;
    assert_eq!(synced.len(), 2);

    let set = <library::library_server::LibraryServer<Echo> as NamedService>::FILE_DESCRIPTOR_SET;
    let needle = b"/v1/{name=shelves/*/books/*}";
    assert!(set.windows(needle.len()).any(|w| w == needle));
}

/// proto2 groups (nested, in extend blocks, as rpc types) and a message with
/// extension ranges travel as written.
#[tokio::test]
async fn proto2_groups_and_extendable_messages() {
    let mut client = p2::p2_client::P2Client::new(channel().await);
    let sub = p2::extendable::header::Sub { x: Some(-5) };
    let sent = p2::Extendable {
        id: 1,
        header: Some(p2::extendable::Header {
            key: "k".into(),
            value: None,
            sub: vec![sub],
        }),
        packed_ints: vec![1, -1, i32::MAX],
        modes: vec![p2::Mode::Fast as i32, p2::Mode::Slow as i32],
        mode: None,
        mode_by_int: HashMap::from([(3, p2::Mode::Slow as i32)]),
    };
    let got = client.call(sent.clone()).await.unwrap().into_inner();
    assert_eq!(got.n.unwrap().s(), "k");
    assert_eq!(got.sub, Some(sub));
    assert_eq!(sent.mode(), p2::Mode::Fast);
    let header = p2::extendable::Header::default();
    assert_eq!(header.value(), b"\r\n\t\0");
    let nested = client
        .group(p2::GroupExt { a: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(nested.s(), "0");
    let headers: Vec<_> = client
        .deep(futures::stream::iter([
            sub,
            p2::extendable::header::Sub::default(),
        ]))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(headers[0].key, "-5");
    assert_eq!(headers[1].key, "-1");
}

/// A oneof named `self` of keyword fields, messages named like primitives beside
/// fields of those types, and enums whose variants share affixes.
#[tokio::test]
async fn keyword_oneofs_and_primitive_named_messages() {
    use names::{keywords::Self_, Keywords};
    let mut client = names::names_client::NamesClient::new(channel().await);
    for choice in [
        Self_::Type("t".into()),
        Self_::Self_(-1),
        Self_::Super(true),
        Self_::Crate(b"c".to_vec().into()),
        Self_::Async("a".into()),
    ] {
        let sent = Keywords {
            self_: Some(choice),
        };
        assert_eq!(
            client.keyword(sent.clone()).await.unwrap().into_inner(),
            sent
        );
    }
    assert_eq!(client.flag(true).await.unwrap().into_inner(), 1);
    let prims = client
        .prims(names::Bool { value: true })
        .await
        .unwrap()
        .into_inner();
    assert!(prims.flag && prims.boxed.unwrap().value);
    assert_eq!(prims.range.unwrap().hi, 2.0);
    let value = names::Value {
        kind: Some(names::value::Kind::DoubleValue(0.5)),
        color: names::Color::BlueColor as i32,
        state: names::State::StartingOver as i32,
    };
    let back: Vec<_> = client
        .values(futures::stream::iter([value.clone()]))
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(back, [value]);
}

/// The proto2 defaults protoc accepts, as the accessors give them.
#[test]
fn round10_proto2_defaults() {
    let d = defaults::D::default();
    assert!(d.d_neg_nan().is_nan() && d.f_neg_nan().is_nan());
    assert_eq!(d.f_inf(), f32::INFINITY);
    assert_eq!(d.d_huge(), f64::INFINITY);
    assert_eq!(d.d_neg_huge(), f64::NEG_INFINITY);
    assert_eq!(d.f_int(), 123.0);
    assert!(d.d_neg_zero_int() == 0.0 && d.d_neg_zero_int().is_sign_negative());
    assert_eq!(d.i_neg_zero(), 0);
    assert_eq!(d.unicode(), "é😀");
    assert_eq!(d.b_unicode(), "é\u{1}".as_bytes());
    assert_eq!(d.b_octal(), b"\x01\nSS4");
    assert_eq!(d.s_hex(), "AJJ");
    assert_eq!(d.d_exp(), 1e5);
    assert_eq!(d.d_dot(), 0.5);
    assert_eq!(d.f_dot(), 5.0);
    assert_eq!(d.f_tiny(), 0.0);
    assert_eq!(d.d_tiny(), 0.0);
}
