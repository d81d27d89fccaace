//! `tracing` events of an outage on a real Redis: a warning when the store keeps failing and the
//! circuit opens, an info event when a probe finds Redis back and the circuit closes; and one
//! warning, with the store's address, at the first failure of each episode of failures.

use crate::support;

use std::time::Duration;

use futures::future::BoxFuture;
use redlimit::store::{CheckRequest, Operation, RedisStore, Store, StoreError};
use redlimit::{Decision, Limiter, Quota};
use support::RedisServer;

/// The warning of the first failure of an episode.
const FIRST_FAILURE: &str = "rate limit store failed; the failure policy decides until it answers";

/// The lines of `text` at `level` that contain `message`.
fn lines_with<'a>(text: &'a str, level: &str, message: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.contains(level) && l.contains(message))
        .collect()
}

// One thread: the subscriber set for this test sees every event of the calls it makes.
#[tokio::test(flavor = "current_thread")]
async fn outage_warns_once_and_recovery_is_an_info_event() {
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::INFO);

    let mut redis = RedisServer::start();
    let store = RedisStore::builder(redis.url())
        .circuit_breaker(support::breaker_opening_after(2))
        .build()
        .unwrap();
    let limiter = Limiter::new(store);
    let quota = Quota::per_minute(100).unwrap();
    assert!(support::admits(&limiter, "k", &quota).await);

    redis.stop();
    for _ in 0..6 {
        assert!(limiter
            .try_check_quotas("k", &quota.into(), 1)
            .await
            .is_err());
    }
    let text = captured.text();
    let opened = lines_with(&text, "WARN", "circuit opened");
    assert_eq!(opened.len(), 1, "one warning per outage:\n{text}");
    assert!(
        lines_with(&text, "INFO", "circuit closed").is_empty(),
        "{text}"
    );

    redis.restart();
    let back = support::answers_within_10s(&limiter, "k", &quota).await;
    assert!(
        back,
        "Redis answered after the restart:\n{}",
        captured.text()
    );
    let text = captured.text();
    assert_eq!(
        lines_with(&text, "INFO", "circuit closed").len(),
        1,
        "{text}"
    );
    assert!(!text.contains('\u{1b}'), "no colour codes: {text:?}");
}

/// A service started with a wrong `REDIS_URL` serves (the policy fails open), and says so once,
/// with where it tried to connect, and not once per request nor once a second: with the
/// defaults (the circuit breaker on: its opening and its failed probes belong to the same
/// outage) and without a circuit breaker.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_url_logs_one_warning_at_the_first_failure_not_one_per_request() {
    one_warning_for_a_wrong_url(|url| RedisStore::new(url).unwrap()).await;
}

/// The same without a circuit breaker: every request tries Redis.
#[tokio::test(flavor = "current_thread")]
async fn a_wrong_url_without_a_circuit_breaker_logs_one_warning() {
    one_warning_for_a_wrong_url(|url| {
        RedisStore::builder(url)
            .without_circuit_breaker()
            .build()
            .unwrap()
    })
    .await;
}

async fn one_warning_for_a_wrong_url(store: impl FnOnce(&str) -> RedisStore) {
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::DEBUG);

    let port = support::free_port(); // nothing listens there
    let password = "s3cret-pw";
    let url = format!("redis://limiter:{password}@127.0.0.1:{port}/");
    let store = store(&url);
    let limiter = Limiter::new(store);
    let quota = Quota::per_minute(100).unwrap();
    let requests = 150;
    // Over more than two seconds: a line a second would show.
    for _ in 0..requests {
        assert!(limiter.check("k", &quota).await.is_allowed());
        tokio::time::sleep(Duration::from_millis(15)).await;
    }

    let text = captured.text();
    let warnings = lines_with(&text, " WARN ", "");
    assert_eq!(warnings.len(), 1, "one warning in all:\n{text}");
    let warning = warnings[0];
    assert!(warning.contains(FIRST_FAILURE), "{warning}");
    assert!(
        warning.contains(&format!("redis://limiter:***@127.0.0.1:{port}/")),
        "the address, its password hidden: {warning}"
    );
    assert!(
        !text.contains(password),
        "the password is never logged:\n{text}"
    );
    let stats = limiter.stats();
    assert_eq!(stats.store_errors, requests, "{stats:?}");
    assert_eq!(stats.failed_open, requests, "{stats:?}");
}

/// An episode lasts until Redis answers: its failures after the first are left out (for a
/// minute), and once Redis has answered the next failure warns again at once, saying how many
/// were left out.
#[tokio::test(flavor = "current_thread")]
async fn an_answer_ends_the_episode_and_the_next_failure_warns_again() {
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::INFO);

    let mut redis = RedisServer::start();
    // The defaults, circuit breaker included: its answers and its skipped calls alike belong
    // to the episode.
    let limiter = Limiter::new(RedisStore::new(redis.url()).unwrap());
    let quota = Quota::per_minute(1_000).unwrap();
    assert!(support::admits(&limiter, "k", &quota).await);

    redis.stop();
    for _ in 0..30 {
        assert!(limiter.check("k", &quota).await.is_allowed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = captured.text();
    let first = lines_with(&text, "WARN", FIRST_FAILURE);
    assert_eq!(first.len(), 1, "one warning for the episode:\n{text}");
    let address = format!("redis://127.0.0.1:{}/", redis.port());
    assert!(first[0].contains(&address), "{}", first[0]);
    assert!(
        lines_with(&text, "WARN", "still failing").is_empty(),
        "no line again within the minute:\n{text}"
    );

    redis.restart();
    assert!(support::answers_within_10s(&limiter, "k", &quota).await);
    // Two episodes' first lines are a second apart at least (a store that flaps).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    redis.stop();
    assert!(limiter.check("k", &quota).await.is_allowed());
    let text = captured.text();
    let first = lines_with(&text, "WARN", FIRST_FAILURE);
    assert_eq!(first.len(), 2, "the next episode warns at once:\n{text}");
    assert!(first[1].contains("left_out=29"), "{}", first[1]);
}

/// A store of the user's, failing: described by its `Debug`, warned about once.
#[derive(Debug)]
#[allow(dead_code)] // read through its `Debug`
struct Unreachable {
    ledger: &'static str,
}

impl Store for Unreachable {
    fn check<'a>(&'a self, _: CheckRequest<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(std::future::ready(Err(StoreError::Timeout(
            Duration::from_millis(5),
        ))))
    }

    fn run<'a>(&'a self, _: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        support::stores::refused("unreachable")
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_custom_stores_failures_warn_once_with_its_debug() {
    let (captured, _guard) = crate::support::logs::capture(tracing::Level::INFO);

    let limiter = Limiter::new(Unreachable {
        ledger: "ledger-of-the-custom-store-test",
    });
    let quota = Quota::per_minute(100).unwrap();
    for _ in 0..100 {
        assert!(limiter.check("k", &quota).await.is_allowed());
    }
    let text = captured.text();
    let warnings = lines_with(&text, " WARN ", "");
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(
        warnings[0].contains(r#"store=Unreachable { ledger: "ledger-of-the-custom-store-test" }"#),
        "{text}"
    );
    assert_eq!(limiter.stats().store_errors, 100);
}
