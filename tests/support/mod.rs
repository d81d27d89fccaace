//! Real-Redis test harness shared by the integration tests.
//!
//! Every test gets its own private `redis-server` process (or a private
//! three-master cluster) on a port of its own, in a temporary directory that
//! is removed afterwards. The machine-wide Redis on 127.0.0.1:6379 is never
//! used.
//!
//! ```ignore
//! mod support;
//! let redis = support::RedisServer::start();
//! let mut conn = redis.conn();
//! ```
//!
//! `redis-server` must be on `PATH`; without it every test that starts a
//! server panics with an explanation instead of being skipped.
#![allow(dead_code, unused_imports)]

mod cluster;
pub mod example;
mod limiters;
pub mod logs;
pub mod sentinel;
mod server;
pub mod service;
pub mod stores;
mod tls;

pub use cluster::{key_slot, RedisCluster};
pub use limiters::{
    admits, admits_quotas, answers_within_10s, breaker_opening_after, cluster_limiter, decision,
    denied_by_a_block, memory_limiter, quota_with_burst, redis_error_on_verify, redis_limiter,
    redis_store, store_limited_to, suspended_for, Ctx, Denials, Fixture, PATIENT_TIMEOUT,
};
pub use server::{debug_sleep_via, RedisServer};
pub use tls::{TlsFiles, TlsSetup};

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a test prints when there is no `redis-server` to run.
pub const REDIS_MISSING: &str = "redis-server not found on PATH: the integration tests need a real \
     Redis. Install it (`apt-get install redis-server`) or run `./scripts/test.sh`, which installs it.";

/// First port handed out.
const PORT_BASE: u16 = 20000;
/// How many ports are handed out: 20000..22768. The cluster bus port is the
/// port + 10000, i.e. 30000..32768, so both stay inside 20000..45000, below
/// Linux's default ephemeral range (32768..), and a server port can never be
/// another server's bus port.
const PORT_COUNT: u16 = 2768;
/// Redis Cluster listens for its bus on the client port plus this.
pub const BUS_PORT_OFFSET: u16 = 10000;

/// Where this process starts in the port range (random, so that test
/// binaries running at the same time mostly pick different ports).
static PORT_START: OnceLock<u16> = OnceLock::new();
/// How many ports this process has handed out so far.
static PORTS_HANDED_OUT: AtomicU16 = AtomicU16::new(0);

/// Returns a port in 20000..22768 whose cluster bus port (+10000) is free
/// too. Ports come from a process-wide counter, so two tests in one binary
/// never get the same one; other processes are ruled out by binding both
/// ports for a moment. A caller that then fails to start Redis on it should
/// simply ask again.
pub fn free_port() -> u16 {
    for _ in 0..PORT_COUNT {
        let port = next_candidate_port();
        if is_bindable(port) && is_bindable(port + BUS_PORT_OFFSET) {
            return port;
        }
    }
    panic!(
        "no free port pair (P, P+{BUS_PORT_OFFSET}) in {PORT_BASE}..{}",
        PORT_BASE + PORT_COUNT
    );
}

/// The next port from the process-wide rotation, free or not.
fn next_candidate_port() -> u16 {
    let start = *PORT_START.get_or_init(|| (random_u64() % u64::from(PORT_COUNT)) as u16);
    let n = PORTS_HANDED_OUT.fetch_add(1, Ordering::Relaxed);
    let offset = (u32::from(start) + u32::from(n)) % u32::from(PORT_COUNT);
    PORT_BASE + offset as u16
}

/// Whether a listener could be bound on 127.0.0.1:`port` right now.
fn is_bindable(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A random number from the standard library's per-process hasher keys,
/// the process id and the clock (no extra crates needed).
fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    hasher.write_u128(nanos);
    hasher.finish()
}

/// The environment variable naming the server binary the fixture runs (`valkey-server`, or a
/// path to one); `redis-server` when unset. CI runs the script suites once more on Valkey.
pub const SERVER_VAR: &str = "REDLIMIT_SERVER";

/// The server binary every fixture starts: `$REDLIMIT_SERVER`, else `redis-server`.
pub fn server_binary() -> String {
    std::env::var(SERVER_VAR)
        .ok()
        .filter(|binary| !binary.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Whether the server binary was built with TLS. Asked once: the binary is started with a TLS
/// port and a certificate that does not exist, so it exits at once either way, and a build
/// without TLS says "Failed finding TLS support" (Valkey's PyPI build, for one).
pub fn server_has_tls() -> bool {
    static HAS_TLS: OnceLock<bool> = OnceLock::new();
    *HAS_TLS.get_or_init(|| {
        let port = free_port().to_string();
        let output = Command::new(server_binary())
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--tls-port",
                &port,
            ])
            .args(["--tls-cert-file", "/nonexistent/redlimit-probe.crt"])
            .args(["--tls-key-file", "/nonexistent/redlimit-probe.key"])
            .output()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", server_binary()));
        let text =
            String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
        !text.contains("Failed finding TLS support")
    })
}

/// `true` (after printing why) when the server binary has no TLS and a TLS test cannot run:
/// the only case in which a test skips, and it says so.
pub fn skip_without_tls(test: &str) -> bool {
    if server_has_tls() {
        return false;
    }
    eprintln!("skipped {test}: {} was built without TLS", server_binary());
    true
}

/// A current-thread runtime with time and I/O, for a test body that is not async itself (a
/// proptest closure, a process-driving test) and blocks on the library's futures.
pub fn current_thread_runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    runtime.expect("a current-thread runtime")
}

/// A multi-thread runtime of 2 workers (as an application's), for a test that drives its own.
pub fn multi_thread_runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    runtime.expect("a multi-thread runtime")
}

/// A Redis on TLS with a certificate of `name` (asking clients for theirs when `mutual`), or
/// `None` when this machine's redis-server has no TLS (`test` names the skipped test).
pub fn tls_server(test: &str, name: &str, mutual: bool) -> Option<(TlsFiles, RedisServer)> {
    if skip_without_tls(test) {
        return None;
    }
    let files = TlsFiles::generate(name);
    let redis = RedisServer::start_tls(&TlsSetup::new(&files, mutual));
    Some((files, redis))
}

/// A TLS server of its own (its files kept) and the files of another CA, which did not sign its
/// certificate; `None` when the installed server has no TLS (the test `test` skips).
pub fn server_and_another_ca(test: &str) -> Option<(TlsFiles, RedisServer, TlsFiles)> {
    let (files, redis) = tls_server(test, "server", false)?;
    Some((files, redis, TlsFiles::generate("other")))
}

/// The installed server's version, e.g. `"7.0.15"`.
pub fn redis_server_version() -> String {
    let output = Command::new(server_binary())
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                panic!("{REDIS_MISSING}");
            }
            panic!("could not run `redis-server --version`: {e}");
        });
    let text = String::from_utf8_lossy(&output.stdout);
    // "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=..."
    text.split_whitespace()
        .find_map(|word| word.strip_prefix("v="))
        .unwrap_or_else(|| panic!("unexpected `redis-server --version` output: {text}"))
        .to_string()
}

/// The value of `field` in an `INFO` reply (`field:value` lines).
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim_end().strip_prefix(field)?.strip_prefix(':'))
}

/// Poisons `key` of `limiter` on `redis` with corrupt stored bytes that make the script refuse
/// every decision on it with an error reply (not self-healed): an override is stored, then its
/// first tier's limit is overwritten with 0 in Redis. The controls' layout: 'M', the
/// suspended-until (8 bytes), the tier count, then per tier limit, period_us and burst as
/// little-endian doubles, so the first limit starts at byte 11 (offset 10); the sliding log
/// keeps its controls beside its sorted set (the first of `control_keys`).
pub async fn poison_key(redis: &RedisServer, limiter: &redlimit::Limiter, key: &str) {
    let quotas = redlimit::Quotas::from(redlimit::Quota::per_hour(3).unwrap());
    limiter
        .set_quota(key, &quotas)
        .await
        .expect("set_quota before the poisoning");
    let storage_key = match limiter.algorithm() {
        redlimit::Algorithm::SlidingLog => {
            let [log_controls, _] = redlimit::test_hooks::control_keys(&limiter.storage_key(key));
            log_controls
        }
        _ => limiter.storage_key(key),
    };
    let _: () = redis::cmd("SETRANGE")
        .arg(&storage_key)
        .arg(10)
        .arg(&0f64.to_le_bytes()[..])
        .query(&mut redis.conn())
        .expect("SETRANGE");
}

/// The decision script's one argument, as the crate packs it: doubles `now_us` (-1: Redis's
/// clock) and `cost`, the algorithm's byte, then per tier doubles limit, period_us, burst
/// (little-endian).
pub fn script_args(now_us: f64, cost: f64, algorithm: u8, tiers: &[(f64, f64, f64)]) -> Vec<u8> {
    let mut args = [now_us, cost].map(f64::to_le_bytes).concat();
    args.push(algorithm);
    for &(limit, period_us, burst) in tiers {
        args.extend([limit, period_us, burst].map(f64::to_le_bytes).concat());
    }
    args
}

/// `EVAL source` on the one key `key` with the one argument `arg`: the script's reply.
pub fn eval_on_key<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    source: &str,
    key: &str,
    arg: impl redis::ToRedisArgs,
) -> T {
    let reply = redis::cmd("EVAL")
        .arg(source)
        .arg(1)
        .arg(key)
        .arg(arg)
        .query(conn);
    reply.expect("the script's reply")
}

/// A tiny deterministic generator (xorshift), so a failing run can be replayed by its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
