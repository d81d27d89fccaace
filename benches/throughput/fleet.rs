//! Scenario: the fleet features (overrides, suspensions, several quotas).

use super::*;

impl Bench {
    /// A fleet feature on the token bucket, concurrency 64, hot key: its own limiter and key,
    /// the feature set up (or set again) before the run and checked with one decision.
    pub(crate) async fn fleet(&mut self, fleet: Fleet) -> Checked<Run> {
        if fleet == Fleet::Untenanted {
            return self.untenanted().await;
        }
        let algorithm = Algorithm::TokenBucket;
        let prefix = format!("{PREFIX}-fleet-{}", fleet.name().replace(' ', "-"));
        let limiter = self.admin.limiter(algorithm, &prefix, false).await?;
        let key = self.keys.plain[0].as_str();
        let admitting = admitting(algorithm);
        let (quotas, suspended) = match fleet {
            Fleet::Override => {
                // Another admitting quota, so that the decisions show which one was in force.
                let forced = Quotas::from(Quota::per_second(2_000_000_000).expect("a valid quota"));
                limiter
                    .set_quota(key, &forced)
                    .await
                    .map_err(|e| failure!("fleet override: set_quota: {e}"))?;
                let first = limiter.check(key, &admitting).await;
                ensure!(
                    first.decision().map(|d| d.quota) == Some(forced[0]),
                    "fleet override: the override is not in force ({first:?})"
                );
                (Quotas::from(admitting), false)
            }
            Fleet::TwoTiers => {
                let per_minute = Quota::per_minute(60_000_000_000).expect("a valid quota");
                let tiers = Quotas::new([admitting, per_minute]).expect("two valid quotas");
                (tiers, false)
            }
            Fleet::Untenanted => unreachable!("measured by Bench::untenanted"),
            Fleet::Suspended => {
                limiter
                    .suspend(key, Duration::from_secs(3600))
                    .await
                    .map_err(|e| failure!("fleet suspended: suspend: {e}"))?;
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
        let (run, _) = measure(&self.settings, &self.admin, ops).await?;
        let after = limiter.stats();
        ensure!(
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
        )?;
        Ok(run)
    }

    /// [`Fleet::Untenanted`]: the token bucket's `check` of [`Bench::check`] (same keys, same
    /// quota, the server's clock), but the crate's script sent by hand without the tenant's key.
    async fn untenanted(&mut self) -> Checked<Run> {
        let algorithm = Algorithm::TokenBucket;
        let prefix = format!("{PREFIX}-fleet-untenanted");
        let limiter = self.admin.limiter(algorithm, &prefix, false).await?;
        let mut connection = connect(&self.admin.url).await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(redlimit::test_hooks::script_source())
            .query_async(&mut connection)
            .await
            .map_err(|e| failure!("SCRIPT LOAD of the crate's script: {e}"))?;
        let keys: Vec<String> = self
            .keys
            .plain
            .iter()
            .map(|key| limiter.storage_key(key.as_str()))
            .collect();
        // '<ddBddd': now_us (-1: the server's clock), cost, the algorithm's tag, then the one
        // tier's limit, period_us and burst (lua/common.lua's header).
        let quota = admitting(algorithm);
        let mut args = Vec::with_capacity(41);
        args.extend_from_slice(&(-1f64).to_le_bytes());
        args.extend_from_slice(&1f64.to_le_bytes());
        args.push(b't'); // the token bucket's tag (lua/common.lua's header)
        for number in [
            quota.limit() as f64,
            quota.period().as_micros() as f64,
            quota.burst() as f64,
        ] {
            args.extend_from_slice(&number.to_le_bytes());
        }
        let (sha, keys, args): (Arc<str>, _, Arc<[u8]>) = (sha.into(), Arc::new(keys), args.into());
        let shape = Shape::RATIO;
        let ops = (0..shape.concurrency)
            .map(|task| UntenantedOp {
                connection: connection.clone(),
                sha: sha.clone(),
                keys: keys.clone(),
                args: args.clone(),
                shape,
                task,
            })
            .collect();
        let (run, ops) = measure(&self.settings, &self.admin, ops).await?;
        drop(ops);
        self.record("fleet no tenant key", shape, run.clone())?;
        Ok(run)
    }
}
