//! Scenario: one limiter over 1, 2 and 4 connections.

use super::*;

/// `n` stores of one connection each, taken in turn by the calls (one counter, no lock): a
/// store with several connections, measured here against one, so that the choice of a single
/// connection can be checked again.
#[derive(Debug)]
pub(crate) struct RoundRobin {
    pub(crate) stores: Vec<RedisStore>,
    pub(crate) next: AtomicUsize,
}

impl Store for RoundRobin {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.stores.len();
        self.stores[i].check(request)
    }
}

impl Bench {
    /// Token-bucket `Limiter::check` at concurrency 256 over 1, 2 and 4 connections,
    /// interleaved round by round (starting at a rotating place), on the hot key and over
    /// [`KEYS`] keys. Prints decisions/s of each (medians) and the per-round ratios to one
    /// connection.
    pub(crate) async fn connections(&mut self) -> Checked {
        let algorithm = Algorithm::TokenBucket;
        let rounds = self.settings.connection_rounds;
        for keys in [Keys::Hot, Keys::Spread] {
            let shape = Shape::new(256, keys);
            let mut limiters = Vec::new();
            for n in CONNECTIONS {
                let prefix = format!("{PREFIX}-connections-{n}");
                limiters.push(self.admin.round_robin_limiter(n, &prefix).await?);
            }
            let mut rates = vec![Vec::new(); CONNECTIONS.len()];
            // This process's and Redis's CPU µs per decision.
            let mut cpu = vec![(Vec::new(), Vec::new()); CONNECTIONS.len()];
            for round in 0..rounds {
                for step in 0..CONNECTIONS.len() {
                    let i = (step + round) % CONNECTIONS.len();
                    let ops = self.check_ops(&limiters[i], admitting(algorithm), true, shape);
                    let (run, _) = measure(&self.settings, &self.admin, ops).await?;
                    ensure!(
                        run.failures == 0,
                        "connections {} over {} connections: {} of {} operations failed or had an \
                         unexpected decision: the figures would not be valid",
                        shape.label(),
                        CONNECTIONS[i],
                        run.failures,
                        run.ops
                    );
                    rates[i].push(run.rate());
                    cpu[i].0.push(run.own_cpu_us());
                    cpu[i].1.push(run.redis_cpu_us());
                }
            }
            for (limiter, n) in limiters.iter().zip(CONNECTIONS) {
                let scenario = format!("connections {} over {n}", shape.label());
                assert_only(limiter, &scenario, "allowed", |s| {
                    s.denied == 0 && s.store_errors == 0
                })?;
            }
            let rate =
                |i: usize| format!("{} -> {:.0}/s", CONNECTIONS[i], median(rates[i].clone()));
            let ratio = |i: usize| {
                let ratio = Ratio::of(
                    rates[i]
                        .iter()
                        .zip(&rates[0])
                        .map(|(n, one)| n / one)
                        .collect(),
                );
                format!(
                    "{}/1 {:.2} ({:.2}-{:.2})",
                    CONNECTIONS[i], ratio.median, ratio.min, ratio.max
                )
            };
            let cpu: Vec<String> = cpu
                .iter()
                .zip(CONNECTIONS)
                .map(|((own, redis), n)| {
                    format!(
                        "{n}: {:.2}+{:.2}",
                        median(own.clone()),
                        median(redis.clone())
                    )
                })
                .collect();
            println!(
                "connections {}: {}, {}, {} (median of {rounds} rounds); per round {}, {}; CPU \
                 µs/decision bench+redis {}",
                shape.label(),
                rate(0),
                rate(1),
                rate(2),
                ratio(1),
                ratio(2),
                cpu.join(", ")
            );
        }
        Ok(())
    }
}

/// Fails the bench when the limiter's counters show another path than the one measured by
/// `scenario` (named in the failure, with the counters).
pub(crate) fn assert_only(
    limiter: &Limiter,
    scenario: &str,
    path: &str,
    ok: impl Fn(&LimiterStats) -> bool,
) -> Checked {
    let stats = limiter.stats();
    ensure!(
        ok(&stats),
        "{scenario}: a run of the {path} path saw other decisions or store errors: the figures \
         are not valid ({stats:?})"
    );
    Ok(())
}
