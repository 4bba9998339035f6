//! A minimal authoritative DNS server on loopback (UDP, and TCP on the same port for
//! answers too large for a datagram, as real servers truncate them) whose records and
//! failures the test changes while it runs, and a follower that collects a resolution
//! stream's changes one lookup at a time.

#![allow(dead_code, unreachable_pub)]

use std::{
    collections::{BTreeSet, HashSet},
    future::Future,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    str::FromStr,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use hickory_resolver::proto::{
    op::{Message, MessageType, OpCode, ResponseCode},
    rr::{
        rdata::{A, AAAA, SRV},
        Name, RData, Record, RecordType,
    },
};
use rpc_core::balance::Change;
use rpc_discovery_dns::{DnsConfig, DnsResolver, Refresh};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, UdpSocket},
    sync::{mpsc, watch},
    task::JoinHandle,
};

/// The largest answer sent over UDP to a query without EDNS (RFC 1035): a larger one
/// goes with only its header and question, marked truncated.
const UDP_ANSWER_LIMIT: usize = 512;

/// Guards against hangs only; nothing is asserted about time.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Default TTL of the test records: longer than any test runs.
pub const TTL: u32 = 3600;

pub fn name(name: &str) -> Name {
    Name::from_str(name).unwrap()
}

pub fn srv(owner: &str, priority: u16, port: u16, target: &str) -> Record {
    Record::from_rdata(
        name(owner),
        TTL,
        RData::SRV(SRV::new(priority, 0, port, name(target))),
    )
}

pub fn a(owner: &str, ip: Ipv4Addr) -> Record {
    Record::from_rdata(name(owner), TTL, RData::A(A(ip)))
}

pub fn aaaa(owner: &str, ip: Ipv6Addr) -> Record {
    Record::from_rdata(name(owner), TTL, RData::AAAA(AAAA(ip)))
}

/// What the server does with queries.
#[derive(Default)]
struct State {
    records: Vec<Record>,
    /// Put the A and AAAA records of SRV targets in the additional section.
    glue: bool,
    /// Read queries and never answer.
    silent: bool,
    /// Answer queries of these types with `SERVFAIL`.
    servfail: HashSet<RecordType>,
    /// Answer this many more queries with `NXDOMAIN`, whatever the records say.
    nxdomain_next: usize,
    /// Every query received, in order.
    log: Vec<(Name, RecordType)>,
}

/// The DNS server. Stops when dropped.
pub struct Responder {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    received: watch::Receiver<usize>,
    task: JoinHandle<()>,
    tcp_task: JoinHandle<()>,
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.task.abort();
        self.tcp_task.abort();
    }
}

impl Responder {
    pub async fn start(records: Vec<Record>) -> Responder {
        // A UDP port whose TCP twin is free too.
        let (socket, tcp) = loop {
            let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            if let Ok(tcp) = TcpListener::bind(socket.local_addr().unwrap()).await {
                break (socket, tcp);
            }
        };
        let addr = socket.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            records,
            ..State::default()
        }));
        let (count, received) = watch::channel(0);
        let tcp_count = count.clone();
        let task = tokio::spawn({
            let state = state.clone();
            async move {
                let mut buf = vec![0; 4096];
                loop {
                    let (len, peer) = socket.recv_from(&mut buf).await.unwrap();
                    let Ok(request) = Message::from_vec(&buf[..len]) else {
                        continue;
                    };
                    let response = respond(&mut state.lock().unwrap(), &request);
                    count.send_modify(|n| *n += 1);
                    if let Some(mut response) = response {
                        let mut bytes = response.to_vec().unwrap();
                        let limit = request
                            .extensions()
                            .as_ref()
                            .map_or(UDP_ANSWER_LIMIT, |edns| usize::from(edns.max_payload()));
                        if bytes.len() > limit {
                            response.take_answers();
                            response.take_additionals();
                            response.set_truncated(true);
                            bytes = response.to_vec().unwrap();
                        }
                        let _ = socket.send_to(&bytes, peer).await;
                    }
                }
            }
        });
        let tcp_task = tokio::spawn({
            let state = state.clone();
            let count = tcp_count;
            async move {
                while let Ok((mut conn, _)) = tcp.accept().await {
                    let state = state.clone();
                    let count = count.clone();
                    tokio::spawn(async move {
                        // Two-byte length, then the message, each way (RFC 1035 4.2.2).
                        while let Ok(len) = conn.read_u16().await {
                            let mut buf = vec![0; usize::from(len)];
                            if conn.read_exact(&mut buf).await.is_err() {
                                break;
                            }
                            let Ok(request) = Message::from_vec(&buf) else {
                                break;
                            };
                            let response = respond(&mut state.lock().unwrap(), &request);
                            count.send_modify(|n| *n += 1);
                            let Some(response) = response else { continue };
                            let bytes = response.to_vec().unwrap();
                            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
                            framed.extend_from_slice(&bytes);
                            if conn.write_all(&framed).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Responder {
            addr,
            state,
            received,
            task,
            tcp_task,
        }
    }

    /// A resolver that asks only this server, with a long interval (only TTLs,
    /// failures and refreshes cause lookups) and quick retries.
    pub fn resolver(&self) -> DnsResolver {
        DnsResolver::new(DnsConfig {
            interval: Duration::from_secs(3600),
            retry_min: Duration::from_millis(10),
            retry_max: Duration::from_millis(100),
            nameservers: Some(vec![self.addr]),
            query_timeout: Some(Duration::from_millis(200)),
        })
        .unwrap()
    }

    /// [`resolver`](Self::resolver) with a first retry `retry_min` after a failure
    /// or an absence.
    pub fn resolver_retrying_after(&self, retry_min: Duration) -> DnsResolver {
        DnsResolver::new(DnsConfig {
            interval: Duration::from_secs(3600),
            retry_min,
            retry_max: retry_min,
            nameservers: Some(vec![self.addr]),
            query_timeout: Some(Duration::from_millis(200)),
        })
        .unwrap()
    }

    pub fn set_records(&self, records: Vec<Record>) {
        self.state.lock().unwrap().records = records;
    }

    pub fn set_glue(&self, glue: bool) {
        self.state.lock().unwrap().glue = glue;
    }

    pub fn set_silent(&self, silent: bool) {
        self.state.lock().unwrap().silent = silent;
    }

    pub fn set_servfail(&self, types: &[RecordType]) {
        self.state.lock().unwrap().servfail = types.iter().copied().collect();
    }

    pub fn set_nxdomain_next(&self, n: usize) {
        self.state.lock().unwrap().nxdomain_next = n;
    }

    /// The queries received so far.
    pub fn log(&self) -> Vec<(Name, RecordType)> {
        self.state.lock().unwrap().log.clone()
    }

    /// How many queries of `record_type` were received so far.
    pub fn count(&self, record_type: RecordType) -> usize {
        self.log().iter().filter(|(_, t)| *t == record_type).count()
    }

    /// Waits until the server has received at least `n` queries of `record_type`.
    pub async fn wait_for(&self, record_type: RecordType, n: usize) {
        let mut received = self.received.clone();
        tokio::time::timeout(HANG_GUARD, async {
            while self.count(record_type) < n {
                received.changed().await.unwrap();
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server never got {n} {record_type} queries"));
    }
}

fn respond(state: &mut State, request: &Message) -> Option<Message> {
    let query = request.queries().first()?.clone();
    let (qname, qtype) = (query.name().clone(), query.query_type());
    state.log.push((qname.clone(), qtype));
    if state.silent {
        return None;
    }
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(true)
        .set_recursion_desired(request.recursion_desired())
        .add_query(query);
    if state.servfail.contains(&qtype) {
        response.set_response_code(ResponseCode::ServFail);
        return Some(response);
    }
    if state.nxdomain_next > 0 {
        state.nxdomain_next -= 1;
        response.set_response_code(ResponseCode::NXDomain);
        return Some(response);
    }
    let answers: Vec<Record> = state
        .records
        .iter()
        .filter(|r| *r.name() == qname && r.record_type() == qtype)
        .cloned()
        .collect();
    if answers.is_empty() && !state.records.iter().any(|r| *r.name() == qname) {
        response.set_response_code(ResponseCode::NXDomain);
    }
    if state.glue {
        for answer in &answers {
            if let RData::SRV(srv) = answer.data() {
                for glue in state
                    .records
                    .iter()
                    .filter(|r| r.name() == srv.target() && r.record_type().is_ip_addr())
                {
                    response.add_additional(glue.clone());
                }
            }
        }
    }
    response.insert_answers(answers);
    Some(response)
}

/// Follows a resolution stream in a task of its own and hands over the changes of one
/// lookup at a time. Stops following when dropped.
pub struct Follower {
    pub refresh: Refresh,
    batches: mpsc::UnboundedReceiver<Vec<Change>>,
    task: JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follower {
    pub fn start(resolver: &DnsResolver, uri: &str) -> Follower {
        let (mut changes, refresh) = resolver.resolve(&uri.parse().unwrap()).unwrap();
        let (tx, batches) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(first) = changes.next().await {
                // One lookup's changes come out together; the stream is pending
                // (waiting for the next lookup) right after them.
                let mut batch = vec![first];
                while let Some(Some(change)) = changes.next().now_or_never() {
                    batch.push(change);
                }
                if tx.send(batch).is_err() {
                    break;
                }
            }
        });
        Follower {
            refresh,
            batches,
            task,
        }
    }

    /// The changes of the next lookup that found any, as `+endpoint` and `-endpoint`.
    pub async fn batch(&mut self) -> BTreeSet<String> {
        let batch = tokio::time::timeout(HANG_GUARD, self.batches.recv())
            .await
            .expect("no changes came")
            .expect("the stream ended");
        batch.iter().map(show).collect()
    }

    /// Runs `until` (waiting for something the server sees), asserting that no
    /// lookup reports changes meanwhile.
    pub async fn assert_no_changes_while(&mut self, until: impl Future<Output = ()>) {
        tokio::select! {
            () = until => {}
            batch = self.batches.recv() => panic!(
                "unexpected changes: {:?}",
                batch.iter().flatten().map(show).collect::<Vec<_>>()
            ),
        }
        if let Ok(batch) = self.batches.try_recv() {
            panic!(
                "unexpected changes: {:?}",
                batch.iter().map(show).collect::<Vec<_>>()
            );
        }
    }
}

fn show(change: &Change) -> String {
    match change {
        Change::Insert(e) => format!("+{e}"),
        Change::Remove(e) => format!("-{e}"),
    }
}

/// `["+tcp://a:1", ...]` as a set, to compare with [`Follower::batch`].
pub fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}
