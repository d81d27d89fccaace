//! Scenario: the fleet features (overrides, suspensions, several quotas).

use super::*;

impl Bench {
    /// A fleet feature on the token bucket, concurrency 64, hot key: its own limiter and key,
    /// the feature set up (or set again) before the run and checked with one decision.
    pub(crate) async fn fleet(&mut self, fleet: Fleet) -> Run {
        let algorithm = Algorithm::TokenBucket;
        let prefix = format!("{PREFIX}-fleet-{}", fleet.name().replace(' ', "-"));
        let limiter = self.admin.limiter(algorithm, &prefix, false).await;
        let key = self.keys.plain[0].as_str();
        let admitting = admitting(algorithm);
        let (quotas, suspended) = match fleet {
            Fleet::Override => {
                // Another admitting quota, so that the decisions show which one was in force.
                let forced = Quotas::from(Quota::per_second(2_000_000_000).expect("a valid quota"));
                limiter.set_quota(key, &forced).await.expect("set_quota");
                let first = limiter.check(key, &admitting).await;
                assert_eq!(
                    first.decision().map(|d| d.quota),
                    Some(forced[0]),
                    "the override is in force"
                );
                (Quotas::from(admitting), false)
            }
            Fleet::TwoTiers => {
                let per_minute = Quota::per_minute(60_000_000_000).expect("a valid quota");
                let tiers = Quotas::new([admitting, per_minute]).expect("two valid quotas");
                (tiers, false)
            }
            Fleet::Suspended => {
                limiter
                    .suspend(key, Duration::from_secs(3600))
                    .await
                    .expect("suspend");
                (Quotas::from(admitting), true)
            }
        };
        let before = limiter.stats();
        let ops = (0..RATIO_CONCURRENCY)
            .map(|_| FleetOp {
                limiter: limiter.clone(),
                quotas,
                suspended,
                keys: self.keys.clone(),
            })
            .collect();
        let (run, _) = measure(&self.settings, &self.admin, ops).await;
        let after = limiter.stats();
        assert!(
            after.store_errors == 0
                && if suspended {
                    after.allowed == before.allowed
                } else {
                    after.denied == before.denied
                },
            "fleet {}: the run saw other decisions or store errors ({before:?} -> {after:?})",
            fleet.name()
        );
        self.record(
            &format!("fleet {}", fleet.name()),
            Shape::RATIO,
            run.clone(),
        );
        run
    }
}
