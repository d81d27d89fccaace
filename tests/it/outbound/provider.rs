//! The outbound layer against a real HTTP upstream (a hyper server on a local port) that
//! announces its limit, in both dialects (IETF `RateLimit-Policy` / `RateLimit`, and
//! `X-RateLimit-*`): learning lowers the quota on every instance, the ceiling holds, nothing
//! left suspends until the reset, a later shorter announcement does not cut a suspension, and
//! garbage or hostile headers change nothing.
//!
//! Every instance is a limiter on its own connection to a private `redis-server`; the client is
//! a hyper HTTP/1.1 connection per request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use redlimit::key::FnKey;
use redlimit::outbound::{OutboundError, OutboundLayer, DEFAULT_MAX_AUTO_SUSPENSION};
use redlimit::{Algorithm, Limiter, Quota, Quotas};
use tokio::net::{TcpListener, TcpStream};
use tower::{BoxError, Layer, Service, ServiceExt};

use super::support::{suspended_for, RedisServer};
use super::{limiters, Body};

pub(super) type Header = (HeaderName, HeaderValue);

pub(super) fn header(name: &'static str, value: impl AsRef<[u8]>) -> Header {
    (
        HeaderName::from_static(name),
        HeaderValue::from_bytes(value.as_ref()).expect("a header value"),
    )
}

/// One answer of the upstream: its headers, after `delay`.
struct Reply {
    delay: Duration,
    headers: Vec<Header>,
}

/// Runs when a request arrives, before the upstream answers it.
type Hook = Box<dyn Fn() + Send>;

/// What the upstream answers: the queued replies in order, then `default` to every request.
#[derive(Default)]
struct Script {
    queue: VecDeque<Reply>,
    default: Vec<Header>,
    /// When each request arrived.
    hits: Vec<SystemTime>,
    /// Runs (once) on the next request, before it is answered.
    hook: Option<Hook>,
}

/// A hyper HTTP/1.1 server that answers `200 ok` with the scripted headers.
pub(super) struct Upstream {
    addr: SocketAddr,
    script: Arc<Mutex<Script>>,
}

impl Upstream {
    pub(super) async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let script = Arc::new(Mutex::new(Script::default()));
        let shared = script.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let script = shared.clone();
                let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                    let script = script.clone();
                    async move {
                        let reply = {
                            let mut script = script.lock().unwrap();
                            script.hits.push(SystemTime::now());
                            if let Some(hook) = script.hook.take() {
                                hook();
                            }
                            script.queue.pop_front().unwrap_or_else(|| Reply {
                                delay: Duration::ZERO,
                                headers: script.default.clone(),
                            })
                        };
                        tokio::time::sleep(reply.delay).await;
                        let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                        for (name, value) in reply.headers {
                            response.headers_mut().append(name, value);
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream { addr, script }
    }

    /// Every answer from now on carries `headers`.
    pub(super) fn announce(&self, headers: Vec<Header>) {
        self.script.lock().unwrap().default = headers;
    }

    /// The next answer carries `headers`, after `delay`.
    fn queue(&self, delay: Duration, headers: Vec<Header>) {
        self.script
            .lock()
            .unwrap()
            .queue
            .push_back(Reply { delay, headers });
    }

    /// When each request so far arrived.
    pub(super) fn hits(&self) -> Vec<SystemTime> {
        self.script.lock().unwrap().hits.clone()
    }

    /// `hook` runs on the next request, before the upstream answers it.
    pub(super) fn on_next_request(&self, hook: impl Fn() + Send + 'static) {
        self.script.lock().unwrap().hook = Some(Box::new(hook));
    }

    /// A client service: one new connection per request.
    pub(super) fn client(
        &self,
    ) -> impl Service<
        Request<Body>,
        Response = Response<Incoming>,
        Error = BoxError,
        Future = impl std::future::Future<Output = Result<Response<Incoming>, BoxError>> + Send,
    > + Clone
           + Send
           + 'static {
        let addr = self.addr;
        tower::service_fn(move |request: Request<Body>| async move {
            let stream = TcpStream::connect(addr).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            Ok::<_, BoxError>(sender.send_request(request).await?)
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Dialect {
    Ietf,
    XRateLimit,
}

impl Dialect {
    /// Both dialects, for the tests that run once under each.
    const BOTH: [Dialect; 2] = [Dialect::Ietf, Dialect::XRateLimit];

    /// A quota of `limit` per `window` seconds, with plenty left.
    fn quota(self, limit: u64, window: u64) -> Vec<Header> {
        match self {
            Dialect::Ietf => vec![
                header("ratelimit-policy", format!("\"api\";q={limit};w={window}")),
                header("ratelimit", format!("\"api\";r={};t={window}", limit - 1)),
            ],
            // No window in this dialect: the layer counts per its ceiling's period.
            Dialect::XRateLimit => vec![
                header("x-ratelimit-limit", limit.to_string()),
                header("x-ratelimit-remaining", (limit - 1).to_string()),
                header("x-ratelimit-reset", window.to_string()),
            ],
        }
    }

    /// `remaining` left until `reset` seconds from now (`X-RateLimit-Reset` in epoch seconds
    /// when `epoch`, GitHub's style).
    fn left(self, remaining: u64, reset: u64, epoch: bool) -> Vec<Header> {
        match self {
            Dialect::Ietf => vec![header("ratelimit", format!("api;r={remaining};t={reset}"))],
            Dialect::XRateLimit => {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                let reset = if epoch {
                    // Rounded up, as a provider says when its window ends.
                    (now.as_secs() + 1 + reset).to_string()
                } else {
                    reset.to_string()
                };
                vec![
                    header("x-ratelimit-limit", "50"),
                    header("x-ratelimit-remaining", remaining.to_string()),
                    header("x-ratelimit-reset", reset),
                ]
            }
        }
    }
}

pub(super) fn per_second(limit: u64) -> Quota {
    Quota::per_second(limit).unwrap()
}

pub(super) const KEY: &str = "partner-api";

/// A layer over `limiter` with `configured`, learning below `ceiling` when given.
pub(super) fn layer(limiter: &Limiter, configured: Quota, ceiling: Option<Quota>) -> OutboundLayer {
    let builder = OutboundLayer::builder(limiter.clone(), configured, KEY);
    match ceiling {
        Some(ceiling) => builder.learn_quota(ceiling),
        None => builder,
    }
    .max_wait(Duration::ZERO)
    // A learning round after every response: these tests are about what one round does.
    .learn_period(Duration::ZERO)
    .build()
    .unwrap()
}

/// An announcement of `q` requests per `w` seconds (`RateLimit-Policy`).
pub(super) fn policy(q: u64, w: u64) -> Vec<Header> {
    vec![header("ratelimit-policy", format!("p;q={q};w={w}"))]
}

/// What most learning tests start from: a private Redis, one fixed-window limiter on it, an
/// upstream, the ceiling (50 a second), and [`layer`]`(limiter, ceiling, Some(ceiling))`: no
/// wait, a round after every response.
pub(super) async fn learning() -> (RedisServer, Limiter, Upstream, Quota, OutboundLayer) {
    learning_with(|limiter, ceiling| layer(limiter, ceiling, Some(ceiling))).await
}

/// [`learning`] with the layer `make` builds over the limiter and the ceiling.
pub(super) async fn learning_with(
    make: impl FnOnce(&Limiter, Quota) -> OutboundLayer,
) -> (RedisServer, Limiter, Upstream, Quota, OutboundLayer) {
    let (redis, limiter, upstream) = one_instance_and_upstream(Algorithm::FixedWindow).await;
    let ceiling = per_second(50);
    let layer = make(&limiter, ceiling);
    (redis, limiter, upstream, ceiling, layer)
}

/// A layer over `limiter` on `KEY` learning below `ceiling`, waiting up to `max_wait`, with the
/// default learning period.
pub(super) fn learning_layer(
    limiter: &Limiter,
    ceiling: Quota,
    max_wait: Duration,
) -> OutboundLayer {
    OutboundLayer::builder(limiter.clone(), ceiling, KEY)
        .learn_quota(ceiling)
        .max_wait(max_wait)
        .build()
        .unwrap()
}

/// A layer over `limiter` on `KEY` learning below `ceiling` whose learned quotas last 2 s
/// without a confirming answer, a round every `learn_period`, waiting up to 5 s.
pub(super) fn expiring_layer(
    limiter: &Limiter,
    ceiling: Quota,
    learn_period: Duration,
) -> OutboundLayer {
    OutboundLayer::builder(limiter.clone(), ceiling, KEY)
        .learn_quota(ceiling)
        .learned_ttl(Duration::from_secs(2))
        .learn_period(learn_period)
        .max_wait(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The key of a request: its path without the leading `/`.
type PerPath = FnKey<fn(&http::request::Parts) -> Option<String>>;

/// A layer over `limiter` keyed by the request's path (`/t1` is the key `t1`), learning below
/// `ceiling`, waiting up to 5 s, a round every `learn_period` (the default when `None`).
pub(super) fn per_path_layer(
    limiter: &Limiter,
    ceiling: Quota,
    learn_period: Option<Duration>,
) -> OutboundLayer<PerPath> {
    let per_path: PerPath =
        FnKey::new(|parts| Some(parts.uri.path().trim_start_matches('/').to_owned()));
    let builder = OutboundLayer::builder_with_extractor(limiter.clone(), ceiling, per_path)
        .learn_quota(ceiling)
        .max_wait(Duration::from_secs(5));
    match learn_period {
        Some(period) => builder.learn_period(period),
        None => builder,
    }
    .build()
    .unwrap()
}

/// A request for the key `key` of a [`per_path_layer`].
pub(super) fn to_key(key: &str) -> Request<Body> {
    Request::get(format!("/{key}"))
        .body(Body::default())
        .unwrap()
}

/// `n` calls through `layer`, each after the previous one: the outcome of each.
pub(super) async fn outcomes(
    layer: &OutboundLayer,
    upstream: &Upstream,
    n: usize,
) -> Vec<Result<(), String>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let result = layer
            .layer(upstream.client())
            .oneshot(Request::new(Body::default()))
            .await;
        out.push(
            result
                .map(|_| ())
                .map_err(|e: OutboundError<BoxError>| e.to_string()),
        );
    }
    out
}

/// One request through `layer` to `upstream`; the answer must be the upstream's, unchanged.
pub(super) async fn call(layer: &OutboundLayer, upstream: &Upstream) -> Response<Bytes> {
    let response = layer
        .layer(upstream.client())
        .oneshot(Request::new(Body::default()))
        .await
        .unwrap_or_else(|error: OutboundError<BoxError>| panic!("{error}"));
    // Learning runs after the response: done before the test reads the store.
    layer.settled().await;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    assert_eq!(parts.status, StatusCode::OK);
    assert_eq!(body, "ok");
    Response::from_parts(parts, body)
}

/// A private Redis, `n` limiters on it under `algorithm` (each on a connection of its own), and
/// an upstream to script.
async fn instances_and_upstream(
    algorithm: Algorithm,
    n: usize,
) -> (RedisServer, Vec<Limiter>, Upstream) {
    let redis = RedisServer::start();
    let instances = limiters(&redis, algorithm, n);
    (redis, instances, Upstream::start().await)
}

/// The same with one limiter.
async fn one_instance_and_upstream(algorithm: Algorithm) -> (RedisServer, Limiter, Upstream) {
    let (redis, mut instances, upstream) = instances_and_upstream(algorithm, 1).await;
    (redis, instances.remove(0), upstream)
}

/// The quota `limiter` decides `KEY` with now (a peek: cost 0).
async fn quota_in_force(limiter: &Limiter, configured: Quota) -> Quota {
    let verdict = limiter.check_quotas(KEY, &configured.into(), 0).await;
    verdict.decision().expect("a store decision").quota
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learning_lowers_the_quota_on_every_instance_in_each_dialect() {
    for dialect in Dialect::BOTH {
        let (_redis, instances, upstream) = instances_and_upstream(Algorithm::FixedWindow, 3).await;
        let configured = per_second(50);
        let layers: Vec<_> = instances
            .iter()
            .map(|limiter| layer(limiter, configured, Some(configured)))
            .collect();
        for limiter in &instances {
            assert_eq!(quota_in_force(limiter, configured).await, configured);
        }

        upstream.announce(dialect.quota(20, 1));
        call(&layers[0], &upstream).await;
        // One instance learned; every instance obeys on its next call.
        for limiter in &instances {
            assert_eq!(quota_in_force(limiter, configured).await, per_second(20));
        }
        let status = instances[2].inspect(KEY).await.unwrap();
        assert_eq!(status.quota_override, Some(Quotas::from(per_second(20))));
        // The others read the same announcement: already in force, nothing learned again.
        for layer in &layers[1..] {
            call(layer, &upstream).await;
        }
        let learned: Vec<u64> = layers.iter().map(|l| l.stats().learned).collect();
        assert_eq!(learned, [1, 0, 0], "{dialect:?}");
        assert!(layers.iter().all(|l| l.stats().announcements == 1));

        // The provider lowers it again: learned again, once.
        upstream.announce(dialect.quota(10, 1));
        call(&layers[1], &upstream).await;
        call(&layers[2], &upstream).await;
        for limiter in &instances {
            assert_eq!(quota_in_force(limiter, configured).await, per_second(10));
        }
        let learned: Vec<u64> = layers.iter().map(|l| l.stats().learned).collect();
        assert_eq!(learned, [1, 1, 0], "{dialect:?}");
        for limiter in &instances {
            assert_eq!(limiter.stats().store_errors, 0);
        }
    }
}

#[tokio::test]
async fn the_ceiling_holds_in_each_dialect() {
    for dialect in Dialect::BOTH {
        let (_redis, limiter, upstream) = one_instance_and_upstream(Algorithm::TokenBucket).await;
        let configured = per_second(50);
        let ceiling = per_second(30);
        let layer = layer(&limiter, configured, Some(ceiling));
        let in_force = || async { limiter.inspect(KEY).await.unwrap().quota_override };

        // Faster than the ceiling: learned as the ceiling, never more.
        upstream.announce(dialect.quota(1000, 1));
        call(&layer, &upstream).await;
        assert_eq!(in_force().await, Some(Quotas::from(ceiling)), "{dialect:?}");
        // Lower: learned.
        upstream.announce(dialect.quota(20, 1));
        call(&layer, &upstream).await;
        assert_eq!(in_force().await, Some(Quotas::from(per_second(20))));
        // Raised again above the ceiling: back to the ceiling only.
        upstream.announce(dialect.quota(40, 1));
        call(&layer, &upstream).await;
        assert_eq!(in_force().await, Some(Quotas::from(ceiling)));
        assert_eq!(layer.stats().learned, 3);
        if let Dialect::Ietf = dialect {
            // A longer window, faster than the ceiling in rate (1801 a minute > 30 a second).
            upstream.announce(dialect.quota(1801, 60));
            call(&layer, &upstream).await;
            assert_eq!(in_force().await, Some(Quotas::from(ceiling)));
            upstream.announce(dialect.quota(1200, 60));
            call(&layer, &upstream).await;
            // The ceiling stays a cap over the learned minute.
            let per_minute = Quota::per_minute(1200).unwrap();
            let expected = Quotas::new([ceiling, per_minute]).unwrap();
            assert_eq!(in_force().await, Some(expected));
        }
    }
}

#[tokio::test]
async fn nothing_left_suspends_until_the_reset_in_each_dialect() {
    for dialect in Dialect::BOTH {
        let (_redis, instances, upstream) = instances_and_upstream(Algorithm::TokenBucket, 2).await;
        let configured = per_second(50);
        let layer = layer(&instances[0], configured, None);

        // Something left: nothing happens.
        upstream.announce(dialect.left(1, 30, true));
        call(&layer, &upstream).await;
        assert_eq!(suspended_for(&instances[1], KEY).await, None, "{dialect:?}");
        // Nothing left until the reset: the whole fleet pauses until then (the answer itself is
        // handed back unchanged).
        upstream.announce(dialect.left(0, 30, true));
        call(&layer, &upstream).await;
        let left = suspended_for(&instances[1], KEY).await.expect("suspended");
        assert!(
            left > Duration::from_secs(27) && left <= Duration::from_secs(32),
            "{dialect:?}: {left:?}"
        );
        let decision = *instances[1]
            .check(KEY, &configured)
            .await
            .decision()
            .unwrap();
        assert!(decision.suspended && !decision.allowed);
        assert_eq!(layer.stats().paced, 1);
        // The next request of the layer does not go out: it would wait past its max_wait.
        let refused = layer
            .layer(upstream.client())
            .oneshot(Request::new(Body::default()))
            .await;
        assert!(matches!(refused, Err(OutboundError::Acquire(_))));

        // A reset absurdly far away is capped (the layer's default cap, 5 minutes).
        let capped = OutboundLayer::builder(instances[0].clone(), configured, "capped")
            .build()
            .unwrap();
        upstream.announce(dialect.left(0, 10 * 365 * 86_400, true));
        call(&capped, &upstream).await;
        let left = suspended_for(&instances[1], "capped")
            .await
            .expect("capped");
        assert!(
            left > Duration::from_secs(4 * 60) && left <= DEFAULT_MAX_AUTO_SUSPENSION,
            "{dialect:?}: {left:?}"
        );
    }
}

/// Two requests admitted together; the first answer says nothing is left for 30 s, the second,
/// arriving later, for 2 s: the suspension keeps its 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_shorter_announcement_does_not_cut_a_suspension_in_each_dialect() {
    for dialect in Dialect::BOTH {
        let (_redis, instances, upstream) = instances_and_upstream(Algorithm::TokenBucket, 2).await;
        let configured = per_second(50);
        let layers = [
            layer(&instances[0], configured, None),
            layer(&instances[1], configured, None),
        ];
        upstream.queue(Duration::ZERO, dialect.left(0, 30, false));
        upstream.queue(Duration::from_millis(500), dialect.left(0, 2, false));
        // Both admitted before either goes out.
        let mut first = layers[0].layer(upstream.client());
        let mut second = layers[1].layer(upstream.client());
        first.ready().await.unwrap();
        second.ready().await.unwrap();
        let (a, b) = tokio::join!(
            first.call(Request::new(Body::default())),
            second.call(Request::new(Body::default()))
        );
        assert_eq!(a.unwrap().status(), StatusCode::OK);
        assert_eq!(b.unwrap().status(), StatusCode::OK);
        // The pacing writes run after the responses.
        for layer in &layers {
            layer.settled().await;
        }
        let left = suspended_for(&instances[0], KEY).await.expect("suspended");
        assert!(left > Duration::from_secs(27), "{dialect:?}: {left:?}");
        let paced: u64 = layers.iter().map(|l| l.stats().paced).sum();
        assert_eq!(paced, 1, "the shorter announcement set nothing");
    }
}

/// Header sets that must change nothing: too big, too many lines, wrong syntax, out of range.
fn hostile(dialect: Dialect) -> Vec<Vec<Header>> {
    // More lines than the layer reads (8), fewer than the client accepts (100 in all).
    let many = |name: &'static str, value: &str| vec![header(name, value); 40];
    match dialect {
        Dialect::Ietf => vec![
            vec![
                header("ratelimit-policy", "\"p\";q=20;w=1,".repeat(3000)),
                header("ratelimit", "\"p\";r=0;t=30,".repeat(3000)),
            ],
            [
                many("ratelimit-policy", "p;q=20;w=1"),
                many("ratelimit", "p;r=0;t=30"),
            ]
            .concat(),
            vec![
                header("ratelimit-policy", "p;q=99999999999999999999;w=1"),
                header("ratelimit", "p;r=-1;t=30"),
            ],
            vec![
                header("ratelimit-policy", "p;q=20;w=0"),
                header("ratelimit", "p;r=0;t=0"),
            ],
            vec![
                header("ratelimit-policy", b"p\xff;q=20;w=1"),
                header("ratelimit", b"p;r=0;t=30\xfe"),
            ],
            vec![
                header("ratelimit-policy", "(p q);q=20;w=1"),
                header("ratelimit", "\"p;r=0;t=30"),
            ],
            vec![
                header("ratelimit-policy", "p;q=20;w=1;qu=\"content-bytes\""),
                header("ratelimit", "p;r=0.5;t=30"),
            ],
            vec![
                header("ratelimit-policy", "p;q=0;w=1"),
                header("ratelimit", "p;r=5;t=30, q;r=1"),
            ],
            vec![
                header("ratelimit-policy", "p;q=20;w=1,"),
                header("ratelimit", "p;r=0;t=30;;"),
            ],
        ],
        Dialect::XRateLimit => vec![
            vec![
                header("x-ratelimit-limit", "20"),
                header("x-ratelimit-limit", "30"),
                header("x-ratelimit-remaining", "0"),
                header("x-ratelimit-remaining", "0"),
                header("x-ratelimit-reset", "30"),
            ],
            vec![
                header("x-ratelimit-limit", "twenty"),
                header("x-ratelimit-remaining", "none"),
                header("x-ratelimit-reset", "soon"),
            ],
            vec![
                header("x-ratelimit-limit", "9".repeat(40)),
                header("x-ratelimit-remaining", "-0"),
                header("x-ratelimit-reset", "30"),
            ],
            vec![
                header("x-ratelimit-limit", "0"),
                header("x-ratelimit-remaining", "0"),
                // Milliseconds since the epoch: not a form this reads.
                header("x-ratelimit-reset", "1750000000000"),
            ],
            vec![
                header("x-ratelimit-limit", "2".repeat(60_000)),
                header("x-ratelimit-remaining", "0"),
                header("x-ratelimit-reset", "3".repeat(60_000)),
            ],
            vec![
                // The configured quota; a reset that has passed.
                header("x-ratelimit-limit", "50"),
                header("x-ratelimit-remaining", "0"),
                header("x-ratelimit-reset", "1000000000"),
            ],
            [
                many("x-ratelimit-limit", "20"),
                many("x-ratelimit-remaining", "0"),
            ]
            .concat(),
        ],
    }
}

#[tokio::test]
async fn garbage_and_hostile_headers_change_nothing_in_each_dialect() {
    for dialect in Dialect::BOTH {
        let (_redis, limiter, upstream) = one_instance_and_upstream(Algorithm::TokenBucket).await;
        let configured = per_second(50);
        let layer = layer(&limiter, configured, Some(configured));
        for (i, headers) in hostile(dialect).into_iter().enumerate() {
            upstream.announce(headers.clone());
            let response = call(&layer, &upstream).await;
            // Handed back as the upstream sent it.
            for (name, value) in &headers {
                assert!(
                    response.headers().get_all(name).iter().any(|v| v == value),
                    "{dialect:?} #{i}: {name} lost"
                );
            }
            let status = limiter.inspect(KEY).await.unwrap();
            assert_eq!(status.quota_override, None, "{dialect:?} #{i}");
            assert_eq!(status.suspended_for, None, "{dialect:?} #{i}");
            let stats = layer.stats();
            assert_eq!((stats.learned, stats.paced), (0, 0), "{dialect:?} #{i}");
        }
        assert_eq!(limiter.stats().store_errors, 0);
    }
}
