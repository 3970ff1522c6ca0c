//! The async API (feature `tokio`): futures and a stream over the same
//! endpoint, woken by tokio's reactor.
//!
//! The first future that has to wait starts the endpoint's *driver task* on
//! the current tokio runtime: it registers the socket (and a `timerfd` for
//! the engine's timers) with tokio's reactor through `AsyncFd`, and drives
//! the engine whenever either is ready. A waiting future registers its
//! `Waker` where its result will be published (its RPC's slot, or the
//! request queue), so a response is: the kernel marks the socket readable,
//! tokio wakes the driver task, which runs the engine and wakes the
//! future's task. No thread of ours is involved; the background thread
//! only steps in where no tokio runtime is available (futures polled by
//! another executor) or after the runtime has shut down.
//!
//! Before registering, a future makes one non-blocking pass over the socket
//! itself and, if no other thread or task is polling this endpoint,
//! busy-polls for up to [`EndpointConfig::async_poll`](crate::EndpointConfig)
//! (50 µs by default, as the blocking API's `poll`): a response that comes
//! back within the budget costs
//! no wake-up at all (on a loopback ping-pong, a round trip takes a few µs
//! while a wake-up through the reactor takes tens), at the price of holding
//! the executor thread while it spins, bounded by the budget and by one
//! spinner per endpoint. Set it to zero for pure reactor wake-ups.
//!
//! # Cancel safety
//!
//! * Dropping an [`RpcFuture`] (or the future of [`AsyncEndpoint::call`]) before it
//!   completes abandons the RPC: the engine forgets it and its response,
//!   if one arrives, is discarded.
//! * Dropping a [`RecvRequestFuture`] / [`RecvResponseFuture`], or a
//!   [`Requests`] stream between items, loses nothing: an item is taken
//!   from the queue only in the poll that returns it.
//!
//! Sends and replies never block and are used as-is from async code.

use crate::config::EndpointConfig;
use crate::driver::release;
use crate::endpoint::{Endpoint, PendingRpc, Request, Response};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::shared::Shared;
use crate::wait::{WaitQueue, Waiter};
use homa_proto::{Metrics, Outgoing, RpcId, SendBuf};
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::future::{Future, IntoFuture};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Passes of the driver task per poll before it yields to other tasks.
const REACTOR_ROUNDS: usize = 16;

/// The async driver task's shared state: the timer it sleeps on, and its
/// waker for shutdown.
pub(crate) struct Reactor {
    /// A non-blocking `timerfd` on `CLOCK_MONOTONIC`, registered with
    /// tokio's reactor and armed for the engine's next timer, so that timers
    /// need neither tokio's time driver nor a thread of ours.
    timer: TimerFd,
    /// Engine time the timer is armed for (`u64::MAX`: not armed). Raised
    /// to `MAX` by the task when the timer fires, lowered under the engine
    /// lock by [`Reactor::rearm`].
    armed: AtomicU64,
    waker: parking_lot::Mutex<Option<Waker>>,
    /// The driver task exists (it may be dormant).
    task: AtomicBool,
}

impl Reactor {
    fn new() -> std::io::Result<Reactor> {
        Ok(Reactor {
            timer: TimerFd::new(
                ClockId::CLOCK_MONOTONIC,
                TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
            )?,
            armed: AtomicU64::new(u64::MAX),
            waker: parking_lot::Mutex::new(None),
            task: AtomicBool::new(false),
        })
    }

    /// Arms the timer for engine time `next` if that is earlier than what
    /// it is armed for. Called under the engine lock (one writer at a
    /// time); a later deadline leaves the timer alone (an early firing only
    /// costs the task one pass that finds nothing due).
    /// `at_ns` is the CLOCK_MONOTONIC time at which the engine's clock
    /// reads `next` ([`Shared::monotonic_at`]).
    pub(crate) fn rearm(&self, next: u64, at_ns: u64) {
        if next < self.armed.load(Relaxed) {
            self.armed.store(next, Relaxed);
            // One shot at an absolute CLOCK_MONOTONIC time (at least 1 ns:
            // zero would disarm it). An error leaves the timer as it was,
            // which at worst delays a timer to the background thread.
            let at = Duration::from_nanos(at_ns.max(1));
            let _ = self.timer.set(
                Expiration::OneShot(at.into()),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            );
        }
    }

    /// Wakes the driver task (shutdown).
    pub(crate) fn wake(&self) {
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

/// A descriptor registered with tokio; owned elsewhere (the endpoint's
/// socket or the reactor's timer, both alive while the task runs).
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Clears the endpoint's reactor flag when the driver task ends (shutdown,
/// the runtime shutting down, a failed registration), and hands the socket
/// to the background thread if anyone still waits.
struct ReactorGuard(Arc<Shared>, Arc<Reactor>);

impl Drop for ReactorGuard {
    fn drop(&mut self) {
        self.1.task.store(false, SeqCst);
        self.0.roles.reactor.store(false, SeqCst);
        self.0.app_leaves();
    }
}

impl Shared {
    /// Makes sure the driver task runs (on the current tokio runtime) and
    /// watches: wakes it if it is dormant. Returns false where there is no
    /// runtime (the background thread then watches for the caller, as for
    /// a sleeping thread).
    fn ensure_reactor(self: &Arc<Self>) -> bool {
        if self.roles.reactor.load(SeqCst) {
            return true;
        }
        if let Some(r) = self.reactor_state.get() {
            if r.task.load(SeqCst) {
                r.wake();
                return true;
            }
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let r = match self.reactor_state.get() {
            Some(r) => r.clone(),
            None => match Reactor::new() {
                Ok(r) => self.reactor_state.get_or_init(|| Arc::new(r)).clone(),
                Err(_) => return false,
            },
        };
        if r.task.compare_exchange(false, true, SeqCst, SeqCst).is_ok() {
            handle.spawn(run_reactor(self.clone(), r));
        } else {
            r.wake();
        }
        true
    }

    /// Whether the driver task should watch (be registered with tokio):
    /// never while a thread or task busy-polls the endpoint (the spinner
    /// drives the engine itself, and with the socket registered every
    /// datagram would wake a tokio worker for nothing, preempting the
    /// spinner on a small machine); otherwise once a task has had to wait,
    /// and from then on until a spinner appears (registering and
    /// deregistering cost a system call each, so a task that waits on
    /// every call, with `async_poll` zero, keeps the socket registered).
    fn reactor_wanted(&self, registered: bool) -> bool {
        self.roles.pollers.count() == 0 && (registered || self.roles.blocked.load(SeqCst) > 0)
    }

    /// One poll of the driver task. Dormant (socket and timer not
    /// registered with tokio, `roles.reactor` false) while nobody waits or
    /// someone spins; otherwise registered, driving the engine while the
    /// socket or the timer is ready. Returns `Ready` when the task should
    /// end (shutdown, or tokio refused the registration).
    fn poll_reactor(
        &self,
        r: &Reactor,
        regs: &mut Option<Registered>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        {
            let mut w = r.waker.lock();
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        for _ in 0..REACTOR_ROUNDS {
            if self.is_shut() {
                return Poll::Ready(());
            }
            if !self.reactor_wanted(regs.is_some()) {
                // Go dormant; then look again, so that a task that blocked
                // meanwhile (and saw the flag still set, so did not wake
                // us) is not missed.
                *regs = None;
                self.roles.reactor.store(false, SeqCst);
                if !self.reactor_wanted(false) {
                    return Poll::Pending;
                }
            }
            if regs.is_none() {
                match Registered::new(self, r) {
                    Some(g) => *regs = Some(g),
                    None => return Poll::Ready(()),
                }
                self.roles.reactor.store(true, SeqCst);
                self.locked(|_| {
                    r.armed.store(u64::MAX, Relaxed);
                    let next = self.next_deadline.load(SeqCst);
                    r.rearm(next, self.monotonic_at(next));
                });
            }
            let Registered { sock, timer } = regs.as_ref().expect("registered");
            let mut work = false;
            match timer.poll_read_ready(cx) {
                Poll::Ready(Ok(mut g)) => {
                    // Consumes the expiration count (non-blocking: EAGAIN
                    // if there is none, which is fine).
                    let _ = r.timer.wait();
                    g.clear_ready();
                    r.armed.store(u64::MAX, Relaxed);
                    work = true;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            let mut ready = None;
            match sock.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => {
                    ready = Some(g);
                    work = true;
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            if !work {
                return Poll::Pending;
            }
            let mut d = self.lock_engine();
            let now = self.clock(&mut d);
            self.drive(&mut d, now, true);
            let drained = d.rx_drained;
            if r.armed.load(Relaxed) == u64::MAX {
                let next = self.next_deadline.load(Relaxed);
                r.rearm(next, self.monotonic_at(next));
            }
            release(d);
            // Only a receive that found the socket empty may clear the
            // flag: datagrams that arrive after it raise it again (tokio
            // keeps the readiness events it has not seen yet).
            if drained {
                if let Some(mut g) = ready {
                    g.clear_ready();
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// A future's own attempt before it registers: one non-blocking pass,
    /// or busy-polling for `async_poll` until `done` says the result is in.
    pub(crate) fn poll_before_waiting(&self, done: impl Fn() -> bool) {
        // One spinner per endpoint at a time: others (many calls in flight
        // from many tasks) register at once instead of each holding an
        // executor thread for the budget.
        if self.async_poll_ns == 0 || self.roles.pollers.count() > 0 {
            self.drive_once();
            return;
        }
        self.roles.pollers.enter();
        let mut now = self.now_ns();
        let end = now.saturating_add(self.async_poll_ns);
        let mut found = false;
        let mut polite = crate::handoff::Politeness::default();
        polite.passed(now, false);
        while !self.is_shut() {
            self.poll_politely(&mut polite, now);
            now = self.drive_once().unwrap_or_else(|| self.now_ns());
            if done() {
                found = true;
                break;
            }
            if now >= end {
                break;
            }
            std::hint::spin_loop();
        }
        self.leave_polling(now, found);
        // The driver task stays dormant while someone spins: if others
        // wait, it must watch now.
        if self.roles.blocked.load(SeqCst) > 0 && !self.roles.reactor.load(SeqCst) {
            if let Some(r) = self.reactor_state.get() {
                r.wake();
            }
        }
    }

    /// One poll of an `AsyncRead`/`AsyncWrite` that waits for `ready()`:
    /// drives the engine once if it is not, then registers the task with
    /// `notify` and re-checks; `Pending` counts the caller as a blocked
    /// waiter (`counted`, so the background thread or the driver task keeps
    /// the engine going), `Ready` uncounts it. `Ready(Err)` once the
    /// endpoint is shut down.
    pub(crate) fn poll_ready(
        self: &Arc<Self>,
        cx: &mut std::task::Context<'_>,
        ready: impl Fn() -> bool,
        notify: &crate::wait::Notify,
        counted: &mut bool,
    ) -> Poll<std::io::Result<()>> {
        if !ready() {
            self.drive_once();
        }
        if !ready() {
            notify.register(Waiter::Task(cx.waker().clone()));
            if !ready() {
                if self.is_shut() {
                    return Poll::Ready(Err(Error::Shutdown.into()));
                }
                if !*counted {
                    *counted = true;
                    self.enter_blocked_async();
                }
                return Poll::Pending;
            }
        }
        if *counted {
            *counted = false;
            self.leave_blocked();
        }
        Poll::Ready(Ok(()))
    }

    /// Registers a waiting future: counted as blocked, and watched for by
    /// the driver task (or, without a runtime, the background thread).
    pub(crate) fn enter_blocked_async(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_ok() {
            // Counted first, so that the driver task, woken below, sees it.
            self.roles.blocked.fetch_add(1, SeqCst);
            if self.ensure_reactor() {
                return;
            }
            self.roles.blocked.fetch_sub(1, SeqCst);
        }
        self.enter_blocked();
    }
}

/// The socket and the timer, registered with tokio's reactor while the
/// driver task watches (dropping them deregisters).
struct Registered {
    sock: AsyncFd<Fd>,
    timer: AsyncFd<Fd>,
}

impl Registered {
    /// Registers both, or `None` if tokio refuses (`AsyncFd` panics on a
    /// runtime built without its I/O driver: the task then ends and the
    /// background thread takes over).
    fn new(shared: &Shared, r: &Reactor) -> Option<Registered> {
        let regs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: both descriptors stay open and unchanged for the
            // whole life of these `AsyncFd`s: the socket belongs to the
            // endpoint's shared state and the timer to the reactor, both
            // held by the driver task (its arguments) that owns this value;
            // `Fd::as_raw_fd` always returns the same number.
            unsafe {
                (
                    AsyncFd::register_with_interest(Fd(shared.sock.fd()), Interest::READABLE),
                    AsyncFd::register_with_interest(
                        Fd(r.timer.as_fd().as_raw_fd()),
                        Interest::READABLE,
                    ),
                )
            }
        }));
        match regs {
            Ok((Ok(sock), Ok(timer))) => Some(Registered { sock, timer }),
            _ => None,
        }
    }
}

/// The driver task (see the module documentation).
async fn run_reactor(shared: Arc<Shared>, r: Arc<Reactor>) {
    let _guard = ReactorGuard(shared.clone(), r.clone());
    let mut regs = None;
    std::future::poll_fn(|cx| shared.poll_reactor(&r, &mut regs, cx)).await;
}

/// An endpoint for async code (feature `tokio`): the same endpoint as
/// [`Endpoint`], whose calls that wait are futures woken by tokio's reactor
/// (see the module documentation of the runtime, docs/runtime.md). Cheap to
/// clone; every clone, and the [`Endpoint`] it was made from, share one
/// socket and one engine, so a program may serve with [`Self::requests`]
/// on some tasks and call out with [`Self::call`] on others.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> homa::Result<()> {
/// let server = homa::AsyncEndpoint::bind("127.0.0.1:0")?;
/// let addr = server.local_addr();
/// let client = homa::AsyncEndpoint::bind("127.0.0.1:0")?;
/// let call = client.call(addr, &b"hi"[..]);
/// let serve = async {
///     let req = server.recv_request().await?;
///     req.reply(&b"ho"[..])
/// };
/// let (reply, served) = tokio::join!(call, serve);
/// served?;
/// assert_eq!(reply?.to_vec(), b"ho");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AsyncEndpoint {
    ep: Endpoint,
}

impl From<Endpoint> for AsyncEndpoint {
    fn from(ep: Endpoint) -> AsyncEndpoint {
        AsyncEndpoint { ep }
    }
}

impl From<AsyncEndpoint> for Endpoint {
    fn from(a: AsyncEndpoint) -> Endpoint {
        a.ep
    }
}

impl AsyncEndpoint {
    /// Binds an endpoint with the default settings ([`Endpoint::bind`]).
    pub fn bind(addr: impl ToSocketAddrs) -> Result<AsyncEndpoint> {
        Endpoint::bind(addr).map(AsyncEndpoint::from)
    }

    /// Binds an endpoint with `cfg` ([`Endpoint::bind_with`]); or build one
    /// with [`Endpoint::builder`] and convert it (`AsyncEndpoint::from`).
    pub fn bind_with(addr: impl ToSocketAddrs, cfg: EndpointConfig) -> Result<AsyncEndpoint> {
        Endpoint::bind_with(addr, cfg).map(AsyncEndpoint::from)
    }

    /// The same endpoint's blocking API, for threads outside the async
    /// runtime (its waiting calls block the thread: not for async code).
    pub fn blocking(&self) -> &Endpoint {
        &self.ep
    }

    /// The address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.ep.local_addr()
    }

    /// The settings the endpoint runs with ([`Endpoint::config`]).
    pub fn config(&self) -> &EndpointConfig {
        self.ep.config()
    }

    /// Sends `request` to `peer` and waits for the response. Dropping the
    /// future before it completes abandons the RPC.
    pub async fn call(&self, peer: SocketAddr, request: impl Into<Outgoing>) -> Result<Message> {
        self.ep.send_request(peer, request)?.await
    }

    /// Like [`Self::call`], failing with [`Error::Timeout`] (and abandoning
    /// the RPC) after `timeout`.
    pub async fn call_timeout(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
        timeout: Duration,
    ) -> Result<Message> {
        let fut = self.ep.send_request(peer, request)?.into_future();
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout),
        }
    }

    /// Starts an RPC without waiting ([`Endpoint::send_request`]); `.await`
    /// the [`PendingRpc`] for its response.
    pub fn send_request(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<PendingRpc> {
        self.ep.send_request(peer, request)
    }

    /// Starts an RPC whose outcome goes to the response queue
    /// ([`Endpoint::send_request_shared`]); see [`Self::recv_response`].
    pub fn send_request_shared(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<RpcId> {
        self.ep.send_request_shared(peer, request)
    }

    /// The next outcome of a shared RPC.
    pub fn recv_response(&self) -> RecvResponseFuture {
        RecvResponseFuture(QueueWait::new(self.ep.shared_arc()))
    }

    /// Abandons a shared RPC; no response will be delivered for it.
    pub fn cancel(&self, id: RpcId) {
        self.ep.cancel(id)
    }

    /// The next incoming request.
    pub fn recv_request(&self) -> RecvRequestFuture {
        RecvRequestFuture(QueueWait::new(self.ep.shared_arc()))
    }

    /// The incoming requests as a [`futures_core::Stream`]; it ends when the
    /// endpoint shuts down. Any number of streams (and receivers, blocking
    /// or not) may take from the same endpoint: each request goes to one
    /// of them.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> homa::Result<()> {
    /// let server = homa::AsyncEndpoint::bind("127.0.0.1:0")?;
    /// let addr = server.local_addr();
    /// let mut requests = server.requests();
    /// tokio::spawn(async move {
    ///     while let Some(req) = requests.next().await {
    ///         let (msg, responder) = req.into_parts();
    ///         let _ = responder.reply(msg.into_bytes());
    ///     }
    /// });
    /// let client = homa::AsyncEndpoint::bind("127.0.0.1:0")?;
    /// let reply = client.call(addr, &b"hi"[..]).await?;
    /// assert_eq!(reply.to_vec(), b"hi");
    /// # Ok(()) }
    /// ```
    pub fn requests(&self) -> Requests {
        Requests(QueueWait::new(self.ep.shared_arc()))
    }

    /// A send buffer for messages of up to `len` bytes
    /// ([`Endpoint::new_send_buf`]).
    pub fn new_send_buf(&self, len: usize) -> SendBuf {
        self.ep.new_send_buf(len)
    }

    /// Shuts the endpoint down ([`Endpoint::shutdown`]): every clone, and
    /// the blocking handles, see it.
    pub fn shutdown(&self) {
        self.ep.shutdown()
    }

    /// Whether the endpoint has been shut down.
    pub fn is_shut_down(&self) -> bool {
        self.ep.is_shut_down()
    }

    /// The engine's counters ([`Endpoint::metrics`]).
    pub fn metrics(&self) -> Metrics {
        self.ep.metrics()
    }
}

/// The response of a [`PendingRpc`], as a future (`pending.await`).
pub struct RpcFuture {
    rpc: PendingRpc,
    counted: bool,
}

impl IntoFuture for PendingRpc {
    type Output = Result<Message>;
    type IntoFuture = RpcFuture;
    fn into_future(self) -> RpcFuture {
        RpcFuture {
            rpc: self,
            counted: false,
        }
    }
}

impl Future for RpcFuture {
    type Output = Result<Message>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Message>> {
        let this = self.get_mut();
        let mut drove = false;
        loop {
            let (shared, slot) = this.rpc.parts();
            if let Some(r) = slot.take() {
                if this.counted {
                    shared.leave_blocked();
                    this.counted = false;
                }
                this.rpc.set_finished();
                return Poll::Ready(r.map(Message::new));
            }
            if !drove {
                drove = true;
                shared.poll_before_waiting(|| slot.is_done());
                continue;
            }
            if !slot.register(Waiter::Task(cx.waker().clone())) {
                continue;
            }
            if !this.counted {
                this.counted = true;
                shared.enter_blocked_async();
            }
            return Poll::Pending;
        }
    }
}

impl Drop for RpcFuture {
    fn drop(&mut self) {
        if self.counted {
            self.rpc.parts().0.leave_blocked();
        }
    }
}

/// Waits, as the API's futures do (a bounded busy-poll of its own, then
/// the driver task), until `ready()`; `register` leaves the task's waker
/// where the driver finds it when the awaited thing happens. Ends with
/// [`Error::Shutdown`] if the endpoint shuts down first.
pub(crate) struct WaitUntil<'a, R: Fn() -> bool, G: Fn(Waiter)> {
    shared: &'a Arc<Shared>,
    ready: R,
    register: G,
    drove: bool,
    counted: bool,
}

impl<'a, R: Fn() -> bool, G: Fn(Waiter)> WaitUntil<'a, R, G> {
    pub(crate) fn new(shared: &'a Arc<Shared>, ready: R, register: G) -> Self {
        WaitUntil {
            shared,
            ready,
            register,
            drove: false,
            counted: false,
        }
    }
}

impl<R: Fn() -> bool, G: Fn(Waiter)> Unpin for WaitUntil<'_, R, G> {}

impl<R: Fn() -> bool, G: Fn(Waiter)> Future for WaitUntil<'_, R, G> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        loop {
            let done = (this.ready)();
            if done || this.shared.is_shut() {
                if this.counted {
                    this.shared.leave_blocked();
                    this.counted = false;
                }
                return Poll::Ready(if done { Ok(()) } else { Err(Error::Shutdown) });
            }
            if !this.drove {
                this.drove = true;
                this.shared.poll_before_waiting(&this.ready);
                continue;
            }
            (this.register)(Waiter::Task(cx.waker().clone()));
            // Reported between the check and the registration: look again.
            if (this.ready)() {
                continue;
            }
            if !this.counted {
                this.counted = true;
                this.shared.enter_blocked_async();
            }
            return Poll::Pending;
        }
    }
}

impl<R: Fn() -> bool, G: Fn(Waiter)> Drop for WaitUntil<'_, R, G> {
    fn drop(&mut self) {
        if self.counted {
            self.shared.leave_blocked();
        }
    }
}

/// Which queue a [`QueueWait`] takes from.
trait Queue {
    type Item;
    type Out;
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item>;
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Self::Out;
}

struct IncomingRequests;
impl Queue for IncomingRequests {
    type Item = (homa_proto::ServerRpc, homa_proto::Message);
    type Out = Request;
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item> {
        &shared.requests
    }
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Request {
        shared.request(item)
    }
}

/// Requests delivered incrementally ([`Endpoint::recv_partial_request`]).
struct PartialRequests;
impl Queue for PartialRequests {
    type Item = (
        homa_proto::ServerRpc,
        homa_proto::PartialMessage,
        Arc<crate::wait::Notify>,
    );
    type Out = (crate::IncomingMessage, crate::Responder);
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item> {
        &shared.partial_requests
    }
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Self::Out {
        crate::partial::incoming_request(shared, item)
    }
}

/// The next request delivered incrementally, as a future
/// ([`AsyncEndpoint::recv_partial_request`]).
pub(crate) struct RecvPartialRequest(QueueWait<PartialRequests>);

impl RecvPartialRequest {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        RecvPartialRequest(QueueWait::new(shared))
    }
}

impl Future for RecvPartialRequest {
    type Output = Result<(crate::IncomingMessage, crate::Responder)>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_next(cx)
    }
}

/// Streams opened by peers ([`crate::Endpoint::accept_stream`]).
struct AcceptedStreams;
impl Queue for AcceptedStreams {
    type Item = (homa_proto::StreamId, Arc<crate::stream::StreamSignals>);
    type Out = crate::Stream;
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item> {
        &shared.accepted_streams
    }
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Self::Out {
        crate::stream::accepted(shared, item)
    }
}

/// The next stream a peer opens, as a future
/// ([`AsyncEndpoint::accept_stream`]).
pub(crate) struct AcceptStream(QueueWait<AcceptedStreams>);

impl AcceptStream {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        AcceptStream(QueueWait::new(shared))
    }
}

impl Future for AcceptStream {
    type Output = Result<crate::Stream>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.get_mut().0.poll_next(cx)
    }
}

struct Responses;
impl Queue for Responses {
    type Item = Response;
    type Out = Response;
    fn queue(shared: &Shared) -> &WaitQueue<Response> {
        &shared.responses
    }
    fn convert(_: &Arc<Shared>, item: Response) -> Response {
        item
    }
}

struct QueueWait<Q: Queue> {
    shared: Arc<Shared>,
    token: Option<u64>,
    counted: bool,
    _q: std::marker::PhantomData<Q>,
}

impl<Q: Queue> QueueWait<Q> {
    fn new(shared: Arc<Shared>) -> Self {
        QueueWait {
            shared,
            token: None,
            counted: false,
            _q: std::marker::PhantomData,
        }
    }
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Q::Out>> {
        let mut drove = false;
        loop {
            if let Some(item) = Q::queue(&self.shared).try_pop() {
                self.release();
                return Poll::Ready(Ok(Q::convert(&self.shared, item)));
            }
            if self.shared.is_shut() {
                self.release();
                return Poll::Ready(Err(Error::Shutdown));
            }
            if !drove {
                drove = true;
                let q = Q::queue(&self.shared);
                self.shared.poll_before_waiting(|| q.len() > 0);
                continue;
            }
            if let Some(t) = self.token.take() {
                Q::queue(&self.shared).deregister(t);
            }
            match Q::queue(&self.shared).register(Waiter::Task(cx.waker().clone())) {
                None => continue,
                Some(t) => self.token = Some(t),
            }
            if !self.counted {
                self.counted = true;
                self.shared.enter_blocked_async();
            }
            return Poll::Pending;
        }
    }
    fn release(&mut self) {
        if let Some(t) = self.token.take() {
            Q::queue(&self.shared).deregister(t);
        }
        if self.counted {
            self.counted = false;
            self.shared.leave_blocked();
        }
    }
}

impl<Q: Queue> Drop for QueueWait<Q> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The next incoming request, as a future.
pub struct RecvRequestFuture(QueueWait<IncomingRequests>);

impl Future for RecvRequestFuture {
    type Output = Result<Request>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Request>> {
        self.get_mut().0.poll_next(cx)
    }
}

/// The next outcome of a shared RPC, as a future.
pub struct RecvResponseFuture(QueueWait<Responses>);

impl Future for RecvResponseFuture {
    type Output = Result<Response>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Response>> {
        self.get_mut().0.poll_next(cx)
    }
}

/// The stream of incoming requests ([`Endpoint::requests`]).
pub struct Requests(QueueWait<IncomingRequests>);

impl Requests {
    /// The next request; `None` once the endpoint has shut down. The same as
    /// `StreamExt::next` from `futures` or `tokio-stream`, without either.
    /// Cancel-safe: dropping the future loses no request.
    pub async fn next(&mut self) -> Option<Request> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_next_request(cx)).await
    }

    fn poll_next_request(&mut self, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        match self.0.poll_next(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(Some(r)),
            Poll::Ready(Err(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures_core::Stream for Requests {
    type Item = Request;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Request>> {
        self.get_mut().poll_next_request(cx)
    }
}

impl std::fmt::Debug for Requests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requests").finish_non_exhaustive()
    }
}
