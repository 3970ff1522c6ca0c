//! Unloaded round-trip times: one RPC at a time from one client to one
//! server, for a list of sizes. These are the denominators of slowdown.

use super::homa_node::endpoint_config;
use super::tcp_node::{decode_header, encode_header, HEADER};
use super::Transport;
use super::{Error, Result};
use crate::payload::Payloads;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// RTTs measured for one size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbePoint {
    pub size: u32,
    /// Median of the repetitions, ns.
    pub p50_ns: u64,
    pub min_ns: u64,
    pub reps: usize,
}

/// What to probe and how long to spend on it.
pub struct ProbeSpec {
    pub transport: Transport,
    pub ip: IpAddr,
    pub server: SocketAddr,
    pub sizes: Vec<u32>,
    /// Repetitions per size: at most this many...
    pub max_reps: usize,
    /// ...and at least this many, the rest as time allows.
    pub min_reps: usize,
    /// Time allowed per size beyond `min_reps`.
    pub budget_per_size: Duration,
    pub homa: homa::EndpointConfig,
    pub payloads: Payloads,
}

/// Measures every size (smallest first); every response is checked.
pub fn probe(spec: &ProbeSpec) -> Result<Vec<ProbePoint>> {
    let mut call: Box<dyn FnMut(u64, usize) -> Result<()>> = if spec.transport.is_homa() {
        let ep = homa::Endpoint::bind_with(
            SocketAddr::new(spec.ip, 0),
            endpoint_config(spec.transport, &spec.homa),
        )?;
        let (server, payloads) = (spec.server, spec.payloads.clone());
        Box::new(move |seq, len| {
            let req = payloads.payload(seq, len);
            let resp = ep.call_timeout(server, req.clone(), Duration::from_secs(5))?;
            if resp != *req {
                return Err(Error::Bench(format!("echo of {len} bytes differs")));
            }
            Ok(())
        })
    } else {
        let mut s = TcpStream::connect_timeout(&spec.server, Duration::from_secs(3))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let payloads = spec.payloads.clone();
        let mut buf = Vec::new();
        Box::new(move |seq, len| {
            let req = payloads.payload(seq, len);
            let mut frame = encode_header(len, seq).to_vec();
            frame.extend_from_slice(&req);
            s.write_all(&frame)?;
            let mut h = [0u8; HEADER];
            s.read_exact(&mut h)?;
            if decode_header(&h) != (len, seq) {
                return Err(Error::Bench("TCP echo header differs".into()));
            }
            buf.resize(len, 0);
            s.read_exact(&mut buf)?;
            if buf[..] != req[..] {
                return Err(Error::Bench(format!("TCP echo of {len} bytes differs")));
            }
            Ok(())
        })
    };
    let mut sizes = spec.sizes.clone();
    sizes.sort_unstable();
    sizes.dedup();
    // Warm up the path (caches, connection windows).
    for i in 0..20 {
        call(i, sizes[0] as usize)?;
    }
    let mut out = Vec::new();
    let mut seq = 1000;
    for &size in &sizes {
        let mut rtts = Vec::new();
        let start = Instant::now();
        while rtts.len() < spec.max_reps
            && (rtts.len() < spec.min_reps || start.elapsed() < spec.budget_per_size)
        {
            seq += 1;
            let t = Instant::now();
            call(seq, size as usize)?;
            rtts.push(t.elapsed().as_nanos() as u64);
        }
        rtts.sort_unstable();
        out.push(ProbePoint {
            size,
            p50_ns: rtts[(rtts.len() - 1) / 2],
            min_ns: rtts[0],
            reps: rtts.len(),
        });
    }
    Ok(out)
}

/// Sizes at which to probe a workload: its smallest and largest lengths and
/// the lengths at 24 evenly spaced quantiles (or every length, if fewer).
pub fn probe_sizes(w: &homa_workload::workload::Workload) -> Vec<u32> {
    let pts = w.points();
    let mut v: Vec<u32> = if pts.len() <= 26 {
        pts.iter().map(|p| p.0).collect()
    } else {
        let mut v: Vec<u32> = (0..24)
            .map(|k| w.quantile((k as f64 + 0.5) / 24.0))
            .collect();
        v.push(w.min_len());
        v.push(w.max_len());
        v
    };
    v.sort_unstable();
    v.dedup();
    v
}

/// The unloaded RTT for any size: piecewise linear between probed sizes,
/// flat beyond the ends.
#[derive(Clone, Debug, Serialize)]
pub struct Baseline {
    pub points: Vec<(u32, u64)>,
}

impl Baseline {
    /// Per size, the lowest median over several transports' probes (so that
    /// every transport is measured against the same, best, unloaded time).
    pub fn best_of(probes: &[&[ProbePoint]]) -> Baseline {
        let mut points: Vec<(u32, u64)> = Vec::new();
        for p in probes.iter().flat_map(|v| v.iter()) {
            match points.iter_mut().find(|x| x.0 == p.size) {
                Some(x) => x.1 = x.1.min(p.p50_ns),
                None => points.push((p.size, p.p50_ns)),
            }
        }
        points.sort_unstable();
        Baseline { points }
    }

    pub fn rtt_ns(&self, size: u32) -> u64 {
        let p = &self.points;
        if p.is_empty() {
            return 1;
        }
        let i = p.partition_point(|x| x.0 < size);
        if i == 0 {
            return p[0].1;
        }
        if i == p.len() {
            return p[p.len() - 1].1;
        }
        let (s0, r0) = (p[i - 1].0 as f64, p[i - 1].1 as f64);
        let (s1, r1) = (p[i].0 as f64, p[i].1 as f64);
        if s1 == s0 {
            return p[i].1;
        }
        (r0 + (r1 - r0) * (size as f64 - s0) / (s1 - s0)).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homa_workload::workload::Workload;

    #[test]
    fn baseline_interpolates_and_takes_best() {
        let a = [
            ProbePoint {
                size: 100,
                p50_ns: 1000,
                min_ns: 900,
                reps: 3,
            },
            ProbePoint {
                size: 1100,
                p50_ns: 3000,
                min_ns: 2000,
                reps: 3,
            },
        ];
        let b = [ProbePoint {
            size: 100,
            p50_ns: 800,
            min_ns: 700,
            reps: 3,
        }];
        let bl = Baseline::best_of(&[&a, &b]);
        assert_eq!(bl.points, vec![(100, 800), (1100, 3000)]);
        assert_eq!(bl.rtt_ns(50), 800);
        assert_eq!(bl.rtt_ns(100), 800);
        assert_eq!(bl.rtt_ns(600), 1900);
        assert_eq!(bl.rtt_ns(5000), 3000);
        assert_eq!(Baseline { points: vec![] }.rtt_ns(5), 1);
    }

    #[test]
    fn probe_sizes_cover_the_workload() {
        let w = Workload::builtin("w4").unwrap().capped(1_000_000);
        let s = probe_sizes(&w);
        assert_eq!(s[0], w.min_len());
        assert_eq!(*s.last().unwrap(), w.max_len());
        assert!(s.len() >= 10 && s.len() <= 26, "{s:?}");
        assert!(s.windows(2).all(|p| p[0] < p[1]));
        assert_eq!(probe_sizes(&Workload::fixed(500)), vec![500]);
    }
}
