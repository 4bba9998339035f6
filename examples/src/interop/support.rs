//! What the cases share: the deadline every call carries, the checks of payloads and
//! statuses, and request and response streams.

use futures::{Stream, StreamExt};
use rpc_core::{Code, Request, Status};
use rpc_proto::testing::{
    test_service_client::TestServiceClient, Payload, PayloadType, ResponseParameters,
    StreamingOutputCallRequest, StreamingOutputCallResponse,
};
use tokio::sync::mpsc;

use super::{client::CALL_TIMEOUT, zeros};

/// Request and response payload sizes of `large_unary` and its variants.
pub(super) const LARGE_REQUEST: usize = 271_828;
pub(super) const LARGE_RESPONSE: usize = 314_159;

/// Wraps a message in a request with the hang-guard deadline.
pub(super) fn call<T>(message: T) -> Request<T> {
    Request::new(message).with_timeout(CALL_TIMEOUT)
}

/// Formats a call's failure for the report.
pub(super) fn failed(what: &str) -> impl FnOnce(Status) -> String + '_ {
    move |status| format!("{what} failed: {status}")
}

/// Checks that `payload` is `len` zero bytes of type `COMPRESSABLE`.
pub(super) fn check_payload(
    what: &str,
    payload: Option<&Payload>,
    len: usize,
) -> Result<(), String> {
    let Some(payload) = payload else {
        return Err(format!("{what}: no payload"));
    };
    ensure!(
        payload.body.len() == len,
        "{what}: payload of {} bytes, expected {len}",
        payload.body.len()
    );
    ensure!(
        payload.body.iter().all(|&b| b == 0),
        "{what}: payload is not all zeros"
    );
    ensure!(
        payload.r#type == PayloadType::Compressable as i32,
        "{what}: payload type {}, expected COMPRESSABLE",
        payload.r#type
    );
    Ok(())
}

/// Checks that a call failed with `code` (and `message`, if given).
pub(super) fn check_status<T>(
    what: &str,
    result: Result<T, Status>,
    code: Code,
    message: Option<&str>,
) -> Result<(), String> {
    let status = match result {
        Ok(_) => return Err(format!("{what} succeeded; expected {code}")),
        Err(status) => status,
    };
    ensure!(
        status.code() == code,
        "{what}: status {status}; expected {code}"
    );
    if let Some(message) = message {
        ensure!(
            status.message() == message,
            "{what}: status message {:?}; expected {message:?}",
            status.message()
        );
    }
    Ok(())
}

/// A `StreamingOutputCallRequest` asking for responses of `sizes`, carrying a payload
/// of `payload` zeros (none if 0).
pub(super) fn output_request(sizes: &[usize], payload: usize) -> StreamingOutputCallRequest {
    StreamingOutputCallRequest {
        response_parameters: sizes
            .iter()
            .map(|&size| ResponseParameters {
                size: size as i32,
                ..Default::default()
            })
            .collect(),
        payload: (payload > 0).then(|| zeros(payload)),
        ..Default::default()
    }
}

/// A request stream fed through `rx`: it ends when every sender is dropped (the
/// half-close), and its sender sees `closed()` once the framework drops the stream.
pub(super) fn channel_stream<T: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Reads a response stream to its end: the messages, or the status that ended it.
pub(super) async fn drain<T, S>(responses: &mut S) -> Result<Vec<T>, Status>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    let mut messages = Vec::new();
    while let Some(message) = responses.next().await {
        messages.push(message?);
    }
    Ok(messages)
}

/// Runs a whole `FullDuplexCall` with `requests`, half-closing after them.
pub(super) async fn full_duplex(
    client: &mut TestServiceClient,
    requests: Vec<StreamingOutputCallRequest>,
) -> Result<Vec<StreamingOutputCallResponse>, Status> {
    let mut responses = client
        .full_duplex_call(call(futures::stream::iter(requests)))
        .await?
        .into_inner();
    drain(&mut responses).await
}
