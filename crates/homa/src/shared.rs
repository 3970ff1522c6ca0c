//! The state an endpoint's handles, RPC handles, serving threads and
//! background thread share.

use crate::config::EndpointConfig;
use crate::driver::Driver;
use crate::endpoint::Response;
use crate::error::{Error, Result};
use crate::handoff::Pollers;
use crate::socket::UdpSocket;
use crate::sys::{monotonic_ns, EventFd};
use crate::wait::WaitQueue;
use homa_proto::ServerRpc;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;

/// layout-sensitive; docs/performance.md).
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
    pub(crate) driver: Mutex<Driver>,
    pub(crate) doorbell: EventFd,
    /// Threads in the polling phase of a wait (they drive the engine).
    pub(crate) pollers: Pollers,
    /// Threads and tasks sleeping until a result arrives.
    pub(crate) blocked: AtomicUsize,
    /// The background thread currently has the socket in its poll set.
    pub(crate) bg_watching: AtomicBool,
    /// A blocked application thread sleeps on the socket itself (the
    /// "watcher"); it drives the engine when packets arrive.
    pub(crate) watcher: AtomicBool,
    /// Wakes the watcher when its result arrives by another path, or when
    /// another thread set an engine deadline earlier than its sleep.
    pub(crate) watcher_bell: Arc<EventFd>,
    /// When the watcher will wake on its own (0 while it is awake).
    pub(crate) watcher_sleep_until: AtomicU64,
    /// When the background thread will wake on its own (u64::MAX: never,
    /// 0: it is awake).
    pub(crate) bg_sleep_until: AtomicU64,
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
    pub(crate) responses: WaitQueue<Response>,
    pub(crate) counters: Counters,
}

/// Counters of the waiting machinery (relaxed atomics; for reports).
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) slept: AtomicU64,
    pub(crate) rings: AtomicU64,
    pub(crate) bg_drives: AtomicU64,
}

impl Shared {
    pub(crate) fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.base_ns)
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
