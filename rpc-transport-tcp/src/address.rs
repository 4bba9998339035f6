//! [`Address`]: `tcp://host:port` and `unix:///path` URIs.

use std::{fmt, path::PathBuf, str::FromStr};

use rpc_core::{
    endpoint::{Endpoint, Scheme},
    Error,
};

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

    /// Parses with [`Endpoint`]'s parser, then keeps what this transport serves.
    fn from_str(uri: &str) -> Result<Address, Error> {
        Address::try_from(&uri.parse::<Endpoint>()?)
    }
}

impl TryFrom<&Endpoint> for Address {
    type Error = Error;

    fn try_from(endpoint: &Endpoint) -> Result<Address, Error> {
        match endpoint {
            Endpoint::Host {
                scheme: Scheme::Tcp,
                host,
                port,
            } => Ok(Address::Tcp(format!("{host}:{port}"))),
            Endpoint::Unix(path) => Ok(Address::Unix(path.clone())),
            other => Err(invalid(
                &other.to_string(),
                "not served by this transport (use tcp:// or unix://; service names go \
                 through discovery first)",
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
            ("127.0.0.1:7000", "expected scheme"),
            ("tcp://127.0.0.1", "missing :port"),
            ("tcp://:7000", "missing host"),
            ("tcp://h:99999", "port must be"),
            ("tcp://::1:7000", "brackets"),
            ("tcp://h:1/path", "no path"),
            ("unix://relative.sock", "absolute"),
            ("udp://h:1", "not served"),
            ("dns://kv.example.com", "not served"),
        ] {
            let err = uri.parse::<Address>().unwrap_err().to_string();
            assert!(err.contains(words), "{uri}: {err}");
        }
    }
}
