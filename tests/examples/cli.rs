//! The example server `examples/axum.rs`, run as a user runs it: its flags, its store choice, and
//! what HTTP clients see. Every test uses a private Redis (or a dead port), never the machine's.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use redlimit::Algorithm;
use support::example::{self, dead_redis_url, Example};
use support::sentinel::{RedisSentinel, MASTER_NAME};
use support::{RedisCluster, RedisServer, TlsFiles};

/// How long one HTTP exchange may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// A file that exists but holds no certificate.
const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");

/// Starts the axum example on a free port with `flags` and `envs`, and waits for `listening on
/// ADDR`.
fn start(flags: &str, envs: &[(&str, &str)]) -> Example {
    Example::start("axum", flags, envs)
}

/// Starts the axum example on `redis` (`--redis URL`) with `flags`.
fn start_on(redis: &RedisServer, flags: &str) -> Example {
    start(&format!("--redis {} {flags}", redis.url()), &[])
}

/// Starts the axum example on the TLS Redis `redis` trusting the CA of `ca` (`--redis-ca`), with
/// `flags`.
fn start_over_tls(redis: &RedisServer, ca: &TlsFiles, flags: &str) -> Example {
    let (url, ca) = (redis.tls_url(), ca.ca().display().to_string());
    start(&format!("--redis {url} --redis-ca {ca} {flags}"), &[])
}

/// `GET /` on `example`, with optional extra headers.
fn get(example: &Example, headers: &[(&str, &str)]) -> HttpResponse {
    http_get(example.addr, "/", headers)
        .unwrap_or_else(|e| panic!("GET / failed: {e}; {}", example.output()))
}

/// The address of `example`'s `/metrics`, from its `metrics on http://ADDR/metrics` line.
fn metrics_addr(example: &Example) -> SocketAddr {
    let url = example
        .stdout
        .iter()
        .find_map(|l| l.strip_prefix("metrics on http://"))
        .unwrap_or_else(|| panic!("no `metrics on` line; {}", example.output()));
    let addr = url.strip_suffix("/metrics").expect("a /metrics URL");
    addr.parse().expect("an address")
}

/// What a tiny HTTP/1.1 client saw.
#[derive(Debug)]
struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` over a fresh connection (`Connection: close`, so the body ends at EOF).
fn http_get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT)?;
    stream.set_read_timeout(Some(HTTP_TIMEOUT))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;

    let bad = |what: &str| std::io::Error::other(format!("{what} in response {raw:?}"));
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("no header end"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Ok(HttpResponse {
        status,
        headers,
        body: body.to_owned(),
    })
}

#[test]
fn bad_flags_exit_non_zero_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--limit", "0"], "--limit must be at least 1"),
        (&["--limit", "ten"], "--limit"),
        (&["--burst", "0"], "--burst must be at least 1"),
        (&["--algorithm", "leaky-bucket"], "unknown algorithm"),
        (
            &["--algorithm", "sliding-log", "--limit", "1000000"],
            "use sliding-window",
        ),
        (&["--frobnicate"], "unknown argument"),
        (&["--shadow=yes"], "--shadow takes no value"),
        (&["--period", "10x"], "--period"),
        (&["--period", "1.5s"], "--period"),
        (&["--period", "0s"], "--period"),
        (&["--period", "s"], "--period"),
        (&["--period"], "--period needs a value"),
        (&["--on-redis-error", "maybe"], "--on-redis-error"),
        (
            &["--on-redis-error", "local", "--instances", "0"],
            "--instances must be at least 1",
        ),
        (
            &["--instances", "3"],
            "--instances applies only to --on-redis-error local",
        ),
        (&["--metrics-bind", "localhost"], "--metrics-bind"),
        (&["--bind", "localhost"], "--bind"),
        (&["--redis", "not a url"], "--redis"),
        (&["--redis", "redis://a/", "--redis", "redis://b/"], "once"),
        (
            &["--redis", "redis://a/", "--redis-cluster", "redis://b/"],
            "once",
        ),
        (
            &["--redis-cluster", ","],
            "--redis-cluster needs at least one URL",
        ),
        (&["--redis-cluster", "not a url"], "--redis-cluster"),
        (
            &["--redis-sentinel", "redis://127.0.0.1:26379/"],
            "--redis-sentinel needs --sentinel-master NAME",
        ),
        (
            &["--sentinel-master", "mymaster"],
            "--sentinel-master needs --redis-sentinel",
        ),
        (
            &[
                "--redis",
                "redis://a/",
                "--redis-sentinel",
                "redis://b:26379/",
                "--sentinel-master",
                "mymaster",
            ],
            "once",
        ),
        (
            &["--redis-sentinel", ",", "--sentinel-master", "mymaster"],
            "--redis-sentinel needs at least one URL",
        ),
        (
            &[
                "--redis-sentinel",
                "redis://a:26379/,rediss://b:26379/",
                "--sentinel-master",
                "mymaster",
            ],
            "mix redis:// and rediss://",
        ),
        (
            &[
                "--redis",
                "rediss://a/",
                "--redis-ca",
                "/nonexistent/ca.pem",
            ],
            "--redis-ca: cannot read",
        ),
        (
            &["--redis", "rediss://a/", "--redis-ca", MANIFEST],
            "holds no PEM certificate",
        ),
        (&["--key", "cookie"], "--key: expected ip or api-key"),
        (&["--key"], "--key needs a value"),
        // A flag given twice is refused, not "the last one wins".
        (&["--limit", "3", "--limit", "4"], "give --limit once"),
        (&["--period=1s", "--period", "2s"], "give --period once"),
        (&["--key", "ip", "--key", "api-key"], "give --key once"),
        (
            &["--bind", "127.0.0.1:0", "--bind", "127.0.0.1:1"],
            "give --bind once",
        ),
        (
            &["--algorithm", "gcra", "--algorithm", "gcra"],
            "give --algorithm once",
        ),
        (
            &["--on-redis-error", "open", "--on-redis-error=closed"],
            "give --on-redis-error once",
        ),
    ];
    example::assert_usage_errors("axum", cases);
}

#[test]
fn help_prints_usage_and_every_algorithm() {
    // The API key is a key only once something in front has checked it: `authenticated`.
    let usage = example::help_naming(
        "axum",
        "--bind --redis --redis-cluster --redis-sentinel --sentinel-master --limit --period \
         --burst --algorithm --on-redis-error --instances local --redis-ca --metrics-bind \
         --shadow '--key ip|api-key' authenticated '[default: ip]'",
    );
    example::assert_names_every_algorithm(&usage);
}

#[test]
fn limits_with_redis_and_answers_429_with_headers() {
    let redis = RedisServer::start();
    let url = redis.url();
    // API keys are clients of their own only with `--key api-key` (an authenticating layer in
    // front); the default key is the IP address.
    let example = start_on(&redis, "--limit 3 --period 1m --key api-key");
    // Verified at start: the store line names the server's version.
    example.assert_printed(&example::redis_store_line(&url));

    for i in 0..3 {
        let response = get(&example, &[]);
        assert_eq!(response.status, 200, "request {i}: {response:?}");
        assert_eq!(response.body, "ok");
        assert_eq!(
            response.header("ratelimit-policy"),
            Some("\"default\";q=3;w=60")
        );
        let remaining = format!("\"default\";r={};", 2 - i);
        assert!(
            response
                .header("ratelimit")
                .unwrap()
                .starts_with(&remaining),
            "request {i}: {response:?}"
        );
    }
    let denied = get(&example, &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    let retry_after: u64 = denied
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    // 3 a minute: one request comes back every 20 s.
    assert!((1..=20).contains(&retry_after), "{denied:?}");
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"default\";q=3;w=60")
    );
    assert_eq!(
        denied.header("ratelimit"),
        Some(format!("\"default\";r=0;t={retry_after}").as_str())
    );

    // An API key is a client of its own, and it reaches Redis only hashed.
    let with_key = get(&example, &[("x-api-key", "secret-key-1")]);
    assert_eq!(with_key.status, 200, "{with_key:?}");
    let keys = redis.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter()
            .any(|k| k.starts_with("redlimit:{ip:127.0.0.1}:default:")),
        "{keys:?}"
    );
    assert!(keys.iter().all(|k| !k.contains("secret-key-1")), "{keys:?}");
}

#[test]
fn limits_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls().join(",");
    let example = start(
        &format!("--redis-cluster {urls} --limit 3 --period 1m --key api-key"),
        &[],
    );
    let version = support::redis_server_version();
    assert!(
        example
            .stdout
            .iter()
            .any(|l| l.starts_with("store: redis-cluster ")
                && l.ends_with(&format!(" (Redis {version})"))),
        "{}",
        example.output()
    );
    for i in 0..3 {
        let response = get(&example, &[("x-api-key", &format!("tenant-{i}"))]);
        assert_eq!(response.status, 200, "{response:?}");
    }
    // Each API key is a client of its own, wherever its slot lives.
    for i in 0..3 {
        let key = [("x-api-key", format!("tenant-{i}"))];
        let key = [(key[0].0, key[0].1.as_str())];
        assert_eq!(get(&example, &key).status, 200);
        assert_eq!(get(&example, &key).status, 200);
        let denied = get(&example, &key);
        assert_eq!(denied.status, 429, "{denied:?}");
        assert!(denied.header("retry-after").is_some());
    }
}

#[test]
fn limits_through_redis_sentinel() {
    let setup = RedisSentinel::start();
    let urls = setup.sentinel_urls().join(",");
    let example = start(&format!("--redis-sentinel {urls} --sentinel-master {MASTER_NAME} --limit 2 --period 1m --key api-key"), &[]);
    let version = support::redis_server_version();
    let expected = format!("store: redis-sentinel {urls} master {MASTER_NAME} (Redis {version})");
    assert!(
        example.stdout.contains(&expected),
        "expected {expected:?}; {}",
        example.output()
    );
    let key = [("x-api-key", "sentinel-tenant")];
    assert_eq!(get(&example, &key).status, 200);
    assert_eq!(get(&example, &key).status, 200);
    let denied = get(&example, &key);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert!(denied.header("retry-after").is_some());
    // The decisions live on the primary the sentinels name.
    let keys = setup.master.keys();
    assert!(!keys.is_empty(), "no limiter key on the primary");
}

#[test]
fn every_algorithm_is_selectable_and_limits() {
    let redis = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        let example = start_on(
            &redis,
            &format!("--limit 2 --period 1h --algorithm {name} --key api-key"),
        );
        // A key of its own per algorithm: state never carries over.
        let key = [("x-api-key", name)];
        let statuses: Vec<u16> = (0..3).map(|_| get(&example, &key).status).collect();
        assert_eq!(statuses, [200, 200, 429], "{name}; {}", example.output());
    }
}

#[test]
fn dead_redis_fails_closed_with_503_or_open_with_200() {
    let dead = dead_redis_url();

    let closed = start(&format!("--redis {dead} --on-redis-error closed"), &[]);
    closed.assert_printed_starting(&format!("store: redis {dead} (not reachable yet: "));
    let started = Instant::now();
    let response = get(&closed, &[]);
    assert_eq!(response.status, 503, "{response:?}");
    assert!(response.header("retry-after").is_some(), "{response:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    drop(closed);

    let open = start(&format!("--redis {dead} --on-redis-error open"), &[]);
    for _ in 0..12 {
        // More than the default limit of 10: nothing is counted while Redis is away.
        let response = get(&open, &[]);
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(response.body, "ok");
    }
    // `--redis` never falls back to memory, and says Redis is not there yet.
    assert!(!open.stdout.iter().any(|l| l.starts_with("store: memory")));
    assert!(open.stderr.lock().unwrap().contains("does not answer"));
}

#[test]
fn without_redis_it_says_memory_and_still_limits() {
    let dead = dead_redis_url();
    let example = start("--limit 2", &[("REDIS_URL", &dead)]);
    example.assert_printed(&format!("store: memory (no Redis reachable at {dead})"));
    let statuses: Vec<u16> = (0..3).map(|_| get(&example, &[]).status).collect();
    assert_eq!(statuses, [200, 200, 429]);
    let denied = get(&example, &[]);
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
}

#[test]
fn without_redis_flag_it_uses_redis_url_when_it_answers() {
    let redis = RedisServer::start();
    let url = redis.url();
    let example = start("--limit 1", &[("REDIS_URL", &url)]);
    example.assert_printed_starting(&format!("store: redis {url} (Redis "));
    assert_eq!(get(&example, &[]).status, 200);
    assert_eq!(get(&example, &[]).status, 429);
    assert_eq!(redis.dbsize(), 1, "the decision was made in Redis");
}

#[test]
fn period_units_are_accepted_and_refill() {
    let dead = dead_redis_url();
    let env = [("REDIS_URL", dead.as_str())];
    for (period, shown) in [("1s", "1s"), ("60s", "60s"), ("1m", "60s"), ("1h", "3600s")] {
        let example = start(&format!("--limit 7 --period {period}"), &env);
        let quota =
            format!("quota: 7 per {shown} (burst 7), algorithm token-bucket, on-redis-error open");
        example.assert_printed(&quota);
    }

    let example = start("--limit 1 --period 500ms", &env);
    assert_eq!(get(&example, &[]).status, 200);
    assert_eq!(get(&example, &[]).status, 429);
    thread::sleep(Duration::from_millis(600));
    assert_eq!(get(&example, &[]).status, 200, "refilled after 500 ms");
}

#[test]
fn limits_over_tls_with_a_private_ca() {
    let Some((files, redis)) =
        support::tls_server("limits_over_tls_with_a_private_ca", "example", false)
    else {
        return;
    };
    let example = start_over_tls(&redis, &files, "--limit 2 --period 1m");
    example.assert_printed(&example::redis_store_line(&redis.tls_url()));
    let statuses: Vec<u16> = (0..3).map(|_| get(&example, &[]).status).collect();
    assert_eq!(statuses, [200, 200, 429], "{}", example.output());
    assert_eq!(redis.dbsize(), 1, "the decision was made in Redis over TLS");
}

#[test]
fn tls_with_the_wrong_ca_says_why_and_the_policy_decides() {
    let Some((_files, redis, other)) =
        support::server_and_another_ca("tls_with_the_wrong_ca_says_why_and_the_policy_decides")
    else {
        return;
    };
    let example = start_over_tls(&redis, &other, "--on-redis-error closed");
    let url = redis.tls_url();
    assert!(
        example.stdout.iter().any(|l| l
            .starts_with(&format!("store: redis {url} (not reachable yet: "))
            && l.contains("certificate")),
        "{}",
        example.output()
    );
    assert_eq!(get(&example, &[]).status, 503);
}

#[test]
fn dead_redis_with_local_fallback_enforces_a_share_of_the_quota() {
    let dead = dead_redis_url();
    let local = start(
        &format!("--redis {dead} --limit 4 --on-redis-error local --instances 2 --key api-key"),
        &[],
    );
    local.assert_printed(
        "quota: 4 per 60s (burst 4), algorithm token-bucket, on-redis-error local (instances 2)",
    );
    local.assert_printed_starting(&format!("store: redis {dead} (not reachable yet: "));
    // This instance's share: 4 / 2 = 2, then 429 with a retry hint, decided in memory.
    let statuses: Vec<u16> = (0..3).map(|_| get(&local, &[]).status).collect();
    assert_eq!(statuses, [200, 200, 429], "{}", local.output());
    let denied = get(&local, &[]);
    assert_eq!(denied.status, 429, "{denied:?}");
    assert!(denied.header("retry-after").is_some(), "{denied:?}");
    // Another client has a share of its own.
    assert_eq!(get(&local, &[("x-api-key", "other")]).status, 200);
    drop(local);

    // `--instances 1` (the default) keeps the whole quota.
    let whole = start(
        &format!("--redis {dead} --limit 3 --on-redis-error local"),
        &[],
    );
    whole.assert_printed(
        "quota: 3 per 60s (burst 3), algorithm token-bucket, on-redis-error local (instances 1)",
    );
    let statuses: Vec<u16> = (0..4).map(|_| get(&whole, &[]).status).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{}", whole.output());
}

#[test]
fn metrics_bind_serves_prometheus_text_after_real_requests() {
    let redis = RedisServer::start();
    let example = start_on(&redis, "--limit 2 --metrics-bind 127.0.0.1:0 --key api-key");
    let metrics_addr = metrics_addr(&example);
    let statuses: Vec<u16> = (0..3)
        .map(|_| get(&example, &[("x-api-key", "secret-key-9")]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);

    let scraped = http_get(metrics_addr, "/metrics", &[]).unwrap();
    assert_eq!(scraped.status, 200, "{scraped:?}");
    let body = scraped.body;
    for line in [
        "redlimit_decisions_total{policy=\"default\",outcome=\"allowed\"} 2",
        "redlimit_decisions_total{policy=\"default\",outcome=\"limited\"} 1",
        "redlimit_circuit_breaker_open 0",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in:\n{body}");
    }
    assert!(
        body.contains("redlimit_store_latency_seconds"),
        "no latency in:\n{body}"
    );
    assert!(!body.contains("secret-key-9"), "{body}");
}

/// `--shadow`: every request answered 200, the would-be denials counted as `shadow_limited`
/// in `/metrics`, no `RateLimit` headers.
#[test]
fn shadow_answers_every_request_and_counts_shadow_limited() {
    let redis = RedisServer::start();
    let example = start_on(&redis, "--limit 2 --metrics-bind 127.0.0.1:0 --shadow");
    example.assert_printed_starting("shadow: on");
    let metrics_addr = metrics_addr(&example);
    let responses: Vec<_> = (0..5).map(|_| get(&example, &[])).collect();
    let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200; 5]);
    for response in &responses {
        assert_eq!(response.header("ratelimit"), None);
        assert_eq!(response.header("ratelimit-policy"), None);
    }
    let body = http_get(metrics_addr, "/metrics", &[]).unwrap().body;
    for line in [
        "redlimit_decisions_total{policy=\"default\",outcome=\"allowed\"} 2",
        "redlimit_decisions_total{policy=\"default\",outcome=\"shadow_limited\"} 3",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in:\n{body}");
    }
    assert!(!body.contains("outcome=\"limited\""), "{body}");
    eprintln!("--shadow: statuses {statuses:?}; /metrics:");
    for line in body
        .lines()
        .filter(|l| l.starts_with("redlimit_decisions_total"))
    {
        eprintln!("  {line}");
    }
}

#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let dead = dead_redis_url();
    // info level: the background connection warns that it cannot connect.
    let example = start(&format!("--redis {dead}"), &[("RUST_LOG", "info")]);
    assert_eq!(get(&example, &[]).status, 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !example.stderr.lock().unwrap().contains("WARN") {
        assert!(
            Instant::now() < deadline,
            "no warning; {}",
            example.output()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let stderr = example.stderr.lock().unwrap().clone();
    assert!(!stderr.contains('\u{1b}'), "ANSI codes in {stderr:?}");
}

/// The default key is the client's IP address: an unchecked `x-api-key`, fresh on every
/// request, buys no fresh quota (the example must not count any key a client sends).
#[test]
fn the_default_key_is_the_ip_and_a_fresh_api_key_does_not_evade_it() {
    let dead = dead_redis_url();
    let example = start("--limit 2", &[("REDIS_URL", &dead)]);
    let statuses: Vec<u16> = (0..4)
        .map(|i| get(&example, &[("x-api-key", &format!("random-{i}"))]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 429, 429], "{}", example.output());

    // `--key api-key` (behind an authenticating layer) counts each key apart, as before.
    let keyed = start("--limit 2 --key api-key", &[("REDIS_URL", &dead)]);
    let statuses: Vec<u16> = (0..4)
        .map(|i| get(&keyed, &[("x-api-key", &format!("tenant-{i}"))]).status)
        .collect();
    assert_eq!(statuses, [200; 4], "{}", keyed.output());
}

/// The hyper example prints `REDIS_URL` without its password, as the other examples do, and
/// refuses an address given twice.
#[test]
fn the_hyper_example_redacts_the_password_and_refuses_repeats() {
    let port = support::free_port();
    let url = format!("redis://user:hunter2-secret@127.0.0.1:{port}/");
    let hyper = Example::start("hyper", "", &[("REDIS_URL", &url)]);
    let shown = format!("store: redis redis://user:***@127.0.0.1:{port}/");
    hyper.assert_printed(&shown);
    assert!(!hyper.output().contains("hunter2"), "{}", hyper.output());
    // Redis is not there: the layer fails open, the server answers.
    let response = http_get(hyper.addr, "/", &[]).unwrap();
    assert_eq!(response.status, 200, "{response:?}");

    let cases: &[(&[&str], &str)] = &[
        (&["127.0.0.1:0", "127.0.0.1:1"], "give the address once"),
        (
            &["--bind", "127.0.0.1:0", "127.0.0.1:1"],
            "give the address once",
        ),
        (&["--frobnicate"], "unknown argument"),
    ];
    example::assert_usage_errors("hyper", cases);
}
