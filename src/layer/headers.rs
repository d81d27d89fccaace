//! The rate-limit headers: `RateLimit-Policy`, `RateLimit` and the legacy `X-RateLimit-*`,
//! written once per layer and per response without allocating.
//!
//! Headers follow draft-ietf-httpapi-ratelimit-headers-11:
//! `RateLimit-Policy: "name";q=100;w=60` (the quota) and `RateLimit: "name";r=42;t=5` (what is
//! left, and seconds until it resets), on allowed and rejected responses alike. A layer with
//! several tiers lists them all in `RateLimit-Policy`, named `"name-1"`, `"name-2"`… in order
//! (one field line, a structured-field list), and names the binding one
//! ([`Decision::quota`]) in `RateLimit`. An override set with `Limiter::set_quota`
//! ([`Decision::overridden`]) is advertised as itself: its binding quota alone, as `"name"`,
//! never as one of the layer's tiers (whose other items would describe quotas not in force),
//! even when it equals one of them. A rejection adds `Retry-After` in delay-seconds (rounded
//! up, at least 1, plus the optional jitter). Optionally the legacy
//! `X-RateLimit-Limit / -Remaining / -Reset` too.
//!
//! What `q`, `w`, `r` and `t` mean, and why they never contradict each other, is told in the
//! docs of [`RateLimit`](crate::layer::RateLimit) (`# The numbers in the headers`). Each is a
//! structured-field Integer, at most [`MAX_INTEGER`] (see [`policy_window`] for the quotas that
//! reach it).

use std::borrow::Cow;
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::intern::interned;
use crate::quota::{Quota, Quotas};

static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// The largest Integer of a structured field (RFC 8941 §3.3.1: at most 15 digits). Every number
/// of `RateLimit-Policy` and `RateLimit` is at most this, or no conforming parser reads the
/// field.
pub(crate) const MAX_INTEGER: u64 = 999_999_999_999_999;

/// `q` and `w` of `RateLimit-Policy` (see the module docs): the capacity `r` counts against,
/// and the longest a key takes from empty back to it, in whole seconds rounded up. A window
/// under a second is scaled to one second (`q` per second); one longer than [`MAX_INTEGER`]
/// seconds is scaled down to it (`q` what comes back in that time, fewer than the capacity),
/// and `q` is at most [`MAX_INTEGER`]: so `q` per `w` is never faster than the quota.
fn policy_window(quota: &Quota, algorithm: Algorithm) -> (u64, u64) {
    const SECOND: u128 = 1_000_000;
    let capacity = u128::from(quota.burst());
    let window_us = algorithm.spec().window.full_again_us(quota).max(1);
    let max = u128::from(MAX_INTEGER);
    let (q, w) = if window_us < SECOND {
        (capacity * SECOND / window_us, 1)
    } else if window_us > max * SECOND {
        // At most 10^15 × 10^21: within a u128.
        (capacity * max * SECOND / window_us, max)
    } else {
        (capacity, window_us.div_ceil(SECOND))
    };
    let bounded = |n: u128| u64::try_from(n.min(max)).unwrap_or(MAX_INTEGER);
    (bounded(q), bounded(w))
}

/// How the layer writes its headers for one list of quotas; built once per layer (and once per
/// resolved list of quotas, see `Config::style_for`).
#[derive(Debug, Clone)]
pub(crate) struct HeaderStyle {
    /// The policy name, for a quota that is none of the tiers (an override).
    name: String,
    algorithm: Algorithm,
    /// The quotas these headers describe, checked against by the requests that get them.
    quotas: Quotas,
    /// One per quota, in order.
    tiers: Vec<Tier>,
    /// `RateLimit-Policy` listing every tier, constant for a layer.
    policy: HeaderValue,
    /// Also send `X-RateLimit-*`.
    legacy: bool,
    /// The largest random amount added to `Retry-After` (zero: none).
    jitter: Duration,
}

/// One tier's name in the headers.
#[derive(Debug, Clone)]
struct Tier {
    quota: Quota,
    /// The quoted name, e.g. `"default"` or `"default-2"`.
    quoted_name: String,
    /// Its `q` and `w` (see the module docs).
    q: u64,
    w: u64,
    /// Its `RateLimit-Policy` item, e.g. `"default";q=10;w=60`.
    item: String,
}

impl Tier {
    fn new(quoted_name: String, quota: Quota, algorithm: Algorithm) -> Tier {
        let (q, w) = policy_window(&quota, algorithm);
        let item = format!("{quoted_name};q={q};w={w}");
        Tier {
            quota,
            quoted_name,
            q,
            w,
            item,
        }
    }
}

impl HeaderStyle {
    /// `name` must already be validated (`[A-Za-z0-9._-]`).
    pub(crate) fn new(
        name: &str,
        quotas: &Quotas,
        algorithm: Algorithm,
        legacy: bool,
        jitter: Duration,
    ) -> Self {
        let tiers: Vec<Tier> = match quotas.as_slice() {
            [quota] => vec![Tier::new(format!("\"{name}\""), *quota, algorithm)],
            _ => (1..)
                .zip(quotas)
                .map(|(i, quota)| Tier::new(format!("\"{name}-{i}\""), *quota, algorithm))
                .collect(),
        };
        let items: Vec<&str> = tiers.iter().map(|tier| tier.item.as_str()).collect();
        let policy = HeaderValue::try_from(items.join(", "))
            .unwrap_or_else(|_| HeaderValue::from_static("\"default\""));
        HeaderStyle {
            name: name.to_owned(),
            algorithm,
            quotas: *quotas,
            tiers,
            policy,
            legacy,
            jitter,
        }
    }

    /// The same style with its `RateLimit-Policy` value kept for the life of the process (see
    /// [`interned`]), so that each response clones it for free: for a layer's own quotas, built
    /// once per layer. Styles built for the quotas a resolver chose keep a counted value, since
    /// those quotas may be computed per key.
    pub(crate) fn with_constant_policy(mut self) -> Self {
        if let Ok(text) = self.policy.to_str() {
            // `from_static` takes visible ASCII and spaces only, which `to_str` guarantees.
            self.policy = HeaderValue::from_static(interned(text));
        }
        self
    }

    /// The same style (name, algorithm, options) for other quotas.
    pub(crate) fn for_quotas(&self, quotas: &Quotas) -> HeaderStyle {
        HeaderStyle::new(&self.name, quotas, self.algorithm, self.legacy, self.jitter)
    }

    /// The quotas these headers describe.
    pub(crate) fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The tier that bound `decision`, and the `RateLimit-Policy` to send with it: every tier
    /// when it is one of them, else (an override is in force) that quota alone. An override's
    /// quota is never matched to a tier: the layer's other tiers are not what is in force.
    fn binding(&self, decision: &Decision) -> (Cow<'_, Tier>, Cow<'_, HeaderValue>) {
        let own = (!decision.overridden)
            .then(|| self.tiers.iter().find(|tier| tier.quota == decision.quota))
            .flatten();
        match own {
            Some(tier) => (Cow::Borrowed(tier), Cow::Borrowed(&self.policy)),
            None => {
                let tier = Tier::new(format!("\"{}\"", self.name), decision.quota, self.algorithm);
                let policy = HeaderValue::try_from(tier.item.as_str())
                    .unwrap_or_else(|_| HeaderValue::from_static("\"default\""));
                (Cow::Owned(tier), Cow::Owned(policy))
            }
        }
    }

    /// [`denied_secs`](Self::denied_secs) for `decision`'s binding tier: what `Retry-After`
    /// says for a cost the quota can never hold.
    pub(super) fn never_allowed_secs(&self, decision: &Decision) -> u64 {
        Self::denied_secs(decision, self.binding(decision).0.w)
    }

    /// `t` of `RateLimit` for a denied request, in whole seconds (at least 1): the exact wait,
    /// or for a cost the quota can never hold (no true retry time) the binding tier's `w`.
    fn denied_secs(decision: &Decision, w: u64) -> u64 {
        if decision.never_allowed() && !decision.suspended {
            w.max(1)
        } else {
            decision.retry_after_secs()
        }
    }

    /// The wait `Retry-After` (and `grpc-retry-pushback-ms`) announce for a denied request:
    /// `retry_after` plus a random amount up to the jitter, never less than the true wait.
    /// `None` for a cost the quota can never hold.
    pub(super) fn retry_hint(&self, decision: &Decision) -> Option<Duration> {
        if decision.never_allowed() && !decision.suspended {
            return None;
        }
        if self.jitter.is_zero() {
            return Some(decision.retry_after);
        }
        let max = u64::try_from(self.jitter.as_micros()).unwrap_or(u64::MAX);
        let jitter = Duration::from_micros(fastrand::u64(0..=max));
        Some(decision.retry_after.saturating_add(jitter))
    }

    /// Adds the rate-limit headers describing `decision`.
    pub(crate) fn apply(&self, headers: &mut HeaderMap, decision: &Decision) {
        let (tier, policy) = self.binding(decision);
        // With several tiers `reset_after` is the longest of them: the binding tier's own reset
        // is at most its `w`, so that bound is the tier's `t` (single tiers never reach it).
        let reset = decision.reset_after_secs().min(tier.w);
        let (remaining, t) = if decision.allowed {
            (decision.remaining, reset)
        } else if decision.suspended {
            (0, Self::denied_secs(decision, tier.w))
        } else {
            (decision.remaining, Self::denied_secs(decision, tier.w))
        };
        // Integers of a structured field: `r` counts against `q` (which may be written below the
        // capacity, see `policy_window`), and a wait longer than the largest Integer is written
        // as it (`Retry-After` keeps the exact wait).
        let (remaining, t) = (remaining.min(tier.q), t.min(MAX_INTEGER));
        // Written on the stack and copied once into the header value: one allocation, where a
        // `format!` took two (the string, then the shrink into `Bytes`), and no formatting
        // machinery.
        let mut state = StackValue::new();
        state.push(tier.quoted_name.as_bytes());
        state.push(b";r=");
        state.push_decimal(remaining);
        state.push(b";t=");
        state.push_decimal(t);
        // Appended, not inserted: with stacked layers every policy shows up as its own item.
        headers.append(RATELIMIT_POLICY.clone(), policy.into_owned());
        if let Ok(value) = HeaderValue::from_bytes(state.as_bytes()) {
            headers.append(RATELIMIT.clone(), value);
        }
        if !self.legacy {
            return;
        }
        // The legacy headers hold one policy: the most restrictive one (least remaining) wins.
        let tighter = headers
            .get(&X_REMAINING)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_none_or(|known| remaining < known);
        if tighter {
            // The capacity `remaining` counts against, as `q` (not the per-period limit).
            headers.insert(X_LIMIT.clone(), tier.q.into());
            headers.insert(X_REMAINING.clone(), remaining.into());
            headers.insert(X_RESET.clone(), reset.max(t).into());
        }
    }
}

/// A header value built on the stack. The `RateLimit` value fits: the quoted name is at most 68
/// bytes (64, a tier number, quotes), each number 15 digits ([`MAX_INTEGER`]), with `;r=` and
/// `;t=` 104 in all.
struct StackValue {
    bytes: [u8; StackValue::CAPACITY],
    len: usize,
}

impl StackValue {
    const CAPACITY: usize = 128;

    fn new() -> Self {
        StackValue {
            bytes: [0; Self::CAPACITY],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.bytes[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// `n` in decimal, as `Display` writes it (two digits per step, through `itoa`).
    fn push_decimal(&mut self, n: u64) {
        self.push(itoa::Buffer::new().format(n).as_bytes());
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::core::MAX_SUSPENSION;
    use crate::quota::{MAX_COUNT, MAX_PERIOD};
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    #[test]
    fn policy_window_in_whole_seconds() {
        assert_eq!(
            policy_window(&Quota::per_minute(100).unwrap(), Algorithm::TokenBucket),
            (100, 60)
        );
        let half_second = Quota::new(5, Duration::from_millis(500)).unwrap();
        assert_eq!(policy_window(&half_second, Algorithm::TokenBucket), (10, 1));
        let odd = Quota::new(3, Duration::from_millis(1500)).unwrap();
        assert_eq!(policy_window(&odd, Algorithm::TokenBucket), (3, 2));
    }

    pub(crate) fn style(name: &str, quotas: &[Quota], legacy: bool) -> HeaderStyle {
        let quotas = Quotas::new(quotas.iter().copied()).unwrap();
        HeaderStyle::new(
            name,
            &quotas,
            Algorithm::TokenBucket,
            legacy,
            Duration::ZERO,
        )
    }

    /// The style of the policy `api` over 10 a second and 500 a minute, and those tiers.
    fn two_tiers() -> (Quota, Quota, HeaderStyle) {
        let second = Quota::per_second(10).unwrap();
        let minute = Quota::per_minute(500).unwrap();
        (second, minute, style("api", &[second, minute], false))
    }

    /// The headers `style` writes for `decision` on a response that had none.
    fn written(style: &HeaderStyle, decision: &Decision) -> HeaderMap {
        let mut headers = HeaderMap::new();
        style.apply(&mut headers, decision);
        headers
    }

    /// Asserts the `RateLimit-Policy` and `RateLimit` fields `headers` hold.
    #[track_caller]
    fn assert_fields(headers: &HeaderMap, policy: &str, state: &str) {
        assert_eq!(headers["ratelimit-policy"], policy);
        assert_eq!(headers["ratelimit"], state);
    }

    pub(crate) fn allowed(quota: Quota, remaining: u64, reset_after: Duration) -> Decision {
        Decision {
            allowed: true,
            limit: quota.limit(),
            remaining,
            retry_after: Duration::ZERO,
            reset_after,
            suspended: false,
            quota,
            overridden: false,
        }
    }

    pub(crate) fn denied(quota: Quota, retry_after: Duration) -> Decision {
        Decision {
            allowed: false,
            limit: quota.limit(),
            remaining: 0,
            retry_after,
            reset_after: quota.period(),
            suspended: false,
            quota,
            overridden: false,
        }
    }

    #[test]
    fn decimals_are_written_as_display_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 4_294_967_296, u64::MAX - 1, u64::MAX] {
            let mut value = StackValue::new();
            value.push_decimal(n);
            assert_eq!(value.as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn a_constant_policy_is_the_same_value_shared_by_every_response() {
        let quotas = [
            Quota::per_minute(10).unwrap(),
            Quota::per_second(1).unwrap(),
        ];
        let counted = style("api", &quotas, false);
        let constant = counted.clone().with_constant_policy();
        assert_eq!(constant.policy, counted.policy);
        assert_eq!(
            constant.policy.to_str().unwrap(),
            r#""api-1";q=10;w=60, "api-2";q=1;w=1"#
        );
        // Two styles built apart point at the one interned text.
        let again = counted.with_constant_policy();
        assert!(std::ptr::eq(
            again.policy.as_bytes(),
            constant.policy.as_bytes()
        ));
    }

    #[test]
    fn the_longest_state_fits_on_the_stack() {
        let quota = Quota::per_minute(MAX_COUNT).unwrap();
        let quotas = [quota, Quota::per_second(1).unwrap()];
        let name = "n".repeat(64);
        let style = style(&name, &quotas, false);
        // An admission's `t` is capped at its tier's `w`: the longest `t` is a denial's wait.
        let decision = Decision {
            remaining: u64::MAX,
            retry_after: Duration::new(u64::MAX, 0),
            ..denied(quota, Duration::ZERO)
        };
        let headers = written(&style, &decision);
        let expected = format!("\"{name}-1\";r={MAX_INTEGER};t={MAX_INTEGER}");
        assert_eq!(headers["ratelimit"], expected.as_str());
    }

    #[test]
    fn a_burst_of_ten_to_the_fifteen_is_written_as_the_largest_integer() {
        let style = style("default", &[Quota::per_second(MAX_COUNT).unwrap()], false);
        assert_eq!(style.policy, r#""default";q=999999999999999;w=1"#);
    }

    #[test]
    fn a_sub_second_window_scaled_past_fifteen_digits_is_written_as_the_largest_integer() {
        let quota = Quota::new(MAX_COUNT, Duration::from_micros(1)).unwrap();
        assert_eq!(
            style("p", &[quota], false).policy,
            r#""p";q=999999999999999;w=1"#
        );
    }

    #[test]
    fn a_refill_longer_than_the_largest_integer_of_seconds_is_scaled_down_to_it() {
        // 10^15 units, one a century: 3.15 × 10^24 s to refill. What comes back in the
        // largest `w`, 999 999 999 999 999 s, is 317 097.9 units.
        let quota = Quota::new(1, MAX_PERIOD)
            .unwrap()
            .with_burst(MAX_COUNT)
            .unwrap();
        let style = style("p", &[quota], false);
        assert_eq!(style.policy, r#""p";q=317097;w=999999999999999"#);
        // `r` counts against that `q`.
        let headers = written(&style, &allowed(quota, MAX_COUNT - 1, MAX_PERIOD));
        assert_eq!(headers["ratelimit"], r#""p";r=317097;t=3153600000"#);
    }

    /// Quotas from 1 to 10^15 units over 1 µs to a century, in orders of magnitude.
    fn any_quota() -> impl Strategy<Value = Quota> {
        let count = (0u32..=15, 1u64..=9).prop_map(|(e, d)| (d * 10u64.pow(e)).min(MAX_COUNT));
        let period_us = (0u32..=15, 1u64..=9).prop_map(|(e, d)| d.saturating_mul(10u64.pow(e)));
        (count.clone(), period_us, count).prop_map(|(limit, period_us, burst)| {
            let period = Duration::from_micros(period_us).min(MAX_PERIOD);
            Quota::new(limit, period)
                .unwrap()
                .with_burst(burst)
                .unwrap()
        })
    }

    /// The numbers of a `"name";a=1;b=2` item, each checked to be a structured-field Integer.
    fn integers(item: &str) -> Result<Vec<(String, u64)>, TestCaseError> {
        let mut numbers = Vec::new();
        for param in item.split(';').skip(1) {
            let (key, value) = param.split_once('=').unwrap();
            let digits = value.len() <= 15 && value.bytes().all(|b| b.is_ascii_digit());
            prop_assert!(digits, "{} is not an Integer in {}", value, item);
            numbers.push((key.to_owned(), value.parse().unwrap()));
        }
        Ok(numbers)
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Every quota the crate accepts, under every algorithm, with any decision it can
        /// make (a wait and a reset of at most the time to full, or any suspension): both fields
        /// hold Integers of at most 15 digits, `r ≤ q`, `t ≤ w` (but a suspension's), and `q`
        /// per `w` is never faster than the quota refills its burst.
        #[test]
        fn every_number_written_is_an_integer_of_a_structured_field(
            quota in any_quota(),
            algorithm in proptest::sample::select(Algorithm::ALL.to_vec()),
            admitted in any::<bool>(),
            suspended in any::<bool>(),
            remaining in any::<u64>(),
            wait in any::<u128>(),
        ) {
            let style = HeaderStyle::new("p", &quota.into(), algorithm, false, Duration::ZERO);
            let full_us = algorithm.spec().window.full_again_us(&quota).max(1);
            let suspended = suspended && !admitted;
            let wait_ms = match suspended {
                true => wait % (MAX_SUSPENSION.as_millis() + 1),
                false => (wait % (full_us + 1)).div_ceil(1_000),
            };
            let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(u64::MAX));
            let decision = Decision {
                allowed: admitted,
                limit: quota.limit(),
                remaining: remaining % (quota.burst() + 1),
                retry_after: if admitted { Duration::ZERO } else { wait },
                reset_after: wait,
                suspended,
                quota,
                overridden: false,
            };
            let headers = written(&style, &decision);
            let policy = integers(headers["ratelimit-policy"].to_str().unwrap())?;
            let state = integers(headers["ratelimit"].to_str().unwrap())?;
            let ([(_, q), (_, w)], [(_, r), (_, t)]) = (&policy[..], &state[..]) else {
                panic!("{policy:?} {state:?}");
            };
            prop_assert!(r <= q, "r {} > q {}", r, q);
            prop_assert!(t <= w || decision.suspended, "t {} > w {}", t, w);
            let capacity = u128::from(quota.burst());
            prop_assert!(
                u128::from(*q) * full_us <= capacity * u128::from(*w) * 1_000_000,
                "{} per {} s is faster than {} per {} µs", q, w, capacity, full_us
            );
        }
    }

    #[test]
    fn every_algorithm_advertises_its_capacity_and_the_time_to_refill_it() {
        let quota = Quota::per_minute(10).unwrap().with_burst(50).unwrap();
        // 50 tokens at 10 a minute: `r` counts down from 49 of 50, full again in 5 minutes.
        assert_eq!(policy_window(&quota, Algorithm::TokenBucket), (50, 300));
        assert_eq!(policy_window(&quota, Algorithm::Gcra), (50, 300));
        for window in [Algorithm::FixedWindow, Algorithm::SlidingLog] {
            assert_eq!(policy_window(&quota, window), (50, 60), "{window}");
        }
        // The previous window weighs through the current one: two periods to be full again.
        assert_eq!(policy_window(&quota, Algorithm::SlidingWindow), (50, 120));
        // Without a burst the rate algorithms keep their limit and period.
        let plain = Quota::per_minute(10).unwrap();
        assert_eq!(policy_window(&plain, Algorithm::TokenBucket), (10, 60));
        assert_eq!(policy_window(&plain, Algorithm::Gcra), (10, 60));
    }

    #[test]
    fn legacy_limit_is_the_capacity_remaining_counts_against() {
        let quota = Quota::per_minute(10).unwrap().with_burst(50).unwrap();
        let style = style("api", &[quota], true);
        let headers = written(&style, &allowed(quota, 49, Duration::from_secs(6)));
        assert_fields(&headers, "\"api\";q=50;w=300", "\"api\";r=49;t=6");
        assert_eq!(headers["x-ratelimit-limit"], "50");
        assert_eq!(headers["x-ratelimit-remaining"], "49");
    }

    #[test]
    fn an_override_equal_to_a_tier_is_still_advertised_alone() {
        let (second, _, style) = two_tiers();
        // The override 10/1s + 50/60s binds on its 10/1s, equal to the layer's first tier.
        let overridden = Decision {
            overridden: true,
            ..allowed(second, 3, Duration::from_secs(40))
        };
        let headers = written(&style, &overridden);
        // `t`: the decision's reset is the override's longest tier; capped at this tier's `w`.
        assert_fields(&headers, "\"api\";q=10;w=1", "\"api\";r=3;t=1");
    }

    #[test]
    fn stacked_policies_are_all_listed_and_legacy_keeps_the_tightest() {
        let quota = Quota::per_minute(100).unwrap();
        let outer = style("minute", &[quota], true);
        let inner = style("second", &[quota], true);
        let second = Duration::from_secs(1);
        let mut headers = HeaderMap::new();
        inner.apply(&mut headers, &allowed(quota, 1, second));
        outer.apply(&mut headers, &allowed(quota, 98, second));
        let states: Vec<_> = headers.get_all("ratelimit").iter().collect();
        assert_eq!(states, ["\"second\";r=1;t=1", "\"minute\";r=98;t=1"]);
        assert_eq!(headers.get_all("ratelimit-policy").iter().count(), 2);
        assert_eq!(headers["x-ratelimit-remaining"], "1");
    }

    #[test]
    fn several_tiers_are_numbered_and_the_binding_one_is_named() {
        let (second, minute, style) = two_tiers();
        let headers = written(&style, &allowed(minute, 3, Duration::from_secs(59)));
        assert_fields(
            &headers,
            "\"api-1\";q=10;w=1, \"api-2\";q=500;w=60",
            "\"api-2\";r=3;t=59",
        );

        let headers = written(&style, &denied(second, Duration::from_millis(100)));
        assert_eq!(headers["ratelimit"], "\"api-1\";r=0;t=1");
    }

    #[test]
    fn a_quota_that_is_no_tier_is_listed_alone() {
        let (_, _, style) = two_tiers();
        let granted = Quota::per_minute(7).unwrap();
        let headers = written(&style, &allowed(granted, 6, Duration::from_secs(9)));
        assert_fields(&headers, "\"api\";q=7;w=60", "\"api\";r=6;t=9");
    }

    #[test]
    fn headers_describe_the_decision() {
        let quota = Quota::per_minute(10).unwrap();
        let style = style("api", &[quota], true);
        let headers = written(&style, &allowed(quota, 7, Duration::from_millis(17_001)));
        assert_fields(&headers, "\"api\";q=10;w=60", "\"api\";r=7;t=18");
        assert_eq!(headers["x-ratelimit-remaining"], "7");
    }
}
