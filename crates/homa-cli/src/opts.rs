//! Command-line options shared by the subcommands that open Homa endpoints,
//! and the parsers of sizes and engine overrides: the front end's half of
//! every benchmark (the benchmarks themselves are in `homa-bench`).

use clap::Args;
use std::time::Duration;

use homa_bench::NETWORK_GBPS;

/// Options of a Homa endpoint, common to every subcommand that opens one.
#[derive(Args, Clone, Debug)]
pub struct HomaOpts {
    /// IP MTU; the packet size is the largest UDP payload that fits it
    /// [default: the MTU of the interface the endpoint is bound to, e.g.
    /// 65536 on loopback; 1500 for a wildcard address].
    #[arg(long)]
    pub mtu: Option<usize>,
    /// Link rate the engine paces to, in Gbit/s [default: 25 for `server` and
    /// `client`; 100 for the loopback benchmarks, whose "link" is memory].
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Busy-poll time (µs) before a waiting thread sleeps.
    #[arg(long, default_value_t = 50)]
    pub poll_us: u64,
    /// Busy-poll time (µs) of an async wait before its task yields to
    /// tokio's reactor (the `homa-async` transport) [default: the
    /// runtime's, 50].
    #[arg(long)]
    pub async_poll_us: Option<u64>,
    /// Disable UDP GSO on transmit.
    #[arg(long)]
    pub no_gso: bool,
    /// Disable UDP GRO on receive (by default it is on only while long
    /// messages arrive).
    #[arg(long)]
    pub no_gro: bool,
    /// Do not receive large packets' payloads straight into the receive
    /// pool (landing; on by default, used only with packets of 16 KB or more).
    #[arg(long)]
    pub no_landing: bool,
    /// Send short DATA datagrams unpadded (by default 129..197-byte IPv4
    /// datagrams go out as 198 bytes, which this kernel moves faster; see
    /// the runtime's default `pad_v4`).
    #[arg(long)]
    pub no_pad: bool,
    /// Let the kernel fragment packets too large for a route instead of
    /// sending them with the IP "don't fragment" bit (which fails them at
    /// send time; the default, see EndpointConfig::dont_fragment).
    #[arg(long)]
    pub allow_fragments: bool,
    /// Engine parameter overrides, KEY=VALUE (repeatable). Keys:
    /// rtt_us, unsched_bytes, grant_window, priority_levels,
    /// unsched_priorities, max_overcommit, max_incoming, max_nic_queue_ns,
    /// pacer_bypass_bytes, resend_interval_us, rpc_timeout_ms, tombstone_us,
    /// max_message_length, pool_mb, checksum (0/1), max_client_rpcs,
    /// max_server_rpcs_per_peer, max_peers; streams: stream_window_bytes,
    /// max_streams, stream_share_permille, stream_yield_bytes; RTT and windows
    /// (docs/congestion.md): measure_rtt (0/1), adaptive_windows (0/1),
    /// rtt_high_factor, rtt_grant_factor, unsched_ratio_permille,
    /// grant_covers_foreign_queue (0/1), smoothed_signal (0: latest
    /// sample; F: smoothed RTT above F × rtt_min).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

impl HomaOpts {
    /// The endpoint configuration for a real network (25 Gbit/s by default).
    pub fn config(&self) -> anyhow::Result<homa::EndpointConfig> {
        self.config_with_link(NETWORK_GBPS)
    }

    /// The endpoint configuration, pacing to `default_gbps` unless
    /// `--link-gbps` says otherwise.
    pub fn config_with_link(&self, default_gbps: f64) -> anyhow::Result<homa::EndpointConfig> {
        let mut b = homa::Endpoint::builder();
        if let Some(us) = self.async_poll_us {
            b = b.async_poll(Duration::from_micros(us));
        }
        let mut cfg = b
            .mtu(self.mtu.map_or(homa::Mtu::Interface, homa::Mtu::Fixed))
            .poll(Duration::from_micros(self.poll_us))
            .gso(!self.no_gso)
            .gro(!self.no_gro)
            .landing(!self.no_landing)
            .dont_fragment(!self.allow_fragments)
            .build();
        cfg.engine.link_bps = (self.link_gbps.unwrap_or(default_gbps) * 1e9) as u64;
        if self.no_pad {
            cfg.engine.pad_v4 = Default::default();
            cfg.engine.pad_v6 = Default::default();
        }
        for kv in &self.set {
            set_engine_param(&mut cfg.engine, kv)?;
        }
        Ok(cfg)
    }
}

/// The `--set KEY=VALUE` overrides of a testbed experiment as the hook its
/// endpoints' engine configurations go through: checked now rather than
/// mid-run, applied to every endpoint later. `None` without overrides.
pub fn engine_hook(set: &[String]) -> anyhow::Result<Option<homa_testbed::cluster::EngineHook>> {
    if set.is_empty() {
        return Ok(None);
    }
    let mut probe = homa::EngineConfig::default();
    for kv in set {
        set_engine_param(&mut probe, kv)?;
    }
    let set = set.to_vec();
    Ok(Some(std::sync::Arc::new(
        move |e: &mut homa::EngineConfig| {
            for kv in &set {
                let _ = set_engine_param(e, kv);
            }
        },
    )))
}

/// Applies one `KEY=VALUE` override to the engine configuration.
pub fn set_engine_param(c: &mut homa::EngineConfig, kv: &str) -> anyhow::Result<()> {
    let (k, v) = kv
        .split_once('=')
        .ok_or_else(|| anyhow::anyhow!("expected KEY=VALUE, got {kv:?}"))?;
    let n: u64 = v
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("{k}: {v:?} is not a non-negative integer"))?;
    match k.trim() {
        "rtt_us" => c.rtt_ns = n * 1000,
        "unsched_bytes" => c.unsched_bytes = Some(n as u32),
        "grant_window" => c.grant_window = Some(n as u32),
        "priority_levels" => c.priority_levels = n as u8,
        "unsched_priorities" => c.unsched_priorities = n as u8,
        "max_overcommit" => c.max_overcommit = n as usize,
        "max_incoming" => c.max_incoming = Some(n),
        "max_nic_queue_ns" => c.max_nic_queue_ns = Some(n),
        "pacer_bypass_bytes" => c.pacer_bypass_bytes = n as u32,
        "resend_interval_us" => c.resend_interval_ns = Some(n * 1000),
        "rpc_timeout_ms" => c.rpc_timeout_ns = Some(n * 1_000_000),
        "tombstone_us" => c.tombstone_ns = Some(n * 1_000),
        "max_message_length" => c.max_message_length = n as u32,
        "pool_mb" => c.pool_bytes = (n as usize) << 20,
        "checksum" => c.checksum = n != 0,
        "max_client_rpcs" => c.max_client_rpcs = n as usize,
        "max_server_rpcs_per_peer" => c.max_server_rpcs_per_peer = n as usize,
        "max_peers" => c.max_peers = n as usize,
        "stream_window_bytes" => c.stream_window_bytes = n as u32,
        "stream_yield_bytes" => c.stream_yield_bytes = Some(n as u32),
        "max_streams" => c.max_streams = n as usize,
        "stream_share_permille" => c.stream_share_permille = n as u32,
        "measure_rtt" => c.measure_rtt = n != 0,
        "adaptive_windows" => {
            c.window_policy = if n != 0 {
                homa::WindowPolicy::Adaptive
            } else {
                homa::WindowPolicy::Static
            }
        }
        "rtt_high_factor" => c.rtt_high_factor = n as u32,
        "rtt_grant_factor" => c.rtt_grant_factor = n as u32,
        "unsched_ratio_permille" => c.unsched_ratio_permille = n as u32,
        "grant_covers_foreign_queue" => c.grant_covers_foreign_queue = n != 0,
        // 0: the latest sample (seed 003's rule); F: srtt > F × rtt_min.
        "smoothed_signal" => {
            c.congestion_signal = match n {
                0 => homa::CongestionSignal::Latest,
                f => homa::CongestionSignal::Smoothed { factor: f as u32 },
            }
        }
        // On-Ramp (docs/onramp.md §4).
        "onramp" => c.onramp = n != 0,
        "onramp_threshold_us" => c.onramp_threshold_ns = Some(n * 1000),
        "onramp_max_hold_us" => c.onramp_max_hold_ns = Some(n * 1000),
        "onramp_open_permille" => c.onramp_open_permille = Some(n as u32),
        "onramp_fresh_reports" => c.onramp_fresh_reports = n != 0,
        "onramp_hold_grants" => c.onramp_hold_grants = n != 0,
        other => anyhow::bail!("unknown engine parameter {other:?}"),
    }
    Ok(())
}

/// Parses "100,1000,1e4"-style size lists (plain integers, optional k/m suffix).
pub fn parse_sizes(s: &str) -> anyhow::Result<Vec<usize>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| parse_size(p.trim()))
        .collect()
}

/// Parses one size: "500000", "500k", "1m", "1g" (decimal multiples).
pub fn parse_size(p: &str) -> anyhow::Result<usize> {
    let (num, mul) = match p.chars().last() {
        Some('k' | 'K') => (&p[..p.len() - 1], 1_000),
        Some('m' | 'M') => (&p[..p.len() - 1], 1_000_000),
        Some('g' | 'G') => (&p[..p.len() - 1], 1_000_000_000),
        _ => (p, 1),
    };
    let n: usize = num.parse().map_err(|_| anyhow::anyhow!("bad size {p:?}"))?;
    Ok(n * mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(
            parse_sizes("100,1k, 2M").unwrap(),
            vec![100, 1000, 2_000_000]
        );
        assert!(parse_sizes("10,x").is_err());
    }

    #[test]
    fn engine_overrides_apply_and_reject_unknown_keys() {
        let mut c = homa::EngineConfig::default();
        set_engine_param(&mut c, "rtt_us=15").unwrap();
        set_engine_param(&mut c, "checksum=0").unwrap();
        set_engine_param(&mut c, "pool_mb=8").unwrap();
        assert_eq!(c.rtt_ns, 15_000);
        assert!(!c.checksum);
        assert_eq!(c.pool_bytes, 8 << 20);
        set_engine_param(&mut c, "adaptive_windows=1").unwrap();
        set_engine_param(&mut c, "smoothed_signal=3").unwrap();
        set_engine_param(&mut c, "rtt_high_factor=4").unwrap();
        assert_eq!(c.window_policy, homa::WindowPolicy::Adaptive);
        assert_eq!(
            c.congestion_signal,
            homa::CongestionSignal::Smoothed { factor: 3 }
        );
        assert_eq!(c.rtt_high_factor, 4);
        set_engine_param(&mut c, "smoothed_signal=0").unwrap();
        assert_eq!(c.congestion_signal, homa::CongestionSignal::Latest);
        for kv in [
            "onramp=1",
            "onramp_threshold_us=30",
            "onramp_max_hold_us=200",
            "onramp_open_permille=250",
            "onramp_fresh_reports=1",
        ] {
            set_engine_param(&mut c, kv).unwrap();
        }
        assert!(c.onramp && c.onramp_fresh_reports);
        assert_eq!(c.onramp_threshold_ns, Some(30_000));
        assert_eq!(c.onramp_max_hold_ns, Some(200_000));
        assert_eq!(c.onramp_open_permille, Some(250));
        assert!(set_engine_param(&mut c, "bogus=1").is_err());
        assert!(set_engine_param(&mut c, "rtt_us").is_err());
        assert!(set_engine_param(&mut c, "rtt_us=-1").is_err());
    }

    #[test]
    fn padding_is_on_by_default_and_no_pad_turns_it_off() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            homa: HomaOpts,
        }
        let on = Cli::parse_from(["t"]).homa.config().unwrap();
        let runtime = homa::EndpointConfig::default().engine;
        assert_eq!(on.engine.pad_v4, runtime.pad_v4);
        assert_eq!(on.engine.pad_v6, runtime.pad_v6);
        assert_ne!(runtime.pad_v4, Default::default());
        let off = Cli::parse_from(["t", "--no-pad"]).homa.config().unwrap();
        assert_eq!(off.engine.pad_v4, Default::default());
        assert_eq!(off.engine.pad_v6, Default::default());
    }
}
