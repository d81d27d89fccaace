//! [`Limiter::refund`]: units given back after the fact, in one atomic store call.

use super::{Limiter, PolicyLabel, Shadow};
use crate::limiter::{ControlError, Target};
use crate::policy::FailureContext;
use crate::quota::Quotas;
use crate::store::{RefundRequest, StoreError};

impl Limiter {
    /// Gives `units` back to every tier of `target` under `quotas` (the quotas it was checked
    /// against; an override in the store replaces them, as in a check), in one atomic store
    /// call, never above a tier's capacity. For a request that reserved more than it used (see
    /// the [modes guide](crate::guide::modes)): reserve at request time with the cost, give the
    /// rest back once it is known.
    ///
    /// What a refund does per algorithm: the token bucket gets the tokens back (at most its
    /// burst), GCRA's debt shrinks (at least to 0), the fixed window's count shrinks, the
    /// sliding window's current count and then its previous one, and the sliding log loses its
    /// newest entries. A key with nothing stored, or stored before a tenant's
    /// [`reset`](Self::reset) (full already), is left as it is. Refunding 0 units does nothing.
    ///
    /// ```
    /// use redlimit::{store::MemoryStore, Limiter, Quota, Quotas};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(MemoryStore::new());
    /// let quotas = Quotas::from(Quota::per_minute(10)?);
    /// // Reserve 8 for a job, which then used 3: give 5 back.
    /// assert!(limiter.check_quotas("tenant-42", &quotas, 8).await.is_allowed());
    /// limiter.refund("tenant-42", &quotas, 5).await?;
    /// let peek = *limiter.check_quotas("tenant-42", &quotas, 0).await.decision().unwrap();
    /// assert_eq!(peek.remaining, 7);
    /// // Never above capacity.
    /// limiter.refund("tenant-42", &quotas, 100).await?;
    /// let peek = *limiter.check_quotas("tenant-42", &quotas, 0).await.decision().unwrap();
    /// assert_eq!(peek.remaining, 10);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn refund<'a>(
        &self,
        target: impl Into<Target<'a>>,
        quotas: &Quotas,
        units: u64,
    ) -> Result<(), ControlError> {
        self.supports(quotas).map_err(|(_, error)| error)?;
        let key = self.target_key(target.into());
        self.refund_storage_key(key.as_str(), quotas, units).await?;
        Ok(())
    }

    /// [`refund`](Self::refund) on a storage key, as the layer's settlement gives units back.
    pub(crate) async fn refund_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        units: u64,
    ) -> Result<(), StoreError> {
        if units == 0 {
            return Ok(());
        }
        let request = RefundRequest {
            key: storage_key,
            algorithm: self.inner.algorithm,
            quotas,
            units,
            now_micros: self.inner.clock.now_micros(),
        };
        let result = self.inner.store.refund(request).await;
        // A cached denial may now be too long.
        self.forget_storage_key(storage_key);
        result.map(|_| ())
    }
}

impl Limiter {
    /// A layer's settlement after the response: `refund` units given back, or `charge` more
    /// taken (what is left of it at most: a tier is emptied, never driven below). A failure is
    /// counted and logged; a charge that failed goes to the failure policy (a local fallback
    /// charges its share), a refund that failed is lost (the units stay spent).
    pub(crate) async fn settle_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        refund: u64,
        charge: u64,
        label: &PolicyLabel,
    ) {
        let result = if refund > 0 {
            self.refund_storage_key(storage_key, quotas, refund).await
        } else {
            self.charge_storage_key(storage_key, quotas, charge).await
        };
        let Err(error) = result else { return };
        self.inner.stats.count_store_error();
        if charge > 0 {
            let request = self.request(storage_key, quotas, charge);
            let verdict = self.inner.policy.on_store_error(&FailureContext {
                error: &error,
                request,
            });
            self.inner.stats.count_failure(&verdict, label);
        }
        self.count_settle_failure(&error.to_string());
    }

    /// Counts a settlement that failed, and logs it at a bounded rate (never the key).
    pub(crate) fn count_settle_failure(&self, error: &str) {
        self.inner.stats.count_settle_failure();
        if let Some(suppressed) = crate::store::failure_log_gate() {
            tracing::warn!(
                error,
                suppressed,
                "rate limit settlement after the response failed; the response was not delayed"
            );
        }
    }

    /// Takes `units` more from a storage key after the fact: what is left of them, at most (a
    /// peek, then a check of that cost; a check that a concurrent request beat to the units is
    /// denied and consumes nothing, so this never takes more than was left).
    async fn charge_storage_key(
        &self,
        storage_key: &str,
        quotas: &Quotas,
        units: u64,
    ) -> Result<(), StoreError> {
        let label = PolicyLabel::direct().shadowed(Shadow::Uncounted);
        let peek = self
            .ask(self.request(storage_key, quotas, 0), &label)
            .await?;
        let take = units.min(peek.remaining);
        if take > 0 {
            self.ask(self.request(storage_key, quotas, take), &label)
                .await?;
        }
        Ok(())
    }
}
