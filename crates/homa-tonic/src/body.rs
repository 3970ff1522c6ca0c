//! The HTTP body of a call carried by Homa: the whole gRPC-framed payload
//! as one data frame, then the trailers, if any. Also the helper that
//! reads a body to its end.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A complete body: its data (a slice of a received Homa message, or the
/// bytes to send) and its trailers. What a [`crate::HomaChannel`] returns
/// to tonic, and what a served request's handler reads.
/// A streaming call's body instead arrives frame by frame from the task
/// that reads its `homa::Stream`.
#[derive(Debug, Default)]
pub struct HomaBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
    frames: Option<FrameReceiver>,
}

/// Where a streamed body's frames come from.
pub(crate) type FrameReceiver =
    tokio::sync::mpsc::UnboundedReceiver<Result<Frame<Bytes>, tonic::Status>>;
/// Where a streamed body's frames go.
pub(crate) type FrameSender =
    tokio::sync::mpsc::UnboundedSender<Result<Frame<Bytes>, tonic::Status>>;

impl HomaBody {
    /// A body of `data` followed by `trailers`.
    pub fn new(data: Bytes, trailers: Option<HeaderMap>) -> HomaBody {
        HomaBody {
            data: (!data.is_empty()).then_some(data),
            trailers,
            frames: None,
        }
    }

    /// A body whose frames arrive on `frames` (ends when its sender drops).
    pub(crate) fn streamed(frames: FrameReceiver) -> HomaBody {
        HomaBody {
            data: None,
            trailers: None,
            frames: Some(frames),
        }
    }
}

impl Body for HomaBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if let Some(rx) = &mut this.frames {
            return rx.poll_recv(cx);
        }
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none() && self.frames.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.frames {
            Some(_) => SizeHint::default(),
            None => SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}

/// A body read to its end: the data frames joined (the one frame of a
/// unary message is kept as it is, not copied) and the trailers.
pub(crate) struct Collected {
    pub data: Bytes,
    pub trailers: Option<HeaderMap>,
}

/// Reads `body` to its end.
pub(crate) async fn collect<B>(body: B) -> Result<Collected, B::Error>
where
    B: Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut first: Option<Bytes> = None;
    let mut more: Option<BytesMut> = None;
    let mut trailers: Option<HeaderMap> = None;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame?;
        match frame.into_data() {
            Ok(d) => match (&mut first, &mut more) {
                (None, _) => first = Some(d),
                (Some(f), None) => {
                    let mut m = BytesMut::with_capacity(f.len() + d.len());
                    m.extend_from_slice(f);
                    m.extend_from_slice(&d);
                    more = Some(m);
                }
                (Some(_), Some(m)) => m.extend_from_slice(&d),
            },
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    match &mut trailers {
                        Some(all) => all.extend(t),
                        None => trailers = Some(t),
                    }
                }
            }
        }
    }
    let data = match (first, more) {
        (_, Some(m)) => m.freeze(),
        (Some(f), None) => f,
        (None, None) => Bytes::new(),
    };
    Ok(Collected { data, trailers })
}
