//! The client side: [`HomaChannel`], what a tonic-generated client takes in
//! place of `tonic::transport::Channel`. One call, one Homa RPC.

use crate::body::{collect, HomaBody};
use crate::wire;
use bytes::Bytes;
use homa::AsyncEndpoint;
use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::Status;

/// How much longer than a call's `grpc-timeout` the client waits for the
/// server's own DeadlineExceeded before it gives up by itself.
const CLIENT_DEADLINE_GRACE: Duration = Duration::from_millis(20);

/// A gRPC channel to one server over Homa: `tower::Service<http::Request<B>>`
/// (so tonic's `GrpcService`), cheap to clone (clones share the endpoint).
///
/// ```no_run
/// # async fn f(ep: homa::AsyncEndpoint, addr: std::net::SocketAddr) {
/// let channel = homa_tonic::HomaChannel::new(ep, addr);
/// // let mut client = GreeterClient::new(channel);
/// # }
/// ```
#[derive(Clone)]
pub struct HomaChannel {
    ep: AsyncEndpoint,
    peer: SocketAddr,
    /// Method paths carried on a `homa::Stream` each.
    streaming: Option<Arc<HashSet<String>>>,
}

impl std::fmt::Debug for HomaChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HomaChannel")
            .field("local", &self.ep.local_addr())
            .field("peer", &self.peer)
            .finish()
    }
}

impl HomaChannel {
    /// A channel that sends its calls from `ep` to the server at `peer`.
    pub fn new(ep: AsyncEndpoint, peer: SocketAddr) -> HomaChannel {
        HomaChannel {
            ep,
            peer,
            streaming: None,
        }
    }

    /// Carries calls of these methods (paths such as
    /// `/routeguide.RouteGuide/RouteChat`) on a `homa::Stream` each, message
    /// by message, instead of one Homa RPC: for streaming methods whose
    /// messages must flow while the call goes on (a bidi exchange, a
    /// server stream that does not end soon). Other calls, streaming or
    /// not, go whole in one RPC (docs/grpc.md §4).
    pub fn with_streaming<I, P>(mut self, paths: I) -> HomaChannel
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let mut set = self.streaming.as_deref().cloned().unwrap_or_default();
        set.extend(paths.into_iter().map(Into::into));
        self.streaming = Some(Arc::new(set));
        self
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }
}

/// The future of one call through a [`HomaChannel`].
pub type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<HomaBody>, Status>> + Send>>;

impl<B> tower_service::Service<http::Request<B>> for HomaChannel
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<HomaBody>;
    type Error = Status;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> ResponseFuture {
        let ep = self.ep.clone();
        let peer = self.peer;
        if let Some(s) = &self.streaming {
            if s.contains(req.uri().path()) {
                let (parts, body) = req.into_parts();
                return Box::pin(
                    async move { crate::streaming::call(&ep, peer, parts, body).await },
                );
            }
        }
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            // The whole request body: one message for a unary call; for a
            // client-streaming call, every message up to the stream's end.
            let body = collect(body)
                .await
                .map_err(|e| Status::from_error(e.into()))?;
            let path = parts.uri.path();
            let msg = wire::encode_request(path, &parts.headers, &body.data);
            let pending = ep.send_request(peer, msg).map_err(homa_status)?;
            // Dropped before the response (the caller gave up on the
            // call): the server is told, and drops the handler.
            let mut notice = CancelNotice {
                ep: ep.clone(),
                peer,
                id: Some(pending.id()),
            };
            let fut = pending.into_future();
            let reply = match wire::grpc_timeout(&parts.headers) {
                Some(d) => tokio::time::timeout(d + CLIENT_DEADLINE_GRACE, fut)
                    .await
                    .unwrap_or(Err(homa::Error::Timeout)),
                None => fut.await,
            };
            // Answered, failed or timed out: the server knows or will.
            notice.id = None;
            let reply = reply.map_err(homa_status)?;
            let r = wire::decode_response(reply.into_bytes())
                .map_err(|e| Status::internal(e.to_string()))?;
            let mut resp = http::Response::new(HomaBody::new(r.body, r.trailers));
            *resp.status_mut() = r.status;
            *resp.headers_mut() = r.headers;
            Ok(resp)
        })
    }
}

/// Sends the server a cancel notice for RPC `id` when dropped with one
/// (fire and forget: the notice's own response is not waited for).
struct CancelNotice {
    ep: AsyncEndpoint,
    peer: SocketAddr,
    id: Option<homa::RpcId>,
}

impl Drop for CancelNotice {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.ep.send_request(self.peer, wire::encode_cancel(id.0));
        }
    }
}

/// The gRPC status for a failed Homa RPC.
fn homa_status(e: homa::Error) -> Status {
    match e {
        homa::Error::Timeout => Status::deadline_exceeded("Homa RPC timed out"),
        e @ homa::Error::MessageTooLong { .. } => Status::resource_exhausted(format!("Homa: {e}")),
        e @ homa::Error::InvalidPeer(_) => Status::invalid_argument(format!("Homa: {e}")),
        e => Status::unavailable(format!("Homa: {e}")),
    }
}
