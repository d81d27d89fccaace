//! [`Limiter::refund`]: units given back after the fact, in one atomic store call; the layer's
//! settlements, which remember when and where their units were reserved, and
//! [`Limiter::flush_settlements`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

use crate::core::{Ask, ControlError, Limiter, PolicyLabel, Shadow, Taken, Target};
use crate::decision::Verdict;
use crate::failure_policy::FailureContext;
use crate::quota::Quotas;
use crate::store::ops::StoreExt;
use crate::store::{RefundRequest, ReservedAt, StoreError};

/// When units were reserved, so that a refund gives them back to the window (and the reset
/// epoch) they were charged to and to no other: made by [`Limiter::check_reserving`] (or taken
/// with [`Limiter::mark_reservation`] just before the check that reserves), given to
/// [`Limiter::refund_reserved`]. A check answered from a lease holds units its renewal
/// reserved earlier: its reservation is that renewal's (see the guide's
/// [`leases`](crate::guide::leases) page).
#[derive(Debug, Clone, Copy)]
pub struct Reserved {
    /// Taken before the reservation's store call was sent: the age measured from it is never
    /// less than the true age.
    sent: Instant,
    /// The client clock's time at that moment, when the limiter has a client clock.
    client_micros: Option<u64>,
    /// The store's clock's µs at which it admitted the reservation, when it told
    /// ([`StoreExt::check_timed`](crate::store::StoreExt::check_timed), asked within
    /// [`during`](Self::during)).
    store_micros: Option<u64>,
    /// µs before that moment the reservation may have been made (0 for the layer's).
    earlier: u64,
}

impl Reserved {
    /// When the refund says the units were reserved: the client clock's time, else the time
    /// the store told for its admission, else the store's time less the age measured here.
    fn at(&self) -> ReservedAt {
        match (self.client_micros, self.store_micros) {
            (Some(at), _) => ReservedAt::Client(at.saturating_sub(self.earlier)),
            (None, Some(at)) => ReservedAt::Store(at.saturating_sub(self.earlier)),
            (None, None) => {
                let age = u64::try_from(self.sent.elapsed().as_micros()).unwrap_or(u64::MAX);
                ReservedAt::Ago(age.saturating_add(self.earlier))
            }
        }
    }

    /// This reservation as the check that made it learned it: on the store's clock, the time
    /// the store told for its admission; answered from a lease, the renewal's reservation (its
    /// time, on either clock).
    pub(crate) fn taking(mut self, taken: Taken) -> Reserved {
        match taken {
            Taken::Marked => {}
            Taken::Decided(at) => self.store_micros = Some(at),
            Taken::Renewal(renewal) => {
                self.sent = renewal.sent;
                self.client_micros = renewal.client_micros;
                self.store_micros = renewal.store_micros;
            }
        }
        self
    }
}

/// The layer's settlements still running, for [`Limiter::flush_settlements`].
#[derive(Debug, Default)]
pub(crate) struct Settlements {
    pending: AtomicUsize,
    idle: Notify,
}

/// One settlement in flight: dropped unfinished (its task never ran, or was cancelled when the
/// runtime shut down), it is counted as a failed settlement.
pub(crate) struct Pending {
    limiter: Limiter,
    settlements: Arc<Settlements>,
    finished: bool,
}

impl Pending {
    /// The settlement ran to its end (it may still have failed: counted where it did).
    pub(crate) fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.finished {
            self.limiter.count_settle_failure(
                "the settlement was dropped before it ended (runtime shut down)",
            );
        }
        let settlements = &self.settlements;
        if settlements.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            settlements.idle.notify_waiters();
        }
    }
}

impl Limiter {
    /// Gives `units` back to every tier of `target` under `quotas` (the quotas it was checked
    /// against; an override in the store replaces them, as in a check), in one atomic store
    /// call, never above a tier's capacity. For a request that reserved more than it used (see
    /// the [modes guide](crate::guide::modes)): reserve at request time with the cost, give the
    /// rest back once it is known.
    ///
    /// What a refund does per algorithm: the token bucket gets the tokens back (at most its
    /// burst), GCRA's debt shrinks (at least to 0), the fixed window's count shrinks, the
    /// sliding window's count of the window the units were reserved in, and the sliding log
    /// loses its oldest entries from the reservation on. A key with nothing stored, or stored before a tenant's
    /// [`reset`](Self::reset) (full already), is left as it is. Refunding 0 units does nothing.
    ///
    /// The units are taken as reserved in the current window: the fixed window and the
    /// sliding window give them back to the window of this call, the sliding log removes its
    /// oldest entries still in its window (the longest tier's), and a tenant's reset before
    /// this call does not stop it. So refund within the window of the reservation, and not
    /// across a reset; else use [`refund_reserved`](Self::refund_reserved), as the layer's
    /// settlements and the leases' give-backs do (see the [modes guide](crate::guide::modes)).
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quotas = Quotas::from(Quota::per_minute(10)?);
    /// // Reserve 8 for a job, which then used 3: give 5 back.
    /// assert!(limiter.check_quotas("tenant-42", &quotas, 8).await.is_allowed());
    /// limiter.refund("tenant-42", &quotas, 5).await?;
    /// let peek = *limiter.check_quotas("tenant-42", &quotas, 0).await.decision().unwrap();
    /// assert_eq!(peek.remaining, 7);
    /// // Never above capacity.
    /// limiter.refund("tenant-42", &quotas, 100).await?;
    /// let peek = *limiter.check_quotas("tenant-42", &quotas, 0).await.decision().unwrap();
    /// assert_eq!(peek.remaining, 10);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn refund<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        units: u64,
    ) -> Result<(), ControlError> {
        let mut reserved = self.mark_reservation();
        if self.algorithm().spec().is_log() {
            // Reserved at some time in the log's window: its oldest entries in it go.
            let longest = quotas.iter().map(|q| q.period_micros()).max().unwrap_or(1);
            reserved.earlier = longest - 1;
        }
        self.refund_reserved(target, quotas, units, reserved).await
    }

    /// [`refund`](Self::refund) of units reserved at `reserved`: they go back only to the
    /// window they were charged to (the fixed window's, the sliding window's current or, in the
    /// next window, its previous count; the sliding log's entries from then on), and not at all
    /// when the tenant was [`reset`](Self::reset) since. Nothing is ever given to a window that
    /// did not hold them; a refund can be lost near a window's start (see the
    /// [modes guide](crate::guide::modes) for the bound).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{clock::{Clock, ManualClock}, store::MemoryStore, Algorithm, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .algorithm(Algorithm::FixedWindow)
    ///     .clock(Clock::Manual(clock.clone()))
    ///     .build()?;
    /// let quotas = Quota::per_minute(10)?.into();
    /// let (verdict, reserved) = limiter.check_reserving("job", &quotas, 8).await;
    /// assert!(verdict.is_allowed());
    /// clock.advance(Duration::from_secs(60)); // the job ran into the next window
    /// assert!(limiter.check_quotas("job", &quotas, 10).await.is_allowed());
    /// limiter.refund_reserved("job", &quotas, 5, reserved).await?;
    /// // Nothing went to this window: it never held those units.
    /// assert!(!limiter.check_quotas("job", &quotas, 1).await.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn refund_reserved<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        units: u64,
        reserved: Reserved,
    ) -> Result<(), ControlError> {
        self.supports(quotas).map_err(|(_, error)| error)?;
        let key = self.target_key(target.into());
        self.refund_storage_key(key.as_str(), quotas, units, reserved)
            .await?;
        Ok(())
    }

    /// [`check_quotas`](Self::check_quotas), and the time of the reservation it made, for
    /// [`refund_reserved`](Self::refund_reserved): with a client clock that clock's time, with
    /// the store's clock the time the store tells for its admission
    /// ([`StoreExt::check_timed`]), which the refund sends as it
    /// is, however late the store runs it. A check answered from a lease returns the time of
    /// the lease's renewal that reserved its units, on either clock.
    pub async fn check_reserving<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        cost: u64,
    ) -> (Verdict, Reserved) {
        let reserved = self.mark_reservation();
        let storage_key = self.target_key(target.into());
        let label = PolicyLabel::direct();
        let ask = Ask::new(storage_key.as_str(), quotas, cost, &label).reserving(true);
        let answer = self.answer(ask).await;
        (answer.verdict, reserved.taking(answer.taken))
    }

    /// The time of a reservation about to be made, for
    /// [`refund_reserved`](Self::refund_reserved): take it just before the check that reserves
    /// (with a client clock its time, with the store's clock this instant, from which the
    /// refund measures the reservation's age: later than the truth when the store runs the
    /// refund late, or when a lease answers the check, whose renewal reserved the units
    /// earlier; [`check_reserving`](Self::check_reserving) avoids both).
    pub fn mark_reservation(&self) -> Reserved {
        Reserved {
            sent: Instant::now(),
            client_micros: self.clock().now_micros(),
            store_micros: None,
            earlier: 0,
        }
    }

    /// [`refund`](Self::refund) on a storage key, of units reserved at `reserved`, as the
    /// layer's settlement gives units back.
    pub(crate) async fn refund_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        units: u64,
        reserved: Reserved,
    ) -> Result<(), StoreError> {
        if units == 0 {
            return Ok(());
        }
        let request = RefundRequest {
            key: storage_key,
            algorithm: self.algorithm(),
            quotas,
            units,
            reserved: reserved.at(),
        };
        let result = self.store().refund(request).await;
        // A cached denial may now be too long.
        self.forget_storage_key(storage_key);
        result.map(|_| ())
    }
}

impl Limiter {
    /// Waits until every settlement the layers on this limiter started has ended (given its
    /// units back or taken its charge, or failed and been counted in
    /// [`settle_failures`](crate::limiter::LimiterStats::settle_failures)). Settlements run as
    /// tasks of their own after each response; call this on shutdown, with
    /// [`release_leases`](Self::release_leases), before the runtime goes: a settlement still
    /// pending when the runtime drops it is lost, and counted as a failure.
    ///
    /// ```
    /// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter, Quota, RateLimitLayer};
    /// use tower::{Layer, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let layer = RateLimitLayer::builder(limiter.clone(), Quota::per_hour(10)?, GlobalKey::new("all"))
    ///     .policy_name("api")
    ///     .cost(|_| 5)
    ///     .cost_from_response(|_| 0) // nothing used: the 5 go back
    ///     .build()?;
    /// let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// }));
    /// svc.oneshot(http::Request::new(())).await?;
    /// limiter.flush_settlements().await;
    /// let key = redlimit::Target::scoped("api", "all");
    /// let peek = limiter.check_quotas(key, &Quota::per_hour(10)?.into(), 0).await;
    /// assert_eq!(peek.decision().unwrap().remaining, 10);
    /// assert_eq!(limiter.stats().settle_failures, 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn flush_settlements(&self) {
        let settlements = self.feature_state::<Settlements>();
        loop {
            let mut idle = std::pin::pin!(settlements.idle.notified());
            idle.as_mut().enable();
            if settlements.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Counts a settlement about to be spawned, until its [`Pending`] is finished or dropped.
    pub(crate) fn settlement_started(&self) -> Pending {
        let settlements = self.feature_state::<Settlements>();
        settlements.pending.fetch_add(1, Ordering::AcqRel);
        Pending {
            limiter: self.clone(),
            settlements,
            finished: false,
        }
    }

    /// A layer's settlement after the response: `refund` units of a reservation made at
    /// `reserved` given back, or `charge` more taken (what is left of it at most: a tier is
    /// emptied, never driven below). A failure is counted and logged; a charge that failed goes
    /// to the failure policy (a local fallback charges its share), a refund that failed is lost
    /// (the units stay spent).
    pub(crate) async fn settle_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        (refund, charge): (u64, u64),
        reserved: Reserved,
        label: &PolicyLabel,
    ) {
        let result = if refund > 0 {
            self.refund_storage_key(storage_key, quotas, refund, reserved)
                .await
        } else {
            self.charge_storage_key(storage_key, quotas, charge, label)
                .await
        };
        let Err(error) = result else { return };
        self.counters().count_store_error();
        if charge > 0 {
            let request = self.request(storage_key, quotas, charge);
            let verdict = self.policy().on_store_error(&FailureContext {
                error: &error,
                request,
            });
            self.counters().count_failure(&verdict, label);
        }
        self.count_settle_failure(&error.to_string());
    }

    /// Counts a settlement that failed, and logs it at a bounded rate (never the key).
    pub(crate) fn count_settle_failure(&self, error: &str) {
        self.counters().count_settle_failure();
        if let Some(suppressed) = crate::store::failure_log_gate() {
            tracing::warn!(
                error,
                suppressed,
                "rate limit settlement after the response failed; the response was not delayed"
            );
        }
    }

    /// Takes `units` more from a storage key after the fact: what is left of them, at most (a
    /// peek, then a check of that cost; a check that a concurrent request beat to the units is
    /// denied and consumes nothing, so this never takes more than was left). Its store calls'
    /// latency goes under the layer's `label`; they count as no decision.
    async fn charge_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        units: u64,
        label: &PolicyLabel,
    ) -> Result<(), StoreError> {
        let label = label.shadowed(Shadow::Uncounted);
        let peek = self
            .decide_without_policy(self.request(storage_key, quotas, 0), &label)
            .await?;
        let take = units.min(peek.remaining);
        if take > 0 {
            self.decide_without_policy(self.request(storage_key, quotas, take), &label)
                .await?;
        }
        Ok(())
    }
}
