//! Bulk TCP flows between testbed hosts: the traffic Homa shares its
//! receivers' downlinks with in the coexistence experiment
//! ([`crate::coexist`]). Real kernel TCP (the congestion control is set on
//! each socket, CUBIC by default), on plain blocking sockets driven by
//! threads of this process: a writer that never runs out of data, a reader
//! that counts what arrives.

use crate::netns::{run_in, spawn_in};
use crate::testbed::{host_addr, Testbed};
use crate::{Error, Result};
use serde::Serialize;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Port of flow `k`'s receiver: `BULK_BASE_PORT + k`.
pub const BULK_BASE_PORT: u16 = 6000;

/// How long a blocked read or write waits before it looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Bytes per `write` call.
const CHUNK: usize = 64 * 1024;

/// One flow: host `sender` writes to host `receiver` as fast as TCP lets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FlowSpec {
    pub sender: usize,
    pub receiver: usize,
}

/// What the sender's kernel says of a flow (`TCP_INFO`), and its bytes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FlowInfo {
    pub sender: usize,
    pub receiver: usize,
    /// Bytes the receiver read since the flow started.
    pub bytes_received: u64,
    /// TCP's smoothed RTT, µs: the standing queue the flow keeps shows here.
    pub srtt_us: u32,
    pub rttvar_us: u32,
    /// Congestion window, segments.
    pub cwnd_segments: u32,
    /// Segments retransmitted over the flow's life.
    pub total_retrans: u32,
}

/// Running flows; [`BulkFlows::stop`] ends them (dropping does too).
pub struct BulkFlows {
    specs: Vec<FlowSpec>,
    stop: Arc<AtomicBool>,
    received: Vec<Arc<AtomicU64>>,
    /// A duplicate of each writer's socket, to read `TCP_INFO` from.
    writers: Vec<TcpStream>,
    threads: Vec<JoinHandle<Result<()>>>,
    /// The congestion control every flow runs (read back from its socket).
    pub congestion_control: String,
}

fn set_congestion_control(s: &TcpStream, algorithm: &str) -> Result<String> {
    let fd = s.as_raw_fd();
    // SAFETY: setsockopt/getsockopt on a live socket with buffers of the
    // lengths passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            algorithm.as_ptr().cast(),
            algorithm.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(Error::Command(format!(
            "TCP_CONGESTION {algorithm}: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut buf = [0u8; 16];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: as above.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(Error::Command(format!(
            "TCP_CONGESTION: {}",
            std::io::Error::last_os_error()
        )));
    }
    let name = &buf[..len as usize];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

fn tcp_info(s: &TcpStream) -> Option<libc::tcp_info> {
    // SAFETY: tcp_info is plain old data, for which all zeroes is valid.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt on a live socket writes at most `len` bytes into
    // `info`, which is that long.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(info)
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads flow bytes until the writer closes or `stop`.
fn read_flow(listener: TcpListener, stop: &AtomicBool, count: &AtomicU64) -> Result<()> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if would_block(&e) => {
                if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    };
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if would_block(&e) || e.kind() == ErrorKind::Interrupted => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes until `stop`, then closes its side.
fn write_flow(mut s: TcpStream, stop: &AtomicBool) -> Result<()> {
    s.set_write_timeout(Some(POLL))?;
    let buf = vec![0x5au8; CHUNK];
    while !stop.load(Ordering::Relaxed) {
        match s.write(&buf) {
            Ok(_) => {}
            Err(e) if would_block(&e) || e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    Ok(())
}

/// Starts every flow of `flows` on the testbed, each from its sender's
/// namespace to its receiver's, with congestion control `algorithm`
/// ("cubic"); returns once all are connected.
pub fn start(tb: &Testbed, flows: &[FlowSpec], algorithm: &str) -> Result<BulkFlows> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut b = BulkFlows {
        specs: flows.to_vec(),
        stop: stop.clone(),
        received: Vec::new(),
        writers: Vec::new(),
        threads: Vec::new(),
        congestion_control: String::new(),
    };
    for (k, f) in flows.iter().enumerate() {
        if f.sender >= tb.hosts() || f.receiver >= tb.hosts() || f.sender == f.receiver {
            return Err(Error::config(format!("bad TCP flow {f:?}")));
        }
        let addr = SocketAddr::new(host_addr(f.receiver).into(), BULK_BASE_PORT + k as u16);
        let listener = run_in(&tb.ns(f.receiver), move || Ok(TcpListener::bind(addr)?))?;
        let count = Arc::new(AtomicU64::new(0));
        b.received.push(count.clone());
        let st = stop.clone();
        b.threads.push(
            std::thread::Builder::new()
                .name(format!("tcp-sink-{k}"))
                .spawn(move || read_flow(listener, &st, &count))
                .map_err(|e| Error::bench(format!("spawn: {e}")))?,
        );
        let (tx, rx) = mpsc::channel();
        let st = stop.clone();
        let algorithm = algorithm.to_string();
        b.threads.push(spawn_in(
            &tb.ns(f.sender),
            format!("tcp-bulk-{k}"),
            move || {
                let connected = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                    .map_err(Error::from)
                    .and_then(|s| {
                        let cc = set_congestion_control(&s, &algorithm)?;
                        Ok((s.try_clone()?, s, cc))
                    });
                match connected {
                    Ok((dup, s, cc)) => {
                        let _ = tx.send(Ok((dup, cc)));
                        write_flow(s, &st)
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        let _ = tx.send(Err(e));
                        Err(Error::bench(format!("TCP flow {k}: {msg}")))
                    }
                }
            },
        )?);
        let (dup, cc) = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| Error::bench(format!("TCP flow {k} did not connect")))??;
        b.writers.push(dup);
        b.congestion_control = cc;
    }
    Ok(b)
}

impl BulkFlows {
    /// Bytes received so far, all flows together.
    pub fn received_bytes(&self) -> u64 {
        self.received
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes received so far, by flow.
    pub fn received_by_flow(&self) -> Vec<u64> {
        self.received
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    }

    /// Each flow's state as its sender's kernel reports it now.
    pub fn info(&self) -> Vec<FlowInfo> {
        self.specs
            .iter()
            .zip(&self.writers)
            .zip(&self.received)
            .map(|((spec, w), count)| {
                let i = tcp_info(w);
                FlowInfo {
                    sender: spec.sender,
                    receiver: spec.receiver,
                    bytes_received: count.load(Ordering::Relaxed),
                    srtt_us: i.map_or(0, |i| i.tcpi_rtt),
                    rttvar_us: i.map_or(0, |i| i.tcpi_rttvar),
                    cwnd_segments: i.map_or(0, |i| i.tcpi_snd_cwnd),
                    total_retrans: i.map_or(0, |i| i.tcpi_total_retrans),
                }
            })
            .collect()
    }

    /// Stops every flow and waits for its threads; the flows' final state.
    pub fn stop(mut self) -> Result<Vec<FlowInfo>> {
        let info = self.info();
        self.stop_threads()?;
        Ok(info)
    }

    fn stop_threads(&mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(Error::bench("TCP flow thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for BulkFlows {
    fn drop(&mut self) {
        let _ = self.stop_threads();
    }
}
