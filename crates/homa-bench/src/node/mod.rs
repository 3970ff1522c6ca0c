//! The cluster benchmark's node programs (the equivalent of the Linux
//! module's cp_node): echo servers and open-loop clients, over Homa or TCP.
//!
//! A client thread ("port") draws message lengths from a workload and
//! issues echo RPCs to servers chosen uniformly at random, with Poisson
//! arrivals at a target rate in Gbit/s (request plus response bytes), never
//! more than a cap of RPCs outstanding (arrivals beyond it wait for a free
//! slot and are counted). Every response is compared with its request, and
//! every RPC's size and round-trip time is recorded.
//!
//! These functions use whatever network namespace the calling thread is
//! in; `homa_testbed::netns::spawn_in` puts them on a testbed host.

pub mod homa_node;
pub mod probe;
pub mod tcp_node;

use crate::payload::Payloads;
use homa_workload::workload::Workload;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Why a node program failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("benchmark: {0}")]
    Bench(String),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("homa: {0}")]
    Homa(#[from] homa::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What carries the RPCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Homa, with the engine's priorities carried in DSCP.
    Homa,
    /// Homa with every packet in the lowest class (DSCP 0): the ablation
    /// that shows what the switch's priority queues are worth.
    HomaNoprio,
    /// TCP: persistent connections, TCP_NODELAY, length-prefixed frames.
    Tcp,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::Homa => "homa",
            Transport::HomaNoprio => "homa-noprio",
            Transport::Tcp => "tcp",
        }
    }
    pub fn is_homa(self) -> bool {
        matches!(self, Transport::Homa | Transport::HomaNoprio)
    }
    /// Parses "homa,tcp,homa-noprio".
    pub fn parse_list(s: &str) -> Result<Vec<Transport>> {
        let v: Vec<Transport> = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.trim().parse())
            .collect::<Result<_>>()?;
        if v.is_empty() {
            return Err(Error::Config("no transport given".into()));
        }
        Ok(v)
    }
}

impl FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Transport> {
        match s.to_ascii_lowercase().as_str() {
            "homa" => Ok(Transport::Homa),
            "homa-noprio" | "homa_noprio" | "noprio" => Ok(Transport::HomaNoprio),
            "tcp" => Ok(Transport::Tcp),
            _ => Err(Error::Config(format!(
                "unknown transport {s:?} (homa, homa-noprio, tcp)"
            ))),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One bench server node: `ports` listening ports from `base_port`.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub transport: Transport,
    pub ip: IpAddr,
    pub base_port: u16,
    pub ports: usize,
    /// Threads receiving and answering on each Homa port (TCP uses one
    /// event loop per port).
    pub threads_per_port: usize,
    pub homa: homa::EndpointConfig,
    /// Largest request accepted (TCP frames above it close the connection).
    pub max_message: usize,
}

/// Counters of a server node at shutdown.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerStats {
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
}

/// A running server node; [`ServerHandle::stop`] ends it.
pub struct ServerHandle {
    pub(crate) stop: Box<dyn FnOnce() -> Result<ServerStats> + Send>,
    pub addrs: Vec<SocketAddr>,
    /// Homa: the first port's endpoint, which a client on the same host can
    /// share (see [`ClientSpec::homa_endpoint`]).
    pub homa_endpoint: Option<homa::Endpoint>,
}

impl ServerHandle {
    pub fn stop(self) -> Result<ServerStats> {
        (self.stop)()
    }
}

/// Starts a server node in the calling thread's namespace.
pub fn start_server(spec: &ServerSpec) -> Result<ServerHandle> {
    if spec.ports == 0 {
        return Err(Error::Config("a server needs at least one port".into()));
    }
    if spec.transport.is_homa() {
        homa_node::start_server(spec)
    } else {
        tcp_node::start_server(spec)
    }
}

/// One client node.
#[derive(Clone)]
pub struct ClientSpec {
    pub transport: Transport,
    /// Address the client's sockets bind to (port 0).
    pub ip: IpAddr,
    /// Each server's ports (one inner list per server host).
    pub servers: Vec<Vec<SocketAddr>>,
    pub workload: Arc<Workload>,
    /// Target request + response payload rate of the whole node, Gbit/s.
    pub gbps: f64,
    /// Cap on RPCs outstanding per client port.
    pub max_outstanding: usize,
    /// Client threads, each with its own socket and share of the rate.
    pub ports: usize,
    /// RPCs started before this are not recorded.
    pub warmup: Duration,
    /// Length of the recorded window after the warm-up.
    pub duration: Duration,
    /// After the window, how long to wait for outstanding RPCs.
    pub drain: Duration,
    pub seed: u64,
    pub homa: homa::EndpointConfig,
    /// Homa: issue the RPCs on this endpoint (the host's server endpoint)
    /// instead of opening one per client port. The runtime paces each
    /// endpoint to the link rate on its own, so separate endpoints on one
    /// host would together overrun its link; one endpoint per host is the
    /// user-space equivalent of the Linux module's per-host pacer and SRPT
    /// queue. Requires `ports == 1`.
    pub homa_endpoint: Option<homa::Endpoint>,
    /// TCP: connections to each server per client port opened at start...
    pub tcp_conns: usize,
    /// ...and at most this many (more are opened while all are busy).
    pub tcp_max_conns: usize,
    pub payloads: Payloads,
    /// Incremented per completed RPC (for progress bars).
    pub progress: Option<Arc<std::sync::atomic::AtomicU64>>,
}

impl ClientSpec {
    /// Mean gap between arrivals at one client port, ns.
    pub fn mean_gap_ns(&self) -> f64 {
        let per_port_bps = self.gbps * 1e9 / self.ports.max(1) as f64;
        // Each RPC moves its length twice (request and echo).
        2.0 * self.workload.mean() * 8.0 / per_port_bps * 1e9
    }
    fn validate(&self) -> Result<()> {
        if self.servers.is_empty() || self.servers.iter().any(|s| s.is_empty()) {
            return Err(Error::Config("the client needs servers".into()));
        }
        if !(self.gbps.is_finite() && self.gbps > 0.0) {
            return Err(Error::Config(format!("bad rate {} Gbit/s", self.gbps)));
        }
        if self.ports == 0 || self.max_outstanding == 0 || self.tcp_conns == 0 {
            return Err(Error::Config(
                "ports, outstanding cap and connections must be positive".into(),
            ));
        }
        if self.homa_endpoint.is_some() && self.ports != 1 {
            return Err(Error::Config(
                "a shared Homa endpoint takes exactly one client port".into(),
            ));
        }
        if self.workload.max_len() as usize > self.payloads.max_len() {
            return Err(Error::Config("payloads shorter than the workload".into()));
        }
        Ok(())
    }
}

/// One completed RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Sample {
    pub size: u32,
    pub rtt_ns: u64,
    /// How late the client sent the request after its scheduled arrival
    /// (a client starved of CPU, or waiting on the outstanding cap).
    pub lag_ns: u64,
}

/// What a client node measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ClientResult {
    /// RPCs started inside the recorded window and completed.
    #[serde(skip)]
    pub samples: Vec<Sample>,
    /// RPCs started (whole run, warm-up included).
    pub issued: u64,
    /// RPCs completed with a correct response (whole run).
    pub completed: u64,
    /// RPCs that failed (transport error or a wrong response).
    pub failed: u64,
    /// Responses whose bytes differed from the request.
    pub mismatches: u64,
    /// RPCs still outstanding when the drain time ran out.
    pub unfinished: u64,
    /// Arrivals that had to wait because the outstanding cap was reached.
    pub cap_waits: u64,
    /// TCP: requests queued behind another on a busy connection.
    pub pipelined: u64,
    /// TCP: connections opened beyond the initial pool.
    pub connections: u64,
    /// Request + response payload bytes of RPCs completed inside the window.
    pub window_bytes: u64,
    /// Request + response payload bytes of RPCs scheduled inside the window
    /// (what the arrival process offered; with a heavy-tailed workload it
    /// differs from the target in any finite window).
    pub offered_bytes: u64,
    pub window_secs: f64,
    /// First few error messages.
    pub errors: Vec<String>,
}

impl ClientResult {
    pub(crate) fn error(&mut self, msg: String) {
        self.failed += 1;
        if self.errors.len() < 5 {
            self.errors.push(msg);
        }
    }
    /// Combines the results of several client threads or nodes.
    pub fn merge(&mut self, o: ClientResult) {
        self.samples.extend(o.samples);
        self.issued += o.issued;
        self.completed += o.completed;
        self.failed += o.failed;
        self.mismatches += o.mismatches;
        self.unfinished += o.unfinished;
        self.cap_waits += o.cap_waits;
        self.pipelined += o.pipelined;
        self.connections += o.connections;
        self.window_bytes += o.window_bytes;
        self.offered_bytes += o.offered_bytes;
        self.window_secs = self.window_secs.max(o.window_secs);
        for e in o.errors {
            if self.errors.len() < 5 {
                self.errors.push(e);
            }
        }
    }
    /// Payload offered inside the window, Gbit/s.
    pub fn offered_gbps(&self) -> f64 {
        if self.window_secs <= 0.0 {
            0.0
        } else {
            self.offered_bytes as f64 * 8.0 / self.window_secs / 1e9
        }
    }
    /// Payload throughput inside the window, Gbit/s.
    pub fn gbps(&self) -> f64 {
        if self.window_secs <= 0.0 {
            0.0
        } else {
            self.window_bytes as f64 * 8.0 / self.window_secs / 1e9
        }
    }
}

/// Runs a client node to completion in the calling thread's namespace
/// (one thread per port).
pub fn run_client(spec: &ClientSpec) -> Result<ClientResult> {
    spec.validate()?;
    let start = Instant::now();
    let mut handles = Vec::new();
    for port in 0..spec.ports {
        let spec = spec.clone();
        let h = std::thread::Builder::new()
            .name(format!("bench-client-{port}"))
            .spawn(move || {
                let sched = Schedule::new(&spec, port, start);
                if spec.transport.is_homa() {
                    homa_node::client_port(&spec, sched)
                } else {
                    tcp_node::client_port(&spec, sched)
                }
            })?;
        handles.push(h);
    }
    let mut total = ClientResult::default();
    for h in handles {
        let r = h
            .join()
            .map_err(|_| Error::Bench("client thread panicked".into()))??;
        total.merge(r);
    }
    Ok(total)
}

/// The arrival process and bookkeeping of one client port.
pub(crate) struct Schedule {
    /// Arrival times, sizes and servers: the same for every transport.
    rng: ChaCha8Rng,
    /// Choices a transport makes on its own (ports, connections), kept apart
    /// so that they do not change the arrivals.
    pick_rng: ChaCha8Rng,
    mean_gap_ns: f64,
    pub window_start: Instant,
    pub window_end: Instant,
    pub drain_end: Instant,
    next: Instant,
    next_seq: u64,
    seq_stride: u64,
    workload: Arc<Workload>,
    n_servers: usize,
}

impl Schedule {
    fn new(spec: &ClientSpec, port: usize, start: Instant) -> Schedule {
        let mut rng =
            ChaCha8Rng::seed_from_u64(spec.seed ^ (port as u64).wrapping_mul(0x1234_5678_9abc));
        let mean_gap_ns = spec.mean_gap_ns();
        let window_start = start + spec.warmup;
        let window_end = window_start + spec.duration;
        let first = exp_gap(&mut rng, mean_gap_ns);
        Schedule {
            rng,
            pick_rng: ChaCha8Rng::seed_from_u64(
                spec.seed ^ 0x5eed_0fc4_0e55 ^ (port as u64).wrapping_mul(0x9E37_79B9),
            ),
            mean_gap_ns,
            window_start,
            window_end,
            drain_end: window_end + spec.drain,
            next: start + Duration::from_nanos(first),
            // Sequence numbers unique per node: port p uses p, p+ports, ...
            next_seq: (spec.seed << 20) + port as u64,
            seq_stride: spec.ports as u64,
            workload: spec.workload.clone(),
            n_servers: spec.servers.len(),
        }
    }
    /// When the next arrival is due (None once the window is over).
    pub fn next_arrival(&self) -> Option<Instant> {
        (self.next < self.window_end).then_some(self.next)
    }
    /// Takes the due arrival.
    pub fn take_arrival(&mut self, r: &mut ClientResult) -> Arrival {
        let at = self.next;
        self.next += Duration::from_nanos(exp_gap(&mut self.rng, self.mean_gap_ns));
        let seq = self.next_seq;
        self.next_seq += self.seq_stride;
        let len = self.workload.sample(&mut self.rng) as usize;
        let server = self.rng.gen_range(0..self.n_servers);
        if at >= self.window_start {
            r.offered_bytes += 2 * len as u64;
        }
        Arrival {
            seq,
            len,
            server,
            at,
        }
    }
    pub fn pick(&mut self, n: usize) -> usize {
        self.pick_rng.gen_range(0..n.max(1))
    }
    /// Whether an RPC started at `t` is recorded.
    pub fn in_window(&self, t: Instant) -> bool {
        t >= self.window_start && t < self.window_end
    }
    pub fn window_secs(&self) -> f64 {
        self.window_end
            .duration_since(self.window_start)
            .as_secs_f64()
    }
}

/// One RPC to issue.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Arrival {
    pub seq: u64,
    pub len: usize,
    /// Index into [`ClientSpec::servers`].
    pub server: usize,
    /// When it was scheduled.
    pub at: Instant,
}

/// An exponentially distributed gap with mean `mean_ns` (Poisson arrivals).
fn exp_gap(rng: &mut ChaCha8Rng, mean_ns: f64) -> u64 {
    let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    (-u.ln() * mean_ns).min(1e12) as u64
}

/// Bookkeeping shared by both transports' clients when an RPC completes.
pub(crate) fn record(
    r: &mut ClientResult,
    sched: &Schedule,
    a: &Arrival,
    started: Instant,
    done: Instant,
    progress: &Option<Arc<std::sync::atomic::AtomicU64>>,
) {
    let size = a.len;
    r.completed += 1;
    if sched.in_window(started) {
        r.samples.push(Sample {
            size: size as u32,
            rtt_ns: done.duration_since(started).as_nanos() as u64,
            lag_ns: started.saturating_duration_since(a.at).as_nanos() as u64,
        });
    }
    if done >= sched.window_start && done < sched.window_end {
        r.window_bytes += 2 * size as u64;
    }
    if let Some(p) = progress {
        p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_parse() {
        assert_eq!(
            Transport::parse_list("homa, tcp,homa-noprio").unwrap(),
            vec![Transport::Homa, Transport::Tcp, Transport::HomaNoprio]
        );
        assert!(Transport::parse_list("udp").is_err());
        assert!(Transport::parse_list(",").is_err());
        assert_eq!(Transport::HomaNoprio.to_string(), "homa-noprio");
    }

    fn spec(gbps: f64, ports: usize) -> ClientSpec {
        ClientSpec {
            transport: Transport::Homa,
            ip: "127.0.0.1".parse().unwrap(),
            servers: vec![vec!["127.0.0.1:1".parse().unwrap()]],
            workload: Arc::new(Workload::fixed(1000)),
            gbps,
            max_outstanding: 10,
            ports,
            warmup: Duration::from_millis(100),
            duration: Duration::from_secs(1),
            drain: Duration::from_secs(1),
            seed: 3,
            homa: homa::EndpointConfig::default(),
            homa_endpoint: None,
            tcp_conns: 1,
            tcp_max_conns: 1,
            payloads: Payloads::new(1000),
            progress: None,
        }
    }

    #[test]
    fn arrival_rate_matches_target() {
        // 1000-byte echoes at 0.016 Gbit/s: 16e6 / (2*8000) = 1000 RPCs/s.
        let s = spec(0.016, 1);
        assert!((s.mean_gap_ns() - 1e6).abs() < 1.0);
        let mut sched = Schedule::new(&s, 0, Instant::now());
        let mut n = 0;
        let mut last = Instant::now();
        while sched.next_arrival().is_some() {
            let a = sched.take_arrival(&mut ClientResult::default());
            assert_eq!((a.len, a.server), (1000, 0));
            assert!(a.at >= last);
            last = a.at;
            n += 1;
        }
        // 1.1 s of arrivals at 1000/s: Poisson, so within a few sigma.
        assert!((1000..1200).contains(&n), "{n}");
        // Two ports share the rate.
        assert!((spec(0.016, 2).mean_gap_ns() - 2e6).abs() < 1.0);
    }

    #[test]
    fn sequence_numbers_are_unique_across_ports() {
        let s = spec(1.0, 3);
        let now = Instant::now();
        let mut seen = std::collections::HashSet::new();
        for p in 0..3 {
            let mut sched = Schedule::new(&s, p, now);
            for _ in 0..100 {
                assert!(seen.insert(sched.take_arrival(&mut ClientResult::default()).seq));
            }
        }
    }

    #[test]
    fn picks_do_not_change_the_arrivals() {
        let s = spec(1.0, 1);
        let now = Instant::now();
        let (mut a, mut b) = (Schedule::new(&s, 0, now), Schedule::new(&s, 0, now));
        let mut r = ClientResult::default();
        for i in 0..50 {
            // One transport picks a lot, the other never.
            for _ in 0..i % 4 {
                a.pick(7);
            }
            let (x, y) = (a.take_arrival(&mut r), b.take_arrival(&mut r));
            assert_eq!(
                (x.seq, x.len, x.server, x.at),
                (y.seq, y.len, y.server, y.at)
            );
        }
    }

    #[test]
    fn results_merge() {
        let mut a = ClientResult {
            completed: 2,
            window_bytes: 1_000_000_000,
            window_secs: 8.0,
            ..Default::default()
        };
        let mut b = ClientResult::default();
        for i in 0..7 {
            b.error(format!("e{i}"));
        }
        assert_eq!((b.failed, b.errors.len()), (7, 5));
        a.merge(b);
        assert_eq!((a.completed, a.failed, a.errors.len()), (2, 7, 5));
        assert!((a.gbps() - 1.0).abs() < 1e-9);
        assert!(spec(0.0, 1).validate().is_err());
    }
}
