//! [`ConcurrencyBody`]: the response body that holds the request's slot until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::Slot;
use crate::layer::ResponseBody;

pin_project! {
    /// The body of a response from [`ConcurrencyLimit`]: it holds the request's slot until it
    /// ends (or is dropped).
    pub struct ConcurrencyBody<B> {
        #[pin]
        inner: ResponseBody<B>,
        slot: Option<Slot>,
    }
}

impl<B> ConcurrencyBody<B> {
    pub(super) fn new(inner: ResponseBody<B>, slot: Option<Slot>) -> Self {
        ConcurrencyBody { inner, slot }
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
