//! The mock upstream: a hyper server that enforces (and with `--announce`, announces) its quota.
//!
//! # A provider that announces its limit
//!
//! `--upstream-limit N` gives the upstream a quota of its own (by default `--limit`), and
//! `--announce ietf|x-ratelimit` makes it announce that quota and what is left in each response:
//! `RateLimit-Policy: "fleet";q=N;w=SECONDS` with `RateLimit: "fleet";r=LEFT;t=SECONDS_TO_RESET`,
//! or `X-RateLimit-Limit`, `-Remaining` and `-Reset` (the window's end in Unix epoch seconds,
//! GitHub's style). The workers read it: a response saying nothing is left suspends the key
//! until the reset for the whole fleet (pacing), and with `--learn` the first announcement sets
//! the upstream's quota as the key's fleet-wide override (never faster than `--limit`, the
//! ceiling). The example then prints, before the summary:
//!
//! ```text
//! learned quota: 20/1s after N responses
//! ```
//!
//! `N`: the responses the upstream had sent when the first worker learned.
//! `--workers 4 --limit 50 --upstream-limit 20 --period 1s --seconds 5 --announce ietf --learn`
//! converges on 20 a second and draws (almost) no `429`: the workers' limiter counts the same
//! windows as the upstream from the first response on.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::args::{Dialect, ProviderOptions};
use crate::clock::{micros, unix_micros};

/// The mock upstream: `limit` per fixed window of `period` aligned to the Unix epoch, by this
/// machine's clock; `429` with `Retry-After` (the window's end, whole seconds rounded up) beyond.
/// With `--announce` every answer carries the quota and what is left in that window.
pub struct Upstream {
    pub addr: SocketAddr,
    pub tally: Arc<Mutex<Tally>>,
}

/// What the upstream received.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Requests received per window (the window's index since the epoch), refused ones included.
    pub per_window: BTreeMap<u64, u64>,
    pub total: u64,
    pub too_many: u64,
}

impl Upstream {
    pub async fn start(provider: ProviderOptions) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tally = Arc::new(Mutex::new(Tally::default()));
        let shared = tally.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let tally = shared.clone();
                let service = hyper::service::service_fn(move |_request: Request<Incoming>| {
                    std::future::ready(Ok::<_, Infallible>(answer(&tally, provider)))
                });
                tokio::spawn(async move {
                    let connection = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service);
                    let _ = connection.await;
                });
            }
        });
        Ok(Upstream { addr, tally })
    }
}

/// Counts one request in its window and answers it.
fn answer(tally: &Mutex<Tally>, provider: ProviderOptions) -> Response<Full<Bytes>> {
    let quota = provider.quota;
    let now = unix_micros();
    let period = micros(quota.period());
    let window = now / period;
    let mut tally = tally.lock().expect("the tally lock");
    tally.total += 1;
    let count = tally.per_window.entry(window).or_default();
    *count += 1;
    let count = *count;
    let end = (window + 1) * period;
    let builder = announce(Response::builder(), provider, count, end, now);
    if count <= quota.limit() {
        return builder
            .body(Full::new(Bytes::from_static(b"ok")))
            .expect("a valid response");
    }
    tally.too_many += 1;
    let left = end - now;
    builder
        .status(StatusCode::TOO_MANY_REQUESTS)
        .header("retry-after", left.div_ceil(1_000_000).max(1))
        .body(Full::new(Bytes::from_static(b"too many requests")))
        .expect("a valid response")
}

/// The announcement headers of `--announce`, after `count` requests in the window that ends at
/// `end` (µs since the epoch; `now` too).
fn announce(
    builder: http::response::Builder,
    provider: ProviderOptions,
    count: u64,
    end: u64,
    now: u64,
) -> http::response::Builder {
    let limit = provider.quota.limit();
    let remaining = limit.saturating_sub(count);
    match provider.announce {
        None => builder,
        Some(Dialect::Ietf) => builder
            .header(
                "ratelimit-policy",
                format!(
                    "\"fleet\";q={limit};w={}",
                    provider.quota.period().as_secs()
                ),
            )
            .header(
                "ratelimit",
                format!(
                    "\"fleet\";r={remaining};t={}",
                    (end - now).div_ceil(1_000_000)
                ),
            ),
        Some(Dialect::XRateLimit) => builder
            .header("x-ratelimit-limit", limit)
            .header("x-ratelimit-remaining", remaining)
            .header("x-ratelimit-reset", end.div_ceil(1_000_000)),
    }
}
