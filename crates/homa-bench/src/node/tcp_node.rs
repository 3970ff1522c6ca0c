//! Bench server and client over TCP: persistent connections with
//! TCP_NODELAY, frames of `[length u32 LE][rpc sequence u64 LE][payload]`,
//! one non-blocking event loop per port. A client keeps a pool of
//! connections to every server and sends each request on an idle one,
//! opening another (without blocking) when none is idle, up to a limit, so
//! that TCP itself, not a shortage of connections, decides the latency. Only
//! at the limit does a request queue behind another on a busy connection
//! (counted as `pipelined`).
//!
//! The server answers a request only once all of it has arrived, as an RPC
//! server would (and as the Homa server must).

use super::{
    record, Arrival, ClientResult, ClientSpec, Schedule, ServerHandle, ServerSpec, ServerStats,
};
use super::{Error, Result};
use crate::epoll::{self, BATCH, ERR, IN, OUT};
use nix::sys::epoll::{Epoll, EpollEvent};
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a frame header.
pub const HEADER: usize = 12;
const SCRATCH: usize = 256 * 1024;

pub fn encode_header(len: usize, seq: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..].copy_from_slice(&seq.to_le_bytes());
    h
}

pub fn decode_header(h: &[u8; HEADER]) -> (usize, u64) {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let seq = u64::from_le_bytes(h[4..].try_into().expect("8 bytes"));
    (len, seq)
}

/// Bytes waiting to be written on a non-blocking stream.
#[derive(Default)]
struct OutBuf {
    buf: Vec<u8>,
    off: usize,
}

impl OutBuf {
    fn is_empty(&self) -> bool {
        self.off == self.buf.len()
    }
    fn push(&mut self, b: &[u8]) {
        if self.is_empty() {
            self.buf.clear();
            self.off = 0;
        } else if self.off > (4 << 20) {
            self.buf.drain(..self.off);
            self.off = 0;
        }
        self.buf.extend_from_slice(b);
    }
    /// Writes until done or the socket is full. Ok(true): all written.
    fn flush(&mut self, s: &mut TcpStream) -> io::Result<bool> {
        while !self.is_empty() {
            match s.write(&self.buf[self.off..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.off += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

// ---------------------------------------------------------------- server

/// Appends to a partly read frame header (`hdr`, `have` bytes so far) what
/// `bytes` holds of it; returns how many bytes it took.
fn fill_header(hdr: &mut [u8; HEADER], have: &mut usize, bytes: &[u8]) -> usize {
    let k = (HEADER - *have).min(bytes.len());
    hdr[*have..*have + k].copy_from_slice(&bytes[..k]);
    *have += k;
    k
}

struct SConn {
    stream: TcpStream,
    hdr: [u8; HEADER],
    hdr_n: usize,
    /// Payload length of the request being received.
    len: usize,
    body: Vec<u8>,
    out: OutBuf,
    want_out: bool,
}

const LISTEN: u64 = u64::MAX;

pub(crate) fn start_server(spec: &ServerSpec) -> Result<ServerHandle> {
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut addrs = Vec::new();
    let mut threads = Vec::new();
    for k in 0..spec.ports {
        let l = TcpListener::bind(SocketAddr::new(spec.ip, spec.base_port + k as u16))?;
        l.set_nonblocking(true)?;
        addrs.push(l.local_addr()?);
        let (stop, requests, bytes, errors) = (
            stop.clone(),
            requests.clone(),
            bytes.clone(),
            errors.clone(),
        );
        let max = spec.max_message;
        threads.push(
            std::thread::Builder::new()
                .name(format!("tcp-srv-{}", addrs[k].port()))
                .spawn(move || serve(l, max, &stop, &requests, &bytes, &errors))?,
        );
    }
    Ok(ServerHandle {
        addrs,
        homa_endpoint: None,
        stop: Box::new(move || {
            stop.store(true, Relaxed);
            for t in threads {
                t.join()
                    .map_err(|_| Error::Bench("server thread panicked".into()))??;
            }
            Ok(ServerStats {
                requests: requests.load(Relaxed),
                bytes: bytes.load(Relaxed),
                errors: errors.load(Relaxed),
            })
        }),
    })
}

fn serve(
    l: TcpListener,
    max_message: usize,
    stop: &AtomicBool,
    requests: &AtomicU64,
    bytes: &AtomicU64,
    errors: &AtomicU64,
) -> io::Result<()> {
    let ep = epoll::new()?;
    ep.add(&l, EpollEvent::new(IN, LISTEN))?;
    let mut conns: Vec<Option<SConn>> = Vec::new();
    let mut events = [EpollEvent::empty(); BATCH];
    let mut scratch = vec![0u8; SCRATCH];
    while !stop.load(Relaxed) {
        for event in epoll::wait(&ep, &mut events, 50)? {
            let (token, ev) = (event.data(), event.events());
            if token == LISTEN {
                loop {
                    match l.accept() {
                        Ok((s, _)) => {
                            s.set_nonblocking(true)?;
                            s.set_nodelay(true)?;
                            let slot =
                                conns.iter().position(Option::is_none).unwrap_or_else(|| {
                                    conns.push(None);
                                    conns.len() - 1
                                });
                            ep.add(&s, EpollEvent::new(IN | ERR, slot as u64))?;
                            conns[slot] = Some(SConn {
                                stream: s,
                                hdr: [0; HEADER],
                                hdr_n: 0,
                                len: 0,
                                body: Vec::new(),
                                out: OutBuf::default(),
                                want_out: false,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(_) => {
                            errors.fetch_add(1, Relaxed);
                            break;
                        }
                    }
                }
                continue;
            }
            let slot = token as usize;
            let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let mut close = false;
            if ev.intersects(IN | ERR) {
                match server_read(c, &mut scratch, max_message, requests, bytes) {
                    Ok(open) => close = !open,
                    Err(_) => {
                        errors.fetch_add(1, Relaxed);
                        close = true;
                    }
                }
            }
            if !close {
                match c.out.flush(&mut c.stream) {
                    Ok(done) => {
                        if done == c.want_out {
                            c.want_out = !done;
                            let evs = if done { IN | ERR } else { IN | ERR | OUT };
                            ep.modify(&c.stream, &mut EpollEvent::new(evs, token))?;
                        }
                    }
                    Err(_) => close = true,
                }
            }
            if close {
                let _ = ep.delete(&c.stream);
                conns[slot] = None;
            }
        }
    }
    Ok(())
}

/// Reads what is available; answers complete requests. Ok(false): the peer
/// closed (or sent a frame above the limit) and the connection must go.
fn server_read(
    c: &mut SConn,
    scratch: &mut [u8],
    max_message: usize,
    requests: &AtomicU64,
    bytes: &AtomicU64,
) -> io::Result<bool> {
    loop {
        let n = match c.stream.read(scratch) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut p = 0;
        while p < n {
            if c.hdr_n < HEADER {
                p += fill_header(&mut c.hdr, &mut c.hdr_n, &scratch[p..n]);
                if c.hdr_n < HEADER {
                    break;
                }
                let (len, _) = decode_header(&c.hdr);
                if len > max_message {
                    return Ok(false);
                }
                c.len = len;
                c.body.clear();
                c.body.reserve(len);
            }
            let k = (c.len - c.body.len()).min(n - p);
            c.body.extend_from_slice(&scratch[p..p + k]);
            p += k;
            if c.body.len() == c.len {
                c.out.push(&c.hdr);
                c.out.push(&c.body);
                c.hdr_n = 0;
                requests.fetch_add(1, Relaxed);
                bytes.fetch_add(c.len as u64, Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------- client

struct Outstanding {
    a: Arrival,
    started: Instant,
}

struct CConn {
    stream: TcpStream,
    server: usize,
    alive: bool,
    out: OutBuf,
    want_out: bool,
    fifo: VecDeque<Outstanding>,
    hdr: [u8; HEADER],
    hdr_n: usize,
    /// Bytes of the current response's payload checked so far.
    body_off: usize,
    /// The current response still matches its request.
    body_ok: bool,
}

const TIMER: u64 = u64::MAX;

/// Starts a TCP connection without waiting for it: writes before it is
/// established fail with EAGAIN and are retried when it becomes writable.
fn connect_nonblocking(addr: SocketAddr) -> io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscalls on a descriptor we own; the sockaddr structs are
    // fully initialized and their sizes passed along.
    unsafe {
        let fd = libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let r = match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                libc::connect(
                    fd,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_scope_id = a.scope_id();
                libc::connect(
                    fd,
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
        }
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// Opens a pooled connection to `addr` and registers it.
fn open_conn(
    ep: &Epoll,
    conns: &mut Vec<CConn>,
    server: usize,
    addr: SocketAddr,
) -> io::Result<usize> {
    let stream = connect_nonblocking(addr)?;
    let i = conns.len();
    ep.add(&stream, EpollEvent::new(IN | ERR, i as u64))?;
    conns.push(CConn {
        stream,
        server,
        alive: true,
        out: OutBuf::default(),
        want_out: false,
        fifo: VecDeque::new(),
        hdr: [0; HEADER],
        hdr_n: 0,
        body_off: 0,
        body_ok: true,
    });
    Ok(i)
}

pub(crate) fn client_port(spec: &ClientSpec, mut sched: Schedule) -> Result<ClientResult> {
    let ep = epoll::new()?;
    // Wakes the loop at the next arrival: epoll's own timeout is in ms.
    let timer = TimerFd::new(
        ClockId::CLOCK_MONOTONIC,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    ep.add(&timer, EpollEvent::new(IN, TIMER))
        .map_err(io::Error::from)?;
    // The pool: tcp_conns connections to every server to start with, spread
    // over its ports; more are opened when all are busy.
    let mut conns: Vec<CConn> = Vec::new();
    let mut pools: Vec<Vec<usize>> = Vec::new();
    for (s, ports) in spec.servers.iter().enumerate() {
        let mut pool = Vec::new();
        for j in 0..spec.tcp_conns {
            let addr = ports[j % ports.len()];
            pool.push(
                open_conn(&ep, &mut conns, s, addr)
                    .map_err(|e| Error::Bench(format!("connect to {addr}: {e}")))?,
            );
        }
        pools.push(pool);
    }
    let mut r = ClientResult {
        window_secs: sched.window_secs(),
        ..Default::default()
    };
    let mut outstanding = 0usize;
    let mut backlog: VecDeque<Arrival> = VecDeque::new();
    let mut events = [EpollEvent::empty(); BATCH];
    let mut scratch = vec![0u8; SCRATCH];
    loop {
        let now = Instant::now();
        while let Some(t) = sched.next_arrival() {
            if t > now {
                break;
            }
            if outstanding + backlog.len() >= spec.max_outstanding {
                r.cap_waits += 1;
            }
            backlog.push_back(sched.take_arrival(&mut r));
        }
        while outstanding < spec.max_outstanding {
            let Some(a) = backlog.pop_front() else {
                break;
            };
            let server = a.server;
            r.issued += 1;
            // An idle live connection to that server (searched from a random
            // start so that they share the work); else a new one; at the
            // limit, the least-loaded.
            let pool = &pools[server];
            let start = sched.pick(pool.len());
            let live = (0..pool.len())
                .map(|k| pool[(start + k) % pool.len()])
                .filter(|&i| conns[i].alive);
            let mut best = live.min_by_key(|&i| conns[i].fifo.len());
            let busy = !matches!(best, Some(i) if conns[i].fifo.is_empty());
            if busy && pools[server].len() < spec.tcp_max_conns.max(1) {
                let ports = &spec.servers[server];
                let addr = ports[pools[server].len() % ports.len()];
                match open_conn(&ep, &mut conns, server, addr) {
                    Ok(i) => {
                        pools[server].push(i);
                        r.connections += 1;
                        best = Some(i);
                    }
                    Err(e) => r.error(format!("connect to {addr}: {e}")),
                }
            }
            let Some(i) = best else {
                r.error(format!("no connection left to server {server}"));
                continue;
            };
            let c = &mut conns[i];
            if !c.fifo.is_empty() {
                r.pipelined += 1;
            }
            c.out.push(&encode_header(a.len, a.seq));
            c.out.push(&spec.payloads.payload(a.seq, a.len));
            c.fifo.push_back(Outstanding {
                a,
                started: Instant::now(),
            });
            outstanding += 1;
            if let Err(e) = sync_out(&ep, c, i) {
                fail_conn(&ep, c, &mut r, &mut outstanding, &e.to_string());
            }
        }
        let done_issuing = sched.next_arrival().is_none() && backlog.is_empty();
        if done_issuing && outstanding == 0 {
            break;
        }
        if now >= sched.drain_end {
            r.unfinished = (outstanding + backlog.len()) as u64;
            break;
        }
        let until = sched
            .next_arrival()
            .unwrap_or(sched.drain_end)
            .min(sched.drain_end);
        // One shot, relative (at least 1 µs: zero would disarm it).
        let after = until
            .saturating_duration_since(now)
            .max(Duration::from_micros(1));
        timer
            .set(
                Expiration::OneShot(after.into()),
                TimerSetTimeFlags::empty(),
            )
            .map_err(io::Error::from)?;
        for event in epoll::wait(&ep, &mut events, 1000)? {
            let (token, ev) = (event.data(), event.events());
            if token == TIMER {
                // Consumes the expiry (EAGAIN if there was none: fine).
                let _ = timer.wait();
                continue;
            }
            let i = token as usize;
            let c = &mut conns[i];
            if !c.alive {
                continue;
            }
            if ev.intersects(IN | ERR) {
                if let Err(e) = client_read(c, &mut scratch, spec, &sched, &mut r, &mut outstanding)
                {
                    fail_conn(&ep, c, &mut r, &mut outstanding, &e.to_string());
                    continue;
                }
            }
            if ev.intersects(OUT) {
                if let Err(e) = sync_out(&ep, c, i) {
                    fail_conn(&ep, c, &mut r, &mut outstanding, &e.to_string());
                }
            }
        }
    }
    Ok(r)
}

/// Writes what the socket takes and watches for writability while bytes remain.
fn sync_out(ep: &Epoll, c: &mut CConn, token: usize) -> io::Result<()> {
    let done = c.out.flush(&mut c.stream)?;
    if done == c.want_out {
        c.want_out = !done;
        let evs = if done { IN | ERR } else { IN | ERR | OUT };
        ep.modify(&c.stream, &mut EpollEvent::new(evs, token as u64))?;
    }
    Ok(())
}

fn fail_conn(ep: &Epoll, c: &mut CConn, r: &mut ClientResult, outstanding: &mut usize, why: &str) {
    let _ = ep.delete(&c.stream);
    c.alive = false;
    for o in c.fifo.drain(..) {
        *outstanding -= 1;
        r.error(format!(
            "RPC of {} bytes to server {}: connection failed: {why}",
            o.a.len, c.server
        ));
    }
}

/// Reads responses, checking each byte against its request as it arrives.
fn client_read(
    c: &mut CConn,
    scratch: &mut [u8],
    spec: &ClientSpec,
    sched: &Schedule,
    r: &mut ClientResult,
    outstanding: &mut usize,
) -> io::Result<()> {
    loop {
        let n = match c.stream.read(scratch) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ))
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let mut p = 0;
        while p < n {
            let Some(front) = c.fifo.front() else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "response without a request",
                ));
            };
            if c.hdr_n < HEADER {
                p += fill_header(&mut c.hdr, &mut c.hdr_n, &scratch[p..n]);
                if c.hdr_n < HEADER {
                    break;
                }
                let (len, seq) = decode_header(&c.hdr);
                if len != front.a.len || seq != front.a.seq {
                    // The stream is out of step; nothing after this can be trusted.
                    r.mismatches += 1;
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "response header ({len} bytes, rpc {seq}) does not match request ({} bytes, rpc {})",
                            front.a.len, front.a.seq
                        ),
                    ));
                }
                c.body_off = 0;
                c.body_ok = true;
            }
            let k = (front.a.len - c.body_off).min(n - p);
            if k > 0 {
                let expect = spec.payloads.payload(front.a.seq, front.a.len);
                if scratch[p..p + k] != expect[c.body_off..c.body_off + k] {
                    c.body_ok = false;
                }
                c.body_off += k;
                p += k;
            }
            if c.body_off == front.a.len {
                let done = Instant::now();
                let o = c.fifo.pop_front().expect("front exists");
                *outstanding -= 1;
                c.hdr_n = 0;
                if c.body_ok {
                    record(r, sched, &o.a, o.started, done, &spec.progress);
                } else {
                    r.mismatches += 1;
                    r.error(format!(
                        "response to RPC {} ({} bytes) differs from the request",
                        o.a.seq, o.a.len
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = encode_header(123_456, 0xdead_beef_0000_0001);
        assert_eq!(decode_header(&h), (123_456, 0xdead_beef_0000_0001));
    }

    #[test]
    fn out_buffer_compacts() {
        let mut o = OutBuf::default();
        assert!(o.is_empty());
        o.push(b"abc");
        assert!(!o.is_empty());
        o.off = 3;
        assert!(o.is_empty());
        o.push(b"d");
        assert_eq!((o.buf.as_slice(), o.off), (&b"d"[..], 0));
    }
}
