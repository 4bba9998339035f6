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

/// Parses `-H` values (`key: value`, `key:value`) into metadata. Keys are lowercased;
/// values of keys ending in `-bin` are base64 (standard or URL-safe alphabet, padding
/// optional).
pub fn parse_headers(headers: &[String]) -> Result<Metadata, Failure> {
    let mut metadata = Metadata::new();
    for header in headers {
        let (key, value) = header
            .split_once(':')
            .ok_or_else(|| Failure::error(format!("-H {header:?}: expected `key: value`")))?;
        let key = key.trim().to_ascii_lowercase();
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
        let metadata = parse_headers(&[
            "X-User: ann".into(),
            "trace-bin:AAEC".into(),
            "pad-bin: AAE".into(),
        ])
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
        let metadata = parse_headers(&["x-k:  spaced   ".into()]).unwrap();
        assert_eq!(metadata.get_str("x-k"), Some("spaced"));
    }

    #[test]
    fn bad_headers_are_refused() {
        assert!(parse_headers(&["no-colon".into()]).is_err());
        assert!(parse_headers(&["bad key: v".into()]).is_err());
        assert!(parse_headers(&["k-bin: not base64!".into()]).is_err());
    }
}
