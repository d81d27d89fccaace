//! Whether Redis and this process were answering during a decision: a thread of its own sends
//! `PING` on a connection of its own every [`EVERY`] while a schedule runs, and records when each
//! was sent and answered. A store timeout while that thread's `PING`s were answered promptly
//! throughout is the store's own stall, not Redis's nor the machine's (two cores shared with
//! other work): the oracles judge a timeout only then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the monitor pings.
const EVERY: Duration = Duration::from_millis(5);

/// One `PING`: when it was sent, and when answered (`None`: an error or no answer in a second).
#[derive(Clone, Copy, Debug)]
struct Ping {
    sent: Instant,
    answered: Option<Instant>,
}

/// The monitor of a schedule's run.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Ping>>,
}

impl Monitor {
    /// Starts pinging the server at `url`.
    pub fn start(url: String) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let client = redis::Client::open(url).expect("valid redis url");
            let mut conn = None;
            let mut pings = Vec::new();
            while !stopped.load(Ordering::Relaxed) {
                let sent = Instant::now();
                if conn.is_none() {
                    conn = client
                        .get_connection_with_timeout(Duration::from_secs(1))
                        .ok()
                        .inspect(|c| {
                            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
                        });
                }
                let answered = conn.as_mut().and_then(|c| {
                    let pong: redis::RedisResult<String> = redis::cmd("PING").query(c);
                    pong.ok().map(|_| Instant::now())
                });
                if answered.is_none() {
                    conn = None;
                }
                pings.push(Ping { sent, answered });
                std::thread::sleep(EVERY);
            }
            pings
        });
        Monitor { stop, thread }
    }

    /// Stops the monitor, returning what it saw.
    pub fn stop(self) -> Health {
        self.stop.store(true, Ordering::Relaxed);
        Health {
            pings: self.thread.join().expect("the monitor"),
        }
    }
}

/// What a [`Monitor`] saw.
#[derive(Default)]
pub struct Health {
    pings: Vec<Ping>,
}

impl Health {
    /// Whether, from `from` to `to`, Redis answered the monitor's `PING`s with never more than
    /// `gap` between two answers (nor between `from` or `to` and the answers around them): a
    /// stall of Redis, of the network or of this process's threads longer than `gap` shows as
    /// such a gap.
    pub fn steady(&self, from: Instant, to: Instant, gap: Duration) -> bool {
        let answers = self
            .pings
            .iter()
            .filter_map(|p| p.answered)
            .filter(|at| *at + gap >= from && *at <= to + gap);
        let mut last = from;
        let mut before = true;
        for at in answers {
            if at.saturating_duration_since(last) > gap {
                return false;
            }
            last = last.max(at);
            before = false;
        }
        // A ping sent in the span and never answered is a stall as well.
        let failed = self
            .pings
            .iter()
            .any(|p| p.answered.is_none() && p.sent >= from && p.sent <= to);
        !before && last + gap >= to && !failed
    }

    /// Whether this process's monitor thread was kept from running for more than `gap` at
    /// some moment from `from` to `to`: between an answer and the next `PING` it only sleeps
    /// [`EVERY`].
    pub fn starved(&self, from: Instant, to: Instant, gap: Duration) -> bool {
        self.pings.windows(2).any(|pair| {
            let (a, b) = (pair[0], pair[1]);
            let Some(answered) = a.answered else {
                return false;
            };
            b.sent >= from
                && answered <= to
                && b.sent.saturating_duration_since(answered) > EVERY + gap
        })
    }

    /// Whether the monitor ran at all (a schedule on another backend has none).
    pub fn ran(&self) -> bool {
        !self.pings.is_empty()
    }
}
