//! Tenants and routes stored hashed as `limited` and `inspect` show them: by their stored form,
//! which the commands take to name them; and a TENANT of that form is a stored id.

use std::time::Duration;

use redlimit::{Limiter, Target};
use serde_json::Value;

use crate::support::{self, RedisServer};
use crate::{ok, run, text};

/// `limited` lists the tenants denied now: a suspended tenant whose id the limiter stores
/// hashed (a space, braces) is denied too.
#[test]
fn limited_lists_a_suspended_tenant_with_a_hashed_id() {
    let redis = RedisServer::start();
    ok(&redis, &["suspend", "a b", "1h"]);
    ok(&redis, &["suspend", "{x}", "1h"]);
    let json = ok(&redis, &["--json", "limited"]);
    let rows: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 2, "{json}");
}

/// `inspect` of a tenant suspended on a route whose scope is stored hashed (it holds a space):
/// the route's row must not say `suspended: no`.
#[test]
fn inspect_shows_a_hashed_routes_own_state() {
    let redis = RedisServer::start();
    ok(&redis, &["--scope", "a b", "suspend", "t", "1m"]);
    let inspected = ok(&redis, &["inspect", "t"]);
    // The route's row (the unscoped key, not suspended, comes first).
    let (_, route) = inspected.split_once("\nroute ").expect("a route row");
    assert!(!route.contains("suspended: no"), "{inspected}");
    assert!(
        route.contains("  suspended: ") && route.contains("s left"),
        "{inspected}"
    );
}

/// The id a key (or a scope's key) is stored under: `#` and its SHA-256 when hashed.
fn stored_id(limiter: &Limiter, target: Target<'_>) -> (String, Option<String>) {
    let key = limiter.storage_key(target);
    match limiter.stored_key(&key) {
        Some(redlimit::limiter::StoredKey::Route { id, scope }) => {
            (id.to_owned(), scope.map(str::to_owned))
        }
        other => panic!("{key}: {other:?}"),
    }
}

/// What `limited` shows of a tenant stored hashed is what the commands take to name it: its
/// row says `hashed`, and `resume` of that form resumes that tenant (and no other).
#[tokio::test]
async fn a_hashed_tenant_is_named_by_its_stored_form() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let (hashed, _) = stored_id(&limiter, Target::key("a b"));
    assert!(hashed.starts_with('#') && hashed.len() == 65, "{hashed}");
    ok(&redis, &["suspend", "a b", "1h"]);
    ok(&redis, &["suspend", "plain", "1h"]);
    let json = ok(&redis, &["--json", "limited"]);
    let rows: Value = serde_json::from_str(&json).unwrap();
    let row = |tenant: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|row| row["tenant"] == tenant)
            .cloned()
            .unwrap_or_else(|| panic!("{tenant} not in {json}"))
    };
    assert_eq!(row(&hashed)["hashed"], true, "{json}");
    assert_eq!(row(&hashed)["route_hashed"], false, "{json}");
    assert_eq!(row("plain")["hashed"], false, "{json}");
    let listed = ok(&redis, &["limited"]);
    assert!(
        listed.contains(&format!("{hashed} (every route): suspended")),
        "{listed}"
    );
    let inspected = ok(&redis, &["--json", "inspect", &hashed]);
    let inspected: Value = serde_json::from_str(&inspected).unwrap();
    assert_eq!(inspected["hashed"], true);
    assert_eq!(
        inspected["storage_key"],
        format!("redlimit:{{{hashed}}}"),
        "{inspected}"
    );
    assert!(
        inspected["suspended_ms"].as_u64().unwrap() > 0,
        "{inspected}"
    );
    ok(&redis, &["resume", &hashed]);
    assert_eq!(limiter.inspect("a b").await.unwrap().suspended_for, None);
    assert!(support::suspended_for(&limiter, "plain").await.is_some());
    // The name itself still names the same tenant.
    ok(&redis, &["suspend", "a b", "1m"]);
    let by_name: Value = serde_json::from_str(&ok(&redis, &["--json", "inspect", "a b"])).unwrap();
    assert_eq!(by_name["tenant"], "a b");
    assert_eq!(by_name["hashed"], true);
    assert_eq!(by_name["storage_key"], inspected["storage_key"]);
}

/// A route stored hashed is listed by its stored form, which `--scope` takes to name it; its
/// name still names it too.
#[tokio::test]
async fn a_hashed_route_is_named_by_its_stored_form() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let (_, scope) = stored_id(&limiter, Target::scoped("a b", "t"));
    let scope = scope.unwrap();
    ok(&redis, &["--scope", "a b", "suspend", "t", "1m"]);
    let json: Value = serde_json::from_str(&ok(&redis, &["--json", "inspect", "t"])).unwrap();
    let routes = json["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 1, "{json}");
    assert_eq!(routes[0]["route"], scope.as_str());
    assert_eq!(routes[0]["hashed"], true);
    assert!(routes[0]["suspended_ms"].as_u64().unwrap() > 0, "{json}");
    for named in ["a b", scope.as_str()] {
        let one: Value =
            serde_json::from_str(&ok(&redis, &["--json", "--scope", named, "inspect", "t"]))
                .unwrap();
        assert_eq!(one["route_hashed"], true, "{named}");
        assert!(one["suspended_ms"].as_u64().unwrap() > 0, "{named}: {one}");
    }
    ok(&redis, &["--scope", &scope, "resume", "t"]);
    let status = limiter.inspect(Target::scoped("a b", "t")).await.unwrap();
    assert_eq!(status.suspended_for, None);
}

/// The `#`-id rule: a TENANT of exactly `#` and 64 lower-case hex digits is a stored id. The
/// limiter hashes every key that starts with `#`, so no key is stored as that argument: it
/// names only the key stored under it. A tenant whose own key has that form is named by its
/// stored form; any other key starting with `#` is the key itself, as before.
#[tokio::test]
async fn a_tenant_of_the_stored_form_is_a_stored_id() {
    let redis = RedisServer::start();
    let limiter: Limiter = support::Ctx::default().redis(&redis);
    let literal = format!("#{}", "ab".repeat(32));
    limiter
        .suspend(literal.as_str(), Duration::from_secs(60))
        .await
        .unwrap();
    let (stored, _) = stored_id(&limiter, Target::key(&literal));
    assert_ne!(stored, literal);
    // The argument names the id `literal`, which holds nothing: the tenant is not touched.
    let unknown = run(&["--redis", &redis.url(), "inspect", &literal], &[]);
    assert_eq!(unknown.status.code(), Some(2), "{}", text(&unknown.stderr));
    ok(&redis, &["resume", &literal]);
    assert!(support::suspended_for(&limiter, literal.as_str())
        .await
        .is_some());
    // Its stored form names it.
    let inspected = ok(&redis, &["inspect", &stored]);
    assert!(inspected.contains("s left"), "{inspected}");
    ok(&redis, &["resume", &stored]);
    assert_eq!(
        support::suspended_for(&limiter, literal.as_str()).await,
        None
    );
    // Not the exact form (upper-case, one digit short): the key itself.
    for key in [
        format!("#{}", "AB".repeat(32)),
        format!("#{}", "a".repeat(63)),
    ] {
        ok(&redis, &["suspend", &key, "1m"]);
        let status = limiter.inspect(key.as_str()).await.unwrap();
        assert!(status.suspended_for.is_some(), "{key}");
    }
}
