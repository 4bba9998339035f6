//! The transports' own counters as metrics: what UDP and RDMA count below the core
//! (retransmissions, losses, the round-trip estimate; eager and rendezvous frames,
//! waits for credit), labelled by `listener`. Read from the handles
//! [`AnyListener::transport_stats`](rpc_connect::AnyListener::transport_stats) hands
//! out, every time the server's own counters are (see `metrics::record_stats`).

use std::sync::atomic::Ordering::Relaxed;

use metrics::{describe_counter, describe_gauge, Unit};
use rpc_connect::TransportStats;

/// One listener's counters and the URI that labels them.
pub(crate) struct Listened {
    pub(crate) listener: String,
    pub(crate) stats: TransportStats,
}

const UDP_DATAGRAMS_SENT: &str = "rpc_udp_sent_datagrams_total";
const UDP_DATAGRAMS_RECEIVED: &str = "rpc_udp_received_datagrams_total";
const UDP_BYTES_SENT: &str = "rpc_udp_sent_bytes_total";
const UDP_RESENT: &str = "rpc_udp_retransmitted_fragments_total";
const UDP_RESENT_BYTES: &str = "rpc_udp_retransmitted_bytes_total";
const UDP_LOST: &str = "rpc_udp_lost_messages_total";
const UDP_DROPPED: &str = "rpc_udp_dropped_datagrams_total";
const UDP_PEERS: &str = "rpc_udp_peers";
const UDP_PEERS_REFUSED: &str = "rpc_udp_refused_peers_total";
const UDP_PEERS_EVICTED: &str = "rpc_udp_evicted_peers_total";
const UDP_UNASSOCIATED: &str = "rpc_udp_unassociated_datagrams_total";
const UDP_RETRIES: &str = "rpc_udp_retries_sent_total";
const UDP_SRTT: &str = "rpc_udp_smoothed_rtt_seconds";
const UDP_REASSEMBLY: &str = "rpc_udp_reassembly_bytes";
const RDMA_SENT: &str = "rpc_rdma_sent_frames_total";
const RDMA_RECEIVED: &str = "rpc_rdma_received_frames_total";
const RDMA_CREDIT_WAITS: &str = "rpc_rdma_credit_waits_total";
const RDMA_CREDIT_MESSAGES: &str = "rpc_rdma_credit_messages_total";
const RDMA_BATCHES: &str = "rpc_rdma_batch_messages_total";
const RDMA_PULLED: &str = "rpc_rdma_pulled_bytes_total";
const RDMA_BULK_OPS: &str = "rpc_rdma_bulk_operations_total";
const RDMA_BULK_BYTES: &str = "rpc_rdma_bulk_bytes_total";
const RDMA_BULK_FAILED: &str = "rpc_rdma_bulk_failed_total";
const RDMA_HELD: &str = "rpc_rdma_held_receive_buffers";

/// Units and `# HELP` texts of every metric of this module.
pub(crate) fn describe() {
    describe_counter!(
        UDP_DATAGRAMS_SENT,
        Unit::Count,
        "UDP datagrams the listener sent."
    );
    describe_counter!(
        UDP_DATAGRAMS_RECEIVED,
        Unit::Count,
        "UDP datagrams the listener received, before any check."
    );
    describe_counter!(
        UDP_BYTES_SENT,
        Unit::Bytes,
        "Bytes of the UDP datagrams sent."
    );
    describe_counter!(
        UDP_RESENT,
        Unit::Count,
        "UDP fragments sent again: lost, or probing for a lost acknowledgement."
    );
    describe_counter!(
        UDP_RESENT_BYTES,
        Unit::Bytes,
        "Bytes of the UDP fragments sent again, headers included."
    );
    describe_counter!(
        UDP_LOST,
        Unit::Count,
        "UDP messages lost: incomplete at the reassembly timeout, dropped."
    );
    describe_counter!(
        UDP_DROPPED,
        Unit::Count,
        "UDP datagrams dropped, by reason: malformed, duplicate (a fragment already received), over_budget (reassembly memory full), queue_full (a peer's queue full), refused (a message over the length limit)."
    );
    describe_gauge!(
        UDP_PEERS,
        Unit::Count,
        "UDP associations the listener holds now."
    );
    describe_counter!(
        UDP_PEERS_REFUSED,
        Unit::Count,
        "New UDP peers refused: every association had work in flight."
    );
    describe_counter!(
        UDP_PEERS_EVICTED,
        Unit::Count,
        "Idle UDP associations forgotten to make room for a new peer."
    );
    describe_counter!(
        UDP_UNASSOCIATED,
        Unit::Count,
        "UDP datagrams from addresses without an association (HELLOs among them), answered without state or dropped."
    );
    describe_counter!(
        UDP_RETRIES,
        Unit::Count,
        "RETRYs sent: HELLOs without a valid token."
    );
    describe_gauge!(
        UDP_SRTT,
        Unit::Seconds,
        "The smoothed round-trip time of the UDP association that last measured one."
    );
    describe_gauge!(
        UDP_REASSEMBLY,
        Unit::Bytes,
        "Bytes held now for incomplete UDP messages and frames not yet read."
    );
    describe_counter!(
        RDMA_SENT,
        Unit::Count,
        "Frames the RDMA links sent, by mode: eager (copied into a send) or rendezvous (pulled by the peer)."
    );
    describe_counter!(
        RDMA_RECEIVED,
        Unit::Count,
        "Frames the RDMA links received, by mode: eager or rendezvous."
    );
    describe_counter!(
        RDMA_CREDIT_WAITS,
        Unit::Count,
        "Times an RDMA frame waited for credit, a send buffer or a rendezvous slot."
    );
    describe_counter!(
        RDMA_CREDIT_MESSAGES,
        Unit::Count,
        "CREDIT messages the RDMA links sent (credit that found no traffic to ride on)."
    );
    describe_counter!(
        RDMA_BATCHES,
        Unit::Count,
        "BATCH messages the RDMA links sent, each carrying one or more of the eager frames."
    );
    describe_counter!(
        RDMA_PULLED,
        Unit::Bytes,
        "Bytes the RDMA links pulled with one-sided reads (rendezvous frames)."
    );
    describe_counter!(
        RDMA_BULK_OPS,
        Unit::Count,
        "One-sided bulk transfers the RDMA links made, by op: read or write."
    );
    describe_counter!(
        RDMA_BULK_BYTES,
        Unit::Bytes,
        "Bytes moved by one-sided bulk transfers."
    );
    describe_counter!(
        RDMA_BULK_FAILED,
        Unit::Count,
        "Bulk transfers that failed (refused, or the connection ended)."
    );
    describe_gauge!(
        RDMA_HELD,
        Unit::Count,
        "Receive buffers holding frames the server has not taken yet."
    );
}

/// Records every listener's counters now.
pub(crate) fn record(listened: &[Listened]) {
    for Listened { listener, stats } in listened {
        let l = listener.clone();
        match stats {
            TransportStats::Udp(s) => {
                for (name, value) in [
                    (UDP_DATAGRAMS_SENT, &s.datagrams_sent),
                    (UDP_DATAGRAMS_RECEIVED, &s.datagrams_received),
                    (UDP_BYTES_SENT, &s.bytes_sent),
                    (UDP_RESENT, &s.fragments_resent),
                    (UDP_RESENT_BYTES, &s.bytes_resent),
                    (UDP_LOST, &s.expired),
                    (UDP_PEERS_REFUSED, &s.peers_refused),
                    (UDP_PEERS_EVICTED, &s.peers_evicted),
                    (UDP_UNASSOCIATED, &s.unvalidated),
                    (UDP_RETRIES, &s.retries_sent),
                ] {
                    metrics::counter!(name, "listener" => l.clone()).absolute(value.load(Relaxed));
                }
                for (reason, value) in [
                    ("malformed", &s.malformed),
                    ("duplicate", &s.duplicate_fragments),
                    ("over_budget", &s.over_budget),
                    ("queue_full", &s.queue_full),
                    ("refused", &s.refused),
                ] {
                    metrics::counter!(UDP_DROPPED, "listener" => l.clone(), "reason" => reason)
                        .absolute(value.load(Relaxed));
                }
                metrics::gauge!(UDP_PEERS, "listener" => l.clone())
                    .set(s.peers_live.load(Relaxed) as f64);
                metrics::gauge!(UDP_REASSEMBLY, "listener" => l.clone())
                    .set(s.reassembly_bytes.load(Relaxed) as f64);
                metrics::gauge!(UDP_SRTT, "listener" => l)
                    .set(s.srtt_us.load(Relaxed) as f64 / 1e6);
            }
            TransportStats::Rdma(totals) => {
                let s = totals.snapshot();
                for (name, mode, value) in [
                    (RDMA_SENT, "eager", &s.eager_sent),
                    (RDMA_SENT, "rendezvous", &s.rendezvous_sent),
                    (RDMA_RECEIVED, "eager", &s.eager_received),
                    (RDMA_RECEIVED, "rendezvous", &s.rendezvous_received),
                ] {
                    metrics::counter!(name, "listener" => l.clone(), "mode" => mode)
                        .absolute(value.load(Relaxed));
                }
                for (op, value) in [("read", &s.bulk_reads), ("write", &s.bulk_writes)] {
                    metrics::counter!(RDMA_BULK_OPS, "listener" => l.clone(), "op" => op)
                        .absolute(value.load(Relaxed));
                }
                for (name, value) in [
                    (RDMA_CREDIT_WAITS, &s.send_waits),
                    (RDMA_CREDIT_MESSAGES, &s.credit_messages),
                    (RDMA_BATCHES, &s.batches_sent),
                    (RDMA_PULLED, &s.pulled_bytes),
                    (RDMA_BULK_BYTES, &s.bulk_bytes),
                    (RDMA_BULK_FAILED, &s.bulk_failed),
                ] {
                    metrics::counter!(name, "listener" => l.clone()).absolute(value.load(Relaxed));
                }
                metrics::gauge!(RDMA_HELD, "listener" => l).set(s.recv_held.load(Relaxed) as f64);
            }
            _ => {}
        }
    }
}
