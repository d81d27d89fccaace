//! Wait mode: [`Limiter::acquire`] and its siblings sleep until the quotas admit a request, up
//! to a deadline, instead of answering "denied".
//!
//! Each round is one [`check_quotas`](Limiter::check_quotas) (one script call, every tier, all
//! or none). A denial, a suspension or a fail-closed verdict gives a wait; the caller sleeps that
//! long plus a random jitter, then tries again.
//!
//! # One line per key and process
//!
//! The waiters of one limiter (and its clones) on one key form a line, first come, first
//! served: only the first asks the store; the others wait for it to be admitted or to give up,
//! then the next asks at once. So a herd of waiters costs the store about one check per
//! admission and per process instead of one per waiter at every refill (measured on Redis: 500
//! waiters in 5 processes on 10 a second, in the second after a 2 s suspension, 74 checks for
//! 19 admissions, where one check per waiter per refill took 4 800), and a large cost is not
//! starved by small ones: `acquire_cost(5)` among 4 waiters of cost 1 is admitted once 5 units
//! have come back, and the waiters behind it wait.
//!
//! What the first waiter learns from a denial (no request of this cost or more before some time)
//! is shared with the line: a waiter whose deadline comes earlier gives up at once, without a
//! check of its own. A waiter behind a larger cost waits its turn even if its own cost would
//! pass now; past its deadline it gives up, consuming nothing.
//!
//! The line is per process: waiters of other processes (other `Limiter`s) are not in it, so
//! across a fleet the first waiters of each process still compete, and a large cost can lose
//! to small ones of other processes. Give a large cost a deadline that covers its refill, or
//! keep it on a key of its own.
//!
//! # Jitter
//!
//! The jitter is uniform in `[0, J]` with `J = wait / 20`, at least 1 ms: waiters of several
//! processes told the same `retry_after` (the end of a suspension, say) do not wake in lockstep,
//! and the longer the wait the wider they spread (a 2 s suspension: over 100 ms), while a single
//! waiter loses at most 5 % of its wait to it (2.5 % on average), so it still reaches 95 % of
//! the rate.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Limiter, Target};
use crate::decision::Verdict;
use crate::quota::Quotas;

/// The shortest jitter bound, and the shortest sleep between two tries.
const MIN_JITTER: Duration = Duration::from_millis(1);

/// Why [`Limiter::acquire`] (or the [outbound layer](crate::outbound)) gave up.
///
/// ```
/// use std::time::{Duration, Instant};
/// use redlimit::{limiter::AcquireError, store::MemoryStore, Limiter, Quota, Quotas};
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
    /// jitter, uniform in `[0, J]` with `J = wait / 20` and at least 1 ms, so that waiters told
    /// the same time do not wake in lockstep; it never sleeps past `deadline`. Waiters of this
    /// limiter (and its clones) on the same key take turns in arrival order, and only the first
    /// asks the store (first come, first served). The first try happens at once when nobody
    /// is ahead, so a deadline of now means "admit me if you can, without waiting".
    ///
    /// One waiter loses at most 5 % of each wait to the jitter (2.5 % on average). A quota with
    /// room for lateness (a burst of 2 or more) absorbs it and the timer's: one waiter then
    /// reaches the full rate. With a burst of 1 every late millisecond is lost (measured: 90 %
    /// of 20 a second for one waiter, 98 % with a burst of 2); several waiters fill the gaps.
    ///
    /// Every try is one check: the denials met while waiting count in
    /// [`LimiterStats::denied`](crate::limiter::LimiterStats::denied) (and the metrics) like any other.
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
    pub async fn acquire<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        self.acquire_cost(target, quotas, 1, deadline).await
    }

    /// [`acquire`](Self::acquire) for a request of `cost` units.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use redlimit::{limiter::AcquireError, store::MemoryStore, Limiter, Quota, Quotas, Target};
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
    /// // Another scope counts apart: what the outbound layer uses when given a scope.
    /// limiter.acquire_cost(Target::scoped("upload", "export"), &quotas, 10, deadline).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_cost<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        cost: u64,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        let target = target.into();
        let storage_key = self.storage_key(target);
        wait_for(&self.inner.waiters, &storage_key, cost, deadline, || {
            self.check_quotas(target, quotas, cost)
        })
        .await
    }
}

/// The retry loop: `check` until it admits, sleeping between tries, never past `deadline`; only
/// while this waiter has its turn in the line of `storage_key` (see the [module docs](self)).
async fn wait_for<F, Fut>(
    waiters: &Waiters,
    storage_key: &str,
    cost: u64,
    deadline: Instant,
    mut check: F,
) -> Result<Verdict, AcquireError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Verdict>,
{
    let place = waiters.join(storage_key);
    let line = place.line();
    let _turn = line.wait_turn(cost, deadline).await?;
    loop {
        let (wait, suspended) = match check().await {
            Verdict::Decided(decision) if decision.allowed => {
                line.set_hint(None);
                return Ok(Verdict::Decided(decision));
            }
            Verdict::FailedOpen => {
                line.set_hint(None);
                return Ok(Verdict::FailedOpen);
            }
            Verdict::Decided(decision) if decision.never_allowed() => {
                return Err(AcquireError::NeverAllowed)
            }
            Verdict::Decided(decision) => (decision.retry_after, decision.suspended),
            Verdict::FailedClosed { retry_after } => (retry_after, false),
        };
        let now = Instant::now();
        let next = now.checked_add(wait);
        line.set_hint(next.map(|not_before| Hint {
            cost,
            not_before,
            suspended,
        }));
        match next {
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

/// The waiters of one limiter (and its clones), in one line per storage key: only the first of
/// a line asks the store; the others wait for their turn, in arrival order.
#[derive(Default)]
pub(crate) struct Waiters {
    /// Only the keys somebody is waiting on: a line leaves with its last waiter.
    lines: Mutex<HashMap<String, Arc<Line>>>,
}

impl Waiters {
    /// A place at the end of the line of `storage_key`.
    fn join<'a>(&'a self, storage_key: &'a str) -> Place<'a> {
        let mut lines = lock(&self.lines);
        let line = lines.entry(storage_key.to_owned()).or_default().clone();
        Place {
            waiters: self,
            storage_key,
            line: Some(line),
        }
    }

    /// Drops what the lines of `storage_key` (and of its scopes) learned from the store: a
    /// control changed the key, the next try must ask.
    pub(crate) fn forget(&self, storage_key: &str) {
        let lines = lock(&self.lines);
        for (key, line) in lines.iter() {
            let tail = key.strip_prefix(storage_key);
            if tail.is_some_and(|tail| tail.is_empty() || tail.starts_with(':')) {
                line.set_hint(None);
            }
        }
    }
}

/// The waiters of one key in this process.
#[derive(Default)]
struct Line {
    /// Held by the waiter whose turn it is. tokio's mutex is fair (first come, first served):
    /// its queue is the line.
    turn: tokio::sync::Mutex<()>,
    /// What the last denial of this line said, for the waiters behind.
    hint: Mutex<Option<Hint>>,
    /// Wakes the waiters behind when the hint changes.
    hint_changed: Notify,
}

/// A denial's lesson: no request of `cost` or more passes before `not_before` (a larger cost
/// waits at least as long, a consumption only delays it further).
#[derive(Debug, Clone, Copy)]
struct Hint {
    cost: u64,
    not_before: Instant,
    suspended: bool,
}

impl Line {
    /// Waits for the turn, or gives up (consuming nothing) when the line's last denial says the
    /// next admission of `cost` comes after `deadline`, or when `deadline` passes in the line.
    async fn wait_turn(
        &self,
        cost: u64,
        deadline: Instant,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, AcquireError> {
        // One future for the whole wait: it keeps the place in the mutex's queue.
        let mut turn = pin!(self.turn.lock());
        let mut expired = pin!(tokio::time::sleep_until(deadline.into()));
        let mut woke = Woke::Changed;
        loop {
            // Created before the hint is read: a change made in between still wakes it.
            let mut changed = pin!(self.hint_changed.notified());
            // Read again once the turn came: the waiter before may have just left a lesson.
            let hint = *lock(&self.hint);
            let give_up = || AcquireError::DeadlineExceeded {
                retry_after: hint.map_or(Duration::ZERO, |hint| {
                    hint.not_before.saturating_duration_since(Instant::now())
                }),
                suspended: hint.is_some_and(|hint| hint.suspended),
            };
            if hint.is_some_and(|hint| cost >= hint.cost && hint.not_before > deadline) {
                return Err(give_up());
            }
            match woke {
                // A waiter whose turn came at its deadline still tries.
                Woke::Turn(turn) => return Ok(turn),
                Woke::Expired => return Err(give_up()),
                Woke::Changed => {}
            }
            woke = poll_fn(|cx| {
                if let Poll::Ready(turn) = turn.as_mut().poll(cx) {
                    Poll::Ready(Woke::Turn(turn))
                } else if changed.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Woke::Changed)
                } else if expired.as_mut().poll(cx).is_ready() {
                    Poll::Ready(Woke::Expired)
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }

    /// Replaces the hint; a new one wakes the waiters behind to read it (clearing it cannot
    /// make anybody give up: no wake-up).
    fn set_hint(&self, hint: Option<Hint>) {
        let new = hint.is_some();
        *lock(&self.hint) = hint;
        if new {
            self.hint_changed.notify_waiters();
        }
    }
}

/// What ended a waiter's wait in line: its turn, a new hint, or its deadline.
enum Woke<'a> {
    Turn(tokio::sync::MutexGuard<'a, ()>),
    Changed,
    Expired,
}

/// A waiter's place in a line; leaving (done, failed or dropped) removes an emptied line.
struct Place<'a> {
    waiters: &'a Waiters,
    storage_key: &'a str,
    line: Option<Arc<Line>>,
}

impl Place<'_> {
    fn line(&self) -> &Line {
        self.line
            .as_ref()
            .expect("a place has its line until dropped")
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut lines = lock(&self.waiters.lines);
        // Every clone of a line is made and dropped under this lock, so the count is exact:
        // 2 is the map's and this place's.
        if let Some(line) = self.line.take() {
            if Arc::strong_count(&line) == 2 {
                lines.remove(self.storage_key);
            }
        }
    }
}

/// Locks `mutex`, through a poisoning: the data (lines, hints) stays consistent at every step.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The part of the deadline message that says the key is suspended.
fn suspended_note(suspended: &bool) -> &'static str {
    if *suspended {
        " (the key is suspended)"
    } else {
        ""
    }
}

/// The upper bound of the jitter added to `wait`: `wait / 20`, at least 1 ms.
fn jitter_bound(wait: Duration) -> Duration {
    (wait / 20).max(MIN_JITTER)
}

/// A random jitter, uniform in `[0, jitter_bound(wait)]` (microsecond steps).
fn jitter(wait: Duration) -> Duration {
    let bound = jitter_bound(wait).as_micros() as u64;
    Duration::from_micros(fastrand::u64(0..=bound))
}

#[cfg(test)]
impl Waiters {
    fn lines(&self) -> usize {
        lock(&self.lines).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_is_a_twentieth_of_the_wait_and_at_least_1_ms() {
        let ms = Duration::from_millis;
        assert_eq!(jitter_bound(Duration::ZERO), ms(1));
        assert_eq!(jitter_bound(ms(10)), ms(1));
        assert_eq!(jitter_bound(ms(50)), Duration::from_micros(2_500));
        assert_eq!(jitter_bound(ms(500)), ms(25));
        // Long waits (a suspension) spread their waiters widely.
        assert_eq!(jitter_bound(Duration::from_secs(2)), ms(100));
        assert_eq!(
            jitter_bound(Duration::from_secs(3600)),
            Duration::from_secs(180)
        );
        for wait in [ms(0), ms(50), ms(500), Duration::from_secs(86_400)] {
            for _ in 0..1_000 {
                assert!(jitter(wait) <= jitter_bound(wait), "{wait:?}");
            }
        }
    }

    #[test]
    fn the_jitter_spreads_over_its_range() {
        let wait = Duration::from_millis(500);
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

    use crate::quota::Quota;
    use crate::store::MemoryStore;

    #[tokio::test]
    async fn only_the_first_of_a_line_asks_the_store() {
        let limiter = Limiter::new(MemoryStore::new());
        // One every 100 ms; spent.
        let quotas = Quotas::from(Quota::per_second(10).unwrap().with_burst(1).unwrap());
        assert!(limiter.check_quotas("k", &quotas, 1).await.is_allowed());
        // 20 waiters, room for about 5 of them before the deadline.
        let deadline = Instant::now() + Duration::from_millis(500);
        let results =
            futures::future::join_all((0..20).map(|_| limiter.acquire("k", &quotas, deadline)))
                .await;
        let admitted = results.iter().filter(|r| r.is_ok()).count() as u64;
        let stats = limiter.stats();
        assert_eq!(stats.allowed, 1 + admitted);
        assert!((3..=6).contains(&admitted), "{admitted} admitted");
        // The first of the line is denied once per unit (it asks as soon as its turn comes);
        // the one that learns the next unit comes too late tells the rest, who ask nothing.
        // Every waiter on its own would have asked about every 100 ms.
        assert!(
            stats.denied <= admitted + 2,
            "{} denials for {admitted} admissions",
            stats.denied
        );
        for error in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(
                error,
                AcquireError::DeadlineExceeded {
                    suspended: false,
                    ..
                }
            ));
        }
        assert_eq!(limiter.inner.waiters.lines(), 0);
    }

    #[tokio::test]
    async fn a_waiter_whose_deadline_comes_first_gives_up_without_asking() {
        let limiter = Limiter::new(MemoryStore::new());
        let quotas = Quotas::from(Quota::per_second(1).unwrap());
        assert!(limiter.check_quotas("k", &quotas, 1).await.is_allowed());
        let far = Instant::now() + Duration::from_secs(5);
        let mut first = Box::pin(limiter.acquire("k", &quotas, far));
        // The first waiter asks once, is denied (~1 s), and sleeps.
        let polled = poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        assert_eq!(limiter.stats().denied, 1);
        // Behind it, a deadline before that unit: an error at once, no check of its own.
        let near = Instant::now() + Duration::from_millis(100);
        let error = limiter.acquire("k", &quotas, near).await.unwrap_err();
        let AcquireError::DeadlineExceeded { retry_after, .. } = error else {
            panic!("{error:?}");
        };
        assert!(retry_after > Duration::from_millis(500), "{retry_after:?}");
        assert_eq!(limiter.stats().denied, 1);
        // A dropped waiter leaves its line; the last one removes it.
        assert_eq!(limiter.inner.waiters.lines(), 1);
        drop(first);
        assert_eq!(limiter.inner.waiters.lines(), 0);
    }
}
