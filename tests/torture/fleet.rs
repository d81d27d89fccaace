//! The fleet driver: builds a schedule's instances on the fixture's Redis (or one shared
//! `MemoryStore`), runs its operations in order (bursts concurrently, held slots and layer
//! requests in the background) and records what every instance decided, for the oracles.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use redlimit::clock::{Clock, ManualClock};
use redlimit::concurrency::{
    ConcurrencyBody, ConcurrencyLimitLayer, ConcurrencyLimiter, SlotOutcome,
};
use redlimit::failure_policy::{
    FailClosed, FailOpen, FailureContext, FailurePolicy, LocalFallback,
};
use redlimit::key::FnKey;
use redlimit::layer::ShadowLimited;
use redlimit::limiter::{AcquireError, BlockFor};
use redlimit::limiter::{LeaseStats, Leases, LimiterBuilder, LimiterStats};
use redlimit::outbound::{OutboundError, OutboundLayer};
use redlimit::store::{MemoryStore, RedisStore};
use redlimit::{Algorithm, Limiter, Quota, Quotas, RateLimitLayer, Verdict};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout};
use tower::{Service, ServiceBuilder, ServiceExt};

use crate::faults::{self, Fault};
use crate::generator::{
    Backend, BodyEnd, Config, Family, Op, Policy, Schedule, Settlement, Upstream,
};
use crate::support::{RedisCluster, RedisServer};

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

tokio::task_local! {
    /// Set when the failure policy answered the check running in this task.
    static BY_POLICY: std::cell::Cell<bool>;
    /// The store error the failure policy answered, when a caller asks ([`marked_why`]).
    static WHY: std::cell::RefCell<Option<String>>;
}

/// The schedule's failure policy, marking the checks it answers: a `LocalFallback` answers
/// with a `Decided` verdict like the store's, and its admissions are counted apart.
#[derive(Debug)]
struct Marked<P>(P);

impl<P: FailurePolicy> FailurePolicy for Marked<P> {
    fn on_store_error(&self, ctx: &FailureContext<'_>) -> redlimit::Verdict {
        let _ = BY_POLICY.try_with(|marked| marked.set(true));
        let _ = WHY.try_with(|why| *why.borrow_mut() = Some(ctx.error.to_string()));
        self.0.on_store_error(ctx)
    }
}

/// `builder` with the schedule's failure `policy`, marked ([`Marked`]).
pub fn with_policy(builder: LimiterBuilder, policy: Policy) -> LimiterBuilder {
    match policy {
        Policy::FailOpen => builder.failure_policy(Marked(FailOpen)),
        Policy::FailClosed => builder.failure_policy(Marked(FailClosed::default())),
        Policy::LocalFallback(n) => builder.failure_policy(Marked(LocalFallback::new(n))),
    }
}

/// How far the differential run's clock moves ahead of real time after each call, at least:
/// more than the time between reading the clock and Redis running the script, on a loaded
/// machine. The lead grows to twice the slowest Redis call seen (a Cluster on a busy machine
/// may take longer), so that a key never expires in Redis's real time before the simulated
/// clock says it may.
const DIFFERENTIAL_LEAD: Duration = Duration::from_millis(25);

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
        Follow::start_all(vec![manual.clone()])
    }

    /// Moves every clock of `clocks` by the same real time, so their offsets stay.
    pub fn start_all(clocks: Vec<ManualClock>) -> Follow {
        Follow(tokio::spawn(async move {
            let mut last = Instant::now();
            loop {
                sleep(Duration::from_millis(1)).await;
                let now = Instant::now();
                for clock in &clocks {
                    clock.advance(now - last);
                }
                last = now;
            }
        }))
    }
}

/// How far the instances' offsets may drift apart: moving the clocks back is one `set` per
/// clock, and [`Follow`] may advance some of them in between.
const OFFSET_DRIFT_US: u64 = 3_000;

/// A rate schedule's clocks: the operator's (`base`), and each instance's, its offset ahead of
/// it (`Config::offsets_ms`); the schedule's steps move them all.
struct Clocks {
    base: ManualClock,
    fleet: Vec<ManualClock>,
    /// Per instance: how far the fastest instance's clock is ahead of its own, in µs.
    lead: Vec<u64>,
}

impl Clocks {
    fn new(config: &Config) -> Clocks {
        let offsets: Vec<u64> = (0..config.instances).map(|i| config.offset_us(i)).collect();
        let fastest = offsets.iter().copied().max().unwrap_or(0);
        Clocks {
            base: ManualClock::new(CLOCK_START),
            fleet: offsets
                .iter()
                .map(|off| ManualClock::new(CLOCK_START + Duration::from_micros(*off)))
                .collect(),
            lead: offsets
                .iter()
                .map(|off| match fastest - off {
                    0 if fastest == 0 => 0,
                    lead => lead + OFFSET_DRIFT_US,
                })
                .collect(),
        }
    }

    fn all(&self) -> Vec<ManualClock> {
        std::iter::once(self.base.clone())
            .chain(self.fleet.iter().cloned())
            .collect()
    }

    fn advance(&self, by: Duration) {
        self.all().iter().for_each(|clock| clock.advance(by));
    }

    /// Instance `inst`'s clock, in µs.
    fn now(&self, inst: usize) -> u64 {
        self.fleet[inst].now_micros()
    }

    /// The latest time instance `inst`'s call may have decided as of, now: its own clock,
    /// plus `skew_us` of steps back, plus how far the fastest clock is ahead of it (docs
    /// (Clock): a call whose clock is behind its key's stored time by at most
    /// `Clock::MAX_SKEW` "decides as of the stored time").
    fn end(&self, inst: usize, skew_us: u64) -> u64 {
        self.now(inst) + skew_us + self.lead[inst]
    }

    /// Moves every clock forward to put the operator's at `target` (no-op if it is past).
    fn forward_to(&self, target: Duration) {
        let now = Duration::from_micros(self.base.now_micros());
        if target > now {
            self.advance(target - now);
        }
    }

    /// Moves every clock back by `back_us`.
    fn back(&self, back_us: u64) {
        for clock in self.all() {
            clock.set(Duration::from_micros(clock.now_micros() - back_us));
        }
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
    /// An `acquire` whose tries were answered by the store and by the failure policy: which
    /// gave its last answer is not known, so no oracle counts it.
    Unattributed { allowed: bool },
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
    /// Steps of the clock back beyond `Clock::MAX_SKEW` before it started (each repairs
    /// every state to the earlier time).
    pub era: u32,
    pub started: Instant,
    pub outcome: Outcome,
}

impl Event {
    /// A check of the rate family: `(op, inst, key, cost)`, its units used as charged; when it
    /// `started`, on the manual clock then (`clock_us`) and once decided (`end_us`); in its
    /// key's `epoch` and the clocks' `era`.
    fn check(
        (op, inst, key, cost): (usize, usize, usize, u64),
        (started, clock_us, end_us): (Instant, u64, u64),
        (epoch, era): (u32, u32),
        outcome: Outcome,
    ) -> Event {
        Event {
            op,
            inst,
            key,
            cost,
            used: cost,
            clock_us,
            end_us,
            epoch,
            era,
            started,
            outcome,
        }
    }
}

/// One decision with its wall time, for the oracles on waits, on the failure policy and on the
/// headers' numbers.
#[derive(Clone, Debug)]
pub struct Timed {
    pub op: usize,
    pub inst: usize,
    pub algorithm: Algorithm,
    /// Who asked, and beside what (`burst`, `queued behind a busy task's`, ...).
    pub caller: &'static str,
    pub started: Instant,
    pub ended: Instant,
    pub outcome: Outcome,
    /// The store error the failure policy answered.
    pub error: Option<String>,
    /// The store's timeout, when the decision is one store call polled to its end (its wait is
    /// judged); `None` for one parked, cancelled, or of several calls (leases).
    pub timeout: Option<Duration>,
    /// `remaining` and the deciding quota's burst, of a decided verdict (store or policy).
    pub header: Option<(u64, u64)>,
}

impl Timed {
    /// The record of a check that `started` and returned now with `checked` ([`marked_why`]).
    pub fn new(
        (op, inst, algorithm, caller): (usize, usize, Algorithm, &'static str),
        started: Instant,
        checked: &(Verdict, bool, Option<String>),
        timeout: Option<Duration>,
    ) -> Timed {
        let (verdict, by_policy, error) = checked;
        Timed {
            op,
            inst,
            algorithm,
            caller,
            started,
            ended: Instant::now(),
            outcome: outcome(verdict, *by_policy),
            error: error.clone(),
            timeout,
            header: match verdict {
                Verdict::Decided(d) => Some((d.remaining, d.quota.burst())),
                _ => None,
            },
        }
    }
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
/// earliest end it may have: the clock before the call, plus its duration), or until a step
/// back after the clock reached `until_us` (`ended`).
#[derive(Clone, Debug)]
pub struct Suspension {
    pub op: usize,
    pub key: usize,
    pub at: Instant,
    pub until_us: u64,
    /// When a resume, reset or data loss ended it early.
    pub ended: Option<Instant>,
}

/// An override set by `set_quota` from `at` (when it returned), until a `clear_quota`, a
/// later `set_quota` or a data loss.
#[derive(Clone, Debug)]
pub struct Override {
    pub op: usize,
    pub key: usize,
    pub limit: u64,
    /// When the call started, and the manual clock then.
    pub started: Instant,
    pub clock_us: u64,
    pub at: Instant,
    pub ended: Option<Instant>,
    /// Whether it is known to be in force: a call that failed may have run all the same (a
    /// timeout bounds the wait, not the work), and a failed clear may have left it.
    pub sure: bool,
}

/// What a run recorded.
#[derive(Default)]
pub struct Run {
    pub events: Vec<Event>,
    pub segments: Vec<Segment>,
    pub suspensions: Vec<Suspension>,
    pub overrides: Vec<Override>,
    /// Shadow tiers: whether each of `events` reached the service with a `ShadowLimited`.
    pub shadow_limited: Vec<bool>,
    /// Shadow tiers: each instance's `LimiterStats::shadow_limited` at the end.
    pub shadow_counted: Vec<u64>,
    /// Requests a shadow layer refused: (op, instance, status).
    pub refused_in_shadow: Vec<(usize, usize, u16)>,
    /// Where the same fault-free schedule got different decisions from Redis and memory.
    pub differences: Vec<String>,
    /// Faults by the time they were injected, and the fault.
    pub faults: Vec<(Instant, Fault)>,
    /// When each fault of `faults` began.
    pub fault_starts: Vec<Instant>,
    /// Operations that did not finish within their bound: (op, what).
    pub hangs: Vec<(usize, String)>,
    /// Moments the inner side had more than the limit in flight: (when, key, in flight, op).
    pub over: Vec<(Instant, usize, i64, usize)>,
    /// Counter samples per instance, in order.
    pub stats: Vec<Vec<(LimiterStats, LeaseStats)>>,
    /// Rate schedules with per-instance clocks: (instance, key, last outcome) that never
    /// decided again in the recovery probe.
    pub stuck: Vec<(usize, usize, String)>,
    /// Instances still refused after the upstream turned honest: (instance, what).
    pub lockouts: Vec<(usize, String)>,
    pub operations: u64,
    pub cancellations: u64,
    /// The schedule's limit (for the reports).
    pub limit: u64,
    /// Decisions with their wall time ([`Timed`]): the batching family's, and the rate family's
    /// checks.
    pub timed: Vec<Timed>,
    /// When Redis was out of memory ([`Fault::OutOfMemory`]): when the fault began, when Redis
    /// was out of memory, and when the lift began.
    pub out_of_memory: Vec<(Instant, Instant, Instant)>,
    /// What the health monitor saw (batching schedules).
    pub health: crate::health::Health,
    /// When a task of the fleet's runtime worked without yielding (batching): (from, to).
    pub busy: Vec<(Instant, Instant)>,
    /// The headers' `r` and `q` of each response that had them (settlement): (op, inst, r, q).
    pub headers: Vec<(usize, usize, u64, u64)>,
}

/// The fixture shared by every schedule: one private Redis (restarted by faults), and the
/// 3-master Cluster, started the first time a schedule needs it.
#[derive(Clone)]
pub struct Fixture {
    pub redis: Arc<Mutex<RedisServer>>,
    pub cluster: Arc<Mutex<Option<RedisCluster>>>,
    /// The cluster's node URLs once it runs (they outlive a node's restart).
    cluster_urls: Arc<std::sync::OnceLock<Vec<String>>>,
}

impl Fixture {
    pub fn new(redis: RedisServer) -> Fixture {
        Fixture {
            redis: Arc::new(Mutex::new(redis)),
            cluster: Arc::default(),
            cluster_urls: Arc::default(),
        }
    }

    /// Starts the cluster unless it runs.
    pub async fn start_cluster(&self) {
        if self.cluster_urls.get().is_some() {
            return;
        }
        let cluster = RedisCluster::start;
        let cluster = tokio::task::spawn_blocking(cluster).await.expect("cluster");
        let _ = self.cluster_urls.set(cluster.urls());
        *self.cluster.lock().unwrap() = Some(cluster);
    }

    /// Whether the cluster was started.
    pub fn has_cluster(&self) -> bool {
        self.cluster_urls.get().is_some()
    }

    /// A store of the fleet's on `backend` (not the memory store).
    pub fn store(&self, backend: Backend) -> RedisStore {
        let builder = match backend {
            Backend::Cluster => {
                let urls = self.cluster_urls.get().expect("the cluster runs").clone();
                RedisStore::cluster_builder(urls)
            }
            _ => RedisStore::builder(self.redis.lock().unwrap().url()),
        };
        builder.timeout(STORE_TIMEOUT).build().expect("valid store")
    }

    /// Deletes `keys` from the backend's Redis (single node or Cluster), outside any store.
    fn delete(&self, backend: Backend, keys: &[String]) {
        let del = |conn: &mut dyn redis::ConnectionLike| {
            for key in keys {
                let _: () = redis::cmd("DEL").arg(key).query(conn).expect("DEL");
            }
        };
        match backend {
            Backend::Cluster => {
                let urls = self.cluster_urls.get().expect("the cluster runs").clone();
                let client = redis::cluster::ClusterClient::new(urls).expect("cluster client");
                del(&mut client.get_connection().expect("cluster connection"));
            }
            _ => del(&mut self.redis.lock().unwrap().conn()),
        }
    }
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
    let clocks = vec![clock.clone(); schedule.config.instances];
    limiters_on(schedule, redis, clock, clocks, leases)
}

/// [`limiters`], each instance on its clock of `clocks`, the operator on `clock`.
fn limiters_on(
    schedule: &Schedule,
    redis: &Fixture,
    clock: Clock,
    clocks: Vec<Clock>,
    leases: bool,
) -> (Vec<Limiter>, Limiter) {
    let memory = MemoryStore::new();
    let make = |lease: bool, clock: &Clock| {
        let config = &schedule.config;
        let mut builder = match config.backend {
            Backend::Memory => Limiter::builder(memory.clone()),
            backend => Limiter::builder(redis.store(backend)),
        }
        .algorithm(config.algorithm)
        .clock(clock.clone())
        .prefix(format!("t{}", schedule.seed));
        builder = with_policy(builder, config.policy);
        if config.deny_cache {
            builder = builder.deny_cache(1_000);
        }
        if let (true, Some(ms)) = (lease, config.lease_ms) {
            builder = builder.leases(Leases::new(Duration::from_millis(ms)));
        }
        builder.build().expect("valid limiter")
    };
    let fleet = clocks.iter().map(|clock| make(leases, clock)).collect();
    (fleet, make(false, &clock))
}

fn quotas(config: &Config) -> Quotas {
    let quota = Quota::new(config.limit, Duration::from_millis(config.period_ms)).expect("quota");
    Quotas::from(quota)
}

/// How `verdict` ended, `by_policy` when the failure policy gave it.
fn outcome(verdict: &Verdict, by_policy: bool) -> Outcome {
    match verdict {
        _ if by_policy => Outcome::Policy {
            allowed: verdict.is_allowed(),
        },
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
    if schedule.config.backend == Backend::Cluster {
        redis.start_cluster().await;
    }
    let ops = cut(ops, deadline);
    match schedule.config.family {
        Family::Rate => rate(schedule, ops, redis).await,
        Family::Concurrency => concurrency(schedule, ops, redis).await,
        Family::Settle => settle(schedule, ops, redis).await,
        Family::Outbound => outbound(schedule, ops, redis).await,
        Family::Batching => crate::batching::run(schedule, ops, redis).await,
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

/// Records a data loss as a new segment of every key, and ends the controls.
fn data_loss(run: &mut Run, epochs: &mut [u32], fleet: &[Limiter], clock_us: u64) {
    let at = new_segments(run, epochs, fleet, clock_us);
    for suspension in run.suspensions.iter_mut() {
        suspension.ended.get_or_insert(at);
    }
    for quota in run.overrides.iter_mut() {
        quota.ended.get_or_insert(at);
    }
}

/// A new segment of every key from now (a data loss, or every state repaired to an earlier
/// clock), returning now.
fn new_segments(run: &mut Run, epochs: &mut [u32], fleet: &[Limiter], clock_us: u64) -> Instant {
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
    at
}

/// Injects `fault`, recorded with the moment it was over (a restarted server is back; a
/// `DEBUG SLEEP` has just begun), and the moment it began (a data loss may be anywhere
/// between).
async fn fault(run: &mut Run, redis: &Fixture, fault: Fault, keys: Vec<String>, backend: Backend) {
    let began = Instant::now();
    faults::inject(redis, fault, keys, backend).await;
    run.faults.push((Instant::now(), fault));
    run.fault_starts.push(began);
}

/// `check`'s verdict, whether the failure policy answered it, and the store error it answered.
pub async fn marked_why<F: std::future::Future<Output = Verdict>>(
    check: F,
) -> (Verdict, bool, Option<String>) {
    WHY.scope(std::cell::RefCell::new(None), async {
        let (verdict, by_policy) = marked(check).await;
        (verdict, by_policy, WHY.with(|why| why.borrow_mut().take()))
    })
    .await
}

/// `check`'s verdict, with whether the failure policy answered it.
async fn marked<F: std::future::Future<Output = Verdict>>(check: F) -> (Verdict, bool) {
    BY_POLICY
        .scope(std::cell::Cell::new(false), async {
            let verdict = check.await;
            (verdict, BY_POLICY.with(|marked| marked.get()))
        })
        .await
}

/// A check of `cost` on `limiter`, with whether the failure policy answered it.
async fn marked_check(limiter: &Limiter, name: &str, quotas: &Quotas, cost: u64) -> Outcome {
    let (verdict, by_policy) = marked(limiter.check_quotas(name, quotas, cost)).await;
    outcome(&verdict, by_policy)
}

/// The storage keys of the schedule's keys and of their tenants' controls (docs/fleet.md:
/// "`<prefix>:{<id>}#t`"): what a corruption writes into.
fn storage_keys(schedule: &Schedule, limiter: &Limiter) -> Vec<String> {
    (0..schedule.config.keys)
        .map(|key| limiter.storage_key(key_name(schedule, key).as_str()))
        .flat_map(|route| [format!("{route}#t"), route])
        .collect()
}

/// The manual clock `before_us` before its next window boundary of `period_ms` (forward
/// only: the boundary after, if that moment has passed).
fn edge(manual: &ManualClock, period_ms: u64, before_us: u64) -> Duration {
    let period_us = period_ms * 1_000;
    let now = manual.now_micros();
    let mut target = (now / period_us + 1) * period_us - before_us.min(period_us - 1);
    if target <= now {
        target += period_us;
    }
    Duration::from_micros(target)
}

async fn rate<'a>(schedule: &Schedule, ops: impl Iterator<Item = &'a Op>, redis: &Fixture) -> Run {
    let config = &schedule.config;
    let clocks = Clocks::new(config);
    let manual = clocks.base.clone();
    let _follow = Follow::start_all(clocks.all());
    let fleet_clocks = clocks.fleet.iter().cloned().map(Clock::Manual).collect();
    let (fleet, operator) = limiters_on(
        schedule,
        redis,
        Clock::Manual(manual.clone()),
        fleet_clocks,
        true,
    );
    let spread_us = config.spread_us();
    let quotas = quotas(config);
    let keys = storage_keys(schedule, &operator);
    let mut run = Run::default();
    // Whether this process stalled (`within-timeout`): any server answers that.
    let monitor = crate::health::Monitor::start(redis.redis.lock().unwrap().url());
    let mut epochs = vec![0u32; config.keys];
    let mut era = 0u32;
    // How far the clock stepped back within `Clock::MAX_SKEW` in all: a check then decides as
    // of a stored time up to that much later (docs (Clock): "The call decides as of the stored
    // time"), and Redis, which expires keys in real time, as of the clock before the steps;
    // docs: "The fleet then admits no more than one clock running as fast as the fastest
    // instance would". So a check's time lies between its clock and its clock plus this.
    let mut skew_us = 0u64;
    let mut ran = Vec::new();
    sample(&mut run, &fleet);
    for (i, op) in ops.enumerate() {
        run.operations += 1;
        ran.push(op.clone());
        match *op {
            Op::Burst {
                inst,
                key,
                n,
                cost,
                cancel_us,
            } => {
                let name = key_name(schedule, key);
                // Without leases a check is one store call: its wait is judged.
                let judged = match config.backend {
                    Backend::Memory => None,
                    _ => config.lease_ms.is_none().then_some(STORE_TIMEOUT),
                };
                let checks = (0..n).map(|_| {
                    let (limiter, quotas, name, clocks) = (&fleet[inst], &quotas, &name, &clocks);
                    async move {
                        let started = Instant::now();
                        let start_us = clocks.now(inst);
                        let check = marked_why(limiter.check_quotas(name.as_str(), quotas, cost));
                        let bound = cancel_us.map(Duration::from_micros).unwrap_or(BOUND);
                        let (outcome, timed) = match timeout(bound, check).await {
                            Ok(checked) => {
                                let what = (i, inst, config.algorithm, "burst");
                                let timed = Timed::new(what, started, &checked, judged);
                                (outcome(&checked.0, checked.1), Some(timed))
                            }
                            Err(_) if cancel_us.is_some() => (Outcome::Cancelled, None),
                            Err(_) => {
                                return Err(format!(
                                    "check of {cost} still pending after {BOUND:?}"
                                ))
                            }
                        };
                        let end_us = clocks.end(inst, skew_us);
                        Ok((started, start_us, end_us, outcome, timed))
                    }
                });
                for result in futures::future::join_all(checks).await {
                    match result {
                        Ok((started, clock_us, end_us, outcome, timed)) => {
                            run.timed.extend(timed);
                            run.cancellations += u64::from(outcome == Outcome::Cancelled);
                            let times = (started, clock_us, end_us);
                            let lineage = (epochs[key], era);
                            let event = Event::check((i, inst, key, cost), times, lineage, outcome);
                            run.events.push(event);
                        }
                        Err(what) => run.hangs.push((i, format!("instance {inst}: {what}"))),
                    }
                }
            }
            Op::Blocking {
                inst,
                key,
                n,
                cost,
                block_ms,
            } => {
                let name = key_name(schedule, key);
                let block = BlockFor::new(Duration::from_millis(block_ms)).expect("block");
                let checks = (0..n).map(|_| {
                    let (limiter, quotas, name, clocks, block) =
                        (&fleet[inst], &quotas, &name, &clocks, &block);
                    async move {
                        let started = Instant::now();
                        let start_us = clocks.now(inst);
                        let check = limiter.check_blocking(name.as_str(), quotas, cost, block);
                        let answer = timeout(BOUND, marked(check)).await;
                        let end_us = clocks.end(inst, skew_us);
                        (started, start_us, end_us, Instant::now(), answer)
                    }
                });
                for (started, clock_us, end_us, returned, answer) in
                    futures::future::join_all(checks).await
                {
                    let Ok((verdict, by_policy)) = answer else {
                        run.hangs.push((
                            i,
                            format!(
                                "instance {inst}: check_blocking still pending after {BOUND:?}"
                            ),
                        ));
                        continue;
                    };
                    let what = (i, inst, config.algorithm, "blocking");
                    let checked = (verdict, by_policy, None);
                    run.timed.push(Timed::new(what, started, &checked, None));
                    // docs (`check_blocking`): "Until the block ends every check on the key is
                    // denied as suspended", with `retry_after` the time left: a suspended
                    // denial tells of a suspension in force until at least its start plus
                    // that. A deny cache may answer from before a control made elsewhere, so
                    // only the store's own answers count.
                    if let (Verdict::Decided(d), false, false) =
                        (verdict, by_policy, config.deny_cache)
                    {
                        if d.suspended && !d.allowed {
                            run.suspensions.push(Suspension {
                                op: i,
                                key,
                                at: returned,
                                until_us: clock_us + d.retry_after.as_micros() as u64,
                                ended: None,
                            });
                        }
                    }
                    let (times, lineage) = ((started, clock_us, end_us), (epochs[key], era));
                    let outcome = outcome(&verdict, by_policy);
                    let event = Event::check((i, inst, key, cost), times, lineage, outcome);
                    run.events.push(event);
                }
            }
            Op::Acquire {
                inst,
                key,
                cost,
                wait_ms,
                cancel_us,
            } => {
                let name = key_name(schedule, key);
                let started = Instant::now();
                let clock_us = clocks.now(inst);
                let deadline = started + Duration::from_millis(wait_ms);
                let acquire = BY_POLICY.scope(std::cell::Cell::new(false), async {
                    let acquired = fleet[inst]
                        .acquire_cost(name.as_str(), &quotas, cost, deadline)
                        .await;
                    (acquired, BY_POLICY.with(|marked| marked.get()))
                });
                let bound = match cancel_us {
                    Some(us) => Duration::from_micros(us),
                    None => Duration::from_millis(wait_ms) + BOUND,
                };
                let acquired = timeout(bound, acquire).await;
                if let Ok((Ok(verdict), by_policy)) = acquired {
                    let what = (i, inst, config.algorithm, "acquire");
                    let checked = (verdict, by_policy, None);
                    run.timed.push(Timed::new(what, started, &checked, None));
                }
                let outcome = match acquired {
                    Ok((Ok(verdict), false)) => outcome(&verdict, false),
                    // The policy answered a try: the last answer may be the store's.
                    Ok((Ok(verdict), true)) => match verdict {
                        Verdict::Decided(_) => Outcome::Unattributed {
                            allowed: verdict.is_allowed(),
                        },
                        _ => outcome(&verdict, true),
                    },
                    Ok((Err(_), _)) => Outcome::Denied,
                    Err(_) if cancel_us.is_some() => Outcome::Cancelled,
                    Err(_) => {
                        let what =
                            format!("instance {inst}: acquire still pending after {bound:?}");
                        run.hangs.push((i, what));
                        continue;
                    }
                };
                run.cancellations += u64::from(outcome == Outcome::Cancelled);
                let times = (started, clock_us, clocks.end(inst, skew_us));
                let event = Event::check((i, inst, key, cost), times, (epochs[key], era), outcome);
                run.events.push(event);
            }
            Op::Advance { ms } => clocks.advance(Duration::from_millis(ms)),
            Op::Edge { before_us } => {
                clocks.forward_to(edge(&manual, config.period_ms, before_us));
            }
            Op::StepBack { ms } => {
                let now = manual.now_micros();
                // docs/fleet.md ("Suspension"): denied "with `retry_after` = the time left
                // ... on Redis's clock (or the client clock if configured)", so a suspension
                // ends when the clock reaches its end. One whose end the slowest clock (the
                // operator's) has reached is over, and a step back does not bring it back (a
                // control or a reset since may have dropped it).
                let stepped = Instant::now();
                for s in run.suspensions.iter_mut().filter(|s| s.until_us <= now) {
                    s.ended.get_or_insert(stepped);
                }
                let back = (ms * 1_000).min(now - clock_start_us());
                clocks.back(back);
                skew_us += back;
                // The slowest instance's clock is then behind what the fastest stored by the
                // spread plus the steps.
                if Duration::from_micros(skew_us + spread_us) > Clock::MAX_SKEW {
                    // docs (Clock): "The state is repaired to `now` (no refill granted; a
                    // window of a later time reads as empty)": a new segment of every key.
                    era += 1;
                    skew_us = 0;
                    new_segments(&mut run, &mut epochs, &fleet, now - back);
                }
            }
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Reset { key, via } => {
                let name = key_name(schedule, key);
                let resetter = via.map_or(&operator, |inst| &fleet[inst]);
                let before: Vec<u64> = fleet.iter().map(|l| l.lease_stats().held).collect();
                // The segment starts no later than the call (the refill counts from there).
                let clock_us = manual.now_micros();
                if timeout(BOUND, resetter.reset(name.as_str())).await.is_err() {
                    run.hangs.push((i, "reset still pending".into()));
                }
                let at = Instant::now();
                // A renewal Redis ran before the reset may answer just after it.
                sleep(Duration::from_millis(30)).await;
                let mut held: Vec<u64> = fleet
                    .iter()
                    .zip(before)
                    .map(|(l, b)| l.lease_stats().held.max(b))
                    .collect();
                // docs/leases.md: "a lease ended by a reset this limiter runs" is stranded: the
                // resetting instance spends none of the units it held after its own reset.
                if let Some(inst) = via {
                    held[inst] = 0;
                }
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
            Op::Suspend { key, ms } | Op::Extend { key, ms } => {
                let extend = matches!(op, Op::Extend { .. });
                let started = Instant::now();
                // A suspension replaces the one in force (it may shorten it); an extension
                // keeps a later end.
                if !extend {
                    for s in run.suspensions.iter_mut().filter(|s| s.key == key) {
                        s.ended.get_or_insert(started);
                    }
                }
                let name = key_name(schedule, key);
                // The end counts from the call's clock, at least this one.
                let clock_us = manual.now_micros();
                let duration = Duration::from_millis(ms);
                let result = if extend {
                    timeout(BOUND, operator.extend_suspension(name.as_str(), duration)).await
                } else {
                    timeout(BOUND, operator.suspend(name.as_str(), duration)).await
                };
                match result {
                    Ok(Ok(_)) => run.suspensions.push(Suspension {
                        op: i,
                        key,
                        at: Instant::now(),
                        until_us: clock_us + ms * 1_000,
                        ended: None,
                    }),
                    Ok(Err(_)) => {}
                    Err(_) => run.hangs.push((i, format!("{op:?} still pending"))),
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
            Op::SetQuota { key, .. } | Op::ClearQuota { key } => {
                let started = Instant::now();
                let mut ended = Vec::new();
                for (n, o) in run.overrides.iter_mut().enumerate() {
                    if o.key == key && o.ended.is_none() {
                        o.ended = Some(started);
                        ended.push(n);
                    }
                }
                let name = key_name(schedule, key);
                let clock_us = manual.now_micros();
                let set = match *op {
                    Op::SetQuota { limit, .. } => Some(limit),
                    _ => None,
                };
                let result = match set {
                    Some(limit) => {
                        let quota = Quota::new(limit, Duration::from_millis(config.period_ms))
                            .expect("quota");
                        let quotas = Quotas::from(quota);
                        timeout(BOUND, operator.set_quota(name.as_str(), &quotas)).await
                    }
                    None => timeout(BOUND, operator.clear_quota(name.as_str())).await,
                };
                let sure = matches!(result, Ok(Ok(_)));
                if let Some(limit) = set {
                    run.overrides.push(Override {
                        op: i,
                        key,
                        limit,
                        started,
                        clock_us,
                        at: Instant::now(),
                        ended: None,
                        sure,
                    });
                }
                if !sure {
                    for n in ended {
                        run.overrides[n].ended = None;
                        run.overrides[n].sure = false;
                    }
                }
                if result.is_err() {
                    run.hangs.push((i, format!("{op:?} still pending")));
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
                fault(&mut run, redis, f, keys.clone(), config.backend).await;
                if f.loses_data() {
                    data_loss(&mut run, &mut epochs, &fleet, clock_us);
                }
            }
            _ => {}
        }
        sample(&mut run, &fleet);
    }
    if spread_us > 0 {
        run.stuck = recover(
            schedule,
            &fleet,
            &operator,
            &clocks,
            &quotas,
            !run.faults.is_empty(),
        )
        .await;
    }
    // Quiet: renewals and give-backs in flight land before the last sample.
    sleep(Duration::from_millis(300)).await;
    sample(&mut run, &fleet);
    run.health = tokio::task::spawn_blocking(move || monitor.stop())
        .await
        .expect("the monitor");
    if config.backend != Backend::Memory && !ran.iter().any(|op| matches!(op, Op::Fault(_))) {
        run.differences = differential(schedule, &ran, redis).await;
    }
    run
}

/// How long after the controls are lifted every instance must decide again on every key.
pub const RECOVERY: Duration = Duration::from_secs(3);

/// The recovery probe of a schedule with per-instance clocks: the controls are lifted (resume,
/// clear the override; `forget` drops a cached denial) and every clock moves past anything the
/// schedule stored (a period, the spread, `Clock::MAX_SKEW` and the largest step back, twice);
/// then each instance checks 1 on each key until the store admits it, for [`RECOVERY`] at most.
/// Returns the (instance, key, last outcome) never admitted.
async fn recover(
    schedule: &Schedule,
    fleet: &[Limiter],
    operator: &Limiter,
    clocks: &Clocks,
    quotas: &Quotas,
    faulted: bool,
) -> Vec<(usize, usize, String)> {
    let config = &schedule.config;
    if faulted {
        // A `DEBUG SLEEP` (under 900 ms) is over, a restarted server answers.
        sleep(Duration::from_secs(1)).await;
    }
    let past = 2 * (config.period_ms * 1_000 + Clock::MAX_SKEW.as_micros() as u64 + 120_000_000)
        + config.spread_us();
    clocks.advance(Duration::from_micros(past));
    let names: Vec<String> = (0..config.keys).map(|k| key_name(schedule, k)).collect();
    let mut pending: Vec<(usize, usize, String)> = (0..fleet.len())
        .flat_map(|inst| (0..config.keys).map(move |key| (inst, key, String::new())))
        .collect();
    let deadline = Instant::now() + RECOVERY;
    loop {
        for name in &names {
            let _ = timeout(BOUND, operator.resume(name.as_str())).await;
            let _ = timeout(BOUND, operator.clear_quota(name.as_str())).await;
        }
        let mut still = Vec::new();
        for (inst, key, _) in pending {
            let name = names[key].as_str();
            fleet[inst].forget(name);
            match timeout(BOUND, marked_check(&fleet[inst], name, quotas, 1)).await {
                Ok(Outcome::Allowed) => {}
                Ok(outcome) => still.push((inst, key, format!("{outcome:?}"))),
                Err(_) => still.push((inst, key, format!("pending after {BOUND:?}"))),
            }
        }
        if still.is_empty() || Instant::now() >= deadline {
            return still;
        }
        pending = still;
        sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the fault-free `ops` one check at a time, on Redis and on a `MemoryStore`, and lists
/// where the decisions differ. No leases, no deny cache (both answer as the store would, but
/// from a moment of their own). Both stores see the same manual clock for each pair of calls.
/// Redis expires a key in real time, from when its script ran, and the memory store on the
/// clock: so that Redis never drops a state the memory store still holds, the clock runs
/// ahead of real time by more than the latency between reading it and the script running
/// ([`DIFFERENTIAL_LEAD`] after each pair, plus the real time elapsed, plus the schedule's
/// steps forward; never back).
async fn differential(schedule: &Schedule, ops: &[Op], redis: &Fixture) -> Vec<String> {
    let config = &schedule.config;
    let manual = ManualClock::new(CLOCK_START);
    let build = |store: Option<MemoryStore>| {
        match store {
            Some(memory) => Limiter::builder(memory),
            None => Limiter::builder(redis.store(config.backend)),
        }
        .algorithm(config.algorithm)
        .clock(Clock::Manual(manual.clone()))
        .prefix(format!("d{}", schedule.seed))
        .failure_policy(FailClosed::default())
        .build()
        .expect("valid limiter")
    };
    let memory = MemoryStore::new();
    let pair = [build(None), build(Some(memory.clone()))];
    let quotas = quotas(config);
    let mut differences = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut last = Instant::now();
    let mut follow = |lead: Duration| {
        let now = Instant::now();
        manual.advance(now - last + lead);
        last = now;
    };
    for (i, op) in ops.iter().enumerate() {
        let key = match *op {
            Op::Burst { key, .. }
            | Op::Blocking { key, .. }
            | Op::Reset { key, .. }
            | Op::Suspend { key, .. }
            | Op::Extend { key, .. }
            | Op::Resume { key }
            | Op::SetQuota { key, .. }
            | Op::ClearQuota { key } => key_name(schedule, key),
            _ => String::new(),
        };
        let name = key.as_str();
        let calls = match *op {
            Op::Burst { n, .. } | Op::Blocking { n, .. } => n,
            Op::Reset { .. }
            | Op::Suspend { .. }
            | Op::Extend { .. }
            | Op::Resume { .. }
            | Op::SetQuota { .. }
            | Op::ClearQuota { .. } => 1,
            _ => 0,
        };
        for call in 0..calls {
            follow(Duration::ZERO);
            if let Op::SetQuota { .. } | Op::ClearQuota { .. } = *op {
                // The clock runs ahead of Redis's real time, so Redis still holds a state the
                // memory store let expire on the clock. Harmless under the quota that wrote it (it
                // decodes as fresh), but a token bucket or GCRA state read under another quota
                // refills or drains at the new rate from its last write: Redis would answer from
                // a stale usage the memory store rightly forgot. What the memory store dropped on
                // the clock goes from Redis too, before the quota changes.
                let now = manual.now_micros();
                let storage_key = pair[1].storage_key(name);
                let [log_controls, tenant] = redlimit::test_hooks::control_keys(&storage_key);
                let gone: Vec<String> = [storage_key, log_controls, tenant]
                    .into_iter()
                    .filter(|k| memory.stored_state(k, now).is_none())
                    .collect();
                redis.delete(config.backend, &gone);
            }
            let mut answers = Vec::new();
            let asked = Instant::now();
            for limiter in &pair {
                let answer = match *op {
                    Op::Burst { cost, .. } => {
                        format!("{:?}", limiter.check_quotas(name, &quotas, cost).await)
                    }
                    Op::Blocking { cost, block_ms, .. } => {
                        let block = BlockFor::new(Duration::from_millis(block_ms)).expect("block");
                        let verdict = limiter.check_blocking(name, &quotas, cost, &block).await;
                        format!("{verdict:?}")
                    }
                    Op::Reset { .. } => format!("{:?}", limiter.reset(name).await.map(|_| ())),
                    Op::Suspend { ms, .. } => {
                        let duration = Duration::from_millis(ms);
                        format!("{:?}", limiter.suspend(name, duration).await.map(|_| ()))
                    }
                    Op::Extend { ms, .. } => {
                        let duration = Duration::from_millis(ms);
                        let extended = limiter.extend_suspension(name, duration).await;
                        format!("{:?}", extended.map(|_| ()))
                    }
                    Op::Resume { .. } => {
                        format!("{:?}", limiter.resume(name).await.map(|_| ()))
                    }
                    Op::SetQuota { limit, .. } => {
                        let period = Duration::from_millis(config.period_ms);
                        let quota = Quota::new(limit, period).expect("quota");
                        let set = limiter.set_quota(name, &Quotas::from(quota)).await;
                        format!("{:?}", set.map(|_| ()))
                    }
                    _ => format!("{:?}", limiter.clear_quota(name).await.map(|_| ())),
                };
                if answers.is_empty() {
                    slowest = slowest.max(asked.elapsed());
                }
                answers.push(answer);
            }
            if answers[0] != answers[1] {
                differences.push(format!(
                    "op {i} {op:?}, call {call}: Redis {} / memory {}",
                    answers[0], answers[1]
                ));
            }
            follow(DIFFERENTIAL_LEAD.max(slowest * 2));
        }
        match *op {
            Op::Advance { ms } => manual.advance(Duration::from_millis(ms)),
            Op::Edge { before_us } => manual.set(edge(&manual, config.period_ms, before_us)),
            _ => {}
        }
    }
    differences
}

async fn concurrency<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    redis: &Fixture,
) -> Run {
    let config = &schedule.config;
    let (fleet, _) = limiters(schedule, redis, Clock::default(), false);
    let keys = storage_keys(schedule, &fleet[0]);
    let slots: Vec<ConcurrencyLimiter> = fleet
        .iter()
        .map(|l| ConcurrencyLimiter::with_options(l.clone(), config.limit, SLOT_LEASE, "c"))
        .collect::<Result<_, _>>()
        .expect("valid concurrency limiter");
    let in_flight: Arc<Vec<AtomicI64>> =
        Arc::new((0..config.keys).map(|_| AtomicI64::new(0)).collect());
    let over = Arc::new(Mutex::new(Vec::new()));
    let streams: Vec<_> = slots
        .iter()
        .map(|slots| stream_service(schedule, slots, &in_flight, &over))
        .collect();
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
            Op::Stream {
                inst,
                key,
                n,
                first_ms,
                chunks,
                chunk_ms,
                end,
            } => {
                for _ in 0..n {
                    let request = Request::builder()
                        .header("x-key", key_name(schedule, key))
                        .header("x-key-index", key)
                        .header("x-op", i)
                        .header("x-first", first_ms)
                        .header("x-chunks", u64::from(chunks))
                        .header("x-chunk-ms", chunk_ms)
                        .body(String::new())
                        .unwrap();
                    let (svc, hangs) = (streams[inst].clone(), hangs.clone());
                    run.cancellations += u64::from(end != BodyEnd::Read);
                    tasks.spawn(async move {
                        let bound = BOUND + Duration::from_millis(first_ms);
                        let call = svc.oneshot(request);
                        let response = match end {
                            BodyEnd::Future(us) => {
                                // Dropped with the future, or with the body at once.
                                let _ = timeout(Duration::from_micros(us), call).await;
                                return;
                            }
                            _ => match timeout(bound, call).await {
                                Ok(Ok(response)) => response,
                                Ok(Err(never)) => match never {},
                                Err(_) => {
                                    let what = format!(
                                        "instance {inst}: layer request still pending after {bound:?}"
                                    );
                                    hangs.lock().unwrap().push((i, what));
                                    return;
                                }
                            },
                        };
                        let frames = match end {
                            BodyEnd::BeforePoll => 0,
                            BodyEnd::After(frames) => frames,
                            _ => u8::MAX,
                        };
                        let mut body = response.into_body();
                        let read = async {
                            for _ in 0..frames {
                                if body.frame().await.is_none() {
                                    break;
                                }
                            }
                        };
                        let bound = BOUND + Duration::from_millis(chunk_ms * u64::from(chunks));
                        if timeout(bound, read).await.is_err() {
                            let what =
                                format!("instance {inst}: body still pending after {bound:?}");
                            hangs.lock().unwrap().push((i, what));
                        }
                    });
                }
                // Let the requests start before the next operation.
                sleep(Duration::from_millis(5)).await;
            }
            Op::Sleep { ms } => sleep(Duration::from_millis(ms)).await,
            Op::Fault(f) => fault(&mut run, redis, f, keys.clone(), config.backend).await,
            _ => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    done.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    run.stuck = free_again(schedule, &slots, !run.faults.is_empty()).await;
    run.over = std::mem::take(&mut *over.lock().unwrap());
    run.hangs
        .extend(std::mem::take(&mut *hangs.lock().unwrap()));
    run
}

/// One request in flight on its key, from the inner service's start until it is dropped: at
/// the end of its body, or with its response future or its body.
struct InFlight {
    in_flight: Arc<Vec<AtomicI64>>,
    key: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.in_flight[self.key].fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starts over the limit: (when, key, in flight, op).
type Over = Arc<Mutex<Vec<(Instant, usize, i64, usize)>>>;

/// A streaming body: `x-chunks` frames `x-chunk-ms` apart.
type Frames = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// The header `name` of `parts` as a number (0 when missing).
fn number(parts: &http::request::Parts, name: &str) -> u64 {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

/// A `ConcurrencyLimitLayer` on `slots` in front of a service that counts what is in flight
/// per key ([`InFlight`]) and records each start over the limit (in `over`), answering after
/// `x-first` ms with a streaming body.
fn stream_service(
    schedule: &Schedule,
    slots: &ConcurrencyLimiter,
    in_flight: &Arc<Vec<AtomicI64>>,
    over: &Over,
) -> impl Service<
    Request<String>,
    Response = Response<ConcurrencyBody<Frames>>,
    Error = Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    let key = FnKey::new(|parts: &http::request::Parts| {
        parts
            .headers
            .get("x-key")
            .and_then(|v| Some(v.to_str().ok()?.to_owned()))
    });
    let layer = ConcurrencyLimitLayer::new(slots.clone(), key, "c").expect("valid layer");
    let (in_flight, over) = (in_flight.clone(), over.clone());
    let limit = schedule.config.limit as i64;
    let inner = tower::service_fn(move |request: Request<String>| {
        let (in_flight, over) = (in_flight.clone(), over.clone());
        async move {
            let (parts, _) = request.into_parts();
            let key = number(&parts, "x-key-index") as usize;
            let now = in_flight[key].fetch_add(1, Ordering::SeqCst) + 1;
            let guard = InFlight { in_flight, key };
            if now > limit {
                let op = number(&parts, "x-op") as usize;
                over.lock().unwrap().push((Instant::now(), key, now, op));
            }
            sleep(Duration::from_millis(number(&parts, "x-first"))).await;
            let chunk = Duration::from_millis(number(&parts, "x-chunk-ms"));
            let chunks = number(&parts, "x-chunks");
            let frames =
                futures::stream::unfold((guard, chunks), move |(guard, left)| async move {
                    if left == 0 {
                        // The body ends: the request is no longer in flight.
                        drop(guard);
                        return None;
                    }
                    sleep(chunk).await;
                    let frame = Frame::data(Bytes::from_static(b"x"));
                    Some((Ok(frame), (guard, left - 1)))
                });
            Ok::<_, Infallible>(Response::new(StreamBody::new(frames.boxed())))
        }
    });
    ServiceBuilder::new().layer(layer).service(inner)
}

/// docs/modes.md: a slot is held until the response body ends "or its future or body is
/// dropped"; one not given back is "left to its lease, which has ended by then" (a lease after
/// it was queued). Once every request has ended and a lease (plus 300 ms, and a second after
/// a fault) has passed, each key takes N slots again on one instance, within `RECOVERY`.
/// Returns the (instance, key, what) that did not.
async fn free_again(
    schedule: &Schedule,
    slots: &[ConcurrencyLimiter],
    faulted: bool,
) -> Vec<(usize, usize, String)> {
    let config = &schedule.config;
    let mut wait = SLOT_LEASE + Duration::from_millis(300);
    if faulted {
        wait += Duration::from_secs(1);
    }
    sleep(wait).await;
    let deadline = Instant::now() + RECOVERY;
    let mut stuck = Vec::new();
    for key in 0..config.keys {
        let name = key_name(schedule, key);
        loop {
            let mut held = Vec::new();
            let mut last = String::new();
            for _ in 0..config.limit {
                match timeout(BOUND, slots[0].acquire(&name)).await {
                    Ok(SlotOutcome::Acquired(slot)) => held.push(slot),
                    Ok(other) => last = format!("{other:?}"),
                    Err(_) => last = format!("pending after {BOUND:?}"),
                }
            }
            let got = held.len();
            drop(held);
            if got as u64 == config.limit {
                break;
            }
            if Instant::now() >= deadline {
                let what = format!("{got} of {} slots taken; then {last}", config.limit);
                stuck.push((0, key, what));
                break;
            }
            sleep(Duration::from_millis(200)).await;
        }
    }
    stuck
}

/// The settlement schedules' inner service: answers after the request's `x-hold` ms with its
/// `x-used` units, and records each admitted request.
/// With each, whether a `ShadowLimited` was in its extensions (shadow tiers).
type Admitted = Arc<Mutex<Vec<(Event, bool)>>>;

async fn settle<'a>(
    schedule: &Schedule,
    ops: impl Iterator<Item = &'a Op>,
    redis: &Fixture,
) -> Run {
    let config = &schedule.config;
    let manual = ManualClock::new(CLOCK_START);
    let _follow = Follow::start(&manual);
    let (fleet, _) = limiters(schedule, redis, Clock::Manual(manual.clone()), false);
    let keys = storage_keys(schedule, &fleet[0]);
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
            let builder = RateLimitLayer::builder(limiter.clone(), quotas(config), key)
                .cost(move |parts| header(parts, "x-reserve"));
            let builder = match config.settlement {
                Settlement::Status => builder.cost_from_status([StatusCode::UNAUTHORIZED]),
                Settlement::Response | Settlement::Shadow | Settlement::ShadowTiers => builder
                    .cost_from_response(move |response| {
                        response
                            .headers()
                            .get("x-used")
                            .and_then(|v| v.to_str().ok()?.parse().ok())
                            .unwrap_or(u64::MAX)
                    }),
            };
            let builder = match config.settlement {
                Settlement::ShadowTiers => {
                    let period = Duration::from_millis(config.period_ms);
                    let tier = Quota::new(config.shadow_limit, period).expect("quota");
                    builder.shadow_quotas(tier)
                }
                _ => builder,
            };
            let shadow = config.settlement == Settlement::Shadow;
            let layer = builder.shadow(shadow).build().expect("valid layer");
            let (admitted, manual) = (admitted.clone(), manual.clone());
            let inner = tower::service_fn(move |request: Request<String>| {
                let (admitted, manual) = (admitted.clone(), manual.clone());
                async move {
                    let (parts, _) = request.into_parts();
                    let clock_us = header(&parts, "x-clock");
                    let limited = parts.extensions.get::<ShadowLimited>().is_some();
                    admitted.lock().unwrap().push((
                        Event {
                            op: header(&parts, "x-op") as usize,
                            inst,
                            key: header(&parts, "x-key-index") as usize,
                            cost: header(&parts, "x-reserve"),
                            used: header(&parts, "x-used"),
                            clock_us,
                            end_us: manual.now_micros(),
                            epoch: 0,
                            era: 0,
                            started: Instant::now(),
                            outcome: Outcome::Allowed,
                        },
                        limited,
                    ));
                    sleep(Duration::from_millis(header(&parts, "x-hold"))).await;
                    let mut response = Response::new(String::new());
                    if header(&parts, "x-status") == 401 {
                        *response.status_mut() = StatusCode::UNAUTHORIZED;
                    }
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
    let refused = Arc::new(Mutex::new(Vec::new()));
    let numbers = Arc::new(Mutex::new(Vec::new()));
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
                // By status, a 401 costs the reservation and anything else nothing.
                let (used, status) = match config.settlement {
                    Settlement::Status if used > 0 => (reserve, 401),
                    Settlement::Status => (0, 200),
                    _ => (used, 200),
                };
                for _ in 0..n {
                    let request = Request::builder()
                        .header("x-status", status)
                        .header("x-key", key_name(schedule, key))
                        .header("x-key-index", key)
                        .header("x-op", i)
                        .header("x-reserve", reserve)
                        .header("x-used", used)
                        .header("x-hold", hold_ms)
                        .header("x-clock", manual.now_micros())
                        .body(String::new())
                        .unwrap();
                    let (svc, hangs, refused, numbers) = (
                        services[inst].clone(),
                        hangs.clone(),
                        refused.clone(),
                        numbers.clone(),
                    );
                    let shadow = config.settlement == Settlement::Shadow;
                    tasks.spawn(async move {
                        let bound = BOUND + Duration::from_millis(hold_ms);
                        match timeout(bound, svc.oneshot(request)).await {
                            Ok(Ok(response)) => {
                                if let Some((r, q)) = header_numbers(response.headers()) {
                                    numbers.lock().unwrap().push((i, inst, r, q));
                                }
                                let status = response.status();
                                assert!(
                                    status == StatusCode::OK
                                        || status == StatusCode::UNAUTHORIZED
                                        || status.as_u16() == 429
                                        || status.as_u16() == 503,
                                    "{status}"
                                );
                                if shadow && (status.as_u16() == 429 || status.as_u16() == 503) {
                                    refused.lock().unwrap().push((i, inst, status.as_u16()));
                                }
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
                fault(&mut run, redis, f, keys.clone(), config.backend).await;
                if f.loses_data() {
                    let mut epochs = vec![0; config.keys];
                    data_loss(&mut run, &mut epochs, &fleet, clock_us);
                }
            }
            _ => {}
        }
    }
    while tasks.join_next().await.is_some() {}
    (run.events, run.shadow_limited) = std::mem::take(&mut *admitted.lock().unwrap())
        .into_iter()
        .unzip();
    run.shadow_counted = fleet.iter().map(|l| l.stats().shadow_limited).collect();
    run.refused_in_shadow = std::mem::take(&mut *refused.lock().unwrap());
    run.headers = std::mem::take(&mut *numbers.lock().unwrap());
    run.hangs
        .extend(std::mem::take(&mut *hangs.lock().unwrap()));
    run
}

/// `r` of a response's `RateLimit` field, and `q` of the policy it names in `RateLimit-Policy`
/// (docs/headers.md: `"name";r=1;t=40` and `"name";q=3;w=60`).
fn header_numbers(headers: &http::HeaderMap) -> Option<(u64, u64)> {
    let state = headers.get("ratelimit")?.to_str().ok()?;
    let policy = headers.get("ratelimit-policy")?.to_str().ok()?;
    let mut params = state.split(';');
    let name = params.next()?.trim();
    let r = params.find_map(|p| p.trim().strip_prefix("r=")?.parse().ok())?;
    let q = policy.split(',').find_map(|item| {
        let mut params = item.split(';');
        (params.next()?.trim() == name).then_some(())?;
        params.find_map(|p| p.trim().strip_prefix("q=")?.parse().ok())
    })?;
    Some((r, q))
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
            Op::Fault(f) => fault(&mut run, redis, *f, Vec::new(), Backend::Redis).await,
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
