//! The fleet example's stand-in for a third-party API: an HTTP server that enforces a quota of its
//! own, counts what it receives, and optionally announces its quota in headers. A fixture, not the
//! library: the fleet example's workers call it through redlimit's `OutboundLayer`.
//!
//! It allows `quota` requests per fixed window aligned to the Unix epoch on this machine's clock
//! and answers `429` with `Retry-After` (the window's end, whole seconds rounded up) beyond.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::Service;

/// The running upstream: its address and what it received.
pub struct Upstream {
    pub addr: SocketAddr,
    tally: Arc<Mutex<Tally>>,
}

/// Requests per window (its index since the epoch), in total, and refused.
#[derive(Default)]
struct Tally {
    per_window: BTreeMap<u64, u64>,
    total: u64,
    too_many: u64,
}

impl Upstream {
    /// Serves on a free local port; `announce` is `ietf`, `x-ratelimit` or none.
    pub async fn start(quota: redlimit::Quota, announce: Option<String>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let upstream = Upstream {
            addr: listener.local_addr()?,
            tally: Arc::default(),
        };
        tokio::spawn(serve(listener, upstream.tally.clone(), quota, announce));
        Ok(upstream)
    }

    /// How many requests it has answered so far.
    pub fn total(&self) -> u64 {
        self.tally.lock().unwrap().total
    }

    /// The summary line; the count of each window goes to stderr.
    pub fn summary(&self, seconds: u64) -> String {
        let tally = self.tally.lock().unwrap();
        eprintln!("upstream windows: {:?}", tally.per_window.values());
        let most = tally.per_window.values().max().unwrap_or(&0);
        let (total, too_many) = (tally.total, tally.too_many);
        format!(
            "upstream: {total} requests in {seconds} s, {most} max in any aligned window, \
             {too_many} answered 429"
        )
    }
}

async fn serve(
    listener: TcpListener,
    tally: Arc<Mutex<Tally>>,
    quota: redlimit::Quota,
    announce: Option<String>,
) {
    while let Ok((stream, _)) = listener.accept().await {
        let (tally, announce) = (tally.clone(), announce.clone());
        let answer = hyper::service::service_fn(move |_: Request<Incoming>| {
            let (now, period) = (now_micros(), micros(quota.period()));
            let (window, limit) = (now / period, quota.limit());
            let mut tally = tally.lock().unwrap();
            tally.total += 1;
            let count = *tally
                .per_window
                .entry(window)
                .and_modify(|n| *n += 1)
                .or_insert(1);
            let left = limit.saturating_sub(count);
            let reset = ((window + 1) * period - now).div_ceil(1_000_000);
            let mut response = Response::builder();
            if announce.as_deref() == Some("ietf") {
                let policy = format!("\"fleet\";q={limit};w={}", quota.period().as_secs());
                response = response.header("ratelimit-policy", policy);
                response = response.header("ratelimit", format!("\"fleet\";r={left};t={reset}"));
            } else if announce.is_some() {
                // GitHub's style: the window's end in Unix epoch seconds.
                let end = ((window + 1) * period).div_ceil(1_000_000);
                let headers = [("limit", limit), ("remaining", left), ("reset", end)];
                for (name, value) in headers {
                    response = response.header(format!("x-ratelimit-{name}"), value);
                }
            }
            if count > limit {
                tally.too_many += 1;
                response = response
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("retry-after", reset.max(1));
            }
            std::future::ready(response.body(Full::new(Bytes::from_static(b"ok"))))
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), answer);
        tokio::spawn(connection);
    }
}

/// A client for the upstream at `addr` over one kept-alive HTTP/1 connection, as a tower
/// service (what an `OutboundLayer` wraps). The layer clones the service into each call, so the
/// connection sits behind a lock.
pub async fn client(
    addr: SocketAddr,
) -> std::io::Result<
    impl Service<Request<Empty<Bytes>>, Response = Response<Incoming>, Error = hyper::Error> + Clone,
> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let handshake = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await;
    let (sender, connection) = handshake.map_err(std::io::Error::other)?;
    tokio::spawn(connection);
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    Ok(tower::service_fn(move |request: Request<Empty<Bytes>>| {
        let sender = sender.clone();
        async move {
            let mut sender = sender.lock().await;
            sender.ready().await?; // the previous response read to its end
            sender.send_request(request).await
        }
    }))
}

/// Now, in µs since the Unix epoch: the clock both the upstream and the workers align windows on.
pub fn now_micros() -> u64 {
    micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// How long until `at` (µs since the Unix epoch); zero if it has passed.
pub fn until(at: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(now_micros()))
}

/// `duration` in whole µs.
pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
