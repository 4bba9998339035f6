//! The `rpc` command line (crate rpc-cli) against the `rpc-server` binary, both as
//! processes: `list`, `describe`, `call`, `health` and a short `bench` over TCP, UDP,
//! RDMA (the soft provider), gRPC's wire, a Unix socket and TLS, with the server's reflection; and
//! `--no-reflection` answered with a message saying how to pass `.proto` files.
//!
//! `rpc` is found next to `rpc-server` in the target directory: `cargo test
//! --workspace` builds both. Run alone (`cargo test -p rpc-server`), the test skips
//! with a note unless `rpc` was built (under `CI` it fails instead).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::process::Command;

/// The `rpc` binary beside `rpc-server`, if it was built.
fn rpc_binary() -> Option<PathBuf> {
    let rpc = Path::new(env!("CARGO_BIN_EXE_rpc-server")).with_file_name("rpc");
    if rpc.exists() {
        return Some(rpc);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing: cargo test --workspace builds it",
        rpc.display()
    );
    eprintln!("skipped: build the command line first (cargo build -p rpc-cli)");
    None
}

fn cert(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/tls")
        .join(name)
        .display()
        .to_string()
}

/// Runs `rpc args…` and returns its exit code, stdout and stderr.
async fn rpc(rpc: &Path, args: &[&str]) -> (i32, String, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(rpc).args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("rpc hung")
    .expect("run rpc");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_lists_describes_calls_checks_and_benches_the_server_binary_on_every_wire() {
    let Some(bin) = rpc_binary() else { return };
    let unix = format!(
        "unix://{}",
        std::env::temp_dir()
            .join(format!("rpc-cli-{}.sock", std::process::id()))
            .display()
    );
    let common::Launched {
        child: _server,
        uris,
        admin,
    } = common::launch(&[
        "--admin",
        "127.0.0.1:0",
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        "udp://127.0.0.1:0",
        "--listen",
        "rdma://127.0.0.1:0",
        "--listen",
        "grpc://127.0.0.1:0",
        "--listen",
        &unix,
        "--listen",
        "tls://127.0.0.1:0",
        "--tls-cert",
        &cert("server.pem"),
        "--tls-key",
        &cert("server.key"),
    ])
    .await;
    let ca = cert("ca.pem");
    for uri in &uris {
        let tls: Vec<&str> = if uri.starts_with("tls://") {
            vec!["--ca", &ca]
        } else {
            Vec::new()
        };
        let with = |args: &[&str]| -> Vec<String> {
            let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            all.extend(tls.iter().map(|a| a.to_string()));
            all
        };
        let run = |args: Vec<String>| {
            let bin = bin.clone();
            async move {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                rpc(&bin, &args).await
            }
        };

        let (code, out, err) = run(with(&["list", uri])).await;
        assert_eq!(code, 0, "{uri}: list: {err}");
        for service in [
            "rpc.examples.v1.Echo",
            "rpc.examples.v1.KeyValue",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
        ] {
            assert!(out.lines().any(|l| l.trim() == service), "{uri}: {out}");
        }

        let (code, out, err) = run(with(&["describe", uri, "rpc.examples.v1.Echo"])).await;
        assert_eq!(code, 0, "{uri}: describe: {err}");
        assert!(
            out.contains("service Echo") && out.contains("rpc Say"),
            "{out}"
        );

        let (code, out, err) = run(with(&[
            "call",
            uri,
            "rpc.examples.v1.Echo/Say",
            "-d",
            r#"{"message": "hello"}"#,
        ]))
        .await;
        assert_eq!(code, 0, "{uri}: call: {err}");
        assert!(out.contains(r#""message": "hello""#), "{uri}: {out}");

        // A failing call: NOT_FOUND is 5, and the exit code is 64 + 5.
        let (code, _, err) = run(with(&[
            "call",
            uri,
            "rpc.examples.v1.Echo/Fail",
            "-d",
            r#"{"code": 5, "message": "no such thing"}"#,
        ]))
        .await;
        assert_eq!(code, 69, "{uri}: {err}");
        assert!(
            err.contains("NOT_FOUND") && err.contains("no such thing"),
            "{err}"
        );

        let (code, out, err) = run(with(&["health", uri])).await;
        assert_eq!(code, 0, "{uri}: health: {out}{err}");

        let (code, out, err) = run(with(&[
            "bench",
            uri,
            "rpc.examples.v1.Echo/Say",
            "-d",
            r#"{"message": "x"}"#,
            "-n",
            "2000",
            "-c",
            "16",
            "--format",
            "json",
        ]))
        .await;
        assert_eq!(code, 0, "{uri}: bench: {err}");
        assert!(out.contains("\"OK\""), "{uri}: bench report: {out}");
    }
    let _ = std::fs::remove_file(unix.trim_start_matches("unix://"));
    // Every command's reflection stream ended OK, none cancelled (from two reviews:
    // each `rpc` run left one CANCELLED, read as errors on dashboards).
    let admin = admin.expect("the admin address");
    let mut http = tokio::net::TcpStream::connect(&admin).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    http.write_all(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut metrics = String::new();
    http.read_to_string(&mut metrics).await.unwrap();
    let reflection: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("rpc_server_calls_total") && l.contains("ServerReflectionInfo"))
        .collect();
    assert!(!reflection.is_empty(), "{metrics}");
    assert!(
        reflection.iter().all(|l| l.contains("code=\"OK\"")),
        "{reflection:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reflection_rpc_says_how_to_pass_proto_files() {
    let Some(bin) = rpc_binary() else { return };
    let common::Launched {
        child: _server,
        uris,
        ..
    } = common::launch(&["--listen", "tcp://127.0.0.1:0", "--no-reflection"]).await;
    let (code, out, err) = rpc(&bin, &["list", &uris[0]]).await;
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("--proto"), "{err}");
    // With the .proto files, calls work.
    let protos = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto");
    let (code, out, err) = rpc(
        &bin,
        &[
            "call",
            &uris[0],
            "rpc.examples.v1.Echo/Say",
            "--proto",
            "rpc/examples/v1/echo.proto",
            "-I",
            &protos.display().to_string(),
            "-d",
            r#"{"message": "by file"}"#,
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("by file"), "{out}");
}

mod common;

/// `rpc` finds a service's replicas in etcd (`etcd://cluster/service`), where
/// `rpc-server --register` put them, and balances its calls over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_calls_replicas_it_finds_in_etcd() {
    let Some(bin) = rpc_binary() else { return };
    let Some(cluster) = common::cluster() else {
        return;
    };
    let service = common::unique("cli");
    let register = format!("etcd://{}/{service}", cluster.join(","));
    let mut replicas = Vec::new();
    for name in ["a", "b"] {
        replicas.push(common::start(&cluster, &service, name).await);
    }
    let (code, out, err) = rpc(
        &bin,
        &[
            "call",
            &register,
            "rpc.examples.v1.Echo/Say",
            "-v",
            "-d",
            r#"{"message": "found in etcd"}"#,
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("found in etcd"), "{out}");
    // Served by one of the two (each reply carries x-served-by).
    assert!(
        err.contains("x-served-by: a") || err.contains("x-served-by: b"),
        "{err}"
    );
    let (code, out, err) = rpc(&bin, &["list", &register]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("rpc.examples.v1.Echo"), "{out}");
}
