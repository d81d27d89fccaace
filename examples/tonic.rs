//! A tonic gRPC server (`helloworld.Greeter`) rate-limited by redlimit.
//!
//! ```text
//! cargo run --example tonic -- [--bind ADDR] [--redis URL] [--limit N] [--period DURATION]
//!     [--burst N] [--algorithm NAME] [--on-redis-error open|closed|local] [--instances N]
//!     [--redis-cluster URL,URL,...] [--redis-ca FILE] [--key ip|api-key]
//! ```
//!
//! The same flags and store selection as the axum example, on 127.0.0.1:50051 by default. Each
//! client gets `--limit` calls per `--period`: a client is its IP address, which `PeerIp` reads
//! from tonic's `TcpConnectInfo` (the crate's `tonic` feature). With `--key api-key` it is its
//! `x-api-key` metadata when it sends one (hashed before it reaches Redis), else its IP: only
//! behind a layer that has authenticated that metadata. Over the quota a call fails with
//! `RESOURCE_EXHAUSTED` and the metadata `retry-after` (seconds) and `grpc-retry-pushback-ms`;
//! with `--on-redis-error closed` a call fails with `UNAVAILABLE` while Redis is down, and with
//! `--on-redis-error local --instances N` each instance enforces `1/N` of the quota in memory
//! until Redis is back. As in the axum example, the Redis store is verified before serving
//! (`RedisStore::verify`): a wrong `--redis` shows at start-up.
//!
//! The service is written by hand (`examples/common/greeter.rs`), so no `protoc` is needed. With
//! [grpcurl](https://github.com/fullstorydev/grpcurl) and that file's proto:
//!
//! ```text
//! $ cargo run --example tonic -- --limit 3 --period 1m
//! $ grpcurl -plaintext -proto helloworld.proto -d '{"name":"you"}' \
//!       127.0.0.1:50051 helloworld.Greeter/SayHello
//! ```

mod common;

use std::process::ExitCode;

use common::greeter::GreeterServer;
use common::server::{self, Options, Program};

const PROGRAM: Program = Program {
    name: "tonic",
    default_bind: "127.0.0.1:50051",
    closed_answer: "UNAVAILABLE",
    serves_metrics: false,
};

#[tokio::main]
async fn main() -> ExitCode {
    PROGRAM.main(run).await
}

async fn run(options: Options) -> Result<(), String> {
    let layer = server::layer(&options).await?;

    let listener = server::listen(options.bind).await?;

    tonic::transport::Server::builder()
        // tonic's server puts each connection's TcpConnectInfo into the requests: PeerIp reads it.
        .layer(layer)
        .add_service(GreeterServer)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await
        .map_err(|e| e.to_string())
}
