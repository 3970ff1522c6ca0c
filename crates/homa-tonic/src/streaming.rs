//! Streaming calls on a `homa::Stream` each (docs/grpc.md §4): the client
//! side for the methods a [`crate::HomaChannel`] was told stream, and the
//! server side for every stream a peer opens. Message by message: the
//! request head, then data and the end on one side; the response head,
//! data, trailers and the end on the other.

use crate::body::{FrameReceiver, FrameSender, HomaBody};
use crate::server::{status_reply, BoxError, CatchUnwind};
use crate::wire;
use bytes::Bytes;
use homa::{AsyncEndpoint, Stream};
use http_body::Frame;
use std::net::SocketAddr;
use std::pin::pin;
use tonic::body::Body;
use tonic::Status;
use tower_service::Service;

fn stream_status(e: homa::Error) -> Status {
    match e {
        homa::Error::Timeout => Status::deadline_exceeded("Homa stream timed out"),
        e => Status::unavailable(format!("Homa stream: {e}")),
    }
}

/// One incoming stream message, sorted.
enum Incoming {
    Data(Bytes),
    Trailers(http::HeaderMap),
}

fn sort(m: Bytes) -> Result<Incoming, Status> {
    match m.first() {
        Some(&wire::STREAM_DATA) => Ok(Incoming::Data(m.slice(1..))),
        Some(&wire::STREAM_TRAILERS) => wire::decode_stream_trailers(&m)
            .map(Incoming::Trailers)
            .map_err(|e| Status::internal(e.to_string())),
        _ => Err(Status::internal("unexpected message on a gRPC stream")),
    }
}

/// Starts a streaming call: opens the stream, sends the request head,
/// leaves a task to send the request body and receive the response, and
/// returns once the response head is in.
pub(crate) async fn call<B>(
    ep: &AsyncEndpoint,
    peer: SocketAddr,
    parts: http::request::Parts,
    body: B,
) -> Result<http::Response<HomaBody>, Status>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut stream = ep.open_stream(peer).map_err(stream_status)?;
    let head = wire::encode_request(parts.uri.path(), &parts.headers, &[]);
    stream.send_async(head).await.map_err(stream_status)?;
    let (head_tx, head_rx) = tokio::sync::oneshot::channel();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(client_task(stream, body, head_tx, tx));
    let head = head_rx
        .await
        .map_err(|_| Status::unavailable("the stream ended before the response"))??;
    let mut resp = http::Response::new(HomaBody::streamed(rx));
    *resp.status_mut() = head.status;
    *resp.headers_mut() = head.headers;
    Ok(resp)
}

type HeadSender = tokio::sync::oneshot::Sender<Result<wire::DecodedResponse, Status>>;

async fn client_task<B>(mut stream: Stream, body: B, head_tx: HeadSender, tx: FrameSender)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = pin!(body);
    let mut body_done = false;
    let mut head_tx = Some(head_tx);
    let fail = |head_tx: &mut Option<HeadSender>, status: Status| match head_tx.take() {
        Some(h) => {
            let _ = h.send(Err(status));
        }
        None => {
            let _ = tx.send(Err(status));
        }
    };
    loop {
        tokio::select! {
            frame = std::future::poll_fn(|cx| {
                body.as_mut()
                    .poll_frame(cx)
                    .map(|f| f.map(|r| r.map_err(|e| Status::from_error(e.into()))))
            }), if !body_done => {
                match frame {
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            if !d.is_empty() {
                                if let Err(e) = stream.send_async(wire::encode_stream_data(&d)).await {
                                    return fail(&mut head_tx, stream_status(e));
                                }
                            }
                        }
                    }
                    Some(Err(status)) => return fail(&mut head_tx, status),
                    None => {
                        body_done = true;
                        if let Err(e) = stream.finish() {
                            return fail(&mut head_tx, stream_status(e));
                        }
                    }
                }
            }
            msg = stream.recv_async() => {
                let m = match msg {
                    Ok(Some(m)) => m,
                    Ok(None) => {
                        if head_tx.is_some() {
                            fail(&mut head_tx, Status::unavailable("the stream ended before the response"));
                        }
                        return;
                    }
                    Err(e) => return fail(&mut head_tx, stream_status(e)),
                };
                if let Some(h) = head_tx.take() {
                    let head = wire::decode_response(m).map_err(|e| Status::internal(e.to_string()));
                    let _ = h.send(head);
                    continue;
                }
                let frame = match sort(m) {
                    Ok(Incoming::Data(d)) => Frame::data(d),
                    Ok(Incoming::Trailers(t)) => Frame::trailers(t),
                    Err(s) => return fail(&mut head_tx, s),
                };
                if tx.send(Ok(frame)).is_err() {
                    return; // the caller dropped the response: the stream is cancelled
                }
            }
        }
    }
}

/// Serves the streams peers open on `ep`, one task each, until the
/// endpoint shuts down.
pub(crate) async fn accept_loop<S, B>(ep: AsyncEndpoint, service: S)
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    while let Ok(stream) = ep.accept_stream().await {
        tokio::spawn(serve_stream(service.clone(), stream));
    }
}

/// Takes the next request message off the stream into the request body.
/// Returns false once the request side is over (its end, or a failure).
fn feed(msg: homa::Result<Option<Bytes>>, req_tx: &mut Option<FrameSender>) -> bool {
    match msg {
        Ok(Some(m)) => {
            let item = sort(m).map(|i| match i {
                Incoming::Data(d) => Frame::data(d),
                Incoming::Trailers(t) => Frame::trailers(t),
            });
            if let Some(tx) = req_tx {
                let _ = tx.send(item);
            }
            true
        }
        Ok(None) => {
            *req_tx = None;
            false
        }
        Err(e) => {
            if let Some(tx) = req_tx.take() {
                let _ = tx.send(Err(stream_status(e)));
            }
            false
        }
    }
}

async fn serve_stream<S, B>(mut service: S, mut stream: Stream)
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let head = match stream.recv_async().await {
        Ok(Some(m)) => m,
        _ => return,
    };
    let req = match wire::decode_request(head) {
        Ok(r) => r,
        Err(e) => {
            let _ = stream
                .send_async(status_reply(Status::internal(e.to_string())))
                .await;
            return finish(stream).await;
        }
    };
    let deadline = wire::grpc_timeout(&req.headers);
    let (tx, rx): (FrameSender, FrameReceiver) = tokio::sync::mpsc::unbounded_channel();
    let mut req_tx = Some(tx);
    let mut req_open = true;
    let uri = match http::Uri::try_from(req.path) {
        Ok(u) => u,
        Err(e) => {
            let _ = stream
                .send_async(status_reply(Status::internal(format!(
                    "malformed method path: {e}"
                ))))
                .await;
            return finish(stream).await;
        }
    };
    let mut http_req = http::Request::new(Body::new(HomaBody::streamed(rx)));
    *http_req.uri_mut() = uri;
    *http_req.method_mut() = http::Method::POST;
    *http_req.version_mut() = http::Version::HTTP_2;
    *http_req.headers_mut() = req.headers;
    // The call, up to its response head, while the request body is fed.
    let call = CatchUnwind(Box::pin(async {
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .map_err(|e| Status::unavailable(format!("service not ready: {}", e.into())))?;
        service
            .call(http_req)
            .await
            .map_err(|e| Status::from_error(e.into()))
    }));
    let sleep = deadline.map(tokio::time::sleep);
    let mut call = pin!(call);
    let mut sleep = pin!(sleep);
    let resp = loop {
        tokio::select! {
            r = &mut call => break match r {
                Ok(r) => r,
                Err(_) => Err(Status::internal("the handler panicked")),
            },
            () = async { sleep.as_mut().as_pin_mut().expect("guarded").await }, if sleep.is_some() => {
                break Err(Status::deadline_exceeded("the handler overran its deadline"));
            }
            msg = stream.recv_async(), if req_open => req_open = feed(msg, &mut req_tx),
        }
    };
    let resp = match resp {
        Ok(r) => r,
        Err(status) => {
            let _ = stream.send_async(status_reply(status)).await;
            return finish(stream).await;
        }
    };
    let (parts, body) = resp.into_parts();
    let head = wire::encode_response(parts.status, &parts.headers, None, &[]);
    if stream.send_async(head).await.is_err() {
        return;
    }
    // The response body, frame by frame, while the request body is fed.
    let mut body = CatchUnwindBody(Box::pin(body));
    loop {
        tokio::select! {
            frame = std::future::poll_fn(|cx| body.poll(cx)) => {
                let msg = match frame {
                    Ok(Some(f)) => match f.into_data() {
                        Ok(d) if d.is_empty() => continue,
                        Ok(d) => wire::encode_stream_data(&d),
                        Err(f) => match f.into_trailers() {
                            Ok(t) => wire::encode_stream_trailers(&t),
                            Err(_) => continue,
                        },
                    },
                    Ok(None) => break,
                    Err(status) => {
                        wire::encode_stream_trailers(status.into_http::<()>().headers())
                    }
                };
                if stream.send_async(msg).await.is_err() {
                    return;
                }
            }
            msg = stream.recv_async(), if req_open => req_open = feed(msg, &mut req_tx),
        }
    }
    finish(stream).await;
}

/// Ends this side and reads the peer's side to its end, so that the
/// stream closes without being cancelled.
async fn finish(mut stream: Stream) {
    if stream.finish().is_err() {
        return;
    }
    while let Ok(Some(_)) = stream.recv_async().await {}
}

/// A response body whose errors and panics become a status.
struct CatchUnwindBody<B>(std::pin::Pin<Box<B>>);

impl<B> CatchUnwindBody<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    fn poll(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Option<Frame<Bytes>>, Status>> {
        use std::task::Poll;
        let body = self.0.as_mut();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body.poll_frame(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(None)) => Poll::Ready(Ok(None)),
            Ok(Poll::Ready(Some(Ok(f)))) => Poll::Ready(Ok(Some(f))),
            Ok(Poll::Ready(Some(Err(e)))) => Poll::Ready(Err(Status::from_error(e.into()))),
            Err(_) => Poll::Ready(Err(Status::internal("the handler's stream panicked"))),
        }
    }
}
