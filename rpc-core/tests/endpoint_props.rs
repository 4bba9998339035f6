//! Property tests of URI parsing ([`Endpoint`]): no input makes the parser panic or
//! recurse without bound, errors are `InvalidAddress`, and what parses prints back to
//! a URI that parses to the same endpoint.

use proptest::prelude::*;
use rpc_core::{Endpoint, ErrorKind};

/// Pieces URIs are made of, so that generated strings get past the first checks.
fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("tcp://".to_owned()),
        Just("udp://".to_owned()),
        Just("rdma://".to_owned()),
        Just("unix://".to_owned()),
        Just("static://".to_owned()),
        Just("dns://".to_owned()),
        Just("dns+udp://".to_owned()),
        Just("etcd://".to_owned()),
        Just(":".to_owned()),
        Just("/".to_owned()),
        Just(",".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(" ".to_owned()),
        Just("?".to_owned()),
        Just("65535".to_owned()),
        Just("65536".to_owned()),
        Just("+1".to_owned()),
        Just("host".to_owned()),
        Just("::1".to_owned()),
        Just("a.b".to_owned()),
        Just(".".to_owned()),
        "\\PC{0,4}",
    ]
}

fn uri() -> impl Strategy<Value = String> {
    prop::collection::vec(piece(), 0..10).prop_map(|pieces| pieces.concat())
}

fn check(uri: &str) -> Result<(), TestCaseError> {
    match uri.parse::<Endpoint>() {
        Ok(endpoint) => {
            let printed = endpoint.to_string();
            let again = printed.parse::<Endpoint>();
            prop_assert!(again.is_ok(), "{uri:?} printed as {printed:?}: {again:?}");
            prop_assert_eq!(
                again.unwrap(),
                endpoint,
                "{:?} printed as {:?}",
                uri,
                printed
            );
        }
        Err(err) => prop_assert_eq!(err.kind(), ErrorKind::InvalidAddress, "{}", err),
    }
    Ok(())
}

proptest! {
    #[test]
    fn arbitrary_strings_never_panic(uri in "\\PC{0,60}") {
        check(&uri)?;
    }

    #[test]
    fn uris_made_of_pieces_parse_or_say_why(uri in uri()) {
        check(&uri)?;
    }
}

#[test]
fn deeply_nested_static_lists_are_refused_without_recursing() {
    // Each `static://` used to parse its member with a recursive call: a long enough
    // user-supplied URI overflowed the stack (an abort, not even a panic).
    let uri = "static://".repeat(200_000) + "tcp://h:1";
    let err = uri.parse::<Endpoint>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidAddress);
    assert!(err.to_string().contains("server addresses only"), "{err}");
}

#[test]
fn static_lists_hold_server_addresses() {
    let endpoint: Endpoint = "static://tcp://a:1,unix:///s.sock".parse().unwrap();
    assert_eq!(endpoint.to_string(), "static://tcp://a:1,unix:///s.sock");
    for uri in ["static://static://tcp://a:1", "static://a:1,static://b:2"] {
        let err = uri.parse::<Endpoint>().unwrap_err();
        assert!(
            err.to_string().contains("server addresses only"),
            "{uri}: {err}"
        );
    }
}
