//! The production modes on Redis: each a script of its own (`lua/refund.lua`, `lua/block.lua`,
//! `lua/slots.lua`), its arguments and its reply, run through the same connection, timeout,
//! breaker and `NOSCRIPT` handling as a decision.

use std::time::Duration;

use futures::future::BoxFuture;

use super::mode_call::ModeCall;
use super::script::{read_decision, Call};
use super::{count_error, RedisStore, Unsettled};
use crate::decision::Decision;
use crate::store::breaker::Admission;
use crate::store::{Block, CheckRequest, RefundRequest, SlotReply, SlotRequest, StoreError};

impl RedisStore {
    /// Runs a mode's call as [`Store::check`](crate::store::Store::check) runs a decision:
    /// skipped while the breaker is open, transport trouble counted toward it.
    async fn run_mode<T>(
        &self,
        call: ModeCall<'_>,
        name: &'static str,
        read: impl FnOnce(redis::Value) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
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
        let result = self.run_script(Call::Mode(call), read).await;
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
        result
    }

    pub(super) fn refund_call<'a>(
        &'a self,
        request: RefundRequest<'a>,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(
            self.run_mode(ModeCall::Refund(request), "refund", |reply| match reply {
                redis::Value::Int(n) if n >= 0 => Ok(n as u64),
                other => Err(StoreError::BadReply(format!("{other:?}"))),
            }),
        )
    }

    pub(super) fn block_call<'a>(
        &'a self,
        request: CheckRequest<'a>,
        block: Block,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(
            self.run_mode(ModeCall::Block(request, block), "check", move |reply| {
                read_decision(reply, &request)
            }),
        )
    }

    pub(super) fn slots_call<'a>(
        &'a self,
        request: SlotRequest<'a>,
    ) -> BoxFuture<'a, Result<SlotReply, StoreError>> {
        Box::pin(self.run_mode(ModeCall::Slots(request), "slots", |reply| {
            let (ok, remaining, wait_ms): (i64, i64, i64) = redis::from_redis_value_ref(&reply)
                .map_err(|_| StoreError::BadReply(format!("{reply:?}")))?;
            Ok(SlotReply {
                ok: ok == 1,
                remaining: u64::try_from(remaining).unwrap_or(0),
                wait: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)),
            })
        }))
    }
}
