//! The `Echo` service and a reference implementation.

use std::time::Duration;

use rpc_core::{Code, Request, Response, Status};

pub use crate::v1::{
    echo_client, echo_methods, echo_server, FailReply, FailRequest, SayReply, SayRequest,
    SleepReply, SleepRequest,
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
}
