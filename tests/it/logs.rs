//! `tracing` events of an outage on a real Redis: a warning when the store keeps failing and the
//! circuit opens, an info event when a probe finds Redis back and the circuit closes.

use crate::support;

use redlimit::store::RedisStore;
use redlimit::{Limiter, Quota};
use support::RedisServer;

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
