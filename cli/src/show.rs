//! What the commands print: a key's status as text, one fact a line, or as JSON.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::time::Duration;

use redlimit::limiter::KeyStatus;
use redlimit::Quotas;
use serde_json::{json, Value};

/// A key's status as JSON members: override, suspension, time to reset, state.
pub fn status_json(status: &KeyStatus) -> serde_json::Map<String, Value> {
    let millis = |d: Option<Duration>| d.map(|d| d.as_millis() as u64);
    let tiers: Vec<String> = status.tiers.iter().map(ToString::to_string).collect();
    let value = json!({
        "override": status.quota_override.as_ref().map(quotas_text),
        "suspended_ms": millis(status.suspended_for),
        "reset_after_ms": millis(status.expires_in),
        "tiers": tiers,
        "log_entries": status.log_entries,
    });
    match value {
        Value::Object(members) => members,
        _ => unreachable!("json! of an object"),
    }
}

/// A name read back from a key in Redis (a tenant, a route) with its control characters
/// escaped (`\u{1b}`): whoever can write a key must not drive the operator's terminal or
/// forge a line of the output.
pub fn printable(name: &str) -> Cow<'_, str> {
    if !name.chars().any(char::is_control) {
        return Cow::Borrowed(name);
    }
    let mut text = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if c.is_control() {
            let _ = write!(text, "{}", c.escape_unicode());
        } else {
            text.push(c);
        }
    }
    Cow::Owned(text)
}

/// The key's controls, a line each: its override and its suspension.
fn controls_text(text: &mut String, status: &KeyStatus) {
    let override_text = status
        .quota_override
        .as_ref()
        .map_or("none".to_owned(), quotas_text);
    let _ = writeln!(text, "  override: {override_text}");
    let suspended = status.suspended_for.map_or("no".to_owned(), |left| {
        format!("{} left", seconds_text(left))
    });
    let _ = writeln!(text, "  suspended: {suspended}");
}

/// One route of `inspect`: its override, suspension, expiry and state on one line each.
pub fn route_text(scope: &str, status: &KeyStatus) -> String {
    let mut text = format!("route {}\n", printable(scope));
    controls_text(&mut text, status);
    let reset = status.expires_in.map_or("fresh".to_owned(), |left| {
        format!("in {}", seconds_text(left))
    });
    let _ = writeln!(text, "  back to full: {reset}");
    if status.tiers.is_empty() {
        let _ = writeln!(text, "  remaining: full (none stored)");
    }
    state_text(&mut text, status);
    text
}

/// What a key looks like, one fact a line.
pub fn status_text(shown: &str, storage_key: &str, status: &KeyStatus) -> String {
    let mut text = format!("key {shown} ({storage_key})\n");
    controls_text(&mut text, status);
    let expires = status
        .expires_in
        .map_or("nothing stored".to_owned(), seconds_text);
    let _ = writeln!(text, "  expires in: {expires}");
    if status.tiers.is_empty() {
        let _ = writeln!(text, "  state: none stored");
    }
    state_text(&mut text, status);
    text
}

/// The stored state of each tier, and the sliding log's entries.
fn state_text(text: &mut String, status: &KeyStatus) {
    for (i, tier) in status.tiers.iter().enumerate() {
        let _ = writeln!(text, "  state of tier {}: {tier}", i + 1);
    }
    if let Some(entries) = status.log_entries {
        let _ = writeln!(text, "  sliding log entries: {entries}");
    }
}

/// `the unscoped key, api, login`, or `none`.
pub fn routes_text(routes: &[Option<String>]) -> String {
    let names: Vec<Cow<'_, str>> = routes
        .iter()
        .map(|route| printable(route.as_deref().unwrap_or("(unscoped)")))
        .collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// `10/1m, 500/1h`, the way `set-quota` takes them (with ` burst B` when it differs).
pub fn quotas_text(quotas: &Quotas) -> String {
    let tiers: Vec<String> = quotas
        .iter()
        .map(|quota| {
            let mut text = format!("{}/{}", quota.limit(), duration_text(quota.period()));
            if quota.burst() != quota.limit() {
                let _ = write!(text, " burst {}", quota.burst());
            }
            text
        })
        .collect();
    tiers.join(", ")
}

/// A duration in the largest unit that shows it whole: `1h`, `10m`, `30s`, `500ms`, `5µs`.
pub fn duration_text(duration: Duration) -> String {
    let micros = duration.as_micros();
    for (unit, size) in [
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ] {
        if micros >= size && micros.is_multiple_of(size) {
            return format!("{}{unit}", micros / size);
        }
    }
    format!("{micros}µs")
}

/// A time left, to the millisecond, `59.998s`; beyond an hour also in days, hours and minutes:
/// `2591999.998s (29d 23h 59m)`.
pub fn seconds_text(duration: Duration) -> String {
    let mut text = format!("{:.3}s", duration.as_secs_f64());
    let minutes = duration.as_secs() / 60;
    if minutes >= 60 {
        let (days, hours) = (minutes / (24 * 60), minutes / 60 % 24);
        let _ = write!(text, " ({days}d {hours}h {}m)", minutes % 60);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlimit::Quota;

    #[test]
    fn durations_and_quotas_print_as_set_quota_takes_them() {
        assert_eq!(duration_text(Duration::from_secs(3600)), "1h");
        assert_eq!(duration_text(Duration::from_secs(90)), "90s");
        assert_eq!(duration_text(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration_text(Duration::from_micros(5)), "5µs");
        let quotas = Quotas::new(vec![
            Quota::per_minute(3).unwrap(),
            Quota::per_hour(500).unwrap().with_burst(600).unwrap(),
        ])
        .unwrap();
        assert_eq!(quotas_text(&quotas), "3/1m, 500/1h burst 600");
        assert_eq!(printable("api:v1"), "api:v1");
        assert_eq!(printable("a\x1b[2J\nb\u{9b}"), r"a\u{1b}[2J\u{a}b\u{9b}");
        assert_eq!(
            seconds_text(Duration::from_millis(2_591_999_998)),
            "2591999.998s (29d 23h 59m)"
        );
    }
}
