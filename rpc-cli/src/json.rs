//! The proto3 JSON mapping of dynamic messages, both ways (prost-reflect's, well-known
//! types included): output names in lowerCamelCase (or as in the `.proto`), input
//! accepting both; and errors that say where a value does not fit and what the field
//! expects.

use std::{fmt, io::Read};

use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage,
    SerializeOptions,
};
use serde_path_to_error::Segment;

/// How messages are printed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrintOptions {
    /// Print fields with their default value too.
    pub emit_defaults: bool,
    /// Field names as in the `.proto` instead of lowerCamelCase.
    pub proto_names: bool,
    /// Indented over several lines instead of one line.
    pub pretty: bool,
}

/// A message as proto3 JSON, its map fields' entries in the order of their keys (the
/// same output for the same message on every run). Fails only for an `Any` whose type
/// the message's pool does not have (its JSON form is the type's own fields).
pub fn to_json(message: &DynamicMessage, options: PrintOptions) -> Result<String, String> {
    let known = without_undefined_closed(message);
    let message = known.as_ref().unwrap_or(message);
    if let Some(why) = invalid_time(message) {
        return Err(why);
    }
    let serialize_options = SerializeOptions::new()
        .skip_default_fields(!options.emit_defaults)
        .use_proto_field_name(options.proto_names);
    let typed = typed_empty_anys(message);
    let mut value = typed
        .as_ref()
        .unwrap_or(message)
        .serialize_with_options(serde_json::value::Serializer, &serialize_options)
        .map_err(|err| err.to_string())?;
    if typed.is_some() {
        print_empty_anys(&mut value);
    }
    settle(&mut value, &message.descriptor(), options);
    // The message itself too: a method returning a DoubleValue of NaN printed null.
    non_finite_in(message, &mut value, options);
    let text = if options.pretty {
        serde_json::to_string_pretty(&value)
    } else {
        serde_json::to_string(&value)
    };
    text.map_err(|err| err.to_string())
}

/// Puts the JSON form `value` of a `descriptor` message in its printed shape: each map
/// field's entries sorted by key (prost-reflect keeps maps in hash maps, in an order
/// that changed from run to run), and each `float` written as its shortest `f32` form
/// (a `Value` holds it as the `f64` it widens to: 0.1 would print 0.10000000149011612).
fn settle(value: &mut serde_json::Value, descriptor: &MessageDescriptor, options: PrintOptions) {
    match descriptor.full_name() {
        "google.protobuf.FloatValue" => return settle_float(value),
        "google.protobuf.Any" => {
            let Some(url) = value.get("@type").and_then(|url| url.as_str()) else {
                return;
            };
            let name = url.rsplit('/').next().unwrap_or(url);
            let Some(inner) = descriptor.parent_pool().get_message_by_name(name) else {
                return;
            };
            // A well-known type's JSON form goes under "value"; another's fields sit
            // beside "@type".
            if inner.full_name().starts_with("google.protobuf.") {
                if let Some(packed) = value.get_mut("value") {
                    settle(packed, &inner, options);
                }
            } else {
                settle_fields(value, &inner, options);
            }
            return;
        }
        // Other well-known types have JSON forms of their own (a Struct's keys are
        // sorted by prost-reflect already).
        name if name.starts_with("google.protobuf.") => return,
        _ => {}
    }
    settle_fields(value, descriptor, options);
}

/// Writes the `DoubleValue` and `FloatValue` fields holding NaN or an infinity as
/// proto3 JSON's strings (`"NaN"`, `"Infinity"`, `"-Infinity"`): prost-reflect hands
/// the wrapper's number to serde_json, which has no such numbers and wrote `null`,
/// the JSON of an unset field. And negative zeros as `-0.0`: prost-reflect takes -0.0
/// for a field's default 0 (they compare equal), and left a `float` or `double` field
/// without presence out (a wrapper's printed `0.0`), where protobuf's own encoders
/// compare the bits and keep it. Walks `message` beside its JSON `value` (lists, maps
/// and `Any` included).
fn non_finite_wrappers(
    message: &DynamicMessage,
    value: &mut serde_json::Value,
    options: PrintOptions,
) {
    let serde_json::Value::Object(object) = value else {
        return;
    };
    let descriptor = message.descriptor();
    let name_of = |field: &FieldDescriptor| {
        if options.proto_names {
            field.name().to_owned()
        } else {
            field.json_name().to_owned()
        }
    };
    for field in descriptor.fields() {
        if !is_implicit_float(&field) {
            continue;
        }
        let name = name_of(&field);
        if object.contains_key(&name) {
            continue;
        }
        if let Some(zero) = negative_zero(&message.get_field(&field)) {
            // Where the field's number puts it among the fields printed (after an
            // Any's "@type", which is no field).
            let number = |key: &String| {
                descriptor
                    .get_field_by_json_name(key)
                    .or_else(|| descriptor.get_field_by_name(key))
                    .map_or(0, |f| f.number())
            };
            let at = object
                .keys()
                .take_while(|key| number(key) < field.number())
                .count();
            object.shift_insert(at, name, zero);
        }
    }
    for (field, field_value) in message.fields() {
        let name = if options.proto_names {
            field.name()
        } else {
            field.json_name()
        };
        let Some(json) = object.get_mut(name) else {
            continue;
        };
        match field_value {
            prost_reflect::Value::Message(inner) => non_finite_in(inner, json, options),
            prost_reflect::Value::List(items) => {
                if let serde_json::Value::Array(array) = json {
                    for (item, json) in items.iter().zip(array.iter_mut()) {
                        if let prost_reflect::Value::Message(inner) = item {
                            non_finite_in(inner, json, options);
                        }
                    }
                }
            }
            prost_reflect::Value::Map(entries) => {
                if let serde_json::Value::Object(map) = json {
                    for (key, item) in entries {
                        let key = match key {
                            prost_reflect::MapKey::String(s) => s.clone(),
                            prost_reflect::MapKey::Bool(b) => b.to_string(),
                            prost_reflect::MapKey::I32(n) => n.to_string(),
                            prost_reflect::MapKey::I64(n) => n.to_string(),
                            prost_reflect::MapKey::U32(n) => n.to_string(),
                            prost_reflect::MapKey::U64(n) => n.to_string(),
                        };
                        if let (prost_reflect::Value::Message(inner), Some(json)) =
                            (item, map.get_mut(&key))
                        {
                            non_finite_in(inner, json, options);
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// [`non_finite_in`] for the message an `Any` packs (its `value` decoded as the type
/// its `type_url` names, when the pool has it), beside the Any's JSON: the object
/// itself, or its `value` for a well-known type with a JSON form of its own.
fn non_finite_in_any(any: &DynamicMessage, json: &mut serde_json::Value, options: PrintOptions) {
    let (Some(url), Some(bytes)) = (
        any.get_field_by_name("type_url")
            .and_then(|v| v.as_str().map(str::to_owned)),
        any.get_field_by_name("value")
            .and_then(|v| v.as_bytes().cloned()),
    ) else {
        return;
    };
    let pool = any.descriptor().parent_pool().clone();
    let Some(packed) = url
        .rsplit('/')
        .next()
        .and_then(|name| pool.get_message_by_name(name))
    else {
        return;
    };
    let Ok(inner) = DynamicMessage::decode(packed.clone(), bytes) else {
        return;
    };
    if packed.full_name().starts_with("google.protobuf.") {
        if let serde_json::Value::Object(object) = json {
            if let Some(value) = object.get_mut("value") {
                non_finite_in(&inner, value, options);
            }
        }
    } else {
        non_finite_in(&inner, json, options);
    }
}

/// [`non_finite_wrappers`] for one message value: a wrapper itself, or another message.
fn non_finite_in(message: &DynamicMessage, json: &mut serde_json::Value, options: PrintOptions) {
    let number = match message.descriptor().full_name() {
        "google.protobuf.DoubleValue" => {
            message.get_field_by_name("value").and_then(|v| v.as_f64())
        }
        "google.protobuf.FloatValue" => message
            .get_field_by_name("value")
            .and_then(|v| v.as_f32())
            .map(f64::from),
        "google.protobuf.Any" => return non_finite_in_any(message, json, options),
        name if name.starts_with("google.protobuf.") => return,
        _ => return non_finite_wrappers(message, json, options),
    };
    if let Some(zero) = number.and_then(|n| negative_zero(&prost_reflect::Value::F64(n))) {
        *json = zero;
    } else if let Some(number) = number.filter(|n| !n.is_finite()) {
        let text = if number.is_nan() {
            "NaN"
        } else if number > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        };
        *json = serde_json::Value::String(text.to_owned());
    }
}

/// Whether `field` is a singular `float` or `double` without presence: one that
/// prost-reflect leaves out at -0.0, as if it held its default.
fn is_implicit_float(field: &FieldDescriptor) -> bool {
    matches!(field.kind(), Kind::Double | Kind::Float)
        && !field.is_list()
        && !field.supports_presence()
}

/// `-0.0` as JSON if `value` is a negative zero `float` or `double`.
fn negative_zero(value: &prost_reflect::Value) -> Option<serde_json::Value> {
    let number = match value {
        prost_reflect::Value::F64(n) => *n,
        prost_reflect::Value::F32(n) => f64::from(*n),
        _ => return None,
    };
    (number == 0.0 && number.is_sign_negative())
        .then(|| serde_json::Number::from_f64(number).map(serde_json::Value::Number))
        .flatten()
}

/// Why a `Duration` or `Timestamp` in `message`, at any depth (`Any` values aside),
/// has no JSON form, if one has none: a Duration whose seconds and nanos have opposite
/// signs, or nanos of a second or more, and a Timestamp whose nanos are outside
/// 0..1e9. prost-reflect printed them as other values (`{seconds: 1, nanos: -1}`, a
/// positive 0.999999999 s, as `"-0.999999999s"`; from a review, against protobuf's own
/// mapping, which refuses them). The range of each is prost-reflect's to check.
fn invalid_time(message: &DynamicMessage) -> Option<String> {
    find_message(message, 0, &mut no_json_form)
}

/// Why `message` itself, if it is a Duration, a Timestamp or a FieldMask, has no JSON
/// form ([`invalid_time`]).
fn no_json_form(message: &DynamicMessage) -> Option<String> {
    let number = |n: u32| match message.get_field_by_number(n).as_deref() {
        Some(prost_reflect::Value::I64(v)) => *v,
        Some(prost_reflect::Value::I32(v)) => i64::from(*v),
        _ => 0,
    };
    match message.descriptor().full_name() {
        "google.protobuf.Duration" => {
            let (seconds, nanos) = (number(1), number(2));
            let mixed = (seconds > 0 && nanos < 0) || (seconds < 0 && nanos > 0);
            (mixed || nanos.abs() >= 1_000_000_000).then(|| {
                format!(
                    "a google.protobuf.Duration of {seconds} s and {nanos} ns has no JSON form: \
                     its seconds and nanos must have the same sign, and nanos be under a second"
                )
            })
        }
        "google.protobuf.Timestamp" => {
            let nanos = number(2);
            (!(0..1_000_000_000).contains(&nanos)).then(|| {
                format!(
                    "a google.protobuf.Timestamp with {nanos} ns has no JSON form: its nanos \
                     must be in 0..999999999"
                )
            })
        }
        "google.protobuf.FieldMask" => {
            let paths = message.get_field_by_number(1);
            let Some(prost_reflect::Value::List(paths)) = paths.as_deref() else {
                return None;
            };
            paths.iter().filter_map(|p| p.as_str()).find_map(|path| {
                let why = field_mask_path(path)?;
                Some(format!(
                    "a google.protobuf.FieldMask path {:?} has no JSON form: {why}",
                    crate::exit::printable(path)
                ))
            })
        }
        _ => None,
    }
}

/// `visit` on `message` and on every message it holds (in fields, lists and map
/// values), depth first, until one gives `Some`; no deeper than decoders nest
/// ([`MAX_DEPTH`]).
fn find_message<T>(
    message: &DynamicMessage,
    depth: usize,
    visit: &mut dyn FnMut(&DynamicMessage) -> Option<T>,
) -> Option<T> {
    if depth > MAX_DEPTH {
        return None;
    }
    if let Some(found) = visit(message) {
        return Some(found);
    }
    for (_, value) in message.fields() {
        let found = match value {
            prost_reflect::Value::Message(inner) => find_message(inner, depth + 1, visit),
            prost_reflect::Value::List(items) => items.iter().find_map(|item| match item {
                prost_reflect::Value::Message(inner) => find_message(inner, depth + 1, visit),
                _ => None,
            }),
            prost_reflect::Value::Map(entries) => entries.values().find_map(|item| match item {
                prost_reflect::Value::Message(inner) => find_message(inner, depth + 1, visit),
                _ => None,
            }),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// `visit` on `message` and on every message it holds, as [`find_message`] walks them,
/// each mutably.
fn each_message_mut(
    message: &mut DynamicMessage,
    depth: usize,
    visit: &mut dyn FnMut(&mut DynamicMessage),
) {
    if depth > MAX_DEPTH {
        return;
    }
    visit(message);
    let mut each = |value: &mut prost_reflect::Value| {
        if let prost_reflect::Value::Message(inner) = value {
            each_message_mut(inner, depth + 1, visit);
        }
    };
    for (_, value) in message.fields_mut() {
        match value {
            prost_reflect::Value::List(items) => items.iter_mut().for_each(&mut each),
            prost_reflect::Value::Map(entries) => entries.values_mut().for_each(&mut each),
            other => each(other),
        }
    }
}

/// Why a `FieldMask` path does not survive its JSON form (camelCase, read back as
/// snake_case), if it does not: an uppercase letter, a `_` not followed by a lowercase
/// letter, as protobuf's own mapping refuses (prost-reflect printed `foo_` as `"foo"`).
fn field_mask_path(path: &str) -> Option<&'static str> {
    let mut after_underscore = false;
    for c in path.chars() {
        if c.is_ascii_uppercase() {
            return Some("it holds an uppercase letter");
        }
        if after_underscore && !c.is_ascii_lowercase() {
            return Some("a `_` in it is followed by other than a lowercase letter");
        }
        after_underscore = c == '_';
    }
    after_underscore.then_some("it ends in `_`")
}

/// Whether `message` holds, at any depth, a negative zero in a field that
/// prost-reflect's encoding leaves out ([`is_implicit_float`]).
fn holds_negative_zero(message: &DynamicMessage) -> bool {
    let in_value = |value: &prost_reflect::Value| match value {
        prost_reflect::Value::Message(inner) => holds_negative_zero(inner),
        _ => false,
    };
    message.descriptor().fields().any(|field| {
        if is_implicit_float(&field) {
            return negative_zero(&message.get_field(&field)).is_some();
        }
        if !matches!(field.kind(), Kind::Message(_)) || !message.has_field(&field) {
            return false;
        }
        match &*message.get_field(&field) {
            prost_reflect::Value::Message(inner) => holds_negative_zero(inner),
            prost_reflect::Value::List(items) => items.iter().any(in_value),
            prost_reflect::Value::Map(entries) => entries
                .values()
                .any(|value| in_value(value) || negative_zero(value).is_some()),
            _ => false,
        }
    })
}

/// `message` encoded, its negative zeros kept: prost-reflect takes -0.0 in a `float`
/// or `double` field without presence for the default 0 and leaves the field out, so
/// `{"d": -0}` reached the server as 0 (protobuf's own encoders compare the bits, and
/// send it). Such fields, and the messages that hold them, are encoded after the
/// message's other fields (parsers take fields in any order; a list keeps its order).
pub fn encode(message: &DynamicMessage) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(message, &mut out);
    out
}

fn encode_into(message: &DynamicMessage, out: &mut Vec<u8>) {
    use prost::Message as _;
    if !holds_negative_zero(message) {
        out.extend_from_slice(&message.encode_to_vec());
        return;
    }
    // A proto2 group goes between its START_GROUP and END_GROUP keys, not as a
    // length-delimited field (from a review).
    let put_message = |field: &FieldDescriptor, inner: &DynamicMessage, out: &mut Vec<u8>| {
        let bytes = encode(inner);
        if field.is_group() {
            use prost::encoding::{encode_key, WireType};
            encode_key(field.number(), WireType::StartGroup, out);
            out.extend_from_slice(&bytes);
            encode_key(field.number(), WireType::EndGroup, out);
        } else {
            prost::encoding::bytes::encode(field.number(), &bytes, out);
        }
    };
    let holds = |value: &prost_reflect::Value| match value {
        prost_reflect::Value::Message(inner) => holds_negative_zero(inner),
        _ => false,
    };
    let mut rest = message.clone();
    let mut tail = Vec::new();
    for field in message.descriptor().fields() {
        let value = message.get_field(&field);
        match &*value {
            prost_reflect::Value::F64(n)
                if is_implicit_float(&field) && negative_zero(&value).is_some() =>
            {
                prost::encoding::double::encode(field.number(), n, &mut tail);
            }
            prost_reflect::Value::F32(n)
                if is_implicit_float(&field) && negative_zero(&value).is_some() =>
            {
                prost::encoding::float::encode(field.number(), n, &mut tail);
            }
            prost_reflect::Value::Message(inner)
                if message.has_field(&field) && holds_negative_zero(inner) =>
            {
                rest.clear_field(&field);
                put_message(&field, inner, &mut tail);
            }
            prost_reflect::Value::List(items) if items.iter().any(holds) => {
                rest.clear_field(&field);
                for item in items {
                    if let prost_reflect::Value::Message(inner) = item {
                        put_message(&field, inner, &mut tail);
                    }
                }
            }
            // A map entry's value is a field without presence too.
            prost_reflect::Value::Map(entries)
                if entries
                    .values()
                    .any(|value| holds(value) || negative_zero(value).is_some()) =>
            {
                let Kind::Message(entry) = field.kind() else {
                    continue;
                };
                rest.clear_field(&field);
                for (key, value) in entries {
                    let mut pair = DynamicMessage::new(entry.clone());
                    pair.set_field(&entry.map_entry_key_field(), key.clone().into());
                    pair.set_field(&entry.map_entry_value_field(), value.clone());
                    put_message(&field, &pair, &mut tail);
                }
            }
            _ => {}
        }
    }
    out.extend_from_slice(&rest.encode_to_vec());
    out.extend_from_slice(&tail);
}

/// [`settle`] for a message printed as an object of its fields.
fn settle_fields(
    value: &mut serde_json::Value,
    descriptor: &MessageDescriptor,
    options: PrintOptions,
) {
    let serde_json::Value::Object(object) = value else {
        return;
    };
    // Where the next field printed sits: prost-reflect prints them in this order.
    let mut at = 0;
    for field in descriptor.fields() {
        let name = if options.proto_names {
            field.name()
        } else {
            field.json_name()
        };
        let Some(value) = object.get_mut(name) else {
            if options.emit_defaults && unset_prints_null(&field) {
                object.shift_insert(at, name.to_owned(), serde_json::Value::Null);
                at += 1;
            }
            continue;
        };
        at += 1;
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                continue;
            };
            let (key, map_value) = (entry.map_entry_key_field(), entry.map_entry_value_field());
            if let serde_json::Value::Object(map) = value {
                let mut entries: Vec<_> = std::mem::take(map).into_iter().collect();
                entries.sort_by(|(a, _), (b, _)| compare_keys(&key.kind(), a, b));
                for (_, value) in &mut entries {
                    settle_kind(value, &map_value.kind(), options);
                }
                map.extend(entries);
            }
        } else if let serde_json::Value::Array(items) = value {
            items
                .iter_mut()
                .for_each(|item| settle_kind(item, &field.kind(), options));
        } else {
            settle_kind(value, &field.kind(), options);
        }
    }
}

/// Whether `field`, unset, prints as `null` with `--emit-defaults`: a singular field with
/// presence outside any oneof (a message field, a proto2 scalar), as protojson's
/// `EmitUnpopulated` (grpcurl's `-emit-defaults`) prints it. A proto3 `optional`
/// field (a oneof of its own) and a oneof's members stay out, as there; so does a
/// `google.protobuf.Value` field, whose `null` reads back as a set `NULL_VALUE`.
fn unset_prints_null(field: &FieldDescriptor) -> bool {
    field.supports_presence()
        && !field.is_list()
        && !field.is_map()
        && field.containing_oneof().is_none()
        && !matches!(field.kind(), Kind::Message(m) if m.full_name() == "google.protobuf.Value")
}

/// [`settle`] for one value of a field of `kind`.
fn settle_kind(value: &mut serde_json::Value, kind: &Kind, options: PrintOptions) {
    match kind {
        Kind::Message(descriptor) => settle(value, descriptor, options),
        Kind::Float => settle_float(value),
        _ => {}
    }
}

/// A `float` widened to `f64`, put back as the `f64` of its shortest `f32` form. Except
/// the largest floats (±`f32::MAX`), whose shortest form (`3.4028235e38`) is past
/// `f32::MAX` as a double, and is refused as out of range when read back as a
/// `float`: they keep the widened value, exact either way.
fn settle_float(value: &mut serde_json::Value) {
    if let Some(wide) = value.as_f64() {
        let shortest = (wide as f32).to_string();
        if let Some(number) = shortest
            .parse::<f64>()
            .ok()
            .filter(|n| n.abs() <= f64::from(f32::MAX))
            .and_then(serde_json::Number::from_f64)
        {
            *value = serde_json::Value::Number(number);
        }
    }
}

/// Orders two map keys' JSON forms as the keys themselves: numbers by value, `false`
/// before `true`, strings by their bytes.
fn compare_keys(kind: &Kind, a: &str, b: &str) -> std::cmp::Ordering {
    match kind {
        Kind::String | Kind::Bool => a.cmp(b),
        _ => match (a.parse::<i128>(), b.parse::<i128>()) {
            (Ok(a), Ok(b)) => a.cmp(&b),
            _ => a.cmp(b),
        },
    }
}

/// The message types named by the `Any` values in `value`'s `@type`s (full names,
/// without the URL's prefix), nested ones included.
pub fn json_any_types(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(fields) => {
            if let Some(serde_json::Value::String(url)) = fields.get("@type") {
                push_type(url, out);
            }
            fields.values().for_each(|v| json_any_types(v, out));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_any_types(v, out)),
        _ => {}
    }
}

/// The message types named by the `Any` values of `message` (full names), at any
/// depth; inside an `Any` whose type the message's pool has, the ones its value holds
/// (an `Any` of a type not known yet hides what it holds until it is). An error if
/// messages nest deeper than [`MAX_DEPTH`], counting those inside `Any` values (each
/// decoded apart, so prost's own limit does not see them together): printing such a
/// message would recurse as deep.
pub fn message_any_types(message: &DynamicMessage, out: &mut Vec<String>) -> Result<(), String> {
    any_types_at(message, out, 0)
}

/// How deep messages may nest in a response that is printed, `Any` values included:
/// prost's own decoding limit.
pub const MAX_DEPTH: usize = 100;

fn any_types_at(
    message: &DynamicMessage,
    out: &mut Vec<String>,
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "messages nest more than {MAX_DEPTH} deep (with the ones inside Any values)"
        ));
    }
    if message.descriptor().full_name() == "google.protobuf.Any" {
        let url = message.get_field_by_name("type_url");
        let Some(url) = url.as_ref().and_then(|u| u.as_str()) else {
            return Ok(());
        };
        let name = url.rsplit('/').next().unwrap_or(url);
        let pool = message.descriptor().parent_pool().clone();
        match pool.get_message_by_name(name) {
            Some(inner) => {
                let value = message.get_field_by_name("value");
                let bytes = value.as_ref().and_then(|v| v.as_bytes()).cloned();
                if let Some(inner) = bytes.and_then(|b| DynamicMessage::decode(inner, b).ok()) {
                    any_types_at(&inner, out, depth + 1)?;
                }
            }
            None => push_type(url, out),
        }
        return Ok(());
    }
    for (_, value) in message.fields() {
        value_any_types(value, out, depth + 1)?;
    }
    Ok(())
}

fn value_any_types(
    value: &prost_reflect::Value,
    out: &mut Vec<String>,
    depth: usize,
) -> Result<(), String> {
    match value {
        prost_reflect::Value::Message(message) => any_types_at(message, out, depth),
        prost_reflect::Value::List(items) => items
            .iter()
            .try_for_each(|v| value_any_types(v, out, depth)),
        prost_reflect::Value::Map(entries) => entries
            .values()
            .try_for_each(|v| value_any_types(v, out, depth)),
        _ => Ok(()),
    }
}

/// Most elements one response may hold to be decoded and printed: the values of its
/// fields, the elements of its lists and the entries of its maps, at any depth, those
/// of the messages its `Any` values pack included (with `--emit-defaults`, every field
/// of each message in it, as each prints). See [`check_elements`].
pub const MAX_ELEMENTS: usize = 1_000_000;

/// Refuses an encoded `descriptor` message holding more than [`MAX_ELEMENTS`]
/// elements, counted on its encoding before anything is decoded; `emit_defaults`:
/// every field of each message present counts too (`--emit-defaults` prints them).
///
/// What it bounds: decoding makes a `prost_reflect::Value` of some 50 bytes of each
/// element, a packed `bool` of one byte on the wire as much as any, and printing
/// makes a `serde_json::Value` of each, then its text: the 16 million packed booleans
/// of a 16 MiB response (the default --max-message-size) came to gigabytes. Each
/// element takes at least a byte of the message, so a message of fewer than
/// `MAX_ELEMENTS` bytes never has too many (with `--emit-defaults` it may). What it
/// does not: the length of strings and bytes (each is one element, bounded by the
/// message's size, and printed at most a few times as long: escapes, base64), and
/// the contents of an `Any` whose type the pool does not have yet (kept as bytes, not
/// decoded; counted once the type is known, as the message is decoded again). A
/// malformed encoding passes, for the decoder to report.
pub fn check_elements(
    descriptor: &MessageDescriptor,
    bytes: &[u8],
    emit_defaults: bool,
) -> Result<(), String> {
    let mut elements = Elements {
        counted: 0,
        emit_defaults,
    };
    let mut bytes = bytes;
    match elements.scan(Some(descriptor), &mut bytes, None, 0) {
        Ok(()) | Err(Stop::Malformed) => Ok(()),
        Err(Stop::TooMany) => Err(format!(
            "a response has more than {MAX_ELEMENTS} elements (values of fields, elements \
             of lists, entries of maps, at any depth{}), more than rpc decodes and prints \
             as JSON; ask the method for less (a page, a filter)",
            if emit_defaults {
                ", and with --emit-defaults every field of each message"
            } else {
                ""
            }
        )),
        Err(Stop::TooDeep) => Err(format!(
            "a response's messages nest more than {MAX_DEPTH} deep (with the ones inside \
             Any values)"
        )),
    }
}

/// Why [`Elements::scan`] stopped before the end.
enum Stop {
    /// Not an encoding prost decodes: left to the decoder to say why.
    Malformed,
    /// More than [`MAX_ELEMENTS`] elements.
    TooMany,
    /// Messages nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

/// The count of [`check_elements`].
struct Elements {
    counted: usize,
    emit_defaults: bool,
}

impl Elements {
    fn add(&mut self, elements: usize) -> Result<(), Stop> {
        self.counted = self.counted.saturating_add(elements);
        if self.counted > MAX_ELEMENTS {
            Err(Stop::TooMany)
        } else {
            Ok(())
        }
    }

    /// Counts the fields of the encoded message at the start of `bytes`, of type
    /// `descriptor` (`None`: an unknown group, whose fields prost-reflect keeps too),
    /// at `depth` (as prost counts it: map entries are not a level, and as
    /// [`message_any_types`] does: an `Any`'s message is one more), to the end of
    /// `bytes` or, in a `group`, to its end-group tag. Every field on the wire counts
    /// one (each element of a list and each entry of a map is one), and each element of
    /// a packed list one more.
    fn scan(
        &mut self,
        descriptor: Option<&MessageDescriptor>,
        bytes: &mut &[u8],
        group: Option<u32>,
        depth: usize,
    ) -> Result<(), Stop> {
        use prost::encoding::{decode_key, decode_varint, WireType};
        if depth > MAX_DEPTH {
            return Err(Stop::TooDeep);
        }
        if let (Some(descriptor), true) = (descriptor, self.emit_defaults) {
            self.add(descriptor.fields().len())?;
        }
        let any = descriptor.filter(|d| d.full_name() == "google.protobuf.Any");
        // An `Any`'s fields (the last of each, as decoding keeps).
        let mut type_url: &[u8] = &[];
        let mut value: &[u8] = &[];
        while !bytes.is_empty() {
            let (number, wire_type) = decode_key(bytes).map_err(|_| Stop::Malformed)?;
            self.add(1)?;
            let field = descriptor.and_then(|d| field_kind(d, number));
            match wire_type {
                WireType::Varint => {
                    decode_varint(bytes).map_err(|_| Stop::Malformed)?;
                }
                WireType::SixtyFourBit => skip(bytes, 8)?,
                WireType::ThirtyTwoBit => skip(bytes, 4)?,
                WireType::LengthDelimited => {
                    let len = decode_varint(bytes).map_err(|_| Stop::Malformed)?;
                    let len = usize::try_from(len).map_err(|_| Stop::Malformed)?;
                    if len > bytes.len() {
                        return Err(Stop::Malformed);
                    }
                    let (mut inner, rest) = bytes.split_at(len);
                    *bytes = rest;
                    if any.is_some() {
                        match number {
                            1 => type_url = inner,
                            2 => value = inner,
                            _ => {}
                        }
                    }
                    match field {
                        Some((Kind::Message(message), _)) => {
                            let level = if message.is_map_entry() {
                                depth
                            } else {
                                depth + 1
                            };
                            self.scan(Some(&message), &mut inner, None, level)?;
                        }
                        Some((kind, true)) => self.add(packed_elements(&kind, inner))?,
                        _ => {}
                    }
                }
                WireType::StartGroup => {
                    let message = match field {
                        Some((Kind::Message(message), _)) => Some(message),
                        _ => None,
                    };
                    self.scan(message.as_ref(), bytes, Some(number), depth + 1)?;
                }
                WireType::EndGroup => {
                    return if group == Some(number) {
                        Ok(())
                    } else {
                        Err(Stop::Malformed)
                    };
                }
            }
        }
        if group.is_some() {
            return Err(Stop::Malformed); // a group without its end
        }
        // An `Any`'s message, when the pool has its type: printing decodes it.
        if let Some(any) = any {
            let packed = std::str::from_utf8(type_url).ok().and_then(|url| {
                let name = url.rsplit('/').next().unwrap_or(url);
                any.parent_pool().get_message_by_name(name)
            });
            if let Some(packed) = packed {
                let mut value = value;
                match self.scan(Some(&packed), &mut value, None, depth + 1) {
                    // A value that does not decode stays bytes (decoding the message
                    // around it goes on): the count goes on past it too (from a review:
                    // one malformed Any ended the count, and the fields after it were
                    // decoded uncounted).
                    Ok(()) | Err(Stop::Malformed) => {}
                    Err(stop) => return Err(stop),
                }
            }
        }
        Ok(())
    }
}

/// The kind of field `number` of `descriptor` (one of its extensions' too), and whether
/// it is a list (a map is neither: its entries are messages).
fn field_kind(descriptor: &MessageDescriptor, number: u32) -> Option<(Kind, bool)> {
    match descriptor.get_field(number) {
        Some(field) => Some((field.kind(), field.is_list())),
        None => descriptor
            .get_extension(number)
            .map(|extension| (extension.kind(), extension.is_list())),
    }
}

/// The elements of a packed list of `kind` encoded as `bytes` (none for a kind that
/// does not pack: each string, bytes or message is a field of its own).
fn packed_elements(kind: &Kind, bytes: &[u8]) -> usize {
    match kind {
        Kind::String | Kind::Bytes | Kind::Message(_) => 0,
        Kind::Fixed32 | Kind::Sfixed32 | Kind::Float => bytes.len() / 4,
        Kind::Fixed64 | Kind::Sfixed64 | Kind::Double => bytes.len() / 8,
        // Varints: one ends at each byte without its top bit.
        _ => bytes.iter().filter(|&&byte| byte < 0x80).count(),
    }
}

/// Skips `n` bytes of `bytes`.
fn skip(bytes: &mut &[u8], n: usize) -> Result<(), Stop> {
    *bytes = bytes.get(n..).ok_or(Stop::Malformed)?;
    Ok(())
}

/// Most distinct `Any` types collected from one message: each new one is compared
/// with those before, and a response of 1.5 million `Any`s of distinct types (8 bytes
/// each) took an hour of CPU (from a review). Types past it are not looked up, and
/// their values print as errors naming them.
const MAX_ANY_TYPES: usize = 256;

fn push_type(url: &str, out: &mut Vec<String>) {
    let name = url.rsplit('/').next().unwrap_or(url);
    if !name.is_empty() && out.len() < MAX_ANY_TYPES && !out.iter().any(|known| known == name) {
        out.push(name.to_owned());
    }
}

/// A JSON value that does not fit a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// The message type.
    pub message: String,
    /// Where in the value: `a.b[2]`, or empty for the value itself.
    pub path: String,
    /// What the field there is, e.g. `int32`, `repeated string`, `map<string, Foo>`.
    pub expected: Option<String>,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JSON does not match {}", self.message)?;
        if !self.path.is_empty() {
            write!(f, " at `{}`", self.path)?;
        }
        if let Some(expected) = &self.expected {
            write!(f, " (a field of type {expected})")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for JsonError {}

/// A message from a JSON value (field names in lowerCamelCase or as in the `.proto`;
/// unknown fields are refused).
pub fn from_value(
    descriptor: &MessageDescriptor,
    mut value: serde_json::Value,
) -> Result<DynamicMessage, JsonError> {
    if let Err((path, field, reason)) = normalize(descriptor, &mut value, String::new()) {
        return Err(JsonError {
            message: descriptor.full_name().to_owned(),
            path,
            expected: field.as_ref().map(type_name),
            reason,
        });
    }
    if let Some((path, field, number)) = inexact_64_bit(descriptor, &value, String::new()) {
        return Err(JsonError {
            message: descriptor.full_name().to_owned(),
            path,
            expected: Some(type_name(&field)),
            reason: format!(
                "{number} is not an exact 64-bit integer: JSON numbers with a fraction or \
                 exponent, or past the 64-bit range, are read as doubles, exact only below \
                 2^52; write it as an integer in range or as a string \
                 (\"12345678901234567890\")"
            ),
        });
    }
    if let Some((path, field)) = named_twice(descriptor, &value, String::new()) {
        return Err(JsonError {
            message: descriptor.full_name().to_owned(),
            path,
            expected: Some(type_name(&field)),
            reason: format!(
                "the field is given twice, as {:?} and as {:?}: give it once",
                field.json_name(),
                field.name()
            ),
        });
    }
    let options = DeserializeOptions::new();
    let mut track = serde_path_to_error::Track::new();
    // Kept only when it holds a -0 that prost-reflect may lose (see `wrapper_zeros`).
    let zeros = has_negative_zero(&value).then(|| value.clone());
    let deserializer = serde_path_to_error::Deserializer::new(value, &mut track);
    match DynamicMessage::deserialize_with_options(descriptor.clone(), deserializer, &options) {
        Ok(mut message) => {
            if let Some(json) = zeros {
                wrapper_zeros(&mut message, &json);
            }
            empty_anys(&mut message);
            if let Some((path, reason)) = unknown_closed(&message, String::new(), 0) {
                return Err(JsonError {
                    message: descriptor.full_name().to_owned(),
                    path,
                    expected: None,
                    reason,
                });
            }
            // Refused before it is sent, as the answer would be (a server's decoder
            // refuses it too, or runs the call and its answer does not print; from a
            // review: requests 101 to 126 deep were sent, then the answer failed).
            if let Err(why) = any_types_at(&message, &mut Vec::new(), 0) {
                return Err(JsonError {
                    message: descriptor.full_name().to_owned(),
                    path: String::new(),
                    expected: None,
                    reason: format!("{why}: protobuf decoders refuse that"),
                });
            }
            Ok(message)
        }
        Err(err) => {
            let path = track.path();
            let field = path_at(descriptor, &path).and_then(|(_, field)| field);
            Err(JsonError {
                message: descriptor.full_name().to_owned(),
                path: path_text(&path),
                expected: field.as_ref().map(type_name),
                reason: plain_reason(err.to_string(), field.as_ref(), descriptor, &path),
            })
        }
    }
}

/// The path of a number that its closed enum (proto2's, [`crate::editions::is_closed`])
/// does not define, in `message` at any depth, with why it is refused: a peer keeps
/// it among the unknown fields, and the field reads as unset (from a review: `{"e":
/// 7}` was sent, and the server saw no `e`; protobuf's own JSON parser refuses it).
fn unknown_closed(
    message: &DynamicMessage,
    path: String,
    depth: usize,
) -> Option<(String, String)> {
    if depth > MAX_DEPTH {
        return None;
    }
    let check =
        |value: &prost_reflect::Value, kind: &Kind, at: String| -> Option<(String, String)> {
            if let (Some(n), Kind::Enum(e)) = (undefined_closed(value, kind), kind) {
                return Some((
                    at,
                    format!(
                        "{n} is not a value of {}, a closed enum: a server would keep it \
                         as an unknown field and read the field as unset",
                        e.full_name()
                    ),
                ));
            }
            match value {
                prost_reflect::Value::Message(inner) => unknown_closed(inner, at, depth + 1),
                _ => None,
            }
        };
    message.fields().find_map(|(field, value)| {
        let at = if path.is_empty() {
            field.json_name().to_owned()
        } else {
            format!("{path}.{}", field.json_name())
        };
        match (value, field.kind()) {
            (prost_reflect::Value::List(items), kind) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| check(item, &kind, format!("{at}[{i}]"))),
            (prost_reflect::Value::Map(entries), Kind::Message(entry)) => {
                let kind = entry.map_entry_value_field().kind();
                entries.iter().find_map(|(key, item)| {
                    let key = match key {
                        prost_reflect::MapKey::String(text) => format!("{text:?}"),
                        prost_reflect::MapKey::Bool(b) => b.to_string(),
                        prost_reflect::MapKey::I32(n) => n.to_string(),
                        prost_reflect::MapKey::I64(n) => n.to_string(),
                        prost_reflect::MapKey::U32(n) => n.to_string(),
                        prost_reflect::MapKey::U64(n) => n.to_string(),
                    };
                    check(item, &kind, format!("{at}[{key}]"))
                })
            }
            (value, kind) => check(value, &kind, at),
        }
    })
}

/// `value`'s number if it is one that `kind`, a closed enum, does not define.
fn undefined_closed(value: &prost_reflect::Value, kind: &Kind) -> Option<i32> {
    match (value, kind) {
        (prost_reflect::Value::EnumNumber(n), Kind::Enum(e))
            if crate::editions::is_closed(e) && e.get_value(*n).is_none() =>
        {
            Some(*n)
        }
        _ => None,
    }
}

/// `message` without the numbers its closed enums do not define, at any depth, or
/// `None` if it holds none. A protobuf parser keeps such a number among the unknown
/// fields (a list's element alone, a map's whole entry), so the field reads as unset
/// and protobuf's JSON leaves it out; prost-reflect decodes it as a number (from a
/// review: a response's `{"e": 7}` printed where protobuf prints `{}`).
fn without_undefined_closed(message: &DynamicMessage) -> Option<DynamicMessage> {
    unknown_closed(message, String::new(), 0)?;
    let mut known = message.clone();
    each_message_mut(&mut known, 0, &mut |m| {
        let mut unset = Vec::new();
        for (field, value) in m.fields_mut() {
            let kind = field.kind();
            match value {
                prost_reflect::Value::List(items) => {
                    items.retain(|item| undefined_closed(item, &kind).is_none());
                }
                prost_reflect::Value::Map(entries) => {
                    if let Kind::Message(entry) = &kind {
                        let kind = entry.map_entry_value_field().kind();
                        entries.retain(|_, item| undefined_closed(item, &kind).is_none());
                    }
                }
                single => {
                    if undefined_closed(single, &kind).is_some() {
                        unset.push(field.number());
                    }
                }
            }
        }
        for number in unset {
            m.clear_field_by_number(number);
        }
    });
    Some(known)
}

/// The type URL an empty `Any` (`{}`) is read and printed through: prost-reflect reads
/// and writes an `Any` with a type only. Its type is Empty's, whose value is empty too
/// (the CLI's pools hold the well-known types).
const EMPTY_ANY_URL: &str = "rpc-cli.invalid/google.protobuf.Empty";

/// Empties again the `Any` values of `message` that [`normalize`] gave
/// [`EMPTY_ANY_URL`], at any depth: `{}` is the empty Any (from a review: refused,
/// "expected '@type' field", where protobuf's parsers take it).
fn empty_anys(message: &mut DynamicMessage) {
    each_message_mut(message, 0, &mut |message| {
        let stand_in = message.descriptor().full_name() == "google.protobuf.Any"
            && message
                .get_field_by_number(1)
                .as_deref()
                .and_then(|u| u.as_str())
                == Some(EMPTY_ANY_URL);
        if stand_in {
            message.clear_field_by_number(1);
            message.clear_field_by_number(2);
        }
    });
}

/// `message` with each empty `Any` in it (no type, no value) given [`EMPTY_ANY_URL`],
/// which prost-reflect prints (it refuses an Any without a type), or `None` if it has
/// none; [`print_empty_anys`] then prints them as `{}`, protobuf's form of them (from a
/// review: a response holding one did not print).
fn typed_empty_anys(message: &DynamicMessage) -> Option<DynamicMessage> {
    let empty_any = |message: &DynamicMessage| {
        message.descriptor().full_name() == "google.protobuf.Any"
            && !message.has_field_by_number(1)
            && !message.has_field_by_number(2)
    };
    find_message(message, 0, &mut |m| empty_any(m).then_some(()))?;
    let mut typed = message.clone();
    each_message_mut(&mut typed, 0, &mut |m| {
        if empty_any(m) {
            m.set_field_by_number(1, prost_reflect::Value::String(EMPTY_ANY_URL.into()));
        }
    });
    Some(typed)
}

/// The JSON objects [`typed_empty_anys`] made, as `{}`.
fn print_empty_anys(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(object) => {
            if object.get("@type").and_then(|url| url.as_str()) == Some(EMPTY_ANY_URL) {
                object.clear();
                return;
            }
            object.values_mut().for_each(print_empty_anys);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(print_empty_anys),
        _ => {}
    }
}

/// A value [`normalize`] refuses: its path, its field (`None` for the message
/// itself), and why.
type Refused = (String, Option<FieldDescriptor>, String);

/// Puts the strings of `value` (read as `descriptor`) that proto3 JSON takes and
/// prost-reflect does not read the same way in the form it reads, or refuses them:
/// an integer written as a string with a fraction or an exponent (`"1e3"`, `"2.0"`:
/// proto3 JSON reads the string as the number it holds, prost-reflect refused it)
/// becomes its digits when whole; a `float` or `double` string must be a JSON number
/// or `"NaN"`, `"Infinity"`, `"-Infinity"` (prost-reflect took Rust's words, `"inf"`,
/// and made `"1e39"` an infinity, past the float's range); a `Timestamp` or
/// `Duration` may not have more than 9 fractional digits (prost-reflect dropped the
/// rest unseen). In fields, lists, maps, wrappers and `Any` values.
fn normalize(
    descriptor: &MessageDescriptor,
    value: &mut serde_json::Value,
    path: String,
) -> Result<(), Refused> {
    if descriptor.full_name() == "google.protobuf.Any" {
        let serde_json::Value::Object(object) = &mut *value else {
            return Ok(());
        };
        if object.is_empty() {
            // The empty Any (no type, no value), which prost-reflect cannot read: read
            // as a stand-in, emptied again after (`empty_anys`).
            object.insert("@type".to_owned(), EMPTY_ANY_URL.into());
            object.insert("value".to_owned(), serde_json::json!({}));
            return Ok(());
        }
        let empty_type = object
            .get("@type")
            .and_then(|url| url.as_str())
            .is_some_and(|url| url.rsplit('/').next() == Some("google.protobuf.Empty"));
        if empty_type && object.len() == 1 {
            // An Empty in an Any as Python, C++ and Java write it: without "value" (a
            // message's fields beside "@type", of which Empty has none).
            object.insert("value".to_owned(), serde_json::json!({}));
        }
        let Some(packed) = object
            .get("@type")
            .and_then(|url| url.as_str())
            .and_then(|url| url.rsplit('/').next())
            .and_then(|name| descriptor.parent_pool().get_message_by_name(name))
        else {
            return Ok(());
        };
        if !packed.full_name().starts_with("google.protobuf.") {
            return normalize(&packed, value, path);
        }
        return match value.get_mut("value") {
            Some(inner) => normalize(&packed, inner, format!("{path}.value")),
            None => Ok(()),
        };
    }
    if descriptor.full_name().starts_with("google.protobuf.") {
        let at = |reason: String| (path.clone(), None, reason);
        return match descriptor.full_name() {
            "google.protobuf.Timestamp" => {
                fraction_digits(value).map_err(at)?;
                leap_second(value).map_err(at)
            }
            "google.protobuf.Duration" => fraction_digits(value).map_err(at),
            "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value" => {
                integer_string(value);
                Ok(())
            }
            "google.protobuf.FloatValue" => {
                float_string(value).map_err(at)?;
                float_rounded(value);
                Ok(())
            }
            "google.protobuf.DoubleValue" => float_string(value).map_err(at),
            _ => Ok(()),
        };
    }
    let serde_json::Value::Object(fields) = value else {
        return Ok(());
    };
    for (name, value) in fields.iter_mut() {
        let Some(field) = descriptor
            .get_field_by_json_name(name)
            .or_else(|| descriptor.get_field_by_name(name))
        else {
            continue;
        };
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                continue;
            };
            let kind = entry.map_entry_value_field().kind();
            let key_kind = entry.map_entry_key_field().kind();
            if let serde_json::Value::Object(entries) = value {
                for (key, value) in entries.iter_mut() {
                    let at = format!("{here}[{key:?}]");
                    // Checked here, where the key is known: prost-reflect's error names
                    // the map only, in words about an integer.
                    if map_key(&key_kind, key).is_none() {
                        let why = match key_kind {
                            Kind::Bool => "a bool map's keys are \"true\" and \"false\"".to_owned(),
                            _ => format!(
                                "a map key of type {} is an integer in decimal digits, {}",
                                kind_name(&key_kind),
                                integer_range(&key_kind).unwrap_or_default()
                            ),
                        };
                        return Err((at, Some(field.clone()), format!("the key {key:?}: {why}")));
                    }
                    normalize_kind(&field, &kind, value, at)?;
                }
            }
        } else if let (true, serde_json::Value::Array(items)) = (field.is_list(), &mut *value) {
            for (i, value) in items.iter_mut().enumerate() {
                normalize_kind(&field, &field.kind(), value, format!("{here}[{i}]"))?;
            }
        } else {
            normalize_kind(&field, &field.kind(), value, here)?;
        }
    }
    Ok(())
}

/// [`normalize`] for one value of `field`, of `kind`.
fn normalize_kind(
    field: &FieldDescriptor,
    kind: &Kind,
    value: &mut serde_json::Value,
    path: String,
) -> Result<(), Refused> {
    match kind {
        Kind::Message(message) => normalize(message, value, path).map_err(|(path, inner, why)| {
            // A well-known type's own value: the field holding it is the one to name.
            (path, inner.or_else(|| Some(field.clone())), why)
        }),
        Kind::Float => {
            float_string(value).map_err(|why| (path, Some(field.clone()), why))?;
            float_rounded(value);
            Ok(())
        }
        Kind::Double => float_string(value).map_err(|why| (path, Some(field.clone()), why)),
        Kind::Int32
        | Kind::Sint32
        | Kind::Sfixed32
        | Kind::Uint32
        | Kind::Fixed32
        | Kind::Int64
        | Kind::Sint64
        | Kind::Sfixed64
        | Kind::Uint64
        | Kind::Fixed64 => {
            integer_string(value);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// An integer given as a string with a fraction or an exponent (`"1e3"`, `"1.50e2"`),
/// written as its digits (`"1000"`, `"150"`) when the number is whole; left as it is
/// otherwise, for prost-reflect to refuse.
fn integer_string(value: &mut serde_json::Value) {
    let serde_json::Value::String(text) = value else {
        return;
    };
    if text.contains(['.', 'e', 'E']) {
        if let Some(digits) = whole_number(text) {
            *text = digits;
        }
    }
}

/// The digits of the whole number a JSON number's text (`-1.5e3`) writes, exactly;
/// `None` if it is no JSON number, not whole, or past 128 bits.
fn whole_number(text: &str) -> Option<String> {
    // JSON's grammar (no spaces, no `+`, no leading zeros), checked by serde_json.
    serde_json::from_str::<serde_json::Number>(text).ok()?;
    if text.trim() != text {
        return None;
    }
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
        None => (text, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let scale = exponent.checked_sub(fraction.len() as i64)?;
    let digits = if scale >= 0 {
        if scale > 40 && digits.trim_start_matches('0').is_empty() {
            "0".to_owned()
        } else if scale > 40 {
            return None;
        } else {
            format!("{digits}{}", "0".repeat(scale as usize))
        }
    } else {
        // `scale` may be i64::MIN ("1e-9223372036854775808"): no negation overflow.
        let cut = usize::try_from(scale.unsigned_abs()).ok()?;
        if cut > digits.len() {
            // All the digits are below the point: whole only if they are zeros.
            digits
                .trim_start_matches('0')
                .is_empty()
                .then(String::new)?
        } else {
            let (kept, dropped) = digits.split_at(digits.len() - cut);
            if !dropped.trim_start_matches('0').is_empty() {
                return None;
            }
            kept.to_owned()
        }
    };
    let number: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    Some(if negative && number != 0 {
        format!("-{number}")
    } else {
        number.to_string()
    })
}

/// A `float` or `double` given as a string: `"NaN"`, `"Infinity"`, `"-Infinity"`, or
/// the text of a JSON number (`"1.5"`, `"1e3"`), read as that number (and checked
/// against the type's range as a number is).
fn float_string(value: &mut serde_json::Value) -> Result<(), String> {
    let serde_json::Value::String(text) = value else {
        return Ok(());
    };
    if matches!(text.as_str(), "NaN" | "Infinity" | "-Infinity") {
        return Ok(());
    }
    match serde_json::from_str::<serde_json::Number>(text) {
        Ok(number) if text.trim() == text => {
            *value = serde_json::Value::Number(number);
            Ok(())
        }
        _ => Err(format!(
            "{text:?} is not a number: write a JSON number, as a number or a string, or \
             \"NaN\", \"Infinity\", \"-Infinity\" (a string past the range of a double \
             is refused too)"
        )),
    }
}

/// A `float` past `f32::MAX` that rounds to it, as the largest float: its shortest
/// form, `3.4028235e38`, which other implementations print, is a little past it as a
/// double, and prost-reflect refused it as out of range (from a review). Past the
/// rounding, it stays out of range.
fn float_rounded(value: &mut serde_json::Value) {
    let Some(number) = value.as_f64() else {
        return;
    };
    let rounded = number as f32;
    if number.abs() > f64::from(f32::MAX) && rounded.is_finite() {
        if let Some(max) = serde_json::Number::from_f64(f64::from(rounded)) {
            *value = serde_json::Value::Number(max);
        }
    }
}

/// A `Timestamp` string's seconds in 0..59: RFC 3339 allows 60 (a leap second), which
/// protobuf's JSON mapping refuses, and prost-reflect read as the 59th (from a review:
/// `23:59:60Z` was sent as `23:59:59Z`).
fn leap_second(value: &serde_json::Value) -> Result<(), String> {
    let Some(text) = value.as_str() else {
        return Ok(());
    };
    let seconds = text
        .split_once(['T', 't'])
        .and_then(|(_, time)| time.get(6..8));
    if seconds.is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()) && s >= "60") {
        return Err(format!(
            "{text:?}: a Timestamp's seconds are 0 to 59 (no leap second)"
        ));
    }
    Ok(())
}

/// A `Timestamp` or `Duration` string with at most 9 fractional digits (nanoseconds):
/// prost-reflect dropped those past the ninth unseen.
fn fraction_digits(value: &serde_json::Value) -> Result<(), String> {
    let Some(text) = value.as_str() else {
        return Ok(());
    };
    let Some((_, fraction)) = text.split_once('.') else {
        return Ok(());
    };
    let digits = fraction.chars().take_while(char::is_ascii_digit).count();
    if digits > 9 {
        return Err(format!(
            "{text:?} has {digits} fractional digits: at most 9 (nanoseconds)"
        ));
    }
    Ok(())
}

/// Whether a JSON value holds the number -0 anywhere.
fn has_negative_zero(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Number(n) => {
            n.as_f64().is_some_and(|n| n == 0.0 && n.is_sign_negative())
        }
        serde_json::Value::Array(items) => items.iter().any(has_negative_zero),
        serde_json::Value::Object(fields) => fields.values().any(has_negative_zero),
        _ => false,
    }
}

/// Puts back the negative zeros of the `DoubleValue` and `FloatValue` wrappers that
/// `json` (the JSON `message` was read from) gives as -0: prost-reflect reads a
/// wrapper by encoding its number as a bare `double`, which leaves -0.0 out, and it
/// read as 0; and those of the messages `Any` values pack, likewise encoded. Walks
/// nested messages, lists and maps.
fn wrapper_zeros(message: &mut DynamicMessage, json: &serde_json::Value) {
    let descriptor = message.descriptor();
    let zero = match descriptor.full_name() {
        "google.protobuf.DoubleValue" => prost_reflect::Value::F64(-0.0),
        "google.protobuf.FloatValue" => prost_reflect::Value::F32(-0.0),
        // prost-reflect packs an Any's message with its own encoding, which leaves
        // every such -0 out: the message is read and packed again.
        "google.protobuf.Any" => {
            let Some((packed, inner, well_known)) = any_packed(&descriptor, json) else {
                return;
            };
            let mut inner = inner.clone();
            if let (false, serde_json::Value::Object(fields)) = (well_known, &mut inner) {
                fields.remove("@type");
            }
            if let (Ok(packed), Some(field)) = (
                from_value(&packed, inner),
                descriptor.get_field_by_name("value"),
            ) {
                let bytes = prost::bytes::Bytes::from(encode(&packed));
                message.set_field(&field, prost_reflect::Value::Bytes(bytes));
            }
            return;
        }
        name if name.starts_with("google.protobuf.") => return,
        _ => {
            let serde_json::Value::Object(fields) = json else {
                return;
            };
            for (name, json) in fields {
                let Some(field) = descriptor
                    .get_field_by_json_name(name)
                    .or_else(|| descriptor.get_field_by_name(name))
                else {
                    continue;
                };
                let Kind::Message(entry) = field.kind() else {
                    continue;
                };
                if !message.has_field(&field) || !has_negative_zero(json) {
                    continue;
                }
                match (message.get_field_mut(&field), json) {
                    (prost_reflect::Value::Message(inner), json) => wrapper_zeros(inner, json),
                    (prost_reflect::Value::List(items), serde_json::Value::Array(array)) => {
                        // (A list drops no element of a message type: each is one.)
                        for (item, json) in items.iter_mut().zip(array) {
                            if let prost_reflect::Value::Message(inner) = item {
                                wrapper_zeros(inner, json);
                            }
                        }
                    }
                    (prost_reflect::Value::Map(entries), serde_json::Value::Object(map)) => {
                        let key_kind = entry.map_entry_key_field().kind();
                        for (key, json) in map {
                            let Some(key) = map_key(&key_kind, key) else {
                                continue;
                            };
                            if let Some(prost_reflect::Value::Message(inner)) =
                                entries.get_mut(&key)
                            {
                                wrapper_zeros(inner, json);
                            }
                        }
                    }
                    _ => {}
                }
            }
            return;
        }
    };
    if has_negative_zero(json) {
        if let Some(field) = descriptor.get_field(1) {
            message.set_field(&field, zero);
        }
    }
}

/// A map key of `kind` from its JSON form (an object's key).
fn map_key(kind: &Kind, text: &str) -> Option<prost_reflect::MapKey> {
    use prost_reflect::MapKey;
    Some(match kind {
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => MapKey::I32(text.parse().ok()?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => MapKey::I64(text.parse().ok()?),
        Kind::Uint32 | Kind::Fixed32 => MapKey::U32(text.parse().ok()?),
        Kind::Uint64 | Kind::Fixed64 => MapKey::U64(text.parse().ok()?),
        Kind::Bool => MapKey::Bool(text.parse().ok()?),
        Kind::String => MapKey::String(text.to_owned()),
        _ => return None,
    })
}

/// The values an integer kind takes, as text; `None` for other kinds.
fn integer_range(kind: &Kind) -> Option<&'static str> {
    match kind {
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Some("-2147483648 to 2147483647"),
        Kind::Uint32 | Kind::Fixed32 => Some("0 to 4294967295"),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            Some("-9223372036854775808 to 9223372036854775807")
        }
        Kind::Uint64 | Kind::Fixed64 => Some("0 to 18446744073709551615"),
        _ => None,
    }
}

/// prost-reflect's and the standard library's words for what is wrong, in a user's:
/// an integer out of its type's range names the range, one that is no integer says
/// so, and an unknown field name gets the closest names of its message.
fn plain_reason(
    reason: String,
    field: Option<&FieldDescriptor>,
    descriptor: &MessageDescriptor,
    path: &serde_path_to_error::Path,
) -> String {
    let range = field.and_then(|field| integer_range(&field.kind()));
    if let Some(range) = range {
        if reason.contains("out of range")
            || reason.contains("too large")
            || reason.contains("too small")
        {
            return format!("out of range: the field takes {range}");
        }
        if reason.contains("invalid digit") || reason.contains("cannot parse integer") {
            return format!(
                "not an integer: write decimal digits, as a number or a string, {range}"
            );
        }
    }
    // "unrecognized field name 'mesage'": the names of the message it is in.
    if let Some(name) = reason
        .split_once("unrecognized field name '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(name, _)| name.to_owned())
    {
        // The path ends at the message the unknown name is in; not at an `Any`, whose
        // JSON holds the fields of the message it packs (which the path does not
        // follow): its own fields' names would mislead.
        if let Some((message, _)) = path_at(descriptor, path)
            .filter(|(message, _)| message.full_name() != "google.protobuf.Any")
        {
            let names: Vec<String> = message.fields().map(|f| f.json_name().to_owned()).collect();
            return format!(
                "{reason}{}",
                crate::schema::suggest(&name, &names, "fields of this message")
            );
        }
    }
    reason
}

/// The first 64-bit integer field of `value` (read as `descriptor`) given as a JSON
/// number that is not an exact integer in range: one serde_json read as a double (a
/// fraction, an exponent, or past the 64-bit range) from 2^52 up, where a fraction
/// may have been rounded away, or not whole. prost-reflect would round or clamp it. Returns its path,
/// field and the number as written.
fn inexact_64_bit(
    descriptor: &MessageDescriptor,
    value: &serde_json::Value,
    path: String,
) -> Option<(String, FieldDescriptor, serde_json::Number)> {
    // An Any: the message it packs, by its `@type` (a 64-bit wrapper packed there is
    // its bare number under `value`).
    if descriptor.full_name() == "google.protobuf.Any" {
        let (packed, json, well_known) = any_packed(descriptor, value)?;
        return if well_known {
            let inner = packed.get_field_by_name("value")?;
            let wrapper = matches!(
                packed.full_name(),
                "google.protobuf.Int64Value" | "google.protobuf.UInt64Value"
            );
            wrapper
                .then(|| inexact_in(&inner, json, format!("{path}.value")))
                .flatten()
        } else {
            inexact_64_bit(&packed, json, path)
        };
    }
    // A 64-bit wrapper as the message itself (a method's request type): its JSON
    // form is the bare number (found in review: 9007199254740993.0 went out as
    // ...992, where the same number in a field was refused).
    if matches!(
        descriptor.full_name(),
        "google.protobuf.Int64Value" | "google.protobuf.UInt64Value"
    ) {
        let inner = descriptor.get_field_by_name("value")?;
        return inexact_in(&inner, value, path);
    }
    let serde_json::Value::Object(fields) = value else {
        return None;
    };
    // Well-known types have JSON forms of their own (a 64-bit wrapper's, a bare
    // number, is checked by `inexact_in`).
    if descriptor.full_name().starts_with("google.protobuf.") {
        return None;
    }
    for (here, field, value) in named_fields(descriptor, fields, &path) {
        let found = if field.is_map() {
            let Kind::Message(entry) = field.kind() else {
                continue;
            };
            let value_field = entry.map_entry_value_field();
            match value {
                serde_json::Value::Object(entries) => entries
                    .iter()
                    .find_map(|(key, v)| inexact_in(&value_field, v, format!("{here}[{key:?}]"))),
                _ => None,
            }
        } else if field.is_list() {
            match value {
                serde_json::Value::Array(items) => items
                    .iter()
                    .enumerate()
                    .find_map(|(i, v)| inexact_in(&field, v, format!("{here}[{i}]"))),
                _ => None,
            }
        } else {
            inexact_in(&field, value, here)
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// The path and field of a field an object of `descriptor`'s names twice, once by its
/// lowerCamelCase name and once by its `.proto` name (both are accepted, and
/// prost-reflect kept the last one), in `value` or the messages inside it.
fn named_twice(
    descriptor: &MessageDescriptor,
    value: &serde_json::Value,
    path: String,
) -> Option<(String, FieldDescriptor)> {
    if descriptor.full_name() == "google.protobuf.Any" {
        return match any_packed(descriptor, value)? {
            (packed, json, false) => named_twice(&packed, json, path),
            _ => None,
        };
    }
    let serde_json::Value::Object(fields) = value else {
        return None;
    };
    if descriptor.full_name().starts_with("google.protobuf.") {
        return None; // JSON forms of their own
    }
    for (here, field, value) in named_fields(descriptor, fields, &path) {
        if field.json_name() != field.name()
            && fields.contains_key(field.json_name())
            && fields.contains_key(field.name())
        {
            return Some((here, field));
        }
        let Kind::Message(inner) = field.kind() else {
            continue;
        };
        let found = match value {
            serde_json::Value::Object(entries) if field.is_map() => {
                let Kind::Message(entry) = entry_kind(&inner) else {
                    continue;
                };
                entries
                    .iter()
                    .find_map(|(key, v)| named_twice(&entry, v, format!("{here}[{key:?}]")))
            }
            serde_json::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, v)| named_twice(&inner, v, format!("{here}[{i}]"))),
            _ => named_twice(&inner, value, here),
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// What an `Any`'s JSON `value` packs: the message type its `@type` names (looked up in
/// `any`'s pool), the JSON of that message (the object itself, or its `value` for a
/// well-known type with a JSON form of its own: proto3 JSON's rule for `Any`), and
/// whether it is such a well-known type. `None` without a `@type` the pool has.
fn any_packed<'a>(
    any: &MessageDescriptor,
    value: &'a serde_json::Value,
) -> Option<(MessageDescriptor, &'a serde_json::Value, bool)> {
    let serde_json::Value::Object(object) = value else {
        return None;
    };
    let url = object.get("@type")?.as_str()?;
    let packed = any
        .parent_pool()
        .get_message_by_name(url.rsplit('/').next()?)?;
    if packed.full_name().starts_with("google.protobuf.") {
        Some((packed, object.get("value")?, true))
    } else {
        Some((packed, value, false))
    }
}

/// The entries of a message's JSON object that name a field of `descriptor` (by its
/// lowerCamelCase or its `.proto` name), each with its path below `path` and the field.
fn named_fields<'a>(
    descriptor: &'a MessageDescriptor,
    fields: &'a serde_json::Map<String, serde_json::Value>,
    path: &'a str,
) -> impl Iterator<Item = (String, FieldDescriptor, &'a serde_json::Value)> + 'a {
    fields.iter().filter_map(move |(name, value)| {
        let field = descriptor
            .get_field_by_json_name(name)
            .or_else(|| descriptor.get_field_by_name(name))?;
        let here = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        Some((here, field, value))
    })
}

/// The kind of a map entry's value.
fn entry_kind(entry: &MessageDescriptor) -> Kind {
    entry.map_entry_value_field().kind()
}

/// [`inexact_64_bit`] for one value of `field`.
fn inexact_in(
    field: &FieldDescriptor,
    value: &serde_json::Value,
    path: String,
) -> Option<(String, FieldDescriptor, serde_json::Number)> {
    match (field.kind(), value) {
        (Kind::Message(message), serde_json::Value::Number(_))
            if matches!(
                message.full_name(),
                "google.protobuf.Int64Value" | "google.protobuf.UInt64Value"
            ) =>
        {
            let inner = message.get_field_by_name("value")?;
            inexact_in(&inner, value, path)
        }
        (Kind::Message(message), _) => inexact_64_bit(&message, value, path),
        (
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64,
            serde_json::Value::Number(number),
        ) => {
            // A number serde_json read as a double: exact only below 2^52, where a
            // double still holds fractions (above it, a fraction would have been
            // rounded away unseen).
            let double = number.as_f64()?;
            let exact = number.is_i64()
                || number.is_u64()
                || (double.fract() == 0.0 && double.abs() < (1u64 << 52) as f64);
            (!exact).then(|| (path, field.clone(), number.clone()))
        }
        _ => None,
    }
}

/// A message from JSON text holding exactly one value.
pub fn from_str(descriptor: &MessageDescriptor, text: &str) -> Result<DynamicMessage, JsonError> {
    let Unique(value) = serde_json::from_str(text).map_err(|err| JsonError {
        message: descriptor.full_name().to_owned(),
        path: String::new(),
        expected: None,
        reason: format!("not JSON: {err}"),
    })?;
    from_value(descriptor, value)
}

/// The JSON values of a reader, one after the other (JSON lines, or values separated
/// by any whitespace), each as soon as it is complete.
pub fn values<R: Read>(reader: R) -> impl Iterator<Item = Result<serde_json::Value, String>> {
    serde_json::Deserializer::from_reader(reader)
        .into_iter::<Unique>()
        .map(|value| {
            value
                .map(|Unique(value)| value)
                .map_err(|err| format!("not JSON: {err}"))
        })
}

/// Hands `each` the JSON values of `reader` in turn (JSON lines, or values separated
/// by any whitespace), each as soon as it is complete; with `arrays`, a value that is
/// an array is handed over as its elements, each as soon as it is complete. Stops at
/// the input's end, at its first error (handed over), or when `each` says so (returns
/// `false`). An array is never held whole (from a review: 2 million requests in one
/// array took 972 MB, and the first was sent only once the `]` was read).
pub fn each_value<R: Read>(
    reader: R,
    arrays: bool,
    each: &mut dyn FnMut(Result<serde_json::Value, String>) -> bool,
) {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_reader(reader);
    let mut stopped = false;
    // `end` reads past whitespace to the next value, and says whether there is none.
    while de.end().is_err() {
        let top = Top {
            arrays,
            each: &mut *each,
            stopped: &mut stopped,
        };
        if let Err(err) = top.deserialize(&mut de) {
            if !stopped {
                each(Err(format!("not JSON: {err}")));
            }
            return;
        }
        if stopped {
            return;
        }
    }
}

/// One top-level value of [`each_value`]'s input, handed over as it is read.
struct Top<'a> {
    arrays: bool,
    each: &'a mut dyn FnMut(Result<serde_json::Value, String>) -> bool,
    /// `each` said to stop: the error that ends the reading is not the input's.
    stopped: &'a mut bool,
}

impl Top<'_> {
    fn hand<E: serde::de::Error>(&mut self, value: serde_json::Value) -> Result<(), E> {
        if (self.each)(Ok(value)) {
            Ok(())
        } else {
            *self.stopped = true;
            Err(E::custom("stopped"))
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Top<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Top<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: serde::de::Error>(mut self, v: bool) -> Result<(), E> {
        self.hand(v.into())
    }
    fn visit_i64<E: serde::de::Error>(mut self, v: i64) -> Result<(), E> {
        self.hand(v.into())
    }
    fn visit_u64<E: serde::de::Error>(mut self, v: u64) -> Result<(), E> {
        self.hand(v.into())
    }
    fn visit_f64<E: serde::de::Error>(mut self, v: f64) -> Result<(), E> {
        let value = serde::de::Visitor::visit_f64::<E>(UniqueVisit, v)?;
        self.hand(value)
    }
    fn visit_str<E: serde::de::Error>(mut self, v: &str) -> Result<(), E> {
        self.hand(v.into())
    }
    fn visit_string<E: serde::de::Error>(mut self, v: String) -> Result<(), E> {
        self.hand(v.into())
    }
    fn visit_unit<E: serde::de::Error>(mut self) -> Result<(), E> {
        self.hand(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, seq: A) -> Result<(), A::Error> {
        if !self.arrays {
            let value = UniqueVisit.visit_seq(seq)?;
            return self.hand(value);
        }
        let mut seq = seq;
        while let Some(Unique(item)) = seq.next_element()? {
            self.hand(item)?;
        }
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, map: A) -> Result<(), A::Error> {
        let value = UniqueVisit.visit_map(map)?;
        self.hand(value)
    }
}

/// A JSON value in which no object has the same key twice: a `serde_json::Value`
/// keeps the last of them, and a field given twice lost its first value unseen
/// (protobuf's JSON parsers, Go's protojson under grpcurl among them, refuse it).
struct Unique(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Unique {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueVisit).map(Unique)
    }
}

/// [`Unique`]'s visitor.
struct UniqueVisit;

impl<'de> serde::de::Visitor<'de> for UniqueVisit {
    type Value = serde_json::Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, Into::into))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        <Unique as serde::Deserialize>::deserialize(d).map(|Unique(v)| v)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Unique(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(items.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Unique(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key {key:?} is given twice in one object"
                )));
            }
            object.insert(key, value);
        }
        Ok(object.into())
    }
}

/// The path as `a.b[2]`.
fn path_text(path: &serde_path_to_error::Path) -> String {
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Enum { variant } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(variant);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// The field a path ends at (`None` for the empty path), and the innermost message it
/// reached, walking the descriptors (map values and list elements included); `None`
/// if the path leaves the schema (an unknown field).
fn path_at(
    descriptor: &MessageDescriptor,
    path: &serde_path_to_error::Path,
) -> Option<(MessageDescriptor, Option<FieldDescriptor>)> {
    let mut message = descriptor.clone();
    let mut field: Option<FieldDescriptor> = None;
    // Inside a map field, the next key is a map key, not a field name.
    let mut in_map = false;
    for segment in path.iter() {
        match segment {
            Segment::Map { key } => {
                if in_map {
                    in_map = false;
                    let value = field.as_ref()?.kind();
                    let entry = value.as_message()?.map_entry_value_field();
                    if let Kind::Message(m) = entry.kind() {
                        message = m;
                    }
                    field = Some(entry);
                    continue;
                }
                let next = message
                    .get_field_by_json_name(key)
                    .or_else(|| message.get_field_by_name(key))?;
                if next.is_map() {
                    in_map = true;
                } else if let Kind::Message(m) = next.kind() {
                    message = m;
                }
                field = Some(next);
            }
            Segment::Seq { .. } => {}
            Segment::Enum { .. } | Segment::Unknown => return None,
        }
    }
    Some((message, field))
}

/// How a field's type reads in a `.proto`: `int32`, `repeated string`,
/// `map<string, pkg.Foo>`, `pkg.Bar`.
pub fn type_name(field: &FieldDescriptor) -> String {
    if field.is_map() {
        if let Kind::Message(entry) = field.kind() {
            return format!(
                "map<{}, {}>",
                kind_name(&entry.map_entry_key_field().kind()),
                kind_name(&entry.map_entry_value_field().kind())
            );
        }
    }
    let name = kind_name(&field.kind());
    if field.is_list() {
        format!("repeated {name}")
    } else {
        name
    }
}

/// A scalar's name, or a message's or enum's full name.
pub fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => m.full_name().into(),
        Kind::Enum(e) => e.full_name().into(),
    }
}

#[cfg(test)]
mod tests {
    use super::whole_number;

    /// Values one after the other, an array's elements each on its own; each handed
    /// over as soon as it is complete: the first element of an array whose rest has
    /// not come yet is already out (from a review: the whole array was read first).
    #[test]
    fn values_are_handed_over_as_they_come() {
        let collect = |text: &str, arrays: bool| {
            let mut got = Vec::new();
            super::each_value(text.as_bytes(), arrays, &mut |value| {
                got.push(
                    value
                        .map(|v| v.to_string())
                        .unwrap_or_else(|e| format!("error: {e}")),
                );
                true
            });
            got
        };
        let input = r#"[1, {"a":2}] 3 [] {"b":[4]}"#;
        assert_eq!(
            collect(input, true),
            ["1", r#"{"a":2}"#, "3", r#"{"b":[4]}"#]
        );
        assert_eq!(
            collect(input, false),
            [r#"[1,{"a":2}]"#, "3", "[]", r#"{"b":[4]}"#]
        );
        let twice = collect(r#"[{"a":1}, {"a":1,"a":2}]"#, true);
        assert_eq!(twice[0], r#"{"a":1}"#);
        assert!(twice[1].contains("given twice"), "{twice:?}");
        let cut = collect("[1, 2", true);
        assert_eq!(cut[..2], ["1", "2"]);
        assert!(cut[2].starts_with("error: not JSON"), "{cut:?}");

        // A reader whose input stops mid-array (the pipe's writer has not sent more):
        // the element before is out already.
        struct Stalls(Vec<&'static [u8]>);
        impl std::io::Read for Stalls {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                match self.0.first_mut() {
                    Some(chunk) => {
                        let n = chunk.len().min(buf.len());
                        buf[..n].copy_from_slice(&chunk[..n]);
                        *chunk = &chunk[n..];
                        if chunk.is_empty() {
                            self.0.remove(0);
                        }
                        Ok(n)
                    }
                    None => Err(std::io::Error::other("no more yet")),
                }
            }
        }
        let mut got = Vec::new();
        super::each_value(Stalls(vec![b"[{\"m\":\"a\"},\n"]), true, &mut |value| {
            got.push(value.map(|v| v.to_string()));
            true
        });
        assert_eq!(got[0].as_deref(), Ok(r#"{"m":"a"}"#), "{got:?}");
        assert!(got[1].is_err(), "{got:?}");

        // `each` stops the reading.
        let mut seen = 0;
        super::each_value("[1, 2, 3] 4".as_bytes(), true, &mut |_| {
            seen += 1;
            seen < 2
        });
        assert_eq!(seen, 2);
    }

    /// A number a closed (proto2) enum does not define is refused, in a field, a list
    /// and a map; an open (proto3) enum takes it.
    #[test]
    fn closed_enums_take_only_their_values() {
        use protox::file::{File, FileResolver};
        struct Files;
        impl FileResolver for Files {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "c.proto" => File::from_source(
                        name,
                        "syntax = \"proto2\";\npackage c;\nenum E { A = 1; B = 2; }\n\
                         message M { optional E e = 1; repeated E l = 2; map<string, E> m = 3; }\n",
                    ),
                    _ => File::from_source(
                        name,
                        "syntax = \"proto3\";\npackage o;\nenum E { Z = 0; }\n\
                         message M { E e = 1; }\n",
                    ),
                }
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(Files);
        compiler.open_files(["c.proto", "o.proto"]).unwrap();
        let pool =
            prost_reflect::DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
                .unwrap();
        let closed = pool.get_message_by_name("c.M").unwrap();
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        assert!(super::from_value(&closed, json(r#"{"e":2,"l":[1],"m":{"k":"B"}}"#)).is_ok());
        for (text, at) in [
            (r#"{"e":7}"#, "`e`"),
            (r#"{"l":[1,9]}"#, "`l[1]`"),
            (r#"{"m":{"k":3}}"#, "`m[\"k\"]`"),
        ] {
            let err = super::from_value(&closed, json(text))
                .unwrap_err()
                .to_string();
            assert!(err.contains(at) && err.contains("closed enum"), "{err}");
        }
        let open = pool.get_message_by_name("o.M").unwrap();
        assert!(super::from_value(&open, json(r#"{"e":7}"#)).is_ok());

        // Printed (an answer's numbers come decoded, as prost-reflect reads them):
        // left out as protobuf's parsers leave them, a list's element alone, a map's
        // whole entry; an open enum's number printed.
        let printed = |descriptor: &prost_reflect::MessageDescriptor, bytes: &[u8]| {
            let message = prost_reflect::DynamicMessage::decode(descriptor.clone(), bytes).unwrap();
            super::to_json(&message, super::PrintOptions::default()).unwrap()
        };
        // e = 7; l = [1, 9, 2]; m = {"k": 3, "j": 1}
        let bytes = [
            &[0x08, 7][..],
            &[0x10, 1, 0x10, 9, 0x10, 2],
            &[0x1a, 5, 0x0a, 1, b'k', 0x10, 3],
            &[0x1a, 5, 0x0a, 1, b'j', 0x10, 1],
        ]
        .concat();
        assert_eq!(printed(&closed, &bytes), r#"{"l":["A","B"],"m":{"j":"A"}}"#);
        assert_eq!(printed(&open, &[0x08, 7]), r#"{"e":7}"#);
    }

    /// From a review, against protobuf's own JSON mapping: the shortest form of the
    /// largest float is taken (it was refused as out of range), a leap second is
    /// refused (it was sent as the 59th), and a FieldMask path that does not survive
    /// camelCase is not printed (`foo_` printed as `"foo"`).
    #[test]
    fn floats_leap_seconds_and_field_mask_paths_as_protobuf_maps_them() {
        use prost::Message as _;
        use prost_reflect::{DescriptorPool, DynamicMessage};
        let pool = DescriptorPool::global();
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        let float = pool
            .get_message_by_name("google.protobuf.FloatValue")
            .unwrap();
        for max in ["3.4028235e38", "\"3.4028235e38\"", "-3.4028235e38"] {
            let message = super::from_value(&float, json(max)).unwrap();
            let value = message.get_field_by_number(1).unwrap().as_f32().unwrap();
            assert_eq!(value.abs(), f32::MAX, "{max}");
        }
        assert!(super::from_value(&float, json("3.5e38")).is_err());
        let timestamp = pool
            .get_message_by_name("google.protobuf.Timestamp")
            .unwrap();
        for leap in ["1972-06-30T23:59:60Z", "1972-06-30T18:59:60.5-05:00"] {
            let err = super::from_value(&timestamp, json(&format!("{leap:?}"))).unwrap_err();
            assert!(err.to_string().contains("no leap second"), "{err}");
        }
        assert!(super::from_value(&timestamp, json("\"1972-06-30T23:59:59Z\"")).is_ok());
        let mask = pool
            .get_message_by_name("google.protobuf.FieldMask")
            .unwrap();
        let print = |path: &str| {
            let bytes = prost_types::FieldMask {
                paths: vec![path.to_owned()],
            }
            .encode_to_vec();
            let message = DynamicMessage::decode(mask.clone(), bytes.as_slice()).unwrap();
            super::to_json(&message, super::PrintOptions::default())
        };
        assert_eq!(print("foo_bar.baz").unwrap(), "\"fooBar.baz\"");
        for bad in ["foo_", "a__b", "fooBar", "a_1"] {
            let err = print(bad).unwrap_err();
            assert!(err.contains("has no JSON form"), "{bad}: {err}");
        }
    }

    /// The empty Any reads from and prints as `{}`, alone, in a field, a list and a
    /// map; an Empty in an Any reads without "value" too (from a review: `{}` was
    /// refused and an empty Any in a response did not print).
    #[test]
    fn the_empty_any_is_an_empty_object() {
        use prost::Message as _;
        use protox::file::{File, FileResolver, GoogleFileResolver};
        struct Files;
        impl FileResolver for Files {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "a.proto" => File::from_source(
                        name,
                        "syntax = \"proto3\";\nimport \"google/protobuf/any.proto\";\n\
                         import \"google/protobuf/empty.proto\";\n\
                         message A { google.protobuf.Any one = 1;\n\
                         repeated google.protobuf.Any list = 2;\n\
                         map<string, google.protobuf.Any> map = 3; }\n",
                    ),
                    _ => GoogleFileResolver::new().open_file(name),
                }
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(Files);
        compiler.include_imports(true);
        compiler.open_file("a.proto").unwrap();
        let pool =
            prost_reflect::DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
                .unwrap();
        let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
        let compact = super::PrintOptions {
            pretty: false,
            ..super::PrintOptions::default()
        };
        let any = pool.get_message_by_name("google.protobuf.Any").unwrap();
        let empty = super::from_value(&any, json("{}")).unwrap();
        assert!(empty.encode_to_vec().is_empty());
        assert_eq!(super::to_json(&empty, compact).unwrap(), "{}");
        let a = pool.get_message_by_name("A").unwrap();
        let text = r#"{"one":{},"list":[{},{"@type":"type.googleapis.com/google.protobuf.Empty"}],"map":{"k":{}}}"#;
        let message = super::from_value(&a, json(text)).unwrap();
        // Field 1 an empty message; field 2 an empty one, then one naming Empty;
        // field 3 an entry of key "k" and an empty value.
        let bytes = message.encode_to_vec();
        assert!(
            bytes.starts_with(&[0x0a, 0x00, 0x12, 0x00, 0x12, 0x2b]),
            "{bytes:?}"
        );
        assert_eq!(
            super::to_json(&message, compact).unwrap(),
            r#"{"one":{},"list":[{},{"@type":"type.googleapis.com/google.protobuf.Empty","value":{}}],"map":{"k":{}}}"#
        );
    }

    /// A request nested deeper than protobuf decoders take is refused before it is
    /// sent (from a review: 101 to 126 levels were sent, and only the answer failed).
    #[test]
    fn requests_nested_past_the_decoders_limit_are_refused() {
        use protox::file::{File, FileResolver};
        struct Files;
        impl FileResolver for Files {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                File::from_source(
                    name,
                    "syntax = \"proto3\";\nmessage N { N child = 1; int32 a = 2; }\n",
                )
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(Files);
        compiler.open_file("n.proto").unwrap();
        let pool =
            prost_reflect::DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
                .unwrap();
        let n = pool.get_message_by_name("N").unwrap();
        let nested = |depth: usize| {
            let text = "{\"child\":".repeat(depth) + "{\"a\":1}" + &"}".repeat(depth);
            serde_json::from_str::<serde_json::Value>(&text).unwrap()
        };
        assert!(super::from_value(&n, nested(super::MAX_DEPTH)).is_ok());
        let err = super::from_value(&n, nested(super::MAX_DEPTH + 1)).unwrap_err();
        assert!(err.to_string().contains("nest more than 100 deep"), "{err}");
    }

    /// A Duration whose seconds and nanos disagree in sign, or a Timestamp's nanos out
    /// of range, in a field, a list or a map, has no JSON form (from a review:
    /// `{seconds: 1, nanos: -1}`, a positive duration, printed `"-0.999999999s"`).
    #[test]
    fn durations_and_timestamps_that_have_no_json_form_are_not_printed() {
        use prost::Message as _;
        use prost_reflect::{DescriptorPool, DynamicMessage};
        let pool = DescriptorPool::global();
        let decode = |name: &str, bytes: Vec<u8>| {
            let desc = pool.get_message_by_name(name).unwrap();
            DynamicMessage::decode(desc, bytes.as_slice()).unwrap()
        };
        let duration = |seconds, nanos| {
            decode(
                "google.protobuf.Duration",
                prost_types::Duration { seconds, nanos }.encode_to_vec(),
            )
        };
        let print = |m: &DynamicMessage| super::to_json(m, super::PrintOptions::default());
        for (seconds, nanos) in [(1, -1), (-2, 500_000_000), (0, 1_000_000_000)] {
            let err = print(&duration(seconds, nanos)).unwrap_err();
            assert!(err.contains("has no JSON form"), "{err}");
        }
        assert_eq!(print(&duration(-1, -500_000_000)).unwrap(), "\"-1.500s\"");
        assert_eq!(print(&duration(0, -1)).unwrap(), "\"-0.000000001s\"");
        let late = prost_types::Timestamp {
            seconds: 0,
            nanos: -1,
        };
        let err = print(&decode("google.protobuf.Timestamp", late.encode_to_vec())).unwrap_err();
        assert!(err.contains("has no JSON form"), "{err}");
        // Deeper: in a list and a map.
        use protox::file::{File, FileResolver, GoogleFileResolver};
        struct Files;
        impl FileResolver for Files {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "t.proto" => File::from_source(
                        name,
                        "syntax = \"proto3\";\nimport \"google/protobuf/duration.proto\";\n\
                         message M { map<string, google.protobuf.Duration> m = 1;\n\
                         repeated google.protobuf.Duration l = 2; }\n",
                    ),
                    _ => GoogleFileResolver::new().open_file(name),
                }
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(Files);
        compiler.include_imports(true);
        compiler.open_file("t.proto").unwrap();
        let pool =
            DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set()).unwrap();
        let m = pool.get_message_by_name("M").unwrap();
        let bad = prost_types::Duration {
            seconds: 2,
            nanos: -500_000_000,
        }
        .encode_to_vec();
        let mut entry = vec![0x0a, 0x01, b'k', 0x12, bad.len() as u8];
        entry.extend_from_slice(&bad);
        let mut in_map = vec![0x0a, entry.len() as u8];
        in_map.extend_from_slice(&entry);
        let mut in_list = vec![0x12, bad.len() as u8];
        in_list.extend_from_slice(&bad);
        for bytes in [in_map, in_list] {
            let message = DynamicMessage::decode(m.clone(), bytes.as_slice()).unwrap();
            let err = print(&message).unwrap_err();
            assert!(err.contains("has no JSON form"), "{err}");
        }
    }

    /// A -0 inside a proto2 group sends the group between its START_GROUP and
    /// END_GROUP keys, as the usual encoder does (from a review: the encoder that keeps
    /// -0 wrote it as a length-delimited field, which a server drops or refuses).
    #[test]
    fn a_negative_zero_inside_a_group_keeps_the_groups_wire_type() {
        use prost_reflect::ReflectMessage as _;
        use protox::file::{File, FileResolver};
        struct Files;
        impl FileResolver for Files {
            fn open_file(&self, name: &str) -> Result<File, protox::Error> {
                match name {
                    "g.proto" => File::from_source(
                        name,
                        "syntax = \"proto2\";\npackage g;\nimport \"p.proto\";\n\
                         message Req { optional group G = 1 { optional p.P3 p = 2; } }\n",
                    ),
                    "p.proto" => File::from_source(
                        name,
                        "syntax = \"proto3\";\npackage p;\nmessage P3 { double d = 1; }\n",
                    ),
                    _ => Err(protox::Error::file_not_found(name)),
                }
            }
        }
        let mut compiler = protox::Compiler::with_file_resolver(Files);
        compiler.include_imports(true);
        compiler.open_file("g.proto").unwrap();
        let pool =
            prost_reflect::DescriptorPool::from_file_descriptor_set(compiler.file_descriptor_set())
                .unwrap();
        let req = pool.get_message_by_name("g.Req").unwrap();
        let mut message = prost_reflect::DynamicMessage::new(req);
        let group = message.descriptor().get_field(1).unwrap();
        let mut inner = prost_reflect::DynamicMessage::new(match group.kind() {
            prost_reflect::Kind::Message(m) => m,
            _ => unreachable!(),
        });
        let p = inner.descriptor().get_field(2).unwrap();
        let mut p3 = prost_reflect::DynamicMessage::new(match p.kind() {
            prost_reflect::Kind::Message(m) => m,
            _ => unreachable!(),
        });
        p3.set_field_by_number(1, prost_reflect::Value::F64(-0.0));
        inner.set_field(&p, prost_reflect::Value::Message(p3));
        message.set_field(&group, prost_reflect::Value::Message(inner));
        let bytes = super::encode(&message);
        // Field 1 START_GROUP (0x0b), field 2 of the group (0x12, length 9) holding
        // field 1 fixed64 -0 (0x09, 8 bytes, the sign bit last), field 1 END_GROUP (0x0c).
        let mut expected = vec![0x0b, 0x12, 0x09, 0x09];
        expected.extend_from_slice(&(-0.0f64).to_le_bytes());
        expected.push(0x0c);
        assert_eq!(bytes, expected);
        // And it decodes back to the -0.
        let back = prost_reflect::DynamicMessage::decode(message.descriptor(), &bytes[..]).unwrap();
        assert_eq!(back, message);
    }

    /// An exponent at i64's edge is refused or read as zero, without overflowing in the
    /// scale's negation (from a review: `"1e-9223372036854775808"` panicked in a debug
    /// build).
    #[test]
    fn whole_numbers_at_the_exponents_edges() {
        assert_eq!(whole_number("1e-9223372036854775808"), None);
        assert_eq!(whole_number("1.0e-9223372036854775807"), None);
        assert_eq!(whole_number("0e-9223372036854775808").as_deref(), Some("0"));
        assert_eq!(whole_number("1e3").as_deref(), Some("1000"));
        assert_eq!(whole_number("2.50e1").as_deref(), Some("25"));
        assert_eq!(whole_number("1.5"), None);
    }
}
