//! What a feature above the core keeps per limiter: [`FeatureStates`].

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use super::Limiter;

/// One value per feature type, made on first use and shared by every clone of the limiter: so
/// that a feature keeps its own state, which the core holds without naming its type.
#[derive(Default)]
pub(crate) struct FeatureStates(Mutex<Vec<Arc<dyn Any + Send + Sync>>>);

impl FeatureStates {
    /// The state of type `T`, made with `T::default()` the first time.
    fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut states = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(state) = states
            .iter()
            .find_map(|state| state.clone().downcast::<T>().ok())
        {
            return state;
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
