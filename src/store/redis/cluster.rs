//! Script calls on Cluster: the resends after a refusal that proves the script did not run,
//! `ASK` and `MOVED` followed, and the split form a slot migration needs.

use std::time::Duration;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::invoke::{invoke, is_noscript, ScriptConnection};
use super::reload::Reloads;
use crate::store::contract::StoreError;
use crate::store::op::{OnRehashing, ScriptOp};
use crate::store::wire::decide::{split_keys, DecideOp, SplitDecideOp};

impl ScriptConnection for ClusterConnection {
    async fn run<O: ScriptOp + Sync>(
        &mut self,
        reloads: &Reloads,
        op: &O,
    ) -> Result<redis::Value, StoreError> {
        invoke_on_cluster(self, reloads, op).await
    }
}

/// Script calls on Cluster: redis-rs is told not to retry (`.retries(0)`), so this resends a
/// call only after a reply that proves the script did not run, twice at most, within the
/// call's timeout.
///
/// Why redis-rs must not retry: in redis-rs 1.8.1, `choose_response` in
/// `src/cluster_handling/async_connection/request.rs` resends a request whenever
/// `request.retry < retry_params.number_of_retries`, by the error's `RedisError::retry_method`
/// (`src/errors/redis_error.rs`): an I/O error reads as `Reconnect` (connection dropped) or
/// `RetryImmediately` (any other, a response timeout included), and both come *after* the
/// command was written, when the script may have run. A resend there would count one request
/// twice. With `number_of_retries` 0 every error is handed back as it is (slot refreshes and
/// reconnections still happen, they just resend nothing). `send_refresh_error` goes through
/// the same `choose_response`.
///
/// What this resends instead: `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`,
/// `MASTERDOWN` and `READONLY` are refusals made before a script runs (a script refused by
/// `READONLY` stops at its first write, before any change), `ClusterConnectionNotFound` and a
/// refused connection mean nothing was written. (`NOSCRIPT` is handled by [`invoke`].)
///
/// **Slot migration.** While a slot moves (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, then
/// `MIGRATE` key by key) the source answers `ASK <slot> <host:port>` for a key it no longer
/// holds. Sent by slot again, the call would reach the source again and get `ASK` again, so
/// every new or moved key of that slot failed open for the whole migration. An `ASK` is
/// followed here: `ASKING` and the script go to the node named in the error as one pipeline
/// (one write, so no other call on that multiplexed connection can come between them and use
/// up the `ASKING`). A `MOVED` (the slot has moved for good) is followed to the node it names
/// at once, while redis-rs refreshes its slot map (it does so on `MOVED` even without
/// retries), so later calls go there by slot.
///
/// A decision reads two keys of one hash tag (three for the sliding log), and while their slot
/// moves Redis refuses it with `TRYAGAIN Multiple keys request during rehashing of slot`
/// whenever some of them exist and some do not, on the source and (after `ASKING`) on the
/// target alike: the tenant's key usually does not exist, so no resend can help. On that
/// refusal alone a decision takes [`split_check`] instead ([`ScriptOp::on_rehashing`]); every
/// other call is as it was.
async fn invoke_on_cluster<O: ScriptOp + Sync>(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    op: &O,
) -> Result<redis::Value, StoreError> {
    match follow(connection, reloads, op).await {
        Err(StoreError::Redis(error)) if is_rehashing(error.inner()) => match op.on_rehashing() {
            OnRehashing::Split { request, timed } => {
                split_check(connection, reloads, DecideOp { request, timed }).await
            }
            _ => Err(StoreError::Redis(error)),
        },
        result => result,
    }
}

/// A decision in two steps, still exact (`lua/common.lua`'s header, "Split"): the keys besides
/// the state's are read with one-key commands, which a migration never refuses (they follow
/// `ASK` and `MOVED` as scripts do), then the same script runs on the state's key alone with
/// those strings as arguments. Controls read a moment before the decision are those of a
/// decision that ran just before a concurrent change to them, so no decision is wrong for it.
async fn split_check(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    decide: DecideOp<'_>,
) -> Result<redis::Value, StoreError> {
    let mut extras = Vec::with_capacity(2);
    for key in split_keys(decide.request.key, decide.request.algorithm) {
        extras.push(read_string(connection, &key).await?);
    }
    let split = SplitDecideOp {
        decide,
        extras: &extras,
    };
    follow(connection, reloads, &split).await
}

/// One string by a one-key `MGET` (as the script reads it: a key of another type reads as
/// absent), empty when absent, following `ASK` and `MOVED` as [`follow`] does.
async fn read_string(connection: &mut ClusterConnection, key: &str) -> Result<Vec<u8>, StoreError> {
    let mut resends = 0;
    let mut redirect: Option<Redirect> = None;
    loop {
        let mut mget = redis::cmd("MGET");
        mget.arg(key);
        let result = match &redirect {
            None => mget.query_async(connection).await,
            Some(to) => send_to(connection, to, mget).await,
        };
        match result {
            Ok(redis::Value::Array(mut values)) if values.len() == 1 => {
                return match values.pop() {
                    Some(redis::Value::BulkString(bytes)) => Ok(bytes),
                    Some(redis::Value::Nil) => Ok(Vec::new()),
                    other => Err(StoreError::BadReply(format!("{other:?}"))),
                };
            }
            Ok(other) => return Err(StoreError::BadReply(format!("{other:?}"))),
            Err(error) if resends < 4 && did_not_run(&error) => {
                resends += 1;
                redirect = Redirect::of(&error);
                if redirect.is_none() {
                    tokio::time::sleep(Duration::from_millis(5 * resends)).await;
                }
            }
            Err(error) => return Err(StoreError::redis(error)),
        }
    }
}

/// Whether `error` is a migrating slot's refusal of a call on several keys, some missing.
pub(super) fn is_rehashing(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::TryAgain)
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("Multiple keys request during rehashing"))
}

/// One call with the resends of [`invoke_on_cluster`]: a `TRYAGAIN` on several keys
/// ([`is_rehashing`]) comes back at once for an operation that does not resend it (a
/// decision, for the split form; a batch, whose decisions go again alone).
async fn follow<O: ScriptOp + Sync>(
    connection: &mut ClusterConnection,
    reloads: &Reloads,
    op: &O,
) -> Result<redis::Value, StoreError> {
    let mut resends = 0;
    let mut redirect: Option<Redirect> = None;
    loop {
        let result = match &redirect {
            None => invoke(connection, reloads, op).await,
            Some(to) => invoke_redirected(connection, to, op).await,
        };
        match result {
            Err(StoreError::Redis(error))
                if is_rehashing(error.inner())
                    && !matches!(op.on_rehashing(), OnRehashing::Resend) =>
            {
                return Err(StoreError::Redis(error));
            }
            Err(StoreError::Redis(error)) if resends < 4 && did_not_run(error.inner()) => {
                resends += 1;
                redirect = Redirect::of(error.inner());
                if redirect.is_none() {
                    // The slot map refresh that the refusal started needs a moment.
                    tokio::time::sleep(Duration::from_millis(5 * resends)).await;
                }
            }
            result => return result,
        }
    }
}

/// Where an `ASK` or `MOVED` error sends a call.
#[derive(Debug, Clone)]
struct Redirect {
    ask: bool,
    host: String,
    port: u16,
}

impl Redirect {
    /// The node an `ASK` or `MOVED` reply names (`ASK 3999 127.0.0.1:7001`), `None` for other
    /// errors.
    fn of(error: &RedisError) -> Option<Redirect> {
        let ask = error.kind() == ErrorKind::Server(ServerErrorKind::Ask);
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        Some(Redirect {
            ask,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// One script call sent to the node `to` names, after `ASKING` for an `ASK`. The target of a
/// migration may not have the script yet: on `NOSCRIPT` the body goes with `EVAL` (which
/// caches it there, so the next call's `EVALSHA` finds it).
async fn invoke_redirected<O: ScriptOp>(
    connection: &mut ClusterConnection,
    to: &Redirect,
    op: &O,
) -> Result<redis::Value, StoreError> {
    let reply = match send_to(connection, to, op.evalsha()).await {
        Err(error) if is_noscript(&error) => send_to(connection, to, op.eval())
            .await
            .map_err(StoreError::redis)?,
        result => result.map_err(StoreError::redis)?,
    };
    Ok(reply)
}

/// Sends `cmd` to the node `to` names: with `ASKING` before it in one pipeline for an `ASK`.
async fn send_to(
    connection: &mut ClusterConnection,
    to: &Redirect,
    cmd: redis::Cmd,
) -> Result<redis::Value, RedisError> {
    let node = SingleNodeRoutingInfo::ByAddress {
        host: to.host.clone(),
        port: to.port,
    };
    let reply = if to.ask {
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").add_command(cmd);
        // Offset 1: only the script's reply comes back.
        let mut replies = connection.route_pipeline(pipe, 1, 1, node).await?;
        replies.pop().ok_or_else(|| {
            RedisError::from((ErrorKind::Client, "no reply to the script after ASKING"))
        })?
    } else {
        connection
            .route_command(cmd, RoutingInfo::SingleNode(node))
            .await?
    };
    // The reply's own error only: a batch's decisions each answer on their own.
    match reply {
        redis::Value::ServerError(error) => Err(error.into()),
        reply => Ok(reply),
    }
}

/// Whether a Cluster reply proves that the script was not run; see [`invoke_on_cluster`].
fn did_not_run(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    ) || error.is_connection_refusal()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error reply of `kind` saying `detail`, as redis-rs reads it.
    fn server_error(kind: ServerErrorKind, detail: &str) -> RedisError {
        RedisError::from((
            ErrorKind::Server(kind),
            "An error was signalled by the server",
            detail.to_owned(),
        ))
    }

    #[test]
    fn redirections_name_their_node() {
        let ask = server_error(ServerErrorKind::Ask, "3999 127.0.0.1:7001");
        let to = Redirect::of(&ask).expect("ASK names a node");
        assert!(to.ask);
        assert_eq!((to.host.as_str(), to.port), ("127.0.0.1", 7001));
        let moved = server_error(ServerErrorKind::Moved, "3999 [::1]:7002");
        let to = Redirect::of(&moved).expect("MOVED names a node");
        assert!(!to.ask);
        assert_eq!((to.host.as_str(), to.port), ("::1", 7002));
        let other = RedisError::from((ErrorKind::Server(ServerErrorKind::TryAgain), "later"));
        assert!(Redirect::of(&other).is_none());
    }

    #[test]
    fn only_a_refusal_of_several_keys_takes_the_split_form() {
        let several = server_error(
            ServerErrorKind::TryAgain,
            "Multiple keys request during rehashing of slot",
        );
        assert!(is_rehashing(&several));
        let other = server_error(ServerErrorKind::TryAgain, "later");
        assert!(!is_rehashing(&other));
        let ask = server_error(ServerErrorKind::Ask, "3999 127.0.0.1:7001");
        assert!(!is_rehashing(&ask));
    }
}
