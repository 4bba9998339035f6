//! The `Echo` service and a reference implementation.

use std::time::Duration;

use rpc_core::{Code, Request, Response, Status};

use futures::{stream::BoxStream, StreamExt};
use rpc_core::stream::Streaming;

pub use crate::v1::{
    echo_client, echo_methods, echo_server, CountReply, CountRequest, FailReply, FailRequest,
    SayReply, SayRequest, SleepReply, SleepRequest, SumReply, SumRequest,
};

/// The reference `Echo` implementation.
#[derive(Debug, Default, Clone)]
pub struct EchoService;

impl echo_server::Echo for EchoService {
    async fn say(&self, request: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        let SayRequest { message, payload } = request.into_inner();
        Ok(Response::new(SayReply { message, payload }))
    }

    async fn sleep(&self, request: Request<SleepRequest>) -> Result<Response<SleepReply>, Status> {
        let delay_ms = request.get_ref().delay_ms;
        tokio::time::sleep(Duration::from_millis(u64::from(delay_ms))).await;
        Ok(Response::new(SleepReply { slept_ms: delay_ms }))
    }

    async fn fail(&self, request: Request<FailRequest>) -> Result<Response<FailReply>, Status> {
        let FailRequest { code, message } = request.into_inner();
        if code == 0 {
            return Ok(Response::new(FailReply {}));
        }
        Err(Status::new(Code::from_u32(code), message))
    }

    type CountStream = BoxStream<'static, Result<CountReply, Status>>;

    async fn count(
        &self,
        request: Request<CountRequest>,
    ) -> Result<Response<Self::CountStream>, Status> {
        let CountRequest { count, interval_ms } = request.into_inner();
        let interval = Duration::from_millis(u64::from(interval_ms));
        let replies = futures::stream::iter(1..=count).then(move |n| async move {
            if n > 1 && !interval.is_zero() {
                tokio::time::sleep(interval).await;
            }
            Ok(CountReply { n })
        });
        Ok(Response::new(replies.boxed()))
    }

    async fn sum(
        &self,
        request: Request<Streaming<SumRequest>>,
    ) -> Result<Response<SumReply>, Status> {
        let mut values = request.into_inner();
        let (mut total, mut count) = (0i64, 0u32);
        while let Some(request) = values.message().await? {
            total = total.checked_add(request.value).ok_or_else(|| {
                Status::out_of_range(format!("the sum overflows after {count} values"))
            })?;
            count += 1;
        }
        Ok(Response::new(SumReply { total, count }))
    }

    type ChatStream = BoxStream<'static, Result<SayReply, Status>>;

    async fn chat(
        &self,
        request: Request<Streaming<SayRequest>>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let replies = request.into_inner().map(|message| {
            message.map(|SayRequest { message, payload }| SayReply {
                message: format!("re: {message}"),
                payload,
            })
        });
        Ok(Response::new(replies.boxed()))
    }
}
