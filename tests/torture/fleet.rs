//! The fleet driver: builds a schedule's instances on the fixture's Redis (or one shared
//! `MemoryStore`), runs its operations in order (bursts concurrently, held slots and layer
//! requests in the background) and records what every instance decided, for the oracles.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use redlimit::clock::{Clock, ManualClock};
use redlimit::key::FnKey;
use redlimit::limiter::AcquireError;
use redlimit::limiter::{ConcurrencyLimiter, LeaseStats, Leases, LimiterStats, SlotOutcome};
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::policy::FailClosed;
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Limiter, Quota, Quotas, RateLimitLayer, Verdict};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::faults::{self, Fault};
use crate::generator::{Backend, Config, Family, Op, Schedule, Upstream};
use crate::support::RedisServer;

/// The store timeout of every instance (docs/failure.md: "Every Redis call is bounded by a
/// timeout"); short, so that faults turn into policy answers quickly.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(250);
/// The longest one check, control or slot acquisition may take: a decision makes at most a
/// few store calls (a renewal, the rest of a lease, the request's own cost, a script reload),
/// each bounded by [`STORE_TIMEOUT`], plus a loaded machine's scheduling. Generous on purpose:
/// a request that waits on work nobody will finish waits for ever, not for 3 s.
pub const BOUND: Duration = Duration::from_secs(3);
/// A slot's lease in the concurrency schedules (renewed every third of it).
pub const SLOT_LEASE: Duration = Duration::from_millis(1_500);
/// The outbound layer's cap on a suspension an upstream asks for.
pub const MAX_AUTO_SUSPENSION: Duration = Duration::from_secs(1);
/// Past the cap on suspensions, how long a refusal may still last before it is a lockout: an
/// announced quota with a window of up to a minute is one an upstream may really have.
pub const LOCKOUT: Duration = Duration::from_secs(60);
/// The outbound layer's longest wait for the quota.
pub const MAX_WAIT: Duration = Duration::from_secs(2);
/// Where the manual clock starts: a multiple of every period the generator draws.
const CLOCK_START: Duration = Duration::from_secs(1_800_000_000);

/// The manual clock's start, in µs.
pub fn clock_start_us() -> u64 {
    CLOCK_START.as_micros() as u64
}

/// Moves `manual` with real time (plus the schedule's jumps), until the handle is dropped:
/// Redis expires a key in real time after a TTL computed on the client clock, so a client
/// clock slower than real time would see a window's count vanish before the window ends.
pub struct Follow(tokio::task::JoinHandle<()>);

impl Follow {
    pub fn start(manual: &ManualClock) -> Follow {
        let manual = manual.clone();
        Follow(tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                sleep(Duration::from_millis(1)).await;
                let now = Instant::now();
                manual.advance(now - last);
                last = now;
            }
        }))
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How a check or a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The store decided: admitted.
    Allowed,
    /// The store decided: denied.
    Denied,
    /// The failure policy answered (counted apart from the store's admissions).
    Policy { allowed: bool },
    /// Dropped on purpose before it finished.
    Cancelled,
}

/// One decision on a key.
#[derive(Clone, Debug)]
pub struct Event {
    pub op: usize,
    pub inst: usize,
    pub key: usize,
    /// Units charged when admitted (the reservation, for a layer request).
    pub cost: u64,
    /// Units the response reported as used (layer requests; `cost` otherwise).
    pub used: u64,
    /// The manual clock when it started, in µs.
    pub clock_us: u64,
    /// The manual clock when it had been decided, in µs (the window is unknown when the two
    /// differ in it).
    pub end_us: u64,
    /// Resets and data losses of its key before it started.
    pub epoch: u32,
    pub started: Instant,
    pub outcome: Outcome,
}

/// A reset or a data loss: the key starts a new segment.
#[derive(Clone, Debug)]
pub struct Segment {
    pub key: usize,
    pub epoch: u32,
    pub clock_us: u64,
    /// When the control returned (or the fault was injected).
    pub at: Instant,
    /// Units each instance held in leases at that moment (any key: an upper bound).
    pub held: Vec<u64>,
    /// A data loss (the store forgot the key), not a reset.
    pub loss: bool,
}

/// A suspension in force from `at` (real) while the manual clock is before `until_us` (the
/// earliest end it may have: the clock before the call, plus its duration).
#[derive(Clone, Debug)]
pub struct Suspension {
    pub op: usize,
    pub key: usize,
    pub at: Instant,
    pub until_us: u64,
    /// When a resume, reset or data loss ended it early.
    pub ended: Option<Instant>,
}

/// What a run recorded.
#[derive(Default)]
pub struct Run {
    pub events: Vec<Event>,
    pub segments: Vec<Segment>,
    pub suspensions: Vec<Suspension>,
    /// Faults by the time they were injected, and the fault.
    pub faults: Vec<(Instant, Fault)>,
    /// Operations that did not finish within their bound: (op, what).
    pub hangs: Vec<(usize, String)>,
    /// Moments the inner side had more than the limit in flight: (when, key, in flight, op).
    pub over: Vec<(Instant, usize, i64, usize)>,
    /// Counter samples per instance, in order.
    pub stats: Vec<Vec<(LimiterStats, LeaseStats)>>,
    /// Instances still refused after the upstream turned honest: (instance, what).
    pub lockouts: Vec<(usize, String)>,
    pub operations: u64,
    pub cancellations: u64,
    /// The schedule's limit (for the reports).
    pub limit: u64,
}

/// The fixture shared by every schedule: one private Redis (restarted by faults).
pub type Fixture = Arc<Mutex<RedisServer>>;

fn url(redis: &Fixture) -> String {
    redis.lock().unwrap().url()
}

fn redis_store(redis: &Fixture) -> RedisStore {
    RedisStore::builder(url(redis))
        .timeout(STORE_TIMEOUT)
        .build()
        .expect("valid store")
}

fn key_name(schedule: &Schedule, key: usize) -> String {
    format!("k{key}-{}", schedule.seed)
}

/// The fleet's instances plus the operator's limiter (never leasing).
fn limiters(
    schedule: &Schedule,
    redis: &Fixture,
    clock: Clock,
    leases: bool,
) -> (Vec<Limiter>, Limiter) {
    let memory = MemoryStore::new();
    let make = |lease: bool| {
        let config = &schedule.config;
        let mut builder = match config.backend {
            Backend::Memory => Limiter::builder(memory.clone()),
            Backend::Redis => Limiter::builder(redis_store(redis)),
        }
        .algorithm(config.algorithm)
        .clock(clock.clone())
        .prefix(format!("t{}", schedule.seed));
        if config.family == Family::Settle {
            builder = builder.failure_policy(FailClosed::default());
        }
        if config.deny_cache {
            builder = builder.deny_cache(1_000);
        }
        if let (true, Some(ms)) = (lease, config.lease_ms) {
            builder = builder.leases(Leases::new(Duration::from_millis(ms)));
        }
        builder.build().expect("valid limiter")
    };
    let fleet = (0..schedule.config.instances)
        .map(|_| make(leases))
        .collect();
    (fleet, make(false))
}

fn quotas(config: &Config) -> Quotas {
    let quota = Quota::new(config.limit, Duration::from_millis(config.period_ms)).expect("quota");
    Quotas::from(quota)
}

fn outcome(verdict: &Verdict) -> Outcome {
    match verdict {
        Verdict::Decided(decision) if decision.allowed => Outcome::Allowed,
        Verdict::Decided(_) => Outcome::Denied,
        other => Outcome::Policy {
            allowed: other.is_allowed(),
        },
    }
}

/// Runs `ops` of `schedule` (a prefix of its operations when shrinking), stopping before the
/// first operation that would start at or after `deadline`.
pub async fn run(schedule: &Schedule, ops: &[Op], redis: &Fixture, deadline: Instant) -> Run {
    let ops = cut(ops, deadline);
    match schedule.config.family {
        Family::Rate => rate(schedule, ops, redis).await,
        Family::Concurrency => concurrency(schedule, ops, redis).await,
        Family::Settle => settle(schedule, ops, redis).await,
        Family::Outbound => outbound(schedule, ops, redis).await,
    }
}

/// `ops`, ending at the first one reached at or after `deadline` (each yields `None` then).
fn cut(ops: &[Op], deadline: Instant) -> impl Iterator<Item = &Op> + '_ {
    ops.iter().take_while(move |_| Instant::now() < deadline)
}

/// Samples every instance's counters.
fn sample(run: &mut Run, fleet: &[Limiter]) {
    run.stats.resize(fleet.len(), Vec::new());
    for (i, limiter) in fleet.iter().enumerate() {
        run.stats[i].push((limiter.stats(), limiter.lease_stats()));
    }
}

/// Records a data loss as a new segment of every key, and ends the suspensions.
fn data_loss(run: &mut Run, epochs: &mut [u32], fleet: &[Limiter], clock_us: u64) {
    let at = Instant::now();
    let held: Vec<u64> = fleet.iter().map(|l| l.lease_stats().held).collect();
    for (key, epoch) in epochs.iter_mut().enumerate() {
        *epoch += 1;
        run.segments.push(Segment {
            key,
            epoch: *epoch,
            clock_us,
            at,
            held: held.clone(),
            loss: true,
        });
    }
    for suspension in run.suspensions.iter_mut() {
        suspension.ended.get_or_insert(at);
    }
}

/// Injects `fault`, recorded with the moment it was over (a restarted server is back; a
/// `DEBUG SLEEP` has just begun).
async fn fault(run: &mut Run, redis: &Fixture, fault: Fault) {
    faults::inject(redis, fault).await;
    run.faults.push((Instant::now(), fault));
}

async fn rate<'a>(schedule: &Schedule, ops: impl Iterator<Item = &'a Op>, redis: &Fixture) -> Run {
    let config = &schedule.config;
    let manual = ManualClock::new(CLOCK_START);
    let _follow = Follow::start(&manual);
    let (fleet, operator) = limiters(schedule, redis, Clock::Manual(manual.clone()), true);
    let quotas = quotas(config);
    let mut run = Run::default();
    let mut epochs = vec![0u32; config.keys];
    sample(&mut run, &fleet);
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        match *op {
            Op::Burst {
                inst,
                key,
                n,
                cost,
                cancel_us,
            } => {
                let name = key_name(schedule, key);
                let checks = (0..n).map(|_| {
                    let (limiter, quotas, name, manual) = (&fleet[inst], &quotas, &name, &manual);
                    async move {
                        let started = Instant::now();
                        let start_us = manual.now_micros();
                        let check = limiter.check_quotas(name.as_str(), quotas, cost);
                        let bound = cancel_us.map(Duration::from_micros).unwrap_or(BOUND);
                        let outcome = match timeout(bound, check).await {
                            Ok(verdict) => outcome(&verdict),
                            Err(_) if cancel_us.is_some() => Outcome::Cancelled,
                            Err(_) => {
                                return Err(format!(
                                    "check of {cost} still pending after {BOUND:?}"
                                ))
                            }
                        };
                        Ok((started, start_us, manual.now_micros(), outcome))
                    }
                });
                for result in futures::future::join_all(checks).await {
                    match result {
                        Ok((started, clock_us, end_us, outcome)) => {
                            run.cancellations += u64::from(outcome == Outcome::Cancelled);
                            run.events.push(Event {
                                op: i,
                                inst,
                                key,
                                cost,
                                used: cost,
                                clock_us,
                                end_us,
                                epoch: epochs[key],
                                started,
                                outcome,
                            });
                        }
                        Err(what) => run.hangs.push((i, format!("instance {inst}: {what}"))),
                    }
                }
            }
            Op::Advance { ms } => manual.advance(Duration::from_millis(ms)),
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Reset { key } => {
                let name = key_name(schedule, key);
                let before: Vec<u64> = fleet.iter().map(|l| l.lease_stats().held).collect();
                // The segment starts no later than the call (the refill counts from there).
                let clock_us = manual.now_micros();
                if timeout(BOUND, operator.reset(name.as_str())).await.is_err() {
                    run.hangs.push((i, "reset still pending".into()));
                }
                let at = Instant::now();
                // A renewal Redis ran before the reset may answer just after it.
                sleep(Duration::from_millis(30)).await;
                let held = fleet
                    .iter()
                    .zip(before)
                    .map(|(l, b)| l.lease_stats().held.max(b))
                    .collect();
                epochs[key] += 1;
                run.segments.push(Segment {
                    key,
                    epoch: epochs[key],
                    clock_us,
                    at,
                    held,
                    loss: false,
                });
            }
            Op::Suspend { key, ms } => {
                // A suspension replaces the one in force (it may shorten it).
                let started = Instant::now();
                for s in run.suspensions.iter_mut().filter(|s| s.key == key) {
                    s.ended.get_or_insert(started);
                }
                let name = key_name(schedule, key);
                // The suspension ends `ms` after the clock the call reads, no earlier than this.
                let clock_us = manual.now_micros();
                let set = operator.suspend(name.as_str(), Duration::from_millis(ms));
                match timeout(BOUND, set).await {
                    Ok(Ok(_)) => run.suspensions.push(Suspension {
                        op: i,
                        key,
                        at: Instant::now(),
                        until_us: clock_us + ms * 1_000,
                        ended: None,
                    }),
                    Ok(Err(_)) => {}
                    Err(_) => run.hangs.push((i, "suspend still pending".into())),
                }
            }
            Op::Resume { key } => {
                let started = Instant::now();
                for s in run.suspensions.iter_mut().filter(|s| s.key == key) {
                    s.ended.get_or_insert(started);
                }
                let name = key_name(schedule, key);
                if timeout(BOUND, operator.resume(name.as_str()))
                    .await
                    .is_err()
                {
                    run.hangs.push((i, "resume still pending".into()));
                }
            }
            Op::Forget { inst, key } => fleet[inst].forget(key_name(schedule, key).as_str()),
            Op::Release { inst } => {
                let released = timeout(BOUND, fleet[inst].release_leases()).await;
                if released.is_err() {
                    let what = format!("instance {inst}: release_leases still pending");
                    run.hangs.push((i, what));
                }
            }
            Op::Fault(f) => {
                let clock_us = manual.now_micros();
                fault(&mut run, redis, f).await;
                if f.loses_data() {
                    data_loss(&mut run, &mut epochs, &fleet, clock_us);
                }
            }
            _ => {}
        }
        sample(&mut run, &fleet);
    }
    // Quiet: renewals and give-backs in flight land before the last sample.
    sleep(Duration::from_millis(300)).await;
    sample(&mut run, &fleet);
    run
}

async fn concurrency<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    redis: &Fixture,
) -> Run {
    let config = &schedule.config;
    let (fleet, _) = limiters(schedule, redis, Clock::default(), false);
    let slots: Vec<ConcurrencyLimiter> = fleet
        .iter()
        .map(|l| ConcurrencyLimiter::with_options(l.clone(), config.limit, SLOT_LEASE, "c"))
        .collect::<Result<_, _>>()
        .expect("valid concurrency limiter");
    let in_flight: Arc<Vec<AtomicI64>> =
        Arc::new((0..config.keys).map(|_| AtomicI64::new(0)).collect());
    let over = Arc::new(Mutex::new(Vec::new()));
    let hangs = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let mut run = Run {
        limit: config.limit,
        ..Run::default()
    };
    // The in-flight count over time, not only at admissions: a holder whose slot was lost
    // stays in flight while others take its place.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (in_flight, over, done) = (in_flight.clone(), over.clone(), done.clone());
        let limit = config.limit as i64;
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                for (key, count) in in_flight.iter().enumerate() {
                    let now = count.load(Ordering::SeqCst);
                    if now > limit {
                        over.lock()
                            .unwrap()
                            .push((Instant::now(), key, now, usize::MAX));
                    }
                }
                sleep(Duration::from_millis(50)).await;
            }
        })
    };
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        match *op {
            Op::Hold {
                inst,
                key,
                n,
                hold_ms,
                cancel_us,
            } => {
                for _ in 0..n {
                    let (slots, name) = (slots[inst].clone(), key_name(schedule, key));
                    let (in_flight, over, hangs) = (in_flight.clone(), over.clone(), hangs.clone());
                    let limit = config.limit as i64;
                    run.cancellations += u64::from(cancel_us.is_some());
                    tasks.spawn(async move {
                        let bound = cancel_us.map(Duration::from_micros).unwrap_or(BOUND);
                        let slot = match timeout(bound, slots.acquire(&name)).await {
                            Ok(SlotOutcome::Acquired(slot)) => slot,
                            Ok(_) => return,
                            Err(_) if cancel_us.is_some() => return,
                            Err(_) => {
                                let what = format!(
                                    "instance {inst}: acquire still pending after {BOUND:?}"
                                );
                                hangs.lock().unwrap().push((i, what));
                                return;
                            }
                        };
                        let now = in_flight[key].fetch_add(1, Ordering::SeqCst) + 1;
                        if now > limit {
                            over.lock().unwrap().push((Instant::now(), key, now, i));
                        }
                        sleep(Duration::from_millis(hold_ms)).await;
                        in_flight[key].fetch_sub(1, Ordering::SeqCst);
                        drop(slot);
                    });
                }
            }
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Fault(f) => fault(&mut run, redis, f).await,
            _ => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    done.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    run.over = std::mem::take(&mut *over.lock().unwrap());
    run.hangs
        .extend(std::mem::take(&mut *hangs.lock().unwrap()));
    run
}

/// The settlement schedules' inner service: answers after the request's `x-hold` ms with its
/// `x-used` units, and records each admitted request.
type Admitted = Arc<Mutex<Vec<Event>>>;

async fn settle<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    redis: &Fixture,
) -> Run {
    let config = &schedule.config;
    let manual = ManualClock::new(CLOCK_START);
    let _follow = Follow::start(&manual);
    let (fleet, _) = limiters(schedule, redis, Clock::Manual(manual.clone()), false);
    let admitted: Admitted = Arc::default();
    let header = |parts: &http::request::Parts, name: &str| -> u64 {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(0)
    };
    let services: Vec<_> = fleet
        .iter()
        .enumerate()
        .map(|(inst, limiter)| {
            let key = FnKey::new(|parts: &http::request::Parts| {
                parts
                    .headers
                    .get("x-key")
                    .and_then(|v| Some(v.to_str().ok()?.to_owned()))
            });
            let layer = RateLimitLayer::builder(limiter.clone(), quotas(config), key)
                .cost(move |parts| header(parts, "x-reserve"))
                .cost_from_response(move |response| {
                    response
                        .headers()
                        .get("x-used")
                        .and_then(|v| v.to_str().ok()?.parse().ok())
                        .unwrap_or(u64::MAX)
                })
                .build()
                .expect("valid layer");
            let (admitted, manual) = (admitted.clone(), manual.clone());
            let inner = tower::service_fn(move |request: Request<String>| {
                let (admitted, manual) = (admitted.clone(), manual.clone());
                async move {
                    let (parts, _) = request.into_parts();
                    let clock_us = header(&parts, "x-clock");
                    admitted.lock().unwrap().push(Event {
                        op: header(&parts, "x-op") as usize,
                        inst,
                        key: header(&parts, "x-key-index") as usize,
                        cost: header(&parts, "x-reserve"),
                        used: header(&parts, "x-used"),
                        clock_us,
                        end_us: manual.now_micros(),
                        epoch: 0,
                        started: Instant::now(),
                        outcome: Outcome::Allowed,
                    });
                    sleep(Duration::from_millis(header(&parts, "x-hold"))).await;
                    let mut response = Response::new(String::new());
                    let used = header(&parts, "x-used").to_string();
                    response
                        .headers_mut()
                        .insert("x-used", used.parse().unwrap());
                    Ok::<_, Infallible>(response)
                }
            });
            ServiceBuilder::new().layer(layer).service(inner)
        })
        .collect();
    let hangs = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let mut run = Run::default();
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        match *op {
            Op::Request {
                inst,
                key,
                n,
                reserve,
                used,
                hold_ms,
            } => {
                for _ in 0..n {
                    let request = Request::builder()
                        .header("x-key", key_name(schedule, key))
                        .header("x-key-index", key)
                        .header("x-op", i)
                        .header("x-reserve", reserve)
                        .header("x-used", used)
                        .header("x-hold", hold_ms)
                        .header("x-clock", manual.now_micros())
                        .body(String::new())
                        .unwrap();
                    let (svc, hangs) = (services[inst].clone(), hangs.clone());
                    tasks.spawn(async move {
                        let bound = BOUND + Duration::from_millis(hold_ms);
                        match timeout(bound, svc.oneshot(request)).await {
                            Ok(Ok(response)) => {
                                let status = response.status();
                                assert!(
                                    status == StatusCode::OK
                                        || status.as_u16() == 429
                                        || status.as_u16() == 503,
                                    "{status}"
                                );
                            }
                            Ok(Err(_)) => {}
                            Err(_) => hangs.lock().unwrap().push((
                                i,
                                format!("instance {inst}: request still pending after {bound:?}"),
                            )),
                        }
                    });
                }
                // Let the requests start before the next operation.
                sleep(Duration::from_millis(5)).await;
            }
            Op::Advance { ms } => manual.advance(Duration::from_millis(ms)),
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Fault(f) => {
                let clock_us = manual.now_micros();
                fault(&mut run, redis, f).await;
                if f.loses_data() {
                    let mut epochs = vec![0; config.keys];
                    data_loss(&mut run, &mut epochs, &fleet, clock_us);
                }
            }
            _ => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    run.events = std::mem::take(&mut *admitted.lock().unwrap());
    run.hangs
        .extend(std::mem::take(&mut *hangs.lock().unwrap()));
    run
}

/// The scripted upstream's answer under `upstream`.
fn answer(upstream: &Upstream) -> Response<String> {
    let mut response = Response::new(String::new());
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: String| {
        headers.insert(name, value.parse().unwrap());
    };
    match *upstream {
        Upstream::Honest => {
            set("ratelimit-policy", "\"p\";q=20;w=1".into());
            set("ratelimit", "\"p\";r=10;t=1".into());
        }
        Upstream::Lying {
            quota,
            window_s,
            remaining,
            reset_s,
        } => {
            set("ratelimit-policy", format!("\"p\";q={quota};w={window_s}"));
            set("ratelimit", format!("\"p\";r={remaining};t={reset_s}"));
        }
        Upstream::TooMany { retry_after_s } => {
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response
                .headers_mut()
                .insert("retry-after", retry_after_s.to_string().parse().unwrap());
        }
    }
    response
}

async fn outbound<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    redis: &Fixture,
) -> Run {
    let (fleet, _) = limiters(schedule, redis, Clock::default(), false);
    let upstream = Arc::new(Mutex::new(Upstream::Honest));
    let calls = Arc::new(AtomicU64::new(0));
    let ceiling = Quota::per_second(20).expect("quota");
    let mut services: Vec<_> = fleet
        .iter()
        .map(|limiter| {
            let layer = OutboundLayer::builder(limiter.clone(), ceiling, key_name(schedule, 0))
                .learn_quota(ceiling)
                .max_auto_suspension(MAX_AUTO_SUSPENSION)
                .max_wait(MAX_WAIT)
                .build()
                .expect("valid outbound layer");
            let (upstream, calls) = (upstream.clone(), calls.clone());
            let inner = tower::service_fn(move |_: Request<String>| {
                calls.fetch_add(1, Ordering::Relaxed);
                let response = answer(&upstream.lock().unwrap());
                async move { Ok::<_, Infallible>(response) }
            });
            ServiceBuilder::new().layer(layer).service(inner)
        })
        .collect();
    let mut run = Run::default();
    let bound = MAX_WAIT + BOUND;
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        match op {
            Op::Call { inst, n } => {
                for _ in 0..*n {
                    let call = async {
                        let svc = services[*inst].ready().await?;
                        svc.call(Request::new(String::new())).await
                    };
                    if timeout(bound, call).await.is_err() {
                        run.hangs.push((
                            i,
                            format!("instance {inst}: call still pending after {bound:?}"),
                        ));
                    }
                }
            }
            Op::SetUpstream(next) => *upstream.lock().unwrap() = next.clone(),
            Op::Sleep { ms } => sleep(Duration::from_millis(*ms)).await,
            Op::Fault(f) => fault(&mut run, redis, *f).await,
            _ => {}
        }
    }
    // Recovery: the upstream is honest again. docs/outbound.md: a pause an upstream asks for
    // is "capped at `max_auto_suspension`" and the learned quota is "never faster than the
    // ceiling" (and, DESIGN §6c, bounded): past the cap, each instance must reach the upstream
    // within its `max_wait`, or be told its next unit is at most LOCKOUT away.
    *upstream.lock().unwrap() = Upstream::Honest;
    sleep(MAX_AUTO_SUSPENSION + Duration::from_millis(200)).await;
    for (inst, svc) in services.iter_mut().enumerate() {
        let before = calls.load(Ordering::Relaxed);
        let call = async {
            let svc = svc.ready().await?;
            svc.call(Request::new(String::new())).await
        };
        let what = match timeout(bound, call).await {
            Ok(Ok(_)) if calls.load(Ordering::Relaxed) > before => continue,
            Ok(Ok(_)) => "answered without reaching the upstream".to_owned(),
            // A quota an upstream may really have (its next unit within LOCKOUT) is followed,
            // not a lockout.
            Ok(Err(OutboundError::Acquire(AcquireError::DeadlineExceeded {
                retry_after, ..
            }))) if retry_after <= LOCKOUT => continue,
            Ok(Err(error)) => format!("refused: {error}"),
            Err(_) => format!("still pending after {bound:?}"),
        };
        run.lockouts.push((inst, what));
    }
    run
}

/// Whether `event` started and was decided in one window of `period_us`.
pub fn one_window(event: &Event, period_us: u64) -> bool {
    event.clock_us / period_us == event.end_us / period_us
}

/// Per key and window, the units the events of `keep` charged, summed by `units`.
pub fn per_window(
    events: &[Event],
    period_us: u64,
    keep: impl Fn(&Event) -> bool,
    units: impl Fn(&Event) -> u64,
) -> HashMap<(usize, u64, u32), u64> {
    let mut sums = HashMap::new();
    for event in events.iter().filter(|e| keep(e)) {
        *sums
            .entry((event.key, event.clock_us / period_us, event.epoch))
            .or_insert(0) += units(event);
    }
    sums
}
