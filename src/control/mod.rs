//! Fleet controls: a key's quotas changed at run time, a fleet-wide suspension, a reset, and a
//! look at a key, each one atomic call to the store.
//!
//! Everything lives in the store next to the key's state (for Redis, in the same string under
//! the same hash tag), so every instance obeys a control on its next call, without a restart,
//! and a limiter that uses none of them pays nothing for them.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::sync::oneshot;

use crate::algorithm::{is_one_state, packed_by_tag, state_len_of, Algorithm};
use crate::core::{ControlError, Limiter, Target, MAX_SUSPENSION};
use crate::quota::Quotas;
use crate::store::ops::control::marked_override;
use crate::store::ops::StoreExt;
use crate::store::wire::layout::{Controls, OVERRIDE_IDLE_MS, STAMP};
use crate::store::{Control, ControlReply, ControlRequest};

/// How long an override set with [`Limiter::set_quota`] outlives the key's last admitted
/// request: 30 days. Every admission on the key keeps it that long again; an idle key then
/// evaporates, override included, like any idle key.
pub const OVERRIDE_IDLE_TTL: Duration = Duration::from_millis(OVERRIDE_IDLE_MS);

/// What a key looks like in the store, without consuming anything: see [`Limiter::inspect`].
#[derive(Debug, Clone, PartialEq)]
pub struct KeyStatus {
    /// The quotas set with [`Limiter::set_quota`] in force on this route, used instead of the
    /// callers' own: the route's own, else the tenant's for every route.
    pub quota_override: Option<Quotas>,
    /// Who set the override in force (`quota_override`): an operator, or an
    /// [`OutboundLayer`](crate::outbound::OutboundLayer) that learned it from the upstream's
    /// announcements; `None` when there is none.
    pub override_source: Option<OverrideSource>,
    /// The override of every route of the tenant ([`Target::all_routes`]), if any.
    pub all_routes_override: Option<Quotas>,
    /// The time the suspension has left ([`Limiter::suspend`]), the tenant's or the route's,
    /// whichever ends later; `None` when not suspended.
    pub suspended_for: Option<Duration>,
    /// When the key's entry expires; `None` when nothing is stored (a fresh key).
    pub expires_in: Option<Duration>,
    /// Each tier's stored state, in order; empty when fresh. The sliding log keeps its entries
    /// in a log of their own: see `log_entries`.
    pub tiers: Vec<TierState>,
    /// The sliding log's entries (units admitted in its longest window); `None` for other
    /// algorithms.
    pub log_entries: Option<u64>,
}

/// Who set a key's override (see [`KeyStatus::override_source`]).
///
/// The store tells them apart: an override an
/// [`OutboundLayer`](crate::outbound::OutboundLayer) learned is marked by its learning record
/// (the route's storage key and `#l`, which no route has), written in the same atomic call as
/// the override; [`Limiter::set_quota`] and [`Limiter::clear_quota`] on
/// the key remove the mark in their own call, so the override they set is always the
/// operator's, and learning never replaces an operator's override.
///
/// ```
/// use redlimit::limiter::OverrideSource;
/// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(MemoryStore::new());
/// let status = limiter.set_quota("tenant-42", &Quotas::from(Quota::per_minute(5)?)).await?;
/// assert_eq!(status.override_source, Some(OverrideSource::Operator));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverrideSource {
    /// Set with [`Limiter::set_quota`] (on the key, or on every route of its tenant).
    Operator,
    /// Learned by an [`OutboundLayer`](crate::outbound::OutboundLayer) from the upstream's
    /// announcements.
    Learned {
        /// The time the learned quota has left: past it, the layer's next learning round
        /// clears it unless an answer confirmed it. `None` once over, and for a record whose
        /// end is no time or more than [`MAX_SUSPENSION`] ahead (no learning write sets one):
        /// read back bounded, a corrupt record never makes a quota last for ever.
        left: Option<Duration>,
    },
}

/// One tier's state as stored: its algorithm and its numbers, by name.
///
/// Times are µs since the Unix epoch: `ts` of the token bucket (up to when refill is
/// accounted), `at` of GCRA (when its `debt`, in requests, was measured), `window` of the fixed
/// and sliding windows (their start).
#[derive(Debug, Clone, PartialEq)]
pub struct TierState {
    /// The algorithm whose state this is (`None`: nothing stored yet for this tier).
    pub algorithm: Option<Algorithm>,
    /// The state's numbers, by name, e.g. `[("tokens", 3.0), ("ts", 1.7e15)]`.
    pub fields: Vec<(&'static str, f64)>,
}

impl fmt::Display for TierState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.algorithm {
            None => f.write_str("fresh"),
            Some(algorithm) => {
                write!(f, "{algorithm}")?;
                for (name, value) in &self.fields {
                    write!(f, " {name}={value}")?;
                }
                Ok(())
            }
        }
    }
}

/// The time a learned quota whose record ends at `end_us` has left at `now_us`, read back
/// bounded: no learning write sets an end more than [`MAX_SUSPENSION`] ahead
/// ([`Limiter::learn_quota`] clamps its time), so an end past that, whoever wrote it, or bytes
/// that are no time (NaN, an infinity, an end already past) read as over (`None`), never as
/// a quota that lasts for ever.
fn learned_left(end_us: f64, now_us: f64) -> Option<Duration> {
    let left = end_us - now_us;
    (left > 0.0 && left <= MAX_SUSPENSION.as_micros() as f64)
        .then(|| Duration::from_micros(left as u64))
}

impl KeyStatus {
    /// A route's status from its reply and its tenant's.
    fn decode(route: ControlReply, tenant: &ControlReply) -> KeyStatus {
        let now = route.now_micros as f64;
        let left = |until_us: f64| {
            (until_us > now)
                .then(|| Duration::from_micros((until_us - now).min(u64::MAX as f64) as u64))
        };
        // The tenant's: a suspension, an override of every route, a reset.
        let tenant_stored = tenant.stored.clone().unwrap_or_default();
        let (mut suspended_for, mut all_routes_override, mut reset_us) = (None, None, 0.0);
        let tenant_controls = Controls::parse(&tenant_stored);
        if let Controls::Some {
            until_us, bytes, ..
        } = tenant_controls
        {
            suspended_for = left(until_us);
            all_routes_override = Quotas::new(tenant_controls.override_quotas()).ok();
            if let Some(b) = tenant_stored.get(bytes.len()..bytes.len() + 8) {
                reset_us = f64::from_le_bytes(b.try_into().unwrap_or_default());
            }
        }
        let stored = route.stored.unwrap_or_default();
        let (mut quota_override, mut at, mut stamp) = (None, 0, 0.0);
        let mut learned = None;
        let controls = Controls::parse(&stored);
        match controls {
            Controls::Some {
                until_us, bytes, ..
            } if !is_one_state(stored.len()) => {
                suspended_for = suspended_for.max(left(until_us));
                quota_override = Quotas::new(controls.override_quotas()).ok();
                // Learned while its record holds the same override, byte for byte.
                let record = route.record.as_deref().unwrap_or_default();
                if quota_override.is_some() && marked_override(record) == Some(&bytes[9..]) {
                    let end = f64::from_le_bytes(record[1..9].try_into().unwrap_or_default());
                    learned = Some(OverrideSource::Learned {
                        left: learned_left(end, now),
                    });
                }
                at = bytes.len();
                if stored.get(at) == Some(&STAMP) {
                    if let Some(b) = stored.get(at + 1..at + 9) {
                        stamp = f64::from_le_bytes(b.try_into().unwrap_or_default());
                    }
                    at += 9;
                }
            }
            Controls::Corrupt if !is_one_state(stored.len()) => at = stored.len(),
            _ => {}
        }
        // States written before the tenant's reset read as fresh.
        let stale = reset_us > 0.0 && stamp < reset_us;
        if stale {
            at = stored.len();
        }
        let mut tiers = Vec::new();
        while let Some(&tag) = stored.get(at) {
            let len = state_len_of(tag);
            let state = &stored[at..(at + len).min(stored.len())];
            at += len;
            let value = |i: usize| {
                state
                    .get(1 + 8 * i..9 + 8 * i)
                    .and_then(|b| b.try_into().ok())
                    .map_or(f64::NAN, f64::from_le_bytes)
            };
            let algorithm = packed_by_tag(tag);
            let names = algorithm.map_or(&[][..], |a| a.spec().fields);
            let fields = names
                .iter()
                .enumerate()
                .map(|(i, name)| (*name, value(i)))
                .collect();
            tiers.push(TierState { algorithm, fields });
        }
        let override_source = match (quota_override, all_routes_override) {
            (Some(_), _) => Some(learned.unwrap_or(OverrideSource::Operator)),
            (None, Some(_)) => Some(OverrideSource::Operator),
            (None, None) => None,
        };
        KeyStatus {
            quota_override: quota_override.or(all_routes_override),
            override_source,
            all_routes_override,
            suspended_for,
            expires_in: route.expires_in,
            tiers,
            log_entries: route.log_entries.map(|n| if stale { 0 } else { n }),
        }
    }
}

/// Forgets what a limiter holds of a tenant when dropped: at the end of a control's store
/// call, however it ends (see [`Limiter::forget_tenant`]).
struct Forget<'a> {
    limiter: &'a Limiter,
    key: &'a str,
    reset: bool,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.limiter.forget_tenant(self.key, self.reset);
    }
}

/// How long a caller's control waits for a layer's write being sent when the store does not
/// say how long its calls may take.
const WRITE_WAIT_BOUND: Duration = Duration::from_secs(1);

/// What a layer's write changes, and so which of a caller's controls win over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// A suspension that only extends (pacing): a caller's `suspend` and `resume` win.
    Suspension,
    /// A learned override (a learning round): a caller's `set_quota` and `clear_quota` win.
    Override,
}

impl WriteKind {
    /// The kind of layer write a caller's `control` wins over, if any.
    fn overtaken_by(control: Control<'_>) -> Option<WriteKind> {
        match control {
            Control::Suspend(_) | Control::Resume => Some(WriteKind::Suspension),
            Control::SetQuota(_) | Control::ClearQuota => Some(WriteKind::Override),
            _ => None,
        }
    }
}

/// The writes this limiter's outbound layers started on their own after an upstream's answer
/// (a pacing suspension, a learning round) and have not finished, per storage key they write.
///
/// A layer starts one ([`Limiter::start_write`]) before it hands the answer back; the write
/// runs in a task of its own. A caller's control on the same key that changes what the write
/// changes, made after that, wins over it: it waits for a write already being sent (at most
/// the store's call timeout), so that it lands after it, and marks the others overtaken,
/// which are then never sent. The write never waits for a caller, and a caller only for a
/// store call under way.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    next_id: AtomicU64,
    keys: Mutex<HashMap<String, Vec<Write>>>,
}

/// One layer write in the registry.
#[derive(Debug)]
struct Write {
    id: u64,
    kind: WriteKind,
    state: WriteState,
}

/// Where a layer write is.
enum WriteState {
    /// Not sent yet: a caller's control of its kind overtakes it.
    Waiting,
    /// A caller's control of its kind came first: never sent.
    Overtaken,
    /// Its store call is under way: done when it ended.
    Sending(Shared<BoxFuture<'static, ()>>),
}

impl fmt::Debug for WriteState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WriteState::Waiting => "Waiting",
            WriteState::Overtaken => "Overtaken",
            WriteState::Sending(_) => "Sending",
        })
    }
}

/// A layer's write on one key, registered in its limiter's [`Writes`] until dropped.
pub(crate) struct WriteTicket {
    limiter: Limiter,
    key: String,
    id: u64,
}

impl fmt::Debug for WriteTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WriteTicket").field("id", &self.id).finish()
    }
}

impl Drop for WriteTicket {
    fn drop(&mut self) {
        self.limiter
            .feature_state::<Writes>()
            .end(&self.key, self.id);
    }
}

/// What [`Writes::send`] says of a write about to be sent.
enum Sending<'a> {
    /// A caller's control overtook it: not sent.
    Overtaken,
    /// Marked as being sent until this is dropped.
    Started(SendingGuard<'a>),
}

/// A layer write's store call under way: dropped when it ended (or its future was), it wakes
/// the controls waiting for it.
struct SendingGuard<'a> {
    writes: &'a Writes,
    key: &'a str,
    id: u64,
    _done: oneshot::Sender<()>,
}

impl Drop for SendingGuard<'_> {
    fn drop(&mut self) {
        let mut keys = self.writes.lock();
        if let Some(write) = keys
            .get_mut(self.key)
            .and_then(|writes| writes.iter_mut().find(|w| w.id == self.id))
        {
            write.state = WriteState::Waiting;
        }
    }
}

impl Writes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Write>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a write of `kind` on `key`.
    fn start(&self, limiter: Limiter, key: String, kind: WriteKind) -> WriteTicket {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.lock().entry(key.clone()).or_default().push(Write {
            id,
            kind,
            state: WriteState::Waiting,
        });
        WriteTicket { limiter, key, id }
    }

    /// Marks `ticket`'s write as being sent, unless a caller's control overtook it.
    fn send<'a>(&'a self, ticket: &'a WriteTicket) -> Sending<'a> {
        let mut keys = self.lock();
        let write = keys
            .get_mut(&ticket.key)
            .and_then(|writes| writes.iter_mut().find(|w| w.id == ticket.id));
        let (done, ended) = oneshot::channel::<()>();
        let ended: BoxFuture<'static, ()> = Box::pin(async move {
            let _ = ended.await;
        });
        match write {
            Some(write) if matches!(write.state, WriteState::Overtaken) => Sending::Overtaken,
            Some(write) => {
                write.state = WriteState::Sending(ended.shared());
                Sending::Started(SendingGuard {
                    writes: self,
                    key: &ticket.key,
                    id: ticket.id,
                    _done: done,
                })
            }
            // Always registered while its ticket lives.
            None => Sending::Started(SendingGuard {
                writes: self,
                key: &ticket.key,
                id: ticket.id,
                _done: done,
            }),
        }
    }

    /// The writes of `kind` on `key` being sent, which a caller's control waits for; when
    /// there are none (or `now`), marks the ones not sent yet as overtaken, in the same look.
    fn overtake(
        &self,
        key: &str,
        kind: WriteKind,
        now: bool,
    ) -> Vec<Shared<BoxFuture<'static, ()>>> {
        let mut keys = self.lock();
        let Some(writes) = keys.get_mut(key) else {
            return Vec::new();
        };
        let sending: Vec<_> = writes
            .iter()
            .filter(|w| w.kind == kind)
            .filter_map(|w| match &w.state {
                WriteState::Sending(done) => Some(done.clone()),
                _ => None,
            })
            .collect();
        if sending.is_empty() || now {
            for write in writes.iter_mut().filter(|w| w.kind == kind) {
                if matches!(write.state, WriteState::Waiting) {
                    write.state = WriteState::Overtaken;
                }
            }
        }
        sending
    }

    /// Unregisters the write `id` on `key` (its ticket was dropped).
    fn end(&self, key: &str, id: u64) {
        let mut keys = self.lock();
        if let Some(writes) = keys.get_mut(key) {
            writes.retain(|w| w.id != id);
            if writes.is_empty() {
                keys.remove(key);
            }
        }
    }
}

/// Whether `control` on `target` writes the tenant's key rather than the route's: an override
/// of every route ([`Target::all_routes`]), and a suspension, its end or a reset of an unscoped
/// target (the tenant's, every route). Learning writes the route; an inspection writes nothing
/// and reads the route first.
fn writes_tenant(target: Target<'_>, control: Control<'_>) -> bool {
    match control {
        Control::SetQuota(_) | Control::ClearQuota => target.all_routes,
        Control::Suspend(_) | Control::Extend(_) | Control::Resume | Control::Reset => {
            target.scope.is_none()
        }
        Control::Learn(..) | Control::Unlearn | Control::Inspect => false,
    }
}

impl Limiter {
    /// The store's bound on one call ([`Store::call_timeout`](crate::store::Store::call_timeout)).
    pub(crate) fn store_call_timeout(&self) -> Option<Duration> {
        self.store().call_timeout()
    }

    /// The storage key of a target's route.
    fn route_key(&self, target: Target<'_>) -> String {
        self.storage_key(Target {
            all_routes: false,
            ..target
        })
    }

    async fn run(&self, key: &str, control: Control<'_>) -> Result<ControlReply, ControlError> {
        let request = ControlRequest {
            key,
            algorithm: self.algorithm(),
            control,
            now_micros: self.clock().now_micros(),
        };
        // Whatever happens to the call (it fails and may have run, or this future is dropped
        // while the store applies it), nothing this process holds of the tenant may outlive a
        // change: the guard forgets every scope when the call ends, before the caller learns
        // it is done, or when the future is dropped.
        let forget = (!matches!(control, Control::Inspect)).then_some(Forget {
            limiter: self,
            key,
            reset: matches!(control, Control::Reset),
        });
        let reply = self.store().control(request).await;
        drop(forget);
        Ok(reply?)
    }

    /// Runs a caller's `control` on the key it writes ([`writes_tenant`]), then reports the
    /// route under its tenant's controls. It wins over the writes this limiter's layers started
    /// before it and have not sent (see [`Writes`]).
    async fn control<'a>(
        &self,
        target: impl Into<Target<'a>>,
        control: Control<'_>,
    ) -> Result<KeyStatus, ControlError> {
        let status = self.control_by(target.into(), control, None).await?;
        Ok(status.expect("a caller's control always runs"))
    }

    /// [`control`](Self::control), or with `ticket` a layer's write started earlier: then
    /// `None` when a caller's control overtook it (nothing was sent). A suspension's duration
    /// is checked first: 1 µs to [`MAX_SUSPENSION`].
    async fn control_by(
        &self,
        target: Target<'_>,
        control: Control<'_>,
        ticket: Option<&WriteTicket>,
    ) -> Result<Option<KeyStatus>, ControlError> {
        if let Control::Suspend(duration) | Control::Extend(duration) = control {
            if duration.as_micros() == 0 || duration > MAX_SUSPENSION {
                return Err(ControlError::InvalidDuration);
            }
        }
        let tenant = writes_tenant(target, control);
        let route = self.route_key(target);
        let tenant_key = crate::store::wire::layout::tenant_key(&route);
        let (written, other) = if tenant {
            (&tenant_key, &route)
        } else {
            (&route, &tenant_key)
        };
        // No await between the registry's look and the store call: a write marked as sending
        // is sent, and a caller's control that found none sending is sent before any.
        let writes = self.feature_state::<Writes>();
        let sending = match ticket {
            Some(ticket) => match writes.send(ticket) {
                Sending::Overtaken => return Ok(None),
                Sending::Started(sending) => Some(sending),
            },
            None => {
                if let Some(kind) = WriteKind::overtaken_by(control) {
                    self.overtake(written, kind).await;
                }
                None
            }
        };
        let reply = self.run(written, control).await;
        drop(sending);
        let reply = reply?;
        let other_reply = self.run(other, Control::Inspect).await?;
        Ok(Some(if tenant {
            KeyStatus::decode(other_reply, &reply)
        } else {
            KeyStatus::decode(reply, &other_reply)
        }))
    }

    /// Waits until no layer write of `kind` on `key` is being sent (the ones being sent land
    /// first), at most the store's call timeout, then marks the ones not sent yet as
    /// overtaken: they are never sent. Dropped while waiting, it overtakes nothing.
    async fn overtake(&self, key: &str, kind: WriteKind) {
        let writes = self.feature_state::<Writes>();
        let writes = &*writes;
        let bound = self.store_call_timeout().unwrap_or(WRITE_WAIT_BOUND);
        // Without a tokio runtime there is no timer to bound the wait: the control does not
        // wait (a layer's writes run on tokio, and on the memory store one is sent and answered
        // within one poll), and never hangs.
        let Some(deadline) = tokio::runtime::Handle::try_current()
            .ok()
            .and_then(|_| tokio::time::Instant::now().checked_add(bound))
        else {
            writes.overtake(key, kind, true);
            return;
        };
        loop {
            let sending = writes.overtake(key, kind, false);
            if sending.is_empty() {
                return;
            }
            let all = futures::future::join_all(sending);
            if tokio::time::timeout_at(deadline, all).await.is_err() {
                // Held by a store that has not answered: the control goes on.
                writes.overtake(key, kind, true);
                return;
            }
        }
    }

    /// Replaces the quotas of `target` with `quotas`, fleet-wide: every instance's next check on
    /// the key uses them instead of its own (a [`QuotaResolver`]'s or a layer's included), until
    /// [`clear_quota`](Self::clear_quota), or until the key has admitted nothing for
    /// [`OVERRIDE_IDLE_TTL`]. The key's state is kept, capped to the new quotas. The override is
    /// the operator's ([`OverrideSource::Operator`]): learning never replaces it, even when it
    /// equals a quota learning set. Returns what the key now looks like.
    ///
    /// [`QuotaResolver`]: crate::layer::QuotaResolver
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStore::new();
    /// let (one, other) = (Limiter::new(store.clone()), Limiter::new(store));
    /// let default = Quota::per_minute(100)?;
    /// let tight = Quotas::from(Quota::per_minute(1)?);
    /// let status = one.set_quota("tenant-42", &tight).await?;
    /// assert_eq!(status.quota_override, Some(tight));
    /// // The other instance obeys on its next call.
    /// assert!(other.check("tenant-42", &default).await.is_allowed());
    /// let denied = *other.check("tenant-42", &default).await.decision().unwrap();
    /// assert!(!denied.allowed);
    /// assert_eq!(denied.quota, tight[0]);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_quota<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
    ) -> Result<KeyStatus, ControlError> {
        self.supports(quotas).map_err(|(_, error)| error)?;
        self.control(target, Control::SetQuota(quotas)).await
    }

    /// Removes the override set with [`set_quota`](Self::set_quota), or a learned one: the
    /// callers' quotas apply again on every instance's next call.
    pub async fn clear_quota<'a>(
        &self,
        target: impl Into<Target<'a>>,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::ClearQuota).await
    }

    /// Sets `quotas` as the override of `target`'s route, marked as learned and lasting `ttl`
    /// (its record's time), in one atomic call, unless the route holds an operator's override:
    /// then nothing changes. For [`OutboundLayer`](crate::outbound::OutboundLayer)'s learning,
    /// a write it started with `ticket`: `None` when a caller's `set_quota` or `clear_quota`
    /// overtook it. See [`OverrideSource`].
    pub(crate) async fn learn_quota(
        &self,
        ticket: &WriteTicket,
        target: Target<'_>,
        quotas: &Quotas,
        ttl: Duration,
    ) -> Result<Option<KeyStatus>, ControlError> {
        self.supports(quotas).map_err(|(_, error)| error)?;
        let ttl = ttl.clamp(Duration::from_millis(1), MAX_SUSPENSION);
        self.control_by(target, Control::Learn(quotas, ttl), Some(ticket))
            .await
    }

    /// Clears `target`'s route override when it is learned (an operator's stays), and its
    /// learning record, in one atomic call: a write started with `ticket`, as
    /// [`learn_quota`](Self::learn_quota).
    pub(crate) async fn unlearn_quota(
        &self,
        ticket: &WriteTicket,
        target: Target<'_>,
    ) -> Result<Option<KeyStatus>, ControlError> {
        self.control_by(target, Control::Unlearn, Some(ticket))
            .await
    }

    /// [`extend_suspension`](Self::extend_suspension) as a layer's write started with
    /// `ticket` (a pacing suspension after an upstream's answer): `None` when a caller's
    /// `suspend` or `resume` overtook it.
    pub(crate) async fn extend_suspension_by(
        &self,
        ticket: &WriteTicket,
        target: Target<'_>,
        duration: Duration,
    ) -> Result<Option<KeyStatus>, ControlError> {
        self.control_by(target, Control::Extend(duration), Some(ticket))
            .await
    }

    /// Registers a write a layer makes on its own on `target` (`kind`), before the answer that
    /// calls for it is handed back: a caller's control of that kind made after this wins over
    /// it (see [`Writes`]). The write goes through the ticket's methods; dropping the ticket
    /// ends it.
    pub(crate) fn start_write(&self, target: Target<'_>, kind: WriteKind) -> WriteTicket {
        let route = self.route_key(target);
        // The key the write's control writes (see `writes_tenant`): a suspension (`Extend`) of
        // an unscoped target is the tenant's, learning's is the route's.
        let key = match kind {
            WriteKind::Suspension if target.scope.is_none() => {
                crate::store::wire::layout::tenant_key(&route)
            }
            _ => route,
        };
        self.feature_state::<Writes>()
            .start(self.clone(), key, kind)
    }

    /// Suspends `target` fleet-wide for `duration` (1 µs to [`MAX_SUSPENSION`]): until then every
    /// decision on it is denied with [`Decision::suspended`](crate::Decision::suspended) set and
    /// `retry_after` the time left, whatever its quotas hold. The check happens inside the same
    /// atomic call as the decision. A new suspension replaces the old one, and wins over an
    /// [`OutboundLayer`](crate::outbound::OutboundLayer)'s write for an answer handed back
    /// before (see [after the response](crate::outbound#after-the-response)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// limiter.suspend("upstream", Duration::from_secs(30)).await?;
    /// let decision = *limiter.check("upstream", &Quota::per_second(10)?).await.decision().unwrap();
    /// assert!(decision.suspended && !decision.allowed);
    /// assert!(decision.retry_after <= Duration::from_secs(30));
    /// limiter.resume("upstream").await?;
    /// assert!(limiter.check("upstream", &Quota::per_second(10)?).await.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn suspend<'a>(
        &self,
        target: impl Into<Target<'a>>,
        duration: Duration,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::Suspend(duration)).await
    }

    /// Suspends `target` for at least `duration`, as [`suspend`](Self::suspend) does, except
    /// that a suspension that ends later stays as it is: the end becomes the later of its own
    /// and now + `duration`. For automatic suspensions (an upstream's `Retry-After`), which must
    /// never cut an operator's.
    pub async fn extend_suspension<'a>(
        &self,
        target: impl Into<Target<'a>>,
        duration: Duration,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::Extend(duration)).await
    }

    /// Ends a suspension of `target`. Made after an
    /// [`OutboundLayer`](crate::outbound::OutboundLayer) on this limiter handed an upstream's
    /// answer back, it wins over the suspension that answer calls for (see
    /// [after the response](crate::outbound#after-the-response)).
    pub async fn resume<'a>(
        &self,
        target: impl Into<Target<'a>>,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::Resume).await
    }

    /// Forgets the usage of `target`: every quota starts full again. An override and a
    /// suspension stay.
    pub async fn reset<'a>(
        &self,
        target: impl Into<Target<'a>>,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::Reset).await
    }

    /// What `target` looks like in the store, without consuming anything: its override, its
    /// suspension, its expiry and each tier's stored state. To see what a request would be told,
    /// peek with cost 0 ([`check_quotas`](Self::check_quotas)).
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Algorithm, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// assert!(limiter.inspect("k").await?.tiers.is_empty()); // fresh
    /// limiter.check("k", &Quota::per_minute(10)?).await;
    /// let status = limiter.inspect("k").await?;
    /// assert_eq!(status.tiers[0].algorithm, Some(Algorithm::TokenBucket));
    /// assert_eq!(status.tiers[0].fields[0], ("tokens", 9.0));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect<'a>(
        &self,
        target: impl Into<Target<'a>>,
    ) -> Result<KeyStatus, ControlError> {
        self.control(target, Control::Inspect).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Decision;
    use crate::quota::Quota;
    use crate::store::{CheckRequest, MemoryStore, Operation, OperationRequest, Store, StoreError};

    const NOW: u64 = 1_800_000_000_000_000;

    /// A route's reply after learning 40 a second for 10 minutes at [`NOW`], and its tenant's.
    fn learned() -> (ControlReply, ControlReply) {
        let store = MemoryStore::new();
        let forty = Quotas::from(Quota::per_second(40).unwrap());
        let request = |key, control| ControlRequest {
            key,
            algorithm: Algorithm::TokenBucket,
            control,
            now_micros: Some(NOW),
        };
        let ten_minutes = Duration::from_secs(600);
        let route = store.control_now(request("redlimit:{k}", Control::Learn(&forty, ten_minutes)));
        let tenant = store.control_now(request("redlimit:{k}#t", Control::Inspect));
        (route, tenant)
    }

    #[test]
    fn a_learning_records_end_is_read_back_bounded() {
        use OverrideSource::{Learned, Operator};
        let (route, tenant) = learned();
        let source = |record: Option<Vec<u8>>| {
            let reply = ControlReply {
                record,
                ..route.clone()
            };
            KeyStatus::decode(reply, &tenant).override_source
        };
        let written = route.record.clone().unwrap();
        let ending = |end: f64| {
            let mut record = written.clone();
            record[1..9].copy_from_slice(&end.to_le_bytes());
            record
        };
        let now = NOW as f64;
        let ten_minutes = Duration::from_secs(600);
        assert_eq!(
            source(Some(written.clone())),
            Some(Learned {
                left: Some(ten_minutes)
            })
        );
        // At most what a learning write sets.
        let longest = now + MAX_SUSPENSION.as_micros() as f64;
        assert_eq!(
            source(Some(ending(longest))),
            Some(Learned {
                left: Some(MAX_SUSPENSION)
            })
        );
        // Past it, or no time at all: over, never a quota for ever.
        let year = 365.0 * 86_400e6;
        for end in [
            longest + 1.0,
            now + 10.0 * year,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
            f64::NEG_INFINITY,
            -1e15,
            0.0,
            now,
        ] {
            let left = source(Some(ending(end)));
            assert_eq!(left, Some(Learned { left: None }), "{end}");
        }
        // Longer than its controls: still the mark, its end still bounded.
        let mut longer = ending(f64::INFINITY);
        longer.extend_from_slice(b"xyz");
        assert_eq!(source(Some(longer)), Some(Learned { left: None }));
        // Cut short, or no record: no mark, so the override is an operator's (learning never
        // takes an override it cannot prove its own).
        let mut short = written.clone();
        short.truncate(written.len() - 1);
        for record in [Some(short), Some(b"M".to_vec()), None] {
            assert_eq!(source(record.clone()), Some(Operator), "{record:?}");
        }
    }

    /// A memory store whose suspensions that extend take `delay` before they are applied: a
    /// pacing write held in flight.
    #[derive(Debug, Clone)]
    struct SlowExtensions {
        inner: MemoryStore,
        delay: Duration,
    }

    impl Store for SlowExtensions {
        fn check<'a>(
            &'a self,
            request: CheckRequest<'a>,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.inner.check(request)
        }

        /// The controls alone.
        fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
            let extends = match operation.request() {
                OperationRequest::Control(request) => matches!(request.control, Control::Extend(_)),
                _ => {
                    let refused = StoreError::Unsupported("controls only");
                    return Box::pin(std::future::ready(Err(refused)));
                }
            };
            Box::pin(async move {
                if extends {
                    tokio::time::sleep(self.delay).await;
                }
                self.inner.run(operation).await
            })
        }
    }

    fn suspended(status: &KeyStatus) -> bool {
        status.suspended_for.is_some()
    }

    #[tokio::test]
    async fn a_later_control_overtakes_a_layer_write_not_sent_yet() {
        let limiter = Limiter::new(MemoryStore::new());
        let wait = Duration::from_secs(60);
        // A resume after the write was started: the write is never sent.
        let ticket = limiter.start_write(Target::key("a"), WriteKind::Suspension);
        limiter.resume("a").await.unwrap();
        let written = limiter.extend_suspension_by(&ticket, Target::key("a"), wait);
        assert_eq!(written.await.unwrap(), None);
        assert!(!suspended(&limiter.inspect("a").await.unwrap()));
        // Nor a second write through the same ticket.
        let again = limiter.extend_suspension_by(&ticket, Target::key("a"), wait);
        assert_eq!(again.await.unwrap(), None);
        drop(ticket);
        assert!(
            limiter.feature_state::<Writes>().lock().is_empty(),
            "the ticket is gone"
        );

        // A control of another kind, or on another key (the route of a scope, not the
        // tenant), or made before the write started, does not.
        let ticket = limiter.start_write(Target::key("b"), WriteKind::Suspension);
        let quotas = Quotas::from(Quota::per_second(5).unwrap());
        limiter.set_quota("b", &quotas).await.unwrap();
        limiter.resume(Target::scoped("s", "b")).await.unwrap();
        let written = limiter.extend_suspension_by(&ticket, Target::key("b"), wait);
        assert!(suspended(&written.await.unwrap().unwrap()));
        limiter.resume("c").await.unwrap();
        let ticket = limiter.start_write(Target::key("c"), WriteKind::Suspension);
        let written = limiter.extend_suspension_by(&ticket, Target::key("c"), wait);
        assert!(suspended(&written.await.unwrap().unwrap()));

        // Learning's writes give way to an operator's quota controls.
        let ticket = limiter.start_write(Target::key("d"), WriteKind::Override);
        limiter.clear_quota("d").await.unwrap();
        let learned = limiter.learn_quota(&ticket, Target::key("d"), &quotas, wait);
        assert_eq!(learned.await.unwrap(), None);
        assert_eq!(limiter.inspect("d").await.unwrap().quota_override, None);
    }

    #[tokio::test]
    async fn a_later_control_lands_after_a_layer_write_being_sent() {
        let store = SlowExtensions {
            inner: MemoryStore::new(),
            delay: Duration::from_millis(200),
        };
        let limiter = Limiter::new(store);
        let ticket = limiter.start_write(Target::key("a"), WriteKind::Suspension);
        let write =
            limiter.extend_suspension_by(&ticket, Target::key("a"), Duration::from_secs(60));
        let resume = async {
            // Once the write is under way.
            tokio::time::sleep(Duration::from_millis(50)).await;
            limiter.resume("a").await.unwrap()
        };
        let (written, resumed) = tokio::join!(write, resume);
        assert!(suspended(&written.unwrap().unwrap()));
        assert!(!suspended(&resumed), "the resume landed before the write");
        assert!(!suspended(&limiter.inspect("a").await.unwrap()));
    }

    #[tokio::test]
    async fn a_control_dropped_while_it_waits_overtakes_nothing() {
        let store = SlowExtensions {
            inner: MemoryStore::new(),
            delay: Duration::from_millis(200),
        };
        let limiter = Limiter::new(store);
        let (first, second) = (
            limiter.start_write(Target::key("a"), WriteKind::Suspension),
            limiter.start_write(Target::key("a"), WriteKind::Suspension),
        );
        let wait = Duration::from_secs(60);
        let write = limiter.extend_suspension_by(&first, Target::key("a"), wait);
        let resume = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Dropped while it waits for the first write: never ran.
            let gave_up = tokio::time::timeout(Duration::from_millis(50), limiter.resume("a"));
            assert!(gave_up.await.is_err());
        };
        let (written, ()) = tokio::join!(write, resume);
        assert!(written.unwrap().is_some());
        // The second write was not overtaken by a control that never ran.
        let written = limiter.extend_suspension_by(&second, Target::key("a"), wait);
        assert!(written.await.unwrap().is_some());
        assert!(suspended(&limiter.inspect("a").await.unwrap()));
    }
}
