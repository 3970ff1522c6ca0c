//! Minimal epoll and timerfd wrappers for the TCP transport's event loops
//! (non-blocking sockets, one thread per port, no runtime dependency).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub const IN: u32 = libc::EPOLLIN as u32;
pub const OUT: u32 = libc::EPOLLOUT as u32;
pub const ERR: u32 = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall; the returned descriptor is owned here.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll {
            // SAFETY: `fd` was just created above (and checked); nothing else owns it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    pub fn modify(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout_ms` (-1: forever); fills `events` with (token, events).
    pub fn wait(&self, events: &mut Vec<(u64, u32)>, timeout_ms: i32) -> io::Result<()> {
        let mut raw = [libc::epoll_event { events: 0, u64: 0 }; 64];
        events.clear();
        // SAFETY: raw has room for raw.len() events.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                raw.as_mut_ptr(),
                raw.len() as libc::c_int,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        for ev in &raw[..n as usize] {
            let (token, evs) = (ev.u64, ev.events);
            events.push((token, evs));
        }
        Ok(())
    }
}

/// A one-shot monotonic timer whose expiry makes its descriptor readable:
/// sub-millisecond wake-ups for epoll (whose own timeout is in ms).
pub struct TimerFd {
    fd: OwnedFd,
}

impl TimerFd {
    pub fn new() -> io::Result<TimerFd> {
        // SAFETY: plain syscall; the returned descriptor is owned here.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        Ok(TimerFd {
            // SAFETY: `fd` was just created above (and checked); nothing else owns it.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Arms the timer to fire once after `d` (at least 1 µs: zero disarms).
    pub fn set(&self, d: Duration) -> io::Result<()> {
        let d = d.max(Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: spec is valid; the old value is not requested.
        cvt(unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) })
            .map(|_| ())
    }

    /// Consumes an expiry (after the descriptor was readable).
    pub fn clear(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into buf; errors (EAGAIN) are fine.
        unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn timer_wakes_epoll() {
        let ep = Epoll::new().unwrap();
        let t = TimerFd::new().unwrap();
        ep.add(t.as_raw_fd(), 7, IN).unwrap();
        let start = Instant::now();
        t.set(Duration::from_millis(3)).unwrap();
        let mut evs = Vec::new();
        while evs.is_empty() {
            ep.wait(&mut evs, 1000).unwrap();
        }
        assert_eq!(evs[0].0, 7);
        assert!(start.elapsed() >= Duration::from_millis(3));
        t.clear();
        ep.wait(&mut evs, 0).unwrap();
        assert!(evs.is_empty());
        ep.delete(t.as_raw_fd()).unwrap();
    }
}
