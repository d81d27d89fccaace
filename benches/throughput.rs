//! Decisions a second, latency and cost of redlimit against the floor: a raw redis-rs `EVALSHA`
//! of a reference script that does only what any limiter must (`TIME`, one `GET`, one
//! `SET key value PX ttl`).
//!
//! ```text
//! cargo bench --bench throughput                # full run (a few minutes)
//! cargo bench --bench throughput -- --quick     # under 2 minutes
//! REDIS_URL=redis://10.0.0.5:6379/ cargo bench --bench throughput -- --quick
//! ```
//!
//! Redis is a private `redis-server` this bench starts on a free loopback port, or the one at
//! `REDIS_URL` when set (keys under `redlimit-bench*`, which expire; `CONFIG RESETSTAT` is sent
//! before each run, so use a Redis of your own).
//!
//! Every scenario runs at concurrency 1, 64 and 256 (tasks, each with one operation in flight),
//! on one hot key and over 10 000 keys:
//!
//! - `raw`: redis-rs `EVALSHA` of the reference script on one multiplexed connection;
//! - `check/<algorithm>`: `Limiter::check` through a `RedisStore` (one connection);
//! - `layer`: the `RateLimitLayer` in process (`ready` + `call` on a trivial `service_fn`), and
//!   `service` the same service without the layer (what the bench itself costs);
//! - `http`, `http+layer`: the axum example's router served on 127.0.0.1:0, driven by hyper
//!   clients over keep-alive connections (one per task);
//! - `denied/<algorithm>`: `Limiter::check` on keys whose quota is already spent;
//! - `deny-cache/<algorithm>`: a hot over-limit key makes 90 % of the traffic, the rest is spread
//!   over other keys, with and without the limiter's deny cache;
//! - `fleet <case>`: what the fleet features cost Redis, token bucket, concurrency 64, hot key, in
//!   the compared rounds: `override` (a quota set with `Limiter::set_quota`), `two tiers`
//!   (`Limiter::check_quotas` with a per-second and a per-minute quota), `suspended` (a key under
//!   `Limiter::suspend`: the denied path). A limiter that uses none of them is the
//!   `check token-bucket` row itself.
//! - `connections`: token-bucket `Limiter::check` at concurrency 256, hot key and 10 000 keys,
//!   over 1, 2 and 4 connections taken round robin per call (`RoundRobin` below: what a
//!   `connections(n)` store option would do), interleaved round by round; one summary line per
//!   shape.
//!
//! Allowed runs use a quota that admits everything (10^9 a second; the sliding log 100 000 per
//! 100 ms, its burst cap); a run that saw a denial, an error or a non-200 answer fails. Each run
//! is warmed up first. Redis `usec_per_call` of `EVALSHA` comes from `INFO commandstats` after a
//! `CONFIG RESETSTAT`; allocations per decision from the counting global allocator below.
//! The ratios at the end come from the compared runs interleaved round by round in this process,
//! so a noisy machine moves both sides of each ratio alike: the throughput ratios are the medians
//! of the per-round ratios; the Redis cost ratios compare each side's least-disturbed round
//! (preemption of Redis mid-script only ever adds to `usec_per_call`). Redis CPU per decision
//! (`/proc/<pid>/schedstat` of the private server) and this process's CPU per decision are shown
//! too: waiting for a CPU does not inflate them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::{routing::get, Router};
use bytes::Bytes;
use futures::future::BoxFuture;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use redis::aio::MultiplexedConnection;
use redlimit::key::HeaderKey;
use redlimit::store::{CheckRequest, RedisStore, Store, StoreError};
use redlimit::{
    limiter::{LimiterBuilder, LimiterStats},
    Algorithm, Decision, Limiter, Quota, Quotas, RateLimitLayer, Verdict,
};
use tower::{Layer, Service, ServiceExt};

mod support;
use support::PrivateRedis;
// The TLS tests' certificates (a private CA, a server certificate for 127.0.0.1).
#[allow(dead_code)]
#[path = "../tests/support/tls.rs"]
mod tls;

// ---------------------------------------------------------------------------------------------
// Allocation counting

/// Counts every allocation (and reallocation) of the process.
///
/// Each thread counts on a cache line of its own: one shared counter had both cores fight over
/// one line on every allocation, which slowed a run in proportion to its allocations (the
/// layer's 22 per request against `check`'s 12) and so leaned on the ratios this bench exists
/// to measure.
struct CountingAlloc;

/// Counting shards, one cache line each; threads take them in turn (more threads than shards
/// share one, which only costs speed).
static ALLOCATIONS: [Shard; SHARDS] = [const { Shard(AtomicU64::new(0)) }; SHARDS];
const SHARDS: usize = 16;
/// The shard the next new thread takes.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

#[repr(align(128))]
struct Shard(AtomicU64);

thread_local! {
    /// This thread's shard, `usize::MAX` until its first allocation. A `const` `Copy` value:
    /// reading it never allocates and never runs a destructor, as an allocator needs.
    static SHARD: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

fn count_allocation() {
    let shard = SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0);
    ALLOCATIONS[shard].0.fetch_add(1, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_allocation();
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_allocation();
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> u64 {
    ALLOCATIONS
        .iter()
        .map(|shard| shard.0.load(Ordering::Relaxed))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// Settings and shapes

/// How long and how often things run.
struct Settings {
    quick: bool,
    warm_up: Duration,
    run: Duration,
    /// Most operations one run makes (the time bound usually ends it first).
    max_ops: u64,
    /// Interleaved rounds of the compared runs (concurrency 64, hot key).
    rounds: usize,
    /// Interleaved rounds of the deny-cache runs (with and without), per algorithm.
    deny_rounds: usize,
    /// Interleaved rounds of the connections runs (1, 2 and 4 connections), per shape.
    connection_rounds: usize,
    /// `-n` of `redis-benchmark`.
    redis_benchmark_requests: u64,
}

impl Settings {
    fn from_args() -> Settings {
        let quick = std::env::args().any(|arg| arg == "--quick");
        if quick {
            Settings {
                quick,
                warm_up: Duration::from_millis(100),
                run: Duration::from_millis(250),
                max_ops: 2_000_000,
                rounds: 9,
                deny_rounds: 3,
                connection_rounds: 4,
                redis_benchmark_requests: 200_000,
            }
        } else {
            Settings {
                quick,
                warm_up: Duration::from_millis(300),
                run: Duration::from_millis(1000),
                max_ops: 10_000_000,
                rounds: 15,
                deny_rounds: 5,
                connection_rounds: 9,
                redis_benchmark_requests: 1_000_000,
            }
        }
    }
}

/// Distinct keys of the spread runs.
const KEYS: usize = 10_000;
/// Keys the deny cache may hold in the deny-cache runs.
const DENY_CACHE_KEYS: usize = 10_000;
/// Concurrency of the compared runs and of the ratios.
const RATIO_CONCURRENCY: usize = 64;
/// The connections of the connections runs ([`RoundRobin`] over that many stores).
const CONNECTIONS: [usize; 3] = [1, 2, 4];
/// The algorithms of the `redis cost/reference` line, in its order.
const COST_LINE_ORDER: [&str; 5] = [
    "token-bucket",
    "gcra",
    "fixed-window",
    "sliding-window",
    "sliding-log",
];
/// The key prefix in Redis.
const PREFIX: &str = "redlimit-bench";

/// Tasks in flight and the keys they use.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shape {
    concurrency: usize,
    keys: Keys,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Keys {
    /// Every operation on key 0.
    Hot,
    /// Operations rotate over [`KEYS`] keys.
    Spread,
    /// 90 % on key 0 (over its quota), 10 % spread over the other keys (under theirs).
    HotDenied,
}

impl Shape {
    const ALL: [Shape; 6] = [
        Shape::new(1, Keys::Hot),
        Shape::new(64, Keys::Hot),
        Shape::new(256, Keys::Hot),
        Shape::new(1, Keys::Spread),
        Shape::new(64, Keys::Spread),
        Shape::new(256, Keys::Spread),
    ];
    const RATIO: Shape = Shape::new(RATIO_CONCURRENCY, Keys::Hot);

    const fn new(concurrency: usize, keys: Keys) -> Shape {
        Shape { concurrency, keys }
    }

    /// The key index of operation `n` of task `task`.
    fn key(&self, task: usize, n: u64) -> usize {
        let i = n as usize * self.concurrency + task;
        match self.keys {
            Keys::Hot => 0,
            Keys::Spread => i % KEYS,
            Keys::HotDenied if !i.is_multiple_of(10) => 0,
            Keys::HotDenied => 1 + (i / 10) % (KEYS - 1),
        }
    }

    fn label(&self) -> String {
        let keys = match self.keys {
            Keys::Hot => "hot key".to_owned(),
            Keys::Spread => format!("{KEYS} keys"),
            Keys::HotDenied => "90% hot denied".to_owned(),
        };
        format!("c{:<3} {keys}", self.concurrency)
    }
}

/// The keys, prepared once so that operations do not allocate them.
struct KeySet {
    /// `client-<i>`, what `Limiter::check` gets.
    plain: Vec<String>,
    /// The reference script's Redis key for each.
    raw: Vec<String>,
    /// The `x-api-key` header value for each.
    header: Vec<HeaderValue>,
}

impl KeySet {
    fn new() -> Arc<KeySet> {
        let plain: Vec<String> = (0..KEYS).map(|i| format!("client-{i}")).collect();
        Arc::new(KeySet {
            raw: plain
                .iter()
                .map(|k| format!("{PREFIX}-ref:{{{k}}}"))
                .collect(),
            header: plain
                .iter()
                .map(|k| HeaderValue::from_str(k).expect("a valid header value"))
                .collect(),
            plain,
        })
    }
}

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

// ---------------------------------------------------------------------------------------------
// Latency histogram

/// Log-linear histogram of nanoseconds: 32 buckets per power of two (about 3 % wide).
struct Histogram {
    counts: Box<[u32; Histogram::BUCKETS]>,
}

impl Histogram {
    const BUCKETS: usize = 32 + 59 * 32;

    fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; Histogram::BUCKETS]),
        }
    }

    fn record(&mut self, nanos: u64) {
        let index = if nanos < 32 {
            nanos as usize
        } else {
            let exponent = 63 - nanos.leading_zeros() as usize; // >= 5
            let mantissa = (nanos >> (exponent - 5)) as usize - 32;
            32 + (exponent - 5) * 32 + mantissa
        };
        self.counts[index] += 1;
    }

    /// The middle of bucket `index`, in nanoseconds.
    fn value(index: usize) -> f64 {
        if index < 32 {
            return index as f64;
        }
        let (exponent, mantissa) = ((index - 32) / 32 + 5, (index - 32) % 32);
        ((64 + 2 * mantissa + 1) as f64 / 2.0) * (1u64 << (exponent - 5)) as f64
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }

    /// The `q` quantile in microseconds.
    fn quantile_us(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        let target = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += u64::from(count);
            if seen >= target {
                return Histogram::value(index) / 1000.0;
            }
        }
        f64::NAN
    }
}

// ---------------------------------------------------------------------------------------------
// The runner

/// One task's operation: what it does for its `n`-th call. `true` when it went as expected.
trait Op: Send + 'static {
    fn run(&mut self, n: u64) -> impl Future<Output = bool> + Send + '_;
}

/// What one measured run saw.
#[derive(Clone)]
struct Run {
    ops: u64,
    failures: u64,
    elapsed: Duration,
    p50_us: f64,
    p99_us: f64,
    allocations: u64,
    /// `usec_per_call` and calls of `EVALSHA` in Redis during the run.
    redis: Option<ScriptStat>,
    /// CPU time of Redis's main thread during the run, when it is this bench's own server.
    redis_cpu: Option<Duration>,
    /// CPU time of this process (all its threads) during the run.
    own_cpu: Option<Duration>,
}

impl Run {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    fn allocations_per_op(&self) -> f64 {
        self.allocations as f64 / self.ops as f64
    }

    /// Redis CPU microseconds per operation (all of Redis's work: network, parsing, script).
    fn redis_cpu_us(&self) -> f64 {
        self.redis_cpu
            .map_or(f64::NAN, |cpu| cpu.as_secs_f64() * 1e6 / self.ops as f64)
    }

    /// This process's CPU microseconds per operation: the client side (and, for HTTP, the
    /// server and the load generator too).
    fn own_cpu_us(&self) -> f64 {
        self.own_cpu
            .map_or(f64::NAN, |cpu| cpu.as_secs_f64() * 1e6 / self.ops as f64)
    }

    fn usec_per_call(&self) -> f64 {
        self.redis.map_or(f64::NAN, |s| s.usec_per_call)
    }
}

#[derive(Debug, Clone, Copy)]
struct ScriptStat {
    calls: u64,
    usec_per_call: f64,
}

/// Runs `ops` (one task each) for a warm-up, then for a measured run, and gives the ops back.
async fn measure<O: Op>(settings: &Settings, redis: &Admin, ops: Vec<O>) -> (Run, Vec<O>) {
    let (_, ops) = run_tasks(ops, settings.warm_up, settings.max_ops).await;
    redis.reset_stats().await;
    let (cpu_before, own_before) = (redis.cpu(), own_cpu());
    let (mut run, ops) = run_tasks(ops, settings.run, settings.max_ops).await;
    run.redis_cpu = redis
        .cpu()
        .zip(cpu_before)
        .map(|(after, before)| after - before);
    run.own_cpu = own_cpu()
        .zip(own_before)
        .map(|(after, before)| after.saturating_sub(before));
    run.redis = redis.script_stat().await;
    (run, ops)
}

/// CPU time of this process so far: the time on a CPU of each of its threads
/// (`/proc/self/task/*/schedstat`, in nanoseconds).
fn own_cpu() -> Option<Duration> {
    let mut nanos = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        if let Ok(schedstat) = std::fs::read_to_string(path) {
            nanos += schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(Duration::from_nanos(nanos))
}

async fn run_tasks<O: Op>(ops: Vec<O>, duration: Duration, max_ops: u64) -> (Run, Vec<O>) {
    let per_task = (max_ops / ops.len() as u64).max(1);
    let go = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(ops.len());
    for mut op in ops {
        let (go, stop) = (go.clone(), stop.clone());
        let mut histogram = Histogram::new();
        tasks.push(tokio::spawn(async move {
            while !go.load(Ordering::Acquire) {
                tokio::task::yield_now().await;
            }
            let (mut n, mut failures) = (0, 0);
            while n < per_task && !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                if !op.run(n).await {
                    failures += 1;
                }
                histogram.record(start.elapsed().as_nanos() as u64);
                n += 1;
            }
            (op, n, failures, histogram)
        }));
    }
    // Let every task reach its start line.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let allocations_before = allocations();
    let start = Instant::now();
    go.store(true, Ordering::Release);
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.expect("a bench task panicked"));
    }
    let elapsed = start.elapsed();
    let allocations = allocations() - allocations_before;

    let mut histogram = Histogram::new();
    let (mut ops, mut total, mut failures) = (Vec::new(), 0, 0);
    for (op, n, f, h) in results {
        ops.push(op);
        total += n;
        failures += f;
        histogram.merge(&h);
    }
    let run = Run {
        ops: total,
        failures,
        elapsed,
        p50_us: histogram.quantile_us(0.50),
        p99_us: histogram.quantile_us(0.99),
        allocations,
        redis: None,
        redis_cpu: None,
        own_cpu: None,
    };
    (run, ops)
}

// ---------------------------------------------------------------------------------------------
// Operations

/// (a) The reference script: only `TIME`, one `GET` and one `SET key value PX ttl` on its key.
const REFERENCE_SCRIPT: &str = r"
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, 0, 0, 0, 0}
";

/// (a) raw redis-rs `EVALSHA` of [`REFERENCE_SCRIPT`] on one multiplexed connection (shared by
/// every task: each holds a clone of the handle).
struct RawOp {
    connection: MultiplexedConnection,
    sha: Arc<str>,
    keys: Arc<KeySet>,
    shape: Shape,
    task: usize,
}

impl Op for RawOp {
    async fn run(&mut self, n: u64) -> bool {
        let key = &self.keys.raw[self.shape.key(self.task, n)];
        let reply: redis::RedisResult<redis::Value> = redis::cmd("EVALSHA")
            .arg(&*self.sha)
            .arg(1)
            .arg(key)
            .arg("1764500000000000:7")
            .arg(1000)
            .query_async(&mut self.connection)
            .await;
        reply.is_ok()
    }
}

/// (b) `Limiter::check`; `true` when the decision is the expected one.
struct CheckOp {
    limiter: Limiter,
    /// The quota of every key (of the spread keys in a [`Keys::HotDenied`] run).
    quota: Quota,
    /// The spent quota of the hot key in a [`Keys::HotDenied`] run.
    spent: Quota,
    expect_allowed: bool,
    keys: Arc<KeySet>,
    shape: Shape,
    task: usize,
}

impl Op for CheckOp {
    async fn run(&mut self, n: u64) -> bool {
        let index = self.shape.key(self.task, n);
        let key = &self.keys.plain[index];
        if self.shape.keys == Keys::HotDenied {
            let (quota, allowed) = if index == 0 {
                (&self.spent, false)
            } else {
                (&self.quota, true)
            };
            return self.limiter.check(key, quota).await.is_allowed() == allowed;
        }
        self.limiter.check(key, &self.quota).await.is_allowed() == self.expect_allowed
    }
}

/// A fleet feature the bench measures (see [`Bench::fleet`]).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fleet {
    /// The key's quota overridden with `Limiter::set_quota` (admitting).
    Override,
    /// Two tiers in one call: `Limiter::check_quotas` with a per-second and a per-minute quota.
    TwoTiers,
    /// The key suspended with `Limiter::suspend`: every decision is a denial.
    Suspended,
}

impl Fleet {
    const ALL: [Fleet; 3] = [Fleet::Override, Fleet::TwoTiers, Fleet::Suspended];

    fn name(self) -> &'static str {
        match self {
            Fleet::Override => "override",
            Fleet::TwoTiers => "two tiers",
            Fleet::Suspended => "suspended",
        }
    }
}

/// `Limiter::check_quotas` on the hot key; `true` when the decision is the expected one
/// (admitted, or denied because suspended).
struct FleetOp {
    limiter: Limiter,
    quotas: Quotas,
    suspended: bool,
    keys: Arc<KeySet>,
}

impl Op for FleetOp {
    async fn run(&mut self, _n: u64) -> bool {
        let verdict = self
            .limiter
            .check_quotas(&self.keys.plain[0], &self.quotas, 1)
            .await;
        match verdict {
            Verdict::Decided(decision) => {
                decision.allowed != self.suspended && decision.suspended == self.suspended
            }
            _ => false,
        }
    }
}

/// (c) `ready` + `call` on a service (the layer over a trivial service, or the trivial service
/// alone), with requests carrying `x-api-key`; `true` on `200 OK`.
struct ServiceOp<S> {
    service: S,
    keys: Arc<KeySet>,
    shape: Shape,
    task: usize,
}

impl<S, B> Op for ServiceOp<S>
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible> + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    async fn run(&mut self, n: u64) -> bool {
        let mut request = Request::new(());
        request.headers_mut().insert(
            API_KEY,
            self.keys.header[self.shape.key(self.task, n)].clone(),
        );
        let Ok(service) = self.service.ready().await;
        let Ok(response) = service.call(request).await;
        response.status() == StatusCode::OK
    }
}

/// The trivial inner service of (c).
fn trivial_service(
) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(|_request: Request<()>| async { Ok(Response::new(())) })
}

/// (d) one keep-alive HTTP/1.1 connection of the load generator; `true` on `200 OK`.
struct HttpOp {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    keys: Arc<KeySet>,
    shape: Shape,
    task: usize,
}

impl HttpOp {
    async fn connect(address: SocketAddr, keys: Arc<KeySet>, shape: Shape, task: usize) -> HttpOp {
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("the bench server accepts connections");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("an HTTP/1.1 handshake");
        tokio::spawn(connection);
        HttpOp {
            sender,
            keys,
            shape,
            task,
        }
    }
}

impl Op for HttpOp {
    async fn run(&mut self, n: u64) -> bool {
        let request = Request::get("/")
            .header(http::header::HOST, "127.0.0.1")
            .header(API_KEY, &self.keys.header[self.shape.key(self.task, n)])
            .body(Empty::new())
            .expect("a valid request");
        if self.sender.ready().await.is_err() {
            return false;
        }
        let Ok(response) = self.sender.send_request(request).await else {
            return false;
        };
        let ok = response.status() == StatusCode::OK;
        ok && response.into_body().collect().await.is_ok()
    }
}

// ---------------------------------------------------------------------------------------------
// Redis

/// The Redis under test and an admin connection for stats.
struct Admin {
    url: String,
    connection: MultiplexedConnection,
    /// Whether `CONFIG RESETSTAT` works (a managed Redis may refuse it).
    stats: bool,
    _server: Option<PrivateRedis>,
}

impl Admin {
    async fn connect() -> Admin {
        let (url, server) = match std::env::var("REDIS_URL") {
            Ok(url) => (url, None),
            Err(_) => {
                let server = PrivateRedis::start().unwrap_or_else(|e| {
                    panic!("{e}: install redis-server or set REDIS_URL to a Redis of your own")
                });
                (server.url(), Some(server))
            }
        };
        let connection = connect(&url).await;
        let mut admin = Admin {
            url,
            connection,
            stats: true,
            _server: server,
        };
        admin.stats = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut admin.connection)
            .await
            .is_ok();
        admin
    }

    async fn info(&self, section: &str) -> String {
        redis::cmd("INFO")
            .arg(section)
            .query_async::<String>(&mut self.connection.clone())
            .await
            .unwrap_or_default()
    }

    async fn version(&self) -> String {
        let info = self.info("server").await;
        info_field(&info, "redis_version").unwrap_or("?").to_owned()
    }

    /// CPU time of the private server's main thread so far (`/proc/<pid>/schedstat`: time on
    /// a CPU in nanoseconds, which waiting for a CPU does not inflate).
    fn cpu(&self) -> Option<Duration> {
        let pid = self._server.as_ref()?.pid();
        let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
        let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
        Some(Duration::from_nanos(nanos))
    }

    async fn reset_stats(&self) {
        if self.stats {
            let _: redis::RedisResult<()> = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut self.connection.clone())
                .await;
        }
    }

    /// `EVALSHA` calls and their `usec_per_call` since the last reset.
    async fn script_stat(&self) -> Option<ScriptStat> {
        if !self.stats {
            return None;
        }
        let info = self.info("commandstats").await;
        let line = info_field(&info, "cmdstat_evalsha")?;
        let field = |name: &str| {
            line.split(',')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<f64>().ok())
        };
        let (calls, usec) = (field("calls")?, field("usec")?);
        Some(ScriptStat {
            calls: calls as u64,
            usec_per_call: usec / calls,
        })
    }

    /// A limiter on a store of its own (one connection), checked once so that a dead Redis
    /// fails here.
    async fn limiter(&self, algorithm: Algorithm, prefix: &str, deny_cache: bool) -> Limiter {
        let store = RedisStore::builder(self.url.as_str())
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a valid Redis URL");
        let builder = Limiter::builder(store).algorithm(algorithm).prefix(prefix);
        let builder = if deny_cache {
            with_deny_cache(builder).expect("deny-cache runs only when this build has one")
        } else {
            builder
        };
        let limiter = builder.build().expect("a valid limiter");
        limiter
            .try_check_quotas("warm-up", &admitting(algorithm).into(), 1)
            .await
            .unwrap_or_else(|e| panic!("Redis at {} does not answer: {e}", self.url));
        limiter
    }
}

/// `n` stores of one connection each, taken in turn by the calls (one counter, no lock): what
/// `RedisStoreBuilder::connections(n)` did in commit 8f7a1cd (branch `connections`), removed
/// because these runs showed no clear gain; kept here so that the decision can be measured again.
#[derive(Debug)]
struct RoundRobin {
    stores: Vec<RedisStore>,
    next: AtomicUsize,
}

impl Store for RoundRobin {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.stores.len();
        self.stores[i].check(request)
    }
}

impl Admin {
    /// A token-bucket limiter on [`RoundRobin`] over `connections` connections, checked once.
    async fn round_robin_limiter(&self, connections: usize, prefix: &str) -> Limiter {
        let stores = (0..connections)
            .map(|_| {
                RedisStore::builder(self.url.as_str())
                    .timeout(Duration::from_secs(2))
                    .build()
                    .expect("a valid Redis URL")
            })
            .collect();
        let store = RoundRobin {
            stores,
            next: AtomicUsize::new(0),
        };
        let algorithm = Algorithm::TokenBucket;
        let limiter = Limiter::builder(store)
            .algorithm(algorithm)
            .prefix(prefix)
            .build()
            .expect("a valid limiter");
        // One check per connection, so that each is open before the runs.
        for _ in 0..connections {
            limiter
                .try_check_quotas("warm-up", &admitting(algorithm).into(), 1)
                .await
                .unwrap_or_else(|e| panic!("Redis at {} does not answer: {e}", self.url));
        }
        limiter
    }
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .expect("a valid Redis URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Redis at {url}: {e}"))
}

fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// A quota that admits every check of the bench.
fn admitting(algorithm: Algorithm) -> Quota {
    match algorithm {
        Algorithm::SlidingLog => Quota::new(
            redlimit::algorithm::MAX_SLIDING_LOG_BURST,
            Duration::from_millis(100),
        ),
        _ => Quota::per_second(1_000_000_000),
    }
    .expect("a valid quota")
}

/// A quota the bench spends with its first check of a key: every later check is denied.
fn spent() -> Quota {
    Quota::per_hour(1).expect("a valid quota")
}

/// The builder with the local deny cache on.
fn with_deny_cache(builder: LimiterBuilder) -> Option<LimiterBuilder> {
    Some(builder.deny_cache(DENY_CACHE_KEYS))
}

fn has_deny_cache() -> bool {
    with_deny_cache(Limiter::builder(redlimit::store::MemoryStore::new())).is_some()
}

// ---------------------------------------------------------------------------------------------
// Scenarios

/// A row of the table: a scenario at one shape, with its runs (several for the compared shape).
struct Row {
    scenario: String,
    shape: Shape,
    runs: Vec<Run>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

impl Row {
    fn median_of(&self, f: impl Fn(&Run) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }
}

struct Bench {
    settings: Settings,
    admin: Admin,
    keys: Arc<KeySet>,
    sha: Arc<str>,
    raw_connection: MultiplexedConnection,
    rows: Vec<Row>,
}

impl Bench {
    fn record(&mut self, scenario: &str, shape: Shape, run: Run) {
        assert_eq!(
            run.failures,
            0,
            "{scenario} at {}: {} of {} operations failed or had an unexpected decision: the \
             figures would not be valid",
            shape.label(),
            run.failures,
            run.ops
        );
        match self
            .rows
            .iter_mut()
            .find(|row| row.scenario == scenario && row.shape == shape)
        {
            Some(row) => row.runs.push(run),
            None => self.rows.push(Row {
                scenario: scenario.to_owned(),
                shape,
                runs: vec![run],
            }),
        }
    }

    async fn raw(&mut self, shape: Shape) -> Run {
        let ops = (0..shape.concurrency)
            .map(|task| RawOp {
                connection: self.raw_connection.clone(),
                sha: self.sha.clone(),
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        self.record("raw EVALSHA (reference)", shape, run.clone());
        run
    }

    fn check_ops(
        &self,
        limiter: &Limiter,
        quota: Quota,
        allowed: bool,
        shape: Shape,
    ) -> Vec<CheckOp> {
        (0..shape.concurrency)
            .map(|task| CheckOp {
                limiter: limiter.clone(),
                quota,
                spent: spent(),
                expect_allowed: allowed,
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect()
    }

    /// (b) on the allowed path.
    async fn check(&mut self, algorithm: Algorithm, shape: Shape) -> Run {
        let prefix = format!("{PREFIX}-{algorithm}");
        let limiter = self.admin.limiter(algorithm, &prefix, false).await;
        let ops = self.check_ops(&limiter, admitting(algorithm), true, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        assert_only(&limiter, "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        });
        self.record(&format!("check {algorithm}"), shape, run.clone());
        run
    }

    /// (b) on the denied path: every key's quota is spent before the run.
    async fn denied(&mut self, algorithm: Algorithm, shape: Shape) {
        let prefix = format!("{PREFIX}-denied-{algorithm}");
        let limiter = self.admin.limiter(algorithm, &prefix, false).await;
        let quota = spent();
        let keys = if shape.keys == Keys::Hot { 1 } else { KEYS };
        for chunk in self.keys.plain[..keys].chunks(256) {
            futures::future::join_all(chunk.iter().map(|key| limiter.check(key, &quota))).await;
        }
        let before = limiter.stats();
        let ops = self.check_ops(&limiter, quota, false, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        let after = limiter.stats();
        assert!(
            after.allowed == before.allowed && after.store_errors == 0,
            "{algorithm}: the denied run admitted or failed ({before:?} -> {after:?})"
        );
        self.record(&format!("denied {algorithm}"), shape, run);
    }

    /// (c) the layer over a trivial service, token bucket.
    async fn layer(&mut self, shape: Shape) -> Run {
        let limiter = self
            .admin
            .limiter(Algorithm::TokenBucket, &format!("{PREFIX}-layer"), false)
            .await;
        let layer = RateLimitLayer::new(
            limiter.clone(),
            admitting(Algorithm::TokenBucket),
            HeaderKey::named("x-api-key").expect("a valid header name"),
        );
        let service = layer.layer(trivial_service());
        let ops = (0..shape.concurrency)
            .map(|task| ServiceOp {
                service: service.clone(),
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        assert_only(&limiter, "allowed", |s| {
            s.denied == 0 && s.store_errors == 0
        });
        self.record("layer (ready+call)", shape, run.clone());
        run
    }

    /// What (c) costs without the layer: the request the bench builds and the trivial service.
    async fn service_alone(&mut self, shape: Shape) {
        let service = trivial_service();
        let ops = (0..shape.concurrency)
            .map(|task| ServiceOp {
                service: service.clone(),
                keys: self.keys.clone(),
                shape,
                task,
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        self.record("service alone (no layer)", shape, run);
    }

    /// (d) HTTP through the example's router, with or without the layer.
    async fn http(&mut self, shape: Shape, with_layer: bool) {
        let limiter = self
            .admin
            .limiter(Algorithm::TokenBucket, &format!("{PREFIX}-http"), false)
            .await;
        // The router and handler of examples/axum.rs.
        let app = Router::new().route("/", get(|| async { "ok" }));
        let app = if with_layer {
            app.layer(RateLimitLayer::new(
                limiter.clone(),
                admitting(Algorithm::TokenBucket),
                HeaderKey::named("x-api-key").expect("a valid header name"),
            ))
        } else {
            app
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let address = listener.local_addr().expect("a local address");
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = on_shutdown.await;
            })
            .await
        });
        let mut ops = Vec::with_capacity(shape.concurrency);
        for task in 0..shape.concurrency {
            ops.push(HttpOp::connect(address, self.keys.clone(), shape, task).await);
        }
        let (run, ops) = measure(&self.settings, &self.admin, ops).await;
        drop(ops);
        let _ = shutdown.send(());
        let _ = server.await;
        if with_layer {
            assert_only(&limiter, "allowed", |s| {
                s.denied == 0 && s.store_errors == 0
            });
        }
        let scenario = if with_layer {
            "http + layer"
        } else {
            "http (no layer)"
        };
        self.record(scenario, shape, run);
    }

    /// (b) with the deny cache or without, 90 % of the traffic on a hot key over its quota.
    async fn deny_mix(&mut self, algorithm: Algorithm, deny_cache: bool) -> Run {
        let shape = Shape::new(RATIO_CONCURRENCY, Keys::HotDenied);
        let prefix = format!("{PREFIX}-mix-{algorithm}-{deny_cache}");
        let limiter = self.admin.limiter(algorithm, &prefix, deny_cache).await;
        limiter.check(&self.keys.plain[0], &spent()).await;
        let ops = self.check_ops(&limiter, admitting(algorithm), true, shape);
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        let cache = if deny_cache { "with" } else { "without" };
        self.record(
            &format!("deny-cache {cache} {algorithm}"),
            shape,
            run.clone(),
        );
        run
    }
}

impl Bench {
    /// A fleet feature on the token bucket, concurrency 64, hot key: its own limiter and key,
    /// the feature set up (or set again) before the run and checked with one decision.
    async fn fleet(&mut self, fleet: Fleet) -> Run {
        let algorithm = Algorithm::TokenBucket;
        let prefix = format!("{PREFIX}-fleet-{}", fleet.name().replace(' ', "-"));
        let limiter = self.admin.limiter(algorithm, &prefix, false).await;
        let key = self.keys.plain[0].as_str();
        let admitting = admitting(algorithm);
        let (quotas, suspended) = match fleet {
            Fleet::Override => {
                // Another admitting quota, so that the decisions show which one was in force.
                let forced = Quotas::from(Quota::per_second(2_000_000_000).expect("a valid quota"));
                limiter.set_quota(key, &forced).await.expect("set_quota");
                let first = limiter.check(key, &admitting).await;
                assert_eq!(
                    first.decision().map(|d| d.quota),
                    Some(forced[0]),
                    "the override is in force"
                );
                (Quotas::from(admitting), false)
            }
            Fleet::TwoTiers => {
                let per_minute = Quota::per_minute(60_000_000_000).expect("a valid quota");
                let tiers = Quotas::new([admitting, per_minute]).expect("two valid quotas");
                (tiers, false)
            }
            Fleet::Suspended => {
                limiter
                    .suspend(key, Duration::from_secs(3600))
                    .await
                    .expect("suspend");
                (Quotas::from(admitting), true)
            }
        };
        let before = limiter.stats();
        let ops = (0..RATIO_CONCURRENCY)
            .map(|_| FleetOp {
                limiter: limiter.clone(),
                quotas,
                suspended,
                keys: self.keys.clone(),
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        let after = limiter.stats();
        assert!(
            after.store_errors == 0
                && if suspended {
                    after.allowed == before.allowed
                } else {
                    after.denied == before.denied
                },
            "fleet {}: the run saw other decisions or store errors ({before:?} -> {after:?})",
            fleet.name()
        );
        self.record(
            &format!("fleet {}", fleet.name()),
            Shape::RATIO,
            run.clone(),
        );
        run
    }
}

impl Bench {
    /// Token-bucket `Limiter::check` at concurrency 256 over 1, 2 and 4 connections,
    /// interleaved round by round (starting at a rotating place), on the hot key and over
    /// [`KEYS`] keys. Prints decisions/s of each (medians) and the per-round ratios to one
    /// connection.
    async fn connections(&mut self) {
        let algorithm = Algorithm::TokenBucket;
        let rounds = self.settings.connection_rounds;
        for keys in [Keys::Hot, Keys::Spread] {
            let shape = Shape::new(256, keys);
            let mut limiters = Vec::new();
            for n in CONNECTIONS {
                let prefix = format!("{PREFIX}-connections-{n}");
                limiters.push(self.admin.round_robin_limiter(n, &prefix).await);
            }
            let mut rates = vec![Vec::new(); CONNECTIONS.len()];
            // This process's and Redis's CPU µs per decision.
            let mut cpu = vec![(Vec::new(), Vec::new()); CONNECTIONS.len()];
            for round in 0..rounds {
                for step in 0..CONNECTIONS.len() {
                    let i = (step + round) % CONNECTIONS.len();
                    let ops = self.check_ops(&limiters[i], admitting(algorithm), true, shape);
                    let (run, _) = measure(&self.settings, &self.admin, ops).await;
                    assert_eq!(run.failures, 0, "{} connections failed", CONNECTIONS[i]);
                    rates[i].push(run.rate());
                    cpu[i].0.push(run.own_cpu_us());
                    cpu[i].1.push(run.redis_cpu_us());
                }
            }
            for limiter in &limiters {
                assert_only(limiter, "allowed", |s| s.denied == 0 && s.store_errors == 0);
            }
            let rate =
                |i: usize| format!("{} -> {:.0}/s", CONNECTIONS[i], median(rates[i].clone()));
            let ratio = |i: usize| {
                let ratio = Ratio::of(
                    rates[i]
                        .iter()
                        .zip(&rates[0])
                        .map(|(n, one)| n / one)
                        .collect(),
                );
                format!(
                    "{}/1 {:.2} ({:.2}-{:.2})",
                    CONNECTIONS[i], ratio.median, ratio.min, ratio.max
                )
            };
            let cpu: Vec<String> = cpu
                .iter()
                .zip(CONNECTIONS)
                .map(|((own, redis), n)| {
                    format!(
                        "{n}: {:.2}+{:.2}",
                        median(own.clone()),
                        median(redis.clone())
                    )
                })
                .collect();
            println!(
                "connections {}: {}, {}, {} (median of {rounds} rounds); per round {}, {}; CPU \
                 µs/decision bench+redis {}",
                shape.label(),
                rate(0),
                rate(1),
                rate(2),
                ratio(1),
                ratio(2),
                cpu.join(", ")
            );
        }
    }
}

/// Fails the bench when the limiter's counters show another path than the one measured.
fn assert_only(limiter: &Limiter, path: &str, ok: impl Fn(&LimiterStats) -> bool) {
    let stats = limiter.stats();
    assert!(
        ok(&stats),
        "a run of the {path} path saw other decisions or store errors: the figures are not \
         valid ({stats:?})"
    );
}

// ---------------------------------------------------------------------------------------------
// Output

fn print_table(rows: &[Row]) {
    println!(
        "{:<33} {:<20} {:>11} {:>9} {:>9} {:>13} {:>12} {:>12} {:>10}",
        "scenario",
        "shape",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "redis µs/call",
        "redis CPU µs",
        "bench CPU µs",
        "allocs/dec"
    );
    println!("{}", "-".repeat(139));
    let figure = |value: f64| {
        if value.is_nan() {
            "-".to_owned()
        } else {
            format!("{value:.2}")
        }
    };
    for row in rows {
        let usec = figure(row.median_of(Run::usec_per_call));
        let cpu = figure(row.median_of(Run::redis_cpu_us));
        let own = figure(row.median_of(Run::own_cpu_us));
        let runs = if row.runs.len() > 1 {
            format!(" (median of {})", row.runs.len())
        } else {
            String::new()
        };
        println!(
            "{:<33} {:<20} {:>11.0} {:>9.1} {:>9.1} {:>13} {:>12} {:>12} {:>10.2}{runs}",
            row.scenario,
            row.shape.label(),
            row.median_of(Run::rate),
            row.median_of(|r| r.p50_us),
            row.median_of(|r| r.p99_us),
            usec,
            cpu,
            own,
            row.median_of(Run::allocations_per_op),
        );
    }
}

/// What one algorithm (or the reference script) cost Redis in each round.
#[derive(Default)]
struct Costs {
    usec: Vec<f64>,
    cpu: Vec<f64>,
}

impl Costs {
    /// The least-disturbed figure: preemption of Redis mid-script only ever adds to
    /// `usec_per_call`, so on a shared machine the smallest of the rounds is the closest to the
    /// script's own cost.
    fn least(values: &[f64]) -> f64 {
        values
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::min)
    }
}

/// The median of per-round ratios, and their range.
struct Ratio {
    median: f64,
    min: f64,
    max: f64,
}

impl Ratio {
    fn of(values: Vec<f64>) -> Ratio {
        let finite: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        Ratio {
            median: median(finite.clone()),
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// `redis-benchmark -P 16` of the reference script, when it is on PATH.
fn redis_benchmark(url: &str, sha: &str, requests: u64) -> String {
    let Some((host, port, password)) = host_port(url) else {
        return format!("skipped: cannot read host and port from {url}");
    };
    let mut command = std::process::Command::new("redis-benchmark");
    command.args(["-h", &host, "-p", &port]);
    if let Some(password) = password {
        command.args(["-a", &password, "--no-auth-warning"]);
    }
    command
        .args(["-n", &requests.to_string(), "-c", "64", "-P", "16", "-q"])
        .args(["EVALSHA", sha, "1", &format!("{PREFIX}-ref:{{rb}}")])
        .args(["1764500000000000:7", "1000"]);
    match command.output() {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| line.rsplit('\r').next().unwrap_or(line).trim())
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(output) => format!(
            "failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => format!("skipped: redis-benchmark is not on PATH ({e})"),
    }
}

/// Host, port and password of a `redis://[user:password@]host[:port][/db]` URL.
fn host_port(url: &str) -> Option<(String, String, Option<String>)> {
    let rest = url.strip_prefix("redis://")?;
    let rest = rest.split('/').next()?;
    let (password, address) = match rest.rsplit_once('@') {
        Some((user_info, address)) => (
            user_info.split_once(':').map(|(_, p)| p.to_owned()),
            address,
        ),
        None => (None, rest),
    };
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
    Some((host.to_owned(), port.to_owned(), password))
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let settings = Settings::from_args();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(bench(settings));
}

async fn bench(settings: Settings) {
    let started = Instant::now();
    let admin = Admin::connect().await;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(REFERENCE_SCRIPT)
        .query_async(&mut admin.connection.clone())
        .await
        .expect("SCRIPT LOAD of the reference script");
    let raw_connection = connect(&admin.url).await;
    let version = admin.version().await;
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load_at_start = load_average();
    let mut bench = Bench {
        settings,
        admin,
        keys: KeySet::new(),
        sha: sha.into(),
        raw_connection,
        rows: Vec::new(),
    };

    // The compared runs, interleaved: round r runs each in turn, starting at a rotating place.
    let rounds = bench.settings.rounds;
    let (mut check_raw, mut layer_check) = (Vec::new(), Vec::new());
    // What the layer adds per decision in each round: this process's CPU, and Redis's.
    let (mut layer_own_cpu, mut layer_redis_cpu) = (Vec::new(), Vec::new());
    // Token-bucket `check`'s own per decision in each round: this process's CPU, and Redis's.
    let mut check_cpu = (Vec::new(), Vec::new());
    // Per algorithm, then the reference last: usec_per_call and Redis CPU per decision by round.
    let mut cost: Vec<(Option<Algorithm>, Costs)> = Algorithm::ALL
        .iter()
        .map(|&a| Some(a))
        .chain([None])
        .map(|a| (a, Costs::default()))
        .collect();
    // The fleet features, measured in the same rounds: usec_per_call and Redis CPU by round.
    let mut fleet_cost: Vec<(Fleet, Costs)> =
        Fleet::ALL.iter().map(|&f| (f, Costs::default())).collect();
    let compared = 2 + Algorithm::ALL.len() + Fleet::ALL.len();
    for round in 0..rounds {
        let (mut raw, mut layer) = (None, None);
        let mut checks: Vec<(Algorithm, Run)> = Vec::new();
        for step in 0..compared {
            match (step + round) % compared {
                0 => raw = Some(bench.raw(Shape::RATIO).await),
                1 => layer = Some(bench.layer(Shape::RATIO).await),
                i if i < 2 + Algorithm::ALL.len() => {
                    let algorithm = Algorithm::ALL[i - 2];
                    checks.push((algorithm, bench.check(algorithm, Shape::RATIO).await));
                }
                i => {
                    let (fleet, costs) = &mut fleet_cost[i - 2 - Algorithm::ALL.len()];
                    let run = bench.fleet(*fleet).await;
                    costs.usec.push(run.usec_per_call());
                    costs.cpu.push(run.redis_cpu_us());
                }
            }
        }
        let (raw, layer) = (raw.expect("ran"), layer.expect("ran"));
        let token_bucket = &checks
            .iter()
            .find(|(a, _)| *a == Algorithm::TokenBucket)
            .expect("ran")
            .1;
        check_raw.push(token_bucket.rate() / raw.rate());
        check_cpu.0.push(token_bucket.own_cpu_us());
        check_cpu.1.push(token_bucket.redis_cpu_us());
        layer_check.push(layer.rate() / token_bucket.rate());
        layer_own_cpu.push(layer.own_cpu_us() - token_bucket.own_cpu_us());
        layer_redis_cpu.push(layer.redis_cpu_us() - token_bucket.redis_cpu_us());
        let runs = checks.iter().map(|(a, run)| (Some(*a), run));
        for (algorithm, run) in runs.chain([(None, &raw)]) {
            let slot = cost
                .iter_mut()
                .find(|(a, _)| *a == algorithm)
                .expect("listed");
            slot.1.usec.push(run.usec_per_call());
            slot.1.cpu.push(run.redis_cpu_us());
        }
    }
    bench.service_alone(Shape::RATIO).await;

    // Every other shape once.
    for shape in Shape::ALL.into_iter().filter(|&s| s != Shape::RATIO) {
        bench.raw(shape).await;
        for &algorithm in Algorithm::ALL {
            bench.check(algorithm, shape).await;
        }
        bench.layer(shape).await;
        bench.service_alone(shape).await;
    }
    for shape in Shape::ALL {
        bench.http(shape, false).await;
        bench.http(shape, true).await;
    }
    for &algorithm in Algorithm::ALL {
        bench
            .denied(algorithm, Shape::new(RATIO_CONCURRENCY, Keys::Hot))
            .await;
        bench
            .denied(algorithm, Shape::new(RATIO_CONCURRENCY, Keys::Spread))
            .await;
    }

    // The deny cache: interleaved with and without, per algorithm.
    let mut speedups: Vec<(Algorithm, Ratio, f64)> = Vec::new();
    if has_deny_cache() {
        let deny_rounds = bench.settings.deny_rounds;
        for &algorithm in Algorithm::ALL {
            let (mut speedup, mut calls) = (Vec::new(), Vec::new());
            for round in 0..deny_rounds {
                let (with, without) = if round % 2 == 0 {
                    let with = bench.deny_mix(algorithm, true).await;
                    (with, bench.deny_mix(algorithm, false).await)
                } else {
                    let without = bench.deny_mix(algorithm, false).await;
                    (bench.deny_mix(algorithm, true).await, without)
                };
                speedup.push(with.rate() / without.rate());
                // EVALSHA calls per decision, with the cache over without.
                let per_decision = |run: &Run| {
                    run.redis
                        .map_or(f64::NAN, |s| s.calls as f64 / run.ops as f64)
                };
                calls.push(per_decision(&with) / per_decision(&without));
            }
            speedups.push((algorithm, Ratio::of(speedup), median(calls)));
        }
    }

    let redis_benchmark = redis_benchmark(
        &bench.admin.url,
        &bench.sha,
        bench.settings.redis_benchmark_requests,
    );

    // Sort the table by scenario, then shape.
    let order = |scenario: &str| {
        [
            "raw",
            "check",
            "denied",
            "deny-cache",
            "fleet",
            "service",
            "layer",
            "http (",
            "http +",
        ]
        .iter()
        .position(|p| scenario.starts_with(p))
        .unwrap_or(99)
    };
    let shape_order = |shape: &Shape| {
        Shape::ALL
            .iter()
            .position(|s| s == shape)
            .unwrap_or(Shape::ALL.len())
    };
    bench.rows.sort_by(|a, b| {
        (order(&a.scenario), &a.scenario, shape_order(&a.shape)).cmp(&(
            order(&b.scenario),
            &b.scenario,
            shape_order(&b.shape),
        ))
    });

    println!();
    println!(
        "redlimit throughput bench ({}), {cores} cores, Redis {version} at {}, load average {} \
         at start, {} at end, {:.0} s",
        if bench.settings.quick {
            "--quick"
        } else {
            "full"
        },
        if bench.admin._server.is_some() {
            "a private redis-server on loopback"
        } else {
            "REDIS_URL"
        },
        load_at_start,
        load_average(),
        started.elapsed().as_secs_f64(),
    );
    println!(
        "each run: {:?} warm-up, then {:?}; rows marked (median of N) are the interleaved rounds",
        bench.settings.warm_up, bench.settings.run
    );
    println!();
    print_table(&bench.rows);
    println!();
    println!("redis-benchmark -P 16 -c 64 of the reference script:");
    println!("{redis_benchmark}");
    println!();
    if !bench.admin.stats {
        println!("(CONFIG RESETSTAT refused by this Redis: no usec_per_call figures)");
    }
    let check_raw = Ratio::of(check_raw);
    let layer_check = Ratio::of(layer_check);
    println!(
        "check/raw per round: median {:.2}, range {:.2}-{:.2}",
        check_raw.median, check_raw.min, check_raw.max
    );
    println!(
        "layer/check per round: median {:.2}, range {:.2}-{:.2}",
        layer_check.median, layer_check.min, layer_check.max
    );
    println!(
        "layer over check per decision, median of rounds: bench CPU {:+.2} µs, Redis CPU {:+.2} \
         µs (check: {:.2} + {:.2} µs)",
        median(layer_own_cpu),
        median(layer_redis_cpu),
        median(check_cpu.0),
        median(check_cpu.1),
    );
    let (_, reference) = cost.pop().expect("the reference is last");
    let cost: Vec<(Algorithm, f64)> = cost
        .into_iter()
        .map(|(algorithm, costs)| {
            let algorithm = algorithm.expect("an algorithm");
            let per_round = |of: fn(&Costs) -> &Vec<f64>| {
                let pairs = of(&costs).iter().zip(of(&reference));
                Ratio::of(pairs.map(|(a, r)| a / r).collect())
            };
            let (usec, cpu) = (per_round(|c| &c.usec), per_round(|c| &c.cpu));
            let least = Costs::least(&costs.usec) / Costs::least(&reference.usec);
            println!(
                "redis cost/reference {algorithm}: usec_per_call least-disturbed runs {least:.2}, \
                 per round median {:.2} (range {:.2}-{:.2}); Redis CPU per decision per round \
                 median {:.2} (range {:.2}-{:.2})",
                usec.median, usec.min, usec.max, cpu.median, cpu.min, cpu.max
            );
            (algorithm, least)
        })
        .collect();
    println!(
        "reference script: usec_per_call least-disturbed {:.2} µs, Redis CPU per decision median \
         {:.2} µs",
        Costs::least(&reference.usec),
        median(reference.cpu.clone())
    );
    for (algorithm, ratio, calls) in &speedups {
        println!(
            "deny-cache {algorithm}: speedup median {:.2}, range {:.2}-{:.2}; EVALSHA calls per \
             decision with/without {calls:.3}",
            ratio.median, ratio.min, ratio.max
        );
    }
    // The fleet features against the same reference; `plain` is the token bucket's own figure
    // above (a limiter that uses none of them runs exactly that call).
    let plain = cost
        .iter()
        .find(|(algorithm, _)| *algorithm == Algorithm::TokenBucket)
        .map_or(f64::NAN, |(_, ratio)| *ratio);
    let mut fleet_line = vec![format!("plain {plain:.2}")];
    for (fleet, costs) in &fleet_cost {
        let per_round = |of: fn(&Costs) -> &Vec<f64>| {
            let pairs = of(costs).iter().zip(of(&reference));
            Ratio::of(pairs.map(|(a, r)| a / r).collect())
        };
        let (usec, cpu) = (per_round(|c| &c.usec), per_round(|c| &c.cpu));
        let least = Costs::least(&costs.usec) / Costs::least(&reference.usec);
        println!(
            "fleet cost/reference {}: usec_per_call least-disturbed runs {least:.2}, per round \
             median {:.2} (range {:.2}-{:.2}); Redis CPU per decision per round median {:.2} \
             (range {:.2}-{:.2})",
            fleet.name(),
            usec.median,
            usec.min,
            usec.max,
            cpu.median,
            cpu.min,
            cpu.max
        );
        fleet_line.push(format!("{} {least:.2}", fleet.name()));
    }
    println!(
        "fleet cost (usec_per_call / reference): {}",
        fleet_line.join(", ")
    );
    tls_overhead(&bench.settings).await;
    bench.connections().await;
    println!();
    println!("check/raw ratio: {:.2}", check_raw.median);
    println!("layer/check ratio: {:.2}", layer_check.median);
    // The order the acceptance checks read, whatever the order of `Algorithm::ALL`.
    let costs: Vec<String> = COST_LINE_ORDER
        .iter()
        .map(|name| {
            let ratio = cost
                .iter()
                .find(|(algorithm, _)| algorithm.name() == *name)
                .map_or(f64::NAN, |(_, ratio)| *ratio);
            format!("{name} {ratio:.2}")
        })
        .collect();
    println!("redis cost/reference: {}", costs.join(", "));
    match speedups
        .iter()
        .map(|(_, ratio, _)| ratio.median)
        .min_by(f64::total_cmp)
    {
        Some(speedup) => println!("deny-cache speedup: {speedup:.2}"),
        None => println!("deny-cache speedup: n/a (this build has no deny cache)"),
    }
}

/// The TLS overhead: token-bucket `Limiter::check` on one hot key through a `redis-server` that
/// listens both in plain text and with TLS, each side in turn over a few rounds, at concurrency
/// 1 and 64. Prints decisions/s of both and the median of the per-round ratios.
async fn tls_overhead(settings: &Settings) {
    let files = tls::TlsFiles::generate("redlimit-bench");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (plain_port, tls_port) = (free_port(), free_port());
    let mut server = std::process::Command::new("redis-server")
        .args(["--port", &plain_port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--tls-port",
            &tls_port.to_string(),
            "--tls-auth-clients",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(files.server_cert())
        .arg("--tls-key-file")
        .arg(files.server_key())
        .arg("--tls-ca-cert-file")
        .arg(files.ca())
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server with TLS");
    let ca = tls::TlsFiles::read(&files.ca());
    let plain = RedisStore::builder(format!("redis://127.0.0.1:{plain_port}/"))
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a plain store");
    let secure = RedisStore::builder(format!("rediss://127.0.0.1:{tls_port}/"))
        .tls_ca_pem(ca)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a TLS store");
    let deadline = Instant::now() + Duration::from_secs(10);
    while plain.verify().await.is_err() || secure.verify().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the TLS redis-server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quota = admitting(Algorithm::TokenBucket);
    let limiters = [Limiter::new(plain), Limiter::new(secure)];
    let window = settings.run;
    let rounds = settings.rounds.clamp(1, 5);
    for concurrency in [1usize, 64] {
        let mut rates = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            for side in [round % 2, 1 - round % 2] {
                let limiter = &limiters[side];
                let stop = Instant::now() + window;
                let tasks = (0..concurrency).map(|_| {
                    let (limiter, quota) = (limiter.clone(), quota);
                    tokio::spawn(async move {
                        let mut done = 0u64;
                        while Instant::now() < stop {
                            let decision =
                                limiter.try_check_quotas("tls-hot", &quota.into(), 1).await;
                            assert!(decision.expect("a decision").allowed, "admitted");
                            done += 1;
                        }
                        done
                    })
                });
                let started = Instant::now();
                let mut done = 0;
                for task in tasks.collect::<Vec<_>>() {
                    done += task.await.expect("a task");
                }
                rates[side].push(done as f64 / started.elapsed().as_secs_f64());
            }
        }
        let ratios: Vec<f64> = rates[1].iter().zip(&rates[0]).map(|(t, p)| t / p).collect();
        println!(
            "tls/plain token-bucket check c{concurrency} hot key: plain {:.0}/s, tls {:.0}/s, \
             ratio median {:.2} over {rounds} rounds",
            median(rates[0].clone()),
            median(rates[1].clone()),
            median(ratios)
        );
    }
    let _ = server.kill();
    let _ = server.wait();
}
