//! A fleet control (`lua/control.lua`): its script, keys, packed argument and reply.

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::store::op::{Script, ScriptId, ScriptOp};
use crate::store::wire::layout::log_controls_key;
use crate::store::wire::layout::{exact, learned_record_key, put_quota, tenant_key, Op};
use crate::store::wire::scripts::CONTROL_SOURCE;
use crate::store::{ControlReply, ControlRequest, StoreError};

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
