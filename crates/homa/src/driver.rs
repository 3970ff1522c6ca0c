//! The engine pass: whoever holds the engine lock receives from the socket,
//! runs the engine's timers, routes its events to the waiting threads and
//! transmits what it produced. Everything touched under the lock is in
//! [`Driver`].

use crate::endpoint::Response;
use crate::endpoint::{dur_ns, recycle_slot, spare_slot};
use crate::error::{Error, Result};
use crate::handoff::BG_MAX_SLEEP_NS;
use crate::message::Message;
use crate::serve::{InlineGuard, Serving};

/// The engine lock held by value (`Arc<Mutex<Driver>>::try_lock_arc`), so
/// that a serving pass can lend it to its handler.
pub(crate) type DriverGuard = parking_lot::ArcMutexGuard<parking_lot::RawMutex, Driver>;
use crate::shared::Shared;
use crate::socket::{
    Faults, FlushOutcome, Landed, Peeked, RecvOutcome, RxBatch, SocketStats, TxQueue,
    GSO_MAX_SEGMENTS, LANDING_MIN_BYTES,
};
use crate::timetrace;
use crate::wait::{Notify, Slot, Waiter};
use homa_proto::driver::FastPath as _;
use homa_proto::{Event, Outgoing, RpcId, ServerRpc};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

/// Receive rounds per drive: bounds how long one thread holds the engine.
const MAX_RX_ROUNDS: usize = 8;
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

pub(crate) type RpcResult = Result<homa_proto::Message>;

/// What an RPC whose response is delivered incrementally gets first: the
/// message as its first bytes are in, and its reader's wake-up.
pub(crate) type PartialStart = Result<(homa_proto::PartialMessage, Arc<Notify>)>;

/// One drive pass by a waiting thread: its engine time, and whether it
/// received anything (a waiter that keeps receiving keeps polling).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass {
    pub(crate) now: u64,
    pub(crate) received: bool,
}

/// Where a client RPC's outcome goes.
pub(crate) enum Target {
    /// A private RPC: its own slot, awaited through its [`PendingRpc`].
    Private(Arc<Slot<RpcResult>>),
    /// A private RPC whose response is read as it arrives
    /// ([`Endpoint::call_partial`](crate::Endpoint::call_partial)).
    Partial(Arc<Slot<PartialStart>>),
    /// A shared RPC: the endpoint's response queue ([`Endpoint::recv_response`]).
    Shared,
}

pub(crate) struct ClientRpc {
    peer: SocketAddr,
    target: Target,
}

/// Client RPCs in progress, indexed by the engine's slot for each id
/// (`client_rpc_index`): dense, reused, so a vector serves where a hash map
/// cost ~100 ns per response (a cache miss the time trace showed between
/// the response event and its slot).
///
/// The engine frees an RPC's slot when it queues the RPC's last event
/// (`Response`, `Failed`), and a new request may take the slot before that
/// event is dispatched: an event queued after a pass's dispatch (a landed
/// packet, a timer) waits for the next pass, and a serve handler's nested
/// call runs while later events wait behind its request. The displaced
/// entry moves to `finished` until its event comes; nothing is lost.
#[derive(Default)]
pub(crate) struct ClientRpcs {
    slots: Vec<Option<(RpcId, ClientRpc)>>,
    /// Entries displaced from their slot whose final event is still queued
    /// in the engine (almost always empty).
    finished: Vec<(RpcId, ClientRpc)>,
    len: usize,
}

impl ClientRpcs {
    fn insert(&mut self, engine: &homa_proto::Endpoint, id: RpcId, rpc: ClientRpc) {
        self.insert_at(engine.client_rpc_index(id), id, rpc);
    }

    fn insert_at(&mut self, slot: usize, id: RpcId, rpc: ClientRpc) {
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, || None);
        }
        if let Some(old) = self.slots[slot].replace((id, rpc)) {
            self.finished.push(old);
        }
        self.len += 1;
    }

    /// Removes RPC `id` if it is here.
    fn remove(&mut self, engine: &homa_proto::Endpoint, id: RpcId) -> Option<ClientRpc> {
        self.remove_at(engine.client_rpc_index(id), id)
    }

    fn remove_at(&mut self, slot: usize, id: RpcId) -> Option<ClientRpc> {
        let rpc = match self.slots.get_mut(slot) {
            Some(entry) if entry.as_ref().is_some_and(|(i, _)| *i == id) => {
                entry.take().map(|(_, rpc)| rpc)
            }
            _ if self.finished.is_empty() => None,
            _ => {
                let at = self.finished.iter().position(|(i, _)| *i == id)?;
                Some(self.finished.swap_remove(at).1)
            }
        };
        self.len -= rpc.is_some() as usize;
        rpc
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Ids of the RPCs to `peer`.
    fn ids_to(&self, peer: SocketAddr) -> Vec<RpcId> {
        self.slots
            .iter()
            .flatten()
            .chain(&self.finished)
            .filter(|(_, r)| r.peer == peer)
            .map(|(id, _)| *id)
            .collect()
    }

    fn drain(&mut self) -> Vec<(RpcId, ClientRpc)> {
        self.len = 0;
        let mut all: Vec<_> = self.slots.drain(..).flatten().collect();
        all.append(&mut self.finished);
        all
    }
}

/// Everything touched under the engine lock.
pub(crate) struct Driver {
    pub(crate) engine: homa_proto::Endpoint,
    pub(crate) rx: RxBatch,
    pub(crate) tx: TxQueue,
    pub(crate) rpcs: ClientRpcs,
    pub(crate) faults: Option<Faults>,
    pub(crate) stats: SocketStats,
    pub(crate) errors: Vec<(SocketAddr, i32)>,
    /// Waiters to wake once the lock is released.
    pub(crate) wakes: Vec<Waiter>,
    /// Requests handed to a serve handler inside a drive pass (counted in
    /// `RuntimeStats::found_polling`).
    pub(crate) served_inline: u64,
    /// The current drive is the watcher's own (it reads the new deadline
    /// itself; nobody needs to ring it).
    pub(crate) watcher_driving: bool,
    pub(crate) last_now: u64,
    /// The last receive of this pass found the socket empty (the async
    /// driver task may then clear tokio's readiness flag).
    pub(crate) rx_drained: bool,
    /// Readers of partial messages, by serial: woken on the engine's
    /// `PartialProgress` (a reader removes itself when it is dropped).
    pub(crate) partials: HashMap<u64, Arc<Notify>>,
    /// Open streams' wake-ups, by stream (`stream.rs`); a stream's handle
    /// removes its entry when it is dropped.
    pub(crate) streams: HashMap<homa_proto::StreamId, Arc<crate::stream::StreamSignals>>,
}

/// State shared by the endpoint's handles, its RPC handles and its
/// background thread.
/// Unlocks the driver, then wakes whoever the pass found a result for
/// (after unlocking, so that the woken thread does not collide with the
/// lock). Most passes wake nobody: then it is only the unlock.
pub(crate) fn release<G: std::ops::DerefMut<Target = Driver>>(mut d: G) {
    if d.wakes.is_empty() {
        return;
    }
    let wakes = std::mem::take(&mut d.wakes);
    drop(d);
    for w in wakes {
        w.wake();
    }
}

/// What a waiter runs at the end of its own engine passes, with the engine
/// locked and the pass's time ([`Shared::drive_once_serving`]).
pub(crate) type LockedCheck<'a> = dyn FnMut(&mut Driver, u64) + 'a;

impl Shared {
    /// Takes the engine lock for a thread that has to have it (an
    /// application call, the watcher, the background thread, a serving
    /// pass's second half), ahead of busy pollers.
    ///
    /// A busy poller takes and releases the lock every round (`try_lock`).
    /// The mutex is not fair, so a thread blocked in `lock` could watch one
    /// such poller take it again and again: beside a stream whose reader
    /// polled without pause, a server's `reply` waited 15 ms for the lock
    /// on this 2-core machine (issue #21). While anyone waits here, pollers
    /// do not try the lock at all ([`Self::drive_once_serving`]), so the
    /// waiter gets it at the next release.
    pub(crate) fn lock_engine(&self) -> parking_lot::MutexGuard<'_, Driver> {
        self.counted_lock(|| self.driver.try_lock(), || self.driver.lock())
    }

    /// [`Self::lock_engine`], the guard held by value.
    fn lock_engine_arc(&self) -> parking_lot::ArcMutexGuard<parking_lot::RawMutex, Driver> {
        self.counted_lock(|| self.driver.try_lock_arc(), || self.driver.lock_arc())
    }

    /// `try_lock()`, or else `lock()` counted in `lock_waiters` meanwhile.
    fn counted_lock<G>(&self, try_lock: impl FnOnce() -> Option<G>, lock: impl FnOnce() -> G) -> G {
        if let Some(d) = try_lock() {
            return d;
        }
        self.lock_waiters.fetch_add(1, SeqCst);
        let d = lock();
        self.lock_waiters.fetch_sub(1, SeqCst);
        d
    }

    /// A poller's lock: none if another thread holds it, but behind any
    /// thread waiting in [`Self::lock_engine`] (asleep) rather than
    /// spinning on a core it may need.
    fn poller_lock(&self) -> Option<parking_lot::MutexGuard<'_, Driver>> {
        if self.lock_waiters.load(Relaxed) != 0 {
            Some(self.lock_engine())
        } else {
            self.driver.try_lock()
        }
    }

    /// Runs `f` under the engine lock, then lets the engine transmit (and,
    /// with `recv`, receive first), then wakes whoever got a result.
    pub(crate) fn with_driver<R>(&self, recv: bool, f: impl FnOnce(&mut Driver, u64) -> R) -> R {
        // Inside this endpoint's serve handler: the pass that runs the
        // handler transmits and wakes afterwards.
        let f = match self.with_inline_driver(f) {
            Ok(r) => return r,
            Err(f) => f,
        };
        let mut d = self.lock_engine();
        let now = self.clock(&mut d);
        self.last_app.store(now, Relaxed);
        let r = f(&mut d, now);
        self.drive(&mut d, now, recv);
        release(d);
        r
    }

    /// Runs `f` on the driver without a drive pass (counters, shutdown).
    pub(crate) fn locked<R>(&self, f: impl FnOnce(&mut Driver) -> R) -> R {
        let f = match self.with_inline_driver(|d, _| f(d)) {
            Ok(r) => return r,
            Err(f) => f,
        };
        let mut d = self.lock_engine();
        let r = f(&mut d, 0);
        release(d);
        r
    }

    /// Monotonic engine time, never behind what the engine has seen.
    pub(crate) fn clock(&self, d: &mut Driver) -> u64 {
        let now = self.now_ns().max(d.last_now);
        d.last_now = now;
        now
    }

    /// One non-blocking pass if nobody else is driving right now; returns
    /// the engine time used, if it ran.
    pub(crate) fn drive_once(&self) -> Option<u64> {
        self.drive_once_serving(None, None).map(|p| p.now)
    }

    /// [`Self::drive_once`] that hands requests to `serving`'s handler, or
    /// (not serving) runs `locked` after the pass with the engine still
    /// locked: a waiter that can take its result from the engine does so
    /// in the same lock (a stream's reader, `Stream::recv_chunk`).
    pub(crate) fn drive_once_serving(
        &self,
        serving: Option<&mut Serving>,
        locked: Option<&mut LockedCheck<'_>>,
    ) -> Option<Pass> {
        let Some(s) = serving else {
            let mut d = self.poller_lock()?;
            let now = self.clock(&mut d);
            let before = d.stats.packets_received;
            self.drive(&mut d, now, true);
            let received = d.stats.packets_received != before;
            if let Some(f) = locked {
                f(&mut d, now);
            }
            release(d);
            return Some(Pass { now, received });
        };
        // A serving pass. The empty poll (the busy loop's usual pass) takes
        // the lock as any other; a pass with work continues with the lock
        // held by value, so that it can be lent to the handler's calls (see
        // `serve.rs`). Taking the by-value guard on every round instead
        // cost two atomic operations on the `Arc` per empty poll.
        let mut d = self.poller_lock()?;
        let now = self.clock(&mut d);
        let before = d.stats.packets_received;
        if !self.drive_begin(&mut d, now, true) {
            let received = d.stats.packets_received != before;
            release(d);
            return Some(Pass { now, received });
        }
        // Whatever another thread does in between (its pass may route the
        // events just received to the request queue) is correct; this pass
        // then finds fewer events.
        release(d);
        let mut pass = Some(self.lock_engine_arc());
        self.dispatch_serving(&mut pass, now, s);
        let d = pass
            .as_deref_mut()
            .expect("the handler gives the pass back");
        timetrace::record("events dispatched");
        self.drive_end(d, now, true);
        release(pass.expect("held"));
        Some(Pass {
            now,
            received: true,
        })
    }

    pub(crate) fn start(
        &self,
        peer: SocketAddr,
        request: Outgoing,
        target: Target,
    ) -> Result<RpcId> {
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
        let partial = matches!(target, Target::Partial(_));
        let id = self.with_driver(false, |d, now| {
            let id = d
                .engine
                .send_request(now, peer, request)
                .map_err(Error::from_send)?;
            timetrace::record("engine send_request done");
            if partial {
                d.engine
                    .deliver_response_partially(id)
                    .map_err(Error::from_send)?;
            }
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
    pub(crate) fn call(
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
    pub(crate) fn await_private(
        &self,
        id: RpcId,
        slot: &Slot<RpcResult>,
        deadline: Option<u64>,
    ) -> Result<Message> {
        let r = if slot.is_done() {
            self.roles.pollers.found_at_once();
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

    pub(crate) fn reply(&self, rpc: ServerRpc, response: Outgoing) -> Result<()> {
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
    /// thread waits on this endpoint, so for a while (several times its
    /// wire time, at least a few ms) the background thread takes over once
    /// the application has been away for `APP_IDLE_NS`, and looks that often
    /// meanwhile; it is rung only if it sleeps longer.
    pub(crate) fn need_attention(&self, len: usize) {
        let wire = (len as u128 * 8_000_000_000 / self.link_bps.max(1) as u128) as u64;
        let now = self.now_ns();
        let until = now + 4 * wire + 5_000_000;
        self.attention_until.fetch_max(until, SeqCst);
        if self.roles.pollers.count() == 0 && self.roles.attention_must_ring(now) {
            self.ring();
        }
    }

    pub(crate) fn cancel(&self, id: RpcId) {
        self.with_driver(false, |d, _| {
            if d.rpcs.remove(&d.engine, id).is_some() {
                d.engine.cancel(id);
            }
        });
    }

    /// Receive, timers, events, transmit: one round of progress.
    pub(crate) fn drive(&self, d: &mut Driver, now: u64, recv: bool) {
        if self.drive_begin(d, now, recv) {
            self.dispatch_events(d);
            timetrace::record("events dispatched");
            self.drive_end(d, now, recv);
        }
    }

    /// The first half of a pass: receive (with `recv`) and run due timers.
    /// Returns false for a poll that found nothing to do (the busy-poll
    /// loop's usual pass), which then ends here.
    pub(crate) fn drive_begin(&self, d: &mut Driver, now: u64, recv: bool) -> bool {
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
                return false;
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
        true
    }

    /// The second half of a pass, after its events went where they belong:
    /// transmit, deferred work, errors, publish the next deadline.
    pub(crate) fn drive_end(&self, d: &mut Driver, now: u64, recv: bool) {
        // As in `receive`: packets of an engine that measures RTT carry the
        // time they are built, not the pass's start.
        let tx_now = if self.cfg.engine.measure_rtt
            || self.cfg.engine.window_policy == homa_proto::WindowPolicy::Adaptive
        {
            now.max(self.now_ns())
        } else {
            now
        };
        self.transmit(d, tx_now);
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
    pub(crate) fn receive(&self, d: &mut Driver, now: u64) -> bool {
        let Driver {
            engine,
            rx,
            stats,
            faults,
            errors,
            ..
        } = d;
        let mut d_drained = false;
        let mut got = false;
        // An engine that measures RTT gets each datagram's time read after
        // `recvmmsg` returned it, not the pass's: a thread preempted between
        // the pass's clock read and the receive (a busy machine) would
        // otherwise date packets before they arrived, and the echoes and
        // samples built on those times come out too short (on the testbed
        // under load: `rtt_min` 7 µs where a small packet alone takes 8 µs
        // a hop, docs/congestion.md §8).
        let fresh = self.cfg.engine.measure_rtt
            || self.cfg.engine.window_policy == homa_proto::WindowPolicy::Adaptive;
        let at = |now: u64| if fresh { now.max(self.now_ns()) } else { now };
        for _ in 0..MAX_RX_ROUNDS {
            let landing = faults.is_none() && self.cfg.landing && rx.landing();
            let out = if landing {
                self.land_one(engine, rx, stats, at(now))
            } else {
                rx.recv(&self.sock, stats, |src, data, seg| match faults.as_mut() {
                    // Loss is injected per packet.
                    Some(f) => {
                        for pkt in data.chunks(seg.max(1)) {
                            if !f.drop_rx() {
                                engine.handle_datagram(at(now), src, pkt);
                            }
                        }
                        if data.is_empty() && !f.drop_rx() {
                            engine.handle_datagram(at(now), src, data);
                        }
                    }
                    None => engine.handle_datagrams(at(now), src, data, seg),
                })
            };
            match out {
                RecvOutcome::Received(true) => {
                    got = true;
                    // A full batch (or, while landing, any datagram): more
                    // may be waiting, but if what arrived
                    // made something to send, the pass sends it first. A
                    // receiver of long messages otherwise copied up to
                    // MAX_RX_ROUNDS batches (megabytes) before its grants
                    // went out, and the sender waited for them: 500 KB
                    // throughput rose from 33.3 to 36.4 Gbit/s on average
                    // and varied less (docs/performance.md, thirteenth
                    // session).
                    if engine.may_transmit() {
                        break;
                    }
                    // A landed packet that gave the application something
                    // (a stream's next bytes, a whole message) is handed
                    // over before the next is copied in: a reader that
                    // writes back what it reads starts after one packet
                    // instead of after up to MAX_RX_ROUNDS (half a
                    // megabyte on loopback). Landing takes one datagram
                    // per system call anyway, so nothing is batched less.
                    if landing && engine.has_events() {
                        break;
                    }
                }
                RecvOutcome::Received(false) => {
                    got = true;
                    break;
                }
                RecvOutcome::Empty => {
                    d_drained = true;
                    break;
                }
                RecvOutcome::Error => {
                    // A pending socket error (ICMP): read the error queue,
                    // then keep receiving.
                    if self.sock.read_errors(errors, stats) == 0 {
                        break;
                    }
                }
            }
        }
        d.rx_drained = d_drained;
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

    /// One datagram while landing is on (`RxBatch::peek`): into the receive
    /// pool if the engine has a place for its payload, otherwise the
    /// ordinary way.
    fn land_one(
        &self,
        engine: &mut homa_proto::Endpoint,
        rx: &mut RxBatch,
        stats: &mut SocketStats,
        now: u64,
    ) -> RecvOutcome {
        let (src, len) = match rx.peek(&self.sock, stats) {
            Peeked::Datagram(src, len) => (src, len),
            Peeked::Empty => return RecvOutcome::Empty,
            Peeked::Error => return RecvOutcome::Error,
        };
        if len >= LANDING_MIN_BYTES {
            let landed = match engine.landing_site(src, rx.peeked_head(len), len) {
                Some(mut site) => {
                    let header_len = site.header_len;
                    rx.recv_landed(&self.sock, stats, len, header_len, &mut site.payload)
                }
                None => Landed::Queued,
            };
            // The pool slices are written (or not): the engine may run again.
            match landed {
                Landed::Whole(head) => {
                    engine.handle_landed(now, src, head, len);
                    return RecvOutcome::Received(true);
                }
                Landed::Dropped => return RecvOutcome::Received(true),
                Landed::Queued => {}
            }
        }
        rx.not_landed(stats);
        match rx.recv_one(&self.sock, stats, |src, data, seg| {
            engine.handle_datagrams(now, src, data, seg)
        }) {
            // While landing, datagrams come one per call: more may wait.
            RecvOutcome::Received(_) => RecvOutcome::Received(true),
            other => other,
        }
    }

    /// Fails client RPCs whose peer the network declared unreachable.
    pub(crate) fn handle_errors(&self, d: &mut Driver) {
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

    pub(crate) fn complete(&self, d: &mut Driver, id: RpcId, rpc: ClientRpc, result: RpcResult) {
        let w = match rpc.target {
            Target::Private(slot) => slot.complete(result),
            // The engine reports such a response only as `PartialResponse`:
            // what comes here is a failure before its first bytes.
            Target::Partial(slot) => slot.complete(result.and(Err(Error::UnknownRpc))),
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

    pub(crate) fn dispatch_events(&self, d: &mut Driver) {
        while let Some(ev) = d.engine.poll_event() {
            self.dispatch(d, ev);
        }
    }

    pub(crate) fn dispatch(&self, d: &mut Driver, ev: Event) {
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
            Event::PartialResponse { id, message } => {
                // Unknown ids were abandoned: dropping the message returns
                // its pool space (the engine cancels nothing by itself, but
                // an abandoned RPC was cancelled already).
                if let Some(ClientRpc {
                    target: Target::Partial(slot),
                    ..
                }) = d.rpcs.remove(&d.engine, id)
                {
                    let notify = Arc::new(Notify::default());
                    d.partials.insert(message.serial(), notify.clone());
                    if let Some(w) = slot.complete(Ok((message, notify))) {
                        d.wakes.push(w);
                    }
                }
            }
            Event::PartialProgress { serial } => {
                if let Some(w) = d.partials.get(&serial).and_then(|n| n.take()) {
                    d.wakes.push(w);
                }
            }
            Event::PartialRequest { rpc, message } => {
                let notify = Arc::new(Notify::default());
                d.partials.insert(message.serial(), notify.clone());
                if let Some(w) = self.partial_requests.push((rpc, message, notify)) {
                    d.wakes.push(w);
                }
            }
            Event::StreamOpened { stream } => self.stream_opened(d, stream),
            Event::StreamReadable { stream } => {
                if let Some(st) = d.streams.get(&stream) {
                    if let Some(w) = st.readable() {
                        d.wakes.push(w);
                    }
                }
            }
            Event::StreamWritable { stream } => {
                if let Some(st) = d.streams.get(&stream) {
                    if let Some(w) = st.writable() {
                        d.wakes.push(w);
                    }
                }
            }
        }
    }

    /// [`Self::dispatch_events`] on a serving thread's own pass: each request
    /// goes straight to the handler, on this thread. No queue, no second
    /// lock, no second pass: the pass lends its lock guard to the handler
    /// (through the thread-local of `serve.rs`), so a reply given inside the
    /// handler is in the engine before this pass transmits.
    pub(crate) fn dispatch_serving(
        &self,
        pass: &mut Option<DriverGuard>,
        now: u64,
        s: &mut Serving,
    ) {
        loop {
            let d = pass.as_deref_mut().expect("held between handlers");
            let Some(ev) = d.engine.poll_event() else {
                break;
            };
            match ev {
                Event::Request { rpc, message } => {
                    if self.shut.load(Acquire) {
                        // Nobody will answer: release its pool space.
                        continue;
                    }
                    let req = s.shared.request((rpc, message));
                    timetrace::record("inline request");
                    let lent = InlineGuard::enter(self, pass.take().map(|g| (g, now)));
                    (s.handler)(req);
                    *pass = lent.leave();
                    s.served += 1;
                    // Under the lock: a plain add, not an atomic one.
                    pass.as_deref_mut().expect("given back").served_inline += 1;
                }
                ev => self.dispatch(d, ev),
            }
        }
    }

    pub(crate) fn transmit(&self, d: &mut Driver, now: u64) {
        let before = d.stats.packets_sent;
        self.transmit_inner(d, now);
        if d.stats.packets_sent != before {
            crate::handoff::note_sent();
        }
    }

    fn transmit_inner(&self, d: &mut Driver, mut now: u64) {
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

    /// Publishes the engine's next deadline and client RPC count for the
    /// threads that sleep (the watcher, the background thread, the async
    /// driver task's timer), and rings a sleeper only when a timer is due
    /// well before it would wake (see the comment inside): the fast path
    /// makes no extra system call.
    pub(crate) fn publish(&self, d: &mut Driver, now: u64) {
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
        // The async driver task keeps a timer armed for the engine's next
        // deadline while it lives (it has no other clock).
        #[cfg(feature = "tokio")]
        if self.roles.reactor.load(Relaxed) {
            if let Some(r) = self.reactor_state.get() {
                r.rearm(next, self.monotonic_at(next));
            }
        }
        // Whoever runs timers must hear of an earlier deadline: pollers check
        // it every round; the watcher and the background thread sleep.
        if self.roles.pollers.count() > 0 {
            return;
        }
        // Only the pacer is urgent. A protocol timer (the engine's tick)
        // rings the watcher only if it would wake more than BG_MAX_SLEEP_NS
        // after it, and the background thread only while it watches an idle
        // application's socket; while the application is active, its
        // threads run timers and hand over when they leave
        // (`Shared::app_leaves`). Ringing for every tick that came within
        // URGENT_NS cost one eventfd write in ~one of ten client sends (the
        // caller of a send is not yet polling when its pass publishes), and
        // woke the background thread, which under the ordinary scheduler
        // preempted a polling thread: 100-byte echo p99 ~20 µs without `chrt`.
        let urgent = d
            .engine
            .pacer_deadline()
            .is_some_and(|p| p < now.saturating_add(URGENT_NS));
        let worth =
            |sleep: u64| next < sleep && (urgent || sleep > next.saturating_add(BG_MAX_SLEEP_NS));
        if self.roles.watcher.load(SeqCst) {
            if !d.watcher_driving && worth(self.watcher_sleep_until.load(SeqCst)) {
                self.watcher_bell.ring();
            }
            return;
        }
        let sleep = self.roles.bg_sleep_until.load(SeqCst);
        // Paced packets of a long message going out: the background thread
        // looks every APP_IDLE_NS meanwhile (`plan_background`) and the
        // thread that just drove usually comes straight back (its next send,
        // its wait) and sends them. A ring here woke it ~1,500 times a
        // second in a 500 KB stream, each wake-up ~20 µs of CPU on this VM.
        let urgent = urgent
            && !(crate::handoff::looks_by_take_over(sleep, now) && self.attention_until_after(now));
        if next < sleep && (urgent || (self.roles.bg_watching.load(SeqCst) && worth(sleep))) {
            self.ring();
        }
    }

    pub(crate) fn shutdown(&self) {
        if self.shut.swap(true, SeqCst) {
            return;
        }
        self.locked(|d| {
            d.engine.shutdown();
            self.dispatch_events(d);
            self.wake_streams(d);
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
        drop(self.partial_requests.drain());
        self.partial_requests.wake_all();
        drop(self.accepted_streams.drain());
        self.accepted_streams.wake_all();
        self.responses.wake_all();
        #[cfg(feature = "tokio")]
        if let Some(r) = self.reactor_state.get() {
            r.wake();
        }
        self.watcher_bell.ring();
        self.ring();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(port: u16) -> ClientRpc {
        ClientRpc {
            peer: SocketAddr::from(([127, 0, 0, 1], port)),
            target: Target::Shared,
        }
    }

    #[test]
    fn a_slot_taken_before_its_last_event_keeps_both_rpcs() {
        let mut t = ClientRpcs::default();
        let (old, new) = (RpcId(8), RpcId(8 + (1 << 20)));
        t.insert_at(3, old, rpc(1));
        // The engine freed `old` and gave its slot to `new` before the
        // driver saw `old`'s response.
        t.insert_at(3, new, rpc(2));
        assert_eq!(t.len(), 2);
        let mut to_1 = t.ids_to(SocketAddr::from(([127, 0, 0, 1], 1)));
        to_1.sort();
        assert_eq!(to_1, vec![old]);
        // `old`'s response finds it; `new`'s still finds its own.
        assert_eq!(t.remove_at(3, old).map(|r| r.peer.port()), Some(1));
        assert!(t.remove_at(3, old).is_none());
        assert_eq!(t.len(), 1);
        assert_eq!(t.remove_at(3, new).map(|r| r.peer.port()), Some(2));
        assert_eq!(t.len(), 0);
        assert!(t.finished.is_empty());
        // An unknown id (an abandoned RPC's late response) removes nothing.
        t.insert_at(0, old, rpc(1));
        assert!(t.remove_at(0, new).is_none());
        assert!(t.remove_at(7, new).is_none());
        assert_eq!(t.drain().len(), 1);
        assert_eq!(t.len(), 0);
    }
}
