//! An axum server rate-limited by redlimit: the first thing to run.
//!
//! ```text
//! cargo run --example axum -- [--bind ADDR] [--redis URL] [--limit N] [--period DURATION]
//!     [--burst N] [--algorithm NAME] [--on-redis-error open|closed|local] [--instances N]
//!     [--redis-cluster URL,URL,...] [--redis-ca FILE] [--metrics-bind ADDR] [--key ip|api-key]
//! ```
//!
//! Each client gets `--limit` requests per `--period`: a client is its IP address. With
//! `--key api-key` it is its `x-api-key` header when it sends one (hashed before it reaches
//! Redis), else its IP address: only for a server behind a layer that has authenticated that
//! header, or a client sending a fresh key per request gets a fresh quota each time. `GET /`
//! answers `200 ok`, or `429` with `Retry-After` and the `RateLimit` headers once the client is
//! over its quota. A flag given twice is refused.
//!
//! Without `--redis` the server uses the Redis at `REDIS_URL` (or `redis://127.0.0.1:6379`) when
//! one answers, otherwise an in-memory store, and says which. With `--redis` it always uses that
//! Redis: if it is down, `--on-redis-error` decides (`open` admits, `closed` answers 503,
//! `local --instances N` enforces `1/N` of the quota in memory until Redis is back).
//! `--redis-cluster` does the same on a Redis Cluster reached through any of its nodes.
//! `rediss://` URLs use TLS; `--redis-ca FILE` trusts a private CA (PEM) instead of the system's.
//! At start the server verifies the store (connect, `PING`, script load) and prints
//! `store: redis URL (Redis 7.0.15)`, or `store: redis URL (not reachable yet: ...)` and starts
//! anyway. `--metrics-bind ADDR` serves the limiter's metrics (the crate's `metrics` feature) as
//! Prometheus text at `http://ADDR/metrics`.
//!
//! The command line and store selection are shared with the tonic example
//! (`examples/common/server.rs`).
//!
//! ```text
//! $ cargo run --example axum -- --limit 3 --period 1m
//! $ for i in 1 2 3 4; do curl -si localhost:3000/ | head -1; done
//! ```

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use axum::{routing::get, Router};
use common::server::{self, Options, Program};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

const PROGRAM: Program = Program {
    name: "axum",
    default_bind: "127.0.0.1:3000",
    closed_answer: "503",
    serves_metrics: true,
};

#[tokio::main]
async fn main() -> ExitCode {
    server::init_tracing();
    let options = match PROGRAM.options() {
        Ok(options) => options,
        Err(code) => return code,
    };
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Result<(), String> {
    // Installed before the limiter exists, so that its first metrics are recorded.
    let metrics = match options.metrics_bind {
        Some(addr) => Some((addr, install_prometheus()?)),
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

    let listener = tokio::net::TcpListener::bind(options.bind)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.bind))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on {local}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;

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

/// Installs the Prometheus recorder as the process's `metrics` recorder; `/metrics` renders it.
fn install_prometheus() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the Prometheus recorder: {e}"))
}
