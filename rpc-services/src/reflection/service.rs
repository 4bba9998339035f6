//! The bidirectional `ServerReflectionInfo` stream of both protocol versions, over
//! one [`Index`]: each request in, its answer out, one at a time.

use std::sync::Arc;

use futures::{stream::BoxStream, Stream, StreamExt};
use prost::Message;
use rpc_core::{stream::Streaming, Request, Response, Status};

use super::{
    index::{Index, Sent},
    v1, v1alpha, Reflection,
};

/// Answers `requests` in order. The next request is read only once the previous
/// answer has been taken, so a client holds at most one request and one answer in
/// the server (beyond the transport's windows), and the stream's record of files
/// sent is bounded by the number of files in the index. A request that cannot be
/// read ends the call with its status.
fn answers(
    index: Arc<Index>,
    requests: impl Stream<Item = Result<v1::ServerReflectionRequest, Status>> + Send + 'static,
) -> impl Stream<Item = Result<v1::ServerReflectionResponse, Status>> + Send + 'static {
    let requests = Box::pin(requests);
    futures::stream::unfold(
        Some((index, requests, Sent::default())),
        |state| async move {
            let (index, mut requests, mut sent) = state?;
            match requests.next().await? {
                Ok(request) => {
                    let answer = index.answer(request, &mut sent);
                    Some((Ok(answer), Some((index, requests, sent))))
                }
                Err(status) => Some((Err(status), None)),
            }
        },
    )
}

/// One message as the other version's: the two versions' messages are the same
/// fields under another package name, so the encoding of one decodes as the other.
fn convert<A: Message, B: Message + Default>(message: &A) -> B {
    // Cannot fail for the same fields; an empty message if it ever did.
    B::decode(bytes::Bytes::from(message.encode_to_vec())).unwrap_or_default()
}

impl v1::server_reflection_server::ServerReflection for Reflection {
    type ServerReflectionInfoStream =
        BoxStream<'static, Result<v1::ServerReflectionResponse, Status>>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1::ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let requests = request.into_inner();
        Ok(Response::new(
            answers(Arc::clone(&self.index), requests).boxed(),
        ))
    }
}

impl v1alpha::server_reflection_server::ServerReflection for Reflection {
    type ServerReflectionInfoStream =
        BoxStream<'static, Result<v1alpha::ServerReflectionResponse, Status>>;

    async fn server_reflection_info(
        &self,
        request: Request<Streaming<v1alpha::ServerReflectionRequest>>,
    ) -> Result<Response<Self::ServerReflectionInfoStream>, Status> {
        let requests = request
            .into_inner()
            .map(|request| request.map(|request| convert(&request)));
        let responses = answers(Arc::clone(&self.index), requests)
            .map(|response| response.map(|response| convert(&response)));
        Ok(Response::new(responses.boxed()))
    }
}
