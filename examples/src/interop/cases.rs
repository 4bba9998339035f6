//! The cases of plain calls and streams, metadata and statuses, one function each,
//! with gRPC's requests, sizes and checks. The cancel, deadline and compression cases
//! are in `cancel_cases` and `compression_cases`.

use rpc_core::{bytes::Bytes, client::Channel, Code, Metadata};
use rpc_proto::testing::{
    test_service_client::TestServiceClient,
    unimplemented_service_client::UnimplementedServiceClient, EchoStatus, Empty, SimpleRequest,
    StreamingInputCallRequest, StreamingOutputCallRequest,
};
use tokio::sync::mpsc;

use super::{
    support::{
        call, channel_stream, check_payload, check_status, drain, failed, full_duplex,
        output_request, LARGE_REQUEST, LARGE_RESPONSE,
    },
    zeros, ECHO_INITIAL_KEY, ECHO_TRAILING_KEY,
};

/// Request payloads of `client_streaming` and `ping_pong`.
const REQUEST_SIZES: [usize; 4] = [27_182, 8, 1_828, 45_904];

/// Response payloads of `server_streaming` and `ping_pong`.
const RESPONSE_SIZES: [usize; 4] = [31_415, 9, 2_653, 58_979];

/// The status message of `special_status_message`: whitespace, BMP and non-BMP text.
const SPECIAL_MESSAGE: &str = "\t\ntest with whitespace\r\nand Unicode BMP ☺ and non-BMP 😈\t\n";

/// Metadata values of `custom_metadata`.
const INITIAL_VALUE: &str = "test_initial_metadata_value";
const TRAILING_VALUE: [u8; 3] = [0xab, 0xab, 0xab];

/// `EmptyCall` with the empty message; it succeeds with the empty message (gRPC's
/// "response is non-null": the answer decoded as `Empty`).
pub(super) async fn empty_unary(channel: Channel) -> Result<(), String> {
    let response = TestServiceClient::new(channel)
        .empty_call(call(Empty {}))
        .await
        .map_err(failed("EmptyCall"))?;
    let Empty {} = response.into_inner();
    Ok(())
}

/// `UnaryCall`: 271,828 zeros out, 314,159 zeros back.
pub(super) async fn large_unary(channel: Channel) -> Result<(), String> {
    let response = TestServiceClient::new(channel)
        .unary_call(call(SimpleRequest {
            response_size: LARGE_RESPONSE as i32,
            payload: Some(zeros(LARGE_REQUEST)),
            ..Default::default()
        }))
        .await
        .map_err(failed("UnaryCall"))?;
    check_payload(
        "UnaryCall",
        response.get_ref().payload.as_ref(),
        LARGE_RESPONSE,
    )
}

/// `StreamingInputCall` with payloads of 27,182, 8, 1,828 and 45,904 zeros, then the
/// half-close; the server counts 74,922 bytes.
pub(super) async fn client_streaming(channel: Channel) -> Result<(), String> {
    let requests = REQUEST_SIZES.map(|size| StreamingInputCallRequest {
        payload: Some(zeros(size)),
        ..Default::default()
    });
    let response = TestServiceClient::new(channel)
        .streaming_input_call(call(futures::stream::iter(requests)))
        .await
        .map_err(failed("StreamingInputCall"))?;
    let total = response.get_ref().aggregated_payload_size;
    ensure!(
        total == 74_922,
        "aggregated_payload_size {total}; expected 74922"
    );
    Ok(())
}

/// `StreamingOutputCall` asking for 31,415, 9, 2,653 and 58,979 bytes: exactly four
/// responses of those sizes, in order.
pub(super) async fn server_streaming(channel: Channel) -> Result<(), String> {
    let mut responses = TestServiceClient::new(channel)
        .streaming_output_call(call(output_request(&RESPONSE_SIZES, 0)))
        .await
        .map_err(failed("StreamingOutputCall"))?
        .into_inner();
    let messages = drain(&mut responses)
        .await
        .map_err(failed("StreamingOutputCall's stream"))?;
    ensure!(
        messages.len() == RESPONSE_SIZES.len(),
        "{} responses; expected {}",
        messages.len(),
        RESPONSE_SIZES.len()
    );
    for (i, (message, size)) in messages.iter().zip(RESPONSE_SIZES).enumerate() {
        check_payload(&format!("response {i}"), message.payload.as_ref(), size)?;
    }
    Ok(())
}

/// `FullDuplexCall`: each of four requests is sent after the answer to the previous
/// one arrived; then the half-close, and the stream ends with no more responses.
pub(super) async fn ping_pong(channel: Channel) -> Result<(), String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut client = TestServiceClient::new(channel);
    let send = |i: usize| {
        tx.send(output_request(&[RESPONSE_SIZES[i]], REQUEST_SIZES[i]))
            .map_err(|_| format!("the request stream was dropped before request {i}"))
    };
    send(0)?;
    let mut responses = client
        .full_duplex_call(call(channel_stream(rx)))
        .await
        .map_err(failed("FullDuplexCall"))?
        .into_inner();
    for (i, size) in RESPONSE_SIZES.iter().enumerate() {
        if i > 0 {
            send(i)?;
        }
        let message = responses
            .message()
            .await
            .map_err(failed(&format!("reading response {i}")))?
            .ok_or_else(|| format!("the stream ended after {i} responses"))?;
        check_payload(&format!("response {i}"), message.payload.as_ref(), *size)?;
    }
    drop(tx); // the half-close
    let rest = drain(&mut responses)
        .await
        .map_err(failed("the end of the stream"))?;
    ensure!(rest.is_empty(), "{} responses more than four", rest.len());
    Ok(())
}

/// `FullDuplexCall` that half-closes at once: no responses, and success.
pub(super) async fn empty_stream(channel: Channel) -> Result<(), String> {
    let responses = full_duplex(&mut TestServiceClient::new(channel), Vec::new())
        .await
        .map_err(failed("FullDuplexCall"))?;
    ensure!(
        responses.is_empty(),
        "{} responses; expected none",
        responses.len()
    );
    Ok(())
}

/// Echo metadata on `UnaryCall` and `FullDuplexCall`: `x-grpc-test-echo-initial`
/// comes back in the headers, `x-grpc-test-echo-trailing-bin` in the trailers. On a
/// unary call our trailers travel with the headers, so there the trailing value is
/// looked for in the response metadata.
pub(super) async fn custom_metadata(channel: Channel) -> Result<(), String> {
    let mut metadata = Metadata::new();
    metadata
        .insert(ECHO_INITIAL_KEY, INITIAL_VALUE)
        .and_then(|()| metadata.insert(ECHO_TRAILING_KEY, Bytes::from_static(&TRAILING_VALUE)))
        .map_err(|e| format!("building the metadata: {e}"))?;
    let check_initial = |what: &str, got: &Metadata| {
        let value = got.get_str(ECHO_INITIAL_KEY);
        ensure!(
            value == Some(INITIAL_VALUE),
            "{what}: {ECHO_INITIAL_KEY} is {value:?} in the headers; expected {INITIAL_VALUE:?}"
        );
        Ok(())
    };
    let check_trailing = |what: &str, got: Option<&Metadata>| {
        let value = got
            .and_then(|m| m.get(ECHO_TRAILING_KEY))
            .map(|v| v.as_bytes());
        ensure!(
            value == Some(&TRAILING_VALUE[..]),
            "{what}: {ECHO_TRAILING_KEY} is {value:?} in the trailers; expected {TRAILING_VALUE:?}"
        );
        Ok(())
    };
    let mut client = TestServiceClient::new(channel);

    let mut request = call(SimpleRequest {
        response_size: LARGE_RESPONSE as i32,
        payload: Some(zeros(LARGE_REQUEST)),
        ..Default::default()
    });
    *request.metadata_mut() = metadata.clone();
    let response = client
        .unary_call(request)
        .await
        .map_err(failed("UnaryCall"))?;
    check_payload(
        "UnaryCall",
        response.get_ref().payload.as_ref(),
        LARGE_RESPONSE,
    )?;
    check_initial("UnaryCall", response.metadata())?;
    check_trailing("UnaryCall", Some(response.metadata()))?;

    let request = output_request(&[LARGE_RESPONSE], LARGE_REQUEST);
    let mut request = call(futures::stream::iter([request]));
    *request.metadata_mut() = metadata;
    let response = client
        .full_duplex_call(request)
        .await
        .map_err(failed("FullDuplexCall"))?;
    check_initial("FullDuplexCall", response.metadata())?;
    let mut responses = response.into_inner();
    let messages = drain(&mut responses)
        .await
        .map_err(failed("FullDuplexCall's stream"))?;
    ensure!(
        messages.len() == 1,
        "{} responses; expected 1",
        messages.len()
    );
    check_payload(
        "FullDuplexCall",
        messages[0].payload.as_ref(),
        LARGE_RESPONSE,
    )?;
    check_trailing("FullDuplexCall", responses.trailers())
}

/// A status asked for in the request (code 2, "test status message") ends
/// `UnaryCall`, and `FullDuplexCall` after its half-close, with that code and message.
pub(super) async fn status_code_and_message(channel: Channel) -> Result<(), String> {
    const MESSAGE: &str = "test status message";
    let status = EchoStatus {
        code: 2,
        message: MESSAGE.into(),
    };
    let mut client = TestServiceClient::new(channel);
    let result = client
        .unary_call(call(SimpleRequest {
            response_status: Some(status.clone()),
            ..Default::default()
        }))
        .await;
    check_status("UnaryCall", result, Code::UNKNOWN, Some(MESSAGE))?;
    let request = StreamingOutputCallRequest {
        response_status: Some(status),
        ..Default::default()
    };
    let result = full_duplex(&mut client, vec![request]).await;
    check_status("FullDuplexCall", result, Code::UNKNOWN, Some(MESSAGE))
}

/// A status message with tabs, CR LF, a BMP and a non-BMP character comes back
/// byte for byte.
pub(super) async fn special_status_message(channel: Channel) -> Result<(), String> {
    let result = TestServiceClient::new(channel)
        .unary_call(call(SimpleRequest {
            response_status: Some(EchoStatus {
                code: 2,
                message: SPECIAL_MESSAGE.into(),
            }),
            ..Default::default()
        }))
        .await;
    check_status("UnaryCall", result, Code::UNKNOWN, Some(SPECIAL_MESSAGE))
}

/// `TestService/UnimplementedCall`, which the server leaves unimplemented.
pub(super) async fn unimplemented_method(channel: Channel) -> Result<(), String> {
    let result = TestServiceClient::new(channel)
        .unimplemented_call(call(Empty {}))
        .await;
    check_status("UnimplementedCall", result, Code::UNIMPLEMENTED, None)
}

/// `UnimplementedService/UnimplementedCall`, a service the server does not have.
pub(super) async fn unimplemented_service(channel: Channel) -> Result<(), String> {
    let result = UnimplementedServiceClient::new(channel)
        .unimplemented_call(call(Empty {}))
        .await;
    check_status(
        "UnimplementedService/UnimplementedCall",
        result,
        Code::UNIMPLEMENTED,
        None,
    )
}
