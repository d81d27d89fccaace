//! An axum server rate-limited by redlimit: the first thing to run.
//!
//! ```text
//! cargo run --example axum -- [--bind ADDR] [--redis URL] [--limit N] [--period DURATION]
//!     [--burst N] [--algorithm NAME] [--on-redis-error open|closed|local] [--instances N]
//!     [--redis-cluster URL,URL,...] [--redis-ca FILE] [--metrics-bind ADDR] [--key ip|api-key]
//! ```
//!
//! Each client (its IP address, or with `--key api-key` its `x-api-key` header, hashed) gets
//! `--limit` requests per `--period`: `GET /` answers `200 ok`, then `429` with `Retry-After` and
//! the `RateLimit` headers. The store (a Redis, a Cluster, Sentinel, or memory when no Redis
//! answers), the failure policy and `--metrics-bind` (Prometheus text at `http://ADDR/metrics`)
//! come from the command line this example shares with the tonic one
//! (`examples/common/server.rs`); every flag is in docs/examples.md. The Redis store is
//! verified before serving (`RedisStore::verify`), so a wrong `--redis` shows at start-up, not
//! as requests that pass unlimited: a service would return that error (`verify().await?`).
//!
//! ```text
//! $ cargo run --example axum -- --limit 3 --period 1m
//! $ for i in 1 2 3 4; do curl -si localhost:3000/ | head -1; done
//! ```

mod common;

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::{routing::get, Router};
use common::server::{self, Options, Program};
use metrics_exporter_prometheus::PrometheusBuilder;

const PROGRAM: Program = Program {
    name: "axum",
    default_bind: "127.0.0.1:3000",
    closed_answer: "503",
    serves_metrics: true,
};

#[tokio::main]
async fn main() -> ExitCode {
    PROGRAM.main(run).await
}

async fn run(options: Options) -> Result<(), String> {
    // Installed before the limiter exists, so that its first metrics are recorded.
    let metrics = match options.metrics_bind {
        Some(addr) => {
            let recorder = PrometheusBuilder::new().install_recorder();
            Some((
                addr,
                recorder.map_err(|e| format!("cannot install the Prometheus recorder: {e}"))?,
            ))
        }
        None => None,
    };
    let layer = server::layer(&options).await?;
    // What an operator names with `redlimit --scope` (suspensions need none).
    println!("policy: {} (scope {})", layer.policy_name(), layer.scope());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);

    if let Some((addr, handle)) = metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} for metrics: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        println!("metrics on http://{local}/metrics");
        let metrics_app =
            Router::new().route("/metrics", get(move || async move { handle.render() }));
        tokio::spawn(async move { axum::serve(listener, metrics_app).await });
    }

    let listener = server::listen(options.bind).await?;

    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .map_err(|e| e.to_string())
}
