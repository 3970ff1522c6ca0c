//! The endpoint: the engine behind a mutex, driven by whichever thread needs
//! progress, plus one background thread for the moments when nobody does.
//!
//! Fast path (see docs/runtime.md): a thread waiting for a result busy-polls;
//! each round it tries the engine lock and, if it gets it, receives from the
//! socket, runs the engine and transmits, then checks its own result. A reply
//! found this way costs no thread handoff. After `poll` without a result the
//! thread sleeps and the background thread watches the socket for it (one
//! handoff). The background thread also runs the engine's timers.

use crate::config::{EndpointBuilder, EndpointConfig};
use crate::driver::{ClientRpcs, Driver, RpcResult, Target};
use crate::error::{Error, Result};
use crate::handoff::Roles;
use crate::message::Message;
use crate::serve::{InlineGuard, Serving};
use crate::shared::{Counters, Shared};
use crate::socket::{Faults, RxBatch, SocketOptions, SocketStats, TxQueue, UdpSocket};
use crate::sys::{monotonic_ns, EventFd};
use crate::timetrace;
use crate::wait::{Slot, WaitQueue};
use homa_proto::{EndpointStats, Metrics, Outgoing, PeerRtt, RpcId, SendBuf, ServerRpc};
use parking_lot::Mutex;
use std::cell::Cell;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

thread_local! {
    /// A spare private-RPC slot: a thread that makes one call after another
    /// reuses it instead of allocating and freeing one per RPC.
    static SPARE_SLOT: Cell<Option<Arc<Slot<RpcResult>>>> = const { Cell::new(None) };
}

/// How waits ended and how often the background thread had to step in: the
/// thread-handoff count of the runtime (see docs/runtime.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Waits satisfied without sleeping (no thread handoff).
    pub found_polling: u64,
    /// Waits that went to sleep and were woken by another thread.
    pub slept: u64,
    /// Doorbell rings to the background thread.
    pub doorbell_rings: u64,
    /// Times the background thread ran the engine.
    pub background_drives: u64,
    /// CPU yields of busy-polling threads, after a send or every
    /// [`POLL_YIELD_EVERY`](crate::POLL_YIELD_EVERY) of polling, and of
    /// threads after bulk stream reads and writes (16 KB or more)
    /// ([`EndpointConfig::poll_yield`](crate::EndpointConfig::poll_yield)).
    pub poll_yields: u64,
    /// Times a polling thread moved itself to another CPU because its
    /// yields kept letting another thread run (the CPU was shared; see
    /// [`EndpointConfig::poll_yield`](crate::EndpointConfig::poll_yield)).
    pub poll_shared_cpu: u64,
}

/// An open Homa endpoint: one UDP socket and its protocol state. Cheap to
/// clone; all clones share the endpoint, which shuts down when the last one
/// is dropped (or at [`Endpoint::shutdown`]).
#[derive(Clone)]
pub struct Endpoint {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
    bg: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.shutdown();
        if let Some(h) = self.bg.lock().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// A private RPC in progress: its response can only be collected here.
/// Dropping it without waiting abandons the RPC.
pub struct PendingRpc {
    shared: Arc<Shared>,
    id: RpcId,
    /// Taken in `drop` (to be reused as the thread's spare).
    slot: std::mem::ManuallyDrop<Arc<Slot<RpcResult>>>,
    finished: bool,
}

/// A request received by a server. Answer it with [`Request::reply`] from any
/// thread. Dropping it without a reply abandons the RPC: the server forgets
/// it at once and the client eventually fails it (timeout).
pub struct Request {
    responder: Responder,
    message: Message,
}

/// The right to answer one request, separated from its message by
/// [`Request::into_parts`].
pub struct Responder {
    shared: Arc<Shared>,
    rpc: ServerRpc,
    answered: bool,
}

/// The outcome of a shared RPC (see [`Endpoint::send_request_shared`]).
#[derive(Debug)]
pub struct Response {
    /// The id [`Endpoint::send_request_shared`] returned.
    pub id: RpcId,
    /// The server the request went to.
    pub peer: SocketAddr,
    /// The response, or why there is none.
    pub result: Result<Message>,
}

impl Endpoint {
    /// A builder of endpoint settings, each setter naming its default; its
    /// `bind(addr)` opens the endpoint:
    /// `Endpoint::builder().poll(Duration::from_micros(20)).bind("127.0.0.1:0")`.
    pub fn builder() -> EndpointBuilder {
        EndpointBuilder::new()
    }

    /// Opens an endpoint on `addr` with the default configuration. Port 0
    /// picks a free port; `[::]` serves IPv4 and IPv6.
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Endpoint> {
        Self::bind_with(addr, EndpointConfig::default())
    }

    /// Opens an endpoint on `addr` with `cfg` (from
    /// [`EndpointConfig::builder`] or another endpoint's [`Self::config`]).
    pub fn bind_with(addr: impl ToSocketAddrs, cfg: EndpointConfig) -> Result<Endpoint> {
        let addr = addr.to_socket_addrs()?.next().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to bind")
        })?;
        cfg.validate().map_err(Error::InvalidConfig)?;
        let engine_cfg = cfg.engine_config(addr.is_ipv6(), cfg.mtu_for(addr.ip()));
        let sock = UdpSocket::bind(
            addr,
            &SocketOptions {
                gso: cfg.gso,
                gro: cfg.gro,
                buffer_bytes: cfg.socket_buffer_bytes,
                dont_fragment: cfg.dont_fragment,
                // Short messages and control packets mostly go at the top
                // level: those go out without a TOS cmsg.
                default_tos: cfg.tos(engine_cfg.priority_levels.saturating_sub(1)),
                reuse_port: cfg.reuse_port,
            },
        )?;
        let base_ns = monotonic_ns();
        let engine = homa_proto::Endpoint::new(engine_cfg.clone(), 0)
            .map_err(|e| Error::InvalidConfig(e.0))?;
        let driver = Driver {
            engine,
            rx: RxBatch::new(cfg.recv_batch),
            tx: TxQueue::new(cfg.send_batch, engine_cfg.max_packet_size),
            rpcs: ClientRpcs::default(),
            faults: cfg.fault.as_ref().map(Faults::new),
            stats: SocketStats::default(),
            errors: Vec::new(),
            wakes: Vec::new(),
            served_inline: 0,
            watcher_driving: false,
            last_now: 0,
            rx_drained: false,
            partials: Default::default(),
            streams: Default::default(),
        };
        // What `config()` reports: the engine values in effect for this
        // socket's family (an IPv6 socket's packets are 20 bytes shorter).
        let mut cfg = cfg;
        cfg.engine = engine_cfg.clone();
        let shared = Arc::new(Shared {
            sock,
            max_message: engine_cfg.max_message_length as usize,
            unsched_bytes: engine_cfg.effective_unsched_bytes() as usize,
            segment: engine_cfg.max_data_per_packet(),
            link_bps: engine_cfg.link_bps,
            poll_ns: cfg.poll.as_nanos().min(u64::MAX as u128) as u64,
            async_poll_ns: cfg.async_poll.as_nanos().min(u64::MAX as u128) as u64,
            cfg,
            base_ns,
            driver: Arc::new(Mutex::new(driver)),
            lock_waiters: AtomicU32::new(0),
            doorbell: EventFd::new()?,
            roles: Roles::default(),
            #[cfg(feature = "tokio")]
            reactor_state: std::sync::OnceLock::new(),
            watcher_bell: Arc::new(EventFd::new()?),
            watcher_sleep_until: AtomicU64::new(0),
            next_deadline: AtomicU64::new(u64::MAX),
            coalesce_ns: (engine_cfg.effective_max_nic_queue_ns() / 2).min(50_000),
            inflight: AtomicUsize::new(0),
            last_app: AtomicU64::new(0),
            tx_pending: AtomicBool::new(false),
            attention_until: AtomicU64::new(0),
            shut: AtomicBool::new(false),
            requests: WaitQueue::new(),
            partial_requests: WaitQueue::new(),
            accepted_streams: WaitQueue::new(),
            responses: WaitQueue::new(),
            counters: Counters::default(),
        });
        let bg_shared = shared.clone();
        let bg = std::thread::Builder::new()
            .name(format!("homa-bg-{}", shared.sock.local_addr().port()))
            .spawn(move || bg_shared.background())?;
        Ok(Endpoint {
            handle: Arc::new(Handle {
                shared,
                bg: Mutex::new(Some(bg)),
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn shared_arc(&self) -> Arc<Shared> {
        self.handle.shared.clone()
    }

    /// The address the socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared().sock.local_addr()
    }

    /// The configuration the endpoint was opened with, its `engine` part as
    /// in effect: packet size and per-packet overhead for the socket's
    /// family (1,452-byte packets over IPv6 at MTU 1500, 1,472 over IPv4)
    /// and the RPC id seed chosen at bind. (A copy still binds another
    /// endpoint with a fresh seed when `rpc_id_seed` is `None`.)
    pub fn config(&self) -> &EndpointConfig {
        &self.shared().cfg
    }

    /// Whether UDP GSO / GRO are in use on this socket.
    pub fn offloads(&self) -> (bool, bool) {
        (self.shared().sock.gso(), self.shared().sock.gro())
    }

    /// A zeroed send buffer of `len` bytes laid out as this endpoint's
    /// packets, for messages built in place: requests and replies given as a
    /// [`SendBuf`] leave without the copy that gathers each packet's header
    /// and payload (a sixth of a bulk sender's CPU time). Fill it with
    /// [`SendBuf::write`]; a buffer can be sent again once
    /// [`SendBuf::in_flight`] is false (the RPC no longer needs it), so a
    /// sender can keep a few and reuse them.
    ///
    /// ```no_run
    /// let ep = homa::Endpoint::bind("127.0.0.1:0")?;
    /// let mut buf = ep.new_send_buf(100_000);
    /// buf.write(0, &[7; 100_000]).unwrap();
    /// let reply = ep.call("127.0.0.1:4000".parse().unwrap(), buf.clone())?;
    /// assert!(!buf.in_flight());
    /// # Ok::<(), homa::Error>(())
    /// ```
    pub fn new_send_buf(&self, len: usize) -> SendBuf {
        SendBuf::new(len, self.shared().segment)
    }

    /// Sends `request` to `peer` and waits for the response.
    ///
    /// ```no_run
    /// let ep = homa::Endpoint::bind("127.0.0.1:0")?;
    /// let reply = ep.call("127.0.0.1:4000".parse().unwrap(), &b"ping"[..])?;
    /// println!("{} bytes back", reply.len());
    /// # Ok::<(), homa::Error>(())
    /// ```
    pub fn call(&self, peer: SocketAddr, request: impl Into<Outgoing>) -> Result<Message> {
        self.shared().call(peer, request.into(), None)
    }

    /// Like [`Self::call`], giving up (and abandoning the RPC) after `timeout`.
    pub fn call_timeout(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
        timeout: Duration,
    ) -> Result<Message> {
        self.shared().call(peer, request.into(), Some(timeout))
    }

    /// Starts a private RPC and returns at once; collect the response later
    /// with [`PendingRpc::wait`]. This is the Linux module's private RPC: only
    /// the holder of its id can receive the response.
    pub fn send_request(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<PendingRpc> {
        timetrace::record("send_request");
        let slot = spare_slot();
        let id = self
            .shared()
            .start(peer, request.into(), Target::Private(slot.clone()))?;
        Ok(PendingRpc {
            shared: self.shared().clone(),
            id,
            slot: std::mem::ManuallyDrop::new(slot),
            finished: false,
        })
    }

    /// Starts an RPC whose outcome goes to the endpoint's response queue,
    /// where any thread can collect it with [`Self::recv_response`] (the Linux
    /// module's non-private RPC). Useful to keep many RPCs in flight from one
    /// thread.
    pub fn send_request_shared(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<RpcId> {
        self.shared().start(peer, request.into(), Target::Shared)
    }

    /// Waits for the next outcome of a shared RPC.
    pub fn recv_response(&self) -> Result<Response> {
        self.shared()
            .wait_queue(&self.shared().responses, None)?
            .ok_or(Error::Shutdown)
    }

    /// Like [`Self::recv_response`], returning `Ok(None)` after `timeout`.
    pub fn recv_response_timeout(&self, timeout: Duration) -> Result<Option<Response>> {
        let deadline = self.shared().now_ns() + dur_ns(timeout);
        self.shared()
            .wait_queue(&self.shared().responses, Some(deadline))
    }

    /// Abandons a shared RPC; no response will be delivered for it.
    pub fn cancel(&self, id: RpcId) {
        self.shared().cancel(id);
    }

    /// Waits for the next incoming request.
    pub fn recv_request(&self) -> Result<Request> {
        let r = self
            .shared()
            .wait_queue(&self.shared().requests, None)?
            .map(|r| self.shared().request(r))
            .ok_or(Error::Shutdown);
        timetrace::record("request returned");
        r
    }

    /// Serves requests on this thread until the endpoint shuts down: each
    /// request goes to `handler`, which answers it with [`Request::reply`]
    /// (or keeps it, or passes it to another thread to answer later).
    ///
    /// This is the fastest way to serve short requests. While this thread
    /// polls, a request it receives runs `handler` right there, inside the
    /// pass that received it and under the endpoint's engine lock, and a
    /// reply given inside the handler leaves in that same pass: no queue, no
    /// second lock, no thread handoff (eRPC's dispatch-thread handlers work
    /// the same way). The price: while a handler runs, no other thread can
    /// drive this endpoint, so a handler should be short. Long work belongs
    /// on another thread: move the [`Request`] there and reply from there.
    /// Inside the handler, this endpoint's blocking waits (`call`,
    /// `PendingRpc::wait`, `recv_request`...) return
    /// [`Error::WaitInHandler`]; starting RPCs and replying work.
    ///
    /// Any number of threads may serve the same endpoint, alongside threads
    /// using [`Self::recv_request`]; requests that another thread's pass
    /// brought in are taken from the queue and handled here too.
    ///
    /// ```no_run
    /// let ep = homa::Endpoint::bind("127.0.0.1:4000")?;
    /// // An echo server; returns once `ep.shutdown()` is called elsewhere.
    /// ep.serve(|req| {
    ///     let (message, responder) = req.into_parts();
    ///     let _ = responder.reply(message.into_bytes());
    /// })?;
    /// # Ok::<(), homa::Error>(())
    /// ```
    pub fn serve(&self, mut handler: impl FnMut(Request)) -> Result<()> {
        let shared = self.shared();
        shared.check_may_wait()?;
        let mut serving = Serving {
            shared,
            handler: &mut handler,
            served: 0,
        };
        loop {
            match shared.wait_queue_serving(&shared.requests, None, Some(&mut serving)) {
                Ok(Some(r)) => {
                    let req = shared.request(r);
                    let _guard = InlineGuard::enter(shared, None);
                    (serving.handler)(req);
                }
                Ok(None) | Err(Error::Shutdown) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Like [`Self::recv_request`], returning `Ok(None)` after `timeout`.
    pub fn recv_request_timeout(&self, timeout: Duration) -> Result<Option<Request>> {
        let deadline = self.shared().now_ns() + dur_ns(timeout);
        Ok(self
            .shared()
            .wait_queue(&self.shared().requests, Some(deadline))?
            .map(|r| self.shared().request(r)))
    }

    /// Returns a request if one is waiting (after one non-blocking pass over
    /// the socket), without sleeping.
    pub fn try_recv_request(&self) -> Result<Option<Request>> {
        self.recv_request_timeout(Duration::ZERO)
    }

    /// Fails every pending RPC with [`Error::Shutdown`], wakes every waiter and
    /// refuses new work. Idempotent; also happens when the last clone of the
    /// endpoint is dropped.
    pub fn shutdown(&self) {
        self.shared().shutdown();
    }

    /// Whether the endpoint has been shut down.
    pub fn is_shut_down(&self) -> bool {
        self.shared().shut.load(Acquire)
    }

    /// The engine's counters (packets by type, drops by reason...).
    pub fn metrics(&self) -> Metrics {
        self.shared().locked(|d| d.engine.metrics().clone())
    }

    /// What the engine measured of the path to `peer` (its RTT estimator,
    /// whether it is congested) and the windows it gives it; `None` for a
    /// peer the engine does not know. The RTT fields stay empty unless the
    /// engine measures RTT (`EngineConfig::measure_rtt` or adaptive
    /// windows, docs/congestion.md).
    pub fn peer_rtt(&self, peer: SocketAddr) -> Option<PeerRtt> {
        self.shared().locked(|d| d.engine.peer_rtt(peer))
    }

    /// The engine's table sizes.
    pub fn engine_stats(&self) -> EndpointStats {
        self.shared().locked(|d| d.engine.stats())
    }

    /// The socket layer's counters (syscalls, GSO/GRO use, errors).
    pub fn socket_stats(&self) -> SocketStats {
        self.shared().locked(|d| d.stats.clone())
    }

    /// Counters of the waiting machinery.
    pub fn runtime_stats(&self) -> RuntimeStats {
        let c = &self.shared().counters;
        RuntimeStats {
            found_polling: self.shared().roles.pollers.found()
                + self.shared().locked(|d| d.served_inline),
            slept: c.slept.load(Relaxed),
            doorbell_rings: c.rings.load(Relaxed),
            background_drives: c.bg_drives.load(Relaxed),
            poll_yields: c.poll_yields.load(Relaxed),
            poll_shared_cpu: c.poll_shared_cpu.load(Relaxed),
        }
    }

    /// Requests received but not yet taken by [`Self::recv_request`].
    pub fn queued_requests(&self) -> usize {
        self.shared().requests.len()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_addr", &self.local_addr())
            .field("shut_down", &self.is_shut_down())
            .finish()
    }
}

pub(crate) fn dur_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128 / 2) as u64
}

impl PendingRpc {
    /// The RPC's id: unique among this endpoint's client RPCs, and what the
    /// server sees as [`Request::id`] (with this endpoint's address as
    /// [`Request::peer`]).
    pub fn id(&self) -> RpcId {
        self.id
    }

    /// Waits for the response.
    pub fn wait(mut self) -> Result<Message> {
        self.finished = true;
        self.shared.await_private(self.id, &self.slot, None)
    }

    /// Waits at most `timeout`; on expiry abandons the RPC and returns
    /// [`Error::Timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Message> {
        self.finished = true;
        let deadline = self.shared.now_ns() + dur_ns(timeout);
        self.shared
            .await_private(self.id, &self.slot, Some(deadline))
    }

    /// The response if it has arrived (after one non-blocking pass over the
    /// socket); `None` otherwise, and the RPC stays pending.
    pub fn try_wait(&mut self) -> Option<Result<Message>> {
        if self.finished {
            return Some(Err(Error::ResponseTaken));
        }
        if !self.slot.is_done() {
            self.shared.drive_once();
        }
        let r = self.slot.take()?;
        self.finished = true;
        Some(r.map(Message::new))
    }

    /// Whether the outcome is known (a `wait` would not block).
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn parts(&self) -> (&Arc<Shared>, &Arc<Slot<RpcResult>>) {
        (&self.shared, &self.slot)
    }
    #[cfg(feature = "tokio")]
    pub(crate) fn set_finished(&mut self) {
        self.finished = true;
    }
}

impl Drop for PendingRpc {
    fn drop(&mut self) {
        if !self.finished && !self.slot.is_done() {
            self.shared.cancel(self.id);
        }
        // SAFETY: taken once, here; the field is not used afterwards.
        recycle_slot(unsafe { std::mem::ManuallyDrop::take(&mut self.slot) });
    }
}

/// This thread's spare private-RPC slot, or a new one.
pub(crate) fn spare_slot() -> Arc<Slot<RpcResult>> {
    SPARE_SLOT
        .try_with(|c| c.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| Arc::new(Slot::new()))
}

/// Keeps a finished RPC's slot as the thread's spare if it is ours alone
/// (the driver lets go of its handle when it completes or cancels the RPC).
pub(crate) fn recycle_slot(mut slot: Arc<Slot<RpcResult>>) {
    if let Some(s) = Arc::get_mut(&mut slot) {
        *s = Slot::new();
        let _ = SPARE_SLOT.try_with(|c| c.set(Some(slot)));
    }
}

impl fmt::Debug for PendingRpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingRpc")
            .field("id", &self.id)
            .field("done", &self.is_done())
            .finish()
    }
}

impl Request {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.responder.rpc.peer
    }
    /// The RPC's id: the same [`RpcId`] the client got from
    /// [`PendingRpc::id`] or [`Endpoint::send_request_shared`]. Ids are
    /// chosen by the client endpoint, so on a server only the pair
    /// ([`Self::peer`], `id`) identifies an RPC.
    pub fn id(&self) -> RpcId {
        self.responder.id()
    }
    /// The request's bytes.
    pub fn message(&self) -> &Message {
        &self.message
    }
    /// Sends the response. The request's message is released first.
    pub fn reply(self, response: impl Into<Outgoing>) -> Result<()> {
        timetrace::record("reply");
        let (message, r) = self.into_parts();
        drop(message);
        r.reply(response)
    }
    /// Splits the request so that the message can be kept (or released)
    /// independently of answering it.
    pub fn into_parts(self) -> (Message, Responder) {
        (self.message, self.responder)
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("peer", &self.responder.rpc.peer)
            .field("id", &self.responder.rpc.id)
            .field("len", &self.message.len())
            .finish()
    }
}

impl Responder {
    /// The client's address.
    pub fn peer(&self) -> SocketAddr {
        self.rpc.peer
    }
    /// The RPC's id (see [`Request::id`]).
    pub fn id(&self) -> RpcId {
        RpcId(self.rpc.id)
    }
    /// Sends the response.
    pub fn reply(mut self, response: impl Into<Outgoing>) -> Result<()> {
        self.answered = true;
        self.shared.reply(self.rpc, response.into())
    }
}

impl Drop for Responder {
    /// Never answered: tell the engine so it frees the RPC now instead of
    /// keeping it until the client gives up.
    fn drop(&mut self) {
        if !self.answered && !self.shared.shut.load(Acquire) {
            let rpc = self.rpc;
            self.shared.with_driver(false, |d, _| d.engine.abandon(rpc));
        }
    }
}

impl Shared {
    pub(crate) fn responder(self: &Arc<Self>, rpc: ServerRpc) -> Responder {
        Responder {
            shared: self.clone(),
            rpc,
            answered: false,
        }
    }

    pub(crate) fn request(
        self: &Arc<Self>,
        (rpc, message): (ServerRpc, homa_proto::Message),
    ) -> Request {
        Request {
            responder: Responder {
                shared: self.clone(),
                rpc,
                answered: false,
            },
            message: Message::new(message),
        }
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Endpoint>();
    is::<PendingRpc>();
    is::<Request>();
    is::<Responder>();
}
