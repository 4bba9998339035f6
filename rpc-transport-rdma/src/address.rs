//! [`Address`]: `rdma://host:port` and `rdma+unix:///path` URIs.

use std::{fmt, path::PathBuf, str::FromStr};

use rpc_core::{
    endpoint::{Endpoint, Scheme},
    Error, ErrorKind,
};

/// Where an RDMA link connects or listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Address {
    /// `rdma://host:port`: the connection (and, with the soft provider, its messages)
    /// goes over TCP to `host:port`, as given (resolved at connect time).
    Tcp(String),
    /// `rdma+unix:///path`: the soft provider over a Unix socket (same host only).
    Unix(PathBuf),
}

const UNIX_PREFIX: &str = "rdma+unix://";

fn invalid(uri: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidAddress,
        format!("invalid address {uri:?}: {why}"),
    )
}

impl FromStr for Address {
    type Err = Error;

    fn from_str(uri: &str) -> Result<Address, Error> {
        if uri.starts_with(UNIX_PREFIX) {
            return match uri.parse::<Endpoint>()? {
                Endpoint::RdmaUnix(path) => Ok(Address::Unix(path)),
                _ => Err(invalid(
                    uri,
                    "an rdma+unix:// path must be absolute: rdma+unix:///run/app.sock",
                )),
            };
        }
        Address::try_from(&uri.parse::<Endpoint>()?)
    }
}

impl TryFrom<&Endpoint> for Address {
    type Error = Error;

    fn try_from(endpoint: &Endpoint) -> Result<Address, Error> {
        match endpoint {
            Endpoint::Host {
                scheme: Scheme::Rdma,
                host,
                port,
            } => Ok(Address::Tcp(format!("{host}:{port}"))),
            Endpoint::RdmaUnix(path) => Ok(Address::Unix(path.clone())),
            other => Err(invalid(
                &other.to_string(),
                "not served by this transport (use rdma:// or rdma+unix://; service names \
                 go through discovery first)",
            )),
        }
    }
}

impl Address {
    /// The socket under it: the soft provider's messages (and verbs' connection setup)
    /// go over a TCP or Unix stream.
    pub(crate) fn socket(&self) -> rpc_transport_tcp::Address {
        match self {
            Address::Tcp(addr) => rpc_transport_tcp::Address::Tcp(addr.clone()),
            Address::Unix(path) => rpc_transport_tcp::Address::Unix(path.clone()),
        }
    }

    /// The address of a bound socket, as an RDMA address.
    pub(crate) fn from_socket(socket: &rpc_transport_tcp::Address) -> Address {
        match socket {
            rpc_transport_tcp::Address::Tcp(addr) => Address::Tcp(addr.clone()),
            rpc_transport_tcp::Address::Unix(path) => Address::Unix(path.clone()),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(addr) => write!(f, "rdma://{addr}"),
            Address::Unix(path) => write!(f, "{UNIX_PREFIX}{}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn uri() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("rdma://"),
            Just("rdma+unix://"),
            Just("tcp://"),
            Just("static://"),
            Just("/"),
            Just(":"),
            Just("["),
            Just("]"),
            Just("::1"),
            Just("host"),
            Just("7000"),
            Just("99999"),
            Just(","),
            Just(" "),
            Just("\u{e9}"),
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
    }

    fn check(uri: &str) -> Result<(), TestCaseError> {
        match uri.parse::<Address>() {
            Ok(address) => {
                let printed = address.to_string();
                let again = printed.parse::<Address>();
                prop_assert!(again.is_ok(), "{uri:?} printed as {printed:?}: {again:?}");
                prop_assert_eq!(again.unwrap(), address);
            }
            Err(err) => prop_assert_eq!(err.kind(), ErrorKind::InvalidAddress, "{}", err),
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn arbitrary_strings_parse_or_say_why(uri in "\\PC{0,40}") {
            check(&uri)?;
        }

        #[test]
        fn uris_made_of_pieces_round_trip(uri in uri()) {
            check(&uri)?;
        }
    }

    #[test]
    fn parses_both_forms_and_says_what_is_wrong() {
        assert_eq!(
            "rdma://10.0.0.5:7000".parse::<Address>().unwrap(),
            Address::Tcp("10.0.0.5:7000".into())
        );
        assert_eq!(
            "rdma+unix:///tmp/a.sock".parse::<Address>().unwrap(),
            Address::Unix("/tmp/a.sock".into())
        );
        assert_eq!(
            "rdma+unix:///tmp/a.sock"
                .parse::<Address>()
                .unwrap()
                .to_string(),
            "rdma+unix:///tmp/a.sock"
        );
        for (uri, words) in [
            ("rdma://h", "missing :port"),
            ("rdma+unix://rel.sock", "absolute"),
            ("tcp://h:1", "not served"),
        ] {
            let err = uri.parse::<Address>().unwrap_err().to_string();
            assert!(err.contains(words), "{uri}: {err}");
        }
    }
}
