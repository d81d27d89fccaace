//! Settlement's refund (`lua/refund.lua`): its script, keys, packed argument and reply, and its
//! Rust mirror, step for step over the same bytes, which the memory store runs under the key's
//! shard lock.
//!
//! Gives units back to every tier of one route, never above a tier's capacity, and only to the
//! window they were reserved in (the script's header states the rule per algorithm).

use std::future::Future;
use std::sync::PoisonError;

use super::StoreOp;
use crate::algorithm::{is_one_state, lua_mod, packed_by_tag, sliding_log, state_len_of, Refund};
use crate::clock::system_now_micros;
use crate::quota::Quota;
use crate::store::contract::OperationRequest;
use crate::store::contract::StoreError;
use crate::store::memory::shard::{KeyState, Stored};
use crate::store::memory::{positive, time, MemoryStore};
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::redis::RedisStore;
use crate::store::refund::{RefundRequest, ReservedAt};
use crate::store::wire::layout::{capped_cost, exact, log_controls_key, tenant_key, Controls};
use crate::store::wire::scripts::REFUND_SOURCE;

/// The refund script.
pub(crate) static REFUND: Script = Script {
    id: ScriptId::Refund,
    source: &REFUND_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&REFUND_SOURCE)),
};

/// One refund: its reply is the number of tiers that got units back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RefundOp<'a>(pub(crate) RefundRequest<'a>);

impl ScriptOp for RefundOp<'_> {
    type Output = u64;

    fn script(&self) -> &'static Script {
        &REFUND
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        push_refund(cmd, &self.0);
    }

    fn read_reply(&self, reply: redis::Value) -> Result<u64, StoreError> {
        match reply {
            redis::Value::Int(n) if n >= 0 => Ok(n as u64),
            other => Err(StoreError::BadReply(format!("{other:?}"))),
        }
    }
}

/// Appends a refund's `numkeys`, `KEYS` and `ARGV`.
fn push_refund(cmd: &mut redis::Cmd, r: &RefundRequest<'_>) {
    if r.algorithm.spec().is_log() {
        cmd.arg(3)
            .arg(log_controls_key(r.key))
            .arg(r.key)
            .arg(tenant_key(r.key));
    } else {
        cmd.arg(2).arg(r.key).arg(tenant_key(r.key));
    }
    cmd.arg(refund_args(r));
}

/// The refund script's one argument: `'<dBdd' .. n * '<ddd'`: now_us, the algorithm's tag, the
/// units, age_us, then the caller's tiers; the reservation's time as `lua/refund.lua`'s header
/// reads it (a client's time and age 0; -2 and Redis's time; -1 and the age). The units are
/// capped as a decision's cost is ([`capped_cost`]): no tier holds more, and the mirror caps
/// them alike.
fn refund_args(r: &RefundRequest<'_>) -> Vec<u8> {
    let quotas: &[Quota] = r.quotas;
    let (now, age) = match r.reserved {
        ReservedAt::Client(at) => (exact(at), 0.0),
        ReservedAt::Store(at) => (-2.0, exact(at)),
        ReservedAt::Ago(age) => (-1.0, exact(age)),
    };
    let mut bytes = Vec::with_capacity(25 + 24 * quotas.len());
    bytes.extend_from_slice(&now.to_le_bytes());
    bytes.push(r.algorithm.tag());
    bytes.extend_from_slice(&exact(capped_cost(r.units)).to_le_bytes());
    bytes.extend_from_slice(&age.to_le_bytes());
    for quota in quotas.iter().take(crate::quota::MAX_TIERS) {
        for v in [quota.limit(), quota.period_micros(), quota.burst()] {
            bytes.extend_from_slice(&exact(v).to_le_bytes());
        }
    }
    bytes
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
    // The algorithm's own refund step (the sliding log has none here: see `log_refund`).
    let step = packed_by_tag(tag).and_then(|a| a.spec().refund)?;
    let (mut at, mut stamp) = (0, 0.0);
    if !is_one_state(s.len()) {
        match Controls::parse(s) {
            Controls::None => {}
            Controls::Corrupt => return None,
            controls @ Controls::Some { n, .. } => {
                if let Some(over) = override_tiers(&controls) {
                    tiers = over;
                }
                (stamp, at) = Controls::stamp(s, Controls::len(n));
            }
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
        let len = state_len_of(tag_at);
        let state = &s[at..(at + len).min(s.len())];
        at += len;
        i += 1;
        let new = match tiers.get(i - 1) {
            Some(&(period, burst)) if state.len() == len && tag_at == tag => {
                // The start of the fixed window the units were reserved in.
                let start = reserved - lua_mod(reserved, period);
                let refund = Refund {
                    units,
                    start,
                    period,
                    burst,
                };
                step(state, &refund)
            }
            _ => None,
        };
        match new {
            Some(new) if new.as_bytes() != state => {
                out.extend_from_slice(new.as_bytes());
                changed += 1;
            }
            _ => out.extend_from_slice(state),
        }
    }
    (changed > 0).then_some((out, changed))
}

/// The periods and bursts of the override in `controls`, if any.
fn override_tiers(controls: &Controls<'_>) -> Option<Vec<(f64, f64)>> {
    let &Controls::Some { n, .. } = controls else {
        return None;
    };
    (n > 0).then(|| {
        (0..n)
            .filter_map(|i| controls.tier(i))
            .map(|t| (t.period, t.burst))
            .collect()
    })
}

/// The tenant's reset (0: none) and its override's periods and bursts, if any.
fn tenant_reset(tenant: Option<&[u8]>) -> (f64, Option<Vec<(f64, f64)>>) {
    let Some(t) = tenant else {
        return (0.0, None);
    };
    let controls = Controls::parse(t);
    let Controls::Some { n, .. } = controls else {
        return (0.0, None);
    };
    (
        Controls::tenant_reset(t, Controls::len(n)),
        override_tiers(&controls),
    )
}

/// Whether units reserved at `reserved` may have been paid for before a reset at `reset_us`: a
/// client clock's reservation within `MAX_SKEW` after it counts as before, since the reset may
/// have been made under another client's clock up to that far behind (`lua/refund.lua`).
pub(crate) fn reserved_before_reset(reserved: f64, reset_us: f64, client: bool) -> bool {
    let skew = if client {
        crate::algorithm::MAX_SKEW_US
    } else {
        0.0
    };
    reserved < reset_us + skew
}

/// The sliding log's refund of `units` reserved at `reserved`: the `units` oldest entries
/// scored at or after `reserved` removed from `log` (sorted oldest first), as
/// `ZRANGEBYSCORE … LIMIT` and `ZREM` do in `lua/refund.lua`. Returns the entries removed.
pub(crate) fn log_refund(log: &mut sliding_log::Log, units: f64, reserved: f64) -> u64 {
    let older = log.partition_point(|&score| score < reserved);
    let n = (units.min(usize::MAX as f64) as usize).min(log.len() - older);
    log.drain(older..older + n);
    n as u64
}

impl StoreOp for RefundOp<'_> {
    type Output = u64;

    fn request(&self) -> OperationRequest<'_> {
        OperationRequest::Refund(self.0)
    }

    const LACKING: &'static str = "this store has no refunds";

    fn on_redis<'s>(
        &'s self,
        store: &'s RedisStore,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 's {
        store.guarded(*self, "refund")
    }

    fn in_memory(&self, store: &MemoryStore) -> Result<u64, StoreError> {
        store.refund_now(self.0)
    }
}

/// The mirror: the same refund under the key's shard lock.
impl MemoryStore {
    /// A refund (`lua/refund.lua`), synchronously; refused as the script refuses its arguments
    /// (no unit, or a time at or past 2^53 µs: a client's, a store's, an age).
    pub(crate) fn refund_now(&self, request: RefundRequest<'_>) -> Result<u64, StoreError> {
        let (now, reserved, client) = match request.reserved {
            ReservedAt::Client(at) => {
                let at = time(at, "refund", "now_us")?;
                (at, at as f64, true)
            }
            // Sent as `age_us` (with now_us -2 or -1).
            ReservedAt::Store(at) => {
                let at = time(at, "refund", "age_us")?;
                (system_now_micros(), at as f64, false)
            }
            ReservedAt::Ago(age) => {
                let age = time(age, "refund", "age_us")?;
                let now = system_now_micros();
                (now, now as f64 - age as f64, false)
            }
        };
        // Capped as on the wire (`refund_args`).
        let units = positive(capped_cost(request.units), "refund", "units")? as f64;
        let log = request.algorithm.spec().is_log();
        let mut guard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let tenant = shard.tenant(request.key, now);
        let route_key = if log {
            log_controls_key(request.key)
        } else {
            request.key.to_owned()
        };
        let (held, live) = shard.find(&route_key, now);
        let route = live.and_then(|slot| shard.bytes(slot)).map(<[u8]>::to_vec);
        if log {
            // Only the controls' string: its stamp against the tenant's reset.
            let stale = stale(route.as_deref(), tenant.as_deref());
            if stale {
                return Ok(0);
            }
            let (_, live) = shard.find(request.key, now);
            let Some(slot) = live else { return Ok(0) };
            let KeyState::Log(entries) = &mut shard.slots[slot].stored.state else {
                return Ok(0);
            };
            let reset = tenant_reset_us(tenant.as_deref());
            if reset > 0.0 && reserved_before_reset(reserved, reset, client) {
                return Ok(0); // reserved before the tenant's reset
            }
            return Ok(log_refund(entries, units, reserved));
        }
        let Some((bytes, changed)) = refund(
            route.as_deref(),
            tenant.as_deref(),
            request.algorithm.tag(),
            units,
            (reserved, client),
            request.quotas,
        ) else {
            return Ok(0);
        };
        let (Some(slot), Some(_)) = (held, live) else {
            return Ok(0);
        };
        let expires_at = shard.slots[slot].stored.expires_at;
        let stored = Stored {
            state: KeyState::Bytes(bytes),
            expires_at,
        };
        // The key keeps its expiry, as `SET … PX <its PTTL>` does.
        shard.put(held, &route_key, stored, now, self.max_keys_per_shard);
        Ok(changed)
    }
}

/// The tenant's reset in µs (0: none).
fn tenant_reset_us(tenant: Option<&[u8]>) -> f64 {
    match tenant.map(Controls::parse) {
        Some(Controls::Some { n, .. }) => {
            Controls::tenant_reset(tenant.unwrap_or_default(), Controls::len(n))
        }
        _ => 0.0,
    }
}

/// Whether the states under `route`'s controls were written before its tenant's reset.
fn stale(route: Option<&[u8]>, tenant: Option<&[u8]>) -> bool {
    let reset = tenant_reset_us(tenant);
    if reset <= 0.0 {
        return false;
    }
    let stamp = match route.map(|s| (s, Controls::parse(s))) {
        Some((s, Controls::Some { n, .. })) => Controls::stamp(s, Controls::len(n)).0,
        _ => 0.0,
    };
    stamp < reset
}
