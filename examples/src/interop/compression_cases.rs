//! The compression cases. Unary messages can be forced compressed or not
//! (`Request::set_compress`, `Response::set_compress`); stream messages are compressed
//! by size alone (the channel's or server's threshold, 1 KiB by default), which is where
//! these cases depart from gRPC's.

use rpc_core::{client::Channel, Code};
use rpc_proto::testing::{
    test_service_client::TestServiceClient, BoolValue, Empty, SimpleRequest,
    StreamingInputCallRequest,
};

use super::{
    support::{
        call, check_payload, check_status, drain, failed, output_request, LARGE_REQUEST,
        LARGE_RESPONSE,
    },
    zeros,
};

/// A `large_unary` request with `expect_compressed` set.
fn expecting(compressed: bool) -> SimpleRequest {
    SimpleRequest {
        expect_compressed: Some(BoolValue { value: compressed }),
        response_size: LARGE_RESPONSE as i32,
        payload: Some(zeros(LARGE_REQUEST)),
        ..Default::default()
    }
}

/// Lets the server tell this connection that it accepts compressed messages (it says
/// so in its answers): one call before the first that must be compressed.
async fn negotiate(client: &mut TestServiceClient) -> Result<(), String> {
    client
        .empty_call(call(Empty {}))
        .await
        .map_err(failed("EmptyCall (negotiating compression)"))?;
    Ok(())
}

/// `UnaryCall` three times: an uncompressed probe saying `expect_compressed: true`
/// (the server must refuse it, `INVALID_ARGUMENT`), then a compressed request saying
/// true and an uncompressed one saying false (both answered, 314,159 bytes). Each
/// request's compression is forced with `Request::set_compress`.
pub(super) async fn client_compressed_unary(channel: Channel) -> Result<(), String> {
    let mut client = TestServiceClient::new(channel);
    negotiate(&mut client).await?;
    let mut probe = call(expecting(true));
    probe.set_compress(Some(false));
    let result = client.unary_call(probe).await;
    check_status(
        "the uncompressed probe",
        result,
        Code::INVALID_ARGUMENT,
        None,
    )?;
    for compress in [true, false] {
        let what = if compress {
            "compressed"
        } else {
            "uncompressed"
        };
        let mut request = call(expecting(compress));
        request.set_compress(Some(compress));
        let response = client
            .unary_call(request)
            .await
            .map_err(failed(&format!("the {what} UnaryCall")))?;
        check_payload(what, response.get_ref().payload.as_ref(), LARGE_RESPONSE)?;
    }
    Ok(())
}

/// `UnaryCall` twice, asking for a compressed and an uncompressed response; the
/// client checks each response's compression flag (`Response::compressed`).
pub(super) async fn server_compressed_unary(channel: Channel) -> Result<(), String> {
    let mut client = TestServiceClient::new(channel);
    for compressed in [true, false] {
        let response = client
            .unary_call(call(SimpleRequest {
                response_compressed: Some(BoolValue { value: compressed }),
                response_size: LARGE_RESPONSE as i32,
                payload: Some(zeros(LARGE_REQUEST)),
                ..Default::default()
            }))
            .await
            .map_err(failed(&format!(
                "UnaryCall (response_compressed: {compressed})"
            )))?;
        ensure!(
            response.compressed() == compressed,
            "response_compressed: {compressed}, but the response arrived {}",
            if response.compressed() {
                "compressed"
            } else {
                "uncompressed"
            }
        );
        check_payload(
            "the response",
            response.get_ref().payload.as_ref(),
            LARGE_RESPONSE,
        )?;
    }
    Ok(())
}

/// `StreamingInputCall` twice: an uncompressed probe (27,182 bytes) saying
/// `expect_compressed: true`, which the server must refuse with `INVALID_ARGUMENT`, sent
/// on the channel without compression, since stream messages are compressed by size
/// alone (there is no per-message switch on streams); then, on the compressing
/// channel, 27,182 bytes saying true (compressed: above the 1 KiB threshold) and
/// 45,904 saying false: the server counts 73,086. The second message is compressed
/// too, for the same reason; the server checks only `expect_compressed: true`, as
/// gRPC's `CompressedRequest` feature defines it.
pub(super) async fn client_compressed_streaming(
    channel: Channel,
    plain: Channel,
) -> Result<(), String> {
    let request = |size: usize, compressed: bool| StreamingInputCallRequest {
        payload: Some(zeros(size)),
        expect_compressed: Some(BoolValue { value: compressed }),
    };
    let result = TestServiceClient::new(plain)
        .streaming_input_call(call(futures::stream::iter([request(27_182, true)])))
        .await;
    check_status(
        "the uncompressed probe",
        result,
        Code::INVALID_ARGUMENT,
        None,
    )?;
    let mut client = TestServiceClient::new(channel);
    negotiate(&mut client).await?;
    let requests = [request(27_182, true), request(45_904, false)];
    let response = client
        .streaming_input_call(call(futures::stream::iter(requests)))
        .await
        .map_err(failed("StreamingInputCall"))?;
    let total = response.get_ref().aggregated_payload_size;
    ensure!(
        total == 73_086,
        "aggregated_payload_size {total}; expected 73086"
    );
    Ok(())
}

/// `StreamingOutputCall` asking for 31,415 bytes compressed and 92,653 not: two
/// responses of those sizes; the first must arrive compressed
/// (`Streaming::last_compressed`). Stream messages are compressed by size alone, so
/// the server cannot leave the second uncompressed and the client does not check it
/// (gRPC's description makes both checks "if supported by the implementation").
pub(super) async fn server_compressed_streaming(channel: Channel) -> Result<(), String> {
    let mut request = output_request(&[31_415, 92_653], 0);
    request.response_parameters[0].compressed = Some(BoolValue { value: true });
    request.response_parameters[1].compressed = Some(BoolValue { value: false });
    let mut responses = TestServiceClient::new(channel)
        .streaming_output_call(call(request))
        .await
        .map_err(failed("StreamingOutputCall"))?
        .into_inner();
    let first = responses
        .message()
        .await
        .map_err(failed("reading response 0"))?
        .ok_or("the stream ended before response 0")?;
    ensure!(
        responses.last_compressed(),
        "response 0 asked to be compressed arrived uncompressed"
    );
    check_payload("response 0", first.payload.as_ref(), 31_415)?;
    let rest = drain(&mut responses)
        .await
        .map_err(failed("StreamingOutputCall's stream"))?;
    ensure!(rest.len() == 1, "{} responses; expected 2", rest.len() + 1);
    check_payload("response 1", rest[0].payload.as_ref(), 92_653)
}
