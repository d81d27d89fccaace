//! The request path under leases, and the background work: renewals, give-backs, sweeps.
//!
//! A request spends held units when the key's lease has enough. Otherwise it waits for the
//! renewal in flight, or, when none is, it renews itself: one store call of cost k (or of its
//! own cost at k = 1, which is exactly a check without leases), whose decision it gets.
//!
//! A renewal that other requests wait for is nobody's request: it runs as a task of its own on
//! the leases' runtime ([`LeaseTable::spawn`]), never inside the future of the request that
//! started it, which may be dropped at any await (a client that disconnects, a timeout, a
//! `select!`), parked (polled once, then neither polled nor dropped), or on a runtime that
//! idles or shuts down. That request only waits for its answer ([`Claim`]): dropped before it,
//! it leaves the renewal its units, which stay held; dropped with the answer come but unread,
//! it gives back the units the answer spent. A renewal's task dropped before its end (its
//! runtime shut down) ends it ([`Unfinished`]), which wakes the waiters to renew themselves. A
//! waiter waits no longer than the store's [`call_timeout`](crate::store::Store::call_timeout),
//! or [`WAIT_BOUND`] for a store that does not say: past it the failure policy answers. A lease
//! that ends (forgotten, released, idle, a control) wakes its waiters, which then start again
//! on the key's new lease (so a waiter's store call is a renewal like any other), or check as
//! without leases when the key cannot have one now.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;
use tokio::sync::oneshot;

use super::state::{Batch, Released, Reservation};
use super::{Counters, Lease, LeaseStats, LeaseTable};
use crate::core::{Answer, Ask, Limiter, PolicyLabel, StoreTimer, Taken, WeakLimiter};
use crate::decision::{Decision, Verdict};
use crate::quota::Quotas;
use crate::store::ops::StoreExt;
use crate::store::{RefundRequest, ReservedAt, StoreError};

/// How long a request waits for another's renewal when the store does not say how long its
/// calls take ([`Store::call_timeout`](crate::store::Store::call_timeout) is `None`): 1 s, as
/// the crate's other waits for a store's work in flight.
pub(crate) const WAIT_BOUND: Duration = Duration::from_secs(1);

/// When a request that waits for another's renewal stops waiting, and the bound that sets it;
/// `None` without a Tokio runtime (no timer to bound the wait with).
type Deadline = Option<(tokio::time::Instant, Duration)>;

/// What a request hears from the renewal it started when that renewal's task was dropped
/// unfinished (its runtime shut down).
const RENEWAL_GONE: &str =
    "the lease renewal this request started ended unanswered (its runtime shut down)";

/// What a request on a lease does next.
enum Step<'a> {
    /// Admitted from held units: the decision, when those units were reserved, and the size of
    /// a background renewal to start.
    Spent(Decision, Reservation, Option<u64>),
    /// Answered without the store (the deny cache, or the failed renewal it waited for).
    Answered(Answer),
    /// Wait for the renewal in flight (made under the lease's lock, so a renewal that ends
    /// after the look wakes it).
    Wait(Notified<'a>),
    /// Renew now, for this many units; the renewal ends the lease's renewals counted so far
    /// (its generation).
    Renew(u64, u64),
    /// The lease ended while this request waited: start again on the key's new lease.
    Ended,
}

impl Limiter {
    /// Decides a request of `cost` on `storage_key` under leases (see [`Leases`](super::Leases)).
    pub(super) async fn decide_leased(&self, leases: &LeaseTable, ask: Ask<'_>) -> Answer {
        let Ask {
            storage_key,
            quotas,
            cost,
            label,
            reserving,
            ..
        } = ask;
        let now = leases.now(self.clock());
        let lease = match leases.applies(quotas, cost) {
            true => leases.lease(storage_key, quotas, now),
            false => None,
        };
        let Some(mut lease) = lease else {
            return self.answer_direct(ask).await;
        };
        self.start_sweeping(leases);
        let mut waited_for = None;
        // Set when this request first waits.
        let mut deadline: Option<Deadline> = None;
        let mut now = Some(now);
        let (units, generation) = loop {
            let now = now.take().unwrap_or_else(|| leases.now(self.clock()));
            match self.step(
                leases,
                &lease,
                storage_key,
                cost,
                label,
                now,
                &mut waited_for,
            ) {
                Step::Spent(decision, reservation, prefetch) => {
                    self.counters().count_decision(&decision, label);
                    Counters::add(&leases.counters.spent, cost);
                    if let Some(ask) = prefetch {
                        self.spawn_prefetch(leases, lease.clone(), ask, label);
                    }
                    // A settlement gives these units back to the renewal's window.
                    let answer = Answer::decided(decision);
                    return self.reserved_by(answer, ask, leases, reservation);
                }
                Step::Answered(answer) => return answer,
                Step::Wait(notified) => {
                    let deadline = *deadline.get_or_insert_with(|| self.wait_deadline());
                    if let Err(bound) = wait_until(deadline, notified).await {
                        let request = self.request(storage_key, quotas, cost);
                        return self.fail(StoreError::Timeout(bound), request, label);
                    }
                    continue;
                }
                Step::Renew(units, generation) => break (units, generation),
                Step::Ended => {}
            }
            // The lease ended while this request waited: it starts again on the key's new
            // lease, so its store call is a renewal, whose units stay with the lease if the
            // request is dropped (a check of its own, dropped in flight, would consume units
            // that nobody spends).
            waited_for = None;
            match leases.lease(storage_key, quotas, now) {
                Some(new) => lease = new,
                // The table is full, or the key's hash holds another lease.
                None => {
                    let direct = self.answer_direct(ask);
                    return self
                        .within(deadline.flatten(), direct, storage_key, quotas, cost, label)
                        .await;
                }
            }
        };
        let renewal = self.renew(leases, &lease, generation, units, cost, label, reserving);
        self.within(
            deadline.flatten(),
            renewal,
            storage_key,
            quotas,
            cost,
            label,
        )
        .await
    }

    /// The end of a wait for another's renewal that starts now: the store's call timeout
    /// ([`WAIT_BOUND`] when it does not say) from now. That renewal should have ended by then.
    fn wait_deadline(&self) -> Deadline {
        let bound = self.store().call_timeout().unwrap_or(WAIT_BOUND);
        tokio::runtime::Handle::try_current().ok()?;
        Some((tokio::time::Instant::now().checked_add(bound)?, bound))
    }

    /// `decided` for a request that waited (so has a `deadline`): within the store's call
    /// timeout of its first wait, else the failure policy's answer (a renewal it started goes
    /// on in its task).
    async fn within(
        &self,
        deadline: Deadline,
        decided: impl Future<Output = Answer>,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        label: &PolicyLabel,
    ) -> Answer {
        let Some((deadline, timeout)) = deadline else {
            return decided.await;
        };
        match tokio::time::timeout_at(deadline, decided).await {
            Ok(answer) => answer,
            Err(_) => self.fail(
                StoreError::Timeout(timeout),
                self.request(key, quotas, cost),
                label,
            ),
        }
    }

    /// The decision for a request of `cost` on `storage_key` when the key's lease holds enough
    /// units: no store call, nothing to await, so a caller (the layer) need not box a future
    /// for it. `None` when it must wait ([`answer_later`]).
    ///
    /// [`answer_later`]: Limiter::answer_later
    pub(super) fn check_leased_now(&self, leases: &LeaseTable, ask: Ask<'_>) -> Option<Answer> {
        let Ask {
            storage_key,
            quotas,
            cost,
            label,
            ..
        } = ask;
        if !leases.applies(quotas, cost) {
            return None;
        }
        let lease = leases.find(storage_key, quotas)?;
        let now = leases.now(self.clock());
        let sizing = &leases.sizing;
        let (taken, prefetch, expired) = {
            let mut state = lease.state.lock().expect("lease");
            state.last_used = now;
            let expired = state.expire(now, sizing.interval);
            let taken = state.take(cost, now);
            let prefetch = taken
                .is_some()
                .then(|| state.start_prefetch(now, sizing))
                .flatten();
            (taken, prefetch, expired)
        };
        self.release(leases, storage_key, quotas, expired);
        let (decision, reservation) = taken?;
        self.counters().count_decision(&decision, label);
        Counters::add(&leases.counters.spent, cost);
        if let Some(ask) = prefetch {
            self.spawn_prefetch(leases, lease, ask, label);
        }
        Some(self.reserved_by(Answer::decided(decision), ask, leases, reservation))
    }

    /// `answer`, spent from units `reservation` reserved: for a check that reserves, dated by
    /// that renewal.
    fn reserved_by(
        &self,
        answer: Answer,
        ask: Ask<'_>,
        leases: &LeaseTable,
        reservation: Reservation,
    ) -> Answer {
        match ask.reserving {
            true => answer.taken(Taken::Renewal(leases.renewal(self.clock(), reservation))),
            false => answer,
        }
    }

    /// One look at the lease, under its lock, at `now`.
    #[allow(clippy::too_many_arguments)]
    fn step<'a>(
        &self,
        leases: &LeaseTable,
        lease: &'a Lease,
        key: &str,
        cost: u64,
        label: &PolicyLabel,
        now: u64,
        waited_for: &mut Option<u64>,
    ) -> Step<'a> {
        let sizing = &leases.sizing;
        let mut state = lease.state.lock().expect("lease");
        state.last_used = now;
        let expired = state.expire(now, sizing.interval);
        let step = if let Some((decision, reservation)) = state.take(cost, now) {
            Step::Spent(decision, reservation, state.start_prefetch(now, sizing))
        } else if waited_for.is_some_and(|g| state.generation > g) && state.last_failed {
            // The renewal this request waited for failed: the failure policy answers, without
            // another store call per waiter.
            let request = self.request(key, &lease.quotas, cost);
            drop(state);
            Step::Answered(self.fail(
                StoreError::Unavailable("the lease renewal this request waited for failed"),
                request,
                label,
            ))
        } else if state.detached {
            Step::Ended
        } else if state.renewing {
            *waited_for = Some(state.generation);
            Step::Wait(lease.renewed.notified())
        } else if let Some(decision) = self.cached_denial(key, &lease.quotas, cost, label) {
            Step::Answered(Answer::decided(decision))
        } else {
            state.renewing = true;
            Step::Renew(state.plan(now, cost, sizing), state.generation)
        };
        self.release(leases, key, &lease.quotas, expired);
        step
    }

    /// A denial of the deny cache for this request (counted), if it holds one.
    fn cached_denial(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        label: &PolicyLabel,
    ) -> Option<Decision> {
        let cache = self.deny_cache()?;
        let now = cache.now(self.clock().now_micros());
        let decision = cache.lookup(key, quotas, cost, now)?;
        self.counters().count_cached_denial(label);
        Some(decision)
    }

    /// The renewal a request starts and waits on: `ask` units, `cost` of them its own (see
    /// [`renewal`](Self::renewal)), run as a task on the leases' runtime, so that it ends and
    /// wakes the waiters whatever becomes of this request. `generation`: the lease's renewals
    /// counted when this one was marked. Only without any Tokio runtime does the request run
    /// it itself.
    #[allow(clippy::too_many_arguments)]
    async fn renew(
        &self,
        leases: &LeaseTable,
        lease: &Arc<Lease>,
        generation: u64,
        ask: u64,
        cost: u64,
        label: &PolicyLabel,
        reserving: bool,
    ) -> Answer {
        let (send, answer) = oneshot::channel();
        let mut claim = Claim {
            limiter: self,
            lease,
            generation,
            answer,
            read: false,
        };
        // Armed before the task is spawned: a task dropped before its first poll ends the
        // renewal too.
        let unfinished = Unfinished::new(lease.clone());
        let (limiter, owned, owned_label) = (self.clone(), lease.clone(), label.clone());
        let renewal = async move {
            let delivery = limiter
                .renewal(&owned, ask, cost, &owned_label, reserving)
                .await;
            unfinished.disarm();
            if let Some(delivery) = delivery {
                if let Err(unread) = send.send(delivery) {
                    // The request went away after the renewal had spent its units.
                    limiter.unclaimed(&owned, unread);
                }
            }
        };
        if let Err(renewal) = leases.spawn(renewal) {
            renewal.await;
        }
        let (key, quotas) = (&*lease.key, &lease.quotas);
        match claim.answer().await {
            Some(Delivery::Decided(answer, _)) => {
                if let Verdict::Decided(decision) = &answer.verdict {
                    self.counters().count_decision(decision, label);
                }
                answer
            }
            Some(Delivery::Failed(error)) => {
                self.fail(error, self.request(key, quotas, cost), label)
            }
            None => self.fail(
                StoreError::Unavailable(RENEWAL_GONE),
                self.request(key, quotas, cost),
                label,
            ),
        }
    }

    /// A renewal of `ask` units, `cost` of them for the request that started it. A denial of
    /// more than `cost` is asked again for what is left (so the last units of a quota are
    /// leased too), then for `cost` alone (so the denial is exactly the one a check would
    /// get). What the request gets (not counted yet: counted when it reads it), or `None` when
    /// the request was dropped meanwhile (its units then stay held).
    async fn renewal(
        &self,
        lease: &Lease,
        mut ask: u64,
        cost: u64,
        label: &PolicyLabel,
        reserving: bool,
    ) -> Option<Delivery> {
        let leases = self.delegate::<LeaseTable>()?;
        let (key, quotas) = (&*lease.key, &lease.quotas);
        loop {
            let sent = leases.now(self.clock());
            let started =
                (self.deny_cache()).map(|c| c.start(key, c.now(self.clock().now_micros())));
            let result = self.lease_call(leases, key, quotas, ask, label).await;
            let (decision, decided) = match result {
                Ok(answer) => answer,
                Err(error) => {
                    let abandoned = {
                        let mut state = lease.state.lock().expect("lease");
                        let abandoned = state.abandoned;
                        state.finish(true);
                        abandoned
                    };
                    lease.renewed.notify_waiters();
                    return (!abandoned).then_some(Delivery::Failed(error));
                }
            };
            if decision.allowed {
                let mut state = lease.state.lock().expect("lease");
                let abandoned = state.abandoned;
                let spent = if abandoned { 0 } else { cost };
                let answer = state.granted(
                    ask - spent,
                    spent,
                    &decision,
                    (sent, decided),
                    &leases.sizing,
                );
                let detached = state
                    .detached
                    .then(|| state.clear(leases.now(self.clock()), leases.sizing.interval));
                state.finish(false);
                drop(state);
                lease.renewed.notify_waiters();
                Counters::add(&leases.counters.spent, spent);
                if let Some(released) = detached {
                    self.release(leases, key, quotas, released);
                }
                if let Some(cache) = self.deny_cache() {
                    cache.admitted(key, quotas, ask);
                }
                if abandoned {
                    return None;
                }
                // The request's units are this renewal's.
                let reservation = Reservation { sent, decided };
                let answer = Answer::decided(answer);
                let answer = match reserving {
                    true => answer.taken(Taken::Renewal(leases.renewal(self.clock(), reservation))),
                    false => answer,
                };
                let units = Batch::of(spent, &decision, (sent, decided), &leases.sizing);
                return Some(Delivery::Decided(answer, Some(units)));
            }
            let (released, abandoned) = {
                let mut state = lease.state.lock().expect("lease");
                let abandoned = state.abandoned;
                if ask > cost && !decision.suspended && !abandoned {
                    ask = match decision.remaining {
                        left if left >= cost && left < ask => left,
                        _ => cost,
                    };
                    continue;
                }
                let released = decision
                    .suspended
                    .then(|| state.clear(leases.now(self.clock()), leases.sizing.interval));
                state.finish(false);
                (released, abandoned)
            };
            lease.renewed.notify_waiters();
            if let Some(released) = released {
                self.release(leases, key, quotas, released);
            }
            if let (Some(cache), Some(started)) = (self.deny_cache(), started) {
                let now = cache.now(self.clock().now_micros());
                cache.remember(key, quotas, cost, &decision, now, started);
            }
            if abandoned {
                return None;
            }
            return Some(Delivery::Decided(Answer::decided(decision), None));
        }
    }

    /// A renewal's answer that its request never read (it went away after the renewal had
    /// spent its units): those units go back to the store, as a lease's do when it ends.
    fn unclaimed(&self, lease: &Lease, delivery: Delivery) {
        let (Delivery::Decided(_, Some(units)), Some(leases)) =
            (delivery, self.delegate::<LeaseTable>())
        else {
            return;
        };
        leases
            .counters
            .spent
            .fetch_sub(units.units, Ordering::Relaxed);
        let now = leases.now(self.clock());
        let released = Released::of(&units, now, leases.sizing.interval);
        self.release(leases, &lease.key, &lease.quotas, released);
    }

    /// One store call of cost `ask` for a lease.
    async fn lease_call(
        &self,
        leases: &LeaseTable,
        key: &str,
        quotas: &Quotas,
        ask: u64,
        label: &PolicyLabel,
    ) -> Result<(Decision, Option<u64>), StoreError> {
        let timer = StoreTimer::start();
        // Asked when the store admits (on its own clock): a give-back of these units sends it.
        let request = self.request(key, quotas, ask);
        let result = self.store().check_timed(request, None).await;
        timer.stop(label);
        Counters::add(&leases.counters.renewals, 1);
        if let Ok((decision, _)) = &result {
            if decision.allowed {
                Counters::add(&leases.counters.leased, ask);
            }
        } else {
            self.counters().count_store_error();
        }
        result
    }

    /// Starts a background renewal of `ask` units (the lease is marked renewing already), as
    /// a task on the leases' runtime; without one, ends it at once.
    fn spawn_prefetch(
        &self,
        leases: &LeaseTable,
        lease: Arc<Lease>,
        ask: u64,
        label: &PolicyLabel,
    ) {
        // Armed before the task is spawned: a task dropped before its first poll (or not
        // spawned) ends the renewal too.
        let unfinished = Unfinished::new(lease.clone());
        let (limiter, label) = (self.clone(), label.clone());
        let prefetch = async move {
            limiter.prefetch(&lease, ask, &label).await;
            unfinished.disarm();
        };
        let _ = leases.spawn(prefetch);
    }

    /// A background renewal: like [`renew`](Self::renew) with no request of its own. A denial
    /// leaves the lease to run out (the next request then renews and gets the denial); a
    /// suspension ends it at once.
    async fn prefetch(&self, lease: &Lease, mut ask: u64, label: &PolicyLabel) {
        let Some(leases) = self.delegate::<LeaseTable>() else {
            return;
        };
        let (key, quotas) = (&*lease.key, &lease.quotas);
        loop {
            let sent = leases.now(self.clock());
            let result = self.lease_call(leases, key, quotas, ask, label).await;
            let mut state = lease.state.lock().expect("lease");
            let now = leases.now(self.clock());
            let released = match result {
                Ok((decision, decided)) if decision.allowed => {
                    state.granted(ask, 0, &decision, (sent, decided), &leases.sizing);
                    state
                        .detached
                        .then(|| state.clear(now, leases.sizing.interval))
                }
                Ok((decision, _))
                    if !decision.suspended && (1..ask).contains(&decision.remaining) =>
                {
                    ask = decision.remaining;
                    continue;
                }
                Ok((decision, _)) => decision
                    .suspended
                    .then(|| state.clear(now, leases.sizing.interval)),
                Err(_) => {
                    state.finish(true);
                    drop(state);
                    lease.renewed.notify_waiters();
                    return;
                }
            };
            state.finish(false);
            drop(state);
            lease.renewed.notify_waiters();
            if let Some(released) = released {
                self.release(leases, key, quotas, released);
            }
            return;
        }
    }

    /// Gives `released` units of `key` back to the store in the background (the stranded ones
    /// are only counted).
    fn release(&self, leases: &LeaseTable, key: &str, quotas: &Quotas, released: Released) {
        Counters::add(&leases.counters.stranded, released.stranded);
        if released.returnable == 0 {
            return;
        }
        let returning = Returning::start(self.clone(), released.returnable);
        let (key, quotas) = (Box::<str>::from(key), *quotas);
        let give_back = async move {
            let limiter = returning.limiter.clone();
            limiter.give_back(&key, &quotas, released, returning).await
        };
        // Without a runtime the give-back is dropped unsent: its units are stranded.
        let _ = leases.spawn(give_back);
    }

    /// Gives the returnable units of `released` back to the store, never above a tier's
    /// capacity, and only to the window (and reset) their oldest renewal was sent in: the
    /// store's refund (as [`Limiter::refund`] does), without ending the key's lease as `refund`
    /// would.
    async fn give_back(
        &self,
        key: &str,
        quotas: &Quotas,
        released: Released,
        returning: Returning,
    ) {
        let Some(leases) = self.delegate::<LeaseTable>() else {
            return;
        };
        let units = released.returnable;
        if units == 0 {
            return;
        }
        // The lease table's µs: the client clock's; else the store's time of the admission
        // when it told, or the age on the table's own monotonic clock.
        let sent = released.reserved.unwrap_or(0);
        let reserved = match (self.clock().now_micros(), released.decided) {
            (Some(_), _) => ReservedAt::Client(sent),
            (None, Some(at)) => ReservedAt::Store(at),
            (None, None) => ReservedAt::Ago(leases.now(self.clock()).saturating_sub(sent)),
        };
        let request = RefundRequest {
            key,
            algorithm: self.algorithm(),
            quotas,
            units,
            reserved,
        };
        match self.store().refund(request).await {
            // No tier took any (a reset since, the window gone, every tier full): stranded.
            Ok(tiers) => returning.end(tiers > 0),
            // Never retried: a give-back landing late could reach a fixed window's next window.
            Err(error) => {
                tracing::debug!(%error, units, "lease give-back failed; its units are stranded");
                returning.end(false);
            }
        }
        if let Some(cache) = self.deny_cache() {
            // A cached denial may now be too long.
            cache.forget(key);
        }
    }

    /// Starts the sweeper once: every interval it ends expired batches and idle leases, giving
    /// their units back. It holds the limiter weakly and stops when the limiter is dropped.
    fn start_sweeping(&self, leases: &LeaseTable) {
        if leases.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let sweeper = Sweeper(self.downgrade());
        let every = leases.config.interval;
        // Without a runtime the sweeper is dropped, and the next request tries again.
        let _ = leases.spawn(sweep(sweeper, every));
    }

    /// Ends every lease of this limiter and gives its unspent units back to the store (never
    /// above a tier's capacity): call it on shutdown, with
    /// [`flush_settlements`](Self::flush_settlements) when layers settle costs. Returns the
    /// units given back. Without leases it does nothing.
    ///
    /// ```
    /// use redlimit::{limiter::Leases, store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).leases(Leases::default()).build().unwrap();
    /// limiter.check("k", &Quota::per_second(100).unwrap()).await;
    /// limiter.release_leases().await;
    /// assert_eq!(limiter.lease_stats().held, 0);
    /// # }
    /// ```
    pub async fn release_leases(&self) -> u64 {
        let Some(leases) = self.delegate::<LeaseTable>() else {
            return 0;
        };
        let now = leases.now(self.clock());
        // Every drained unit is accounted for at once (held until its give-back is answered),
        // so a caller that drops this future mid-way strands the rest instead of losing them.
        let drained: Vec<_> = leases
            .drain(now)
            .into_iter()
            .map(|(key, quotas, released)| {
                Counters::add(&leases.counters.stranded, released.stranded);
                let returning = Returning::start(self.clone(), released.returnable);
                (key, quotas, released, returning)
            })
            .collect();
        let mut returned = 0;
        for (key, quotas, released, returning) in drained {
            self.give_back(&key, &quotas, released, returning).await;
            returned += released.returnable;
        }
        returned
    }

    /// What this limiter's leases did so far (all zero without leases).
    ///
    /// ```
    /// use redlimit::{limiter::Leases, store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter = Limiter::builder(MemoryStore::new()).leases(Leases::default()).build().unwrap();
    /// limiter.check("k", &Quota::per_second(100).unwrap()).await;
    /// let stats = limiter.lease_stats();
    /// // A first request on a key is one store call of its own cost, as without leases.
    /// assert_eq!((stats.renewals, stats.leased, stats.spent), (1, 1, 1));
    /// # }
    /// ```
    pub fn lease_stats(&self) -> LeaseStats {
        self.delegate::<LeaseTable>()
            .map(LeaseTable::snapshot)
            .unwrap_or_default()
    }

    /// Ends the leases of every scope of `tenant` (a tenant's unscoped storage key), giving
    /// their units back unless `give_back` is false (the control hook; a reset's units were
    /// leased before it and must not come back after it: they are stranded): nothing that
    /// starts after it is admitted from units leased before.
    pub(super) fn end_tenant_leases(&self, leases: &LeaseTable, tenant: &str, give_back: bool) {
        let now = leases.now(self.clock());
        for (key, quotas, released) in leases.remove_tenant(tenant, now) {
            if give_back {
                self.release(leases, &key, &quotas, released);
            } else {
                let units = released.stranded + released.returnable;
                Counters::add(&leases.counters.stranded, units);
            }
        }
    }

    /// Ends `storage_key`'s lease, giving its units back (the forget hook).
    pub(super) fn end_lease(&self, leases: &LeaseTable, storage_key: &str) {
        let now = leases.now(self.clock());
        if let Some((quotas, released)) = leases.remove(storage_key, now) {
            self.release(leases, storage_key, &quotas, released);
        }
    }
}

/// Waits for `notified` until `deadline`; the bound that set it when it ran out.
async fn wait_until(deadline: Deadline, notified: Notified<'_>) -> Result<(), Duration> {
    let Some((deadline, bound)) = deadline else {
        notified.await;
        return Ok(());
    };
    tokio::time::timeout_at(deadline, notified)
        .await
        .map_err(|_| bound)
}

/// What a renewal hands the request that started it.
enum Delivery {
    /// Its answer, and the units it spent of the renewal (none for a denial): given back if the
    /// request went away before it read the answer.
    Decided(Answer, Option<Batch>),
    /// The store failed: the failure policy answers the request.
    Failed(StoreError),
}

/// A request's wait for the renewal it started (which runs in a task of its own). Dropped
/// before the answer came (the request's future was), it leaves its units to the renewal:
/// they stay held for the next requests. Dropped with the answer come but unread, it gives back
/// the units the answer spent.
struct Claim<'a> {
    limiter: &'a Limiter,
    lease: &'a Lease,
    /// The lease's renewals counted when this one was marked: a renewal that ended since is
    /// not this one.
    generation: u64,
    answer: oneshot::Receiver<Delivery>,
    read: bool,
}

impl Claim<'_> {
    /// The renewal's answer; `None` when its task ended without one (its runtime shut down).
    async fn answer(&mut self) -> Option<Delivery> {
        let delivery = (&mut self.answer).await.ok();
        self.read = true;
        delivery
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.read {
            return;
        }
        if let Ok(mut state) = self.lease.state.lock() {
            if state.renewing && state.generation == self.generation {
                state.abandoned = true;
            }
        }
        // Either the renewal sent its answer before this, or its send fails and it gives the
        // units back itself.
        self.answer.close();
        if let Ok(delivery) = self.answer.try_recv() {
            self.limiter.unclaimed(self.lease, delivery);
        }
    }
}

/// Ends a lease's renewal if the future running it is dropped first (a task cancelled at
/// shutdown, or dropped unspawned): the waiters wake and renew themselves.
struct Unfinished(Option<Arc<Lease>>);

impl Unfinished {
    fn new(lease: Arc<Lease>) -> Self {
        Unfinished(Some(lease))
    }

    /// The renewal ended itself.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take() {
            if let Ok(mut state) = lease.state.lock() {
                state.finish(false);
            }
            lease.renewed.notify_waiters();
        }
    }
}

/// The sweeper's hold on its limiter (weak). Dropped while the limiter lives (its task was
/// dropped: its runtime shut down, or there was none), it lets the next request start another.
struct Sweeper(WeakLimiter);

impl Drop for Sweeper {
    fn drop(&mut self) {
        if let Some(limiter) = self.0.upgrade() {
            if let Some(leases) = limiter.delegate::<LeaseTable>() {
                leases.sweeping.store(false, Ordering::Relaxed);
            }
        }
    }
}

/// The sweeper's loop (see [`Limiter::start_sweeping`]).
async fn sweep(sweeper: Sweeper, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(limiter) = sweeper.0.upgrade() else {
            return;
        };
        let Some(leases) = limiter.delegate::<LeaseTable>() else {
            return;
        };
        let now = leases.now(limiter.clock());
        for (key, quotas, released) in leases.sweep(now) {
            limiter.release(leases, &key, &quotas, released);
        }
    }
}

/// Units given back to the store and not yet answered: counted as held until the store answers
/// (then returned, or stranded when it failed), and stranded when the give-back is dropped
/// first, so `leased = spent + held + returned + stranded` holds while it is in flight.
pub(super) struct Returning {
    limiter: Limiter,
    units: u64,
}

impl Returning {
    fn start(limiter: Limiter, units: u64) -> Self {
        if let Some(leases) = limiter.delegate::<LeaseTable>() {
            Counters::add(&leases.counters.returning, units);
        }
        Returning { limiter, units }
    }

    /// The store answered: the units went back (`returned`), or not (`stranded`).
    fn end(mut self, returned: bool) {
        self.settle(returned);
    }

    fn settle(&mut self, returned: bool) {
        let units = std::mem::take(&mut self.units);
        if let (Some(leases), true) = (self.limiter.delegate::<LeaseTable>(), units > 0) {
            let counters = &leases.counters;
            Counters::add(
                if returned {
                    &counters.returned
                } else {
                    &counters.stranded
                },
                units,
            );
            counters.returning.fetch_sub(units, Ordering::Relaxed);
        }
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.settle(false);
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use futures::future::BoxFuture;
    use tokio::task::JoinHandle;

    use crate::clock::{Clock, ManualClock};
    use crate::core::{Answer, Ask, Limiter, PolicyLabel, Target};
    use crate::decision::{Decision, Verdict};
    use crate::lease::{LeaseTable, Leases};
    use crate::quota::{Quota, Quotas};
    use crate::store::{CheckRequest, MemoryStore, Operation, OperationRequest, Store, StoreError};

    impl Limiter {
        /// The answer of this limiter's leases at once, as the core asks for it.
        fn leased_now(&self, ask: Ask<'_>) -> Option<Answer> {
            self.check_leased_now(self.delegate::<LeaseTable>().expect("leases on"), ask)
        }
    }

    /// A memory store that counts its checks and peeks (checks of cost 0), can leave its
    /// first check unanswered for good (a store that breaks its own timeout), and can answer
    /// each check after a `delay` (a timer of the runtime that first polls the call).
    #[derive(Debug, Default)]
    struct Probe {
        memory: MemoryStore,
        checks: Arc<AtomicU64>,
        peeks: Arc<AtomicU64>,
        hang_first: Arc<AtomicBool>,
        hang_refunds: Arc<AtomicBool>,
        timeout: Option<Duration>,
        delay: Duration,
    }

    /// A future that never answers when `hang`, else `answer`.
    fn hang_or<'a, T: Send + 'a>(hang: bool, answer: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        if hang {
            Box::pin(std::future::pending())
        } else {
            answer
        }
    }

    impl Store for Probe {
        fn check<'a>(
            &'a self,
            request: CheckRequest<'a>,
        ) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.checks.fetch_add(1, Ordering::Relaxed);
            if request.cost == 0 {
                self.peeks.fetch_add(1, Ordering::Relaxed);
            }
            let hang = self.hang_first.swap(false, Ordering::Relaxed);
            let (answer, delay) = (self.memory.check(request), self.delay);
            if delay.is_zero() {
                return hang_or(hang, answer);
            }
            hang_or(
                hang,
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    answer.await
                }),
            )
        }

        /// Refunds (which may hang) and controls; a decision that tells its time is refused,
        /// so that it goes through `check` above.
        fn run<'a>(&'a self, operation: Operation<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
            match operation.request() {
                OperationRequest::Refund(_) => hang_or(
                    self.hang_refunds.load(Ordering::Relaxed),
                    self.memory.run(operation),
                ),
                OperationRequest::Control(_) => self.memory.run(operation),
                _ => Box::pin(std::future::ready(Err(StoreError::Unsupported("probe")))),
            }
        }

        fn call_timeout(&self) -> Option<Duration> {
            self.timeout
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn background_renewals_never_peek_after_the_rate_falls() {
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let probe = Probe::default();
        let (checks, peeks) = (probe.checks.clone(), probe.peeks.clone());
        let limiter = Limiter::builder(probe)
            .clock(Clock::Manual(clock.clone()))
            .leases(Leases::new(Duration::from_millis(50)))
            .build()
            .unwrap();
        let quota = Quota::per_second(1_000_000).unwrap();
        // One request every 10 µs for 100 ms, then one every 80 µs for 400 ms: the rate falls
        // eightfold.
        for (every, for_) in [(10, 100_000), (80, 400_000)] {
            for _ in 0..for_ / every {
                assert!(limiter.check("hot", &quota).await.is_allowed());
                clock.advance(Duration::from_micros(every));
                // Lets a background renewal run.
                tokio::task::yield_now().await;
            }
        }
        let (checks, peeks) = (
            checks.load(Ordering::Relaxed),
            peeks.load(Ordering::Relaxed),
        );
        assert!(checks > 10, "the lease was renewed: {checks}");
        assert_eq!(peeks, 0, "{peeks} of {checks} store calls were peeks");
    }

    /// A limiter with leases on a [`Probe`] that states `timeout` and never answers its first
    /// check, and the first request for `target` spawned: its renewal stays in flight for good,
    /// whatever the store's timeout says.
    async fn with_a_renewal_hung(
        timeout: Option<Duration>,
        target: Target<'static>,
    ) -> (Limiter, JoinHandle<Verdict>) {
        let probe = Probe {
            hang_first: Arc::new(AtomicBool::new(true)),
            timeout,
            ..Probe::default()
        };
        let checks = probe.checks.clone();
        let limiter = Limiter::builder(probe)
            .leases(Leases::default())
            .build()
            .unwrap();
        let first = spawn_check(&limiter, target);
        while checks.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (limiter, first)
    }

    /// A request of cost 1 for `target` under a quota far from spent, in a task of its own.
    fn spawn_check(limiter: &Limiter, target: Target<'static>) -> JoinHandle<Verdict> {
        let limiter = limiter.clone();
        let quota = Quota::per_hour(1_000).unwrap();
        tokio::spawn(async move { limiter.check_quotas(target, &quota.into(), 1).await })
    }

    /// The second request for `target` waits for the first one's renewal, which never answers,
    /// until `end` ends the lease (`ended` says how, for the failure): then it is answered at
    /// once.
    async fn a_waiter_is_woken_when_the_lease_ends<F: Future<Output = ()>>(
        target: Target<'static>,
        end: impl FnOnce(Limiter) -> F,
        ended: &str,
    ) {
        let (limiter, first) = with_a_renewal_hung(None, target).await;
        let second = spawn_check(&limiter, target);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!second.is_finished(), "it waits for the renewal in flight");
        end(limiter).await;
        let second = tokio::time::timeout(Duration::from_secs(5), second).await;
        assert!(
            second.is_ok_and(|verdict| verdict.unwrap().is_allowed()),
            "the waiting request was still pending 5 s after {ended}"
        );
        first.abort();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_request_waits_for_a_renewal_no_longer_than_the_store_timeout_then_the_policy_answers(
    ) {
        let timeout = Duration::from_millis(100);
        let (limiter, first) = with_a_renewal_hung(Some(timeout), "k".into()).await;
        let quota = Quota::per_hour(1_000).unwrap();
        for _ in 0..3 {
            let waited = tokio::time::timeout(timeout * 20, limiter.check("k", &quota)).await;
            assert_eq!(
                waited.ok(),
                Some(Verdict::FailedOpen),
                "a waiter was still pending after 20 store timeouts"
            );
        }
        assert_eq!(limiter.stats().failed_open, 3);
        first.abort();
    }

    /// A control through the limiter ends the tenant's leases on every scope, and wakes the
    /// requests waiting on them, as `forget` does (this store states no timeout, so nothing
    /// else would).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_control_wakes_the_requests_waiting_for_its_tenants_renewal() {
        let resume = |limiter: Limiter| async move {
            limiter.resume("k").await.unwrap();
        };
        let target = Target::scoped("api", "k");
        a_waiter_is_woken_when_the_lease_ends(target, resume, "a control on its tenant").await;
    }

    /// Units on their way back to the store still balance the counters: held until the store
    /// answers, and stranded when the give-back is dropped unanswered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn lease_counters_balance_while_a_give_back_is_in_flight_and_after_it_is_dropped() {
        let probe = Probe::default();
        let hang = probe.hang_refunds.clone();
        let limiter = Limiter::builder(probe)
            .leases(Leases::default())
            .build()
            .unwrap();
        let quota = Quota::per_second(1_000_000).unwrap();
        for _ in 0..200 {
            assert!(limiter.check("hot", &quota).await.is_allowed());
            tokio::task::yield_now().await;
        }
        let balanced =
            |s: crate::lease::LeaseStats| s.leased == s.spent + s.held + s.returned + s.stranded;
        hang.store(true, Ordering::Relaxed);
        let held = limiter.lease_stats().held;
        assert!(
            held > 0,
            "the lease holds units: {:?}",
            limiter.lease_stats()
        );
        // A give-back that never answers (in a task), then one dropped by its caller.
        limiter.forget("hot");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = limiter.lease_stats();
        assert!(balanced(stats), "a give-back in flight: {stats:?}");
        for _ in 0..200 {
            assert!(limiter.check("hot", &quota).await.is_allowed());
            tokio::task::yield_now().await;
        }
        let release = tokio::time::timeout(Duration::from_millis(50), limiter.release_leases());
        assert!(release.await.is_err(), "the give-back never answers");
        let stats = limiter.lease_stats();
        assert!(
            balanced(stats),
            "a release_leases dropped by its caller: {stats:?}"
        );
        assert!(
            stats.stranded > 0,
            "the dropped give-back's units are stranded: {stats:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn forgetting_a_key_wakes_the_requests_waiting_for_its_renewal() {
        let forget = |limiter: Limiter| async move { limiter.forget("k") };
        a_waiter_is_woken_when_the_lease_ends("k".into(), forget, "its key was forgotten").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_held_lease_answers_without_a_future_and_anything_else_is_left_to_the_check() {
        let limiter = Limiter::builder(MemoryStore::new())
            .leases(Leases::default())
            .build()
            .unwrap();
        let quotas = Quotas::from(Quota::per_second(1_000_000).unwrap());
        let key = limiter.storage_key("hot");
        let label = PolicyLabel::direct();
        assert!(
            limiter
                .leased_now(Ask::new(&key, &quotas, 1, &label))
                .is_none(),
            "no lease yet"
        );
        for _ in 0..100 {
            limiter.answer(Ask::new(&key, &quotas, 1, &label)).await;
        }
        let held = limiter.lease_stats().held;
        assert!(held > 0);
        let verdict = limiter
            .leased_now(Ask::new(&key, &quotas, 1, &label))
            .unwrap()
            .verdict;
        assert!(verdict.is_allowed());
        let stats = limiter.lease_stats();
        assert_eq!(stats.spent, 101);
        assert_eq!(limiter.stats().allowed, 101);
        // Other quotas, a peek, a cost above what is held: the usual check.
        let other = Quotas::from(Quota::per_second(999_999).unwrap());
        assert!(limiter
            .leased_now(Ask::new(&key, &other, 1, &label))
            .is_none());
        assert!(limiter
            .leased_now(Ask::new(&key, &quotas, 0, &label))
            .is_none());
        assert!(limiter
            .leased_now(Ask::new(&key, &quotas, u64::MAX, &label))
            .is_none());
    }

    /// Polls `future` once.
    async fn poll_once<F: Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx)))
            .await
    }

    /// What becomes of the runtime a request started its key's renewal on, once it has polled
    /// that request once and left it parked (neither polled nor dropped).
    #[derive(Debug, Clone, Copy)]
    enum Then {
        /// Nothing drives it any more.
        Idles,
        /// It shuts down.
        ShutsDown,
    }

    /// A request on a key whose store answers in 20 ms is polled once on a runtime of its own,
    /// which then idles or shuts down with the request parked: the renewal that request started
    /// is nobody's, and the later requests on the key are decided by the store within a few
    /// store calls, not after a wait bound (this store states no timeout).
    async fn a_renewal_started_on_a_runtime_that(then: Then) {
        let probe = Probe {
            delay: Duration::from_millis(20),
            ..Probe::default()
        };
        let limiter = Limiter::builder(probe)
            .leases(Leases::default())
            .build()
            .unwrap();
        let quota = Quota::per_hour(1_000).unwrap();
        let (polled, first_poll) = tokio::sync::oneshot::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let other = limiter.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let mut parked = Box::pin(other.check("k", &quota));
            let pending = runtime.block_on(poll_once(&mut parked)).is_pending();
            if let Then::ShutsDown = then {
                drop(runtime);
                polled.send(pending).unwrap();
                released.recv().unwrap();
            } else {
                polled.send(pending).unwrap();
                released.recv().unwrap();
                drop(runtime);
            }
            drop(parked);
        });
        assert!(first_poll.await.unwrap(), "the store answers in 20 ms");
        let mut answers = Vec::new();
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let verdict = tokio::time::timeout(Duration::from_secs(5), limiter.check("k", &quota));
            answers.push((verdict.await, started.elapsed()));
        }
        release.send(()).unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap();
        for (verdict, took) in &answers {
            assert!(
                matches!(verdict, Ok(Verdict::Decided(d)) if d.allowed)
                    && *took < Duration::from_millis(500),
                "{then:?}: a later request: {verdict:?} after {took:?} (all: {answers:?})"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_started_on_a_runtime_that_then_idles_holds_up_no_later_request() {
        a_renewal_started_on_a_runtime_that(Then::Idles).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_started_on_a_runtime_that_then_shuts_down_holds_up_no_later_request() {
        a_renewal_started_on_a_runtime_that(Then::ShutsDown).await;
    }

    /// A store that states no timeout never answers the first request's renewal: a request
    /// waiting for it gets the failure policy's answer after 1 s ([`super::WAIT_BOUND`]).
    #[tokio::test(start_paused = true)]
    async fn without_a_store_timeout_a_waiter_waits_for_a_renewal_one_second_then_the_policy_answers(
    ) {
        let (limiter, first) = with_a_renewal_hung(None, "k".into()).await;
        let quota = Quota::per_hour(1_000).unwrap();
        let started = tokio::time::Instant::now();
        let waited = tokio::time::timeout(Duration::from_secs(20), limiter.check("k", &quota));
        assert_eq!(waited.await.ok(), Some(Verdict::FailedOpen));
        assert_eq!(started.elapsed(), super::WAIT_BOUND);
        first.abort();
    }

    /// A request polled once, whose renewal then answered while nothing polled it, and then
    /// dropped: the unit the renewal spent for it goes back to the store, and the counters
    /// balance.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_dropped_with_its_renewals_answer_unread_gives_its_unit_back() {
        let probe = Probe {
            delay: Duration::from_millis(10),
            ..Probe::default()
        };
        let memory = probe.memory.clone();
        // Units that stay valid past the test: only a give-back brings one back.
        let limiter = Limiter::builder(probe)
            .leases(Leases::new(Duration::from_secs(5)))
            .build()
            .unwrap();
        let quota = Quota::per_hour(1_000).unwrap();
        let mut parked = Box::pin(limiter.check("k", &quota));
        assert!(poll_once(&mut parked).await.is_pending());
        // The renewal answers meanwhile.
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(parked);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stats = limiter.lease_stats();
        assert_eq!(
            (stats.leased, stats.spent, stats.held, stats.returned),
            (1, 0, 0, 1),
            "{stats:?}"
        );
        let key = limiter.storage_key("k");
        let peek = CheckRequest {
            key: &key,
            algorithm: crate::Algorithm::TokenBucket,
            quotas: &quota.into(),
            cost: 0,
            now_micros: None,
        };
        assert_eq!(memory.check_now(peek).remaining, 1_000, "the unit is back");
    }

    /// The sweeper's runtime shuts down: the next request on this limiter, on another runtime,
    /// starts another, which ends the idle leases and gives their units back.
    #[test]
    fn the_sweeper_of_a_runtime_that_shut_down_starts_again_on_the_next() {
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        // The leases' time stands still until the test moves it: nothing ends early.
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let quota = Quota::per_second(1_000_000).unwrap();
        let first = runtime();
        let limiter = first.block_on(async {
            let limiter = Limiter::builder(MemoryStore::new())
                .clock(Clock::Manual(clock.clone()))
                .leases(Leases::new(Duration::from_millis(10)))
                .build()
                .unwrap();
            for _ in 0..200 {
                assert!(limiter.check("hot", &quota).await.is_allowed());
                clock.advance(Duration::from_micros(10));
                tokio::task::yield_now().await;
            }
            limiter
        });
        drop(first);
        let held = limiter.lease_stats().held;
        assert!(held > 0, "{:?}", limiter.lease_stats());
        clock.advance(Duration::from_secs(1));
        runtime().block_on(async {
            // A request through a lease's renewal (a new key): the sweeper's start.
            assert!(limiter.check("other", &quota).await.is_allowed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        });
        let stats = limiter.lease_stats();
        assert_eq!(stats.held, 0, "the idle leases ended: {stats:?}");
        assert!(stats.returned >= held, "{stats:?}");
    }
}
