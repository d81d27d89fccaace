//! The Redis side of the scripts: what a call sends (`EVALSHA` with the packed arguments) and
//! how its reply is read, the one `SCRIPT LOAD`, and the `NOSCRIPT` fallback (see
//! `lua/common.lua`'s header for the format, `src/algorithm/` for what the scripts decide).

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::args::PackedArgs;
use super::batch::Queued;
use super::block::{push_block, BLOCK};
use super::refund::{push_refund, REFUND};
use super::reload::{load, Reloads, Script};
use super::sentinel::PrimaryConnection;
use super::slots::{push_slots, SLOTS};
use crate::algorithm::{Algorithm, MAX_EXACT};
use crate::decision::Decision;
use crate::mirror::layout::{
    exact, f64_at, learned_record_key, put_quota, tenant_key, Op, Reply, MAX_REPLY_MS,
};
use crate::mirror::{
    log_controls_key, BATCH_SOURCE, BLOCK_SOURCE, CONTROL_SOURCE, REFUND_SOURCE, SLOTS_SOURCE,
    SOURCE,
};
use crate::quota::Quota;
use crate::store::{
    Block, CheckRequest, ControlReply, ControlRequest, RefundRequest, SlotRequest, StoreError,
};

/// The decision script (every algorithm's; the arguments name the algorithm), hashed once per
/// process.
static DECIDE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&SOURCE));

/// Several decisions in one call (`lua/batch.lua`).
static BATCH: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&BATCH_SOURCE));

/// The fleet controls' script (`lua/control.lua`).
static CONTROL: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(&CONTROL_SOURCE));

/// One script call: a decision, or a fleet control. A decision's `bool`: whether it asks when
/// Redis decided (`now_us` -2, see [`PackedArgs`]), for [`Store::check_timed`].
///
/// [`Store::check_timed`]: crate::store::Store::check_timed
#[derive(Debug, Clone, Copy)]
pub(super) enum Call<'a> {
    Check(CheckRequest<'a>, bool),
    /// A decision in the split form (see `cluster.rs`), with the other keys' strings.
    Split(CheckRequest<'a>, bool, &'a [Vec<u8>]),
    Control(ControlRequest<'a>),
    /// Settlement's refund (`refund.rs`).
    Refund(RefundRequest<'a>),
    /// A decision that blocks the key on a denial (`block.rs`).
    Block(CheckRequest<'a>, Block, bool),
    /// A concurrency slot operation (`slots.rs`).
    Slots(SlotRequest<'a>),
    /// Queued decisions in one call (`batch.rs`): one alone runs the decision script, several
    /// the batch script.
    Batch(&'a [Queued]),
}

impl Call<'_> {
    /// The script this call runs, its body, and which it is for [`Reloads`].
    fn script(&self) -> (&'static redis::Script, &'static str, Script) {
        match self {
            Call::Check(..) | Call::Split(..) => (&DECIDE, &SOURCE, Script::Decide),
            Call::Control(_) => (&CONTROL, &CONTROL_SOURCE, Script::Control),
            Call::Refund(_) => (&REFUND, &REFUND_SOURCE, Script::Refund),
            Call::Block(..) => (&BLOCK, &BLOCK_SOURCE, Script::Block),
            Call::Slots(_) => (&SLOTS, &SLOTS_SOURCE, Script::Slots),
            Call::Batch([_]) => (&DECIDE, &SOURCE, Script::Decide),
            Call::Batch(_) => (&BATCH, &BATCH_SOURCE, Script::Batch),
        }
    }

    /// An `EVALSHA` of this call (the SHA-1, `numkeys`, `KEYS` and `ARGV`).
    pub(super) fn evalsha(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script().0.get_hash());
        self.push_keys_and_args(&mut cmd);
        cmd
    }

    /// The same call as an `EVAL` with the script's body, which cannot fail with `NOSCRIPT`.
    pub(super) fn eval(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.script().1);
        self.push_keys_and_args(&mut cmd);
        cmd
    }

    /// Appends `numkeys`, `KEYS` and `ARGV` after the SHA-1 or the body.
    fn push_keys_and_args(&self, cmd: &mut redis::Cmd) {
        match self {
            Call::Check(request, timed) => push_call(cmd, request, *timed),
            Call::Split(request, timed, extras) => push_split_call(cmd, request, *timed, extras),
            Call::Control(request) => push_control(
                cmd,
                request.key,
                request.algorithm,
                request.control.op(),
                request.now_micros,
            ),
            Call::Refund(request) => push_refund(cmd, request),
            Call::Block(request, block, timed) => push_block(cmd, request, block, *timed),
            Call::Slots(request) => push_slots(cmd, request),
            Call::Batch(batch) => push_batch(cmd, batch),
        }
    }
}

/// A decision's reply read under the caller's quotas, with the µs of Redis's clock at which it
/// decided when the reply tells it (an admission that asked).
pub(super) fn read_decision(
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

/// A control's reply: the key's string after the operation, its PTTL, the script's `now_us`,
/// the sorted set's size (or -1) and the learning record's string.
pub(super) fn read_control(reply: redis::Value) -> Result<ControlReply, StoreError> {
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

/// How each backend's connection sends a script call: the one place they differ.
pub(super) trait ScriptConnection: ConnectionLike + Clone + Send + Sync + 'static {
    fn run(
        &mut self,
        reloads: &Reloads,
        call: Call<'_>,
    ) -> impl Future<Output = Result<redis::Value, StoreError>> + Send;
}

impl ScriptConnection for MultiplexedConnection {
    async fn run(&mut self, reloads: &Reloads, call: Call<'_>) -> Result<redis::Value, StoreError> {
        // No resend: a dropped connection is replaced, on the store's runtime.
        invoke(self, reloads, call).await
    }
}

impl ScriptConnection for PrimaryConnection {
    async fn run(&mut self, reloads: &Reloads, call: Call<'_>) -> Result<redis::Value, StoreError> {
        // No resend: a dropped connection is replaced, and the next call goes to the primary
        // the sentinels name then.
        invoke(self, reloads, call).await
    }
}

/// `PING` and `SCRIPT LOAD` of the decision script: what a decision needs besides `EVALSHA`.
pub(super) async fn check_server(connection: &mut impl ConnectionLike) -> Result<(), StoreError> {
    redis::cmd("PING")
        .exec_async(connection)
        .await
        .map_err(StoreError::redis)?;
    load(connection, &SOURCE).await.map_err(StoreError::redis)?;
    Ok(())
}

/// One EVALSHA of the call's script. On `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
/// the script is loaded once for every call that saw it ([`Reloads`]) and this call retries; if
/// `NOSCRIPT` comes back again (another flush landed between the load and the retry, or the
/// retry reached a replica promoted without the script), or the load failed, it sends the
/// script body with `EVAL`, which cannot fail that way. A `NOSCRIPT` reply means the script
/// did not run, so each of these resends is safe.
pub(super) async fn invoke<C>(
    connection: &mut C,
    reloads: &Reloads,
    call: Call<'_>,
) -> Result<redis::Value, StoreError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let (_, source, which) = call.script();
    let evalsha = call.evalsha();
    let seen = reloads.seen(which);
    let reply: redis::Value = match query(&evalsha, connection).await {
        Err(error) if is_noscript(&error) => {
            let (retried, load_failed) = match reloads.reload(which, seen, connection, source).await
            {
                Ok(()) => (query(&evalsha, connection).await, false),
                Err(error) => (Err(error), true),
            };
            match retried {
                // NOSCRIPT again, or the load failed (e.g. an ACL without `script|load`); never
                // after any other reply, which may come from a script that ran.
                Err(error) if is_noscript(&error) || (load_failed && !error.is_io_error()) => {
                    query(&call.eval(), connection)
                        .await
                        .map_err(StoreError::redis)?
                }
                result => result.map_err(StoreError::redis)?,
            }
        }
        result => result.map_err(StoreError::redis)?,
    };
    Ok(reply)
}

/// Sends `cmd` and takes an error reply for an error: only the reply's own, not those inside
/// an array (a batch's decisions each answer on their own).
async fn query<C: ConnectionLike>(
    cmd: &redis::Cmd,
    connection: &mut C,
) -> Result<redis::Value, RedisError> {
    match connection.req_packed_command(cmd).await? {
        redis::Value::ServerError(error) => Err(error.into()),
        reply => Ok(reply),
    }
}

pub(super) fn is_noscript(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Appends one decision's `numkeys`, `KEYS` and `ARGV` to an `EVALSHA` or `EVAL` command whose
/// first argument (the SHA-1 or the body) is already in place: the storage key (for the
/// sliding log, its controls' key, then its sorted set), the tenant's key, then
/// [`PackedArgs`].
pub(super) fn push_call(cmd: &mut redis::Cmd, request: &CheckRequest<'_>, timed: bool) {
    cmd.arg(key_count(request.algorithm));
    push_keys(cmd, request.key, request.algorithm);
    cmd.arg(PackedArgs::of(request, timed).as_bytes());
}

/// How many keys a decision sends: the sliding log's 3, the others' 2.
fn key_count(algorithm: Algorithm) -> usize {
    if algorithm.spec().is_log() {
        3
    } else {
        2
    }
}

/// A decision's `KEYS` (see [`push_call`]).
fn push_keys(cmd: &mut redis::Cmd, key: &str, algorithm: Algorithm) {
    if algorithm.spec().is_log() {
        cmd.arg(log_controls_key(key));
    }
    cmd.arg(key).arg(tenant_key(key));
}

/// Appends queued decisions (`lua/batch.lua`'s header): every one's keys in order, then every
/// one's argument; one decision alone as [`push_call`] does.
fn push_batch(cmd: &mut redis::Cmd, batch: &[Queued]) {
    let keys: usize = batch.iter().map(|queued| key_count(queued.algorithm)).sum();
    cmd.arg(keys);
    for queued in batch {
        push_keys(cmd, &queued.key, queued.algorithm);
    }
    for queued in batch {
        cmd.arg(queued.args.as_bytes());
    }
}

/// Appends the split form of a decision (`lua/common.lua`'s header, "Split"), which a Cluster
/// slot migration needs: the state's key alone (for the sliding log its sorted set), then the
/// arguments of [`push_call`] and `extras`, the other keys' strings as the caller read them
/// (the tenant's, then for the sliding log its controls'; empty for an absent key).
pub(super) fn push_split_call(
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
pub(super) fn split_keys(key: &str, algorithm: Algorithm) -> Vec<String> {
    if algorithm.spec().is_log() {
        vec![tenant_key(key), log_controls_key(key)]
    } else {
        vec![tenant_key(key)]
    }
}

/// Appends a fleet control's `numkeys`, `KEYS` and `ARGV` (see `lua/control.lua`), as
/// [`push_call`] does for a decision: a tenant's control (`key` a [`tenant_key`]) names the
/// tenant's key only; a route's names the route's string, and for the
/// sliding log its controls' string then its sorted set.
pub(super) fn push_control(
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
        Op::SetQuota(quotas) | Op::Learn(quotas, _) => {
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
    use crate::mirror::layout::f64_at;

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
