//! The TCP baselines' event loops (non-blocking sockets, one thread per
//! port, no runtime dependency) wait with `nix`'s [`Epoll`], level-triggered,
//! each descriptor's token in the event's data. This adds what every loop
//! shares: the interest sets, a close-on-exec epoll, and a wait that takes
//! EINTR for a timeout.

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use std::io;

pub const IN: EpollFlags = EpollFlags::EPOLLIN;
pub const OUT: EpollFlags = EpollFlags::EPOLLOUT;
pub const ERR: EpollFlags = EpollFlags::EPOLLERR
    .union(EpollFlags::EPOLLHUP)
    .union(EpollFlags::EPOLLRDHUP);

/// Events one wait takes at most (the size of the loops' event buffers).
pub const BATCH: usize = 64;

/// A close-on-exec epoll instance.
pub fn new() -> io::Result<Epoll> {
    Ok(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?)
}

/// Waits up to `timeout_ms`; returns the events that came (none on timeout
/// or interruption).
pub fn wait<'a>(
    ep: &Epoll,
    events: &'a mut [EpollEvent],
    timeout_ms: u16,
) -> io::Result<&'a [EpollEvent]> {
    match ep.wait(events, timeout_ms) {
        Ok(n) => Ok(&events[..n]),
        Err(Errno::EINTR) => Ok(&[]),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    use std::time::{Duration, Instant};

    /// The client loop's timer: a relative one-shot on a non-blocking
    /// timerfd wakes the epoll once, and reading it consumes the expiry.
    #[test]
    fn timer_wakes_epoll() {
        let ep = new().unwrap();
        let flags = TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC;
        let t = TimerFd::new(ClockId::CLOCK_MONOTONIC, flags).unwrap();
        ep.add(&t, EpollEvent::new(IN, 7)).unwrap();
        let mut events = [EpollEvent::empty(); BATCH];
        assert!(wait(&ep, &mut events, 0).unwrap().is_empty());
        let start = Instant::now();
        let after = TimeSpec::from(Duration::from_millis(3));
        t.set(Expiration::OneShot(after), TimerSetTimeFlags::empty())
            .unwrap();
        let token = loop {
            if let Some(ev) = wait(&ep, &mut events, 1000).unwrap().first() {
                break ev.data();
            }
        };
        assert_eq!(token, 7);
        assert!(start.elapsed() >= Duration::from_millis(3));
        t.wait().unwrap();
        assert!(wait(&ep, &mut events, 0).unwrap().is_empty());
        // Nothing left to read: the non-blocking timerfd says so at once.
        assert_eq!(t.wait(), Err(Errno::EAGAIN));
        ep.delete(&t).unwrap();
    }
}
