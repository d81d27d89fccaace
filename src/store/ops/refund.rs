//! Settlement's refund (`lua/refund.lua`): its script, keys, packed argument and reply.

use crate::quota::Quota;
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::wire::layout::exact;
use crate::store::wire::layout::{log_controls_key, tenant_key};
use crate::store::wire::scripts::REFUND_SOURCE;
use crate::store::{RefundRequest, ReservedAt, StoreError};

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
/// reads it (a client's time and age 0; -2 and Redis's time; -1 and the age).
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
    bytes.extend_from_slice(&exact(r.units).to_le_bytes());
    bytes.extend_from_slice(&age.to_le_bytes());
    for quota in quotas.iter().take(crate::quota::MAX_TIERS) {
        for v in [quota.limit(), quota.period_micros(), quota.burst()] {
            bytes.extend_from_slice(&exact(v).to_le_bytes());
        }
    }
    bytes
}
