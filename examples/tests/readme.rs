//! The README's code compiles and runs, and cannot drift.
//!
//! `the_readme_quotes_code_that_compiles` reads `README.md`: its `proto`, `toml` and
//! Quickstart `rust` blocks must be the files of the Quickstart crate
//! (`examples/quickstart`, built and run by its own test), and every other `rust` block
//! an excerpt of this file, whose tests run each one against a server on loopback (or,
//! for addresses that exist only in the README, compile it).

use std::{error::Error, path::Path};

use rpc_core::{retry::RetryPolicy, server::Server};
use rpc_proto::{
    blob::{blob_server::BlobServer, BlobService},
    echo::{echo_server::EchoServer, EchoService},
    kv::{
        key_value_client::KeyValueClient, key_value_server::KeyValueServer, GetRequest, MemoryStore,
    },
};

type Result<T = ()> = std::result::Result<T, Box<dyn Error>>;

/// Serves the example services on a loopback port; returns its URI.
async fn serve() -> Result<String> {
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    let server = Server::builder()
        .add_service(EchoServer::new(EchoService))
        .add_service(KeyValueServer::new(MemoryStore::default()))
        .add_service(BlobServer::new(BlobService));
    tokio::spawn(server.serve(listener));
    Ok(uri)
}

#[tokio::test]
async fn streaming() -> Result {
    let uri = serve().await?;
    use futures::StreamExt;
    use rpc_proto::echo::{echo_client::EchoClient, CountRequest, SumRequest};

    let mut echo = EchoClient::new(rpc_transport_tcp::connect(&uri).await?);
    // Server streaming: read the replies as they come.
    let request = CountRequest {
        count: 5,
        interval_ms: 20,
    };
    let mut counts = echo.count(request).await?.into_inner();
    while let Some(reply) = counts.message().await? {
        println!("{}", reply.n);
    }
    // Client streaming: any Stream of requests.
    let values = futures::stream::iter(1..=1000).map(|value| SumRequest { value });
    let total = echo.sum(values).await?.into_inner().total;
    assert_eq!(total, 500_500);
    Ok(())
}

#[tokio::test]
async fn interceptors() -> Result {
    use rpc_core::intercept::{interceptor_fn, InterceptLayer};
    use rpc_core::{server::Server, Metadata, Status};
    use rpc_proto::echo::{echo_client::EchoClient, SayRequest};
    use rpc_proto::echo::{echo_server::EchoServer, EchoService};
    use tower::Layer;

    // The server rejects calls without the token.
    let auth = interceptor_fn(|method: &str, metadata: &mut Metadata| {
        if metadata.get_str("x-token") == Some("s3cret") {
            Ok(())
        } else {
            Err(Status::unauthenticated(format!("{method} needs x-token")))
        }
    });
    let server = Server::builder()
        .layer(InterceptLayer::new(auth))
        .add_service(EchoServer::new(EchoService));

    // The client adds it to every call.
    let token = interceptor_fn(|_method: &str, metadata: &mut Metadata| {
        let added = metadata.insert("x-token", "s3cret");
        added.map_err(|err| Status::internal(err.to_string()))
    });
    let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
    let uri = listener.local_addr_uri();
    tokio::spawn(server.serve(listener));
    let channel = rpc_transport_tcp::connect(&uri).await?;
    let mut echo = EchoClient::new(InterceptLayer::new(token).layer(channel));
    let reply = echo
        .say(SayRequest {
            message: "hi".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(reply.get_ref().message, "hi");

    let mut without_token = EchoClient::new(rpc_transport_tcp::connect(&uri).await?);
    let refused = without_token.say(SayRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), rpc_core::Code::UNAUTHENTICATED);
    Ok(())
}

#[tokio::test]
async fn bulk_transfer() -> Result {
    let uri = serve().await?;
    let channel = rpc_transport_tcp::connect(&uri).await?;
    let data = rpc_proto::blob::pattern(1, 1 << 20);
    use rpc_proto::blob::{blob_client::BlobClient, UploadRequest};
    use std::time::Duration;

    let exposed = channel.bulk().expose_read(data, Duration::from_secs(60))?;
    let descriptor = exposed.descriptor().to_bytes();
    let reply = BlobClient::new(channel)
        .upload(UploadRequest { descriptor })
        .await?; // the server called request.bulk().read(..) on the descriptor
    assert_eq!(reply.get_ref().len, 1 << 20);
    Ok(())
}

#[tokio::test]
async fn retries() -> Result {
    let uri = serve().await?;
    use rpc_core::retry::RetryPolicy;

    let channel = rpc_transport_tcp::connect(&uri).await?;
    let mut kv = KeyValueClient::new(channel).with_retries(RetryPolicy::default());
    // or, as a tower layer anywhere in a stack: RetryLayer::new(policy).layer(channel)
    let missing = kv
        .get(GetRequest {
            key: "nothing".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), rpc_core::Code::NOT_FOUND);
    Ok(())
}

/// Compiled, not run: the addresses exist only in the README.
#[allow(dead_code)]
async fn one_line_any_transport() -> Result {
    use rpc_connect::Connect;

    let mut one = KeyValueClient::connect("udp://10.0.0.5:7000").await?;
    let mut any = KeyValueClient::balanced("dns://_kv._tcp.example.com")
        .await?
        .with_retries(RetryPolicy::default());
    one.get(GetRequest::default()).await?;
    any.get(GetRequest::default()).await?;
    Ok(())
}

#[tokio::test]
async fn several_replicas() -> Result {
    use rpc_core::balance::Balanced;
    use rpc_transport_tcp::StreamChannels;

    let replicas = [
        "tcp://10.0.0.1:7000".parse()?,
        "tcp://10.0.0.2:7000".parse()?,
    ];
    let balanced = Balanced::from_endpoints(StreamChannels::default(), replicas)?;
    let kv = KeyValueClient::new(balanced).with_retries(RetryPolicy::default());
    // Channels connect on first use: these two addresses are never dialed here.
    drop(kv);
    Ok(())
}

/// A fenced block of the README: its language and text, and the line it starts on.
struct Block {
    lang: String,
    text: String,
    line: usize,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in markdown.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(Block {
                    lang: lang.trim().to_string(),
                    text: String::new(),
                    line: n + 1,
                })
            }
            (Some(_), Some("")) => blocks.extend(open.take()),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "README.md: a fenced block is not closed");
    blocks
}

/// Whether `excerpt`'s lines appear one after another in `file`, each indented by the
/// same prefix (a snippet quoted from inside a function body).
fn quotes(file: &str, excerpt: &str) -> bool {
    let file: Vec<&str> = file.lines().collect();
    let excerpt: Vec<&str> = excerpt.lines().collect();
    let Some(first) = excerpt.first() else {
        return false;
    };
    (0..file.len().saturating_sub(excerpt.len() - 1)).any(|start| {
        let Some(indent) = file[start].strip_suffix(first) else {
            return false;
        };
        indent.trim().is_empty()
            && excerpt.iter().zip(&file[start..]).all(|(want, got)| {
                if want.is_empty() {
                    got.is_empty()
                } else {
                    got.strip_prefix(indent) == Some(want)
                }
            })
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

#[test]
fn the_readme_quotes_code_that_compiles() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = read(&here.join("../README.md"));
    let quickstart = here.join("quickstart");
    let proto = read(&quickstart.join("proto/kv.proto"));
    let manifest = read(&quickstart.join("Cargo.toml"));
    let dependencies = &manifest[manifest.find("[dependencies]").expect("[dependencies]")..];
    let dependencies = dependencies.replace("\"../../", "\"/path/to/rpc/");
    let sources = [
        (
            "examples/quickstart/build.rs",
            read(&quickstart.join("build.rs")),
        ),
        (
            "examples/quickstart/src/main.rs",
            read(&quickstart.join("src/main.rs")),
        ),
        (
            "examples/tests/readme.rs",
            read(&here.join("tests/readme.rs")),
        ),
    ];
    let blocks = blocks(&readme);
    let mut rust = 0;
    for block in &blocks {
        let at = format!("README.md:{}", block.line);
        match block.lang.as_str() {
            "sh" => {}
            "proto" => assert_eq!(
                block.text, proto,
                "{at}: not examples/quickstart/proto/kv.proto"
            ),
            "toml" => assert_eq!(
                block.text, dependencies,
                "{at}: not the dependencies of examples/quickstart/Cargo.toml \
                 (with paths under /path/to/rpc)"
            ),
            "rust" => {
                rust += 1;
                assert!(
                    sources
                        .iter()
                        .any(|(_, source)| quotes(source, &block.text)),
                    "{at}: this block is in none of {:?}; put it in one (tests here run \
                     it) and quote it exactly:\n{}",
                    sources.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
                    block.text
                );
            }
            other => panic!("{at}: a block marked {other:?}: mark it rust, proto, toml or sh"),
        }
    }
    // The Quickstart's build.rs and main.rs are quoted whole.
    for (name, source) in &sources[..2] {
        assert!(
            blocks.iter().any(|block| &block.text == source),
            "README.md does not show {name} whole"
        );
    }
    assert!(
        rust >= 8,
        "README.md: only {rust} rust blocks; is the parser right?"
    );
}

#[test]
fn quoting_allows_one_indentation_and_nothing_else() {
    let file = "fn f() {\n    let a = 1;\n\n    let b = a;\n}\n";
    assert!(quotes(file, "let a = 1;\n\nlet b = a;\n"));
    assert!(quotes(file, file));
    assert!(!quotes(file, "let a = 1;\nlet b = a;\n"));
    assert!(!quotes(file, "let b = a;\nlet a = 1;\n"));
    assert!(!quotes(file, "a = 1;\n"));
}
