//! A refund: the Rust mirror of `lua/refund.lua`, step for step, over the same bytes (its
//! wire is in `src/store/redis/refund.rs`).
//!
//! Gives units back to every tier of one route, never above a tier's capacity, and only to the
//! window they were reserved in (the script's header states the rule per algorithm).

use crate::quota::Quota;

fn f64_at(s: &[u8], at: usize) -> Option<f64> {
    s.get(at..at + 8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// What a refund of `units` reserved at `reserved` (µs) does to a route's string `route` under
/// its tenant's string `tenant`, for the algorithm tagged `tag` (not the sliding log: see
/// [`log_refund`]). `client`: `reserved` is a client clock's (see [`reserved_before_reset`]).
/// `None`: nothing changes; else the new string and the number of tiers that got units back.
pub(crate) fn refund(
    route: Option<&[u8]>,
    tenant: Option<&[u8]>,
    tag: u8,
    units: f64,
    (reserved, client): (f64, bool),
    quotas: &[Quota],
) -> Option<(Vec<u8>, u64)> {
    let mut tiers: Vec<(f64, f64)> = quotas
        .iter()
        .map(|q| (q.period_micros() as f64, q.burst() as f64))
        .collect();
    let reset_us = tenant_reset(tenant);
    if let Some(over) = reset_us.1 {
        tiers = over;
    }
    let s = route?;
    let (mut at, mut stamp) = (0, 0.0);
    if s.len() != 17 && s.len() != 25 && s.first() == Some(&b'M') {
        let n = usize::from(*s.get(9)?);
        let clen = 10 + 24 * n;
        if n > 8 || s.len() < clen {
            return None;
        }
        if n > 0 {
            tiers = (0..n)
                .map(|i| Some((f64_at(s, 10 + 24 * i + 8)?, f64_at(s, 10 + 24 * i + 16)?)))
                .collect::<Option<_>>()?;
        }
        at = clen;
        if s.get(at) == Some(&super::STAMP) && s.len() >= at + 9 {
            stamp = f64_at(s, at + 1)?;
            at += 9;
        }
    }
    if reset_us.0 > 0.0
        && (stamp < reset_us.0 || reserved_before_reset(reserved, reset_us.0, client))
    {
        return None;
    }
    let mut out = s[..at].to_vec();
    let (mut changed, mut i) = (0, 0);
    while at < s.len() {
        let tag_at = s[at];
        if tag_at == 0 {
            out.push(0);
            at += 1;
            i += 1;
            continue;
        }
        let len = if tag_at == b'w' { 25 } else { 17 };
        let state = &s[at..(at + len).min(s.len())];
        at += len;
        i += 1;
        let new = match tiers.get(i - 1) {
            Some(&(period, burst)) if state.len() == len && tag_at == tag => {
                // The start of the fixed window the units were reserved in.
                let start = reserved - super::lua_mod(reserved, period);
                refund_state(state, units, start, period, burst)
            }
            _ => None,
        };
        match new {
            Some(new) if new != state => {
                out.extend_from_slice(&new);
                changed += 1;
            }
            _ => out.extend_from_slice(state),
        }
    }
    (changed > 0).then_some((out, changed))
}

/// The tenant's reset (0: none) and its override's periods and bursts, if any.
fn tenant_reset(tenant: Option<&[u8]>) -> (f64, Option<Vec<(f64, f64)>>) {
    let Some(t) = tenant.filter(|t| t.first() == Some(&b'M')) else {
        return (0.0, None);
    };
    let Some(&n) = t.get(9) else {
        return (0.0, None);
    };
    let n = usize::from(n);
    let clen = 10 + 24 * n;
    if n > 8 || t.len() < clen {
        return (0.0, None);
    }
    let over = (n > 0)
        .then(|| {
            (0..n)
                .map(|i| Some((f64_at(t, 10 + 24 * i + 8)?, f64_at(t, 10 + 24 * i + 16)?)))
                .collect()
        })
        .flatten();
    (f64_at(t, clen).unwrap_or(0.0), over)
}

/// One tier's state after a refund of units reserved in the fixed window starting at `start`,
/// as `lua/refund.lua` computes it; `None` when it does not parse or has nothing to give back.
fn refund_state(state: &[u8], units: f64, start: f64, period: f64, burst: f64) -> Option<Vec<u8>> {
    let ok = |v: f64| (0.0..super::MAX_EXACT).contains(&v);
    let tag = state[0];
    let a = f64_at(state, 1)?;
    let b = f64_at(state, 9)?;
    let mut new = vec![tag];
    let mut push = |v: f64| new.extend_from_slice(&v.to_le_bytes());
    if tag == b'w' {
        let c = b;
        let p = f64_at(state, 17)?;
        if !(ok(c) && ok(p)) {
            return None;
        }
        push(a);
        if a == start {
            push((c - units).max(0.0));
            push(p);
        } else if a == start + period {
            push(c);
            push((p - units).max(0.0));
        } else {
            return None;
        }
    } else {
        if !(ok(a) && ok(b)) {
            return None;
        }
        match tag {
            b't' => {
                push((a - super::lua_mod(a, 1.0) + units).min(burst));
                push(b);
            }
            b'g' => {
                push(a);
                push((b - units).max(0.0));
            }
            b'f' if a == start => {
                push(a);
                push((b - units).max(0.0));
            }
            _ => return None,
        }
    }
    Some(new)
}

/// Whether units reserved at `reserved` may have been paid for before a reset at `reset_us`: a
/// client clock's reservation within `MAX_SKEW` after it counts as before, since the reset may
/// have been made under another client's clock up to that far behind (`lua/refund.lua`).
pub(crate) fn reserved_before_reset(reserved: f64, reset_us: f64, client: bool) -> bool {
    let skew = if client { super::MAX_SKEW_US } else { 0.0 };
    reserved < reset_us + skew
}

/// The sliding log's refund of `units` reserved at `reserved`: the `units` oldest entries
/// scored at or after `reserved` removed from `log` (sorted oldest first), as
/// `ZRANGEBYSCORE … LIMIT` and `ZREM` do in `lua/refund.lua`. Returns the entries removed.
pub(crate) fn log_refund(log: &mut super::sliding_log::Log, units: f64, reserved: f64) -> u64 {
    let older = log.partition_point(|&score| score < reserved);
    let n = (units.min(usize::MAX as f64) as usize).min(log.len() - older);
    log.drain(older..older + n);
    n as u64
}

/// The refund script's body (`lua/refund.lua`).
pub(crate) const REFUND_SOURCE: &str = include_str!("../../lua/refund.lua");
