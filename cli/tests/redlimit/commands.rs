//! Every command of `redlimit`, run as a user runs it against a private Redis: what it changes is
//! what a `Limiter` and a `RateLimitLayer` of the fleet then decide, and bad input exits 2 with
//! a message.

use crate::support;

use std::convert::Infallible;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use redlimit::key::HeaderKey;
use redlimit::store::RedisStore;
use redlimit::{Decision, Limiter, Quota, RateLimitLayer, Target, Verdict};
use support::example::dead_redis_url;
use support::{RedisCluster, RedisServer};
use tower::{ServiceBuilder, ServiceExt};

/// Runs `redlimit` against `redis` with `args`, `REDIS_URL` pointing nowhere.
fn redlimit(redis: &RedisServer, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = crate::redlimit_command();
    command
        .arg("--redis")
        .arg(redis.url())
        .args(args)
        .env("REDIS_URL", dead_redis_url());
    for (name, value) in envs {
        command.env(name, value);
    }
    command.output().expect("run redlimit")
}

/// Runs it and returns its stdout, asserting success.
fn redlimit_ok(redis: &RedisServer, args: &[&str]) -> String {
    redlimit_ok_with(redis, args, &[])
}

fn redlimit_ok_with(redis: &RedisServer, args: &[&str], envs: &[(&str, &str)]) -> String {
    crate::stdout_of_success(&redlimit(redis, args, envs), &format!("{args:?}"))
}

/// The scope of a layer over `limiter` keyed by `x-api-key` with `quota`: the route an operator
/// names with `--scope`.
fn api_key_scope(limiter: &Limiter, quota: Quota) -> String {
    let key = HeaderKey::named("x-api-key").unwrap();
    let layer = RateLimitLayer::new(limiter.clone(), quota, key);
    layer.scope().to_owned()
}

/// Spends `n` of `tenant`'s `quota` on the route `scope`, asserting every request admitted.
async fn spend(limiter: &Limiter, scope: &str, tenant: &str, quota: Quota, n: usize) {
    for i in 0..n {
        let verdict = limiter
            .check_quotas(Target::scoped(scope, tenant), &quota.into(), 1)
            .await;
        assert!(
            verdict.is_allowed(),
            "{tenant} on {scope}: request {i} denied"
        );
    }
}

/// The value of the status line `  NAME: VALUE`.
fn field<'a>(stdout: &'a str, name: &str) -> &'a str {
    let prefix = format!("  {name}: ");
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {name:?} line in {stdout}"))
}

/// The seconds in `59.998s left` / `59.998s (…)`.
fn seconds(value: &str) -> f64 {
    value
        .split_once('s')
        .and_then(|(number, _)| number.parse().ok())
        .unwrap_or_else(|| panic!("no seconds in {value:?}"))
}

fn limiter(redis: &RedisServer) -> Limiter {
    support::Ctx::default().redis(redis)
}

/// A private Redis and a limiter on it.
fn redis_and_limiter() -> (RedisServer, Limiter) {
    let redis = RedisServer::start();
    let limiter = limiter(&redis);
    (redis, limiter)
}

async fn decide(limiter: &Limiter, key: &str, quota: &Quota) -> Decision {
    match limiter.check(key, quota).await {
        Verdict::Decided(decision) => decision,
        other => panic!("the store failed: {other:?}"),
    }
}

#[tokio::test]
async fn set_quota_is_shown_by_inspect_and_obeyed_by_a_limiter() {
    let redis = RedisServer::start();
    let stdout = redlimit_ok(&redis, &["set-quota", "tenant-7", "3/1m", "500/1h"]);
    assert!(
        stdout.starts_with("set-quota: \"tenant-7\" now uses 3/1m, 500/1h on every instance\n"),
        "{stdout}"
    );
    assert_eq!(field(&stdout, "override"), "3/1m, 500/1h");
    assert_eq!(field(&stdout, "suspended"), "no");

    let inspected = redlimit_ok(&redis, &["inspect", "tenant-7"]);
    assert!(
        inspected.starts_with("key \"tenant-7\" (redlimit:{tenant-7})\n"),
        "{inspected}"
    );
    assert_eq!(field(&inspected, "override"), "3/1m, 500/1h");
    assert_eq!(field(&inspected, "state"), "none stored");

    // A limiter with a generous quota of its own gets the override's 3 a minute.
    let limiter = limiter(&redis);
    let own = Quota::per_second(1_000).unwrap();
    for _ in 0..3 {
        assert!(decide(&limiter, "tenant-7", &own).await.allowed);
    }
    let denied = decide(&limiter, "tenant-7", &own).await;
    assert!(!denied.allowed && !denied.suspended, "{denied:?}");
    assert_eq!(denied.quota, Quota::per_minute(3).unwrap());
    // Another key keeps the caller's quota.
    assert_eq!(decide(&limiter, "tenant-8", &own).await.limit, 1_000);

    let inspected = redlimit_ok(&redis, &["inspect", "tenant-7"]);
    assert!(
        field(&inspected, "state of tier 1").starts_with("token-bucket tokens=0"),
        "{inspected}"
    );

    let cleared = redlimit_ok(&redis, &["clear-quota", "tenant-7"]);
    assert_eq!(field(&cleared, "override"), "none");
    assert!(decide(&limiter, "tenant-7", &own).await.allowed);
}

/// The override `inspect` prints, in every unit it prints a period in (`µs` included) and with
/// a burst that differs from the limit, is what `set-quota` takes back: pasted unquoted (split
/// at spaces by the shell) or quoted as one argument, it sets the same tiers.
#[tokio::test]
async fn set_quota_takes_back_the_override_inspect_prints() {
    let (redis, limiter) = redis_and_limiter();
    let periods = [
        Duration::from_secs(3600),
        Duration::from_secs(600),
        Duration::from_secs(30),
        Duration::from_millis(1500),
        Duration::from_micros(5),
        Duration::from_micros(2_500_001),
    ];
    let tiers = periods.map(|period| Quota::new(4, period).unwrap());
    let mut tiers = tiers.to_vec();
    tiers[2] = tiers[2].with_burst(9).unwrap();
    let quotas = redlimit::Quotas::new(tiers).unwrap();
    limiter.set_quota("source", &quotas).await.unwrap();
    let inspected = redlimit_ok(&redis, &["inspect", "source"]);
    let printed = field(&inspected, "override");
    assert_eq!(
        printed,
        "4/1h, 4/10m, 4/30s burst 9, 4/1500ms, 4/5\u{b5}s, 4/2500001\u{b5}s"
    );
    let unquoted: Vec<&str> = printed.split(' ').collect();
    for (tenant, tiers) in [("unquoted", unquoted), ("quoted", vec![printed])] {
        let args = [vec!["set-quota", tenant], tiers].concat();
        let output = redlimit(&redis, &args, &[]);
        assert!(
            output.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let status = limiter.inspect(tenant).await.unwrap();
        let set = status.quota_override.expect("an override");
        assert_eq!(set.as_slice(), quotas.as_slice(), "{args:?}");
        let inspected = redlimit_ok(&redis, &["inspect", tenant]);
        assert_eq!(field(&inspected, "override"), printed, "{args:?}");
    }
}

#[tokio::test]
async fn suspend_shows_the_time_left_and_denies_until_resume() {
    let redis = RedisServer::start();
    let stdout = redlimit_ok(&redis, &["suspend", "upstream", "90s"]);
    assert!(
        stdout.starts_with("suspend: \"upstream\" is denied on every instance for 90s\n"),
        "{stdout}"
    );
    let left = seconds(field(&stdout, "suspended"));
    assert!(
        (85.0..=90.0).contains(&left),
        "{left} s left right after suspend: {stdout}"
    );
    assert!(field(&stdout, "suspended").ends_with("s left"), "{stdout}");

    let inspected = redlimit_ok(&redis, &["inspect", "upstream"]);
    let left_later = seconds(field(&inspected, "suspended"));
    assert!(left_later <= left && left_later > 80.0, "{inspected}");

    let limiter = limiter(&redis);
    let quota = Quota::per_second(100).unwrap();
    let denied = decide(&limiter, "upstream", &quota).await;
    assert!(!denied.allowed && denied.suspended, "{denied:?}");
    assert_eq!(denied.remaining, 0);
    assert!(
        denied.retry_after <= Duration::from_secs(90)
            && denied.retry_after > Duration::from_secs(80),
        "{denied:?}"
    );
    // Only that key.
    assert!(decide(&limiter, "other", &quota).await.allowed);

    let resumed = redlimit_ok(&redis, &["resume", "upstream"]);
    assert!(resumed.starts_with("resume: \"upstream\" is no longer suspended\n"));
    assert_eq!(field(&resumed, "suspended"), "no");
    assert!(decide(&limiter, "upstream", &quota).await.allowed);
}

#[tokio::test]
async fn reset_forgets_the_usage() {
    let (redis, limiter) = redis_and_limiter();
    let quota = Quota::per_hour(2).unwrap();
    for _ in 0..2 {
        assert!(decide(&limiter, "ip:203.0.113.7", &quota).await.allowed);
    }
    assert!(!decide(&limiter, "ip:203.0.113.7", &quota).await.allowed);

    let stdout = redlimit_ok(&redis, &["reset", "ip:203.0.113.7"]);
    assert!(stdout.starts_with("reset: \"ip:203.0.113.7\"'s usage is forgotten"));
    assert_eq!(field(&stdout, "state"), "none stored", "{stdout}");
    assert!(decide(&limiter, "ip:203.0.113.7", &quota).await.allowed);
}

/// The response to `GET /` with `x-api-key: api_key` through `layer` over a service answering
/// `200 ok`, its body collected.
async fn get_through(layer: &RateLimitLayer<HeaderKey>, api_key: &str) -> Response<Bytes> {
    let service =
        ServiceBuilder::new()
            .layer(layer.clone())
            .service_fn(|_: Request<Full<Bytes>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
            });
    let request = Request::get("/")
        .header("x-api-key", api_key)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, body) = service.oneshot(request).await.unwrap().into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// A request through a layer keyed by the `x-api-key` header: its status, and for a 429 whether
/// the body says "suspended" (anything else would be a denial for the quota: a test failure).
pub(crate) async fn through_layer(layer: &RateLimitLayer<HeaderKey>, api_key: &str) -> StatusCode {
    let response = get_through(layer, api_key).await;
    let status = response.status();
    let body = response.into_body();
    if status == StatusCode::TOO_MANY_REQUESTS {
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains("suspended"),
            "429 not for a suspension: {body:?}"
        );
    }
    status
}

#[tokio::test]
async fn an_api_key_is_hashed_as_the_layer_hashes_it_in_the_layers_scope() {
    let redis = RedisServer::start();
    let quota = Quota::per_minute(100).unwrap();
    let plain = RateLimitLayer::new(
        limiter(&redis),
        quota,
        HeaderKey::named("x-api-key").unwrap(),
    );
    let secret = RateLimitLayer::new(
        limiter(&redis),
        quota,
        HeaderKey::named("x-api-key")
            .unwrap()
            .with_secret("fleet-s3cret"),
    );
    let scope = plain.scope().to_owned();
    assert_eq!(through_layer(&plain, "k-123").await, StatusCode::OK);

    let suspend = [
        "--scope",
        &scope,
        "--header",
        "x-api-key",
        "suspend",
        "k-123",
        "1m",
    ];
    let stdout = redlimit_ok(&redis, &suspend);
    assert!(
        stdout.starts_with("suspend: x-api-key header \"k-123\" is denied on every instance"),
        "{stdout}"
    );
    assert!(!stdout.contains("redlimit:{k-123}"), "hashed: {stdout}");
    assert_eq!(
        through_layer(&plain, "k-123").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(through_layer(&plain, "k-456").await, StatusCode::OK);
    // The layer with a secret hashes to another key: not suspended.
    assert_eq!(through_layer(&secret, "k-123").await, StatusCode::OK);

    // The same secret, from the environment: that layer's key.
    let env = [("REDLIMIT_HEADER_SECRET", "fleet-s3cret")];
    redlimit_ok_with(&redis, &suspend, &env);
    assert_eq!(
        through_layer(&secret, "k-123").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // And from the flag, for resume.
    let args = [
        "--scope",
        &scope,
        "--header",
        "x-api-key",
        "--header-secret",
        "fleet-s3cret",
        "resume",
        "k-123",
    ];
    redlimit_ok(&redis, &args);
    assert_eq!(through_layer(&secret, "k-123").await, StatusCode::OK);
    assert_eq!(
        through_layer(&plain, "k-123").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn bad_input_exits_2_with_a_message() {
    let dead = dead_redis_url();
    // A command line per case: words split at spaces, 'quoted' words kept whole, DEAD for the
    // unreachable Redis's URL.
    let cases = [
        ("inspect k", "--redis URL"),
        ("--redis DEAD", "requires a subcommand"),
        ("--redis DEAD inspect", "<KEY>"),
        ("--redis DEAD inspect ''", "<KEY>"),
        ("--redis DEAD inspect k x", "unexpected argument 'x'"),
        ("--redis DEAD frobnicate k", "unrecognized subcommand"),
        ("--redis DEAD suspend k", "<DURATION>"),
        ("--redis DEAD suspend k 0s", "more than 0"),
        ("--redis DEAD suspend k 0ms", "more than 0"),
        ("--redis DEAD suspend k 721h", "30 days"),
        (
            "--redis DEAD suspend k 99999999999999999999h",
            "is not a duration",
        ),
        ("--redis DEAD suspend k 1.5s", "is not a duration"),
        ("--redis DEAD set-quota k", "<N/DURATION>"),
        ("--redis DEAD set-quota k 10", "is not N/DURATION"),
        ("--redis DEAD set-quota k 0/1s", "at least 1"),
        ("--redis DEAD set-quota k x/1s", "whole number"),
        ("--redis DEAD set-quota k 10/0s", "more than 0"),
        ("--redis DEAD set-quota k 10/s", "is not a duration"),
        ("--redis DEAD set-quota k 10/1s/2", "is not a duration"),
        (
            "--redis DEAD set-quota k 10/9999999999h",
            "at most 100 years",
        ),
        (
            "--redis DEAD set-quota k 1/1s 1/2s 1/3s 1/4s 1/5s 1/6s 1/7s 1/8s 1/9s",
            "at most 8",
        ),
        (
            "--redis DEAD --algorithm leaky inspect k",
            "unknown algorithm",
        ),
        ("--redis DEAD --header-secret s inspect k", "needs --header"),
        (
            "--redis DEAD --header 'bad name' inspect k",
            "not a header name",
        ),
        (
            "--redis DEAD --prefix= inspect k",
            "--prefix must not be empty",
        ),
        ("--redis DEAD --scope", "a value is required for '--scope"),
        (
            "--redis DEAD --frobnicate inspect k",
            "unexpected argument '--frobnicate'",
        ),
        ("--redis 'not a url' inspect k", "--redis: invalid URL"),
        (
            "--redis DEAD --redis DEAD inspect k",
            "cannot be used multiple times",
        ),
        (
            "--redis DEAD limited --watch 0s",
            "--watch: the interval must be more than 0",
        ),
        ("--sentinel DEAD inspect k", "--service <NAME>"),
    ];
    crate::assert_usage_errors(&cases, &dead);
}

#[test]
fn an_unreachable_redis_exits_1_and_says_so() {
    let dead = dead_redis_url();
    let output = crate::run_to_exit(&["--redis", &dead, "inspect", "k"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot use the Redis at {dead}")),
        "{stderr}"
    );
}

#[test]
fn a_sliding_log_quota_beyond_its_burst_cap_is_refused_before_anything_changes() {
    let redis = RedisServer::start();
    let output = redlimit(
        &redis,
        &["--algorithm", "sliding-log", "set-quota", "k", "1000000/1s"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("sliding-window"), "{stderr}");
    assert_eq!(redis.dbsize(), 0, "nothing stored");
}

/// A request through `layer` with `x-api-key: key`: its status and `Retry-After`.
async fn get_with_key(layer: &RateLimitLayer<HeaderKey>, key: &str) -> (u16, Option<u64>) {
    let response = get_through(layer, key).await;
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|value| value.to_str().ok()?.parse().ok());
    (response.status().as_u16(), retry_after)
}

/// The operator's contract: `redlimit --header x-api-key suspend k1 30s` stops a service's
/// client `x-api-key: k1` (429, `Retry-After` close to 30) and no other, without naming a scope;
/// `resume` lets it through; and a suspension outlives a restart with another quota (a new
/// limiter and layer on the same Redis).
#[tokio::test]
async fn redlimit_suspends_a_tenant_of_a_service_on_every_route_across_a_restart() {
    let redis = RedisServer::start();
    let start = |limit: u64| {
        let quota = Quota::per_minute(limit).unwrap();
        RateLimitLayer::new(
            limiter(&redis),
            quota,
            HeaderKey::named("x-api-key").unwrap(),
        )
    };
    let service = start(100);
    assert_eq!(service.scope(), "default:token-bucket:100/60s");
    assert_eq!(get_with_key(&service, "k1").await.0, 200);

    let stdout = redlimit_ok(&redis, &["--header", "x-api-key", "suspend", "k1", "30s"]);
    assert!(
        stdout.starts_with("suspend: x-api-key header \"k1\""),
        "{stdout}"
    );
    let (status, retry_after) = get_with_key(&service, "k1").await;
    assert_eq!(status, 429);
    let retry_after = retry_after.expect("a Retry-After");
    assert!(
        (25..=30).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    assert_eq!(
        get_with_key(&service, "k2").await.0,
        200,
        "others unaffected"
    );

    redlimit_ok(&redis, &["--header", "x-api-key", "resume", "k1"]);
    assert_eq!(get_with_key(&service, "k1").await.0, 200);

    // Suspended again, then a deploy with another quota: still suspended.
    redlimit_ok(&redis, &["--header", "x-api-key", "suspend", "k1", "30s"]);
    drop(service);
    let service = start(50);
    let (status, retry_after) = get_with_key(&service, "k1").await;
    assert_eq!(status, 429);
    assert!(
        retry_after.is_some_and(|s| (20..=30).contains(&s)),
        "{retry_after:?}"
    );
    assert_eq!(get_with_key(&service, "k2").await.0, 200);

    // inspect lists the routes where k1 has state, with its suspension.
    let inspected = redlimit_ok(&redis, &["--header", "x-api-key", "inspect", "k1"]);
    assert!(
        inspected.contains("routes: default:token-bucket:100/60s"),
        "{inspected}"
    );
    assert!(
        inspected.contains("route default:token-bucket:100/60s\n"),
        "{inspected}"
    );
    assert!(
        field(&inspected, "suspended").ends_with("s left"),
        "{inspected}"
    );
    redlimit_ok(&redis, &["--header", "x-api-key", "resume", "k1"]);
    assert_eq!(get_with_key(&service, "k1").await.0, 200);
}

/// `inspect` of a tenant with no state, or of a route it has no state on, and `--all-routes`
/// where it does not apply: a clear message, exit 2, nothing written.
#[test]
fn unknown_tenants_and_routes_exit_2_and_write_nothing() {
    let redis = RedisServer::start();
    let cases: [(&[&str], &str); 4] = [
        (&["inspect", "nobody"], "unknown tenant \"nobody\""),
        (&["--scope", "api", "inspect", "nobody"], "unknown tenant"),
        (
            &["--all-routes", "suspend", "k", "1m"],
            "--all-routes is for set-quota",
        ),
        (
            &["--all-routes", "--scope", "api", "set-quota", "k", "1/1s"],
            "without --scope",
        ),
    ];
    for (args, message) in cases {
        let output = redlimit(&redis, args, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // A known tenant, an unknown route.
    redlimit_ok(&redis, &["--scope", "api", "set-quota", "k", "5/1m"]);
    let output = redlimit(&redis, &["--scope", "login", "inspect", "k"], &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown route \"login\""), "{stderr}");
    assert!(stderr.contains("api"), "{stderr}");
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys, ["redlimit:{k}:api"], "nothing else written");
}

/// `set-quota --all-routes` overrides every route of the tenant, as a layer on any route sees.
#[tokio::test]
async fn set_quota_all_routes_reaches_every_route() {
    let (redis, limiter) = redis_and_limiter();
    let own = Quota::per_second(1_000).unwrap();
    let stdout = redlimit_ok(&redis, &["--all-routes", "set-quota", "t", "2/1m"]);
    assert_eq!(field(&stdout, "override"), "2/1m", "{stdout}");
    for scope in ["api", "login"] {
        spend(&limiter, scope, "t", own, 2).await;
        assert!(!support::admits(&limiter, Target::scoped(scope, "t"), &own).await);
    }
    redlimit_ok(&redis, &["--all-routes", "clear-quota", "t"]);
    assert!(support::admits(&limiter, Target::scoped("api", "t"), &own).await);
}

/// `limited` lists the keys denied now or with under 10 % left, most constrained first, in text
/// and as JSON, and changes nothing.
#[tokio::test]
async fn limited_lists_the_most_constrained_keys_first() {
    let (redis, limiter) = redis_and_limiter();
    let quota = Quota::per_hour(20).unwrap();
    let scope = api_key_scope(&limiter, quota);
    // spent: 20 of 20 used (denied); low: 1 left (5 %); fine: 18 left; held: suspended.
    for (key, used) in [("spent", 20), ("low", 19), ("fine", 2)] {
        spend(&limiter, &scope, key, quota, used).await;
    }
    limiter
        .suspend("held", Duration::from_secs(60))
        .await
        .unwrap();
    let mut conn = redis.conn();
    let before: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();

    let text = redlimit_ok(&redis, &["limited"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(
        lines[0].starts_with("held (every route): suspended, "),
        "{text}"
    );
    assert!(
        lines[1].starts_with(&format!("spent {scope}: 0 of 20 left")),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&format!("low {scope}: 1 of 20 left")),
        "{text}"
    );

    let json = redlimit_ok(&redis, &["limited", "--json"]);
    assert!(
        json.starts_with("[{\"tenant\":\"held\",\"route\":\"(every route)\""),
        "{json}"
    );
    assert!(
        json.contains(&format!(
            "{{\"tenant\":\"spent\",\"route\":\"{scope}\",\"remaining\":0,\"limit\":20,"
        )),
        "{json}"
    );
    assert!(!json.contains("fine"), "{json}");
    let mut after: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(before, after, "limited writes nothing");
}

/// `limited` keeps each tenant's rows together, its own row (a suspension of every route) first
/// and then its routes by name: the times left are read at different moments, so an order by
/// them could flip between runs. Tenants go most constrained first.
#[tokio::test]
async fn limited_lists_a_tenants_own_row_first_then_its_routes() {
    let (redis, limiter) = redis_and_limiter();
    let (five, forty) = (Quota::per_hour(5).unwrap(), Quota::per_hour(40).unwrap());
    let (scope5, scope40) = (
        api_key_scope(&limiter, five),
        api_key_scope(&limiter, forty),
    );
    // low: 0 of 5 left on one route, 2 of 40 on the other (the first by name); held: 0 of 5,
    // then suspended for a minute on every route; long: suspended for 5 minutes.
    for (tenant, quota, scope, used) in [
        ("low", five, &scope5, 5),
        ("low", forty, &scope40, 38),
        ("held", five, &scope5, 5),
    ] {
        spend(&limiter, scope, tenant, quota, used).await;
    }
    redlimit_ok(&redis, &["suspend", "held", "1m"]);
    redlimit_ok(&redis, &["suspend", "long", "5m"]);

    let expected = [
        ("long", "(every route)"),
        ("held", "(every route)"),
        ("held", scope5.as_str()),
        ("low", scope40.as_str()),
        ("low", scope5.as_str()),
    ];
    let text = redlimit_ok(&redis, &["limited"]);
    let rows: Vec<&str> = text
        .lines()
        .map(|line| line.split_once(": ").map_or(line, |(row, _)| row))
        .collect();
    let want: Vec<String> = expected.iter().map(|(t, r)| format!("{t} {r}")).collect();
    assert_eq!(rows, want, "{text}");
    let json = redlimit_ok(&redis, &["limited", "--json"]);
    let at: Vec<Option<usize>> = expected
        .iter()
        .map(|(t, r)| json.find(&format!("{{\"tenant\":\"{t}\",\"route\":\"{r}\"")))
        .collect();
    assert!(
        at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]),
        "{json}"
    );
}

/// Runs `redlimit` on `cluster` (`--redis-cluster` with every node) and returns its
/// stdout, asserting success.
fn redlimit_cluster_ok(cluster: &RedisCluster, args: &[&str]) -> String {
    let output = crate::redlimit_command()
        .arg("--redis-cluster")
        .arg(cluster.urls().join(","))
        .args(args)
        .env("REDIS_URL", dead_redis_url())
        .output()
        .expect("run redlimit");
    crate::stdout_of_success(&output, &format!("{args:?}"))
}

/// Asserts that `text` is one JSON object on one line.
fn assert_one_json_object(text: &str) {
    assert_eq!(text.lines().count(), 1, "{text}");
    let value: serde_json::Value = serde_json::from_str(text).expect("JSON");
    assert!(value.is_object(), "{text}");
}

/// On a 3-master Cluster, `limited` and `inspect` scan every master: tenants whose keys live on
/// different masters are all found.
#[tokio::test]
async fn limited_and_inspect_scan_every_master_of_a_cluster() {
    let cluster = RedisCluster::start();
    let limiter = Limiter::new(
        RedisStore::cluster(cluster.urls().iter().map(String::as_str)).expect("cluster URLs"),
    );
    let quota = Quota::per_hour(5).unwrap();
    let scope = api_key_scope(&limiter, quota);
    // One tenant on each master: a key's slot is its hash tag's, `{tenant}`.
    let mut tenants: Vec<(String, usize)> = Vec::new();
    for i in 0..1000 {
        let tenant = format!("t{i}");
        let node = cluster.node_for_key(&format!("{{{tenant}}}"));
        if !tenants.iter().any(|(_, n)| *n == node) {
            tenants.push((tenant, node));
        }
        if tenants.len() == cluster.nodes().len() {
            break;
        }
    }
    assert_eq!(tenants.len(), 3, "a tenant on every master: {tenants:?}");
    for (tenant, _) in &tenants {
        spend(&limiter, &scope, tenant, quota, 5).await;
    }

    let text = redlimit_cluster_ok(&cluster, &["limited"]);
    assert_eq!(text.lines().count(), 3, "{text}");
    for (tenant, node) in &tenants {
        assert!(
            text.contains(&format!("{tenant} {scope}: 0 of 5 left")),
            "{tenant} (on master {node}) not listed: {text}"
        );
    }
    let json = redlimit_cluster_ok(&cluster, &["limited", "--json"]);
    for (tenant, _) in &tenants {
        assert!(
            json.contains(&format!(
                "{{\"tenant\":\"{tenant}\",\"route\":\"{scope}\",\"remaining\":0,\"limit\":5,"
            )),
            "{json}"
        );
    }

    // A suspension through the tool reaches the tenant on its own master, and shows first.
    let (held, _) = &tenants[2];
    redlimit_cluster_ok(&cluster, &["suspend", held, "1m"]);
    let text = redlimit_cluster_ok(&cluster, &["limited"]);
    assert!(
        text.starts_with(&format!("{held} (every route): suspended, ")),
        "{text}"
    );
    assert!(!limiter
        .check_quotas(Target::scoped(&scope, held), &quota.into(), 0)
        .await
        .is_allowed());

    for (tenant, node) in &tenants {
        let inspected = redlimit_cluster_ok(&cluster, &["inspect", tenant]);
        assert!(
            inspected.contains(&format!("routes: {scope}\n"))
                && inspected.contains(&format!("route {scope}\n")),
            "{tenant} on master {node}: {inspected}"
        );
        let json = redlimit_cluster_ok(&cluster, &["inspect", tenant, "--json"]);
        assert_one_json_object(&json);
        assert!(
            json.contains(&format!("\"routes\":[{{\"route\":\"{scope}\",")),
            "{json}"
        );
    }
}

/// `inspect --json`: one JSON object naming every route of the tenant with its override,
/// suspension and time to reset; plain text stays without `--json`.
#[tokio::test]
async fn inspect_json_names_the_routes() {
    let (redis, limiter) = redis_and_limiter();
    let quota = Quota::per_minute(10).unwrap();
    for scope in ["api", "login"] {
        assert!(limiter
            .check_quotas(Target::scoped(scope, "t"), &quota.into(), 1)
            .await
            .is_allowed());
    }
    redlimit_ok(&redis, &["--scope", "api", "set-quota", "t", "3/1m"]);
    redlimit_ok(&redis, &["suspend", "t", "1m"]);

    let json = redlimit_ok(&redis, &["inspect", "t", "--json"]);
    assert_eq!(json.lines().count(), 1, "{json}");
    assert_one_json_object(&json);
    assert!(
        json.starts_with(
            "{\"tenant\":\"t\",\"key\":\"t\",\"storage_key\":\"redlimit:{t}\",\"route\":null,"
        ),
        "{json}"
    );
    assert!(
        json.contains("{\"route\":\"api\",\"override\":\"3/1m\",\"suspended_ms\":"),
        "{json}"
    );
    assert!(
        json.contains("{\"route\":\"login\",\"override\":null,\"suspended_ms\":"),
        "{json}"
    );
    assert!(
        !json.contains("\"suspended_ms\":null"),
        "suspended everywhere: {json}"
    );
    assert!(json.contains("\"reset_after_ms\":"), "{json}");

    // One route with --scope: its own status, no list.
    let json = redlimit_ok(&redis, &["--scope", "login", "inspect", "t", "--json"]);
    assert_one_json_object(&json);
    assert!(
        json.contains("\"route\":\"login\",\"override\":null,"),
        "{json}"
    );
    assert!(json.ends_with("\"routes\":[]}\n"), "{json}");

    let text = redlimit_ok(&redis, &["inspect", "t"]);
    assert!(text.starts_with("key \"t\" (redlimit:{t})\n"), "{text}");
    assert!(text.contains("routes: api, login\n"), "{text}");
}

/// `--redis` and `--redis-cluster` together: exit 2 with a message, nothing written.
#[test]
fn redis_and_redis_cluster_together_exit_2_and_write_nothing() {
    let redis = RedisServer::start();
    let output = redlimit(
        &redis,
        &["--redis-cluster", &redis.url(), "suspend", "k", "1m"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    assert!(
        output.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(redis.dbsize(), 0, "nothing written");

    let cases = [
        (
            "--redis-cluster , inspect k",
            "--redis-cluster needs at least one URL",
        ),
        (
            "--redis-cluster 'not a url' inspect k",
            "--redis-cluster: invalid URL",
        ),
    ];
    crate::assert_usage_errors(&cases, "");
}

/// A block on abuse (`BlockFor`) shows in `redlimit` as the tenant's suspension, with the
/// block's time left, and `resume` ends it early.
#[tokio::test]
async fn a_block_on_abuse_shows_in_inspect_and_resume_ends_it() {
    let (redis, limiter) = redis_and_limiter();
    let quotas = redlimit::Quotas::from(Quota::per_minute(1).unwrap());
    let block = redlimit::limiter::BlockFor::new(Duration::from_secs(900)).unwrap();
    assert!(limiter
        .check_blocking("abuser", &quotas, 1, &block)
        .await
        .is_allowed());
    let blocked = std::time::Instant::now();
    assert!(!limiter
        .check_blocking("abuser", &quotas, 1, &block)
        .await
        .is_allowed());
    let inspected = redlimit_ok(&redis, &["inspect", "abuser"]);
    let left = seconds(field(&inspected, "suspended"));
    let since = blocked.elapsed().as_secs_f64();
    assert!(
        left <= 900.0 && left >= 900.0 - since - 1.0,
        "{since}: {inspected}"
    );
    redlimit_ok(&redis, &["resume", "abuser"]);
    let status = limiter.inspect("abuser").await.unwrap();
    assert_eq!(status.suspended_for, None);
}

/// The README's `ACL SETUSER <user> ...` line for `user` (read from the README, so the docs and
/// the tests cannot drift apart), with `PASSWORD` replaced by `password`.
fn readme_acl_rules(user: &str, password: &str) -> String {
    let readme = include_str!("../../../README.md");
    let prefix = format!("ACL SETUSER {user} ");
    let line = readme
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("the README gives the ACL SETUSER line for {user:?}"));
    line.replace(">PASSWORD", &format!(">{password}"))
}

/// What the README adds to both lines on Cluster, and to the operator's line only.
const CLUSTER_ADDENDUM: &str = "+cluster|slots +asking";
const OPERATOR_CLUSTER_ADDENDUM: &str = "+cluster|nodes";

fn create_acl_user(node: &RedisServer, user: &str, rules: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER").arg(user);
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    let _: () = cmd.query(&mut node.conn()).expect("ACL SETUSER");
}

/// Runs `redlimit` as `user` on `nodes` (one: `--redis`; more: `--redis-cluster`).
fn redlimit_as(nodes: &[RedisServer], user: &str, args: &[&str]) -> Output {
    let urls: Vec<String> = nodes
        .iter()
        .map(|node| format!("redis://{user}:pw-{user}@127.0.0.1:{}/", node.port()))
        .collect();
    let target = if nodes.len() == 1 {
        "--redis"
    } else {
        "--redis-cluster"
    };
    Command::new(crate::BINARY)
        .arg(target)
        .arg(urls.join(","))
        .args(args)
        .env("REDIS_URL", dead_redis_url())
        .env_remove("REDLIMIT_HEADER_SECRET")
        .stdin(Stdio::null())
        .output()
        .expect("run redlimit")
}

/// Every command as the README's operator user, on `nodes` (a single node or a Cluster's
/// masters), with `limiter` (a full-privilege one on the same Redis) to set up and check: each
/// exits 0 and does what it says. The service's user stays without `SCAN`: the tool's scans
/// exit 1 with `NOPERM`. What the operator can see beyond the prefix: key names, not values.
async fn every_command_works_as_the_operator(
    nodes: &[RedisServer],
    limiter: &Limiter,
    outside_node: usize,
) {
    let cluster = nodes.len() > 1;
    let readme = include_str!("../../../README.md");
    let service = readme_acl_rules("limiter", "pw-limiter");
    let operator = readme_acl_rules("operator", "pw-operator");
    // The operator's line is the service's plus what the tool itself runs.
    assert_eq!(
        operator,
        format!("{} +scan", service.replace("pw-limiter", "pw-operator")),
        "the README's operator line is the service's line plus +scan"
    );
    assert!(
        readme.contains(&format!(
            "On Cluster add `{CLUSTER_ADDENDUM}` to both lines"
        )) && readme.contains(&format!(
            "and `{OPERATOR_CLUSTER_ADDENDUM}` to the operator's"
        )),
        "the README names the Cluster addenda this test uses"
    );
    for node in nodes {
        let (mut service, mut operator) = (service.clone(), operator.clone());
        if cluster {
            service = format!("{service} {CLUSTER_ADDENDUM}");
            operator = format!("{operator} {CLUSTER_ADDENDUM} {OPERATOR_CLUSTER_ADDENDUM}");
        }
        create_acl_user(node, "limiter", &service);
        create_acl_user(node, "operator", &operator);
    }

    let quota = Quota::per_hour(5).unwrap();
    let scope = api_key_scope(limiter, quota);
    let route_status = || async {
        limiter
            .inspect(Target::scoped(&scope, "acme"))
            .await
            .unwrap()
    };
    spend(limiter, &scope, "acme", quota, 5).await;
    let run = |args: &[&str]| {
        let output = redlimit_as(nodes, "operator", args);
        crate::stdout_of_success(&output, &format!("as the operator, {args:?}"))
    };

    let inspected = run(&["inspect", "acme"]);
    assert!(
        inspected.contains(&format!("routes: {scope}\n")),
        "{inspected}"
    );
    let json = run(&["--json", "inspect", "acme"]);
    assert!(
        json.contains(&format!("\"routes\":[{{\"route\":\"{scope}\",")),
        "{json}"
    );
    let limited = run(&["limited"]);
    assert_eq!(limited.lines().count(), 1, "{limited}");
    assert!(
        limited.starts_with(&format!("acme {scope}: 0 of 5 left, full again in ")),
        "{limited}"
    );
    let json = run(&["--json", "limited"]);
    assert!(
        json.starts_with(&format!(
            "[{{\"tenant\":\"acme\",\"route\":\"{scope}\",\"remaining\":0,\"limit\":5,"
        )),
        "{json}"
    );

    run(&["set-quota", "acme", "--scope", &scope, "7/1m"]);
    let status = route_status().await;
    assert_eq!(
        status.quota_override,
        Some(Quota::per_minute(7).unwrap().into()),
        "set-quota as the operator"
    );
    run(&["clear-quota", "acme", "--scope", &scope]);
    let status = route_status().await;
    assert_eq!(status.quota_override, None, "clear-quota as the operator");
    run(&["set-quota", "acme", "--all-routes", "9/1m"]);
    let status = route_status().await;
    assert_eq!(
        status.all_routes_override,
        Some(Quota::per_minute(9).unwrap().into()),
        "set-quota --all-routes as the operator"
    );
    run(&["clear-quota", "acme", "--all-routes"]);
    let status = route_status().await;
    assert_eq!(status.all_routes_override, None, "clear-quota --all-routes");

    run(&["suspend", "acme", "1m"]);
    let status = limiter.inspect("acme").await.unwrap();
    assert!(status.suspended_for.is_some(), "suspend as the operator");
    run(&["resume", "acme"]);
    let status = limiter.inspect("acme").await.unwrap();
    assert_eq!(status.suspended_for, None, "resume as the operator");

    run(&["reset", "acme"]);
    assert!(
        limiter
            .check_quotas(Target::scoped(&scope, "acme"), &quota.into(), 1)
            .await
            .is_allowed(),
        "reset as the operator forgot the usage"
    );

    // The service's line stays least privilege: no SCAN (nor, on Cluster, CLUSTER NODES), so the
    // tool's scans fail loudly.
    let refused = if cluster { "cluster|nodes" } else { "scan" };
    for args in [&["inspect", "acme"][..], &["limited"]] {
        let output = redlimit_as(nodes, "limiter", args);
        let what = format!("{args:?} as the service");
        let stderr = crate::support::example::stderr_of_exit(&output, 1, &what);
        assert!(
            stderr.contains(&format!("no permissions to run the '{refused}' command")),
            "{args:?} as the service: {stderr}"
        );
        // The rule the user lacks, named.
        assert!(
            stderr.contains(&format!("(the user needs +{refused}: see the README")),
            "{args:?} as the service: {stderr}"
        );
    }
    for node in nodes {
        let url = format!("redis://limiter:pw-limiter@127.0.0.1:{}/", node.port());
        let mut as_service = redis::Client::open(url).unwrap().get_connection().unwrap();
        let scan: redis::RedisResult<(u64, Vec<String>)> =
            redis::cmd("SCAN").arg(0).query(&mut as_service);
        let error = scan.expect_err("the service's user may not SCAN");
        assert_eq!(
            error.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        );
    }

    // What SCAN shows the operator: the name of every key in the database, outside the prefix
    // too (a key pattern does not restrict SCAN), but no value outside the prefix.
    let node = &nodes[outside_node];
    let _: () = redis::cmd("SET")
        .arg(OUTSIDE)
        .arg("token")
        .query(&mut node.conn())
        .unwrap();
    let url = format!("redis://operator:pw-operator@127.0.0.1:{}/", node.port());
    let mut as_operator = redis::Client::open(url).unwrap().get_connection().unwrap();
    let (_, names): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(1000)
        .query(&mut as_operator)
        .unwrap();
    assert!(
        names.iter().any(|n| n == OUTSIDE),
        "SCAN as the operator: {names:?}"
    );
    let read: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg(OUTSIDE).query(&mut as_operator);
    let error = read.expect_err("no value outside the prefix");
    assert_eq!(
        error.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
    );
}

/// A key outside the limiters' prefix.
const OUTSIDE: &str = "sessions:alice";

/// Every command as the README's operator user on a single node.
#[tokio::test]
async fn every_admin_command_works_as_the_readmes_operator_user() {
    let (redis, limiter) = redis_and_limiter();
    every_command_works_as_the_operator(std::slice::from_ref(&redis), &limiter, 0).await;
}

/// The same on a 3-master Cluster, with the README's Cluster addenda.
#[tokio::test]
async fn every_admin_command_works_as_the_readmes_operator_user_on_cluster() {
    let cluster = RedisCluster::start();
    let limiter = Limiter::new(
        RedisStore::cluster(cluster.urls().iter().map(String::as_str)).expect("cluster URLs"),
    );
    let outside = cluster.node_for_key(OUTSIDE);
    every_command_works_as_the_operator(cluster.nodes(), &limiter, outside).await;
}
