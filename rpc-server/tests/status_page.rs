//! The admin server's status page (`--admin`), loaded by headless Chromium while calls
//! run: the index's charts show the traffic (after its script has polled
//! `status.json`), `/rpcz` lists the calls made, `/connections` the client's TCP
//! connection. And over plain HTTP: read-only (405), 404, `/metrics` still Prometheus
//! text, bad query strings answered. Needs no etcd; the browser test needs `chromium`
//! on PATH (Debian's package; `.ci/run` installs it).
//!
//! `RPC_STATUS_SCREENSHOT=docs/status-page.png` makes the browser test also save a
//! screenshot of the index under load there.

mod common;

use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use rpc_core::Request;
use rpc_proto::echo::{echo_client::EchoClient, FailRequest, SayRequest};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::{Child, Command},
};

const SAY: &str = "rpc.examples.v1.Echo/Say";
const FAIL: &str = "rpc.examples.v1.Echo/Fail";

/// `rpc-server` with one TCP listener and the admin server, from `admin_flag`
/// (`--admin` or its alias `--metrics`): the child, the listener's URI and the admin
/// address (`HOST:PORT`).
async fn start(admin_flag: &str) -> (Child, String, String) {
    let common::Launched {
        child,
        mut uris,
        admin,
    } = common::launch(&["--listen", "tcp://127.0.0.1:0", admin_flag, "127.0.0.1:0"]).await;
    (
        child,
        uris.remove(0),
        admin.expect("the admin server's address"),
    )
}

/// `METHOD path` on the admin address: status code, headers and body as text.
async fn http(addr: &str, method: &str, path: &str) -> (u16, String, String) {
    http_for(addr, "127.0.0.1", method, path).await
}

/// [`http`] with `host` as the request's `Host`.
async fn http_for(addr: &str, host: &str, method: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not HTTP: {text}"));
    (code, head.to_ascii_lowercase(), body.to_owned())
}

/// Calls `Say` (and now and then `Fail`, NOT_FOUND) until `stop`, counting the calls.
fn load(uri: String, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut client = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            if n % 20 == 0 {
                let status = client
                    .fail(FailRequest {
                        code: 5,
                        message: "no such key".into(),
                    })
                    .await
                    .unwrap_err();
                assert_eq!(status.code(), rpc_core::Code::NOT_FOUND);
            } else {
                let request = SayRequest {
                    message: format!("call {n}"),
                    ..SayRequest::default()
                };
                client
                    .say(Request::new(request).with_timeout(Duration::from_secs(10)))
                    .await
                    .unwrap();
            }
            count.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// `chromium` on PATH; `None` (after saying how to get it) when it is absent outside
/// CI. Under CI (`CI` set) its absence fails the test: `.ci/run` installs it.
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("chromium"))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        let how =
            "install it with `apt-get install -y chromium` (Debian) or put a `chromium` on PATH";
        if std::env::var_os("CI").is_some() {
            panic!("chromium is not on PATH, and the status page test needs it: {how}");
        }
        eprintln!("skipped: no chromium on PATH; {how}");
    }
    found
}

/// Headless Chromium on `url` with `extra` flags: what it printed (the DOM with
/// `--dump-dom`, after the page's scripts ran for the virtual-time budget).
async fn browse(chromium: &PathBuf, url: &str, extra: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!(
        "rpc-status-chromium-{}-{}",
        std::process::id(),
        rpc_core::frame::random_client_id()
    ));
    let output = Command::new(chromium)
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-extensions",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .expect("chromium took over two minutes")
        .expect("run chromium");
    let _ = std::fs::remove_dir_all(&profile);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "chromium failed: {:?}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The start tag of the first element in `html` that begins with `prefix`.
fn tag<'a>(html: &'a str, prefix: &str) -> &'a str {
    let start = html
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in\n{html}"));
    let rest = &html[start..];
    &rest[..rest.find('>').map_or(rest.len(), |end| end + 1)]
}

/// The value of attribute `name` in a start tag.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let needle = format!(" {name}=\"");
    let start = tag
        .find(&needle)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + needle.len();
    &tag[start..start + tag[start..].find('"').unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_sees_the_traffic_on_the_status_page_rpcz_and_connections() {
    let Some(chromium) = chromium() else {
        return;
    };
    let (_child, uri, admin) = start("--admin").await;
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let load = load(uri, stop.clone(), count.clone());

    // Until a complete second with calls is in the window (the charts leave out the
    // second in progress).
    let rate = format!("\"method\":\"{SAY}\",\"in_flight\":");
    let mut json = String::new();
    for _ in 0..300 {
        json = http(&admin, "GET", "/status.json").await.2;
        if json.contains(&rate) && !json.contains("\"rate\":0,") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(json.contains(&rate), "no {SAY} in {json}");

    // The index: the chart of Say's calls/s shows the calls, after the page's script
    // has polled status.json at least once (the DOM is the script's).
    let index = browse(&chromium, &format!("http://{admin}/"), &["--dump-dom"]).await;
    let body = tag(&index, "<body");
    let polls: u32 = attr(body, "data-polls").parse().unwrap();
    assert!(polls >= 1, "the page never polled status.json: {body}");
    let svg_start = format!("<svg data-method=\"{SAY}\" data-metric=\"calls\"");
    let svg = tag(&index, &svg_start);
    let max: f64 = attr(svg, "data-max").parse().unwrap();
    assert!(max > 0.0, "the calls/s chart is flat: {svg}");
    let path = tag(&index[index.find(&svg_start).unwrap()..], "<path");
    // `M0,38.0 L1,37.2 ...`: a new segment (M) after a second without a value.
    let heights: Vec<f64> = attr(path, "d")
        .split(' ')
        .filter_map(|point| point.split_once(',')?.1.parse().ok())
        .collect();
    // One point per second since the server started, at most five minutes' worth.
    assert!((1..=300).contains(&heights.len()), "{path}");
    assert!(
        heights.iter().any(|&y| y < 38.0),
        "no point above the baseline: {path}"
    );
    let value = tag(
        &index,
        &format!("<b class=\"value\" data-method=\"{SAY}\" data-metric=\"calls\""),
    );
    let rate: f64 = attr(value, "data-value").parse().unwrap();
    assert!(rate > 0.0, "current calls/s: {value}");
    // Fail answers NOT_FOUND: its error-rate chart is up.
    let errors = tag(
        &index,
        &format!("<b class=\"value\" data-method=\"{FAIL}\" data-metric=\"errors\""),
    );
    assert_eq!(attr(errors, "data-value"), "100", "{errors}");

    // /rpcz: the calls made, by method and by status.
    let rpcz = browse(
        &chromium,
        &format!("http://{admin}/rpcz?method=Echo%2FSay&status=OK"),
        &["--dump-dom"],
    )
    .await;
    let row = tag(&rpcz, "<tr class=\"call\"");
    assert_eq!(attr(row, "data-method"), SAY, "{row}");
    assert_eq!(attr(row, "data-status"), "OK", "{row}");
    assert!(
        !rpcz.contains(&format!("data-method=\"{FAIL}\"")),
        "filtered out"
    );
    let failed = browse(
        &chromium,
        &format!("http://{admin}/rpcz?status=NOT_FOUND"),
        &["--dump-dom"],
    )
    .await;
    let row = tag(&failed, "<tr class=\"call\"");
    assert_eq!(attr(row, "data-method"), FAIL, "{row}");
    assert!(failed.contains("no such key"), "the status message");

    // /connections: the load's TCP connection, with bytes each way.
    let connections = browse(
        &chromium,
        &format!("http://{admin}/connections"),
        &["--dump-dom"],
    )
    .await;
    let row = tag(&connections, "<tr class=\"connection\" data-wire=\"tcp\"");
    let received: u64 = attr(row, "data-bytes-received").parse().unwrap();
    let sent: u64 = attr(row, "data-bytes-sent").parse().unwrap();
    assert!(received > 0 && sent > 0, "{row}");

    if let Some(path) = std::env::var_os("RPC_STATUS_SCREENSHOT") {
        let path = PathBuf::from(path);
        let path = if path.is_relative() {
            // Relative to the workspace, not to this crate.
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(path)
        } else {
            path
        };
        browse(
            &chromium,
            &format!("http://{admin}/"),
            &[
                &format!("--screenshot={}", path.display()),
                "--window-size=1280,1000",
                "--hide-scrollbars",
            ],
        )
        .await;
        assert!(path.is_file(), "no screenshot at {}", path.display());
    }

    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(count.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn the_admin_server_is_read_only_and_still_serves_prometheus_text() {
    // `--metrics`, the older name, serves the same pages.
    let (_child, uri, admin) = start("--metrics").await;
    let mut client = EchoClient::new(rpc_transport_tcp::connect(&uri).await.unwrap());
    client
        .say(SayRequest {
            message: "m".into(),
            ..SayRequest::default()
        })
        .await
        .unwrap();

    for (method, path) in [("POST", "/"), ("DELETE", "/rpcz"), ("PUT", "/metrics")] {
        let (code, head, _) = http(&admin, method, path).await;
        assert_eq!(code, 405, "{method} {path}");
        assert!(head.contains("allow: get, head"), "{head}");
    }
    for path in ["/nope", "/rpcz/", "/metrics/x"] {
        assert_eq!(http(&admin, "GET", path).await.0, 404, "{path}");
    }
    let (code, head, body) = http(&admin, "HEAD", "/").await;
    assert_eq!((code, body.as_str()), (200, ""), "HEAD has no body");
    // On loopback, only requests for localhost or an IP address: a page that rebinds
    // its name to 127.0.0.1 (DNS rebinding) is refused.
    let port = admin.rsplit(':').next().unwrap();
    assert_eq!(
        http_for(&admin, &format!("localhost:{port}"), "GET", "/rpcz")
            .await
            .0,
        200
    );
    assert_eq!(
        http_for(&admin, &format!("rebound.example:{port}"), "GET", "/rpcz")
            .await
            .0,
        421
    );
    assert!(head.contains("content-type: text/html"), "{head}");

    // Prometheus text on /metrics, as before.
    let (code, head, body) = http(&admin, "GET", "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    for line in [
        "# TYPE rpc_server_calls_total counter",
        &format!("rpc_server_calls_total{{method=\"{SAY}\",code=\"OK\"}} 1"),
        "rpc_server_connections 1",
    ] {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }

    // Every page answers, whatever the query.
    for path in [
        "/rpcz?status=%ff%fe&min_ms=abc&limit=-1&method=%",
        "/rpcz?status=BOGUS&&=&min_ms=1e999",
        "/rpcz?method=%3Cscript%3E",
        "/?x=1",
        "/connections?%zz",
        "/status.json?",
    ] {
        let (code, _, body) = http(&admin, "GET", path).await;
        assert_eq!(code, 200, "{path}: {body}");
        assert!(!body.contains("<script>\""), "{path}: unescaped");
    }
    let (_, _, body) = http(&admin, "GET", "/rpcz?status=BOGUS").await;
    assert!(body.contains("ignored status=BOGUS"), "{body}");
    let (_, head, json) = http(&admin, "GET", "/status.json").await;
    assert!(head.contains("content-type: application/json"), "{head}");
    assert!(
        json.starts_with("{\"uptime\":") && json.trim_end().ends_with('}'),
        "{json}"
    );
    assert!(json.contains(&format!("\"method\":\"{SAY}\"")), "{json}");
}
