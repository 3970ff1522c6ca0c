//! `rate-bench`: how many small RPCs per second a server with M threads
//! answers on loopback, for Homa, a raw UDP echo server (recvmmsg/sendmmsg
//! batches) and a TCP epoll echo server, in the same run.
//!
//! Every server uses its M threads the same way: M sockets bound to one
//! address with `SO_REUSEPORT` (Homa: M endpoints, each with its own engine;
//! UDP: M sockets; TCP: M listeners, each with its own epoll loop), so the
//! kernel steers each client socket's 4-tuple (a Homa RPC's packets all share
//! it; a TCP connection is accepted by one listener) to one thread. Server
//! threads busy-poll for the same time before they sleep.
//!
//! Clients are closed loops: N threads, each with its own socket (Homa
//! endpoint, UDP socket, TCP connection) and K requests outstanding; a
//! completed RPC is replaced at once. Several outstanding per client rather
//! than one: keeping M server threads busy with one outstanding RPC per
//! client takes as many client threads as RPCs in flight, and on a machine
//! with few cores their context switches, not the server, would set the
//! rate; K outstanding on few client threads keeps the servers' queues full
//! while every RPC is still its own message (one Homa RPC, one datagram, one
//! framed write). Clients never busy-poll, for any transport, so they leave
//! the CPUs to the servers. Each run is bounded in time and in count.

use crate::closed::ClosedLoop;
use crate::epoll::{self, BATCH, ERR, IN, OUT};
use crate::payload::Payloads;
use crate::stats::{new_histogram, record};
use crate::wait::wait_fd;
use anyhow::Context;
use hdrhistogram::Histogram;
use nix::sys::epoll::EpollEvent;
use serde::Serialize;
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A transport of `rate-bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateTransport {
    Homa,
    Udp,
    Tcp,
}

impl RateTransport {
    pub const ALL: [RateTransport; 3] =
        [RateTransport::Homa, RateTransport::Udp, RateTransport::Tcp];

    pub fn name(self) -> &'static str {
        match self {
            RateTransport::Homa => "homa",
            RateTransport::Udp => "udp",
            RateTransport::Tcp => "tcp",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<RateTransport> {
        RateTransport::ALL
            .into_iter()
            .find(|t| t.name() == s.trim())
            .ok_or_else(|| anyhow::anyhow!("unknown transport {s:?} (homa, udp, tcp)"))
    }
}

/// One `rate-bench` run: every transport with every server thread count.
#[derive(Clone, Debug)]
pub struct RateBench {
    pub transports: Vec<RateTransport>,
    /// Server thread counts, each run in turn (e.g. `[1, 2]`).
    pub server_threads: Vec<usize>,
    /// Client threads, each with its own socket.
    pub clients: usize,
    /// Requests each client keeps outstanding.
    pub outstanding: usize,
    /// Request (and echo) size in bytes.
    pub size: usize,
    /// Measured time per transport and thread count.
    pub seconds: f64,
    /// Unmeasured time before it (sockets, pools and caches warm up).
    pub warmup: f64,
    /// At most this many RPCs per client (a bound besides the time).
    pub max_rpcs: u64,
    /// How long server threads busy-poll before sleeping.
    pub poll: Duration,
    /// The Homa endpoints' configuration (clients get `poll` zero, servers
    /// `poll` and `reuse_port`).
    pub homa: homa::EndpointConfig,
    /// One line per run on stderr.
    pub progress: bool,
}

impl RateBench {
    /// The defaults of `homa rate-bench`: 100 B requests, one server thread,
    /// [`default_clients`] clients with 2 outstanding each, 2 s per run after
    /// 0.3 s of warm-up, at most 2 million RPCs per client.
    pub fn new() -> RateBench {
        RateBench {
            transports: RateTransport::ALL.to_vec(),
            server_threads: vec![1],
            clients: default_clients(),
            outstanding: 2,
            size: 100,
            seconds: 2.0,
            warmup: 0.3,
            max_rpcs: 2_000_000,
            poll: Duration::from_micros(50),
            homa: crate::loopback_config(),
            progress: false,
        }
    }
}

impl Default for RateBench {
    fn default() -> Self {
        RateBench::new()
    }
}

/// Enough client sockets to saturate a server here: four per CPU, at
/// least 8. With 2 outstanding each that is 16+ RPCs in flight for at most a
/// few server threads, and enough 4-tuples that `SO_REUSEPORT`'s hashing
/// spreads them about evenly over the server's sockets.
pub fn default_clients() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (4 * cores).max(8)
}

/// One row of `rate-bench --json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RateRow {
    pub transport: String,
    pub server_threads: usize,
    pub clients: usize,
    pub rpcs_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// CPU time the server's threads used in the measured window, in cores
    /// (1.0: one CPU busy all the time), from the kernel's per-thread
    /// accounting (`/proc/self/task/*/schedstat`).
    pub server_cores: f64,
    /// `rpcs_per_sec / server_cores`: what one fully busy server core
    /// answers at this load. The per-core rate the clients do not limit:
    /// on a machine with few cores, the client threads share the CPUs with
    /// the server, so `rpcs_per_sec` measures the clients as much as the
    /// server. Servers busy-poll only when `--server-poll-us` says so
    /// (default 0 for this reason: a polling server's idle time would count
    /// as work).
    pub rpcs_per_server_core: f64,
}

/// Runs every thread count, and within it every transport; one row each.
pub fn run(spec: &RateBench) -> anyhow::Result<Vec<RateRow>> {
    anyhow::ensure!(
        spec.clients > 0 && spec.outstanding > 0,
        "clients and outstanding RPCs must be positive"
    );
    anyhow::ensure!(
        spec.server_threads.iter().all(|m| *m > 0),
        "a server needs at least one thread"
    );
    anyhow::ensure!(
        spec.seconds > 0.0 && spec.warmup >= 0.0,
        "bad duration {} s (warm-up {} s)",
        spec.seconds,
        spec.warmup
    );
    anyhow::ensure!(
        (UDP_TAG..=crate::baseline::MAX_UDP_PAYLOAD).contains(&spec.size),
        "size must be {UDP_TAG}..={} bytes (one datagram; the UDP client tags it)",
        crate::baseline::MAX_UDP_PAYLOAD
    );
    let mut rows = Vec::new();
    for &m in &spec.server_threads {
        for &t in &spec.transports {
            if spec.progress {
                eprintln!(
                    "rate-bench: {} server, {m} thread(s); {} clients x {} outstanding, {} B, {} s ...",
                    t.name(),
                    spec.clients,
                    spec.outstanding,
                    spec.size,
                    spec.seconds
                );
            }
            let r =
                run_one(spec, t, m).with_context(|| format!("{} with {m} thread(s)", t.name()))?;
            let row = r.row(t, m, spec.clients);
            if spec.progress {
                eprintln!(
                    "rate-bench: {} {m} thread(s): {:.0} RPCs/s, p50 {:.1} µs, p99 {:.1} µs; served per server thread {:?}",
                    t.name(),
                    row.rpcs_per_sec,
                    row.p50_us,
                    row.p99_us,
                    r.served
                );
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

/// What one run measured.
struct RunResult {
    /// Sum over the clients of (RPCs completed in the window / window).
    rpcs_per_sec: f64,
    /// Server threads' CPU seconds per second of the window.
    server_cores: f64,
    latency: Histogram<u64>,
    /// Requests each server thread answered (warm-up included).
    served: Vec<u64>,
}

impl RunResult {
    fn row(&self, t: RateTransport, m: usize, clients: usize) -> RateRow {
        let us = |q: f64| (self.latency.value_at_quantile(q) as f64 / 10.0).round() / 100.0;
        RateRow {
            transport: t.name().into(),
            server_threads: m,
            clients,
            rpcs_per_sec: self.rpcs_per_sec.round(),
            p50_us: us(0.5),
            p99_us: us(0.99),
            server_cores: (self.server_cores * 1000.0).round() / 1000.0,
            rpcs_per_server_core: if self.server_cores > 0.0 {
                (self.rpcs_per_sec / self.server_cores).round()
            } else {
                0.0
            },
        }
    }
}

/// When a client measures and when it stops.
#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
    max_rpcs: u64,
}

impl Window {
    fn measures(&self, t: Instant) -> bool {
        t >= self.start && t < self.end
    }
    /// Whether to start another RPC (`issued` so far).
    fn more(&self, issued: u64) -> bool {
        issued < self.max_rpcs && Instant::now() < self.end
    }
    /// Outstanding RPCs not answered by then fail the run.
    fn drain_limit(&self) -> Instant {
        self.end + Duration::from_secs(2)
    }
}

/// What one client measured.
struct ClientTally {
    in_window: u64,
    window_secs: f64,
    latency: Histogram<u64>,
}

impl ClientTally {
    fn new() -> ClientTally {
        ClientTally {
            in_window: 0,
            window_secs: 0.0,
            latency: new_histogram(),
        }
    }
    /// One RPC started at `t0` completed now.
    fn complete(&mut self, w: &Window, t0: Instant) {
        let now = Instant::now();
        if w.measures(now) {
            self.in_window += 1;
            record(&mut self.latency, now.duration_since(t0).as_nanos() as u64);
        }
    }
    /// The client stopped issuing (its window ends now if it ended early).
    fn finish(mut self, w: &Window) -> ClientTally {
        let end = Instant::now().min(w.end);
        self.window_secs = end.saturating_duration_since(w.start).as_secs_f64();
        self
    }
}

/// A running echo server: its address, its threads and how to stop it.
struct Server {
    addr: SocketAddr,
    threads: ServerThreads,
    stop: Box<dyn FnOnce() -> anyhow::Result<Vec<u64>>>,
}

/// The kernel thread ids of a server's threads, each registered by the
/// thread itself when it starts, for their CPU time.
#[derive(Clone, Default)]
struct ServerThreads(Arc<std::sync::Mutex<Vec<libc::pid_t>>>);

impl ServerThreads {
    /// Spawns a server thread that registers itself first.
    fn spawn<T: Send + 'static>(
        &self,
        name: String,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<JoinHandle<T>> {
        let ids = self.0.clone();
        std::thread::Builder::new().name(name).spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            ids.lock().unwrap_or_else(|e| e.into_inner()).push(tid);
            f()
        })
    }

    /// These threads and every thread of the process named `name` (the
    /// Homa runtime's background threads of the server's endpoints: their
    /// work is the server's too).
    fn with_named(self, name: &str) -> ServerThreads {
        if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
            let mut ids = self.0.lock().unwrap_or_else(|e| e.into_inner());
            for e in dir.flatten() {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                if comm.trim() == name {
                    if let Some(tid) = e.file_name().to_str().and_then(|t| t.parse().ok()) {
                        ids.push(tid);
                    }
                }
            }
        }
        self
    }

    /// Total CPU time of the threads so far, in seconds (threads that
    /// have not started yet count nothing).
    fn cpu_secs(&self) -> f64 {
        let ids = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        ids.iter().map(|&tid| thread_cpu_secs(tid)).sum()
    }
}

/// CPU time of thread `tid` of this process: the first field of its
/// `schedstat`, nanoseconds on a CPU (0 if it cannot be read).
fn thread_cpu_secs(tid: libc::pid_t) -> f64 {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// Sleeps until `t` (at once if it has passed).
fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

fn run_one(spec: &RateBench, t: RateTransport, m: usize) -> anyhow::Result<RunResult> {
    let server = match t {
        RateTransport::Homa => homa_server(&spec.homa, spec.poll, m)?,
        RateTransport::Udp => udp_server(spec.poll, m)?,
        RateTransport::Tcp => tcp_server(spec.poll, m, spec.size)?,
    };
    let start = Instant::now() + Duration::from_secs_f64(spec.warmup);
    let w = Window {
        start,
        end: start + Duration::from_secs_f64(spec.seconds),
        max_rpcs: spec.max_rpcs,
    };
    let payloads = Payloads::new(spec.size);
    let mut clients: Vec<JoinHandle<anyhow::Result<ClientTally>>> = Vec::new();
    let mut spawn_error = None;
    for c in 0..spec.clients {
        let (addr, k, size, payloads) =
            (server.addr, spec.outstanding, spec.size, payloads.clone());
        let mut cfg = spec.homa.clone();
        cfg.poll = Duration::ZERO;
        let body = move || match t {
            RateTransport::Homa => homa_client(cfg, addr, k, size, &w),
            RateTransport::Udp => udp_client(addr, k, &payloads, size, &w),
            RateTransport::Tcp => tcp_client(addr, k, &payloads, size, &w),
        };
        match std::thread::Builder::new()
            .name(format!("rate-client-{c}"))
            .spawn(body)
        {
            Ok(h) => clients.push(h),
            Err(e) => {
                spawn_error = Some(e);
                break;
            }
        }
    }
    // The servers' CPU time over the measured window.
    sleep_until(w.start);
    let (cpu0, t0) = (server.threads.cpu_secs(), Instant::now());
    sleep_until(w.end);
    let (cpu1, t1) = (server.threads.cpu_secs(), Instant::now());
    let server_cores = (cpu1 - cpu0) / t1.duration_since(t0).as_secs_f64().max(1e-9);
    let mut latency = new_histogram();
    let mut rate = 0.0;
    let mut first_error = spawn_error.map(anyhow::Error::from);
    for h in clients {
        match h.join() {
            Ok(Ok(tally)) => {
                if tally.window_secs > 0.0 {
                    rate += tally.in_window as f64 / tally.window_secs;
                }
                if let Err(e) = latency.add(&tally.latency) {
                    first_error.get_or_insert(anyhow::anyhow!("merging histograms: {e}"));
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(anyhow::anyhow!("a client thread panicked"));
            }
        }
    }
    let served = (server.stop)()?;
    if let Some(e) = first_error {
        return Err(e);
    }
    anyhow::ensure!(
        !latency.is_empty(),
        "no RPC completed in the measured window (all {} per client done in the warm-up?)",
        spec.max_rpcs
    );
    Ok(RunResult {
        rpcs_per_sec: rate,
        server_cores,
        latency,
        served,
    })
}

// ------------------------------------------------------------------ Homa

/// M endpoints on one address (`SO_REUSEPORT`), each echoing inside its own
/// thread's receive passes.
fn homa_server(cfg: &homa::EndpointConfig, poll: Duration, m: usize) -> anyhow::Result<Server> {
    let cfg = homa::EndpointBuilder::from(cfg.clone())
        .poll(poll)
        .reuse_port(true)
        .build();
    let first = homa::Endpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = first.local_addr();
    let mut eps = vec![first];
    for _ in 1..m {
        eps.push(homa::Endpoint::bind_with(addr, cfg.clone())?);
    }
    let ids = ServerThreads::default();
    let mut threads = Vec::new();
    for (i, ep) in eps.iter().enumerate() {
        let ep = ep.clone();
        threads.push(ids.spawn(
            format!("rate-homa-srv-{i}"),
            move || -> homa::Result<u64> {
                let mut served = 0;
                ep.serve(|req| {
                    let (message, responder) = req.into_parts();
                    // The client may have given up on it meanwhile.
                    let _ = responder.reply(message.into_bytes());
                    served += 1;
                })?;
                Ok(served)
            },
        )?);
    }
    Ok(Server {
        addr,
        threads: ids.with_named(&format!("homa-bg-{}", addr.port())),
        stop: Box::new(move || {
            for ep in &eps {
                ep.shutdown();
            }
            join_servers(threads)
        }),
    })
}

fn join_servers<E: Into<anyhow::Error>>(
    threads: Vec<JoinHandle<Result<u64, E>>>,
) -> anyhow::Result<Vec<u64>> {
    threads
        .into_iter()
        .map(|t| {
            t.join()
                .map_err(|_| anyhow::anyhow!("a server thread panicked"))?
                .map_err(Into::into)
        })
        .collect()
}

/// N of these run against the Homa server: [`ClosedLoop`], bounded by the
/// window; any failed RPC fails the run.
fn homa_client(
    config: homa::EndpointConfig,
    server: SocketAddr,
    k: usize,
    size: usize,
    w: &Window,
) -> anyhow::Result<ClientTally> {
    let r = ClosedLoop {
        server,
        bind: "127.0.0.1:0".parse().expect("address"),
        config,
        size,
        outstanding: k,
        max_rpcs: w.max_rpcs,
        until: Some(w.end),
        measure_from: Some(w.start),
        drain: w.drain_limit().duration_since(w.end),
    }
    .run()?;
    if let Some(e) = r.first_error {
        anyhow::bail!("{} Homa RPCs failed; first error: {e}", r.failed);
    }
    anyhow::ensure!(
        r.bad_echo == 0,
        "{} Homa echoes differ from their request",
        r.bad_echo
    );
    Ok(ClientTally {
        in_window: r.latency.len(),
        window_secs: r.window_secs,
        latency: r.latency,
    })
}

// ------------------------------------------------------------------- UDP

/// Datagrams received or sent per system call by the UDP server.
const UDP_BATCH: usize = 32;
/// Leading bytes of a UDP request that the client overwrites with the
/// request's slot and generation, to match replies to requests.
const UDP_TAG: usize = 8;
/// A UDP request not answered after this is taken as lost and sent again.
const UDP_RESEND: Duration = Duration::from_millis(200);

/// A UDP socket with `SO_REUSEPORT` bound to `addr`.
fn reuseport_udp(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// M sockets on one address, each with a thread that echoes batches:
/// `recvmmsg` up to [`UDP_BATCH`] datagrams, `sendmmsg` them back.
fn udp_server(poll: Duration, m: usize) -> anyhow::Result<Server> {
    reuseport_server(
        "udp",
        m,
        reuseport_udp,
        UdpSocket::local_addr,
        move |s: UdpSocket, stop: &AtomicBool| udp_echo_batches(&s, poll, stop),
    )
}

/// M sockets bound by `bind` to one address (the first to an ephemeral
/// loopback port, the others to its address), each served by its own
/// thread running `serve` until the server is stopped.
fn reuseport_server<S: Send + 'static>(
    name: &str,
    m: usize,
    bind: impl Fn(SocketAddr) -> io::Result<S>,
    local_addr: impl Fn(&S) -> io::Result<SocketAddr>,
    serve: impl Fn(S, &AtomicBool) -> io::Result<u64> + Send + Clone + 'static,
) -> anyhow::Result<Server> {
    let first = bind("127.0.0.1:0".parse().expect("address"))?;
    let addr = local_addr(&first)?;
    let mut socks = vec![first];
    for _ in 1..m {
        socks.push(bind(addr)?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let ids = ServerThreads::default();
    let mut threads = Vec::new();
    for (i, sock) in socks.into_iter().enumerate() {
        let (stop, serve) = (stop.clone(), serve.clone());
        threads.push(ids.spawn(format!("rate-{name}-srv-{i}"), move || serve(sock, &stop))?);
    }
    Ok(Server {
        addr,
        threads: ids,
        stop: Box::new(move || {
            stop.store(true, Relaxed);
            join_servers(threads)
        }),
    })
}

/// Buffers and headers for one `recvmmsg`/`sendmmsg` batch.
struct MmsgBatch {
    bufs: Vec<u8>,
    addrs: Vec<libc::sockaddr_storage>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

const UDP_SLOT: usize = 65_536;

impl MmsgBatch {
    fn new() -> Box<MmsgBatch> {
        let mut b = Box::new(MmsgBatch {
            bufs: vec![0u8; UDP_BATCH * UDP_SLOT],
            // SAFETY: all-zero is a valid sockaddr_storage.
            addrs: (0..UDP_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            iovs: (0..UDP_BATCH)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            // SAFETY: all-zero is a valid mmsghdr (null pointers, zero
            // lengths); `reset` points it at its buffer and address.
            hdrs: (0..UDP_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
        });
        b.reset(UDP_BATCH);
        b
    }

    /// Points the first `n` headers at their buffer and address, full size.
    fn reset(&mut self, n: usize) {
        for i in 0..n {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i * UDP_SLOT..].as_mut_ptr().cast(),
                iov_len: UDP_SLOT,
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    /// Receives up to a batch without blocking; 0 when none is waiting.
    fn recv(&mut self, fd: i32) -> io::Result<usize> {
        // SAFETY: every header points at its own live buffer, iovec and
        // address in `self`, sized as declared.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                UDP_BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize)
    }

    /// Sends the `n` received datagrams back to their sources. A datagram
    /// the socket cannot take now is dropped (the client sends it again).
    fn echo(&mut self, fd: i32, n: usize) -> io::Result<()> {
        for i in 0..n {
            self.iovs[i].iov_len = self.hdrs[i].msg_len as usize;
        }
        let mut sent = 0;
        while sent < n {
            // SAFETY: headers `sent..n` point at live buffers (lengths as
            // received) and at the addresses `recvmmsg` filled in.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    self.hdrs[sent..].as_mut_ptr(),
                    (n - sent) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => break,
                    // A client gone away (ECONNREFUSED from an earlier ICMP).
                    io::ErrorKind::ConnectionRefused => {
                        sent += 1;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            sent += r.max(1) as usize;
        }
        self.reset(n);
        Ok(())
    }
}

fn udp_echo_batches(sock: &UdpSocket, poll: Duration, stop: &AtomicBool) -> io::Result<u64> {
    let fd = sock.as_raw_fd();
    let mut batch = MmsgBatch::new();
    let mut served = 0u64;
    let mut idle_since = Instant::now();
    while !stop.load(Relaxed) {
        let n = batch.recv(fd)?;
        if n > 0 {
            batch.echo(fd, n)?;
            served += n as u64;
            idle_since = Instant::now();
        } else if idle_since.elapsed() < poll {
            std::hint::spin_loop();
        } else {
            wait_fd(fd, libc::POLLIN, Duration::from_millis(50))?;
        }
    }
    Ok(served)
}

fn udp_client(
    server: SocketAddr,
    k: usize,
    payloads: &Payloads,
    size: usize,
    w: &Window,
) -> anyhow::Result<ClientTally> {
    let sock = UdpSocket::bind("127.0.0.1:0")?;
    sock.connect(server)?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))?;
    let mut msg = payloads.payload(0, size).to_vec();
    // Per slot: generation, and when its request was (last) sent.
    let mut slots: Vec<(u32, Option<Instant>)> = vec![(0, None); k];
    let mut send = |slot: usize, generation: u32| -> io::Result<()> {
        msg[..4].copy_from_slice(&(slot as u32).to_le_bytes());
        msg[4..UDP_TAG].copy_from_slice(&generation.to_le_bytes());
        sock.send(&msg).map(|_| ())
    };
    let mut tally = ClientTally::new();
    let mut issued = 0u64;
    let mut buf = vec![0u8; UDP_SLOT];
    loop {
        for (i, s) in slots.iter_mut().enumerate() {
            if s.1.is_none() && w.more(issued) {
                s.0 = s.0.wrapping_add(1);
                s.1 = Some(Instant::now());
                send(i, s.0)?;
                issued += 1;
            }
        }
        if slots.iter().all(|s| s.1.is_none()) {
            break;
        }
        anyhow::ensure!(Instant::now() < w.drain_limit(), "UDP requests unanswered");
        match sock.recv(&mut buf) {
            Ok(n) if n == size => {
                let slot = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
                let generation = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
                // A late echo of a request sent again is stale.
                if let Some(s) = slots.get_mut(slot).filter(|s| s.0 == generation) {
                    if let Some(t0) = s.1.take() {
                        tally.complete(w, t0);
                    }
                }
            }
            Ok(n) => anyhow::bail!("echo of {n} bytes, sent {size}"),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // Lost (a full socket buffer under load): send again.
                for (i, s) in slots.iter_mut().enumerate() {
                    if s.1.is_some_and(|t| t.elapsed() > UDP_RESEND) {
                        s.0 = s.0.wrapping_add(1);
                        s.1 = Some(Instant::now());
                        send(i, s.0)?;
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(tally.finish(w))
}

// ------------------------------------------------------------------- TCP

/// A TCP listener with `SO_REUSEPORT` bound to `addr`.
fn reuseport_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_port(true)?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// M listeners on one address, each with its own epoll loop echoing whole
/// `size`-byte messages on the connections it accepted.
fn tcp_server(poll: Duration, m: usize, size: usize) -> anyhow::Result<Server> {
    reuseport_server(
        "tcp",
        m,
        reuseport_listener,
        TcpListener::local_addr,
        move |l: TcpListener, stop: &AtomicBool| tcp_echo_loop(&l, size, poll, stop),
    )
}

/// A server connection: bytes of an incomplete request, replies not yet
/// written.
struct Conn {
    stream: TcpStream,
    partial: usize,
    out: Vec<u8>,
}

const LISTENER: u64 = u64::MAX;

fn tcp_echo_loop(
    l: &TcpListener,
    size: usize,
    poll: Duration,
    stop: &AtomicBool,
) -> io::Result<u64> {
    let ep = epoll::new()?;
    ep.add(l, EpollEvent::new(IN, LISTENER))?;
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut events = [EpollEvent::empty(); BATCH];
    let mut buf = vec![0u8; 256 * 1024];
    let mut served = 0u64;
    let mut idle_since = Instant::now();
    while !stop.load(Relaxed) {
        let timeout = if idle_since.elapsed() < poll { 0 } else { 50 };
        let ready = epoll::wait(&ep, &mut events, timeout)?;
        if ready.is_empty() {
            continue;
        }
        idle_since = Instant::now();
        for event in ready {
            let (token, ev) = (event.data(), event.events());
            if token == LISTENER {
                while let Ok((s, _)) = l.accept() {
                    s.set_nonblocking(true)?;
                    s.set_nodelay(true)?;
                    let slot = conns.iter().position(Option::is_none).unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    ep.add(&s, EpollEvent::new(IN | ERR, slot as u64))?;
                    conns[slot] = Some(Conn {
                        stream: s,
                        partial: 0,
                        out: Vec::new(),
                    });
                }
                continue;
            }
            let slot = token as usize;
            let Some(c) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let open = if ev.intersects(IN | ERR) {
                echo_whole_messages(c, &mut buf, size, &mut served)
            } else {
                Ok(true)
            };
            let open = open.and_then(|open| {
                if !open {
                    return Ok(false);
                }
                flush(c)?;
                let want = if c.out.is_empty() {
                    IN | ERR
                } else {
                    IN | OUT | ERR
                };
                ep.modify(&c.stream, &mut EpollEvent::new(want, slot as u64))?;
                Ok(true)
            });
            if !matches!(open, Ok(true)) {
                let _ = ep.delete(&c.stream);
                conns[slot] = None;
            }
        }
    }
    Ok(served)
}

/// Reads what is there and queues an echo of every message completed.
/// Ok(false): the peer closed the connection.
fn echo_whole_messages(
    c: &mut Conn,
    buf: &mut [u8],
    size: usize,
    served: &mut u64,
) -> io::Result<bool> {
    loop {
        match c.stream.read(buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                // Requests are fixed-size: the bytes of each completed one
                // are echoed as they came.
                let total = c.partial + n;
                let whole = total / size;
                c.partial = total % size;
                *served += whole as u64;
                c.out.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes queued replies, but only whole messages' worth of the bytes read
/// (the incomplete request's bytes stay queued until it completes).
fn flush(c: &mut Conn) -> io::Result<()> {
    let ready = c.out.len() - c.partial;
    let mut at = 0;
    while at < ready {
        match c.stream.write(&c.out[at..ready]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    c.out.drain(..at);
    Ok(())
}

fn tcp_client(
    server: SocketAddr,
    k: usize,
    payloads: &Payloads,
    size: usize,
    w: &Window,
) -> anyhow::Result<ClientTally> {
    let mut s = TcpStream::connect_timeout(&server, Duration::from_secs(2))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let msg = payloads.payload(0, size);
    let mut tally = ClientTally::new();
    // Send times of the outstanding requests, oldest first (echoes return
    // in order on one connection).
    let mut started: VecDeque<Instant> = VecDeque::with_capacity(k);
    let mut issued = 0u64;
    let mut buf = vec![0u8; size * k];
    let mut partial = 0usize;
    loop {
        while started.len() < k && w.more(issued) {
            started.push_back(Instant::now());
            s.write_all(&msg)?;
            issued += 1;
        }
        if started.is_empty() {
            break;
        }
        anyhow::ensure!(
            Instant::now() < w.drain_limit(),
            "{} TCP requests unanswered",
            started.len()
        );
        match s.read(&mut buf) {
            Ok(0) => anyhow::bail!("the TCP server closed the connection"),
            Ok(n) => {
                let total = partial + n;
                for _ in 0..total / size {
                    let t0 = started
                        .pop_front()
                        .ok_or_else(|| anyhow::anyhow!("more TCP echoes than requests"))?;
                    tally.complete(w, t0);
                }
                partial = total % size;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(tally.finish(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(transports: Vec<RateTransport>, threads: Vec<usize>) -> RateBench {
        RateBench {
            transports,
            server_threads: threads,
            clients: 3,
            outstanding: 2,
            seconds: 0.2,
            warmup: 0.0,
            max_rpcs: 300,
            poll: Duration::from_micros(10),
            ..RateBench::new()
        }
    }

    /// The smoke test: every transport with one and two server threads,
    /// bounded to a few hundred RPCs per client; every row is sane.
    #[test]
    fn every_transport_and_thread_count_gives_a_row() {
        let rows = run(&tiny(RateTransport::ALL.to_vec(), vec![1, 2])).unwrap();
        let got: Vec<(&str, usize)> = rows
            .iter()
            .map(|r| (r.transport.as_str(), r.server_threads))
            .collect();
        assert_eq!(
            got,
            [
                ("homa", 1),
                ("udp", 1),
                ("tcp", 1),
                ("homa", 2),
                ("udp", 2),
                ("tcp", 2)
            ]
        );
        for r in &rows {
            assert_eq!(r.clients, 3);
            assert!(r.rpcs_per_sec > 0.0, "{r:?}");
            assert!(r.p50_us > 0.0 && r.p99_us >= r.p50_us, "{r:?}");
            // The server threads did the serving: they used CPU time, and
            // no more than they have.
            let m = r.server_threads as f64;
            assert!(r.server_cores > 0.0 && r.server_cores <= m + 1.1, "{r:?}");
            assert!(
                r.rpcs_per_server_core >= r.rpcs_per_sec / (m + 1.1),
                "{r:?}"
            );
        }
        let v: serde_json::Value = serde_json::from_str(&crate::stats::to_json(rows)).unwrap();
        for key in [
            "transport",
            "server_threads",
            "clients",
            "rpcs_per_sec",
            "p50_us",
            "p99_us",
            "server_cores",
            "rpcs_per_server_core",
        ] {
            assert!(v["rows"][0].get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn bad_specs_are_refused() {
        let ok = tiny(vec![RateTransport::Udp], vec![1]);
        assert!(run(&RateBench {
            clients: 0,
            ..ok.clone()
        })
        .is_err());
        assert!(run(&RateBench {
            server_threads: vec![0],
            ..ok.clone()
        })
        .is_err());
        assert!(run(&RateBench {
            size: 4,
            ..ok.clone()
        })
        .is_err());
        assert!(run(&RateBench { seconds: 0.0, ..ok }).is_err());
        assert_eq!(RateTransport::parse(" tcp").unwrap(), RateTransport::Tcp);
        assert!(RateTransport::parse("quic").is_err());
    }

    /// A TCP server answers only whole requests, however the bytes arrive.
    #[test]
    fn tcp_server_echoes_whole_messages_only() {
        let server = tcp_server(Duration::ZERO, 1, 10).unwrap();
        let mut c = TcpStream::connect(server.addr).unwrap();
        c.set_nodelay(true).unwrap();
        c.write_all(&[1u8; 7]).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buf = [0u8; 20];
        assert!(c.read(&mut buf).is_err(), "echoed part of a request");
        c.write_all(&[1u8; 13]).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(buf, [1u8; 20]);
        drop(c);
        assert_eq!((server.stop)().unwrap(), vec![2]);
    }
}
