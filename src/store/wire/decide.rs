//! A decision (`lua/common.lua`): the decision script, a decision's keys and packed
//! argument (which every decision sends, whichever script wraps it), its split form for a
//! Cluster slot in migration, and its reply.

use crate::algorithm::{Algorithm, MAX_EXACT};
use crate::decision::Decision;
use crate::quota::{Quota, MAX_TIERS};
use crate::store::contract::{CheckRequest, StoreError};
use crate::store::op::{OnRehashing, Script, ScriptId, ScriptOp};
use crate::store::wire::layout::{
    capped_cost, exact, f64_at, log_controls_key, push_tenant_key, put_quota, tenant_key, Reply,
    ARGS_HEADER, MAX_REPLY_MS, QUOTA_BYTES,
};
use crate::store::wire::scripts::SOURCE;

/// The decision script (every algorithm's; the arguments name the algorithm).
pub(crate) static DECIDE: Script = Script {
    id: ScriptId::Decide,
    source: &SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&SOURCE)),
};

/// One decision. `timed`: whether it asks when Redis decided (`now_us` -2, see
/// [`PackedArgs`]), for [`StoreExt::check_timed`](crate::store::StoreExt::check_timed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecideOp<'a> {
    pub(crate) request: CheckRequest<'a>,
    pub(crate) timed: bool,
}

impl ScriptOp for DecideOp<'_> {
    type Output = (Decision, Option<u64>);

    fn script(&self) -> &'static Script {
        &DECIDE
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        push_call(cmd, &self.request, self.timed);
    }

    fn read_reply(&self, reply: redis::Value) -> Result<Self::Output, StoreError> {
        read_decision(reply, &self.request)
    }

    fn on_rehashing(&self) -> OnRehashing<'_> {
        OnRehashing::Split {
            request: self.request,
            timed: self.timed,
        }
    }
}

/// A decision in the split form (see [`push_split_call`]), with the other keys' strings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SplitDecideOp<'a> {
    pub(crate) decide: DecideOp<'a>,
    pub(crate) extras: &'a [Vec<u8>],
}

impl ScriptOp for SplitDecideOp<'_> {
    type Output = (Decision, Option<u64>);

    fn script(&self) -> &'static Script {
        &DECIDE
    }

    fn write_args(&self, cmd: &mut redis::Cmd) {
        push_split_call(cmd, &self.decide.request, self.decide.timed, self.extras);
    }

    fn read_reply(&self, reply: redis::Value) -> Result<Self::Output, StoreError> {
        read_decision(reply, &self.decide.request)
    }
}

/// The longest argument: now, cost, the algorithm, and 8 tiers.
const MAX_ARGS: usize = ARGS_HEADER + QUOTA_BYTES * MAX_TIERS;

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
        timed: bool,
    ) -> Self {
        let quotas = &quotas[..quotas.len().min(MAX_TIERS)];
        let now = match now_micros {
            Some(now) => exact(now),
            None if timed => -2.0,
            None => -1.0,
        };
        let cost = exact(capped_cost(cost));
        let mut bytes = [0; MAX_ARGS];
        bytes[0..8].copy_from_slice(&now.to_le_bytes());
        bytes[8..16].copy_from_slice(&cost.to_le_bytes());
        bytes[16] = algorithm.tag();
        let mut at = ARGS_HEADER;
        for quota in quotas {
            at = put_quota(&mut bytes, at, quota);
        }
        PackedArgs { len: at, bytes }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl PackedArgs {
    /// A decision's argument; `timed`: its admission tells when Redis decided.
    pub(crate) fn of(request: &CheckRequest<'_>, timed: bool) -> Self {
        Self::new(
            request.algorithm,
            request.quotas,
            request.cost,
            request.now_micros,
            timed,
        )
    }
}

/// A decision's reply read under the caller's quotas, with the µs of Redis's clock at which it
/// decided when the reply tells it (an admission that asked).
pub(crate) fn read_decision(
    reply: redis::Value,
    request: &CheckRequest<'_>,
) -> Result<(Decision, Option<u64>), StoreError> {
    let parsed = match &reply {
        redis::Value::BulkString(bytes) => Reply::from_redis(bytes)
            .map(|parsed| (parsed, None))
            .or_else(|| Reply::from_timed(bytes).map(|(parsed, at)| (parsed, Some(at)))),
        redis::Value::Int(both) => {
            Reply::from_admission(*both, request.quotas).map(|parsed| (parsed, None))
        }
        _ => None,
    };
    parsed
        .and_then(|(parsed, at)| Some((parsed.into_decision(request.quotas)?, at)))
        .ok_or_else(|| StoreError::BadReply(format!("{reply:?}")))
}

/// Appends one decision's `numkeys`, `KEYS` and `ARGV` to an `EVALSHA` or `EVAL` command whose
/// first argument (the SHA-1 or the body) is already in place: the storage key (for the
/// sliding log, its controls' key, then its sorted set), the tenant's key, then
/// [`PackedArgs`].
fn push_call(cmd: &mut redis::Cmd, request: &CheckRequest<'_>, timed: bool) {
    cmd.arg(key_count(request.algorithm));
    push_keys(cmd, request.key, request.algorithm);
    cmd.arg(PackedArgs::of(request, timed).as_bytes());
}

/// How many keys a decision sends: the sliding log's 3, the others' 2.
pub(crate) fn key_count(algorithm: Algorithm) -> usize {
    if algorithm.spec().is_log() {
        3
    } else {
        2
    }
}

/// A decision's `KEYS` (see [`push_call`]).
pub(crate) fn push_keys(cmd: &mut redis::Cmd, key: &str, algorithm: Algorithm) {
    if algorithm.spec().is_log() {
        cmd.arg(log_controls_key(key));
    }
    cmd.arg(key);
    push_tenant_key(cmd, key);
}

/// Appends the split form of a decision (`lua/common.lua`'s header, "Split"), which a Cluster
/// slot migration needs: the state's key alone (for the sliding log its sorted set), then the
/// arguments of [`push_call`] and `extras`, the other keys' strings as the caller read them
/// (the tenant's, then for the sliding log its controls'; empty for an absent key).
fn push_split_call(
    cmd: &mut redis::Cmd,
    request: &CheckRequest<'_>,
    timed: bool,
    extras: &[Vec<u8>],
) {
    cmd.arg(1)
        .arg(request.key)
        .arg(PackedArgs::of(request, timed).as_bytes());
    for extra in extras {
        cmd.arg(extra.as_slice());
    }
}

/// The keys a decision reads besides its state, in the order of [`push_split_call`]'s
/// `extras`: the tenant's, then for the sliding log its controls'.
pub(crate) fn split_keys(key: &str, algorithm: Algorithm) -> Vec<String> {
    if algorithm.spec().is_log() {
        vec![tenant_key(key), log_controls_key(key)]
    } else {
        vec![tenant_key(key)]
    }
}

impl Reply {
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

    /// Parses an admission's reply to a decision that asked when Redis decided (`now_us` -2):
    /// the string [`from_redis`](Self::from_redis) reads, then that time, a double
    /// (`lua/common.lua`'s header, Reply). Anything else is `None`.
    pub(crate) fn from_timed(reply: &[u8]) -> Option<(Self, u64)> {
        let (head, at) = reply.split_at_checked(reply.len().checked_sub(8)?)?;
        let parsed = Self::from_redis(head).filter(|parsed| parsed.allowed)?;
        let at = f64_at(at, 0);
        ((0.0..MAX_EXACT).contains(&at) && at.fract() == 0.0).then_some((parsed, at as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_arguments_and_reply() {
        let quota = Quota::per_minute(10).unwrap();
        let args = PackedArgs::new(Algorithm::Gcra, &[quota], u64::MAX, None, false);
        let args = args.as_bytes();
        assert_eq!(args.len(), 17 + 24);
        let f = |i: usize| f64_at(args, i);
        // Server clock, a cost capped above any burst, the algorithm, then the tier.
        assert_eq!((f(0), f(8), args[16]), (-1.0, 1e15 + 1.0, b'g'));
        assert_eq!((f(17), f(25), f(33)), (10.0, 60e6, 10.0));
        // A client time Lua cannot hold exactly is refused by the script, not rounded.
        let late = PackedArgs::new(Algorithm::Gcra, &[quota], 1, Some(1 << 53), false);
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
        // An admission that asked when Redis decided: the string, then that µs.
        let at = 1_700_000_000_123_456.0;
        let timed = Reply::from_timed(&reply(1, 1, &[9.0, 0.0, 6000.0, at])).unwrap();
        assert_eq!(timed, (ok, at as u64));
        let over = Reply::from_timed(&reply(5, 1, &[9.0, 0.0, 1.0, 10.0, 60e6, 3.0, at]));
        assert_eq!(
            over.map(|(r, at)| (r.overridden, at)),
            Some((Some((10, 60_000_000, 3)), at as u64))
        );
        for bad in [
            reply(0, 1, &[9.0, 0.0, 6000.0, at]),
            reply(1, 1, &[9.0, 0.0, 6000.0, -1.0]),
            reply(1, 1, &[9.0, 0.0, 6000.0, 0.5]),
            reply(1, 1, &[9.0, 0.0, 6000.0]),
            Vec::new(),
        ] {
            assert_eq!(Reply::from_timed(&bad), None, "{bad:?}");
        }
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
        let packed = PackedArgs::new(Algorithm::SlidingLog, &[quota], 1, Some(7), false);
        let extras = [b"tenant".to_vec(), Vec::new()];
        let mut cmd = redis::cmd("EVALSHA");
        let request = CheckRequest {
            key: "p:{k}",
            algorithm: Algorithm::SlidingLog,
            quotas: &quota.into(),
            cost: 1,
            now_micros: Some(7),
        };
        push_split_call(&mut cmd, &request, false, &extras);
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
}
