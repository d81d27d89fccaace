//! The driver: what the script is told, what it answers, and its Rust mirror (`lua/common.lua`
//! for decisions, `lua/control.lua` for the fleet controls) that the memory store runs.
//!
//! Everything of one storage key lives in one string: the optional controls (an override of
//! the quotas, a suspension), then every tier's state (see `lua/common.lua`). The sliding log
//! keeps its sorted set next to it, under `<key>`, and its controls under `<key>#m`.

use std::time::Duration;

use super::{ms_up, sliding_log, Algorithm, Args, Packed, PackedStep, MAX_EXACT};
use crate::decision::Decision;
use crate::quota::{Quota, MAX_TIERS};

/// An override lives until no request was admitted on its key for this long: 30 days
/// (`OVERRIDE_IDLE_MS` in the scripts).
pub(crate) const OVERRIDE_IDLE_MS: u64 = 30 * 24 * 3600 * 1000;

/// The longest time a reply carries (`MAX_REPLY_MS` in `lua/common.lua`): 2^62 ms.
pub(crate) const MAX_REPLY_MS: i64 = 1 << 62;

/// The longest expiry: 2^53 ms, 285 000 years.
const MAX_TTL_MS: i64 = 1 << 53;

/// The tag byte of the controls at the start of a key's string.
const CONTROLS: u8 = b'M';

/// The tag of the tenant's reset a route's states were written under (after its controls).
pub(crate) const STAMP: u8 = b'E';

/// The longest argument: now, cost, the algorithm, and 8 tiers.
const MAX_ARGS: usize = 17 + 24 * MAX_TIERS;

/// A number Lua holds exactly, or NaN, which the scripts refuse by name.
fn exact(v: u64) -> f64 {
    if (v as f64) < MAX_EXACT {
        v as f64
    } else {
        f64::NAN
    }
}

/// The decision script's one argument: `'<ddB' .. n * '<ddd'` (see `lua/common.lua`).
pub(crate) struct PackedArgs {
    len: usize,
    bytes: [u8; MAX_ARGS],
}

impl PackedArgs {
    pub(crate) fn new(
        algorithm: Algorithm,
        quotas: &[Quota],
        cost: u64,
        now_micros: Option<u64>,
    ) -> Self {
        let quotas = &quotas[..quotas.len().min(MAX_TIERS)];
        let now = now_micros.map_or(-1.0, exact);
        let cost = exact(capped_cost(cost));
        let mut bytes = [0; MAX_ARGS];
        bytes[0..8].copy_from_slice(&now.to_le_bytes());
        bytes[8..16].copy_from_slice(&cost.to_le_bytes());
        bytes[16] = algorithm.tag();
        let mut at = 17;
        for quota in quotas {
            at = put_quota(&mut bytes, at, quota);
        }
        PackedArgs { len: at, bytes }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Any cost above the largest burst a quota can have is never allowed, whatever the quotas in
/// force (an override may have a larger burst than the caller's): capped there, so Lua stays
/// below 2^53.
pub(crate) fn capped_cost(cost: u64) -> u64 {
    cost.min(crate::quota::MAX_COUNT + 1)
}

/// Writes a quota's doubles limit, period_us, burst at `at`; returns the end.
fn put_quota(bytes: &mut [u8], at: usize, quota: &Quota) -> usize {
    bytes[at..at + 8].copy_from_slice(&exact(quota.limit()).to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&exact(quota.period_micros()).to_le_bytes());
    bytes[at + 16..at + 24].copy_from_slice(&exact(quota.burst()).to_le_bytes());
    at + 24
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

/// The key of the tenant's controls (a suspension, an override of every route, a reset of every
/// route) for a storage key: its hash tag and `#t`, `<prefix>:{<id>}#t`, in the same Cluster
/// slot as every route of the tenant. A key without a hash tag gets its whole self as the tag
/// (`{<key>}#t`), which hashes to the same slot.
pub(crate) fn tenant_key(key: &str) -> String {
    if is_tenant_key(key) {
        return key.to_owned();
    }
    let tagged = key.find('{').and_then(|open| {
        let close = open + 1 + key[open + 1..].find('}')?;
        (close > open + 1).then_some(close)
    });
    match tagged {
        Some(close) => {
            let mut tenant = String::with_capacity(close + 3);
            tenant.push_str(&key[..=close]);
            tenant.push_str(TENANT_SUFFIX);
            tenant
        }
        None => format!("{{{key}}}{TENANT_SUFFIX}"),
    }
}

/// Whether `key` is a tenant's key ([`tenant_key`]).
pub(crate) fn is_tenant_key(key: &str) -> bool {
    key.ends_with("}#t")
}

/// Appends one decision's `numkeys`, `KEYS` and `ARGV` to an `EVALSHA` or `EVAL` command whose
/// first argument (the SHA-1 or the body) is already in place: the storage `key` (for the
/// sliding log, its controls' key, then its sorted set), the tenant's key, then the
/// `algorithm`, its `quotas`, the `cost`, and the client's clock in µs (`None`: Redis `TIME`).
pub(crate) fn push_call(
    cmd: &mut redis::Cmd,
    key: &str,
    algorithm: Algorithm,
    quotas: &[Quota],
    cost: u64,
    now_micros: Option<u64>,
) {
    let args = PackedArgs::new(algorithm, quotas, cost, now_micros);
    if algorithm == Algorithm::SlidingLog {
        cmd.arg(3)
            .arg(log_controls_key(key))
            .arg(key)
            .arg(tenant_key(key));
    } else {
        cmd.arg(2).arg(key).arg(tenant_key(key));
    }
    cmd.arg(args.as_bytes());
}

/// Appends the split form of a decision (`lua/common.lua`'s header, "Split"), which a Cluster
/// slot migration needs: the state's key alone (for the sliding log its sorted set), then the
/// arguments of [`push_call`] and `extras`, the other keys' strings as the caller read them
/// (the tenant's, then for the sliding log its controls'; empty for an absent key).
pub(crate) fn push_split_call(
    cmd: &mut redis::Cmd,
    key: &str,
    algorithm: Algorithm,
    quotas: &[Quota],
    cost: u64,
    now_micros: Option<u64>,
    extras: &[Vec<u8>],
) {
    let args = PackedArgs::new(algorithm, quotas, cost, now_micros);
    cmd.arg(1).arg(key).arg(args.as_bytes());
    for extra in extras {
        cmd.arg(extra.as_slice());
    }
}

/// The keys a decision reads besides its state, in the order of [`push_split_call`]'s
/// `extras`: the tenant's, then for the sliding log its controls'.
pub(crate) fn split_keys(key: &str, algorithm: Algorithm) -> Vec<String> {
    if algorithm == Algorithm::SlidingLog {
        vec![tenant_key(key), log_controls_key(key)]
    } else {
        vec![tenant_key(key)]
    }
}

/// Appends a fleet control's `numkeys`, `KEYS` and `ARGV` (see `lua/control.lua`), as
/// [`push_call`] does for a decision: a tenant's control (`key` a [`tenant_key`]) names the
/// tenant's key only; a route's names the route's string, and for the
/// sliding log its controls' string then its sorted set.
pub(crate) fn push_control(
    cmd: &mut redis::Cmd,
    key: &str,
    algorithm: Algorithm,
    op: Op<'_>,
    now_micros: Option<u64>,
) {
    if op.is_tenant(key) {
        cmd.arg(1).arg(tenant_key(key));
        cmd.arg(control_args(op, 0, now_micros));
    } else if algorithm == Algorithm::SlidingLog {
        cmd.arg(2).arg(log_controls_key(key)).arg(key);
        cmd.arg(control_args(op, algorithm.tag(), now_micros));
    } else {
        cmd.arg(1).arg(key);
        cmd.arg(control_args(op, algorithm.tag(), now_micros));
    }
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
}

impl Op<'_> {
    /// Whether this control is the tenant's (every route's): when `key` is the tenant's key.
    pub(crate) fn is_tenant(&self, key: &str) -> bool {
        is_tenant_key(key)
    }
}

/// The control script's one argument: `'<dBB'` now_us, the operation's byte and the algorithm's
/// tag (0 for the tenant's key), then its operand.
fn control_args(op: Op<'_>, algorithm: u8, now_micros: Option<u64>) -> Vec<u8> {
    let mut bytes = vec![0; 10];
    bytes[0..8].copy_from_slice(&now_micros.map_or(-1.0, exact).to_le_bytes());
    bytes[8] = match op {
        Op::SetQuota(_) => b'q',
        Op::ClearQuota => b'c',
        Op::Suspend(_) => b's',
        Op::Extend(_) => b'e',
        Op::Resume => b'r',
        Op::Reset => b'x',
        Op::Inspect => b'i',
    };
    bytes[9] = algorithm;
    match op {
        Op::SetQuota(quotas) => {
            bytes.push(quotas.len() as u8);
            let at = bytes.len();
            bytes.resize(at + 24 * quotas.len(), 0);
            let mut at = at;
            for quota in quotas {
                at = put_quota(&mut bytes, at, quota);
            }
        }
        Op::Suspend(micros) | Op::Extend(micros) => {
            bytes.extend_from_slice(&exact(micros).to_le_bytes())
        }
        _ => {}
    }
    bytes
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
    /// One tier's reply from µs: times become whole ms, rounded up.
    #[cfg(test)]
    pub(crate) fn new(
        allowed: bool,
        _args: &Args,
        remaining: f64,
        retry_us: f64,
        reset_us: f64,
    ) -> Self {
        Reply {
            allowed,
            suspended: false,
            tier: 0,
            overridden: None,
            remaining: remaining as u64,
            retry_after_ms: if retry_us >= 0.0 {
                ms_up(retry_us).min(MAX_REPLY_MS)
            } else {
                -1
            },
            reset_after_ms: ms_up(reset_us).min(MAX_REPLY_MS),
        }
    }

    /// Parses an admission under the caller's one quota, which the script replies as one
    /// integer, `reset_after_ms * (burst + 1) + remaining` (see `lua/common.lua`). `None` when
    /// the caller sent more than one quota or the integer is negative.
    pub(crate) fn from_admission(both: i64, quotas: &[Quota]) -> Option<Self> {
        let [quota] = quotas else {
            return None;
        };
        let both = u64::try_from(both).ok()?;
        let radix = quota.burst() + 1;
        Some(Reply {
            allowed: true,
            suspended: false,
            tier: 0,
            overridden: None,
            remaining: both % radix,
            retry_after_ms: 0,
            reset_after_ms: i64::try_from(both / radix).ok()?,
        })
    }

    /// Parses a script's reply: one string packed `'<BBddd'` (flags: 1 allowed, 2 suspended,
    /// 4 an override decided; the binding tier's position from 1; remaining, retry_after_ms
    /// with -1 for never, reset_after_ms), followed with flag 4 by `'<ddd'` (the override
    /// tier's limit, period_us, burst); every number an integer. Anything else is `None`.
    pub(crate) fn from_redis(reply: &[u8]) -> Option<Self> {
        let [flags, tier, rest @ ..] = reply else {
            return None;
        };
        let overridden = flags & 4 == 4;
        if rest.len() != if overridden { 48 } else { 24 } || *flags > 7 || *tier == 0 {
            return None;
        }
        let v = |i: usize| {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&rest[8 * i..8 * i + 8]);
            let v = f64::from_le_bytes(bytes);
            // Integers inside an i64 (NaN fails the range).
            ((-1.0..=MAX_REPLY_MS as f64).contains(&v) && v.fract() == 0.0).then_some(v as i64)
        };
        let unsigned = |i: usize| v(i).and_then(|v| u64::try_from(v).ok());
        Some(Reply {
            allowed: flags & 1 == 1,
            suspended: flags & 2 == 2,
            tier: usize::from(*tier) - 1,
            overridden: if overridden {
                Some((unsigned(3)?, unsigned(4)?, unsigned(5)?))
            } else {
                None
            },
            remaining: unsigned(0)?,
            retry_after_ms: v(1)?,
            reset_after_ms: unsigned(2)? as i64,
        })
    }

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

/// The TTL of a key whose state is fresh again `reset_us` from now.
#[cfg(test)]
pub(crate) fn ttl_ms(reset_us: f64) -> u64 {
    ms_up(reset_us).clamp(1, MAX_TTL_MS) as u64
}

fn f64_at(bytes: &[u8], at: usize) -> f64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    f64::from_le_bytes(b)
}

/// A tier's numbers, as the script reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tier {
    limit: f64,
    period: f64,
    burst: f64,
}

impl Tier {
    fn of(quota: &Quota) -> Tier {
        Tier {
            limit: exact(quota.limit()),
            period: exact(quota.period_micros()),
            burst: exact(quota.burst()),
        }
    }

    fn at(bytes: &[u8], at: usize) -> Tier {
        Tier {
            limit: f64_at(bytes, at),
            period: f64_at(bytes, at + 8),
            burst: f64_at(bytes, at + 16),
        }
    }

    fn valid(&self) -> bool {
        let ok = |v: f64| (1.0..MAX_EXACT).contains(&v) && v.fract() == 0.0;
        ok(self.limit) && ok(self.period) && ok(self.burst)
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
        match s.get(9) {
            Some(&n) if usize::from(n) <= MAX_TIERS && s.len() >= 10 + 24 * usize::from(n) => {
                let n = usize::from(n);
                Controls::Some {
                    until_us: f64_at(s, 1),
                    n,
                    bytes: &s[..10 + 24 * n],
                }
            }
            _ => Controls::Corrupt,
        }
    }

    /// The override's quotas (empty when none, or when one does not make a valid quota).
    pub(crate) fn override_quotas(&self) -> Vec<Quota> {
        let Controls::Some { n, bytes, .. } = *self else {
            return Vec::new();
        };
        (0..n)
            .map(|i| Tier::at(bytes, 10 + 24 * i))
            .map(|t| Quota::from_micros(t.limit as u64, t.period as u64, t.burst as u64))
            .collect::<Result<_, _>>()
            .unwrap_or_default()
    }
}

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
    overridden: Option<Vec<Tier>>,
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

/// A route's string and its tenant's controls opened, as the opening of `lua/common.lua` reads
/// them.
struct Opened<'a> {
    /// The tiers in force: the route's override, else the tenant's, else the caller's.
    tiers: Vec<Tier>,
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

/// The tenant's reset, when its string carries one after its controls.
fn tenant_reset(tenant: &[u8], controls_len: usize) -> f64 {
    if tenant.len() >= controls_len + 8 {
        f64_at(tenant, controls_len)
    } else {
        0.0
    }
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

/// Opens `stored` (the route's string) under `tenant` (the tenant's string), or answers the
/// suspended reply. Mirrors the opening of `lua/common.lua`.
fn open<'a>(
    stored: Option<&'a [u8]>,
    tenant: Option<&'a [u8]>,
    now: f64,
    quotas: &[Quota],
) -> Result<Opened<'a>, Reply> {
    let mut tiers: Vec<Tier> = quotas.iter().take(MAX_TIERS).map(Tier::of).collect();
    let mut overridden = false;
    let mut reset_us = 0.0;
    if let Some(Controls::Some { until_us, n, bytes }) = tenant.map(Controls::parse) {
        if until_us > now {
            let left = reply_ms(until_us - now);
            return Err(Reply {
                allowed: false,
                suspended: true,
                tier: 0,
                overridden: (n > 0).then(|| {
                    let first = Tier::at(bytes, 10);
                    (first.limit as u64, first.period as u64, first.burst as u64)
                }),
                remaining: 0,
                retry_after_ms: left,
                reset_after_ms: left,
            });
        }
        if n > 0 {
            tiers = (0..n).map(|i| Tier::at(bytes, 10 + 24 * i)).collect();
            overridden = true;
        }
        reset_us = tenant_reset(tenant.unwrap_or_default(), bytes.len());
    }
    let (mut head, mut route_override, mut stamp, mut states, mut bare) =
        (None, false, 0.0, stored, true);
    if let Some(s) = stored.filter(|s| s.len() != 17 && s.len() != 25) {
        match Controls::parse(s) {
            Controls::None => {}
            Controls::Corrupt => states = None,
            Controls::Some { until_us, n, bytes } => {
                if until_us > now {
                    let left = reply_ms(until_us - now);
                    let first = if n > 0 {
                        Some(Tier::at(bytes, 10))
                    } else {
                        overridden.then(|| tiers[0])
                    };
                    return Err(Reply {
                        allowed: false,
                        suspended: true,
                        tier: 0,
                        overridden: first
                            .map(|t| (t.limit as u64, t.period as u64, t.burst as u64)),
                        remaining: 0,
                        retry_after_ms: left,
                        reset_after_ms: left,
                    });
                }
                if n > 0 {
                    tiers = (0..n).map(|i| Tier::at(bytes, 10 + 24 * i)).collect();
                    overridden = true;
                    route_override = true;
                    head = Some(bytes.to_vec());
                }
                let mut at = bytes.len();
                if s.get(at) == Some(&STAMP) && s.len() >= at + 9 {
                    stamp = f64_at(s, at + 1);
                    at += 9;
                }
                states = Some(&s[at..]);
                bare = false;
            }
        }
    }
    let mut stale = false;
    if reset_us > 0.0 {
        if stamp < reset_us {
            stale = true;
            states = None;
        }
        let mut new = head.unwrap_or_else(|| {
            let mut bare = vec![CONTROLS];
            bare.extend_from_slice(&[0; 9]);
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
    let plain = opened.bare && opened.head.is_none() && !opened.overridden && tiers.len() == 1;
    let s = opened.states;
    let mut at = 0;
    let mut gather = Gather::new();
    gather.overridden = opened.overridden.then(|| tiers.clone());
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
                let len = match tag {
                    0 => 1,
                    b'w' => 25,
                    _ => 17,
                };
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
    gather.overridden = opened.overridden.then(|| tiers.clone());
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
        Controls::Some { bytes, .. } if stored.len() != 17 && stored.len() != 25 => {
            &stored[bytes.len()..]
        }
        Controls::Corrupt if stored.len() != 17 && stored.len() != 25 => &[],
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
        at += if tag == b'w' { 25 } else { 17 };
    }
    None
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
            } if s.len() != 17 && s.len() != 25 => {
                until_us = until;
                override_bytes = bytes[9..].to_vec();
                rest = &s[bytes.len()..];
            }
            Controls::Corrupt if s.len() != 17 && s.len() != 25 => {}
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
        Op::Inspect => return None,
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
            let last = if reset_us.is_nan() { 0.0 } else { reset_us };
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
    Some((Some(new), ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_arguments_and_reply() {
        let quota = Quota::per_minute(10).unwrap();
        let args = PackedArgs::new(Algorithm::Gcra, &[quota], u64::MAX, None);
        let args = args.as_bytes();
        assert_eq!(args.len(), 17 + 24);
        let f = |i: usize| f64_at(args, i);
        // Server clock, a cost capped above any burst, the algorithm, then the tier.
        assert_eq!((f(0), f(8), args[16]), (-1.0, 1e15 + 1.0, b'g'));
        assert_eq!((f(17), f(25), f(33)), (10.0, 60e6, 10.0));
        // A client time Lua cannot hold exactly is refused by the script, not rounded.
        let late = PackedArgs::new(Algorithm::Gcra, &[quota], 1, Some(1 << 53));
        assert!(f64_at(late.as_bytes(), 0).is_nan());

        let reply = |flags: u8, tier: u8, v: &[f64]| -> Vec<u8> {
            let mut r = vec![flags, tier];
            r.extend(v.iter().flat_map(|v| v.to_le_bytes()));
            r
        };
        let ok = Reply::from_redis(&reply(1, 1, &[9.0, 0.0, 6000.0])).unwrap();
        assert!(ok.allowed && !ok.suspended);
        assert_eq!(
            (ok.tier, ok.remaining, ok.retry_after_ms, ok.reset_after_ms),
            (0, 9, 0, 6000)
        );
        assert_eq!(ok.into_decision(&[quota]).unwrap().quota, quota);
        // The second of two tiers.
        let second = Quota::per_hour(100).unwrap();
        let ok = Reply::from_redis(&reply(1, 2, &[9.0, 0.0, 6000.0])).unwrap();
        assert_eq!(ok.into_decision(&[quota, second]).unwrap().quota, second);
        // A position beyond the caller's tiers is no decision.
        assert_eq!(ok.into_decision(&[quota]), None);
        let never = Reply::from_redis(&reply(0, 1, &[0.0, -1.0, 1.0])).unwrap();
        assert!(!never.allowed && never.retry_after_ms == -1);
        let suspended = Reply::from_redis(&reply(2, 1, &[0.0, 5.0, 5.0])).unwrap();
        assert!(suspended.suspended && !suspended.allowed);
        // An override's quota comes with the reply.
        let overridden =
            Reply::from_redis(&reply(5, 1, &[9.0, 0.0, 6000.0, 3.0, 60e6, 3.0])).unwrap();
        let decision = overridden.into_decision(&[second]).unwrap();
        assert_eq!(decision.quota, Quota::per_minute(3).unwrap());
        assert_eq!(decision.limit, 3);
        // Anything else is a bad reply, never a made-up decision.
        for bad in [
            reply(8, 1, &[9.0, 0.0, 1.0]),
            reply(1, 0, &[9.0, 0.0, 1.0]),
            reply(1, 1, &[0.5, 0.0, 1.0]),
            reply(1, 1, &[9.0, f64::NAN, 1.0]),
            reply(1, 1, &[9.0, 0.0, -1.0]),
            reply(1, 1, &[9.0, 0.0, 1e300]),
            reply(1, 1, &[9.0, 0.0]),
            reply(5, 1, &[9.0, 0.0, 1.0]),
            reply(1, 1, &[9.0, 0.0, 1.0, 3.0, 60e6, 3.0]),
            Vec::new(),
        ] {
            assert_eq!(Reply::from_redis(&bad), None, "{bad:?}");
        }
        // An admission under one quota as one integer: reset 6000 ms, 9 left of a burst of 10.
        let ok = Reply::from_admission(6000 * 11 + 9, &[quota]).unwrap();
        assert_eq!(
            ok,
            Reply::from_redis(&reply(1, 1, &[9.0, 0.0, 6000.0])).unwrap()
        );
        let full = Reply::from_admission(10, &[quota]).unwrap();
        assert_eq!((full.remaining, full.reset_after_ms), (10, 0));
        // Only for one quota, never negative.
        assert_eq!(Reply::from_admission(9, &[quota, second]), None);
        assert_eq!(Reply::from_admission(-1, &[quota]), None);
        // A reply naming no valid quota is no decision.
        let zero = Reply::from_redis(&reply(5, 1, &[9.0, 0.0, 1.0, 0.0, 60e6, 3.0])).unwrap();
        assert_eq!(zero.into_decision(&[quota]), None);
    }

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
    fn tenant_keys_share_the_slot_of_every_route() {
        assert_eq!(tenant_key("redlimit:{k1}:api"), "redlimit:{k1}#t");
        assert_eq!(tenant_key("redlimit:{k1}"), "redlimit:{k1}#t");
        assert_eq!(tenant_key("redlimit:{k1}#t"), "redlimit:{k1}#t");
        // No hash tag: the whole key becomes it.
        assert_eq!(tenant_key("plain"), "{plain}#t");
        assert_eq!(tenant_key("a{}b"), "{a{}b}#t");
        assert!(is_tenant_key(&tenant_key("x:{y}:z")));
        assert!(!is_tenant_key("redlimit:{k1}:api"));
    }

    #[test]
    fn the_split_form_names_the_state_key_alone() {
        let quota = Quota::per_second(10).unwrap();
        let args = |cmd: &redis::Cmd| -> Vec<Vec<u8>> {
            cmd.args_iter()
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => bytes.to_vec(),
                    _ => Vec::new(),
                })
                .collect()
        };
        let packed = PackedArgs::new(Algorithm::SlidingLog, &[quota], 1, Some(7));
        let extras = [b"tenant".to_vec(), Vec::new()];
        let mut cmd = redis::cmd("EVALSHA");
        push_split_call(
            &mut cmd,
            "p:{k}",
            Algorithm::SlidingLog,
            &[quota],
            1,
            Some(7),
            &extras,
        );
        let expected: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            b"1".to_vec(),
            b"p:{k}".to_vec(),
            packed.as_bytes().to_vec(),
            b"tenant".to_vec(),
            Vec::new(),
        ];
        assert_eq!(args(&cmd), expected);
        assert_eq!(
            split_keys("p:{k}", Algorithm::SlidingLog),
            ["p:{k}#t", "p:{k}#m"]
        );
        assert_eq!(split_keys("p:{k}", Algorithm::Gcra), ["p:{k}#t"]);
    }

    #[test]
    fn a_suspension_far_ahead_gives_a_readable_reply() {
        // A tenant suspended until 1e300 µs: the reply's times are capped, never unreadable.
        let mut tenant = vec![CONTROLS];
        tenant.extend_from_slice(&1e300f64.to_le_bytes());
        tenant.push(0);
        let quota = Quota::per_minute(10).unwrap();
        let step = match Algorithm::TokenBucket.kind() {
            super::super::Kind::Packed(step) => step,
            super::super::Kind::Log => unreachable!(),
        };
        let (reply, write) = decide(step, None, Some(&tenant), 1e6, 1.0, &[quota]).unwrap();
        assert!(reply.suspended && !reply.allowed && write.is_none());
        assert_eq!(reply.retry_after_ms, MAX_REPLY_MS);
        // The same on the route's own controls.
        let (reply, _) = decide(step, Some(&tenant), None, 1e6, 1.0, &[quota]).unwrap();
        assert_eq!(reply.retry_after_ms, MAX_REPLY_MS);
    }
}
