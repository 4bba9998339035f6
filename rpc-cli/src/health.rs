//! `rpc health`: one `grpc.health.v1.Health/Check`; exits 0 only when the answer is
//! `SERVING`, so that it serves as a container's health probe.

use rpc_core::Request;
use rpc_proto::health::{health_client::HealthClient, HealthCheckRequest, ServingStatus};

use crate::{
    cli::HealthArgs,
    exit::{Failure, EXIT_NOT_SERVING},
    metadata,
    target::{self, DEFAULT_TIMEOUT},
};

/// Runs `rpc health`: prints the status's name (`SERVING`, `NOT_SERVING`, ...).
pub async fn run(args: HealthArgs) -> Result<(), Failure> {
    let request_metadata = metadata::parse_headers(&args.conn.headers, &args.conn.uri)?;
    let target = target::connect(&args.conn).await?;
    let mut client = HealthClient::new(target.clone());
    let result = check(&args, &mut client, request_metadata).await;
    // The connection ends as its transport ends it (TLS's close_notify) before the
    // process exits (from a review: half of the probes ended with a bare FIN, which a
    // server logs as a truncation; container probes run this constantly).
    drop(client);
    target.close().await;
    result
}

/// The check itself, and what it prints.
async fn check(
    args: &HealthArgs,
    client: &mut HealthClient<target::Target>,
    request_metadata: rpc_core::metadata::Metadata,
) -> Result<(), Failure> {
    let mut request = Request::new(HealthCheckRequest {
        service: args.service.clone(),
    });
    if let Some(timeout) = args.conn.deadline(Some(DEFAULT_TIMEOUT)) {
        request = request.with_timeout(timeout);
    }
    *request.metadata_mut() = request_metadata;
    let response = client.check(request).await.map_err(|status| {
        // Its details decoded as `call`'s are (google.rpc's error details).
        let details =
            crate::call::decode_details(status.details(), &prost_reflect::DescriptorPool::new());
        let mut failure = Failure::status(&status, details);
        failure.message = format!("health check failed: {}", failure.message);
        failure
    })?;
    let status = response.get_ref().status;
    let name = ServingStatus::try_from(status)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("STATUS_{status}"));
    // A closed stdout (quiet) does not hide the exit code of the check.
    if let Err(failure) = crate::exit::write_stdout(format!("{name}\n").as_bytes()) {
        if failure.exit_code != 0 {
            return Err(failure);
        }
    }
    if status == ServingStatus::Serving as i32 {
        Ok(())
    } else {
        let what = if args.service.is_empty() {
            "the server".to_owned()
        } else {
            format!("service {:?}", args.service)
        };
        Err(Failure::with_code(
            EXIT_NOT_SERVING,
            format!("{what} is {name}"),
        ))
    }
}
