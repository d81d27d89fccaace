//! Fault tests: real `redis-server` processes misbehave while 16 concurrent workers send
//! requests through the `RateLimitLayer`.
//!
//! Each test prints its figures (status mix, worst latency, recovery time); see them with
//! `cargo test --test it store_faults:: -- --nocapture`. Latency bounds are the store timeout
//! (100 ms) plus a 400 ms margin, so that a busy 2-core CI machine does not make them flaky;
//! the real worst figures are printed.

mod load;
use crate::support;

use std::convert::Infallible;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::FutureExt;
use http::{Request, Response};
use load::{ms, Load, Run};
use redlimit::key::GlobalKey;
use redlimit::store::{CircuitBreaker, RedisStore};
use redlimit::{
    failure_policy::{FailClosed, FailOpen, LocalFallback},
    Limiter, Quota, RateLimitLayer, Verdict,
};
use support::{Ctx, RedisServer};
use tokio::time::sleep;
use tower::{service_fn, Layer};

/// The store's default per-call timeout.
const TIMEOUT: Duration = Duration::from_millis(100);
/// Added to [`TIMEOUT`] in latency assertions (scheduling on a loaded machine).
const MARGIN: Duration = Duration::from_millis(400);
/// How soon after Redis is back the app must enforce again.
const RECOVERY: Duration = Duration::from_secs(2);
/// Concurrent workers of the load.
const WORKERS: usize = 16;
/// Consecutive store decisions that count as "steadily enforcing again".
const STEADY: usize = 100;
/// The quota of the load: 200/s for one global key, far less than the load sends, so 429s
/// show that Redis is enforcing.
fn quota() -> Quota {
    Quota::per_second(200).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Open,
    Closed,
}

impl Policy {
    /// Both policies, for the tests that run once under each.
    const BOTH: [Policy; 2] = [Policy::Open, Policy::Closed];

    fn limiter(self, store: RedisStore) -> Limiter {
        self.ctx().limiter(store)
    }

    /// Limiters under this policy (the default algorithm and clock).
    fn ctx(self) -> Ctx {
        match self {
            Policy::Open => Ctx::default().failure_policy(FailOpen),
            Policy::Closed => Ctx::default().failure_policy(FailClosed::default()),
        }
    }

    /// What every request gets while Redis is away.
    fn outage_status(self) -> u16 {
        match self {
            Policy::Open => 200,
            Policy::Closed => 503,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Policy::Open => "FailOpen",
            Policy::Closed => "FailClosed",
        }
    }
}

async fn hello(_request: Request<()>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

/// Starts the load: [`WORKERS`] workers through the layer (one global key) for at most `max`.
fn start_load(limiter: &Limiter, max: Duration) -> Load {
    let app = RateLimitLayer::new(limiter.clone(), quota(), GlobalKey::new("faults"))
        .layer(service_fn(hello));
    Load::start(app, WORKERS, max)
}

/// Waits until the store answers (connected, script loaded), so that the load starts in a
/// steady state.
async fn warm_up(limiter: &Limiter) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match limiter
            .try_check_quotas("warm-up", &quota().into(), 0)
            .await
        {
            Ok(_) => return,
            Err(e) if Instant::now() > deadline => panic!("Redis never answered: {e}"),
            Err(_) => sleep(Duration::from_millis(20)).await,
        }
    }
}

/// A server of its own, a warmed-up `FailClosed` limiter on it, and a load of at most 10 s
/// through it, 600 ms in (steady).
async fn closed_under_load() -> (RedisServer, Limiter, Load) {
    let redis = RedisServer::start();
    let limiter = Policy::Closed.limiter(RedisStore::new(redis.url()).unwrap());
    warm_up(&limiter).await;
    let load = start_load(&limiter, Duration::from_secs(10));
    sleep(Duration::from_millis(600)).await;
    (redis, limiter, load)
}

/// A limiter on `redis` whose calls wait up to 2 s, with no circuit breaker: for the tests
/// that count errors or need a long stall answered, not for latency.
fn patient_limiter(redis: &RedisServer) -> Limiter {
    Ctx::default()
        .timeout(Duration::from_secs(2))
        .without_breaker()
        .redis(redis)
}

/// Runs a blocking harness call (stop, restart, INFO, ...) without stalling the load.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Figures of one test, printed in one piece (tests run in parallel).
struct Report(String);

impl Report {
    fn new(title: &str) -> Report {
        Report(format!("\n=== {title} ===\n"))
    }

    fn line(&mut self, label: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.0, "  {label:<32} {value}");
    }

    /// How long after `from` the time `at` came, or `never`.
    fn after(&mut self, label: &str, from: Duration, at: Option<Duration>) {
        self.line(label, at.map_or("never".into(), |t| since(from, t)));
    }

    /// The lines every load test ends with (the whole run, when the store decided steadily
    /// again after `from`, the limiter's counters), then prints the report.
    fn close(mut self, run: &Run, from: Duration, steady: Option<Duration>, limiter: &Limiter) {
        self.line("whole run", run.all());
        self.after("steadily enforcing after", from, steady);
        self.line("limiter stats", format!("{:?}", limiter.stats()));
        self.print();
    }

    fn print(&self) {
        println!("{}", self.0);
    }
}

/// Checked just before a stopped server restarts: did another test process start its own
/// Redis on our port meanwhile? (The harness hands ports out per process, and a stopped
/// server's port is free.) Then the outage was not one, and the assertions say so.
fn port_taken_note(redis: &RedisServer) -> String {
    let addr = ([127, 0, 0, 1], redis.port()).into();
    match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
        Ok(_) => format!(
            " [NOTE: while our Redis was down, something else listened on its port {} \
             (another test process's Redis?): the outage was not one]",
            redis.port()
        ),
        Err(_) => String::new(),
    }
}

fn since(at: Duration, later: Duration) -> String {
    ms(later.saturating_sub(at))
}

/// When a stopped server was restarted under load, and what was seen just before.
struct Restart {
    /// The note of [`port_taken_note`], taken just before the restart.
    taken: String,
    /// When the restart began, on the load's clock.
    at: Duration,
    /// When Redis answered again.
    up_at: Duration,
}

/// Restarts the stopped `redis` while `load` runs, lets the load run 2.5 s more, and finishes it.
async fn restart_then_finish(redis: &mut RedisServer, load: Load) -> (Run, Restart) {
    let taken = blocking(|| port_taken_note(redis));
    let at = load.elapsed();
    blocking(|| redis.restart());
    let up_at = load.elapsed();
    sleep(Duration::from_millis(2500)).await;
    (load.finish().await, Restart { taken, at, up_at })
}

/// The app enforced again (`enforcing`, when it first did) within `RECOVERY` of `from`, the
/// end of the fault `after` names.
fn assert_recovered(enforcing: Option<Duration>, from: Duration, after: &str) {
    let enforcing = enforcing.unwrap_or_else(|| panic!("the app enforces again {after}"));
    assert!(
        enforcing.saturating_sub(from) < RECOVERY,
        "enforcing again {} {after}",
        since(from, enforcing)
    );
}

/// Every request of `run` from `from` to `to`, while Redis was down, got the policy's outcome
/// (`taken`: the note of [`port_taken_note`]).
fn assert_policy_answered(run: &Run, from: Duration, to: Duration, policy: Policy, taken: &str) {
    for sample in run.between(from, to) {
        assert_eq!(
            (sample.status, sample.limited),
            (policy.outage_status(), false),
            "{}: every request while Redis is down gets the policy's outcome: {sample:?}{taken}",
            policy.name()
        );
    }
}

/// No request hung, and none waited longer than the timeout plus the margin.
fn assert_bounded(run: &Run, what: &str) {
    let all = run.all();
    assert_eq!(all.hung, 0, "{what}: requests hung: {all}");
    assert!(
        all.worst < TIMEOUT + MARGIN,
        "{what}: a request waited {} (bound {}): {all}",
        ms(all.worst),
        ms(TIMEOUT + MARGIN)
    );
}

/// `kill -9` of Redis under load: every request during the outage gets the policy's outcome
/// within the timeout; then Redis restarts and the running app enforces again within 2 s.
async fn kill_then_restart(policy: Policy) {
    let mut redis = RedisServer::start();
    let store = RedisStore::new(redis.url()).unwrap();
    assert_eq!(store.timeout(), TIMEOUT);
    let limiter = policy.limiter(store);
    warm_up(&limiter).await;

    let load = start_load(&limiter, Duration::from_secs(15));
    sleep(Duration::from_millis(700)).await;
    let kill_at = load.elapsed();
    blocking(|| redis.stop());
    let dead_at = load.elapsed();
    sleep(Duration::from_millis(1200)).await;
    let (run, restart) = restart_then_finish(&mut redis, load).await;
    let evalsha = blocking(|| redis.command_calls("evalsha"));

    let before = run.slice(Duration::ZERO, kill_at);
    let outage = run.slice(dead_at, restart.at);
    let first_429 = run.first_answer(restart.at, 429).map(|s| s.end());
    let steady = run.steady_from(restart.at, STEADY);
    let mut report = Report::new(&format!("kill -9, then restart ({})", policy.name()));
    report.line("before the kill", before);
    report.line("while killing", run.slice(kill_at, dead_at));
    report.line("outage", outage);
    report.line(
        "restart (Redis loading)",
        run.slice(restart.at, restart.up_at),
    );
    report.line("after the restart", run.slice(restart.up_at, run.end()));
    report.line("restart() took", since(restart.at, restart.up_at));
    report.after("first 429 after restart", restart.up_at, first_429);
    report.line("evalsha calls since restart", evalsha);
    report.close(&run, restart.up_at, steady, &limiter);

    assert!(
        before.too_many > 0,
        "Redis enforced before the kill: {before}"
    );
    assert!(outage.total > 0, "the load ran during the outage");
    assert_policy_answered(&run, dead_at, restart.at, policy, &restart.taken);
    assert_bounded(&run, "kill -9");
    assert_recovered(first_429, restart.up_at, "after the restart");
    assert!(evalsha > 0, "the restarted Redis receives the checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_then_restart_under_each_policy() {
    for policy in Policy::BOTH {
        kill_then_restart(policy).await;
    }
}

/// `DEBUG SLEEP 1` under load: requests started while Redis sleeps get the policy's outcome
/// (503 with `FailClosed`) within the timeout, and enforcement resumes after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debug_sleep_1_answers_within_the_timeout() {
    let (redis, limiter, load) = closed_under_load().await;
    let send_at = load.elapsed();
    let sleeper = blocking(|| redis.debug_sleep(Duration::from_secs(1)));
    let sent_at = load.elapsed();
    tokio::task::spawn_blocking(move || sleeper.join())
        .await
        .unwrap()
        .unwrap();
    let woke_at = load.elapsed();
    sleep(Duration::from_millis(2000)).await;
    let run = load.finish().await;

    // Redis slept for 1 s somewhere in [send_at, woke_at]: it surely slept from
    // `woke_at - 1 s` to `send_at + 1 s`. A request started in there, at least a timeout
    // before the end, cannot have had an answer from Redis in time.
    let asleep_from = woke_at.saturating_sub(Duration::from_secs(1)).max(sent_at);
    let asleep_until = send_at + Duration::from_secs(1) - TIMEOUT;
    let asleep = run.slice(asleep_from, asleep_until);
    let first_429 = run.first_answer(woke_at, 429).map(|s| s.end());
    let steady = run.steady_from(woke_at, STEADY);
    let mut report = Report::new("DEBUG SLEEP 1 (FailClosed)");
    report.line("before the sleep", run.slice(Duration::ZERO, send_at));
    report.line("sleeping (whole 1 s)", run.slice(send_at, woke_at));
    report.line("surely asleep", asleep);
    report.line("after waking", run.slice(woke_at, run.end()));
    report.after("first 429 after waking", woke_at, first_429);
    report.close(&run, woke_at, steady, &limiter);

    assert!(asleep.total > 0, "the load ran while Redis slept");
    assert_eq!(
        asleep.unavailable, asleep.total,
        "while Redis sleeps every request gets FailClosed's 503: {asleep}"
    );
    assert_bounded(&run, "DEBUG SLEEP 1");
    assert_recovered(first_429, woke_at, "after the sleep");
}

/// `SCRIPT FLUSH` (three times) under load: the scripts reload by themselves, no store error,
/// every response 200 or 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_under_load_has_no_errors() {
    let redis = RedisServer::start();
    // Errors are what this test measures, not latency: a generous timeout keeps a loaded
    // machine from turning a slow reply into a store error.
    let limiter = Policy::Closed
        .ctx()
        .timeout(Duration::from_secs(2))
        .redis(&redis);
    warm_up(&limiter).await;

    let load = start_load(&limiter, Duration::from_secs(10));
    sleep(Duration::from_millis(500)).await;
    blocking(|| redis.reset_stats());
    let first_flush_at = load.elapsed();
    for _ in 0..3 {
        blocking(|| redis.script_flush());
        sleep(Duration::from_millis(400)).await;
    }
    let run = load.finish().await;
    let (evalsha, loads) = script_calls(&redis);
    let stats = limiter.stats();

    let mut report = Report::new("SCRIPT FLUSH x3 (FailClosed)");
    report.line("before", run.slice(Duration::ZERO, first_flush_at));
    report.line("flushing", run.slice(first_flush_at, run.end()));
    report.line("whole run", run.all());
    report.line("evalsha / script load", format!("{evalsha} / {loads}"));
    report.line("limiter stats", format!("{stats:?}"));
    report.print();

    assert_eq!(stats.store_errors, 0, "no store error: {stats:?}");
    let all = run.all();
    assert_eq!(
        all.ok_checked + all.too_many,
        all.total,
        "only 200/429: {all}"
    );
    assert!(all.too_many > 0, "Redis enforced: {all}");
    assert!(loads >= 1, "the NOSCRIPT path ran (script loads: {loads})");
}

/// `SCRIPT FLUSH` every millisecond while 16 callers check: a flush can land between the reload
/// and the retry, so the NOSCRIPT path must not depend on the reload surviving. No call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_every_millisecond_has_no_errors() {
    let redis = RedisServer::start();
    // Errors are what this test measures, not latency.
    let limiter = patient_limiter(&redis);
    let quota = Quota::per_second(1_000_000).unwrap();
    limiter
        .try_check_quotas("warm", &quota.into(), 1)
        .await
        .expect("warm-up");
    blocking(|| redis.reset_stats());

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let (stop, client) = (stop.clone(), redis.client());
        tokio::spawn(async move {
            let mut connection = client.get_multiplexed_async_connection().await.unwrap();
            let mut flushes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: () = redis::cmd("SCRIPT")
                    .arg("FLUSH")
                    .query_async(&mut connection)
                    .await
                    .expect("SCRIPT FLUSH");
                flushes += 1;
                sleep(Duration::from_millis(1)).await;
            }
            flushes
        })
    };
    let workers = (0..WORKERS).map(|w| {
        let limiter = limiter.clone();
        async move {
            let mut errors = Vec::new();
            for i in 0..250 {
                if let Err(e) = limiter
                    .try_check_quotas(&format!("w{w}-{i}"), &quota.into(), 1)
                    .await
                {
                    errors.push(e.to_string());
                }
            }
            errors
        }
    });
    let errors: Vec<String> = join_all(workers).await.into_iter().flatten().collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flushes = flusher.await.unwrap();
    let (evalsha, eval, loads) = blocking(|| {
        (
            redis.command_calls("evalsha"),
            redis.command_calls("eval"),
            redis.command_calls("script|load"),
        )
    });
    println!(
        "SCRIPT FLUSH every 1 ms, {WORKERS} callers x 250 checks: {} errors, {flushes} flushes, \
         evalsha {evalsha}, script load {loads}, eval {eval}",
        errors.len()
    );
    assert!(flushes >= 50, "the flusher ran ({flushes} flushes)");
    assert!(loads >= 1, "the NOSCRIPT path ran (script loads: {loads})");
    assert!(
        errors.is_empty(),
        "{} errors: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
}

/// `CLIENT KILL TYPE normal` under load: the connection is dropped under the app, which
/// reconnects by itself and enforces again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_kill_recovers() {
    let (redis, limiter, load) = closed_under_load().await;
    let kill_at = load.elapsed();
    blocking(|| redis.client_kill_normal());
    let killed_at = load.elapsed();
    sleep(Duration::from_millis(2000)).await;
    let run = load.finish().await;

    let disrupted: Vec<_> = run
        .between(kill_at, run.end())
        .filter(|s| !s.store_decided())
        .collect();
    let last_disrupted = disrupted.iter().map(|s| s.end()).max();
    let steady = run.steady_from(kill_at, STEADY);
    let mut report = Report::new("CLIENT KILL TYPE normal (FailClosed)");
    report.line("before", run.slice(Duration::ZERO, kill_at));
    report.line("after the kill", run.slice(kill_at, run.end()));
    report.line("CLIENT KILL took", since(kill_at, killed_at));
    report.line("requests disrupted", disrupted.len());
    report.line(
        "last disrupted answer",
        last_disrupted.map_or("none".into(), |t| since(kill_at, t)),
    );
    report.close(&run, kill_at, steady, &limiter);

    assert_bounded(&run, "CLIENT KILL");
    assert_recovered(steady, kill_at, "after CLIENT KILL");
    let steady = steady.expect("checked just above");
    assert!(run.slice(steady, run.end()).too_many > 0);
}

/// The app starts while Redis is down: it serves per policy without waiting, then enforces
/// once Redis is up.
async fn started_while_down(policy: Policy) {
    let mut redis = RedisServer::start();
    redis.stop();
    let limiter = policy.limiter(RedisStore::new(redis.url()).unwrap());

    let load = start_load(&limiter, Duration::from_secs(10));
    sleep(Duration::from_millis(1000)).await;
    let (run, restart) = restart_then_finish(&mut redis, load).await;

    let down = run.slice(Duration::ZERO, restart.at);
    let first_429 = run.first_answer(restart.at, 429).map(|s| s.end());
    let steady = run.steady_from(restart.at, STEADY);
    let mut report = Report::new(&format!("started while Redis is down ({})", policy.name()));
    report.line("Redis down", down);
    report.line("Redis up", run.slice(restart.up_at, run.end()));
    report.line("restart() took", since(restart.at, restart.up_at));
    report.after("first 429 after Redis is up", restart.up_at, first_429);
    report.close(&run, restart.up_at, steady, &limiter);

    assert!(down.total > 0);
    assert_policy_answered(&run, Duration::ZERO, restart.at, policy, &restart.taken);
    assert_bounded(&run, "started while down");
    assert_recovered(first_429, restart.up_at, "once Redis is up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn started_while_down_under_each_policy() {
    for policy in Policy::BOTH {
        started_while_down(policy).await;
    }
}

// ---- circuit breaker ----

/// One check of the breaker tests' key.
async fn probe_check(limiter: &Limiter) -> Verdict {
    limiter.check("breaker", &quota()).await
}

/// A FailClosed limiter on a store with a breaker of 3 failures, and the store (for
/// `circuit_open`).
fn breaker_limiter(redis: &RedisServer, cool_down: Duration) -> (Limiter, RedisStore) {
    let store = Ctx::default()
        .timeout(TIMEOUT)
        .breaker(CircuitBreaker {
            failure_threshold: 3,
            cool_down,
        })
        .redis_store(redis);
    (Policy::Closed.limiter(store.clone()), store)
}

/// Opens the circuit: Redis sleeps 600 ms and concurrent calls time out until it opens.
/// Returns the instants between which it opened; Redis is awake again on return.
async fn open_circuit(
    redis: &RedisServer,
    limiter: &Limiter,
    store: &RedisStore,
) -> (Instant, Instant) {
    let sleeper = blocking(|| redis.debug_sleep(Duration::from_millis(600)));
    // Let Redis pick the command up before calling it.
    sleep(Duration::from_millis(50)).await;
    let mut calls_at;
    loop {
        calls_at = Instant::now();
        join_all((0..3).map(|_| probe_check(limiter))).await;
        if store.circuit_open() {
            break;
        }
        assert!(
            calls_at.elapsed() < Duration::from_secs(5),
            "the circuit never opened"
        );
    }
    let opened_by = Instant::now();
    tokio::task::spawn_blocking(move || sleeper.join())
        .await
        .unwrap()
        .unwrap();
    (calls_at, opened_by)
}

/// A breaker limiter (`cool_down`) on a server of its own, its circuit just opened by
/// [`open_circuit`].
struct Opened {
    redis: RedisServer,
    limiter: Limiter,
    store: RedisStore,
    /// When the calls that opened the circuit started.
    calls_at: Instant,
    /// By when it was open.
    opened_by: Instant,
}

async fn opened(cool_down: Duration) -> Opened {
    let redis = RedisServer::start();
    let (limiter, store) = breaker_limiter(&redis, cool_down);
    warm_up(&limiter).await;
    let (calls_at, opened_by) = open_circuit(&redis, &limiter, &store).await;
    Opened {
        redis,
        limiter,
        store,
        calls_at,
        opened_by,
    }
}

/// Zeroes Redis's command counts once the calls that timed out while the circuit opened have
/// run (they run when Redis wakes), so that what follows is counted alone.
async fn count_from_now(redis: &RedisServer) {
    sleep(Duration::from_millis(100)).await;
    blocking(|| redis.reset_stats());
}

/// The `EVALSHA` and `SCRIPT LOAD` calls Redis served (since its counts were last zeroed).
fn script_calls(redis: &RedisServer) -> (u64, u64) {
    blocking(|| {
        (
            redis.command_calls("evalsha"),
            redis.command_calls("script|load"),
        )
    })
}

/// While the circuit is open Redis receives no call at all; after the cool-down one probe
/// reaches it and closes the circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn open_circuit_sends_nothing_to_redis_during_the_cool_down() {
    let cool_down = Duration::from_secs(2);
    let open = opened(cool_down).await;
    let (redis, limiter, store) = (&open.redis, &open.limiter, &open.store);
    let (calls_at, opened_by) = (open.calls_at, open.opened_by);
    count_from_now(redis).await;

    // The circuit opened after `calls_at + TIMEOUT`: it is surely open until
    // `calls_at + TIMEOUT + cool_down`. Call hard until well before that.
    let skip_until = calls_at + cool_down - Duration::from_millis(300);
    let skip_from = Instant::now();
    let mut skipped = 0;
    let mut worst = Duration::ZERO;
    while Instant::now() < skip_until {
        let calls = (0..16).map(|_| async {
            let started = Instant::now();
            let verdict = probe_check(limiter).await;
            (verdict, started.elapsed())
        });
        for (verdict, latency) in join_all(calls).await {
            assert!(
                matches!(verdict, Verdict::FailedClosed { .. }),
                "an open circuit goes straight to the policy: {verdict:?}"
            );
            skipped += 1;
            worst = worst.max(latency);
        }
        sleep(Duration::from_millis(10)).await;
    }
    let skip_for = skip_from.elapsed();
    let evalsha_open = blocking(|| redis.command_calls("evalsha"));
    let open_during_skip = store.circuit_open();

    // Surely over by `opened_by + cool_down`.
    tokio::time::sleep_until((opened_by + cool_down + Duration::from_millis(50)).into()).await;
    let probe_at = Instant::now();
    let probe = probe_check(limiter).await;
    let probe_latency = probe_at.elapsed();
    let closed = !store.circuit_open();
    let (evalsha_probe, loads) = script_calls(redis);
    let after: Vec<Verdict> = join_all((0..16).map(|_| probe_check(limiter))).await;

    let mut report = Report::new("circuit breaker: no Redis calls during the cool-down");
    report.line(
        "breaker",
        format!("threshold 3, cool-down {}", ms(cool_down)),
    );
    report.line(
        "calls while open",
        format!("{skipped} over {}, all FailClosed", ms(skip_for)),
    );
    report.line("worst latency while open", ms(worst));
    report.line("evalsha calls while open", evalsha_open);
    report.line("probe", format!("{probe:?} in {}", ms(probe_latency)));
    report.line(
        "evalsha / script load",
        format!("{evalsha_probe} / {loads}"),
    );
    report.line("circuit closed after probe", closed);
    report.print();

    assert!(skipped > 100, "calls were made while open ({skipped})");
    assert!(open_during_skip, "the circuit stayed open");
    assert_eq!(
        evalsha_open, 0,
        "no call reaches Redis during the cool-down"
    );
    assert!(
        worst < TIMEOUT,
        "an open circuit answers without waiting: {}",
        ms(worst)
    );
    assert!(
        matches!(probe, Verdict::Decided(d) if d.allowed),
        "the probe reaches Redis: {probe:?}"
    );
    assert!(closed, "a successful probe closes the circuit");
    assert!(evalsha_probe >= 1, "the probe reached Redis");
    assert!(after.iter().all(|v| matches!(v, Verdict::Decided(_))));
}

/// Right after the cool-down, of many concurrent callers exactly one probes Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_probe_at_a_time() {
    let cool_down = Duration::from_millis(1000);
    let open = opened(cool_down).await;
    let (redis, limiter, store) = (&open.redis, &open.limiter, &open.store);
    count_from_now(redis).await;
    tokio::time::sleep_until((open.opened_by + cool_down + Duration::from_millis(50)).into()).await;
    assert!(store.circuit_open(), "no call since it opened: still open");

    let callers = 64;
    // Redis holds the probe's reply for a while (well within the timeout), so that every
    // caller arrives while the probe is in flight: a probe answered before the last caller
    // came would close the circuit, and that caller would rightly go to Redis.
    blocking(|| {
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(50)
            .arg("ALL")
            .query(&mut redis.conn())
            .expect("CLIENT PAUSE");
    });
    let verdicts = join_all((0..callers).map(|_| probe_check(limiter))).await;
    let decided = verdicts
        .iter()
        .filter(|v| matches!(v, Verdict::Decided(_)))
        .count();
    let skipped = verdicts
        .iter()
        .filter(|v| matches!(v, Verdict::FailedClosed { .. }))
        .count();
    let (evalsha, loads) = script_calls(redis);

    let mut report = Report::new("circuit breaker: one probe at a time");
    report.line("concurrent callers", callers);
    report.line("decided by Redis (probe)", decided);
    report.line("sent to the policy", skipped);
    report.line("evalsha / script load", format!("{evalsha} / {loads}"));
    report.line("circuit closed", !store.circuit_open());
    report.print();

    assert_eq!(decided, 1, "exactly one probe: {verdicts:?}");
    assert_eq!(skipped, callers - 1);
    // One EVALSHA, or two around a SCRIPT LOAD after NOSCRIPT.
    assert_eq!(evalsha, 1 + loads, "only the probe reached Redis");
    assert!(!store.circuit_open());
}

/// A probe whose caller goes away (a client disconnect, an outer timeout) must not leave the
/// circuit open for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abandoned_probe_does_not_keep_the_circuit_open() {
    let cool_down = Duration::from_millis(300);
    let open = opened(cool_down).await;
    let (limiter, store) = (&open.limiter, &open.store);
    tokio::time::sleep_until((open.opened_by + cool_down + Duration::from_millis(50)).into()).await;
    // The probe is polled once (its EVALSHA is in flight), then dropped. Calls that still find
    // the circuit open answer at once; the first one left pending is the probe.
    let wait_for_probe = Instant::now() + Duration::from_secs(2);
    loop {
        match probe_check(limiter).now_or_never() {
            None => break,
            Some(Verdict::FailedClosed { .. }) if Instant::now() < wait_for_probe => {
                sleep(Duration::from_millis(5)).await;
            }
            other => panic!("expected a pending probe, got {other:?}"),
        }
    }

    let closed_after = decided_again(limiter, cool_down * 3 + Duration::from_secs(1)).await;
    let mut report = Report::new("circuit breaker: abandoned probe");
    report.line(
        "Redis decides again after",
        closed_after.map_or("never".into(), |t| ms(t - open.opened_by)),
    );
    report.print();
    assert!(
        closed_after.is_some(),
        "the circuit stays open forever after a dropped probe"
    );
    assert!(!store.circuit_open());
}

/// When a check first came back decided by Redis, checking every 20 ms for `within`; `None`
/// if none did.
async fn decided_again(limiter: &Limiter, within: Duration) -> Option<Instant> {
    let deadline = Instant::now() + within;
    loop {
        let started = Instant::now();
        if let Verdict::Decided(_) = probe_check(limiter).await {
            return Some(started);
        }
        if Instant::now() > deadline {
            return None;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// A layer starts a plain check's store decision when it is called: a probe started so and
/// dropped before its response future was ever polled (a client gone at once, a `select!`
/// that picked another branch) must not leave the circuit open for good either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_probe_started_by_a_layer_call_and_dropped_unpolled_does_not_keep_the_circuit_open() {
    use tower::{Service, ServiceExt};
    let cool_down = Duration::from_millis(300);
    let open = opened(cool_down).await;
    let (limiter, store) = (&open.limiter, &open.store);
    let mut app = RateLimitLayer::new(limiter.clone(), quota(), GlobalKey::new("breaker"))
        .layer(service_fn(hello));
    tokio::time::sleep_until((open.opened_by + cool_down + Duration::from_millis(50)).into()).await;
    // The first call after the cool-down takes the probe; dropped unpolled, it sends nothing.
    let ready = app
        .ready()
        .await
        .expect("the inner service is always ready");
    drop(ready.call(Request::new(())));

    let closed_after = decided_again(limiter, cool_down * 3 + Duration::from_secs(1)).await;
    assert!(
        closed_after.is_some(),
        "the circuit stays open forever after a probe dropped before its first poll"
    );
    assert!(!store.circuit_open());
}

// ---- LocalFallback ----

/// With Redis down, `LocalFallback::new(4)` admits exactly a quarter of the quota per key;
/// once Redis is back, decisions come from Redis again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_fallback_while_down_then_redis_again() {
    let quota = Quota::per_minute(100).unwrap();
    let mut redis = RedisServer::start();
    redis.stop();
    let store = RedisStore::new(redis.url()).unwrap();
    let limiter = Limiter::builder(store.clone())
        .failure_policy(LocalFallback::new(4))
        .build()
        .unwrap();

    let started = Instant::now();
    let mut decisions = Vec::new();
    for _ in 0..40 {
        match limiter.check("tenant", &quota).await {
            Verdict::Decided(decision) => decisions.push(decision),
            other => panic!("LocalFallback decides: {other:?}"),
        }
    }
    let local_took = started.elapsed();
    let admitted = decisions.iter().filter(|d| d.allowed).count();
    let first_denied = decisions.iter().find(|d| !d.allowed).copied();
    let taken = blocking(|| port_taken_note(&redis));

    blocking(|| redis.restart());
    let up = Instant::now();
    let deadline = up + Duration::from_secs(5);
    let first = loop {
        match limiter.check("tenant", &quota).await {
            Verdict::Decided(d) if d.limit == 100 => break Some(d),
            _ if Instant::now() > deadline => break None,
            _ => sleep(Duration::from_millis(20)).await,
        }
    };
    let back_after = up.elapsed();
    let first = first.expect("decisions come from Redis again");
    // Another instance, without fallback, spends 10 on the same key in Redis...
    let other = Ctx::default().timeout(Duration::from_secs(2)).redis(&redis);
    let spent = other
        .try_check_quotas("tenant", &quota.into(), 10)
        .await
        .unwrap();
    // ... and this instance sees it.
    let next = match limiter.check("tenant", &quota).await {
        Verdict::Decided(d) => d,
        other => panic!("{other:?}"),
    };
    let stats = limiter.stats();

    let mut report = Report::new("LocalFallback::new(4), per_minute(100)");
    report.line(
        "Redis down: 40 calls",
        format!(
            "{admitted} admitted, then denied (retry after {:?}), in {}",
            first_denied.map(|d| d.retry_after),
            ms(local_took)
        ),
    );
    report.line("Redis decides again after", ms(back_after));
    report.line("first Redis decision", format!("{first:?}"));
    report.line("after another instance spent 10", format!("{next:?}"));
    report.line("limiter stats", format!("{stats:?}"));
    report.print();

    assert_eq!(admitted, 25, "a quarter of the quota{taken}: {decisions:?}");
    assert!(decisions[..25].iter().all(|d| d.allowed && d.limit == 25));
    for denied in &decisions[25..] {
        assert!(!denied.allowed);
        assert!(
            denied.retry_after > Duration::ZERO
                && denied.retry_after <= Duration::from_millis(2400),
            "denied with a retry time of at most one token (2.4 s): {denied:?}"
        );
    }
    assert!(
        back_after < Duration::from_secs(3),
        "Redis decides again soon"
    );
    assert!(
        first.allowed && first.remaining >= 95,
        "Redis's own state, untouched by the local admissions: {first:?}"
    );
    assert!(spent.allowed);
    assert!(
        next.limit == 100
            && (first.remaining - 11..=first.remaining - 10).contains(&next.remaining),
        "remaining reflects what the other instance spent in Redis: {first:?} then {next:?}"
    );
    assert!(
        stats.fallback_decisions >= 40,
        "the 40 calls were local: {stats:?}"
    );
}

/// A configured timeout above the Redis client's own default response timeout (500 ms) is
/// the one that applies: a 1 s stall fits in a 2 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_timeout_above_500_ms_is_honoured() {
    let redis = RedisServer::start();
    let limiter = patient_limiter(&redis);
    warm_up(&limiter).await;
    let sleeper = blocking(|| redis.debug_sleep(Duration::from_secs(1)));
    sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let result = limiter.try_check_quotas("slow", &quota().into(), 1).await;
    let took = started.elapsed();
    tokio::task::spawn_blocking(move || sleeper.join())
        .await
        .unwrap()
        .unwrap();
    let mut report = Report::new("timeout 2 s, DEBUG SLEEP 1");
    report.line("check", format!("{result:?} after {}", ms(took)));
    report.print();
    assert!(
        result.is_ok(),
        "a 1 s stall fits in the 2 s timeout: {result:?} after {}",
        ms(took)
    );
}

/// One poisoned key (corrupt stored bytes the script refuses with an error reply) hammered
/// 1 000 times, on every algorithm, with the default breaker (5 failures) and the default
/// policy (fail open): its script errors go to the policy for that call alone, the circuit
/// never opens, and other keys that are over their limit keep being denied by Redis (were such
/// errors counted by the breaker, 5 in a row would open it and every other key fail open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_key_does_not_open_the_circuit_for_other_keys() {
    let redis = RedisServer::start();
    let store = RedisStore::new(redis.url()).unwrap();
    let quota = Quota::per_hour(2).unwrap();
    let over: Vec<String> = (0..4).map(|i| format!("over-{i}")).collect();
    for &algorithm in redlimit::Algorithm::ALL {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .prefix(format!("poison-{algorithm}"))
            .build()
            .unwrap();
        for key in &over {
            for _ in 0..2 {
                assert!(limiter.check(key, &quota).await.is_allowed());
            }
        }
        support::poison_key(&redis, &limiter, "poisoned").await;
        let error = limiter
            .try_check_quotas("poisoned", &quota.into(), 1)
            .await
            .unwrap_err();
        assert!(!error.is_transport(), "{algorithm}: {error}");
        let (mut poisoned_failed_open, mut denied, mut others_failed_open, mut opened) =
            (0, 0, 0, 0);
        for i in 0..1_000 {
            if matches!(limiter.check("poisoned", &quota).await, Verdict::FailedOpen) {
                poisoned_failed_open += 1;
            }
            opened += usize::from(store.circuit_open());
            if i % 10 == 0 {
                for key in &over {
                    match limiter.check(key, &quota).await {
                        Verdict::Decided(decision) if !decision.allowed => denied += 1,
                        _ => others_failed_open += 1,
                    }
                }
            }
        }
        let stats = limiter.stats();
        println!(
            "{algorithm}: poisoned key 1000 calls, {poisoned_failed_open} failed open (its own \
             policy); other keys over their limit: {denied} denied, {others_failed_open} not \
             denied; circuit seen open {opened} times; store errors counted {}",
            stats.store_errors
        );
        assert_eq!(poisoned_failed_open, 1_000, "{algorithm}");
        assert_eq!(others_failed_open, 0, "{algorithm}");
        assert_eq!(denied, 400, "{algorithm}");
        assert_eq!(opened, 0, "{algorithm}: the circuit never opens");
        assert_eq!(
            stats.store_errors, 1_000,
            "{algorithm}: every failure counted"
        );
    }
}

/// 512 concurrent checks across one `SCRIPT FLUSH` (sent while Redis is busy with a `DEBUG
/// SLEEP`, so that all of them are queued before the first runs): each sees `NOSCRIPT`, yet the
/// process sends one `SCRIPT LOAD` (the others wait for it; a call that races a finished load
/// sends `EVAL` instead of a load of its own), and no call fails, where a load per call would
/// send the 45 KB script hundreds of times. Counted with `INFO commandstats`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_under_512_concurrent_calls_loads_the_script_once() {
    const CALLS: usize = 512;
    let redis = RedisServer::start();
    // Loads are what this test counts, not latency: a generous timeout keeps a loaded machine
    // from turning a slow reply into a store error.
    let limiter = Policy::Closed.ctx().redis(&redis);
    let quota = Quota::per_hour(1_000).unwrap();
    for round in 0..3 {
        // Warm: the script is loaded and the connection open.
        limiter
            .try_check_quotas("warm", &quota.into(), 1)
            .await
            .unwrap();
        // The flush, then Redis busy for a moment: all 512 EVALSHAs are sent before Redis runs
        // the first, so each of them answers NOSCRIPT.
        let sleeper = blocking(|| {
            redis.reset_stats();
            redis.script_flush();
            redis.debug_sleep(Duration::from_millis(300))
        });
        sleep(Duration::from_millis(50)).await;
        let keys: Vec<String> = (0..CALLS).map(|i| format!("k{round}-{}", i % 64)).collect();
        let quotas = quota.into();
        let results = join_all(
            keys.iter()
                .map(|key| limiter.try_check_quotas(key, &quotas, 1)),
        )
        .await;
        tokio::task::spawn_blocking(move || sleeper.join())
            .await
            .unwrap()
            .unwrap();
        let failed: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(ToString::to_string))
            .collect();
        let (evalsha, loads, evals) = blocking(|| {
            (
                redis.command_calls("evalsha"),
                redis.command_calls("script|load"),
                redis.command_calls("eval"),
            )
        });
        println!(
            "round {round}: {CALLS} concurrent checks across SCRIPT FLUSH: {} failed, \
             script|load {loads}, eval {evals}, evalsha {evalsha}",
            failed.len()
        );
        assert!(failed.is_empty(), "no call fails: {:?}", failed.first());
        assert!(
            results.iter().all(|r| matches!(r, Ok(d) if d.allowed)),
            "all admitted"
        );
        assert!((1..=2).contains(&loads), "at most a few loads: {loads}");
        assert!(evals <= 2, "at most a few EVAL fallbacks: {evals}");
    }
}
