//! This HTTP/2 against an independent one, the `h2` crate, over an in-memory pipe: h2's
//! client calls a server on [`Connection`], and a client on [`Connection`] calls h2's
//! server, with messages large enough to need many WINDOW_UPDATEs, several streams at
//! once, and trailers.

use std::io::IoSlice;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::{
    conn::{Config, Connection, Event, Role},
    hpack::Indexing,
};

/// Writes everything `conn` queued.
async fn flush(conn: &mut Connection, io: &mut DuplexStream) {
    while !conn.out().is_empty() {
        let mut slices = [IoSlice::new(&[]); 32];
        let n = conn.out().slices(&mut slices);
        let written = io.write_vectored(&slices[..n]).await.expect("write");
        conn.out().advance(written);
    }
}

/// An echo server on [`Connection`]: each stream's DATA comes back, then trailers
/// with `grpc-status: 0` and the number of bytes seen.
async fn echo_server(mut io: DuplexStream, config: Config) {
    let mut conn = Connection::new(Role::Server, config, None);
    let mut input = BytesMut::with_capacity(64 * 1024);
    let mut seen = std::collections::HashMap::<u32, usize>::new();
    loop {
        flush(&mut conn, &mut io).await;
        if conn.is_closed() {
            return;
        }
        input.reserve(64 * 1024);
        match io.read_buf(&mut input).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            let event = match conn.next_event(&mut input) {
                Ok(Some(event)) => event,
                Ok(None) => break,
                Err(error) => panic!("server: {error:?}"),
            };
            let (stream, end) = match event {
                Event::Headers {
                    stream,
                    fields,
                    end_stream,
                    ..
                } => {
                    assert!(fields.iter().any(|(n, v)| n == ":method" && v == "POST"));
                    if let std::collections::hash_map::Entry::Vacant(entry) = seen.entry(stream) {
                        entry.insert(0);
                        conn.send_headers(stream, false, |w| {
                            w.field(b":status", b"200", Indexing::Incremental);
                            w.field(b"content-type", b"application/grpc", Indexing::Incremental);
                        });
                    }
                    (stream, end_stream)
                }
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => {
                    *seen.get_mut(&stream).unwrap() += data.len();
                    conn.release(stream, data.len());
                    if !data.is_empty() {
                        conn.send_data(stream, data, false);
                    }
                    (stream, end_stream)
                }
                Event::Reset { .. } | Event::GoAway { .. } | Event::PingAck(_) => continue,
                Event::HeadersTooLarge { .. } => panic!("headers too large"),
            };
            if end {
                let count = seen[&stream].to_string();
                conn.send_headers(stream, true, |w| {
                    w.field(b"grpc-status", b"0", Indexing::Incremental);
                    w.field(b"x-seen", count.as_bytes(), Indexing::No);
                });
            }
        }
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn an_h2_client_calls_a_server_on_this_http2() {
    let (client_io, server_io) = tokio::io::duplex(256 * 1024);
    let config = Config {
        stream_window: 65_535,
        connection_window: 200_000,
        ..Config::default()
    };
    tokio::spawn(echo_server(server_io, config));
    let (send, connection) = h2::client::handshake(client_io).await.expect("handshake");
    tokio::spawn(connection);
    let mut calls = Vec::new();
    for (i, len) in [0usize, 5, 70_000, 1 << 20, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let send = send.clone();
        calls.push(tokio::spawn(async move {
            let body = pattern(len, i as u8);
            let request = http::Request::post(format!("http://localhost/echo/{i}"))
                .body(())
                .unwrap();
            let mut send = send.ready().await.expect("ready");
            let (response, mut stream) = send.send_request(request, false).expect("send");
            // Sent in pieces of 100 KB as h2's capacity allows.
            let writer = tokio::spawn(async move {
                let mut rest = body.clone();
                while !rest.is_empty() {
                    let piece = rest.split_to(rest.len().min(100_000));
                    stream.send_data(piece, false).expect("send_data");
                }
                stream.send_data(Bytes::new(), true).expect("end");
                body
            });
            let response = response.await.expect("response");
            assert_eq!(response.status(), 200);
            let mut body = response.into_body();
            let mut echoed = BytesMut::new();
            while let Some(chunk) = body.data().await {
                let chunk = chunk.expect("data");
                body.flow_control().release_capacity(chunk.len()).unwrap();
                echoed.extend_from_slice(&chunk);
            }
            let trailers = body.trailers().await.expect("trailers").expect("some");
            assert_eq!(trailers["grpc-status"], "0");
            assert_eq!(trailers["x-seen"], len.to_string().as_str());
            let sent = writer.await.unwrap();
            assert_eq!(echoed.len(), sent.len());
            assert!(echoed[..] == sent[..], "call {i}: the echo differs");
        }));
    }
    for call in calls {
        call.await.unwrap();
    }
}

#[tokio::test]
async fn a_client_on_this_http2_calls_an_h2_server() {
    let (client_io, server_io) = tokio::io::duplex(256 * 1024);
    // h2's server: echoes each request's body, then trailers.
    tokio::spawn(async move {
        let mut connection = h2::server::Builder::new()
            .initial_window_size(65_535)
            .handshake::<_, Bytes>(server_io)
            .await
            .expect("server handshake");
        while let Some(accepted) = connection.accept().await {
            let (request, mut respond) = accepted.expect("accept");
            tokio::spawn(async move {
                assert_eq!(request.uri().path(), "/echo.Echo/Say");
                let mut body = request.into_body();
                let response = http::Response::builder().status(200).body(()).unwrap();
                let mut send = respond.send_response(response, false).expect("respond");
                let mut total = 0;
                while let Some(chunk) = body.data().await {
                    let chunk = chunk.expect("data");
                    body.flow_control().release_capacity(chunk.len()).unwrap();
                    total += chunk.len();
                    send.reserve_capacity(chunk.len());
                    send.send_data(chunk, false).expect("send");
                }
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                trailers.insert("x-seen", total.to_string().parse().unwrap());
                send.send_trailers(trailers).expect("trailers");
            });
        }
    });
    let mut io = client_io;
    let mut conn = Connection::new(
        Role::Client,
        Config {
            stream_window: 65_535,
            ..Config::default()
        },
        None,
    );
    let mut input = BytesMut::new();
    // Wait for the server's SETTINGS.
    while !conn.is_open() {
        flush(&mut conn, &mut io).await;
        io.read_buf(&mut input).await.expect("read");
        if let Some(event) = conn.next_event(&mut input).expect("no error") {
            panic!("{event:?}");
        }
    }
    let lens = [0usize, 10, 100_000, 2 << 20];
    let mut expect = std::collections::HashMap::new();
    for (i, len) in lens.into_iter().enumerate() {
        let id = conn.open_stream().expect("open");
        conn.send_headers(id, false, |w| {
            w.field(b":method", b"POST", Indexing::Incremental);
            w.field(b":scheme", b"http", Indexing::Incremental);
            w.field(b":path", b"/echo.Echo/Say", Indexing::Incremental);
            w.field(b":authority", b"localhost", Indexing::Incremental);
            w.field(b"te", b"trailers", Indexing::Incremental);
        });
        let body = pattern(len, i as u8);
        conn.send_data(id, body.clone(), true);
        expect.insert(id, (body, BytesMut::new(), false));
    }
    let mut done = 0;
    while done < lens.len() {
        flush(&mut conn, &mut io).await;
        input.reserve(64 * 1024);
        assert!(
            io.read_buf(&mut input).await.expect("read") > 0,
            "server closed"
        );
        while let Some(event) = conn.next_event(&mut input).expect("no error") {
            match event {
                Event::Headers {
                    stream,
                    fields,
                    end_stream,
                    ..
                } => {
                    let (body, echoed, headers) = expect.get_mut(&stream).unwrap();
                    if !*headers {
                        *headers = true;
                        assert!(fields.iter().any(|(n, v)| n == ":status" && v == "200"));
                    } else {
                        assert!(end_stream);
                        let seen = fields.iter().find(|(n, _)| n == "x-seen").unwrap();
                        assert_eq!(seen.1, body.len().to_string());
                        assert!(echoed[..] == body[..], "stream {stream}: the echo differs");
                        done += 1;
                    }
                }
                Event::Data { stream, data, .. } => {
                    conn.release(stream, data.len());
                    expect.get_mut(&stream).unwrap().1.extend_from_slice(&data);
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!(conn.open_streams(), 0);
}
