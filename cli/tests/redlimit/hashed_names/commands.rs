//! Every command given a stored id (`#` and 64 lower-case hex digits) reaches exactly the tenant
//! or route stored under it, on a single node and on Cluster; no argument reaches another
//! tenant's keys or keys outside the prefix.

use redlimit::{Limiter, Quota, Quotas, Target};
use serde_json::Value;

use crate::support;

use crate::{run_ok, run_on as run, Deployment};

fn json_ok(redis: &[&str], args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = run_ok(redis, &all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// The id a key is stored under (between the braces).
fn id_of(limiter: &Limiter, key: &str) -> String {
    let stored = limiter.storage_key(key);
    stored["redlimit:{".len()..stored.len() - 1].to_owned()
}

/// The id a scope is stored under.
fn scope_id_of(limiter: &Limiter, scope: &str) -> String {
    let stored = limiter.storage_key(Target::scoped(scope, "t"));
    stored["redlimit:{t}:".len()..].to_owned()
}

fn quotas(limit: u64) -> Quotas {
    Quota::per_hour(limit).unwrap().into()
}

/// Whether `key` on `scope` (unscoped when `None`) has a request left of a 2/h quota (a peek
/// at cost 0, which writes nothing), and the limit that decided.
async fn probe(limiter: &Limiter, key: &str, scope: Option<&str>) -> (bool, u64) {
    let target = scope.map_or(Target::key(key), |s| Target::scoped(s, key));
    let verdict = limiter.check_quotas(target, &quotas(2), 0).await;
    let decision = verdict.decision().copied().expect("a decision");
    (
        decision.remaining > 0 && !decision.suspended,
        decision.limit,
    )
}

async fn spend(limiter: &Limiter, key: &str, scope: Option<&str>) {
    let target = scope.map_or(Target::key(key), |s| Target::scoped(s, key));
    for _ in 0..2 {
        assert!(limiter
            .check_quotas(target, &quotas(2), 1)
            .await
            .is_allowed());
    }
}

/// Two hashed tenants (`{acme}` and `{other}`) and the plain `acme`, each with state on the
/// unscoped key and on the hashed route `a b`: every command given `{acme}`'s stored id (and
/// the route's) acts on `{acme}` only.
async fn every_command_on_a_hashed_tenant_and_route(redis: &[&str], limiter: &Limiter) {
    let (acme, other, plain, route) = ("{acme}", "{other}", "acme", "a b");
    for key in [acme, other, plain] {
        spend(limiter, key, None).await;
        spend(limiter, key, Some(route)).await;
    }
    // A route whose quotas `limited` knows (a layer's derived scope).
    let header = redlimit::key::HeaderKey::named("x-api-key").unwrap();
    let layer = redlimit::RateLimitLayer::new(limiter.clone(), Quota::per_hour(2).unwrap(), header);
    let known = layer.scope().to_owned();
    for key in [acme, other] {
        spend(limiter, key, Some(&known)).await;
    }
    let id = id_of(limiter, acme);
    let route_id = scope_id_of(limiter, route);
    assert!(id.starts_with('#') && id.len() == 65, "{id}");
    assert!(
        route_id.starts_with('#') && route_id.len() == 65,
        "{route_id}"
    );

    let inspected = json_ok(redis, &["inspect", &id]);
    assert_eq!(inspected["hashed"], true, "{inspected}");
    assert_eq!(inspected["route_hashed"], false, "{inspected}");
    assert_eq!(
        inspected["storage_key"],
        limiter.storage_key(acme),
        "{inspected}"
    );
    let routes: Vec<&Value> = inspected["routes"].as_array().unwrap().iter().collect();
    assert_eq!(routes.len(), 2, "{inspected}");
    assert!(routes
        .iter()
        .any(|r| r["route"] == route_id.as_str() && r["hashed"] == true));
    let scoped = json_ok(redis, &["inspect", &id, "--scope", &route_id]);
    assert_eq!(scoped["route_hashed"], true, "{scoped}");
    assert_eq!(
        scoped["storage_key"],
        limiter.storage_key(Target::scoped(route, acme)),
        "{scoped}"
    );

    // limited: each spent tenant once per route, the hashed ones by their ids.
    let limited = json_ok(redis, &["limited"]);
    let rows: Vec<(String, String)> = limited
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tenant"].as_str().unwrap().to_owned(),
                r["route"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut unique = rows.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), rows.len(), "a row twice: {limited}");
    for key in [acme, other] {
        let row = (id_of(limiter, key), known.clone());
        assert!(rows.contains(&row), "{row:?} not in {limited}");
    }
    assert!(
        limited
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["hashed"] == true && r["remaining"] == 0),
        "{limited}"
    );

    run_ok(redis, &["suspend", &id, "1h"]);
    // Suspended on every route (the state is spent too: the suspension is read, not the count).
    for target in [Target::key(acme), Target::scoped(route, acme)] {
        let verdict = limiter.check_quotas(target, &quotas(2), 0).await;
        assert!(verdict.decision().unwrap().suspended, "{target:?}");
    }
    let status = limiter.inspect(Target::key(other)).await.unwrap();
    assert_eq!(
        status.suspended_for, None,
        "another hashed tenant was suspended"
    );
    assert_eq!(
        support::suspended_for(limiter, Target::key(plain)).await,
        None
    );
    let limited = json_ok(redis, &["limited"]);
    let own_rows = limited
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["tenant"] == id.as_str() && r["route"] == "(every route)")
        .count();
    assert_eq!(own_rows, 1, "{limited}");
    run_ok(redis, &["resume", &id]);
    assert_eq!(
        support::suspended_for(limiter, Target::key(acme)).await,
        None
    );

    run_ok(redis, &["set-quota", &id, "--scope", &route_id, "7/1h"]);
    assert_eq!(probe(limiter, acme, Some(route)).await.1, 7);
    assert_eq!(probe(limiter, other, Some(route)).await.1, 2);
    assert_eq!(probe(limiter, plain, Some(route)).await.1, 2);
    assert_eq!(probe(limiter, acme, None).await.1, 2);
    run_ok(redis, &["clear-quota", &id, "--scope", &route_id]);
    assert_eq!(probe(limiter, acme, Some(route)).await.1, 2);

    run_ok(redis, &["set-quota", &id, "--all-routes", "9/1h"]);
    assert_eq!(probe(limiter, acme, None).await.1, 9);
    assert_eq!(probe(limiter, other, None).await.1, 2);
    run_ok(redis, &["clear-quota", &id, "--all-routes"]);
    assert_eq!(probe(limiter, acme, None).await.1, 2);

    // reset of the route, then of the tenant: only `{acme}`'s state.
    assert!(
        !probe(limiter, acme, Some(route)).await.0,
        "spent before the reset"
    );
    assert!(
        !probe(limiter, acme, None).await.0,
        "spent before the reset"
    );
    run_ok(redis, &["reset", &id, "--scope", &route_id]);
    assert!(probe(limiter, acme, Some(route)).await.0);
    assert!(!probe(limiter, acme, None).await.0);
    run_ok(redis, &["reset", &id]);
    assert!(probe(limiter, acme, None).await.0);
    for key in [other, plain] {
        assert!(!probe(limiter, key, None).await.0, "{key} was reset");
        assert!(!probe(limiter, key, Some(route)).await.0, "{key} was reset");
    }
}

/// On a single node and on a Cluster.
#[tokio::test]
async fn every_command_reaches_exactly_a_hashed_tenant_and_route() {
    for on in [Deployment::single_node(), Deployment::cluster()] {
        every_command_on_a_hashed_tenant_and_route(&on.flags(), &on.limiter).await;
    }
}

/// A tenant whose own key is `#` and 64 lower-case hex digits is stored hashed; the argument
/// of that form names the (empty) id, not the tenant; its own stored form names the tenant.
#[tokio::test]
async fn a_key_of_the_stored_form_is_named_by_its_own_stored_form_only() {
    let on = Deployment::single_node();
    let (r, limiter) = (&on.flags(), &on.limiter);
    let own = format!("#{}", "ab".repeat(32));
    spend(limiter, &own, None).await;
    let stored = id_of(limiter, &own);
    assert_ne!(stored, own, "stored as itself");

    // The argument names the id `own`, where nothing is stored: nothing to inspect (exit 2).
    let nothing = run(r, &["inspect", &own]);
    assert_eq!(nothing.status.code(), Some(2), "{nothing:?}");
    assert!(nothing.stdout.is_empty(), "{nothing:?}");
    run_ok(r, &["suspend", &own, "1h"]);
    let named = json_ok(r, &["inspect", &own]);
    assert_eq!(
        named["storage_key"],
        format!("redlimit:{{{own}}}"),
        "{named}"
    );
    assert_eq!(named["hashed"], true, "{named}");
    assert_eq!(
        limiter.inspect(own.as_str()).await.unwrap().suspended_for,
        None,
        "the argument of the stored form reached the tenant whose key it is"
    );
    run_ok(r, &["suspend", &stored, "1h"]);
    assert!(support::suspended_for(limiter, own.as_str())
        .await
        .is_some());
    let shown = json_ok(r, &["inspect", &stored]);
    assert_eq!(shown["storage_key"], limiter.storage_key(own.as_str()));
    assert_eq!(shown["hashed"], true);
}

/// Upper-case hex, 63 or 65 digits, and the shared key's `#:` form are keys, not stored ids:
/// each names the tenant of that key (stored hashed, as it starts with `#`).
#[tokio::test]
async fn near_misses_of_the_stored_form_name_the_tenant_of_that_key() {
    let on = Deployment::single_node();
    let (r, limiter) = (&on.flags(), &on.limiter);
    let hex = "0123456789abcdef".repeat(4);
    for key in [
        format!("#{}", hex.to_uppercase()),
        format!("#{}", &hex[1..]),
        format!("#{hex}0"),
        "#:unkeyed".to_owned(),
        format!("#:{}", &hex[1..]),
    ] {
        run_ok(r, &["suspend", &key, "1h"]);
        let status = limiter.inspect(key.as_str()).await.unwrap();
        assert!(status.suspended_for.is_some(), "{key} was not suspended");
        let shown = json_ok(r, &["inspect", &key]);
        assert_eq!(
            shown["storage_key"],
            limiter.storage_key(key.as_str()),
            "{key}"
        );
        assert_eq!(shown["hashed"], true, "{key}");
        assert_ne!(shown["storage_key"], format!("redlimit:{{{key}}}"), "{key}");
    }
}

/// SCAN patterns: a key, scope or prefix with glob characters reaches its own keys only.
#[tokio::test]
async fn glob_characters_in_keys_scopes_and_prefixes_reach_only_their_own_keys() {
    let on = Deployment::single_node();
    let (r, limiter) = (&on.flags(), &on.limiter);
    let tenants = ["a*", "ab", "a?", "a[b]", "a\\", "a\\*", "a"];
    for tenant in tenants {
        spend(limiter, tenant, None).await;
        spend(limiter, tenant, Some(&format!("s-{tenant}"))).await;
    }
    for tenant in tenants {
        let shown = json_ok(r, &["inspect", tenant]);
        let routes: Vec<&Value> = shown["routes"].as_array().unwrap().iter().collect();
        // `routes` lists the scoped routes (the unscoped one is the status itself).
        assert_eq!(routes.len(), 1, "{tenant}: {shown}");
        assert_eq!(
            routes[0]["route"],
            format!("s-{tenant}"),
            "{tenant}: {shown}"
        );
    }
    // A scope with glob characters and a `#` (stored hashed) names its own route of its own
    // tenant.
    for tenant in ["ab", "a*"] {
        spend(limiter, tenant, Some("x#*")).await;
    }
    run_ok(r, &["reset", "ab", "--scope", "x#*"]);
    assert!(probe(limiter, "ab", Some("x#*")).await.0);
    assert!(!probe(limiter, "a*", Some("x#*")).await.0);
    assert!(!probe(limiter, "ab", None).await.0);
    run_ok(r, &["reset", "ab", "--scope", "s-a*"]);
    assert!(!probe(limiter, "a*", Some("s-a*")).await.0);
    run_ok(r, &["reset", "a*"]);
    assert!(probe(limiter, "a*", None).await.0);
    for tenant in tenants.iter().filter(|t| **t != "a*") {
        assert!(!probe(limiter, tenant, None).await.0, "{tenant} was reset");
    }
    // A prefix with glob characters lists nothing of another prefix: `z` of the prefix `re*`
    // and `z2` of the default prefix, each spent on a route whose quotas `limited` knows.
    let known = |limiter: &Limiter| {
        let header = redlimit::key::HeaderKey::named("x-api-key").unwrap();
        let layer =
            redlimit::RateLimitLayer::new(limiter.clone(), Quota::per_hour(2).unwrap(), header);
        layer.scope().to_owned()
    };
    let other = Limiter::builder(support::redis_store(on.node()))
        .prefix("re*")
        .build()
        .unwrap();
    spend(&other, "z", Some(&known(&other))).await;
    spend(limiter, "z2", Some(&known(limiter))).await;
    let listed = |args: &[&str]| -> Vec<String> {
        let rows = json_ok(r, args);
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["tenant"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(&["limited", "--prefix", "re*"]), ["z"]);
    assert_eq!(listed(&["limited"]), ["z2"]);
    for prefix in ["re?", "redlimi?", "[r]edlimit", "redlimit\\", "r*"] {
        assert!(
            listed(&["limited", "--prefix", prefix]).is_empty(),
            "{prefix}"
        );
    }
}
