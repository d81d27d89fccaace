//! [`OutboundError`]: the inner service's error, or why the layer gave up waiting.

use std::error::Error;
use std::fmt;

use crate::core::AcquireError;

/// The error of an [`Outbound`](super::Outbound) service: the inner service's own error, or
/// the layer's reason for not sending the request. A request that fails with
/// [`Acquire`](Self::Acquire) or [`MissingKey`](Self::MissingKey) never reached the inner
/// service.
///
/// It implements [`std::error::Error`] when the inner error does, so it converts into tower's
/// `BoxError` (e.g. behind `tower::buffer::Buffer`).
///
/// ```
/// use std::convert::Infallible;
/// use std::time::Duration;
/// use http::{Request, Response};
/// use redlimit::outbound::{OutboundError, OutboundLayer};
/// use redlimit::{limiter::AcquireError, store::MemoryStore, Limiter, Quota};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = OutboundLayer::builder(Limiter::new(MemoryStore::new()), Quota::per_minute(1)?, "api")
///     .max_wait(Duration::from_millis(100))
///     .build()?;
/// let client = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|_: Request<String>| async { Ok::<_, Infallible>(Response::new(String::new())) });
/// client.clone().oneshot(Request::new(String::new())).await?;
/// // The next slot is a minute away, the request may wait 100 ms.
/// let error = client.oneshot(Request::new(String::new())).await.unwrap_err();
/// assert!(matches!(error, OutboundError::Acquire(AcquireError::DeadlineExceeded { .. })));
/// assert!(error.to_string().contains("past the deadline"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum OutboundError<E> {
    /// The inner service failed.
    Inner(E),
    /// The limiter did not admit the request in time (or never can): it was not sent.
    Acquire(AcquireError),
    /// The layer's key extractor found no key in the request: it was not sent. A request-
    /// dependent key is the caller's own making, so a missing one is a bug to fix, never a
    /// silent bypass.
    MissingKey,
}

impl<E> OutboundError<E> {
    /// The inner service's error, if that is what this is.
    ///
    /// ```
    /// use redlimit::outbound::OutboundError;
    ///
    /// assert_eq!(OutboundError::Inner("refused").into_inner(), Some("refused"));
    /// assert_eq!(OutboundError::<&str>::MissingKey.into_inner(), None);
    /// ```
    pub fn into_inner(self) -> Option<E> {
        match self {
            OutboundError::Inner(error) => Some(error),
            _ => None,
        }
    }
}

impl<E: fmt::Display> fmt::Display for OutboundError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutboundError::Inner(error) => error.fmt(f),
            OutboundError::Acquire(error) => error.fmt(f),
            OutboundError::MissingKey => f.write_str(
                "the outbound layer's key extractor found no key in the request; it was not sent",
            ),
        }
    }
}

impl<E: Error + 'static> Error for OutboundError<E> {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            OutboundError::Inner(error) => error.source(),
            OutboundError::Acquire(error) => error.source(),
            OutboundError::MissingKey => None,
        }
    }
}
