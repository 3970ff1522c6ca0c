//! Places where application threads (or async tasks) wait for results: a
//! one-shot slot per private RPC and a queue with waiters for incoming
//! requests and shared responses. A result is published with an atomic flag
//! that a polling thread checks without taking any lock; only a sleeper needs
//! the wake-up (unpark or `Waker::wake`).

use crate::sys::EventFd;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

/// The result of one private RPC.
pub(crate) struct Slot<T> {
    done: AtomicBool,
    inner: Mutex<SlotInner<T>>,
}

struct SlotInner<T> {
    value: Option<T>,
    waiter: Option<Waiter>,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Slot<T> {
        Slot {
            done: AtomicBool::new(false),
            inner: Mutex::new(SlotInner {
                value: None,
                waiter: None,
            }),
        }
    }
    /// Lock-free check for the polling loop.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    /// Stores the result (only the first one counts) and returns the waiter
    /// to wake. The caller wakes it after releasing the engine lock, so the
    /// woken thread does not immediately collide with it.
    #[must_use]
    pub(crate) fn complete(&self, v: T) -> Option<Waiter> {
        let mut g = self.inner.lock();
        if self.done.load(Ordering::Relaxed) {
            return None;
        }
        g.value = Some(v);
        self.done.store(true, Ordering::Release);
        g.waiter.take()
    }
    /// Takes the result if it is there.
    pub(crate) fn take(&self) -> Option<T> {
        if !self.is_done() {
            return None;
        }
        self.inner.lock().value.take()
    }
    /// Registers a waiter unless the result is already there (then returns
    /// false and the caller should take it).
    pub(crate) fn register(&self, w: Waiter) -> bool {
        let mut g = self.inner.lock();
        if self.done.load(Ordering::Relaxed) {
            return false;
        }
        g.waiter = Some(w);
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
