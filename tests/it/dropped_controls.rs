//! A control whose future is dropped while the store holds it (a caller's timeout, a client
//! gone), and which the store applies after all, still ends this limiter's cached denials of
//! the tenant: the next check asks the store again instead of answering a denial the control
//! undid.

use std::time::Duration;

use redlimit::{Algorithm, Limiter, Quota};

use crate::support::{Ctx, RedisServer};

/// Script calls Redis has run.
fn script_calls(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha") + redis.command_calls("eval")
}

/// Which control undoes the denial.
#[derive(Debug, Clone, Copy)]
enum Undo {
    /// The key's usage is forgotten.
    Reset,
    /// The key's suspension (set by another instance) ends.
    Resume,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_dropped_in_flight_still_ends_the_tenants_cached_denials() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(1).unwrap();
    // Calls that outlive Redis's nap: only the caller's own timeout drops the control.
    let ctx = Ctx::new(Algorithm::TokenBucket).timeout(Duration::from_secs(10));
    let cached = ctx.clone().deny_cache(100).redis(&redis);
    let other: Limiter = ctx.redis(&redis);
    // The control script loaded, so that the control Redis holds is the script itself (a
    // NOSCRIPT answered to a dropped future is never sent again).
    cached.inspect("warm-up").await.unwrap();
    let mut answered = Vec::new();
    for undo in [Undo::Reset, Undo::Resume] {
        let key = format!("dropped-{undo:?}");
        match undo {
            Undo::Reset => assert!(cached.check(&key, &quota).await.is_allowed()),
            Undo::Resume => {
                other
                    .suspend(key.as_str(), Duration::from_secs(60))
                    .await
                    .unwrap();
            }
        }
        // Denied by the store, then by the cache (no script call).
        assert!(!cached.check(&key, &quota).await.is_allowed());
        let calls = script_calls(&redis);
        assert!(!cached.check(&key, &quota).await.is_allowed());
        assert_eq!(
            script_calls(&redis),
            calls,
            "{undo:?}: the denial is cached"
        );

        // Redis naps 1 s; the control is sent meanwhile and its caller gives up after 300 ms.
        let nap = redis.debug_sleep(Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(50));
        let control = async {
            match undo {
                Undo::Reset => cached.reset(key.as_str()).await,
                Undo::Resume => cached.resume(key.as_str()).await,
            }
        };
        let dropped = tokio::time::timeout(Duration::from_millis(300), control).await;
        assert!(
            dropped.is_err(),
            "{undo:?}: the control answered: {dropped:?}"
        );
        nap.join().unwrap();
        // Redis applied it once awake.
        let status = other.inspect(key.as_str()).await.unwrap();
        let applied = match undo {
            Undo::Reset => status.tiers.is_empty(),
            Undo::Resume => status.suspended_for.is_none(),
        };
        assert!(applied, "{undo:?}: Redis did not apply it: {status:?}");

        let verdict = cached.check(&key, &quota).await;
        if !verdict.is_allowed() {
            answered.push(format!("{undo:?}: {:?}", verdict.decision()));
        }
    }
    assert!(
        answered.is_empty(),
        "the cached denial still answers: {answered:#?}"
    );
}
