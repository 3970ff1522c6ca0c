//! The state an endpoint's handles, RPC handles, serving threads and
//! background thread share.

use crate::config::EndpointConfig;
use crate::driver::Driver;
use crate::endpoint::Response;
use crate::error::{Error, Result};
use crate::handoff::Roles;
use crate::socket::UdpSocket;
use crate::sys::{monotonic_ns, EventFd};
use crate::wait::{Notify, WaitQueue};
use homa_proto::ServerRpc;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;

/// State shared by the endpoint's handles, its RPC handles, its serving
/// threads, the async driver task and the background thread.
///
/// Aligned to 128 bytes (two cache lines, which the adjacent-line prefetcher
/// moves together) so that no other allocation shares its lines: the roles'
/// atomics are written on every poll round. A precaution, not a measured
/// gain (docs/performance.md). The engine lock itself lives in its own
/// allocation since the serving pass holds its guard by value.
#[repr(align(128))]
pub(crate) struct Shared {
    pub(crate) sock: UdpSocket,
    pub(crate) cfg: EndpointConfig,
    pub(crate) max_message: usize,
    pub(crate) unsched_bytes: usize,
    /// Payload bytes per packet: the segment size of fitting send buffers.
    pub(crate) segment: usize,
    pub(crate) link_bps: u64,
    /// `monotonic_ns()` when the endpoint opened: engine time is relative to it.
    pub(crate) base_ns: u64,
    pub(crate) poll_ns: u64,
    /// [`EndpointConfig::async_poll`] in nanoseconds.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) async_poll_ns: u64,
    /// The engine and everything touched with it, behind one lock. In an
    /// `Arc` so that a serving pass can hold its guard by value and lend it
    /// to the handler (`serve.rs`).
    pub(crate) driver: Arc<Mutex<Driver>>,
    /// Threads blocked in [`Shared::lock_engine`] (an application call, the
    /// watcher, the background thread): busy pollers leave the lock to them
    /// (see there).
    pub(crate) lock_waiters: AtomicU32,
    pub(crate) doorbell: EventFd,
    /// Who drives the engine and who sleeps (see `handoff.rs`).
    pub(crate) roles: Roles,
    /// The async driver task's timer, made when the first task waits.
    #[cfg(feature = "tokio")]
    pub(crate) reactor_state: std::sync::OnceLock<Arc<crate::async_api::Reactor>>,
    /// Wakes the watcher when its result arrives by another path, or when
    /// another thread set an engine deadline earlier than its sleep.
    pub(crate) watcher_bell: Arc<EventFd>,
    /// When the watcher will wake on its own (0 while it is awake).
    pub(crate) watcher_sleep_until: AtomicU64,
    /// The engine's next timer as of the last drive, plus `coalesce_ns`
    /// (u64::MAX: none). Everyone who waits for the engine's timers uses
    /// this value.
    pub(crate) next_deadline: AtomicU64,
    /// How late a timer may be run so that pacing releases a batch of
    /// packets per system call and per wake-up instead of one: half the
    /// engine's NIC-queue allowance (the queue never runs dry).
    pub(crate) coalesce_ns: u64,
    /// Client RPCs in progress.
    pub(crate) inflight: AtomicUsize,
    /// When an application thread last polled or called into the endpoint.
    pub(crate) last_app: AtomicU64,
    /// Packets the socket could not take yet.
    pub(crate) tx_pending: AtomicBool,
    /// Until this time the socket needs watching even with no waiter (a long
    /// response is being sent and its grants must be heard).
    pub(crate) attention_until: AtomicU64,
    pub(crate) shut: AtomicBool,
    pub(crate) requests: WaitQueue<(ServerRpc, homa_proto::Message)>,
    /// Requests delivered incrementally (`EngineConfig::partial_delivery_bytes`).
    pub(crate) partial_requests: WaitQueue<(ServerRpc, homa_proto::PartialMessage, Arc<Notify>)>,
    pub(crate) responses: WaitQueue<Response>,
    /// Streams opened by peers, for `accept_stream`.
    pub(crate) accepted_streams:
        WaitQueue<(homa_proto::StreamId, Arc<crate::stream::StreamSignals>)>,
    pub(crate) counters: Counters,
}

/// Counters of the waiting machinery (relaxed atomics; for reports).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) slept: AtomicU64,
    pub(crate) rings: AtomicU64,
    pub(crate) bg_drives: AtomicU64,
    pub(crate) poll_yields: AtomicU64,
    pub(crate) poll_shared_cpu: AtomicU64,
}

impl Shared {
    pub(crate) fn now_ns(&self) -> u64 {
        let elapsed = monotonic_ns().saturating_sub(self.base_ns);
        // The `test-hooks` clock skew; compiled out otherwise.
        #[cfg(feature = "test-hooks")]
        let elapsed = self.cfg.clock.read(elapsed);
        elapsed
    }

    /// `monotonic_ns()` at which the engine's clock reads `t` (the inverse
    /// of [`Self::now_ns`]), for timers armed on the machine's clock.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn monotonic_at(&self, t: u64) -> u64 {
        #[cfg(feature = "test-hooks")]
        let t = self.cfg.clock.elapsed_at(t);
        self.base_ns.saturating_add(t)
    }

    pub(crate) fn check_peer(&self, peer: &SocketAddr) -> Result<()> {
        if peer.port() == 0 || peer.ip().is_unspecified() || peer.ip().is_multicast() {
            return Err(Error::InvalidPeer(*peer));
        }
        if !self.sock.can_reach(peer) {
            return Err(Error::UnreachableFamily {
                peer: *peer,
                local: self.sock.local_addr(),
            });
        }
        Ok(())
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn is_shut(&self) -> bool {
        self.shut.load(Acquire)
    }
}
