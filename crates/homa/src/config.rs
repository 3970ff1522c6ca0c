//! Runtime configuration: the engine's [`homa_proto::Config`] plus the knobs
//! that only exist on real sockets (polling, DSCP, offloads, buffers).

use crate::socket::FaultInjector;
use crate::sys::ClockSkew;
use std::net::ToSocketAddrs;
use std::time::Duration;

/// Bytes of IPv4 + UDP headers.
const V4_OVERHEAD: usize = 28;
/// Bytes of IPv6 + UDP headers.
const V6_OVERHEAD: usize = 48;

/// An endpoint's settings: the engine's ([`EngineConfig`](crate::EngineConfig))
/// plus those that only exist on real sockets (polling, MTU, DSCP, offloads,
/// buffers).
///
/// Make one with [`Endpoint::builder`](crate::Endpoint::builder) (or
/// [`EndpointConfig::builder`], the same builder), whose setters name each
/// default; [`Endpoint::config`](crate::Endpoint::config) shows the settings
/// an endpoint runs with. The fields are public to read; the struct is
/// `#[non_exhaustive]`, so new settings do not break code that builds one.
///
/// ```
/// use std::time::Duration;
/// let cfg = homa::EndpointConfig::builder()
///     .poll(Duration::from_micros(20))
///     .engine(|e| e.with_rpc_timeout_ns(500_000_000))
///     .build();
/// assert_eq!(cfg.mtu, homa::Mtu::Interface);
/// assert_eq!(cfg.engine.rpc_timeout_ns, Some(500_000_000));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EndpointConfig {
    /// The protocol engine's parameters (link rate, windows, timeouts, pool
    /// size...). `max_packet_size` is overridden when [`Self::mtu`] is set and
    /// `rpc_id_seed` when [`Self::rpc_id_seed`] is `None`. Windows and
    /// timers left unset (`None`, the default) are derived by the engine
    /// from the link rate and the packet size the endpoint finally has. The default is the
    /// engine's, except `max_nic_queue_ns` (20 µs: a user-space runtime pays a
    /// system call per batch, so the engine may release a GSO-sized batch at
    /// once), `checksum` (off: UDP checksums the datagrams already),
    /// `defer_acks` (on: the runtime frees acknowledged RPCs after sending a
    /// reply) and `pad_v4`/`pad_v6` (129..198 and 129..188 bytes: datagram
    /// sizes that Linux handles slowly, docs/performance.md).
    pub engine: homa_proto::Config,
    /// The IP MTU packets are sized to ([`Mtu`]): by default the MTU of
    /// the interface the endpoint is bound to. The engine's packet size
    /// becomes the largest UDP payload that fits it (1472 bytes for IPv4 at
    /// 1500, 1452 for IPv6; at most 65,000), so no packet on the wire
    /// exceeds it even when GSO batches them.
    pub mtu: Mtu,
    /// How long a waiting thread busy-polls the socket before it sleeps (the
    /// Linux module's `poll_usecs`). Zero sleeps at once.
    pub poll: Duration,
    /// How long an async wait (feature `tokio`) busy-polls the socket
    /// before its task yields to tokio's reactor, when no other thread or
    /// task polls the same endpoint (default 50 µs, as [`Self::poll`]). A
    /// response that comes
    /// back within it costs no wake-up (a wake-up through the reactor takes
    /// tens of µs), at the price of holding the executor thread while
    /// spinning. Zero never spins: a task that waits gives its executor
    /// thread back at once (docs/runtime.md).
    pub async_poll: Duration,
    /// Whether a busy-polling thread yields its CPU (`sched_yield`) right
    /// after it sent packets and every [`POLL_YIELD_EVERY`] of polling, so
    /// that a thread woken on its CPU (a receiver its send woke on
    /// loopback, or any thread when more threads poll than there are
    /// cores) runs within microseconds instead of after the poll period;
    /// and after bulk stream reads and writes while the CPU is wanted.
    /// Costs ~0.5 µs per yield when nobody else wants the CPU. Default:
    /// `true`; off only for measuring what it changes (docs/runtime.md,
    /// "Polling politely").
    pub poll_yield: bool,
    /// DSCP value (0..=63) written into packets of each engine priority level
    /// (index 7 is the highest level). The default uses the class selectors
    /// CS0..CS7, which a `prio` qdisc or a switch can map to queues.
    pub dscp: [u8; 8],
    /// Use UDP GSO for runs of packets to one peer when the kernel supports it.
    pub gso: bool,
    /// Accept UDP GRO super-datagrams when the kernel supports it.
    pub gro: bool,
    /// Receive the payloads of long messages' large packets (16 KB or more:
    /// a large MTU such as loopback's) straight into the receive pool, one
    /// copy per byte fewer, at the cost of one more system call per packet
    /// while they arrive (docs/runtime.md).
    pub landing: bool,
    /// SO_SNDBUF / SO_RCVBUF size requested for the socket.
    pub socket_buffer_bytes: usize,
    /// Send every packet with the IP "don't fragment" bit and never let the
    /// kernel fragment (`IP_PMTUDISC_DO` / `IPV6_PMTUDISC_DO`). Packets are
    /// sized to the configured MTU, so they need no fragmenting where the
    /// MTU is right; where a route's MTU is smaller, a packet fails at send
    /// (counted in `SocketStats::send_too_big`) instead of going out in
    /// fragments. On by default, also because an IPv4 packet that may be
    /// fragmented takes its IP id from a counter shared by every CPU sending
    /// between the same two hosts: 100-130 ns more per round trip of two
    /// small datagrams on loopback here (docs/performance.md).
    pub dont_fragment: bool,
    /// Datagrams received per `recvmmsg` call.
    pub recv_batch: usize,
    /// Packets collected from the engine before one `sendmmsg`.
    pub send_batch: usize,
    /// Seed of the first RPC id; `None` picks one from the clock and process
    /// id so that a restarted endpoint does not reuse ids.
    pub rpc_id_seed: Option<u64>,
    /// Fail client RPCs at once when ICMP says their peer is unreachable
    /// (otherwise they wait for the engine's timeout).
    pub fail_on_unreachable: bool,
    /// Random packet loss at the socket layer (tests of loss recovery; set
    /// with the `test-hooks` feature's `EndpointBuilder::fault`).
    pub(crate) fault: Option<FaultInjector>,
    /// The engine's clock (the machine's, unless the `test-hooks`
    /// feature's `EndpointBuilder::clock_skew` offsets it or makes it drift).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    pub(crate) clock: ClockSkew,
    /// Set `SO_REUSEPORT` on the socket before binding, so that several
    /// endpoints (each with its own engine, typically one per core) can bind
    /// the same address. The kernel then steers each datagram by a hash of
    /// its 4-tuple to one of them: every packet of an RPC shares its
    /// client's 4-tuple, so an RPC stays on one endpoint. Every endpoint of
    /// the group must set it (same user). Off by default.
    pub reuse_port: bool,
}

/// How an endpoint sizes its packets ([`EndpointConfig::mtu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Mtu {
    /// The MTU of the network interface that holds the endpoint's address,
    /// as TCP and the Linux Homa module size their segments: 65,536 on
    /// loopback (`127.0.0.0/8`, `::1`), so a message moves in few large
    /// packets there; 1,500 (Ethernet's) for a wildcard address (`0.0.0.0`,
    /// `[::]`), whose peers may be anywhere, or an address no interface
    /// holds. The default.
    #[default]
    Interface,
    /// This IP MTU, whatever the interface.
    Fixed(usize),
    /// No MTU: `engine.max_packet_size` as given.
    Engine,
}

impl From<usize> for Mtu {
    fn from(mtu: usize) -> Mtu {
        Mtu::Fixed(mtu)
    }
}

/// The MTU [`Mtu::Interface`] uses where it finds no interface.
pub const FALLBACK_MTU: usize = 1500;

/// How often a busy-polling thread yields its CPU
/// ([`EndpointConfig::poll_yield`]). A woken thread queued behind a poller
/// waits at most about this long; the poller spends ~0.5 µs per yield, ~10%
/// of its polling, when nobody else wants the CPU.
pub const POLL_YIELD_EVERY: std::time::Duration = std::time::Duration::from_micros(5);

/// Builds an [`EndpointConfig`] and binds endpoints with it. Every setter
/// names its default; settings not set keep it. A builder can bind any
/// number of endpoints.
///
/// ```no_run
/// use std::time::Duration;
/// let ep = homa::Endpoint::builder()
///     .poll(Duration::from_micros(20))
///     .mtu(9000)
///     .engine(|e| e.with_link_bps(100_000_000_000).with_pool_bytes(256 << 20))
///     .bind("0.0.0.0:4000")?;
/// # Ok::<(), homa::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct EndpointBuilder {
    cfg: EndpointConfig,
}

impl EndpointConfig {
    /// A builder starting from the defaults (the same as
    /// [`Endpoint::builder`](crate::Endpoint::builder)).
    pub fn builder() -> EndpointBuilder {
        EndpointBuilder::default()
    }
}

impl From<EndpointConfig> for EndpointBuilder {
    /// A builder starting from `cfg` (e.g. another endpoint's
    /// [`config`](crate::Endpoint::config)).
    fn from(cfg: EndpointConfig) -> EndpointBuilder {
        EndpointBuilder { cfg }
    }
}

impl EndpointBuilder {
    /// A builder starting from the defaults.
    pub fn new() -> EndpointBuilder {
        EndpointBuilder::default()
    }

    /// Changes the engine's settings: `f` gets the current ones (at first
    /// the runtime's defaults, see [`EndpointConfig::engine`]) and returns
    /// the new ones, typically through the engine's `with_*` setters, each
    /// of which names its default:
    /// `.engine(|e| e.with_rpc_timeout_ns(100_000_000).with_pool_bytes(8 << 20))`.
    pub fn engine(
        mut self,
        f: impl FnOnce(homa_proto::Config) -> homa_proto::Config,
    ) -> EndpointBuilder {
        self.cfg.engine = f(self.cfg.engine);
        self
    }
    /// The IP MTU packets are sized to ([`EndpointConfig::mtu`]): a number
    /// (`.mtu(9000)`) or an [`Mtu`]. Default: [`Mtu::Interface`].
    pub fn mtu(mut self, mtu: impl Into<Mtu>) -> EndpointBuilder {
        self.cfg.mtu = mtu.into();
        self
    }
    /// How long a waiting thread busy-polls before it sleeps
    /// ([`EndpointConfig::poll`]). Default: 50 µs.
    pub fn poll(mut self, poll: Duration) -> EndpointBuilder {
        self.cfg.poll = poll;
        self
    }
    /// Set `SO_REUSEPORT` before binding ([`EndpointConfig::reuse_port`]),
    /// so that several endpoints (one per core) can share an address.
    /// Default: `false`.
    pub fn reuse_port(mut self, on: bool) -> EndpointBuilder {
        self.cfg.reuse_port = on;
        self
    }
    /// How long an async wait busy-polls before its task yields to tokio's
    /// reactor, when nobody else polls the endpoint
    /// ([`EndpointConfig::async_poll`]). Default: 50 µs; zero never spins.
    pub fn async_poll(mut self, poll: Duration) -> EndpointBuilder {
        self.cfg.async_poll = poll;
        self
    }
    /// Let busy-polling threads yield their CPU after a send and every
    /// [`POLL_YIELD_EVERY`] ([`EndpointConfig::poll_yield`]). Default: `true`.
    pub fn poll_yield(mut self, on: bool) -> EndpointBuilder {
        self.cfg.poll_yield = on;
        self
    }
    /// DSCP value (0..=63) per engine priority level, index 7 the highest
    /// ([`EndpointConfig::dscp`]). Default: CS0..CS7, `[0, 8, 16, 24, 32, 40,
    /// 48, 56]`.
    pub fn dscp(mut self, dscp: [u8; 8]) -> EndpointBuilder {
        self.cfg.dscp = dscp;
        self
    }
    /// Use UDP GSO where the kernel supports it. Default: `true`.
    pub fn gso(mut self, on: bool) -> EndpointBuilder {
        self.cfg.gso = on;
        self
    }
    /// Accept UDP GRO where the kernel supports it. Default: `true`.
    pub fn gro(mut self, on: bool) -> EndpointBuilder {
        self.cfg.gro = on;
        self
    }
    /// Receive large packets' payloads straight into the receive pool
    /// ([`EndpointConfig::landing`]). Default: `true`.
    pub fn landing(mut self, on: bool) -> EndpointBuilder {
        self.cfg.landing = on;
        self
    }
    /// SO_SNDBUF / SO_RCVBUF size requested. Default: 4 MiB.
    pub fn socket_buffer_bytes(mut self, bytes: usize) -> EndpointBuilder {
        self.cfg.socket_buffer_bytes = bytes;
        self
    }
    /// Never let the kernel fragment a packet
    /// ([`EndpointConfig::dont_fragment`]). Default: `true`.
    pub fn dont_fragment(mut self, on: bool) -> EndpointBuilder {
        self.cfg.dont_fragment = on;
        self
    }
    /// Datagrams received per `recvmmsg` (at least 1). Default: 32.
    pub fn recv_batch(mut self, n: usize) -> EndpointBuilder {
        self.cfg.recv_batch = n;
        self
    }
    /// Packets collected before one `sendmmsg` (at least 1). Default: 128.
    pub fn send_batch(mut self, n: usize) -> EndpointBuilder {
        self.cfg.send_batch = n;
        self
    }
    /// Seed of the first RPC id; `None` picks a fresh one at every bind.
    /// Default: `None`.
    pub fn rpc_id_seed(mut self, seed: impl Into<Option<u64>>) -> EndpointBuilder {
        self.cfg.rpc_id_seed = seed.into();
        self
    }
    /// Fail client RPCs at once when ICMP says their peer is unreachable.
    /// Default: `true`.
    pub fn fail_on_unreachable(mut self, on: bool) -> EndpointBuilder {
        self.cfg.fail_on_unreachable = on;
        self
    }
    /// Lose packets at random at the socket layer (tests of loss recovery;
    /// `test-hooks` feature only). Default: `None`.
    #[cfg(feature = "test-hooks")]
    pub fn fault(mut self, fault: impl Into<Option<FaultInjector>>) -> EndpointBuilder {
        self.cfg.fault = fault.into();
        self
    }
    /// Gives the engine a clock of its own: the machine's offset by
    /// `skew.offset_ns` and running `skew.drift_ppb` fast or slow, as an
    /// unsynchronised host's would (`test-hooks` feature only; experiments
    /// on one machine, whose endpoints otherwise share one clock). Timers
    /// follow it too, so a drift also stretches them by as many parts per
    /// billion. Default: the machine's clock.
    #[cfg(feature = "test-hooks")]
    pub fn clock_skew(mut self, skew: ClockSkew) -> EndpointBuilder {
        self.cfg.clock = skew;
        self
    }
    /// The settings built so far.
    pub fn build(self) -> EndpointConfig {
        self.cfg
    }
    /// The settings built so far, by reference.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }
    /// Opens an endpoint on `addr` with these settings (see
    /// [`Endpoint::bind`](crate::Endpoint::bind)). Fails with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) when a setting
    /// is out of range.
    pub fn bind(&self, addr: impl ToSocketAddrs) -> crate::Result<crate::Endpoint> {
        crate::Endpoint::bind_with(addr, self.cfg.clone())
    }
}

/// Default NIC queue limit for the UDP runtime: 20 µs of transmission (about
/// 43 full packets at 25 Gbit/s). The engine's own default (one packet time)
/// suits a driver that can hand the NIC one packet per call; a user-space
/// runtime pays a system call per batch, so it lets the engine release a
/// GSO-sized batch at once. Short messages are unaffected (they bypass the
/// pacer); the cost is at most this much queueing in the kernel.
pub(crate) const RUNTIME_NIC_QUEUE_NS: u64 = 20_000;

/// Default padding of short DATA datagrams to IPv4 peers
/// (`homa_proto::Config::pad_v4`): 129..197-byte datagrams go out as 198
/// bytes. On the Linux 6.18 machines this was measured on, a busy-polled
/// UDP ping-pong (C, loopback, socket without UDP GRO) of 129..197-byte
/// datagrams takes ~0.1 µs longer per datagram than one of 128 or 198 bytes;
/// a 100-byte Homa message is a 156-byte datagram (docs/performance.md).
pub(crate) const RUNTIME_PAD_V4: homa_proto::PadWindow =
    homa_proto::PadWindow { from: 129, to: 198 };
/// The same for IPv6 peers, where the slow sizes end lower (measured
/// 130..184 slow, 188 fast).
pub(crate) const RUNTIME_PAD_V6: homa_proto::PadWindow =
    homa_proto::PadWindow { from: 129, to: 188 };

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            // The engine derives its settings for its default network
            // (25 Gbit/s, 20 µs, 1500-byte MTU); the windows are left to
            // `Endpoint::new`, which derives them from the link rate, RTT
            // and packet size the endpoint is finally given (`link_bps`, the
            // MTU, IPv6).
            engine: homa_proto::Config::for_network(&homa_proto::NetworkProfile::default())
                .with_grant_window(None)
                .with_unsched_bytes(None)
                .with_max_nic_queue_ns(RUNTIME_NIC_QUEUE_NS)
                // UDP's own checksum already protects every datagram on a
                // real network (and loopback cannot corrupt); the engine's
                // CRC-32C would cost ~20% of the CPU of a bulk transfer.
                .with_checksum(false)
                // The runtime applies them after sending (`run_deferred`).
                .with_defer_acks(true)
                .with_pad_v4(RUNTIME_PAD_V4)
                .with_pad_v6(RUNTIME_PAD_V6),
            mtu: Mtu::Interface,
            poll: Duration::from_micros(50),
            async_poll: Duration::from_micros(50),
            poll_yield: true,
            dscp: [0, 8, 16, 24, 32, 40, 48, 56],
            gso: true,
            gro: true,
            landing: true,
            socket_buffer_bytes: 4 << 20,
            dont_fragment: true,
            recv_batch: 32,
            send_batch: 128,
            rpc_id_seed: None,
            fail_on_unreachable: true,
            fault: None,
            clock: ClockSkew::default(),
            reuse_port: false,
        }
    }
}

impl EndpointConfig {
    /// The IP MTU an endpoint bound to `ip` sizes its packets to (`None`:
    /// the engine's `max_packet_size` as given).
    pub(crate) fn mtu_for(&self, ip: std::net::IpAddr) -> Option<usize> {
        match self.mtu {
            Mtu::Interface => Some(crate::sys::interface_mtu(ip).unwrap_or(FALLBACK_MTU)),
            Mtu::Fixed(mtu) => Some(mtu),
            Mtu::Engine => None,
        }
    }

    /// The engine configuration actually used for an endpoint of this
    /// family whose packets fit `mtu` ([`Self::mtu_for`]).
    pub(crate) fn engine_config(&self, ipv6: bool, mtu: Option<usize>) -> homa_proto::Config {
        let mut c = self.engine.clone();
        if let Some(mtu) = mtu {
            let overhead = if ipv6 { V6_OVERHEAD } else { V4_OVERHEAD };
            c.max_packet_size = mtu
                .saturating_sub(overhead)
                .min(homa_proto::config::MAX_PACKET_SIZE);
        }
        if ipv6 && c.packet_overhead_bytes == homa_proto::Config::default().packet_overhead_bytes {
            // IPv6's header is 20 bytes longer than IPv4's.
            c.packet_overhead_bytes += 20;
        }
        c.rpc_id_seed = self.rpc_id_seed.unwrap_or_else(fresh_seed);
        // A packet size below the padded size (a tiny MTU): no padding.
        for w in [&mut c.pad_v4, &mut c.pad_v6] {
            if w.to as usize > c.max_packet_size {
                *w = homa_proto::PadWindow::default();
            }
        }
        c
    }
    /// The TOS / traffic-class byte for a priority level.
    pub(crate) fn tos(&self, priority: u8) -> u8 {
        (self.dscp[(priority as usize).min(7)] & 0x3f) << 2
    }
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.dscp.iter().any(|d| *d > 63) {
            return Err("DSCP values must be 0..=63".into());
        }
        if self.recv_batch == 0 || self.send_batch == 0 {
            return Err("batch sizes must be positive".into());
        }
        if let Some(f) = &self.fault {
            if !(0.0..=1.0).contains(&f.rx_loss) || !(0.0..=1.0).contains(&f.tx_loss) {
                return Err("loss probabilities must be in 0..=1".into());
            }
        }
        Ok(())
    }
}

/// A seed that differs between incarnations: the wall clock mixed with the
/// process id and a per-process counter (splitmix64 to spread the bits).
fn fresh_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let z =
        t ^ ((std::process::id() as u64) << 32) ^ COUNTER.fetch_add(0x9E37_79B9, Ordering::Relaxed);
    homa_proto::splitmix64(z) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_sets_packet_size_per_family() {
        let c = EndpointConfig::builder().mtu(1500).build();
        assert_eq!(c.engine_config(false, Some(1500)).max_packet_size, 1472);
        assert_eq!(c.engine_config(true, Some(1500)).max_packet_size, 1452);
        // Loopback's 65,536 is capped at the engine's largest packet.
        assert_eq!(
            c.engine_config(false, Some(65_536)).max_packet_size,
            homa_proto::config::MAX_PACKET_SIZE
        );
        let keep = EndpointConfig::builder()
            .mtu(Mtu::Engine)
            .engine(|e| e.with_max_packet_size(9000))
            .build();
        assert_eq!(keep.mtu_for("::1".parse().unwrap()), None);
        assert_eq!(keep.engine_config(true, None).max_packet_size, 9000);
    }

    #[test]
    fn timers_follow_the_final_link_and_packet_size_unless_set() {
        // Derived from the packet size the MTU gives and the link rate the
        // user gives, when the endpoint is made.
        let c = EndpointConfig::builder()
            .engine(|e| e.with_link_bps(1_000_000_000))
            .build();
        let e = c.engine_config(false, Some(9000));
        let packet_ns = e.wire_time_ns(e.max_packet_size);
        assert_eq!(e.effective_resend_interval_ns(), 100 * packet_ns);
        assert_eq!(e.effective_tombstone_ns(), 20 * 100 * packet_ns);
        // 100 wire times of a 1 MB message (0.8 s) are below the 2 s floor.
        assert_eq!(e.effective_rpc_timeout_ns(), 2_000_000_000);
        // Loopback's 65,000-byte packets at the default 25 Gbit/s: 100
        // packet times (2.1 ms) exceed the 1 ms floor.
        let lo = EndpointConfig::default().engine_config(false, Some(65_536));
        assert_eq!(lo.max_packet_size, 65_000);
        assert!(lo.effective_resend_interval_ns() > 2_000_000);
        // A value set by the user stays.
        let set = EndpointConfig::builder()
            .engine(|e| e.with_resend_interval_ns(300_000).with_tombstone_ns(0))
            .build()
            .engine_config(false, Some(65_536));
        assert_eq!(set.effective_resend_interval_ns(), 300_000);
        assert_eq!(set.effective_tombstone_ns(), 0);
    }

    #[test]
    fn the_default_mtu_is_the_interfaces() {
        let c = EndpointConfig::default();
        assert_eq!(c.mtu, Mtu::Interface);
        // Loopback (every Linux machine has it; its MTU is 65,536 unless an
        // administrator changed it).
        let lo = c.mtu_for("127.0.0.1".parse().unwrap()).unwrap();
        assert!(lo > FALLBACK_MTU, "loopback MTU {lo}");
        assert_eq!(c.mtu_for("127.0.0.2".parse().unwrap()), Some(lo));
        // A wildcard address, and one no interface holds.
        assert_eq!(c.mtu_for("0.0.0.0".parse().unwrap()), Some(FALLBACK_MTU));
        assert_eq!(
            c.mtu_for("[::]".trim_matches(['[', ']']).parse().unwrap()),
            Some(FALLBACK_MTU)
        );
        assert_eq!(c.mtu_for("192.0.2.77".parse().unwrap()), Some(FALLBACK_MTU));
        assert_eq!(
            EndpointConfig::builder()
                .mtu(9000)
                .build()
                .mtu_for("127.0.0.1".parse().unwrap()),
            Some(9000)
        );
    }

    #[test]
    fn seeds_differ_unless_pinned() {
        let c = EndpointConfig::default();
        assert_ne!(
            c.engine_config(false, None).rpc_id_seed,
            c.engine_config(false, None).rpc_id_seed
        );
        let pinned = EndpointConfig::builder().rpc_id_seed(77).build();
        assert_eq!(pinned.engine_config(false, None).rpc_id_seed, 77);
    }

    #[test]
    fn dscp_map_becomes_tos_byte() {
        let c = EndpointConfig::default();
        assert_eq!(c.tos(0), 0);
        assert_eq!(c.tos(7), 56 << 2);
        assert_eq!(c.tos(200), 56 << 2);
        let bad = EndpointConfig::builder().dscp([64; 8]).build();
        assert!(bad.validate().is_err());
        assert!(EndpointConfig::default().validate().is_ok());
    }

    #[test]
    fn builder_setters_document_the_real_defaults() {
        // The values each setter's doc names as its default.
        let d = EndpointConfig::default();
        assert_eq!(d.mtu, Mtu::Interface);
        assert!(d.landing && d.gro && d.gso);
        assert_eq!(d.poll, Duration::from_micros(50));
        assert_eq!(d.dscp, [0, 8, 16, 24, 32, 40, 48, 56]);
        assert!(d.gso && d.gro && d.dont_fragment && d.fail_on_unreachable);
        assert_eq!(d.socket_buffer_bytes, 4 << 20);
        assert_eq!((d.recv_batch, d.send_batch), (32, 128));
        assert_eq!(d.rpc_id_seed, None);
        assert!(d.fault.is_none());
        // The engine part: the engine's derivation for its default network
        // (windows left to bind time), but four.
        let e = &d.engine;
        assert_eq!(e.max_nic_queue_ns, Some(20_000));
        assert!(!e.checksum);
        assert!(e.defer_acks);
        assert_eq!((e.pad_v4.from, e.pad_v4.to), (129, 198));
        assert_eq!((e.pad_v6.from, e.pad_v6.to), (129, 188));
        let plain = homa_proto::Config::for_network(&homa_proto::NetworkProfile::default())
            .with_grant_window(None)
            .with_unsched_bytes(None)
            .with_max_nic_queue_ns(20_000)
            .with_checksum(false)
            .with_defer_acks(true)
            .with_pad_v4(RUNTIME_PAD_V4)
            .with_pad_v6(RUNTIME_PAD_V6);
        assert_eq!(*e, plain);
    }

    #[test]
    fn builder_sets_each_setting_and_keeps_the_rest() {
        let c = EndpointBuilder::new()
            .mtu(9000)
            .poll(Duration::ZERO)
            .dscp([1; 8])
            .gso(false)
            .gro(false)
            .socket_buffer_bytes(1 << 20)
            .dont_fragment(false)
            .recv_batch(4)
            .send_batch(8)
            .rpc_id_seed(5)
            .fail_on_unreachable(false)
            .engine(|e| e.with_rpc_timeout_ns(7_000_000))
            .build();
        assert_eq!(c.mtu, Mtu::Fixed(9000));
        assert_eq!(c.poll, Duration::ZERO);
        assert_eq!(c.dscp, [1; 8]);
        assert!(!c.gso && !c.gro && !c.dont_fragment && !c.fail_on_unreachable);
        assert_eq!(c.socket_buffer_bytes, 1 << 20);
        assert_eq!((c.recv_batch, c.send_batch), (4, 8));
        assert_eq!(c.rpc_id_seed, Some(5));
        assert_eq!(c.engine.rpc_timeout_ns, Some(7_000_000));
        // The engine closure starts from the runtime's engine defaults.
        assert!(!c.engine.checksum && c.engine.defer_acks);
        // A builder from a config starts there.
        let again = EndpointBuilder::from(c.clone()).build();
        assert_eq!(again.mtu, Mtu::Fixed(9000));
        assert_eq!(again.engine, c.engine);
    }
}
