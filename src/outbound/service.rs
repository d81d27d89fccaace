//! [`Outbound`]: the client middleware service.

use std::fmt;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::config::{Acquire, Config, KeySource};
use super::error::OutboundError;
use super::future::ResponseFuture;
use crate::core::AcquireError;
use crate::key::{GlobalKey, KeyExtractor};

/// The service [`OutboundLayer`](super::OutboundLayer) wraps around a client: see the
/// [module docs](super) for an example.
///
/// With a fixed key, `poll_ready` is Pending until the limiter admits one request (or the wait
/// would pass `max_wait`: then it is Ready, and the next `call` fails with
/// [`OutboundError::Acquire`] without reaching the inner service; `poll_ready` itself only fails
/// when the inner service's does, so a `tower::buffer::Buffer` in front stays usable).
/// The admission belongs to this instance until its next `call`: a clone starts without
/// one, and a service dropped after `poll_ready` without a `call` has spent one admission.
///
/// With a key taken from each request, `poll_ready` is always Ready: each response future waits
/// for its key's quota first, then polls a clone of the inner service ready and calls it, so a
/// key waiting for quota holds none of the inner service's capacity (a connection, a
/// `ConcurrencyLimit` slot) and does not delay keys that have quota.
///
/// The service is `Send` but not `Sync` (it may hold the pending acquisition); put a
/// `tower::buffer::Buffer` in front to share one between tasks.
pub struct Outbound<S, K = GlobalKey> {
    inner: S,
    config: Arc<Config<K>>,
    permit: Permit,
}

/// Where a fixed-key service stands with its admission for the next `call`.
enum Permit {
    /// Nothing acquired yet.
    Idle,
    /// Waiting for the limiter.
    Acquiring(Acquire),
    /// Admitted: the next `call` goes through.
    Admitted,
    /// The limiter did not admit in time: the next `call` fails with this.
    Refused(AcquireError),
}

impl<S, K> Outbound<S, K> {
    pub(crate) fn from_config(inner: S, config: Arc<Config<K>>) -> Self {
        Outbound {
            inner,
            config,
            permit: Permit::Idle,
        }
    }

    /// The inner service.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use redlimit::{outbound::OutboundLayer, store::MemoryStore, Limiter, Quota};
    /// use tower::{Layer, service_fn};
    ///
    /// let layer = OutboundLayer::new(Limiter::new(MemoryStore::new()), Quota::per_second(5)?, "api");
    /// let client = service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
    /// let mut limited = layer.layer(client);
    /// let _client = limited.get_ref();
    /// let _client = limited.get_mut(); // calls made through it skip the limiter
    /// let _client = limited.into_inner();
    /// # Ok::<(), redlimit::quota::QuotaError>(())
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably. Calls made through it skip the limiter.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes `self`, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K> Clone for Outbound<S, K> {
    fn clone(&self) -> Self {
        // The admission (or the wait for one) stays with the instance that asked for it.
        Outbound::from_config(self.inner.clone(), self.config.clone())
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for Outbound<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let permit = match &self.permit {
            Permit::Idle => "idle",
            Permit::Acquiring(_) => "acquiring",
            Permit::Admitted => "admitted",
            Permit::Refused(_) => "refused",
        };
        f.debug_struct("Outbound")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .field("permit", &permit)
            .finish()
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for Outbound<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor,
{
    type Response = Response<ResBody>;
    type Error = OutboundError<S::Error>;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let KeySource::Fixed(key) = &self.config.key {
            // Admission first, then the inner service: a ready inner service (a connection, a
            // concurrency slot) is not held while waiting for the quota.
            loop {
                match &mut self.permit {
                    Permit::Idle => {
                        let acquire = self.config.limits.acquire(key.clone());
                        self.permit = Permit::Acquiring(acquire);
                    }
                    Permit::Acquiring(acquire) => {
                        self.permit = match ready!(acquire.as_mut().poll(cx)) {
                            Ok(_) => Permit::Admitted,
                            Err(error) => Permit::Refused(error),
                        };
                    }
                    // A refusal is the next request's error, not the service's: an error from
                    // `poll_ready` would make callers (and `Buffer`) discard the service.
                    Permit::Refused(_) => return Poll::Ready(Ok(())),
                    Permit::Admitted => break,
                }
            }
        } else {
            // Per-request keys: each response future waits for its quota, then for a clone of
            // the inner service to be ready. Taking the readiness here would hold a connection
            // or a concurrency slot of the inner service for the whole wait of a key without
            // quota, and keys with quota would wait behind it.
            return Poll::Ready(Ok(()));
        }
        self.inner.poll_ready(cx).map_err(OutboundError::Inner)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let limits = &self.config.limits;
        match &self.config.key {
            KeySource::Fixed(key) => {
                match std::mem::replace(&mut self.permit, Permit::Idle) {
                    Permit::Admitted => {
                        let backoff = limits
                            .reads_responses()
                            .then(|| (limits.clone(), key.clone()));
                        ResponseFuture::calling(self.inner.call(request), backoff)
                    }
                    Permit::Refused(error) => ResponseFuture::failed(OutboundError::Acquire(error)),
                    Permit::Idle | Permit::Acquiring(_) => {
                        panic!("Outbound::call without a successful poll_ready (tower's Service contract)")
                    }
                }
            }
            KeySource::PerRequest(extractor) => {
                let (parts, body) = request.into_parts();
                let Some(key) = extractor.extract(&parts) else {
                    tracing::debug!("outbound request without a rate limit key: not sent (OutboundError::MissingKey)");
                    return ResponseFuture::failed(OutboundError::MissingKey);
                };
                let key: Arc<str> = key.into();
                let acquire = limits.acquire(key.clone());
                let backoff = limits.reads_responses().then(|| (limits.clone(), key));
                // `poll_ready` left the inner service alone: the future polls a clone of it
                // ready after the quota wait, and calls that clone. https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services
                let inner = self.inner.clone();
                let request = Request::from_parts(parts, body);
                ResponseFuture::acquiring(acquire, request, inner, backoff)
            }
        }
    }
}
