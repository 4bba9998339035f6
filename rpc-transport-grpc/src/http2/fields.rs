//! A decoded header block as HTTP/2 requires it (RFC 9113 §8.2 and §8.3): field names
//! in lower case without separators, values without NUL, CR or LF or surrounding
//! whitespace, pseudo-header fields first, each once, only those of a request (or of a
//! response), no connection-specific fields, `te` only `trailers`. A block that breaks
//! a rule is malformed: the stream is reset with `PROTOCOL_ERROR`.

use bytes::Bytes;

/// One field: name and value.
pub(crate) type Field = (Bytes, Bytes);

/// Why a block is malformed (for the log; the peer gets `PROTOCOL_ERROR`).
pub(crate) type Malformed = &'static str;

/// What a request's pseudo-header fields say.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Request {
    /// `:method`.
    pub(crate) method: Bytes,
    /// `:path`.
    pub(crate) path: Bytes,
    /// `content-length`, if given.
    pub(crate) content_length: Option<u64>,
}

/// What a response's pseudo-header field says.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Response {
    /// `:status`.
    pub(crate) status: u16,
}

/// Whether `name` is a valid field name apart from a leading `:` (RFC 9113 §8.2.1: no
/// upper case, no control characters, separators or non-ASCII).
pub(crate) fn valid_name(name: &[u8]) -> bool {
    !name.is_empty() && name.iter().all(|&b| NAME_BYTES[usize::from(b)])
}

/// The octets [`valid_name`] allows, as a table: one load per octet, where the
/// ranges took a dozen comparisons (every field of every block goes through it).
const NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = matches!(c, b'!' | b'#'..=b'\'' | b'*' | b'+' | b'-' | b'.' | b'^'..=b'`' | b'|' | b'~')
            || c.is_ascii_digit()
            || c.is_ascii_lowercase();
        b += 1;
    }
    table
};

/// Whether `value` is a valid field value (RFC 9113 §8.2.1: no NUL, CR or LF).
///
/// Spaces and tabs at either end, which RFC 9113 also calls malformed, are let through
/// on purpose: gRPC's metadata grammar allows them (an ASCII value is any run of
/// 0x20–0x7E), grpc-go, grpc-core and the h2 crate accept them, and grpc-go sends a
/// status message such as `bad input: ` in `grpc-message` as it is. Refused, such a
/// peer's status turned into INTERNAL at this client and its request metadata into a
/// reset stream at this server. (This side's own messages never end in a space:
/// [`crate::codec::percent_encode`].)
pub(crate) fn valid_value(value: &[u8]) -> bool {
    !value.iter().any(|&b| matches!(b, 0 | b'\r' | b'\n'))
}

/// Checks the regular fields (after the pseudo-header fields) of any block.
fn check_regular(name: &[u8], value: &[u8]) -> Result<(), Malformed> {
    if !valid_name(name) {
        return Err("a field name HTTP/2 does not allow (upper case, or a separator)");
    }
    if !valid_value(value) {
        return Err("a field value HTTP/2 does not allow");
    }
    match name {
        b"connection" | b"proxy-connection" | b"keep-alive" | b"transfer-encoding" | b"upgrade" => {
            Err("a connection-specific field")
        }
        b"te" if value != b"trailers" => Err("te other than \"trailers\""),
        _ => Ok(()),
    }
}

/// Checks a request's header block and reads its pseudo-header fields.
pub(crate) fn request(fields: &[Field]) -> Result<Request, Malformed> {
    let mut request = Request::default();
    let (mut method, mut scheme, mut path, mut authority) = (false, false, false, false);
    let mut regular = false;
    for (name, value) in fields {
        if let Some(pseudo) = name.strip_prefix(b":") {
            if regular {
                return Err("a pseudo-header field after a regular one");
            }
            let seen = match pseudo {
                b"method" => {
                    request.method = value.clone();
                    &mut method
                }
                b"scheme" => &mut scheme,
                b"path" => {
                    request.path = value.clone();
                    &mut path
                }
                b"authority" => &mut authority,
                _ => return Err("a pseudo-header field a request does not have"),
            };
            if std::mem::replace(seen, true) {
                return Err("a pseudo-header field twice");
            }
            if !valid_value(value) {
                return Err("a pseudo-header value HTTP/2 does not allow");
            }
            continue;
        }
        regular = true;
        check_regular(name, value)?;
        if name == "content-length" {
            let length = content_length(value).ok_or("a content-length that is not a number")?;
            if request
                .content_length
                .replace(length)
                .is_some_and(|l| l != length)
            {
                return Err("two different content-lengths");
            }
        }
    }
    if !method || request.method.is_empty() {
        return Err("a request without :method");
    }
    if request.method != "CONNECT" && (!scheme || !path || request.path.is_empty()) {
        return Err("a request without :scheme or :path");
    }
    Ok(request)
}

/// Checks a response's header block and reads its `:status`.
pub(crate) fn response(fields: &[Field]) -> Result<Response, Malformed> {
    let mut status = None;
    let mut regular = false;
    for (name, value) in fields {
        if name.first() == Some(&b':') {
            if regular {
                return Err("a pseudo-header field after a regular one");
            }
            if name != ":status" {
                return Err("a pseudo-header field a response does not have");
            }
            let code = status_code(value).ok_or("a :status that is not three digits")?;
            if status.replace(code).is_some() {
                return Err("a pseudo-header field twice");
            }
            continue;
        }
        regular = true;
        check_regular(name, value)?;
    }
    Ok(Response {
        status: status.ok_or("a response without :status")?,
    })
}

/// A `:status` value: three digits.
pub(crate) fn status_code(value: &[u8]) -> Option<u16> {
    match *value {
        [a, b, c] if [a, b, c].iter().all(u8::is_ascii_digit) => {
            Some(u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'))
        }
        _ => None,
    }
}

/// A `content-length` value: digits only (`str::parse` would take a leading `+`).
pub(crate) fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// Checks a trailer block: regular fields only.
pub(crate) fn trailers(fields: &[Field]) -> Result<(), Malformed> {
    for (name, value) in fields {
        if name.first() == Some(&b':') {
            return Err("a pseudo-header field in trailers");
        }
        check_regular(name, value)?;
    }
    Ok(())
}

/// The value of the first field named `name`.
pub(crate) fn get<'a>(fields: &'a [Field], name: &str) -> Option<&'a Bytes> {
    fields
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&'static str, &'static str)]) -> Vec<Field> {
        pairs
            .iter()
            .map(|(n, v)| {
                (
                    Bytes::from_static(n.as_bytes()),
                    Bytes::from_static(v.as_bytes()),
                )
            })
            .collect()
    }

    const GOOD: [(&str, &str); 6] = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/a.B/C"),
        (":authority", "x"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];

    #[test]
    fn a_grpc_request_passes_and_says_its_method_and_path() {
        let request = request(&fields(&GOOD)).unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/a.B/C");
        assert_eq!(request.content_length, None);
    }

    #[test]
    fn malformed_requests_are_refused() {
        let mut cases: Vec<Vec<(&str, &str)>> = Vec::new();
        let with = |extra: (&'static str, &'static str)| {
            let mut f = GOOD.to_vec();
            f.push(extra);
            f
        };
        cases.push(with(("Upper", "x")));
        cases.push(with(("connection", "close")));
        cases.push(with(("te", "gzip")));
        cases.push(with((":path", "/again")));
        cases.push(with(("x", "a\r\nb")));
        cases.push(with(("bad name", "x")));
        cases.push(with(("content-length", "12a")));
        cases.push(GOOD[1..].to_vec());
        cases.push([&GOOD[..2], &GOOD[3..]].concat());
        cases.push(vec![("x", "y"), (":method", "POST")]);
        cases.push(with((":status", "200")));
        cases.push({
            let mut f = GOOD.to_vec();
            f[2] = (":path", "");
            f
        });
        for case in cases {
            assert!(request(&fields(&case)).is_err(), "{case:?}");
        }
    }

    /// Spaces or tabs at either end of a value are taken (gRPC allows them; see
    /// [`valid_value`]); NUL, CR and LF anywhere are not.
    #[test]
    fn values_with_spaces_at_their_ends_are_taken() {
        for value in [" padded", "padded ", "\tx\t", " "] {
            let mut f = GOOD.to_vec();
            f.push(("x", value));
            assert!(request(&fields(&f)).is_ok(), "{value:?}");
        }
        assert!(!valid_value(b"a\0b"));
    }

    /// The table says what RFC 9113 §8.2.1 and RFC 9110's token allow: lower-case
    /// letters, digits and the token's symbols; no upper case, separator, control or
    /// non-ASCII octet.
    #[test]
    fn field_name_octets_are_tokens_in_lower_case() {
        let allowed: Vec<u8> = (0..=255u8).filter(|&b| valid_name(&[b])).collect();
        assert_eq!(
            allowed,
            b"!#$%&'*+-.0123456789^_`abcdefghijklmnopqrstuvwxyz|~".to_vec()
        );
        assert!(!valid_name(b""));
        assert!(valid_name(b"grpc-accept-encoding"));
        assert!(!valid_name(b"Grpc-Status"));
    }

    #[test]
    fn responses_and_trailers_are_checked() {
        assert_eq!(
            response(&fields(&[
                (":status", "200"),
                ("content-type", "application/grpc")
            ])),
            Ok(Response { status: 200 })
        );
        assert!(response(&fields(&[("content-type", "application/grpc")])).is_err());
        assert!(response(&fields(&[(":status", "20")])).is_err());
        assert!(response(&fields(&[(":status", "200"), (":path", "/")])).is_err());
        assert!(trailers(&fields(&[("grpc-status", "0")])).is_ok());
        assert!(trailers(&fields(&[(":status", "200")])).is_err());
        assert_eq!(
            get(&fields(&GOOD), "te").map(|v| &v[..]),
            Some(&b"trailers"[..])
        );
    }
}
