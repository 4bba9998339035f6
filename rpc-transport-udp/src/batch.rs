//! Moving many datagrams per system call.
//!
//! On Linux: `recvmmsg` and `sendmmsg`, with UDP segmentation offload both ways. A run
//! of datagrams of one length (the fragments of a message, or many requests of the
//! same size) leaves as one `UDP_SEGMENT` send: the kernel's stack handles it once and
//! cuts it into the datagrams at the end (on loopback, a receiving socket with
//! `UDP_GRO` takes it whole). A receiving socket with `UDP_GRO` may get several
//! datagrams of one sender coalesced, with their size in a control message, and cuts
//! them apart here. Each datagram on the wire is unchanged: a peer without either
//! sees ordinary datagrams.
//!
//! Elsewhere: one `recv` or `send` per call.

use std::net::SocketAddr;

/// Datagrams taken per send call at most (the link queues this many).
pub(crate) const SEND_MAX: usize = 256;

/// What one receive call got.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Received {
    /// Receive operations (`recvmmsg` entries) that returned something: fewer than
    /// [`RECV_CALLS`] means the socket's queue was empty at the end.
    pub(crate) calls: usize,
    /// Datagrams handed on.
    pub(crate) datagrams: usize,
    /// Datagrams dropped as not from the expected source.
    pub(crate) strays: usize,
}

/// Receive operations per call (each may return several coalesced datagrams).
pub(crate) const RECV_CALLS: usize = 32;

#[cfg(target_os = "linux")]
pub(crate) use linux::{enable_gro, recv, send};

#[cfg(not(target_os = "linux"))]
pub(crate) use portable::{enable_gro, recv, send};

/// Whether a source address is `peer` (address and port).
fn same_peer(source: SocketAddr, peer: SocketAddr) -> bool {
    source.ip() == peer.ip() && source.port() == peer.port()
}

#[cfg(target_os = "linux")]
mod linux {
    use std::{cell::RefCell, io, mem, net::SocketAddr, os::fd::AsRawFd, ptr};

    use bytes::Bytes;

    use super::{same_peer, Received, RECV_CALLS, SEND_MAX};

    /// The largest UDP payload, and so the size of each receive buffer (a coalesced
    /// receive never exceeds it either).
    const MAX_PAYLOAD: usize = 65_536;
    /// `sendmmsg` entries per call.
    const SEND_CALLS: usize = 32;
    /// Datagrams in one segmented send at most (the kernel's `UDP_MAX_SEGMENTS` is 64
    /// on older kernels, 128 on newer).
    const MAX_SEGMENTS: usize = 64;
    /// Bytes in one segmented send at most: it must fit one (64 KiB) IP packet.
    const MAX_SEGMENTED_BYTES: usize = 60_000;
    /// Room for one control message carrying an `int` (`CMSG_SPACE(sizeof(int))` on
    /// 64-bit Linux is 24), as 8-byte words for `cmsghdr`'s alignment.
    const CONTROL_WORDS: usize = 4;

    /// The system calls' argument arrays and receive buffers, made once per thread and
    /// shared by every link polled on it (a received datagram is copied out at its own
    /// size), so an idle link holds no receive buffer and a call fills in only what
    /// changes. Boxed: the headers point into the arrays beside them.
    struct Batch {
        buffers: Vec<u8>,
        calls: Calls,
    }

    /// The plain-data part of [`Batch`]: valid all-zero.
    struct Calls {
        recv_iovecs: [libc::iovec; RECV_CALLS],
        recv_headers: [libc::mmsghdr; RECV_CALLS],
        recv_controls: [[u64; CONTROL_WORDS]; RECV_CALLS],
        sources: [libc::sockaddr_storage; RECV_CALLS],
        send_iovecs: [libc::iovec; SEND_MAX],
        send_headers: [libc::mmsghdr; SEND_CALLS],
        send_controls: [[u64; CONTROL_WORDS]; SEND_CALLS],
        /// Datagrams in each `send_headers` entry of the last send.
        send_counts: [usize; SEND_CALLS],
        /// Receive headers, from the first, whose lengths the kernel may have
        /// rewritten since they were set up (all of them before the first receive):
        /// the rest are ready.
        recv_dirty: usize,
    }

    impl Calls {
        /// Sets up the first `count` receive headers' names and control buffers, whose
        /// lengths the kernel rewrites for every datagram it receives.
        fn set_up_recv_headers(&mut self, count: usize) {
            for ((header, source), control) in self
                .recv_headers
                .iter_mut()
                .zip(self.sources.iter_mut())
                .zip(self.recv_controls.iter_mut())
                .take(count)
            {
                header.msg_hdr.msg_name = ptr::from_mut(source).cast();
                header.msg_hdr.msg_namelen =
                    mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                header.msg_hdr.msg_control = control.as_mut_ptr().cast();
                header.msg_hdr.msg_controllen = mem::size_of_val(control);
            }
        }
    }

    impl Batch {
        fn new() -> Box<Batch> {
            let mut batch = Box::new(Batch {
                buffers: vec![0; RECV_CALLS * MAX_PAYLOAD],
                // SAFETY: all-zero bytes are a valid value of every field of `Calls`
                // (null pointers, zero lengths and counts, family AF_UNSPEC).
                #[allow(unsafe_code)]
                calls: unsafe { mem::zeroed() },
            });
            let Batch { buffers, calls } = &mut *batch;
            for ((iovec, chunk), header) in calls
                .recv_iovecs
                .iter_mut()
                .zip(buffers.chunks_exact_mut(MAX_PAYLOAD))
                .zip(calls.recv_headers.iter_mut())
            {
                iovec.iov_base = chunk.as_mut_ptr().cast();
                iovec.iov_len = chunk.len();
                header.msg_hdr.msg_iov = iovec;
                header.msg_hdr.msg_iovlen = 1;
            }
            calls.set_up_recv_headers(RECV_CALLS);
            batch
        }
    }

    thread_local! {
        static BATCH: RefCell<Box<Batch>> = RefCell::new(Batch::new());
    }

    /// Asks the kernel to hand over a sender's datagrams coalesced (`UDP_GRO`).
    /// Failing (an old kernel) only costs speed.
    pub(crate) fn enable_gro(socket: &std::net::UdpSocket) {
        let on: libc::c_int = 1;
        // SAFETY: a live descriptor, and a live `c_int` whose size is passed with it.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_GRO,
                ptr::from_ref(&on).cast(),
                mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!(error = %io::Error::last_os_error(), "UDP_GRO not enabled");
        }
    }

    /// Receives what is queued, up to [`RECV_CALLS`] receive operations in one
    /// `recvmmsg`, handing each datagram to `each`. With `only_from`, datagrams from
    /// any other source are dropped (a server's per-peer socket may hold a few that
    /// reached it between its `bind` and `connect`). `WouldBlock` when nothing is
    /// there.
    pub(crate) fn recv(
        socket: &std::net::UdpSocket,
        only_from: Option<SocketAddr>,
        each: &mut dyn FnMut(Bytes),
    ) -> io::Result<Received> {
        BATCH.with(|batch| {
            let mut batch = batch.borrow_mut();
            let Batch { buffers, calls: c } = &mut **batch;
            // Only the headers the last call used are set up again: setting up all
            // 32 cost about 250 instructions for the one or two datagrams a
            // sequential call brings. Every header asks for its source, also without
            // `only_from` (the kernel copies a few bytes more per datagram), so that
            // sockets with and without a filter on one thread share the setup.
            c.set_up_recv_headers(c.recv_dirty);
            // SAFETY: `recv_headers` holds RECV_CALLS headers, each pointing at its
            // own iovec covering a distinct MAX_PAYLOAD chunk of `buffers`, at its own
            // control buffer with its size, and its own `sockaddr_storage` with its
            // size (set up in `Batch::new`, and again after the kernel rewrote the
            // lengths, above); all of them live in the boxed `Batch`,
            // which is borrowed for the call.
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    c.recv_headers.as_mut_ptr(),
                    RECV_CALLS as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    ptr::null_mut(),
                )
            };
            // The kernel writes the lengths of the headers it fills (one more is
            // counted, in case a failed receive wrote its own); after an error, any.
            c.recv_dirty = usize::try_from(rc).map_or(RECV_CALLS, |n| (n + 1).min(RECV_CALLS));
            let calls = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
            let mut received = Received {
                calls,
                ..Received::default()
            };
            for ((header, chunk), source) in c
                .recv_headers
                .iter()
                .zip(buffers.chunks_exact(MAX_PAYLOAD))
                .zip(c.sources.iter())
                .take(calls)
            {
                let len = (header.msg_len as usize).min(MAX_PAYLOAD);
                let segment = coalesced_size(&header.msg_hdr).unwrap_or(len).max(1);
                let segments = len.div_ceil(segment);
                if let Some(peer) = only_from {
                    if source_addr(source).is_none_or(|source| !same_peer(source, peer)) {
                        received.strays += segments;
                        continue;
                    }
                }
                // A copy of exactly each datagram's size.
                for datagram in chunk[..len].chunks(segment) {
                    each(Bytes::copy_from_slice(datagram));
                    received.datagrams += 1;
                }
            }
            Ok(received)
        })
    }

    /// The size of the datagrams of a coalesced receive, from its `UDP_GRO` control
    /// message; `None` for a single datagram.
    fn coalesced_size(header: &libc::msghdr) -> Option<usize> {
        // SAFETY: `header` was filled in by the kernel, its control buffer and length
        // describe live memory; CMSG_FIRSTHDR and CMSG_NXTHDR stay within them, and a
        // UDP_GRO message's data is one `c_int`, read unaligned.
        #[allow(unsafe_code)]
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(header);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_UDP && (*cmsg).cmsg_type == libc::UDP_GRO {
                    let size = ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                    return usize::try_from(size).ok().filter(|&s| s > 0);
                }
                cmsg = libc::CMSG_NXTHDR(header, cmsg);
            }
        }
        None
    }

    /// The address the kernel filled in, if it is an IPv4 or IPv6 one.
    fn source_addr(source: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match libc::c_int::from(source.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a `sockaddr_in`, which it
                // is large and aligned enough for.
                #[allow(unsafe_code)]
                let v4 = unsafe { &*ptr::from_ref(source).cast::<libc::sockaddr_in>() };
                let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
                Some(SocketAddr::from((ip, u16::from_be(v4.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: as above, for `sockaddr_in6`.
                #[allow(unsafe_code)]
                let v6 = unsafe { &*ptr::from_ref(source).cast::<libc::sockaddr_in6>() };
                let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
                Some(SocketAddr::from((ip, u16::from_be(v6.sin6_port))))
            }
            _ => None,
        }
    }

    /// Sends from the front of `datagrams` on a connected socket in one `sendmmsg`;
    /// with `segment`, runs of datagrams of one length (the last may be shorter) go as
    /// one segmented send each. Returns how many datagrams the kernel took (at least
    /// one), or the error of the first send.
    pub(crate) fn send(
        socket: &std::net::UdpSocket,
        datagrams: &[Bytes],
        segment: bool,
    ) -> io::Result<usize> {
        BATCH.with(|batch| {
            let mut batch = batch.borrow_mut();
            let c = &mut batch.calls;
            let mut calls = 0;
            let mut next = 0;
            while next < datagrams.len().min(SEND_MAX) && calls < SEND_CALLS {
                let size = datagrams[next].len();
                let mut run = 1;
                if segment {
                    let mut bytes = size;
                    while let Some(d) = datagrams.get(next + run) {
                        if next + run >= SEND_MAX
                            || run >= MAX_SEGMENTS
                            || d.len() > size
                            || bytes + d.len() > MAX_SEGMENTED_BYTES
                        {
                            break;
                        }
                        bytes += d.len();
                        run += 1;
                        if d.len() < size {
                            break; // a shorter one ends a run
                        }
                    }
                }
                for (iovec, datagram) in c.send_iovecs[next..next + run]
                    .iter_mut()
                    .zip(&datagrams[next..next + run])
                {
                    // The kernel only reads through this pointer (sendmmsg).
                    iovec.iov_base = datagram.as_ptr().cast_mut().cast();
                    iovec.iov_len = datagram.len();
                }
                let header = &mut c.send_headers[calls].msg_hdr;
                header.msg_iov = &mut c.send_iovecs[next];
                header.msg_iovlen = run;
                if run > 1 {
                    let control = &mut c.send_controls[calls];
                    header.msg_control = control.as_mut_ptr().cast();
                    // SAFETY: CMSG_SPACE and CMSG_LEN only compute sizes.
                    #[allow(unsafe_code)]
                    let (space, len) = unsafe {
                        (
                            libc::CMSG_SPACE(mem::size_of::<u16>() as u32) as usize,
                            libc::CMSG_LEN(mem::size_of::<u16>() as u32) as usize,
                        )
                    };
                    header.msg_controllen = space;
                    // SAFETY: the control buffer (CONTROL_WORDS words) holds `space`
                    // bytes, so CMSG_FIRSTHDR is not null and the header and its u16 of
                    // data lie within it; the data is written unaligned.
                    #[allow(unsafe_code)]
                    unsafe {
                        let cmsg = libc::CMSG_FIRSTHDR(header);
                        (*cmsg).cmsg_level = libc::SOL_UDP;
                        (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                        (*cmsg).cmsg_len = len;
                        ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size as u16);
                    }
                } else {
                    header.msg_control = ptr::null_mut();
                    header.msg_controllen = 0;
                }
                c.send_counts[calls] = run;
                calls += 1;
                next += run;
            }
            // SAFETY: the first `calls` headers each point at their own run of iovecs
            // (within `send_iovecs`), now covering datagrams of `datagrams`, which
            // outlive the call, and at their own control buffer or none; the socket is
            // connected, so no destination is given (null msg_name, zeroed once).
            #[allow(unsafe_code)]
            let rc = unsafe {
                libc::sendmmsg(
                    socket.as_raw_fd(),
                    c.send_headers.as_mut_ptr(),
                    calls as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            let sent = usize::try_from(rc).map_err(|_| io::Error::last_os_error())?;
            Ok(c.send_counts[..sent].iter().sum())
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod portable {
    use std::{io, net::SocketAddr};

    use bytes::Bytes;

    use super::{same_peer, Received};

    /// The largest UDP payload.
    const MAX_PAYLOAD: usize = 65_536;

    /// No coalescing here.
    pub(crate) fn enable_gro(_socket: &std::net::UdpSocket) {}

    /// Receives one datagram.
    pub(crate) fn recv(
        socket: &std::net::UdpSocket,
        only_from: Option<SocketAddr>,
        each: &mut dyn FnMut(Bytes),
    ) -> io::Result<Received> {
        let mut buf = vec![0u8; MAX_PAYLOAD];
        let (len, source) = socket.recv_from(&mut buf)?;
        if only_from.is_some_and(|peer| !same_peer(source, peer)) {
            return Ok(Received {
                calls: 1,
                datagrams: 0,
                strays: 1,
            });
        }
        each(Bytes::copy_from_slice(&buf[..len]));
        Ok(Received {
            calls: 1,
            datagrams: 1,
            strays: 0,
        })
    }

    /// Sends the first datagram.
    pub(crate) fn send(
        socket: &std::net::UdpSocket,
        datagrams: &[Bytes],
        _segment: bool,
    ) -> io::Result<usize> {
        socket.send(&datagrams[0]).map(|_| 1)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io;

    use bytes::Bytes;

    use super::*;

    fn pair() -> (std::net::UdpSocket, std::net::UdpSocket) {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        (a, b)
    }

    /// Datagrams of mixed sizes, in runs, as an engine emits them.
    fn datagrams() -> Vec<Bytes> {
        let mut out = Vec::new();
        let mut n = 0u8;
        for (count, size) in [(3, 100), (1, 40), (70, 1200), (1, 700), (2, 1200), (5, 64)] {
            for _ in 0..count {
                n = n.wrapping_add(1);
                out.push(Bytes::from(vec![n; size]));
            }
        }
        out
    }

    fn round_trip(segment: bool, gro: bool) {
        let (a, b) = pair();
        if gro {
            enable_gro(&b);
        }
        let sent = datagrams();
        let mut at = 0;
        while at < sent.len() {
            at += send(&a, &sent[at..], segment).unwrap();
        }
        let mut got = Vec::new();
        let mut calls = 0;
        b.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < sent.len() && std::time::Instant::now() < deadline {
            match recv(&b, Some(a.local_addr().unwrap()), &mut |d| got.push(d)) {
                Ok(r) => {
                    assert_eq!(r.strays, 0);
                    calls += r.calls;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, sent, "segment {segment}, gro {gro}");
        if segment && gro {
            // On loopback a segmented send reaches a GRO socket whole.
            assert!(
                calls < sent.len(),
                "{calls} receives for {} datagrams",
                sent.len()
            );
        } else {
            assert_eq!(calls, sent.len());
        }
    }

    #[test]
    fn datagrams_arrive_whole_and_in_order_with_and_without_offload() {
        for segment in [false, true] {
            for gro in [false, true] {
                round_trip(segment, gro);
            }
        }
    }

    #[test]
    fn datagrams_from_another_source_are_counted_not_delivered() {
        let (a, b) = pair();
        let other = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        b.set_nonblocking(true).unwrap();
        // `b` is connected to `a`: the kernel filters `other` out, so ask for a
        // source `b` never hears from instead.
        send(&a, &[Bytes::from_static(b"hello")], false).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match recv(&b, Some(other.local_addr().unwrap()), &mut |_| {
                panic!("delivered")
            }) {
                Ok(r) => {
                    assert_eq!((r.datagrams, r.strays), (0, 1));
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "nothing arrived");
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// Receives on `socket` until `want` datagrams were delivered or counted as
    /// strays: (delivered, strays).
    fn receive(
        socket: &std::net::UdpSocket,
        only_from: Option<SocketAddr>,
        want: usize,
    ) -> (usize, usize) {
        let (mut delivered, mut strays) = (0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while delivered + strays < want {
            match recv(socket, only_from, &mut |_| delivered += 1) {
                Ok(r) => strays += r.strays,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(std::time::Instant::now() < deadline, "nothing arrived");
                    std::thread::yield_now();
                }
                Err(e) => panic!("{e}"),
            }
        }
        (delivered, strays)
    }

    /// The receive headers are set up again only where the last call used them:
    /// sources stay right across receives of different counts, with and without a
    /// source filter, on one thread.
    #[test]
    fn sources_are_read_right_across_calls_with_and_without_a_source_filter() {
        let (a, b) = pair();
        b.set_nonblocking(true).unwrap();
        let from_a = a.local_addr().unwrap();
        let other = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let datagrams = |n: usize| vec![Bytes::from_static(b"x"); n];
        for (n, only_from, expected) in [
            (3, Some(from_a), (3, 0)),
            (1, None, (1, 0)),
            (5, Some(from_a), (5, 0)),
            (2, Some(other), (0, 2)),
            (1, Some(from_a), (1, 0)),
            (4, None, (4, 0)),
            (2, Some(from_a), (2, 0)),
        ] {
            for datagram in datagrams(n) {
                send(&a, &[datagram], false).unwrap();
            }
            assert_eq!(
                receive(&b, only_from, n),
                expected,
                "{n} with {only_from:?}"
            );
        }
    }
}
