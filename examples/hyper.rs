//! The rate-limit layer on a plain hyper server: 10 requests a minute per client IP.
//!
//! ```text
//! cargo run --example hyper [-- ADDR | --bind ADDR]      # default 127.0.0.1:3001
//! ```
//!
//! hyper has no `ConnectInfo`: the server puts the peer `SocketAddr` into each request's
//! extensions, where `PeerIp` finds it. Uses the Redis at `REDIS_URL` when set (printed without
//! its password), otherwise the in-memory store. The address is given once, or not at all.

#[path = "common/flags.rs"]
mod flags;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;

use bytes::Bytes;
use flags::{invalid, redacted, CliError};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use redlimit::key::PeerIp;
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Limiter, Quota, RateLimitLayer};
use tower::{ServiceBuilder, ServiceExt};

const USAGE: &str = "\
usage: cargo run --example hyper [-- ADDR | --bind ADDR]  (default 127.0.0.1:3001)
  --bind ADDR  the address to listen on, or ADDR alone";

#[tokio::main]
async fn main() -> ExitCode {
    flags::main(USAGE, parse_args(std::env::args().skip(1)), run).await
}

/// The address to listen on: `ADDR` or `--bind ADDR`, at most once.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<String, CliError> {
    let given = flags::read(USAGE, args)?;
    let mut addresses = given
        .plain
        .iter()
        .map(String::as_str)
        .chain(given.get("--bind"));
    let bind = addresses.next().unwrap_or("127.0.0.1:3001").to_owned();
    match addresses.next() {
        Some(_) => Err(invalid("give the address once")),
        None => Ok(bind),
    }
}

async fn run(bind: String) -> Result<(), Box<dyn std::error::Error>> {
    let limiter = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("store: redis {}", redacted(&url));
            Limiter::new(RedisStore::new(url.as_str())?)
        }
        Err(_) => {
            println!("store: memory (REDIS_URL not set)");
            Limiter::new(MemoryStore::new())
        }
    };
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(
            limiter,
            Quota::per_minute(10)?,
            PeerIp::new(),
        ))
        .service_fn(|_request: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });

    let listener = tokio::net::TcpListener::bind(bind.as_str()).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let per_request = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                // What PeerIp reads when there is no axum ConnectInfo.
                request.extensions_mut().insert::<SocketAddr>(peer);
                service.clone().oneshot(request)
            });
            if let Err(error) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), per_request)
                .await
            {
                eprintln!("connection from {peer}: {error}");
            }
        });
    }
}
