//! [`BlockFor`]: a denial that suspends the key's tenant, fleet-wide, in the same store call.

use std::time::Duration;

use crate::core::{Ask, ControlError, Limiter, PolicyLabel, Target, MAX_SUSPENSION};
use crate::decision::Verdict;
use crate::quota::Quotas;

/// How long a key denied by a quota is blocked: its tenant is suspended, fleet-wide and on
/// every route, for this long, in the same atomic store call as the denial (see
/// [`RateLimitLayerBuilder::block_for`](crate::layer::RateLimitLayerBuilder::block_for) and
/// [`Limiter::check_blocking`](crate::Limiter::check_blocking)).
///
/// With [`doubling_up_to`](Self::doubling_up_to), each repeated offence doubles the block, up
/// to a cap: the offences are counted next to the tenant's controls and forgotten once the cap
/// has passed with no new block.
///
/// ```
/// use std::time::Duration;
/// use redlimit::limiter::BlockFor;
///
/// let block = BlockFor::new(Duration::from_secs(60))?
///     .doubling_up_to(Duration::from_secs(3600))?;
/// assert_eq!(block.duration(), Duration::from_secs(60));
/// assert_eq!(block.max(), Duration::from_secs(3600));
/// // 1 µs to 30 days.
/// assert!(BlockFor::new(Duration::ZERO).is_err());
/// # Ok::<(), redlimit::limiter::ControlError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFor {
    duration: Duration,
    max: Duration,
}

impl BlockFor {
    /// A block of `duration` (1 µs to [`MAX_SUSPENSION`]), the same for every offence.
    pub fn new(duration: Duration) -> Result<Self, ControlError> {
        check(duration)?;
        Ok(BlockFor {
            duration,
            max: duration,
        })
    }

    /// Each repeated offence doubles the block, up to `max` (at least the block, at most
    /// [`MAX_SUSPENSION`]).
    pub fn doubling_up_to(self, max: Duration) -> Result<Self, ControlError> {
        check(max)?;
        if max < self.duration {
            return Err(ControlError::InvalidDuration);
        }
        Ok(BlockFor { max, ..self })
    }

    /// The first offence's block.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The longest block (the same as [`duration`](Self::duration) without doubling).
    pub fn max(&self) -> Duration {
        self.max
    }
}

/// A block of `duration`, bounded to 1 µs ..= [`MAX_SUSPENSION`].
impl From<Duration> for BlockFor {
    fn from(duration: Duration) -> Self {
        let duration = duration.clamp(Duration::from_micros(1), MAX_SUSPENSION);
        BlockFor {
            duration,
            max: duration,
        }
    }
}

fn check(duration: Duration) -> Result<(), ControlError> {
    if duration.as_micros() == 0 || duration > MAX_SUSPENSION {
        return Err(ControlError::InvalidDuration);
    }
    Ok(())
}

impl BlockFor {
    /// The store's form of this block.
    pub(crate) fn store_block(&self) -> crate::store::Block {
        crate::store::Block {
            duration: self.duration,
            max: self.max,
        }
    }
}

impl Limiter {
    /// Checks one request of `cost` against `quotas`, as [`check_quotas`](Self::check_quotas)
    /// does, and when a quota denies it, blocks the key: its tenant is suspended fleet-wide,
    /// on every route, for the `block` (doubled per repeated offence when it doubles), in the
    /// same atomic store call. The denial's `retry_after` is then the block's time left, or the
    /// quota's own wait when that is longer (a client that obeys it is never denied by the
    /// quota, and so never blocked again, for coming back too early). Until the block
    /// ends every check on the key is denied as [`suspended`](crate::Decision::suspended);
    /// [`inspect`](Self::inspect) shows it and [`resume`](Self::resume) ends it early. A
    /// suspension already in force is never shortened.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::limiter::BlockFor;
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quotas = Quotas::from(Quota::per_second(2)?);
    /// let block = BlockFor::new(Duration::from_secs(600))?;
    /// for _ in 0..2 {
    ///     assert!(limiter.check_blocking("k", &quotas, 1, &block).await.is_allowed());
    /// }
    /// let denied = *limiter.check_blocking("k", &quotas, 1, &block).await.decision().unwrap();
    /// assert!(!denied.allowed);
    /// assert!(denied.retry_after > Duration::from_secs(599));
    /// // Blocked on every route, whatever quota a route checks.
    /// let status = limiter.inspect("k").await?;
    /// assert!(status.suspended_for.unwrap() > Duration::from_secs(599));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check_blocking<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        cost: u64,
        block: &BlockFor,
    ) -> Verdict {
        let storage_key = self.target_key(target.into());
        let label = PolicyLabel::direct();
        let ask = Ask::new(storage_key.as_str(), quotas, cost, &label);
        self.answer(ask.blocking(Some(block.store_block())))
            .await
            .verdict
    }
}
