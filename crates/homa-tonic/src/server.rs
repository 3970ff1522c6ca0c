//! The server side: [`serve`] feeds each incoming Homa request to a tonic
//! service (a [`Router`], tonic's own `Routes`, or one generated server)
//! and replies with its response, trailers and all. Bad input, panics and
//! overrun deadlines become gRPC statuses; the loop keeps serving.

use crate::body::{collect, HomaBody};
use crate::wire;
use bytes::Bytes;
use homa::{AsyncEndpoint, Message, Responder};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;
use tower_service::Service;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The map of [`Running`].
type Calls = HashMap<(SocketAddr, u64), tokio::task::AbortHandle>;

/// Unary calls that went on in a task of their own, by (client, RPC id),
/// for the clients' cancel notices. A call is registered before the serve
/// loop reads the next request, so a notice never comes before its call.
#[derive(Clone, Default)]
struct Running(Arc<std::sync::Mutex<Calls>>);

impl Running {
    fn lock(&self) -> std::sync::MutexGuard<'_, Calls> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `call` in a task, registered under `key` until it ends.
    fn spawn(&self, key: (SocketAddr, u64), call: impl Future<Output = ()> + Send + 'static) {
        let done = self.clone();
        // Held while the task is spawned and registered: its own removal,
        // when it ends, waits for the registration.
        let mut m = self.lock();
        let task = tokio::spawn(async move {
            call.await;
            done.lock().remove(&key);
        });
        m.insert(key, task.abort_handle());
    }

    /// The client `peer` abandoned its call `id`: dropping the handler's
    /// future drops the call's responder unanswered (the engine frees the
    /// RPC). A call that already ended, or ran inline, is not here.
    fn cancel(&self, peer: SocketAddr, id: u64) {
        if let Some(task) = self.lock().remove(&(peer, id)) {
            task.abort();
        }
    }
}

/// The RPC id of a cancel notice (`wire::encode_cancel`); None for a call.
fn cancel_notice(msg: &Message) -> Option<u64> {
    if msg.len() != wire::CANCEL_LEN {
        return None;
    }
    let mut notice = [0u8; wire::CANCEL_LEN];
    msg.copy_to(0, &mut notice);
    wire::decode_cancel(&notice)
}

/// Serves `service` on `ep` until the endpoint shuts down (then returns).
///
/// Each request is decoded and handed to the service at once, in this
/// task; a handler that finishes without waiting (most unary handlers) is
/// answered right there, with no task spawned. One that has to wait goes
/// on in a task of its own (`tokio::spawn`), so slow calls do not hold up
/// the others.
///
/// Run it on a runtime with tokio's time driver (`enable_all`, as
/// `#[tokio::main]` gives): calls with a `grpc-timeout` use it.
pub async fn serve<S, B>(ep: AsyncEndpoint, service: S)
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError> + Send,
{
    // Streaming calls come on streams, served by tasks of their own.
    let streams = tokio::spawn(crate::streaming::accept_loop(ep.clone(), service.clone()));
    let mut requests = ep.requests();
    let running = Running::default();
    while let Some(req) = requests.next().await {
        let (msg, responder) = req.into_parts();
        if let Some(id) = cancel_notice(&msg) {
            running.cancel(responder.peer(), id);
            let _ = responder.reply(Vec::new());
            continue;
        }
        let key = (responder.peer(), responder.id().0);
        let mut call = Box::pin(handle(service.clone(), msg, responder));
        if std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx)))
            .await
            .is_pending()
        {
            running.spawn(key, call);
        }
    }
    streams.abort();
}

/// Handles one request to the end: the reply is sent (or, when the client
/// is gone, dropped) before this returns.
async fn handle<S, B>(service: S, msg: Message, responder: Responder)
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let reply = match wire::decode_request(msg.into_bytes()) {
        Err(e) => status_reply(Status::internal(e.to_string())),
        Ok(req) => {
            let deadline = wire::grpc_timeout(&req.headers);
            let call = CatchUnwind(Box::pin(call(service, req)));
            let outcome = match deadline {
                None => call.await,
                Some(d) => match tokio::time::timeout(d, call).await {
                    Ok(r) => r,
                    Err(_) => Ok(Err(Status::deadline_exceeded(format!(
                        "the handler overran its deadline ({d:?})"
                    )))),
                },
            };
            match outcome {
                Ok(Ok(reply)) => reply,
                Ok(Err(status)) => status_reply(status),
                Err(panic) => status_reply(Status::internal(format!(
                    "the handler panicked: {}",
                    panic_text(&*panic)
                ))),
            }
        }
    };
    // An error here means the client abandoned the call: nobody to tell.
    let _ = responder.reply(reply);
}

/// Calls the service and reads its whole response (every message of a
/// server-streaming call, then its trailers) into one encoded reply.
async fn call<S, B>(mut service: S, req: wire::DecodedRequest) -> Result<Vec<u8>, Status>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let uri = http::Uri::try_from(req.path)
        .map_err(|e| Status::internal(format!("malformed method path: {e}")))?;
    let mut http_req = http::Request::new(Body::new(HomaBody::new(req.body, None)));
    *http_req.uri_mut() = uri;
    *http_req.method_mut() = http::Method::POST;
    *http_req.version_mut() = http::Version::HTTP_2;
    *http_req.headers_mut() = req.headers;
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(|e| Status::unavailable(format!("service not ready: {}", e.into())))?;
    let resp = service
        .call(http_req)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let (parts, body) = resp.into_parts();
    let body = collect(body)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    Ok(wire::encode_response(
        parts.status,
        &parts.headers,
        body.trailers.as_ref(),
        &body.data,
    ))
}

/// A trailers-only response carrying `status`.
pub(crate) fn status_reply(status: Status) -> Vec<u8> {
    let resp: http::Response<()> = status.into_http();
    wire::encode_response(resp.status(), resp.headers(), None, &[])
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// A future that turns a panic while it is polled into an `Err`.
pub(crate) struct CatchUnwind<F>(pub(crate) F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = Pin::new(&mut self.get_mut().0);
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;
type Route = Arc<dyn Fn(http::Request<Body>) -> BoxFuture + Send + Sync>;

/// A small router: gRPC services by name (`/package.Service/`), what
/// tonic's `Routes` does without pulling in axum. Unknown services get
/// `Unimplemented`, as from tonic's router.
#[derive(Clone, Default)]
pub struct Router {
    routes: HashMap<String, Route>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("services", &self.routes.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Router {
    /// An empty router.
    pub fn new() -> Router {
        Router::default()
    }

    /// Adds a tonic-generated server (`GreeterServer::new(..)`), routed by
    /// its `NamedService::NAME`.
    pub fn add_service<S, B>(mut self, service: S) -> Router
    where
        S: Service<http::Request<Body>, Response = http::Response<B>>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError> + Send,
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let route: Route = Arc::new(move |req| {
            let mut s = service.clone();
            Box::pin(async move {
                let r = async {
                    std::future::poll_fn(|cx| s.poll_ready(cx)).await?;
                    s.call(req).await
                };
                Ok(match r.await {
                    Ok(resp) => resp.map(Body::new),
                    Err(e) => Status::from_error(e.into()).into_http(),
                })
            })
        });
        self.routes.insert(S::NAME.to_owned(), route);
        self
    }
}

impl Service<http::Request<Body>> for Router {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> BoxFuture {
        let service = req.uri().path().split('/').nth(1).unwrap_or("");
        match self.routes.get(service) {
            Some(route) => route(req),
            None => {
                let status = Status::unimplemented(format!(
                    "no service {service:?} on this server (path {})",
                    req.uri().path()
                ));
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}
