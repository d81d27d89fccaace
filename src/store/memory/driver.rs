//! The Rust mirror of the driver (`lua/common.lua`), which [`MemoryStore`](super::MemoryStore)
//! runs: the same steps in the same order over the same strings, so both stores store the same
//! bytes. (The fleet controls' mirror is their operation's, `ops/control.rs`.)

use crate::algorithm::{is_one_state, ms_up, sliding_log, state_len_of, Args, Packed, PackedStep};
use crate::quota::{Quota, MAX_TIERS};
use crate::store::wire::layout::{
    Controls, Reply, Tier, CONTROLS, CONTROLS_HEAD, MAX_REPLY_MS, MAX_TTL_MS, OVERRIDE_IDLE_MS,
    STAMP,
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

/// A step's arguments for `tier` at `now` and `cost`; a tier of other than integers is refused,
/// as the script refuses it.
#[inline]
fn args_of(tier: &Tier, now: f64, cost: f64) -> Result<Args, Refused> {
    if !tier.valid() {
        return Err(Refused("limit, period_us and burst must be integers"));
    }
    Ok(Args {
        now,
        cost,
        limit: tier.limit,
        period: tier.period,
        burst: tier.burst,
    })
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
    // Most decisions: one tier, no tenant string, the route's string a bare state or absent.
    // That is the `plain` case below, reached without opening (no tiers array to build).
    if let ([quota], None) = (quotas, tenant) {
        if stored.is_none_or(|s| is_one_state(s.len())) {
            let args = args_of(&Tier::of(quota), now, cost)?;
            let outcome = step(stored, &args);
            let mut gather = Gather::new();
            gather.add(
                0,
                outcome.allowed,
                outcome.remaining,
                outcome.retry_us,
                outcome.reset_us,
            );
            let (_, ttl) = gather.times();
            let write = outcome.state.map(|state| (Written::Packed(state), ttl));
            return Ok((gather.reply(), write));
        }
    }
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
        let args = args_of(tier, now, cost)?;
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
        let args = args_of(tier, now, cost)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

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
