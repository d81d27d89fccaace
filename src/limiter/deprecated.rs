//! The check variants that [`Target`], [`Quotas`] and a cost argument now cover, kept for one
//! release as thin wrappers.

use std::time::Instant;

use super::{AcquireError, Limiter, Target};
use crate::decision::{Decision, Verdict};
use crate::quota::{Quota, Quotas};
use crate::store::StoreError;

impl Limiter {
    /// Use [`check_quotas`](Self::check_quotas)`(key, &quota.into(), cost)`.
    #[deprecated(note = "use `check_quotas(key, &quota.into(), cost)`")]
    pub async fn check_cost(&self, key: &str, quota: &Quota, cost: u64) -> Verdict {
        self.check_quotas(key, &Quotas::from(quota), cost).await
    }

    /// Use [`check_quotas`](Self::check_quotas)`(Target::scoped(scope, key), &quota.into(), cost)`.
    #[deprecated(note = "use `check_quotas(Target::scoped(scope, key), &quota.into(), cost)`")]
    pub async fn check_scoped(&self, scope: &str, key: &str, quota: &Quota, cost: u64) -> Verdict {
        self.check_quotas(Target::scoped(scope, key), &Quotas::from(quota), cost)
            .await
    }

    /// Use [`check_quotas`](Self::check_quotas)`(Target::scoped(scope, key), quotas, cost)`.
    #[deprecated(note = "use `check_quotas(Target::scoped(scope, key), quotas, cost)`")]
    pub async fn check_scoped_quotas(
        &self,
        scope: &str,
        key: &str,
        quotas: &Quotas,
        cost: u64,
    ) -> Verdict {
        self.check_quotas(Target::scoped(scope, key), quotas, cost)
            .await
    }

    /// Use [`try_check_quotas`](Self::try_check_quotas)`(key, &quota.into(), cost)`.
    #[deprecated(note = "use `try_check_quotas(key, &quota.into(), cost)`")]
    pub async fn try_check(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
    ) -> Result<Decision, StoreError> {
        self.try_check_quotas(key, &Quotas::from(quota), cost).await
    }

    /// Use [`acquire_cost`](Self::acquire_cost)`(Target::scoped(scope, key), quotas, cost,
    /// deadline)`.
    #[deprecated(note = "use `acquire_cost(Target::scoped(scope, key), quotas, cost, deadline)`")]
    pub async fn acquire_scoped(
        &self,
        scope: &str,
        key: &str,
        quotas: &Quotas,
        cost: u64,
        deadline: Instant,
    ) -> Result<Verdict, AcquireError> {
        self.acquire_cost(Target::scoped(scope, key), quotas, cost, deadline)
            .await
    }

    /// Use [`forget`](Self::forget)`(Target::scoped(scope, key))`.
    #[deprecated(note = "use `forget(Target::scoped(scope, key))`")]
    pub fn forget_scoped(&self, scope: &str, key: &str) {
        self.forget(Target::scoped(scope, key));
    }

    /// Use [`storage_key`](Self::storage_key)`(Target::scoped(scope, key))`.
    #[deprecated(note = "use `storage_key(Target::scoped(scope, key))`")]
    pub fn scoped_storage_key(&self, scope: &str, key: &str) -> String {
        self.storage_key(Target::scoped(scope, key))
    }

    /// Use [`storage_key`](Self::storage_key), which takes a [`Target`].
    #[deprecated(note = "use `storage_key(target)`")]
    pub fn target_storage_key<'a>(&self, target: impl Into<Target<'a>>) -> String {
        self.storage_key(target)
    }
}
