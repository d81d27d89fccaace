//! The production modes on Redis: each a script of its own (`lua/refund.lua`, ...), run through
//! the same connection, timeout, breaker and `NOSCRIPT` handling as a decision.

use futures::future::BoxFuture;

use super::reload::Script;
use super::{count_error, Answer, Call, RedisStore, Unsettled};
use crate::algorithm::{
    block_args, block_script, log_controls_key, offences_key, refund_args, refund_script,
    slot_args, slots_script, tenant_key, Algorithm, PackedArgs, Reply, BLOCK_SOURCE, REFUND_SOURCE,
    SLOTS_SOURCE,
};
use crate::decision::Decision;
use crate::store::breaker::Admission;
use crate::store::micros;
use crate::store::modes::slot_op;
use crate::store::{Block, CheckRequest, RefundRequest, SlotReply, SlotRequest, StoreError};

/// A production mode's script call.
#[derive(Debug, Clone, Copy)]
pub(super) enum ModeCall<'a> {
    Refund(RefundRequest<'a>),
    /// A decision that blocks on a denial.
    Block(CheckRequest<'a>, Block),
    Slots(SlotRequest<'a>),
}

impl ModeCall<'_> {
    pub(super) fn script(&self) -> (&'static redis::Script, &'static str) {
        match self {
            ModeCall::Refund(_) => (refund_script(), REFUND_SOURCE),
            ModeCall::Block(..) => (block_script(), &BLOCK_SOURCE),
            ModeCall::Slots(_) => (slots_script(), SLOTS_SOURCE),
        }
    }

    pub(super) fn which(&self) -> Script {
        match self {
            ModeCall::Refund(_) => Script::Refund,
            ModeCall::Block(..) => Script::Block,
            ModeCall::Slots(_) => Script::Slots,
        }
    }

    /// Appends `numkeys`, `KEYS` and `ARGV`.
    pub(super) fn push_call(&self, cmd: &mut redis::Cmd) {
        match self {
            ModeCall::Refund(r) => {
                if r.algorithm == Algorithm::SlidingLog {
                    cmd.arg(3)
                        .arg(log_controls_key(r.key))
                        .arg(r.key)
                        .arg(tenant_key(r.key));
                } else {
                    cmd.arg(2).arg(r.key).arg(tenant_key(r.key));
                }
                cmd.arg(refund_args(
                    r.algorithm.tag(),
                    r.units,
                    r.quotas,
                    r.now_micros,
                ));
            }
            ModeCall::Block(r, block) => {
                let args = PackedArgs::new(r.algorithm, r.quotas, r.cost, r.now_micros);
                if r.algorithm == Algorithm::SlidingLog {
                    cmd.arg(4).arg(log_controls_key(r.key)).arg(r.key);
                } else {
                    cmd.arg(3).arg(r.key);
                }
                cmd.arg(tenant_key(r.key)).arg(offences_key(r.key));
                cmd.arg(args.as_bytes())
                    .arg(block_args(micros(block.duration), micros(block.max)));
            }
            ModeCall::Slots(r) => {
                let (op, limit) = slot_op(r.op);
                cmd.arg(1).arg(r.key).arg(slot_args(
                    op,
                    limit,
                    micros(r.lease),
                    r.id,
                    r.now_micros,
                ));
            }
        }
    }
}

impl RedisStore {
    /// Runs a mode's call as [`Store::check`](crate::store::Store::check) runs a decision:
    /// skipped while the breaker is open, transport trouble counted toward it.
    pub(super) async fn run_mode(
        &self,
        call: ModeCall<'_>,
        name: &'static str,
    ) -> Result<redis::Value, StoreError> {
        let admission = match &self.breaker {
            Some(breaker) => breaker.admit(),
            None => Admission::Call,
        };
        if admission == Admission::Skip {
            return Err(StoreError::Unavailable("circuit breaker open"));
        }
        let mut unsettled = Unsettled {
            breaker: self.breaker.as_deref(),
            admission,
        };
        let result = self.run_script(Call::Mode(call)).await;
        unsettled.breaker = None;
        let transport = result.as_ref().err().map(StoreError::is_transport);
        if let Some(breaker) = &self.breaker {
            match transport {
                Some(true) => breaker.on_failure(admission),
                _ => breaker.on_success(admission),
            }
        }
        if let Some(transport) = transport {
            count_error(name, transport);
        }
        match result? {
            Answer::Mode(value) => Ok(value),
            other => Err(StoreError::BadReply(format!("{other:?}"))),
        }
    }

    pub(super) fn refund_call<'a>(
        &'a self,
        request: RefundRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            match self.run_mode(ModeCall::Refund(request), "refund").await? {
                redis::Value::Int(n) if n >= 0 => Ok(n as u64),
                other => Err(StoreError::BadReply(format!("{other:?}"))),
            }
        })
    }
}

impl RedisStore {
    pub(super) fn block_call<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Block,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let reply = self
                .run_mode(ModeCall::Block(request, block), "check")
                .await?;
            let parsed = match &reply {
                redis::Value::BulkString(bytes) => Reply::from_redis(bytes),
                redis::Value::Int(both) => Reply::from_admission(*both, request.quotas),
                _ => None,
            };
            parsed
                .and_then(|parsed| parsed.into_decision(request.quotas))
                .ok_or_else(|| StoreError::BadReply(format!("{reply:?}")))
        })
    }
}

impl RedisStore {
    pub(super) fn slots_call<'a>(
        &'a self,
        request: SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<SlotReply, StoreError>> {
        Box::pin(async move {
            let reply = self.run_mode(ModeCall::Slots(request), "slots").await?;
            let (ok, remaining, wait_ms): (i64, i64, i64) = redis::from_redis_value_ref(&reply)
                .map_err(|_| StoreError::BadReply(format!("{reply:?}")))?;
            Ok(SlotReply {
                ok: ok == 1,
                remaining: u64::try_from(remaining).unwrap_or(0),
                wait: std::time::Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)),
            })
        })
    }
}
