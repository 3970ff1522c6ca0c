//! The baselines Homa is compared with on loopback: a raw UDP ping-pong, a
//! TCP ping-pong over one persistent connection with TCP_NODELAY, and a TCP
//! one-way stream with a small reply per message. Every waiting side
//! busy-polls for the same time as Homa before it blocks.

use crate::payload::Payloads;
use crate::stats::{new_histogram, record};
use crate::wait::{tcp_read_exact, tcp_write_all, udp_recv, Waiting};
use anyhow::Context;
use hdrhistogram::Histogram;
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest payload of one UDP datagram (IPv4).
pub const MAX_UDP_PAYLOAD: usize = 65_507;

/// Round-trip times of `count` UDP echoes of `size` bytes (after `warmup`).
/// A lost datagram (possible even on loopback under load) is resent after
/// 200 ms and that sample is discarded.
/// With `timetrace`, the measured round trips record the same events at the
/// same places as Homa's runtime does (`sendmmsg start` before each send,
/// `recvmmsg got` after each receive), so that both break down alike.
pub fn udp_pingpong(
    size: usize,
    count: u64,
    warmup: u64,
    poll: Duration,
    timetrace: bool,
) -> anyhow::Result<Histogram<u64>> {
    anyhow::ensure!(
        size <= MAX_UDP_PAYLOAD,
        "{size} bytes do not fit one UDP datagram"
    );
    let server = UdpSocket::bind("127.0.0.1:0")?;
    server.set_nonblocking(true)?;
    let addr = server.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let echo = std::thread::Builder::new().name("server".into()).spawn(
        move || -> std::io::Result<()> {
            let mut buf = vec![0u8; 65_536];
            let w = Waiting {
                stop: Some(&st),
                ..Waiting::polling(poll)
            };
            loop {
                match udp_recv(&server, &mut buf, w) {
                    Ok((n, from)) => {
                        homa::timetrace::record("recvmmsg got");
                        homa::timetrace::record("sendmmsg start");
                        server.send_to(&buf[..n], from)?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        },
    )?;
    let client = UdpSocket::bind("127.0.0.1:0")?;
    client.set_nonblocking(true)?;
    let payloads = Payloads::new(size);
    let msg = payloads.payload(1, size);
    let mut buf = vec![0u8; 65_536];
    let mut h = new_histogram();
    let result = (|| -> anyhow::Result<()> {
        for i in 0..warmup + count {
            if timetrace && i == warmup {
                homa::timetrace::enable(true);
            }
            let t0 = Instant::now();
            homa::timetrace::record("sendmmsg start");
            client.send_to(&msg, addr)?;
            let w = Waiting {
                deadline: Some(t0 + Duration::from_millis(200)),
                ..Waiting::polling(poll)
            };
            match udp_recv(&client, &mut buf, w) {
                Ok((n, _)) => {
                    homa::timetrace::record("recvmmsg got");
                    anyhow::ensure!(n == size, "echo of {n} bytes, sent {size}");
                    if i >= warmup {
                        record(&mut h, t0.elapsed().as_nanos() as u64);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                Err(e) => return Err(e.into()),
            }
        }
        anyhow::ensure!(
            payloads.matches(1, &buf[..size]),
            "UDP echo corrupted the payload"
        );
        Ok(())
    })();
    if timetrace {
        homa::timetrace::enable(false);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    echo.join()
        .map_err(|_| anyhow::anyhow!("UDP echo thread panicked"))??;
    result.map(|_| h)
}

pub fn tcp_pair() -> anyhow::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    for x in [&c, &s] {
        x.set_nodelay(true)?;
        x.set_nonblocking(true)?;
    }
    Ok((c, s))
}

/// Round-trip times of `count` TCP echoes of `size` bytes on one connection.
pub fn tcp_pingpong(
    size: usize,
    count: u64,
    warmup: u64,
    poll: Duration,
) -> anyhow::Result<Histogram<u64>> {
    let (mut c, mut s) = tcp_pair()?;
    let total = warmup + count;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut buf = vec![0u8; size];
        let w = Waiting::polling(poll);
        for _ in 0..total {
            tcp_read_exact(&mut s, &mut buf, w)?;
            tcp_write_all(&mut s, &buf, w)?;
        }
        Ok(())
    });
    let payloads = Payloads::new(size);
    let msg = payloads.payload(2, size);
    let mut buf = vec![0u8; size];
    let mut h = new_histogram();
    let w = Waiting::polling(poll);
    for i in 0..total {
        let t0 = Instant::now();
        tcp_write_all(&mut c, &msg, w).context("TCP client write")?;
        tcp_read_exact(&mut c, &mut buf, w).context("TCP client read")?;
        if i >= warmup {
            record(&mut h, t0.elapsed().as_nanos() as u64);
        }
    }
    anyhow::ensure!(payloads.matches(2, &buf), "TCP echo corrupted the payload");
    echo.join()
        .map_err(|_| anyhow::anyhow!("TCP echo thread panicked"))??;
    Ok(h)
}

/// Messages of `size` bytes streamed over one TCP connection for `secs`,
/// each answered by a `reply` -byte message, at most `window` unanswered.
/// Returns (messages completed, elapsed seconds).
pub fn tcp_throughput(
    size: usize,
    reply: usize,
    window: usize,
    secs: f64,
    poll: Duration,
) -> anyhow::Result<(u64, f64)> {
    let (mut c, mut s) = tcp_pair()?;
    let server = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut buf = vec![0u8; size];
        let answer = vec![0u8; reply];
        let w = Waiting::polling(poll);
        let mut n = 0;
        loop {
            match tcp_read_exact(&mut s, &mut buf, w) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(n),
                Err(e) => return Err(e),
            }
            n += 1;
            tcp_write_all(&mut s, &answer, w)?;
        }
    });
    let msg = Payloads::new(size).payload(3, size);
    let mut rbuf = vec![0u8; reply];
    let w = Waiting::polling(poll);
    let window = window.max(1);
    let mut outstanding = 0;
    let mut done = 0u64;
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while start.elapsed() < limit {
        while outstanding < window {
            tcp_write_all(&mut c, &msg, w)?;
            outstanding += 1;
        }
        tcp_read_exact(&mut c, &mut rbuf, w)?;
        outstanding -= 1;
        done += 1;
    }
    while outstanding > 0 {
        tcp_read_exact(&mut c, &mut rbuf, w)?;
        outstanding -= 1;
        done += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(c);
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("TCP server panicked"))??;
    anyhow::ensure!(
        served == done,
        "server saw {served} messages, client {done}"
    );
    Ok((done, elapsed))
}

/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h; not in every libc version).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// The ceiling for any transport built on UDP sockets: a one-way blast of
/// `size`-byte messages cut into `segment`-byte datagrams, sent with UDP GSO
/// (up to 44 segments per call, one iovec) and received with UDP GRO by a
/// thread that only counts bytes. No protocol, no headers, no flow control:
/// what the receiver misses is lost and not counted. Returns (messages'
/// worth of bytes received, seconds).
pub fn udp_gso_stream(size: usize, segment: usize, secs: f64) -> anyhow::Result<(u64, f64)> {
    use std::os::fd::AsRawFd;
    anyhow::ensure!(
        (1..=MAX_UDP_PAYLOAD).contains(&segment) && size > 0,
        "bad segment size {segment} or message size {size}"
    );
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let setopt = |fd: i32, level: i32, opt: i32, v: libc::c_int| {
        // SAFETY: a plain int socket option on a valid socket.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    // The same buffers Homa asks for (4 MiB; FORCE works as root).
    for (fd, force, plain) in [
        (rx.as_raw_fd(), libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (tx.as_raw_fd(), libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setopt(fd, libc::SOL_SOCKET, force, 4 << 20) != 0 {
            setopt(fd, libc::SOL_SOCKET, plain, 4 << 20);
        }
    }
    anyhow::ensure!(
        setopt(rx.as_raw_fd(), libc::SOL_UDP, UDP_GRO, 1) == 0,
        "UDP_GRO not supported: {}",
        std::io::Error::last_os_error()
    );
    rx.set_nonblocking(true)?;
    let dest = rx.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let sink = std::thread::spawn(move || -> u64 {
        let mut buf = vec![0u8; 65_536];
        let mut bytes = 0u64;
        while !st.load(std::sync::atomic::Ordering::Relaxed) {
            match rx.recv(&mut buf) {
                Ok(n) => bytes += n as u64,
                Err(_) => std::hint::spin_loop(),
            }
        }
        // What is already queued also arrived.
        while let Ok(n) = rx.recv(&mut buf) {
            bytes += n as u64;
        }
        bytes
    });
    tx.connect(dest)?;
    let msg = Payloads::new(size).payload(6, size);
    let per_send = (65_000 / segment).clamp(1, 64) * segment;
    let mut ctrl = [0u64; 4];
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    let mut send_error = None;
    'outer: while start.elapsed() < limit {
        for chunk in msg.chunks(per_send) {
            let mut iov = libc::iovec {
                iov_base: chunk.as_ptr() as *mut libc::c_void,
                iov_len: chunk.len(),
            };
            // SAFETY: a zeroed msghdr pointing at one iovec and a control
            // buffer with room for one u16 cmsg; both outlive the call.
            let r = unsafe {
                let mut h: libc::msghdr = std::mem::zeroed();
                h.msg_iov = &mut iov;
                h.msg_iovlen = 1;
                if chunk.len() > segment {
                    h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
                    h.msg_controllen = libc::CMSG_SPACE(2) as usize;
                    let c = libc::CMSG_FIRSTHDR(&h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, segment as u16);
                }
                libc::sendmsg(tx.as_raw_fd(), &h, 0)
            };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                // ENOBUFS/EAGAIN: the socket buffer is full; the receiver is
                // behind, which is the point of a blast.
                if !matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN)) {
                    send_error = Some(e);
                    break 'outer;
                }
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let bytes = sink
        .join()
        .map_err(|_| anyhow::anyhow!("UDP sink panicked"))?;
    if let Some(e) = send_error {
        return Err(anyhow::anyhow!("UDP GSO send failed: {e}"));
    }
    Ok((bytes / size as u64, elapsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_pingpong_measures_every_iteration() {
        let h = udp_pingpong(100, 50, 5, Duration::from_micros(20), false).unwrap();
        assert!(h.len() >= 45, "{}", h.len());
        assert!(h.value_at_quantile(0.5) > 0);
        assert!(udp_pingpong(70_000, 1, 0, Duration::ZERO, false).is_err());
    }

    #[test]
    fn tcp_pingpong_handles_multi_segment_messages() {
        let h = tcp_pingpong(100_000, 20, 2, Duration::from_micros(20)).unwrap();
        assert_eq!(h.len(), 20);
    }

    #[test]
    fn udp_gso_stream_delivers_bytes() {
        let (n, secs) = udp_gso_stream(100_000, 1472, 0.05).unwrap();
        assert!(n >= 1, "{n}");
        assert!(secs >= 0.05);
        assert!(udp_gso_stream(100_000, 0, 0.01).is_err());
    }

    #[test]
    fn tcp_throughput_counts_whole_messages() {
        let (n, secs) = tcp_throughput(50_000, 8, 4, 0.05, Duration::from_micros(20)).unwrap();
        assert!(n >= 4, "{n}");
        assert!(secs >= 0.05);
    }
}
