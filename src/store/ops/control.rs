//! A fleet control (`lua/control.lua`): its script, keys, packed argument and reply, and its
//! Rust mirror, which the memory store runs over the same strings.

use std::sync::PoisonError;
use std::time::Duration;

use super::StoreOp;
use crate::store::contract::OperationRequest;

use crate::algorithm::{is_one_state, ms_up, state_len_of, Algorithm};
use crate::quota::{Quota, MAX_TIERS};
use crate::store::contract::{Control, ControlReply, ControlRequest, StoreError};
use crate::store::memory::shard::{expiry, KeyState, Stored};
use crate::store::memory::{call_time, positive, MemoryStore};
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::redis::{count_error, RedisStore};
use crate::store::wire::layout::{
    exact, f64_at, is_exact, learned_record_key, log_controls_key, put_quota, reset_time,
    tenant_key, Controls, Op, CONTROLS, CONTROLS_HEAD, MAX_TTL_MS, OVERRIDE_IDLE_MS, STAMP,
};
use crate::store::wire::scripts::CONTROL_SOURCE;

/// The fleet controls' script.
pub(crate) static CONTROL: Script = Script {
    id: ScriptId::Control,
    source: &CONTROL_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&CONTROL_SOURCE)),
};

/// One fleet control.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ControlOp<'a>(pub(crate) ControlRequest<'a>);

impl ScriptOp for ControlOp<'_> {
    type Output = ControlReply;

    fn script(&self) -> &'static Script {
        &CONTROL
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        let request = &self.0;
        push_control(
            cmd,
            request.key,
            request.algorithm,
            request.control.op(),
            request.now_micros,
        );
    }

    fn read_reply(&self, reply: redis::Value) -> Result<Self::Output, StoreError> {
        read_control(reply)
    }
}

/// A control's reply: the key's string after the operation, its PTTL, the script's `now_us`,
/// the sorted set's size (or -1) and the learning record's string.
fn read_control(reply: redis::Value) -> Result<ControlReply, StoreError> {
    let bad = || StoreError::BadReply(format!("{reply:?}"));
    let (stored, pttl, now, count, record): (Option<Vec<u8>>, i64, String, i64, Option<Vec<u8>>) =
        redis::from_redis_value_ref(&reply).map_err(|_| bad())?;
    let now_micros = now.parse().map_err(|_| bad())?;
    Ok(ControlReply {
        stored,
        expires_in: u64::try_from(pttl).ok().map(Duration::from_millis),
        now_micros,
        log_entries: u64::try_from(count).ok(),
        record,
    })
}

/// Appends a fleet control's `numkeys`, `KEYS` and `ARGV` (see `lua/control.lua`), as a
/// decision's does: a tenant's control (`key` a [`tenant_key`]) names the
/// tenant's key only; a route's names the route's string, and for the
/// sliding log its controls' string then its sorted set.
fn push_control(
    cmd: &mut redis::Cmd,
    key: &str,
    algorithm: Algorithm,
    op: Op<'_>,
    now_micros: Option<u64>,
) {
    if op.is_tenant(key) {
        cmd.arg(1).arg(tenant_key(key));
        cmd.arg(control_args(op, 0, now_micros));
    } else {
        let log = algorithm.spec().is_log();
        // The learning record (`<key>#l`), then for learning the tenant's controls: an
        // operator's override of every route stops it.
        let record = learned_record_key(key).filter(|_| op.uses_record());
        let tenant = matches!(op, Op::Learn(..)) && record.is_some();
        let keys = 1 + usize::from(log) + usize::from(record.is_some()) + usize::from(tenant);
        cmd.arg(keys);
        if log {
            cmd.arg(log_controls_key(key)).arg(key);
        } else {
            cmd.arg(key);
        }
        if let Some(record) = record {
            cmd.arg(record);
        }
        if tenant {
            cmd.arg(tenant_key(key));
        }
        cmd.arg(control_args(op, algorithm.tag(), now_micros));
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
        Op::Learn(..) => b'a',
        Op::Unlearn => b'u',
    };
    bytes[9] = algorithm;
    if let Op::Learn(_, micros) = op {
        bytes.extend_from_slice(&exact(micros).to_le_bytes());
    }
    match op {
        Op::SetQuota(quotas) | Op::Learn(quotas, _) => push_quotas(&mut bytes, quotas),
        Op::Suspend(micros) | Op::Extend(micros) => {
            bytes.extend_from_slice(&exact(micros).to_le_bytes())
        }
        _ => {}
    }
    bytes
}

/// Appends a list of quotas as the control script reads one: their count, then each quota's
/// 24 bytes ([`put_quota`]).
fn push_quotas(bytes: &mut Vec<u8>, quotas: &[Quota]) {
    bytes.push(quotas.len() as u8);
    let mut at = bytes.len();
    bytes.resize(at + 24 * quotas.len(), 0);
    for quota in quotas {
        at = put_quota(bytes, at, quota);
    }
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
            push_quotas(&mut new, quotas);
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
            override_bytes = Vec::with_capacity(1 + 24 * quotas.len());
            push_quotas(&mut override_bytes, quotas);
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
            let last = reset_time(reset_us);
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

impl StoreOp for ControlOp<'_> {
    type Output = ControlReply;

    fn request(&self) -> OperationRequest<'_> {
        OperationRequest::Control(self.0)
    }

    const LACKING: &'static str = "this store has no fleet controls";

    /// Controls go to Redis even while the circuit breaker is open: an operator's change is
    /// worth a try, and it is bounded by the same timeout.
    async fn on_redis(&self, store: &RedisStore) -> Result<ControlReply, StoreError> {
        let result = store.run_script(self).await;
        if let Err(error) = &result {
            // Loud: a control that did not run (an ACL without a command the script
            // calls, a server refusing it) leaves an operator's change, or an upstream's
            // Retry-After, without effect on the fleet. Never the key: it may be a secret.
            count_error("control", error.is_transport());
            tracing::error!(
                %error,
                algorithm = %self.0.algorithm,
                control = ?self.0.control,
                "rate limit control failed: nothing was changed in the store"
            );
        }
        result
    }

    fn in_memory(&self, store: &MemoryStore) -> Result<ControlReply, StoreError> {
        store.try_control(self.0)
    }
}

/// The mirror: the same control under the key's shard lock.
impl MemoryStore {
    /// Runs a fleet control synchronously, under the key's shard lock (see
    /// [`StoreExt::control`](crate::store::StoreExt::control)).
    ///
    /// A control that `lua/control.lua` refuses (a key holding another algorithm's state, a
    /// client time or a duration at or past 2^53 µs) changes nothing: the reply reports the key
    /// as it is (at the store's clock when the time was refused); `StoreExt::control` answers
    /// the refusal.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::store::{Control, ControlRequest, MemoryStore};
    /// use redlimit::Algorithm;
    ///
    /// let store = MemoryStore::new();
    /// let request = ControlRequest {
    ///     key: "redlimit:{k}",
    ///     algorithm: Algorithm::TokenBucket,
    ///     control: Control::Suspend(Duration::from_secs(2)),
    ///     now_micros: Some(1_000_000),
    /// };
    /// let reply = store.control_now(request);
    /// assert_eq!(reply.expires_in(), Some(Duration::from_secs(2)));
    /// ```
    pub fn control_now(&self, request: ControlRequest<'_>) -> ControlReply {
        match self.try_control(request) {
            Ok(reply) => reply,
            Err(_) => self
                .try_control(ControlRequest {
                    control: Control::Inspect,
                    now_micros: request.now_micros.filter(|&now| is_exact(now)),
                    ..request
                })
                .expect("inspect is never refused"),
        }
    }

    /// [`control_now`](Self::control_now), or the refusal of what `lua/control.lua` refuses:
    /// its arguments, or a control on a key that holds another algorithm's state (nothing
    /// changed).
    pub(crate) fn try_control(
        &self,
        request: ControlRequest<'_>,
    ) -> Result<ControlReply, StoreError> {
        let now = call_time(request.now_micros, "control")?;
        let op = request.control.op();
        match op {
            Op::Suspend(us) | Op::Extend(us) => {
                positive(us, "control", "the suspension in µs")?;
            }
            Op::Learn(_, us) => {
                positive(us, "control", "the learned quota's time in µs")?;
            }
            _ => {}
        }
        let tenant = op.is_tenant(request.key);
        let log = !tenant && request.algorithm.spec().is_log();
        let controls_key = if tenant {
            tenant_key(request.key)
        } else if log {
            log_controls_key(request.key)
        } else {
            request.key.to_owned()
        };
        let mut guard = self
            .shard(request.key)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let shard = &mut *guard;
        let (held, live) = shard.find(&controls_key, now);
        if !tenant && op != Op::Inspect {
            let holds = |key: &str| match shard.find(key, now) {
                (_, Some(slot)) => match &shard.slots[slot].stored.state {
                    KeyState::Log(_) if !log || key != request.key => Some("a zset".to_owned()),
                    KeyState::Log(_) => None,
                    KeyState::Slots(_) => Some("a zset".to_owned()),
                    KeyState::Packed(_) | KeyState::Bytes(_) => {
                        let bytes = shard.bytes(slot).unwrap_or_default();
                        if log && key == request.key {
                            let tag = bytes.first().copied().unwrap_or(0);
                            let name = crate::algorithm::Algorithm::ALL
                                .iter()
                                .find(|a| a.tag() == tag)
                                .map_or("unreadable", |a| a.name());
                            Some(format!("{name} state"))
                        } else {
                            foreign_state(bytes, request.algorithm)
                                .map(|name| format!("{name} state"))
                        }
                    }
                },
                _ => None,
            };
            let what = holds(&controls_key).or_else(|| log.then(|| holds(request.key)).flatten());
            if let Some(what) = what {
                return Err(StoreError::BadReply(format!(
                    "redlimit: refused: the key holds {what}, not {} state; nothing changed",
                    request.algorithm
                )));
            }
        }
        let pttl = live.map(|slot| (shard.slots[slot].stored.expires_at - now).div_ceil(1000));
        let stored = live.and_then(|slot| shard.bytes(slot)).map(<[u8]>::to_vec);
        // The route's learning record, in the same shard (its hash tag).
        let record_key = learned_record_key(request.key).filter(|_| !tenant && op.uses_record());
        // Learning reads the tenant's controls: an operator's override of every route stops it.
        let all_routes = matches!(op, Op::Learn(..))
            && shard
                .tenant(request.key, now)
                .is_some_and(|t| matches!(Controls::parse(&t), Controls::Some { n, .. } if n > 0));
        let record: Option<Option<Vec<u8>>> =
            record_key
                .as_ref()
                .and_then(|key| match shard.find(key, now) {
                    (_, Some(slot)) => shard.bytes(slot).map(|bytes| Some(bytes.to_vec())),
                    _ => Some(None),
                });
        let (op, record_write) = learning(
            stored.as_deref(),
            record.as_ref().map(Option::as_deref),
            all_routes,
            now as f64,
            op,
        );
        let after = match control(stored.as_deref(), pttl, now as f64, op, tenant) {
            None => stored,
            Some((None, _)) => {
                if let Some(slot) = held {
                    shard.remove_slot(slot);
                }
                None
            }
            Some((Some(bytes), ttl_ms)) => {
                let stored = Stored {
                    state: KeyState::Bytes(bytes.clone()),
                    expires_at: expiry(now, ttl_ms),
                };
                shard.put(held, &controls_key, stored, now, self.max_keys_per_shard);
                Some(bytes)
            }
        };
        let record = match (record_key, record_write) {
            (Some(key), RecordWrite::Put(bytes, ttl_ms)) => {
                let stored = Stored {
                    state: KeyState::Bytes(bytes.clone()),
                    expires_at: expiry(now, ttl_ms),
                };
                let (held, _) = shard.find(&key, now);
                shard.put(held, &key, stored, now, self.max_keys_per_shard);
                Some(bytes)
            }
            (Some(key), RecordWrite::Unmark(left)) => {
                if let (Some(slot), _) = shard.find(&key, now) {
                    match &left {
                        Some(left) => {
                            // Its expiry stays; written through `put`, so that its eviction
                            // class follows what it holds now.
                            let stored = Stored {
                                state: KeyState::Bytes(left.clone()),
                                expires_at: shard.slots[slot].stored.expires_at,
                            };
                            shard.put(Some(slot), &key, stored, now, self.max_keys_per_shard);
                        }
                        None => shard.remove_slot(slot),
                    }
                }
                left
            }
            _ => record.flatten(),
        };
        if log && op == Op::Reset {
            if let (Some(slot), _) = shard.find(request.key, now) {
                shard.remove_slot(slot);
            }
        }
        let expires_in = match shard.find(&controls_key, now) {
            (_, Some(slot)) => Some(std::time::Duration::from_millis(
                (shard.slots[slot].stored.expires_at - now).div_ceil(1000),
            )),
            _ => None,
        };
        let log_entries = log.then(|| match shard.find(request.key, now) {
            (_, Some(slot)) => match &shard.slots[slot].stored.state {
                KeyState::Log(entries) => entries.len() as u64,
                KeyState::Packed(_) | KeyState::Bytes(_) | KeyState::Slots(_) => 0,
            },
            _ => 0,
        });
        Ok(ControlReply {
            stored: after,
            expires_in,
            now_micros: now,
            log_entries,
            record,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Quota;

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
}
