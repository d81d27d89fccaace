//! Probes of the layer's queued checks: a batching `RedisStore` queues a plain check when the
//! layer is *called* (`RateLimit::call` → `Limiter::answer_now` → `Store::queue`), and the
//! response future waits for the batch's answer in a slot of a block of 64 answers. Each probe
//! attacks a promise of that path through `tower::Service::call` on a `RateLimitLayer` (or
//! `Limiter::check`): futures dropped before any poll, after one or two, parked, moved to
//! another runtime, callers that block their worker, Redis losing its data, scripts, memory or
//! life, the circuit breaker, the deny cache, many blocks of answers, Cluster, stores that wrap
//! the Redis store, and the one-warning-per-outage rule. The four that found defects (a probe
//! held unpolled or parked, a denial read late, a Cluster reload waiting for every master) run
//! since their fixes.
//!
//! The layers here run a fixed window of 100 000 units over ten years on one global key, under
//! `FailClosed`: a 200 is the store's admission, a 503 the policy's answer, and what Redis
//! counted is read back with a peek (cost 0); each admission's `remaining` is its own number.

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::join_all;
use http::{Request, Response, StatusCode};
use redlimit::failure_policy::FailClosed;
use redlimit::key::GlobalKey;
use redlimit::layer::{RateLimit, ResponseBody, ResponseFuture};
use redlimit::store::{CircuitBreaker, RedisStore, Store, DEFAULT_MAX_BATCH};
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas, RateLimitLayer, Target, Verdict};
use tower::{Layer, Service};

use super::sender::main_runtime;
use super::{
    assert_later_decisions_go_alone, builder, script_calls, verified_cluster_store, warm_store,
    SLACK,
};
use crate::support::stores::{BoxedStore, Faithful, Forward};
use crate::support::{self, RedisCluster, RedisServer, Rng};

// ---------------------------------------------------------------------------------------------
// The layer under attack.
// ---------------------------------------------------------------------------------------------

/// The one key every request of a [`Hot`] layer counts against.
const KEY: &str = "hot";

/// The units of the hot key's window: far more than any probe sends.
const QUOTA: u64 = 100_000;

/// The store timeout of most probes: long enough that a loaded 2-core machine decides in time.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A fixed window of [`QUOTA`] over ten years (windows aligned to the epoch: none ends during
/// a test), so that Redis's count is exactly `QUOTA - remaining`.
fn ten_years() -> Quota {
    Quota::new(QUOTA, Duration::from_secs(3650 * 86_400)).unwrap()
}

/// The inner service: answers 200 and notes the `remaining` of the decision it was handed (so
/// each admission is seen, with its own number).
#[derive(Clone, Default)]
struct Inner {
    seen: Arc<Mutex<Vec<u64>>>,
}

impl Service<Request<()>> for Inner {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<()>) -> Self::Future {
        let remaining = request
            .extensions()
            .get::<Decision>()
            .expect("an admitted request carries its decision")
            .remaining;
        self.seen.lock().unwrap().push(remaining);
        std::future::ready(Ok(Response::new(())))
    }
}

type App = RateLimit<Inner, GlobalKey>;
type Fut = ResponseFuture<Inner, (), GlobalKey>;
type Output = Result<Response<ResponseBody<()>>, Infallible>;

/// A layer on one global key over a limiter on `store` (fixed window, `FailClosed`).
#[derive(Clone)]
struct Hot {
    limiter: Limiter,
    layer: RateLimitLayer<GlobalKey>,
    app: App,
    inner: Inner,
    key: &'static str,
}

impl Hot {
    fn on(store: impl Store) -> Hot {
        Hot::keyed(store, KEY)
    }

    /// The same on the global key `key`.
    fn keyed(store: impl Store, key: &'static str) -> Hot {
        let limiter = Limiter::builder(store)
            .algorithm(Algorithm::FixedWindow)
            .failure_policy(FailClosed::default())
            .build()
            .unwrap();
        Hot::with(limiter, ten_years(), key)
    }

    /// A layer of `quota` on the global key `key` over `limiter`.
    fn with(limiter: Limiter, quota: Quota, key: &'static str) -> Hot {
        let layer = RateLimitLayer::new(limiter.clone(), quota, GlobalKey::new(key));
        let inner = Inner::default();
        let app = layer.layer(inner.clone());
        Hot {
            limiter,
            layer,
            app,
            inner,
            key,
        }
    }

    /// The key Redis holds the layer's state under.
    fn storage_key(&self) -> String {
        self.limiter
            .storage_key(Target::scoped(self.layer.scope(), self.key))
    }

    /// `Service::call` on a clone of the app, made ready first (as tower asks): the store's
    /// decision is queued here, synchronously.
    fn call(&self) -> Fut {
        let mut app = self.app.clone();
        let waker = futures::task::noop_waker();
        let ready = app.poll_ready(&mut Context::from_waker(&waker));
        assert!(matches!(ready, Poll::Ready(Ok(()))));
        app.call(Request::new(()))
    }

    /// [`call`](Self::call), pinned in a box, to poll by hand.
    fn boxed(&self) -> Pin<Box<Fut>> {
        Box::pin(self.call())
    }

    /// A request through the layer to its end, with the time it took from its call.
    fn timed(&self) -> impl Future<Output = (StatusCode, Duration)> + Send + 'static {
        let started = Instant::now();
        let future = self.call();
        async move { (status(future.await), started.elapsed()) }
    }

    /// What Redis counted on the key: a peek (cost 0) of the layer's scope.
    async fn consumed(&self) -> u64 {
        let target = Target::scoped(self.layer.scope(), self.key);
        let peek = self
            .limiter
            .try_check_quotas(target, self.layer.quotas(), 0)
            .await
            .expect("the peek decided");
        QUOTA - peek.remaining
    }

    /// The `remaining` of every admission the inner service saw.
    fn seen(&self) -> Vec<u64> {
        self.inner.seen.lock().unwrap().clone()
    }
}

fn status(output: Output) -> StatusCode {
    output.expect("the layer never errs").status()
}

/// Polls `future` once with a waker that does nothing: its output, if ready.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    let waker = futures::task::noop_waker();
    future.poll(&mut Context::from_waker(&waker))
}

/// `count` requests through `hot`, each from its call to its end, all entered at once.
async fn burst(hot: &Hot, count: usize) -> Vec<(StatusCode, Duration)> {
    join_all((0..count).map(|_| hot.timed())).await
}

/// `count` requests each on a task of its own (started at once), with their times.
async fn spawned_burst(hot: &Hot, count: usize) -> Vec<(StatusCode, Duration)> {
    let tasks: Vec<_> = (0..count).map(|_| tokio::spawn(hot.timed())).collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

fn summary(answers: &[(StatusCode, Duration)]) -> String {
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for (status, _) in answers {
        *by_status.entry(status.as_u16()).or_default() += 1;
    }
    let worst = answers.iter().map(|(_, took)| *took).max();
    format!("{by_status:?}, worst {worst:?}")
}

fn all_ok_within(answers: &[(StatusCode, Duration)], within: Duration) -> bool {
    answers
        .iter()
        .all(|(status, took)| *status == StatusCode::OK && *took <= within)
}

/// Every answer is the failure policy's (503), each within `within`.
fn all_policy_within(answers: &[(StatusCode, Duration)], within: Duration) -> bool {
    answers
        .iter()
        .all(|(status, took)| *status == StatusCode::SERVICE_UNAVAILABLE && *took <= within)
}

/// Asserts that no two admissions share a `remaining`: each answer is its own, not another
/// decision's (a crossed slot would repeat one).
fn assert_answers_are_their_own(hot: &Hot) {
    let seen = hot.seen();
    let distinct: HashSet<u64> = seen.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        seen.len(),
        "two admissions were handed the same decision: {seen:?}"
    );
}

/// A warm store (no breaker, `timeout`, default batching) and a [`Hot`] layer on it.
async fn hot_on(redis: &RedisServer, timeout: Duration) -> (RedisStore, Hot) {
    let store = warm_store(redis, timeout, DEFAULT_MAX_BATCH).await;
    let hot = Hot::on(store.clone());
    assert_eq!(hot.consumed().await, 0);
    (store, hot)
}

/// The group is clean and batching still works: three decisions on idle Redis go alone
/// (nothing counted in flight), and 64 layer requests behind a `DEBUG SLEEP` are batched
/// (the batch script ran) and answered within the sleep plus the slack, each counted once.
async fn assert_store_still_batches(
    redis: &RedisServer,
    store: &RedisStore,
    hot: &Hot,
    after: &str,
) {
    assert_later_decisions_go_alone(redis, store, &format!("alone-{after}"), after).await;
    let before = hot.consumed().await;
    let sleep = Duration::from_millis(150);
    redis.reset_stats();
    let sleeping = redis.asleep(sleep).await;
    let answers = burst(hot, 64).await;
    RedisServer::awake(sleeping).await;
    let (_, batches) = script_calls(redis);
    assert!(
        all_ok_within(&answers, sleep + Duration::from_millis(500)),
        "64 later requests {after}: {}",
        summary(&answers)
    );
    assert!(batches >= 1, "64 later requests {after} were not batched");
    assert_eq!(
        hot.consumed().await,
        before + 64,
        "64 later requests {after}"
    );
}

// ---------------------------------------------------------------------------------------------
// Futures dropped before any poll, after one, after two; parked.
// ---------------------------------------------------------------------------------------------

/// 64 layer calls on one hot key behind a `DEBUG SLEEP` (the first goes alone, 63 queue when
/// called); each polled `polls` times, then every even one dropped and every odd one awaited.
/// The odd ones are admitted, each its own decision; Redis counts them plus at most the
/// dropped ones that were polled (so possibly sent), none of the ones dropped unpolled; and
/// the store is left clean.
async fn dropped_after(polls: usize) {
    let redis = RedisServer::start();
    let (store, hot) = hot_on(&redis, TIMEOUT).await;
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let mut futures: Vec<Pin<Box<Fut>>> = (0..64).map(|_| hot.boxed()).collect();
    for _ in 0..polls {
        for future in &mut futures {
            assert!(
                poll_once(future.as_mut()).is_pending(),
                "decided behind a sleep"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut kept = Vec::new();
    for (i, future) in futures.into_iter().enumerate() {
        if i % 2 == 0 {
            drop(future);
        } else {
            kept.push(future);
        }
    }
    let started = Instant::now();
    let answers: Vec<StatusCode> = tokio::time::timeout(TIMEOUT + SLACK, join_all(kept))
        .await
        .expect("the kept requests hang")
        .into_iter()
        .map(status)
        .collect();
    let took = started.elapsed();
    RedisServer::awake(sleeping).await;
    assert!(
        answers.iter().all(|s| *s == StatusCode::OK),
        "kept after {polls} polls: {answers:?}"
    );
    assert!(took <= TIMEOUT, "the kept took {took:?}");
    assert_answers_are_their_own(&hot);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let admitted = hot.seen().len() as u64;
    assert_eq!(admitted, 32);
    let count = hot.consumed().await;
    let sent_at_most = if polls == 0 { 0 } else { 32 };
    assert!(
        (admitted..=admitted + sent_at_most).contains(&count),
        "after {polls} polls: Redis counts {count} for {admitted} admitted and 32 dropped"
    );
    assert_store_still_batches(
        &redis,
        &store,
        &hot,
        &format!("after drops at {polls} polls"),
    )
    .await;
}

/// Dropped before any poll, on one thread: no call could be sent between the call and the
/// drop, so Redis counts the admissions exactly.
#[tokio::test]
async fn layer_futures_dropped_before_any_poll_at_c64_on_one_hot_key_consume_nothing() {
    dropped_after(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_futures_dropped_after_one_poll_at_c64_on_one_hot_key_count_at_most_once() {
    dropped_after(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_futures_dropped_after_two_polls_at_c64_on_one_hot_key_count_at_most_once() {
    dropped_after(2).await;
}

/// 64 layer calls on one hot key, Redis idle: the lead (alone) polled once then parked, one
/// queued call never polled but kept, one queued call polled once then parked; the other 61
/// are answered as fast as without them, and the three parked, polled to their end at last,
/// are admitted too: Redis counts exactly the 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_layer_futures_slow_none_of_the_others_on_one_hot_key() {
    let redis = RedisServer::start();
    let (store, hot) = hot_on(&redis, TIMEOUT).await;
    // Control: 61 requests alone, for the time they take here.
    let control = burst(&hot, 61).await;
    let control_worst = control.iter().map(|(_, took)| *took).max().unwrap();
    assert!(all_ok_within(&control, TIMEOUT), "{}", summary(&control));
    let base = hot.consumed().await;
    // The control's sender ends on its next poll: the lead must find nothing in flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut lead = hot.boxed();
    let mut parked_queued = hot.boxed();
    let unpolled = hot.boxed();
    // Alone: its reply cannot be there at its first poll.
    assert!(poll_once(lead.as_mut()).is_pending());
    // Queued: its sender may answer it before this first poll.
    let early = match poll_once(parked_queued.as_mut()) {
        Poll::Ready(answer) => Some(status(answer)),
        Poll::Pending => None,
    };
    let others = spawned_burst(&hot, 61).await;
    let worst = others.iter().map(|(_, took)| *took).max().unwrap();
    eprintln!(
        "control worst {control_worst:?}; beside the parked: {}",
        summary(&others)
    );
    assert!(
        all_ok_within(&others, control_worst + SLACK),
        "beside 3 parked futures: {} (control {control_worst:?})",
        summary(&others)
    );
    assert!(worst < TIMEOUT / 2, "{}", summary(&others));
    let mut parked = vec![("lead", lead), ("unpolled", unpolled)];
    match early {
        Some(early) => assert_eq!(early, StatusCode::OK, "the queued one, at once"),
        None => parked.push(("queued", parked_queued)),
    }
    for (name, parked) in parked {
        let answer = tokio::time::timeout(TIMEOUT, parked)
            .await
            .unwrap_or_else(|_| panic!("the parked {name} hangs"));
        assert_eq!(status(answer), StatusCode::OK, "the parked {name}");
    }
    assert_answers_are_their_own(&hot);
    assert_eq!(hot.consumed().await, base + 64, "Redis's count");
    assert_store_still_batches(&redis, &store, &hot, "after the parked").await;
}

/// The same through `Limiter::check`: 64 checks on one key behind a `DEBUG SLEEP`, each polled
/// once; every third dropped, one parked, the rest awaited: the rest are decided within the
/// timeout, the parked one too once polled again, and Redis counts the admissions plus at
/// most the dropped ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_checks_dropped_and_parked_after_one_poll_count_at_most_once() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let limiter = Limiter::builder(store.clone())
        .algorithm(Algorithm::FixedWindow)
        .failure_policy(FailClosed::default())
        .build()
        .unwrap();
    let quota = ten_years();
    let key = "checked";
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let mut checks: Vec<_> = (0..64)
        .map(|_| Box::pin(limiter.check(key, &quota)))
        .collect();
    for check in &mut checks {
        assert!(poll_once(check.as_mut()).is_pending());
    }
    let parked = checks.remove(10);
    let mut kept = Vec::new();
    let mut dropped = 0;
    for (i, check) in checks.into_iter().enumerate() {
        if i % 3 == 0 {
            dropped += 1;
            drop(check);
        } else {
            kept.push(check);
        }
    }
    let started = Instant::now();
    let verdicts = join_all(kept).await;
    let took = started.elapsed();
    RedisServer::awake(sleeping).await;
    assert!(took <= TIMEOUT, "took {took:?}");
    let mut remaining: Vec<u64> = verdicts
        .iter()
        .map(|verdict| match verdict {
            Verdict::Decided(decision) if decision.allowed => decision.remaining,
            other => panic!("{other:?}"),
        })
        .collect();
    let parked = tokio::time::timeout(TIMEOUT, parked)
        .await
        .expect("the parked check hangs");
    match parked {
        Verdict::Decided(decision) if decision.allowed => remaining.push(decision.remaining),
        other => panic!("the parked check: {other:?}"),
    }
    let admitted = remaining.len() as u64;
    let distinct: HashSet<u64> = remaining.iter().copied().collect();
    assert_eq!(distinct.len(), remaining.len(), "crossed answers");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let peek = limiter
        .try_check_quotas(key, &Quotas::from(quota), 0)
        .await
        .unwrap();
    let count = QUOTA - peek.remaining;
    assert!(
        (admitted..=admitted + dropped).contains(&count),
        "Redis counts {count} for {admitted} admitted and {dropped} dropped"
    );
    assert_later_decisions_go_alone(&redis, &store, "after-checks", "after dropped checks").await;
}

// ---------------------------------------------------------------------------------------------
// Many blocks of answers.
// ---------------------------------------------------------------------------------------------

/// 300 layer calls on one hot key behind a `DEBUG SLEEP` (one alone, 299 queued: five blocks
/// of answers), each polled once; then, in a random order, a third dropped, a tenth parked
/// (kept, not polled) and the rest awaited. Every answer is its own, nothing panics or hangs,
/// the parked ones are decided when polled at last, and Redis counts the admissions plus at
/// most the dropped ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_blocks_of_queued_layer_futures_dropped_in_random_order_each_get_their_own_answer()
{
    let redis = RedisServer::start();
    let (store, hot) = hot_on(&redis, Duration::from_secs(3)).await;
    let mut rng = Rng(0x5eed_0b10c5 ^ u64::from(redis.port()));
    let sleeping = redis.asleep(Duration::from_millis(400)).await;
    let mut futures: Vec<Option<Pin<Box<Fut>>>> = (0..300).map(|_| Some(hot.boxed())).collect();
    for future in futures.iter_mut().flatten() {
        assert!(poll_once(future.as_mut()).is_pending());
    }
    let mut order: Vec<usize> = (0..futures.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let (mut dropped, mut parked, mut awaited) = (0u64, Vec::new(), Vec::new());
    for (n, &i) in order.iter().enumerate() {
        let future = futures[i].take().unwrap();
        match n % 10 {
            0..=2 => {
                dropped += 1;
                drop(future);
                if n % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            3 => parked.push(future),
            _ => awaited.push(future),
        }
    }
    let started = Instant::now();
    let answers = tokio::time::timeout(Duration::from_secs(3) + SLACK, join_all(awaited))
        .await
        .expect("the awaited requests hang");
    let took = started.elapsed();
    RedisServer::awake(sleeping).await;
    let statuses: Vec<StatusCode> = answers.into_iter().map(status).collect();
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?} after {took:?}"
    );
    let parked_answers = tokio::time::timeout(Duration::from_secs(3), join_all(parked))
        .await
        .expect("the parked requests hang");
    for answer in parked_answers {
        assert_eq!(status(answer), StatusCode::OK, "a parked request");
    }
    assert_answers_are_their_own(&hot);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let admitted = hot.seen().len() as u64;
    let count = hot.consumed().await;
    eprintln!("{admitted} admitted, {dropped} dropped, Redis counts {count}, took {took:?}");
    assert!(
        (admitted..=admitted + dropped).contains(&count),
        "Redis counts {count} for {admitted} admitted and {dropped} dropped"
    );
    assert_store_still_batches(&redis, &store, &hot, "after five blocks").await;
}

/// A Cluster and a store on it with `timeout` and no breaker, a layer on a key `held`, its
/// master's index, and a layer on a key of another master.
async fn held_and_other(timeout: Duration) -> (RedisCluster, RedisStore, Hot, usize, Hot) {
    let cluster = RedisCluster::start();
    let store = verified_cluster_store(&cluster, timeout).await;
    let held = Hot::keyed(store.clone(), "held");
    let held_node = cluster.node_for_key(&held.storage_key());
    let other = (0..)
        .map(|i| {
            Hot::keyed(
                store.clone(),
                Box::leak(format!("other-{i}").into_boxed_str()),
            )
        })
        .find(|hot| cluster.node_for_key(&hot.storage_key()) != held_node)
        .unwrap();
    (cluster, store, held, held_node, other)
}

/// On Cluster: 64 layer calls on a key whose master is held by `DEBUG SLEEP`, each polled
/// once, every even one dropped; meanwhile 64 on a key of another master are decided at once
/// (no slot waits for another's queue); then the odd ones are admitted, and Redis counts them
/// plus at most the dropped ones, and 64 on the other key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_layer_calls_dropped_behind_a_held_master_hold_up_no_other_slot() {
    let (cluster, _store, held, held_node, other) = held_and_other(TIMEOUT).await;
    // Warm: both keys' slots decided in bursts (both scripts loaded on both masters: a
    // load after `NOSCRIPT` goes to every master, see the probe after this one).
    for hot in [&held, &other] {
        let warm = burst(hot, 64).await;
        assert!(all_ok_within(&warm, TIMEOUT), "{}", summary(&warm));
    }
    let (held_before, other_before) = (held.consumed().await, other.consumed().await);
    let sleep = Duration::from_millis(400);
    let sleeping = support::debug_sleep_via(&cluster.nodes()[held_node].client(), sleep);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut futures: Vec<Pin<Box<Fut>>> = (0..64).map(|_| held.boxed()).collect();
    for future in &mut futures {
        assert!(poll_once(future.as_mut()).is_pending());
    }
    let kept: Vec<_> = futures
        .into_iter()
        .enumerate()
        .filter_map(|(i, future)| (i % 2 == 1).then_some(future))
        .collect();
    let others = burst(&other, 64).await;
    eprintln!("the other master beside a held one: {}", summary(&others));
    assert!(
        all_ok_within(&others, sleep / 2),
        "the other slot waited: {}",
        summary(&others)
    );
    let kept = tokio::time::timeout(TIMEOUT + SLACK, join_all(kept))
        .await
        .expect("the kept requests hang");
    RedisServer::awake(sleeping).await;
    assert!(kept
        .into_iter()
        .all(|answer| status(answer) == StatusCode::OK));
    assert_answers_are_their_own(&held);
    assert_answers_are_their_own(&other);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let held_count = held.consumed().await - held_before;
    assert!(
        (32..=64).contains(&held_count),
        "Redis counts {held_count} for 32 admitted and 32 dropped"
    );
    assert_eq!(other.consumed().await - other_before, 64);
}

/// On Cluster, one master held by `DEBUG SLEEP` (4 timeouts long), every script flushed first
/// when `flushed` (as after a restart, or a failover to a replica without them): a layer
/// request on a key of another master, healthy, answers. Returns its status and time.
async fn beside_a_held_master(flushed: bool, timeout: Duration) -> (StatusCode, Duration) {
    let (cluster, _store, _held, held_node, other) = held_and_other(timeout).await;
    let warm = burst(&other, 8).await;
    assert!(all_ok_within(&warm, timeout), "{}", summary(&warm));
    if flushed {
        cluster.script_flush_all();
    }
    let sleeping = support::debug_sleep_via(&cluster.nodes()[held_node].client(), 4 * timeout);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let answer = other.timed().await;
    RedisServer::awake(sleeping).await;
    answer
}

/// The control: scripts in place, a request on a healthy master is decided at once while
/// another master sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_held_master_delays_no_request_on_another() {
    let timeout = Duration::from_millis(300);
    let answer = beside_a_held_master(false, timeout).await;
    assert!(
        answer.0 == StatusCode::OK && answer.1 <= timeout,
        "a request on a healthy master while another sleeps: {answer:?}"
    );
}

/// Scripts flushed: the request's `NOSCRIPT` starts a `SCRIPT LOAD`, which the Cluster client
/// sends to every node and answers when all have: the load waits for the held master, and the
/// request on the healthy master with it, past its timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_reload_after_noscript_waits_for_no_other_master() {
    let timeout = Duration::from_millis(300);
    let answer = beside_a_held_master(true, timeout).await;
    assert!(
        answer.0 == StatusCode::OK && answer.1 <= timeout + MARGIN,
        "a request on a healthy master while another sleeps, scripts flushed: {answer:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Runtimes.
// ---------------------------------------------------------------------------------------------

/// A store built on the main runtime; 64 layer calls made on a helper's current-thread runtime
/// (which returns them unpolled and is then shut down), polled on the main runtime: each is
/// decided there, and Redis counts 64.
#[test]
fn layer_calls_made_on_a_runtime_shut_down_before_any_poll_are_decided_on_another() {
    let redis = RedisServer::start();
    let main = main_runtime();
    let (_store, hot) = main.block_on(hot_on(&redis, TIMEOUT));
    let helper_hot = hot.clone();
    let futures = std::thread::spawn(move || {
        let helper = support::current_thread_runtime();
        let futures: Vec<Fut> =
            helper.block_on(async { (0..64).map(|_| helper_hot.call()).collect() });
        drop(helper);
        futures
    })
    .join()
    .unwrap();
    all_admitted_on(&main, futures);
    main.block_on(async {
        assert_answers_are_their_own(&hot);
        assert_eq!(hot.consumed().await, 64);
    });
}

/// Polls `futures` on `runtime` to their answers, within the timeout: every one admitted.
/// Returns the time they took.
fn all_admitted_on(runtime: &tokio::runtime::Runtime, futures: Vec<Fut>) -> Duration {
    let started = Instant::now();
    let answers = runtime.block_on(async {
        tokio::time::timeout(TIMEOUT + SLACK, join_all(futures))
            .await
            .expect("hang")
    });
    let took = started.elapsed();
    let statuses: Vec<StatusCode> = answers.into_iter().map(status).collect();
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?} in {took:?}"
    );
    took
}

/// The store built (and bound) on a current-thread runtime that makes 64 layer calls (one
/// alone, 63 queued, a sender spawned there that never ran) and is shut down before any is
/// polled: polled on the main runtime, each is decided (sent alone, the store rebinding),
/// within the timeout, and Redis counts 64.
#[test]
fn layer_calls_queued_on_the_stores_own_runtime_shut_down_before_any_poll_are_decided_on_the_next()
{
    let redis = RedisServer::start();
    let first = support::current_thread_runtime();
    let (store, hot) = first.block_on(hot_on(&redis, TIMEOUT));
    let futures: Vec<Fut> = first.block_on(async { (0..64).map(|_| hot.call()).collect() });
    drop(first);
    let main = main_runtime();
    let took = all_admitted_on(&main, futures);
    eprintln!("decided on the next runtime in {took:?}");
    assert!(took <= TIMEOUT + SLACK, "took {took:?}");
    main.block_on(async {
        assert_answers_are_their_own(&hot);
        assert_eq!(hot.consumed().await, 64);
        assert_store_still_batches(&redis, &store, &hot, "after the first runtime").await;
    });
}

/// A store built on the main runtime, shared by two helper runtimes: one makes 32 layer calls,
/// polls each once and then blocks (its futures parked on an undriven runtime); the other
/// makes 32, polls each once and is shut down with them alive. Meanwhile three bursts of 64
/// on the main runtime are each decided as fast as a control burst; Redis counts the main
/// runtime's admissions plus at most the helpers' 64.
#[test]
fn a_store_shared_by_an_idle_and_a_shut_down_runtime_decides_the_main_runtimes_layer_calls() {
    let redis = RedisServer::start();
    let main = main_runtime();
    let (_store, hot) = main.block_on(hot_on(&redis, TIMEOUT));
    let control = main.block_on(burst(&hot, 64));
    let control_worst = control.iter().map(|(_, took)| *took).max().unwrap();
    let base = main.block_on(hot.consumed());
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (ready_idle, idle_ready) = std::sync::mpsc::channel::<()>();
    let idle_hot = hot.clone();
    let idle = std::thread::spawn(move || {
        let runtime = support::current_thread_runtime();
        runtime.block_on(async {
            let mut futures: Vec<_> = (0..32).map(|_| idle_hot.boxed()).collect();
            for future in &mut futures {
                let _ = poll_once(future.as_mut());
            }
            ready_idle.send(()).unwrap();
            // Blocks its runtime: the futures stay parked on it, never polled again.
            let _ = released.recv();
            drop(futures);
        });
    });
    idle_ready.recv().unwrap();
    let gone_hot = hot.clone();
    let gone = std::thread::spawn(move || {
        let runtime = support::current_thread_runtime();
        let futures = runtime.block_on(async {
            let mut futures: Vec<_> = (0..32).map(|_| gone_hot.boxed()).collect();
            for future in &mut futures {
                let _ = poll_once(future.as_mut());
            }
            futures
        });
        drop(runtime);
        futures
    })
    .join()
    .unwrap();
    let rounds: Vec<_> = (0..3)
        .map(|_| {
            let answers = main.block_on(burst(&hot, 64));
            eprintln!(
                "beside an idle and a shut-down runtime: {}",
                summary(&answers)
            );
            answers
        })
        .collect();
    drop(gone);
    release.send(()).unwrap();
    idle.join().unwrap();
    for answers in &rounds {
        assert!(
            all_ok_within(
                answers,
                control_worst.max(Duration::from_millis(100)) + SLACK
            ),
            "{} (control {control_worst:?})",
            summary(answers)
        );
    }
    main.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let count = hot.consumed().await - base;
        assert!(
            (192..=256).contains(&count),
            "Redis counts {count} for 192 admitted and 64 parked or dropped"
        );
    });
}

/// The control for [`assert_63_within_control`]: the worst time of 63 requests each on a task
/// of its own, nothing else going on.
async fn spawned_control(hot: &Hot) -> Duration {
    let control = spawned_burst(hot, 63).await;
    control.iter().map(|(_, took)| *took).max().unwrap()
}

/// 63 requests each on a task of its own, made `beside` something else: each is admitted
/// within the control's worst time (at least 100 ms) plus the slack.
async fn assert_63_within_control(hot: &Hot, control_worst: Duration, round: usize, beside: &str) {
    let others = spawned_burst(hot, 63).await;
    eprintln!("round {round}: {beside}: {}", summary(&others));
    assert!(
        all_ok_within(
            &others,
            control_worst.max(Duration::from_millis(100)) + SLACK
        ),
        "round {round}: {} (control {control_worst:?})",
        summary(&others)
    );
}

/// A task whose layer request was just decided blocks its worker for 2 s; 63 requests made
/// meanwhile on the other worker are each decided within the control's time: no answer waits
/// for the blocked task. Three rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seconds_of_synchronous_work_after_a_layer_decision_delay_no_other_decision() {
    let redis = RedisServer::start();
    let (_store, hot) = hot_on(&redis, TIMEOUT).await;
    let control_worst = spawned_control(&hot).await;
    for round in 0..3 {
        let (decided, blocked) = std::sync::mpsc::channel();
        let busy_hot = hot.clone();
        let busy = tokio::spawn(async move {
            let status = status(busy_hot.call().await);
            decided.send(status).unwrap();
            std::thread::sleep(Duration::from_secs(2));
        });
        let first = tokio::task::spawn_blocking(move || blocked.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(first, StatusCode::OK);
        assert_63_within_control(&hot, control_worst, round, "beside a blocked worker").await;
        busy.await.unwrap();
    }
}

/// A task calls the layer and then blocks its worker for 2 s before polling: first with Redis
/// idle (its call goes alone, unsent meanwhile), then behind a parked lead (its call is queued
/// and a sender spawned from the blocked worker). 63 requests made meanwhile are each decided
/// within the control's time, and the blocked task's own request is admitted at last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seconds_of_synchronous_work_between_a_layer_call_and_its_first_poll_delay_no_other_decision(
) {
    let redis = RedisServer::start();
    let (_store, hot) = hot_on(&redis, Duration::from_secs(4)).await;
    let control_worst = spawned_control(&hot).await;
    for round in 0..2 {
        // Round 1: a lead polled once and parked, so that the blocked task's call queues.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut lead = (round == 1).then(|| hot.boxed());
        if let Some(lead) = &mut lead {
            assert!(poll_once(lead.as_mut()).is_pending());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (called, blocked) = std::sync::mpsc::channel();
        let busy_hot = hot.clone();
        let busy = tokio::spawn(async move {
            let future = busy_hot.call();
            called.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(2));
            status(future.await)
        });
        tokio::task::spawn_blocking(move || blocked.recv().unwrap())
            .await
            .unwrap();
        assert_63_within_control(
            &hot,
            control_worst,
            round,
            "beside a task blocked after its call",
        )
        .await;
        assert_eq!(busy.await.unwrap(), StatusCode::OK, "round {round}");
        if let Some(lead) = lead {
            assert_eq!(status(lead.await), StatusCode::OK);
        }
    }
    assert_answers_are_their_own(&hot);
}

/// The store's runtime shut down; 64 layer calls made outside any runtime (a plain thread):
/// polled on a new runtime, each is decided, and Redis counts 64.
#[test]
fn layer_calls_made_outside_any_runtime_after_the_stores_runtime_shut_down_are_decided_on_the_next()
{
    let redis = RedisServer::start();
    let first = support::current_thread_runtime();
    let (store, hot) = first.block_on(hot_on(&redis, TIMEOUT));
    drop(first);
    let futures: Vec<Fut> = (0..64).map(|_| hot.call()).collect();
    let main = main_runtime();
    all_admitted_on(&main, futures);
    main.block_on(async {
        assert_answers_are_their_own(&hot);
        assert_eq!(hot.consumed().await, 64);
        assert_store_still_batches(&redis, &store, &hot, "after calls outside a runtime").await;
    });
}

// ---------------------------------------------------------------------------------------------
// The deny cache.
// ---------------------------------------------------------------------------------------------

/// A layer of 2 a second (token bucket) on one key over a limiter with a deny cache. The key
/// spent, a lead goes alone behind a `DEBUG SLEEP`, so that the next layer call is queued
/// when called and decided (denied, retry after ~0.2 s) as Redis wakes; its response future
/// is polled at once (`late`: false) or 1.2 s after that (`late`: true), and 1.2 s after the
/// decision Redis would admit again (a peek shows the tokens back), and so must the layer: a
/// denial decided 1.2 s ago has ended. Returns the next request's status and how many the
/// deny cache answered.
async fn denial_then_next(late: bool) -> (StatusCode, u64, u64) {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let limiter = Limiter::builder(store)
        .failure_policy(FailClosed::default())
        .deny_cache(100)
        .build()
        .unwrap();
    let hot = Hot::with(limiter.clone(), Quota::per_second(2).unwrap(), "denied");
    let spent = burst(&hot, 2).await;
    assert!(all_ok_within(&spent, TIMEOUT), "{}", summary(&spent));
    // Redis held: a lead goes alone behind the sleep, so that the next call queues when
    // called; both are decided (denied) when Redis wakes.
    let sleeping = redis.asleep(Duration::from_millis(300)).await;
    let mut lead = hot.boxed();
    assert!(poll_once(lead.as_mut()).is_pending());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let denied = hot.call();
    RedisServer::awake(sleeping).await;
    let denied = if late {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        denied.await.unwrap()
    } else {
        let denied = denied.await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        denied
    };
    assert_eq!(
        denied.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "decided when Redis woke: {:?}",
        denied.headers()
    );
    let target = Target::scoped(hot.layer.scope(), hot.key);
    let peek = limiter
        .try_check_quotas(target, hot.layer.quotas(), 0)
        .await
        .unwrap();
    assert!(peek.remaining >= 1, "Redis would admit: {peek:?}");
    let cached_before = limiter.stats().deny_cached;
    let (next, _) = hot.timed().await;
    let cached = limiter.stats().deny_cached - cached_before;
    drop(lead);
    (next, cached, peek.remaining)
}

/// The control: the denial's future polled at once is cached only until its `retry_after`;
/// 1.2 s later the layer admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_polled_at_once_is_not_cached_past_its_retry_after() {
    let (next, cached, tokens) = denial_then_next(false).await;
    assert_eq!(
        next,
        StatusCode::OK,
        "denied ({cached} from the deny cache), Redis holding {tokens} tokens"
    );
}

/// The denial's future, queued when called, polled 1.2 s after Redis decided it: the deny
/// cache must not deny past the denial's `retry_after` either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_queued_when_called_and_polled_late_is_not_cached_past_its_retry_after() {
    let (next, cached, tokens) = denial_then_next(true).await;
    assert_eq!(
        next,
        StatusCode::OK,
        "denied ({cached} from the deny cache) 1.2 s after Redis decided a denial of 2 a second, Redis holding {tokens} tokens"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis misbehaves.
// ---------------------------------------------------------------------------------------------

/// The margin over the store timeout within which a failed decision answers.
const MARGIN: Duration = Duration::from_millis(400);

/// 64 layer requests on `hot` queued behind a 2 s `DEBUG SLEEP`, then `fault` done to Redis
/// 50 ms later: their answers.
async fn burst_then(
    redis: &mut RedisServer,
    hot: &Hot,
    fault: impl FnOnce(&mut RedisServer),
) -> Vec<(StatusCode, Duration)> {
    let _sleeping = redis.asleep(Duration::from_secs(2)).await;
    let requests = tokio::spawn({
        let hot = hot.clone();
        async move { burst(&hot, 64).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    fault(redis);
    requests.await.unwrap()
}

/// 64 layer requests on `hot` queued behind a 250 ms `DEBUG SLEEP`, and `command` sent to
/// Redis 30 ms later on a connection of its own: their answers, once Redis is awake again and
/// the command has returned.
async fn burst_beside_a_command(
    redis: &RedisServer,
    hot: &Hot,
    command: &'static [&'static str],
) -> Vec<(StatusCode, Duration)> {
    let sleeping = redis.asleep(Duration::from_millis(250)).await;
    let requests = tokio::spawn({
        let hot = hot.clone();
        async move { burst(&hot, 64).await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let client = redis.client();
    let sent = std::thread::spawn(move || {
        let mut conn = client.get_connection().unwrap();
        let _: () = redis::cmd(command[0])
            .arg(&command[1..])
            .query(&mut conn)
            .unwrap();
    });
    let answers = requests.await.unwrap();
    RedisServer::awake(sleeping).await;
    sent.join().unwrap();
    answers
}

/// Waits up to 5 s, after Redis came back, for a burst of `count` layer requests that are all
/// admitted.
async fn admitted_again(hot: &Hot, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answers = burst(hot, count).await;
        if answers.iter().all(|(status, _)| *status == StatusCode::OK) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never admitted after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 64 layer requests behind a `DEBUG SLEEP` (queued when called), then Redis killed: each
/// answers with the failure policy (503) within the timeout plus the margin, counted from its
/// call; after a restart the layer admits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_layer_requests_answer_within_the_timeout_when_redis_is_killed_mid_flight() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let (_store, hot) = hot_on(&redis, timeout).await;
    let answers = burst_then(&mut redis, &hot, RedisServer::stop).await;
    eprintln!("killed: {}", summary(&answers));
    assert!(
        all_policy_within(&answers, timeout + MARGIN),
        "{}",
        summary(&answers)
    );
    redis.restart();
    admitted_again(&hot, 1).await;
}

/// Redis stopped: three bursts of 64 layer requests (the breaker opening among them), each
/// answered by the failure policy within the timeout plus the margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_requests_answer_within_the_timeout_with_the_policy_while_redis_is_stopped() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(200);
    let store = builder(&redis, timeout, DEFAULT_MAX_BATCH).build().unwrap();
    store.verify().await.unwrap();
    let hot = Hot::on(store.clone());
    assert_eq!(hot.consumed().await, 0);
    redis.stop();
    for round in 0..3 {
        let answers = burst(&hot, 64).await;
        eprintln!("stopped, round {round}: {}", summary(&answers));
        assert!(
            all_policy_within(&answers, timeout + MARGIN),
            "round {round}: {}",
            summary(&answers)
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

/// `SCRIPT FLUSH` lands while 64 layer requests are queued behind a `DEBUG SLEEP`: each is
/// admitted (the scripts loaded again), within the timeout, and Redis counts exactly 64 (a
/// `NOSCRIPT` ran nothing: nothing is counted twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_flush_mid_flight_admits_each_queued_layer_request_once() {
    let redis = RedisServer::start();
    let (store, hot) = hot_on(&redis, TIMEOUT).await;
    for round in 0..2 {
        let before = hot.consumed().await;
        let answers = burst_beside_a_command(&redis, &hot, &["SCRIPT", "FLUSH"]).await;
        eprintln!("script flush, round {round}: {}", summary(&answers));
        assert!(all_ok_within(&answers, TIMEOUT), "{}", summary(&answers));
        assert_eq!(hot.consumed().await, before + 64, "round {round}");
    }
    assert_answers_are_their_own(&hot);
    assert_store_still_batches(&redis, &store, &hot, "after script flushes").await;
}

/// `FLUSHALL` lands while 64 layer requests are queued behind a `DEBUG SLEEP`: each is decided
/// by Redis (no policy answer) within the timeout; Redis counts at most the 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushall_mid_flight_leaves_every_queued_layer_request_decided() {
    let redis = RedisServer::start();
    let (store, hot) = hot_on(&redis, TIMEOUT).await;
    let answers = burst_beside_a_command(&redis, &hot, &["FLUSHALL"]).await;
    eprintln!("flushall: {}", summary(&answers));
    assert!(all_ok_within(&answers, TIMEOUT), "{}", summary(&answers));
    assert!(hot.consumed().await <= 64);
    assert_store_still_batches(&redis, &store, &hot, "after a flushall").await;
}

/// Redis restarted (killed, started again: data and scripts gone) while 64 layer requests are
/// queued behind a `DEBUG SLEEP`: each answers within the timeout plus the margin, and the
/// layer admits again within seconds, batching as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_flight_answers_each_queued_layer_request_in_time_and_the_layer_recovers() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let (store, hot) = hot_on(&redis, timeout).await;
    let answers = burst_then(&mut redis, &hot, RedisServer::restart).await;
    eprintln!("restart: {}", summary(&answers));
    assert!(
        answers.iter().all(|(_, took)| *took <= timeout + MARGIN),
        "{}",
        summary(&answers)
    );
    admitted_again(&hot, 8).await;
    assert_store_still_batches(&redis, &store, &hot, "after a restart").await;
}

/// Redis past `maxmemory` with nothing to evict: 64 layer requests queued behind a `DEBUG
/// SLEEP` (so that they go in batches) are each refused a write, and answer with the policy
/// (503) within the timeout plus the margin; Redis counts nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_requests_under_maxmemory_noeviction_answer_with_the_policy_in_time() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let (_store, hot) = hot_on(&redis, timeout).await;
    let first = burst(&hot, 3).await;
    assert!(all_ok_within(&first, timeout), "{}", summary(&first));
    redis.out_of_memory();
    for round in 0..2 {
        let sleeping = redis.asleep(Duration::from_millis(150)).await;
        let answers = burst(&hot, 64).await;
        RedisServer::awake(sleeping).await;
        eprintln!("out of memory, round {round}: {}", summary(&answers));
        assert!(
            all_policy_within(&answers, timeout + MARGIN),
            "round {round}: {}",
            summary(&answers)
        );
    }
    assert_eq!(hot.consumed().await, 3);
}

// ---------------------------------------------------------------------------------------------
// The circuit breaker.
// ---------------------------------------------------------------------------------------------

const COOL_DOWN: Duration = Duration::from_millis(300);

/// A store with a breaker (3 failures, [`COOL_DOWN`]) and a 100 ms timeout, its circuit
/// opened (Redis held by a `DEBUG SLEEP`, requests timing out) and Redis awake again; the
/// layer on it.
async fn opened_circuit(redis: &RedisServer) -> (RedisStore, Hot) {
    let store = builder(redis, Duration::from_millis(100), DEFAULT_MAX_BATCH)
        .circuit_breaker(CircuitBreaker {
            failure_threshold: 3,
            cool_down: COOL_DOWN,
        })
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let hot = Hot::on(store.clone());
    assert_eq!(status(hot.call().await), StatusCode::OK);
    let sleeping = redis.asleep(Duration::from_millis(600)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !store.circuit_open() {
        assert!(Instant::now() < deadline, "the circuit never opened");
        let _ = hot.call().await;
    }
    RedisServer::awake(sleeping).await;
    (store, hot)
}

/// Requests through the layer until one is admitted (the circuit closed again), for at most
/// `within`: the time it took, if any.
async fn admitted_within(hot: &Hot, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if status(hot.call().await) == StatusCode::OK {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The cool-down over, 64 layer calls at once (the first takes the probe, the others are
/// skipped), all dropped before any poll: the probe is handed back, and the layer admits
/// again within a few cool-downs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_futures_dropped_unpolled_while_half_open_do_not_keep_the_circuit_open() {
    let redis = RedisServer::start();
    let (store, hot) = opened_circuit(&redis).await;
    for _ in 0..3 {
        tokio::time::sleep(COOL_DOWN + Duration::from_millis(50)).await;
        let futures: Vec<Fut> = (0..64).map(|_| hot.call()).collect();
        drop(futures);
    }
    let closed = admitted_within(&hot, COOL_DOWN * 3 + Duration::from_secs(2)).await;
    assert!(
        closed.is_some(),
        "the circuit stays open after unpolled probes were dropped"
    );
    assert!(!store.circuit_open());
}

/// The cool-down over, one layer call takes the probe and its response future is held, not
/// polled and not dropped (queued in a buffer, a slow client): Redis is up again, yet every
/// other request must not be skipped for good; within a few cool-downs the layer admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_future_holding_the_probe_unpolled_keeps_no_other_request_from_a_recovered_store() {
    let redis = RedisServer::start();
    let (store, hot) = opened_circuit(&redis).await;
    tokio::time::sleep(COOL_DOWN + Duration::from_millis(50)).await;
    let held = hot.call();
    let closed = admitted_within(&hot, COOL_DOWN * 3 + Duration::from_secs(2)).await;
    let open = store.circuit_open();
    drop(held);
    assert!(
        closed.is_some(),
        "every request failed for {:?} while one unpolled future held the probe (circuit open: {open})",
        COOL_DOWN * 3 + Duration::from_secs(2)
    );
}

/// The same through `Limiter::check`: the probe's check polled once (its call sent) and then
/// parked; Redis is up, yet every other check must not be skipped for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_check_polled_once_and_parked_keeps_no_other_check_from_a_recovered_store() {
    let redis = RedisServer::start();
    let (store, hot) = opened_circuit(&redis).await;
    tokio::time::sleep(COOL_DOWN + Duration::from_millis(50)).await;
    let quota = ten_years();
    let mut probe = Box::pin(hot.limiter.check("probe", &quota));
    assert!(poll_once(probe.as_mut()).is_pending());
    let closed = admitted_within(&hot, COOL_DOWN * 3 + Duration::from_secs(2)).await;
    let open = store.circuit_open();
    drop(probe);
    assert!(
        closed.is_some(),
        "every request failed while a parked check held the probe (circuit open: {open})"
    );
}

// ---------------------------------------------------------------------------------------------
// Stores that wrap the Redis store.
// ---------------------------------------------------------------------------------------------

/// Behind a `DEBUG SLEEP`, a layer call whose future is held and never polled, then 63 awaited:
/// whether the held one's decision was queued when called (Redis counted it without a poll);
/// the 63 are admitted within the timeout and batched.
async fn held_and_63(redis: &RedisServer, hot: &Hot) -> (bool, u64) {
    let before = hot.consumed().await;
    redis.reset_stats();
    let sleeping = redis.asleep(Duration::from_millis(200)).await;
    // A lead in flight first, so that the held call finds a call in flight and queues.
    let mut lead = hot.boxed();
    assert!(poll_once(lead.as_mut()).is_pending());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let held = hot.call();
    let mut answers = burst(hot, 62).await;
    answers.push((status(lead.await), Duration::ZERO));
    RedisServer::awake(sleeping).await;
    let (_, batches) = script_calls(redis);
    assert!(all_ok_within(&answers, TIMEOUT), "{}", summary(&answers));
    assert!(batches >= 1, "not batched");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let count = hot.consumed().await - before;
    drop(held);
    assert!((63..=64).contains(&count), "{count}");
    (count == 64, count)
}

/// A store wrapper that forwards `queue`, held as `Box<dyn Store>` inside another: the
/// layer's calls are queued when called (a held, unpolled call is counted), batched, and
/// each answered its own decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boxed_wrapper_that_forwards_queue_queues_the_layers_calls_when_called() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let boxed: Box<dyn Store> = Box::new(Faithful(store.clone()));
    let hot = Hot::on(BoxedStore(boxed));
    let (queued, count) = held_and_63(&redis, &hot).await;
    assert!(
        queued,
        "the held call was not queued when called ({count} counted)"
    );
    assert_answers_are_their_own(&hot);
}

/// A custom store that forwards `check` and `run` but not `queue`: the layer decides through
/// `check` (batched by the Redis store all the same), a held unpolled call consumes nothing,
/// and each admission is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_that_does_not_forward_queue_decides_the_layers_calls_through_check() {
    let redis = RedisServer::start();
    let store = warm_store(&redis, TIMEOUT, DEFAULT_MAX_BATCH).await;
    let hot = Hot::on(Forward(store.clone()));
    let (queued, count) = held_and_63(&redis, &hot).await;
    assert!(
        !queued,
        "a call was queued through a store that does not queue ({count})"
    );
    assert_answers_are_their_own(&hot);
}

// ---------------------------------------------------------------------------------------------
// One outage, one warning.
// ---------------------------------------------------------------------------------------------

/// Redis killed under a load of 64 concurrent layer requests, wave after wave for about two
/// seconds (calls timing out, the breaker opening, probes failing): one outage, one `WARN`.
#[tokio::test]
async fn a_killed_redis_under_c64_layer_load_warns_once() {
    let (captured, _guard) = support::logs::capture(tracing::Level::DEBUG);
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(100);
    let store = builder(&redis, timeout, DEFAULT_MAX_BATCH).build().unwrap();
    store.verify().await.unwrap();
    let hot = Hot::on(store.clone());
    let warm = burst(&hot, 64).await;
    assert!(all_ok_within(&warm, TIMEOUT), "{}", summary(&warm));
    redis.stop();
    let started = Instant::now();
    let mut waves = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let answers = burst(&hot, 64).await;
        assert!(
            answers
                .iter()
                .all(|(status, _)| *status == StatusCode::SERVICE_UNAVAILABLE),
            "{}",
            summary(&answers)
        );
        waves += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = captured.text();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains(" WARN ")).collect();
    eprintln!("{waves} waves; {} warnings", warnings.len());
    assert_eq!(
        warnings.len(),
        1,
        "one outage, one warning:\n{}",
        warnings.join("\n")
    );
}
