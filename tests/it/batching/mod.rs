//! Batching: decisions that queue behind a call in flight share the next `EVALSHA`
//! (`src/store/redis/batch.rs`, `lua/batch.lua`), and each is still decided as it would be
//! alone: its own reply, error and timeout, at most once, whatever its caller, its runtime or
//! Redis does meanwhile. A `DEBUG SLEEP` holds the first call, so the decisions behind it queue
//! for certain.

mod cancel;
mod cluster;
mod decisions;
mod faults;
mod key_shapes;
mod limits;
mod parked_lead;
mod queued_layer;
mod runtime;
mod sender;
mod takeover;

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{CheckRequest, RedisStore, RedisStoreBuilder, Store, StoreError};
use redlimit::{Algorithm, Decision, Quota, Quotas};

use crate::support::{RedisCluster, RedisServer};

/// A quota nothing in these tests exhausts unless it says so.
pub(crate) fn generous() -> Quotas {
    Quota::per_hour(1_000).unwrap().into()
}

/// A decision of cost 1 on Redis's clock.
pub(crate) fn request<'a>(
    key: &'a str,
    quotas: &'a Quotas,
    algorithm: Algorithm,
) -> CheckRequest<'a> {
    CheckRequest {
        key,
        algorithm,
        quotas,
        cost: 1,
        now_micros: None,
    }
}

/// Whether `store` admits a decision of cost 1 on `key` (it must decide).
async fn admits(store: &RedisStore, key: &str, quotas: &Quotas, algorithm: Algorithm) -> bool {
    let decision = store.check(request(key, quotas, algorithm)).await;
    decision.unwrap().allowed
}

/// What a decision may take beyond its own timeout on this loaded 2-core machine: the timer's
/// and the scheduler's lateness, never a wait for another call.
const SLACK: Duration = Duration::from_millis(250);

type Answer = (Result<Decision, StoreError>, Duration);

/// A store on `redis`, built (and connected, its decision and batch scripts loaded) inside
/// `runtime`'s `block_on`.
fn store_on(
    runtime: &tokio::runtime::Runtime,
    redis: &RedisServer,
    timeout: Duration,
    max_batch: usize,
) -> RedisStore {
    runtime.block_on(warm_store(redis, timeout, max_batch))
}

/// `runtime`, with a store on `redis` built on it as by [`store_on`].
fn runtime_and_store(
    runtime: tokio::runtime::Runtime,
    redis: &RedisServer,
    timeout: Duration,
    max_batch: usize,
) -> (tokio::runtime::Runtime, RedisStore) {
    let store = store_on(&runtime, redis, timeout, max_batch);
    (runtime, store)
}

/// [`connected_store`], its batch script loaded too.
async fn warm_store(redis: &RedisServer, timeout: Duration, max_batch: usize) -> RedisStore {
    let store = connected_store(redis, timeout, max_batch).await;
    warm_batch_script(redis, &store).await;
    store
}

/// A store on `redis` with `timeout`, carrying at most `max_batch` decisions a call, with no
/// circuit breaker: connected, its decision script loaded.
async fn connected_store(redis: &RedisServer, timeout: Duration, max_batch: usize) -> RedisStore {
    let store = store_without_breaker(redis, timeout, max_batch);
    store.verify().await.expect("Redis is up");
    store
}

/// A store's builder on `redis` with `timeout`, carrying at most `max_batch` decisions a call.
fn builder(redis: &RedisServer, timeout: Duration, max_batch: usize) -> RedisStoreBuilder {
    RedisStore::builder(redis.url())
        .timeout(timeout)
        .max_batch(max_batch)
}

/// A store of [`builder`] (with the default circuit breaker); built, not yet connected.
fn new_store(redis: &RedisServer, timeout: Duration, max_batch: usize) -> RedisStore {
    builder(redis, timeout, max_batch).build().unwrap()
}

/// [`new_store`] with no circuit breaker.
fn store_without_breaker(redis: &RedisServer, timeout: Duration, max_batch: usize) -> RedisStore {
    let builder = builder(redis, timeout, max_batch);
    builder.without_circuit_breaker().build().unwrap()
}

/// A store on `cluster` with `timeout` and no circuit breaker, verified (connected, the
/// decision script loaded on every master).
async fn verified_cluster_store(cluster: &RedisCluster, timeout: Duration) -> RedisStore {
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(timeout)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    store
}

/// The two tests of one scenario, the body `$with(max_batch)` written above the call:
/// `$batched` on a store that batches (`DEFAULT_MAX_BATCH`), and `$unbatched` on a store that
/// never does (the control: it holds).
macro_rules! batched_and_unbatched {
    (fn $batched:ident, $unbatched:ident = $with:ident) => {
        #[test]
        fn $batched() {
            $with(redlimit::store::DEFAULT_MAX_BATCH);
        }

        #[test]
        fn $unbatched() {
            $with(1);
        }
    };
    (async fn $batched:ident, $unbatched:ident = $with:ident) => {
        #[tokio::test]
        async fn $batched() {
            $with(redlimit::store::DEFAULT_MAX_BATCH).await;
        }

        #[tokio::test]
        async fn $unbatched() {
            $with(1).await;
        }
    };
}
pub(crate) use batched_and_unbatched;

/// Loads the batch script: a queue behind a held call, so that no `NOSCRIPT` blurs timings.
async fn warm_batch_script(redis: &RedisServer, store: &RedisStore) {
    let sleeping = redis.debug_sleep(Duration::from_millis(60));
    tokio::time::sleep(Duration::from_millis(15)).await;
    let quotas = generous();
    let keys: Vec<String> = (0..4).map(|i| format!("redlimit:{{warm-{i}}}")).collect();
    for answer in join_all(
        keys.iter()
            .map(|key| store.check(request(key, &quotas, Algorithm::TokenBucket))),
    )
    .await
    {
        answer.expect("warm-up decided");
    }
    sleeping.join().unwrap();
}

/// A decision of cost 1 on `key` under the [`generous`] quota (token bucket).
async fn decide(store: &RedisStore, key: &str) -> Result<Decision, StoreError> {
    let quotas = generous();
    store
        .check(request(key, &quotas, Algorithm::TokenBucket))
        .await
}

/// [`decide`], with the time it took.
async fn timed(store: &RedisStore, key: &str) -> Answer {
    let started = Instant::now();
    let answer = decide(store, key).await;
    (answer, started.elapsed())
}

/// [`timed`] on a clone of `store`: a future that owns what it needs, to spawn.
fn timed_owned(
    store: &RedisStore,
    key: &'static str,
) -> impl Future<Output = Answer> + Send + 'static {
    let store = store.clone();
    async move { timed(&store, key).await }
}

/// [`together`] on a clone of `store`: a future that owns what it needs, to spawn.
fn together_owned(
    store: &RedisStore,
    prefix: &'static str,
    count: usize,
) -> impl Future<Output = Vec<Answer>> + Send + 'static {
    let store = store.clone();
    async move { together(&store, prefix, count).await }
}

/// A helper thread, as a health check or a second service on a runtime of its own may be: its
/// current-thread runtime runs `calls` on a clone of `store` and sends back their answer, then
/// idles undriven until released (a send on the returned sender, or its drop), and is dropped.
/// Returns the answer's receiver, that sender, and the thread.
fn helper_runtime<T, F>(
    store: &RedisStore,
    calls: impl FnOnce(RedisStore) -> F + Send + 'static,
) -> (
    mpsc::Receiver<T>,
    mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
)
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    let (answered, answer) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let store = store.clone();
    let helper = std::thread::spawn(move || {
        let runtime = crate::support::current_thread_runtime();
        answered.send(runtime.block_on(calls(store))).unwrap();
        // Idle: the runtime lives on, undriven, until released.
        let _ = released.recv();
        drop(runtime);
    });
    (answer, release, helper)
}

/// `count` decisions on keys of their own, all entered in one poll; each with its time.
async fn together(store: &RedisStore, prefix: &str, count: usize) -> Vec<Answer> {
    let keys: Vec<String> = (0..count)
        .map(|i| format!("redlimit:{{{prefix}-{i}}}"))
        .collect();
    join_all(keys.iter().map(|key| timed(store, key))).await
}

fn show(answers: &[Answer]) -> String {
    answers
        .iter()
        .map(|(answer, took)| match answer {
            Ok(decision) => format!("ok({}) {took:.0?}", decision.allowed),
            Err(error) => format!("err({error}) {took:.0?}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn all_decided_within(answers: &[Answer], within: Duration) -> bool {
    answers
        .iter()
        .all(|(answer, took)| answer.is_ok() && *took <= within)
}

fn none_past(answers: &[Answer], limit: Duration) -> bool {
    answers.iter().all(|(_, took)| *took <= limit)
}

/// Script calls Redis ran (`EVALSHA` and `EVAL`), and of those the batch script's (the only
/// script that runs `MGET`).
fn script_calls(redis: &RedisServer) -> (u64, u64) {
    (
        redis.command_calls("evalsha") + redis.command_calls("eval"),
        redis.command_calls("mget"),
    )
}

// ---------------------------------------------------------------------------------------------
// Futures dropped and parked.
// ---------------------------------------------------------------------------------------------

/// A fixed-window quota of `QUOTA` per hour on one shared key: what Redis consumed is
/// `QUOTA - remaining` of a peek.
const QUOTA: u64 = 100_000;

fn shared_quota() -> Quotas {
    Quota::per_hour(QUOTA).unwrap().into()
}

fn on_shared<'a>(key: &'a str, quotas: &'a Quotas, cost: u64) -> CheckRequest<'a> {
    CheckRequest {
        key,
        algorithm: Algorithm::FixedWindow,
        quotas,
        cost,
        now_micros: None,
    }
}

async fn consumed(store: &RedisStore, key: &str) -> u64 {
    let quotas = shared_quota();
    // The count's own peek may meet a slot still moving (a redirect past the store's resends):
    // it is asked again, a moment later.
    let mut last = None;
    for attempt in 0..5 {
        match store.check(on_shared(key, &quotas, 0)).await {
            Ok(peek) => return QUOTA - peek.remaining,
            Err(error) => last = Some(error),
        }
        tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
    }
    panic!("the count's peek failed 5 times: {last:?}")
}

/// Whether three decisions entered in one poll, Redis idle, went as a lone call and a sender's
/// call of one each (3 script calls, no batch script): the group holds no call in flight.
async fn lone_and_fast(
    redis: &RedisServer,
    store: &RedisStore,
    prefix: &str,
) -> (u64, u64, Vec<Answer>) {
    // A sender that just answered ends on its next poll: a decision that arrives before that
    // is queued and carried by it (harmless, and not what this looks for).
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.reset_stats();
    let answers = together(store, prefix, 3).await;
    let (calls, batches) = script_calls(redis);
    (calls, batches, answers)
}

/// Asserts what [`lone_and_fast`] looks for, each of the three decided within 200 ms: the
/// group holds nothing of what came before (`after`, for the message).
async fn assert_later_decisions_go_alone(
    redis: &RedisServer,
    store: &RedisStore,
    prefix: &str,
    after: &str,
) {
    let (calls, batches, later) = lone_and_fast(redis, store, prefix).await;
    assert!(
        calls == 3 && batches == 0 && all_decided_within(&later, Duration::from_millis(200)),
        "later decisions, {after}: {calls} script calls, {batches} batch calls: {}",
        show(&later)
    );
}

/// `count` keys of their own, `redlimit:{<prefix>-<i>}`.
fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("redlimit:{{{prefix}-{i}}}"))
        .collect()
}

/// An answer as text, to compare two stores' answers or print one.
fn text(answer: &Result<Decision, StoreError>) -> String {
    match answer {
        Ok(decision) => format!("{decision:?}"),
        Err(error) => format!("error: {error}"),
    }
}

/// Tries one decision on `key` up to `attempts` times, a moment apart, and returns the first
/// that Redis decided, or every error seen. A new runtime's first call may meet a connection
/// that an older runtime's shutdown dropped, which the store replaces by itself.
async fn decided_within(
    store: &RedisStore,
    key: &str,
    attempts: usize,
) -> Result<Decision, Vec<String>> {
    let mut errors = Vec::new();
    for _ in 0..attempts {
        let started = Instant::now();
        match decide(store, key).await {
            Ok(decision) => return Ok(decision),
            Err(error) => errors.push(format!("{error} after {:?}", started.elapsed())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(errors)
}

/// A decision of cost 1 on Redis's clock for each of `keys`, in order.
fn requests<'a, K: AsRef<str>>(
    keys: &'a [K],
    quotas: &'a Quotas,
    algorithm: Algorithm,
) -> Vec<CheckRequest<'a>> {
    keys.iter()
        .map(|key| request(key.as_ref(), quotas, algorithm))
        .collect()
}

/// Holds Redis for `sleep`, then sends `first` (alone, behind the sleep) and, once it is on the
/// wire, every request of `rest` (queued behind it, in order). Answers in the order given,
/// `first`'s first.
async fn behind_a_sleep(
    redis: &RedisServer,
    store: &RedisStore,
    sleep: Duration,
    first: CheckRequest<'_>,
    rest: &[CheckRequest<'_>],
) -> Vec<Result<Decision, StoreError>> {
    store.verify().await.expect("Redis is up");
    let (first, rest) = while_asleep(
        redis,
        sleep,
        || store.check(first),
        || join_all(rest.iter().map(|request| store.check(*request))),
    )
    .await;
    std::iter::once(first).chain(rest).collect()
}

/// Holds Redis for `sleep`, then starts `first` (which goes alone and waits behind the sleep)
/// and, once it is on the wire, `rest` (which queues behind it); both answers once Redis wakes.
async fn while_asleep<First: Future, Rest: Future>(
    redis: &RedisServer,
    sleep: Duration,
    first: impl FnOnce() -> First,
    rest: impl FnOnce() -> Rest,
) -> (First::Output, Rest::Output) {
    let sleeping = redis.debug_sleep(sleep);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let leader = first();
    let followers = async {
        // The first call is in flight before the others arrive.
        tokio::time::sleep(Duration::from_millis(20)).await;
        rest().await
    };
    let answers = tokio::join!(leader, followers);
    sleeping.join().unwrap();
    answers
}

/// Two stores for comparing answers: `batched` sends a whole queue in one call, so that it runs
/// in the order given (decisions in calls that overlap have no order between them, as
/// concurrent calls never had); `alone` never batches.
fn batched_and_alone(batched: &RedisServer, alone: &RedisServer) -> (RedisStore, RedisStore) {
    let store = |redis, max_batch| new_store(redis, crate::support::PATIENT_TIMEOUT, max_batch);
    (store(batched, 256), store(alone, 1))
}
