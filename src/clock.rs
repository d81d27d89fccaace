//! [`Clock`]: whose time the algorithms run on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Whose clock a decision uses.
///
/// The default, [`Clock::Server`], reads Redis's own `TIME` inside the script: one clock for the
/// whole fleet, so skew between instances can neither over-admit nor starve. The client clocks pass
/// `now` to the script instead; [`Clock::Manual`] makes tests deterministic.
///
/// ```
/// use redlimit::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new(Duration::from_secs(1_000));
/// let limiter_clock = Clock::Manual(clock.clone());
/// clock.advance(Duration::from_millis(1_500));
/// assert_eq!(limiter_clock.now_micros(), Some(1_001_500_000));
/// assert_eq!(Clock::Server.now_micros(), None);
/// ```
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// Redis server time (`TIME` inside the script). The memory store uses the system clock.
    #[default]
    Server,
    /// This process's system clock, passed to the script.
    System,
    /// A clock the caller moves by hand, passed to the script.
    Manual(ManualClock),
}

impl Clock {
    /// How far instances' client clocks may differ: a stored time up to this far ahead of a
    /// call's `now` is another instance's clock running ahead (skew), further ahead it is this
    /// clock having stepped back. See [`Clock`].
    pub const MAX_SKEW: Duration = Duration::from_secs(5);

    /// Microseconds since the Unix epoch to pass to the store, or `None` for server time.
    pub fn now_micros(&self) -> Option<u64> {
        match self {
            Clock::Server => None,
            Clock::System => Some(system_now_micros()),
            Clock::Manual(clock) => Some(clock.now_micros()),
        }
    }
}

/// The system clock in microseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn system_now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A shared clock moved by hand, for deterministic tests. Clones share the same time.
///
/// Use it as [`Clock::Manual`]; see [`LimiterBuilder::clock`](crate::LimiterBuilder::clock)
/// for a limiter driven by one.
///
/// ```
/// use redlimit::ManualClock;
/// use std::time::Duration;
///
/// let clock = ManualClock::new(Duration::from_secs(10));
/// let shared = clock.clone();
/// shared.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_micros(), 10_005_000);
/// clock.set(Duration::from_secs(9)); // a clock step backwards
/// assert_eq!(shared.now_micros(), 9_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at `since_epoch` after the Unix epoch.
    pub fn new(since_epoch: Duration) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(since_epoch.as_micros() as u64)),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.micros
            .fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    /// Sets the clock, backwards too (to test clock steps).
    pub fn set(&self, since_epoch: Duration) {
        self.micros
            .store(since_epoch.as_micros() as u64, Ordering::SeqCst);
    }

    /// The current time in microseconds since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.micros.load(Ordering::SeqCst)
    }
}
