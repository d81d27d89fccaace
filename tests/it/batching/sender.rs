//! The batch sender is the store's own: no queued decision depends on another caller's task,
//! poll or runtime (`src/store/redis/batch.rs`, `src/store/redis/runtime.rs`). Each test holds
//! Redis with `DEBUG SLEEP` so that a first call is in flight and the decisions behind it queue
//! for certain, then makes that first call's caller misbehave: its runtime idles, its task does
//! synchronous work, its runtime shuts down, its future is parked.

use crate::support;

use std::future::Future;
use std::time::Duration;

use redlimit::store::{RedisStore, StoreError, DEFAULT_MAX_BATCH};
use redlimit::Decision;
use support::RedisServer;

use super::{decide, helper_runtime, runtime_and_store, together, together_owned};

/// The main runtime of these tests: a multi-thread one, as an application's.
pub(crate) fn main_runtime() -> tokio::runtime::Runtime {
    support::multi_thread_runtime()
}

/// A private Redis, the main runtime, and a store on that Redis built on it (see
/// [`runtime_and_store`]) with `timeout`, batching as by default.
fn on_main_runtime(timeout: Duration) -> (RedisServer, tokio::runtime::Runtime, RedisStore) {
    let redis = RedisServer::start();
    let (main, store) = runtime_and_store(main_runtime(), &redis, timeout, DEFAULT_MAX_BATCH);
    (redis, main, store)
}

/// Asserts that every answer was decided by Redis within `within_ms` ms; `what` says which
/// answers they are, the answers follow.
fn assert_all_decided(
    answers: &[(Result<Decision, StoreError>, Duration)],
    within_ms: u64,
    what: &str,
) {
    let within = Duration::from_millis(within_ms);
    let decided = answers
        .iter()
        .all(|(answer, took)| answer.is_ok() && *took < within);
    assert!(decided, "{what}: {answers:?}");
}

/// A store shared with a second runtime (a current-thread one in a helper thread) that made
/// one decision, the first call in flight, and then idles undriven: the decisions queued
/// behind it on the main runtime, and every later decision, are decided without it.
#[test]
fn an_idle_runtime_that_made_the_call_in_flight_stalls_no_queued_decision() {
    let (redis, main, store) = on_main_runtime(Duration::from_secs(1));
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(30));
    // Idle once it decided: the runtime lives on, undriven, until the test ends.
    let (helper_decided, release, helper) = helper_runtime(&store, |store| async move {
        decide(&store, "redlimit:{helper}").await.is_ok()
    });
    std::thread::sleep(Duration::from_millis(30));
    let (queued, later) = main.block_on(async {
        let queued = together(&store, "queued", 4).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut later = Vec::new();
        for i in 0..3 {
            later.extend(together(&store, &format!("later-{i}"), 1).await);
        }
        (queued, later)
    });
    sleeping.join().unwrap();
    assert!(helper_decided.recv().unwrap(), "the helper's own decision");
    release.send(()).unwrap();
    helper.join().unwrap();
    assert_all_decided(
        &queued,
        900,
        "decisions queued behind an idle runtime's call",
    );
    assert_all_decided(&later, 200, "lone decisions after it, Redis idle");
}

/// The task whose call was in flight goes on with a second of synchronous work right after its
/// decision (as a handler may after the layer's check): the decisions queued behind its call
/// do not wait for that work.
#[test]
fn queued_decisions_do_not_wait_for_the_first_callers_synchronous_work() {
    let (redis, main, store) = on_main_runtime(Duration::from_millis(600));
    let (queued, first) = main.block_on(async {
        let sleeping = redis.debug_sleep(Duration::from_millis(150));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let first = {
            let store = store.clone();
            tokio::spawn(async move {
                let answer = decide(&store, "redlimit:{busy}").await;
                // Synchronous work in the same task, without yielding.
                std::thread::sleep(Duration::from_secs(1));
                answer.is_ok()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued = together(&store, "behind-busy", 6).await;
        let first = first.await.unwrap();
        sleeping.join().unwrap();
        (queued, first)
    });
    assert!(first, "the busy task's own decision");
    assert_all_decided(
        &queued,
        500,
        "decisions queued behind a task that went on with synchronous work",
    );
}

/// A runtime that is not the store's (a third one, whose task made the call in flight) shuts
/// down: the decisions queued behind that call on the main runtime are still decided.
#[test]
fn another_runtimes_shutdown_fails_no_queued_decision() {
    let (redis, main, store) = on_main_runtime(Duration::from_secs(1));
    let sleeping = redis.debug_sleep(Duration::from_millis(300));
    std::thread::sleep(Duration::from_millis(30));
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    {
        let store = store.clone();
        other.spawn(async move {
            let _ = decide(&store, "redlimit:{other}").await;
        });
    }
    std::thread::sleep(Duration::from_millis(30));
    let queued = main.block_on(async {
        let queue = tokio::spawn(together_owned(&store, "behind-other", 3));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The other runtime goes away with its call still in flight behind the sleep.
        other.shutdown_background();
        queue.await.unwrap()
    });
    sleeping.join().unwrap();
    assert_all_decided(
        &queued,
        900,
        "decisions queued when another runtime shut down",
    );
}

/// A decision's future polled once (its call on the wire) and then kept, neither polled nor
/// dropped: later lone decisions, with Redis idle, do not wait for it.
#[test]
fn a_parked_decision_slows_no_later_decision() {
    let (redis, main, store) = on_main_runtime(Duration::from_secs(2));
    let later = main.block_on(async {
        // Held, so that the parked call cannot be answered within its first poll.
        let sleeping = redis.asleep(Duration::from_millis(100)).await;
        let mut parked = Box::pin(decide(&store, "redlimit:{parked}"));
        let waker = futures::task::noop_waker();
        let mut context = std::task::Context::from_waker(&waker);
        let polled = parked.as_mut().poll(&mut context);
        assert!(polled.is_pending(), "{polled:?}");
        sleeping.join().unwrap();
        let mut later = Vec::new();
        for i in 0..5 {
            later.extend(together(&store, &format!("after-parked-{i}"), 1).await);
        }
        drop(parked);
        later
    });
    assert_all_decided(
        &later,
        150,
        "lone decisions while another is parked (a take-over delay would be 500 ms)",
    );
}
