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
/// # Client clocks that disagree
///
/// With a client clock, instances' clocks differ by some skew, and a call can find its key's
/// state written by a clock ahead of its own: a stored time (a token bucket's refill time, GCRA's
/// time of the debt, a window's start, the sliding log's newest entry) later than its `now`. How
/// far ahead tells the two causes apart:
///
/// - **At most [`Clock::MAX_SKEW`] (5 s) ahead: skew.** Another instance's clock runs ahead. The
///   call decides as of the stored time: no refill, no new window, nothing written backwards (an
///   admission keeps the stored time; the sliding log adds its entries there, never before the
///   newest). Its `retry_after` and `reset_after` count from its own clock, so they still hold
///   exactly for a client that comes back to the same instance. The fleet then admits no more
///   than one clock running as fast as the fastest instance would: the skew buys at most
///   `rate × skew` once, never per call (tested for every algorithm at 1 ms, 20 ms and 1 s).
/// - **More than [`Clock::MAX_SKEW`] ahead: a clock that stepped back** (an NTP step, a VM
///   restored). The state is repaired to `now` (no refill granted; a window of a later time
///   reads as empty), so the key is never locked out until the clock catches up. A step back of
///   at most `MAX_SKEW` is a skew like any other: the key pauses for at most that long.
///
/// Instances whose clocks differ by more than `MAX_SKEW` fall outside the guarantee: each call of
/// the slower one repairs the state to its earlier time and the faster one counts the difference
/// as refill, so the fleet can admit `rate × skew` more on every call. Keep client clocks
/// synchronised (NTP), or use the server clock.
///
/// ```
/// use redlimit::clock::{Clock, ManualClock};
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
    /// This process's system clock, passed to the script. Instances' clocks must agree within
    /// [`Clock::MAX_SKEW`] (see [Client clocks that disagree](Clock#client-clocks-that-disagree)).
    System,
    /// A clock the caller moves by hand, passed to the script.
    Manual(ManualClock),
}

impl Clock {
    /// How far instances' client clocks may differ: a stored time up to this far ahead of a
    /// call's `now` is another instance's clock running ahead (skew), further ahead it is this
    /// clock having stepped back. See [Client clocks that disagree](Clock#client-clocks-that-disagree).
    ///
    /// 5 s: far above what NTP leaves between hosts (milliseconds), and below the smallest step
    /// back that must still repair at once rather than pause the key (a step back of 30 s under
    /// 10 a minute, after which a window algorithm sees a window start 10 s ahead).
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
/// Use it as [`Clock::Manual`]; see [`LimiterBuilder::clock`](crate::limiter::LimiterBuilder::clock)
/// for a limiter driven by one.
///
/// ```
/// use redlimit::clock::ManualClock;
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
