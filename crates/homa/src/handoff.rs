//! Who drives the engine and who sleeps: busy-polling waiters, the watcher
//! (one sleeping waiter in `ppoll` on the socket), async tasks and the
//! background thread, and the rules that hand the socket from one to the
//! other without losing a wake-up.

use crate::driver::{release, RpcResult};
use crate::error::{Error, Result};
use crate::serve::{wait_in_handler, Serving};
use crate::shared::Shared;
use crate::sys::{ppoll, set_timer_slack_ns};
use crate::timetrace;
use crate::wait::{Slot, WaitQueue, Waiter};
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

/// While application threads are polling, the background thread still wakes
/// this often if a timer is pending (they run timers too, this is a backstop).
/// Kept long: every wake-up of an extra thread preempts a polling one on a
/// busy machine and shows up in the latency tail.
const BG_BACKSTOP_NS: u64 = 10_000_000;
/// The background thread never sleeps longer than this, so a protocol timer
/// (resend, timeout; hundreds of µs apart) set while it sleeps runs at most
/// this late without anyone ringing it.
pub(crate) const BG_MAX_SLEEP_NS: u64 = 2_000_000;
/// When no application thread has been inside the endpoint for this long,
/// the background thread watches the socket itself, so that the engine keeps
/// answering peers (grants, BUSY, acks) while the application is busy
/// elsewhere, as the kernel does for the Linux module.
const APP_IDLE_NS: u64 = 1_000_000;

/// Threads polling the socket (low 32 bits) and, above them, how many
/// polling waits ended with their result: one atomic operation per wait
/// both leaves the poll and counts it.
#[derive(Default)]
pub(crate) struct Pollers(AtomicU64);

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
    /// to the background thread at once: someone sleeps on a result, packets
    /// wait for room, or a long message is going out. (Client RPCs merely in
    /// flight can wait for the idle take-over, `APP_IDLE_NS`.)
    pub(crate) fn needs_watch_now(&self) -> bool {
        self.blocked.load(SeqCst) > 0 || self.tx_pending.load(SeqCst) || self.attention_pending()
    }

    /// Whether a long message still needs its grants heard (see
    /// [`Self::need_attention`]); reads the clock only if one was sent.
    pub(crate) fn attention_pending(&self) -> bool {
        let until = self.attention_until.load(SeqCst);
        until != 0 && until > self.now_ns()
    }

    /// Whether the socket needs someone's attention when no thread polls.
    pub(crate) fn needs_watch(&self) -> bool {
        self.blocked.load(SeqCst) > 0
            || self.inflight.load(SeqCst) > 0
            || self.tx_pending.load(SeqCst)
            || self.attention_pending()
    }

    /// Called when a thread stops polling: if it was the last and work
    /// remains, make sure the background thread is watching.
    /// `found`: the wait ended with its result (counted in
    /// `RuntimeStats::found_polling`).
    pub(crate) fn leave_polling(&self, now: u64, found: bool) {
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
    pub(crate) fn release_watcher(&self) {
        self.watcher.store(false, SeqCst);
        if self.pollers.count() == 0 && self.needs_watch_now() && !self.bg_watching.load(SeqCst) {
            self.ring();
        }
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
    pub(crate) fn wait_with<T>(
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

    pub(crate) fn wait_slot(
        &self,
        slot: &Slot<RpcResult>,
        deadline: Option<u64>,
    ) -> Option<RpcResult> {
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

    /// The background thread: sleeps until the next timer, a doorbell ring or
    /// (when nobody polls and someone waits) socket activity, then drives.
    pub(crate) fn background(self: Arc<Self>) {
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
