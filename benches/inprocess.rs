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
//!
//! ```text
//! cargo bench --bench inprocess -- files   # needs valgrind and redis-server
//! ```
//!
//! The `files` mode counts the crate's own source files one plain request runs code in, on
//! Redis: the side `redlimit on redis` (`RateLimitLayer` on a `RedisStore` on a private
//! `redis-server`, token bucket, no leases, no deny cache, `max_batch(1)`) runs 50 requests of
//! warm-up, then 200 counted ones, all on one current-thread runtime, under callgrind, which
//! counts everything that runs inside `files::measured` (the tasks of the store and of
//! redis-rs's connection included: the runtime polls them there). The dump is read per source
//! file (`support/callgrind.rs`: self cost, inlined code in the file it came from, code on no
//! source line in none); it prints each file under `src/` with its instructions per request,
//! sorted by path, then `one plain request on Redis runs code in N product files`. It needs
//! this package's line tables, which `Cargo.toml` gives the bench profile.
//! `INPROCESS_FILES_DUMP=<file>` keeps callgrind's dump there, for `callgrind_annotate`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response};
use redlimit::key::HeaderKey;
use redlimit::limiter::Leases;
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Algorithm, Limiter, Quota, RateLimitLayer};
use tower::{Layer, Service, ServiceExt};

#[path = "support/callgrind.rs"]
mod callgrind;
#[path = "support/mod.rs"]
mod support;

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

/// This bench's own executable under callgrind, its instructions counted only within the
/// function `toggle` and dumped to `out`; the caller adds the executable's arguments.
fn under_callgrind(toggle: &str, out: &std::path::Path) -> std::io::Result<Command> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new("valgrind");
    command
        .arg("--tool=callgrind")
        .arg("--collect-atstart=no")
        .arg(format!("--toggle-collect={toggle}"))
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(exe);
    Ok(command)
}

/// Instructions of one run of `side` with `n` requests under callgrind, or `None` without
/// valgrind.
fn instructions(side: &str, n: u64) -> Option<u64> {
    let dir = tempfile::tempdir().ok()?;
    let out = dir.path().join("callgrind.out");
    let status = under_callgrind(COUNTED, &out)
        .ok()?
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
    if let Some(url) = value("--files-side") {
        let n = value("--requests")
            .and_then(|n| n.parse().ok())
            .unwrap_or(files::FILES_REQUESTS);
        if let Err(e) = files::side(url, n) {
            eprintln!("inprocess files side failed: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.iter().skip(1).any(|a| a == "files") {
        if let Err(e) = files::run() {
            eprintln!("inprocess files failed: {e}");
            std::process::exit(1);
        }
        return;
    }
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

/// The `files` mode: the product source files one plain request on Redis runs code in.
mod files {
    use super::*;

    /// Requests of the `files` mode before the count: connection, script and caches settled.
    const WARM_UP: u64 = 50;
    /// Requests the `files` mode counts.
    pub(super) const FILES_REQUESTS: u64 = 200;
    /// The function callgrind counts in for the `files` mode (see [`measured`]).
    const MEASURED: &str = "inprocess::files::measured";

    /// Runs `requests` on `runtime`: callgrind counts everything on this thread while it runs,
    /// the tasks the runtime polls meanwhile (the store's own, redis-rs's connection driver)
    /// included, since a current-thread runtime polls them inside `block_on`.
    #[inline(never)]
    fn measured(
        runtime: &tokio::runtime::Runtime,
        requests: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + '_>>,
    ) {
        runtime.block_on(requests);
    }

    /// `n` requests through the `files` mode's service; an error, not a panic, unless each is
    /// answered 200 with its `RateLimit` headers.
    async fn files_requests<S, B>(service: &mut S, n: u64) -> Result<(), String>
    where
        S: Service<Request<Body>, Response = Response<B>>,
        S::Error: std::fmt::Debug,
    {
        for _ in 0..n {
            let ready = service.ready().await.map_err(|e| format!("{e:?}"))?;
            let response = ready.call(request()).await.map_err(|e| format!("{e:?}"))?;
            if !response.status().is_success() || !response.headers().contains_key("ratelimit") {
                return Err(format!(
                    "a response {} without the RateLimit headers: not the store's decision",
                    response.status()
                ));
            }
        }
        Ok(())
    }

    /// The `files` mode's side, `redlimit on redis`, in the process callgrind runs: [`WARM_UP`]
    /// requests, then `n` inside [`measured`]; fails unless every one was admitted by the store.
    pub(super) fn side(url: &str, n: u64) -> Result<(), String> {
        let runtime = runtime();
        let (limiter, mut service) = runtime.block_on(async {
            // Under valgrind the first connection takes longer than the default 100 ms.
            let store = RedisStore::builder(url)
                .timeout(Duration::from_secs(10))
                .max_batch(1)
                .build()
                .map_err(|e| e.to_string())?;
            let limiter = Limiter::builder(store)
                .algorithm(Algorithm::TokenBucket)
                .build()
                .map_err(|e| e.to_string())?;
            let quota = support::admitting(Algorithm::TokenBucket);
            let layer = RateLimitLayer::builder(limiter.clone(), quota, HeaderKey::new(API_KEY))
                .build()
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((limiter, layer.layer(tower::service_fn(inner))))
        })?;
        runtime.block_on(files_requests(&mut service, WARM_UP))?;
        let mut outcome = Ok(());
        measured(
            &runtime,
            Box::pin(async { outcome = files_requests(&mut service, n).await }),
        );
        outcome?;
        let stats = limiter.stats();
        if stats.allowed != WARM_UP + n || stats.store_errors != 0 || stats.failed_open != 0 {
            return Err(format!(
                "expected {} requests admitted by Redis, the limiter counted {stats:?}",
                WARM_UP + n
            ));
        }
        Ok(())
    }

    /// The `files` mode: runs [`side`] under callgrind and prints the product files it ran
    /// code in, with their instructions per request.
    pub(super) fn run() -> Result<(), String> {
        let server = support::PrivateRedis::start()?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = dir.path().join("callgrind.out");
        let run = under_callgrind(MEASURED, &out)
            .map_err(|e| e.to_string())?
            .args(["--files-side", &server.url()])
            .args(["--requests", &FILES_REQUESTS.to_string()])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run valgrind: {e}"))?;
        if !run.status.success() {
            return Err(format!(
                "the side under callgrind failed ({}): {}",
                run.status,
                String::from_utf8_lossy(&run.stderr).trim()
            ));
        }
        if let Some(kept) = std::env::var_os("INPROCESS_FILES_DUMP") {
            std::fs::copy(&out, &kept)
                .map_err(|e| format!("cannot keep the dump at {}: {e}", kept.to_string_lossy()))?;
        }
        let text = std::fs::read_to_string(&out).map_err(|e| format!("{}: {e}", out.display()))?;
        let cost = callgrind::self_cost(&text)?;
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/");
        let product: Vec<(&str, u64)> = cost
            .by_file
            .iter()
            .filter_map(|(file, &ir)| {
                let file = file.strip_prefix(root)?;
                file.starts_with("src/").then_some((file, ir))
            })
            .collect();
        if product.is_empty() {
            return Err(format!(
                "the dump names no file under {root}src/ ({} files, {} of {} instructions on a \
                 source line): the executable has no line tables of this crate (Cargo.toml's \
                 [profile.bench.package.redlimit] gives them; else build with \
                 CARGO_PROFILE_BENCH_DEBUG=line-tables-only)",
                cost.by_file.len(),
                cost.total - cost.no_line,
                cost.total
            ));
        }
        if !product
            .iter()
            .any(|(file, _)| file.starts_with("src/store/redis/"))
        {
            return Err(
                "no file under src/store/redis/ ran in the counted span: the store's \
                        work was not counted"
                    .to_owned(),
            );
        }
        let per = |ir: u64| ir as f64 / FILES_REQUESTS as f64;
        println!(
            "files: redlimit on redis (RateLimitLayer, HeaderKey x-api-key, token bucket, \
             RedisStore max_batch 1, no leases, no deny cache), {WARM_UP} requests of warm-up, \
             then {FILES_REQUESTS} counted; instructions per request, self cost by source file"
        );
        println!("{:<40} {:>24}", "file", "instructions/request");
        for (file, ir) in &product {
            println!("{file:<40} {:>24.0}", per(*ir));
        }
        let in_product: u64 = product.iter().map(|(_, ir)| ir).sum();
        println!(
            "in product files {:.0} of {:.0} instructions per request ({:.0} on no source line: \
             line 0)",
            per(in_product),
            per(cost.total),
            per(cost.no_line)
        );
        println!(
            "one plain request on Redis runs code in {} product files",
            product.len()
        );
        Ok(())
    }
}
