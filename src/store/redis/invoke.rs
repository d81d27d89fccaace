//! How the Redis store runs any script operation ([`ScriptOp`]): one `EVALSHA`, the one
//! `SCRIPT LOAD` after `NOSCRIPT` and the `EVAL` fallback, and how each backend's connection
//! sends it (see `lua/common.lua`'s header for the format, `src/store/ops/` for the
//! operations).

use std::future::Future;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::reload::{load, Reloads};
use super::sentinel::PrimaryConnection;
use crate::store::contract::StoreError;
use crate::store::op::ScriptOp;
use crate::store::wire::decide::DECIDE;

/// How each backend's connection sends a script call. By default once, with no resend: a
/// dropped single-node connection is replaced on the store's runtime, and a dropped Sentinel
/// one too, its next call going to the primary the sentinels name then. Cluster resends what
/// proves it did not run (`cluster.rs`).
pub(super) trait ScriptConnection: ConnectionLike + Clone + Send + Sync + 'static {
    fn run<O: ScriptOp + Sync>(
        &mut self,
        reloads: &Reloads,
        op: &O,
    ) -> impl Future<Output = Result<redis::Value, StoreError>> + Send {
        invoke(self, reloads, op)
    }
}

impl ScriptConnection for MultiplexedConnection {}

impl ScriptConnection for PrimaryConnection {}

/// `PING` and `SCRIPT LOAD` of the decision script: what a decision needs besides `EVALSHA`.
pub(super) async fn check_server(connection: &mut impl ConnectionLike) -> Result<(), StoreError> {
    redis::cmd("PING")
        .exec_async(connection)
        .await
        .map_err(StoreError::redis)?;
    load(connection, DECIDE.source)
        .await
        .map_err(StoreError::redis)?;
    Ok(())
}

/// One EVALSHA of the operation's script. On `NOSCRIPT` (a restart, a failover, `SCRIPT FLUSH`)
/// the script is loaded once for every call that saw it ([`Reloads`]) and this call retries; if
/// `NOSCRIPT` comes back again (another flush landed between the load and the retry, or the
/// retry reached a replica promoted without the script), or the load failed, it sends the
/// script body with `EVAL`, which cannot fail that way. A `NOSCRIPT` reply means the script
/// did not run, so each of these resends is safe.
pub(super) async fn invoke<C, O>(
    connection: &mut C,
    reloads: &Reloads,
    op: &O,
) -> Result<redis::Value, StoreError>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
    O: ScriptOp + Sync,
{
    let script = op.script();
    let evalsha = op.evalsha();
    let seen = reloads.seen(script.id);
    let reply: redis::Value = match query(&evalsha, connection).await {
        Err(error) if is_noscript(&error) => {
            let (retried, load_failed) = match reloads
                .reload(script.id, seen, connection, script.source)
                .await
            {
                Ok(()) => (query(&evalsha, connection).await, false),
                Err(error) => (Err(error), true),
            };
            match retried {
                // NOSCRIPT again, or the load failed (e.g. an ACL without `script|load`); never
                // after any other reply, which may come from a script that ran.
                Err(error) if is_noscript(&error) || (load_failed && !error.is_io_error()) => {
                    query(&op.eval(), connection)
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
