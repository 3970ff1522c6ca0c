//! The endpoint: the engine behind a mutex, driven by whichever thread needs
//! progress, plus one background thread for the moments when nobody does.
//!
//! Fast path (see docs/runtime.md): a thread waiting for a result busy-polls;
//! each round it tries the engine lock and, if it gets it, receives from the
//! socket, runs the engine and transmits, then checks its own result. A reply
//! found this way costs no thread handoff. After `poll` without a result the
//! thread sleeps and the background thread watches the socket for it (one
//! handoff). The background thread also runs the engine's timers.

use crate::config::EndpointConfig;
use crate::error::{Error, Result};
use crate::message::Message;
use crate::socket::{
    Faults, FlushOutcome, RecvOutcome, RxBatch, SocketOptions, SocketStats, TxQueue, UdpSocket,
    GSO_MAX_SEGMENTS,
};
use crate::sys::{monotonic_ns, ppoll, set_timer_slack_ns, EventFd};
use crate::timetrace;
use crate::wait::{Slot, WaitQueue, Waiter};
use homa_proto::driver::FastPath as _;
use homa_proto::{EndpointStats, Event, Metrics, Outgoing, RpcId, SendBuf, ServerRpc};
use parking_lot::Mutex;
use std::cell::Cell;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Receive rounds per drive: bounds how long one thread holds the engine.
const MAX_RX_ROUNDS: usize = 8;
/// While application threads are polling, the background thread still wakes
/// this often if a timer is pending (they run timers too, this is a backstop).
/// Kept long: every wake-up of an extra thread preempts a polling one on a
/// busy machine and shows up in the latency tail.
const BG_BACKSTOP_NS: u64 = 10_000_000;
/// The background thread never sleeps longer than this, so a protocol timer
/// (resend, timeout; hundreds of µs apart) set while it sleeps runs at most
/// this late without anyone ringing it.
const BG_MAX_SLEEP_NS: u64 = 2_000_000;
/// When no application thread has been inside the endpoint for this long,
/// the background thread watches the socket itself, so that the engine keeps
/// answering peers (grants, BUSY, acks) while the application is busy
/// elsewhere, as the kernel does for the Linux module.
const APP_IDLE_NS: u64 = 1_000_000;
/// Protocol timers (resend, keep-alive, tombstone and peer expiry; hundreds
/// of µs apart) may run this late. A drive that delivers a result or sends an
/// application's message leaves a due timer to the next idle pass (a busy
/// poller has one within µs), so that a timer tick, which can take several
/// µs, is not paid inside somebody's round trip. Pacing is not a timer: the
/// transmit step handles it on every pass.
const TIMER_DEFER_NS: u64 = 200_000;
/// Pacer deadlines closer than this (the NIC queue drains in µs) are worth a
/// doorbell ring when the background thread would sleep past them.
const URGENT_NS: u64 = 100_000;

type RpcResult = Result<homa_proto::Message>;

thread_local! {
    /// Set while this thread runs a [`Endpoint::serve`] handler inside a
    /// drive pass: that endpoint's engine lock is held by this very thread,
    /// so its calls into the same endpoint use the pass's driver instead of
    /// locking (which would deadlock).
    static INLINE: Cell<Option<Inline>> = const { Cell::new(None) };
}

thread_local! {
    /// A spare private-RPC slot: a thread that makes one call after another
    /// reuses it instead of allocating and freeing one per RPC.
    static SPARE_SLOT: Cell<Option<Arc<Slot<RpcResult>>>> = const { Cell::new(None) };
}

#[derive(Clone, Copy)]
struct Inline {
    shared: *const Shared,
    /// Null when the handler runs outside a pass (a request that another
    /// thread's pass queued): calls then lock as usual, but blocking waits
    /// are refused all the same, so a handler behaves alike either way.
    driver: *mut Driver,
    now: u64,
}

/// Puts back what [`INLINE`] held before when the handler returns or
/// unwinds.
struct InlineGuard(Option<Inline>);

impl InlineGuard {
    /// Marks this thread as running `shared`'s serve handler, inside the
    /// pass that holds `driver` (null: outside any pass).
    fn enter(shared: &Shared, driver: *mut Driver, now: u64) -> InlineGuard {
        InlineGuard(INLINE.with(|c| {
            c.replace(Some(Inline {
                shared,
                driver,
                now,
            }))
        }))
    }
}

impl Drop for InlineGuard {
    fn drop(&mut self) {
        INLINE.with(|c| c.set(self.0));
    }
}

/// A serving thread's handler, run on requests its own drive passes bring in.
pub(crate) struct Serving<'a> {
    shared: &'a Arc<Shared>,
    handler: &'a mut dyn FnMut(Request),
    /// Requests handled inline so far (the poll loop keeps polling while
    /// this grows).
    served: u64,
}

/// Where a client RPC's outcome goes.
enum Target {
    /// A private RPC: its own slot, awaited through its [`PendingRpc`].
    Private(Arc<Slot<RpcResult>>),
    /// A shared RPC: the endpoint's response queue ([`Endpoint::recv_response`]).
    Shared,
}

struct ClientRpc {
    peer: SocketAddr,
    target: Target,
}

/// Client RPCs in progress, indexed by the engine's slot for each id
/// (`client_rpc_index`): dense, reused, so a vector serves where a hash map
/// cost ~100 ns per response (a cache miss the time trace showed between
/// the response event and its slot).
#[derive(Default)]
struct ClientRpcs {
    slots: Vec<Option<(RpcId, ClientRpc)>>,
    len: usize,
}

impl ClientRpcs {
    fn insert(&mut self, engine: &homa_proto::Endpoint, id: RpcId, rpc: ClientRpc) {
        let slot = engine.client_rpc_index(id);
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, || None);
        }
        let old = self.slots[slot].replace((id, rpc));
        // The engine gives a slot to one live RPC at a time, and every RPC
        // leaves this table when the engine forgets it.
        debug_assert!(old.is_none(), "slot {slot} still held");
        self.len += old.is_none() as usize;
    }

    /// Removes RPC `id` if it is here.
    fn remove(&mut self, engine: &homa_proto::Endpoint, id: RpcId) -> Option<ClientRpc> {
        match self.slots.get_mut(engine.client_rpc_index(id)) {
            Some(entry) if entry.as_ref().is_some_and(|(i, _)| *i == id) => {
                self.len -= 1;
                entry.take().map(|(_, rpc)| rpc)
            }
            _ => None,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Ids of the RPCs to `peer`.
    fn ids_to(&self, peer: SocketAddr) -> Vec<RpcId> {
        self.slots
            .iter()
            .flatten()
            .filter(|(_, r)| r.peer == peer)
            .map(|(id, _)| *id)
            .collect()
    }

    fn drain(&mut self) -> Vec<(RpcId, ClientRpc)> {
        self.len = 0;
        self.slots.drain(..).flatten().collect()
    }
}

/// Threads polling the socket (low 32 bits) and, above them, how many
/// polling waits ended with their result: one atomic operation per wait
/// both leaves the poll and counts it.
#[derive(Default)]
struct Pollers(AtomicU64);

const POLLER: u64 = 1;
const FOUND: u64 = 1 << 32;

impl Pollers {
    fn enter(&self) {
        self.0.fetch_add(POLLER, SeqCst);
    }
    /// Returns how many polled before (this thread included).
    fn leave(&self, found: bool) -> usize {
        let prev = if found {
            self.0.fetch_add(FOUND - POLLER, SeqCst)
        } else {
            self.0.fetch_sub(POLLER, SeqCst)
        };
        (prev & (FOUND - 1)) as usize
    }
    fn count(&self) -> usize {
        (self.0.load(SeqCst) & (FOUND - 1)) as usize
    }
    fn found(&self) -> u64 {
        self.0.load(Relaxed) >> 32
    }
    /// Counts a wait that found its result without polling at all.
    fn found_at_once(&self) {
        self.0.fetch_add(FOUND, Relaxed);
    }
}

/// Everything touched under the engine lock.
struct Driver {
    engine: homa_proto::Endpoint,
    rx: RxBatch,
    tx: TxQueue,
    rpcs: ClientRpcs,
    faults: Option<Faults>,
    stats: SocketStats,
    errors: Vec<(SocketAddr, i32)>,
    /// Waiters to wake once the lock is released.
    wakes: Vec<Waiter>,
    /// Requests handed to a serve handler inside a drive pass (counted in
    /// `RuntimeStats::found_polling`).
    served_inline: u64,
    /// The current drive is the watcher's own (it reads the new deadline
    /// itself; nobody needs to ring it).
    watcher_driving: bool,
    last_now: u64,
}

/// State shared by the endpoint's handles, its RPC handles and its
/// background thread.
///
/// Aligned to 128 bytes (two cache lines, which the adjacent-line prefetcher
/// moves together) so that no other allocation shares its lines: the lock
/// word is written on every poll round. A precaution, not a measured gain:
/// with time traces on, a change that only moved the fields looked ~160 ns
/// slower per round trip until this alignment, but the plain p50 showed no
/// difference either way (the traces' own buffers make traced runs
/// layout-sensitive; docs/performance.md).
#[repr(align(128))]
pub(crate) struct Shared {
    sock: UdpSocket,
    cfg: EndpointConfig,
    max_message: usize,
    unsched_bytes: usize,
    /// Payload bytes per packet: the segment size of fitting send buffers.
    segment: usize,
    link_bps: u64,
    /// `monotonic_ns()` when the endpoint opened: engine time is relative to it.
    base_ns: u64,
    poll_ns: u64,
    driver: Mutex<Driver>,
    doorbell: EventFd,
    /// Threads in the polling phase of a wait (they drive the engine).
    pollers: Pollers,
    /// Threads and tasks sleeping until a result arrives.
    blocked: AtomicUsize,
    /// The background thread currently has the socket in its poll set.
    bg_watching: AtomicBool,
    /// A blocked application thread sleeps on the socket itself (the
    /// "watcher"); it drives the engine when packets arrive.
    watcher: AtomicBool,
    /// Wakes the watcher when its result arrives by another path, or when
    /// another thread set an engine deadline earlier than its sleep.
    watcher_bell: Arc<EventFd>,
    /// When the watcher will wake on its own (0 while it is awake).
    watcher_sleep_until: AtomicU64,
    /// When the background thread will wake on its own (u64::MAX: never,
    /// 0: it is awake).
    bg_sleep_until: AtomicU64,
    /// The engine's next timer as of the last drive, plus `coalesce_ns`
    /// (u64::MAX: none). Everyone who waits for the engine's timers uses
    /// this value.
    next_deadline: AtomicU64,
    /// How late a timer may be run so that pacing releases a batch of
    /// packets per system call and per wake-up instead of one: half the
    /// engine's NIC-queue allowance (the queue never runs dry).
    coalesce_ns: u64,
    /// Client RPCs in progress.
    inflight: AtomicUsize,
    /// When an application thread last polled or called into the endpoint.
    last_app: AtomicU64,
    /// Packets the socket could not take yet.
    tx_pending: AtomicBool,
    /// Until this time the socket needs watching even with no waiter (a long
    /// response is being sent and its grants must be heard).
    attention_until: AtomicU64,
    shut: AtomicBool,
    pub(crate) requests: WaitQueue<(ServerRpc, homa_proto::Message)>,
    pub(crate) responses: WaitQueue<Response>,
    counters: Counters,
}

/// Counters of the waiting machinery (relaxed atomics; for reports).
#[derive(Default)]
struct Counters {
    slept: AtomicU64,
    rings: AtomicU64,
    bg_drives: AtomicU64,
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
    pub id: RpcId,
    pub peer: SocketAddr,
    pub result: Result<Message>,
}

impl Endpoint {
    /// Opens an endpoint on `addr` with the default configuration. Port 0
    /// picks a free port; `[::]` serves IPv4 and IPv6.
    pub fn bind(addr: impl ToSocketAddrs) -> Result<Endpoint> {
        Self::bind_with(addr, EndpointConfig::default())
    }

    /// Opens an endpoint on `addr` with `cfg`.
    pub fn bind_with(addr: impl ToSocketAddrs, cfg: EndpointConfig) -> Result<Endpoint> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::InvalidArgument("no address to bind".into()))?;
        cfg.validate().map_err(Error::InvalidArgument)?;
        let engine_cfg = cfg.engine_config(addr.is_ipv6());
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
            },
        )?;
        let base_ns = monotonic_ns();
        let engine = homa_proto::Endpoint::new(engine_cfg.clone(), 0)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
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
            cfg,
            base_ns,
            driver: Mutex::new(driver),
            doorbell: EventFd::new()?,
            pollers: Pollers::default(),
            blocked: AtomicUsize::new(0),
            bg_watching: AtomicBool::new(false),
            watcher: AtomicBool::new(false),
            watcher_bell: Arc::new(EventFd::new()?),
            watcher_sleep_until: AtomicU64::new(0),
            bg_sleep_until: AtomicU64::new(0),
            next_deadline: AtomicU64::new(u64::MAX),
            coalesce_ns: (engine_cfg.effective_max_nic_queue_ns() / 2).min(50_000),
            inflight: AtomicUsize::new(0),
            last_app: AtomicU64::new(0),
            tx_pending: AtomicBool::new(false),
            attention_until: AtomicU64::new(0),
            shut: AtomicBool::new(false),
            requests: WaitQueue::new(),
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

    fn shared(&self) -> &Arc<Shared> {
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
    /// [`Error::InvalidArgument`]; starting RPCs and replying work.
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
                    let _guard = InlineGuard::enter(shared, std::ptr::null_mut(), 0);
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
            found_polling: self.shared().pollers.found()
                + self.shared().locked(|d| d.served_inline),
            slept: c.slept.load(Relaxed),
            doorbell_rings: c.rings.load(Relaxed),
            background_drives: c.bg_drives.load(Relaxed),
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

fn dur_ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128 / 2) as u64
}

impl PendingRpc {
    /// The RPC's id.
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
            return Some(Err(Error::InvalidArgument("response already taken".into())));
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
fn spare_slot() -> Arc<Slot<RpcResult>> {
    SPARE_SLOT
        .try_with(|c| c.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| Arc::new(Slot::new()))
}

/// Keeps a finished RPC's slot as the thread's spare if it is ours alone
/// (the driver lets go of its handle when it completes or cancels the RPC).
fn recycle_slot(mut slot: Arc<Slot<RpcResult>>) {
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
    /// The client's id for this RPC (unique per client endpoint).
    pub fn id(&self) -> u64 {
        self.responder.rpc.id
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

/// The error of a blocking wait on an endpoint from inside its own serve
/// handler, which would wait for the handler itself.
fn wait_in_handler() -> Error {
    Error::InvalidArgument(
        "cannot wait on an endpoint inside its own serve handler (the handler holds \
         its engine; move the work to another thread)"
            .into(),
    )
}

/// Leaves the polling phase of a wait when dropped (only on unwinding; the
/// wait leaves it explicitly otherwise).
struct PollerGuard<'a>(&'a Shared);

impl Drop for PollerGuard<'_> {
    fn drop(&mut self) {
        self.0.leave_polling(self.0.now_ns(), false);
    }
}

/// Unlocks the driver, then wakes whoever the pass found a result for
/// (after unlocking, so that the woken thread does not collide with the
/// lock). Most passes wake nobody: then it is only the unlock.
fn release(mut d: parking_lot::MutexGuard<'_, Driver>) {
    if d.wakes.is_empty() {
        return;
    }
    let wakes = std::mem::take(&mut d.wakes);
    drop(d);
    for w in wakes {
        w.wake();
    }
}

impl Shared {
    pub(crate) fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.base_ns)
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

    fn check_peer(&self, peer: &SocketAddr) -> Result<()> {
        if peer.port() == 0 || peer.ip().is_unspecified() || peer.ip().is_multicast() {
            return Err(Error::InvalidArgument(format!(
                "{peer} is not a unicast peer address"
            )));
        }
        if !self.sock.can_reach(peer) {
            return Err(Error::InvalidArgument(format!(
                "{peer} is not reachable from a socket bound to {}",
                self.sock.local_addr()
            )));
        }
        Ok(())
    }

    /// Runs `f` under the engine lock, then lets the engine transmit (and,
    /// with `recv`, receive first), then wakes whoever got a result.
    fn with_driver<R>(&self, recv: bool, f: impl FnOnce(&mut Driver, u64) -> R) -> R {
        if let Some((d, now)) = self.inline_driver() {
            // Inside this endpoint's serve handler: the pass that runs the
            // handler transmits and wakes afterwards.
            return f(d, now);
        }
        let mut d = self.driver.lock();
        let now = self.clock(&mut d);
        self.last_app.store(now, Relaxed);
        let r = f(&mut d, now);
        self.drive(&mut d, now, recv);
        release(d);
        r
    }

    /// The driver of the drive pass running on this thread, if it is
    /// running this endpoint's serve handler.
    #[allow(clippy::mut_from_ref)]
    fn inline_driver(&self) -> Option<(&mut Driver, u64)> {
        let i = INLINE.with(|c| c.get())?;
        if !std::ptr::eq(i.shared, self) || i.driver.is_null() {
            return None;
        }
        // SAFETY: `dispatch_serving` set this pointer from the `&mut Driver` of
        // the pass that is calling the handler on this thread, does not use
        // that reference until the handler returns, and clears the pointer
        // then. The pass holds the engine lock throughout.
        Some((unsafe { &mut *i.driver }, i.now))
    }

    /// Whether this thread is inside this endpoint's serve handler, where
    /// waiting on the endpoint would wait for the handler itself.
    fn in_handler(&self) -> bool {
        INLINE
            .with(|c| c.get())
            .is_some_and(|i| std::ptr::eq(i.shared, self))
    }

    /// Refuses a blocking wait from inside this endpoint's serve handler.
    fn check_may_wait(&self) -> Result<()> {
        if self.in_handler() {
            return Err(wait_in_handler());
        }
        Ok(())
    }

    /// Runs `f` on the driver without a drive pass (counters, shutdown).
    fn locked<R>(&self, f: impl FnOnce(&mut Driver) -> R) -> R {
        if let Some((d, _)) = self.inline_driver() {
            return f(d);
        }
        let mut d = self.driver.lock();
        let r = f(&mut d);
        release(d);
        r
    }

    /// Monotonic engine time, never behind what the engine has seen.
    fn clock(&self, d: &mut Driver) -> u64 {
        let now = self.now_ns().max(d.last_now);
        d.last_now = now;
        now
    }

    /// One non-blocking pass if nobody else is driving right now; returns
    /// the engine time used, if it ran.
    pub(crate) fn drive_once(&self) -> Option<u64> {
        self.drive_once_serving(None)
    }

    /// [`Self::drive_once`] that hands requests to `serving`'s handler.
    fn drive_once_serving(&self, serving: Option<&mut Serving>) -> Option<u64> {
        let mut d = self.driver.try_lock()?;
        let now = self.clock(&mut d);
        self.drive_serving(&mut d, now, true, serving);
        release(d);
        Some(now)
    }

    fn start(&self, peer: SocketAddr, request: Outgoing, target: Target) -> Result<RpcId> {
        if self.shut.load(Acquire) {
            return Err(Error::Shutdown);
        }
        self.check_peer(&peer)?;
        if request.len() > self.max_message {
            return Err(Error::MessageTooLong {
                len: request.len(),
                max: self.max_message,
            });
        }
        let len = request.len();
        let id = self.with_driver(false, |d, now| {
            let id = d
                .engine
                .send_request(now, peer, request)
                .map_err(Error::from_send)?;
            timetrace::record("engine send_request done");
            d.rpcs.insert(&d.engine, id, ClientRpc { peer, target });
            Ok::<_, Error>(id)
        })?;
        if len > self.unsched_bytes {
            self.need_attention(len);
        }
        Ok(id)
    }

    /// [`Endpoint::call`]: a private RPC waited for at once, without a
    /// [`PendingRpc`] (and its handle on the endpoint) in between.
    fn call(
        &self,
        peer: SocketAddr,
        request: Outgoing,
        timeout: Option<Duration>,
    ) -> Result<Message> {
        timetrace::record("send_request");
        let slot = spare_slot();
        let id = self.start(peer, request, Target::Private(slot.clone()))?;
        let deadline = timeout.map(|t| self.now_ns() + dur_ns(t));
        let out = self.await_private(id, &slot, deadline);
        recycle_slot(slot);
        out
    }

    /// Waits for private RPC `id`'s outcome in `slot` until `deadline`
    /// (engine time). On a timeout, on shutdown, or when waiting is refused
    /// (inside this endpoint's serve handler), the RPC is abandoned.
    fn await_private(
        &self,
        id: RpcId,
        slot: &Slot<RpcResult>,
        deadline: Option<u64>,
    ) -> Result<Message> {
        let r = if slot.is_done() {
            self.pollers.found_at_once();
            slot.take()
        } else {
            if let Err(e) = self.check_may_wait() {
                self.cancel(id);
                return Err(e);
            }
            self.wait_slot(slot, deadline)
        };
        match r {
            Some(r) => {
                timetrace::record("response returned");
                r.map(Message::new)
            }
            None => {
                // Unless its outcome came in meanwhile.
                if !slot.is_done() {
                    self.cancel(id);
                }
                Err(if self.shut.load(Acquire) {
                    Error::Shutdown
                } else {
                    Error::Timeout
                })
            }
        }
    }

    fn reply(&self, rpc: ServerRpc, response: Outgoing) -> Result<()> {
        if self.shut.load(Acquire) {
            return Err(Error::Shutdown);
        }
        if response.len() > self.max_message {
            return Err(Error::MessageTooLong {
                len: response.len(),
                max: self.max_message,
            });
        }
        let len = response.len();
        self.with_driver(false, |d, now| {
            let r = d.engine.send_response(now, rpc, response);
            timetrace::record("engine send_response done");
            r
        })
        .map_err(Error::from_send)?;
        if len > self.unsched_bytes {
            self.need_attention(len);
        }
        Ok(())
    }

    /// A long message is going out: its grants must be heard even if no
    /// thread waits on this endpoint, so keep the background thread watching
    /// for a while (several times its wire time, at least a few ms).
    fn need_attention(&self, len: usize) {
        let wire = (len as u128 * 8_000_000_000 / self.link_bps.max(1) as u128) as u64;
        let until = self.now_ns() + 4 * wire + 5_000_000;
        self.attention_until.fetch_max(until, SeqCst);
        if self.pollers.count() == 0 && !self.bg_watching.load(SeqCst) {
            self.ring();
        }
    }

    fn cancel(&self, id: RpcId) {
        self.with_driver(false, |d, _| {
            if d.rpcs.remove(&d.engine, id).is_some() {
                d.engine.cancel(id);
            }
        });
    }

    /// Receive, timers, events, transmit: one round of progress.
    fn drive(&self, d: &mut Driver, now: u64, recv: bool) {
        self.drive_serving(d, now, recv, None)
    }

    /// [`Self::drive`]; requests go to `serving`'s handler, if given, before
    /// the pass transmits (so their replies leave in this pass).
    fn drive_serving(&self, d: &mut Driver, now: u64, recv: bool, serving: Option<&mut Serving>) {
        let mut got = false;
        if recv {
            got = self.receive(d, now);
            // A poll that found nothing, with no timer due and nothing queued,
            // changed nothing: skip the rest (this is the busy-poll loop).
            if !got
                && d.tx.pending() == 0
                && d.errors.is_empty()
                && self.next_deadline.load(Relaxed) > now
            {
                // An idle moment: do what the engine put off.
                d.engine.run_deferred(now);
                return;
            }
        }
        // `recv` false: an application call (send or reply); `got`: this
        // pass delivers packets. Either way someone waits on this pass.
        let busy = !recv || got;
        if d.engine
            .poll_timeout()
            .is_some_and(|t| t <= now && (!busy || t.saturating_add(TIMER_DEFER_NS) <= now))
        {
            d.engine.handle_timeout(now);
        }
        match serving {
            Some(s) => self.dispatch_serving(d, now, s),
            None => self.dispatch_events(d),
        }
        timetrace::record("events dispatched");
        self.transmit(d, now);
        // After an application's send or reply has gone out: what the
        // engine put off to keep it off the request-to-reply path
        // (acknowledgements piggybacked on requests).
        if !recv {
            d.engine.run_deferred(now);
        }
        // Sending may have failed fast (unreachable): deliver those too.
        if !d.errors.is_empty() {
            self.handle_errors(d);
        }
        self.publish(d, now);
        timetrace::record("drive done");
    }

    /// Receives what is waiting; returns whether anything arrived.
    fn receive(&self, d: &mut Driver, now: u64) -> bool {
        let Driver {
            engine,
            rx,
            stats,
            faults,
            errors,
            ..
        } = d;
        let mut got = false;
        for _ in 0..MAX_RX_ROUNDS {
            let out = rx.recv(&self.sock, stats, |src, data, seg| match faults.as_mut() {
                // Loss is injected per packet.
                Some(f) => {
                    for pkt in data.chunks(seg.max(1)) {
                        if !f.drop_rx() {
                            engine.handle_datagram(now, src, pkt);
                        }
                    }
                    if data.is_empty() && !f.drop_rx() {
                        engine.handle_datagram(now, src, data);
                    }
                }
                None => engine.handle_datagrams(now, src, data, seg),
            });
            match out {
                RecvOutcome::Received(true) => got = true,
                RecvOutcome::Received(false) => {
                    got = true;
                    break;
                }
                RecvOutcome::Empty => break,
                RecvOutcome::Error => {
                    // A pending socket error (ICMP): read the error queue,
                    // then keep receiving.
                    if self.sock.read_errors(errors, stats) == 0 {
                        break;
                    }
                }
            }
        }
        if got {
            timetrace::record("engine rx done");
        }
        if let Some(f) = faults.as_mut() {
            stats.injected_rx_drops = f.rx_drops;
        }
        if !d.errors.is_empty() {
            self.handle_errors(d);
            got = true;
        }
        got
    }

    /// Fails client RPCs whose peer the network declared unreachable.
    fn handle_errors(&self, d: &mut Driver) {
        let errors = std::mem::take(&mut d.errors);
        if !self.cfg.fail_on_unreachable {
            return;
        }
        for (peer, errno) in errors {
            let fatal = matches!(
                errno,
                libc::ECONNREFUSED
                    | libc::EHOSTUNREACH
                    | libc::ENETUNREACH
                    | libc::EHOSTDOWN
                    | libc::EACCES
                    | libc::EPERM
                    | libc::EADDRNOTAVAIL
                    | libc::EAFNOSUPPORT
            );
            if !fatal {
                continue;
            }
            for id in d.rpcs.ids_to(peer) {
                d.engine.cancel(id);
                if let Some(rpc) = d.rpcs.remove(&d.engine, id) {
                    self.complete(d, id, rpc, Err(Error::PeerUnreachable(peer)));
                }
            }
        }
    }

    fn complete(&self, d: &mut Driver, id: RpcId, rpc: ClientRpc, result: RpcResult) {
        let w = match rpc.target {
            Target::Private(slot) => slot.complete(result),
            Target::Shared => self.responses.push(Response {
                id,
                peer: rpc.peer,
                result: result.map(Message::new),
            }),
        };
        if let Some(w) = w {
            d.wakes.push(w);
        }
    }

    fn dispatch_events(&self, d: &mut Driver) {
        while let Some(ev) = d.engine.poll_event() {
            self.dispatch(d, ev);
        }
    }

    fn dispatch(&self, d: &mut Driver, ev: Event) {
        match ev {
            Event::Request { rpc, message } => {
                if let Some(w) = self.requests.push((rpc, message)) {
                    d.wakes.push(w);
                }
            }
            Event::Response { id, message } => {
                // Unknown ids were abandoned by the application: the
                // message is dropped here and its pool space returns.
                if let Some(rpc) = d.rpcs.remove(&d.engine, id) {
                    self.complete(d, id, rpc, Ok(message));
                }
            }
            Event::Failed { id, error } => {
                if let Some(rpc) = d.rpcs.remove(&d.engine, id) {
                    let e = Error::from_rpc(error, self.max_message);
                    self.complete(d, id, rpc, Err(e));
                }
            }
        }
    }

    /// [`Self::dispatch_events`] on a serving thread's own pass: each request
    /// goes straight to the handler, on this thread, under the engine lock.
    /// No queue, no second lock, no second pass: a reply given inside the
    /// handler is in the engine before this pass transmits.
    fn dispatch_serving(&self, d: &mut Driver, now: u64, s: &mut Serving) {
        while let Some(ev) = d.engine.poll_event() {
            match ev {
                Event::Request { rpc, message } => {
                    if self.shut.load(Acquire) {
                        // Nobody will answer: release its pool space.
                        continue;
                    }
                    let req = s.shared.request((rpc, message));
                    timetrace::record("inline request");
                    let _guard = InlineGuard::enter(self, d, now);
                    (s.handler)(req);
                    s.served += 1;
                    // Under the lock: a plain add, not an atomic one.
                    d.served_inline += 1;
                }
                ev => self.dispatch(d, ev),
            }
        }
    }

    fn transmit(&self, d: &mut Driver, mut now: u64) {
        let Driver {
            engine,
            tx,
            stats,
            faults,
            errors,
            last_now,
            ..
        } = d;
        if tx.pending() > 0 && tx.flush(&self.sock, stats, errors) == FlushOutcome::WouldBlock {
            self.tx_pending.store(true, SeqCst);
            return;
        }
        loop {
            if tx.is_full() {
                if tx.flush(&self.sock, stats, errors) == FlushOutcome::WouldBlock {
                    self.tx_pending.store(true, SeqCst);
                    return;
                }
                // Handing a full queue to the kernel took real time (tens of
                // µs for 128 packets): the pacer must see it, or it counts
                // the whole pass's packets as sent at one instant and stops
                // early (500 KB: 44.8-45.7 Gbit/s with the pass's start
                // time, as with a 3x larger NIC-queue allowance when it
                // was given that instead).
                now = now.max(self.now_ns());
                *last_now = now;
            }
            // Nothing more to send (the usual answer after a receive, and
            // after the last packet of a send): skip the set-up.
            if !engine.may_transmit() {
                break;
            }
            // A run of packets of one message at a time: one SRPT decision
            // and one payload handle per GSO send instead of per packet.
            let room = tx.room().min(GSO_MAX_SEGMENTS);
            let buf = tx.next_buf();
            let Some(burst) = engine.poll_transmit_burst(now, room, buf) else {
                break;
            };
            let tos = self.cfg.tos(burst.priority);
            // One packet, whole in its buffer, and nothing after it: out at
            // once (a short RPC's request or reply; a grant).
            if faults.is_none()
                && burst.count == 1
                && burst.payload.is_empty()
                && burst.pad == 0
                && !engine.may_transmit()
                && tx.send_whole_now(
                    &self.sock,
                    &burst.dest,
                    tos,
                    burst.header_len,
                    stats,
                    errors,
                )
            {
                break;
            }
            match faults.as_mut() {
                Some(f) => tx.commit_burst(burst, tos, |_| {
                    let drop = f.drop_tx();
                    stats.injected_tx_drops += drop as u64;
                    !drop
                }),
                None => tx.commit_burst(burst, tos, |_| true),
            }
        }
        let blocked =
            tx.pending() > 0 && tx.flush(&self.sock, stats, errors) == FlushOutcome::WouldBlock;
        // Written only under the engine lock: skip the fenced store when
        // nothing changed (the usual case, on every pass).
        if self.tx_pending.load(Relaxed) != blocked {
            self.tx_pending.store(blocked, SeqCst);
        }
    }

    /// Publishes what the background thread needs to decide how to sleep,
    /// and rings it if a timer is due well before it would wake. Ordinary
    /// protocol timers do not ring (the background thread wakes every
    /// `BG_MAX_SLEEP_NS` anyway), so the fast path makes no extra syscall.
    fn publish(&self, d: &mut Driver, now: u64) {
        let next = d
            .engine
            .poll_timeout()
            .map_or(u64::MAX, |t| t.saturating_add(self.coalesce_ns));
        // Both are written only under the engine lock, so a relaxed read
        // tells whether the (fenced) store is needed; usually it is not.
        if self.next_deadline.load(Relaxed) != next {
            self.next_deadline.store(next, SeqCst);
        }
        // Release, not SeqCst (an `xchg`, twice per RPC on a client): only
        // the background thread reads it, on waking, to decide whether to
        // watch an idle endpoint; no store-then-load handshake depends on it.
        if self.inflight.load(Relaxed) != d.rpcs.len() {
            self.inflight.store(d.rpcs.len(), Release);
        }
        // Whoever runs timers must hear of an earlier deadline: pollers check
        // it every round; the watcher and the background thread sleep.
        if self.pollers.count() > 0 {
            return;
        }
        // Only the pacer is urgent. A protocol timer (the engine's tick)
        // rings only if the sleeper would wake more than BG_MAX_SLEEP_NS
        // after it: ringing for every tick that came within URGENT_NS cost
        // one eventfd write in ~one of ten client sends (the caller of a
        // send is not yet polling when its pass publishes), and woke the
        // background thread, which under the ordinary scheduler preempted
        // a polling thread: 100-byte echo p99 ~20 µs without `chrt`.
        let urgent = d
            .engine
            .pacer_deadline()
            .is_some_and(|p| p < now.saturating_add(URGENT_NS));
        let worth =
            |sleep: u64| next < sleep && (urgent || sleep > next.saturating_add(BG_MAX_SLEEP_NS));
        if self.watcher.load(SeqCst) {
            if !d.watcher_driving && worth(self.watcher_sleep_until.load(SeqCst)) {
                self.watcher_bell.ring();
            }
            return;
        }
        if worth(self.bg_sleep_until.load(SeqCst)) {
            self.ring();
        }
    }

    fn ring(&self) {
        self.counters.rings.fetch_add(1, Relaxed);
        self.doorbell.ring();
    }

    /// Whether a thread that stops polling or watching must hand the socket
    /// to the background thread at once: someone sleeps on a result, packets
    /// wait for room, or a long message is going out. (Client RPCs merely in
    /// flight can wait for the idle take-over, `APP_IDLE_NS`.)
    fn needs_watch_now(&self) -> bool {
        self.blocked.load(SeqCst) > 0 || self.tx_pending.load(SeqCst) || self.attention_pending()
    }

    /// Whether a long message still needs its grants heard (see
    /// [`Self::need_attention`]); reads the clock only if one was sent.
    fn attention_pending(&self) -> bool {
        let until = self.attention_until.load(SeqCst);
        until != 0 && until > self.now_ns()
    }

    /// Whether the socket needs someone's attention when no thread polls.
    fn needs_watch(&self) -> bool {
        self.blocked.load(SeqCst) > 0
            || self.inflight.load(SeqCst) > 0
            || self.tx_pending.load(SeqCst)
            || self.attention_pending()
    }

    /// Called when a thread stops polling: if it was the last and work
    /// remains, make sure the background thread is watching.
    /// `found`: the wait ended with its result (counted in
    /// `RuntimeStats::found_polling`).
    fn leave_polling(&self, now: u64, found: bool) {
        self.last_app.store(now, Relaxed);
        if self.pollers.leave(found) == 1
            && self.needs_watch_now()
            && !self.watcher.load(SeqCst)
            && !self.bg_watching.load(SeqCst)
        {
            self.ring();
        }
    }

    /// Called when a task (or a thread that could not become the watcher)
    /// is about to sleep: someone must be watching the socket for it.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn enter_blocked(&self) {
        self.blocked.fetch_add(1, SeqCst);
        if !self.watcher.load(SeqCst) && !self.bg_watching.load(SeqCst) {
            self.ring();
        }
    }

    /// Gives up the watcher role; if others still wait, the background
    /// thread takes over the socket.
    fn release_watcher(&self) {
        self.watcher.store(false, SeqCst);
        if self.pollers.count() == 0 && self.needs_watch_now() && !self.bg_watching.load(SeqCst) {
            self.ring();
        }
    }

    /// The watcher's sleep: on the socket and its own doorbell, then drive
    /// the engine if packets (or room to send) arrived.
    fn watch_socket(&self, timeout: Option<Duration>) {
        let tx = self.tx_pending.load(SeqCst);
        // Wake for the engine's next timer too: while a thread watches, the
        // background thread does not have to.
        let now = self.now_ns();
        let next = self.next_deadline.load(SeqCst);
        let until_timer = Duration::from_nanos(next.saturating_sub(now));
        let timeout = timeout.map_or(until_timer, |t| t.min(until_timer));
        self.watcher_sleep_until
            .store(now.saturating_add(timeout.as_nanos() as u64), SeqCst);
        // A deadline published between reading it and storing our sleep.
        let timeout = Some(timeout.min(Duration::from_nanos(
            self.next_deadline.load(SeqCst).saturating_sub(now),
        )));
        let mut fds = [
            libc::pollfd {
                fd: self.watcher_bell.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.sock.fd(),
                events: libc::POLLIN | if tx { libc::POLLOUT } else { 0 },
                revents: 0,
            },
        ];
        let _ = ppoll(&mut fds, timeout);
        self.watcher_sleep_until.store(0, SeqCst);
        if fds[0].revents != 0 {
            self.watcher_bell.drain();
        }
        if fds[1].revents != 0 || self.next_deadline.load(SeqCst) <= self.now_ns() {
            let mut d = self.driver.lock();
            let now = self.clock(&mut d);
            d.watcher_driving = true;
            self.drive(&mut d, now, true);
            d.watcher_driving = false;
            release(d);
        }
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn leave_blocked(&self) {
        self.blocked.fetch_sub(1, SeqCst);
    }

    /// The waiting strategy shared by every blocking call: check, busy-poll
    /// (driving the engine ourselves) for `poll`, then sleep until woken.
    /// Returns `None` at the deadline or on shutdown.
    fn wait_with<T>(
        &self,
        deadline: Option<u64>,
        mut serving: Option<&mut Serving>,
        mut check: impl FnMut() -> Option<T>,
        mut register: impl FnMut(Waiter) -> Option<Option<u64>>,
        mut deregister: impl FnMut(Option<u64>),
    ) -> Option<T> {
        if let Some(v) = check() {
            self.pollers.found_at_once();
            return Some(v);
        }
        self.pollers.enter();
        // A serve handler that panics unwinds out of this loop: stop counting
        // as a poller then too, or the background thread would never take
        // the socket over when the endpoint goes idle.
        let unwinding = PollerGuard(self);
        // The polling phase ends `poll_ns` after the first pass (whose
        // engine time serves as the start: no extra clock read).
        let mut poll_end = None;
        let mut now;
        let mut served = serving.as_ref().map_or(0, |s| s.served);
        let found = loop {
            now = self
                .drive_once_serving(serving.as_deref_mut())
                .unwrap_or_else(|| self.now_ns());
            if let Some(v) = check() {
                break Some(v);
            }
            if self.shut.load(Acquire) {
                break None;
            }
            // A serving thread that just handled requests inline polls on
            // for another `poll_ns`.
            if let Some(s) = serving.as_ref() {
                if s.served != served {
                    served = s.served;
                    poll_end = None;
                }
            }
            match poll_end {
                None => {
                    let end = now + self.poll_ns;
                    poll_end = Some(deadline.map_or(end, |d| d.min(end)));
                }
                Some(end) if now >= end => break None,
                Some(_) => {}
            }
            std::hint::spin_loop();
        };
        if found.is_some() || self.shut.load(Acquire) {
            timetrace::record("poller found result");
            std::mem::forget(unwinding);
            self.leave_polling(now, found.is_some());
            return found;
        }
        self.counters.slept.fetch_add(1, Relaxed);
        // Sleep. The first sleeper becomes the watcher and sleeps on the
        // socket itself, so its result costs no thread handoff; the others
        // park and are woken by whoever drives the engine. The role is taken
        // before we stop counting as a poller, so that nobody wakes the
        // background thread in between.
        self.blocked.fetch_add(1, SeqCst);
        let mut watching = !self.watcher.load(SeqCst) && !self.watcher.swap(true, SeqCst);
        std::mem::forget(unwinding);
        self.leave_polling(now, false);
        let r = loop {
            if let Some(v) = check() {
                break Some(v);
            }
            if self.shut.load(Acquire) {
                break check();
            }
            let now = self.now_ns();
            if deadline.is_some_and(|d| now >= d) {
                break None;
            }
            if !watching {
                watching = !self.watcher.load(SeqCst) && !self.watcher.swap(true, SeqCst);
                if !watching && !self.watcher.load(SeqCst) && !self.bg_watching.load(SeqCst) {
                    // The watcher just left: make sure the socket is watched.
                    self.ring();
                }
            }
            let waiter = if watching {
                Waiter::Fd(self.watcher_bell.clone())
            } else {
                Waiter::current_thread()
            };
            let Some(token) = register(waiter) else {
                continue;
            };
            // Re-check after registering: a result published in between
            // would otherwise wait for the next wake-up.
            if let Some(v) = check() {
                deregister(token);
                break Some(v);
            }
            let left = deadline.map(|d| Duration::from_nanos(d.saturating_sub(now)));
            if watching {
                let cap = Duration::from_nanos(BG_MAX_SLEEP_NS);
                self.watch_socket(Some(left.map_or(cap, |l| l.min(cap))));
            } else {
                match left {
                    Some(l) => std::thread::park_timeout(l),
                    None => std::thread::park(),
                }
            }
            deregister(token);
        };
        self.blocked.fetch_sub(1, SeqCst);
        if watching {
            self.release_watcher();
        }
        r
    }

    fn wait_slot(&self, slot: &Slot<RpcResult>, deadline: Option<u64>) -> Option<RpcResult> {
        self.wait_with(
            deadline,
            None,
            || slot.take(),
            |w| {
                if slot.register(w) {
                    Some(None)
                } else {
                    None
                }
            },
            |_| {},
        )
    }

    fn wait_queue<T>(&self, q: &WaitQueue<T>, deadline: Option<u64>) -> Result<Option<T>> {
        self.wait_queue_serving(q, deadline, None)
    }

    fn wait_queue_serving<T>(
        &self,
        q: &WaitQueue<T>,
        deadline: Option<u64>,
        serving: Option<&mut Serving>,
    ) -> Result<Option<T>> {
        if self.shut.load(Acquire) {
            return Err(Error::Shutdown);
        }
        if self.in_handler() {
            // Only what is already queued: waiting would wait for ourselves.
            if let Some(v) = q.try_pop() {
                return Ok(Some(v));
            }
            if deadline.is_some_and(|d| d <= self.now_ns()) {
                return Ok(None);
            }
            return Err(wait_in_handler());
        }
        let r = self.wait_with(
            deadline,
            serving,
            || q.try_pop(),
            |w| q.register(w).map(Some),
            |t| {
                if let Some(t) = t {
                    q.deregister(t)
                }
            },
        );
        match r {
            Some(v) => Ok(Some(v)),
            None if self.shut.load(Acquire) => Err(Error::Shutdown),
            None => Ok(None),
        }
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn is_shut(&self) -> bool {
        self.shut.load(Acquire)
    }

    pub(crate) fn shutdown(&self) {
        if self.shut.swap(true, SeqCst) {
            return;
        }
        self.locked(|d| {
            d.engine.shutdown();
            self.dispatch_events(d);
            let left = d.rpcs.drain();
            for (id, rpc) in left {
                self.complete(d, id, rpc, Err(Error::Shutdown));
            }
            let now = self.clock(d);
            self.transmit(d, now);
            self.inflight.store(0, SeqCst);
        });
        // Requests nobody will answer: release their pool space.
        drop(self.requests.drain());
        self.requests.wake_all();
        self.responses.wake_all();
        self.watcher_bell.ring();
        self.ring();
    }

    /// The background thread: sleeps until the next timer, a doorbell ring or
    /// (when nobody polls and someone waits) socket activity, then drives.
    fn background(self: Arc<Self>) {
        set_timer_slack_ns(1_000);
        while !self.shut.load(Acquire) {
            // Decide whether to watch the socket; publish, then re-check so a
            // thread that stopped polling meanwhile is not missed.
            let app_idle_at = self.last_app.load(Relaxed).saturating_add(APP_IDLE_NS);
            let wanted = || {
                self.pollers.count() == 0
                    && !self.watcher.load(SeqCst)
                    && (self.needs_watch() || self.now_ns() >= app_idle_at)
            };
            let watch = loop {
                let w = wanted();
                self.bg_watching.store(w, SeqCst);
                if w || !wanted() {
                    break w;
                }
            };
            let now = self.now_ns();
            let mut wake_at = self.next_deadline.load(SeqCst);
            // Pollers and the watcher run due timers themselves.
            let others = self.pollers.count() > 0 || self.watcher.load(SeqCst);
            if others && wake_at != u64::MAX {
                wake_at = wake_at.max(now + BG_BACKSTOP_NS);
            }
            if !watch {
                // The application is active: wake regularly so its timers
                // need no doorbell, and take over the socket once it goes
                // idle. (While watching, an idle endpoint sleeps until its
                // next timer or a packet.)
                wake_at = wake_at.min(now + BG_MAX_SLEEP_NS);
                // (Only a future moment: if the application is already idle
                // and we still do not watch, a watcher or poller has the
                // socket, and waking early would only spin.)
                if self.pollers.count() == 0 && app_idle_at > now {
                    wake_at = wake_at.min(app_idle_at);
                }
            }
            self.bg_sleep_until.store(wake_at, SeqCst);
            // A deadline published after we read it must not be slept through.
            let again = self.next_deadline.load(SeqCst);
            if again < wake_at && !others {
                wake_at = again;
            }
            let attention = self.attention_until.load(SeqCst);
            if watch
                && attention > now
                && self.blocked.load(SeqCst) == 0
                && self.inflight.load(SeqCst) == 0
            {
                wake_at = wake_at.min(attention);
            }
            let timeout =
                (wake_at != u64::MAX).then(|| Duration::from_nanos(wake_at.saturating_sub(now)));
            let mut fds = [
                libc::pollfd {
                    fd: self.doorbell.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.sock.fd(),
                    events: libc::POLLIN
                        | if self.tx_pending.load(SeqCst) {
                            libc::POLLOUT
                        } else {
                            0
                        },
                    revents: 0,
                },
            ];
            let nfds = if watch { 2 } else { 1 };
            let _ = ppoll(&mut fds[..nfds], timeout);
            self.bg_sleep_until.store(0, SeqCst);
            if fds[0].revents != 0 {
                self.doorbell.drain();
            }
            if self.shut.load(Acquire) {
                break;
            }
            let now = self.now_ns();
            let sock_ready = nfds == 2 && fds[1].revents != 0;
            let others_drive = self.pollers.count() > 0 || self.watcher.load(SeqCst);
            let deadline = self.next_deadline.load(SeqCst);
            let due = if others_drive {
                deadline.saturating_add(BG_BACKSTOP_NS) <= now
            } else {
                deadline <= now
            };
            if due || (sock_ready && !others_drive) {
                self.counters.bg_drives.fetch_add(1, Relaxed);
                let mut d = self.driver.lock();
                let now = self.clock(&mut d);
                self.drive(&mut d, now, true);
                release(d);
            }
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
