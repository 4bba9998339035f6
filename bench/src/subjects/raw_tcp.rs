//! The raw TCP baseline: a length-prefixed echo with nothing but framing.
//!
//! A frame is `[u32 BE len][u64 BE id][payload]`, where `len` counts the bytes after
//! it (8 + payload). Both ends set `TCP_NODELAY`.
//!
//! - Server: one task per connection, a buffered read-frame/write-frame loop that
//!   flushes when no more input is buffered (so pipelined requests share a write).
//! - [`DirectCaller`] (latency, bulk): one call at a time straight on the stream.
//! - [`PipelinedCaller`] (throughput): many calls on one connection through a minimal
//!   id demultiplexer: a writer task, a reader task, and a table of waiting callers.

use std::io;

use bytes::Bytes;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpListener, TcpStream,
    },
    sync::mpsc,
};

pub(crate) use super::pipeline::PipelinedCaller;
use super::{pipeline::Waiting, wrong_length, Caller, ServeFuture};

/// Bytes before the payload: the length and the id.
pub(crate) const HEADER_LEN: usize = 12;

/// Largest `len` accepted, like the framework's limit in this benchmark.
pub(crate) const MAX_FRAME_LEN: usize = 64 << 20;

/// Read and write buffer size of each end: far above a batch of small frames (256 of
/// them are 11 KiB); large payloads bypass the buffers.
const BUF_LEN: usize = 64 * 1024;

/// Binds `127.0.0.1:0` and returns the bound `host:port` and the accept loop.
pub(crate) async fn serve() -> io::Result<(String, ServeFuture)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let serve = async move {
        loop {
            let (stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            tokio::spawn(async move {
                if let Err(e) = echo_connection(stream).await {
                    eprintln!("raw-tcp server: {e}");
                }
            });
        }
    };
    Ok((addr, Box::pin(serve)))
}

/// Echoes frames until the client closes the connection.
async fn echo_connection(stream: TcpStream) -> io::Result<()> {
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(BUF_LEN, read);
    let mut writer = BufWriter::with_capacity(BUF_LEN, write);
    let mut body = Vec::new();
    loop {
        let mut header = [0; HEADER_LEN];
        match reader.read_exact(&mut header).await {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            result => result?,
        };
        let payload_len = payload_len(&header)?;
        body.resize(payload_len, 0);
        reader.read_exact(&mut body).await?;
        writer.write_all(&header).await?;
        writer.write_all(&body).await?;
        if reader.buffer().is_empty() {
            writer.flush().await?;
        }
    }
}

/// The header of a frame carrying `payload_len` bytes with call id `id`.
fn header(id: u64, payload_len: usize) -> io::Result<[u8; HEADER_LEN]> {
    let len = u32::try_from(payload_len + 8)
        .ok()
        .filter(|&len| len as usize <= MAX_FRAME_LEN)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "payload too large"))?;
    let mut header = [0; HEADER_LEN];
    header[..4].copy_from_slice(&len.to_be_bytes());
    header[4..].copy_from_slice(&id.to_be_bytes());
    Ok(header)
}

/// The payload length a header announces, checked against [`MAX_FRAME_LEN`].
fn payload_len(header: &[u8; HEADER_LEN]) -> io::Result<usize> {
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if !(8..=MAX_FRAME_LEN).contains(&len) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad frame length {len}"),
        ));
    }
    Ok(len - 8)
}

/// The call id in a header.
fn header_id(header: &[u8; HEADER_LEN]) -> u64 {
    let mut id = [0; 8];
    id.copy_from_slice(&header[4..]);
    u64::from_be_bytes(id)
}

/// Reads one frame's header and its payload into `body`; returns the id.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R, body: &mut Vec<u8>) -> io::Result<u64> {
    let mut header = [0; HEADER_LEN];
    reader.read_exact(&mut header).await?;
    body.resize(payload_len(&header)?, 0);
    reader.read_exact(body).await?;
    Ok(header_id(&header))
}

/// Buffers one frame in `writer` (no flush).
async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    id: u64,
    payload: &[u8],
) -> io::Result<()> {
    writer.write_all(&header(id, payload.len())?).await?;
    writer.write_all(payload).await
}

async fn connect_stream(addr: &str) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One call at a time on one connection, no tasks in between.
#[derive(Debug)]
pub(crate) struct DirectCaller {
    reader: BufReader<OwnedReadHalf>,
    writer: BufWriter<OwnedWriteHalf>,
    next_id: u64,
    body: Vec<u8>,
}

/// Connects a [`DirectCaller`] to `addr` (`host:port`).
pub(crate) async fn connect_direct(addr: &str) -> io::Result<DirectCaller> {
    let (read, write) = connect_stream(addr).await?.into_split();
    Ok(DirectCaller {
        reader: BufReader::with_capacity(BUF_LEN, read),
        writer: BufWriter::with_capacity(BUF_LEN, write),
        next_id: 0,
        body: Vec::new(),
    })
}

impl Caller for DirectCaller {
    async fn call(&mut self, payload: &Bytes) -> io::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        write_frame(&mut self.writer, id, payload).await?;
        self.writer.flush().await?;
        let got_id = read_frame(&mut self.reader, &mut self.body).await?;
        if got_id != id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected id {id}, got {got_id}"),
            ));
        }
        if self.body.len() != payload.len() {
            return Err(wrong_length(payload.len(), self.body.len()));
        }
        Ok(())
    }
}

/// Connects a [`PipelinedCaller`] to `addr` and spawns its writer and reader tasks on
/// the current runtime.
pub(crate) async fn connect_pipelined(addr: &str) -> io::Result<PipelinedCaller> {
    let (read, write) = connect_stream(addr).await?.into_split();
    let (caller, queue, waiting) = PipelinedCaller::new("raw-tcp connection", None);
    tokio::spawn(write_loop(queue, BufWriter::with_capacity(BUF_LEN, write)));
    tokio::spawn(async move {
        if let Err(e) = read_loop(BufReader::with_capacity(BUF_LEN, read), &waiting).await {
            if e.kind() != io::ErrorKind::UnexpectedEof {
                eprintln!("raw-tcp client: {e}");
            }
        }
        waiting.fail_all();
    });
    Ok(caller)
}

/// Writes queued requests, flushing once the queue is empty.
async fn write_loop(
    mut queue: mpsc::Receiver<(u64, Bytes)>,
    mut writer: BufWriter<OwnedWriteHalf>,
) {
    let result: io::Result<()> = async {
        while let Some((id, payload)) = queue.recv().await {
            write_frame(&mut writer, id, &payload).await?;
            while let Ok((id, payload)) = queue.try_recv() {
                write_frame(&mut writer, id, &payload).await?;
            }
            writer.flush().await?;
        }
        writer.shutdown().await
    }
    .await;
    if let Err(e) = result {
        eprintln!("raw-tcp client: {e}");
    }
}

/// Reads responses and hands each to its waiting caller.
async fn read_loop(mut reader: BufReader<OwnedReadHalf>, waiting: &Waiting) -> io::Result<()> {
    let mut body = Vec::new();
    loop {
        let id = read_frame(&mut reader, &mut body).await?;
        waiting.answer(id, body.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = header(0x0102_0304_0506_0708, 32).unwrap();
        assert_eq!(&h[..4], &40u32.to_be_bytes());
        assert_eq!(header_id(&h), 0x0102_0304_0506_0708);
        assert_eq!(payload_len(&h).unwrap(), 32);
        assert!(header(1, MAX_FRAME_LEN).is_err());
        let mut short = h;
        short[..4].copy_from_slice(&7u32.to_be_bytes());
        assert!(payload_len(&short).is_err());
    }
}
