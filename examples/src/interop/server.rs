//! [`InteropService`]: `grpc.testing.TestService` as gRPC's interop descriptions
//! specify it (their "Server" section), plus counts of its streaming handlers (running,
//! cancelled), so in-process tests can check the server's side of the cancel cases.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::{stream::BoxStream, StreamExt};
use rpc_core::{stream::Streaming, Code, Metadata, Request, Response, Status};
use rpc_proto::testing::{
    test_service_server::{TestService, TestServiceServer},
    BoolValue, EchoStatus, Empty, PayloadType, ResponseParameters, SimpleRequest, SimpleResponse,
    StreamingInputCallRequest, StreamingInputCallResponse, StreamingOutputCallRequest,
    StreamingOutputCallResponse,
};
use tokio::sync::watch;

use super::{zeros, ECHO_INITIAL_KEY, ECHO_TRAILING_KEY};

/// Largest payload the server builds for one response (`response_size`,
/// `ResponseParameters.size`): a peer's number must not decide how much we allocate.
/// The largest the interop cases ask for is 314,159 bytes.
pub const MAX_RESPONSE_SIZE: usize = 4 << 20;

/// Most request messages `HalfDuplexCall` holds before answering (it answers only
/// after the client half-closes, so it must buffer them).
pub const MAX_HALF_DUPLEX_REQUESTS: usize = 1024;

/// Most bytes `HalfDuplexCall` holds before answering (payloads and parameters).
pub const MAX_HALF_DUPLEX_BYTES: usize = 16 << 20;

/// The interop `TestService`. Clones share the [`ServerStats`].
#[derive(Clone, Debug, Default)]
pub struct InteropService {
    stats: Arc<ServerStats>,
}

/// What the service saw that a client cannot: its streaming handlers (those of
/// `StreamingInputCall` and `FullDuplexCall`, which the cancel cases use) running now,
/// and those that ended because the client cancelled (or the deadline passed) rather
/// than by finishing.
#[derive(Debug)]
pub struct ServerStats {
    counts: watch::Sender<HandlerCounts>,
}

/// Handler counts of [`ServerStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HandlerCounts {
    /// Handlers (or response streams) alive now.
    pub running: usize,
    /// Handlers (or response streams) dropped before they finished, so far.
    pub cancelled: usize,
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            counts: watch::Sender::new(HandlerCounts::default()),
        }
    }
}

impl ServerStats {
    /// The counts now.
    pub fn counts(&self) -> HandlerCounts {
        *self.counts.borrow()
    }

    /// Waits until the counts satisfy `done`.
    pub async fn wait_for(&self, mut done: impl FnMut(&HandlerCounts) -> bool) {
        let mut rx = self.counts.subscribe();
        // The sender lives in `self`, so it cannot close while we wait.
        let _ = rx.wait_for(|counts| done(counts)).await;
    }
}

impl InteropService {
    /// The stats of this service and its clones.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// The service to add to a server: `Server::builder().add_service(..)`.
    pub fn into_service(self) -> TestServiceServer<InteropService> {
        TestServiceServer::new(self)
    }

    /// Counts a handler as running until it finishes or is dropped.
    fn guard(&self) -> CancelGuard {
        self.stats.counts.send_modify(|c| c.running += 1);
        CancelGuard {
            stats: Some(self.stats.clone()),
        }
    }
}

/// A running handler: counted as cancelled if dropped before [`CancelGuard::finish`].
struct CancelGuard {
    stats: Option<Arc<ServerStats>>,
}

impl CancelGuard {
    /// Ends the handler as its request stream ended it: a stream that failed with
    /// CANCELLED is the server telling the handler of the client's cancel (a handler
    /// running at that instant on another worker reads it before its task is
    /// aborted), which counts as cancelled; any other end, well or not, does not.
    fn ended_by(&mut self, result: &Result<impl Sized, Status>) {
        if !matches!(result, Err(status) if status.code() == Code::CANCELLED) {
            self.finish();
        }
    }

    fn finish(&mut self) {
        if let Some(stats) = self.stats.take() {
            stats.counts.send_modify(|c| c.running -= 1);
        }
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(stats) = self.stats.take() {
            stats.counts.send_modify(|c| {
                c.running -= 1;
                c.cancelled += 1;
            });
        }
    }
}

/// Splits the echo metadata of a request into (headers, trailers) for the response.
fn echo_metadata(request: &Metadata) -> (Metadata, Metadata) {
    let mut headers = Metadata::new();
    let mut trailers = Metadata::new();
    for (key, value) in request.iter() {
        // The keys and values came from valid metadata, so appending cannot fail.
        if key == ECHO_INITIAL_KEY {
            let _ = headers.append(ECHO_INITIAL_KEY, value.clone());
        } else if key == ECHO_TRAILING_KEY {
            let _ = trailers.append(ECHO_TRAILING_KEY, value.clone());
        }
    }
    (headers, trailers)
}

/// The status a request asks the server to end the call with, if any (code 0: none).
fn requested_status(status: Option<&EchoStatus>) -> Option<Status> {
    let status = status?;
    match u32::try_from(status.code) {
        Ok(0) => None,
        Ok(code) => Some(Status::new(Code::from_u32(code), status.message.clone())),
        Err(_) => Some(Status::invalid_argument(format!(
            "response_status.code {} is negative",
            status.code
        ))),
    }
}

/// Checks the payload type a request asks for (only `COMPRESSABLE` exists).
fn check_type(response_type: i32) -> Result<(), Status> {
    if response_type == PayloadType::Compressable as i32 {
        Ok(())
    } else {
        Err(Status::invalid_argument(format!(
            "unsupported response_type {response_type}"
        )))
    }
}

/// Checks a requested payload size: not negative, at most [`MAX_RESPONSE_SIZE`].
fn response_size(size: i32) -> Result<usize, Status> {
    match usize::try_from(size) {
        Ok(size) if size <= MAX_RESPONSE_SIZE => Ok(size),
        Ok(_) => Err(Status::invalid_argument(format!(
            "response size {size} exceeds the server's {MAX_RESPONSE_SIZE}"
        ))),
        Err(_) => Err(Status::invalid_argument(format!(
            "response size {size} is negative"
        ))),
    }
}

/// Validates every parameter of a streaming request before any answer is sent.
fn check_parameters(params: &[ResponseParameters]) -> Result<(), Status> {
    for p in params {
        response_size(p.size)?;
        if p.interval_us < 0 {
            return Err(Status::invalid_argument(format!(
                "interval_us {} is negative",
                p.interval_us
            )));
        }
    }
    Ok(())
}

/// One streamed answer: waits `interval_us`, then a payload of `size` zeros.
async fn respond(params: ResponseParameters) -> StreamingOutputCallResponse {
    let interval = Duration::from_micros(u64::try_from(params.interval_us).unwrap_or(0));
    if !interval.is_zero() {
        tokio::time::sleep(interval).await;
    }
    // Checked by `check_parameters` when the request arrived.
    let size = response_size(params.size).unwrap_or(0);
    StreamingOutputCallResponse {
        payload: Some(zeros(size)),
        ..Default::default()
    }
}

/// A response stream carrying the request's echo metadata.
fn stream_response<S>(request_metadata: &Metadata, stream: S) -> Response<S> {
    let (headers, trailers) = echo_metadata(request_metadata);
    let mut response = Response::new(stream);
    *response.metadata_mut() = headers;
    *response.trailers_mut() = trailers;
    response
}

/// Reads a `StreamingInputCall` to its end: the total size of the payloads.
async fn aggregate(requests: &mut Streaming<StreamingInputCallRequest>) -> Result<i32, Status> {
    let mut total: i32 = 0;
    while let Some(message) = requests.message().await? {
        // Stream messages are compressed by size alone (there is no per-message
        // switch), so only `true` is checked, as gRPC's CompressedRequest does.
        if message.expect_compressed.is_some_and(|e| e.value) && !requests.last_compressed() {
            return Err(Status::invalid_argument(
                "expect_compressed is true, but the message arrived uncompressed",
            ));
        }
        let len = message.payload.as_ref().map_or(0, |p| p.body.len());
        total = i32::try_from(len)
            .ok()
            .and_then(|len| total.checked_add(len))
            .ok_or_else(|| Status::out_of_range("the aggregated payload size overflows"))?;
    }
    Ok(total)
}

/// The state of a `FullDuplexCall` answer stream.
struct Duplex {
    requests: Streaming<StreamingOutputCallRequest>,
    queue: VecDeque<ResponseParameters>,
    guard: CancelGuard,
}

impl TestService for InteropService {
    async fn empty_call(&self, request: Request<Empty>) -> Result<Response<Empty>, Status> {
        let (headers, trailers) = echo_metadata(request.metadata());
        let mut response = Response::new(Empty {});
        *response.metadata_mut() = headers;
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    async fn unary_call(
        &self,
        request: Request<SimpleRequest>,
    ) -> Result<Response<SimpleResponse>, Status> {
        let (headers, trailers) = echo_metadata(request.metadata());
        let compressed = request.compressed();
        let request = request.into_inner();
        if let Some(status) = requested_status(request.response_status.as_ref()) {
            let mut metadata = headers;
            metadata.extend(trailers);
            return Err(status.with_metadata(metadata));
        }
        // A unary request's compression is the client's to choose (`set_compress`), so
        // both answers are checked, not only `true` as gRPC's CompressedRequest does.
        if let Some(BoolValue { value: expected }) = request.expect_compressed {
            if expected != compressed {
                return Err(Status::invalid_argument(format!(
                    "expect_compressed is {expected}, but the request arrived {}",
                    if compressed {
                        "compressed"
                    } else {
                        "uncompressed"
                    }
                )));
            }
        }
        check_type(request.response_type)?;
        let size = response_size(request.response_size)?;
        let mut response = Response::new(SimpleResponse {
            payload: Some(zeros(size)),
            ..Default::default()
        });
        *response.metadata_mut() = headers;
        *response.trailers_mut() = trailers;
        // `None` leaves it to the server's size threshold.
        response.set_compress(request.response_compressed.map(|c| c.value));
        Ok(response)
    }

    /// Answers with the current time (nanoseconds, in decimal) as the payload. The
    /// cache-control headers gRPC adds for HTTP caches have no meaning here.
    async fn cacheable_unary_call(
        &self,
        _request: Request<SimpleRequest>,
    ) -> Result<Response<SimpleResponse>, Status> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let mut payload = zeros(0);
        payload.body = now.to_string().into_bytes().into();
        Ok(Response::new(SimpleResponse {
            payload: Some(payload),
            ..Default::default()
        }))
    }

    type StreamingOutputCallStream =
        BoxStream<'static, Result<StreamingOutputCallResponse, Status>>;

    /// `ResponseParameters.compressed` cannot be honoured per message: stream messages
    /// are compressed by the server's size threshold.
    async fn streaming_output_call(
        &self,
        request: Request<StreamingOutputCallRequest>,
    ) -> Result<Response<Self::StreamingOutputCallStream>, Status> {
        let metadata = request.metadata().clone();
        let request = request.into_inner();
        if let Some(status) = requested_status(request.response_status.as_ref()) {
            return Err(status);
        }
        check_type(request.response_type)?;
        check_parameters(&request.response_parameters)?;
        let answers = futures::stream::iter(request.response_parameters)
            .then(|params| async move { Ok(respond(params).await) });
        Ok(stream_response(&metadata, answers.boxed()))
    }

    async fn streaming_input_call(
        &self,
        request: Request<Streaming<StreamingInputCallRequest>>,
    ) -> Result<Response<StreamingInputCallResponse>, Status> {
        let mut guard = self.guard();
        let (headers, trailers) = echo_metadata(request.metadata());
        let mut requests = request.into_inner();
        let total = aggregate(&mut requests).await;
        guard.ended_by(&total);
        let total = total?;
        let mut response = Response::new(StreamingInputCallResponse {
            aggregated_payload_size: total,
        });
        *response.metadata_mut() = headers;
        *response.trailers_mut() = trailers;
        Ok(response)
    }

    type FullDuplexCallStream = BoxStream<'static, Result<StreamingOutputCallResponse, Status>>;

    /// Answers each request's parameters as the request arrives; a request with a
    /// `response_status` ends the call with that status.
    async fn full_duplex_call(
        &self,
        request: Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::FullDuplexCallStream>, Status> {
        let metadata = request.metadata().clone();
        let state = Duplex {
            requests: request.into_inner(),
            queue: VecDeque::new(),
            guard: self.guard(),
        };
        let answers = futures::stream::unfold(Some(state), |state| async move {
            let mut state = state?;
            loop {
                if let Some(params) = state.queue.pop_front() {
                    return Some((Ok(respond(params).await), Some(state)));
                }
                let request = match state.requests.message().await {
                    Ok(Some(request)) => request,
                    Ok(None) => {
                        state.guard.finish();
                        return None;
                    }
                    Err(status) => {
                        state.guard.ended_by(&Err::<(), _>(status.clone()));
                        return Some((Err(status), None));
                    }
                };
                let refused = requested_status(request.response_status.as_ref())
                    .map_or_else(|| check_type(request.response_type), Err)
                    .and_then(|()| check_parameters(&request.response_parameters));
                if let Err(status) = refused {
                    state.guard.finish();
                    return Some((Err(status), None));
                }
                state.queue.extend(request.response_parameters);
            }
        });
        Ok(stream_response(&metadata, answers.boxed()))
    }

    type HalfDuplexCallStream = BoxStream<'static, Result<StreamingOutputCallResponse, Status>>;

    /// Reads every request until the client half-closes (up to
    /// [`MAX_HALF_DUPLEX_REQUESTS`] and [`MAX_HALF_DUPLEX_BYTES`]), then answers them in
    /// order.
    async fn half_duplex_call(
        &self,
        request: Request<Streaming<StreamingOutputCallRequest>>,
    ) -> Result<Response<Self::HalfDuplexCallStream>, Status> {
        let metadata = request.metadata().clone();
        let mut requests = request.into_inner();
        let mut params = Vec::new();
        let (mut count, mut bytes) = (0usize, 0usize);
        while let Some(request) = requests.message().await? {
            count += 1;
            bytes += request.payload.as_ref().map_or(0, |p| p.body.len())
                + request.response_parameters.len() * std::mem::size_of::<ResponseParameters>();
            if count > MAX_HALF_DUPLEX_REQUESTS || bytes > MAX_HALF_DUPLEX_BYTES {
                return Err(Status::resource_exhausted(format!(
                    "HalfDuplexCall holds at most {MAX_HALF_DUPLEX_REQUESTS} requests and \
                     {MAX_HALF_DUPLEX_BYTES} bytes"
                )));
            }
            if let Some(status) = requested_status(request.response_status.as_ref()) {
                return Err(status);
            }
            check_type(request.response_type)?;
            check_parameters(&request.response_parameters)?;
            params.extend(request.response_parameters);
        }
        let answers =
            futures::stream::iter(params).then(|params| async move { Ok(respond(params).await) });
        Ok(stream_response(&metadata, answers.boxed()))
    }

    /// Left unimplemented on purpose: the `unimplemented_method` case calls it.
    async fn unimplemented_call(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Empty>, Status> {
        Err(Status::unimplemented(
            "grpc.testing.TestService/UnimplementedCall is not implemented",
        ))
    }
}
