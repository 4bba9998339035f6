//! `-H key: value` request metadata, and response metadata printed for `-v`.

use base64::{
    alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    Engine as _,
};
use rpc_core::{metadata::is_binary_key, Metadata, MetadataValue};

use crate::exit::Failure;

/// Standard base64, padded or not, for `-bin` values in and out.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Whether `uri` reaches its server over gRPC's wire (HTTP/2), whose headers take less
/// than the framework's own wires: printable ASCII text, and none of HTTP's and gRPC's
/// own names. (A service registered in etcd may be either: not checked here.)
pub fn over_grpc(uri: &str) -> bool {
    // Schemes are case-insensitive.
    let uri = uri.to_ascii_lowercase();
    match uri.split_once("://") {
        Some(("grpc" | "grpcs" | "dns+grpc" | "dns+grpcs", _)) => true,
        Some(("static", members)) => members.contains("grpc://") || members.contains("grpcs://"),
        _ => false,
    }
}

/// Keys the framework sets itself on every wire (`docs/wire.md` §5.2).
fn framework_key(key: &str) -> bool {
    matches!(key, "rpc-accept-encoding" | "rpc-call-key-bin")
}

/// Parses `-H` values (`key: value`, `key:value`) into metadata. Keys are lowercased;
/// values of keys ending in `-bin` are base64 (standard or URL-safe alphabet, padding
/// optional). Refused before anything is sent (exit 1): keys a wire would drop without
/// a word (the framework's own; HTTP's and gRPC's over gRPC), pseudo-headers, and over
/// gRPC text values that are not printable ASCII (the call failed `INTERNAL`, as if
/// the server had failed it).
pub fn parse_headers(headers: &[String], uri: &str) -> Result<Metadata, Failure> {
    let grpc = over_grpc(uri);
    let mut metadata = Metadata::new();
    for header in headers {
        if header.trim_start().starts_with(':') {
            return Err(Failure::error(format!(
                "-H {header:?}: pseudo-headers (:authority, :path, ...) are the transport's \
                 own and cannot be set (--authority sets gRPC's :authority, --server-name the \
                 TLS name)"
            )));
        }
        let (key, value) = header
            .split_once(':')
            .ok_or_else(|| Failure::error(format!("-H {header:?}: expected `key: value`")))?;
        let key = key.trim().to_ascii_lowercase();
        if framework_key(&key) || (grpc && rpc_transport_grpc::is_reserved_header(&key)) {
            let instead = match key.as_str() {
                "grpc-timeout" => " (use --timeout)",
                "grpc-encoding" | "grpc-accept-encoding" | "rpc-accept-encoding" => {
                    " (compression is negotiated by the transport)"
                }
                _ => "",
            };
            return Err(Failure::error(format!(
                "-H {key}: a key the transport sets itself, which it would not send{instead}"
            )));
        }
        // As HTTP reads a header: whitespace around the value is not part of it.
        let value = value.trim();
        let result = if is_binary_key(&key) {
            let bytes = BASE64
                .decode(value.trim())
                .or_else(|_| {
                    GeneralPurpose::new(
                        &alphabet::URL_SAFE,
                        GeneralPurposeConfig::new()
                            .with_decode_padding_mode(DecodePaddingMode::Indifferent),
                    )
                    .decode(value.trim())
                })
                .map_err(|err| {
                    Failure::error(format!(
                        "-H {key}: the value of a -bin key is base64, and {value:?} is not: {err}"
                    ))
                })?;
            metadata.append(key.clone(), MetadataValue::Binary(bytes.into()))
        } else {
            if grpc && !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
                return Err(Failure::error(format!(
                    "-H {key}: the value is not printable ASCII, which gRPC's headers cannot \
                     carry: send text as ASCII, or bytes base64-encoded under a key ending \
                     in -bin"
                )));
            }
            metadata.append(key.clone(), value.to_owned())
        };
        result.map_err(|err| Failure::error(format!("-H {header:?}: {err}")))?;
    }
    Ok(metadata)
}

/// Formats metadata one `key: value` line each (binary values in base64), each line
/// prefixed with `prefix`.
pub fn format(metadata: &Metadata, prefix: &str) -> String {
    let mut out = String::new();
    for (key, value) in metadata.iter() {
        let value = match value {
            MetadataValue::Text(text) => text.as_str().to_owned(),
            MetadataValue::Binary(bytes) => BASE64.encode(bytes),
        };
        // Keys and text values from a peer: escaped, so that they cannot fake a line.
        let (key, value) = (crate::exit::printable(key), crate::exit::printable(&value));
        out.push_str(&format!("{prefix}{key}: {value}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_text_and_base64_binary() {
        let metadata = parse_headers(
            &[
                "X-User: ann".into(),
                "trace-bin:AAEC".into(),
                "pad-bin: AAE".into(),
            ],
            "tcp://h:1",
        )
        .unwrap();
        assert_eq!(metadata.get_str("x-user"), Some("ann"));
        assert_eq!(metadata.get("trace-bin").unwrap().as_bytes(), &[0, 1, 2]);
        assert_eq!(metadata.get("pad-bin").unwrap().as_bytes(), &[0, 1]);
        assert_eq!(
            format(&metadata, "< "),
            "< x-user: ann\n< trace-bin: AAEC\n< pad-bin: AAE=\n"
        );
    }

    #[test]
    fn whitespace_around_a_value_is_not_part_of_it() {
        let metadata = parse_headers(&["x-k:  spaced   ".into()], "tcp://h:1").unwrap();
        assert_eq!(metadata.get_str("x-k"), Some("spaced"));
    }

    #[test]
    fn bad_headers_are_refused() {
        let parse = |header: &str, uri: &str| parse_headers(&[header.into()], uri);
        assert!(parse("no-colon", "tcp://h:1").is_err());
        assert!(parse("bad key: v", "tcp://h:1").is_err());
        assert!(parse("k-bin: not base64!", "tcp://h:1").is_err());
        assert!(parse(":authority: x", "tcp://h:1").is_err());
        assert!(parse("rpc-accept-encoding: zstd", "tcp://h:1").is_err());
    }

    /// Over gRPC, what its headers cannot carry or keep for themselves is refused
    /// before connecting; the framework's own wires carry it.
    #[test]
    fn headers_grpc_would_drop_or_refuse_are_refused_for_grpc_targets() {
        let parse = |header: &str, uri: &str| parse_headers(&[header.into()], uri);
        for uri in [
            "grpc://h:1",
            "grpcs://h:1",
            "dns+grpc://h:1",
            "static://grpc://a:1,grpc://b:1",
        ] {
            for header in [
                "x-utf8: ünï",
                "x-tab: a\tb",
                "grpc-timeout: 1S",
                "content-type: a",
                "te: x",
            ] {
                let err = parse(header, uri).unwrap_err();
                assert_eq!(err.exit_code, 1, "{header} to {uri}");
            }
            assert!(parse("user-agent: mine/1", uri).is_ok());
            assert!(parse("x-bytes-bin: AAE", uri).is_ok());
            // Not gRPC's protocol headers: sent as metadata, as the link sends them.
            assert!(parse("grpc-trace-bin: AAE", uri).is_ok(), "{uri}");
            assert!(
                parse("grpc-previous-rpc-attempts: 1", uri).is_err(),
                "{uri}"
            );
        }
        for uri in ["tcp://h:1", "udp://h:1", "static://a:1,b:1"] {
            assert!(parse("x-utf8: ünï", uri).is_ok(), "{uri}");
            assert!(parse("content-type: application/x", uri).is_ok(), "{uri}");
        }
        let timeout = parse("grpc-timeout: 1S", "grpc://h:1").unwrap_err();
        assert!(timeout.message.contains("--timeout"), "{}", timeout.message);
    }
}
