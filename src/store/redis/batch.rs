//! Several decisions in one script call, only when there is a queue (`lua/batch.lua`).
//!
//! A decision that finds no call in flight for its group (the connection; on Cluster, its
//! slot) goes out alone at once, from its caller's future, as without batching. Decisions that
//! arrive while a call is in flight wait in the group's queue, and a sender of the store's own
//! (a task on the store's runtime: [`StoreRuntime`](super::runtime::StoreRuntime)) sends them:
//! at once when no sender is in flight for the group, else when the sender's call ends, up to
//! `max_batch` in one `EVALSHA`, and on while decisions keep arriving. A queue that reaches
//! `max_batch`, or a quarter of it behind a single call in flight, gets another sender at once.
//! So no queued decision waits for another caller's call, task, poll or runtime: a caller that
//! is parked, busy with synchronous work, on a runtime that idles or shuts down, holds up only
//! its own decision.
//!
//! Each decision keeps its own reply, its own errors and its own timeout (from the moment it was
//! queued); a decision whose caller went away before its call was sent is left out of it. The
//! circuit breaker hears once per call, and a call that fails as a whole gives every decision
//! in it that error.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use super::cluster::is_rehashing;
use super::connection::is_stale_server;
use super::{count_error, Backend, RedisStore};
use crate::algorithm::Algorithm;
use crate::quota::Quotas;
use crate::store::answers::{Answers, Receiver, Sender};
use crate::store::breaker::{Admission, BreakerState, Ticket};
use crate::store::contract::StoreError;
use crate::store::contract::{AloneCall, CheckRequest, Decided, QueuedAnswer, QueuedDecision};
use crate::store::op::{OnRehashing, Script, ScriptId, ScriptOp};
use crate::store::wire::decide::PackedArgs;
use crate::store::wire::decide::{key_count, push_keys, read_decision, DecideOp, DECIDE};
use crate::store::wire::scripts::BATCH_SOURCE;

/// The default of [`RedisStoreBuilder::max_batch`](super::RedisStoreBuilder::max_batch): the
/// most decisions one script call carries.
pub const DEFAULT_MAX_BATCH: usize = 64;

/// The largest [`RedisStoreBuilder::max_batch`](super::RedisStoreBuilder::max_batch): the most
/// decisions one script call can always carry. The batch script unpacks one value per decision
/// (its tenants' keys, into one `MGET`) and Lua's stack takes fewer than 8 000; a call this
/// large already pays its fixed cost on a thousand decisions.
pub const MAX_BATCH: usize = 1024;

/// The queues of one store (shared by its clones): one group per connection, or on Cluster per
/// slot, since a script's keys must share one.
pub(super) struct Batches {
    max: usize,
    groups: Mutex<Groups>,
}

/// The groups by slot (0 off Cluster). A slot is a number below 16 384 that the crate computes,
/// so it needs no keyed hash: every decision looks its group up twice, and SipHash would cost
/// each more than the rest of the lookup.
type Groups = HashMap<u16, Group, BuildHasherDefault<SlotHasher>>;

/// The [`Groups`]' hasher: a slot times a 64-bit odd constant (Fibonacci hashing), so that the
/// table's top bits differ too.
#[derive(Default)]
struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 << 8 | u64::from(byte)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u16(&mut self, slot: u16) {
        self.0 = u64::from(slot).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// One group's calls in flight and the decisions waiting for the next.
///
/// Whenever the queue holds a decision, a sender is in flight for the group: the one that
/// queued it started one if none was, and a sender ends only with an empty queue.
#[derive(Default)]
struct Group {
    /// Calls in flight: at most one caller's own, and the senders'.
    in_flight: usize,
    /// Of those, the senders' (tasks on the store's runtime).
    senders: usize,
    queue: Vec<Queued>,
    /// Where queued decisions' answers go, made a block at a time.
    answers: Answers<QueuedAnswer>,
}

/// A decision waiting for a call: what the call sends for it, and where its answer goes.
struct Queued {
    key: QueuedKey,
    algorithm: Algorithm,
    /// Whether an admission tells when Redis decided (so does its call alone, if it goes so).
    timed: bool,
    args: PackedArgs,
    answer: Sender<QueuedAnswer>,
}

/// A queued decision's storage key, kept in its queue entry when it fits (a prefix, a hash tag
/// and a scope usually do): queueing a decision then allocates only its answer's channel.
enum QueuedKey {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<str>),
}

/// The longest key a queue entry holds in place.
const INLINE_KEY: usize = 160;

impl QueuedKey {
    fn new(key: &str) -> Self {
        match key.len() {
            len if len <= INLINE_KEY => {
                let mut bytes = [0u8; INLINE_KEY];
                bytes[..len].copy_from_slice(key.as_bytes());
                QueuedKey::Inline {
                    len: len as u8,
                    bytes,
                }
            }
            _ => QueuedKey::Heap(key.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            QueuedKey::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).expect("copied from a str")
            }
            QueuedKey::Heap(key) => key,
        }
    }
}

/// How a decision goes: alone (holding its group's call in flight), or queued in a group.
enum Entry {
    Alone(InFlight),
    Queued(Receiver<QueuedAnswer>),
}

/// The share of `max_batch` queued behind a single call in flight that starts a second call.
const SECOND_CALL_AT: usize = 4;

impl Batches {
    pub(super) fn new(max: usize) -> Self {
        Batches {
            max,
            groups: Mutex::default(),
        }
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a sender's next call's decisions from `group` (those whose callers still wait, up
    /// to `max`), or, when none wait, ends that sender.
    fn next(&self, slot: u16) -> Option<Vec<Queued>> {
        let mut groups = self.lock();
        let group = groups.get_mut(&slot)?;
        group.queue.retain(|queued| !queued.answer.is_closed());
        if group.queue.is_empty() {
            group.senders = group.senders.saturating_sub(1);
            end_call(&mut groups, slot);
            return None;
        }
        let take = group.queue.len().min(self.max);
        Some(group.queue.drain(..take).collect())
    }

    /// Ends a sender that will send no more (its task dropped: the store's runtime shut down).
    /// With no other sender left, nothing would send the queue: its decisions, never sent, go
    /// back to their callers to be sent alone, on their own runtimes.
    fn abandon(&self, store: &RedisStore, slot: u16) {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(&slot) else {
            return;
        };
        group.senders = group.senders.saturating_sub(1);
        let unsent = if group.senders == 0 {
            std::mem::take(&mut group.queue)
        } else {
            Vec::new()
        };
        end_call(&mut groups, slot);
        drop(groups);
        for queued in unsent {
            queued.go_alone(store);
        }
    }
}

impl Queued {
    /// Hands this decision back to its caller, to be sent in a call of its own (an error of
    /// the batch that one decision alone may not meet, or no sender left to send it).
    fn go_alone(self, store: &RedisStore) {
        let (store, timed) = (store.clone(), self.timed);
        let go = move |request: CheckRequest<'_>, deadline| {
            alone_call(
                Owner::Store(store),
                request,
                Some(Ticket::CALL),
                timed,
                Some(deadline),
            )
        };
        let _ = self.answer.send(QueuedAnswer::Alone(Box::new(go)));
    }
}

/// Counts one call of `slot`'s group out; forgets the group when nothing is left in it.
fn end_call(groups: &mut Groups, slot: u16) {
    if let Some(group) = groups.get_mut(&slot) {
        group.in_flight = group.in_flight.saturating_sub(1);
        if group.in_flight == 0 && group.queue.is_empty() {
            groups.remove(&slot);
        }
    }
}

/// A group's call in flight from a caller's own future. Dropped when that call ends, or with
/// the future (a client gone, an outer timeout). Nothing waits for it: decisions queued
/// meanwhile have a sender of their own.
struct InFlight {
    store: RedisStore,
    slot: u16,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        end_call(&mut self.store.batches.lock(), self.slot);
    }
}

/// Sends `batch`, then the group's queue call after call while decisions keep arriving, as a
/// task of its own on the store's runtime: no caller's future, task or runtime carries other
/// callers' decisions.
fn spawn_sender(store: &RedisStore, slot: u16, batch: Vec<Queued>) {
    let mut sending = Sending {
        store: store.clone(),
        slot,
        unsent: Some(batch),
        done: false,
    };
    // A runtime that has shut down drops the task at once: `Sending` says so to the group.
    let _ = store.runtime.spawn(async move {
        let mut batch = sending.unsent.take();
        while let Some(next) = batch {
            sending.store.send_batch(next).await;
            batch = sending.store.batches.next(slot);
        }
        sending.finish();
    });
    // Spawned from a worker of that runtime, the sender lands in the worker's LIFO slot, which
    // no other worker steals (tokio-rs/tokio#4941): a caller that polled its decision once and
    // then blocked the worker would hold every queued decision. A second spawn moves the sender
    // to the worker's queue, where an idle worker is woken to steal it.
    if store.runtime.is_current() {
        let _ = store.runtime.spawn(async {});
    }
}

/// A sender's call in flight. Dropped before its task ends (the store's runtime shut down), it
/// ends the sender, so that the group does not count a call that nothing sends; a first batch
/// it never took (its task never ran) goes back to its callers to be sent alone.
struct Sending {
    store: RedisStore,
    slot: u16,
    unsent: Option<Vec<Queued>>,
    done: bool,
}

impl Sending {
    /// The sender's queue is empty: `next` ended it.
    fn finish(mut self) {
        self.done = true;
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if !self.done {
            for queued in self.unsent.take().into_iter().flatten() {
                queued.go_alone(&self.store);
            }
            self.store.batches.abandon(&self.store, self.slot);
        }
    }
}

impl RedisStore {
    /// A decision, batched with others when calls queue up (see the module docs); `timed`: an
    /// admission tells when Redis decided
    /// ([`StoreExt::check_timed`](crate::store::StoreExt::check_timed)).
    pub(super) async fn batched_check(&self, request: CheckRequest<'_>, timed: bool) -> Decided {
        let mut queued = std::pin::pin!(self.queue_decision(request, timed));
        let (result, _) =
            std::future::poll_fn(|cx| queued.as_mut().poll_decided(cx, request)).await;
        result
    }

    /// Starts a decision (see [`batched_check`](Self::batched_check)) without waiting: queued
    /// for a sender, whose answer the caller polls with no box of its own; or in a call of its
    /// own (a breaker's probe, a sliding log's decision of several units, or nothing in flight
    /// for its group), which owns what it sends.
    pub(super) fn queue_decision(&self, request: CheckRequest<'_>, timed: bool) -> QueuedDecision {
        let ticket = match &self.breaker {
            // A probe is taken at the call's first poll: a future held unpolled holds none.
            Some(breaker) if breaker.probe_due() => {
                let call = alone_call(Owner::Store(self.clone()), request, None, timed, None);
                return QueuedDecision::alone(call);
            }
            Some(breaker) => breaker.ticket(),
            None => Ticket::CALL,
        };
        if ticket.admission == Admission::Skip {
            let open = Err(StoreError::Unavailable("circuit breaker open"));
            return QueuedDecision::answered(open);
        }
        // A probe goes alone: its own outcome opens or closes the circuit. So does a sliding
        // log's decision of more than a unit, which costs Redis O(its cost) (a member per
        // unit): no call's work grows with several such costs and holds other clients behind it
        // (Redis serves none while a script runs).
        let costly_log = request.algorithm == Algorithm::SlidingLog && request.cost > 1;
        if ticket.admission == Admission::Probe || costly_log {
            let owner = Owner::Store(self.clone());
            return QueuedDecision::alone(alone_call(owner, request, Some(ticket), timed, None));
        }
        match self.enter(&request, timed) {
            Entry::Alone(in_flight) => {
                let owner = Owner::InFlight(in_flight);
                QueuedDecision::alone(alone_call(owner, request, Some(ticket), timed, None))
            }
            // The decision's one timeout, from the moment it was queued: the wait, and the call
            // of its own when the batch could not take it.
            Entry::Queued(answer) => QueuedDecision::waiting(
                answer,
                tokio::time::Instant::now() + self.timeout,
                self.timeout,
                read_queued,
            ),
        }
    }

    /// Goes alone when nothing is in flight for the request's group, else queues it, and
    /// starts a sender when none is in flight for the group, when the queue is full, or when a
    /// quarter of it waits behind a single call.
    fn enter(&self, request: &CheckRequest<'_>, timed: bool) -> Entry {
        let slot = match &*self.backend {
            Backend::Cluster { .. } => slot_of(request.key.as_bytes()),
            _ => 0,
        };
        let mut groups = self.batches.lock();
        let group = groups.entry(slot).or_default();
        if group.in_flight == 0 {
            group.in_flight = 1;
            drop(groups);
            return Entry::Alone(InFlight {
                store: self.clone(),
                slot,
            });
        }
        let (answer, receiver) = group.answers.channel();
        group.queue.push(Queued {
            key: QueuedKey::new(request.key),
            algorithm: request.algorithm,
            timed,
            args: PackedArgs::of(request, timed),
            answer,
        });
        // A second call at a quarter of a queue overlaps the first (the client's work on one
        // reply with Redis's on the next call) instead of every decision waiting for one round
        // trip after another.
        let queued = group.queue.len();
        let max = self.batches.max;
        if group.senders == 0
            || queued >= max
            || (group.in_flight == 1 && queued >= max.div_ceil(SECOND_CALL_AT))
        {
            group.in_flight += 1;
            group.senders += 1;
            let batch: Vec<Queued> = group.queue.drain(..queued.min(max)).collect();
            drop(groups);
            spawn_sender(self, slot, batch);
        }
        Entry::Queued(receiver)
    }

    /// One call for `batch`: each decision hears its own reply, or the call's error. The breaker
    /// hears once.
    async fn send_batch(&self, mut batch: Vec<Queued>) {
        batch.retain(|queued| !queued.answer.is_closed());
        if batch.is_empty() {
            return;
        }
        let result = self.run_script(&BatchOp(&batch)).await;
        let came = std::time::Instant::now();
        if let Err(StoreError::Redis(error)) = &result {
            if is_rehashing(error.inner())
                || (batch.len() > 1 && refused_before_running(error.inner()))
            {
                // Nothing ran: each decision goes again alone and hears its own answer (the
                // one key an ACL refuses, the split form of a slot in migration).
                for queued in batch {
                    queued.go_alone(self);
                }
                return;
            }
        }
        let transport = result.as_ref().err().map(StoreError::is_transport);
        if let Some(breaker) = &self.breaker {
            match transport {
                Some(true) => breaker.on_failure(Admission::Call, &self.failures),
                _ => breaker.on_success(Admission::Call),
            }
        }
        if let Some(transport) = transport {
            count_error("check", transport);
        }
        match result {
            Ok(reply) => {
                let replies = split_reply(reply, batch.len());
                for (queued, reply) in batch.into_iter().zip(replies) {
                    let _ = queued.answer.send(QueuedAnswer::Reply(reply, came));
                }
            }
            Err(error) => {
                for queued in batch {
                    let _ = queued
                        .answer
                        .send(QueuedAnswer::Reply(Err(error.clone()), came));
                }
            }
        }
    }
}

/// A decision's call of its own, owning what it sends (`request`'s key and quotas, and the
/// store through its `owner`, which may be its group's call in flight, held until it ends),
/// with the breaker's `admission` (`None`: asked at its first poll); within `deadline` when it
/// has one (the wait it comes after counts). Boxed: a decision that queues (most of them
/// under load) then carries a few hundred bytes, not a whole call's future.
fn alone_call(
    owner: Owner,
    request: CheckRequest<'_>,
    ticket: Option<Ticket>,
    timed: bool,
    deadline: Option<tokio::time::Instant>,
) -> AloneCall {
    let admitted = ticket.map(|ticket| Admitted {
        breaker: owner.store().breaker.clone(),
        ticket,
    });
    let key = QueuedKey::new(request.key);
    let quotas: Quotas = *request.quotas;
    let CheckRequest {
        algorithm,
        cost,
        now_micros,
        ..
    } = request;
    Box::pin(async move {
        let store = owner.store();
        // Handed to the call's own guard in the same poll, with no await between.
        let ticket = match admitted {
            Some(admitted) => admitted.into_call(),
            None => store
                .breaker
                .as_ref()
                .map_or(Ticket::CALL, |breaker| breaker.ticket()),
        };
        if ticket.admission == Admission::Skip {
            return Err(StoreError::Unavailable("circuit breaker open"));
        }
        let request = CheckRequest {
            key: key.as_str(),
            algorithm,
            quotas: &quotas,
            cost,
            now_micros,
        };
        let call = store.guarded_with(ticket, DecideOp { request, timed }, "check");
        match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, call)
                .await
                .unwrap_or_else(|_| Err(StoreError::Timeout(store.timeout))),
            None => call.await,
        }
    })
}

/// What a call of its own holds of the store: a clone, or its group's call in flight (which
/// holds one, and ends with the call).
enum Owner {
    Store(RedisStore),
    InFlight(InFlight),
}

impl Owner {
    fn store(&self) -> &RedisStore {
        match self {
            Owner::Store(store) => store,
            Owner::InFlight(in_flight) => &in_flight.store,
        }
    }
}

/// A breaker's admission not handed to its call yet: a call of its own dropped before its first
/// poll tells the breaker, as a call dropped midway does, so that an abandoned probe does not
/// keep the circuit open for good.
struct Admitted {
    breaker: Option<Arc<BreakerState>>,
    ticket: Ticket,
}

impl Admitted {
    /// The admission, for the call that now answers for it.
    fn into_call(mut self) -> Ticket {
        self.breaker = None;
        self.ticket
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(breaker) = &self.breaker {
            breaker.on_abandoned_of(self.ticket);
        }
    }
}

/// A queued decision's reply, read for `request`; an unreadable one counted.
fn read_queued(reply: redis::Value, request: &CheckRequest<'_>) -> Decided {
    read_decision(reply, request).inspect_err(|_| count_error("check", false))
}

/// The batch script (`lua/batch.lua`): several decisions in one call.
static BATCH: Script = Script {
    id: ScriptId::Batch,
    source: &BATCH_SOURCE,
    hashed: std::sync::LazyLock::new(|| redis::Script::new(&BATCH_SOURCE)),
};

/// Queued decisions in one call: one alone runs the decision script, several the batch script.
/// Its reply is the call's, which [`split_reply`] shares out.
struct BatchOp<'a>(&'a [Queued]);

impl ScriptOp for BatchOp<'_> {
    type Output = redis::Value;

    fn script(&self) -> &'static Script {
        match self.0 {
            [_] => &DECIDE,
            _ => &BATCH,
        }
    }

    fn stale_connection(&self, reply: &redis::Value) -> Option<StoreError> {
        stale_server_error(reply)
    }

    /// Up to three keys and an argument per decision, each key about a hundred bytes.
    fn capacity(&self) -> (usize, usize) {
        let decisions = self.0.len();
        (3 + 4 * decisions, 64 + 256 * decisions)
    }

    /// Every decision's keys in order, then every one's argument (`lua/batch.lua`'s header);
    /// one decision alone as the decision script takes it.
    fn write_args(&self, cmd: &mut redis::Cmd) {
        let keys: usize = self
            .0
            .iter()
            .map(|queued| key_count(queued.algorithm))
            .sum();
        cmd.arg(keys);
        for queued in self.0 {
            push_keys(cmd, queued.key.as_str(), queued.algorithm);
        }
        for queued in self.0 {
            cmd.arg(queued.args.as_bytes());
        }
    }

    fn read_reply(&self, reply: redis::Value) -> Result<redis::Value, StoreError> {
        Ok(reply)
    }

    /// A slot in migration refused the call before any decision ran: each goes again alone,
    /// where it can take the split form.
    fn on_rehashing(&self) -> OnRehashing<'_> {
        OnRehashing::HandBack
    }
}

/// Whether a batch's error reply proves that none of its decisions ran, and that one of them
/// alone may answer otherwise: the server refused the command before running it (an ACL's
/// `NOPERM` on one decision's key, `OOM`, `MISCONF`, a redirect), or the batch script refused
/// its arguments. (A slot in migration's `TRYAGAIN` sends even one decision again alone: alone,
/// it can take the split form.) Any other error may come after some
/// decisions ran (the script runs each under `pcall`, so none should), and transport trouble
/// concerns every decision alike: neither is sent again.
fn refused_before_running(error: &redis::RedisError) -> bool {
    matches!(
        error.code(),
        Some("NOPERM" | "OOM" | "MISCONF" | "NOSCRIPT" | "MOVED" | "ASK" | "CROSSSLOT")
    ) || (error.code() == Some("ERR")
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("redlimit: invalid batch")))
}

/// A decision's error among a batch's replies (an array's elements) that says the server is
/// no primary (`READONLY`: a script's write on a demoted server), if any: what the call says
/// about its connection besides its own outcome.
fn stale_server_error(reply: &redis::Value) -> Option<StoreError> {
    let redis::Value::Array(replies) = reply else {
        return None;
    };
    replies.iter().find_map(|reply| match reply {
        redis::Value::ServerError(error) => {
            let error: redis::RedisError = error.clone().into();
            is_stale_server(&error).then(|| StoreError::redis(error))
        }
        _ => None,
    })
}

/// A call's reply as each decision's: a call of one decision ran the decision script, whose
/// reply is that decision's; a batch answers one element per decision, an error for a decision
/// that failed on its own.
fn split_reply(reply: redis::Value, decisions: usize) -> Vec<Result<redis::Value, StoreError>> {
    match reply {
        reply if decisions == 1 => vec![Ok(reply)],
        redis::Value::Array(replies) if replies.len() == decisions => replies
            .into_iter()
            .map(|reply| match reply {
                redis::Value::ServerError(error) => {
                    count_error("check", false);
                    Err(StoreError::redis(error.into()))
                }
                reply => Ok(reply),
            })
            .collect(),
        other => {
            let bad = format!("{other:?}");
            (0..decisions)
                .map(|_| Err(StoreError::BadReply(bad.clone())))
                .collect()
        }
    }
}

/// The Cluster slot of a key: CRC16 of its hash tag (the part between the first `{` and the
/// next `}`, when not empty), else of the whole key, modulo 16384; as Redis computes it.
fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queued_key_is_the_key_whatever_its_length() {
        for len in [
            0,
            1,
            INLINE_KEY - 1,
            INLINE_KEY,
            INLINE_KEY + 1,
            4 * INLINE_KEY,
        ] {
            let key: String = "r:{k}".chars().cycle().take(len).collect();
            assert_eq!(QueuedKey::new(&key).as_str(), key, "{len} bytes");
        }
        let wide = "é".repeat(INLINE_KEY / 2);
        assert_eq!(QueuedKey::new(&wide).as_str(), wide);
    }

    #[test]
    fn slots_are_redis_cluster_slots() {
        // `CLUSTER KEYSLOT` answers of a Redis 7.0 cluster.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"user1000"), 3443);
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}"));
        assert_eq!(slot_of(b"foo{}{bar}"), 8363);
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        assert_eq!(slot_of(b"redlimit:{tenant-42}#t"), slot_of(b"tenant-42"));
    }
}
