//! Settings and shapes: how long and how often things run, and on which keys.

use super::*;

/// How long and how often things run.
pub(crate) struct Settings {
    pub(crate) quick: bool,
    pub(crate) warm_up: Duration,
    pub(crate) run: Duration,
    /// Most operations one run makes (the time bound usually ends it first).
    pub(crate) max_ops: u64,
    /// Interleaved rounds of the compared runs (concurrency 64, hot key).
    pub(crate) rounds: usize,
    /// Interleaved rounds of the deny-cache runs (with and without), per algorithm.
    pub(crate) deny_rounds: usize,
    /// Interleaved rounds of the connections runs (1, 2 and 4 connections), per shape.
    pub(crate) connection_rounds: usize,
    /// Interleaved rounds of `http (no layer)` and `http + layer`, per shape of the
    /// `http cost` line.
    pub(crate) http_rounds: usize,
    /// `-n` of `redis-benchmark`.
    pub(crate) redis_benchmark_requests: u64,
}

impl Settings {
    pub(crate) fn from_args() -> Settings {
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
                http_rounds: 9,
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
                http_rounds: 15,
                redis_benchmark_requests: 1_000_000,
            }
        }
    }
}

/// The time one Redis call may take: the stores' timeout, and the bound of a reply on the
/// bench's own connections, so that both sides of a comparison wait alike.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);
/// Distinct keys of the spread runs.
pub(crate) const KEYS: usize = 10_000;
/// Keys the deny cache may hold in the deny-cache runs.
pub(crate) const DENY_CACHE_KEYS: usize = 10_000;
/// Concurrency of the compared runs and of the ratios.
pub(crate) const RATIO_CONCURRENCY: usize = 64;
/// The connections of the connections runs ([`RoundRobin`] over that many stores).
pub(crate) const CONNECTIONS: [usize; 3] = [1, 2, 4];
/// The algorithms of the `redis cost/reference` line, in its order: `Algorithm::ALL`'s, with
/// the sliding log just after the sliding window (the order the acceptance checks read), so a
/// new algorithm joins the line in its place in `ALL`.
pub(crate) fn cost_line_order() -> Vec<Algorithm> {
    let mut order: Vec<Algorithm> = Algorithm::ALL
        .iter()
        .copied()
        .filter(|&a| a != Algorithm::SlidingLog)
        .collect();
    let after_window = order
        .iter()
        .position(|&a| a == Algorithm::SlidingWindow)
        .map_or(order.len(), |i| i + 1);
    order.insert(after_window, Algorithm::SlidingLog);
    order
}
/// The key prefix in Redis.
pub(crate) const PREFIX: &str = "redlimit-bench";

/// Tasks in flight and the keys they use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Shape {
    pub(crate) concurrency: usize,
    pub(crate) keys: Keys,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Keys {
    /// Every operation on key 0.
    Hot,
    /// Operations rotate over [`KEYS`] keys.
    Spread,
    /// 90 % on key 0 (over its quota), 10 % spread over the other keys (under theirs).
    HotDenied,
}

impl Shape {
    pub(crate) const ALL: [Shape; 6] = [
        Shape::new(1, Keys::Hot),
        Shape::new(64, Keys::Hot),
        Shape::new(256, Keys::Hot),
        Shape::new(1, Keys::Spread),
        Shape::new(64, Keys::Spread),
        Shape::new(256, Keys::Spread),
    ];
    pub(crate) const RATIO: Shape = Shape::new(RATIO_CONCURRENCY, Keys::Hot);

    pub(crate) const fn new(concurrency: usize, keys: Keys) -> Shape {
        Shape { concurrency, keys }
    }

    /// The key index of operation `n` of task `task`.
    pub(crate) fn key(&self, task: usize, n: u64) -> usize {
        let i = n as usize * self.concurrency + task;
        match self.keys {
            Keys::Hot => 0,
            Keys::Spread => i % KEYS,
            Keys::HotDenied if !i.is_multiple_of(10) => 0,
            Keys::HotDenied => 1 + (i / 10) % (KEYS - 1),
        }
    }

    pub(crate) fn label(&self) -> String {
        let keys = match self.keys {
            Keys::Hot => "hot key".to_owned(),
            Keys::Spread => format!("{KEYS} keys"),
            Keys::HotDenied => "90% hot denied".to_owned(),
        };
        format!("c{:<3} {keys}", self.concurrency)
    }
}

/// The keys, prepared once so that operations do not allocate them.
pub(crate) struct KeySet {
    /// `client-<i>`, what `Limiter::check` gets.
    pub(crate) plain: Vec<String>,
    /// The reference script's Redis key for each.
    pub(crate) raw: Vec<String>,
    /// The `x-api-key` header value for each.
    pub(crate) header: Vec<HeaderValue>,
}

impl KeySet {
    pub(crate) fn new() -> Arc<KeySet> {
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

pub(crate) const API_KEY: HeaderName = HeaderName::from_static("x-api-key");
