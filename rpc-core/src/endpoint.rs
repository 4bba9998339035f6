//! [`Endpoint`]: where a client finds a server, parsed from a URI.
//!
//! Transport addresses name one server: `tcp://host:port`, `unix:///path`,
//! `udp://host:port`, `rdma://host:port`, `rdma+unix:///path` (the soft RDMA provider
//! over a Unix socket), and TLS over the stream transports:
//! `tls://host:port` (TLS over TCP; the host is also the name the server's certificate
//! is checked against) and `tls+unix:///path` (TLS over a Unix socket). Both carry
//! exactly the byte stream of `tcp://` inside the TLS session (`docs/wire.md` §1.1).
//! `grpc://host:port` is gRPC's own wire (HTTP/2 with prior knowledge, `docs/grpc.md`),
//! `grpcs://host:port` the same over TLS (ALPN `h2`).
//! Service names are resolved through discovery
//! into transport addresses: `static://a,b,c` (a fixed list), `dns://name[:port]`
//! (A/AAAA records with the port, SRV records without one) and
//! `etcd://host:port[,host:port...]/service-name`.
//!
//! Parsing only checks the syntax; whether a transport or resolver is available is
//! decided by whoever connects. Every error says what is wrong and what was expected.

use std::{fmt, path::PathBuf, str::FromStr};

use crate::{Error, ErrorKind};

/// The transport of a transport address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `tcp://`
    Tcp,
    /// `unix://`
    Unix,
    /// `udp://`
    Udp,
    /// `rdma://`
    Rdma,
    /// `tls://`: TLS over TCP.
    Tls,
    /// `grpc://`: gRPC's own wire, HTTP/2 with prior knowledge (h2c) over TCP.
    Grpc,
    /// `grpcs://`: gRPC's own wire over TLS (ALPN `h2`); the host is also the name the
    /// server's certificate is checked against.
    Grpcs,
}

impl Scheme {
    /// The URI scheme (`"tcp"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::Unix => "unix",
            Scheme::Udp => "udp",
            Scheme::Rdma => "rdma",
            Scheme::Tls => "tls",
            Scheme::Grpc => "grpc",
            Scheme::Grpcs => "grpcs",
        }
    }
}

/// Where to reach a server, or how to find the servers of a service.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// One server: `tcp://`, `tls://`, `grpc://`, `udp://` or `rdma://` with `host:port` (the host is a
    /// name, an IPv4 address or a bracketed IPv6 address, kept as written).
    Host {
        /// The transport.
        scheme: Scheme,
        /// Host name or address, IPv6 in brackets.
        host: String,
        /// Port.
        port: u16,
    },
    /// One server on a Unix domain socket.
    Unix(PathBuf),
    /// One server on a Unix domain socket, with TLS (`tls+unix:///path`).
    TlsUnix(PathBuf),
    /// One server reached by the soft RDMA provider over a Unix domain socket
    /// (`rdma+unix:///path`; same host only).
    RdmaUnix(PathBuf),
    /// A fixed list of servers (`static://tcp://a:1,tcp://b:1`; an element without a
    /// scheme is TCP: `static://a:1,b:1`).
    Static(Vec<Endpoint>),
    /// Servers found in DNS: with a port, the name's A/AAAA records at that port;
    /// without one, its SRV records. `transport` is the scheme of the addresses found
    /// (`dns://name` is TCP; `dns+udp://name` is UDP).
    Dns {
        /// The transport of the resolved addresses.
        transport: Scheme,
        /// The name to resolve.
        name: String,
        /// The port for A/AAAA lookups; `None` means SRV.
        port: Option<u16>,
    },
    /// Servers registered in etcd under a service name.
    Etcd {
        /// The etcd cluster's client addresses (`host:port`).
        cluster: Vec<String>,
        /// The service name (the key prefix the servers register under).
        service: String,
    },
}

fn invalid(uri: &str, why: impl fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidAddress,
        format!("invalid endpoint {uri:?}: {why}"),
    )
}

/// The longest Unix socket path (Linux's `sun_path`, 108 bytes with its final NUL).
const MAX_UNIX_PATH: usize = 107;

/// What `err` (an [`invalid`] error) says is wrong, without the URI it names.
fn reason(err: &Error) -> String {
    let text = err.to_string();
    match text.split_once("\": ") {
        Some((_, why)) => why.to_owned(),
        None => text,
    }
}

/// Splits `host:port`, checking both.
fn host_port(uri: &str, authority: &str) -> Result<(String, u16), Error> {
    if authority.contains('/') || authority.contains('?') || authority.contains('#') {
        return Err(invalid(
            uri,
            "a host address has no path, query or fragment",
        ));
    }
    if authority.contains(char::is_whitespace) {
        return Err(invalid(uri, "the address has spaces in it"));
    }
    if authority.contains('@') {
        return Err(invalid(
            uri,
            "user names and passwords have no place in an address: host:port only",
        ));
    }
    // A bracketed IPv6 address whose port is missing ends with `]`.
    if authority.starts_with('[') && authority.ends_with(']') {
        return Err(invalid(uri, "missing :port"));
    }
    let (host, port) = authority
        .rsplit_once(':')
        .ok_or_else(|| invalid(uri, "missing :port"))?;
    if host.is_empty() {
        return Err(invalid(uri, "missing host"));
    }
    if let Some(inner) = host.strip_prefix('[') {
        // An IPv6 address, perhaps with a zone (`%2`; a name, `%eth0`, resolves over UDP only).
        let address = inner
            .strip_suffix(']')
            .map(|inner| inner.split_once('%').map_or(inner, |(address, _)| address));
        if address.is_none_or(|address| address.parse::<std::net::Ipv6Addr>().is_err()) {
            return Err(invalid(
                uri,
                "brackets hold an IPv6 address only: tcp://[::1]:7000",
            ));
        }
    } else if host.contains(':') {
        return Err(invalid(
            uri,
            "IPv6 addresses go in brackets: tcp://[::1]:7000",
        ));
    }
    if host.contains(',') {
        return Err(invalid(uri, "the host has commas in it"));
    }
    Ok((host.to_owned(), parse_port(uri, port)?))
}

/// A port: decimal digits only (no sign, as `u16`'s parser would take), 0 to 65535.
fn parse_port(uri: &str, port: &str) -> Result<u16, Error> {
    port.bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .ok_or_else(|| invalid(uri, "the port must be a number from 0 to 65535"))
}

/// `uri` with its scheme in lowercase, the form this crate and the transports match
/// schemes in: schemes are case-insensitive (RFC 3986 §3.1), so `TCP://h:1` is
/// `tcp://h:1`. For code that dispatches on a URI's scheme before parsing it (an
/// [`Endpoint`] parsed from either is the same). Borrowed when already lowercase.
///
/// ```
/// assert_eq!(rpc_core::endpoint::lowercase_scheme("GRPC://h:1"), "grpc://h:1");
/// ```
pub fn lowercase_scheme(uri: &str) -> std::borrow::Cow<'_, str> {
    match uri.split_once("://") {
        Some((scheme, rest)) if scheme.bytes().any(|b| b.is_ascii_uppercase()) => {
            format!("{}://{rest}", scheme.to_ascii_lowercase()).into()
        }
        _ => uri.into(),
    }
}

/// A static list's scheme and separator, refused inside a list (any case).
const STATIC: &str = "static://";

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(uri: &str) -> Result<Endpoint, Error> {
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(invalid(
                uri,
                "expected scheme://...: tcp, tls, grpc, grpcs, unix, tls+unix, udp, rdma, \
                 rdma+unix, static, dns or etcd",
            ));
        };
        // Schemes are case-insensitive (RFC 3986 §3.1); lowercase is the canonical
        // form, which `Display` writes.
        let lowered;
        let scheme = if scheme.bytes().any(|b| b.is_ascii_uppercase()) {
            lowered = scheme.to_ascii_lowercase();
            lowered.as_str()
        } else {
            scheme
        };
        let host = |scheme| {
            let authority = rest.strip_suffix('/').unwrap_or(rest);
            let (host, port) = host_port(uri, authority)?;
            Ok(Endpoint::Host { scheme, host, port })
        };
        match scheme {
            "tcp" => host(Scheme::Tcp),
            "tls" => host(Scheme::Tls),
            "grpc" => host(Scheme::Grpc),
            "grpcs" => host(Scheme::Grpcs),
            "udp" => host(Scheme::Udp),
            "rdma" => host(Scheme::Rdma),
            "unix" | "tls+unix" | "rdma+unix" => {
                if !rest.starts_with('/') || rest.len() < 2 {
                    return Err(invalid(
                        uri,
                        format!("a {scheme}:// path must be absolute: {scheme}:///run/app.sock"),
                    ));
                }
                // sun_path holds 108 bytes with the final NUL: a longer path fails
                // only at bind or connect, as an I/O error.
                if rest.len() > MAX_UNIX_PATH {
                    return Err(invalid(
                        uri,
                        format!(
                            "a Unix socket path is at most {MAX_UNIX_PATH} bytes (this one has \
                             {})",
                            rest.len()
                        ),
                    ));
                }
                let path = PathBuf::from(rest);
                Ok(match scheme {
                    "unix" => Endpoint::Unix(path),
                    "tls+unix" => Endpoint::TlsUnix(path),
                    _ => Endpoint::RdmaUnix(path),
                })
            }
            "static" => {
                if rest.is_empty() {
                    return Err(invalid(uri, "static:// needs at least one address"));
                }
                let members = rest
                    .split(',')
                    .map(|member| {
                        let member = member.trim();
                        if member.is_empty() {
                            return Err(invalid(uri, "an empty member in the list (two commas?)"));
                        }
                        let server_only = || {
                            invalid(
                                uri,
                                format!("{member:?}: a static list holds server addresses only"),
                            )
                        };
                        // Refused before parsing: parsing a nested list would recurse
                        // once per `static://`, as deep as the input is long.
                        if member
                            .get(..STATIC.len())
                            .is_some_and(|p| p.eq_ignore_ascii_case(STATIC))
                        {
                            return Err(server_only());
                        }
                        // A member's error names the list and the member as written.
                        let in_list =
                            |err: Error| invalid(uri, format!("{member:?}: {}", reason(&err)));
                        let parsed = if member.contains("://") {
                            member.parse::<Endpoint>().map_err(in_list)?
                        } else {
                            format!("tcp://{member}")
                                .parse::<Endpoint>()
                                .map_err(in_list)?
                        };
                        match parsed {
                            e @ (Endpoint::Host { .. }
                            | Endpoint::Unix(_)
                            | Endpoint::TlsUnix(_)
                            | Endpoint::RdmaUnix(_)) => Ok(e),
                            _ => Err(server_only()),
                        }
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                Ok(Endpoint::Static(members))
            }
            "dns" | "dns+tcp" | "dns+tls" | "dns+grpc" | "dns+grpcs" | "dns+udp" | "dns+rdma" => {
                let transport = match scheme {
                    "dns+grpc" => Scheme::Grpc,
                    "dns+grpcs" => Scheme::Grpcs,
                    "dns+udp" => Scheme::Udp,
                    "dns+rdma" => Scheme::Rdma,
                    "dns+tls" => Scheme::Tls,
                    _ => Scheme::Tcp,
                };
                let authority = rest.strip_suffix('/').unwrap_or(rest);
                if authority.is_empty() || authority.contains('/') {
                    return Err(invalid(uri, "expected dns://name or dns://name:port"));
                }
                let (name, port) = match authority.rsplit_once(':') {
                    Some((name, port)) => (name, Some(parse_port(uri, port)?)),
                    None => (authority, None),
                };
                // A fully qualified name's final dot (`kv.example.com.`, as zone
                // files write it, kept out of the resolver's search list) is allowed.
                let labels = name.strip_suffix('.').unwrap_or(name);
                let valid = !labels.is_empty()
                    && name.len() <= 253
                    && labels.split('.').all(|label| {
                        !label.is_empty()
                            && label.len() <= 63
                            && label
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    });
                if !valid {
                    return Err(invalid(uri, format!("{name:?} is not a DNS name")));
                }
                Ok(Endpoint::Dns {
                    transport,
                    name: name.to_owned(),
                    port,
                })
            }
            "etcd" => {
                let (cluster, service) = rest
                    .split_once('/')
                    .ok_or_else(|| invalid(uri, "expected etcd://host:port/service-name"))?;
                let service = service.trim_end_matches('/');
                if service.is_empty() {
                    return Err(invalid(uri, "missing the service name after the cluster"));
                }
                let cluster = cluster
                    .split(',')
                    .map(|member| {
                        let (host, port) = host_port(uri, member.trim())?;
                        Ok(format!("{host}:{port}"))
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                Ok(Endpoint::Etcd {
                    cluster,
                    service: service.to_owned(),
                })
            }
            other => Err(invalid(
                uri,
                format!(
                    "unknown scheme {other:?}: expected tcp, tls, grpc, grpcs, unix, tls+unix, \
                     udp, rdma, rdma+unix, static, dns or etcd"
                ),
            )),
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Host { scheme, host, port } => {
                write!(f, "{}://{host}:{port}", scheme.as_str())
            }
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            Endpoint::TlsUnix(path) => write!(f, "tls+unix://{}", path.display()),
            Endpoint::RdmaUnix(path) => write!(f, "rdma+unix://{}", path.display()),
            Endpoint::Static(members) => {
                f.write_str("static://")?;
                for (i, member) in members.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{member}")?;
                }
                Ok(())
            }
            Endpoint::Dns {
                transport,
                name,
                port,
            } => {
                match transport {
                    Scheme::Tcp => f.write_str("dns://")?,
                    other => write!(f, "dns+{}://", other.as_str())?,
                }
                f.write_str(name)?;
                if let Some(port) = port {
                    write!(f, ":{port}")?;
                }
                Ok(())
            }
            Endpoint::Etcd { cluster, service } => {
                write!(f, "etcd://{}/{service}", cluster.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(uri: &str) -> Endpoint {
        uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"))
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for uri in [
            "tcp://127.0.0.1:7000",
            "tcp://[::1]:7000",
            "tcp://db.internal:5432",
            "udp://10.0.0.5:7000",
            "rdma://node7:4791",
            "unix:///run/app.sock",
            "tls://db.internal:5432",
            "grpc://127.0.0.1:50051",
            "grpcs://api.example.com:443",
            "dns+grpcs://kv.example.com:7000",
            "tls+unix:///run/app.sock",
            "rdma+unix:///run/app.sock",
            "static://rdma+unix:///a.sock,rdma://b:1",
            "dns+tls://kv.example.com:7000",
            "dns+grpc://kv.example.com:7000",
            "static://tls://a:1,tls+unix:///s.sock,tcp://a:1,udp://b:2,unix:///s.sock",
            "dns://kv.service.consul",
            "dns://kv.example.com:7000",
            "dns+udp://kv.example.com:7000",
            "etcd://127.0.0.1:2379/kv",
            "etcd://e1:2379,e2:2379/services/kv",
            // A fully qualified name's final dot; an IPv6 zone.
            "dns://kv.example.com.:7000",
            "dns://_kv._tcp.example.com.",
            "tcp://kv.example.com.:7000",
            "tcp://[fe80::1%2]:7000",
        ] {
            assert_eq!(parse(uri).to_string(), uri);
        }
        // A member's error names the list and the member as written.
        let err = "static://a:1,b"
            .parse::<Endpoint>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("static://a:1,b") && err.contains("\"b\": missing :port"),
            "{err}"
        );
    }

    /// Schemes are case-insensitive (RFC 3986 §3.1): `TCP://` is `tcp://`, printed
    /// lowercase; a static list inside a list is refused in any case (parsed, it
    /// would recurse once per nesting, as deep as the input is long).
    #[test]
    fn schemes_in_any_case() {
        for (uri, canonical) in [
            ("TCP://h:1", "tcp://h:1"),
            ("Tls+Unix:///s.sock", "tls+unix:///s.sock"),
            ("GRPCS://h:443", "grpcs://h:443"),
            ("Static://UDP://a:1,b:2", "static://udp://a:1,tcp://b:2"),
            ("DNS+Udp://kv.example.com:7", "dns+udp://kv.example.com:7"),
            ("ETCD://e:2379/kv", "etcd://e:2379/kv"),
        ] {
            assert_eq!(parse(uri).to_string(), canonical);
        }
        let nested = format!("static://{}a:1", "STATIC://".repeat(100_000));
        let err = nested.parse::<Endpoint>().unwrap_err().to_string();
        assert!(err.contains("server addresses only"), "{}", &err[..200]);
    }

    #[test]
    fn static_members_default_to_tcp() {
        assert_eq!(
            parse("static://a:1, b:2"),
            Endpoint::Static(vec![parse("tcp://a:1"), parse("tcp://b:2")])
        );
        assert_eq!(
            parse("dns://x.y"),
            Endpoint::Dns {
                transport: Scheme::Tcp,
                name: "x.y".into(),
                port: None
            }
        );
    }

    #[test]
    fn malformed_uris_say_what_is_wrong() {
        for (uri, words) in [
            ("127.0.0.1:7000", "expected scheme"),
            ("http://h:1", "unknown scheme \"http\""),
            ("tcp://h", "missing :port"),
            ("tcp://:1", "missing host"),
            ("tcp://h:70000", "port must be"),
            ("tcp://::1:7000", "brackets"),
            ("tcp://h:1/x", "no path"),
            ("unix://rel.sock", "absolute"),
            ("tls+unix://rel.sock", "absolute"),
            ("rdma+unix://rel.sock", "absolute"),
            ("tls://h", "missing :port"),
            ("grpc://h", "missing :port"),
            ("static://", "at least one"),
            ("static://dns://x", "server addresses only"),
            ("static://a:1,b", "missing :port"),
            ("dns://", "expected dns://name"),
            ("dns://bad..name", "not a DNS name"),
            ("dns://x:port", "port must be"),
            ("etcd://h:2379", "expected etcd://host:port/service-name"),
            ("etcd://h:2379/", "missing the service name"),
            ("etcd://h/kv", "missing :port"),
            // From a review of address parsing: each says what is wrong.
            ("tcp://[::1]", "missing :port"),
            ("tcp://[fe80::1%eth0]", "missing :port"),
            ("tcp://[127.0.0.1]:7000", "IPv6 address only"),
            ("tcp://[kv.internal]:7000", "IPv6 address only"),
            ("tcp://[]:1", "IPv6 address only"),
            ("tcp://[:1", "IPv6 address only"),
            ("tcp://h:+1", "port must be"),
            ("dns://kv:+53", "port must be"),
            ("tcp://user@h:1", "user names"),
            ("tcp://user:pw@h:1", "user names"),
            ("etcd://user:pw@h:2379/kv", "user names"),
            ("tcp://h:1 ", "spaces"),
            ("static://a:1 b:2", "spaces"),
            ("static://a:1,,b:2", "empty member"),
            ("static://a:1,", "empty member"),
        ] {
            let err = uri.parse::<Endpoint>().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidAddress);
            assert!(err.to_string().contains(words), "{uri}: {err}");
        }
        let long = format!("unix:///{}", "x".repeat(120));
        let err = long.parse::<Endpoint>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidAddress);
        assert!(err.to_string().contains("at most 107 bytes"), "{err}");
    }
}
