//! `limited` and `limited --watch` while layers make traffic, on a single node and on Cluster:
//! exactly the tenants limited, refreshed; and a suspension by tenant id reaching every route.

use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redlimit::key::HeaderKey;
use redlimit::{Limiter, Quota, RateLimitLayer, Target};
use serde_json::Value;

use crate::support::{self, RedisServer};

/// How long a `--watch` test waits for a refresh it expects (a bound on a hang, not a goal).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(30);

use crate::{run_ok, Deployment};

/// Two routes of one service (layers with their own quota, keyed by `x-api-key`); traffic
/// spends `used` of each route's quota for each tenant.
async fn traffic(limiter: &Limiter, tenants: &[(&str, u64)]) -> [String; 2] {
    let (small, large) = (Quota::per_hour(5).unwrap(), Quota::per_hour(40).unwrap());
    let scope = |quota| {
        let key = HeaderKey::named("x-api-key").unwrap();
        RateLimitLayer::new(limiter.clone(), quota, key)
            .scope()
            .to_owned()
    };
    let scopes = [scope(small), scope(large)];
    for (tenant, used) in tenants {
        for (scope, quota) in scopes.iter().zip([small, large]) {
            for _ in 0..(*used).min(quota.limit()) {
                let target = Target::scoped(scope, tenant);
                assert!(limiter
                    .check_quotas(target, &quota.into(), 1)
                    .await
                    .is_allowed());
            }
        }
    }
    scopes
}

/// The `(tenant, route)` of every row of `limited --json`.
fn rows(json: &str) -> Vec<(String, String)> {
    let value: Value = serde_json::from_str(json).expect("JSON");
    let rows = value.as_array().expect("an array");
    rows.iter()
        .map(|row| {
            let text = |name: &str| row[name].as_str().unwrap().to_owned();
            (text("tenant"), text("route"))
        })
        .collect()
}

/// On `redis` (the flags that name it), with `limiter` on the same Redis: a tenant suspended by
/// its id is refused on every route at its next call; `limited --json` lists exactly the
/// limited tenants; `set-quota` then `clear-quota` restore the route's quota.
async fn limited_and_suspension(redis: &[&str], limiter: &Limiter) {
    // spent: every quota used; fine and held: 1 of each.
    let scopes = traffic(limiter, &[("spent", 40), ("fine", 1), ("held", 1)]).await;
    let [small, large] = &scopes;
    let json = run_ok(redis, &["limited", "--json"]);
    let mut found = rows(&json);
    found.sort();
    let spent = |route: &str| ("spent".to_owned(), route.to_owned());
    let mut want = vec![spent(large), spent(small)];
    want.sort();
    assert_eq!(found, want, "{json}");

    run_ok(redis, &["suspend", "held", "10m"]);
    for scope in &scopes {
        let decision = limiter
            .check_quotas(
                Target::scoped(scope, "held"),
                &Quota::per_hour(40).unwrap().into(),
                1,
            )
            .await;
        let decision = decision.decision().copied().expect("decided");
        assert!(
            !decision.allowed && decision.suspended,
            "{scope}: {decision:?}"
        );
    }
    let json = run_ok(redis, &["limited", "--json"]);
    let found = rows(&json);
    assert_eq!(
        found[0],
        ("held".to_owned(), "(every route)".to_owned()),
        "{json}"
    );
    // Then held's routes (each suspended), then spent's.
    let tenants: Vec<&str> = found.iter().map(|(tenant, _)| tenant.as_str()).collect();
    assert_eq!(
        tenants,
        ["held", "held", "held", "spent", "spent"],
        "{json}"
    );

    // A route's quota replaced, then restored.
    let quota = Quota::per_hour(40).unwrap();
    run_ok(redis, &["--scope", large, "set-quota", "fine", "2/1h"]);
    let target = Target::scoped(large, "fine");
    // fine used 1 before: the override's 2 an hour admit at most 2 more, then deny.
    let mut denied = None;
    for _ in 0..3 {
        let verdict = limiter.check_quotas(target, &quota.into(), 1).await;
        let decision = verdict.decision().copied().expect("decided");
        assert_eq!(decision.limit, 2, "the override: {decision:?}");
        if !decision.allowed {
            denied = Some(decision);
            break;
        }
    }
    assert!(denied.is_some(), "2 an hour: a third call is denied");
    let text = run_ok(redis, &["limited"]);
    let row = format!("fine {large}: 0 of 2 left, full again in ");
    assert!(
        text.lines()
            .any(|line| line.starts_with(&row) && line.ends_with(" (override 2/1h)")),
        "{text}"
    );
    run_ok(redis, &["--scope", large, "clear-quota", "fine"]);
    let restored = limiter.check_quotas(target, &quota.into(), 1).await;
    // The route's own 40 an hour again (the state the override spent stays spent).
    assert_eq!(
        restored.decision().map(|d| d.limit),
        Some(40),
        "{restored:?}"
    );
}

/// On a single node and on a Cluster.
#[tokio::test]
async fn limited_lists_exactly_the_limited_tenants_and_a_suspension_reaches_every_route() {
    for on in [Deployment::single_node(), Deployment::cluster()] {
        limited_and_suspension(&on.flags(), &on.limiter).await;
    }
}

/// `limited --watch` run until killed, its stdout line by line.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(url: &str) -> Watch {
        let args = ["--redis", url, "limited", "--watch", "100ms"];
        let mut child = crate::spawn(&args, Stdio::null());
        let lines = support::example::stdout_lines(&mut child);
        Watch { child, lines }
    }

    /// The next whole refresh: its heading and its rows (up to the next heading).
    fn next_refresh(&self, pending: &mut Option<String>) -> (String, Vec<String>) {
        let deadline = Instant::now() + REFRESH_TIMEOUT;
        let mut next = || {
            let left = deadline.saturating_duration_since(Instant::now());
            self.lines.recv_timeout(left).expect("a refresh in time")
        };
        let heading = pending.take().unwrap_or_else(&mut next);
        assert!(heading.starts_with("refresh "), "{heading}");
        let mut rows = Vec::new();
        loop {
            let line = next();
            if line.starts_with("refresh ") {
                *pending = Some(line);
                return (heading, rows);
            }
            rows.push(line);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `limited --watch` refreshes the list until interrupted: a refresh begun after a suspension
/// shows it, where the first showed none.
#[tokio::test]
async fn limited_watch_refreshes_the_list() {
    let redis = RedisServer::start();
    let watch = Watch::start(&redis.url());
    let mut pending = None;
    let (heading, rows) = watch.next_refresh(&mut pending);
    assert_eq!(heading, "refresh 1, every 100ms (Ctrl-C to stop)");
    assert_eq!(rows, ["no key is denied or under 10 % left"]);

    let limiter = support::Ctx::default().redis(&redis);
    limiter
        .suspend("held", Duration::from_secs(60))
        .await
        .unwrap();
    // Refreshes go on (each numbered one more); one begun after the suspension lists it.
    let mut last = 1;
    loop {
        let (heading, rows) = watch.next_refresh(&mut pending);
        last += 1;
        assert!(
            heading.starts_with(&format!("refresh {last}, ")),
            "{heading}"
        );
        if rows
            .iter()
            .any(|row| row.starts_with("held (every route): suspended, "))
        {
            assert_eq!(rows.len(), 1, "{rows:?}");
            break;
        }
        assert_eq!(rows, ["no key is denied or under 10 % left"]);
    }
}
