//! The production modes on Redis: each a script of its own (`lua/refund.lua`, `lua/block.lua`,
//! `lua/slots.lua`), its arguments and its reply, run through the same connection, timeout,
//! breaker and `NOSCRIPT` handling as a decision.

use std::time::Duration;

use futures::future::BoxFuture;

use super::mode_call::ModeCall;
use super::script::{read_decision, Call};
use super::RedisStore;
use crate::decision::Decision;
use crate::store::{Block, CheckRequest, RefundRequest, SlotReply, SlotRequest, StoreError};

impl RedisStore {
    pub(super) fn refund_call<'a>(
        &'a self,
        request: RefundRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(self.guarded(
            Call::Mode(ModeCall::Refund(request)),
            "refund",
            |reply| match reply {
                redis::Value::Int(n) if n >= 0 => Ok(n as u64),
                other => Err(StoreError::BadReply(format!("{other:?}"))),
            },
        ))
    }

    pub(super) fn block_call<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Block,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.guarded(
            Call::Mode(ModeCall::Block(request, block)),
            "check",
            move |reply| read_decision(reply, &request),
        ))
    }

    pub(super) fn slots_call<'a>(
        &'a self,
        request: SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<SlotReply, StoreError>> {
        let op = request.op;
        Box::pin(self.guarded(
            Call::Mode(ModeCall::Slots(request)),
            "slots",
            move |reply| {
                let (ok, n, wait_ms): (i64, i64, i64) = redis::from_redis_value_ref(&reply)
                    .map_err(|_| StoreError::BadReply(format!("{reply:?}")))?;
                let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
                Ok(SlotReply::of(
                    op,
                    ok == 1,
                    u64::try_from(n).unwrap_or(0),
                    wait,
                ))
            },
        ))
    }
}
