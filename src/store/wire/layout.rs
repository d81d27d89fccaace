//! The layout the scripts and their mirror share: the controls at the start of a key's string,
//! the keys a call names, the reply's values, and the numbers every script keeps (see
//! `lua/common.lua`'s header for the format itself).
//!
//! Everything of one storage key lives in one string: the optional controls (an override of
//! the quotas, a suspension), then every tier's state (see `lua/common.lua`). The sliding log
//! keeps its sorted set next to it, under `<key>`, and its controls under `<key>#m`.

use std::time::Duration;

use crate::algorithm::MAX_EXACT;
pub(crate) use crate::algorithm::MAX_REPLY_MS;
use crate::decision::Decision;
use crate::quota::{Quota, MAX_TIERS};
use crate::store::contract::{micros, Control};

/// An override lives until no request was admitted on its key for this long: 30 days
/// (`OVERRIDE_IDLE_MS` in the scripts).
pub(crate) const OVERRIDE_IDLE_MS: u64 = 30 * 24 * 3600 * 1000;

/// The longest expiry: 2^53 ms, 285 000 years (the script caps its TTL at `MAX_EXACT`).
pub(crate) const MAX_TTL_MS: i64 = MAX_EXACT as i64;

/// The tag byte of the controls at the start of a key's string.
pub(crate) const CONTROLS: u8 = b'M';

/// The controls' bytes before the override's quotas: the tag, the suspension's end (a double),
/// and the count of the override's tiers, its last byte.
pub(crate) const CONTROLS_HEAD: usize = 10;

/// The tag of the tenant's reset a route's states were written under (after its controls).
pub(crate) const STAMP: u8 = b'E';

/// A busy key's remembered expiry, before its one state on Redis's clock (`lua/common.lua`'s
/// write): `EXPIRY_MARK`, the expiry in ms negated, a 0 byte; `EXPIRY_HEAD` bytes. Shaped as
/// controls that change nothing (no suspension ends before 0; no override), so that every
/// reader of controls, a release before the remembered expiry too, reads the state after it.
pub(crate) const EXPIRY_MARK: u8 = CONTROLS;

/// The bytes of the remembered expiry before the state: as many as controls without override.
pub(crate) const EXPIRY_HEAD: usize = CONTROLS_HEAD;

/// A number Lua holds exactly, or NaN, which the scripts refuse by name.
pub(crate) fn exact(v: u64) -> f64 {
    if (v as f64) < MAX_EXACT {
        v as f64
    } else {
        f64::NAN
    }
}

/// Whether the scripts take `v` as it is: [`exact`] sends it as itself, not NaN.
pub(crate) fn is_exact(v: u64) -> bool {
    !exact(v).is_nan()
}

/// Any cost above the largest burst a quota can have is never allowed, whatever the quotas in
/// force (an override may have a larger burst than the caller's): capped there, so Lua stays
/// below 2^53.
pub(crate) fn capped_cost(cost: u64) -> u64 {
    cost.min(crate::quota::MAX_COUNT + 1)
}

/// The decision script's argument before its tiers: doubles now_us and cost, and the
/// algorithm's byte.
pub(crate) const ARGS_HEADER: usize = 17;

/// One quota packed (doubles limit, period_us, burst): a tier of the script's argument, and of
/// an override in the controls.
pub(crate) const QUOTA_BYTES: usize = 24;

/// Writes a quota's doubles limit, period_us, burst at `at`; returns the end.
pub(crate) fn put_quota(bytes: &mut [u8], at: usize, quota: &Quota) -> usize {
    bytes[at..at + 8].copy_from_slice(&exact(quota.limit()).to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&exact(quota.period_micros()).to_le_bytes());
    bytes[at + 16..at + 24].copy_from_slice(&exact(quota.burst()).to_le_bytes());
    at + QUOTA_BYTES
}

/// The key of the sliding log's controls: `<key>#m` (no storage key holds a `#` after its
/// hash tag, so it is nobody else's).
pub(crate) fn log_controls_key(key: &str) -> String {
    let mut controls = String::with_capacity(key.len() + 2);
    controls.push_str(key);
    controls.push_str("#m");
    controls
}

/// The suffix of a tenant's key: no storage key ends its hash tag with `}#` (a scope follows
/// `}:`), so the tenant's controls are nobody else's.
const TENANT_SUFFIX: &str = "#t";

/// The unscoped storage key of `key`'s tenant, `<prefix>:{<id>}`: what every storage key of
/// the tenant starts with (its scopes', and its controls' `<prefix>:{<id>}#t`). A key without
/// a hash tag is its own tenant.
pub(crate) fn tenant_route(key: &str) -> &str {
    key.find('}').map_or(key, |close| &key[..=close])
}

/// The key of the tenant's controls (a suspension, an override of every route, a reset of every
/// route) for a storage key: its hash tag and `#t`, `<prefix>:{<id>}#t`, in the same Cluster
/// slot as every route of the tenant. A key without a hash tag gets its whole self as the tag
/// (`{<key>}#t`), which hashes to the same slot.
pub(crate) fn tenant_key(key: &str) -> String {
    tenant_key_parts(key).concat()
}

/// [`tenant_key`] in the pieces it is made of, in order: so that a command writes it as one
/// argument without building it first.
pub(crate) fn tenant_key_parts(key: &str) -> [&str; 4] {
    if is_tenant_key(key) {
        return [key, "", "", ""];
    }
    let tagged = key.find('{').and_then(|open| {
        let close = open + 1 + key[open + 1..].find('}')?;
        (close > open + 1).then_some(close)
    });
    match tagged {
        Some(close) => [&key[..=close], TENANT_SUFFIX, "", ""],
        None => ["{", key, "}", TENANT_SUFFIX],
    }
}

/// Appends [`tenant_key`] of `key` to `cmd` as one argument, written in place.
pub(crate) fn push_tenant_key(cmd: &mut redis::Cmd, key: &str) {
    use redis::RedisWrite;
    use std::io::Write;
    let mut arg = cmd.writer_for_next_arg();
    for part in tenant_key_parts(key) {
        // Writing into the command's own buffer cannot fail.
        let _ = arg.write_all(part.as_bytes());
    }
}

/// Whether `key` is a tenant's key ([`tenant_key`]).
pub(crate) fn is_tenant_key(key: &str) -> bool {
    key.ends_with("}#t")
}

/// A fleet control (`lua/control.lua`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Op<'a> {
    SetQuota(&'a [Quota]),
    ClearQuota,
    /// µs: the suspension ends then, whatever it was.
    Suspend(u64),
    /// µs: the suspension ends then at the earliest (it only ever extends).
    Extend(u64),
    Resume,
    Reset,
    Inspect,
    /// Learning's override, lasting µs: set with its record, unless an operator's is in force.
    Learn(&'a [Quota], u64),
    /// Clears the override when it is learned, and its record.
    Unlearn,
}

impl<'a> Control<'a> {
    /// The operation the scripts (and their mirror) run: durations in whole µs, at least 1.
    pub(crate) fn op(self) -> Op<'a> {
        match self {
            Control::SetQuota(quotas) => Op::SetQuota(quotas.as_slice()),
            Control::ClearQuota => Op::ClearQuota,
            Control::Suspend(duration) => Op::Suspend(micros(duration)),
            Control::Extend(duration) => Op::Extend(micros(duration)),
            Control::Resume => Op::Resume,
            Control::Reset => Op::Reset,
            Control::Inspect => Op::Inspect,
            Control::Learn(quotas, duration) => Op::Learn(quotas.as_slice(), micros(duration)),
            Control::Unlearn => Op::Unlearn,
        }
    }
}

impl Op<'_> {
    /// Whether this control is the tenant's (every route's): when `key` is the tenant's key.
    pub(crate) fn is_tenant(&self, key: &str) -> bool {
        is_tenant_key(key)
    }

    /// Whether this control reads or writes a route's learning record ([`learned_record_key`]).
    pub(crate) fn uses_record(&self) -> bool {
        matches!(
            self,
            Op::SetQuota(_) | Op::ClearQuota | Op::Learn(..) | Op::Unlearn | Op::Inspect
        )
    }
}

/// The suffix of a route's learning record: `#l` after the route's key. No route ends so (a
/// scope holding a `#` is stored hashed, `#` and hex digits), and no other key a store derives
/// does (`#t` the tenant's controls, `#b` its offences, `#m` the sliding log's controls, `#c`
/// a concurrency limit's slots).
pub(crate) const RECORD_SUFFIX: &str = "#l";

/// The key of a route's learning record: the route's key and `#l` (`<prefix>:{<id>}#l`,
/// `<prefix>:{<id>}:<scope>#l`), in the route's hash tag; the same for every algorithm (the
/// sliding log's controls are `<key>#m`, its record `<key>#l`). It holds the override learning
/// set, which tells it from an operator's (see `lua/control.lua`). `None` for a key without a
/// hash tag, or with something else than a scope after it (a tenant's key, a derived key).
pub(crate) fn learned_record_key(route: &str) -> Option<String> {
    let open = route.find('{')?;
    let close = open + 1 + route[open + 1..].find('}')?;
    match &route[close + 1..] {
        "" => {}
        scoped if scoped.starts_with(':') && !scoped.contains('#') => {}
        scoped if scoped.starts_with(':') && is_hashed_scope(&scoped[1..]) => {}
        _ => return None,
    }
    let mut record = String::with_capacity(route.len() + RECORD_SUFFIX.len());
    record.push_str(route);
    record.push_str(RECORD_SUFFIX);
    Some(record)
}

/// Whether a scope's id is a hashed one: `#` and 64 lower-case hex digits (see
/// `crate::key::scope_id`).
fn is_hashed_scope(id: &str) -> bool {
    id.len() == 65
        && id.starts_with('#')
        && id[1..]
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The reply of a decision, packed into one string (see [`Reply::from_redis`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reply {
    pub allowed: bool,
    pub suspended: bool,
    /// The binding tier's position (from 0) among the quotas in force.
    pub tier: usize,
    /// When an override decided: its binding quota as numbers (limit, period_us, burst).
    pub overridden: Option<(u64, u64, u64)>,
    pub remaining: u64,
    pub retry_after_ms: i64,
    pub reset_after_ms: i64,
}

impl Reply {
    /// The decision, under the caller's `quotas` (the binding one named by position), or an
    /// override's; `None` when the reply names no valid quota.
    pub(crate) fn into_decision(self, quotas: &[Quota]) -> Option<Decision> {
        let quota = match self.overridden {
            Some((limit, period_us, burst)) => Quota::from_micros(limit, period_us, burst).ok()?,
            None => *quotas.get(self.tier)?,
        };
        Some(Decision {
            allowed: self.allowed,
            limit: quota.limit(),
            remaining: self.remaining,
            retry_after: if self.retry_after_ms < 0 {
                Decision::NEVER
            } else {
                Duration::from_millis(self.retry_after_ms as u64)
            },
            reset_after: Duration::from_millis(self.reset_after_ms.max(0) as u64),
            suspended: self.suspended,
            quota,
            overridden: self.overridden.is_some(),
        })
    }
}

pub(crate) fn f64_at(bytes: &[u8], at: usize) -> f64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    f64::from_le_bytes(b)
}

/// A tier's numbers, as the script reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tier {
    pub limit: f64,
    pub period: f64,
    pub burst: f64,
}

impl Tier {
    pub(crate) fn of(quota: &Quota) -> Tier {
        Tier {
            limit: exact(quota.limit()),
            period: exact(quota.period_micros()),
            burst: exact(quota.burst()),
        }
    }

    pub(crate) fn at(bytes: &[u8], at: usize) -> Tier {
        Tier {
            limit: f64_at(bytes, at),
            period: f64_at(bytes, at + 8),
            burst: f64_at(bytes, at + 16),
        }
    }

    pub(crate) fn valid(&self) -> bool {
        let ok = |v: f64| (1.0..MAX_EXACT).contains(&v) && v.fract() == 0.0;
        ok(self.limit) && ok(self.period) && ok(self.burst)
    }
}

/// A stored reset time (a tenant's reset, or the one a route's states were written under):
/// bytes that are no time from 0 to `MAX_EXACT` (corrupt, or where one more µs would not be
/// later) read as none, 0, as the scripts read them.
pub(crate) fn reset_time(us: f64) -> f64 {
    if (0.0..MAX_EXACT).contains(&us) {
        us
    } else {
        0.0
    }
}

/// The controls at the start of a key's string, as the scripts parse them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Controls<'a> {
    /// The string does not start with controls: the states begin at its first byte.
    None,
    /// Controls of `len` bytes: a suspension until `until_us` (0: none) and the override's
    /// tiers (`n` of them, from byte 10).
    Some {
        until_us: f64,
        n: usize,
        bytes: &'a [u8],
    },
    /// It starts like controls but is cut short: the whole string reads as absent.
    Corrupt,
}

impl<'a> Controls<'a> {
    pub(crate) fn parse(s: &'a [u8]) -> Self {
        if s.first() != Some(&CONTROLS) {
            return Controls::None;
        }
        match s.get(CONTROLS_HEAD - 1) {
            Some(&n) if usize::from(n) <= MAX_TIERS && s.len() >= Self::len(usize::from(n)) => {
                let n = usize::from(n);
                Controls::Some {
                    until_us: f64_at(s, 1),
                    n,
                    bytes: &s[..Self::len(n)],
                }
            }
            _ => Controls::Corrupt,
        }
    }

    /// The length of controls with `n` override tiers.
    pub(crate) const fn len(n: usize) -> usize {
        CONTROLS_HEAD + QUOTA_BYTES * n
    }

    /// In a route's string whose controls take `len` bytes: the tenant's reset its states
    /// were written under ([`STAMP`] and a double; 0 when none), and where its states begin.
    pub(crate) fn stamp(s: &[u8], len: usize) -> (f64, usize) {
        if s.get(len) == Some(&STAMP) && s.len() >= len + 9 {
            (reset_time(f64_at(s, len + 1)), len + 9)
        } else {
            (0.0, len)
        }
    }

    /// In a tenant's string whose controls take `len` bytes: its last reset (the double after
    /// them; 0 when none).
    pub(crate) fn tenant_reset(t: &[u8], len: usize) -> f64 {
        if t.len() >= len + 8 {
            reset_time(f64_at(t, len))
        } else {
            0.0
        }
    }

    /// The override's tier `i` (from 0): its limit, period_us, burst.
    pub(crate) fn tier(&self, i: usize) -> Option<Tier> {
        match *self {
            Controls::Some { n, bytes, .. } if i < n => Some(Tier::at(bytes, Self::len(i))),
            _ => None,
        }
    }

    /// The override's quotas (empty when none, or when one does not make a valid quota).
    pub(crate) fn override_quotas(&self) -> Vec<Quota> {
        let Controls::Some { n, bytes, .. } = *self else {
            return Vec::new();
        };
        (0..n)
            .map(|i| Tier::at(bytes, Self::len(i)))
            .map(|t| Quota::from_micros(t.limit as u64, t.period as u64, t.burst as u64))
            .collect::<Result<_, _>>()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_keys_share_the_slot_of_every_route() {
        assert_eq!(tenant_key("redlimit:{k1}:api"), "redlimit:{k1}#t");
        assert_eq!(tenant_key("redlimit:{k1}"), "redlimit:{k1}#t");
        assert_eq!(tenant_key("redlimit:{k1}#t"), "redlimit:{k1}#t");
        // No hash tag: the whole key becomes it.
        assert_eq!(tenant_key("plain"), "{plain}#t");
        assert_eq!(tenant_key("a{}b"), "{a{}b}#t");
        // Written into a command in place, it is the same argument.
        for key in ["redlimit:{k1}:api", "redlimit:{k1}#t", "plain", "a{}b", ""] {
            let mut cmd = redis::cmd("X");
            push_tenant_key(&mut cmd, key);
            let arg = cmd.args_iter().nth(1);
            assert!(
                matches!(arg, Some(redis::Arg::Simple(bytes)) if bytes == tenant_key(key).as_bytes()),
                "{key:?}"
            );
        }
        assert!(is_tenant_key(&tenant_key("x:{y}:z")));
        assert!(!is_tenant_key("redlimit:{k1}:api"));
    }
}
