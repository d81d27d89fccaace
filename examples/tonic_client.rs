//! A gRPC client for the tonic example: calls `helloworld.Greeter/SayHello` a few times and prints
//! what came back, status code and retry metadata included.
//!
//! ```text
//! cargo run --example tonic_client -- [ADDR] [--count N] [--api-key KEY]
//! ```
//!
//! `ADDR` defaults to the tonic example's `127.0.0.1:50051`, `--count` to 1. With `--api-key` the
//! calls carry `x-api-key` metadata, which the server counts as a client of its own.
//!
//! ```text
//! $ cargo run --example tonic -- --limit 3 --period 1m &
//! $ cargo run --example tonic_client -- --count 4
//! OK Hello tonic_client! (2 calls left)
//! OK Hello tonic_client! (1 calls left)
//! OK Hello tonic_client! (0 calls left)
//! ResourceExhausted "rate limit exceeded" retry-after=20 grpc-retry-pushback-ms=19998
//! ```

#[path = "common/greeter.rs"]
mod greeter;

use std::process::ExitCode;

use greeter::{GreeterClient, HelloRequest};
use tonic::metadata::MetadataValue;

const USAGE: &str = "usage: cargo run --example tonic_client -- [ADDR] [--count N] [--api-key KEY]";

#[tokio::main]
async fn main() -> ExitCode {
    let mut addr = "127.0.0.1:50051".to_owned();
    let mut count = 1u32;
    let mut api_key = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--count" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) => count = n,
                None => return usage_error("--count needs a whole number"),
            },
            "--api-key" => match args.next().and_then(|k| MetadataValue::try_from(k).ok()) {
                Some(key) => api_key = Some(key),
                None => return usage_error("--api-key needs a printable value"),
            },
            other if !other.starts_with('-') => addr = other.to_owned(),
            other => return usage_error(&format!("unknown argument {other:?}")),
        }
    }

    let channel = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(endpoint) => match endpoint.connect().await {
            Ok(channel) => channel,
            Err(e) => {
                eprintln!("error: cannot connect to {addr}: {e}");
                return ExitCode::FAILURE;
            }
        },
        Err(e) => return usage_error(&format!("bad address {addr:?}: {e}")),
    };
    let mut client = GreeterClient::new(channel);
    for _ in 0..count {
        let mut request = tonic::Request::new(HelloRequest {
            name: "tonic_client".to_owned(),
        });
        if let Some(key) = &api_key {
            request.metadata_mut().insert("x-api-key", key.clone());
        }
        match client.say_hello(request).await {
            Ok(reply) => println!("OK {}", reply.get_ref().message),
            Err(status) => {
                let metadata = |name: &str| {
                    status
                        .metadata()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned()
                };
                println!(
                    "{:?} {:?} retry-after={} grpc-retry-pushback-ms={}",
                    status.code(),
                    status.message(),
                    metadata("retry-after"),
                    metadata("grpc-retry-pushback-ms"),
                );
            }
        }
    }
    ExitCode::SUCCESS
}

fn usage_error(message: &str) -> ExitCode {
    eprintln!("error: {message}\n{USAGE}");
    ExitCode::from(2)
}
