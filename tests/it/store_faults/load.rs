//! A small concurrent load generator for the fault tests.
//!
//! `workers` tasks call a tower service in a loop for a bounded time and record every request:
//! when it started (relative to the start of the load), how long it took, and what it got. A
//! [`Run`] then summarises any time slice: the status mix and the worst latency.
//!
//! ```ignore
//! mod load;
//! let load = load::Load::start(service, 16, Duration::from_secs(5));
//! tokio::time::sleep(Duration::from_millis(500)).await;
//! let fault_at = load.elapsed();
//! // ... cause a fault ...
//! let run = load.finish().await;
//! println!("after the fault: {}", run.slice(fault_at, run.end()));
//! ```
#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use tokio::task::JoinHandle;
use tower::{Service, ServiceExt};

/// Status recorded for a request that got no answer within [`REQUEST_BOUND`].
pub const HUNG: u16 = 0;

/// A request not answered within this is abandoned and recorded as [`HUNG`], so a hung
/// service fails the test instead of hanging it.
pub const REQUEST_BOUND: Duration = Duration::from_secs(5);

/// The pause of each worker between two requests (keeps a 2-core machine responsive; tokio
/// rounds it up to its 1 ms timer tick).
pub const PACE: Duration = Duration::from_millis(1);

/// One request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// When it was sent, since the load started.
    pub start: Duration,
    /// How long the answer took.
    pub latency: Duration,
    /// The HTTP status, or [`HUNG`].
    pub status: u16,
    /// Whether the response carries the `RateLimit` header: the store decided it (a request
    /// let through by the failure policy has none).
    pub limited: bool,
}

impl Sample {
    /// When the answer came, since the load started.
    pub fn end(&self) -> Duration {
        self.start + self.latency
    }

    /// Decided by the store: a 429, or a 200 with `RateLimit` headers (with `FailOpen` or
    /// `FailClosed`; a `LocalFallback` also answers 429 by itself).
    pub fn store_decided(&self) -> bool {
        self.status == 429 || (self.status == 200 && self.limited)
    }
}

/// A running load.
pub struct Load {
    t0: Instant,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Vec<Sample>>>,
}

impl Load {
    /// Starts `workers` workers sending `GET /` to `service` until [`finish`](Self::finish) or
    /// until `max` has passed, whichever comes first.
    pub fn start<S, B>(service: S, workers: usize, max: Duration) -> Load
    where
        S: Service<Request<()>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: Send + 'static,
    {
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|_| {
                let service = service.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut samples = Vec::with_capacity(8192);
                    while !stop.load(Ordering::Relaxed) && t0.elapsed() < max {
                        let started = Instant::now();
                        let answer = tokio::time::timeout(
                            REQUEST_BOUND,
                            service.clone().oneshot(Request::new(())),
                        )
                        .await;
                        let latency = started.elapsed();
                        let (status, limited) = match answer {
                            Ok(Ok(response)) => (
                                response.status().as_u16(),
                                response.headers().contains_key("ratelimit"),
                            ),
                            Ok(Err(never)) => match never {},
                            Err(_) => (HUNG, false),
                        };
                        samples.push(Sample {
                            start: started - t0,
                            latency,
                            status,
                            limited,
                        });
                        tokio::time::sleep(PACE).await;
                    }
                    samples
                })
            })
            .collect();
        Load { t0, stop, workers }
    }

    /// Time since the load started (the clock of [`Sample::start`]).
    pub fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    /// Stops the workers (each finishes its current request) and returns every sample, in the
    /// order they started.
    pub async fn finish(self) -> Run {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = Vec::new();
        for worker in self.workers {
            samples.extend(worker.await.expect("load worker panicked"));
        }
        samples.sort_by_key(|s| s.start);
        Run { samples }
    }
}

/// Every request of a finished load.
pub struct Run {
    pub samples: Vec<Sample>,
}

impl Run {
    /// The start of the last request.
    pub fn end(&self) -> Duration {
        self.samples.last().map_or(Duration::ZERO, |s| s.start)
    }

    /// The requests that started in `from..to`.
    pub fn between(&self, from: Duration, to: Duration) -> impl Iterator<Item = &Sample> + '_ {
        self.samples
            .iter()
            .filter(move |s| s.start >= from && s.start < to)
    }

    /// The status mix and worst latency of the requests that started in `from..to`.
    pub fn slice(&self, from: Duration, to: Duration) -> Summary {
        Summary::of(self.between(from, to))
    }

    /// The whole run.
    pub fn all(&self) -> Summary {
        Summary::of(self.samples.iter())
    }

    /// The first request after `after` that *ended* with `status` (when the app answered it).
    pub fn first_answer(&self, after: Duration, status: u16) -> Option<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.start >= after && s.status == status)
            .min_by_key(|s| s.end())
    }

    /// The first moment after `after` from which the next `streak` requests (by start) were all
    /// decided by the store: when the app was steadily enforcing again.
    pub fn steady_from(&self, after: Duration, streak: usize) -> Option<Duration> {
        let tail: Vec<&Sample> = self.samples.iter().filter(|s| s.start >= after).collect();
        let mut run = 0;
        for (i, sample) in tail.iter().enumerate() {
            if sample.store_decided() {
                run += 1;
                if run == streak {
                    return Some(tail[i + 1 - streak].start);
                }
            } else {
                run = 0;
            }
        }
        None
    }
}

/// What the requests of a time slice saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct Summary {
    pub total: usize,
    /// 200 with `RateLimit` headers: admitted by the store.
    pub ok_checked: usize,
    /// 200 without `RateLimit` headers: admitted by the failure policy.
    pub ok_unchecked: usize,
    pub too_many: usize,
    pub unavailable: usize,
    pub hung: usize,
    pub other: usize,
    pub worst: Duration,
    pub p99: Duration,
}

impl Summary {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Summary {
        let mut summary = Summary::default();
        let mut latencies = Vec::new();
        for sample in samples {
            summary.total += 1;
            match (sample.status, sample.limited) {
                (200, true) => summary.ok_checked += 1,
                (200, false) => summary.ok_unchecked += 1,
                (429, _) => summary.too_many += 1,
                (503, _) => summary.unavailable += 1,
                (HUNG, _) => summary.hung += 1,
                _ => summary.other += 1,
            }
            latencies.push(sample.latency);
        }
        latencies.sort();
        summary.worst = latencies.last().copied().unwrap_or_default();
        if !latencies.is_empty() {
            summary.p99 = latencies[(latencies.len() - 1) * 99 / 100];
        }
        summary
    }

    /// All 200s, checked or not.
    pub fn ok(&self) -> usize {
        self.ok_checked + self.ok_unchecked
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>6} requests: 200={} (unchecked {}) 429={} 503={}",
            self.total,
            self.ok(),
            self.ok_unchecked,
            self.too_many,
            self.unavailable
        )?;
        if self.hung > 0 {
            write!(f, " HUNG={}", self.hung)?;
        }
        if self.other > 0 {
            write!(f, " other={}", self.other)?;
        }
        write!(f, "; p99 {}, worst {}", ms(self.p99), ms(self.worst))
    }
}

/// `12.3 ms`
pub fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
