//! Wait mode: [`Limiter::acquire`] and its siblings sleep until the quotas admit a request, up
//! to a deadline, instead of answering "denied".
//!
//! Each round is one [`check_quotas`](Limiter::check_quotas) (one script call, every tier, all
//! or none). A denial, a suspension or a fail-closed verdict gives a wait; the caller sleeps that
//! long plus a small random jitter, then tries again. The jitter is uniform in `[0, J]` with
//! `J = min(wait / 20, 25 ms)`, and at least 1 ms: waiters told the same `retry_after` do not
//! wake in lockstep (and burn a round trip each for one admission), while a single waiter loses
//! at most 5 % of its wait to it (2.5 % on average), so it still reaches 95 % of the rate.

use std::future::Future;
use std::time::{Duration, Instant};

use super::Limiter;
use crate::policy::Verdict;
use crate::quota::Quotas;

/// The longest jitter added to a wait.
const MAX_JITTER: Duration = Duration::from_millis(25);
/// The shortest jitter bound, and the shortest sleep between two tries.
const MIN_JITTER: Duration = Duration::from_millis(1);

/// Why [`Limiter::acquire`] (or the [outbound layer](crate::outbound)) gave up.
///
/// ```
/// use std::time::{Duration, Instant};
/// use redlimit::{store::MemoryStore, AcquireError, Limiter, Quota, Quotas};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(MemoryStore::new());
/// let quotas = Quotas::from(Quota::per_minute(1)?);
/// let soon = Instant::now() + Duration::from_millis(100);
/// limiter.acquire("api", &quotas, soon).await?;
/// // The next admission is a minute away: no point in waiting 100 ms for it.
/// let error = limiter.acquire("api", &quotas, soon).await.unwrap_err();
/// assert!(matches!(error, AcquireError::DeadlineExceeded { retry_after, suspended: false, .. } if retry_after > Duration::from_secs(59)));
/// // A cost above the quota's capacity can never pass.
/// let never = limiter.acquire_cost("api", &quotas, 2, soon).await.unwrap_err();
/// assert_eq!(never, AcquireError::NeverAllowed);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The next admission comes after the deadline: the caller gave up without consuming
    /// anything. `retry_after` is how long from the last try the limiter asked to wait (a
    /// suspension's time left, a denial's wait, or the failure policy's).
    #[error(
        "rate limit: the next admission is {retry_after:?} away{}, past the deadline; nothing was consumed",
        suspended_note(.suspended)
    )]
    #[non_exhaustive]
    DeadlineExceeded {
        /// How long the limiter asked to wait at the last try.
        retry_after: Duration,
        /// Whether the key is suspended ([`Limiter::suspend`], e.g. by the outbound layer's
        /// auto-suspend after an upstream's `Retry-After`) rather than out of quota.
        suspended: bool,
    },
    /// The cost is above what one of the quotas can ever hold (its burst), or the limiter's
    /// algorithm cannot serve a quota: waiting would never end.
    #[error("rate limit: the cost exceeds a quota's capacity (or the algorithm refuses the quota); it can never be admitted, lower the cost or raise the burst")]
    NeverAllowed,
}

impl Limiter {
    /// Waits until `quotas` admit one request for `key`, or returns an error without consuming
    /// anything when the next admission would come after `deadline`.
    ///
    /// Between tries it sleeps the `retry_after` the limiter gave (a denial's wait, a
    /// suspension's time left, or the failure policy's `FailedClosed` wait) plus a random
    /// jitter, uniform in `[0, J]` with `J = min(wait / 20, 25 ms)` and at least 1 ms, so that
    /// waiters told the same time do not wake in lockstep; it never sleeps past `deadline`. The
    /// first try always happens, so a deadline of now means "admit me if you can, without
    /// waiting".
    ///
    /// One waiter loses at most 5 % of each wait to the jitter (2.5 % on average). A quota with
    /// room for lateness (a burst of 2 or more) absorbs it and the timer's: one waiter then
    /// reaches the full rate. With a burst of 1 every late millisecond is lost (measured: 90 %
    /// of 20 a second for one waiter, 98 % with a burst of 2); several waiters fill the gaps.
    ///
    /// Every try is one check: the denials met while waiting count in
    /// [`LimiterStats::denied`](crate::LimiterStats::denied) (and the metrics) like any other.
    ///
    /// The result is the admitting verdict: [`Verdict::Decided`] with an allowed decision, or
    /// [`Verdict::FailedOpen`] when the store failed and the failure policy let the request
    /// through.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlimit::{store::MemoryStore, Limiter, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// // 20 a second, one at a time: the calls are spaced 50 ms apart.
    /// let quotas = Quota::per_second(20)?.with_burst(1)?.into();
    /// let started = Instant::now();
    /// let deadline = started + Duration::from_secs(5);
    /// for _ in 0..3 {
    ///     let verdict = limiter.acquire("third-party-api", &quotas, deadline).await?;
    ///     assert!(verdict.is_allowed());
    /// }
    /// assert!(started.elapsed() >= Duration::from_millis(100));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(
        &self,
        key: &str,
        quotas: &Quotas,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        self.acquire_cost(key, quotas, 1, deadline).await
    }

    /// [`acquire`](Self::acquire) for a request of `cost` units.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlimit::{store::MemoryStore, AcquireError, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quotas = Quotas::from(Quota::per_minute(10)?);
    /// let deadline = Instant::now() + Duration::from_millis(50);
    /// limiter.acquire_cost("export", &quotas, 8, deadline).await?;
    /// // 2 left; 5 more are 18 s away: past the deadline, and the 2 are still there.
    /// let error = limiter.acquire_cost("export", &quotas, 5, deadline).await.unwrap_err();
    /// assert!(matches!(error, AcquireError::DeadlineExceeded { .. }));
    /// assert_eq!(limiter.check_quotas("export", &quotas, 0).await.decision().unwrap().remaining, 2);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_cost(
        &self,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        wait_for(deadline, || self.check_quotas(key, quotas, cost)).await
    }

    /// [`acquire_cost`](Self::acquire_cost) for `key` within `scope` (see
    /// [`check_scoped`](Self::check_scoped)): what the [outbound layer](crate::outbound) uses
    /// when given a scope.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quotas = Quotas::from(Quota::per_minute(1)?);
    /// let now = Instant::now();
    /// limiter.acquire_scoped("search", "api", &quotas, 1, now).await?;
    /// // Another scope counts apart.
    /// limiter.acquire_scoped("upload", "api", &quotas, 1, now).await?;
    /// assert!(limiter.acquire_scoped("search", "api", &quotas, 1, now).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_scoped(
        &self,
        scope: &str,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        wait_for(deadline, || {
            self.check_scoped_quotas(scope, key, quotas, cost)
        })
        .await
    }
}

/// The retry loop: `check` until it admits, sleeping between tries, never past `deadline`.
async fn wait_for<F, Fut>(deadline: Instant, mut check: F) -> Result<Verdict, AcquireError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Verdict>,
{
    loop {
        let (wait, suspended) = match check().await {
            Verdict::Decided(decision) if decision.allowed => {
                return Ok(Verdict::Decided(decision))
            }
            Verdict::FailedOpen => return Ok(Verdict::FailedOpen),
            Verdict::Decided(decision) if decision.never_allowed() => {
                return Err(AcquireError::NeverAllowed)
            }
            Verdict::Decided(decision) => (decision.retry_after, decision.suspended),
            Verdict::FailedClosed { retry_after } => (retry_after, false),
        };
        let now = Instant::now();
        match now.checked_add(wait) {
            Some(next) if next <= deadline => {
                let wake = next
                    .checked_add(jitter(wait))
                    .map_or(deadline, |wake| wake.min(deadline))
                    .max((now + MIN_JITTER).min(deadline));
                tokio::time::sleep_until(wake.into()).await;
            }
            _ => {
                return Err(AcquireError::DeadlineExceeded {
                    retry_after: wait,
                    suspended,
                })
            }
        }
    }
}

/// The part of the deadline message that says the key is suspended.
fn suspended_note(suspended: &bool) -> &'static str {
    if *suspended {
        " (the key is suspended)"
    } else {
        ""
    }
}

/// The upper bound of the jitter added to `wait`: `min(wait / 20, 25 ms)`, at least 1 ms.
fn jitter_bound(wait: Duration) -> Duration {
    (wait / 20).clamp(MIN_JITTER, MAX_JITTER)
}

/// A random jitter, uniform in `[0, jitter_bound(wait)]` (microsecond steps).
fn jitter(wait: Duration) -> Duration {
    let bound = jitter_bound(wait).as_micros() as u64;
    Duration::from_micros(fastrand::u64(0..=bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_is_a_twentieth_of_the_wait_between_1_and_25_ms() {
        let ms = Duration::from_millis;
        assert_eq!(jitter_bound(Duration::ZERO), ms(1));
        assert_eq!(jitter_bound(ms(10)), ms(1));
        assert_eq!(jitter_bound(ms(50)), Duration::from_micros(2_500));
        assert_eq!(jitter_bound(ms(500)), ms(25));
        assert_eq!(jitter_bound(Duration::from_secs(3600)), ms(25));
        for wait in [ms(0), ms(50), ms(500), Duration::from_secs(86_400)] {
            for _ in 0..1_000 {
                assert!(jitter(wait) <= jitter_bound(wait), "{wait:?}");
            }
        }
    }

    #[test]
    fn the_jitter_spreads_over_its_range() {
        let wait = Duration::from_secs(1);
        let draws: Vec<Duration> = (0..2_000).map(|_| jitter(wait)).collect();
        let low = draws
            .iter()
            .filter(|d| **d < Duration::from_millis(5))
            .count();
        let high = draws
            .iter()
            .filter(|d| **d > Duration::from_millis(20))
            .count();
        // Uniform over [0, 25 ms]: a fifth in each end; far from all or nothing.
        assert!((200..600).contains(&low), "{low}");
        assert!((200..600).contains(&high), "{high}");
    }
}
