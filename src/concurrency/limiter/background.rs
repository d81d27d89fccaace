//! The background work of a [`ConcurrencyLimiter`]: renewing its slots' leases (and putting
//! back those the store lost) and giving slots back until the store answers, both in bulk.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};

use super::{ConcurrencyLimiter, SlotsInner};
use crate::store::SlotOp;

/// Slot ids per store call (renewals and releases are sent in bulk, per key).
const IDS_PER_CALL: usize = 512;
/// Keys renewed or released at once, so that a round over many keys during an outage takes
/// about one timeout, not one per key.
const KEYS_AT_ONCE: usize = 32;
/// The first and the longest pause between attempts to give back (or renew) slots the store
/// did not answer for.
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_millis(250);

impl SlotsInner {
    /// One renewal round: every held slot's lease, one call per key (and per
    /// [`IDS_PER_CALL`] ids), the keys at once; answers whether every call was answered.
    async fn renew_held(&self) -> bool {
        let mut by_key: HashMap<String, Vec<(u64, String)>> = HashMap::new();
        for (&number, (key, id)) in self.held().iter() {
            by_key
                .entry(key.clone())
                .or_default()
                .push((number, id.clone()));
        }
        let (restored, answered): (u64, bool) = stream::iter(by_key)
            .map(|(key, slots)| async move {
                let (mut restored, mut answered) = (0, true);
                for chunk in slots.chunks(IDS_PER_CALL) {
                    let ids: Vec<&str> = chunk.iter().map(|(_, id)| id.as_str()).collect();
                    match self.call(&key, &ids, SlotOp::Renew).await {
                        Ok(reply) => restored += reply.restored,
                        Err(error) => {
                            tracing::debug!(%error, "concurrency slot leases not renewed");
                            answered = false;
                        }
                    }
                    // A slot given back while its renewal was on the way may have been put
                    // back by it: give it back once more.
                    let stale: Vec<String> = {
                        let held = self.held();
                        chunk
                            .iter()
                            .filter(|(number, _)| !held.contains_key(number))
                            .map(|(_, id)| id.clone())
                            .collect()
                    };
                    for id in stale {
                        self.give_back(key.clone(), id);
                    }
                }
                (restored, answered)
            })
            .buffer_unordered(KEYS_AT_ONCE)
            .fold((0, true), |(sum, all), (n, answered)| async move {
                (sum + n, all && answered)
            })
            .await;
        if restored > 0 {
            tracing::warn!(
                restored,
                "concurrency slots lost by the store were put back at their renewal"
            );
        }
        answered
    }

    /// Gives back every queued slot, one call per key (and per [`IDS_PER_CALL`] ids), the
    /// keys at once; answers whether some are left to retry (the store did not answer).
    async fn release_queued(&self) -> bool {
        let queued: Vec<_> = std::mem::take(&mut *self.releasing()).into_iter().collect();
        let lease = self.lease;
        let failed: Vec<(String, Vec<(String, Instant)>)> = stream::iter(queued)
            .map(|(key, mut ids)| async move {
                // Queued a lease ago: its lease has ended by itself.
                ids.retain(|(_, at)| at.elapsed() < lease);
                let mut failed = Vec::new();
                for chunk in ids.chunks(IDS_PER_CALL) {
                    let refs: Vec<&str> = chunk.iter().map(|(id, _)| id.as_str()).collect();
                    if let Err(error) = self.call(&key, &refs, SlotOp::Release).await {
                        tracing::debug!(%error, "concurrency slots not given back yet; retrying");
                        failed.extend_from_slice(chunk);
                    }
                }
                (key, failed)
            })
            .buffer_unordered(KEYS_AT_ONCE)
            .filter(|(_, failed)| std::future::ready(!failed.is_empty()))
            .collect()
            .await;
        let retry = !failed.is_empty();
        let mut releasing = self.releasing();
        for (key, ids) in failed {
            releasing.entry(key).or_default().extend(ids);
        }
        retry
    }
}

impl ConcurrencyLimiter {
    /// Starts the background tasks, once: the renewal of this limiter's slots (every third of
    /// a lease) and the release of the slots it gives back. Both end when the limiter is gone.
    pub(super) fn start_background(&self) {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.inner.started.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.lease / 3;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is now
            loop {
                tick.tick().await;
                // A round the store did not answer (a restart: the connection is new) is
                // retried soon, not a period later, so slots Redis lost are back within one
                // renewal period of its answering again.
                let mut pause = RETRY_FIRST;
                loop {
                    let Some(inner) = weak.upgrade() else { return };
                    if inner.renew_held().await {
                        break;
                    }
                    drop(inner);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        });
        let (weak, wake) = (Arc::downgrade(&self.inner), Arc::clone(&self.inner.wake));
        runtime.spawn(async move {
            loop {
                wake.notified().await;
                let mut pause = RETRY_FIRST;
                loop {
                    let Some(inner) = weak.upgrade() else { return };
                    if !inner.release_queued().await {
                        break;
                    }
                    drop(inner);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        });
    }
}
