//! Waiting on sockets: one `poll(2)` wrapper, and the busy-poll-then-block
//! receive and send loops of the raw UDP and TCP baselines (the strategy the
//! Homa runtime uses, so that a comparison is about the transports and not
//! about how their callers wait).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long to spin before sleeping, a flag that ends the wait early and a
/// deadline after which it fails with `TimedOut`.
#[derive(Clone, Copy)]
pub struct Waiting<'a> {
    pub poll: Duration,
    pub stop: Option<&'a AtomicBool>,
    pub deadline: Option<Instant>,
    /// Spin by yielding the CPU (`sched_yield`) on every round instead of
    /// a pause instruction: the polite spinner, for threads that outnumber
    /// the cores (`floor`).
    pub yielding: bool,
}

impl Waiting<'_> {
    /// Spin for `poll`, no stop flag, no deadline.
    pub fn polling(poll: Duration) -> Waiting<'static> {
        Waiting {
            poll,
            stop: None,
            deadline: None,
            yielding: false,
        }
    }
}

/// Sleeps until `fd` has one of `events` (`libc::POLLIN`, `libc::POLLOUT`),
/// at most `max`; returns false on timeout or interruption.
pub fn wait_fd(fd: RawFd, events: libc::c_short, max: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = max.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0)
}

/// Why a wait should end now, if it should.
fn ended(w: &Waiting) -> Option<io::Error> {
    if w.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
        return Some(io::Error::new(io::ErrorKind::Interrupted, "stopped"));
    }
    if w.deadline.is_some_and(|d| Instant::now() >= d) {
        return Some(io::ErrorKind::TimedOut.into());
    }
    None
}

/// One step of waiting for `fd` to become readable: a spin while less than
/// `w.poll` has passed since `since`, else a sleep of up to 50 ms; an error
/// when the wait should end.
fn wait_readable(fd: RawFd, since: Instant, w: &Waiting) -> io::Result<()> {
    if let Some(e) = ended(w) {
        return Err(e);
    }
    if since.elapsed() < w.poll {
        if w.yielding {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    } else {
        wait_fd(fd, libc::POLLIN, Duration::from_millis(50))?;
    }
    Ok(())
}

/// Receives one datagram from a non-blocking socket, busy-polling first.
pub fn udp_recv(sock: &UdpSocket, buf: &mut [u8], w: Waiting) -> io::Result<(usize, SocketAddr)> {
    let start = Instant::now();
    loop {
        match sock.recv_from(buf) {
            Ok(r) => return Ok(r),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(sock.as_raw_fd(), start, &w)?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Fills `buf` from a non-blocking stream, busy-polling first.
pub fn tcp_read_exact(s: &mut TcpStream, buf: &mut [u8], w: Waiting) -> io::Result<()> {
    let mut at = 0;
    let mut start = Instant::now();
    while at < buf.len() {
        match s.read(&mut buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                at += n;
                start = Instant::now();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_readable(s.as_raw_fd(), start, &w)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf` to a non-blocking stream, waiting for room as needed.
pub fn tcp_write_all(s: &mut TcpStream, buf: &[u8], w: Waiting) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match s.write(&buf[at..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Some(e) = ended(&w) {
                    return Err(e);
                }
                wait_fd(s.as_raw_fd(), libc::POLLOUT, Duration::from_millis(50))?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn udp_recv_polls_then_blocks_and_stops() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_nonblocking(true).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        b.send_to(b"x", a.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 16];
        let w = Waiting::polling(Duration::from_micros(50));
        assert_eq!(udp_recv(&a, &mut buf, w).unwrap().0, 1);
        let stop = AtomicBool::new(true);
        let w = Waiting {
            stop: Some(&stop),
            ..Waiting::polling(Duration::ZERO)
        };
        assert_eq!(
            udp_recv(&a, &mut buf, w).unwrap_err().kind(),
            io::ErrorKind::Interrupted
        );
        let w = Waiting {
            deadline: Some(Instant::now() + Duration::from_millis(5)),
            ..Waiting::polling(Duration::from_micros(10))
        };
        assert_eq!(
            udp_recv(&a, &mut buf, w).unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }

    #[test]
    fn tcp_exact_read_and_write() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.set_nonblocking(true).unwrap();
        s.set_nonblocking(true).unwrap();
        let w = Waiting::polling(Duration::from_micros(50));
        let data = vec![7u8; 300_000];
        let t = std::thread::spawn(move || {
            tcp_write_all(&mut c, &data, w).unwrap();
            c
        });
        let mut got = vec![0u8; 300_000];
        tcp_read_exact(&mut s, &mut got, w).unwrap();
        assert!(got.iter().all(|b| *b == 7));
        drop(t.join().unwrap());
        assert_eq!(
            tcp_read_exact(&mut s, &mut got[..1], w).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
