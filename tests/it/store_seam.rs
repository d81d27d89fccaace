//! The `Store` seam probed from outside the crate, as a user writes a store: wrappers that
//! forward `Store::run` (one level, two, through an `Arc`, to a memory store while deciding on
//! Redis, only some kinds of operation), one that claims to have run an operation it never ran;
//! futures dropped or parked at the seam; a limiter over a forwarding wrapper held to one over
//! the store itself; hostile input through `StoreExt` on both stores. Each test on Redis
//! processes of its own.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use redlimit::clock::{Clock, ManualClock};
use redlimit::concurrency::{ConcurrencyLimiter, SlotOutcome};
use redlimit::limiter::{BlockFor, ControlError, KeyStatus, LeaseStats, Leases};
use redlimit::store::{
    Block, CheckRequest, Control, ControlRequest, MemoryStore, RefundRequest, ReservedAt, SlotOp,
    SlotRequest, Store, StoreError, StoreExt,
};
use redlimit::{Algorithm, Decision, Limiter, Quota, Quotas, Verdict};

use crate::support::stores::{
    BoxedStore, DecideOnly, Delayed, Faithful, Forward, Liar, Mixed, Partial, Shared, EVERY_KIND,
};
use crate::support::{self, redis_store, Ctx, RedisServer};

// ---------------------------------------------------------------------------------------------
// Helpers.

/// A client clock in the middle of an hour, so that no window ends during a test.
fn clock() -> ManualClock {
    ManualClock::new(Duration::from_secs(1_700_003_600))
}

/// A limiter of `algorithm` on `store`, on `clock`.
fn on(store: impl Store, algorithm: Algorithm, clock: &ManualClock) -> Limiter {
    Limiter::builder(store)
        .algorithm(algorithm)
        .clock(Clock::Manual(clock.clone()))
        .build()
        .unwrap()
}

/// A limiter on `store` with leases of 50 ms.
fn with_leases(store: impl Store) -> Limiter {
    Limiter::builder(store)
        .leases(Leases::new(Duration::from_millis(50)))
        .build()
        .unwrap()
}

/// What a peek (cost 0) of `key` under `quotas` finds left.
async fn remaining(limiter: &Limiter, key: &str, quotas: &Quotas) -> u64 {
    let peek = limiter.try_check_quotas(key, quotas, 0).await;
    peek.expect("the store decides").remaining
}

/// Polls `future` once.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Polls `future` `polls` times, `gap` apart (a yield when zero), then drops it unless it ended
/// first; whether it ended.
async fn poll_then_drop<F: Future>(future: F, polls: usize, gap: Duration) -> bool {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        if poll_once(future.as_mut()).await.is_ready() {
            return true;
        }
        if gap.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(gap).await;
        }
    }
    false
}

/// A key status without its expiry (Redis's `PTTL`, read on Redis's own clock): the rest is
/// decided on the client clock.
fn status(status: Result<KeyStatus, ControlError>) -> String {
    match status {
        Ok(status) => format!(
            "{:?}",
            KeyStatus {
                expires_in: None,
                ..status
            }
        ),
        Err(error) => format!("error: {error}"),
    }
}

/// Every key on `redis` and what it holds: a string's bytes, a sorted set's size (the slots'
/// members are ids of the process that took them).
fn dump(redis: &RedisServer) -> Vec<(String, String)> {
    redis.contents(|conn, key| {
        let n: u64 = redis::cmd("ZCARD").arg(key).query(conn).unwrap();
        format!("zset of {n}")
    })
}

// ---------------------------------------------------------------------------------------------
// Wrappers written outside the crate.

/// A wrapper that answers `Ok(())` to an operation it never ran gets an error for each, not a
/// silent success nor a panic: the controls, a refund and a slot are refused
/// (`StoreError::Unsupported`), and the two decisions fall back to `check` (a blocking one's
/// block then being refused, as its docs say).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_claims_to_run_an_operation_it_never_ran_gets_an_error_for_each() {
    let redis = RedisServer::start();
    let store = Liar(redis_store(&redis));
    let quotas = Quotas::from(Quota::per_minute(1).unwrap());
    let key = "redlimit:{liar}";
    let request = CheckRequest {
        key,
        algorithm: Algorithm::TokenBucket,
        quotas: &quotas,
        cost: 1,
        now_micros: None,
    };
    let unsupported = |what: &str, error: StoreError| {
        assert!(
            matches!(error, StoreError::Unsupported(_)),
            "{what}: {error:?}"
        );
    };
    let control = store
        .control(ControlRequest {
            key,
            algorithm: Algorithm::TokenBucket,
            control: Control::Suspend(Duration::from_secs(5)),
            now_micros: None,
        })
        .await;
    unsupported("control", control.unwrap_err());
    let refund = store
        .refund(RefundRequest {
            key,
            algorithm: Algorithm::TokenBucket,
            quotas: &quotas,
            units: 1,
            reserved: ReservedAt::Ago(0),
        })
        .await;
    unsupported("refund", refund.unwrap_err());
    let slots = store
        .slots(SlotRequest {
            key: "redlimit:{liar}:c#c",
            op: SlotOp::Acquire { limit: 1 },
            ids: &["one"],
            lease: Duration::from_secs(5),
            now_micros: None,
        })
        .await;
    unsupported("slots", slots.unwrap_err());
    // A decision that tells its time: `check`, which tells none.
    let (decision, at) = store.check_timed(request, None).await.unwrap();
    assert!(decision.allowed && at.is_none(), "{decision:?} {at:?}");
    // A blocking decision: `check`; its block on the denial is refused.
    let block = Block {
        duration: Duration::from_secs(10),
        max: Duration::from_secs(10),
    };
    let denied = store.check_blocking(request, block).await;
    unsupported("the block of a denial", denied.unwrap_err());

    // Through a limiter: the controls and a refund fail; decisions go on.
    let limiter = Limiter::new(Liar(redis_store(&redis)));
    let quota = Quota::per_minute(1).unwrap();
    let suspend = limiter.suspend("k", Duration::from_secs(5)).await;
    assert!(
        matches!(
            suspend,
            Err(ControlError::Store(StoreError::Unsupported(_)))
        ),
        "{suspend:?}"
    );
    assert!(limiter.check("k", &quota).await.is_allowed());
    let refund = limiter.refund("k", &quota.into(), 1).await;
    assert!(refund.is_err(), "{refund:?}");
    assert!(!limiter.check("k", &quota).await.is_allowed());
}

/// Each kind of operation reaches Redis through two levels of wrapper, through a wrapper that
/// holds its store in an `Arc`, and through one that awaits before it forwards, as through the
/// store itself: the same replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_runs_through_two_levels_of_wrapper_an_arc_and_a_wait() {
    let redis = RedisServer::start();
    let direct = redis_store(&redis);
    let nested = Forward(Faithful(redis_store(&redis)));
    let shared = Shared(Arc::new(redis_store(&redis)));
    let delayed = Delayed(redis_store(&redis));
    let quotas = Quotas::from(Quota::per_minute(2).unwrap());
    let t0 = 1_700_003_600_000_000;
    let mut answers = Vec::new();
    for (name, store) in [
        ("direct", &direct as &dyn Store),
        ("nested", &nested),
        ("shared", &shared),
        ("delayed", &delayed),
    ] {
        let key = format!("redlimit:{{{name}}}");
        let key = key.as_str();
        let request = CheckRequest {
            key,
            algorithm: Algorithm::FixedWindow,
            quotas: &quotas,
            cost: 1,
            now_micros: Some(t0),
        };
        let block = Block {
            duration: Duration::from_secs(10),
            max: Duration::from_secs(40),
        };
        let mut answer = Vec::new();
        answer.push(format!("{:?}", store.check_timed(request, None).await));
        answer.push(format!("{:?}", store.check_blocking(request, block).await));
        answer.push(format!("{:?}", store.check_blocking(request, block).await));
        let refund = RefundRequest {
            key,
            algorithm: Algorithm::FixedWindow,
            quotas: &quotas,
            units: 1,
            reserved: ReservedAt::Client(t0),
        };
        answer.push(format!("{:?}", store.refund(refund).await));
        let control = ControlRequest {
            key,
            algorithm: Algorithm::FixedWindow,
            control: Control::Resume,
            now_micros: Some(t0),
        };
        let tenant = format!("redlimit:{{{name}}}#t");
        let resume = ControlRequest {
            key: &tenant,
            ..control
        };
        answer.push(format!(
            "{:?}",
            store.control(resume).await.map(|r| r.now_micros())
        ));
        answer.push(format!("{:?}", store.check(request).await));
        let slots = format!("redlimit:{{{name}}}:c#c");
        let slot = |op, id| SlotRequest {
            key: &slots,
            op,
            ids: id,
            lease: Duration::from_secs(5),
            now_micros: Some(t0),
        };
        for (op, id) in [
            (SlotOp::Acquire { limit: 1 }, &["a"][..]),
            (SlotOp::Acquire { limit: 1 }, &["b"][..]),
            (SlotOp::Renew, &["a"][..]),
            (SlotOp::Release, &["a"][..]),
        ] {
            answer.push(format!("{:?}", store.slots(slot(op, id)).await));
        }
        answers.push((name, answer));
    }
    println!("{answers:#?}");
    for (name, answer) in &answers[1..] {
        assert_eq!(answer, &answers[0].1, "{name} against the store itself");
    }
    // The block did block, and the refund gave back.
    assert!(answers[0].1[2].contains("allowed: false"), "{answers:#?}");
    assert!(answers[0].1[3].contains("Ok(1)"), "{answers:#?}");
}

/// A wrapper that forwards only some kinds: what it refuses is refused (a control, a refund, a
/// slot), or, for the two decisions, falls back to `check` (and the blocking one's block to a
/// control, which it forwards): every decision still made once, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_forwards_only_some_kinds_refuses_the_others_and_decides_once() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(10).unwrap();
    let quotas = Quotas::from(quota);
    // Controls alone: a blocking check falls back to check + control, a timed one to check.
    let store = Partial::new(redis_store(&redis), &["control"]);
    let seen = store.seen();
    let limiter = Limiter::new(store);
    let (verdict, _) = limiter.check_reserving("k", &quotas, 3).await;
    assert!(verdict.is_allowed());
    assert_eq!(
        remaining(&limiter, "k", &quotas).await,
        7,
        "taken once: {:?}",
        seen.lock().unwrap()
    );
    let refused = limiter.refund("k", &quotas, 3).await;
    assert!(
        matches!(
            refused,
            Err(ControlError::Store(StoreError::Unsupported(_)))
        ),
        "{refused:?}"
    );
    support::denied_by_a_block(&limiter, "b").await;
    let status = limiter.inspect("b").await.unwrap();
    assert!(status.suspended_for.is_some(), "blocked: {status:?}");
    // A refused slot call goes to the failure policy (which fails open by default): no slot
    // is held.
    let slots = ConcurrencyLimiter::new(limiter.clone(), 1).unwrap();
    let outcome = slots.acquire("s").await;
    assert!(!matches!(outcome, SlotOutcome::Acquired(_)), "{outcome:?}");
    println!("seen: {:?}; the slot: {outcome:?}", seen.lock().unwrap());
}

/// A store that forwards the controls and refuses blocking decisions cannot keep the count of
/// offences that `BlockFor::doubling_up_to` needs: a doubling block through it is refused
/// (`StoreError::Unsupported`, before anything is decided), never silently weakened to the
/// base block; a block that does not double still blocks, through the fallback (a decision,
/// then the block as a control), as long as on the store itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubling_block_through_a_store_that_runs_no_blocking_decisions_is_refused_not_weakened()
{
    let redis = RedisServer::start();
    let one = Quotas::from(Quota::per_second(1).unwrap());
    let doubling = Block {
        duration: Duration::from_secs(10),
        max: Duration::from_secs(80),
    };
    let flat = Block {
        duration: Duration::from_secs(10),
        max: Duration::from_secs(10),
    };
    let partial = Partial::new(redis_store(&redis), &["control"][..]);
    let request = |key| CheckRequest {
        key,
        algorithm: Algorithm::TokenBucket,
        quotas: &one,
        cost: 1,
        now_micros: None,
    };
    let refused = partial
        .check_blocking(request("redlimit:{doubling}"), doubling)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Unsupported(_))),
        "{refused:?}"
    );
    // Nothing was decided: the quota is full.
    let peek = partial
        .check(CheckRequest {
            cost: 0,
            ..request("redlimit:{doubling}")
        })
        .await
        .unwrap();
    assert_eq!(peek.remaining, 1, "{peek:?}");
    // A block that does not double: as on the store itself.
    let mut waits = Vec::new();
    for store in [&partial as &dyn Store, &redis_store(&redis)] {
        let key = if waits.is_empty() {
            "redlimit:{flat-a}"
        } else {
            "redlimit:{flat-b}"
        };
        assert!(
            store
                .check_blocking(request(key), flat)
                .await
                .unwrap()
                .allowed
        );
        let denied = store.check_blocking(request(key), flat).await.unwrap();
        assert!(!denied.allowed, "{denied:?}");
        waits.push(denied.retry_after.as_secs());
    }
    assert_eq!(waits[0], waits[1], "{waits:?}");
}

/// A blocking denial's `retry_after` never tells a client to come back before a request would
/// be admitted (DESIGN §4: `retry_after` is the "time until a request of this cost would be
/// allowed", never too early): a block shorter than the quota's own wait must not be the whole
/// answer, or a client that obeys it is denied again, and blocked again for twice as long.
/// (`Limiter::check_blocking` and `lua/block.lua` say the denial's `retry_after` is the block's;
/// the fallback of `StoreExt::check_blocking` answers the longer of the two.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_denial_never_tells_the_client_to_come_back_before_the_quota_admits() {
    let redis = RedisServer::start();
    let one = Quotas::from(Quota::per_minute(1).unwrap());
    let block = BlockFor::new(Duration::from_secs(10))
        .unwrap()
        .doubling_up_to(Duration::from_secs(80))
        .unwrap();
    let mut too_early = Vec::new();
    for (name, store) in [
        ("redis", Box::new(redis_store(&redis)) as Box<dyn Store>),
        ("memory", Box::new(MemoryStore::new())),
    ] {
        let clock = clock();
        let limiter = Limiter::builder(BoxedStore(store))
            .clock(Clock::Manual(clock.clone()))
            .build()
            .unwrap();
        assert!(limiter
            .check_blocking("k", &one, 1, &block)
            .await
            .is_allowed());
        let denied = limiter.check_blocking("k", &one, 1, &block).await;
        let wait = denied.decision().expect("decided").retry_after;
        clock.advance(wait);
        let obeyed = limiter.check_blocking("k", &one, 1, &block).await;
        if !obeyed.is_allowed() {
            too_early.push(format!(
                "{name}: told to come back after {wait:?}, then {obeyed:?}"
            ));
        }
    }
    assert!(too_early.is_empty(), "{too_early:#?}");
}

/// A wrapper whose `check` decides on Redis and whose `run` goes to a memory store: each call
/// goes where the wrapper sends it. A control then changes the memory store, and Redis's
/// decisions never see it; a reservation on the store's clock (a timed decision, an operation)
/// is taken in memory. Nothing panics; the wrapper's author routes both to one store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_store_runs_each_call_where_it_sends_it() {
    let redis = RedisServer::start();
    let memory = MemoryStore::new();
    let limiter = Limiter::new(Mixed {
        decide: redis_store(&redis),
        operations: memory.clone(),
    });
    let in_memory = Limiter::new(memory);
    let quota = Quota::per_minute(2).unwrap();
    let quotas = Quotas::from(quota);
    let status = limiter.suspend("k", Duration::from_secs(60)).await.unwrap();
    assert!(status.suspended_for.is_some(), "{status:?}");
    assert!(
        limiter.check("k", &quota).await.is_allowed(),
        "Redis decides and knows no suspension"
    );
    assert!(!in_memory.check("k", &quota).await.is_allowed());
    // A reservation on the store's clock is a timed decision: made in memory.
    let (verdict, _) = limiter.check_reserving("r", &quotas, 2).await;
    assert!(verdict.is_allowed());
    assert_eq!(
        remaining(&limiter, "r", &quotas).await,
        2,
        "Redis: untouched"
    );
    assert_eq!(
        remaining(&in_memory, "r", &quotas).await,
        0,
        "memory: taken"
    );
}

// ---------------------------------------------------------------------------------------------
// A limiter over a forwarding wrapper against one over the store itself.

/// Settlement, block mode, the controls and concurrency slots on `limiter` (on `clock`): what
/// each answers, and what the keys look like at the end.
async fn transcript(limiter: &Limiter, clock: &ManualClock) -> Vec<String> {
    let mut t: Vec<String> = Vec::new();
    fn note(t: &mut Vec<String>, what: &str, value: impl Debug) {
        t.push(format!("{what}: {value:?}"));
    }
    let quotas = Quotas::from(Quota::per_minute(10).unwrap());
    let peek = |key: &'static str| async move { limiter.try_check_quotas(key, &quotas, 0).await };

    // Settlement.
    let (verdict, reserved) = limiter.check_reserving("settle", &quotas, 6).await;
    note(&mut t, "reserve 6", verdict);
    clock.advance(Duration::from_secs(1));
    let refund = limiter
        .refund_reserved("settle", &quotas, 4, reserved)
        .await;
    note(
        &mut t,
        "refund 4 reserved",
        refund.map_err(|e| e.to_string()),
    );
    note(&mut t, "after", peek("settle").await);
    let refund = limiter.refund("settle", &quotas, 100).await;
    note(&mut t, "refund 100", refund.map_err(|e| e.to_string()));
    note(&mut t, "after", peek("settle").await);

    // Block mode, doubling.
    let one = Quotas::from(Quota::per_minute(1).unwrap());
    let block = BlockFor::new(Duration::from_secs(10))
        .unwrap()
        .doubling_up_to(Duration::from_secs(80))
        .unwrap();
    for round in 0..4 {
        let verdict = limiter.check_blocking("abuser", &one, 1, &block).await;
        note(&mut t, &format!("blocking {round}"), verdict);
        clock.advance(Duration::from_secs(1));
        let verdict = limiter.check_blocking("abuser", &one, 1, &block).await;
        note(&mut t, &format!("blocking {round} again"), verdict);
        note(&mut t, "status", status(limiter.inspect("abuser").await));
        clock.advance(Duration::from_secs(90));
    }

    // The controls.
    let five = Quotas::from(Quota::per_minute(5).unwrap());
    t.push(status(limiter.set_quota("ctl", &five).await));
    note(
        &mut t,
        "check",
        limiter.check_quotas("ctl", &quotas, 1).await,
    );
    t.push(status(
        limiter.suspend("ctl", Duration::from_secs(30)).await,
    ));
    note(
        &mut t,
        "check",
        limiter.check_quotas("ctl", &quotas, 1).await,
    );
    t.push(status(
        limiter
            .extend_suspension("ctl", Duration::from_secs(60))
            .await,
    ));
    t.push(status(
        limiter
            .extend_suspension("ctl", Duration::from_secs(10))
            .await,
    ));
    t.push(status(limiter.resume("ctl").await));
    note(
        &mut t,
        "check",
        limiter.check_quotas("ctl", &quotas, 1).await,
    );
    t.push(status(limiter.reset("ctl").await));
    t.push(status(limiter.clear_quota("ctl").await));
    t.push(status(
        limiter
            .set_quota(redlimit::Target::all_routes("ctl"), &five)
            .await,
    ));
    note(
        &mut t,
        "check",
        limiter.check_quotas("ctl", &quotas, 1).await,
    );

    // Concurrency slots (on the store's clock, so their waits are not compared).
    let slots = ConcurrencyLimiter::new(limiter.clone(), 2).unwrap();
    let outcome = |o: &SlotOutcome| match o {
        SlotOutcome::Acquired(slot) => format!("acquired, {} left", slot.remaining()),
        SlotOutcome::Full { .. } => "full".to_owned(),
        other => format!("{other:?}"),
    };
    let a = slots.acquire("c").await;
    let b = slots.acquire("c").await;
    let c = slots.acquire("c").await;
    t.extend([outcome(&a), outcome(&b), outcome(&c)]);
    drop(a);
    let started = Instant::now();
    let again = loop {
        let again = slots.acquire("c").await;
        if !matches!(again, SlotOutcome::Full { .. }) || started.elapsed() > Duration::from_secs(5)
        {
            break again;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    t.push(format!("after a drop: {}", outcome(&again)));
    drop((b, again));

    // Every key as the limiter reads it.
    for key in ["settle", "abuser", "ctl"] {
        note(&mut t, key, peek(key).await);
        t.push(format!("{key}: {}", status(limiter.inspect(key).await)));
    }
    t
}

/// On Redis, a limiter over a wrapper that forwards `check` and `run` (the docs' pattern) makes
/// the same decisions, reports the same statuses and leaves the same bytes in Redis as one over
/// the `RedisStore` itself: settlement, block mode (doubling), the controls and concurrency
/// slots, under every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_over_a_forwarding_wrapper_on_redis_decides_and_stores_as_over_the_store() {
    for &algorithm in Algorithm::ALL {
        let (one, other) = (RedisServer::start(), RedisServer::start());
        let (clock, wrapped_clock) = (clock(), clock());
        let direct = on(redis_store(&one), algorithm, &clock);
        let wrapped = on(Forward(redis_store(&other)), algorithm, &wrapped_clock);
        let expected = transcript(&direct, &clock).await;
        let got = transcript(&wrapped, &wrapped_clock).await;
        for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
            assert_eq!(g, e, "{algorithm}: line {i} of the transcript");
        }
        assert_eq!(got.len(), expected.len(), "{algorithm}");
        assert_eq!(dump(&other), dump(&one), "{algorithm}: what Redis holds");
    }
}

/// The same on the memory store: a limiter over a forwarding wrapper of a `MemoryStore`
/// decides, reports and stores as one over the `MemoryStore` itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_over_a_forwarding_wrapper_in_memory_decides_and_stores_as_over_the_store() {
    for &algorithm in Algorithm::ALL {
        let (clock, wrapped_clock) = (clock(), clock());
        let (store, wrapped_store) = (MemoryStore::new(), MemoryStore::new());
        let direct = on(store.clone(), algorithm, &clock);
        let wrapped = on(Forward(wrapped_store.clone()), algorithm, &wrapped_clock);
        let expected = transcript(&direct, &clock).await;
        let got = transcript(&wrapped, &wrapped_clock).await;
        for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
            assert_eq!(g, e, "{algorithm}: line {i} of the transcript");
        }
        assert_eq!(got.len(), expected.len(), "{algorithm}");
        let now = clock.now_micros();
        for key in ["settle", "abuser", "ctl"] {
            let storage = direct.storage_key(key);
            let [log_controls, tenant] = redlimit::test_hooks::control_keys(&storage);
            for k in [storage, log_controls, tenant] {
                assert_eq!(
                    wrapped_store.stored_state(&k, now),
                    store.stored_state(&k, now),
                    "{algorithm}: {k}"
                );
            }
        }
    }
}

/// Leases over a forwarding wrapper: the same admissions, the same units given back, and the
/// counters balance, as over the store itself (Redis and memory, on a client clock that stays
/// within one window, so every unit leased and not spent goes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_over_a_forwarding_wrapper_admit_and_give_back_as_over_the_store() {
    async fn run(limiter: &Limiter) -> (u64, u64, LeaseStats) {
        let quotas = Quotas::from(Quota::per_hour(300).unwrap());
        let mut admitted = 0;
        for _ in 0..200 {
            if limiter.check_quotas("hot", &quotas, 1).await.is_allowed() {
                admitted += 1;
            }
        }
        // A background renewal still in flight would come back after the release, stranded.
        tokio::time::sleep(Duration::from_millis(200)).await;
        limiter.release_leases().await;
        let started = Instant::now();
        let stats = loop {
            let s = limiter.lease_stats();
            let balanced = s.leased == s.spent + s.held + s.returned + s.stranded;
            if (balanced && s.held == 0) || started.elapsed() > Duration::from_secs(5) {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        (admitted, remaining(limiter, "hot", &quotas).await, stats)
    }
    fn leasing(store: impl Store, algorithm: Algorithm, clock: &ManualClock) -> Limiter {
        Limiter::builder(store)
            .algorithm(algorithm)
            .clock(Clock::Manual(clock.clone()))
            .leases(Leases::new(Duration::from_millis(50)))
            .build()
            .unwrap()
    }
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::FixedWindow,
    ] {
        let (one, other) = (RedisServer::start(), RedisServer::start());
        let memory = [MemoryStore::new(), MemoryStore::new()];
        let cases = [
            (
                "redis",
                leasing(redis_store(&one), algorithm, &clock()),
                leasing(Forward(redis_store(&other)), algorithm, &clock()),
            ),
            (
                "memory",
                leasing(memory[0].clone(), algorithm, &clock()),
                leasing(Forward(memory[1].clone()), algorithm, &clock()),
            ),
        ];
        for (backend, direct, wrapped) in cases {
            let (d_admitted, d_left, d_stats) = run(&direct).await;
            let (w_admitted, w_left, w_stats) = run(&wrapped).await;
            let what = format!("{algorithm} on {backend}: {d_stats:?} / {w_stats:?}");
            assert_eq!(d_admitted, 200, "{what}");
            assert_eq!(w_admitted, d_admitted, "{what}");
            assert_eq!(w_left, d_left, "{what}");
            for (s, left) in [(&d_stats, d_left), (&w_stats, w_left)] {
                assert_eq!(s.leased, s.spent + s.returned + s.stranded, "{what}");
                assert_eq!(s.held, 0, "{what}");
                assert_eq!(s.stranded, 0, "{what}");
                assert_eq!(left + s.spent, 300, "{what}");
            }
        }
    }
}

/// On Redis's clock, a wrapper that forwards `run` forwards the timed decisions too: a
/// settlement's refund and a lease's give-back carry the time Redis admitted their reservation
/// (`ReservedAt::Store`), as over the store itself; a wrapper that forwards the refunds but not
/// the timed decisions sends their age (`ReservedAt::Ago`), as the modes guide says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_time_a_forwarding_wrapper_dates_refunds_by_the_time_redis_admitted() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_hour(1_000).unwrap());
    for (forwards, dated) in [
        (EVERY_KIND, "refund Store"),
        (
            &["control", "refund", "slots", "blocking"][..],
            "refund Ago",
        ),
    ] {
        let store = Partial::new(redis_store(&redis), forwards);
        let seen = store.seen();
        let limiter = Limiter::new(store);
        let key = format!("settle-{}", forwards.len());
        let (verdict, reserved) = limiter.check_reserving(key.as_str(), &quotas, 5).await;
        assert!(verdict.is_allowed());
        limiter
            .refund_reserved(key.as_str(), &quotas, 5, reserved)
            .await
            .unwrap();
        assert_eq!(remaining(&limiter, &key, &quotas).await, 1_000);
        let leasing = with_leases(Partial::new(redis_store(&redis), forwards));
        for _ in 0..50 {
            assert!(leasing.check_quotas("hot", &quotas, 1).await.is_allowed());
        }
        leasing.release_leases().await;
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter()
                .filter(|s| s.starts_with("refund"))
                .all(|s| s == dated),
            "{seen:?}"
        );
    }
}

/// A store that does not forward `run` cannot give a lease's unspent units back: each
/// give-back is refused and its units are counted as stranded (never a panic, never a hang).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_a_store_without_operations_strand_what_they_cannot_give_back() {
    let redis = RedisServer::start();
    let limiter = with_leases(DecideOnly(redis_store(&redis)));
    let quotas = Quotas::from(Quota::per_hour(1_000).unwrap());
    for _ in 0..200 {
        assert!(limiter.check_quotas("hot", &quotas, 1).await.is_allowed());
    }
    limiter.release_leases().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let s = limiter.lease_stats();
    println!("{s:?}");
    assert_eq!(
        s.leased,
        s.spent + s.held + s.returned + s.stranded,
        "{s:?}"
    );
    assert_eq!(s.returned, 0, "{s:?}");
    assert_eq!(s.held, 0, "{s:?}");
}

// ---------------------------------------------------------------------------------------------
// Futures dropped or parked at the seam.

/// A refund whose future is dropped at any point, through a forwarding wrapper or not, gives
/// its units back once or not at all, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_dropped_at_any_point_gives_back_once_or_not_at_all() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    for &algorithm in Algorithm::ALL {
        let clock = clock();
        let limiters = [
            ("direct", on(redis_store(&redis), algorithm, &clock)),
            (
                "wrapped",
                on(Forward(redis_store(&redis)), algorithm, &clock),
            ),
            ("memory", on(Forward(MemoryStore::new()), algorithm, &clock)),
        ];
        for (name, limiter) in &limiters {
            let mut seen = std::collections::BTreeMap::new();
            for i in 0..24u32 {
                let key = format!("{algorithm}-{name}-{i}");
                assert!(limiter
                    .check_quotas(key.as_str(), &quotas, 10)
                    .await
                    .is_allowed());
                let gap = Duration::from_micros(u64::from(i / 4) * 100);
                poll_then_drop(
                    limiter.refund(key.as_str(), &quotas, 3),
                    (i % 4) as usize,
                    gap,
                )
                .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let left = remaining(limiter, &key, &quotas).await;
                *seen.entry(left).or_insert(0) += 1;
                assert!(
                    left == 0 || left == 3,
                    "{algorithm} {name} #{i}: {left} left after a refund of 3 (seen {seen:?})"
                );
            }
            println!("{algorithm} {name}: {seen:?}");
        }
    }
}

/// A reserving check, a suspension and a slot acquisition dropped at any point, through a
/// forwarding wrapper: a check takes its units once or not at all; a key is suspended or not
/// and a resume ends it; a slot a dropped acquisition may have taken comes back, and at the
/// end exactly `limit` slots can be taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_dropped_at_any_point_through_a_wrapper_take_once_or_not_at_all() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(Forward(redis_store(&redis)));
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    for i in 0..24u32 {
        let (polls, gap) = (
            (i % 4) as usize,
            Duration::from_micros(u64::from(i / 4) * 100),
        );
        let key = format!("reserve-{i}");
        poll_then_drop(
            limiter.check_reserving(key.as_str(), &quotas, 3),
            polls,
            gap,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let left = remaining(&limiter, &key, &quotas).await;
        assert!(left == 10 || left == 7, "#{i}: {left} left");

        let key = format!("suspend-{i}");
        let suspend = limiter.suspend(key.as_str(), Duration::from_secs(60));
        poll_then_drop(suspend, polls, gap).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        limiter.resume(key.as_str()).await.unwrap();
        assert!(support::admits_quotas(&limiter, key.as_str(), &quotas).await);
    }
    let slots = ConcurrencyLimiter::new(limiter.clone(), 2).unwrap();
    for i in 0..24u32 {
        let (polls, gap) = (
            (i % 4) as usize,
            Duration::from_micros(u64::from(i / 4) * 100),
        );
        poll_then_drop(slots.acquire("s"), polls, gap).await;
    }
    // The slots dropped acquisitions took come back (given back in the background).
    let started = Instant::now();
    let held = loop {
        let a = slots.acquire("s").await;
        let b = slots.acquire("s").await;
        let both = matches!(
            (&a, &b),
            (SlotOutcome::Acquired(_), SlotOutcome::Acquired(_))
        );
        if both || started.elapsed() > Duration::from_secs(5) {
            break [a, b];
        }
        drop((a, b));
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        held.iter().all(|o| matches!(o, SlotOutcome::Acquired(_))),
        "after 5 s: {held:?}"
    );
    let third = slots.acquire("s").await;
    assert!(matches!(third, SlotOutcome::Full { .. }), "{third:?}");
}

/// A control, a refund and a slot acquisition each polled once and then parked (neither polled
/// nor dropped) hold up no other caller: the same calls on the same key, through the same
/// wrapper, answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_operation_holds_up_no_other_caller() {
    let redis = RedisServer::start();
    let limiter = Limiter::new(Forward(redis_store(&redis)));
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    assert!(limiter.check_quotas("k", &quotas, 5).await.is_allowed());
    let slots = ConcurrencyLimiter::new(limiter.clone(), 2).unwrap();
    let mut suspend = Box::pin(limiter.suspend("k", Duration::from_secs(60)));
    let mut refund = Box::pin(limiter.refund("k", &quotas, 1));
    let mut acquire = Box::pin(slots.acquire("k"));
    assert!(poll_once(suspend.as_mut()).await.is_pending());
    assert!(poll_once(refund.as_mut()).await.is_pending());
    assert!(poll_once(acquire.as_mut()).await.is_pending());
    let others = async {
        limiter.resume("k").await.unwrap();
        limiter.refund("k", &quotas, 1).await.unwrap();
        let slot = slots.acquire("k").await;
        assert!(matches!(slot, SlotOutcome::Acquired(_)), "{slot:?}");
        limiter.inspect("k").await.unwrap()
    };
    let started = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(3), others).await;
    assert!(status.is_ok(), "held up for {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    drop((suspend, refund, acquire));
}

/// A request on a leased key polled once while it renews the lease, then parked (neither
/// polled nor dropped), must not decide for the other requests on the key (DESIGN 6c: "No
/// caller works for another … may be parked unpolled"; leases guide: "no later request waits
/// on a renewal nobody finishes"): they are decided by the store, not after the store's call
/// timeout by the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_parked_in_its_lease_renewal_holds_up_no_later_request_on_its_key() {
    let redis = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let limiter = with_leases(Ctx::default().timeout(timeout).redis_store(&redis));
    let quota = Quota::per_hour(1_000).unwrap();
    let mut parked = Box::pin(limiter.check("hot", &quota));
    assert!(poll_once(parked.as_mut()).await.is_pending());
    let mut answers = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let verdict = limiter.check("hot", &quota).await;
        answers.push((verdict, started.elapsed()));
    }
    drop(parked);
    println!("{answers:?}");
    for (verdict, took) in &answers {
        assert!(
            matches!(verdict, Verdict::Decided(_)) && *took < timeout / 2,
            "a later request: {verdict:?} after {took:?} (all: {answers:?})"
        );
    }
}

/// The same through a wrapper written as the `Store` docs' example (it forwards `check` and
/// `run`, not `call_timeout`): the later requests on the key must still be answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_parked_in_its_lease_renewal_through_a_wrapper_hangs_no_later_request() {
    let redis = RedisServer::start();
    let limiter = with_leases(Forward(redis_store(&redis)));
    let quota = Quota::per_hour(1_000).unwrap();
    let mut parked = Box::pin(limiter.check("hot", &quota));
    assert!(poll_once(parked.as_mut()).await.is_pending());
    let later = tokio::time::timeout(Duration::from_secs(3), limiter.check("hot", &quota)).await;
    drop(parked);
    assert!(
        later.is_ok(),
        "a later request on the key still waits after 3 s"
    );
}

// ---------------------------------------------------------------------------------------------
// Hostile input through `StoreExt`, on both stores.

/// One hostile call, named.
#[derive(Debug, Clone)]
enum Call {
    Control(String, Control<'static>, Option<u64>),
    Refund(String, Quotas, u64, ReservedAt),
    Slots(String, SlotOp, Vec<String>, Duration, Option<u64>),
    Blocking(String, Quotas, u64, Block, Option<u64>),
    Timed(String, Quotas, u64, Option<u64>),
}

/// Runs `call` on `store` and says what it answered.
async fn answer<S: Store>(store: &S, call: &Call) -> String {
    let algorithm = Algorithm::TokenBucket;
    fn check_request<'a>(
        key: &'a str,
        quotas: &'a Quotas,
        cost: u64,
        now_micros: Option<u64>,
    ) -> CheckRequest<'a> {
        let algorithm = Algorithm::TokenBucket;
        CheckRequest {
            key,
            algorithm,
            quotas,
            cost,
            now_micros,
        }
    }
    fn short<T: Debug>(result: Result<T, StoreError>) -> String {
        match result {
            Ok(value) => {
                let text = format!("ok {value:?}");
                text.chars().take(120).collect()
            }
            Err(error) => {
                let text = format!("error {error}");
                text.chars().take(120).collect()
            }
        }
    }
    match call {
        Call::Control(key, control, now) => short(
            store
                .control(ControlRequest {
                    key,
                    algorithm,
                    control: *control,
                    now_micros: *now,
                })
                .await
                .map(|r| r.expires_in()),
        ),
        Call::Refund(key, quotas, units, reserved) => short(
            store
                .refund(RefundRequest {
                    key,
                    algorithm,
                    quotas,
                    units: *units,
                    reserved: *reserved,
                })
                .await,
        ),
        Call::Slots(key, op, ids, lease, now) => {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            short(
                store
                    .slots(SlotRequest {
                        key,
                        op: *op,
                        ids: &ids,
                        lease: *lease,
                        now_micros: *now,
                    })
                    .await,
            )
        }
        Call::Blocking(key, quotas, cost, block, now) => {
            let request = check_request(key, quotas, *cost, *now);
            short(
                store
                    .check_blocking(request, *block)
                    .await
                    .map(|d| (d.allowed, d.remaining, d.retry_after)),
            )
        }
        Call::Timed(key, quotas, cost, now) => {
            let request = check_request(key, quotas, *cost, *now);
            short(
                store
                    .check_timed(request, None)
                    .await
                    .map(|(d, at)| (d.allowed, d.remaining, at.is_some())),
            )
        }
    }
}

/// Runs `call` on `store` in a task of its own: its answer, or `PANIC` and the panic.
async fn guarded<S: Store + Clone>(store: &S, call: &Call) -> String {
    let (store, call) = (store.clone(), call.clone());
    match tokio::spawn(async move { answer(&store, &call).await }).await {
        Ok(answer) => answer,
        Err(error) => format!("PANIC {error}"),
    }
}

/// The hostile calls: odd keys on every operation, and extreme numbers on each.
fn hostile_calls() -> Vec<(String, Call)> {
    let q = Quotas::from(Quota::per_minute(10).unwrap());
    let eight =
        Quotas::new((1..=8).map(|i| Quota::new(10 * i, Duration::from_secs(i)).unwrap())).unwrap();
    let block = Block {
        duration: Duration::from_secs(10),
        max: Duration::from_secs(40),
    };
    let lease = Duration::from_secs(5);
    let mut calls = Vec::new();
    let keys = [
        ("huge", format!("redlimit:{{huge}}{}", "k".repeat(1 << 20))),
        ("close brace", "x}y".to_owned()),
        ("empty tag", "{}x".to_owned()),
        ("open brace", "{".to_owned()),
        ("lone close", "}".to_owned()),
        ("close then tag", "}{a}".to_owned()),
        ("unclosed", "a{b".to_owned()),
        ("empty", String::new()),
        ("a tenant key", "redlimit:{t}#t".to_owned()),
        ("nul and emoji", "redlimit:{\0🦀}".to_owned()),
    ];
    for (name, key) in keys {
        let k = || key.clone();
        calls.extend([
            (
                format!("{name}: suspend"),
                Call::Control(k(), Control::Suspend(lease), None),
            ),
            (
                format!("{name}: set quota"),
                Call::Control(k(), Control::SetQuota(Box::leak(Box::new(q))), None),
            ),
            (
                format!("{name}: inspect"),
                Call::Control(k(), Control::Inspect, None),
            ),
            (format!("{name}: timed"), Call::Timed(k(), q, 1, None)),
            (
                format!("{name}: refund"),
                Call::Refund(k(), q, 1, ReservedAt::Ago(0)),
            ),
            (
                format!("{name}: blocking"),
                Call::Blocking(
                    k(),
                    Quotas::from(Quota::per_minute(1).unwrap()),
                    2,
                    block,
                    None,
                ),
            ),
            (
                format!("{name}: slot"),
                Call::Slots(
                    k(),
                    SlotOp::Acquire { limit: 1 },
                    vec!["id".into()],
                    lease,
                    None,
                ),
            ),
        ]);
    }
    let key = || "redlimit:{n}".to_owned();
    let max = Duration::MAX;
    let zero = Duration::ZERO;
    let all = Box::leak(Box::new(eight));
    calls.extend([
        (
            "8 tiers: set quota".into(),
            Call::Control(key(), Control::SetQuota(all), None),
        ),
        ("8 tiers: timed".into(), Call::Timed(key(), eight, 1, None)),
        (
            "8 tiers: blocking".into(),
            Call::Blocking(key(), eight, 100, block, None),
        ),
        (
            "8 tiers: refund".into(),
            Call::Refund(key(), eight, 1, ReservedAt::Ago(0)),
        ),
        (
            "cost max: timed".into(),
            Call::Timed(key(), q, u64::MAX, None),
        ),
        (
            "cost max: blocking".into(),
            Call::Blocking(key(), q, u64::MAX, block, None),
        ),
        (
            "now max: timed".into(),
            Call::Timed(key(), q, 1, Some(u64::MAX)),
        ),
        ("now 0: timed".into(), Call::Timed(key(), q, 1, Some(0))),
        (
            "now max: blocking".into(),
            Call::Blocking(key(), q, 1, block, Some(u64::MAX)),
        ),
        (
            "units max: refund".into(),
            Call::Refund(key(), q, u64::MAX, ReservedAt::Ago(0)),
        ),
        (
            "units 0: refund".into(),
            Call::Refund(key(), q, 0, ReservedAt::Ago(0)),
        ),
        (
            "client max: refund".into(),
            Call::Refund(key(), q, 1, ReservedAt::Client(u64::MAX)),
        ),
        (
            "store max: refund".into(),
            Call::Refund(key(), q, 1, ReservedAt::Store(u64::MAX)),
        ),
        (
            "age max: refund".into(),
            Call::Refund(key(), q, 1, ReservedAt::Ago(u64::MAX)),
        ),
        (
            "suspend 0".into(),
            Call::Control(key(), Control::Suspend(zero), None),
        ),
        (
            "suspend max".into(),
            Call::Control(key(), Control::Suspend(max), None),
        ),
        (
            "extend max".into(),
            Call::Control(key(), Control::Extend(max), None),
        ),
        (
            "suspend, now max".into(),
            Call::Control(key(), Control::Suspend(lease), Some(u64::MAX)),
        ),
        (
            "learn 0".into(),
            Call::Control(key(), Control::Learn(Box::leak(Box::new(q)), zero), None),
        ),
        (
            "learn max".into(),
            Call::Control(key(), Control::Learn(Box::leak(Box::new(q)), max), None),
        ),
        (
            "block 0".into(),
            Call::Blocking(
                key(),
                q,
                100,
                Block {
                    duration: zero,
                    max: zero,
                },
                None,
            ),
        ),
        (
            "block max".into(),
            Call::Blocking(key(), q, 100, Block { duration: max, max }, None),
        ),
        (
            "block max below duration".into(),
            Call::Blocking(
                key(),
                q,
                100,
                Block {
                    duration: Duration::from_secs(10),
                    max: Duration::from_secs(1),
                },
                None,
            ),
        ),
    ]);
    let slots = || "redlimit:{n}:s#c".to_owned();
    let id = || vec!["id".to_owned()];
    let acquire = SlotOp::Acquire { limit: 2 };
    calls.extend([
        (
            "slots limit max".into(),
            Call::Slots(
                slots(),
                SlotOp::Acquire { limit: u64::MAX },
                id(),
                lease,
                None,
            ),
        ),
        (
            "slots limit 0".into(),
            Call::Slots(slots(), SlotOp::Acquire { limit: 0 }, id(), lease, None),
        ),
        (
            "slots lease 0".into(),
            Call::Slots(slots(), acquire, id(), zero, None),
        ),
        (
            "slots lease max".into(),
            Call::Slots(slots(), acquire, id(), max, None),
        ),
        (
            "slots now max".into(),
            Call::Slots(slots(), acquire, id(), lease, Some(u64::MAX)),
        ),
        (
            "slots no id".into(),
            Call::Slots(slots(), acquire, Vec::new(), lease, None),
        ),
        (
            "slots two ids".into(),
            Call::Slots(slots(), acquire, vec!["a".into(), "b".into()], lease, None),
        ),
        (
            "slots long id".into(),
            Call::Slots(slots(), acquire, vec!["i".repeat(65)], lease, None),
        ),
        (
            "slots 10 000 ids".into(),
            Call::Slots(
                slots(),
                SlotOp::Release,
                (0..10_000).map(|i| i.to_string()).collect(),
                lease,
                None,
            ),
        ),
        (
            "slots renew none".into(),
            Call::Slots(slots(), SlotOp::Renew, Vec::new(), lease, None),
        ),
    ]);
    calls
}

/// Hostile input through `StoreExt`, straight on a `RedisStore` and on a `MemoryStore`: odd
/// keys (a megabyte, braces anywhere, empty, a tenant's key), eight tiers, `u64::MAX` costs,
/// units, limits and times, zero and maximal durations, slot ids out of bounds. Never a panic:
/// each call answers, with a typed error or a decision. (Printed side by side, so the two
/// stores' answers can be compared.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_through_the_seam_never_panics_either_store() {
    let redis = RedisServer::start();
    let stores = (redis_store(&redis), MemoryStore::new());
    let mut panics = Vec::new();
    for (name, call) in hostile_calls() {
        let on_redis = guarded(&stores.0, &call).await;
        let in_memory = guarded(&stores.1, &call).await;
        println!("{name}\n  redis:  {on_redis}\n  memory: {in_memory}");
        for (store, answer) in [("redis", &on_redis), ("memory", &in_memory)] {
            if answer.starts_with("PANIC") {
                panics.push(format!("{name} on {store}: {answer}"));
            }
        }
    }
    assert!(panics.is_empty(), "{panics:#?}");
}

/// A refund of `u64::MAX` units gives a key back its full capacity and no more ("never above a
/// tier's capacity", `Limiter::refund`), on Redis as in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_u64_max_units_fills_to_capacity_on_redis_as_in_memory() {
    let redis = RedisServer::start();
    let quotas = Quotas::from(Quota::per_hour(10).unwrap());
    let mut wrong = Vec::new();
    for &algorithm in Algorithm::ALL {
        let clock = clock();
        for (name, limiter) in [
            ("redis", on(redis_store(&redis), algorithm, &clock)),
            ("memory", on(MemoryStore::new(), algorithm, &clock)),
        ] {
            let key = format!("k-{algorithm}");
            let key = key.as_str();
            assert!(limiter.check_quotas(key, &quotas, 10).await.is_allowed());
            let refund = limiter.refund(key, &quotas, u64::MAX).await;
            let left = remaining(&limiter, key, &quotas).await;
            if refund.is_err() || left != 10 {
                wrong.push(format!("{algorithm} on {name}: {refund:?}, {left} left"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// Where Redis refuses a call's arguments (a script's error reply: times, units, limits or
/// durations past 2^53 µs, a slot call without an id or with two, an id over 64 bytes), the
/// memory store, the reference of what a store answers, refuses them too, rather than answering
/// and writing what Redis never would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_refuses_the_arguments_redis_refuses() {
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    let mut accepted = Vec::new();
    for (name, call) in hostile_calls() {
        redis.flushall();
        let on_redis = guarded(&store, &call).await;
        let in_memory = guarded(&MemoryStore::new(), &call).await;
        if on_redis.starts_with("error") && !in_memory.starts_with("error") {
            accepted.push(format!("{name}: memory {in_memory}"));
        }
    }
    assert!(accepted.is_empty(), "refused by Redis only: {accepted:#?}");
}

/// A control sent with a client time past 2^53 µs (a clock gone wrong) never leaves a key
/// suspended for ages: Redis refuses it; the memory store must not write a suspension that
/// ends in about 584 000 years (DESIGN: a far-future value must not freeze a key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_at_a_client_time_past_2_53_never_freezes_a_key() {
    /// A suspension sent to `store` at client time `u64::MAX`, then a decision at the real
    /// time through a limiter on the same store.
    async fn after_the_control<S: Store + Clone>(store: S) -> (String, Decision) {
        let limiter = Limiter::new(store.clone());
        let sent = store
            .control(ControlRequest {
                key: &limiter.storage_key("k"),
                algorithm: Algorithm::TokenBucket,
                control: Control::Suspend(Duration::from_secs(5)),
                now_micros: Some(u64::MAX),
            })
            .await;
        let quotas = Quotas::from(Quota::per_minute(10).unwrap());
        let decision = limiter.try_check_quotas("k", &quotas, 1).await.unwrap();
        (format!("{sent:?}"), decision)
    }
    let redis = RedisServer::start();
    for (name, (sent, decision)) in [
        ("redis", after_the_control(redis_store(&redis)).await),
        ("memory", after_the_control(MemoryStore::new()).await),
    ] {
        assert!(
            decision.retry_after <= Duration::from_secs(30 * 24 * 3600),
            "{name}: the control answered {sent}; then {decision:?}"
        );
    }
}

/// Raw keys with braces where a limiter never puts them (`x}y`, `{}x`, a lone `}`), through
/// `StoreExt` on a Redis Cluster: the tenant's key the stores derive may then hash to another
/// slot than the key. Each call answers, or fails with a typed error; never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_braces_on_a_cluster_get_an_answer_or_a_typed_error() {
    let cluster = crate::support::RedisCluster::start();
    let store = Ctx::default().cluster_store(&cluster);
    let quotas = Quotas::from(Quota::per_minute(1).unwrap());
    let block = Block {
        duration: Duration::from_secs(10),
        max: Duration::from_secs(10),
    };
    let mut answers = Vec::new();
    for key in ["x}y", "{}x", "}", "}{a}", "a{b", "redlimit:{ok}"] {
        let k = || key.to_owned();
        for call in [
            Call::Control(k(), Control::Suspend(Duration::from_secs(5)), None),
            Call::Timed(k(), quotas, 1, None),
            Call::Blocking(k(), quotas, 2, block, None),
            Call::Refund(k(), quotas, 1, ReservedAt::Ago(0)),
            Call::Control(k(), Control::Resume, None),
        ] {
            answers.push(format!(
                "{key}: {call:?} -> {}",
                guarded(&store, &call).await
            ));
        }
        let check = store
            .check(CheckRequest {
                key,
                algorithm: Algorithm::TokenBucket,
                quotas: &quotas,
                cost: 1,
                now_micros: None,
            })
            .await;
        answers.push(format!("{key}: check -> {check:?}"));
    }
    for answer in &answers {
        println!("{}", answer.chars().take(300).collect::<String>());
    }
    assert!(!answers.iter().any(|a| a.contains("PANIC")), "{answers:#?}");
}
