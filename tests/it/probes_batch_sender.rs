//! Break-it probes of the store's own batch sender and runtime (`src/store/redis/batch.rs`,
//! `src/store/redis/runtime.rs`, `lua/batch.lua`): each test is named after the promise it
//! tests (the store's module docs, "Batching" and "The store's runtime"; docs/production.md,
//! "Batching"; the `RedisStore` rustdoc) and tries to break it against private Redis servers:
//! other runtimes (idle, shut down, the store's own among them), futures dropped or parked at
//! every await, synchronous work, `maxmemory` mid-batch against a twin server deciding alone,
//! batches at the size bound, faults mid-batch (Redis killed, `DEBUG SLEEP` past the timeout),
//! and a Cluster master killed with queues on several slots.
//!
//! Every decision's latency is checked against its own store timeout plus a slack stated where
//! it is used (the machine running these is shared and loaded). A test that found a broken
//! promise names at its top the cause it guards against.

use crate::support;

use super::batch_limits::out_of_memory;
use super::batch_sender::main_runtime;

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::Context;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redlimit::store::{CheckRequest, RedisStore, Store, StoreError, MAX_BATCH};
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas, Target};
use support::{RedisCluster, RedisServer};

use super::batching::{generous, request};

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
    runtime.block_on(async {
        let store = RedisStore::builder(redis.url())
            .timeout(timeout)
            .max_batch(max_batch)
            .without_circuit_breaker()
            .build()
            .unwrap();
        store.verify().await.expect("Redis is up");
        warm_batch_script(redis, &store).await;
        store
    })
}

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

async fn timed(store: &RedisStore, key: &str) -> Answer {
    let quotas = generous();
    let started = Instant::now();
    let answer = store
        .check(request(key, &quotas, Algorithm::TokenBucket))
        .await;
    (answer, started.elapsed())
}

/// `count` decisions on keys of their own, all entered in one poll; each with its time.
async fn together(store: &RedisStore, prefix: &str, count: usize) -> Vec<Answer> {
    let keys: Vec<String> = (0..count)
        .map(|i| format!("redlimit:{{{prefix}-{i}}}"))
        .collect();
    join_all(keys.iter().map(|key| timed(store, key))).await
}

/// `count` lone decisions one after another, each on a key of its own.
async fn one_by_one(store: &RedisStore, prefix: &str, count: usize) -> Vec<Answer> {
    let mut answers = Vec::new();
    for i in 0..count {
        answers.push(timed(store, &format!("redlimit:{{{prefix}-{i}}}")).await);
    }
    answers
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

/// Polls `future` once with a waker that does nothing; `true` if it is still pending.
fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    let waker = futures::task::noop_waker();
    let mut context = Context::from_waker(&waker);
    Pin::new(future).poll(&mut context).is_pending()
}

// ---------------------------------------------------------------------------------------------
// Other runtimes.
// ---------------------------------------------------------------------------------------------

/// A helper thread's current-thread runtime that, after `CLIENT KILL`, makes the store's first
/// calls (as a health check or a second service on its own runtime may), then idles undriven.
/// Returns the helper's answers and a sender that releases (and drops) its runtime.
fn helper_calls_then_idles(
    store: &RedisStore,
) -> (Vec<String>, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (answered, answers) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let helper = {
        let store = store.clone();
        std::thread::spawn(move || {
            let runtime = support::current_thread_runtime();
            let texts = runtime.block_on(async {
                let mut texts = Vec::new();
                for i in 0..4 {
                    let (answer, took) = timed(&store, &format!("redlimit:{{helper-{i}}}")).await;
                    texts.push(format!("{:?} {took:.0?}", answer.map(|d| d.allowed)));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                texts
            });
            answered.send(texts).unwrap();
            let _ = released.recv();
            drop(runtime);
        })
    };
    let texts = answers.recv().unwrap();
    (texts, release, helper)
}

/// Guards against: the single-node connection is a redis-rs `ConnectionManager`, which reconnects by
/// itself with `tokio::spawn` on the runtime of the call that met the dropped connection
/// (redis-rs 1.8.1 `aio/connection_manager.rs`, `reconnect`: `internals.runtime.spawn`, and
/// the new `MultiplexedConnection`'s driver is spawned wherever that future is polled). So
/// after a dropped connection (`CLIENT KILL`, a Redis restart, a network blip) the new
/// connection's driver lives on whichever caller's runtime met it first, not on the store's:
/// when that runtime idles, every later decision of every runtime times out.
///
/// Promise (src/store/mod.rs, "The store's runtime"): the store runs "its connection (the
/// connection attempts, and the driver task redis-rs spawns for a connection)" on its own
/// runtime, "never a caller's"; "another runtime idling, blocking or shutting down touches no
/// other caller's decision".
#[test]
fn a_connection_remade_by_another_runtimes_call_stalls_no_decision_when_that_runtime_idles() {
    let redis = RedisServer::start();
    let main = main_runtime();
    let timeout = Duration::from_millis(500);
    let store = store_on(&main, &redis, timeout, redlimit::store::DEFAULT_MAX_BATCH);
    // The connection drops; the helper's calls are the first to meet it.
    redis.client_kill_normal();
    std::thread::sleep(Duration::from_millis(50));
    let (helper, release, thread) = helper_calls_then_idles(&store);
    let (lone, queued) = main.block_on(async {
        let lone = one_by_one(&store, "after-helper", 4).await;
        let queued = together(&store, "after-helper-queued", 8).await;
        (lone, queued)
    });
    release.send(()).unwrap();
    thread.join().unwrap();
    // Redis idle, nothing in flight: each decision takes a few ms.
    let within = Duration::from_millis(200);
    assert!(
        all_decided_within(&lone, within) && all_decided_within(&queued, within),
        "the helper (its runtime then idle): {helper:?}\nlone decisions on the main runtime: \
         {}\nqueued: {}",
        show(&lone),
        show(&queued)
    );
}

/// Guards against (same cause as the test above): the helper runtime that remade the connection shuts
/// down, and the decisions of the main runtime made at that moment fail with the dropped
/// connection's error, though it was not their runtime.
#[test]
fn a_connection_remade_by_another_runtimes_call_fails_no_decision_when_that_runtime_shuts_down() {
    let redis = RedisServer::start();
    let main = main_runtime();
    let timeout = Duration::from_millis(500);
    let store = store_on(&main, &redis, timeout, redlimit::store::DEFAULT_MAX_BATCH);
    redis.client_kill_normal();
    std::thread::sleep(Duration::from_millis(50));
    let (helper, release, thread) = helper_calls_then_idles(&store);
    let answers = main.block_on(async {
        // Decisions every 5 ms, through the helper runtime's shutdown 100 ms in.
        let run = tokio::spawn({
            let store = store.clone();
            async move {
                let mut answers = Vec::new();
                for i in 0..60 {
                    answers.push(timed(&store, &format!("redlimit:{{through-{i}}}")).await);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                answers
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        release.send(()).unwrap();
        run.await.unwrap()
    });
    thread.join().unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(answer, _)| answer.is_err())
        .collect();
    assert!(
        failed.is_empty(),
        "helper: {helper:?}\n{} of {} decisions of the main runtime failed when the helper's \
         runtime shut down: {}",
        failed.len(),
        answers.len(),
        show(&answers)
    );
}

/// The store's own runtime (a current-thread one the store was built in) stops being driven
/// while a lone call is on its connection and decisions are queued behind it, then shuts down.
/// Promise (src/store/mod.rs, "The store's runtime"): "If the store's own runtime shuts down,
/// the calls in flight on it fail (a decision that may have run is not sent again), queued
/// decisions not yet sent are sent by their callers alone".
///
/// Guards against: the queued decisions were handed to a sender task that the store's runtime never
/// polled (`spawn_sender` moves the batch into the task at spawn time); dropped unpolled with
/// the runtime, it drops their answer channels, and each hears SENDER_GONE "the store's
/// runtime shut down with this decision's call in flight (it may have run)" although no call
/// carried it (Redis ran no script meanwhile). They are not sent alone.
#[test]
fn queued_decisions_never_sent_are_sent_alone_when_the_stores_runtime_shuts_down() {
    let redis = RedisServer::start();
    let own = support::current_thread_runtime();
    let timeout = Duration::from_millis(1500);
    let store = store_on(&own, &redis, timeout, redlimit::store::DEFAULT_MAX_BATCH);
    let main = main_runtime();
    redis.reset_stats();
    // `own` is no longer driven: the connection's driver and any sender on it wait.
    let lead = main.spawn({
        let store = store.clone();
        async move { timed(&store, "redlimit:{lead}").await }
    });
    std::thread::sleep(Duration::from_millis(30));
    let queued = main.spawn({
        let store = store.clone();
        async move { together(&store, "queued", 3).await }
    });
    std::thread::sleep(Duration::from_millis(50));
    let (calls_before, _) = script_calls(&redis);
    drop(own);
    let (lead, queued) = main.block_on(async { (lead.await.unwrap(), queued.await.unwrap()) });
    let later = main.block_on(one_by_one(&store, "later", 3));
    assert_eq!(calls_before, 0, "nothing reached Redis before the shutdown");
    let gone = queued.iter().filter(
        |(answer, _)| matches!(answer, Err(error) if error.to_string().contains("may have run")),
    );
    assert_eq!(
        gone.count(),
        0,
        "queued decisions no call carried told they may have run: lead {}; queued {}; later {}",
        show(&[lead]),
        show(&queued),
        show(&later)
    );
}

/// After the store's own runtime shut down (nothing in flight), the next runtime's decisions are
/// decided. Promise: "the store binds the runtime of its next call and reconnects there, so a
/// store outlives a runtime".
///
/// Guards against (single node): the first decision(s) after the shutdown fail with the dropped
/// connection's error: the `ConnectionManager` still holds the connection whose driver died
/// with the runtime, and only that failure makes it reconnect.
#[test]
fn after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    let redis = RedisServer::start();
    let own = main_runtime();
    let store = store_on(&own, &redis, Duration::from_millis(500), 64);
    drop(own);
    let next = main_runtime();
    let answers = next.block_on(one_by_one(&store, "next", 5));
    assert!(
        answers.iter().all(|(answer, _)| answer.is_ok()),
        "decisions after the store's runtime shut down: {}",
        show(&answers)
    );
}

/// The same on Cluster.
///
/// Guards against (Cluster): see the assertion's figures: the cluster connection's driver died with the
/// runtime, and nothing replaces the connection (`stale_server` names only `READONLY` and
/// `MASTERDOWN`), so decisions keep failing.
#[test]
fn on_cluster_after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    let cluster = RedisCluster::start();
    let own = main_runtime();
    let store = own.block_on(async {
        let store = RedisStore::cluster_builder(cluster.urls())
            .timeout(Duration::from_millis(500))
            .without_circuit_breaker()
            .build()
            .unwrap();
        store.verify().await.expect("cluster up");
        let _ = one_by_one(&store, "before", 3).await;
        store
    });
    drop(own);
    let next = main_runtime();
    let answers = next.block_on(async {
        let mut answers = one_by_one(&store, "next", 5).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        answers.extend(one_by_one(&store, "next-later", 5).await);
        answers
    });
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    assert!(
        answers[5..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} of {} decisions after the store's runtime shut down failed: {}",
        answers.len(),
        show(&answers)
    );
}

/// The store's own runtime idles (a current-thread runtime it was built in, no longer driven),
/// which the docs forbid ("It must keep running while the store is used"). What must still hold
/// (the brief's oracle): every decision of another runtime ends with a clear error or a
/// decision within its own timeout, never a stall past it.
#[test]
fn no_decision_waits_past_its_timeout_while_the_stores_runtime_idles() {
    let redis = RedisServer::start();
    let own = support::current_thread_runtime();
    let timeout = Duration::from_millis(300);
    let store = store_on(&own, &redis, timeout, 64);
    let main = main_runtime();
    let (lone, queued) = main.block_on(async {
        let lone = one_by_one(&store, "idle-own", 2).await;
        let queued = together(&store, "idle-own-queued", 20).await;
        (lone, queued)
    });
    drop(own);
    eprintln!("lone: {}\nqueued: {}", show(&lone), show(&queued));
    assert!(
        none_past(&lone, timeout + SLACK) && none_past(&queued, timeout + SLACK),
        "lone: {}\nqueued: {}",
        show(&lone),
        show(&queued)
    );
}

/// A store built outside any runtime binds its first caller's: here a short-lived helper
/// runtime (a startup check) that is then dropped. The main runtime's decisions are decided,
/// and none waits past its timeout.
#[test]
fn a_store_built_outside_any_runtime_outlives_its_first_callers_runtime() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_millis(500))
        .without_circuit_breaker()
        .build()
        .unwrap();
    {
        let startup = support::current_thread_runtime();
        startup.block_on(store.verify()).expect("Redis is up");
    }
    let main = main_runtime();
    let answers = main.block_on(async {
        let mut answers = one_by_one(&store, "after-startup", 5).await;
        answers.extend(together(&store, "after-startup-queued", 10).await);
        answers
    });
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    eprintln!("{failed} failed: {}", show(&answers));
    assert!(
        none_past(&answers, Duration::from_millis(500) + SLACK),
        "{}",
        show(&answers)
    );
    assert!(
        answers[1..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} failed: {}",
        show(&answers)
    );
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

/// Decisions dropped at every await: a queued one before its batch is sent, after it is sent,
/// the lone leader after its call is on the wire, and one dropped outside any poll. Promise:
/// "A decision whose caller went away before its call was sent is left out of it and consumes
/// nothing"; nothing is decided twice; and the group's bookkeeping is left clean (later
/// decisions go alone, as if nothing had happened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_dropped_at_every_await_consume_only_what_was_sent_and_leave_no_call_counted() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    warm_batch_script(&redis, &store).await;
    let key = "redlimit:{shared}";
    let quotas = shared_quota();
    for round in 0..3 {
        let before = consumed(&store, key).await;
        let sleeping = redis.debug_sleep(Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The leader: alone, its call on the wire behind the sleep.
        let mut lead = Box::pin(store.check(on_shared(key, &quotas, 1)));
        assert!(poll_once(&mut lead));
        // The first queued decision goes at once in a sender's call (behind the sleep too);
        // the rest wait for that call to end.
        let mut queued: Vec<_> = (0..20)
            .map(|_| Box::pin(store.check(on_shared(key, &quotas, 1))))
            .collect();
        for future in &mut queued {
            assert!(poll_once(future));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Dropped: the sender's first (already sent), every odd one (never sent), and on the
        // last round the leader (sent).
        let mut kept = Vec::new();
        for (i, future) in queued.into_iter().enumerate() {
            if i == 0 || i % 2 == 1 {
                drop(future);
            } else {
                kept.push(future);
            }
        }
        let lead_kept = if round == 2 {
            drop(lead);
            None
        } else {
            Some(lead)
        };
        let answers = join_all(kept).await;
        if let Some(lead) = lead_kept {
            lead.await.unwrap();
        }
        sleeping.join().unwrap();
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        // Sent: the leader, the first queued, the 9 kept even ones after the first (i = 2..18).
        let expected = 1 + 1 + answers.len() as u64;
        let after = consumed(&store, key).await;
        eprintln!(
            "round {round}: consumed {} for {expected} sent",
            after - before
        );
        assert_eq!(
            after - before,
            expected,
            "round {round}: consumed {} for {expected} decisions sent (10 dropped unsent)",
            after - before
        );
    }
    let (calls, batches, answers) = lone_and_fast(&redis, &store, "after-drops").await;
    assert!(
        calls == 3 && batches == 0 && all_decided_within(&answers, Duration::from_millis(200)),
        "later decisions: {calls} script calls, {batches} batch calls: {}",
        show(&answers)
    );
}

/// A queued decision polled once and then parked (never polled, never dropped) while its batch
/// is sent: the others queued with it are decided, the parked one is consumed once (its call
/// was sent), and later decisions go alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_queued_decision_holds_up_nothing_and_is_decided_once() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(1))
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    warm_batch_script(&redis, &store).await;
    let key = "redlimit:{parked-shared}";
    let quotas = shared_quota();
    let before = consumed(&store, key).await;
    let sleeping = redis.debug_sleep(Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let lead = store.check(on_shared(key, &quotas, 1));
    let rest = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Two queued: one in the sender's first call, one behind it; then the parked one.
        let first = store.check(on_shared(key, &quotas, 1));
        let second = store.check(on_shared(key, &quotas, 1));
        let mut parked = Box::pin(store.check(on_shared(key, &quotas, 1)));
        let started = Instant::now();
        let (first, second, parked_pending) = {
            let both = futures::future::join(first, second);
            tokio::pin!(both);
            let pending = poll_once(&mut parked);
            let (first, second) = both.await;
            (first, second, pending)
        };
        let took = started.elapsed();
        let others = together(&store, "around-parked", 5).await;
        (first, second, parked_pending, parked, took, others)
    };
    let (lead, (first, second, parked_pending, parked, took, others)) = tokio::join!(lead, rest);
    sleeping.join().unwrap();
    assert!(parked_pending);
    assert!(
        lead.is_ok() && first.is_ok() && second.is_ok(),
        "{lead:?} {first:?} {second:?}"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(
        all_decided_within(&others, Duration::from_millis(300)),
        "{}",
        show(&others)
    );
    let (calls, batches, later) = lone_and_fast(&redis, &store, "after-parked").await;
    // lead, first, second, parked: 4 consumed, whatever became of the parked future.
    let after = consumed(&store, key).await;
    drop(parked);
    assert_eq!(after - before, 4, "consumed");
    assert!(
        calls == 3 && batches == 0 && all_decided_within(&later, Duration::from_millis(200)),
        "later decisions beside a parked queued future: {calls} script calls, {batches} batch \
         calls: {}",
        show(&later)
    );
}

/// Guards against (documented only for the connection's driver, not for the sender): a task that polls
/// a queued decision once and then blocks its worker with synchronous work. The first poll
/// spawns the group's sender from that worker, into its LIFO slot, which no other worker
/// steals (tokio-rs/tokio#4941): every decision queued in that sender's group waits for the
/// blocked task's work. The docs (src/store/mod.rs, "The store's runtime") name this hazard
/// for "the connection's driver, which it woke into that slot"; they do not say that a queued
/// decision's first poll wakes the batch sender there, holding up other callers' queued
/// decisions ("No queued decision waits for another caller: not for its call, its task
/// (parked, or busy with synchronous work)").
#[test]
fn a_queued_decisions_first_poll_then_synchronous_work_holds_up_no_other_queued_decision() {
    let redis = RedisServer::start();
    let main = main_runtime();
    let timeout = Duration::from_millis(800);
    let store = store_on(&main, &redis, timeout, 64);
    let (queued, busy) = main.block_on(async {
        let sleeping = redis.debug_sleep(Duration::from_millis(150));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The lone leader, behind the sleep, on a task of its own.
        let lead = tokio::spawn({
            let store = store.clone();
            async move { timed(&store, "redlimit:{busy-lead}").await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A task polls its decision once (queued: it spawns the group's sender), then works.
        let busy = tokio::spawn({
            let store = store.clone();
            async move {
                let quotas = generous();
                let mut mine =
                    Box::pin(store.check(request("redlimit:{busy}", &quotas, Algorithm::Gcra)));
                let pending = poll_once(&mut mine);
                std::thread::sleep(Duration::from_millis(1500));
                (pending, mine.await.is_ok())
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued = tokio::spawn({
            let store = store.clone();
            async move { together(&store, "behind-busy-poll", 6).await }
        })
        .await
        .unwrap();
        let _ = lead.await;
        let busy = busy.await.unwrap();
        sleeping.join().unwrap();
        (queued, busy)
    });
    assert!(busy.0, "the busy task's decision was queued");
    assert!(
        all_decided_within(&queued, timeout),
        "other callers' decisions queued behind a sender spawned by a task that then blocked: {}",
        show(&queued)
    );
}

// ---------------------------------------------------------------------------------------------
// maxmemory.
// ---------------------------------------------------------------------------------------------

/// Every key with its type and content (strings' bytes; sorted sets' members and scores), no
/// TTLs: what two servers that decided the same must hold alike.
fn contents(redis: &RedisServer) -> Vec<(String, String)> {
    let mut conn = redis.conn();
    redis
        .keys()
        .into_iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
            let value = match kind.as_str() {
                "string" => {
                    let bytes: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
                    format!("{bytes:?}")
                }
                "zset" => {
                    let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(&mut conn)
                        .unwrap();
                    format!("{members:?}")
                }
                other => other.to_owned(),
            };
            (key, value)
        })
        .collect()
}

fn outcome(answer: &Result<Decision, StoreError>) -> String {
    match answer {
        Ok(decision) => format!(
            "allowed={} remaining={} retry={:?} suspended={} overridden={}",
            decision.allowed,
            decision.remaining,
            decision.retry_after,
            decision.suspended,
            decision.overridden
        ),
        Err(error) if error.to_string().contains("OOM") => "OOM".to_owned(),
        Err(error) => format!("error: {error}"),
    }
}

/// Sets up the same data on a server: keys at their limit, overrides (route and tenant-wide), a
/// tenant reset, a suspension, a log of another type, a clock that stepped back.
async fn mixed_fixture(redis: &RedisServer, now: u64) {
    let store = RedisStore::builder(redis.url())
        .timeout(support::PATIENT_TIMEOUT)
        .max_batch(1)
        .without_circuit_breaker()
        .build()
        .unwrap();
    let one: Quotas = Quota::per_hour(1).unwrap().into();
    let at = |key, algorithm, cost| CheckRequest {
        key,
        algorithm,
        quotas: &one,
        cost,
        now_micros: Some(now - 1_000_000),
    };
    for (key, algorithm) in [
        ("redlimit:{full-gcra}", Algorithm::Gcra),
        ("redlimit:{full-log}", Algorithm::SlidingLog),
        ("redlimit:{full-sw}", Algorithm::SlidingWindow),
        ("redlimit:{known-tb}", Algorithm::TokenBucket),
    ] {
        store.check(at(key, algorithm, 1)).await.unwrap();
    }
    // A log from a clock 10 s ahead: a later decision steps back (and repairs on a denial).
    let ahead = CheckRequest {
        now_micros: Some(now + 10_000_000),
        ..at("redlimit:{ahead-log}", Algorithm::SlidingLog, 1)
    };
    store.check(ahead).await.unwrap();
    let tight = Quotas::from(Quota::per_hour(2).unwrap());
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingLog] {
        let limiter = Limiter::builder(store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        let name = format!(
            "over-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        limiter.set_quota(name.as_str(), &tight).await.unwrap();
        let tenant = format!(
            "tenant-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        // A used route, then a tenant-wide override and a tenant reset.
        let route = Target::scoped("api", &tenant);
        let key = limiter.storage_key(route);
        store
            .check(CheckRequest {
                key: &key,
                algorithm,
                quotas: &one,
                cost: 1,
                now_micros: Some(now - 1_000_000),
            })
            .await
            .unwrap();
        limiter
            .set_quota(Target::all_routes(&tenant), &tight)
            .await
            .unwrap();
        limiter.reset(tenant.as_str()).await.unwrap();
        let suspended = format!(
            "susp-{}",
            if algorithm == Algorithm::SlidingLog {
                "log"
            } else {
                "tb"
            }
        );
        limiter
            .suspend(suspended.as_str(), Duration::from_secs(3600))
            .await
            .unwrap();
    }
    let mut conn = redis.conn();
    let _: () = redis::cmd("SET")
        .arg("redlimit:{string-log}")
        .arg("not a set")
        .query(&mut conn)
        .unwrap();
}

/// Copies every key of `from` (its bytes and its TTL) to `to`: twins with the same data.
fn copy_data(from: &RedisServer, to: &RedisServer) {
    let (mut source, mut target) = (from.conn(), to.conn());
    for key in from.keys() {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut source).unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut source).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(&key)
            .arg(ttl.max(0))
            .arg(dump)
            .arg("REPLACE")
            .query(&mut target)
            .unwrap();
    }
}

/// Decisions of every kind in one batch under `maxmemory` with `noeviction`, in several orders,
/// each compared with the same decision alone (`max_batch(1)`) on a twin server with the same
/// data and clock: the same outcome each, and the same data after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_maxmemory_a_mixed_batch_decides_each_as_alone_on_a_twin() {
    let now = 1_900_000_000_000_000u64;
    let one: Quotas = Quota::per_hour(1).unwrap().into();
    let eight = Quotas::new((0..8).map(|i| Quota::per_hour(1_000 + i).unwrap())).unwrap();
    let plenty = generous();
    // Whatever the key layout, ask a limiter: the route of a scoped target.
    let probe = Limiter::new(redlimit::store::MemoryStore::new());
    let log_tenant = probe.storage_key(Target::scoped("api", "tenant-log"));
    let tb_tenant = probe.storage_key(Target::scoped("api", "tenant-tb"));
    let plan: Vec<(String, Algorithm, &Quotas, u64)> = vec![
        (
            "redlimit:{known-tb}".into(),
            Algorithm::TokenBucket,
            &one,
            0,
        ), // peek
        ("redlimit:{full-gcra}".into(), Algorithm::Gcra, &one, 1), // denial
        ("redlimit:{full-log}".into(), Algorithm::SlidingLog, &one, 1), // denial
        (
            "redlimit:{full-sw}".into(),
            Algorithm::SlidingWindow,
            &one,
            0,
        ), // peek
        (
            "redlimit:{string-log}".into(),
            Algorithm::SlidingLog,
            &one,
            0,
        ), // peek, foreign
        ("redlimit:{susp-tb}".into(), Algorithm::TokenBucket, &one, 1), // suspended
        ("redlimit:{susp-log}".into(), Algorithm::SlidingLog, &one, 1), // suspended
        (
            "redlimit:{ahead-log}".into(),
            Algorithm::SlidingLog,
            &one,
            5,
        ), // stepped back, denied
        ("redlimit:{new-log}".into(), Algorithm::SlidingLog, &one, 1), // admission
        (
            "redlimit:{known-tb}".into(),
            Algorithm::TokenBucket,
            &plenty,
            1,
        ), // admission
        ("redlimit:{eight}".into(), Algorithm::FixedWindow, &eight, 3), // 8 tiers
        ("redlimit:{over-tb}".into(), Algorithm::TokenBucket, &one, 1), // override admits
        ("redlimit:{over-log}".into(), Algorithm::SlidingLog, &one, 1), // override admits
        (tb_tenant.clone(), Algorithm::TokenBucket, &one, 1),      // tenant reset + override
        (log_tenant.clone(), Algorithm::SlidingLog, &one, 1),      // tenant reset (DEL)
        (
            "redlimit:{string-log}".into(),
            Algorithm::SlidingLog,
            &one,
            1,
        ), // foreign: DEL
        ("redlimit:{new-gcra}".into(), Algorithm::Gcra, &one, 1),  // admission
    ];
    // Several orders: as written, reversed, denials and peeks last, writers first.
    let mut orders: Vec<Vec<usize>> =
        vec![(0..plan.len()).collect(), (0..plan.len()).rev().collect()];
    let mut rotated: Vec<usize> = (0..plan.len()).collect();
    rotated.rotate_left(8);
    orders.push(rotated);
    let mut shuffled: Vec<usize> = (0..plan.len()).collect();
    // A fixed permutation (multiplicative, 17 entries).
    shuffled.sort_by_key(|i| (i * 7) % plan.len());
    orders.push(shuffled);
    let mut failures = Vec::new();
    for (o, order) in orders.iter().enumerate() {
        let batched_redis = RedisServer::start();
        let alone_redis = RedisServer::start();
        mixed_fixture(&batched_redis, now).await;
        copy_data(&batched_redis, &alone_redis);
        let batched = RedisStore::builder(batched_redis.url())
            .timeout(support::PATIENT_TIMEOUT)
            .max_batch(MAX_BATCH)
            .without_circuit_breaker()
            .build()
            .unwrap();
        let alone = RedisStore::builder(alone_redis.url())
            .timeout(support::PATIENT_TIMEOUT)
            .max_batch(1)
            .without_circuit_breaker()
            .build()
            .unwrap();
        batched.verify().await.unwrap();
        alone.verify().await.unwrap();
        // The batch script loaded (its warm-up keys then deleted on both twins alike).
        warm_batch_script(&batched_redis, &batched).await;
        let mut conn = batched_redis.conn();
        for i in 0..4 {
            let _: () = redis::cmd("DEL")
                .arg(format!("redlimit:{{warm-{i}}}"))
                .query(&mut conn)
                .unwrap();
        }
        for redis in [&batched_redis, &alone_redis] {
            out_of_memory(redis);
        }
        let requests: Vec<CheckRequest<'_>> = order
            .iter()
            .map(|&i| {
                let (key, algorithm, quotas, cost) = &plan[i];
                CheckRequest {
                    key,
                    algorithm: *algorithm,
                    quotas,
                    cost: *cost,
                    now_micros: Some(now),
                }
            })
            .collect();
        let before_batched = contents(&batched_redis);
        assert_eq!(before_batched, contents(&alone_redis), "twins start alike");
        // Batched: a peek in flight, then the whole plan queued behind it in one call.
        batched_redis.reset_stats();
        let sleeping = batched_redis.debug_sleep(Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let lead_key = "redlimit:{lead-peek}";
        let lead = batched.check(CheckRequest {
            cost: 0,
            ..request(lead_key, &one, Algorithm::Gcra)
        });
        let queued = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            // A sender's first call carries the first queued decision alone: a peek first.
            let first = batched.check(CheckRequest {
                cost: 0,
                ..request("redlimit:{first-peek}", &one, Algorithm::Gcra)
            });
            let rest = async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                join_all(requests.iter().map(|r| batched.check(*r))).await
            };
            tokio::join!(first, rest).1
        };
        let (_, batched_answers) = tokio::join!(lead, queued);
        sleeping.join().unwrap();
        let (calls, batches) = script_calls(&batched_redis);
        let refused = batched_answers
            .iter()
            .filter(|a| outcome(a) == "OOM")
            .count();
        eprintln!(
            "order {o}: {calls} script calls, {batches} batch calls; {refused} of {} refused \
             with OOM",
            batched_answers.len()
        );
        let stats = batched_redis.info("commandstats");
        assert!(
            batches == 1 && calls <= 4,
            "the plan went in one batch call: {calls} calls: {stats}"
        );
        assert!(refused >= 5, "writers refused under maxmemory: {refused}");
        let mut alone_answers = Vec::new();
        for r in &requests {
            alone_answers.push(alone.check(*r).await);
        }
        for (k, (b, a)) in batched_answers.iter().zip(&alone_answers).enumerate() {
            let (b, a) = (outcome(b), outcome(a));
            if b != a {
                failures.push(format!(
                    "order {o}, #{k} {}: batched {b} / alone {a}",
                    plan[order[k]].0
                ));
            }
        }
        let (after_b, after_a) = (contents(&batched_redis), contents(&alone_redis));
        if after_b != after_a {
            let differ: Vec<_> = after_b
                .iter()
                .zip(&after_a)
                .filter(|(b, a)| b != a)
                .collect();
            failures.push(format!(
                "order {o}: data differ: {differ:?} ({} / {} keys)",
                after_b.len(),
                after_a.len()
            ));
        }
        if after_b != before_batched {
            failures.push(format!("order {o}: written past maxmemory"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ---------------------------------------------------------------------------------------------
// The size bound.
// ---------------------------------------------------------------------------------------------

/// Full batches at MAX_BATCH of sliding logs with eight tiers, a high cost (1 000 units each)
/// and long keys (2 000 bytes), behind a call in flight: every decision decided, each admitted
/// with what it would be alone, and (reported) how long Redis ran one such call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_batches_of_costly_eight_tier_sliding_logs_with_long_keys_are_decided() {
    let redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .timeout(Duration::from_secs(30))
        .max_batch(MAX_BATCH)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    warm_batch_script(&redis, &store).await;
    let eight = Quotas::new((0..8).map(|i| Quota::per_hour(5_000 + i).unwrap())).unwrap();
    let count = MAX_BATCH + MAX_BATCH / 2;
    let pad = "x".repeat(2_000);
    let keys: Vec<String> = (0..count)
        .map(|i| format!("redlimit:{{big-{i}-{pad}}}"))
        .collect();
    redis.reset_stats();
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let lead = store.check(request(
        "redlimit:{big-lead}",
        &eight,
        Algorithm::SlidingLog,
    ));
    let started = Instant::now();
    let queued = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        join_all(keys.iter().map(|key| {
            store.check(CheckRequest {
                cost: 1_000,
                ..request(key, &eight, Algorithm::SlidingLog)
            })
        }))
        .await
    };
    let (lead, answers) = tokio::join!(lead, queued);
    let took = started.elapsed();
    sleeping.join().unwrap();
    lead.unwrap();
    let stats = redis.info("commandstats");
    let evalsha = support::info_field(&stats, "cmdstat_evalsha")
        .unwrap_or("")
        .to_owned();
    let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
    eprintln!("{count} costly decisions in {took:?}; {evalsha}");
    assert!(
        failed.is_empty(),
        "{} of {count} failed, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    for answer in &answers {
        let decision = answer.as_ref().unwrap();
        assert!(
            decision.allowed && decision.remaining == 4_000,
            "{decision:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Faults mid-batch, and the timing oracle.
// ---------------------------------------------------------------------------------------------

/// `DEBUG SLEEP` past the timeout with a leader and a queue (several full batches): every
/// decision answers within its own timeout plus the slack; what is consumed is no more than the
/// calls sent (the leader's and the sender's first); the decisions that timed out before their
/// call was sent consume nothing; and later decisions go alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_past_the_timeout_answers_each_within_its_timeout_and_consumes_only_what_was_sent()
{
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    warm_batch_script(&redis, &store).await;
    let key = "redlimit:{slept}";
    let quotas = shared_quota();
    let before = consumed(&store, key).await;
    let sleeping = redis.debug_sleep(Duration::from_millis(900));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let one = |store: &RedisStore| {
        let store = store.clone();
        async move {
            let quotas = shared_quota();
            let started = Instant::now();
            let answer = store.check(on_shared("redlimit:{slept}", &quotas, 1)).await;
            (answer, started.elapsed())
        }
    };
    let lead = tokio::spawn(one(&store));
    tokio::time::sleep(Duration::from_millis(20)).await;
    // 200 queued, arriving over 150 ms.
    let mut queued = Vec::new();
    for i in 0..200 {
        queued.push(tokio::spawn(one(&store)));
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
    let mut answers = vec![lead.await.unwrap()];
    for task in queued {
        answers.push(task.await.unwrap());
    }
    sleeping.join().unwrap();
    let _ = &quotas;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let used = consumed(&store, key).await - before;
    let worst = answers.iter().map(|(_, took)| *took).max().unwrap();
    let timed_out = answers
        .iter()
        .filter(|(a, _)| matches!(a, Err(StoreError::Timeout(_))))
        .count();
    assert!(
        none_past(&answers, timeout + SLACK),
        "worst {worst:?} (timeout {timeout:?}): {}",
        show(&answers)
    );
    // Never more than once each (a full queue goes at once, so most calls were on the wire).
    assert!(
        used <= 201,
        "consumed {used} for 201 decisions of which {timed_out} timed out"
    );
    eprintln!("consumed {used} for 201 decisions of which {timed_out} timed out; worst {worst:?}");
    let (calls, batches, later) = lone_and_fast(&redis, &store, "after-sleep").await;
    assert!(
        calls == 3 && batches == 0 && all_decided_within(&later, Duration::from_millis(200)),
        "consumed {used}; later: {calls} calls, {batches} batches: {}",
        show(&later)
    );
}

/// Redis killed (SIGKILL) with a leader and a queue in flight, then started again: every decision
/// answers within its timeout plus the slack, and after the restart decisions are decided
/// again, alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_batch_answers_each_within_its_timeout_and_the_store_recovers() {
    let mut redis = RedisServer::start();
    let timeout = Duration::from_millis(400);
    let store = RedisStore::builder(redis.url())
        .timeout(timeout)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    warm_batch_script(&redis, &store).await;
    let _sleeping = redis.debug_sleep(Duration::from_millis(2_000));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let lead = tokio::spawn({
        let store = store.clone();
        async move { timed(&store, "redlimit:{killed-lead}").await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let queued = tokio::spawn({
        let store = store.clone();
        async move { together(&store, "killed-queued", 100).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    redis.stop();
    let mut answers = vec![lead.await.unwrap()];
    answers.extend(queued.await.unwrap());
    let worst = answers.iter().map(|(_, took)| *took).max().unwrap();
    let failed = answers.iter().filter(|(a, _)| a.is_err()).count();
    eprintln!(
        "killed mid-batch: {failed} of {} failed, worst {worst:?}",
        answers.len()
    );
    assert!(none_past(&answers, timeout + SLACK), "{}", show(&answers));
    redis.restart();
    // Reconnecting takes a few calls at most (the manager backs off from 10 ms).
    let mut recovered = None;
    for attempt in 0..40 {
        let (answer, _) = timed(&store, &format!("redlimit:{{after-restart-{attempt}}}")).await;
        if answer.is_ok() {
            recovered = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered.is_some(), "no decision after the restart");
    let (calls, batches, later) = lone_and_fast(&redis, &store, "after-restart-lone").await;
    eprintln!(
        "recovered after {recovered:?} attempts; later {calls} calls {batches} batches: {}",
        show(&later)
    );
    assert!(
        calls >= 3 && batches == 0 && all_decided_within(&later, Duration::from_millis(300)),
        "recovered after {recovered:?} attempts; later: {calls} calls, {batches} batches: {}",
        show(&later)
    );
}

/// `SCRIPT FLUSH` after the store's own runtime shut down (the script load then runs on the
/// runtime the store binds next): queued decisions and lone ones are decided.
#[test]
fn a_script_flush_after_the_stores_runtime_shut_down_is_survived_by_batches() {
    let redis = RedisServer::start();
    let own = main_runtime();
    let store = store_on(&own, &redis, Duration::from_secs(1), 64);
    drop(own);
    let next = main_runtime();
    let (first, queued, lone) = next.block_on(async {
        // Let the store reconnect on this runtime (see the finding above: a first call may fail).
        let first = one_by_one(&store, "rebind", 3).await;
        redis.script_flush();
        let sleeping = redis.debug_sleep(Duration::from_millis(150));
        tokio::time::sleep(Duration::from_millis(20)).await;
        let lead = timed(&store, "redlimit:{flush-lead}");
        let rest = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            together(&store, "flush-queued", 30).await
        };
        let (lead, mut queued) = tokio::join!(lead, rest);
        sleeping.join().unwrap();
        queued.insert(0, lead);
        let lone = one_by_one(&store, "flush-lone", 3).await;
        (first, queued, lone)
    });
    assert!(
        all_decided_within(&queued, Duration::from_secs(1))
            && all_decided_within(&lone, Duration::from_secs(1)),
        "first after the rebind: {}\nqueued after SCRIPT FLUSH: {}\nlone: {}",
        show(&first),
        show(&queued),
        show(&lone)
    );
}

/// Cluster: queues on several slots (keys on every master) behind calls held by `DEBUG SLEEP`
/// on every master, and one master killed meanwhile. Each decision answers within its timeout
/// plus the slack; the other masters' decisions are decided; and after, decisions on the
/// surviving masters are decided at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_master_killed_with_queues_on_several_slots_holds_up_no_other_slot() {
    let mut cluster = RedisCluster::start();
    let timeout = Duration::from_millis(500);
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(timeout)
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    // Keys on each master: two slots per master, ten keys per slot (one hash tag each).
    let mut tags: Vec<Vec<String>> = vec![Vec::new(); 3];
    let mut i = 0;
    while tags.iter().any(|t| t.len() < 2) {
        let tag = format!("slot-{i}");
        let node = cluster.node_for_key(&tag);
        if tags[node].len() < 2 {
            tags[node].push(tag);
        }
        i += 1;
    }
    let keys_of = |node: usize| -> Vec<String> {
        tags[node]
            .iter()
            .flat_map(|tag| (0..10).map(move |k| format!("redlimit:{{{tag}}}{k}")))
            .collect()
    };
    let all: Vec<(usize, String)> = (0..3)
        .flat_map(|n| keys_of(n).into_iter().map(move |k| (n, k)))
        .collect();
    // Warm: the batch script on every master.
    let _ = join_all(all.iter().map(|(_, key)| timed(&store, key))).await;
    let sleeps: Vec<_> = cluster
        .nodes()
        .iter()
        .map(|node| node.debug_sleep(Duration::from_millis(400)))
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let run = tokio::spawn({
        let store = store.clone();
        let all = all.clone();
        async move {
            join_all(all.iter().map(|(node, key)| {
                let store = store.clone();
                async move { (*node, timed(&store, key).await) }
            }))
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    cluster.node_mut(1).stop();
    let answers = run.await.unwrap();
    for (n, sleep) in sleeps.into_iter().enumerate() {
        if n != 1 {
            let _ = sleep.join();
        }
    }
    let late: Vec<_> = answers
        .iter()
        .filter(|(_, (_, took))| *took > timeout + SLACK)
        .collect();
    let survivors_failed: Vec<_> = answers
        .iter()
        .filter(|(node, (answer, _))| *node != 1 && answer.is_err())
        .collect();
    let mut after = Vec::new();
    for node in [0, 2] {
        for key in keys_of(node).iter().take(3) {
            after.push(timed(&store, key).await);
        }
    }
    let dead = answers
        .iter()
        .filter(|(n, _)| *n == 1)
        .map(|(_, a)| a)
        .collect::<Vec<_>>();
    let worst = answers.iter().map(|(_, (_, took))| *took).max().unwrap();
    eprintln!(
        "cluster: worst {worst:?}; dead master's {} of {} failed; survivors' failed {}; after: {}",
        dead.iter().filter(|(a, _)| a.is_err()).count(),
        dead.len(),
        survivors_failed.len(),
        show(&after)
    );
    assert!(
        late.is_empty()
            && survivors_failed.is_empty()
            && all_decided_within(&after, Duration::from_millis(300)),
        "late: {late:?}\nsurviving masters' decisions failed: {survivors_failed:?}\nafter: {}\n\
         (dead master's: {} of {} failed)",
        show(&after),
        dead.iter().filter(|(a, _)| a.is_err()).count(),
        dead.len()
    );
}

/// Guards against: one batch call carries the Redis work of up to MAX_BATCH decisions, and Redis runs it
/// as one script: 1 024 sliding-log admissions of 4 000 units each (burst 5 000, the log's
/// O(burst) work per decision) make one `EVALSHA` that runs for seconds, past Redis's
/// `busy-reply-threshold` (5 s): meanwhile Redis answers `BUSY` to every other client (here a
/// second store, another instance of the fleet), and the script cannot be killed (it wrote).
/// Sent alone (`max_batch(1)`), the same decisions are separate scripts of ~10 ms each: the
/// other instance waits (Redis reads one client's pipelined commands together) but is never
/// refused with `BUSY`. Promise (src/store/mod.rs, "Batching"): "Nothing
/// else changes for a user ... What changes is the cost"; docs/production.md: "only Redis's
/// cost per decision drops".
#[test]
fn a_full_batch_of_costly_decisions_keeps_other_clients_decided_as_alone() {
    let mut figures = Vec::new();
    let mut busies = Vec::new();
    for max_batch in [MAX_BATCH, 1] {
        let redis = RedisServer::start();
        let main = main_runtime();
        let store = store_on(&main, &redis, Duration::from_secs(60), max_batch);
        let other = store_on(&main, &redis, Duration::from_secs(1), 1);
        let quotas: Quotas = Quota::per_hour(5_000).unwrap().into();
        let keys: Vec<String> = (0..MAX_BATCH + 1)
            .map(|i| format!("redlimit:{{costly-{i}}}"))
            .collect();
        let (admitted, other_answers, took) = main.block_on(async {
            let started = Instant::now();
            let costly = async {
                join_all(keys.iter().map(|key| {
                    store.check(CheckRequest {
                        cost: 4_000,
                        ..request(key, &quotas, Algorithm::SlidingLog)
                    })
                }))
                .await
            };
            let beside = async {
                let mut answers = Vec::new();
                tokio::time::sleep(Duration::from_millis(200)).await;
                while started.elapsed() < Duration::from_secs(8) {
                    answers.push(
                        timed(&other, &format!("redlimit:{{other-{}}}", answers.len())).await,
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                answers
            };
            let (costly, beside) = tokio::join!(costly, beside);
            let admitted = costly
                .iter()
                .filter(|a| matches!(a, Ok(d) if d.allowed))
                .count();
            (admitted, beside, started.elapsed())
        });
        let stats = redis.info("commandstats");
        let evalsha = support::info_field(&stats, "cmdstat_evalsha")
            .unwrap_or("")
            .to_owned();
        let busy = other_answers
            .iter()
            .filter(|(a, _)| matches!(a, Err(e) if e.to_string().contains("BUSY")))
            .count();
        let failed = other_answers.iter().filter(|(a, _)| a.is_err()).count();
        figures.push(format!(
            "max_batch {max_batch}: {admitted} of {} admitted in {took:.1?} ({evalsha}); the other \
             instance: {failed} of {} failed ({busy} BUSY)",
            keys.len(),
            other_answers.len()
        ));
        figures.push(show(&other_answers));
        busies.push(busy);
    }
    eprintln!("{figures:#?}");
    // The control: alone, Redis never refuses the other instance with BUSY (it may make it
    // wait: Redis reads a client's pipelined commands together).
    assert_eq!(busies[1], 0, "{figures:#?}");
    assert_eq!(
        busies[0], 0,
        "BUSY answers to the other instance: {figures:#?}"
    );
}

/// A store's first connection attempt runs on the store's runtime (here the runtime it was built
/// in); that runtime shuts down while the attempt waits for a server that accepted the TCP
/// connection but has not answered yet. Once the server answers, the next runtime's decisions
/// are decided. Promise (src/store/mod.rs, "The store's runtime"): "the store binds the runtime
/// of its next call and reconnects there, so a store outlives a runtime".
///
/// Guards against: the attempt's task is dropped with the runtime and never records an outcome, so the
/// connection slot stays `Attempt::Running` with a future that has already ended
/// (`Replaceable::wait_ready`, src/store/redis/connection.rs): every later call joins it, hears
/// "connection attempt abandoned" at once, and no new attempt ever starts (`settle` replaces
/// only a slot that has a connection). The store never connects again.
#[test]
fn a_connection_attempt_dropped_with_the_stores_runtime_is_made_again_on_the_next() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    redis.stop();
    // A server that accepts (the kernel's backlog) and never answers `HELLO`.
    let silent = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port again");
    let own = main_runtime();
    let store = {
        let _inside = own.enter();
        RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
            .timeout(Duration::from_millis(300))
            .without_circuit_breaker()
            .build()
            .unwrap()
    };
    let first = own.block_on(timed(&store, "redlimit:{first}"));
    // The attempt goes on in the background (up to 10 s): the runtime shuts down meanwhile.
    own.shutdown_timeout(Duration::from_millis(100));
    drop(silent);
    redis.restart();
    let next = main_runtime();
    let answers = next.block_on(async {
        let mut answers = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            answers.push(timed(&store, &format!("redlimit:{{next-{}}}", answers.len())).await);
            if answers.last().unwrap().0.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        answers
    });
    assert!(
        answers.last().unwrap().0.is_ok(),
        "first (its attempt then dropped): {}\n{} decisions over 4 s after the restart: {}",
        show(&[first]),
        answers.len(),
        show(&answers[answers.len().saturating_sub(3)..])
    );
}

/// Guards against: a `SCRIPT LOAD` task dropped with the store's runtime before it ran (the runtime's
/// workers busy, then shut down) leaves its `Reloads` entry `running` for good (only the task
/// clears it, src/store/redis/reload.rs): every later `NOSCRIPT` joins that ended load, hears
/// "SCRIPT LOAD task ended without an answer", and sends the whole script body with `EVAL`.
/// Promise (src/store/redis/reload.rs, and src/store/mod.rs: "the one `SCRIPT LOAD` after
/// `NOSCRIPT`"): one flush costs one load per script, not one `EVAL` of the body per call.
#[test]
fn a_script_load_dropped_with_the_stores_runtime_leaves_one_load_per_flush() {
    let redis = RedisServer::start();
    let own = main_runtime();
    let timeout = Duration::from_millis(300);
    let store = store_on(&own, &redis, timeout, 1);
    let main = main_runtime();
    let rebound = main.block_on(async {
        // The connection is made again from this runtime (its driver then lives here: see the
        // first finding), so that only the store's own tasks are left on `own`.
        redis.client_kill_normal();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut rebound = Vec::new();
        for i in 0..5 {
            rebound.push(timed(&store, &format!("redlimit:{{rebind-{i}}}")).await);
            if rebound.last().unwrap().0.is_ok() {
                break;
            }
        }
        rebound
    });
    // Both of `own`'s workers busy: the load after the next NOSCRIPT waits in its queue.
    for _ in 0..2 {
        own.spawn(async { std::thread::sleep(Duration::from_millis(1200)) });
    }
    std::thread::sleep(Duration::from_millis(100));
    redis.script_flush();
    let stalled = main.block_on(timed(&store, "redlimit:{stalled}"));
    own.shutdown_background();
    std::thread::sleep(Duration::from_millis(1500));
    redis.script_flush();
    redis.reset_stats();
    let answers = main.block_on(together(&store, "after-flush", 50));
    let loads = redis.command_calls("script|load");
    let evals = redis.command_calls("eval");
    let figures = format!(
        "after a flush, 50 concurrent decisions sent {loads} SCRIPT LOAD and {evals} EVAL \
         (rebind: {}; the decision whose load waited on the busy runtime: {}; answers: {})",
        show(&rebound),
        show(&[stalled]),
        show(&answers[..3])
    );
    eprintln!("{figures}");
    assert!(all_decided_within(&answers, timeout + SLACK), "{figures}");
    assert!(loads <= 1 && evals <= 1, "{figures}");
}

/// The store's own runtime (multi-thread) shuts down with a batch on the wire and decisions
/// queued behind it: those on the wire hear that they may have run (not a stall), those never
/// sent are sent alone and decided, each within its timeout plus the slack, and nothing is
/// consumed twice.
///
/// Guards against (same cause as `after_the_stores_runtime_shut_down_the_next_decisions_are_decided`):
/// of the nine decisions never sent, the first sent alone fails with `broken pipe`, the error
/// of the connection whose driver died with the runtime; the other eight are decided.
#[test]
fn the_stores_runtime_shut_down_mid_batch_fails_only_what_was_on_the_wire() {
    let redis = RedisServer::start();
    let own = main_runtime();
    let timeout = Duration::from_millis(1500);
    let store = store_on(&own, &redis, timeout, 64);
    let main = main_runtime();
    let key = "redlimit:{mid-batch}";
    let before = main.block_on(consumed(&store, key));
    let sleeping = redis.debug_sleep(Duration::from_millis(400));
    std::thread::sleep(Duration::from_millis(20));
    let one = |store: &RedisStore| {
        let store = store.clone();
        async move {
            let quotas = shared_quota();
            let started = Instant::now();
            let answer = store
                .check(on_shared("redlimit:{mid-batch}", &quotas, 1))
                .await;
            (answer, started.elapsed())
        }
    };
    let lead = main.spawn(one(&store));
    std::thread::sleep(Duration::from_millis(20));
    let queued: Vec<_> = (0..10).map(|_| main.spawn(one(&store))).collect();
    std::thread::sleep(Duration::from_millis(60));
    own.shutdown_timeout(Duration::from_millis(100));
    let (lead, queued) = main.block_on(async {
        let lead = lead.await.unwrap();
        let mut answers = Vec::new();
        for task in queued {
            answers.push(task.await.unwrap());
        }
        (lead, answers)
    });
    sleeping.join().unwrap();
    let used = main.block_on(async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        consumed(&store, key).await
    }) - before;
    let decided = queued.iter().filter(|(a, _)| a.is_ok()).count();
    let figures = format!(
        "consumed {used}; lead {}; queued ({decided} decided): {}",
        show(std::slice::from_ref(&lead)),
        show(&queued)
    );
    eprintln!("{figures}");
    assert!(none_past(&queued, timeout + SLACK), "{figures}");
    // The first queued decision went in the sender's call; the other nine were never sent.
    assert!(decided >= 9, "{figures}");
    assert!(used <= 11 && used as usize >= decided, "{figures}");
}

/// The same on Sentinel (a plain connection to the primary, replaced when dropped).
#[test]
fn through_sentinel_after_the_stores_runtime_shut_down_the_next_decisions_are_decided() {
    use support::sentinel::{RedisSentinel, MASTER_NAME};
    let setup = RedisSentinel::start();
    let own = main_runtime();
    let store = own.block_on(async {
        let store = RedisStore::sentinel_builder(setup.sentinel_urls(), MASTER_NAME)
            .timeout(Duration::from_millis(500))
            .without_circuit_breaker()
            .build()
            .unwrap();
        store.verify().await.expect("verify via Sentinel");
        let _ = one_by_one(&store, "before", 3).await;
        store
    });
    drop(own);
    let next = main_runtime();
    let answers = next.block_on(one_by_one(&store, "next", 5));
    let failed = answers.iter().filter(|(answer, _)| answer.is_err()).count();
    eprintln!("sentinel: {failed} failed: {}", show(&answers));
    assert!(
        answers[1..].iter().all(|(answer, _)| answer.is_ok()),
        "{failed} of {} decisions after the store's runtime shut down failed: {}",
        answers.len(),
        show(&answers)
    );
}

/// Cluster: a slot moved for good (its keys migrated, `SETSLOT NODE`) just before a burst of
/// decisions on it and on another slot of the same master: the store's slot map is stale, so
/// the batch of the moved slot meets `MOVED` and its decisions go again alone. Each decision is
/// decided once: each shared key's consumption equals the decisions answered, in every round
/// (the slot moved back and forth).
// Open finding: in the full suite (2 of 2 runs; it passed 6 of 6 runs alone), a lone peek
// after the moves kept answering `MOVED` past the store's 4 resends for 750 ms; the decisions
// under test are counted right when it passes.
#[ignore = "open: a peek after the slot's moves answers MOVED past the store's resends in the full suite"]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_cluster_a_slot_moved_under_queues_decides_each_decision_once() {
    let cluster = RedisCluster::start();
    let store = RedisStore::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(2))
        .without_circuit_breaker()
        .build()
        .unwrap();
    store.verify().await.unwrap();
    let moved_key = "redlimit:{moving}";
    let home = cluster.node_for_key(moved_key);
    let slot = cluster.slot_of(moved_key);
    // A key of another slot on the same master.
    let other_key = (0..)
        .map(|i| format!("redlimit:{{still-{i}}}"))
        .find(|key| cluster.node_for_key(key) == home && cluster.slot_of(key) != slot)
        .unwrap();
    let away = (home + 1) % 3;
    let quotas = shared_quota();
    let mut figures = Vec::new();
    let mut expected = [0u64; 2];
    for round in 0..4 {
        // Warm the slot map, then move the slot without telling the store.
        let _ = consumed(&store, moved_key).await;
        let (from, to) = if round % 2 == 0 {
            (home, away)
        } else {
            (away, home)
        };
        cluster.begin_slot_migration(slot, from, to);
        while cluster.migrate_keys(slot, from, to, 100) > 0 {}
        cluster.finish_slot_migration(slot, from, to);
        let answers = join_all((0..60).map(|i| {
            let key = if i % 2 == 0 {
                moved_key
            } else {
                other_key.as_str()
            };
            let store = store.clone();
            async move { (i % 2, store.check(on_shared(key, &quotas, 1)).await) }
        }))
        .await;
        let mut decided = [0u64; 2];
        let mut failed = Vec::new();
        for (which, answer) in &answers {
            match answer {
                Ok(_) => decided[*which] += 1,
                Err(error) => failed.push(error.to_string()),
            }
        }
        expected[0] += decided[0];
        expected[1] += decided[1];
        let used = [
            consumed(&store, moved_key).await,
            consumed(&store, &other_key).await,
        ];
        figures.push(format!(
            "round {round}: decided {decided:?}, consumed in all {used:?} (answered in all \
             {expected:?}), failed {failed:?}"
        ));
        assert!(failed.is_empty() && used == expected, "{figures:#?}");
    }
    eprintln!("{figures:#?}");
}
