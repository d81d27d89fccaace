//! What a feature above the core keeps per limiter: [`FeatureStates`].

use std::any::Any;
use std::sync::{Arc, PoisonError, RwLock};

use super::Limiter;

/// One value per feature type, made on first use and shared by every clone of the limiter: so
/// that a feature keeps its own state, which the core holds without naming its type.
#[derive(Default)]
pub(crate) struct FeatureStates(RwLock<Vec<Arc<dyn Any + Send + Sync>>>);

impl FeatureStates {
    /// The state of type `T`, made with `T::default()` the first time.
    fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let find = |states: &[Arc<dyn Any + Send + Sync>]| {
            states
                .iter()
                .find_map(|state| state.clone().downcast::<T>().ok())
        };
        if let Some(state) = find(&self.0.read().unwrap_or_else(PoisonError::into_inner)) {
            return state;
        }
        let mut states = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = find(&states) {
            return state; // made by another caller between the two locks
        }
        let state = Arc::new(T::default());
        states.push(state.clone());
        state
    }
}

impl std::fmt::Debug for FeatureStates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FeatureStates")
    }
}

impl Limiter {
    /// This limiter's state of a feature, of type `T` (see [`FeatureStates`]).
    pub(crate) fn feature_state<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.inner.features.get()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::store::MemoryStore;

    #[derive(Default)]
    struct Counter(AtomicU64);

    #[derive(Default)]
    struct Other(AtomicU64);

    #[test]
    fn a_features_state_is_one_per_limiter_and_type_shared_by_its_clones() {
        let limiter = Limiter::new(MemoryStore::new());
        let clone = limiter.clone();
        limiter
            .feature_state::<Counter>()
            .0
            .fetch_add(1, Ordering::Relaxed);
        clone
            .feature_state::<Counter>()
            .0
            .fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            limiter.feature_state::<Counter>().0.load(Ordering::Relaxed),
            2
        );
        assert_eq!(
            limiter.feature_state::<Other>().0.load(Ordering::Relaxed),
            0
        );
        let another = Limiter::new(MemoryStore::new());
        assert_eq!(
            another.feature_state::<Counter>().0.load(Ordering::Relaxed),
            0
        );
    }
}
