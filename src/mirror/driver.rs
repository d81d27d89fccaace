//! The Rust mirror of the driver (`lua/common.lua`) and of the fleet controls
//! (`lua/control.lua`), which [`MemoryStore`](crate::store::MemoryStore) runs: the same steps in
//! the same order over the same strings, so both store the same bytes.

use crate::algorithm::{
    is_one_state, ms_up, sliding_log, state_len_of, Algorithm, Args, Packed, PackedStep,
};
use crate::quota::{Quota, MAX_TIERS};
use crate::store::wire::layout::{
    f64_at, put_quota, Controls, Op, Reply, Tier, CONTROLS, CONTROLS_HEAD, MAX_REPLY_MS,
    MAX_TTL_MS, OVERRIDE_IDLE_MS, STAMP,
};

/// Why the mirror refused a call (the script answers an error reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused(pub &'static str);

/// A key's new string: one state as it is (a plain decision: no allocation), or controls and
/// several tiers joined.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Written {
    Packed(Packed),
    Joined(Vec<u8>),
}

/// What a decision writes: the key's new string and its TTL in ms.
pub(crate) type Write = Option<(Written, u64)>;

/// The binding tier and the times, as `lua/common.lua` gathers them.
struct Gather {
    all_ok: bool,
    max_rs: f64,
    /// (position, remaining) of the tier with the least remaining.
    min: Option<(usize, f64)>,
    /// (position, remaining, retry) of the denying tier with the longest wait.
    deny: Option<(usize, f64, f64)>,
    /// The override's tiers, when they are in force.
    overridden: Option<Tiers>,
}

impl Gather {
    fn new() -> Self {
        Gather {
            all_ok: true,
            max_rs: 0.0,
            min: None,
            deny: None,
            overridden: None,
        }
    }

    fn add(&mut self, tier: usize, ok: bool, rem: f64, re: f64, rs: f64) {
        if self.min.is_none_or(|(_, least)| rem < least) {
            self.min = Some((tier, rem));
        }
        if !ok {
            let longer = match self.deny {
                None => true,
                Some((_, _, longest)) => longest >= 0.0 && (re < 0.0 || re > longest),
            };
            if longer {
                self.deny = Some((tier, rem, re));
            }
            self.all_ok = false;
        }
        if rs > self.max_rs {
            self.max_rs = rs;
        }
    }

    /// `reset_ms` and the TTL.
    fn times(&self) -> (i64, u64) {
        let reset_ms = ms_up(self.max_rs).min(MAX_REPLY_MS);
        (reset_ms, reset_ms.clamp(1, MAX_TTL_MS) as u64)
    }

    fn reply(&self) -> Reply {
        let (reset_ms, _) = self.times();
        let reply = |allowed, tier: usize, remaining: f64, retry_after_ms| Reply {
            allowed,
            suspended: false,
            tier,
            overridden: self.overridden.as_ref().map(|tiers| {
                let t = tiers[tier];
                (t.limit as u64, t.period as u64, t.burst as u64)
            }),
            remaining: remaining as u64,
            retry_after_ms,
            reset_after_ms: reset_ms,
        };
        match (self.all_ok, self.min, self.deny) {
            (true, Some((tier, rem)), _) => reply(true, tier, rem, 0),
            (false, _, Some((tier, rem, re))) => {
                let re = if re > 0.0 {
                    ms_up(re).min(MAX_REPLY_MS)
                } else {
                    re as i64
                };
                reply(false, tier, rem, re)
            }
            _ => Reply {
                // No tier: unreachable, every call has one (`Quotas` is never empty).
                allowed: false,
                suspended: false,
                tier: 0,
                overridden: None,
                remaining: 0,
                retry_after_ms: -1,
                reset_after_ms: 0,
            },
        }
    }
}

/// Up to [`MAX_TIERS`] tiers, kept on the stack: a decision allocates none for them.
#[derive(Clone, Copy)]
struct Tiers {
    items: [Tier; MAX_TIERS],
    len: usize,
}

impl Tiers {
    /// The first [`MAX_TIERS`] of `tiers`.
    fn of(tiers: impl Iterator<Item = Tier>) -> Tiers {
        let none = Tier {
            limit: 0.0,
            period: 0.0,
            burst: 0.0,
        };
        let mut out = Tiers {
            items: [none; MAX_TIERS],
            len: 0,
        };
        for (slot, tier) in out.items.iter_mut().zip(tiers) {
            *slot = tier;
            out.len += 1;
        }
        out
    }
}

impl std::ops::Deref for Tiers {
    type Target = [Tier];

    fn deref(&self) -> &[Tier] {
        &self.items[..self.len]
    }
}

/// A route's string and its tenant's controls opened, as the opening of `lua/common.lua` reads
/// them.
struct Opened<'a> {
    /// The tiers in force: the route's override, else the tenant's, else the caller's.
    tiers: Tiers,
    /// Whether an override decides (its quotas go back with the reply).
    overridden: bool,
    /// The controls to write before the states (`head` in the script).
    head: Option<Vec<u8>>,
    /// Whether the route has an override of its own (it keeps the key for its idle time).
    route_override: bool,
    /// The states, from where they begin; `None` when absent, corrupt or reset since.
    states: Option<&'a [u8]>,
    /// Whether the route's string had no controls at all (`at == 1` in the script).
    bare: bool,
    /// Whether the tenant was reset since the route's states were written.
    stale: bool,
}

/// A time left in µs as the reply carries it: whole ms rounded up, at most [`MAX_REPLY_MS`].
fn reply_ms(us: f64) -> i64 {
    let ms = us / 1000.0;
    if ms > MAX_REPLY_MS as f64 {
        MAX_REPLY_MS
    } else {
        ms.ceil() as i64
    }
}

/// The reply of a key suspended until `until_us`, naming `first`, the first tier of the
/// override in force (if any). Mirrors `suspended` in `lua/common.lua`.
fn suspended(until_us: f64, now: f64, first: Option<Tier>) -> Reply {
    let left = reply_ms(until_us - now);
    Reply {
        allowed: false,
        suspended: true,
        tier: 0,
        overridden: first.map(|t| (t.limit as u64, t.period as u64, t.burst as u64)),
        remaining: 0,
        retry_after_ms: left,
        reset_after_ms: left,
    }
}

/// Opens `stored` (the route's string) under `tenant` (the tenant's string), or answers the
/// suspended reply. Mirrors the opening of `lua/common.lua`.
fn open<'a>(
    stored: Option<&'a [u8]>,
    tenant: Option<&'a [u8]>,
    now: f64,
    quotas: &[Quota],
) -> Result<Opened<'a>, Reply> {
    let mut tiers = Tiers::of(quotas.iter().map(Tier::of));
    let mut overridden = false;
    let mut reset_us = 0.0;
    // The tenant's suspension is answered after the route's controls: a route suspended for
    // longer answers with its own end.
    let mut tenant_until = 0.0;
    if let Some(Controls::Some { until_us, n, bytes }) = tenant.map(Controls::parse) {
        tenant_until = until_us;
        if n > 0 {
            tiers = Tiers::of((0..n).map(|i| Tier::at(bytes, Controls::len(i))));
            overridden = true;
        }
        reset_us = Controls::tenant_reset(tenant.unwrap_or_default(), bytes.len());
    }
    let (mut head, mut route_override, mut stamp, mut states, mut bare) =
        (None, false, 0.0, stored, true);
    if let Some(s) = stored.filter(|s| !is_one_state(s.len())) {
        match Controls::parse(s) {
            Controls::None => {}
            Controls::Corrupt => states = None,
            Controls::Some { until_us, n, bytes } => {
                let until_us = until_us.max(tenant_until);
                if until_us > now {
                    let first = if n > 0 {
                        Some(Tier::at(bytes, Controls::len(0)))
                    } else {
                        overridden.then(|| tiers[0])
                    };
                    return Err(suspended(until_us, now, first));
                }
                if n > 0 {
                    tiers = Tiers::of((0..n).map(|i| Tier::at(bytes, Controls::len(i))));
                    overridden = true;
                    route_override = true;
                    head = Some(bytes.to_vec());
                }
                let at;
                (stamp, at) = Controls::stamp(s, bytes.len());
                states = Some(&s[at..]);
                bare = false;
            }
        }
    }
    if tenant_until > now {
        return Err(suspended(tenant_until, now, overridden.then(|| tiers[0])));
    }
    let mut stale = false;
    if reset_us > 0.0 {
        if stamp < reset_us {
            stale = true;
            states = None;
        }
        let mut new = head.unwrap_or_else(|| {
            let mut bare = vec![CONTROLS];
            bare.extend_from_slice(&[0; CONTROLS_HEAD - 1]);
            bare
        });
        new.push(STAMP);
        new.extend_from_slice(&reset_us.to_le_bytes());
        head = Some(new);
    }
    Ok(Opened {
        tiers,
        overridden,
        head,
        route_override,
        states,
        bare,
        stale,
    })
}

/// A decision over a route's string (`stored`) and its tenant's (`tenant`) with a pure step, as
/// `lua/common.lua` makes it: the reply and what to write at the route.
pub(crate) fn decide(
    step: PackedStep,
    stored: Option<&[u8]>,
    tenant: Option<&[u8]>,
    now: f64,
    cost: f64,
    quotas: &[Quota],
) -> Result<(Reply, Write), Refused> {
    let opened = match open(stored, tenant, now, quotas) {
        Ok(opened) => opened,
        Err(suspended) => return Ok((suspended, None)),
    };
    let tiers = &opened.tiers;
    // Several states without controls (a key that dropped a tier) are read tier by tier.
    let plain = opened.bare
        && opened.head.is_none()
        && !opened.overridden
        && tiers.len() == 1
        && opened.states.is_none_or(|s| is_one_state(s.len()));
    let s = opened.states;
    let mut at = 0;
    let mut gather = Gather::new();
    gather.overridden = opened.overridden.then_some(*tiers);
    let mut olds: Vec<Option<&[u8]>> = Vec::new();
    let mut news = Vec::new();
    let mut oks = Vec::new();
    let mut plain_state = None;
    for (i, tier) in tiers.iter().enumerate() {
        if !tier.valid() {
            return Err(Refused("limit, period_us and burst must be integers"));
        }
        let stored = if plain {
            s
        } else {
            s.and_then(|bytes| {
                let tag = *bytes.get(at)?;
                let len = state_len_of(tag);
                let state = &bytes[at..(at + len).min(bytes.len())];
                at += len;
                (tag != 0).then_some(state)
            })
        };
        let args = Args {
            now,
            cost,
            limit: tier.limit,
            period: tier.period,
            burst: tier.burst,
        };
        let outcome = step(stored, &args);
        gather.add(
            i,
            outcome.allowed,
            outcome.remaining,
            outcome.retry_us,
            outcome.reset_us,
        );
        if plain {
            plain_state = outcome.state;
        } else {
            olds.push(stored);
            news.push(outcome.state);
            oks.push(outcome.allowed);
        }
    }
    let (_, mut ttl) = gather.times();
    let write = if plain {
        plain_state.map(|state| (Written::Packed(state), ttl))
    } else {
        let mut changed = false;
        let mut out = opened.head.clone().unwrap_or_default();
        for ((new, old), ok) in news.iter().zip(&olds).zip(&oks) {
            match new {
                Some(new) if gather.all_ok || !ok => {
                    changed = true;
                    out.extend_from_slice(new.as_bytes());
                }
                _ => out.extend_from_slice(old.unwrap_or(&[0])),
            }
        }
        if opened.route_override {
            ttl = ttl.max(OVERRIDE_IDLE_MS);
        }
        changed.then_some((Written::Joined(out), ttl))
    };
    Ok((gather.reply(), write))
}

/// What a sliding-log decision writes.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LogWrite {
    /// The log's new TTL in ms (after the log was changed in place).
    pub log_ttl: Option<u64>,
    /// The controls' key's new string and TTL (an override refreshed by an admission, or the
    /// tenant's reset the log now belongs to).
    pub controls: Option<(Vec<u8>, u64)>,
}

/// A sliding-log decision, as `lua/common.lua` makes it: `controls` is the string at the
/// controls' key, `tenant` the tenant's; the log is changed in place when the decision writes
/// (and emptied first when the tenant was reset since it was written).
pub(crate) fn decide_log(
    controls: Option<&[u8]>,
    tenant: Option<&[u8]>,
    log: &mut sliding_log::Log,
    now: f64,
    cost: f64,
    quotas: &[Quota],
) -> Result<(Reply, LogWrite), Refused> {
    let opened = match open(controls, tenant, now, quotas) {
        Ok(opened) => opened,
        Err(suspended) => return Ok((suspended, LogWrite::default())),
    };
    if opened.stale {
        log.clear();
    }
    let tiers = &opened.tiers;
    let mut gather = Gather::new();
    gather.overridden = opened.overridden.then_some(*tiers);
    let mut writer: Option<(f64, bool)> = None; // (period, stepped back) of the longest writer
    for (i, tier) in tiers.iter().enumerate() {
        if !tier.valid() {
            return Err(Refused("limit, period_us and burst must be integers"));
        }
        let args = Args {
            now,
            cost,
            limit: tier.limit,
            period: tier.period,
            burst: tier.burst,
        };
        let (outcome, stepped_back) = sliding_log::decide(log, &args);
        gather.add(
            i,
            outcome.allowed,
            outcome.remaining,
            outcome.retry_us,
            outcome.reset_us,
        );
        if outcome.state.is_some() && writer.is_none_or(|(longest, _)| tier.period > longest) {
            writer = Some((tier.period, stepped_back));
        }
    }
    let (_, ttl) = gather.times();
    let mut write = LogWrite::default();
    if let Some((period, stepped_back)) = writer {
        let admit = gather.all_ok;
        if admit || stepped_back {
            sliding_log::apply(log, now, period, cost, admit, stepped_back);
            write.log_ttl = Some(ttl);
            if let Some(head) = opened.head.filter(|_| admit && cost > 0.0) {
                let ttl = if opened.route_override {
                    ttl.max(OVERRIDE_IDLE_MS)
                } else {
                    ttl
                };
                write.controls = Some((head, ttl));
            }
        }
    }
    Ok((gather.reply(), write))
}

/// The name of the algorithm whose state a route's string holds, when it is not `algorithm`'s
/// (a control on it is refused, as `lua/control.lua` refuses it).
pub(crate) fn foreign_state(stored: &[u8], algorithm: Algorithm) -> Option<&'static str> {
    let states = match Controls::parse(stored) {
        Controls::Some { bytes, .. } if !is_one_state(stored.len()) => &stored[bytes.len()..],
        Controls::Corrupt if !is_one_state(stored.len()) => &[],
        _ => stored,
    };
    let mut at = 0;
    while let Some(&tag) = states.get(at) {
        if tag == 0 || tag == STAMP {
            at += if tag == 0 { 1 } else { 9 };
            continue;
        }
        match Algorithm::ALL.iter().find(|a| a.tag() == tag) {
            Some(other) if *other != algorithm => return Some(other.name()),
            _ => {}
        }
        at += state_len_of(tag);
    }
    None
}

/// What a route's control does to its learning record, as `lua/control.lua` does it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordWrite {
    /// Nothing changes.
    Keep,
    /// The record becomes this string, for this many ms.
    Put(Vec<u8>, u64),
    /// The record's controls go: what followed them stays, with its TTL (`None`: nothing did,
    /// the key goes).
    Unmark(Option<Vec<u8>>),
}

/// The override a learning record holds (its byte `n` and the quotas, as a route holds its
/// override), when it holds one.
pub(crate) fn marked_override(record: &[u8]) -> Option<&[u8]> {
    if record.first() != Some(&CONTROLS) {
        return None;
    }
    let n = usize::from(*record.get(CONTROLS_HEAD - 1)?);
    let end = Controls::len(n);
    ((1..=MAX_TIERS).contains(&n) && record.len() >= end).then(|| &record[CONTROLS_HEAD - 1..end])
}

/// The control a route's string gets once its learning record is read, and what becomes of the
/// record, as `lua/control.lua` decides them: [`Op::Learn`] sets the override unless the route
/// holds an operator's (one its record does not hold; then nothing changes), [`Op::Unlearn`]
/// clears it only when it is learned, and an operator's [`Op::SetQuota`] or
/// [`Op::ClearQuota`] removes the record's mark. `record`: `None` when the route has no record
/// key or it holds another type (never written, never a mark), `Some(None)` when absent.
/// `all_routes`: the tenant's controls hold an override of every route (an operator's): then
/// [`Op::Learn`] sets nothing and clears the route's learned override, as [`Op::Unlearn`].
pub(crate) fn learning<'a>(
    stored: Option<&[u8]>,
    record: Option<Option<&[u8]>>,
    all_routes: bool,
    now: f64,
    op: Op<'a>,
) -> (Op<'a>, RecordWrite) {
    let override_bytes: &[u8] = match stored.map(|s| (s, Controls::parse(s))) {
        Some((s, Controls::Some { bytes, .. })) if !is_one_state(s.len()) => {
            &bytes[CONTROLS_HEAD - 1..]
        }
        _ => &[0],
    };
    let marked = record.flatten().and_then(marked_override);
    let learned = marked == Some(override_bytes);
    let unmark = || match (record.flatten(), marked) {
        (Some(record), Some(marked)) => {
            let left = &record[CONTROLS_HEAD - 1 + marked.len()..];
            RecordWrite::Unmark((!left.is_empty()).then(|| left.to_vec()))
        }
        _ => RecordWrite::Keep,
    };
    match op {
        Op::Learn(..) if all_routes => {
            (if learned { Op::ClearQuota } else { Op::Inspect }, unmark())
        }
        Op::Learn(quotas, micros) => {
            if record.is_none() || override_bytes != [0] && !learned {
                return (Op::Inspect, RecordWrite::Keep);
            }
            let mut new = vec![CONTROLS];
            new.extend_from_slice(&(now + micros as f64).to_le_bytes());
            new.push(quotas.len() as u8);
            let at = new.len();
            new.resize(at + 24 * quotas.len(), 0);
            let mut at = at;
            for quota in quotas {
                at = put_quota(&mut new, at, quota);
            }
            let ttl = (ms_up(micros as f64) as u64).max(OVERRIDE_IDLE_MS);
            (Op::SetQuota(quotas), RecordWrite::Put(new, ttl))
        }
        Op::Unlearn => (if learned { Op::ClearQuota } else { Op::Inspect }, unmark()),
        Op::SetQuota(_) | Op::ClearQuota => (op, unmark()),
        _ => (op, RecordWrite::Keep),
    }
}

/// A fleet control over a key's string, as `lua/control.lua` makes it: the new string (`None`:
/// delete it) and its TTL in ms, or `None` when nothing changes (inspect). `tenant`: the key
/// is the tenant's (its string: controls, then its reset).
pub(crate) fn control(
    stored: Option<&[u8]>,
    pttl_ms: Option<u64>,
    now: f64,
    op: Op<'_>,
    tenant: bool,
) -> Option<(Option<Vec<u8>>, u64)> {
    let (mut until_us, mut override_bytes, mut rest): (f64, Vec<u8>, &[u8]) = (0.0, vec![0], &[]);
    if let Some(s) = stored {
        match Controls::parse(s) {
            Controls::Some {
                until_us: until,
                bytes,
                ..
            } if !is_one_state(s.len()) => {
                until_us = until;
                override_bytes = bytes[9..].to_vec();
                rest = &s[bytes.len()..];
            }
            Controls::Corrupt if !is_one_state(s.len()) => {}
            _ if !tenant => rest = s,
            _ => {}
        }
    }
    let mut reset_us = if tenant && rest.len() >= 8 {
        f64_at(rest, 0)
    } else {
        0.0
    };
    match op {
        // Learning's controls reach here as what `learning` made of them.
        Op::Inspect | Op::Learn(..) | Op::Unlearn => return None,
        Op::SetQuota(quotas) => {
            override_bytes = vec![quotas.len() as u8];
            override_bytes.resize(1 + 24 * quotas.len(), 0);
            let mut at = 1;
            for quota in quotas {
                at = put_quota(&mut override_bytes, at, quota);
            }
        }
        Op::ClearQuota => override_bytes = vec![0],
        Op::Suspend(micros) => until_us = now + micros as f64,
        Op::Extend(micros) => {
            let end = now + micros as f64;
            if until_us.is_nan() || until_us < end {
                until_us = end;
            }
        }
        Op::Resume => until_us = 0.0,
        Op::Reset if tenant => {
            let last = crate::store::wire::layout::reset_time(reset_us);
            reset_us = now;
            if reset_us <= last {
                reset_us = last + 1.0;
            }
        }
        Op::Reset => rest = &[],
    }
    let suspended = until_us > now;
    let has_override = override_bytes != [0];
    let mut new = Vec::new();
    if tenant {
        if suspended || has_override || reset_us > 0.0 {
            new.push(CONTROLS);
            let until = if suspended { until_us } else { 0.0 };
            new.extend_from_slice(&until.to_le_bytes());
            new.extend_from_slice(&override_bytes);
            if reset_us > 0.0 {
                new.extend_from_slice(&reset_us.to_le_bytes());
            }
        }
    } else {
        // The controls go first; the tenant's reset the states belong to needs them.
        if suspended || has_override || rest.first() == Some(&STAMP) {
            new.push(CONTROLS);
            let until = if suspended { until_us } else { 0.0 };
            new.extend_from_slice(&until.to_le_bytes());
            new.extend_from_slice(&override_bytes);
        }
        new.extend_from_slice(rest);
    }
    if new.is_empty() {
        return Some((None, 0));
    }
    let mut ttl = match pttl_ms {
        Some(pttl) if pttl > 0 && (tenant || !rest.is_empty()) => pttl,
        _ => 1,
    };
    if has_override && (matches!(op, Op::SetQuota(_)) || !tenant) {
        ttl = ttl.max(OVERRIDE_IDLE_MS);
    }
    if tenant && reset_us > 0.0 && op == Op::Reset {
        ttl = ttl.max(OVERRIDE_IDLE_MS);
    }
    if suspended {
        ttl = ttl.max(ms_up(until_us - now) as u64);
    }
    Some((Some(new), ttl.min(MAX_TTL_MS as u64)))
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_round_trip() {
        let q = Quota::per_second(5).unwrap();
        let (set, ttl) = control(None, None, 1e6, Op::SetQuota(&[q]), false).unwrap();
        let set = set.unwrap();
        assert_eq!(ttl, OVERRIDE_IDLE_MS);
        let parsed = Controls::parse(&set);
        assert_eq!(parsed.override_quotas(), vec![q]);
        let (suspended, ttl) =
            control(Some(&set), Some(ttl), 1e6, Op::Suspend(2_000_000), false).unwrap();
        let suspended = suspended.unwrap();
        assert!(
            matches!(Controls::parse(&suspended), Controls::Some { until_us, n: 1, .. } if until_us == 3e6)
        );
        assert_eq!(ttl, OVERRIDE_IDLE_MS);
        let (cleared, _) =
            control(Some(&suspended), Some(ttl), 1e6, Op::ClearQuota, false).unwrap();
        let (resumed, _) = control(cleared.as_deref(), Some(ttl), 1e6, Op::Resume, false).unwrap();
        assert_eq!(resumed, None, "nothing left: the key is deleted");
        assert_eq!(control(Some(&set), None, 1e6, Op::Inspect, false), None);
    }

    #[test]
    fn a_suspension_far_ahead_gives_a_readable_reply() {
        // A tenant suspended until 1e300 µs: the reply's times are capped, never unreadable.
        let mut tenant = vec![CONTROLS];
        tenant.extend_from_slice(&1e300f64.to_le_bytes());
        tenant.push(0);
        let quota = Quota::per_minute(10).unwrap();
        let step = match Algorithm::TokenBucket.kind() {
            crate::algorithm::Kind::Packed(step) => step,
            crate::algorithm::Kind::Log => unreachable!(),
        };
        let (reply, write) = decide(step, None, Some(&tenant), 1e6, 1.0, &[quota]).unwrap();
        assert!(reply.suspended && !reply.allowed && write.is_none());
        assert_eq!(reply.retry_after_ms, MAX_REPLY_MS);
        // The same on the route's own controls.
        let (reply, _) = decide(step, Some(&tenant), None, 1e6, 1.0, &[quota]).unwrap();
        assert_eq!(reply.retry_after_ms, MAX_REPLY_MS);
    }
}
