//! [`Address`]: `tcp://host:port` and `unix:///path` URIs.

use std::{fmt, path::PathBuf, str::FromStr};

use rpc_core::Error;

use crate::invalid;

/// Where a stream link connects or listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    /// `tcp://host:port`: the `host:port` part, as given (resolved at connect time).
    Tcp(String),
    /// `unix:///path`: an absolute socket path.
    Unix(PathBuf),
}

impl FromStr for Address {
    type Err = Error;

    fn from_str(uri: &str) -> Result<Address, Error> {
        let Some((scheme, rest)) = uri.split_once("://") else {
            return Err(invalid(uri, "expected tcp://host:port or unix:///path"));
        };
        match scheme {
            "tcp" => {
                let authority = rest.strip_suffix('/').unwrap_or(rest);
                if authority.contains('/') || authority.contains('?') || authority.contains('#') {
                    return Err(invalid(uri, "a tcp:// address has no path"));
                }
                let (host, port) = authority
                    .rsplit_once(':')
                    .ok_or_else(|| invalid(uri, "missing :port"))?;
                if host.is_empty() {
                    return Err(invalid(uri, "missing host"));
                }
                if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
                    return Err(invalid(
                        uri,
                        "IPv6 addresses go in brackets: tcp://[::1]:7000",
                    ));
                }
                port.parse::<u16>()
                    .map_err(|_| invalid(uri, "port must be a number from 0 to 65535"))?;
                Ok(Address::Tcp(authority.to_owned()))
            }
            "unix" => {
                if !rest.starts_with('/') {
                    return Err(invalid(
                        uri,
                        "a unix:// path must be absolute: unix:///run/app.sock",
                    ));
                }
                Ok(Address::Unix(PathBuf::from(rest)))
            }
            other => Err(invalid(
                uri,
                &format!(
                    "scheme {other:?} is not served by this transport (use tcp:// or unix://)"
                ),
            )),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(addr) => write!(f, "tcp://{addr}"),
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_and_unix() {
        assert_eq!(
            "tcp://127.0.0.1:7000".parse::<Address>().unwrap(),
            Address::Tcp("127.0.0.1:7000".into())
        );
        assert_eq!(
            "tcp://[::1]:7000".parse::<Address>().unwrap(),
            Address::Tcp("[::1]:7000".into())
        );
        assert_eq!(
            "tcp://localhost:1/".parse::<Address>().unwrap(),
            Address::Tcp("localhost:1".into())
        );
        assert_eq!(
            "unix:///tmp/a.sock".parse::<Address>().unwrap(),
            Address::Unix("/tmp/a.sock".into())
        );
        assert_eq!(
            "unix:///tmp/a.sock".parse::<Address>().unwrap().to_string(),
            "unix:///tmp/a.sock"
        );
    }

    #[test]
    fn malformed_uris_say_what_is_wrong() {
        for (uri, words) in [
            ("127.0.0.1:7000", "expected tcp://"),
            ("tcp://127.0.0.1", "missing :port"),
            ("tcp://:7000", "missing host"),
            ("tcp://h:99999", "port must be"),
            ("tcp://::1:7000", "brackets"),
            ("tcp://h:1/path", "no path"),
            ("unix://relative.sock", "absolute"),
            ("udp://h:1", "not served"),
        ] {
            let err = uri.parse::<Address>().unwrap_err().to_string();
            assert!(err.contains(words), "{uri}: {err}");
        }
    }
}
