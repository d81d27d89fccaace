//! [`RedisFailure`]: what went wrong talking to Redis, without redis-rs's types in the API; and
//! [`FailureLog`]: when a store's failures are logged.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Instant;

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

/// Redis answered with an error, or the connection to it failed: the payload of
/// [`StoreError::Redis`](super::StoreError::Redis).
///
/// Opaque, so the crate's public API does not change with its Redis client's. Its `Display`
/// is the client's message; [`code`](Self::code) gives the server's error code when there is
/// one, and [`StoreError::is_transport`](super::StoreError::is_transport) says whether it
/// concerns the whole store or one request.
#[derive(Debug, Clone)]
pub struct RedisFailure(RedisError);

impl RedisFailure {
    pub(crate) fn new(error: RedisError) -> Self {
        RedisFailure(error)
    }

    /// The client's error, for the store's own retry and reconnect decisions.
    pub(crate) fn inner(&self) -> &RedisError {
        &self.0
    }

    /// The server's error code, e.g. `NOPERM`, `BUSY`, `WRONGPASS` or `ERR` (a script's error
    /// reply); `None` when the failure is not a server's reply (I/O, a refused connection).
    pub fn code(&self) -> Option<&str> {
        self.0.code()
    }

    /// The server's or the client's message without the code, when there is one.
    pub fn detail(&self) -> Option<&str> {
        self.0.detail()
    }

    /// Whether the call timed out at the connection (not the store's own timeout, which is
    /// [`StoreError::Timeout`](super::StoreError::Timeout)).
    pub fn is_timeout(&self) -> bool {
        self.0.is_timeout()
    }

    /// See [`StoreError::is_transport`](super::StoreError::is_transport).
    pub(crate) fn is_transport(&self) -> bool {
        let error = &self.0;
        error.is_io_error()
            || error.is_connection_refusal()
            || error.is_connection_dropped()
            || error.is_timeout()
            || matches!(
                error.kind(),
                ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                ) | ErrorKind::ClusterConnectionNotFound
            )
            // A script running past `busy-reply-threshold` (no kind of its own).
            || error.code() == Some("BUSY")
    }
}

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for RedisFailure {
    /// The client error's own cause (an I/O or TLS error, the server's reply).
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.0)
    }
}

/// When a store's failures are logged at `warn`, shared by everything that uses one store.
///
/// An **episode** starts at a failure and ends when the store answers (a call that succeeds:
/// the store says so with [`answered`](Self::answered)) or, for a store that never says so,
/// after [`REPEAT_MS`] without a failure. Its first failure is logged at once; while it lasts,
/// one line a minute at most, each with the count of failures left out since the line
/// before. A store that flaps (fails, answers, fails again) still logs at most one line a
/// second ([`FLAP_MS`]). Every failure is counted elsewhere (`LimiterStats`, metrics) whether
/// it is logged or not.
#[derive(Debug, Default)]
pub(crate) struct FailureLog {
    /// [`ANSWERED`], [`FAILING`] (an episode not logged yet) or [`SAID`].
    state: AtomicU8,
    /// ms since [`EPOCH`] + 1 of the last line; 0 before the first.
    last_line: AtomicU64,
    /// ms since [`EPOCH`] + 1 of the last failure; 0 before the first.
    last_failure: AtomicU64,
    /// Failures not logged since the last line.
    left_out: AtomicU64,
}

/// No episode: the store answered last (or never failed).
const ANSWERED: u8 = 0;
/// An episode whose first line is still due (held back by [`FLAP_MS`]).
const FAILING: u8 = 1;
/// An episode already logged.
const SAID: u8 = 2;

/// The least time between two lines while an episode lasts, and the quiet time that ends an
/// episode of a store that never says it answered.
pub(crate) const REPEAT_MS: u64 = 60_000;
/// The least time between the first lines of two episodes.
pub(crate) const FLAP_MS: u64 = 1_000;

/// The clock of [`FailureLog`]'s times.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// A line [`FailureLog::failed`] says is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogLine {
    /// The first line of an episode (else: it goes on).
    pub(crate) first: bool,
    /// Failures not logged since the line before.
    pub(crate) left_out: u64,
}

impl FailureLog {
    /// A failure: the line to log now, if one is due.
    pub(crate) fn failed(&self) -> Option<LogLine> {
        self.failed_at(EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1)
    }

    /// [`failed`](Self::failed) at `now` (ms, never 0).
    fn failed_at(&self, now: u64) -> Option<LogLine> {
        let quiet = self.last_failure.swap(now, Ordering::Relaxed);
        let mut state = self.state.load(Ordering::Relaxed);
        if state == SAID && quiet != 0 && now >= quiet + REPEAT_MS {
            state = ANSWERED; // a minute without failures: this one starts an episode
        }
        let wait = if state == SAID { REPEAT_MS } else { FLAP_MS };
        let last = self.last_line.load(Ordering::Relaxed);
        if (last == 0 || now >= last + wait)
            && self
                .last_line
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.state.store(SAID, Ordering::Relaxed);
            return Some(LogLine {
                first: state != SAID,
                left_out: self.left_out.swap(0, Ordering::Relaxed),
            });
        }
        if state == ANSWERED {
            self.state.store(FAILING, Ordering::Relaxed);
        }
        self.left_out.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Whether a change of the store's state (its circuit opening, a probe failing) is told at
    /// `warn`: only as the first line of an episode, which it then is (the failures after it
    /// count toward the next line, a minute on). Otherwise the episode's lines already tell
    /// of the outage, and the change is a `debug` event: one outage, one warning.
    pub(crate) fn may_tell(&self) -> bool {
        if self.state.load(Ordering::Relaxed) == SAID {
            return false;
        }
        let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
        self.state.store(SAID, Ordering::Relaxed);
        self.last_line.store(now, Ordering::Relaxed);
        true
    }

    /// The store answered: the episode, if any, is over, and the next failure is logged at
    /// once. One load when there is none.
    #[inline]
    pub(crate) fn answered(&self) {
        if self.state.load(Ordering::Relaxed) != ANSWERED {
            self.state.store(ANSWERED, Ordering::Relaxed);
        }
    }
}

/// The longest description of a store a log line shows.
const MAX_DESCRIPTION: usize = 300;

/// The [`FailureLog`] of the store described by `store`'s `Debug` (cut to a few hundred
/// characters), and that description: one log per description in the process, so that a
/// store that says when it answered (a `RedisStore`, which takes its log here when built) and
/// the limiters that log its failures share one. A store is told apart by its description
/// alone: two stores described alike share their episodes.
pub(crate) fn failure_log(store: &dyn fmt::Debug) -> (String, Arc<FailureLog>) {
    static LOGS: OnceLock<Mutex<HashMap<String, Weak<FailureLog>>>> = OnceLock::new();
    let mut description = format!("{store:?}");
    if description.len() > MAX_DESCRIPTION {
        let mut end = MAX_DESCRIPTION;
        while !description.is_char_boundary(end) {
            end -= 1;
        }
        description.truncate(end);
        description.push('…');
    }
    let mut logs = LOGS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(log) = logs.get(&description).and_then(Weak::upgrade) {
        return (description, log);
    }
    logs.retain(|_, log| log.strong_count() > 0);
    let log = Arc::new(FailureLog::default());
    logs.insert(description.clone(), Arc::downgrade(&log));
    (description, log)
}

/// A limiter's store's [`failure_log`], found on its first failure and kept (in the
/// limiter's `FeatureStates`).
#[derive(Debug, Default)]
pub(crate) struct StoreFailureLog(OnceLock<(String, Arc<FailureLog>)>);

impl StoreFailureLog {
    /// The description and log of `store`, the store this is kept for.
    pub(crate) fn of(&self, store: &dyn fmt::Debug) -> (&str, &FailureLog) {
        let (description, log) = self.0.get_or_init(|| failure_log(store));
        (description, log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::StoreError;

    #[test]
    fn an_episode_logs_its_first_failure_then_one_line_a_minute_until_an_answer() {
        let log = FailureLog::default();
        let line = |first, left_out| Some(LogLine { first, left_out });
        assert_eq!(log.failed_at(10), line(true, 0));
        for at in 11..1_000 {
            assert_eq!(log.failed_at(at), None);
        }
        assert_eq!(log.failed_at(10 + REPEAT_MS - 1), None);
        assert_eq!(log.failed_at(10 + REPEAT_MS), line(false, 990));
        assert_eq!(log.failed_at(20 + REPEAT_MS), None);
        // An answer ends the episode: the next failure is logged at once.
        log.answered();
        log.answered();
        assert_eq!(log.failed_at(2_000 + REPEAT_MS), line(true, 1));
        // A store that flaps logs one line a second.
        log.answered();
        assert_eq!(log.failed_at(2_100 + REPEAT_MS), None);
        log.answered();
        assert_eq!(log.failed_at(2_200 + REPEAT_MS), None);
        // Held back, the episode's first line comes a second after the last line, not a minute.
        assert_eq!(log.failed_at(3_000 + REPEAT_MS), line(true, 2));
        assert_eq!(log.failed_at(4_000 + REPEAT_MS), None);
        // A minute without failures ends an episode of a store that never says it answered.
        assert_eq!(log.failed_at(4_000 + 2 * REPEAT_MS), line(true, 1));
    }

    #[test]
    fn stores_described_alike_share_a_log_and_others_do_not() {
        #[derive(Debug)]
        #[allow(dead_code)] // read through its `Debug`
        struct Described<'a>(&'a str);
        let (description, first) = failure_log(&Described("a store shared by description"));
        assert_eq!(description, r#"Described("a store shared by description")"#);
        let (_, again) = failure_log(&Described("a store shared by description"));
        assert!(Arc::ptr_eq(&first, &again));
        let (_, other) = failure_log(&Described("another store"));
        assert!(!Arc::ptr_eq(&first, &other));
        let (long, _) = failure_log(&Described(&"é".repeat(400)));
        assert!(long.chars().count() <= MAX_DESCRIPTION + 1, "{long}");
    }

    #[test]
    fn a_failure_reads_like_the_clients_error_and_gives_the_servers_code() {
        let error = ::redis::make_extension_error(
            "NOPERM".to_owned(),
            Some("this user has no permissions to access one of the keys".to_owned()),
        );
        let failure = RedisFailure::new(error.clone());
        assert_eq!(failure.to_string(), error.to_string());
        assert_eq!(failure.code(), Some("NOPERM"));
        assert_eq!(failure.detail(), error.detail());
        let io = RedisFailure::new(RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert_eq!(io.code(), None);
        let store = StoreError::Redis(failure);
        let source = std::error::Error::source(&store).expect("a source");
        assert_eq!(source.to_string(), error.to_string());
    }
}
