//! What the controls do to a tenant's routes (a suspension reaches every route, a route's quota
//! comes back after `clear-quota`), a tenant without keys, and tenant ids that hold the key's
//! separators, braces and glob characters.

use redlimit::{Limiter, Quota, Quotas, Target};
use serde_json::Value;

use crate::ok;
use crate::support::{self, RedisServer};

/// `suspend TENANT 30s`: every route of the tenant, and one it has never used, refuse its next
/// call; another tenant is unaffected; `resume` lets them through.
#[tokio::test]
async fn a_suspension_reaches_every_route_on_the_next_call() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let quota: Quotas = Quota::per_minute(100).unwrap().into();
    let routes = ["default:token-bucket:100/60s", "login", "api:v2"];
    for route in &routes[..2] {
        assert!(limiter
            .check_quotas(Target::scoped(route, "t-1"), &quota, 1)
            .await
            .is_allowed());
    }
    ok(&redis, &["suspend", "t-1", "30s"]);
    for route in routes {
        let verdict = limiter
            .check_quotas(Target::scoped(route, "t-1"), &quota, 1)
            .await;
        let decision = verdict.decision().copied().expect("decided");
        assert!(
            !decision.allowed && decision.suspended,
            "{route}: {decision:?}"
        );
    }
    assert!(limiter
        .check_quotas(Target::scoped(routes[0], "t-2"), &quota, 1)
        .await
        .is_allowed());
    ok(&redis, &["resume", "t-1"]);
    for route in routes {
        assert!(limiter
            .check_quotas(Target::scoped(route, "t-1"), &quota, 1)
            .await
            .is_allowed());
    }
}

/// `set-quota --scope R` then `clear-quota --scope R`: the route's own quota again; the same
/// with `--all-routes`.
#[tokio::test]
async fn set_quota_then_clear_quota_restores_the_routes_quota() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let own: Quotas = Quota::per_minute(100).unwrap().into();
    let route = "default:token-bucket:100/60s";
    let limit = |verdict: redlimit::Verdict| verdict.decision().expect("decided").limit;
    for flags in [&["--scope", route][..], &["--all-routes"]] {
        let mut args = flags.to_vec();
        args.extend(["set-quota", "t", "2/1m"]);
        ok(&redis, &args);
        let verdict = limiter
            .check_quotas(Target::scoped(route, "t"), &own, 1)
            .await;
        assert_eq!(limit(verdict), 2, "{flags:?}");
        let mut args = flags.to_vec();
        args.extend(["clear-quota", "t"]);
        ok(&redis, &args);
        let verdict = limiter
            .check_quotas(Target::scoped(route, "t"), &own, 0)
            .await;
        assert_eq!(limit(verdict), 100, "{flags:?}");
    }
}

/// `reset` of a tenant with no keys at all: exit 0, said so, nothing to forget.
#[test]
fn reset_of_a_tenant_without_keys() {
    let redis = RedisServer::start();
    let stdout = ok(&redis, &["reset", "nobody"]);
    assert!(
        stdout.starts_with("reset: \"nobody\"'s usage is forgotten"),
        "{stdout}"
    );
    let json = ok(&redis, &["--json", "reset", "nobody"]);
    let value: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["tenant"], "nobody");
    // What it leaves: the reset's mark, a controls key that lives 30 days, after which
    // `inspect nobody` finds the tenant (exit 0, not the unknown tenant's exit 2).
    let ttl: i64 = redis::cmd("PTTL")
        .arg("redlimit:{nobody}#t")
        .query(&mut redis.conn())
        .unwrap();
    assert!(ttl > 0, "{ttl}");
    ok(&redis, &["inspect", "nobody"]);
}

/// Tenant ids holding the key separator `:`, hash-tag braces, glob characters, spaces:
/// suspend, inspect and resume reach exactly that tenant.
#[tokio::test]
async fn tenants_with_separators_and_braces() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    for tenant in [
        "a:b",
        "ip:10.0.0.1:route",
        "{x}",
        "a}b",
        "a{",
        "*",
        "a?[b]",
        "a b",
        "#t",
    ] {
        ok(&redis, &["suspend", tenant, "1m"]);
        let status = limiter.inspect(tenant).await.unwrap();
        assert!(status.suspended_for.is_some(), "{tenant}");
        let inspected = ok(&redis, &["inspect", tenant]);
        assert!(
            inspected.contains("  suspended: ") && inspected.contains("s left"),
            "{tenant}: {inspected}"
        );
        // Neighbours are untouched.
        for other in ["a", "b", "x", "ip:10.0.0.1"] {
            assert_eq!(
                limiter.inspect(other).await.unwrap().suspended_for,
                None,
                "{tenant} vs {other}"
            );
        }
        ok(&redis, &["resume", tenant]);
        assert_eq!(
            limiter.inspect(tenant).await.unwrap().suspended_for,
            None,
            "{tenant}"
        );
    }
}
