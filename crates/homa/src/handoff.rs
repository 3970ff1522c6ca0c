//! Who drives the engine and who sleeps: busy-polling waiters, the watcher
//! (one sleeping waiter in `ppoll` on the socket), async tasks and the
//! background thread, and the rules that hand the socket from one to the
//! other without losing a wake-up.

use crate::driver::{release, LockedCheck};
use crate::error::{Error, Result};
use crate::serve::{wait_in_handler, Serving};
use crate::shared::Shared;
use crate::sys::{ppoll, set_timer_slack_ns};
use crate::timetrace;
use crate::wait::{Slot, WaitQueue, Waiter};
use std::sync::atomic::Ordering::*;
// The roles' atomics come from loom when the handshake is model-checked
// (`RUSTFLAGS="--cfg homa_loom" cargo test -p homa --lib loom`).
#[cfg(homa_loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(homa_loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

/// While someone else drives the engine (polling threads, the watcher, the
/// async driver task), they run its timers; the background thread then
/// wakes only this often, as a backstop for housekeeping timers (tombstone
/// and peer expiry) that nobody else may get to if the application stops
/// calling. Long on purpose: every wake-up of an extra thread preempts a
/// polling one on a busy machine and shows up in the latency tail. (Until
/// the twelfth session it woke every 2 ms whenever the application was
/// active, so that timers needed no doorbell: ~1,000 wake-ups a second for
/// a client and server pair, each one a preempted round trip.)
pub(crate) const BG_BACKSTOP_NS: u64 = 10_000_000;
/// A protocol timer set while the watcher (an application thread asleep on
/// the socket until the engine's next timer) sleeps rings it only if it is
/// due more than this before the watcher would wake: timers may run this
/// late, and most sends then cost no eventfd write.
pub(crate) const BG_MAX_SLEEP_NS: u64 = 2_000_000;
/// When no application thread has been inside the endpoint for this long,
/// the background thread watches the socket itself, so that the engine keeps
/// answering peers (grants, BUSY, acks) while the application is busy
/// elsewhere, as the kernel does for the Linux module.
const APP_IDLE_NS: u64 = 1_000_000;
/// Poll rounds that find the engine lock taken before a poller yields its
/// CPU (~10 µs of failed rounds: passes hold the lock for a few µs).
const LOCK_SPINS_BEFORE_YIELD: u32 = 64;
const POLL_YIELD_EVERY_NS: u64 = crate::config::POLL_YIELD_EVERY.as_nanos() as u64;
/// A `sched_yield` that takes longer than this ran another thread (the
/// call alone takes ~0.5 µs here).
const YIELD_SHARED_NS: u64 = 2_000;
/// Yields in a row that let another thread run before a poller moves to
/// another CPU.
const SHARED_YIELDS_BEFORE_MOVE: u32 = 8;
/// A thread moves off a shared CPU at most this often.
const MOVE_EVERY_NS: u64 = 10_000_000;

thread_local! {
    /// When this thread last moved off a shared CPU (engine-independent
    /// monotonic time).
    static LAST_MOVE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A stream read or write of at least this many bytes is bulk work, after
/// which the thread gives way ([`Shared::give_way`]).
const BULK_BYTES: usize = 16 * 1024;
/// Bulk operations between two yields that probe whether the CPU is wanted.
const BULK_PROBE_EVERY: u32 = 8;

/// Whether a thread gives way after a bulk operation, having done `ops`
/// since its last yield, which found the CPU `wanted` by another thread.
fn bulk_yield_due(ops: u32, wanted: bool) -> bool {
    wanted || ops + 1 >= BULK_PROBE_EVERY
}

thread_local! {
    /// This thread's bulk operations since its last yield, and whether that
    /// yield ran another thread ([`Shared::give_way`]).
    static BULK: std::cell::Cell<(u32, bool)> = const { std::cell::Cell::new((0, false)) };
}

thread_local! {
    /// This thread's polite yields in a row that ran no other thread, and
    /// the yields it skipped since the last ([`Shared::poll_politely`]).
    static UNWANTED: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Polite yields in a row that ran no other thread, after which a poller
/// yields only to probe ([`POLITE_PROBE_EVERY`]).
const UNWANTED_BEFORE_PROBING: u32 = 4;
/// While its CPU is not wanted, a poller yields at one of this many
/// occasions, to find out whether it still is not.
const POLITE_PROBE_EVERY: u32 = 8;

/// Whether a poller yields at an occasion to, after `unwanted` yields in
/// a row that ran no other thread and `skipped` occasions skipped since.
fn polite_yield_due(unwanted: u32, skipped: u32) -> bool {
    unwanted < UNWANTED_BEFORE_PROBING || skipped + 1 >= POLITE_PROBE_EVERY
}

thread_local! {
    /// Whether this thread handed packets to the kernel since it last
    /// gave up its CPU (see [`Shared::wait_with`]).
    static SENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes that this thread just handed packets to the kernel.
pub(crate) fn note_sent() {
    let _ = SENT.try_with(|s| s.set(true));
}

/// Whether this thread sent since the last call (and forgets it).
fn take_sent() -> bool {
    SENT.try_with(|s| s.replace(false)).unwrap_or(false)
}

/// A busy poller's yields ([`Shared::poll_politely`]).
#[derive(Default)]
pub(crate) struct Politeness {
    /// When the thread last yielded, or its first pass ran (the pass's
    /// engine time: no clock read of its own); None before that pass.
    since: Option<u64>,
    /// Yields in a row that let another thread run.
    shared: u32,
    /// Whether the last pass received packets.
    received: bool,
}

impl Politeness {
    /// Notes a pass at engine time `now` (the first one starts the clock)
    /// and whether it `received` packets.
    pub(crate) fn passed(&mut self, now: u64, received: bool) {
        self.since.get_or_insert(now);
        self.received = received;
    }

    /// Whether a poller that found nothing in its last pass yields before
    /// the next one at `now`, having `sent` packets since its last yield.
    /// While its last yield ran another thread, the CPU is wanted: it
    /// yields every round (a thread queued behind it runs within a round),
    /// until a yield finds nobody waiting.
    fn due(&self, now: u64, sent: bool) -> bool {
        let every = if self.shared > 0 {
            0
        } else {
            POLL_YIELD_EVERY_NS
        };
        sent || self.since.is_some_and(|t| now >= t + every)
    }
}

/// Threads polling the socket (low 32 bits) and, above them, how many
/// polling waits ended with their result: one atomic operation per wait
/// both leaves the poll and counts it.
pub(crate) struct Pollers(AtomicU64);

impl Default for Pollers {
    fn default() -> Self {
        Pollers(AtomicU64::new(0))
    }
}

const POLLER: u64 = 1;
const FOUND: u64 = 1 << 32;

impl Pollers {
    pub(crate) fn enter(&self) {
        self.0.fetch_add(POLLER, SeqCst);
    }
    /// Returns how many polled before (this thread included).
    pub(crate) fn leave(&self, found: bool) -> usize {
        let prev = if found {
            self.0.fetch_add(FOUND - POLLER, SeqCst)
        } else {
            self.0.fetch_sub(POLLER, SeqCst)
        };
        (prev & (FOUND - 1)) as usize
    }
    pub(crate) fn count(&self) -> usize {
        (self.0.load(SeqCst) & (FOUND - 1)) as usize
    }
    pub(crate) fn found(&self) -> u64 {
        self.0.load(Relaxed) >> 32
    }
    /// Counts a wait that found its result without polling at all.
    pub(crate) fn found_at_once(&self) {
        self.0.fetch_add(FOUND, Relaxed);
    }
}

/// What the background thread sees when it decides how to sleep: a snapshot
/// of the roles (who else drives the engine) and of the work waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BgView {
    pub(crate) now: u64,
    /// Polling threads or the async driver task hold the socket and run
    /// due timers themselves.
    pub(crate) pollers: bool,
    /// A thread sleeps on the socket (the watcher): it runs timers and
    /// packets itself.
    pub(crate) watcher: bool,
    /// Work that needs the socket watched at once when nobody else does:
    /// a sleeper waiting on a result, packets waiting for room in the
    /// socket.
    pub(crate) urgent: bool,
    /// A long message is going out: its grants must be heard, by the
    /// application's threads while they come and go, by the background
    /// thread once they have been away for `APP_IDLE_NS`.
    pub(crate) attention: bool,
    /// Whether that work is only a long message going out (nobody sleeps
    /// on a result, no RPC in flight): then watching ends with it.
    pub(crate) attention_only: bool,
    pub(crate) attention_until: u64,
    /// When the application will have been away for `APP_IDLE_NS` (client
    /// RPCs in flight, and the engine's timers, wait until then).
    pub(crate) app_idle_at: u64,
    /// The engine's next timer (plus its coalescing slack); `u64::MAX`: none.
    pub(crate) next_deadline: u64,
}

/// The background thread's decision: watch the socket or not, and when to
/// wake on its own (`u64::MAX`: only when rung or, if watching, on a packet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BgPlan {
    pub(crate) watch: bool,
    pub(crate) wake_at: u64,
}

/// Whether a background thread asleep until `sleep` looks at the endpoint
/// by the time it would take over from an application that leaves at `now`
/// (`APP_IDLE_NS` later).
pub(crate) fn looks_by_take_over(sleep: u64, now: u64) -> bool {
    sleep <= now.saturating_add(APP_IDLE_NS)
}

/// The background thread's rule, as a pure function of what it sees.
///
/// * Threads poll (or the async driver task runs): do not watch; wake only
///   for the backstop, `BG_BACKSTOP_NS` (100 wake-ups a second at most
///   while the application is busy), or, while a long message goes out,
///   every `APP_IDLE_NS`, so that a thread that leaves need not ring to
///   have its grants heard (a ring on every response of a 500 KB stream
///   had the background thread watch and drive against the application's
///   own threads: a third busy thread on 2 cores, fourteenth session).
/// * Only a watcher: sleep until rung (or, with a timer pending, the
///   backstop).
/// * Nobody drives and urgent work waits, or the application has been
///   away for `APP_IDLE_NS`: watch the socket and sleep until the next
///   timer (and, for a long message going out, no longer than its
///   attention window). A long message going out is not urgent: the
///   application's threads usually come straight back (their next send,
///   their next wait) and hear its grants; it is watched once they have
///   been away for `APP_IDLE_NS`.
/// * Nobody drives right now, but the application was inside the endpoint
///   less than `APP_IDLE_NS` ago (between two calls, usually): sleep until
///   it counts as away, then decide again. Its threads run the timers when
///   they come back; the background thread does not compete with them for
///   the engine lock (a lock holder preempted by a busy-polling thread on a
///   2-core machine stalled round trips for milliseconds).
///
/// So an application thread that leaves the endpoint rings nobody unless
/// someone sleeps on a result or packets need room (see
/// [`Shared::app_leaves`]): the background thread notices within
/// `BG_BACKSTOP_NS` that nobody is left and takes over `APP_IDLE_NS` after
/// the last call.
pub(crate) fn plan_background(v: &BgView) -> BgPlan {
    if v.pollers {
        // Busy threads: they run the timers; a periodic look (not a ring on
        // every call) notices when they have all gone.
        let look = if v.attention {
            APP_IDLE_NS
        } else {
            BG_BACKSTOP_NS
        };
        return BgPlan {
            watch: false,
            wake_at: v.now.saturating_add(look),
        };
    }
    if v.watcher {
        // A thread asleep on the socket runs timers and packets itself. With
        // no timer pending the background thread sleeps until rung (the
        // watcher rings when it gives the role up, `Shared::release_watcher`):
        // an idle server whose threads sleep in `recv_request` costs nothing.
        // With one pending, the backstop, as above, so that a watcher that
        // wakes with its result (and returns to the application) need not
        // ring every time.
        let wake_at = match v.next_deadline {
            u64::MAX => u64::MAX,
            t => t.max(v.now.saturating_add(BG_BACKSTOP_NS)),
        };
        return BgPlan {
            watch: false,
            wake_at,
        };
    }
    if v.urgent || v.now >= v.app_idle_at {
        let mut wake_at = v.next_deadline;
        if v.attention_only && v.attention_until > v.now {
            wake_at = wake_at.min(v.attention_until);
        }
        return BgPlan {
            watch: true,
            wake_at,
        };
    }
    BgPlan {
        watch: false,
        wake_at: v.app_idle_at,
    }
}

/// Whether the background thread, awake, runs the engine: when it watches
/// for an absent application (a packet came, or a timer is due), or when
/// a timer is overdue by the backstop (nobody else ran it).
pub(crate) fn background_drives(
    plan: &BgPlan,
    now: u64,
    next_deadline: u64,
    sock_ready: bool,
) -> bool {
    (plan.watch && (sock_ready || next_deadline <= now))
        || next_deadline.saturating_add(BG_BACKSTOP_NS) <= now
}

/// Who holds the socket and who sleeps: the state that the hand-over
/// between application threads, the async driver task and the background
/// thread reads and writes, every access sequentially consistent. Its
/// transitions are [`Roles::leaver_must_ring`] (a thread leaving) and
/// [`Roles::publish_plan`] (the background thread going to sleep); the
/// `loom` tests below check that together they never lose a wake-up.
pub(crate) struct Roles {
    /// Threads in the polling phase of a wait (they drive the engine).
    pub(crate) pollers: Pollers,
    /// Threads and tasks sleeping until a result arrives.
    pub(crate) blocked: AtomicUsize,
    /// The background thread currently has the socket in its poll set.
    pub(crate) bg_watching: AtomicBool,
    /// A blocked application thread sleeps on the socket itself (the
    /// "watcher"); it drives the engine when packets arrive.
    pub(crate) watcher: AtomicBool,
    /// The async driver task (feature `tokio`) has the socket registered
    /// with tokio's reactor and drives the engine when it is readable.
    pub(crate) reactor: AtomicBool,
    /// When the background thread will wake on its own (`u64::MAX`: never,
    /// 0: it is awake).
    pub(crate) bg_sleep_until: AtomicU64,
}

impl Default for Roles {
    fn default() -> Self {
        Roles {
            pollers: Pollers::default(),
            blocked: AtomicUsize::new(0),
            bg_watching: AtomicBool::new(false),
            watcher: AtomicBool::new(false),
            reactor: AtomicBool::new(false),
            bg_sleep_until: AtomicU64::new(0),
        }
    }
}

impl Roles {
    /// Whether someone other than the background thread holds the socket:
    /// polling threads, the watcher, or the async driver task.
    pub(crate) fn others_drive(&self) -> bool {
        self.pollers.count() > 0 || self.watcher.load(SeqCst) || self.reactor.load(SeqCst)
    }

    /// A thread that has just stopped driving (left the polling phase,
    /// given up the watcher role, or the driver task ended) asks whether it
    /// must ring the background thread: only if nobody else holds the
    /// socket and either `urgent` work waits (a sleeper, packets needing
    /// room, a long message) or the background thread sleeps without a
    /// wake-up time. It reads the background thread's sleep after its own
    /// change to the roles; [`Roles::publish_plan`] does the reverse.
    pub(crate) fn leaver_must_ring(&self, urgent: impl FnOnce() -> bool) -> bool {
        if self.others_drive() || self.bg_watching.load(SeqCst) {
            return false;
        }
        urgent() || self.bg_sleep_until.load(SeqCst) == u64::MAX
    }

    /// Whether the background thread must be rung to hear a long message's
    /// grants after the application leaves at `now`: only if nobody else
    /// drives and it sleeps past the moment it would take over
    /// (`now + APP_IDLE_NS`); while a long message goes out it plans to
    /// look at least that often ([`plan_background`]).
    pub(crate) fn attention_must_ring(&self, now: u64) -> bool {
        !self.others_drive()
            && !self.bg_watching.load(SeqCst)
            && !looks_by_take_over(self.bg_sleep_until.load(SeqCst), now)
    }

    /// The background thread publishes `plan` (whether it watches, when it
    /// wakes), then re-reads the roles through `replan` until the plan
    /// stands: a thread that left meanwhile either sees the published sleep
    /// (and rings) or is seen here.
    pub(crate) fn publish_plan(&self, mut plan: BgPlan, replan: impl Fn() -> BgPlan) -> BgPlan {
        loop {
            self.bg_watching.store(plan.watch, SeqCst);
            self.bg_sleep_until.store(plan.wake_at.max(1), SeqCst);
            let again = replan();
            if again.watch == plan.watch && again.wake_at >= plan.wake_at {
                return plan;
            }
            plan = again;
        }
    }
}

/// Leaves the polling phase of a wait when dropped (only on unwinding; the
/// wait leaves it explicitly otherwise).
pub(crate) struct PollerGuard<'a>(&'a Shared);

impl Drop for PollerGuard<'_> {
    fn drop(&mut self) {
        self.0.leave_polling(self.0.now_ns(), false);
    }
}

impl Shared {
    pub(crate) fn ring(&self) {
        self.counters.rings.fetch_add(1, Relaxed);
        self.doorbell.ring();
    }

    /// Whether a thread that stops polling or watching must hand the socket
    /// to the background thread at once: someone sleeps on a result, or
    /// packets wait for room. (Client RPCs in flight and long messages
    /// going out wait for the idle take-over, `APP_IDLE_NS`; see
    /// [`Roles::attention_must_ring`].)
    pub(crate) fn needs_watch_now(&self) -> bool {
        self.roles.blocked.load(SeqCst) > 0 || self.tx_pending.load(SeqCst)
    }

    /// Whether a long message needs its grants heard after `now`.
    pub(crate) fn attention_until_after(&self, now: u64) -> bool {
        self.attention_until.load(SeqCst) > now
    }

    /// Called when a thread stops polling: counts the wait and, if it was
    /// the last poller, hands over ([`Self::app_leaves`]).
    /// `found`: the wait ended with its result (counted in
    /// `RuntimeStats::found_polling`).
    pub(crate) fn leave_polling(&self, now: u64, found: bool) {
        // A send of the last pass is no reason to yield at the next wait
        // (a send before it is); a sleeper gives its CPU away anyway.
        take_sent();
        self.last_app.store(now, Relaxed);
        if self.roles.pollers.leave(found) == 1 {
            self.app_leaves();
        }
    }

    /// The hand-over when an application thread leaves the endpoint with
    /// nobody else driving it (the last poller stops, the watcher wakes, the
    /// async driver task ends). The background thread is rung only if it
    /// must watch the socket at once (someone sleeps on a result, packets
    /// wait for room, a long message goes out) or if it sleeps without a
    /// wake-up time (it planned while only a watcher was there). Otherwise
    /// its backstop wake-up notices the application has gone: the common
    /// case, a `call` that ends with its response, rings nobody.
    ///
    /// The background thread publishes its sleep before re-reading the
    /// roles (see [`Self::background`]), and this reads the sleep after
    /// changing the roles, both sequentially consistent: either it sees this
    /// thread gone, or this thread sees its sleep and rings.
    pub(crate) fn app_leaves(&self) {
        if self.roles.leaver_must_ring(|| self.needs_watch_now())
            || (self.attention_until.load(SeqCst) != 0 && {
                // A long message was sent once (see `need_attention`): is
                // it still going out, and must the background thread be
                // rung for it? One clock read for both.
                let now = self.now_ns();
                self.attention_until_after(now) && self.roles.attention_must_ring(now)
            })
        {
            self.ring();
        }
    }

    /// Called when a task (or a thread that could not become the watcher)
    /// is about to sleep: someone must be watching the socket for it.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn enter_blocked(&self) {
        self.roles.blocked.fetch_add(1, SeqCst);
        if !self.roles.watcher.load(SeqCst)
            && !self.roles.reactor.load(SeqCst)
            && !self.roles.bg_watching.load(SeqCst)
        {
            self.ring();
        }
    }

    /// Gives up the watcher role; if others still wait, the background
    /// thread takes over the socket.
    pub(crate) fn release_watcher(&self) {
        self.roles.watcher.store(false, SeqCst);
        self.app_leaves();
    }

    /// The watcher's sleep: on the socket and its own doorbell, then drive
    /// the engine if packets (or room to send) arrived.
    pub(crate) fn watch_socket(&self, timeout: Option<Duration>) {
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
            let mut d = self.lock_engine();
            let now = self.clock(&mut d);
            d.watcher_driving = true;
            self.drive(&mut d, now, true);
            d.watcher_driving = false;
            release(d);
        }
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn leave_blocked(&self) {
        self.roles.blocked.fetch_sub(1, SeqCst);
    }

    /// Polling politely ([`EndpointConfig::poll_yield`]), called before
    /// each pass of a busy poll: a thread that just sent, or has polled for
    /// `POLL_YIELD_EVERY` since it last yielded, gives its CPU away once.
    /// On loopback the datagram's receiver, woken by the send, is often
    /// queued on the sender's CPU; with more pollers than cores, a woken
    /// thread is queued behind one. Without the yield it waits for the
    /// whole poll period (docs/runtime.md, "Polling politely"). A response
    /// cannot come back before its receiver has run, so the yield after a
    /// send costs nothing when nobody else is runnable here.
    ///
    /// [`EndpointConfig::poll_yield`]: crate::EndpointConfig::poll_yield
    pub(crate) fn poll_politely(&self, p: &mut Politeness, now: u64) {
        if !self.cfg.poll_yield {
            return;
        }
        // A thread whose last pass received packets is working, not
        // waiting, and may have left more in the socket: a backend's second
        // and third requests of a fan-out, behind the first it just
        // answered. It polls again at once; a send is yielded for when a
        // pass finds nothing. (Yielding here gave the CPU to a spinning
        // client for ~5 µs per request: time trace of `rpc-bench`'s
        // 3-nested fan-out.)
        if p.received || !p.due(now, take_sent()) {
            return;
        }
        // A thread whose yields keep finding nobody else wanting its CPU
        // (each poller on a core of its own, as in a one-stream echo) pays
        // ~0.5 µs per yield on its critical path: it yields only to probe
        // until a yield runs another thread again.
        let (unwanted, skipped) = UNWANTED.try_with(|u| u.get()).unwrap_or((0, 0));
        if !polite_yield_due(unwanted, skipped) {
            let _ = UNWANTED.try_with(|u| u.set((unwanted, skipped + 1)));
            p.since = Some(now);
            return;
        }
        let (ran_another, after) = self.yield_cpu();
        let _ = UNWANTED.try_with(|u| {
            u.set(if ran_another {
                (0, 0)
            } else {
                (unwanted.saturating_add(1), 0)
            })
        });
        if ran_another {
            p.shared += 1;
            if p.shared >= SHARED_YIELDS_BEFORE_MOVE {
                p.shared = 0;
                self.move_off_shared_cpu();
            }
        } else {
            p.shared = 0;
        }
        p.since = Some(after);
    }

    /// Yields the CPU (counted in `poll_yields`); returns whether that ran
    /// another thread (it took longer than [`YIELD_SHARED_NS`]) and the
    /// time after it.
    fn yield_cpu(&self) -> (bool, u64) {
        self.counters.poll_yields.fetch_add(1, Relaxed);
        let before = self.now_ns();
        std::thread::yield_now();
        let after = self.now_ns();
        (after.saturating_sub(before) > YIELD_SHARED_NS, after)
    }

    /// After a stream read or write of `bytes`: if that was bulk work (at
    /// least [`BULK_BYTES`]), yields the CPU if the last yield found another
    /// thread waiting for it, and every [`BULK_PROBE_EVERY`]th time
    /// otherwise, to find out. A stream's reader and writer have work on
    /// nearly every call and never wait, so without this they kept their
    /// CPUs for whole scheduler slices while short RPCs' threads on the
    /// same machine waited behind them (issue #21: 100 B RPCs beside a
    /// saturating stream, four threads on two cores). Alone, the probe
    /// costs one `sched_yield` (~0.5 µs) per eight operations.
    pub(crate) fn give_way(&self, bytes: usize) {
        if bytes < BULK_BYTES || !self.cfg.poll_yield {
            return;
        }
        let (ops, wanted) = BULK.try_with(|b| b.get()).unwrap_or((0, false));
        if !bulk_yield_due(ops, wanted) {
            let _ = BULK.try_with(|b| b.set((ops + 1, false)));
            return;
        }
        let (ran_another, _) = self.yield_cpu();
        let _ = BULK.try_with(|b| b.set((0, ran_another)));
    }

    /// Two threads that poll and yield to each other take turns on one CPU
    /// while another idles: the scheduler does not migrate a task that ran
    /// within the last half millisecond, and these run every few µs. A
    /// poller that keeps finding its CPU shared moves itself off it (see
    /// [`crate::sys::move_off_this_cpu`]: its allowed CPUs are unchanged),
    /// at most once per `MOVE_EVERY_NS`.
    fn move_off_shared_cpu(&self) {
        let now = crate::sys::monotonic_ns();
        let due = LAST_MOVE
            .try_with(|t| {
                let last = t.get();
                let due = last == 0 || now >= last + MOVE_EVERY_NS;
                if due {
                    t.set(now.max(1));
                }
                due
            })
            .unwrap_or(false);
        if due && crate::sys::move_off_this_cpu() {
            self.counters.poll_shared_cpu.fetch_add(1, Relaxed);
        }
    }

    /// The waiting strategy shared by every blocking call: check, busy-poll
    /// (driving the engine ourselves) for `poll`, then sleep until woken.
    /// Returns `None` at the deadline or on shutdown.
    pub(crate) fn wait_with<T>(
        &self,
        deadline: Option<u64>,
        mut serving: Option<&mut Serving>,
        mut locked: Option<&mut LockedCheck<'_>>,
        mut check: impl FnMut() -> Option<T>,
        mut register: impl FnMut(Waiter) -> Option<Option<u64>>,
        mut deregister: impl FnMut(Option<u64>),
    ) -> Option<T> {
        if let Some(v) = check() {
            self.roles.pollers.found_at_once();
            return Some(v);
        }
        self.roles.pollers.enter();
        // A serve handler that panics unwinds out of this loop: stop counting
        // as a poller then too, or the background thread would never take
        // the socket over when the endpoint goes idle.
        let unwinding = PollerGuard(self);
        // The polling phase ends `poll_ns` after the first pass (whose
        // engine time serves as the start: no extra clock read), or after
        // the last pass that received packets: a thread that keeps driving
        // the engine through a long message keeps doing it, instead of
        // sleeping as the watcher and being woken for every packet (the
        // server of a 500 KB stream slept in each of its ~5,000 waits a
        // second, fourteenth session).
        let mut poll_end = None;
        // (The previous pass's engine time; none before the first pass.)
        let mut now = 0;
        let mut served = serving.as_ref().map_or(0, |s| s.served);
        let mut busy_lock = 0u32;
        let mut polite = Politeness::default();
        let found = loop {
            self.poll_politely(&mut polite, now);
            let mut received = false;
            now = match self.drive_once_serving(serving.as_deref_mut(), locked.as_deref_mut()) {
                Some(pass) => {
                    busy_lock = 0;
                    if pass.received {
                        poll_end = None;
                        received = true;
                    }
                    pass.now
                }
                None => {
                    // Someone else holds the engine. If that goes on, it
                    // may be a holder that this thread preempted (on a
                    // small machine, the background thread or another
                    // application thread): give it the CPU back.
                    busy_lock += 1;
                    if busy_lock.is_multiple_of(LOCK_SPINS_BEFORE_YIELD) {
                        std::thread::yield_now();
                    }
                    self.now_ns()
                }
            };
            polite.passed(now, received);
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
                // (A waiter that keeps receiving still stops at its deadline.)
                None if deadline.is_some_and(|d| now >= d) => break None,
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
        self.roles.blocked.fetch_add(1, SeqCst);
        let mut watching =
            !self.roles.watcher.load(SeqCst) && !self.roles.watcher.swap(true, SeqCst);
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
                watching =
                    !self.roles.watcher.load(SeqCst) && !self.roles.watcher.swap(true, SeqCst);
                if !watching
                    && !self.roles.watcher.load(SeqCst)
                    && !self.roles.bg_watching.load(SeqCst)
                {
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
                // Until the result, the deadline or the engine's next timer
                // (an earlier timer set meanwhile rings it, see `publish`).
                self.watch_socket(left);
            } else {
                match left {
                    Some(l) => std::thread::park_timeout(l),
                    None => std::thread::park(),
                }
            }
            deregister(token);
        };
        self.roles.blocked.fetch_sub(1, SeqCst);
        if watching {
            self.release_watcher();
        }
        r
    }

    pub(crate) fn wait_slot<T>(&self, slot: &Slot<T>, deadline: Option<u64>) -> Option<T> {
        self.wait_with(
            deadline,
            None,
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

    pub(crate) fn wait_queue<T>(
        &self,
        q: &WaitQueue<T>,
        deadline: Option<u64>,
    ) -> Result<Option<T>> {
        self.wait_queue_serving(q, deadline, None)
    }

    pub(crate) fn wait_queue_serving<T>(
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
            None,
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

    /// What [`plan_background`] decides on, read now.
    fn bg_view(&self) -> BgView {
        let now = self.now_ns();
        let blocked = self.roles.blocked.load(SeqCst) > 0;
        let inflight = self.inflight.load(SeqCst) > 0;
        let tx = self.tx_pending.load(SeqCst);
        let attention_until = self.attention_until.load(SeqCst);
        let attention = attention_until > now;
        BgView {
            now,
            pollers: self.roles.pollers.count() > 0 || self.roles.reactor.load(SeqCst),
            watcher: self.roles.watcher.load(SeqCst),
            urgent: blocked || tx,
            attention,
            attention_only: attention && !blocked && !inflight,
            attention_until,
            app_idle_at: self.last_app.load(Relaxed).saturating_add(APP_IDLE_NS),
            next_deadline: self.next_deadline.load(SeqCst),
        }
    }

    /// The background thread: sleeps until the next timer, a doorbell ring or
    /// (when nobody polls and someone waits) socket activity, then drives.
    pub(crate) fn background(self: Arc<Self>) {
        set_timer_slack_ns(1_000);
        while !self.shut.load(Acquire) {
            // Decide; publish the decision; re-read the roles and decide
            // again until nothing changed, so that a thread that left the
            // endpoint meanwhile is not missed (it reads our sleep after
            // leaving, we read the roles after publishing it).
            let plan = self
                .roles
                .publish_plan(plan_background(&self.bg_view()), || {
                    plan_background(&self.bg_view())
                });
            let BgPlan { watch, wake_at } = plan;
            let now = self.now_ns();
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
            self.roles.bg_sleep_until.store(0, SeqCst);
            if fds[0].revents != 0 {
                self.doorbell.drain();
            }
            if self.shut.load(Acquire) {
                break;
            }
            let sock_ready = nfds == 2 && fds[1].revents != 0;
            let view = self.bg_view();
            let drive = background_drives(
                &plan_background(&view),
                view.now,
                view.next_deadline,
                sock_ready,
            );
            if drive {
                self.counters.bg_drives.fetch_add(1, Relaxed);
                let mut d = self.lock_engine();
                let now = self.clock(&mut d);
                self.drive(&mut d, now, true);
                release(d);
            }
        }
    }
}

#[cfg(all(test, not(homa_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_poller_yields_after_a_send_every_period_and_every_round_while_contended() {
        let mut p = Politeness::default();
        // Before its first pass: only a send makes it yield.
        assert!(!p.due(0, false));
        assert!(p.due(0, true));
        p.passed(1_000, false);
        assert!(!p.due(1_000 + POLL_YIELD_EVERY_NS - 1, false));
        assert!(p.due(1_000 + POLL_YIELD_EVERY_NS, false));
        assert!(p.due(1_001, true));
        // After a yield that ran another thread: every round.
        p.shared = 1;
        assert!(p.due(1_001, false));
    }

    /// Yields that find the CPU wanted by nobody else make a poller yield
    /// only to probe: at one occasion in `POLITE_PROBE_EVERY`, after
    /// `UNWANTED_BEFORE_PROBING` such yields in a row.
    #[test]
    fn a_poller_whose_cpu_nobody_wants_yields_only_to_probe() {
        for unwanted in 0..UNWANTED_BEFORE_PROBING {
            assert!(polite_yield_due(unwanted, 0));
        }
        let due: Vec<bool> = (0..2 * POLITE_PROBE_EVERY)
            .map(|skipped| polite_yield_due(UNWANTED_BEFORE_PROBING, skipped))
            .collect();
        assert_eq!(
            due.iter().filter(|&&d| d).count() as u32,
            POLITE_PROBE_EVERY + 1
        );
        assert!(!due[0] && due[POLITE_PROBE_EVERY as usize - 1]);
    }

    #[test]
    fn a_pass_that_received_is_not_followed_by_a_yield_and_keeps_the_send() {
        // A thread with three requests queued answers the first, sends,
        // and must take the second before it yields for that send.
        let ep = crate::Endpoint::bind("127.0.0.1:0").unwrap();
        let shared = ep.shared();
        let _ = take_sent();
        let mut p = Politeness::default();
        p.passed(1_000, true);
        note_sent();
        shared.poll_politely(&mut p, 1_000 + 10 * POLL_YIELD_EVERY_NS);
        assert_eq!(shared.counters.poll_yields.load(Relaxed), 0);
        // The next pass finds nothing: now the send is yielded for.
        p.passed(1_100, false);
        shared.poll_politely(&mut p, 1_100);
        assert_eq!(shared.counters.poll_yields.load(Relaxed), 1);
        assert!(!take_sent());
    }

    #[test]
    fn bulk_work_gives_way_every_time_while_the_cpu_is_wanted_and_probes_otherwise() {
        // Alone: every BULK_PROBE_EVERY-th operation yields, to find out.
        let due: Vec<bool> = (0..BULK_PROBE_EVERY)
            .map(|ops| bulk_yield_due(ops, false))
            .collect();
        assert_eq!(due.iter().filter(|&&d| d).count(), 1);
        assert!(due[BULK_PROBE_EVERY as usize - 1]);
        // Once a yield ran another thread: after every operation.
        assert!((0..BULK_PROBE_EVERY).all(|ops| bulk_yield_due(ops, true)));
    }

    #[test]
    fn bulk_stream_reads_and_writes_give_way_now_and_then_when_alone() {
        let a = crate::Endpoint::bind("127.0.0.1:0").unwrap();
        let b = crate::Endpoint::bind("127.0.0.1:0").unwrap();
        let addr = b.local_addr();
        let reader = std::thread::spawn(move || {
            let mut s = b.accept_stream().unwrap();
            let mut got = 0;
            while let Some(c) = s.recv_chunk().unwrap() {
                got += c.bytes.len();
            }
            (got, b.shared().counters.poll_yields.load(Relaxed))
        });
        let mut s = a.open_stream(addr).unwrap();
        let before = a.shared().counters.poll_yields.load(Relaxed);
        let n = 4 * BULK_PROBE_EVERY as usize;
        for _ in 0..n {
            s.send(vec![0u8; BULK_BYTES]).unwrap();
        }
        s.finish().unwrap();
        let (got, _) = reader.join().unwrap();
        assert_eq!(got, n * BULK_BYTES);
        // The writer yielded at least once per BULK_PROBE_EVERY writes
        // (and its waits for credit may have yielded too).
        let yields = a.shared().counters.poll_yields.load(Relaxed) - before;
        assert!(yields >= 4, "{yields} yields in {n} bulk writes");
    }

    fn view() -> BgView {
        BgView {
            now: 1_000_000_000,
            pollers: false,
            watcher: false,
            urgent: false,
            attention: false,
            attention_only: false,
            attention_until: 0,
            app_idle_at: 1_000_500_000,
            next_deadline: u64::MAX,
        }
    }

    #[test]
    fn pollers_mean_a_backstop_only() {
        let v = BgView {
            pollers: true,
            urgent: true,
            next_deadline: 1_000_000_100,
            ..view()
        };
        let p = plan_background(&v);
        assert!(!p.watch);
        assert_eq!(p.wake_at, v.now + BG_BACKSTOP_NS);
    }

    #[test]
    fn a_lone_watcher_lets_the_background_thread_sleep() {
        let idle = BgView {
            watcher: true,
            ..view()
        };
        assert_eq!(
            plan_background(&idle),
            BgPlan {
                watch: false,
                wake_at: u64::MAX
            }
        );
        let busy = BgView {
            next_deadline: 1_000_000_100,
            ..idle
        };
        assert_eq!(plan_background(&busy).wake_at, busy.now + BG_BACKSTOP_NS);
    }

    #[test]
    fn between_calls_it_waits_for_the_application_to_go_idle() {
        // Not the engine's timer: the application's threads run it when
        // they come back.
        let v = BgView {
            next_deadline: 1_000_000_100,
            ..view()
        };
        assert_eq!(
            plan_background(&v),
            BgPlan {
                watch: false,
                wake_at: v.app_idle_at
            }
        );
    }

    #[test]
    fn urgent_work_or_an_idle_application_is_watched() {
        let v = BgView {
            urgent: true,
            next_deadline: 1_000_000_100,
            ..view()
        };
        assert_eq!(
            plan_background(&v),
            BgPlan {
                watch: true,
                wake_at: 1_000_000_100
            }
        );
        let idle = BgView {
            now: 2_000_000_000,
            ..view()
        };
        assert_eq!(
            plan_background(&idle),
            BgPlan {
                watch: true,
                wake_at: u64::MAX
            }
        );
        // A long message going out, the application gone for APP_IDLE_NS:
        // watched until its attention window ends.
        let long_send = BgView {
            now: 1_000_500_000,
            attention: true,
            attention_only: true,
            attention_until: 1_003_000_000,
            ..view()
        };
        assert_eq!(
            plan_background(&long_send),
            BgPlan {
                watch: true,
                wake_at: 1_003_000_000
            }
        );
    }

    #[test]
    fn a_long_message_waits_for_the_application_to_go_idle() {
        // The application was just inside: it hears the grants itself when
        // it comes back; the background thread looks again when it would
        // count as away.
        let just_sent = BgView {
            attention: true,
            attention_only: true,
            attention_until: 1_003_000_000,
            ..view()
        };
        assert_eq!(
            plan_background(&just_sent),
            BgPlan {
                watch: false,
                wake_at: just_sent.app_idle_at
            }
        );
        // Threads poll: look every APP_IDLE_NS instead of the backstop, so
        // that the last one to leave need not ring.
        let polled = BgView {
            pollers: true,
            ..just_sent
        };
        assert_eq!(
            plan_background(&polled),
            BgPlan {
                watch: false,
                wake_at: polled.now + APP_IDLE_NS
            }
        );
    }

    #[test]
    fn a_long_message_rings_only_a_background_thread_asleep_for_longer() {
        let r = Roles::default();
        let now = 1_000_000;
        r.bg_sleep_until.store(now + BG_BACKSTOP_NS, SeqCst);
        assert!(r.attention_must_ring(now));
        r.bg_sleep_until.store(now + APP_IDLE_NS, SeqCst);
        assert!(!r.attention_must_ring(now), "it looks in time");
        r.bg_sleep_until.store(0, SeqCst);
        assert!(!r.attention_must_ring(now), "awake: it plans next");
        r.bg_sleep_until.store(u64::MAX, SeqCst);
        r.pollers.enter();
        assert!(!r.attention_must_ring(now), "a poller hears the grants");
        r.pollers.leave(true);
        assert!(r.attention_must_ring(now));
        r.bg_watching.store(true, SeqCst);
        assert!(!r.attention_must_ring(now));
    }

    #[test]
    fn the_background_thread_drives_only_when_watching_or_overdue() {
        let watch = BgPlan {
            watch: true,
            wake_at: 0,
        };
        let rest = BgPlan {
            watch: false,
            wake_at: 0,
        };
        assert!(background_drives(&watch, 10, u64::MAX, true));
        assert!(background_drives(&watch, 10, 10, false));
        assert!(!background_drives(&watch, 10, 11, false));
        // Busy threads have the socket: not even a due timer (they run it).
        assert!(!background_drives(&rest, 10, 10, true));
        assert!(background_drives(&rest, BG_BACKSTOP_NS + 10, 10, false));
    }

    #[test]
    fn a_leaver_rings_only_for_urgent_work_or_a_sleeper_without_wake_up() {
        let r = Roles::default();
        r.bg_sleep_until.store(5, SeqCst);
        assert!(!r.leaver_must_ring(|| false));
        assert!(r.leaver_must_ring(|| true));
        r.pollers.enter();
        assert!(!r.leaver_must_ring(|| true), "another poller drives");
        r.pollers.leave(true);
        r.bg_sleep_until.store(u64::MAX, SeqCst);
        assert!(r.leaver_must_ring(|| false));
        r.bg_watching.store(true, SeqCst);
        assert!(!r.leaver_must_ring(|| true));
    }
}

/// Model checks of the hand-over: every interleaving of a thread that
/// leaves the endpoint with a sleeper waiting and the background thread
/// deciding how to sleep ends with the socket watched (or a ring sent).
#[cfg(all(test, homa_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    fn plan_of(r: &Roles, now: u64) -> BgPlan {
        plan_background(&BgView {
            now,
            pollers: r.pollers.count() > 0,
            watcher: r.watcher.load(SeqCst),
            urgent: r.blocked.load(SeqCst) > 0,
            attention: false,
            attention_only: false,
            attention_until: 0,
            app_idle_at: now + APP_IDLE_NS,
            next_deadline: u64::MAX,
        })
    }

    #[test]
    fn a_poller_that_leaves_a_sleeper_is_never_lost() {
        loom::model(|| {
            let roles = Arc::new(Roles::default());
            roles.pollers.enter();
            let leaver = {
                let roles = roles.clone();
                loom::thread::spawn(move || {
                    // A waiter that stops polling and sleeps (not as the
                    // watcher): counted as blocked, then leaves.
                    roles.blocked.fetch_add(1, SeqCst);
                    roles.pollers.leave(false);
                    roles.leaver_must_ring(|| roles.blocked.load(SeqCst) > 0)
                })
            };
            let plan = roles.publish_plan(plan_of(&roles, 0), || plan_of(&roles, 0));
            let rang = leaver.join().unwrap();
            assert!(
                rang || plan.watch,
                "the sleeper is watched by nobody: {plan:?}"
            );
        });
    }

    #[test]
    fn a_poller_that_leaves_a_long_message_is_heard_in_time() {
        // The last poller leaves at time 0 with a long message going out
        // and nobody sleeping: either it rings, or the background thread,
        // whatever it saw, looks again by APP_IDLE_NS (or watches).
        let plan_at = |r: &Roles, now: u64| {
            plan_background(&BgView {
                now,
                pollers: r.pollers.count() > 0,
                watcher: r.watcher.load(SeqCst),
                urgent: false,
                attention: true,
                attention_only: false,
                attention_until: now + 5 * APP_IDLE_NS,
                app_idle_at: APP_IDLE_NS,
                next_deadline: u64::MAX,
            })
        };
        loom::model(move || {
            let roles = Arc::new(Roles::default());
            roles.pollers.enter();
            // Planned before: asleep until the backstop.
            roles.bg_sleep_until.store(BG_BACKSTOP_NS, SeqCst);
            let leaver = {
                let roles = roles.clone();
                loom::thread::spawn(move || {
                    roles.pollers.leave(true);
                    roles.attention_must_ring(0)
                })
            };
            let plan = roles.publish_plan(plan_at(&roles, 0), || plan_at(&roles, 0));
            let rang = leaver.join().unwrap();
            assert!(
                rang || plan.watch || plan.wake_at <= APP_IDLE_NS,
                "the long message waits past the take-over: {plan:?}"
            );
        });
    }

    #[test]
    fn a_watcher_that_gives_up_its_role_hands_over() {
        loom::model(|| {
            let roles = Arc::new(Roles::default());
            roles.watcher.store(true, SeqCst);
            roles.blocked.fetch_add(1, SeqCst);
            let leaver = {
                let roles = roles.clone();
                loom::thread::spawn(move || {
                    // The watcher's result came; another thread still sleeps
                    // (blocked stays 1) on a result of its own.
                    roles.watcher.store(false, SeqCst);
                    roles.leaver_must_ring(|| roles.blocked.load(SeqCst) > 0)
                })
            };
            let plan = roles.publish_plan(plan_of(&roles, 0), || plan_of(&roles, 0));
            let rang = leaver.join().unwrap();
            assert!(rang || plan.watch, "nobody watches: {plan:?}");
        });
    }
}
