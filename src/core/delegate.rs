//! A feature that answers checks in the store's place: [`Delegate`] (leases, `crate::lease`).
//! The core asks it first and hands it the rest of a check it could not answer at once; it
//! never names the feature's types.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Answer, Ask, ConfigError, Limiter};
use crate::algorithm::Algorithm;
use crate::clock::Clock;

/// A feature that answers some checks without a store call of their own (a lease's units).
pub(crate) trait Delegate: Any + Send + Sync + fmt::Debug {
    /// Whether it takes `ask` (a check that blocks on a denial is one store call: not taken).
    fn takes(&self, ask: &Ask<'_>) -> bool;

    /// Its answer to `ask`, when it needs no waiting; `None` leaves the check to
    /// [`answer_later`](Self::answer_later).
    fn answer_now(&self, limiter: &Limiter, ask: Ask<'_>) -> Option<Answer>;

    /// The rest of `ask`, after [`answer_now`](Self::answer_now) answered nothing. Boxed: only
    /// a check that waits for the store gets here.
    fn answer_later<'a>(&'a self, limiter: &'a Limiter, ask: Ask<'a>) -> BoxFuture<'a, Answer>;

    /// Drops what it holds of `storage_key`, whose state or quota changed.
    fn forget(&self, limiter: &Limiter, storage_key: &str);

    /// Drops what it holds of every scope of `tenant`, giving unspent units back when
    /// `give_back`.
    fn forget_tenant(&self, limiter: &Limiter, tenant: &str, give_back: bool);
}

/// How a [`Delegate`] is configured on the builder, and made by [`build`](super::LimiterBuilder::build).
pub(crate) trait DelegateConfig: Send + Sync + fmt::Debug {
    /// The configuration's errors under `algorithm`.
    fn validate(&self, algorithm: Algorithm) -> Result<(), ConfigError>;

    /// The deny cache it needs: its size when none is asked for, and the longest an entry may
    /// answer.
    fn deny_cache(&self) -> (usize, std::time::Duration);

    /// The delegate, for a limiter of `algorithm` on `clock`.
    fn build(&self, algorithm: Algorithm, clock: &Clock) -> Arc<dyn Delegate>;
}

impl Limiter {
    /// This limiter's delegate of type `T`, when it has one.
    pub(crate) fn delegate<T: Delegate>(&self) -> Option<&T> {
        let delegate: &dyn Any = self.inner.delegate.as_deref()?;
        delegate.downcast_ref()
    }
}
