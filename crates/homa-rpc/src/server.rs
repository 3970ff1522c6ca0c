//! The server side: [`Server`] reads each request's header inside the
//! serving thread's receive pass (`Endpoint::serve`), finds the method and
//! runs its handler there (`inline`), on the worker pool (`pool`) or as a
//! tokio task (`task`); [`Context`] is what a handler knows of its call.

use crate::client::Client;
use crate::status::Status;
use crate::wire::{self, RequestHeader, FLAG_CANCEL, REQUEST_HEADER_LEN};
use crate::{Dispatch, Mode};
use bytes::Buf;
use homa::{Endpoint, Message, Request, Responder};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Builds a [`Server`].
pub struct ServerBuilder {
    ep: Endpoint,
    services: Vec<Arc<dyn Dispatch>>,
    workers: usize,
    runtime: Option<tokio::runtime::Handle>,
    nested: Option<Endpoint>,
}

impl ServerBuilder {
    /// Adds a service (`my_service::server(impl)`). A server may host
    /// several; their method ids must differ.
    pub fn service(mut self, d: impl Dispatch) -> Self {
        self.services.push(Arc::new(d));
        self
    }
    /// Threads of the worker pool that runs `pool` methods (default: the
    /// number of CPUs).
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }
    /// The tokio runtime `task` methods run on (default: the one current
    /// when `build` is called, if any). Its time driver must be on
    /// (deadlines).
    pub fn runtime(mut self, h: tokio::runtime::Handle) -> Self {
        self.runtime = Some(h);
        self
    }
    /// The endpoint handlers' nested calls go through (default: one bound
    /// on the server's address with port 0, with the server endpoint's
    /// settings, when a handler first asks). It must be another endpoint
    /// than the server's: a run-to-completion handler cannot wait on the
    /// endpoint whose receive pass it runs in.
    pub fn nested_endpoint(mut self, ep: Endpoint) -> Self {
        self.nested = Some(ep);
        self
    }
    pub fn build(self) -> Server {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..self.workers {
            let rx = rx.clone();
            let _ = std::thread::Builder::new()
                .name(format!("homa-rpc-worker-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    match job {
                        Ok(j) => j(),
                        Err(_) => return,
                    }
                });
        }
        let nested = OnceLock::new();
        if let Some(ep) = self.nested {
            let _ = nested.set(Ok(Client::new(ep)));
        }
        Server {
            inner: Arc::new(Inner {
                ep: self.ep,
                services: self.services.into_boxed_slice(),
                pool: Mutex::new(Some(tx)),
                runtime: self
                    .runtime
                    .or_else(|| tokio::runtime::Handle::try_current().ok()),
                nested,
                cancels: Mutex::new(HashMap::new()),
            }),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// An RPC server on one endpoint. Cheap to clone; call [`Server::serve`]
/// from as many threads as should serve.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    ep: Endpoint,
    services: Box<[Arc<dyn Dispatch>]>,
    pool: Mutex<Option<mpsc::Sender<Job>>>,
    runtime: Option<tokio::runtime::Handle>,
    nested: OnceLock<Result<Client, Status>>,
    /// Calls running on the pool or as tasks, by (client, RPC id), so that
    /// a cancel notice finds them.
    cancels: Mutex<HashMap<(SocketAddr, u64), Arc<CancelToken>>>,
}

/// Set when the client cancels a call.
#[derive(Default)]
struct CancelToken {
    cancelled: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Server {
    pub fn builder(ep: Endpoint) -> ServerBuilder {
        ServerBuilder {
            ep,
            services: Vec::new(),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            runtime: None,
            nested: None,
        }
    }

    /// The endpoint it serves.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.ep
    }

    /// Serves on this thread until the endpoint shuts down. Requests are
    /// decoded and `inline` handlers run inside this thread's receive pass.
    pub fn serve(&self) -> homa::Result<()> {
        let inner = &self.inner;
        inner.ep.serve(|req| inner.handle(req))
    }

    /// Shuts the endpoint down (every `serve` returns) and stops the pool
    /// once its queued work is done.
    pub fn shutdown(&self) {
        self.inner.ep.shutdown();
        if let Ok(mut p) = self.inner.pool.lock() {
            p.take();
        }
    }
}

impl Inner {
    fn handle(self: &Arc<Self>, req: Request) {
        homa::tt!("rpc request in");
        let (mut msg, responder) = req.into_parts();
        let mut first = [0u8; REQUEST_HEADER_LEN];
        let n = msg.copy_to(0, &mut first);
        let hdr = match RequestHeader::decode(&first[..n], msg.len()) {
            Ok(h) => h,
            Err(s) => return reply_status(responder, &s),
        };
        msg.advance(hdr.body_offset as usize);
        if hdr.flags & FLAG_CANCEL != 0 {
            self.cancel_notice(responder.peer(), msg);
            return reply_status(responder, &Status::new(crate::Code::Ok, ""));
        }
        let Some((svc, mode)) = self
            .services
            .iter()
            .find_map(|s| s.mode(hdr.method).map(|m| (s, m)))
        else {
            let s = Status::unimplemented(format!("no method {:#010x}", hdr.method));
            return reply_status(responder, &s);
        };
        homa::tt!("rpc method found {}", hdr.method);
        let deadline = (hdr.budget_us != 0)
            .then(|| Instant::now() + Duration::from_micros(hdr.budget_us as u64));
        let peer = responder.peer();
        match mode {
            Mode::Inline => {
                let cx = Context {
                    deadline,
                    peer,
                    cancel: None,
                    server: self.clone(),
                };
                let out = catch_unwind(AssertUnwindSafe(|| svc.call(hdr.method, &cx, msg)));
                homa::tt!("rpc response encoded");
                finish(responder, &cx, out.unwrap_or_else(|p| Err(panicked(p))));
            }
            Mode::Pool => {
                let Some(tx) = self.pool.lock().ok().and_then(|p| p.clone()) else {
                    return reply_status(responder, &Status::unavailable("server shutting down"));
                };
                let id = responder.id().0;
                let token = self.register(peer, id);
                let cx = Context {
                    deadline,
                    peer,
                    cancel: Some(token),
                    server: self.clone(),
                };
                let svc = svc.clone();
                let method = hdr.method;
                // Workers catch every panic, so they outlive the server's
                // channel; a send fails only if none could be started.
                let _ = tx.send(Box::new(move || {
                    let out = if cx.is_expired() {
                        Err(Status::deadline_exceeded("deadline passed in the queue"))
                    } else {
                        catch_unwind(AssertUnwindSafe(|| svc.call(method, &cx, msg)))
                            .unwrap_or_else(|p| Err(panicked(p)))
                    };
                    cx.server.unregister(peer, id);
                    finish(responder, &cx, out);
                }));
            }
            Mode::Task => {
                let Some(rt) = self.runtime.clone() else {
                    let s = Status::unavailable("no tokio runtime for async handlers");
                    return reply_status(responder, &s);
                };
                let id = responder.id().0;
                let token = self.register(peer, id);
                let cx = Context {
                    deadline,
                    peer,
                    cancel: Some(token.clone()),
                    server: self.clone(),
                };
                let server = self.clone();
                let fut = svc.call_async(hdr.method, cx.clone(), msg);
                rt.spawn(async move {
                    let handler = tokio::spawn(fut);
                    let abort = handler.abort_handle();
                    let expiry = async {
                        match deadline {
                            Some(d) => tokio::time::sleep_until(d.into()).await,
                            None => std::future::pending().await,
                        }
                    };
                    let out = tokio::select! {
                        r = handler => r.unwrap_or_else(|e| Err(if e.is_panic() {
                            panicked(e.into_panic())
                        } else {
                            Status::cancelled("handler task aborted")
                        })),
                        _ = expiry => {
                            abort.abort();
                            Err(Status::deadline_exceeded("handler ran past the deadline"))
                        }
                        _ = token.notify.notified() => {
                            abort.abort();
                            Err(Status::cancelled("cancelled by the client"))
                        }
                    };
                    server.unregister(peer, id);
                    finish(responder, &cx, out);
                });
            }
        }
    }

    fn register(&self, peer: SocketAddr, id: u64) -> Arc<CancelToken> {
        let t = Arc::new(CancelToken::default());
        if let Ok(mut m) = self.cancels.lock() {
            m.insert((peer, id), t.clone());
        }
        t
    }

    fn unregister(&self, peer: SocketAddr, id: u64) {
        if let Ok(mut m) = self.cancels.lock() {
            m.remove(&(peer, id));
        }
    }

    /// A client's notice that it abandoned its RPC `id` (the body).
    fn cancel_notice(&self, peer: SocketAddr, mut body: Message) {
        if body.remaining() < 8 {
            return;
        }
        let id = body.get_u64_le();
        let token = self
            .cancels
            .lock()
            .ok()
            .and_then(|m| m.get(&(peer, id)).cloned());
        if let Some(t) = token {
            t.cancelled.store(true, Ordering::Release);
            t.notify.notify_one();
        }
    }
}

/// Sends a handler's outcome, unless the call is over: cancelled by its
/// client (nobody listens), or past its deadline (the late response is
/// dropped; the client has given up, and gets `DeadlineExceeded` from
/// its own clock).
fn finish(responder: Responder, cx: &Context, out: Result<Vec<u8>, Status>) {
    if cx.is_cancelled() {
        return; // dropping the responder abandons the RPC
    }
    if cx.is_expired() {
        let s = Status::deadline_exceeded("handler ran past the deadline");
        return reply_status(responder, &s);
    }
    match out {
        Ok(v) => {
            homa::tt!("rpc reply");
            let _ = responder.reply(v);
        }
        Err(s) => reply_status(responder, &s),
    }
}

fn reply_status(responder: Responder, s: &Status) {
    let _ = responder.reply(wire::error_response(s));
}

fn panicked(p: Box<dyn std::any::Any + Send>) -> Status {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    Status::internal(format!("handler panicked: {what}"))
}

/// What a handler knows of its call: the deadline, whether the client
/// cancelled, who called, and a client for nested calls that carries the
/// deadline on.
#[derive(Clone)]
pub struct Context {
    deadline: Option<Instant>,
    peer: SocketAddr,
    cancel: Option<Arc<CancelToken>>,
    server: Arc<Inner>,
}

impl Context {
    /// When the call must be answered (the client's budget, counted from
    /// the request's arrival here), if the client set one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left until the deadline (zero once passed).
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed.
    pub fn is_expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Whether the client cancelled the call (`pool` and `task` handlers;
    /// an `inline` handler runs to completion before any notice is read).
    pub fn is_cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|t| t.cancelled.load(Ordering::Acquire))
    }

    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// A client for nested calls, carrying this call's deadline: start
    /// them all, then wait for each (fan-out without a thread per call).
    pub fn client(&self) -> Result<Client, Status> {
        let base = self.server.nested.get_or_init(|| {
            let ep = &self.server.ep;
            let addr = SocketAddr::new(ep.local_addr().ip(), 0);
            Endpoint::bind_with(addr, ep.config().clone())
                .map(Client::new)
                .map_err(Status::from)
        });
        let c = base.clone()?;
        Ok(match self.deadline {
            Some(d) => c.with_deadline(d),
            None => c,
        })
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("deadline", &self.deadline)
            .field("peer", &self.peer)
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
