//! [`ConcurrencyLimit`], the middleware's [`Service`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use tower_service::Service;

use super::body::ConcurrencyBody;
use super::config::Shared;
use super::future::{ConcurrencyFuture, State};
use super::SlotOutcome;
use crate::key::KeyExtractor;
use crate::layer::take_ready;

/// The shared key of requests without one (as [`MissingKey::Shared`](crate::layer::MissingKey)'s
/// default).
const UNKEYED: &str = "#:unkeyed";

/// The service of [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer).
pub struct ConcurrencyLimit<S, K> {
    pub(super) inner: S,
    pub(super) shared: Arc<Shared<K>>,
}

impl<S: Clone, K> Clone for ConcurrencyLimit<S, K> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, K> fmt::Debug for ConcurrencyLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
{
    type Response = Response<ConcurrencyBody<ResBody>>;
    type Error = S::Error;
    type Future = ConcurrencyFuture<S, ReqBody, K>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let inner = take_ready(&mut self.inner);
        let (parts, body) = request.into_parts();
        let key = self
            .shared
            .extractor
            .with_key(&parts, |key| key.unwrap_or(UNKEYED).to_owned());
        let shared = Arc::clone(&self.shared);
        let acquire: BoxFuture<'static, SlotOutcome> =
            Box::pin(async move { shared.slots.acquire(&key).await });
        ConcurrencyFuture {
            state: State::Acquiring {
                acquire,
                request: Some(Request::from_parts(parts, body)),
                inner: Some(inner),
            },
            shared: Some(Arc::clone(&self.shared)),
        }
    }
}
