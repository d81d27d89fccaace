//! [`RateLimit`]: the middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use crate::body::ResponseBody;
use crate::future::ResponseFuture;
use crate::key::KeyExtractor;
use crate::layer::Config;
use crate::response::is_grpc;
use crate::MissingKey;

/// The service [`RateLimitLayer`](crate::RateLimitLayer) wraps around an inner service.
///
/// See the [crate docs](crate) for an example.
pub struct RateLimit<S, K> {
    inner: S,
    config: Arc<Config<K>>,
}

impl<S, K> RateLimit<S, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<K>>) -> Self {
        RateLimit { inner, config }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K> Clone for RateLimit<S, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for RateLimit<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, K>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service made ready in `poll_ready` is the one that must be called: keep it, leave a
        // clone behind. https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = &self.config;

        let (parts, body) = request.into_parts();
        if config.skip.as_ref().is_some_and(|skip| skip(&parts)) {
            let future = inner.call(Request::from_parts(parts, body));
            return ResponseFuture::pass_through(future, config.clone());
        }
        let grpc = is_grpc(&parts.headers);
        let key = match (config.extractor.extract(&parts), &config.missing_key) {
            (Some(key), _) => key,
            (None, MissingKey::Shared(shared)) => shared.clone(),
            (None, MissingKey::Reject(status)) => {
                return ResponseFuture::missing_key(*status, config.clone(), grpc);
            }
            (None, MissingKey::Allow) => {
                tracing::debug!("request has no rate limit key; allowed by MissingKey::Allow");
                let future = inner.call(Request::from_parts(parts, body));
                return ResponseFuture::pass_through(future, config.clone());
            }
        };
        let cost = config.cost.as_ref().map_or(1, |cost| cost(&parts));

        let limiter = config.limiter.clone();
        let quota = config.quota;
        let check = Box::pin(async move { limiter.check_cost(&key, &quota, cost).await });
        ResponseFuture::checking(
            check,
            Request::from_parts(parts, body),
            inner,
            self.config.clone(),
            grpc,
        )
    }
}
