//! The request path under leases, and the background work: renewals, give-backs, sweeps.
//!
//! A request spends held units when the key's lease has enough. Otherwise it waits for the
//! renewal in flight, or, when none is, it renews itself: one store call of cost k (or of its
//! own cost at k = 1, which is exactly a check without leases), whose decision it gets.
//!
//! A request's future may be dropped at any await (a client that disconnects, a timeout, a
//! `select!`), so no request waits on a renewal that nobody will finish: a renewal a request
//! started is handed to a task when that request is dropped ([`HandOn`]), and keeps the units
//! it would have spent; any renewal's future that is dropped before its end ends it
//! ([`Unfinished`]), which wakes the waiters to renew themselves. A waiter also waits no longer
//! than the store's [`call_timeout`](crate::store::Store::call_timeout): past it the failure
//! policy answers. A lease that ends (forgotten, released, idle, a control) wakes its waiters,
//! which then start again on the key's new lease (so a waiter's store call is a renewal, handed
//! on like any other), or check as without leases when the key cannot have one now.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::futures::Notified;

use super::state::{Released, Reservation};
use super::{Counters, Lease, LeaseStats, LeaseTable};
use crate::core::check::Taken;
use crate::core::stats::{PolicyLabel, StoreTimer};
use crate::core::{Answer, Ask, Inner, Limiter};
use crate::decision::Decision;
use crate::quota::Quotas;
use crate::store::ops::StoreExt;
use crate::store::{RefundRequest, ReservedAt, StoreError};

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
    /// Renew now, for this many units.
    Renew(u64),
    /// The lease ended while this request waited: start again on the key's new lease.
    Ended,
}

impl Limiter {
    /// Decides a request of `cost` on `storage_key` under leases (see [`Leases`](super::Leases)).
    pub(in crate::core) async fn decide_leased(&self, leases: &LeaseTable, ask: Ask<'_>) -> Answer {
        let Ask {
            storage_key,
            quotas,
            cost,
            label,
            reserving,
            ..
        } = ask;
        let now = leases.now(&self.inner.clock);
        let lease = match leases.applies(quotas, cost) {
            true => leases.lease(storage_key, quotas, now),
            false => None,
        };
        let Some(mut lease) = lease else {
            return self.answer_direct(ask).await;
        };
        self.start_sweeping(leases);
        let mut waited_for = None;
        let mut deadline = None;
        let mut now = Some(now);
        let units = loop {
            let now = now.take().unwrap_or_else(|| leases.now(&self.inner.clock));
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
                    self.inner.stats.count_decision(&decision, label);
                    Counters::add(&leases.counters.spent, cost);
                    if let Some(ask) = prefetch {
                        self.spawn_prefetch(lease.clone(), storage_key, ask, label);
                    }
                    // A settlement gives these units back to the renewal's window.
                    let answer = Answer::decided(decision);
                    return self.reserved_by(answer, ask, leases, reservation);
                }
                Step::Answered(answer) => return answer,
                Step::Wait(notified) => {
                    if let Err(timeout) = self.wait_for_renewal(notified, &mut deadline).await {
                        let request = self.request(storage_key, quotas, cost);
                        return self.fail(StoreError::Timeout(timeout), request, label);
                    }
                    continue;
                }
                Step::Renew(units) => break units,
                Step::Ended => {}
            }
            // The lease ended while this request waited: it starts again on the key's new
            // lease, so its store call is a renewal, handed on if the request is dropped (a
            // check of its own, dropped in flight, would consume units that nobody spends).
            waited_for = None;
            match leases.lease(storage_key, quotas, now) {
                Some(new) => lease = new,
                // The table is full, or the key's hash holds another lease.
                None => {
                    let direct = self.answer_direct(ask);
                    return self
                        .within(deadline, direct, storage_key, quotas, cost, label)
                        .await;
                }
            }
        };
        let renewal = self.renew(&lease, storage_key, units, cost, label, reserving);
        self.within(deadline, renewal, storage_key, quotas, cost, label)
            .await
    }

    /// Waits for the renewal in flight, until the store's call timeout after this request
    /// first waited; the timeout when it ran out (that renewal should have ended by then).
    async fn wait_for_renewal(
        &self,
        notified: Notified<'_>,
        deadline: &mut Option<(tokio::time::Instant, Duration)>,
    ) -> Result<(), Duration> {
        let Some(timeout) = self.inner.store.call_timeout() else {
            notified.await;
            return Ok(());
        };
        let (deadline, _) =
            *deadline.get_or_insert_with(|| (tokio::time::Instant::now() + timeout, timeout));
        tokio::time::timeout_at(deadline, notified)
            .await
            .map_err(|_| timeout)
    }

    /// `decided` for a request that waited (so has a `deadline`): within the store's call
    /// timeout of its first wait, else the failure policy's answer (a renewal it started goes
    /// on in a task).
    async fn within(
        &self,
        deadline: Option<(tokio::time::Instant, Duration)>,
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
    pub(crate) fn check_leased_now(&self, ask: Ask<'_>) -> Option<Answer> {
        let Ask {
            storage_key,
            quotas,
            cost,
            label,
            ..
        } = ask;
        let leases = self.inner.leases.as_ref()?;
        if !leases.applies(quotas, cost) {
            return None;
        }
        let lease = leases.find(storage_key, quotas)?;
        let now = leases.now(&self.inner.clock);
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
        self.inner.stats.count_decision(&decision, label);
        Counters::add(&leases.counters.spent, cost);
        if let Some(ask) = prefetch {
            self.spawn_prefetch(lease, storage_key, ask, label);
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
            true => answer.taken(Taken::Renewal(
                leases.renewal(&self.inner.clock, reservation),
            )),
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
            Step::Renew(state.plan(now, cost, sizing))
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
        let cache = self.inner.deny_cache.as_ref()?;
        let now = cache.now(self.inner.clock.now_micros());
        let decision = cache.lookup(key, quotas, cost, now)?;
        self.inner.stats.count_cached_denial(label);
        Some(decision)
    }

    /// The renewal a request waits on: `ask` units, `cost` of them its own (see
    /// [`renewal`](Self::renewal)). Handed to a task if the request is dropped first.
    async fn renew(
        &self,
        lease: &Arc<Lease>,
        key: &str,
        ask: u64,
        cost: u64,
        label: &PolicyLabel,
        reserving: bool,
    ) -> Answer {
        let (limiter, owned, key, label) = (
            self.clone(),
            lease.clone(),
            Box::<str>::from(key),
            label.clone(),
        );
        let renewal = async move {
            let unfinished = Unfinished::new(&owned);
            let answer = limiter
                .renewal(&owned, &key, ask, cost, &label, reserving)
                .await;
            unfinished.disarm();
            answer
        };
        HandOn {
            renewal: Some(Box::pin(renewal)),
            lease: lease.clone(),
        }
        .await
    }

    /// A renewal of `ask` units, `cost` of them for the request that started it. A denial of
    /// more than `cost` is asked again for what is left (so the last units of a quota are
    /// leased too), then for `cost` alone (so the denial is exactly the one a check would
    /// get). The request's decision, or `None` when the request was dropped meanwhile (its
    /// units then stay held).
    async fn renewal(
        &self,
        lease: &Lease,
        key: &str,
        mut ask: u64,
        cost: u64,
        label: &PolicyLabel,
        reserving: bool,
    ) -> Option<Answer> {
        let leases = self.inner.leases.as_ref()?;
        let quotas = &lease.quotas;
        loop {
            let sent = leases.now(&self.inner.clock);
            let started = (self.inner.deny_cache.as_ref())
                .map(|c| c.start(key, c.now(self.inner.clock.now_micros())));
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
                    return (!abandoned)
                        .then(|| self.fail(error, self.request(key, quotas, cost), label));
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
                    .then(|| state.clear(leases.now(&self.inner.clock), leases.sizing.interval));
                state.finish(false);
                drop(state);
                lease.renewed.notify_waiters();
                Counters::add(&leases.counters.spent, spent);
                if let Some(released) = detached {
                    self.release(leases, key, quotas, released);
                }
                if let Some(cache) = &self.inner.deny_cache {
                    cache.admitted(key, quotas, ask);
                }
                if abandoned {
                    return None;
                }
                self.inner.stats.count_decision(&answer, label);
                // The request's units are this renewal's.
                let reservation = Reservation { sent, decided };
                let answer = Answer::decided(answer);
                return Some(match reserving {
                    true => answer.taken(Taken::Renewal(
                        leases.renewal(&self.inner.clock, reservation),
                    )),
                    false => answer,
                });
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
                    .then(|| state.clear(leases.now(&self.inner.clock), leases.sizing.interval));
                state.finish(false);
                (released, abandoned)
            };
            lease.renewed.notify_waiters();
            if let Some(released) = released {
                self.release(leases, key, quotas, released);
            }
            if let (Some(cache), Some(started)) = (&self.inner.deny_cache, started) {
                let now = cache.now(self.inner.clock.now_micros());
                cache.remember(key, quotas, cost, &decision, now, started);
            }
            if abandoned {
                return None;
            }
            self.inner.stats.count_decision(&decision, label);
            return Some(Answer::decided(decision));
        }
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
        let result = self.inner.store.check_timed(request, None).await;
        timer.stop(label);
        Counters::add(&leases.counters.renewals, 1);
        if let Ok((decision, _)) = &result {
            if decision.allowed {
                Counters::add(&leases.counters.leased, ask);
            }
        } else {
            self.inner.stats.count_store_error();
        }
        result
    }

    fn finish(&self, lease: &Lease, failed: bool) {
        lease.state.lock().expect("lease").finish(failed);
        lease.renewed.notify_waiters();
    }

    /// Starts a background renewal of `ask` units (the lease is marked renewing already).
    fn spawn_prefetch(&self, lease: Arc<Lease>, key: &str, ask: u64, label: &PolicyLabel) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.finish(&lease, false);
            return;
        };
        let (limiter, key, label) = (self.clone(), Box::<str>::from(key), label.clone());
        runtime.spawn(async move {
            let unfinished = Unfinished::new(&lease);
            limiter.prefetch(&lease, &key, ask, &label).await;
            unfinished.disarm();
        });
    }

    /// A background renewal: like [`renew`](Self::renew) with no request of its own. A denial
    /// leaves the lease to run out (the next request then renews and gets the denial); a
    /// suspension ends it at once.
    async fn prefetch(&self, lease: &Lease, key: &str, mut ask: u64, label: &PolicyLabel) {
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let quotas = &lease.quotas;
        loop {
            let sent = leases.now(&self.inner.clock);
            let result = self.lease_call(leases, key, quotas, ask, label).await;
            let mut state = lease.state.lock().expect("lease");
            let now = leases.now(&self.inner.clock);
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
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            returning.end(false);
            return;
        };
        let (key, quotas) = (Box::<str>::from(key), *quotas);
        runtime.spawn(async move {
            let limiter = returning.limiter.clone();
            limiter.give_back(&key, &quotas, released, returning).await
        });
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
        let Some(leases) = self.inner.leases.as_ref() else {
            return;
        };
        let units = released.returnable;
        if units == 0 {
            return;
        }
        // The lease table's µs: the client clock's; else the store's time of the admission
        // when it told, or the age on the table's own monotonic clock.
        let sent = released.reserved.unwrap_or(0);
        let reserved = match (self.inner.clock.now_micros(), released.decided) {
            (Some(_), _) => ReservedAt::Client(sent),
            (None, Some(at)) => ReservedAt::Store(at),
            (None, None) => ReservedAt::Ago(leases.now(&self.inner.clock).saturating_sub(sent)),
        };
        let request = RefundRequest {
            key,
            algorithm: self.inner.algorithm,
            quotas,
            units,
            reserved,
        };
        match self.inner.store.refund(request).await {
            // No tier took any (a reset since, the window gone, every tier full): stranded.
            Ok(tiers) => returning.end(tiers > 0),
            // Never retried: a give-back landing late could reach a fixed window's next window.
            Err(error) => {
                tracing::debug!(%error, units, "lease give-back failed; its units are stranded");
                returning.end(false);
            }
        }
        if let Some(cache) = &self.inner.deny_cache {
            // A cached denial may now be too long.
            cache.forget(key);
        }
    }

    /// Starts the sweeper once: every interval it ends expired batches and idle leases, giving
    /// their units back. It holds the limiter weakly and stops when the limiter is dropped.
    fn start_sweeping(&self, leases: &LeaseTable) {
        if leases
            .sweeping
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            leases
                .sweeping
                .store(false, std::sync::atomic::Ordering::Relaxed);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let every = leases.config.interval;
        runtime.spawn(sweep(weak, every));
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
        let Some(leases) = self.inner.leases.as_ref() else {
            return 0;
        };
        let now = leases.now(&self.inner.clock);
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
        self.inner
            .leases
            .as_ref()
            .map(LeaseTable::snapshot)
            .unwrap_or_default()
    }

    /// Ends the leases of every scope of `tenant` (a tenant's unscoped storage key), giving
    /// their units back unless `give_back` is false (the control hook; a reset's units were
    /// leased before it and must not come back after it: they are stranded): nothing that
    /// starts after it is admitted from units leased before.
    pub(crate) fn end_tenant_leases(&self, tenant: &str, give_back: bool) {
        if let Some(leases) = &self.inner.leases {
            let now = leases.now(&self.inner.clock);
            for (key, quotas, released) in leases.remove_tenant(tenant, now) {
                if give_back {
                    self.release(leases, &key, &quotas, released);
                } else {
                    let units = released.stranded + released.returnable;
                    Counters::add(&leases.counters.stranded, units);
                }
            }
        }
    }

    /// Ends `storage_key`'s lease, giving its units back (the forget hook).
    pub(crate) fn end_lease(&self, storage_key: &str) {
        if let Some(leases) = &self.inner.leases {
            let now = leases.now(&self.inner.clock);
            if let Some((quotas, released)) = leases.remove(storage_key, now) {
                self.release(leases, storage_key, &quotas, released);
            }
        }
    }
}

/// A renewal a request started and waits on. Dropped before its end (the request's future
/// was), it hands the renewal to a task, which ends it and keeps the request's units held;
/// without a runtime to take it, the renewal is dropped and [`Unfinished`] ends it.
struct HandOn {
    renewal: Option<BoxFuture<'static, Option<Answer>>>,
    lease: Arc<Lease>,
}

impl Future for HandOn {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        let renewal = self.renewal.as_mut().expect("polled after its answer");
        let answer = std::task::ready!(renewal.as_mut().poll(cx));
        self.renewal = None;
        // Only a dropped request's renewal answers `None`, and this one is still polled.
        Poll::Ready(answer.expect("a renewal answers the request that waits for it"))
    }
}

impl Drop for HandOn {
    fn drop(&mut self) {
        let Some(renewal) = self.renewal.take() else {
            return;
        };
        if let Ok(mut state) = self.lease.state.lock() {
            state.abandoned = true;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(renewal);
        }
    }
}

/// Ends a lease's renewal if the future running it is dropped first (a task cancelled at
/// shutdown, a renewal that could not be handed on): the waiters wake and renew themselves.
struct Unfinished<'a>(Option<&'a Lease>);

impl<'a> Unfinished<'a> {
    fn new(lease: &'a Lease) -> Self {
        Unfinished(Some(lease))
    }

    /// The renewal ended itself.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.0.take() {
            if let Ok(mut state) = lease.state.lock() {
                state.finish(false);
            }
            lease.renewed.notify_waiters();
        }
    }
}

/// The sweeper's loop (see [`Limiter::start_sweeping`]).
async fn sweep(weak: Weak<Inner>, every: std::time::Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let limiter = Limiter { inner };
        let Some(leases) = limiter.inner.leases.as_ref() else {
            return;
        };
        let now = leases.now(&limiter.inner.clock);
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
        if let Some(leases) = &limiter.inner.leases {
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
        if let (Some(leases), true) = (&self.limiter.inner.leases, units > 0) {
            let counters = &leases.counters;
            Counters::add(
                if returned {
                    &counters.returned
                } else {
                    &counters.stranded
                },
                units,
            );
            counters
                .returning
                .fetch_sub(units, std::sync::atomic::Ordering::Relaxed);
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
    use crate::core::stats::PolicyLabel;
    use crate::core::{Ask, Leases};
    use crate::core::{Limiter, Target};
    use crate::decision::Decision;
    use crate::decision::Verdict;
    use crate::quota::{Quota, Quotas};
    use crate::store::{CheckRequest, MemoryStore, Operation, OperationRequest, Store, StoreError};

    /// A memory store that counts its checks and peeks (checks of cost 0), and can leave its
    /// first check unanswered for good (a store that breaks its own timeout).
    #[derive(Debug, Default)]
    struct Probe {
        memory: MemoryStore,
        checks: Arc<AtomicU64>,
        peeks: Arc<AtomicU64>,
        hang_first: Arc<AtomicBool>,
        hang_refunds: Arc<AtomicBool>,
        timeout: Option<Duration>,
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
            hang_or(hang, self.memory.check(request))
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
            |s: crate::core::LeaseStats| s.leased == s.spent + s.held + s.returned + s.stranded;
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
                .check_leased_now(Ask::new(&key, &quotas, 1, &label))
                .is_none(),
            "no lease yet"
        );
        for _ in 0..100 {
            limiter.answer(Ask::new(&key, &quotas, 1, &label)).await;
        }
        let held = limiter.lease_stats().held;
        assert!(held > 0);
        let verdict = limiter
            .check_leased_now(Ask::new(&key, &quotas, 1, &label))
            .unwrap()
            .verdict;
        assert!(verdict.is_allowed());
        let stats = limiter.lease_stats();
        assert_eq!(stats.spent, 101);
        assert_eq!(limiter.stats().allowed, 101);
        // Other quotas, a peek, a cost above what is held: the usual check.
        let other = Quotas::from(Quota::per_second(999_999).unwrap());
        assert!(limiter
            .check_leased_now(Ask::new(&key, &other, 1, &label))
            .is_none());
        assert!(limiter
            .check_leased_now(Ask::new(&key, &quotas, 0, &label))
            .is_none());
        assert!(limiter
            .check_leased_now(Ask::new(&key, &quotas, u64::MAX, &label))
            .is_none());
    }
}
