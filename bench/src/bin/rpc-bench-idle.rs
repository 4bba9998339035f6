//! Server memory per idle connection.
//!
//! ```text
//! rpc-bench-idle [--connections N]   (default 10000)
//! ```
//!
//! Starts the framework's TCP server (the generated `Echo` service) on its own
//! `current_thread` runtime and thread, then opens N connections from a child process,
//! makes one call on each (so every server connection has read and written a frame and
//! holds whatever buffers that left it), and keeps them open and idle. It reads the
//! process's resident memory (`VmRSS`) before and after and prints one JSON line:
//!
//! `{"kind":"idle_connections","subject":"tcp","connections":N,"rss_before_bytes":N,"rss_after_bytes":N,"bytes_per_connection":F}`
//!
//! Only the server is in this process, so the figure is the server's memory per idle
//! connection (user space: the connection task, its buffers, the runtime's
//! registration). Kernel socket buffers are not in `VmRSS` and not counted.

use std::{io, time::Duration};

use bytes::{BufMut, BytesMut};
use rpc_core::{frame, server::Server, Metadata};
use rpc_proto::echo::{echo_server::EchoServer, EchoService, SayRequest};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// One Echo/Say request frame with its length prefix.
fn request_frame(id: u64) -> Vec<u8> {
    let payload = rpc_core::payload::encode(&SayRequest {
        message: "idle".into(),
        payload: Default::default(),
    })
    .to_bytes();
    let mut header = BytesMut::new();
    frame::encode_request_header(
        &mut header,
        id,
        "rpc.examples.v1.Echo/Say",
        None,
        &Metadata::new(),
    );
    let mut out = BytesMut::new();
    out.put_u32((header.len() + payload.len()) as u32);
    out.put_slice(&header);
    out.put_slice(&payload);
    out.to_vec()
}

fn raise_fd_limit(wanted: u64) -> io::Result<()> {
    #![allow(unsafe_code)]
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur >= wanted {
        return Ok(());
    }
    // Raising the hard limit needs CAP_SYS_RESOURCE (root); without it, settle for it.
    limit.rlim_cur = wanted;
    if limit.rlim_max < wanted {
        limit.rlim_max = wanted;
    }
    // SAFETY: setrlimit reads the struct we pass, which lives for the call.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        return Ok(());
    }
    limit.rlim_cur = limit.rlim_max.min(limit.rlim_cur);
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let connections: usize = match args.iter().position(|a| a == "--connections") {
        Some(i) => args
            .get(i + 1)
            .ok_or("--connections needs a value")?
            .parse()?,
        None => 10_000,
    };
    raise_fd_limit(connections as u64 + 256)?;
    if let Some(i) = args.iter().position(|a| a == "--client-of") {
        let addr = args.get(i + 1).ok_or("--client-of needs an address")?;
        return client(addr, connections);
    }

    // The server: its own thread and current_thread runtime, as in rpc-bench.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("server runtime");
        runtime.block_on(async move {
            let listener = rpc_transport_tcp::bind("tcp://127.0.0.1:0")
                .await
                .expect("bind");
            addr_tx
                .send(listener.local_addr_uri())
                .expect("report address");
            let server = Server::builder()
                .max_connections(connections + 16)
                .add_service(EchoServer::new(EchoService))
                .build();
            let _ = server.serve(listener).await;
        });
    });
    let uri = addr_rx.recv()?;
    let addr = uri.trim_start_matches("tcp://").to_owned();
    std::thread::sleep(Duration::from_millis(200));
    let before = rpc_bench::rss_bytes(std::process::id())?;

    // The clients live in a child process, so that neither process needs more than
    // N file descriptors and the child's memory is not counted.
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--connections",
            &connections.to_string(),
            "--client-of",
            &addr,
        ])
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    io::BufRead::read_line(
        &mut io::BufReader::new(child.stdout.take().ok_or("no child stdout")?),
        &mut ready,
    )?;
    if ready.trim() != "connected" {
        return Err(format!("client process failed: {ready:?}").into());
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rpc_bench::rss_bytes(std::process::id())?;
    drop(child.stdin.take()); // the child exits when its stdin closes
    child.wait()?;
    let per = after.saturating_sub(before) as f64 / connections as f64;
    println!(
        "{{\"kind\":\"idle_connections\",\"subject\":\"tcp\",\"connections\":{connections},\"rss_before_bytes\":{before},\"rss_after_bytes\":{after},\"bytes_per_connection\":{per:.1}}}"
    );
    Ok(())
}

/// The child: opens the connections, makes one call on each, reports, waits.
fn client(addr: &str, connections: usize) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let open = runtime.block_on(async {
        let frame = request_frame(1);
        let mut open = Vec::with_capacity(connections);
        for _ in 0..connections {
            let mut stream = TcpStream::connect(addr).await?;
            stream.write_all(&frame).await?;
            let mut len = [0u8; 4];
            stream.read_exact(&mut len).await?;
            let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
            stream.read_exact(&mut body).await?;
            open.push(stream);
        }
        Ok::<_, io::Error>(open)
    })?;
    println!("connected");
    // Hold the connections until the parent closes our stdin.
    let mut sink = String::new();
    let _ = io::Read::read_to_string(&mut io::stdin(), &mut sink);
    drop(open);
    Ok(())
}
