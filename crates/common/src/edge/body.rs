//! Body wrappers of the edge: a request body with a deadline, and a response body that holds
//! its connection's in-flight mark until it is sent or dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};

/// A request body that fails once `within` has passed before its end arrived.
pub(crate) struct DeadlineBody {
    inner: Body,
    within: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl DeadlineBody {
    pub(crate) fn new(inner: Body, within: Duration) -> Self {
        DeadlineBody {
            inner,
            within,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(f) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(f.map(|r| r.map_err(Into::into)));
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {:?}",
                this.within
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body carrying `mark`; the mark goes when hyper drops the body, sent or not.
pub(crate) struct MarkedBody<M> {
    inner: Body,
    _mark: M,
}

impl<M> MarkedBody<M> {
    pub(crate) fn new(inner: Body, mark: M) -> Self {
        MarkedBody { inner, _mark: mark }
    }
}

impl<M: Unpin> http_body::Body for MarkedBody<M> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
