//! The `rpc` binary against a mirror server (`tests/mirror_protos/`): methods of every
//! streaming kind that send the requests back as they came, so that what is printed is
//! what the CLI encoded. Checks protobuf's proto3 JSON mapping both ways (64-bit
//! integers, enums, bytes, non-finite and negative-zero floats, presence, oneofs, maps,
//! names, the well-known types, `Any`), the output of streams and failed calls, exit
//! codes, and how methods are named.

mod common;

use std::path::PathBuf;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message as _;
use rpc_core::{
    server::{Server, ServerCall, ServerReply},
    stream::{ReplyStream, TakeOnce},
    Code, Payload, Status,
};
use serde_json::{json, Value};

use common::{rpc, rpc_with_stdin, Run};

/// The directory of the mirror's `.proto` files.
fn protos() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mirror_protos")
}

/// The mirror's files, their imports included.
fn descriptor_set() -> prost_types::FileDescriptorSet {
    let mut compiler = protox::Compiler::new([protos()]).unwrap();
    compiler.include_imports(true);
    compiler
        .open_files([
            "clitest/mirror.proto",
            "clitest2/mirror2.proto",
            "clitest3/detail.proto",
        ])
        .unwrap();
    compiler.file_descriptor_set()
}

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<prost_types::Any>,
}

/// `clitest.v1.FailRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct FailRequest {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// A message of one string field 1 and one int64 field 2 (`google.rpc.ErrorInfo`'s
/// reason, `clitest.v1.Inner`'s name, `clitest.v3.Detail`'s why and count).
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, tag = "2")]
    number: i64,
}

fn any(type_name: &str, value: &impl prost::Message) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: value.encode_to_vec(),
    }
}

/// The mirror: `clitest.v1.Mirror` and `clitest.v1.Other`, `clitest.v2.Mirror`, with
/// reflection over their files.
fn mirror_server() -> Server {
    let mirror = tower::service_fn(|call: ServerCall| async move {
        let method = call.method.to_string();
        let name = method.rsplit('/').next().unwrap_or_default().to_owned();
        let mut reply = ServerReply::default();
        match name.as_str() {
            "Echo" | "Stamp" | "Nothing" | "Wrapped" => {
                reply.payload = Payload::from(call.payload.clone());
            }
            "Fail" => {
                let request = FailRequest::decode(call.payload.clone()).unwrap();
                let details = RpcStatus {
                    code: request.code,
                    message: request.message.clone(),
                    details: vec![
                        any(
                            "google.rpc.ErrorInfo",
                            &Named {
                                name: "QUOTA".into(),
                                number: 0,
                            },
                        ),
                        any(
                            "clitest.v1.Inner",
                            &Named {
                                name: "inner".into(),
                                number: 7,
                            },
                        ),
                        any(
                            "clitest.v3.Detail",
                            &Named {
                                name: "because".into(),
                                number: 1 << 40,
                            },
                        ),
                    ],
                };
                return Err(
                    Status::new(Code::from_u32(request.code as u32), request.message)
                        .with_details(Bytes::from(details.encode_to_vec())),
                );
            }
            "Repeat" | "Collect" | "Bidi" => {
                let requests = call.stream.as_ref().and_then(|s| s.take());
                let requests = requests.ok_or_else(|| Status::internal("no stream"))?;
                match name.as_str() {
                    "Repeat" => {
                        let requests: Vec<Result<Bytes, Status>> = requests.collect().await;
                        let one = requests.into_iter().next().unwrap()?;
                        let three: ReplyStream = futures::stream::iter(
                            (0..3).map(move |_| Ok(Payload::from(one.clone()))),
                        )
                        .boxed();
                        reply.stream = Some(TakeOnce::new(three));
                    }
                    "Collect" => {
                        // AllList: each request as an element of field 1.
                        let mut list = Vec::new();
                        let requests: Vec<Result<Bytes, Status>> = requests.collect().await;
                        for request in requests {
                            let request = request?;
                            prost::encoding::bytes::encode(1, &request, &mut list);
                        }
                        reply.payload = Payload::from(list);
                    }
                    _ => {
                        let answers: ReplyStream =
                            requests.map(|request| request.map(Payload::from)).boxed();
                        reply.stream = Some(TakeOnce::new(answers));
                    }
                }
            }
            _ => return Err(Status::unimplemented(method)),
        }
        Ok::<_, Status>(reply)
    });
    let reflection = rpc_services::reflection::Reflection::builder()
        .register_file_descriptor_set(descriptor_set())
        .build();
    Server::builder()
        .add_named_service("clitest.v1.Mirror", mirror)
        .add_named_service("clitest.v1.Other", mirror)
        .add_named_service("clitest.v2.Mirror", mirror)
        .add_service(reflection.v1())
        .build()
}

/// The mirror, serving on a loopback TCP port until dropped.
struct Mirror {
    uri: String,
    _serving: tokio::task::JoinHandle<Result<(), rpc_core::Error>>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self._serving.abort();
    }
}

async fn mirror() -> Mirror {
    let server = mirror_server();
    let (uri, serving) =
        rpc_connect::serve(&server, "tcp://127.0.0.1:0", futures::future::pending())
            .await
            .unwrap();
    Mirror {
        uri,
        _serving: tokio::spawn(serving),
    }
}

impl Mirror {
    /// `rpc call URI METHOD -d JSON ARGS...`.
    async fn call(&self, method: &str, json: &str, extra: &[&str]) -> Run {
        let mut args = vec!["call", self.uri.as_str(), method, "-d", json];
        args.extend_from_slice(extra);
        rpc(&args).await
    }

    /// `Echo` of `json`, compact: the printed response.
    async fn echo(&self, json: &str) -> Value {
        let run = self
            .call("clitest.v1.Mirror/Echo", json, &["--compact"])
            .await;
        run.expect_code(0).json()
    }

    /// `Echo` of `json`, which must be refused (exit 1): the error.
    async fn refused(&self, json: &str) -> String {
        let run = self.call("clitest.v1.Mirror/Echo", json, &[]).await;
        assert_eq!(run.code, 1, "{json} was taken: {run:?}");
        run.stderr
    }
}

/// Serves the mirror until killed, printing its URI: `cargo test -p rpc-cli --test
/// mirror serve_the_mirror -- --ignored --nocapture`, to try the CLI by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn serve_the_mirror() {
    let mirror = mirror().await;
    println!("{}", mirror.uri);
    futures::future::pending::<()>().await;
    drop(mirror);
}

/// Whether `value` is the number -0.
fn is_negative_zero(value: &Value) -> bool {
    value
        .as_f64()
        .is_some_and(|n| n == 0.0 && n.is_sign_negative())
}

/// Scalars: 64-bit integers print as strings and are taken as numbers or strings,
/// numbers with exponents, enums by name and number (unknown numbers kept), bytes in
/// either base64 alphabet with or without padding, non-finite floats as strings,
/// defaults left out unless asked for, presence, oneofs, names both ways, `null`, and
/// unknown fields refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scalars_follow_the_proto3_json_mapping() {
    let mirror = mirror().await;
    let out = mirror
        .echo(
            r#"{"i64": 9007199254740993, "u64": "18446744073709551615", "s64": "-5",
                "fx64": 18446744073709551615, "sfx64": "-9223372036854775808",
                "i32": "12", "u32": 1e3, "i64s": [1, "-2", 3e2]}"#,
        )
        .await;
    assert_eq!(
        out,
        json!({"i32": 12, "i64": "9007199254740993", "u32": 1000,
               "u64": "18446744073709551615", "s64": "-5", "fx64": "18446744073709551615",
               "sfx64": "-9223372036854775808", "i64s": ["1", "-2", "300"]})
    );
    let out = mirror
        .echo(r#"{"i32": 1e2, "db": 1.5e300, "fl": 2.5e-3, "dbs": [-1E-5]}"#)
        .await;
    assert_eq!(
        out,
        json!({"i32": 100, "fl": 0.0025, "db": 1.5e300, "dbs": [-1e-5]})
    );
    let out = mirror
        .echo(r#"{"db": "NaN", "fl": "-Infinity", "dbs": ["Infinity", 1.5, "NaN"], "dw": "NaN"}"#)
        .await;
    assert_eq!(
        out,
        json!({"fl": "-Infinity", "db": "NaN", "dbs": ["Infinity", 1.5, "NaN"], "dw": "NaN"})
    );
    // Integers as strings with a fraction or an exponent are the numbers they write
    // (proto3 JSON reads the string as a number; they were refused), exactly.
    let out = mirror
        .echo(
            r#"{"i64": "1e3", "i32": "1.0", "u64": "1.8446744073709551615e19",
                "s64": "-12.5e1", "fx64": "0.0e5", "i64w": "2E2"}"#,
        )
        .await;
    assert_eq!(
        out,
        json!({"i32": 1, "i64": "1000", "u64": "18446744073709551615", "s64": "-125",
               "i64w": "200"})
    );
    for bad in [
        r#"{"i32": "1.5"}"#,
        r#"{"i64": "1e30"}"#,
        r#"{"u32": "-1e0"}"#,
    ] {
        mirror.refused(bad).await;
    }
    // Floats as strings: JSON numbers and the three names only, within range ("inf"
    // was taken, and "1e39" made an infinity of a float).
    let out = mirror
        .echo(r#"{"db": "-1.5E2", "fl": "0.25", "dbs": ["1", "NaN"], "dw": "2"}"#)
        .await;
    assert_eq!(
        out,
        json!({"fl": 0.25, "db": -150.0, "dbs": [1.0, "NaN"], "dw": 2.0})
    );
    for bad in [
        r#"{"db": "inf"}"#,
        r#"{"db": "1e400"}"#,
        r#"{"fl": "1e39"}"#,
        r#"{"fl": " 1"}"#,
        r#"{"dw": "infinity"}"#,
        r#"{"intMap": {"1": {"ratio": "x"}}}"#,
    ] {
        mirror.refused(bad).await;
    }
    // Enums: by name or number, an unknown number kept as a number.
    let out = mirror
        .echo(r#"{"color": "GREEN", "colors": ["RED", 2, 7], "optColor": 0}"#)
        .await;
    assert_eq!(
        out,
        json!({"color": "GREEN", "optColor": "COLOR_UNSPECIFIED", "colors": ["RED", "GREEN", 7]})
    );
    assert_eq!(mirror.echo(r#"{"color": 9}"#).await, json!({"color": 9}));
    assert!(mirror
        .refused(r#"{"color": "BLUE"}"#)
        .await
        .contains("BLUE"));
    // Bytes: standard and URL-safe base64, with and without padding; printed standard.
    for input in ["+/8=", "+/8", "-_8=", "-_8"] {
        let out = mirror.echo(&format!(r#"{{"by": "{input}"}}"#)).await;
        assert_eq!(out, json!({"by": "+/8="}), "{input}");
    }
    let out = mirror
        .echo(r#"{"bys": ["", "AQID", "_w"], "byw": "-_-_"}"#)
        .await;
    assert_eq!(out, json!({"bys": ["", "AQID", "/w=="], "byw": "+/+/"}));
    assert!(mirror
        .refused(r#"{"by": "not base64!"}"#)
        .await
        .contains("by"));
    // Defaults are left out, unless --emit-defaults; fields with presence are printed
    // when set, even at their default.
    let zeros = r#"{"i32": 0, "s": "", "b": false, "color": "COLOR_UNSPECIFIED", "i64": "0",
                    "optI32": 0, "optS": ""}"#;
    assert_eq!(mirror.echo(zeros).await, json!({"optI32": 0, "optS": ""}));
    let all = mirror
        .call(
            "clitest.v1.Mirror/Echo",
            r#"{"optS": ""}"#,
            &["--emit-defaults", "--compact"],
        )
        .await;
    let all = all.expect_code(0).json();
    for (name, default) in [
        ("i32", json!(0)),
        ("i64", json!("0")),
        ("u64", json!("0")),
        ("fx64", json!("0")),
        ("b", json!(false)),
        ("s", json!("")),
        ("by", json!("")),
        ("color", json!("COLOR_UNSPECIFIED")),
        ("inners", json!([])),
        ("strMap", json!({})),
        ("optS", json!("")),
    ] {
        assert_eq!(all[name], default, "{name}: {all}");
    }
    assert_eq!(all["db"].as_f64(), Some(0.0), "{all}");
    assert!(all.get("optI32").is_none(), "unset, with presence: {all}");
    // An unset message field is null, as grpcurl's -emit-defaults prints it; a
    // oneof's members are left out.
    assert_eq!(all["inner"], json!(null), "{all}");
    assert_eq!(all["ts"], json!(null), "{all}");
    assert!(all.get("oneM").is_none(), "{all}");
    let keys: Vec<&String> = all.as_object().unwrap().keys().collect();
    let (i32_at, inner_at) = (
        keys.iter().position(|k| *k == "i32").unwrap(),
        keys.iter().position(|k| *k == "inner").unwrap(),
    );
    assert!(i32_at < inner_at, "in field order: {keys:?}");
    // A oneof: one member, even at its default; two are refused.
    assert_eq!(mirror.echo(r#"{"oneS": ""}"#).await, json!({"oneS": ""}));
    assert_eq!(mirror.echo(r#"{"oneM": {}}"#).await, json!({"oneM": {}}));
    assert_eq!(
        mirror.echo(r#"{"oneS": null, "oneI": "5"}"#).await,
        json!({"oneI": "5"})
    );
    let two = mirror.refused(r#"{"oneS": "a", "oneI": 1}"#).await;
    assert!(two.contains("choice"), "{two}");
    // Names: lowerCamelCase or as in the .proto (json_name too); printed either way.
    let out = mirror
        .echo(r#"{"snake_case_name": "x", "custom": "c", "opt_i32": 1}"#)
        .await;
    assert_eq!(
        out,
        json!({"optI32": 1, "snakeCaseName": "x", "myCustom": "c"})
    );
    let out = mirror
        .echo(r#"{"snakeCaseName": "y", "myCustom": "d"}"#)
        .await;
    assert_eq!(out, json!({"snakeCaseName": "y", "myCustom": "d"}));
    let proto_names = mirror
        .call(
            "clitest.v1.Mirror/Echo",
            r#"{"snakeCaseName": "y", "myCustom": "d", "strMap": {"k": 1}}"#,
            &["--proto-names", "--compact"],
        )
        .await;
    assert_eq!(
        proto_names.expect_code(0).json(),
        json!({"str_map": {"k": "1"}, "snake_case_name": "y", "custom": "d"})
    );
    // null: the field's default (absent); a google.protobuf.Value's null is a value.
    let out = mirror
        .echo(
            r#"{"i32": null, "inner": null, "inners": null, "strMap": null, "ts": null,
                "i64w": null, "oneS": null, "val": null, "nv": null}"#,
        )
        .await;
    assert_eq!(out, json!({"val": null}));
    // Unknown fields are refused, naming them.
    let unknown = mirror.refused(r#"{"nope": 1}"#).await;
    assert!(unknown.contains("nope"), "{unknown}");
    let nested = mirror.refused(r#"{"inner": {"nope": 1}}"#).await;
    assert!(nested.contains("inner"), "{nested}");
}

/// -0 is not the default 0: it goes to the server and back as -0, in a field without
/// presence (prost-reflect took it for the default and left it out both ways), a
/// nested message, a list, a map, a wrapper, and a stream's requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_zero_is_kept_both_ways() {
    let mirror = mirror().await;
    let out = mirror
        .echo(
            r#"{"db": -0, "fl": -0.0, "i32": 1, "dbs": [-0, 0], "inner": {"ratio": -0.0},
                "inners": [{"ratio": -0}, {"name": "b"}], "intMap": {"3": {"ratio": -0}},
                "dbMap": {"z": -0}, "dw": -0, "optDb": -0, "oneM": {"ratio": -0}}"#,
        )
        .await;
    for path in [
        &out["db"],
        &out["fl"],
        &out["dbs"][0],
        &out["inner"]["ratio"],
        &out["inners"][0]["ratio"],
        &out["intMap"]["3"]["ratio"],
        &out["dbMap"]["z"],
        &out["dw"],
        &out["optDb"],
        &out["oneM"]["ratio"],
    ] {
        assert!(is_negative_zero(path), "{path} in {out}");
    }
    assert_eq!(out["inners"][1], json!({"name": "b"}), "{out}");
    assert_eq!(out["i32"], 1, "{out}");
    // Fields stay in the order of their numbers.
    let text = out.to_string();
    let at = |key: &str| text.find(key).unwrap();
    assert!(
        at("\"i32\"") < at("\"fl\"") && at("\"fl\"") < at("\"db\""),
        "{text}"
    );
    assert!(at("\"db\"") < at("\"inner\""), "{text}");
    // In the messages Any values pack (prost-reflect encodes those itself), after
    // their "@type".
    let out = mirror
        .echo(
            r#"{"anys": [{"@type": "type.googleapis.com/google.protobuf.DoubleValue", "value": -0},
                         {"@type": "type.googleapis.com/clitest.v1.Inner", "ratio": -0, "name": "n"},
                         {"@type": "type.googleapis.com/google.protobuf.Any",
                          "value": {"@type": "type.googleapis.com/clitest.v1.Inner",
                                    "children": [{"ratio": -0.0}]}}]}"#,
        )
        .await;
    let anys = &out["anys"];
    assert!(is_negative_zero(&anys[0]["value"]), "{out}");
    assert!(is_negative_zero(&anys[1]["ratio"]), "{out}");
    assert_eq!(anys[1]["name"], "n", "{out}");
    assert!(
        is_negative_zero(&anys[2]["value"]["children"][0]["ratio"]),
        "{out}"
    );
    assert!(
        out.to_string().contains(
            r#"{"@type":"type.googleapis.com/clitest.v1.Inner","name":"n","ratio":-0.0}"#
        ),
        "{out}"
    );
    // 0 itself is still the default, left out.
    assert_eq!(mirror.echo(r#"{"db": 0, "fl": 0.0}"#).await, json!({}));
    // A client stream's requests too.
    let collected = rpc_with_stdin(
        &[
            "call",
            &mirror.uri,
            "clitest.v1.Mirror/Collect",
            "-d",
            "@-",
            "--compact",
        ],
        "{\"db\": -0}\n{\"db\": 1}\n",
    )
    .await;
    let collected = collected.expect_code(0).json();
    assert!(
        is_negative_zero(&collected["items"][0]["db"]),
        "{collected}"
    );
    assert_eq!(collected["items"][1]["db"], 1.0, "{collected}");
}

/// Messages: nested, repeated, maps with string, bool, integer and 64-bit keys
/// (printed in the order of their keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_lists_and_maps() {
    let mirror = mirror().await;
    let input = r#"{"inners": [{"name": "a", "children": [{"n": 1}]}, {}],
                    "inner": {"children": [{"children": [{"name": "deep"}]}]},
                    "strMap": {"b": "2", "a": 1, "": -3},
                    "boolMap": {"true": "t", "false": "f"},
                    "intMap": {"10": {"name": "x"}, "-1": {}, "2": {"n": 1}},
                    "u64Map": {"18446744073709551615": "max", "0": "zero"}}"#;
    let run = mirror
        .call("clitest.v1.Mirror/Echo", input, &["--compact"])
        .await;
    let out = run.expect_code(0).json();
    assert_eq!(
        out,
        json!({
            "inner": {"children": [{"children": [{"name": "deep"}]}]},
            "inners": [{"name": "a", "children": [{"n": 1}]}, {}],
            "strMap": {"": "-3", "a": "1", "b": "2"},
            "boolMap": {"false": "f", "true": "t"},
            "intMap": {"-1": {}, "2": {"n": 1}, "10": {"name": "x"}},
            "u64Map": {"0": "zero", "18446744073709551615": "max"}
        })
    );
    assert!(
        run.stdout
            .contains(r#""intMap":{"-1":{},"2":{"n":1},"10":{"name":"x"}}"#),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(r#""boolMap":{"false":"f","true":"t"}"#),
        "{}",
        run.stdout
    );
    for bad in [
        r#"{"intMap": {"x": {}}}"#,
        r#"{"boolMap": {"yes": "t"}}"#,
        r#"{"u64Map": {"-1": "t"}}"#,
        r#"{"inners": {}}"#,
    ] {
        mirror.refused(bad).await;
    }
    // A bad key is named, with what the map's keys are.
    for (bad, said) in [
        (r#"{"intMap": {"1": {}, "x": {}}}"#, r#"intMap["x"]"#),
        (r#"{"boolMap": {"yes": "t"}}"#, r#""true" and "false""#),
        (r#"{"u64Map": {"-1": "t"}}"#, "0 to 18446744073709551615"),
    ] {
        let stderr = mirror.refused(bad).await;
        assert!(stderr.contains(said), "{bad}: {stderr}");
        assert!(stderr.contains("the key"), "{bad}: {stderr}");
    }
}

/// The well-known types' JSON forms, as fields, as a method's whole request and
/// response, and packed in `Any` values (a well-known type under "value").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn well_known_types_have_their_json_forms() {
    let mirror = mirror().await;
    for (input, printed) in [
        ("1972-01-01T10:00:20.021-05:00", "1972-01-01T15:00:20.021Z"),
        ("2024-02-29T23:59:59Z", "2024-02-29T23:59:59Z"),
        ("2024-01-01T00:00:00.5Z", "2024-01-01T00:00:00.500Z"),
        ("2024-01-01T00:00:00.123456Z", "2024-01-01T00:00:00.123456Z"),
        (
            "2024-01-01T00:00:00.123456789+01:00",
            "2023-12-31T23:00:00.123456789Z",
        ),
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00Z"),
        (
            "9999-12-31T23:59:59.999999999Z",
            "9999-12-31T23:59:59.999999999Z",
        ),
    ] {
        let out = mirror.echo(&format!(r#"{{"ts": "{input}"}}"#)).await;
        assert_eq!(out, json!({ "ts": printed }), "{input}");
    }
    // More than nanoseconds is refused, not cut (it was, unseen).
    for bad in [
        "2024-01-01",
        "2024-01-01T00:00:00",
        "2024-13-01T00:00:00Z",
        "2024-01-01T00:00:00.1234567891Z",
    ] {
        mirror.refused(&format!(r#"{{"ts": "{bad}"}}"#)).await;
    }
    for (input, printed) in [
        ("1.5s", "1.500s"),
        ("-0.000000001s", "-0.000000001s"),
        ("3s", "3s"),
        ("-1.25s", "-1.250s"),
        ("0.000001s", "0.000001s"),
        ("315576000000s", "315576000000s"),
    ] {
        let out = mirror.echo(&format!(r#"{{"dur": "{input}"}}"#)).await;
        assert_eq!(out, json!({ "dur": printed }), "{input}");
    }
    for bad in ["1.5", "315576000001s", "1m", "1.0000000001s"] {
        mirror.refused(&format!(r#"{{"dur": "{bad}"}}"#)).await;
    }
    let out = mirror
        .echo(
            r#"{"mask": "a.b,cD", "st": {"z": [1, "x", null, {"b": true}], "a": {}},
                "val": 1.5, "lv": [1, {}, [], "s"], "empty": {}}"#,
        )
        .await;
    assert_eq!(
        out,
        json!({"mask": "a.b,cD", "st": {"a": {}, "z": [1.0, "x", null, {"b": true}]},
               "val": 1.5, "lv": [1.0, {}, [], "s"], "empty": {}})
    );
    let proto_names = mirror
        .call(
            "clitest.v1.Mirror/Echo",
            r#"{"mask": "fooBar.bazQux"}"#,
            &["--proto-names", "--compact"],
        )
        .await;
    assert_eq!(
        proto_names.expect_code(0).json(),
        json!({"mask": "fooBar.bazQux"})
    );
    // Wrappers: their value alone, 64-bit ones as strings, set at their defaults too.
    let out = mirror
        .echo(
            r#"{"i64w": 5, "u64w": 18446744073709551615, "sw": "", "bw": false,
                "byw": "AQI=", "dw": 1.5, "i32w": 0}"#,
        )
        .await;
    assert_eq!(
        out,
        json!({"i64w": "5", "u64w": "18446744073709551615", "sw": "", "bw": false,
               "byw": "AQI=", "dw": 1.5, "i32w": 0})
    );
    // Any: a message's fields beside "@type", a well-known type's JSON under "value",
    // an Any in an Any, and a type from a file the method's own do not import (the
    // server's reflection has it).
    let anys = r#"{"any": {"name": "x", "@type": "type.googleapis.com/clitest.v1.Inner", "n": 3},
        "anys": [
          {"@type": "type.googleapis.com/google.protobuf.Duration", "value": "1.5s"},
          {"@type": "type.googleapis.com/google.protobuf.Int64Value", "value": "7"},
          {"@type": "type.googleapis.com/google.protobuf.Empty", "value": {}},
          {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {"k": 1}},
          {"@type": "type.googleapis.com/google.protobuf.Any",
           "value": {"@type": "type.googleapis.com/clitest.v1.Inner", "name": "in"}},
          {"@type": "type.googleapis.com/clitest.v3.Detail", "why": "w", "count": 3}
        ]}"#;
    let out = mirror.echo(anys).await;
    assert_eq!(
        out,
        json!({
            "any": {"@type": "type.googleapis.com/clitest.v1.Inner", "name": "x", "n": 3},
            "anys": [
                {"@type": "type.googleapis.com/google.protobuf.Duration", "value": "1.500s"},
                {"@type": "type.googleapis.com/google.protobuf.Int64Value", "value": "7"},
                {"@type": "type.googleapis.com/google.protobuf.Empty", "value": {}},
                {"@type": "type.googleapis.com/google.protobuf.Struct", "value": {"k": 1.0}},
                {"@type": "type.googleapis.com/google.protobuf.Any",
                 "value": {"@type": "type.googleapis.com/clitest.v1.Inner", "name": "in"}},
                {"@type": "type.googleapis.com/clitest.v3.Detail", "why": "w", "count": "3"}
            ]
        })
    );
    let unknown_type = mirror
        .refused(r#"{"any": {"@type": "type.googleapis.com/nobody.Knows"}}"#)
        .await;
    assert!(unknown_type.contains("nobody.Knows"), "{unknown_type}");
    // A field the packed type lacks: named, without the Any's own fields as the
    // names it may mean ("value" was said to be listed by the server but undefined).
    for field in ["value", "nmae"] {
        let unknown = mirror
            .refused(&format!(
                r#"{{"any": {{"@type": "type.googleapis.com/clitest.v1.Inner", "{field}": 1}}}}"#
            ))
            .await;
        assert!(unknown.contains(&format!("'{field}'")), "{unknown}");
        assert!(
            !unknown.contains("server lists") && !unknown.contains("typeUrl"),
            "{unknown}"
        );
    }
    // Well-known types as a method's request and response.
    let stamp = mirror
        .call(
            "clitest.v1.Mirror/Stamp",
            r#""2024-01-01T00:00:00+01:00""#,
            &[],
        )
        .await;
    assert_eq!(stamp.expect_code(0).json(), json!("2023-12-31T23:00:00Z"));
    let nothing = mirror.call("clitest.v1.Mirror/Nothing", "{}", &[]).await;
    assert_eq!(nothing.expect_code(0).json(), json!({}));
    let wrapped = mirror
        .call("clitest.v1.Mirror/Wrapped", "18446744073709551615", &[])
        .await;
    assert_eq!(wrapped.expect_code(0).json(), json!("18446744073709551615"));
    let zero = mirror
        .call("clitest.v1.Mirror/Wrapped", r#""0""#, &[])
        .await;
    assert_eq!(zero.expect_code(0).json(), json!("0"));
}

/// Streams: several JSON values (lines, or any whitespace between them) from
/// standard input, a file or `-d`; server and bidirectional streams print one line
/// per message, a client stream's one response is printed whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_take_several_values_and_print_one_line_each() {
    let mirror = mirror().await;
    let uri = mirror.uri.as_str();
    let repeat = mirror
        .call(
            "clitest.v1.Mirror/Repeat",
            r#"{"u64": 18446744073709551615}"#,
            &[],
        )
        .await;
    let lines = repeat.expect_code(0).json_lines();
    assert_eq!(lines, vec![json!({"u64": "18446744073709551615"}); 3]);
    assert_eq!(repeat.stdout.lines().count(), 3, "{repeat:?}");
    // A server stream takes exactly one request.
    let two = mirror
        .call("clitest.v1.Mirror/Repeat", r#"{} {}"#, &[])
        .await;
    two.expect_code(1);

    let input = "{\"i32\": 1}\n{\"i32\": 2} {\"i32\": 3}\n\n  {\"s\": \"four\"}";
    let collect = rpc_with_stdin(
        &["call", uri, "clitest.v1.Mirror/Collect", "-d", "@-"],
        input,
    )
    .await;
    let expected = json!({"items": [{"i32": 1}, {"i32": 2}, {"i32": 3}, {"s": "four"}]});
    assert_eq!(collect.expect_code(0).json(), expected);
    assert!(collect.stdout.lines().count() > 1, "indented: {collect:?}");
    let inline = mirror
        .call("clitest.v1.Mirror/Collect", input, &["--compact"])
        .await;
    assert_eq!(inline.expect_code(0).json(), expected);
    assert_eq!(inline.stdout.lines().count(), 1, "{inline:?}");
    let file = std::env::temp_dir().join(format!("rpc-cli-mirror-{}.json", std::process::id()));
    std::fs::write(&file, input).unwrap();
    let data = format!("@{}", file.display());
    let from_file = mirror.call("clitest.v1.Mirror/Collect", &data, &[]).await;
    assert_eq!(from_file.expect_code(0).json(), expected);
    // No input: no requests.
    let none = rpc(&["call", uri, "clitest.v1.Mirror/Collect"]).await;
    assert_eq!(none.expect_code(0).json(), json!({}));

    let bidi = rpc_with_stdin(&["call", uri, "clitest.v1.Mirror/Bidi", "-d", "@-"], input).await;
    let lines = bidi.expect_code(0).json_lines();
    assert_eq!(
        lines,
        [
            json!({"i32": 1}),
            json!({"i32": 2}),
            json!({"i32": 3}),
            json!({"s": "four"})
        ]
    );
    let from_file = mirror.call("clitest.v1.Mirror/Bidi", &data, &[]).await;
    assert_eq!(from_file.expect_code(0).json_lines().len(), 4);
    let _ = std::fs::remove_file(&file);
    let none = rpc(&["call", uri, "clitest.v1.Mirror/Bidi"]).await;
    assert_eq!(none.expect_code(0).stdout, "");
}

/// A failed call: `error: CODE_NAME (code): message`, its details decoded (a type of
/// `google.rpc`, one of the method's file, one only the server's reflection has), exit
/// 64 + code; usage errors exit 2, an unreachable server 78, the CLI's own errors 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_print_their_status_and_exit_with_its_code() {
    let mirror = mirror().await;
    let uri = mirror.uri.as_str();
    let fail = mirror
        .call(
            "clitest.v1.Mirror/Fail",
            r#"{"code": 5, "message": "gone"}"#,
            &[],
        )
        .await;
    fail.expect_code(64 + 5);
    assert!(fail.stdout.is_empty(), "{fail:?}");
    let mut lines = fail.stderr.lines();
    assert_eq!(lines.next(), Some("error: NOT_FOUND (5): gone"), "{fail:?}");
    let details = lines
        .next()
        .and_then(|line| line.strip_prefix("details: "))
        .unwrap_or_else(|| panic!("no details: {fail:?}"));
    // Each detail as an Any prints: "@type" first.
    assert!(
        details
            .contains(r#"{"@type":"type.googleapis.com/clitest.v1.Inner","name":"inner","n":7}"#),
        "{details}"
    );
    let details: Value = serde_json::from_str(details).unwrap();
    assert_eq!(details["code"], 5);
    assert_eq!(details["message"], "gone");
    assert_eq!(
        details["details"],
        json!([
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "QUOTA"},
            {"@type": "type.googleapis.com/clitest.v1.Inner", "name": "inner", "n": 7},
            {"@type": "type.googleapis.com/clitest.v3.Detail", "why": "because",
             "count": "1099511627776"}
        ]),
        "{fail:?}"
    );
    for (code, name) in [
        (3, "INVALID_ARGUMENT"),
        (16, "UNAUTHENTICATED"),
        (14, "UNAVAILABLE"),
    ] {
        let fail = mirror
            .call(
                "clitest.v1.Mirror/Fail",
                &format!(r#"{{"code": {code}, "message": "m"}}"#),
                &[],
            )
            .await;
        fail.expect_code(64 + code);
        // UNAVAILABLE says whether the call may have run (this one ran: its handler
        // answered so).
        let note = if code == 14 {
            " [the call may have run]"
        } else {
            ""
        };
        assert!(
            fail.stderr
                .starts_with(&format!("error: {name} ({code}): m{note}\n")),
            "{fail:?}"
        );
    }
    // A code gRPC does not define exits as UNKNOWN, its number in the message.
    let odd = mirror
        .call(
            "clitest.v1.Mirror/Fail",
            r#"{"code": 42, "message": "m"}"#,
            &[],
        )
        .await;
    odd.expect_code(64 + 2);
    assert!(odd.stderr.contains("42"), "{odd:?}");
    // Success, usage errors, the CLI's own errors, an unreachable server.
    mirror
        .call("clitest.v1.Mirror/Echo", "{}", &[])
        .await
        .expect_code(0);
    rpc(&["call", uri]).await.expect_code(2);
    rpc(&["call", uri, "clitest.v1.Mirror/Echo", "--no-such-flag"])
        .await
        .expect_code(2);
    rpc(&["call"]).await.expect_code(2);
    mirror
        .call("clitest.v1.Mirror/Echo", "{", &[])
        .await
        .expect_code(1);
    mirror
        .call("clitest.v1.Mirror/Nope", "{}", &[])
        .await
        .expect_code(1);
    let port = common::closed_port();
    let closed = format!("tcp://127.0.0.1:{port}");
    let refused = rpc(&["call", &closed, "clitest.v1.Mirror/Echo", "-d", "{}"]).await;
    refused.expect_code(64 + 14);
    let grpc_closed = format!("grpc://127.0.0.1:{port}");
    let refused = rpc(&["call", &grpc_closed, "clitest.v1.Mirror/Echo", "-d", "{}"]).await;
    refused.expect_code(64 + 14);
}

/// Methods named with or without a leading dot, `Service/Method` or
/// `Service.Method`; a name without its package is refused with every method it may
/// mean (two services of two packages share it); the same method name in two
/// services of one package.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_are_found_by_their_full_names() {
    let mirror = mirror().await;
    let uri = mirror.uri.as_str();
    for name in [
        "clitest.v1.Mirror/Echo",
        ".clitest.v1.Mirror/Echo",
        "clitest.v1.Mirror.Echo",
        ".clitest.v1.Mirror.Echo",
    ] {
        let run = mirror.call(name, r#"{"s": "x"}"#, &[]).await;
        assert_eq!(run.expect_code(0).json(), json!({"s": "x"}), "{name}");
    }
    let other = mirror
        .call("clitest.v1.Other/Echo", r#"{"name": "o", "s": 1}"#, &[])
        .await;
    other.expect_code(1);
    let other = mirror
        .call("clitest.v1.Other/Echo", r#"{"name": "o"}"#, &[])
        .await;
    assert_eq!(other.expect_code(0).json(), json!({"name": "o"}));
    let v2 = mirror
        .call("clitest.v2.Mirror/Echo", r#"{"text": "t"}"#, &[])
        .await;
    assert_eq!(v2.expect_code(0).json(), json!({"text": "t"}));
    for short in ["Mirror/Echo", "Mirror.Echo"] {
        let run = mirror.call(short, "{}", &[]).await;
        run.expect_code(1);
        assert!(
            run.stderr.contains("clitest.v1.Mirror/Echo")
                && run.stderr.contains("clitest.v2.Mirror/Echo"),
            "{short}: {run:?}"
        );
    }
    // A method's name alone: the methods of that name are named.
    let bare = mirror.call("Echo", "{}", &[]).await;
    bare.expect_code(1);
    for full in [
        "clitest.v1.Mirror/Echo",
        "clitest.v1.Other/Echo",
        "clitest.v2.Mirror/Echo",
    ] {
        assert!(bare.stderr.contains(full), "{full}: {bare:?}");
    }
    // list and describe take the same names.
    for service in ["clitest.v1.Mirror", ".clitest.v1.Mirror"] {
        let list = rpc(&["list", uri, service]).await;
        let list = list.expect_code(0);
        assert!(
            list.stdout
                .starts_with("clitest.v1.Mirror/Echo\nclitest.v1.Mirror/Repeat\n"),
            "{service}: {list:?}"
        );
    }
    // With the schema from files too (a name with a leading dot was not found).
    let proto = protos().join("clitest/mirror.proto").display().to_string();
    let include = protos().display().to_string();
    for service in ["clitest.v1.Other", ".clitest.v1.Other"] {
        let list = rpc(&["list", uri, service, "--proto", &proto, "-I", &include]).await;
        assert_eq!(
            list.expect_code(0).stdout,
            "clitest.v1.Other/Echo\n",
            "{service}"
        );
        let call = rpc(&[
            "call",
            uri,
            &format!("{service}/Echo"),
            "-d",
            r#"{"name": "f"}"#,
            "--proto",
            &proto,
            "-I",
            &include,
        ])
        .await;
        assert_eq!(
            call.expect_code(0).json(),
            json!({"name": "f"}),
            "{service}"
        );
    }
    let services = rpc(&["list", uri]).await;
    let services = services.expect_code(0);
    for service in ["clitest.v1.Mirror", "clitest.v1.Other", "clitest.v2.Mirror"] {
        assert!(
            services.stdout.lines().any(|line| line == service),
            "{services:?}"
        );
    }
    for symbol in [
        "clitest.v1.All",
        ".clitest.v1.All",
        "clitest.v1.Mirror.Echo",
        ".clitest.v1.Mirror/Echo",
        "clitest.v1.Color",
    ] {
        rpc(&["describe", uri, symbol]).await.expect_code(0);
    }
    // A field and an enum value (grpcurl describes them), and every service.
    let field = rpc(&["describe", uri, "clitest.v1.Inner.ratio"]).await;
    assert_eq!(
        field.expect_code(0).stdout,
        "// a field of clitest.v1.Inner\ndouble ratio = 4;\n"
    );
    let value = rpc(&["describe", uri, "clitest.v1.Color.GREEN"]).await;
    assert_eq!(
        value.expect_code(0).stdout,
        "// a value of clitest.v1.Color\nGREEN = 2;\n"
    );
    rpc(&["describe", uri, "clitest.v1.Inner.nope"])
        .await
        .expect_code(1);
    let all = rpc(&["describe", uri]).await;
    let all = all.expect_code(0);
    // Both packages' Mirror, and Other.
    assert_eq!(all.stdout.matches("service Mirror {").count(), 2, "{all:?}");
    assert_eq!(all.stdout.matches("service Other {").count(), 1, "{all:?}");
    assert!(all.stdout.contains("rpc Echo("), "{all:?}");
}
