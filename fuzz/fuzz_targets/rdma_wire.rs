//! One RDMA link message as it sits in a receive buffer (`rpc-transport-rdma`'s
//! `wire` module): never a panic; an accepted rendezvous announcement adds up.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rpc_transport_rdma::fuzzing::link_message(data);
});
