//! [`Quota`]: how many requests a key may make, over which period, with which burst.

use std::fmt;
use std::time::Duration;

mod duration;
pub use duration::{parse_duration, DurationError};

/// The largest `limit` or `burst` a quota accepts: 10^15.
///
/// Counts stay exact in Lua, whose numbers are doubles (exact integers up to 2^53).
pub const MAX_COUNT: u64 = 1_000_000_000_000_000;

/// The longest `period` a quota accepts: 100 years.
///
/// Timestamps and periods are integer microseconds inside the scripts and must stay below 2^53.
pub const MAX_PERIOD: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Why a quota could not be built.
///
/// ```
/// use redlimit::{quota::QuotaError, Quota};
///
/// assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
/// let error = Quota::per_second(1).unwrap().with_burst(0).unwrap_err();
/// assert_eq!(error, QuotaError::ZeroBurst);
/// assert_eq!(error.to_string(), "quota burst must be at least 1 request");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// `limit` was 0: a quota must admit at least one request per period.
    #[error("quota limit must be at least 1 request per period")]
    ZeroLimit,
    /// `period` was shorter than one microsecond.
    #[error("quota period must be at least 1 microsecond")]
    ZeroPeriod,
    /// `burst` was 0: the bucket must hold at least one request.
    #[error("quota burst must be at least 1 request")]
    ZeroBurst,
    /// `limit` or `burst` exceeded [`MAX_COUNT`].
    #[error("quota limit and burst must be at most 10^15 requests")]
    CountTooLarge,
    /// `period` exceeded [`MAX_PERIOD`].
    #[error("quota period must be at most 100 years")]
    PeriodTooLong,
    /// The sliding log stores one entry per unit: its burst must be at most
    /// [`MAX_SLIDING_LOG_BURST`](crate::algorithm::MAX_SLIDING_LOG_BURST).
    #[error("the sliding log keeps one entry per request: its burst must be at most 100000; use sliding-window for larger quotas")]
    BurstTooLargeForSlidingLog,
    /// A list of quotas ([`Quotas`]) was empty.
    #[error("at least one quota is needed")]
    NoQuotas,
    /// A list of quotas ([`Quotas`]) had more than [`MAX_TIERS`].
    #[error("at most 8 quotas can be checked together")]
    TooManyQuotas,
}

/// The most quotas one [`Quotas`] holds (checked in one script call).
pub const MAX_TIERS: usize = 8;

/// A rate: `limit` requests per `period`, with room for `burst` requests at once.
///
/// The burst (the bucket's capacity) defaults to the limit. Every constructor validates its input
/// and returns a [`QuotaError`] instead of panicking.
///
/// Decisions are exact over the whole range (counts up to [`MAX_COUNT`], periods up to
/// [`MAX_PERIOD`]). The `RateLimit` headers of a layer hold integers of at most 15 digits, as
/// every structured field does: a quota of more than 999 999 999 999 999 units at once or per
/// second, or taking more than 999 999 999 999 999 seconds to refill its burst, is advertised
/// within that bound, never as more than it gives (the exact rule is in the
/// [headers guide](crate::guide::headers)).
///
/// ```
/// use redlimit::Quota;
/// use std::time::Duration;
///
/// let per_minute = Quota::per_minute(100)?;               // 100 requests a minute
/// let bursty = Quota::per_second(10)?.with_burst(50)?;    // 10/s, up to 50 at once
/// let custom = Quota::new(5, Duration::from_millis(500))?; // 5 requests per 500 ms
/// assert_eq!(bursty.burst(), 50);
/// assert_eq!(custom.period(), Duration::from_millis(500));
/// assert!(Quota::per_second(0).is_err());
/// # Ok::<(), redlimit::quota::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period: Duration,
    burst: u64,
}

impl Quota {
    /// `limit` requests per `period`; the burst equals the limit.
    ///
    /// The period must be at least 1 µs; it is counted in whole microseconds, rounded up (so the
    /// rate is never faster than asked).
    ///
    /// ```
    /// use redlimit::{quota::QuotaError, Quota};
    /// use std::time::Duration;
    ///
    /// let quota = Quota::new(5, Duration::from_millis(500))?;
    /// assert_eq!((quota.limit(), quota.burst()), (5, 5));
    /// assert_eq!(quota.period(), Duration::from_millis(500));
    /// assert_eq!(Quota::new(5, Duration::from_nanos(10)), Err(QuotaError::ZeroPeriod));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub fn new(limit: u64, period: Duration) -> Result<Self, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if limit > MAX_COUNT {
            return Err(QuotaError::CountTooLarge);
        }
        if period < Duration::from_micros(1) {
            return Err(QuotaError::ZeroPeriod);
        }
        if period > MAX_PERIOD {
            return Err(QuotaError::PeriodTooLong);
        }
        Ok(Quota {
            limit,
            period,
            burst: limit,
        })
    }

    /// `requests` per second.
    ///
    /// ```
    /// use redlimit::Quota;
    /// use std::time::Duration;
    ///
    /// let quota = Quota::per_second(100)?;
    /// assert_eq!((quota.limit(), quota.period()), (100, Duration::from_secs(1)));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn per_second(requests: u64) -> Result<Self, QuotaError> {
        Self::new(requests, Duration::from_secs(1))
    }

    /// `requests` per minute.
    ///
    /// ```
    /// use redlimit::Quota;
    /// use std::time::Duration;
    ///
    /// let quota = Quota::per_minute(100)?;
    /// assert_eq!((quota.limit(), quota.period()), (100, Duration::from_secs(60)));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn per_minute(requests: u64) -> Result<Self, QuotaError> {
        Self::new(requests, Duration::from_secs(60))
    }

    /// `requests` per hour.
    ///
    /// ```
    /// use redlimit::Quota;
    /// use std::time::Duration;
    ///
    /// let quota = Quota::per_hour(100)?;
    /// assert_eq!((quota.limit(), quota.period()), (100, Duration::from_secs(3600)));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn per_hour(requests: u64) -> Result<Self, QuotaError> {
        Self::new(requests, Duration::from_secs(3600))
    }

    /// `requests` per day.
    ///
    /// ```
    /// use redlimit::Quota;
    /// use std::time::Duration;
    ///
    /// let quota = Quota::per_day(100)?;
    /// assert_eq!((quota.limit(), quota.period()), (100, Duration::from_secs(86_400)));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn per_day(requests: u64) -> Result<Self, QuotaError> {
        Self::new(requests, Duration::from_secs(24 * 3600))
    }

    /// The same rate with a different burst: how many requests may pass at once after a quiet
    /// spell. Window algorithms use it as the number of requests per window.
    ///
    /// ```
    /// use redlimit::{quota::QuotaError, Quota};
    ///
    /// // On average 1 request a second, but up to 30 at once after a quiet half-minute.
    /// let quota = Quota::per_second(1)?.with_burst(30)?;
    /// assert_eq!((quota.limit(), quota.burst()), (1, 30));
    /// assert_eq!(quota.with_burst(0), Err(QuotaError::ZeroBurst));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub fn with_burst(self, burst: u64) -> Result<Self, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        if burst > MAX_COUNT {
            return Err(QuotaError::CountTooLarge);
        }
        Ok(Quota { burst, ..self })
    }

    /// Requests admitted per [`period`](Self::period) in the long run.
    ///
    /// ```
    /// use redlimit::Quota;
    ///
    /// assert_eq!(Quota::per_minute(100)?.with_burst(10)?.limit(), 100);
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period over which [`limit`](Self::limit) requests are admitted.
    ///
    /// ```
    /// use redlimit::Quota;
    /// use std::time::Duration;
    ///
    /// assert_eq!(Quota::per_hour(100)?.period(), Duration::from_secs(3600));
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Requests that may pass at once (the bucket's capacity).
    ///
    /// ```
    /// use redlimit::Quota;
    ///
    /// let quota = Quota::per_minute(100)?;
    /// assert_eq!(quota.burst(), 100); // the limit, unless set
    /// assert_eq!(quota.with_burst(5)?.burst(), 5);
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The period in whole microseconds, the unit of every script, rounded up: a shorter
    /// period would admit requests faster than configured.
    pub(crate) fn period_micros(&self) -> u64 {
        // MAX_PERIOD (a whole number of seconds) keeps this below 2^53 even rounded up.
        self.period.as_nanos().div_ceil(1_000) as u64
    }

    /// The quota a script names by its numbers (a reply, an override), validated like any other.
    pub(crate) fn from_micros(limit: u64, period_us: u64, burst: u64) -> Result<Self, QuotaError> {
        Quota::new(limit, Duration::from_micros(period_us))?.with_burst(burst)
    }
}

/// Several quotas checked together on one key, all or none: 10 a second **and** 500 a minute.
///
/// One store call checks every tier atomically: a request denied by one tier consumes from none.
/// The decision reported is the most restrictive (see [`Decision::quota`](crate::Decision)).
/// Holds 1 to [`MAX_TIERS`] quotas, so an empty list is refused when it is built, never at a
/// check. A single [`Quota`] converts into one.
///
/// ```
/// use redlimit::{quota::QuotaError, Quota, Quotas};
///
/// let tiers = Quotas::new([Quota::per_second(10)?, Quota::per_minute(500)?])?;
/// assert_eq!(tiers.len(), 2);
/// let one: Quotas = Quota::per_minute(100)?.into();
/// assert_eq!(one[0].limit(), 100);
/// assert_eq!(Quotas::new([]), Err(QuotaError::NoQuotas));
/// assert_eq!(Quotas::new([one[0]; 9]), Err(QuotaError::TooManyQuotas));
/// # Ok::<(), QuotaError>(())
/// ```
///
/// It holds its quotas inline (no allocation), so building one per call is free.
#[derive(Clone, Copy)]
pub struct Quotas {
    len: u8,
    /// The quotas, then copies of the first one (never read).
    tiers: [Quota; MAX_TIERS],
}

impl Quotas {
    /// The quotas in order; 1 to [`MAX_TIERS`] of them.
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Result<Self, QuotaError> {
        let mut quotas = quotas.into_iter();
        let first = quotas.next().ok_or(QuotaError::NoQuotas)?;
        let mut tiers = Quotas::from(first);
        for quota in quotas {
            if usize::from(tiers.len) == MAX_TIERS {
                return Err(QuotaError::TooManyQuotas);
            }
            tiers.tiers[usize::from(tiers.len)] = quota;
            tiers.len += 1;
        }
        Ok(tiers)
    }

    /// The quotas as a slice.
    ///
    /// ```
    /// use redlimit::{Quota, Quotas};
    ///
    /// let tiers = Quotas::from(Quota::per_second(1)?);
    /// assert_eq!(tiers.as_slice(), &[Quota::per_second(1)?]);
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn as_slice(&self) -> &[Quota] {
        &self.tiers[..usize::from(self.len)]
    }
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Quotas {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Quotas {}

impl std::hash::Hash for Quotas {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl From<Quota> for Quotas {
    fn from(quota: Quota) -> Self {
        Quotas {
            len: 1,
            tiers: [quota; MAX_TIERS],
        }
    }
}

impl From<&Quota> for Quotas {
    fn from(quota: &Quota) -> Self {
        Quotas::from(*quota)
    }
}

impl TryFrom<Vec<Quota>> for Quotas {
    type Error = QuotaError;

    fn try_from(quotas: Vec<Quota>) -> Result<Self, QuotaError> {
        Quotas::new(quotas)
    }
}

impl TryFrom<&[Quota]> for Quotas {
    type Error = QuotaError;

    fn try_from(quotas: &[Quota]) -> Result<Self, QuotaError> {
        Quotas::new(quotas.iter().copied())
    }
}

impl std::ops::Deref for Quotas {
    type Target = [Quota];

    fn deref(&self) -> &[Quota] {
        self.as_slice()
    }
}

impl AsRef<[Quota]> for Quotas {
    fn as_ref(&self) -> &[Quota] {
        self.as_slice()
    }
}

impl<'a> IntoIterator for &'a Quotas {
    type Item = &'a Quota;
    type IntoIter = std::slice::Iter<'a, Quota>;

    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_say_their_units() {
        let quotas = [
            (Quota::per_second(3), 1),
            (Quota::per_minute(3), 60),
            (Quota::per_hour(3), 3600),
            (Quota::per_day(3), 86400),
        ];
        for (quota, seconds) in quotas {
            assert_eq!(quota.unwrap().period(), Duration::from_secs(seconds));
        }
        let q = Quota::per_minute(10).unwrap();
        assert_eq!((q.limit(), q.burst()), (10, 10));
    }

    #[test]
    fn invalid_quotas_are_typed_errors() {
        assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroLimit));
        assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
        assert_eq!(
            Quota::new(1, Duration::from_nanos(999)),
            Err(QuotaError::ZeroPeriod)
        );
        assert_eq!(
            Quota::per_second(1).unwrap().with_burst(0),
            Err(QuotaError::ZeroBurst)
        );
        assert_eq!(
            Quota::per_second(MAX_COUNT + 1),
            Err(QuotaError::CountTooLarge)
        );
        assert_eq!(
            Quota::per_second(1).unwrap().with_burst(u64::MAX),
            Err(QuotaError::CountTooLarge)
        );
        assert_eq!(
            Quota::new(1, MAX_PERIOD + Duration::from_secs(1)),
            Err(QuotaError::PeriodTooLong)
        );
        assert!(Quota::new(MAX_COUNT, MAX_PERIOD).is_ok());
    }

    #[test]
    fn period_micros_rounds_up() {
        let micros = |nanos: u64| {
            Quota::new(1, Duration::from_nanos(nanos))
                .unwrap()
                .period_micros()
        };
        assert_eq!(micros(1_000), 1);
        assert_eq!(micros(1_001), 2);
        assert_eq!(micros(1_999), 2);
        assert_eq!(micros(2_000), 2);
        let max = Quota::new(1, MAX_PERIOD).unwrap().period_micros();
        assert_eq!(u128::from(max), MAX_PERIOD.as_micros());
        let just_below = Quota::new(1, MAX_PERIOD - Duration::from_nanos(1)).unwrap();
        assert_eq!(just_below.period_micros(), max);
        assert!(max < 1 << 53, "exact in Lua's doubles");
    }

    /// 1 request per 1.999 µs: 1 µs after an admitted request, the next one waits.
    #[test]
    fn a_fractional_microsecond_period_is_not_faster_than_configured() {
        use crate::algorithm::Algorithm;
        use crate::store::{CheckRequest, MemoryStore};
        let quota = Quota::new(1, Duration::from_nanos(1_999)).unwrap();
        for &algorithm in Algorithm::ALL {
            let store = MemoryStore::new();
            let check = |now| {
                store
                    .check_now(CheckRequest {
                        key: "redlimit:{k}",
                        algorithm,
                        quotas: &quota.into(),
                        cost: 1,
                        now_micros: Some(now),
                    })
                    .allowed
            };
            let now = 1_700_000_000_000_000;
            assert!(check(now), "{algorithm}");
            assert!(
                !check(now + 1),
                "{algorithm}: admitted 1 µs into a 1.999 µs period"
            );
        }
    }
}
