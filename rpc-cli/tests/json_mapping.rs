//! The CLI's proto3 JSON mapping against protobuf's own test schema,
//! `test_messages_proto3.proto` (vendored in `tests/protos/`, BSD-3-Clause): every
//! message, with every field set (each member of each oneof in turn), well-known types
//! included, goes to JSON and back unchanged, with lowerCamelCase names and with the
//! `.proto` names; and the names follow the proto3 JSON rules.

use std::path::Path;

use prost::Message as _;
use prost_reflect::ReflectMessage as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, Value,
};
use rpc_cli::json::{self, PrintOptions};

const FILE: &str = "google/protobuf/test_messages_proto3.proto";
/// How deep messages nest in the filled values (the schema is recursive).
const MAX_DEPTH: usize = 2;

fn pool() -> DescriptorPool {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/protos");
    let mut compiler = protox::Compiler::new([&dir]).unwrap();
    compiler.include_imports(true);
    compiler.open_files([FILE]).unwrap();
    let mut pool = DescriptorPool::global();
    pool.add_file_descriptor_set(compiler.file_descriptor_set())
        .unwrap();
    pool
}

/// A value of `kind` that is not the default (`i` varies it, for repeated fields and
/// map keys).
fn scalar(kind: &Kind, i: u32, depth: usize, variant: usize) -> Value {
    match kind {
        Kind::Double => Value::F64(-2.25 - f64::from(i)),
        Kind::Float => Value::F32(1.5 + i as f32),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(-42 - i as i32),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(-(1 << 40) - i64::from(i)),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(42 + i),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(u64::MAX - 1 - u64::from(i)),
        Kind::Bool => Value::Bool(i % 2 == 0),
        Kind::String => Value::String(format!("héllo \"{i}\" ✓")),
        Kind::Bytes => Value::Bytes(vec![0, 1, 254, 255, i as u8].into()),
        Kind::Enum(e) => Value::EnumNumber(e.values().last().map_or(0, |v| v.number())),
        Kind::Message(m) => Value::Message(fill(m, depth + 1, variant)),
    }
}

fn map_key(kind: &Kind, i: u32) -> MapKey {
    match scalar(kind, i, 0, 0) {
        Value::I32(v) => MapKey::I32(v),
        Value::I64(v) => MapKey::I64(v),
        Value::U32(v) => MapKey::U32(v),
        Value::U64(v) => MapKey::U64(v),
        Value::Bool(v) => MapKey::Bool(v),
        Value::String(v) => MapKey::String(v),
        other => panic!("not a map key: {other:?}"),
    }
}

/// A well-known type with a valid, non-default value.
fn well_known(descriptor: &MessageDescriptor, depth: usize) -> Option<DynamicMessage> {
    let pool = descriptor.parent_pool();
    let mut message = DynamicMessage::new(descriptor.clone());
    let value = |json: &str| {
        let value_type = pool.get_message_by_name("google.protobuf.Value").unwrap();
        json::from_str(&value_type, json).unwrap()
    };
    match descriptor.full_name() {
        "google.protobuf.Timestamp" => {
            message.set_field_by_name("seconds", Value::I64(1_700_000_000));
            message.set_field_by_name("nanos", Value::I32(123_000_000));
        }
        "google.protobuf.Duration" => {
            message.set_field_by_name("seconds", Value::I64(3));
            message.set_field_by_name("nanos", Value::I32(500_000_000));
        }
        "google.protobuf.FieldMask" => {
            message.set_field_by_name(
                "paths",
                Value::List(vec![
                    Value::String("foo_bar".into()),
                    Value::String("baz.qux_quux".into()),
                ]),
            );
        }
        "google.protobuf.Any" => {
            let foreign = pool
                .get_message_by_name("protobuf_test_messages.proto3.ForeignMessage")
                .unwrap();
            let mut inner = DynamicMessage::new(foreign);
            inner.set_field_by_name("c", Value::I32(7));
            message.set_field_by_name(
                "type_url",
                Value::String(
                    "type.googleapis.com/protobuf_test_messages.proto3.ForeignMessage".into(),
                ),
            );
            message.set_field_by_name("value", Value::Bytes(inner.encode_to_vec().into()));
        }
        "google.protobuf.Value" => {
            message = if depth >= MAX_DEPTH {
                value("null")
            } else {
                value(r#"{"a": [1.5, "x", true, null, {"b": {}}]}"#)
            };
        }
        "google.protobuf.Struct" => {
            let struct_type = descriptor.clone();
            message = json::from_str(
                &struct_type,
                r#"{"n": -3, "s": "t", "l": [], "o": {"p": null}}"#,
            )
            .unwrap();
        }
        "google.protobuf.ListValue" => {
            message = json::from_str(descriptor, r#"["s", 3, false, {"k": [null]}]"#).unwrap();
        }
        name if name.starts_with("google.protobuf.") && name.ends_with("Value") => {
            let field = descriptor.get_field_by_name("value").unwrap();
            message.set_field(&field, scalar(&field.kind(), 0, depth, 0));
        }
        _ => return None,
    }
    Some(message)
}

/// `descriptor` with every field set to a value that is not its default; of each
/// oneof, member `variant % members` only.
fn fill(descriptor: &MessageDescriptor, depth: usize, variant: usize) -> DynamicMessage {
    if let Some(message) = well_known(descriptor, depth) {
        return message;
    }
    let mut message = DynamicMessage::new(descriptor.clone());
    if depth >= MAX_DEPTH {
        return message;
    }
    for field in descriptor.fields() {
        if let Some(oneof) = field.containing_oneof().filter(|o| !o.is_synthetic()) {
            let members: Vec<FieldDescriptor> = oneof.fields().collect();
            if members[variant % members.len()] != field {
                continue;
            }
        }
        let value = if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                unreachable!()
            };
            let (key, value) = (entry.map_entry_key_field(), entry.map_entry_value_field());
            Value::Map(
                (0..2)
                    .map(|i| {
                        (
                            map_key(&key.kind(), i),
                            scalar(&value.kind(), i, depth, variant),
                        )
                    })
                    .collect(),
            )
        } else if field.is_list() {
            Value::List(
                (0..2)
                    .map(|i| scalar(&field.kind(), i, depth, variant))
                    .collect(),
            )
        } else {
            scalar(&field.kind(), 0, depth, variant)
        };
        // A proto3 field without presence at its default is absent in JSON.
        if !field.supports_presence() && value == field.default_value() {
            continue;
        }
        message.set_field(&field, value);
    }
    message
}

fn round_trip(message: &DynamicMessage, options: PrintOptions) {
    // Counted on its encoding first, as a response is before it is decoded: it passes.
    json::check_elements(
        &message.descriptor(),
        &message.encode_to_vec(),
        options.emit_defaults,
    )
    .unwrap_or_else(|err| panic!("{}: {err}", message.descriptor().full_name()));
    let text = json::to_json(message, options).unwrap();
    let back = json::from_str(&message.descriptor(), &text)
        .unwrap_or_else(|err| panic!("{}: {err}\n{text}", message.descriptor().full_name()));
    // With defaults printed, the parsed message holds them as set fields: compare what
    // they print without them.
    let same = if options.emit_defaults {
        let value = |m: &DynamicMessage| {
            serde_json::from_str::<serde_json::Value>(
                &json::to_json(m, PrintOptions::default()).unwrap(),
            )
            .unwrap()
        };
        value(&back) == value(message)
    } else {
        &back == message
    };
    // (Not assert_eq!: the Debug of a recursive message type does not end.)
    assert!(
        same,
        "{} did not round-trip through\n{text}\nback: {}",
        message.descriptor().full_name(),
        json::to_json(&back, options).unwrap()
    );
}

/// Every message the file defines (nested ones included, map entries excepted) and
/// every well-known type it uses.
fn messages(pool: &DescriptorPool) -> Vec<MessageDescriptor> {
    let mut out: Vec<MessageDescriptor> = pool
        .all_messages()
        .filter(|m| !m.is_map_entry())
        .filter(|m| {
            m.parent_file().name() == FILE
                || (m.package_name() == "google.protobuf"
                    && [
                        "google/protobuf/any.proto",
                        "google/protobuf/duration.proto",
                        "google/protobuf/field_mask.proto",
                        "google/protobuf/struct.proto",
                        "google/protobuf/timestamp.proto",
                        "google/protobuf/wrappers.proto",
                    ]
                    .contains(&m.parent_file().name()))
        })
        .collect();
    out.sort_by(|a, b| a.full_name().cmp(b.full_name()));
    out
}

/// Runs `f` on a thread with a large stack: serde's recursion over nested messages
/// is deep in unoptimized builds.
fn with_big_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn every_message_of_test_messages_proto3_round_trips() {
    with_big_stack(every_message_round_trips);
}

fn every_message_round_trips() {
    let pool = pool();
    let messages = messages(&pool);
    let names: Vec<&str> = messages.iter().map(|m| m.full_name()).collect();
    for expected in [
        "protobuf_test_messages.proto3.TestAllTypesProto3",
        "protobuf_test_messages.proto3.TestAllTypesProto3.NestedMessage",
        "protobuf_test_messages.proto3.ForeignMessage",
        "protobuf_test_messages.proto3.NullHypothesisProto3",
        "protobuf_test_messages.proto3.EnumOnlyProto3",
        "google.protobuf.Any",
        "google.protobuf.Duration",
        "google.protobuf.FieldMask",
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
        "google.protobuf.Timestamp",
        "google.protobuf.BoolValue",
        "google.protobuf.BytesValue",
        "google.protobuf.DoubleValue",
        "google.protobuf.FloatValue",
        "google.protobuf.Int32Value",
        "google.protobuf.Int64Value",
        "google.protobuf.StringValue",
        "google.protobuf.UInt32Value",
        "google.protobuf.UInt64Value",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let oneof_members = 10;
    for descriptor in &messages {
        for variant in 0..oneof_members {
            let message = fill(descriptor, 0, variant);
            for options in [
                PrintOptions::default(),
                PrintOptions {
                    pretty: true,
                    ..PrintOptions::default()
                },
                PrintOptions {
                    proto_names: true,
                    ..PrintOptions::default()
                },
                PrintOptions {
                    emit_defaults: true,
                    ..PrintOptions::default()
                },
            ] {
                round_trip(&message, options);
            }
        }
        // The empty message too, with and without its defaults printed.
        let empty = DynamicMessage::new(descriptor.clone());
        if !matches!(
            descriptor.full_name(),
            "google.protobuf.Value" | "google.protobuf.Any"
        ) {
            round_trip(&empty, PrintOptions::default());
        }
    }
}

#[test]
fn well_known_types_use_their_special_json_forms() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let message = fill(&all, 0, 0);
    let text = json::to_json(&message, PrintOptions::default()).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(value["optionalTimestamp"], "2023-11-14T22:13:20.123Z");
    assert_eq!(value["optionalDuration"], "3.500s");
    assert_eq!(value["optionalFieldMask"], "fooBar,baz.quxQuux");
    assert_eq!(value["optionalInt64Wrapper"], "-1099511627776");
    assert_eq!(value["optionalBoolWrapper"], true);
    assert_eq!(
        value["optionalAny"],
        serde_json::json!({
            "@type": "type.googleapis.com/protobuf_test_messages.proto3.ForeignMessage",
            "c": 7
        })
    );
    assert_eq!(value["optionalStruct"]["s"], "t");
    assert_eq!(value["optionalValue"]["a"][0], 1.5);
    assert_eq!(value["optionalInt64"], "-1099511627776");
    assert_eq!(value["optionalUint64"], "18446744073709551614");
    assert_eq!(value["optionalBytes"], "AAH+/wA=");
    assert_eq!(value["optionalNestedEnum"], "BAZ");
    assert_eq!(value["mapInt32Int32"]["-42"], -42);
}

#[test]
fn names_follow_the_proto3_json_rules() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let message = fill(&all, 0, 0);
    let camel: serde_json::Value =
        serde_json::from_str(&json::to_json(&message, PrintOptions::default()).unwrap()).unwrap();
    let proto: serde_json::Value = serde_json::from_str(
        &json::to_json(
            &message,
            PrintOptions {
                proto_names: true,
                ..PrintOptions::default()
            },
        )
        .unwrap(),
    )
    .unwrap();
    // protoc's JSON names for the awkward field names of the conformance suite.
    for (proto_name, json_name) in [
        ("optional_int32", "optionalInt32"),
        ("fieldname1", "fieldname1"),
        ("field_name2", "fieldName2"),
        ("_field_name3", "FieldName3"),
        ("field__name4_", "fieldName4"),
        ("field0name5", "field0name5"),
        ("field_0_name6", "field0Name6"),
        ("fieldName7", "fieldName7"),
        ("FieldName8", "FieldName8"),
        ("field_Name9", "fieldName9"),
        ("Field_Name10", "FieldName10"),
        ("FIELD_NAME11", "FIELDNAME11"),
        ("FIELD_name12", "FIELDName12"),
        ("__field_name13", "FieldName13"),
        ("__Field_name14", "FieldName14"),
        ("field__name15", "fieldName15"),
        ("field__Name16", "fieldName16"),
        ("field_name17__", "fieldName17"),
        ("Field_name18__", "FieldName18"),
    ] {
        assert!(
            camel.get(json_name).is_some(),
            "{json_name} missing: {camel}"
        );
        assert!(
            proto.get(proto_name).is_some(),
            "{proto_name} missing: {proto}"
        );
        // Input accepts both names.
        for name in [proto_name, json_name] {
            let parsed = json::from_str(&all, &format!("{{\"{name}\": 5}}")).unwrap();
            let field = all.get_field_by_name(proto_name).unwrap();
            assert_eq!(parsed.get_field(&field).as_ref(), &Value::I32(5), "{name}");
        }
    }
    // Output uses only JSON names; the .proto names only when asked.
    for field in all.fields() {
        if field.json_name() != field.name() {
            assert!(
                camel.get(field.name()).is_none(),
                "{} printed",
                field.name()
            );
        }
    }
}

#[test]
fn a_value_that_does_not_fit_names_its_path_and_type() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let err = json::from_str(&all, r#"{"optionalNestedMessage": {"a": "seven"}}"#).unwrap_err();
    assert_eq!(err.path, "optionalNestedMessage.a");
    assert_eq!(err.expected.as_deref(), Some("int32"));
    let err = json::from_str(&all, r#"{"repeatedString": ["a", 1]}"#).unwrap_err();
    assert_eq!(err.path, "repeatedString[1]");
    assert_eq!(err.expected.as_deref(), Some("repeated string"));
    let err = json::from_str(&all, r#"{"mapStringNestedMessage": {"k": {"a": []}}}"#).unwrap_err();
    assert_eq!(err.path, "mapStringNestedMessage.k.a");
    assert_eq!(err.expected.as_deref(), Some("int32"));
    let err = json::from_str(&all, r#"{"noSuchField": 1}"#).unwrap_err();
    assert!(err.reason.contains("noSuchField"), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with("JSON does not match protobuf_test_messages.proto3.TestAllTypesProto3"),
        "{text}"
    );
    // In a user's words (they were the libraries': "out of range integral type
    // conversion attempted", "invalid digit found in string"): the field's range, and
    // the names closest to a misspelt one, in the message it is in.
    for (json, words) in [
        (
            r#"{"optionalInt32": 3000000000}"#,
            "out of range: the field takes -2147483648 to 2147483647",
        ),
        (r#"{"optionalUint32": -1}"#, "0 to 4294967295"),
        (
            r#"{"optionalInt64": "9223372036854775808"}"#,
            "out of range",
        ),
        // (A whole number with an exponent or a fraction, "1e3", is one: proto3 JSON
        // reads an integer's string as the number it writes.)
        (r#"{"optionalInt64": "1.5e0"}"#, "not an integer"),
        (r#"{"optionalInt33": 1}"#, "optionalInt32"),
        (r#"{"optionalNestedMessage": {"aa": 1}}"#, "did you mean a?"),
    ] {
        let err = json::from_str(&all, json).unwrap_err();
        assert!(err.to_string().contains(words), "{json}: {err}");
    }
}

/// An `Any` whose type the pool lacks does not print (its JSON form is the type's own
/// fields): an error naming the type, never a made-up object; and the types `Any`
/// values name are found in messages and in JSON, for the CLI to ask reflection.
#[test]
fn an_any_of_an_unknown_type_is_an_error_naming_it() {
    let pool = pool();
    let descriptor = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let mut message = DynamicMessage::new(descriptor.clone());
    let any = prost_types::Any {
        type_url: "type.googleapis.com/nobody.Knows".into(),
        value: vec![8, 1],
    };
    let any = DynamicMessage::decode(
        pool.get_message_by_name("google.protobuf.Any").unwrap(),
        any.encode_to_vec().as_slice(),
    )
    .unwrap();
    message.set_field_by_name("optional_any", Value::Message(any.clone()));
    let mut nested = DynamicMessage::new(descriptor.clone());
    nested.set_field_by_name("optional_any", Value::Message(any));
    message.set_field_by_name("recursive_message", Value::Message(nested));
    let err = json::to_json(&message, PrintOptions::default()).unwrap_err();
    assert!(err.contains("nobody.Knows"), "{err}");

    let mut types = Vec::new();
    json::message_any_types(&message, &mut types).unwrap();
    assert_eq!(types, ["nobody.Knows"]);
    // Inside an Any of a known type: what its value holds.
    let outer = prost_types::Any {
        type_url: "type.googleapis.com/protobuf_test_messages.proto3.TestAllTypesProto3".into(),
        value: message.encode_to_vec(),
    };
    let mut wrapper = DynamicMessage::new(descriptor.clone());
    wrapper.set_field_by_name(
        "optional_any",
        Value::Message(
            DynamicMessage::decode(
                pool.get_message_by_name("google.protobuf.Any").unwrap(),
                outer.encode_to_vec().as_slice(),
            )
            .unwrap(),
        ),
    );
    let mut types = Vec::new();
    json::message_any_types(&wrapper, &mut types).unwrap();
    assert_eq!(types, ["nobody.Knows"], "the Any inside the Any");

    let value = serde_json::json!({
        "optionalAny": {"@type": "type.googleapis.com/a.B", "x": 1},
        "repeatedAny": [{"@type": "example.com/c.D", "inner": {"@type": "e.F"}}],
    });
    let mut types = Vec::new();
    json::json_any_types(&value, &mut types);
    types.sort();
    assert_eq!(types, ["a.B", "c.D", "e.F"]);
}

/// `Any` values nested far deeper than prost's decoding limit (each decoded apart, so
/// the limit does not see them together), as a hostile server could send: an error,
/// not a stack overflow when the types are walked or the message printed.
#[test]
fn any_values_nested_past_the_depth_limit_are_an_error() {
    let pool = pool();
    let any_type = pool.get_message_by_name("google.protobuf.Any").unwrap();
    let mut value = prost_types::Any {
        type_url: "type.googleapis.com/google.protobuf.Empty".into(),
        value: Vec::new(),
    };
    for _ in 0..20_000 {
        value = prost_types::Any {
            type_url: "type.googleapis.com/google.protobuf.Any".into(),
            value: value.encode_to_vec(),
        };
    }
    let encoded = value.encode_to_vec();
    // Refused on the encoding too, before it is decoded.
    let err = json::check_elements(&any_type, &encoded, false).unwrap_err();
    assert!(err.contains("nest more than"), "{err}");
    let message = DynamicMessage::decode(any_type, encoded.as_slice()).unwrap();
    let err = json::message_any_types(&message, &mut Vec::new()).unwrap_err();
    assert!(err.contains("nest more than"), "{err}");
}

/// A response of more elements than `rpc` decodes and prints is refused, counted on
/// its encoding before it is decoded: 16 MiB of packed booleans, one byte each, made
/// 16 million values, and gigabytes of JSON. Lists (packed or not), map entries and
/// fields count together across nesting, those of the message an `Any` packs too;
/// with `--emit-defaults`, every field of each message counts, as it prints.
#[test]
fn responses_of_too_many_elements_are_refused_before_decoding() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let nested_type = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3.NestedMessage")
        .unwrap();
    let max = json::MAX_ELEMENTS;
    let check = |message: &DynamicMessage, emit_defaults: bool| {
        json::check_elements(
            &message.descriptor(),
            &message.encode_to_vec(),
            emit_defaults,
        )
    };
    // Packed booleans: the field counts one, and each of its elements one.
    let mut packed = DynamicMessage::new(all.clone());
    let bools = |n: usize| Value::List(vec![Value::Bool(true); n]);
    packed.set_field_by_name("packed_bool", bools(max - 1));
    check(&packed, false).unwrap();
    packed.set_field_by_name("packed_bool", bools(max));
    let err = check(&packed, false).unwrap_err();
    assert!(err.contains(&format!("more than {max} elements")), "{err}");
    drop(packed);

    // Half in a nested message, half in the message an Any packs: each alone passes,
    // together they do not.
    let mut half = DynamicMessage::new(all.clone());
    let ones = Value::List(vec![Value::I32(1); max / 2]);
    half.set_field_by_name("repeated_int32", ones);
    let mut nested = DynamicMessage::new(nested_type.clone());
    nested.set_field_by_name("corecursive", Value::Message(half.clone()));
    let mut any = DynamicMessage::new(pool.get_message_by_name("google.protobuf.Any").unwrap());
    any.set_field_by_name(
        "type_url",
        Value::String(
            "type.googleapis.com/protobuf_test_messages.proto3.TestAllTypesProto3".into(),
        ),
    );
    any.set_field_by_name("value", Value::Bytes(half.encode_to_vec().into()));
    let mut message = DynamicMessage::new(all.clone());
    message.set_field_by_name("optional_nested_message", Value::Message(nested));
    check(&message, false).unwrap();
    let mut only_any = DynamicMessage::new(all.clone());
    only_any.set_field_by_name("optional_any", Value::Message(any.clone()));
    check(&only_any, false).unwrap();
    message.set_field_by_name("optional_any", Value::Message(any));
    let err = check(&message, false).unwrap_err();
    assert!(err.contains("more than"), "{err}");

    // Empty messages in a list: one element each, three with --emit-defaults (a
    // NestedMessage prints its two fields).
    let entry = DynamicMessage::new(nested_type);
    let mut list = DynamicMessage::new(all);
    list.set_field_by_name(
        "repeated_nested_message",
        Value::List(vec![Value::Message(entry); max / 2]),
    );
    check(&list, false).unwrap();
    let err = check(&list, true).unwrap_err();
    assert!(err.contains("--emit-defaults"), "{err}");

    // A malformed encoding is left to the decoder to report.
    let descriptor = list.descriptor();
    json::check_elements(&descriptor, &[0x0a, 0x05], false).unwrap();

    // An Any whose value does not decode (kept as bytes by the decoder) does not end
    // the count: the packed list after it is still counted (from a review).
    let mut broken = DynamicMessage::new(pool.get_message_by_name("google.protobuf.Any").unwrap());
    broken.set_field_by_name(
        "type_url",
        Value::String(
            "type.googleapis.com/protobuf_test_messages.proto3.TestAllTypesProto3".into(),
        ),
    );
    broken.set_field_by_name("value", Value::Bytes(vec![0xff].into()));
    let mut any_first = DynamicMessage::new(descriptor.clone());
    any_first.set_field_by_name("optional_any", Value::Message(broken));
    let mut then_bools = DynamicMessage::new(descriptor.clone());
    then_bools.set_field_by_name("packed_bool", bools(max));
    // The Any first on the wire (fields may come in any order).
    let mut bytes = any_first.encode_to_vec();
    bytes.extend(then_bools.encode_to_vec());
    let err = json::check_elements(&descriptor, &bytes, false).unwrap_err();
    assert!(err.contains("more than"), "{err}");
}

/// A 64-bit integer given as a JSON number that a double cannot hold exactly is
/// refused, naming where, instead of rounded or clamped; integers in range, strings
/// and whole numbers within 2^53 are taken exactly.
#[test]
fn inexact_64_bit_numbers_are_refused_not_rounded() {
    let pool = pool();
    let descriptor = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    for (text, path) in [
        (
            r#"{"optionalUint64": 18446744073709551616}"#,
            "optionalUint64",
        ),
        (
            r#"{"optionalInt64": -9223372036854775809}"#,
            "optionalInt64",
        ),
        (
            r#"{"optionalInt64": 9223372036854775807.0}"#,
            "optionalInt64",
        ),
        (r#"{"optionalInt64": 9007199254740993.0}"#, "optionalInt64"),
        (r#"{"optionalInt64": 9007199254740993e0}"#, "optionalInt64"),
        (r#"{"optionalInt64": 4503599627370497.5}"#, "optionalInt64"),
        (r#"{"repeatedInt64": [1, 2e19]}"#, "repeatedInt64[1]"),
        (r#"{"mapInt64Int64": {"1": 1e300}}"#, "mapInt64Int64[\"1\"]"),
        (
            r#"{"optionalInt64Wrapper": 1.5e19}"#,
            "optionalInt64Wrapper",
        ),
        (
            r#"{"recursiveMessage": {"optional_fixed64": 3.5}}"#,
            "recursiveMessage.optional_fixed64",
        ),
    ] {
        let err = json::from_str(&descriptor, text).unwrap_err();
        assert_eq!(err.path, path, "{text}: {err}");
        assert!(err.reason.contains("not an exact 64-bit integer"), "{err}");
    }
    for (text, field, expected) in [
        (
            r#"{"optionalUint64": 18446744073709551615}"#,
            "optional_uint64",
            Value::U64(u64::MAX),
        ),
        (
            r#"{"optionalInt64": "-9223372036854775808"}"#,
            "optional_int64",
            Value::I64(i64::MIN),
        ),
        (
            r#"{"optionalInt64": 1e3}"#,
            "optional_int64",
            Value::I64(1000),
        ),
    ] {
        let message = json::from_str(&descriptor, text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            message.get_field_by_name(field).unwrap().into_owned(),
            expected,
            "{text}"
        );
    }
    // A 64-bit wrapper as the message itself (a method whose request type it is): its
    // bare number is checked as a field's is (it was rounded: found in review).
    for wrapper in ["google.protobuf.Int64Value", "google.protobuf.UInt64Value"] {
        let descriptor = pool.get_message_by_name(wrapper).unwrap();
        let err = json::from_str(&descriptor, "9007199254740993.0").unwrap_err();
        assert!(
            err.reason.contains("not an exact 64-bit integer"),
            "{wrapper}: {err}"
        );
        let exact = json::from_str(&descriptor, "9007199254740992").unwrap();
        assert!(
            matches!(
                exact.get_field_by_name("value").unwrap().into_owned(),
                Value::I64(9_007_199_254_740_992) | Value::U64(9_007_199_254_740_992)
            ),
            "{wrapper}"
        );
    }
}

/// Maps print in the order of their keys, the same on every run (prost-reflect keeps
/// them in hash maps: the order changed from run to run), numbers by value; a message's
/// fields stay in the order of their numbers; floats print in their shortest `f32`
/// form, in a message, a list, a map and a `FloatValue`.
#[test]
fn maps_print_sorted_by_key_and_floats_as_written() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let mut message = DynamicMessage::new(all.clone());
    let field = |name: &str| all.get_field_by_name(name).unwrap();
    let ints: std::collections::HashMap<MapKey, Value> = [10, -3, 2, 100, 9, -40]
        .into_iter()
        .map(|k| (MapKey::I32(k), Value::I32(k)))
        .collect();
    message.set_field(&field("map_int32_int32"), Value::Map(ints));
    let strings: std::collections::HashMap<MapKey, Value> = ["b", "a", "d", "c", "ab"]
        .into_iter()
        .map(|k| (MapKey::String(k.into()), Value::String(k.into())))
        .collect();
    message.set_field(&field("map_string_string"), Value::Map(strings));
    let floats: std::collections::HashMap<MapKey, Value> = [(1, 0.1f32), (0, 1e20f32)]
        .into_iter()
        .map(|(k, v)| (MapKey::I32(k), Value::F32(v)))
        .collect();
    message.set_field(&field("map_int32_float"), Value::Map(floats));
    message.set_field(&field("optional_float"), Value::F32(0.1));
    message.set_field(
        &field("repeated_float"),
        Value::List(vec![Value::F32(0.3), Value::F32(-2.5e-7)]),
    );
    message.set_field(&field("optional_int32"), Value::I32(1));
    let wrapper = field("optional_float_wrapper");
    let Kind::Message(float_value) = wrapper.kind() else {
        panic!("FloatValue")
    };
    let mut boxed = DynamicMessage::new(float_value.clone());
    boxed.set_field_by_name("value", Value::F32(0.7));
    message.set_field(&wrapper, Value::Message(boxed));

    let compact = PrintOptions::default();
    let text = json::to_json(&message, compact).unwrap();
    assert!(
        text.contains(r#""mapInt32Int32":{"-40":-40,"-3":-3,"2":2,"9":9,"10":10,"100":100}"#),
        "{text}"
    );
    assert!(
        text.contains(r#""mapStringString":{"a":"a","ab":"ab","b":"b","c":"c","d":"d"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#""mapInt32Float":{"0":1e+20,"1":0.1}"#),
        "{text}"
    );
    assert_eq!(
        serde_json::to_string(&1e20f32).unwrap(),
        "1e+20",
        "as f32s print"
    );
    assert!(text.contains(r#""optionalFloat":0.1"#), "{text}");
    assert!(text.contains(r#""repeatedFloat":[0.3,-2.5e-7]"#), "{text}");
    assert!(text.contains(r#""optionalFloatWrapper":0.7"#), "{text}");
    // Fields in the order of their numbers, as prost-reflect writes them.
    let at = |key: &str| text.find(key).unwrap();
    assert!(at("optionalInt32") < at("optionalFloat"), "{text}");
    assert!(at("optionalFloat") < at("repeatedFloat"), "{text}");
    assert!(at("repeatedFloat") < at("mapInt32Int32"), "{text}");
    for _ in 0..10 {
        let copy = json::from_str(&all, &text).unwrap();
        assert_eq!(json::to_json(&copy, compact).unwrap(), text);
    }
    // Indented output holds the same.
    let pretty = json::to_json(
        &message,
        PrintOptions {
            pretty: true,
            ..compact
        },
    )
    .unwrap();
    let same: serde_json::Value = serde_json::from_str(&pretty).unwrap();
    assert_eq!(
        same,
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    );
}

/// A field given twice is refused, not read as its last value: the same key twice in
/// an object (the values stream of `-d @-` too), or one field by its lowerCamelCase and
/// its `.proto` name, nested as well (Go's protojson, under grpcurl, refuses both).
#[test]
fn a_field_given_twice_is_refused() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let err = json::from_str(&all, r#"{"optionalInt32": 1, "optionalInt32": 2}"#).unwrap_err();
    assert!(err.reason.contains("given twice"), "{err}");
    let err = json::from_str(&all, r#"{"optionalInt32": 1, "optional_int32": 2}"#).unwrap_err();
    assert!(err.reason.contains("given twice"), "{err}");
    assert_eq!(err.path, "optionalInt32");
    let err =
        json::from_str(&all, r#"{"repeatedNestedMessage": [{}, {"a": 1, "a": 2}]}"#).unwrap_err();
    assert!(err.reason.contains("given twice"), "{err}");
    let err = json::from_str(
        &all,
        r#"{"optionalNestedMessage": {"corecursive": {"optionalInt32": 1, "optional_int32": 1}}}"#,
    )
    .unwrap_err();
    assert_eq!(err.path, "optionalNestedMessage.corecursive.optionalInt32");
    let mut values = json::values(r#"{"a": 1} {"b": 1, "b": 2}"#.as_bytes());
    assert!(values.next().unwrap().is_ok());
    let second = values.next().unwrap().unwrap_err();
    assert!(second.contains("given twice"), "{second}");
    // Once each is fine, by either name.
    json::from_str(&all, r#"{"optionalInt32": 1, "optional_int64": "2"}"#).unwrap();
}

/// A `DoubleValue` or `FloatValue` holding NaN or an infinity prints as proto3 JSON's
/// string for it (it printed `null`, the JSON of an unset field), in a message, a list
/// and a nested message, and reads back.
#[test]
fn non_finite_wrapper_values_print_as_their_strings() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let input = r#"{"optionalDoubleWrapper": "NaN", "optionalFloatWrapper": "Infinity",
        "repeatedDoubleWrapper": [1.5, "-Infinity"],
        "recursiveMessage": {"optionalDoubleWrapper": "-Infinity"}}"#;
    let message = json::from_str(&all, input).unwrap();
    let text = json::to_json(&message, PrintOptions::default()).unwrap();
    let printed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(printed["optionalDoubleWrapper"], "NaN", "{text}");
    assert_eq!(printed["optionalFloatWrapper"], "Infinity", "{text}");
    assert_eq!(
        printed["repeatedDoubleWrapper"],
        serde_json::json!([1.5, "-Infinity"]),
        "{text}"
    );
    assert_eq!(
        printed["recursiveMessage"]["optionalDoubleWrapper"], "-Infinity",
        "{text}"
    );
    let back = json::from_str(&all, &text).unwrap();
    assert_eq!(json::to_json(&back, PrintOptions::default()).unwrap(), text);
}

/// The largest `float`s read back as themselves, not refused as out of range (their
/// shortest form, `3.4028235e38`, is past `f32::MAX` as a double, and was printed): in
/// a field, a list, a map and a `FloatValue`.
#[test]
fn the_largest_floats_round_trip() {
    with_big_stack(largest_floats_round_trip);
}

fn largest_floats_round_trip() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let field = |name: &str| all.get_field_by_name(name).unwrap();
    let mut message = DynamicMessage::new(all.clone());
    message.set_field(&field("optional_float"), Value::F32(f32::MAX));
    message.set_field(
        &field("repeated_float"),
        Value::List(vec![Value::F32(f32::MIN), Value::F32(f32::MIN_POSITIVE)]),
    );
    let floats: std::collections::HashMap<MapKey, Value> =
        [(MapKey::I32(1), Value::F32(-f32::MAX))]
            .into_iter()
            .collect();
    message.set_field(&field("map_int32_float"), Value::Map(floats));
    let wrapper = field("optional_float_wrapper");
    let Kind::Message(float_value) = wrapper.kind() else {
        panic!("FloatValue")
    };
    let mut boxed = DynamicMessage::new(float_value.clone());
    boxed.set_field_by_name("value", Value::F32(f32::MAX));
    message.set_field(&wrapper, Value::Message(boxed));
    // Doubles read back exactly as printed (serde_json's default reading of a number
    // may be off by one unit in the last place).
    let mut doubles = DynamicMessage::new(all.clone());
    let values: Vec<f64> = [
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        0.1 + 0.2,
        2.225_073_858_507_201e-308,
        8.98846567431158e307,
    ]
    .into_iter()
    .chain((1..2000u64).map(|i| {
        f64::from_bits(0x3ff0_0000_0000_0000 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 12)
    }))
    .collect();
    doubles.set_field(
        &field("repeated_double"),
        Value::List(values.iter().copied().map(Value::F64).collect()),
    );
    let text = json::to_json(&doubles, PrintOptions::default()).unwrap();
    let copy = json::from_str(&all, &text).unwrap();
    let read = copy.get_field_by_name("repeated_double").unwrap();
    let read: Vec<f64> = read
        .as_list()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    for (read, written) in read.iter().zip(&values) {
        assert_eq!(
            read.to_bits(),
            written.to_bits(),
            "{written:e} read as {read:e}"
        );
    }
    assert_eq!(read.len(), values.len());
    let text = json::to_json(&message, PrintOptions::default()).unwrap();
    assert!(!text.contains("3.4028235e+38"), "{text}");
    let copy = json::from_str(&all, &text).unwrap_or_else(|err| panic!("{text}: {err}"));
    // (Not `assert_eq!` on the messages: the type's `Debug` recurses without end.)
    assert!(copy == message, "{text}");
    // A number past what rounds to the largest float is still refused.
    let too_large = r#"{"optionalFloat": 3.5e38}"#;
    assert!(json::from_str(&all, too_large).is_err(), "{too_large}");
}

/// Inside an `Any`, the packed message gets the same checks and printing as one
/// outside: an inexact 64-bit number and a field given twice are refused (they were
/// taken, the number rounded), also in a packed `Int64Value`; non-finite wrapper
/// values print as their strings (they printed `null`), also a packed `DoubleValue`.
#[test]
fn an_any_is_checked_and_printed_as_the_message_it_packs() {
    with_big_stack(an_any_is_checked_and_printed_as_the_message_it_packs_on_a_big_stack);
}

fn an_any_is_checked_and_printed_as_the_message_it_packs_on_a_big_stack() {
    let pool = pool();
    let all = pool
        .get_message_by_name("protobuf_test_messages.proto3.TestAllTypesProto3")
        .unwrap();
    let url = "type.googleapis.com/protobuf_test_messages.proto3.TestAllTypesProto3";
    let inexact =
        format!(r#"{{"optionalAny": {{"@type": "{url}", "optionalInt64": 9007199254740993.0}}}}"#);
    let err = json::from_str(&all, &inexact).unwrap_err();
    assert!(err.path.contains("optionalInt64"), "{err}");
    let wrapped = r#"{"optionalAny": {"@type": "type.googleapis.com/google.protobuf.Int64Value", "value": 9007199254740993.0}}"#;
    assert!(
        json::from_str(&all, wrapped).is_err(),
        "a packed Int64Value rounded"
    );
    let twice = format!(
        r#"{{"optionalAny": {{"@type": "{url}", "optionalInt32": 1, "optional_int32": 2}}}}"#
    );
    let err = json::from_str(&all, &twice).unwrap_err();
    assert!(err.reason.contains("given twice"), "{err}");
    // Printing: the packed message's wrappers, and a packed DoubleValue.
    let input = format!(
        r#"{{"optionalAny": {{"@type": "{url}", "optionalDoubleWrapper": "NaN"}},
            "repeatedAny": [{{"@type": "type.googleapis.com/google.protobuf.DoubleValue", "value": "-Infinity"}}]}}"#
    );
    let message = json::from_str(&all, &input).unwrap();
    let text = json::to_json(&message, PrintOptions::default()).unwrap();
    let printed: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        printed["optionalAny"]["optionalDoubleWrapper"], "NaN",
        "{text}"
    );
    assert_eq!(printed["repeatedAny"][0]["value"], "-Infinity", "{text}");
}

/// The `Any` types of one message are collected up to a bound: each new one is
/// compared with those before, and a response of a million and a half `Any`s of
/// distinct types took an hour of CPU (from a review).
#[test]
fn any_types_are_collected_up_to_a_bound() {
    let anys: Vec<serde_json::Value> = (0..20_000)
        .map(|i| serde_json::json!({ "@type": format!("type.googleapis.com/t.T{i}") }))
        .collect();
    let mut types = Vec::new();
    json::json_any_types(&serde_json::Value::Array(anys), &mut types);
    assert!(types.len() < 1_000, "{} types collected", types.len());
    assert_eq!(types[0], "t.T0");
}

/// A `DoubleValue` or `FloatValue` that is itself the message (a method's response)
/// prints NaN and the infinities as proto3 JSON's strings, as such a field does: it
/// printed `null` (from a review).
#[test]
fn a_wrapper_message_of_nan_prints_as_a_string() {
    let pool = DescriptorPool::global();
    for (name, value, text) in [
        (
            "google.protobuf.DoubleValue",
            Value::F64(f64::NAN),
            "\"NaN\"",
        ),
        (
            "google.protobuf.DoubleValue",
            Value::F64(f64::NEG_INFINITY),
            "\"-Infinity\"",
        ),
        (
            "google.protobuf.FloatValue",
            Value::F32(f32::INFINITY),
            "\"Infinity\"",
        ),
    ] {
        let descriptor = pool.get_message_by_name(name).expect("a well-known type");
        let mut message = DynamicMessage::new(descriptor);
        message.set_field_by_name("value", value);
        let json = json::to_json(&message, PrintOptions::default()).unwrap();
        assert_eq!(json, text, "{name}");
    }
}
