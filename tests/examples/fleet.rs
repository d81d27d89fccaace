//! The fleet example `examples/fleet.rs`, run as a user runs it: worker processes sharing one
//! quota in a private Redis use it fully and never trip the mock upstream, and without a Redis it
//! refuses to start.

use crate::support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::example::{self, dead_redis_url};
use support::RedisServer;

/// How long a run of a few seconds may take, start-up and builds of the workers aside.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// `upstream: T requests in S s, W max in any aligned window, X answered 429`.
#[derive(Debug, PartialEq)]
struct Summary {
    total: u64,
    seconds: u64,
    max_in_window: u64,
    too_many: u64,
}

impl Summary {
    fn parse(line: &str) -> Option<Summary> {
        let rest = line.strip_prefix("upstream: ")?;
        let (total, rest) = rest.split_once(" requests in ")?;
        let (seconds, rest) = rest.split_once(" s, ")?;
        let (max_in_window, rest) = rest.split_once(" max in any aligned window, ")?;
        let too_many = rest.strip_suffix(" answered 429")?;
        Some(Summary {
            total: total.parse().ok()?,
            seconds: seconds.parse().ok()?,
            max_in_window: max_in_window.parse().ok()?,
            too_many: too_many.parse().ok()?,
        })
    }
}

/// Runs the fleet example with the [`example::words`] of `flags` and `envs` to completion.
fn run_fleet(flags: &str, envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(example::example_binary("fleet"));
    command
        .args(example::words(flags))
        .envs(envs.iter().copied())
        .stdin(Stdio::null());
    let what = format!("the fleet example with {flags:?}");
    example::output_within(&mut command, RUN_TIMEOUT, &what)
}

#[test]
fn workers_use_the_shared_quota_fully_and_never_trip_the_upstream() {
    let redis = RedisServer::start();
    let url = redis.url();
    let (workers, limit, seconds) = (3, 20, 3);
    let output = run_fleet(
        &format!(
            "--redis {url} --workers {workers} --limit {limit} --period 1s --seconds {seconds}"
        ),
        &[("REDIS_URL", &dead_redis_url())],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{}: {stdout}\n{stderr}",
        output.status
    );
    // Exactly one line on stdout: the summary.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let summary = Summary::parse(lines[0]).unwrap_or_else(|| panic!("not a summary: {stdout}"));
    assert_eq!(summary.seconds, seconds, "{summary:?}");
    assert_eq!(summary.too_many, 0, "{summary:?}\n{stderr}");
    assert!(summary.max_in_window <= limit, "{summary:?}\n{stderr}");
    let full = limit * seconds;
    assert!(
        summary.total * 10 >= full * 9,
        "{} requests, under 90 % of {full}: {summary:?}\n{stderr}",
        summary.total
    );
    assert!(summary.total <= full, "{summary:?}\n{stderr}");
    // Every worker took part, each in a process of its own.
    let silent: Vec<u64> = (1..=workers)
        .filter(|id| !stderr.contains(&format!("worker {id}: ")))
        .collect();
    assert!(
        silent.is_empty(),
        "no report from workers {silent:?}: {stderr}"
    );
}

#[test]
fn a_short_period_is_used_fully_too() {
    let redis = RedisServer::start();
    let url = redis.url();
    let output = run_fleet(
        &format!("--redis {url} --workers 2 --limit 5 --period 250ms --seconds 2"),
        &[],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let summary = Summary::parse(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|| panic!("no summary: {stdout}"));
    // 8 windows of 250 ms, 5 each.
    assert_eq!(summary.too_many, 0, "{summary:?}\n{stderr}");
    assert!(summary.max_in_window <= 5, "{summary:?}\n{stderr}");
    assert!(summary.total >= 36, "{summary:?}\n{stderr}");
}

#[test]
fn a_suspension_of_the_fleets_key_pauses_every_worker() {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut fleet = Command::new(example::example_binary("fleet"))
        .args([
            "--redis",
            &url,
            "--workers",
            "3",
            "--limit",
            "20",
            "--period",
            "1s",
        ])
        .args(["--seconds", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the fleet example");
    // The first stderr line names the key; the workers start at least 1.5 s later.
    let mut stderr = BufReader::new(fleet.stderr.take().expect("piped stderr"));
    let mut first = String::new();
    stderr
        .read_line(&mut first)
        .expect("the fleet's first line");
    let key = first
        .split_once("key \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(key, _)| key.to_owned())
        .unwrap_or_else(|| panic!("no key in {first:?}"));
    let rest = thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        rest
    });

    // What `redlimit --redis URL suspend KEY 4s` does (tested in cli/tests/).
    let runtime = support::current_thread_runtime();
    runtime
        .block_on(async {
            let limiter = support::Ctx::default().redis(&redis);
            limiter.suspend(key.as_str(), Duration::from_secs(4)).await
        })
        .expect("suspend the fleet's key");

    let deadline = Instant::now() + RUN_TIMEOUT;
    while fleet.try_wait().expect("poll the fleet").is_none() {
        assert!(Instant::now() < deadline, "the fleet did not finish");
        thread::sleep(Duration::from_millis(50));
    }
    let output = fleet.wait_with_output().expect("the fleet's output");
    let stderr = format!("{first}{}", rest.join().unwrap());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let summary = Summary::parse(stdout.trim_end()).unwrap_or_else(|| panic!("{stdout}"));
    // 4 windows of 20; the suspension covered at least one whole window of the run, and the
    // workers came back after it.
    assert_eq!(summary.too_many, 0, "{summary:?}\n{stderr}");
    assert!((20..=60).contains(&summary.total), "{summary:?}\n{stderr}");
}

#[test]
fn without_a_redis_it_cannot_share_a_quota_and_exits_2() {
    let dead = dead_redis_url();
    for (args, envs) in [
        (String::new(), vec![("REDIS_URL", dead.as_str())]),
        (format!("--redis {dead}"), vec![]),
    ] {
        let output = run_fleet(&args, &envs);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("no Redis answers at {dead}"))
                && stderr.contains("cannot share a quota across processes"),
            "{args:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{args:?}: no summary");
    }
}

#[test]
fn bad_flags_exit_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--workers", "0"], "--workers must be at least 1"),
        (&["--workers", "65"], "--workers: at most 64"),
        (&["--workers", "many"], "--workers"),
        (&["--limit", "0"], "--limit must be at least 1"),
        (&["--limit", "1000000000000000000"], "--limit"),
        (&["--period", "0s"], "--period"),
        (&["--period", "1.5s"], "--period"),
        (&["--period", "10x"], "--period"),
        (&["--seconds", "0"], "--seconds must be at least 1"),
        (&["--seconds", "3601"], "--seconds: at most 3600"),
        (&["--seconds"], "--seconds needs a value"),
        (&["--redis", "not a url"], "--redis: invalid URL"),
        (&["--limit", "5", "--limit", "6"], "give --limit once"),
        (&["--frobnicate", "1"], "unknown argument"),
        (&["extra"], "unexpected argument"),
    ];
    example::assert_usage_errors("fleet", cases);
}

#[test]
fn help_names_every_flag_and_the_summary_line() {
    let usage = example::help_naming("fleet", "--redis --workers --limit --period --seconds");
    let summary = "upstream: T requests in S s, W max in any aligned window, X answered 429";
    assert!(usage.contains(summary), "{usage}");
    assert!(
        !usage.contains("--worker "),
        "the worker mode is hidden: {usage}"
    );
}

/// `learned quota: L/PERIOD after N responses`: (L, PERIOD, N).
fn learned_line(line: &str) -> Option<(u64, String, u64)> {
    let rest = line.strip_prefix("learned quota: ")?;
    let (limit, rest) = rest.split_once('/')?;
    let (period, rest) = rest.split_once(" after ")?;
    let responses = rest.strip_suffix(" responses")?;
    Some((
        limit.parse().ok()?,
        period.to_owned(),
        responses.parse().ok()?,
    ))
}

/// The contract: workers configured with 50 a second against an upstream that allows 20
/// and announces it learn 20/1s from its headers, and draw at most 5 `429`s after that.
fn learning_converges_on_the_upstreams_limit(dialect: &str) {
    let redis = RedisServer::start();
    let url = redis.url();
    let output = run_fleet(&format!("--redis {url} --workers 4 --limit 50 --upstream-limit 20 --period 1s --seconds 5 --announce {dialect} --learn"), &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}\n{stderr}");
    let (limit, period, responses) =
        learned_line(lines[0]).unwrap_or_else(|| panic!("not a learned line: {stdout}"));
    assert_eq!((limit, period.as_str()), (20, "1s"), "{stdout}");
    assert!(responses >= 1, "{stdout}");
    let summary = Summary::parse(lines[1]).unwrap_or_else(|| panic!("no summary: {stdout}"));
    assert_eq!(summary.seconds, 5, "{summary:?}");
    // Every answer announces, the first one included: every 429 came after an announcement.
    assert!(summary.too_many <= 5, "{dialect}: {summary:?}\n{stderr}");
    // The fleet still uses the upstream's quota (4 of the 5 windows at least).
    assert!(summary.total >= 80, "{dialect}: {summary:?}\n{stderr}");
}

#[test]
fn learning_from_ietf_or_x_ratelimit_headers_converges_on_the_upstreams_limit() {
    for dialect in ["ietf", "x-ratelimit"] {
        learning_converges_on_the_upstreams_limit(dialect);
    }
}

#[test]
fn bad_provider_flags_exit_2_with_a_message() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--upstream-limit", "0"],
            "--upstream-limit must be at least 1",
        ),
        (
            &["--upstream-limit", "1000000000000000000"],
            "--upstream-limit",
        ),
        (
            &["--announce", "carrier-pigeon"],
            "--announce: \"carrier-pigeon\" is neither",
        ),
        (&["--announce"], "--announce needs a value"),
        (
            &["--announce", "ietf", "--period", "500ms"],
            "--period must be whole seconds",
        ),
        (&["--learn=yes"], "--learn takes no value"),
        (&["--learn", "--learn"], "give --learn once"),
    ];
    example::assert_usage_errors("fleet", cases);
}

#[test]
fn help_names_the_provider_flags_and_the_learned_line() {
    let usage = example::help_naming(
        "fleet",
        "--upstream-limit --announce --learn ietf x-ratelimit",
    );
    let learned = "learned quota: L/PERIOD after N responses";
    assert!(usage.contains(learned), "{usage}");
}
