//! Time in µs since the Unix epoch, the upstream's windows and the run's schedule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::STARTUP;

/// When the workers start and stop calling, in µs since the Unix epoch: after [`STARTUP`], at a
/// window boundary when the run covers whole windows, for `seconds`.
pub fn schedule(period: Duration, seconds: u64) -> (u64, u64) {
    let earliest = unix_micros() + micros(STARTUP);
    let start = if period <= Duration::from_secs(seconds) {
        earliest.div_ceil(micros(period)) * micros(period)
    } else {
        earliest
    };
    (start, start + seconds * 1_000_000)
}

/// `1s`, `500ms`, `1500us`: a period as the flags write it.
pub fn show_period(period: Duration) -> String {
    let micros = micros(period);
    if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1_000) {
        format!("{}ms", micros / 1_000)
    } else {
        format!("{micros}us")
    }
}

/// Now, in µs since the Unix epoch (this machine's clock, the mock upstream's).
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(micros)
        .unwrap_or(0)
}

/// How long until `at` (µs since the Unix epoch); zero if it has passed.
pub fn until_unix(at: u64) -> Duration {
    Duration::from_micros(at.saturating_sub(unix_micros()))
}

pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
