//! TCP and Unix-domain-socket transport: whole frames over a byte stream, each
//! preceded by a 4-byte big-endian length (see `docs/wire.md`).
//!
//! Addresses are URIs: `tcp://host:port` (host may be a name, an IPv4 address or a
//! bracketed IPv6 address) and `unix:///absolute/path`. TCP connections set
//! `TCP_NODELAY`: the link batches frames itself, so Nagle's delay would only add
//! latency.
//!
//! # Layout
//!
//! - [`StreamLink`]: the length-prefixed [`Link`](rpc_core::link::Link) over any byte
//!   stream.
//! - [`Address`]: URI parsing.
//! - [`StreamConnector`] / [`StreamListener`]: open and accept TCP or Unix links,
//!   optionally with TCP keepalive ([`TcpKeepalive`], off by default: the core's
//!   keepalive PINGs watch connections with calls in flight).
//! - [`tls`] (cargo feature `tls`): the same links inside TLS, `tls://` and
//!   `tls+unix://`, with mTLS and certificate reload.
//!
//! Every accepted link tells the server who the peer is
//! ([`Peer`]): the remote address over TCP, the peer process's uid,
//! gid and pid over a Unix socket, and over TLS the verified certificate's names.
//!
//! # Example
//!
//! ```no_run
//! # async fn f() -> Result<(), rpc_core::Error> {
//! let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0").await?;
//! let addr = listener.local_addr_uri();
//! // Server::builder().add_service(..).serve(listener) in a task, then:
//! let channel = rpc_transport_tcp::connect(&addr).await?;
//! # drop(channel); Ok(()) }
//! ```

mod address;
mod sources;
mod stream;
mod stream_link;
#[cfg(feature = "tls")]
pub mod tls;

use std::{fmt, net::SocketAddr, path::PathBuf};

use rpc_core::{
    client::Channel,
    link::{Connector, LinkConfig, Listener},
    peer::UnixCredentials,
    Error, ErrorKind, Peer,
};

pub use address::Address;
pub use sources::{SourceSlot, SourceSlots};
pub use stream::{Stream, TcpKeepalive};
pub use stream_link::{StreamLink, PREFIX_LEN};

/// The link this crate's connectors and listeners produce.
pub type TcpLink = StreamLink<Stream>;

/// Opens links to one `tcp://` or `unix://` address.
#[derive(Clone, Debug)]
pub struct StreamConnector {
    address: Address,
    tcp_keepalive: Option<TcpKeepalive>,
}

impl StreamConnector {
    /// A connector for `address`.
    pub fn new(address: Address) -> Self {
        StreamConnector {
            address,
            tcp_keepalive: None,
        }
    }

    /// TCP keepalive on the connections it opens (see [`TcpKeepalive`]). Default:
    /// `None` (off: the channel's own keepalive PINGs watch connections with calls in
    /// flight, `ChannelBuilder::keepalive_interval`).
    pub fn tcp_keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.tcp_keepalive = keepalive;
        self
    }

    /// A connector for a `tcp://` or `unix://` URI.
    pub fn from_uri(uri: &str) -> Result<Self, Error> {
        Ok(StreamConnector::new(uri.parse()?))
    }
}

impl Connector for StreamConnector {
    type Link = TcpLink;

    async fn connect(&self, config: &LinkConfig) -> Result<TcpLink, Error> {
        let stream = Stream::connect(&self.address)
            .await
            .map_err(|e| Error::io(format!("connect to {}", self.address), e))?;
        if let Some(keepalive) = &self.tcp_keepalive {
            stream
                .set_tcp_keepalive(keepalive)
                .map_err(|e| Error::io(format!("TCP keepalive on {}", self.address), e))?;
        }
        Ok(StreamLink::new(
            stream,
            self.address.to_string(),
            config.max_frame_len,
        ))
    }

    fn target(&self) -> String {
        self.address.to_string()
    }
}

enum Inner {
    Tcp(tokio::net::TcpListener),
    /// The listener, its path, and the socket file it made (device and inode).
    Unix(tokio::net::UnixListener, PathBuf, Option<(u64, u64)>),
}

/// Accepts TCP or Unix-socket links.
///
/// A Unix listener removes its socket file when dropped.
pub struct StreamListener {
    inner: Inner,
    local: Address,
    tcp_keepalive: Option<TcpKeepalive>,
}

impl fmt::Debug for StreamListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamListener")
            .field("local", &self.local)
            .finish()
    }
}

impl StreamListener {
    /// Binds to `address`. Port 0 picks a free port; [`local_addr_uri`] tells which.
    /// A Unix socket path that exists and is a socket is replaced.
    ///
    /// [`local_addr_uri`]: StreamListener::local_addr_uri
    pub async fn bind(address: &Address) -> Result<Self, Error> {
        match address {
            Address::Tcp(addr) => {
                let listener = tokio::net::TcpListener::bind(addr.as_str())
                    .await
                    .map_err(|e| Error::io(format!("bind tcp://{addr}"), e))?;
                let local = listener
                    .local_addr()
                    .map_err(|e| Error::io("local address", e))?;
                Ok(StreamListener {
                    inner: Inner::Tcp(listener),
                    local: Address::Tcp(local.to_string()),
                    tcp_keepalive: None,
                })
            }
            Address::Unix(path) => {
                remove_stale_socket(path)
                    .await
                    .map_err(|e| Error::io(format!("bind unix://{}", path.display()), e))?;
                let listener = tokio::net::UnixListener::bind(path)
                    .map_err(|e| Error::io(format!("bind unix://{}", path.display()), e))?;
                let ours = socket_identity(path);
                Ok(StreamListener {
                    inner: Inner::Unix(listener, path.clone(), ours),
                    local: address.clone(),
                    tcp_keepalive: None,
                })
            }
        }
    }

    /// The bound address as a URI (`tcp://127.0.0.1:41234`), ready for a client.
    pub fn local_addr_uri(&self) -> String {
        self.local.to_string()
    }

    /// The bound address.
    pub fn address(&self) -> &Address {
        &self.local
    }

    /// TCP keepalive on the connections it accepts (see [`TcpKeepalive`]; ignored on a
    /// Unix socket). Default: `None` (off: the server's own keepalive PINGs watch
    /// connections with calls in flight, and its idle timeout closes the others).
    pub fn tcp_keepalive(mut self, keepalive: Option<TcpKeepalive>) -> Self {
        self.tcp_keepalive = keepalive;
        self
    }

    /// The next connection as a bare [`Stream`] (over TCP with `TCP_NODELAY`), with
    /// the peer's address over TCP (`None` on a Unix socket): for protocols of their
    /// own over these sockets, such as the soft RDMA provider's.
    pub async fn accept_stream(&self) -> std::io::Result<(Stream, Option<SocketAddr>)> {
        match &self.inner {
            Inner::Tcp(listener) => {
                let (stream, peer) = listener.accept().await?;
                // Failing to set it costs latency, not correctness.
                let _ = stream.set_nodelay(true);
                let stream = Stream::Tcp(stream);
                if let Some(keepalive) = &self.tcp_keepalive {
                    // Failing to set it leaves dead peers to the server's keepalive.
                    if let Err(err) = stream.set_tcp_keepalive(keepalive) {
                        tracing::debug!(%peer, error = %err, "TCP keepalive not set");
                    }
                }
                Ok((stream, Some(peer)))
            }
            Inner::Unix(listener, ..) => {
                let (stream, _) = listener.accept().await?;
                Ok((Stream::Unix(stream), None))
            }
        }
    }
}

/// Removes a socket file left by a process that is gone (nothing accepts on it), so
/// that a restart binds again; one a live server listens on is `AddrInUse`, as a busy
/// TCP port is (it was taken over, the live server left with no socket file).
async fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        // Binding would fail with "address in use", which reads as another server
        // running there.
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket: remove it or choose another path",
                path.display()
            ),
        ));
    }
    let probe = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        tokio::net::UnixStream::connect(path),
    )
    .await;
    match probe {
        // Refused: nobody accepts on it. Gone meanwhile: nothing to remove.
        Ok(Err(err))
            if matches!(
                err.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
            ) =>
        {
            let _ = std::fs::remove_file(path);
            Ok(())
        }
        // Connected, or a listener too busy to take us (its backlog full): alive.
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "another server listens on this socket",
        )),
    }
}

/// A socket file's device and inode: which file a listener made.
fn socket_identity(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

impl Drop for StreamListener {
    fn drop(&mut self) {
        // Only the file this listener made: another server may have bound the path
        // since (after this one's file was removed by hand, say).
        if let Inner::Unix(_, path, ours) = &self.inner {
            if ours.is_some() && socket_identity(path) == *ours {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

impl Listener for StreamListener {
    type Link = TcpLink;

    async fn accept(&mut self, config: &LinkConfig) -> Result<TcpLink, Error> {
        let (stream, peer) = self
            .accept_stream()
            .await
            .map_err(|e| Error::io("accept", e))?;
        let description = match peer {
            Some(peer) => format!("tcp://{peer}"),
            None => format!("{} (client)", self.local),
        };
        let info = peer_of(&stream, peer, description.clone());
        Ok(StreamLink::new(stream, description, config.max_frame_len)
            .with_peer_info(info)
            .with_close_probe(Stream::poll_peer_closed))
    }

    fn local_addr(&self) -> String {
        self.local.to_string()
    }
}

/// Makes channels to `tcp://` and `unix://` replicas for a
/// [`Balanced`](rpc_core::balance::Balanced) client; each connects on its first call.
#[derive(Clone, Debug, Default)]
pub struct StreamChannels {
    builder: rpc_core::client::ChannelBuilder,
}

impl StreamChannels {
    /// Channels built with `builder`'s settings.
    pub fn new(builder: rpc_core::client::ChannelBuilder) -> Self {
        StreamChannels { builder }
    }
}

impl rpc_core::balance::MakeChannel for StreamChannels {
    fn make_channel(&self, endpoint: &rpc_core::Endpoint) -> Result<Channel, Error> {
        let connector = StreamConnector::new(Address::try_from(endpoint)?);
        Ok(self.builder.clone().connect_lazy(connector))
    }
}

/// Binds a listener to a `tcp://` or `unix://` URI.
pub async fn bind(uri: &str) -> Result<StreamListener, Error> {
    StreamListener::bind(&uri.parse()?).await
}

/// Connects a [`Channel`] to a `tcp://` or `unix://` URI with default settings.
/// For other settings use [`Channel::builder()`] with a [`StreamConnector`].
pub async fn connect(uri: &str) -> Result<Channel, Error> {
    Channel::builder()
        .connect(StreamConnector::from_uri(uri)?)
        .await
}

/// A [`Channel`] to `uri` that connects on its first call.
pub fn connect_lazy(uri: &str) -> Result<Channel, Error> {
    Ok(Channel::builder().connect_lazy(StreamConnector::from_uri(uri)?))
}

/// What an accepted stream tells of its peer: the address over TCP, the process's
/// credentials over a Unix socket.
fn peer_of(stream: &Stream, addr: Option<SocketAddr>, description: String) -> Peer {
    let peer = Peer::new(description);
    match (stream, addr) {
        (Stream::Tcp(_), Some(addr)) => peer.with_addr(addr),
        (Stream::Unix(unix), _) => match unix.peer_cred() {
            Ok(cred) => peer.with_unix_credentials(UnixCredentials {
                uid: cred.uid(),
                gid: cred.gid(),
                pid: cred.pid(),
            }),
            Err(_) => peer,
        },
        _ => peer,
    }
}

fn invalid(uri: &str, why: &str) -> Error {
    Error::new(
        ErrorKind::InvalidAddress,
        format!("invalid address {uri:?}: {why}"),
    )
}
