//! The in-process path: what one request costs in this process, by instruction count
//! (callgrind, so the numbers carry no noise) and allocations, with everything admitted:
//! single thread, a header key, a trivial inner service, and the `RateLimit` headers written.
//!
//! ```text
//! cargo bench --bench inprocess      # needs valgrind for the instruction counts
//! ```
//!
//! Sides: `bare` (the inner service alone), `redlimit` (`RateLimitLayer` on a `MemoryStore`),
//! `redlimit+lease` (the same limiter with leases on: answered from the lease), and
//! `tower_governor` (tower_governor 0.8's `GovernorLayer` with `use_headers()`, keyed by the
//! same header). Each side runs twice under `valgrind --tool=callgrind` (with `N1` and `N2`
//! requests); per request is the difference over `N2 - N1`, so set-up cancels out. Allocations
//! are counted the same way by the global allocator below, without valgrind.
//!
//! Prints a table, `in-process plain layer/tower_governor: X.XX` (the `redlimit` side's
//! instructions per request over tower_governor's) and `in-process layer/tower_governor: X.XX`
//! (the `redlimit+lease` side's).

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response};
use redlimit::key::HeaderKey;
use redlimit::limiter::Leases;
use redlimit::store::MemoryStore;
use redlimit::{Limiter, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const N1: u64 = 2_000;
const N2: u64 = 12_000;
const SIDES: [&str; 4] = ["bare", "redlimit", "redlimit+lease", "tower_governor"];
const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// The function callgrind counts in (see [`drive`]).
const COUNTED: &str = "<inprocess::Counted<F> as core::future::future::Future>::poll";

/// The trivial inner service.
async fn inner(_: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::empty()))
}

fn request() -> Request<Body> {
    let mut request = Request::new(Body::empty());
    request
        .headers_mut()
        .insert(API_KEY, HeaderValue::from_static("tenant-42"));
    request
}

/// Drives `service` with one request first, then `n` requests; panics on a response other than
/// 200 or without headers. Only the `n` are counted (callgrind's `--toggle-collect` names
/// [`requests`]): what the first request sets up lazily (tower_governor's clock calibrates
/// itself for a time, so for a number of instructions that differs from run to run) is set-up,
/// like the service's construction.
async fn drive<S, B>(mut service: S, n: u64, header: &str)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    requests(&mut service, 1, header).await;
    counted(requests(&mut service, n, header)).await;
}

/// The requests counted: callgrind collects only while this runs.
#[inline(never)]
fn counted<F: std::future::Future>(requests: F) -> Counted<F> {
    Counted(Box::pin(requests))
}

/// A future whose polls callgrind counts (see [`counted`]).
struct Counted<F>(std::pin::Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for Counted<F> {
    type Output = F::Output;

    #[inline(never)]
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.0.as_mut().poll(cx)
    }
}

/// `n` requests through `service`.
async fn requests<S, B>(service: &mut S, n: u64, header: &str)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    for _ in 0..n {
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .unwrap();
        assert!(response.status().is_success());
        assert!(header.is_empty() || response.headers().contains_key(header));
    }
}

/// tower_governor's key: the same header.
#[derive(Clone)]
struct HeaderExtractor;

impl tower_governor::key_extractor::KeyExtractor for HeaderExtractor {
    type Key = HeaderValue;

    fn extract<T>(&self, req: &Request<T>) -> Result<HeaderValue, tower_governor::GovernorError> {
        req.headers()
            .get(API_KEY)
            .cloned()
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
}

/// Runs `n` requests through one side, in this process.
async fn run_side(side: &str, n: u64) {
    let quota = Quota::per_second(1_000_000_000).unwrap();
    let service = tower::service_fn(inner);
    match side {
        "bare" => drive(service, n, "").await,
        "redlimit" | "redlimit+lease" => {
            let builder = Limiter::builder(MemoryStore::new());
            let builder = match side {
                "redlimit+lease" => builder.leases(Leases::new(Duration::from_millis(50))),
                _ => builder,
            };
            let limiter = builder.build().unwrap();
            let layer = RateLimitLayer::builder(limiter, quota, HeaderKey::new(API_KEY))
                .build()
                .unwrap();
            drive(layer.layer(service), n, "ratelimit").await;
        }
        "tower_governor" => {
            let config = tower_governor::governor::GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .key_extractor(HeaderExtractor)
                .use_headers()
                .finish()
                .unwrap();
            let layer = tower_governor::GovernorLayer::new(config);
            drive(layer.layer(service), n, "x-ratelimit-remaining").await;
        }
        other => panic!("unknown side {other}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Instructions of one run of `side` with `n` requests under callgrind, or `None` without
/// valgrind.
fn instructions(side: &str, n: u64) -> Option<u64> {
    let dir = tempfile::tempdir().ok()?;
    let out = dir.path().join("callgrind.out");
    let exe = std::env::current_exe().ok()?;
    let status = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect={COUNTED}"))
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe)
        .args(["--side", side, "--requests", &n.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    if !status.success() {
        return None;
    }
    let text = std::fs::read_to_string(out).ok()?;
    text.lines()
        .find_map(|line| {
            line.strip_prefix("summary:")
                .or(line.strip_prefix("totals:"))
        })
        .and_then(|v| v.trim().parse().ok())
}

fn allocations(side: &str, n: u64) -> u64 {
    let runtime = runtime();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    runtime.block_on(run_side(side, n));
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
    };
    if let Some(side) = value("--side") {
        let n = value("--requests")
            .and_then(|n| n.parse().ok())
            .unwrap_or(N1);
        runtime().block_on(run_side(side, n));
        return;
    }
    let per = |a: u64, b: u64| (b as f64 - a as f64) / (N2 - N1) as f64;
    println!(
        "in-process path: single thread, header key, everything admitted, headers written; \
         per request over {} requests",
        N2 - N1
    );
    println!(
        "{:<16} {:>24} {:>24}",
        "side", "instructions/request", "allocations/request"
    );
    let mut instr = std::collections::HashMap::new();
    for side in SIDES {
        let allocs = per(allocations(side, N1), allocations(side, N2));
        let ir = match (instructions(side, N1), instructions(side, N2)) {
            (Some(a), Some(b)) => Some(per(a, b)),
            _ => None,
        };
        if let Some(ir) = ir {
            instr.insert(side, ir);
        }
        let shown = ir.map_or("n/a (no valgrind)".to_owned(), |ir| format!("{ir:.0}"));
        println!("{side:<16} {shown:>24} {allocs:>24.1}");
    }
    match (instr.get("redlimit"), instr.get("tower_governor")) {
        (Some(ours), Some(theirs)) => {
            println!(
                "in-process plain layer/tower_governor: {:.2}",
                ours / theirs
            )
        }
        _ => println!("in-process plain layer/tower_governor: n/a (valgrind not found)"),
    }
    match (instr.get("redlimit+lease"), instr.get("tower_governor")) {
        (Some(ours), Some(theirs)) => {
            println!("in-process layer/tower_governor: {:.2}", ours / theirs)
        }
        _ => println!("in-process layer/tower_governor: n/a (valgrind not found)"),
    }
}
