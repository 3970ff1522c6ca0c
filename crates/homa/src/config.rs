//! Runtime configuration: the engine's [`homa_proto::Config`] plus the knobs
//! that only exist on real sockets (polling, DSCP, offloads, buffers).

use crate::socket::FaultInjector;
use std::time::Duration;

/// Bytes of IPv4 + UDP headers.
const V4_OVERHEAD: usize = 28;
/// Bytes of IPv6 + UDP headers.
const V6_OVERHEAD: usize = 48;

/// Everything needed to open an endpoint. Build it with struct-update syntax:
///
/// ```
/// let cfg = homa::EndpointConfig {
///     poll: std::time::Duration::from_micros(20),
///     ..homa::EndpointConfig::default()
/// };
/// assert_eq!(cfg.mtu, Some(1500));
/// ```
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// The protocol engine's parameters (link rate, windows, timeouts, pool
    /// size...). `max_packet_size` is overridden when [`Self::mtu`] is set and
    /// `rpc_id_seed` when [`Self::rpc_id_seed`] is `None`. The default is the
    /// engine's, except `max_nic_queue_ns` (see [`RUNTIME_NIC_QUEUE_NS`]),
    /// `checksum` (off: UDP checksums the datagrams already), `defer_acks`
    /// (on: the runtime frees acknowledged RPCs after sending a reply) and
    /// `pad_v4`/`pad_v6` (see [`RUNTIME_PAD_V4`]).
    pub engine: homa_proto::Config,
    /// IP MTU of the path. The engine's packet size becomes the largest UDP
    /// payload that fits it (1472 bytes for IPv4 at 1500, 1452 for IPv6), so
    /// no packet on the wire exceeds it even when GSO batches them. `None`
    /// keeps `engine.max_packet_size` as given.
    pub mtu: Option<usize>,
    /// How long a waiting thread busy-polls the socket before it sleeps (the
    /// Linux module's `poll_usecs`). Zero sleeps at once.
    pub poll: Duration,
    /// DSCP value (0..=63) written into packets of each engine priority level
    /// (index 7 is the highest level). The default uses the class selectors
    /// CS0..CS7, which a `prio` qdisc or a switch can map to queues.
    pub dscp: [u8; 8],
    /// Use UDP GSO for runs of packets to one peer when the kernel supports it.
    pub gso: bool,
    /// Accept UDP GRO super-datagrams when the kernel supports it.
    pub gro: bool,
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
    /// Randomly lose packets at the socket layer (tests of loss recovery).
    pub fault: Option<FaultInjector>,
}

/// Default NIC queue limit for the UDP runtime: 20 µs of transmission (about
/// 43 full packets at 25 Gbit/s). The engine's own default (one packet time)
/// suits a driver that can hand the NIC one packet per call; a user-space
/// runtime pays a system call per batch, so it lets the engine release a
/// GSO-sized batch at once. Short messages are unaffected (they bypass the
/// pacer); the cost is at most this much queueing in the kernel.
pub const RUNTIME_NIC_QUEUE_NS: u64 = 20_000;

/// Default padding of short DATA datagrams to IPv4 peers
/// (`homa_proto::Config::pad_v4`): 129..197-byte datagrams go out as 198
/// bytes. On the Linux 6.18 machines this was measured on, a busy-polled
/// UDP ping-pong (C, loopback, socket without UDP GRO) of 129..197-byte
/// datagrams takes ~0.1 µs longer per datagram than one of 128 or 198 bytes;
/// a 100-byte Homa message is a 156-byte datagram (docs/performance.md).
pub const RUNTIME_PAD_V4: homa_proto::PadWindow = homa_proto::PadWindow { from: 129, to: 198 };
/// The same for IPv6 peers, where the slow sizes end lower (measured
/// 130..184 slow, 188 fast).
pub const RUNTIME_PAD_V6: homa_proto::PadWindow = homa_proto::PadWindow { from: 129, to: 188 };

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            engine: homa_proto::Config {
                max_nic_queue_ns: Some(RUNTIME_NIC_QUEUE_NS),
                // UDP's own checksum already protects every datagram on a
                // real network (and loopback cannot corrupt); the engine's
                // CRC-32C would cost ~20% of the CPU of a bulk transfer.
                checksum: false,
                // The runtime applies them after sending (`run_deferred`).
                defer_acks: true,
                pad_v4: RUNTIME_PAD_V4,
                pad_v6: RUNTIME_PAD_V6,
                // Windows left to `Endpoint::new`, which derives them from
                // the link rate, RTT and packet size the endpoint is finally
                // given (`--link-gbps`, the MTU, IPv6); the rest derived by
                // the engine for its default network (25 Gbit/s, 20 µs,
                // 1500-byte MTU).
                grant_window: None,
                unsched_bytes: None,
                ..homa_proto::Config::for_network(&homa_proto::NetworkProfile::default())
            },
            mtu: Some(1500),
            poll: Duration::from_micros(50),
            dscp: [0, 8, 16, 24, 32, 40, 48, 56],
            gso: true,
            gro: true,
            socket_buffer_bytes: 4 << 20,
            dont_fragment: true,
            recv_batch: 32,
            send_batch: 128,
            rpc_id_seed: None,
            fail_on_unreachable: true,
            fault: None,
        }
    }
}

impl EndpointConfig {
    /// The engine configuration actually used for an endpoint of this family.
    pub(crate) fn engine_config(&self, ipv6: bool) -> homa_proto::Config {
        let mut c = self.engine.clone();
        if let Some(mtu) = self.mtu {
            let overhead = if ipv6 { V6_OVERHEAD } else { V4_OVERHEAD };
            c.max_packet_size = mtu.saturating_sub(overhead);
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
    let mut z =
        t ^ ((std::process::id() as u64) << 32) ^ COUNTER.fetch_add(0x9E37_79B9, Ordering::Relaxed);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_sets_packet_size_per_family() {
        let c = EndpointConfig::default();
        assert_eq!(c.engine_config(false).max_packet_size, 1472);
        assert_eq!(c.engine_config(true).max_packet_size, 1452);
        let keep = EndpointConfig {
            mtu: None,
            engine: homa_proto::Config {
                max_packet_size: 9000,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(keep.engine_config(true).max_packet_size, 9000);
    }

    #[test]
    fn seeds_differ_unless_pinned() {
        let c = EndpointConfig::default();
        assert_ne!(
            c.engine_config(false).rpc_id_seed,
            c.engine_config(false).rpc_id_seed
        );
        let pinned = EndpointConfig {
            rpc_id_seed: Some(77),
            ..Default::default()
        };
        assert_eq!(pinned.engine_config(false).rpc_id_seed, 77);
    }

    #[test]
    fn dscp_map_becomes_tos_byte() {
        let c = EndpointConfig::default();
        assert_eq!(c.tos(0), 0);
        assert_eq!(c.tos(7), 56 << 2);
        assert_eq!(c.tos(200), 56 << 2);
        let bad = EndpointConfig {
            dscp: [64; 8],
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        assert!(EndpointConfig::default().validate().is_ok());
    }
}
