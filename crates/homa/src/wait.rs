//! Places where application threads (or async tasks) wait for results: a
//! one-shot slot per private RPC and a queue with waiters for incoming
//! requests and shared responses. A result is published with an atomic flag
//! that a polling thread checks without taking any lock; only a sleeper needs
//! the wake-up (unpark or `Waker::wake`).

use crate::sys::EventFd;
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::thread::Thread;

/// Someone to wake when a result arrives.
pub(crate) enum Waiter {
    Thread(Thread),
    /// A thread sleeping in `ppoll` on the socket and this doorbell.
    Fd(Arc<EventFd>),
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    Task(Waker),
}

impl Waiter {
    pub(crate) fn current_thread() -> Waiter {
        Waiter::Thread(std::thread::current())
    }
    pub(crate) fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Fd(f) => f.ring(),
            Waiter::Task(w) => w.wake(),
        }
    }
}

/// A re-armable wake-up for one reader of a partial message
/// ([`crate::IncomingMessage`]): the reader registers before it sleeps and
/// checks its condition again afterwards; the driver takes the waiter when
/// the engine reports progress. A stale waiter only costs a spurious wake.
#[derive(Default)]
pub(crate) struct Notify {
    waiter: Mutex<Option<Waiter>>,
}

impl Notify {
    pub(crate) fn register(&self, w: Waiter) {
        *self.waiter.lock() = Some(w);
    }
    pub(crate) fn take(&self) -> Option<Waiter> {
        self.waiter.lock().take()
    }
}

/// The result of one private RPC: a one-shot channel from the engine's
/// driver (which completes it, always under the engine lock, so completions
/// never race each other) to the RPC's one owner (which takes the result or
/// registers a waiter). Lock-free: completing is one atomic swap, and a
/// polling owner's check is one load (a mutex here cost two lock round
/// trips per RPC on the short-RPC path).
pub(crate) struct Slot<T> {
    state: AtomicU8,
    /// Written by the completer before `state` becomes `DONE`; read by the
    /// owner only after it has seen `DONE`.
    value: UnsafeCell<Option<T>>,
    /// Written by the owner while `state` is `EMPTY` (it then publishes it
    /// by moving to `WAITING`); taken by the completer if it finds
    /// `WAITING`, or by the owner when it moves back from `WAITING`.
    waiter: UnsafeCell<Option<Waiter>>,
}

const EMPTY: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;

// SAFETY: the cells are handed between threads only through `state`'s
// Release/Acquire transitions (see the fields); `T` and `Waiter` are `Send`.
unsafe impl<T: Send> Sync for Slot<T> {}
// SAFETY: the same reasoning as for the impl above.
unsafe impl<T: Send> Send for Slot<T> {}

impl<T> Slot<T> {
    pub(crate) fn new() -> Slot<T> {
        Slot {
            state: AtomicU8::new(EMPTY),
            value: UnsafeCell::new(None),
            waiter: UnsafeCell::new(None),
        }
    }
    /// Lock-free check for the polling loop.
    pub(crate) fn is_done(&self) -> bool {
        self.state.load(Ordering::Acquire) == DONE
    }
    /// Stores the result (only the first one counts) and returns the waiter
    /// to wake. The caller wakes it after releasing the engine lock, so the
    /// woken thread does not immediately collide with it. Callers hold the
    /// engine lock: completions never run concurrently.
    #[must_use]
    pub(crate) fn complete(&self, v: T) -> Option<Waiter> {
        if self.state.load(Ordering::Acquire) == DONE {
            return None;
        }
        // SAFETY: not DONE yet, so the owner does not read `value`, and no
        // other completer runs (engine lock).
        unsafe { *self.value.get() = Some(v) };
        if self.state.swap(DONE, Ordering::AcqRel) == WAITING {
            // SAFETY: the owner published its waiter (WAITING) and can no
            // longer take it back (its move back from WAITING now fails).
            unsafe { (*self.waiter.get()).take() }
        } else {
            None
        }
    }
    /// Takes the result if it is there (the owner only).
    pub(crate) fn take(&self) -> Option<T> {
        if !self.is_done() {
            return None;
        }
        // SAFETY: DONE was seen with Acquire: the completer's write is
        // visible and it never writes again; only the owner calls this.
        unsafe { (*self.value.get()).take() }
    }
    /// Registers a waiter unless the result is already there (then returns
    /// false and the caller should take it). The owner only.
    pub(crate) fn register(&self, w: Waiter) -> bool {
        match self.state.load(Ordering::Acquire) {
            DONE => return false,
            WAITING => {
                // Take the old waiter back before replacing it.
                if self
                    .state
                    .compare_exchange(WAITING, EMPTY, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    return false; // DONE meanwhile
                }
                // SAFETY: back to EMPTY by our own move: the completer
                // leaves the cell alone.
                drop(unsafe { (*self.waiter.get()).take() });
            }
            _ => {}
        }
        // SAFETY: EMPTY, and only the owner moves EMPTY to WAITING.
        unsafe { *self.waiter.get() = Some(w) };
        if self
            .state
            .compare_exchange(EMPTY, WAITING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // DONE meanwhile: the completer did not see our waiter.
            // SAFETY: it moved EMPTY to DONE, so it left the cell alone.
            drop(unsafe { (*self.waiter.get()).take() });
            return false;
        }
        true
    }
}

/// A FIFO of results with FIFO waiters: each pushed item wakes one waiter.
pub(crate) struct WaitQueue<T> {
    len: AtomicUsize,
    inner: Mutex<QueueInner<T>>,
}

struct QueueInner<T> {
    items: VecDeque<T>,
    waiters: VecDeque<(u64, Waiter)>,
    next_token: u64,
}

impl<T> WaitQueue<T> {
    pub(crate) fn new() -> WaitQueue<T> {
        WaitQueue {
            len: AtomicUsize::new(0),
            inner: Mutex::new(QueueInner {
                items: VecDeque::new(),
                waiters: VecDeque::new(),
                next_token: 0,
            }),
        }
    }
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
    /// Appends an item and returns the waiter to wake (see [`Slot::complete`]).
    #[must_use]
    pub(crate) fn push(&self, v: T) -> Option<Waiter> {
        let mut g = self.inner.lock();
        g.items.push_back(v);
        self.len.store(g.items.len(), Ordering::Release);
        g.waiters.pop_front().map(|(_, w)| w)
    }
    /// Takes the oldest item; lock-free when the queue is empty.
    pub(crate) fn try_pop(&self) -> Option<T> {
        if self.len() == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        let v = g.items.pop_front();
        self.len.store(g.items.len(), Ordering::Release);
        v
    }
    /// Registers a waiter; returns its token, or `None` if an item is already
    /// there (the caller should pop instead of sleeping).
    pub(crate) fn register(&self, w: Waiter) -> Option<u64> {
        let mut g = self.inner.lock();
        if !g.items.is_empty() {
            return None;
        }
        let t = g.next_token;
        g.next_token += 1;
        g.waiters.push_back((t, w));
        Some(t)
    }
    /// Withdraws a waiter that stops waiting without an item. If it had
    /// already been chosen for a wake-up, the wake-up is passed on so that
    /// no item is left with a sleeping waiter and nobody woken.
    pub(crate) fn deregister(&self, token: u64) {
        let pass_on = {
            let mut g = self.inner.lock();
            if let Some(i) = g.waiters.iter().position(|(t, _)| *t == token) {
                g.waiters.remove(i);
                None
            } else if !g.items.is_empty() {
                g.waiters.pop_front()
            } else {
                None
            }
        };
        if let Some((_, w)) = pass_on {
            w.wake();
        }
    }
    /// Wakes every waiter (shutdown).
    pub(crate) fn wake_all(&self) {
        let ws: Vec<_> = self.inner.lock().waiters.drain(..).collect();
        for (_, w) in ws {
            w.wake();
        }
    }
    /// Removes and returns every item.
    pub(crate) fn drain(&self) -> Vec<T> {
        let mut g = self.inner.lock();
        self.len.store(0, Ordering::Release);
        g.items.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn slot_first_result_wins_and_wakes_sleeper() {
        let s = Arc::new(Slot::<u32>::new());
        let s2 = s.clone();
        let h = std::thread::spawn(move || {
            assert!(s2.register(Waiter::current_thread()));
            while !s2.is_done() {
                std::thread::park_timeout(Duration::from_secs(5));
            }
            s2.take()
        });
        std::thread::sleep(Duration::from_millis(10));
        s.complete(1).unwrap().wake();
        assert!(s.complete(2).is_none());
        assert_eq!(h.join().unwrap(), Some(1));
        assert!(!s.register(Waiter::current_thread()));
    }

    #[test]
    fn slot_handoff_survives_racing_registrations() {
        // The owner registers (and re-registers) waiters while another
        // thread completes: every result arrives exactly once, and an owner
        // that sleeps after registering is always woken.
        let (tx, rx) = std::sync::mpsc::channel::<(Arc<Slot<u32>>, u32)>();
        let completer = std::thread::spawn(move || {
            for (slot, v) in rx {
                for _ in 0..(v % 7) * 20 {
                    std::hint::spin_loop();
                }
                if let Some(w) = slot.complete(v) {
                    w.wake();
                }
                assert!(slot.complete(u32::MAX).is_none(), "second result ignored");
            }
        });
        for v in 0..3000u32 {
            let slot = Arc::new(Slot::new());
            tx.send((slot.clone(), v)).unwrap();
            let mut registrations = 0;
            let got = loop {
                if let Some(x) = slot.take() {
                    break x;
                }
                if slot.register(Waiter::current_thread()) {
                    registrations += 1;
                    if registrations % 2 == 0 {
                        // Sleep only sometimes: re-registering replaces the
                        // waiter while the completer may be looking at it.
                        std::thread::park_timeout(Duration::from_secs(5));
                    }
                }
            };
            assert_eq!(got, v);
            assert!(slot.take().is_none(), "taken once");
            assert!(!slot.register(Waiter::current_thread()));
        }
        drop(tx);
        completer.join().unwrap();
    }

    #[test]
    fn queue_wakes_one_waiter_per_item_in_order() {
        let q = WaitQueue::<u32>::new();
        assert!(q.try_pop().is_none());
        let t1 = q.register(Waiter::current_thread()).unwrap();
        let _t2 = q.register(Waiter::current_thread()).unwrap();
        assert!(q.push(5).is_some());
        assert!(q.register(Waiter::current_thread()).is_none());
        // t1 was woken (popped from the waiter list); if it gives up, the
        // wake-up goes on to t2 rather than being lost.
        q.deregister(t1);
        assert!(q.inner.lock().waiters.is_empty());
        assert_eq!(q.try_pop(), Some(5));
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn queue_many_threads_get_every_item_once() {
        let q = Arc::new(WaitQueue::<u32>::new());
        let mut hs = Vec::new();
        for _ in 0..4 {
            let q = q.clone();
            hs.push(std::thread::spawn(move || {
                let mut got = Vec::new();
                while got.len() < 250 {
                    if let Some(v) = q.try_pop() {
                        got.push(v);
                        continue;
                    }
                    if let Some(t) = q.register(Waiter::current_thread()) {
                        std::thread::park_timeout(Duration::from_millis(50));
                        q.deregister(t);
                    }
                }
                got
            }));
        }
        for i in 0..1000 {
            if let Some(w) = q.push(i) {
                w.wake();
            }
        }
        let mut all: Vec<u32> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.sort();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
    }
}
