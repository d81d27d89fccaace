//! [`ConcurrencyLimitLayer`]: at most N requests in flight per key across the fleet, each
//! holding a slot from admission until its response body ends (or its future or body is
//! dropped). See [`ConcurrencyLimiter`] for the slots, their leases and failures.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::ResponseBody;
use super::response::{self, Wire};
use crate::key::KeyExtractor;
use crate::limiter::{is_name, ConcurrencyLimiter, ConfigError, Slot, SlotOutcome};

/// The shared key of requests without one (as [`MissingKey::Shared`](super::MissingKey)'s
/// default).
const UNKEYED: &str = "#:unkeyed";

/// A [`Layer`] that allows at most [`ConcurrencyLimiter::limit`] requests in flight per key,
/// fleet-wide. A request that finds every slot taken is answered `429 Too Many Requests` with
/// `Retry-After` (1 s: a slot usually frees sooner than any lease ends) and the IETF headers
/// with the quota unit of the draft, `RateLimit-Policy: "<name>";q=<N>;qu="concurrent-requests"`
/// and `RateLimit: "<name>";r=0;t=1`; an admitted one gets `RateLimit: "<name>";r=<left>` on
/// its response. A gRPC request gets a trailers-only `RESOURCE_EXHAUSTED` instead of the 429,
/// as [`RateLimitLayer`](crate::RateLimitLayer) answers it. Requests without a key share one.
///
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use redlimit::layer::ConcurrencyLimitLayer;
/// use redlimit::limiter::ConcurrencyLimiter;
/// use redlimit::{key::GlobalKey, store::MemoryStore, Limiter};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let slots = ConcurrencyLimiter::new(Limiter::new(MemoryStore::new()), 5)?;
/// let layer = ConcurrencyLimitLayer::new(slots, GlobalKey::new("exports"), "exports")?;
/// let mut svc = ServiceBuilder::new().layer(layer).service_fn(|_: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("done")))
/// });
/// let response = svc.ready().await?.call(Request::new(String::new())).await?;
/// assert_eq!(response.status(), StatusCode::OK);
/// assert_eq!(response.headers()["ratelimit"], "\"exports\";r=4");
/// assert_eq!(
///     response.headers()["ratelimit-policy"],
///     "\"exports\";q=5;qu=\"concurrent-requests\""
/// );
/// # Ok(())
/// # }
/// ```
pub struct ConcurrencyLimitLayer<K> {
    shared: Arc<Shared<K>>,
}

struct Shared<K> {
    slots: ConcurrencyLimiter,
    extractor: K,
    name: String,
    policy: HeaderValue,
}

impl<K> Clone for ConcurrencyLimitLayer<K> {
    fn clone(&self) -> Self {
        ConcurrencyLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K: fmt::Debug> fmt::Debug for ConcurrencyLimitLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("slots", &self.shared.slots)
            .field("extractor", &self.shared.extractor)
            .field("name", &self.shared.name)
            .finish()
    }
}

impl<K: KeyExtractor> ConcurrencyLimitLayer<K> {
    /// Limits requests in flight per key of `extractor` with `slots`; `name` (1 to 64 of
    /// `[A-Za-z0-9._-]`) names the policy in the headers.
    pub fn new(
        slots: ConcurrencyLimiter,
        extractor: K,
        name: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        if !is_name(&name) {
            return Err(ConfigError::InvalidPolicyName);
        }
        let policy = format!("\"{name}\";q={};qu=\"concurrent-requests\"", slots.limit());
        let policy = HeaderValue::from_str(&policy).map_err(|_| ConfigError::InvalidPolicyName)?;
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                slots,
                extractor,
                name,
                policy,
            }),
        })
    }
}

impl<S, K> Layer<S> for ConcurrencyLimitLayer<K> {
    type Service = ConcurrencyLimit<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service of [`ConcurrencyLimitLayer`].
pub struct ConcurrencyLimit<S, K> {
    inner: S,
    shared: Arc<Shared<K>>,
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
        // The service made ready in `poll_ready` is the one that must be called: keep it, leave a
        // clone behind. https://docs.rs/tower/latest/tower/trait.Service.html#be-careful-when-cloning-inner-services
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
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

pin_project! {
    /// The response future of [`ConcurrencyLimit`]: takes a slot, then calls the inner service
    /// or answers 429 (503 when the store failed closed). Dropped while it takes the slot, it
    /// gives back the slot its call may take ([`ConcurrencyLimiter::acquire`]).
    pub struct ConcurrencyFuture<S, ReqBody, K>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        state: State<S, ReqBody>,
        // Only until the slot is taken: a held slot must not keep its limiter alive (a slot
        // whose limiter is gone is not given back, as after a crash).
        shared: Option<Arc<Shared<K>>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody>
    where
        S: Service<Request<ReqBody>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, SlotOutcome>,
            request: Option<Request<ReqBody>>,
            inner: Option<S>,
        },
        // The slot is held while the service answers (dropped with this future), then by the body.
        Calling {
            #[pin]
            future: S::Future,
            slot: Option<Slot>,
            // RateLimit-Policy and RateLimit for the response.
            headers: Option<(HeaderValue, HeaderValue)>,
        },
    }
}

impl<S, ReqBody, ResBody, K> Future for ConcurrencyFuture<S, ReqBody, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ConcurrencyBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    request,
                    inner,
                } => {
                    let outcome = ready!(acquire.as_mut().poll(cx));
                    let (request, mut inner) = match (request.take(), inner.take()) {
                        (Some(request), Some(inner)) => (request, inner),
                        _ => panic!("ConcurrencyFuture polled after completion"),
                    };
                    let shared = this
                        .shared
                        .take()
                        .expect("ConcurrencyFuture polled after completion");
                    match outcome {
                        SlotOutcome::Acquired(slot) => {
                            let remaining = format!("\"{}\";r={}", shared.name, slot.remaining());
                            let headers = HeaderValue::from_str(&remaining)
                                .ok()
                                .map(|r| (shared.policy.clone(), r));
                            State::Calling {
                                future: inner.call(request),
                                slot: Some(slot),
                                headers,
                            }
                        }
                        SlotOutcome::FailedOpen => State::Calling {
                            future: inner.call(request),
                            slot: None,
                            headers: None,
                        },
                        SlotOutcome::Full { .. } => {
                            let wire = Wire::of(request.headers());
                            return Poll::Ready(Ok(full(&shared, wire)));
                        }
                        SlotOutcome::FailedClosed { retry_after } => {
                            let wire = Wire::of(request.headers());
                            return Poll::Ready(Ok(unavailable(retry_after, wire)));
                        }
                    }
                }
                StateProj::Calling {
                    future,
                    slot,
                    headers,
                } => {
                    let response = ready!(future.poll(cx))?;
                    let slot = slot.take();
                    let mut response = response.map(|body| ConcurrencyBody {
                        inner: ResponseBody::inner(body),
                        slot,
                    });
                    if let Some((policy, remaining)) = headers.take() {
                        let headers = response.headers_mut();
                        headers.insert("ratelimit-policy", policy);
                        headers.insert("ratelimit", remaining);
                    }
                    return Poll::Ready(Ok(response));
                }
            };
            this.state.set(next);
        }
    }
}

/// 429 (gRPC: RESOURCE_EXHAUSTED): every slot taken.
fn full<B, K>(shared: &Shared<K>, wire: Wire) -> Response<ConcurrencyBody<B>> {
    let mut response =
        response::too_many_concurrent(wire).map(|inner| ConcurrencyBody { inner, slot: None });
    let headers = response.headers_mut();
    headers.insert("ratelimit-policy", shared.policy.clone());
    if let Ok(value) = HeaderValue::from_str(&format!("\"{}\";r=0;t=1", shared.name)) {
        headers.insert("ratelimit", value);
    }
    response
}

/// 503 (gRPC: UNAVAILABLE): the store failed and the policy refused.
fn unavailable<B>(retry_after: Duration, wire: Wire) -> Response<ConcurrencyBody<B>> {
    response::unavailable(retry_after, wire).map(|inner| ConcurrencyBody { inner, slot: None })
}

pin_project! {
    /// The body of a response from [`ConcurrencyLimit`]: it holds the request's slot until it
    /// ends (or is dropped).
    pub struct ConcurrencyBody<B> {
        #[pin]
        inner: ResponseBody<B>,
        slot: Option<Slot>,
    }
}

impl<B: fmt::Debug> fmt::Debug for ConcurrencyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("inner", &self.inner)
            .field("slot", &self.slot)
            .finish()
    }
}

impl<B> Body for ConcurrencyBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            // The body ended: the slot goes back now, not when the connection drops the body.
            this.slot.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
