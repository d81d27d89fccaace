//! Output: the table and the contract lines.

use super::*;

pub(crate) fn print_table(rows: &[Row]) {
    println!(
        "{:<33} {:<20} {:>11} {:>9} {:>9} {:>13} {:>12} {:>12} {:>10}",
        "scenario",
        "shape",
        "decisions/s",
        "p50 µs",
        "p99 µs",
        "redis µs/dec",
        "redis CPU µs",
        "bench CPU µs",
        "allocs/dec"
    );
    println!("{}", "-".repeat(139));
    let figure = |value: f64| {
        if value.is_nan() {
            "-".to_owned()
        } else {
            format!("{value:.2}")
        }
    };
    for row in rows {
        let usec = figure(row.median_of(Run::usec_per_decision));
        let cpu = figure(row.median_of(Run::redis_cpu_us));
        let own = figure(row.median_of(Run::own_cpu_us));
        let runs = if row.runs.len() > 1 {
            format!(" (median of {})", row.runs.len())
        } else {
            String::new()
        };
        println!(
            "{:<33} {:<20} {:>11.0} {:>9.1} {:>9.1} {:>13} {:>12} {:>12} {:>10.2}{runs}",
            row.scenario,
            row.shape.label(),
            row.median_of(Run::rate),
            row.median_of(|r| r.p50_us),
            row.median_of(|r| r.p99_us),
            usec,
            cpu,
            own,
            row.median_of(Run::allocations_per_op),
        );
    }
}

/// What one algorithm (or the reference script) cost Redis in each round.
#[derive(Default)]
pub(crate) struct Costs {
    pub(crate) usec: Vec<f64>,
    pub(crate) cpu: Vec<f64>,
}

impl Costs {
    /// The least-disturbed figure: preemption of Redis mid-script only ever adds to its
    /// `EVALSHA` time, so on a shared machine the smallest of the rounds is the closest to the
    /// script's own cost.
    pub(crate) fn least(values: &[f64]) -> f64 {
        values
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::min)
    }
}

/// The median of per-round ratios, and their range.
pub(crate) struct Ratio {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Ratio {
    pub(crate) fn of(values: Vec<f64>) -> Ratio {
        let finite: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        Ratio {
            median: median(finite.clone()),
            min: finite.iter().copied().fold(f64::INFINITY, f64::min),
            max: finite.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".to_owned())
}

/// `redis-benchmark -P 16` of the reference script, when it is on PATH.
pub(crate) fn redis_benchmark(url: &str, sha: &str, requests: u64) -> String {
    let Some((host, port, password)) = host_port(url) else {
        return format!("skipped: cannot read host and port from {url}");
    };
    let mut command = std::process::Command::new("redis-benchmark");
    command.args(["-h", &host, "-p", &port]);
    if let Some(password) = password {
        command.args(["-a", &password, "--no-auth-warning"]);
    }
    command
        .args(["-n", &requests.to_string(), "-c", "64", "-P", "16", "-q"])
        .args(["EVALSHA", sha, "1", &format!("{PREFIX}-ref:{{rb}}")])
        .args(["1764500000000000:7", "1000"]);
    match command.output() {
        Ok(output) if output.status.success() => String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|line| line.rsplit('\r').next().unwrap_or(line).trim())
            .filter(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        Ok(output) => format!(
            "failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(e) => format!("skipped: redis-benchmark is not on PATH ({e})"),
    }
}

/// Host, port and password of a `redis://[user:password@]host[:port][/db]` URL.
pub(crate) fn host_port(url: &str) -> Option<(String, String, Option<String>)> {
    let rest = url.strip_prefix("redis://")?;
    let rest = rest.split('/').next()?;
    let (password, address) = match rest.rsplit_once('@') {
        Some((user_info, address)) => (
            user_info.split_once(':').map(|(_, p)| p.to_owned()),
            address,
        ),
        None => (None, rest),
    };
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
    Some((host.to_owned(), port.to_owned(), password))
}
