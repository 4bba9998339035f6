//! The cases that end calls early: cancelled after they began, cancelled after the
//! first response, and cut by a deadline. A caller here cancels by dropping the call
//! and gets no status back, so the cancel cases check what the caller can see (the
//! call had not ended, the framework let go of it, the channel goes on) instead of
//! gRPC's `CANCELLED`.

use futures::StreamExt;
use rpc_core::{client::Channel, Code, Request};
use rpc_proto::testing::{
    test_service_client::TestServiceClient, Empty, StreamingInputCallRequest,
};
use tokio::sync::{mpsc, oneshot};

use super::support::{
    call, channel_stream, check_payload, check_status, drain, failed, output_request,
};

/// Checks that the framework let go of a cancelled call's request stream, then that
/// the channel still carries calls.
async fn check_released<T>(
    sender: &mpsc::UnboundedSender<T>,
    channel: Channel,
) -> Result<(), String> {
    // Bounded by the case guard: a call the framework kept would hang here.
    sender.closed().await;
    TestServiceClient::new(channel)
        .empty_call(call(Empty {}))
        .await
        .map_err(failed("EmptyCall after the cancellation"))?;
    Ok(())
}

/// Starts a `StreamingInputCall` and cancels it (drops the call) once it is open: its
/// REQUEST frame, with the metadata, went out, and the framework asks for the first
/// message, which never comes. Then the checks of the module docs (that no handler is
/// left running on the server is checked by `tests/interop.rs`, on the server's side).
pub(super) async fn cancel_after_begin(channel: Channel) -> Result<(), String> {
    let (tx, mut rx) = mpsc::unbounded_channel::<StreamingInputCallRequest>();
    let (opened_tx, opened) = oneshot::channel();
    let mut opened_tx = Some(opened_tx);
    let requests = futures::stream::poll_fn(move |cx| {
        if let Some(opened) = opened_tx.take() {
            let _ = opened.send(());
        }
        rx.poll_recv(cx)
    });
    let mut client = TestServiceClient::new(channel.clone());
    {
        let mut pending = std::pin::pin!(client.streaming_input_call(call(requests)));
        tokio::select! {
            biased;
            result = &mut pending => {
                return Err(format!(
                    "the call ended before it was cancelled: {}",
                    result.map_or_else(|s| s.to_string(), |_| "OK".into())
                ));
            }
            opened = opened => {
                opened.map_err(|_| "the call was dropped before it opened".to_owned())?;
            }
        }
        // Dropping `pending` here cancels the call.
    }
    check_released(&tx, channel).await
}

/// Starts a `FullDuplexCall` (31,415 bytes asked for, 27,182 sent), reads the first
/// response, and cancels by dropping the response stream. As in `cancel_after_begin`,
/// the checks stand in for a `CANCELLED` status the caller does not get.
pub(super) async fn cancel_after_first_response(channel: Channel) -> Result<(), String> {
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(output_request(&[31_415], 27_182))
        .map_err(|_| "the request stream is gone".to_owned())?;
    let mut responses = TestServiceClient::new(channel.clone())
        .full_duplex_call(call(channel_stream(rx)))
        .await
        .map_err(failed("FullDuplexCall"))?
        .into_inner();
    let first = responses
        .message()
        .await
        .map_err(failed("reading the first response"))?
        .ok_or("the stream ended without a response")?;
    check_payload("the first response", first.payload.as_ref(), 31_415)?;
    drop(responses); // the cancellation; `tx` is kept: no half-close
    check_released(&tx, channel).await
}

/// `FullDuplexCall` with one request (27,182 bytes) and no half-close, with a 1 ms
/// deadline: `DEADLINE_EXCEEDED`, whether it passes before the server's headers come
/// back or while the stream is read.
pub(super) async fn timeout_on_sleeping_server(channel: Channel) -> Result<(), String> {
    let request = output_request(&[], 27_182);
    let requests = futures::stream::iter([request]).chain(futures::stream::pending());
    let result = async {
        let mut responses = TestServiceClient::new(channel)
            .full_duplex_call(
                Request::new(requests).with_timeout(std::time::Duration::from_millis(1)),
            )
            .await?
            .into_inner();
        drain(&mut responses).await
    }
    .await;
    check_status("FullDuplexCall", result, Code::DEADLINE_EXCEEDED, None)
}
