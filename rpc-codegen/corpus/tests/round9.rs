//! Round 9: the multi-file project of `rpc-codegen/tests/protos/unseen/round9`, compiled
//! once per set of builder options (`build.rs`), used as an application would: the
//! servers of one build answer the clients of another over the in-memory link.

use std::collections::BTreeSet;

use futures::{stream::BoxStream, StreamExt};
use rpc_codegen_corpus::round9::{all, client, defaults, extern_, nested, none, server};
use rpc_core::{
    client::Channel,
    codegen::{NamedService, Streaming},
    link::mem,
    server::Server,
    Request, Response, Status,
};

type Reply<T> = Result<Response<T>, Status>;
type Stream<T> = BoxStream<'static, Result<T, Status>>;

use all::r9::{a, b, both, c, chain, leaf, svc};

/// `r9.svc.Multi` of the "all" build: each method answers from its request.
struct Multi;

impl svc::multi_server::Multi for Multi {
    type WatchStream = Stream<c::C>;
    type ChatStream = Stream<chain::mid::Mid>;
    type ChainStream = Stream<chain::Top>;

    async fn use_a(&self, request: Request<a::Common>) -> Reply<b::Common> {
        let a = request.into_inner().a;
        Ok(Response::new(b::Common {
            b: a.len() as i64,
            blob: a.clone().into_bytes().into(),
            counts: [(a, 1)].into(),
        }))
    }

    async fn use_c(&self, request: Request<c::C>) -> Reply<leaf::Leaf> {
        Ok(Response::new(leaf::Leaf {
            name: format!("c{}", request.into_inner().id),
        }))
    }

    async fn same_both(&self, request: Request<a::Same>) -> Reply<b::Same> {
        Ok(Response::new(b::Same {
            from_b: request.into_inner().from_a.len() as i64,
        }))
    }

    async fn echo(&self, request: Request<svc::Req>) -> Reply<svc::Req> {
        Ok(Response::new(request.into_inner()))
    }

    async fn nested(&self, request: Request<a::outer::Inner>) -> Reply<c::outer::inner::Deepest> {
        let level = if request.into_inner().x > 0 {
            c::outer::inner::deepest::Level::Deep
        } else {
            c::outer::inner::deepest::Level::Unspecified
        };
        Ok(Response::new(c::outer::inner::Deepest {
            level: level.into(),
        }))
    }

    async fn watch(&self, request: Request<svc::Req>) -> Reply<Self::WatchStream> {
        let n = request.into_inner().text.len() as u32;
        Ok(Response::new(
            futures::stream::iter((0..n).map(|id| Ok(c::C { id }))).boxed(),
        ))
    }

    async fn upload(&self, request: Request<Streaming<a::outer::Inner>>) -> Reply<both::FromQ> {
        let inners: Vec<a::outer::Inner> = request
            .into_inner()
            .map(|inner| inner.unwrap())
            .collect()
            .await;
        Ok(Response::new(both::FromQ {
            p: Some(both::FromP {
                names: inners.iter().map(|inner| inner.x.to_string()).collect(),
            }),
        }))
    }

    async fn chat(&self, request: Request<Streaming<leaf::Leaf>>) -> Reply<Self::ChatStream> {
        Ok(Response::new(
            request
                .into_inner()
                .map(|leaf| Ok(chain::mid::Mid { leaf: Some(leaf?) }))
                .boxed(),
        ))
    }

    async fn split(&self, request: Request<svc::SplitRequest>) -> Reply<svc::SplitReply> {
        let c = request.into_inner().c.unwrap_or_default();
        Ok(Response::new(svc::SplitReply { cs: vec![c; 2] }))
    }

    async fn at(&self, request: Request<a::Stamp>) -> Reply<a::Stamp> {
        let stamp = request.into_inner();
        Ok(Response::new(a::Stamp {
            seconds: stamp.seconds + 1,
            nanos: stamp.nanos,
        }))
    }

    async fn chain(&self, request: Request<chain::Top>) -> Reply<Self::ChainStream> {
        let top = request.into_inner();
        Ok(Response::new(
            futures::stream::iter([Ok(top.clone()), Ok(top)]).boxed(),
        ))
    }
}

/// `r9.svc.multi.Multi`: the service of the package named after the parent's service.
impl svc::multi::multi_server::Multi for Multi {
    async fn echo(&self, request: Request<svc::multi::Client>) -> Reply<svc::multi::Client> {
        Ok(Response::new(request.into_inner()))
    }

    async fn parent(&self, request: Request<svc::Req>) -> Reply<svc::SplitReply> {
        let id = request.into_inner().text.len() as u32;
        Ok(Response::new(svc::SplitReply {
            cs: vec![c::C { id }],
        }))
    }
}

/// A channel to a server with both services of the "all" build.
async fn channel() -> Channel {
    let server = Server::builder()
        .add_service(svc::multi_server::MultiServer::new(Multi))
        .add_service(svc::multi::multi_server::MultiServer::new(Multi))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    Channel::builder().connect(connector).await.unwrap()
}

#[tokio::test]
async fn a_service_over_five_packages_and_two_include_roots() {
    let mut client = svc::multi_client::MultiClient::new(channel().await);
    let reply = client
        .use_a(a::Common { a: "abc".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.b, 3);
    assert_eq!(&reply.blob[..], b"abc");
    assert_eq!(reply.counts["abc"], 1);

    let reply = client.use_c(c::C { id: 7 }).await.unwrap().into_inner();
    assert_eq!(reply.name, "c7");

    // The message `Same` of two packages.
    let reply = client
        .same_both(a::Same {
            from_a: "four".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply, b::Same { from_b: 4 });

    // The same message in and out.
    let req = svc::Req {
        text: "hi".into(),
        common: Some(a::Common { a: "x".into() }),
    };
    assert_eq!(client.echo(req.clone()).await.unwrap().into_inner(), req);

    // Nested types of other packages.
    let reply = client
        .nested(a::outer::Inner {
            x: 1,
            choice: Some(a::outer::inner::Choice::Text("t".into())),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.level(), c::outer::inner::deepest::Level::Deep);

    // Streams of imported types, every kind.
    let ids: Vec<u32> = client
        .watch(svc::Req {
            text: "abc".into(),
            common: None,
        })
        .await
        .unwrap()
        .into_inner()
        .map(|c| c.unwrap().id)
        .collect()
        .await;
    assert_eq!(ids, [0, 1, 2]);
    let inners = futures::stream::iter([1, 2].map(|x| a::outer::Inner { x, choice: None }));
    let reply = client.upload(inners).await.unwrap().into_inner();
    assert_eq!(reply.p.unwrap().names, ["1", "2"]);
    let leaves = futures::stream::iter(["l1", "l2"].map(|name| leaf::Leaf { name: name.into() }));
    let mids: Vec<String> = client
        .chat(leaves)
        .await
        .unwrap()
        .into_inner()
        .map(|mid| mid.unwrap().leaf.unwrap().name)
        .collect()
        .await;
    assert_eq!(mids, ["l1", "l2"]);
    let top = chain::Top {
        mid: Some(chain::mid::Mid {
            leaf: Some(leaf::Leaf {
                name: "deep".into(),
            }),
        }),
    };
    let tops: Vec<chain::Top> = client
        .chain(top.clone())
        .await
        .unwrap()
        .into_inner()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(tops, [top.clone(), top]);

    // Types of the file without a service.
    let reply = client
        .split(svc::SplitRequest {
            c: Some(c::C { id: 3 }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.cs, [c::C { id: 3 }, c::C { id: 3 }]);

    // `google.protobuf.Timestamp`, mapped to the project's `r9.a.Stamp`.
    let reply = client
        .at(a::Stamp {
            seconds: 1,
            nanos: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((reply.seconds, reply.nanos), (2, 2));

    // The nested package named after the service.
    let mut nested = svc::multi::multi_client::MultiClient::new(channel().await);
    let message = svc::multi::Client {
        req: Some(svc::Req {
            text: "n".into(),
            common: None,
        }),
    };
    assert_eq!(
        nested.echo(message.clone()).await.unwrap().into_inner(),
        message
    );
    let reply = nested
        .parent(svc::Req {
            text: "four".into(),
            common: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.cs, [c::C { id: 4 }]);
    assert_eq!(
        <svc::multi::multi_server::MultiServer<Multi> as NamedService>::NAME,
        "r9.svc.multi.Multi"
    );
    assert_eq!(
        <svc::multi_server::MultiServer<Multi> as NamedService>::NAME,
        "r9.svc.Multi"
    );
}

/// The attributes of `type_attribute` and `field_attribute` are on the types.
#[test]
fn type_attributes_derive_what_they_say() {
    let set: BTreeSet<a::Common> = ["b", "a", "b"].map(|a| a::Common { a: a.into() }).into();
    assert_eq!(set.len(), 2);
    assert!(
        a::outer::inner::Choice::Number(1) < a::outer::inner::Choice::Number(2),
        "the oneof is `Ord`"
    );
}

/// The client-only build (`Vec<u8>` bytes, `google.protobuf.Timestamp` as prost-types')
/// calls the "all" build's server: the same wire.
#[tokio::test]
async fn clients_of_another_build_with_other_options() {
    use client::r9::{a as ca, svc as csvc};
    let mut client = csvc::multi_client::MultiClient::new(channel().await);
    let reply = client
        .use_a(ca::Common { a: "xy".into() })
        .await
        .unwrap()
        .into_inner();
    let blob: Vec<u8> = reply.blob;
    assert_eq!(blob, b"xy");
    let stamp = rpc_core::codegen::prost_types::Timestamp {
        seconds: 10,
        nanos: 5,
    };
    let reply = client.at(stamp).await.unwrap().into_inner();
    assert_eq!((reply.seconds, reply.nanos), (11, 5));
    let ids: Vec<u32> = client
        .watch(csvc::Req {
            text: "ab".into(),
            common: None,
        })
        .await
        .unwrap()
        .into_inner()
        .map(|c| c.unwrap().id)
        .collect()
        .await;
    assert_eq!(ids, [0, 1]);
}

/// The server-only build, streaming methods left out, answers the "all" build's client;
/// its streaming methods are unimplemented.
#[tokio::test]
async fn a_server_of_unary_methods_only() {
    use server::r9::{a as sa, b as sb, c as sc, leaf as sleaf, svc as ssvc};
    struct Unary;
    impl ssvc::multi_server::Multi for Unary {
        async fn use_a(&self, request: Request<sa::Common>) -> Reply<sb::Common> {
            Ok(Response::new(sb::Common {
                b: -(request.into_inner().a.len() as i64),
                ..Default::default()
            }))
        }
        async fn use_c(&self, _request: Request<sc::C>) -> Reply<sleaf::Leaf> {
            Err(Status::unimplemented("use_c"))
        }
        async fn same_both(&self, _request: Request<sa::Same>) -> Reply<sb::Same> {
            Err(Status::unimplemented("same_both"))
        }
        async fn echo(&self, request: Request<ssvc::Req>) -> Reply<ssvc::Req> {
            Ok(Response::new(request.into_inner()))
        }
        async fn nested(
            &self,
            _request: Request<sa::outer::Inner>,
        ) -> Reply<sc::outer::inner::Deepest> {
            Err(Status::unimplemented("nested"))
        }
        async fn split(&self, _request: Request<ssvc::SplitRequest>) -> Reply<ssvc::SplitReply> {
            Err(Status::unimplemented("split"))
        }
        async fn at(
            &self,
            request: Request<rpc_core::codegen::prost_types::Timestamp>,
        ) -> Reply<rpc_core::codegen::prost_types::Timestamp> {
            Ok(Response::new(request.into_inner()))
        }
    }
    let server = Server::builder()
        .add_service(ssvc::multi_server::MultiServer::new(Unary))
        .build();
    let (listener, connector) = mem::listener();
    tokio::spawn(async move { server.serve(listener).await });
    let channel = Channel::builder().connect(connector).await.unwrap();
    let mut client = svc::multi_client::MultiClient::new(channel);
    let reply = client
        .use_a(a::Common { a: "abc".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.b, -3);
    let err = client
        .watch(svc::Req::default())
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.code(), rpc_core::Code::UNIMPLEMENTED);
    assert_eq!(
        <ssvc::multi_server::MultiServer<Unary> as NamedService>::UNARY_METHODS,
        ["UseA", "UseC", "SameBoth", "Echo", "Nested", "Split", "At"]
    );
}

/// `extern_path` to the "all" build's `r9.a` (a package) and
/// `r9.c.Outer.Inner.Deepest` (one nested type): the extern build's client and server
/// take those very types.
#[tokio::test]
async fn extern_paths_to_another_build_of_the_crate() {
    use extern_::r9::svc as esvc;
    let mut client = esvc::multi_client::MultiClient::new(channel().await);
    // `a::Common` is the "all" build's type itself.
    let common: a::Common = a::Common { a: "e".into() };
    let reply = client.use_a(common).await.unwrap().into_inner();
    assert_eq!(reply.b, 1);
    let deepest: c::outer::inner::Deepest = client
        .nested(a::outer::Inner { x: 5, choice: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deepest.level(), c::outer::inner::deepest::Level::Deep);
    // `Req` of the extern build holds the "all" build's `Common`.
    let req = esvc::Req {
        text: "t".into(),
        common: Some(a::Common { a: "in".into() }),
    };
    assert_eq!(client.echo(req.clone()).await.unwrap().into_inner(), req);
    // `r9.c.C` is generated in the extern build: its own type.
    let reply = client
        .use_c(extern_::r9::c::C { id: 9 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.name, "c9");
}

/// Neither clients nor servers: messages and method descriptors.
#[test]
fn messages_and_descriptors_without_clients_or_servers() {
    use none::r9::svc as nsvc;
    assert_eq!(nsvc::multi_methods::ALL.len(), 11);
    assert_eq!(nsvc::multi_methods::USE_A.path, "r9.svc.Multi/UseA");
    let _ = nsvc::Req::default();
    assert!(!nsvc::FILE_DESCRIPTOR_SET.is_empty());
}

/// The include file in a subdirectory of the output directory, and `compile_protos`
/// included with `rpc_core::include_protos!()`.
#[test]
fn include_files_elsewhere_and_by_default() {
    let _ = nested::r9::svc::multi::Client::default();
    assert_eq!(
        nested::r9::svc::multi::multi_methods::PARENT.path,
        "r9.svc.multi.Multi/Parent"
    );
    let deepest = defaults::r9::c::outer::inner::Deepest::default();
    assert_eq!(
        deepest.level(),
        defaults::r9::c::outer::inner::deepest::Level::Unspecified
    );
    assert!(!defaults::r9::c::FILE_DESCRIPTOR_SET.is_empty());
}
