//! Per-message timelines of requests in a size range, for finding where a
//! message's latency goes: the wait at its sender before its first packet,
//! the spread of its packets at the sender (grants, other messages), and
//! the network transit of its packets (queueing at every hop). Turned on by
//! [`crate::EngineNet::enable_timeline`]; off, it costs one branch per
//! packet.

use crate::net::HostId;
use crate::sched::Time;
use homa_proto::wire::{decode, Packet};
use std::collections::HashMap;
use std::fmt::Write;

/// Reads one component of a [`Record`].
type Component = fn(&Record) -> u64;

/// One finished request's timeline (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Message length.
    pub len: u32,
    /// DATA packets that arrived (duplicates included).
    pub packets: u32,
    /// Of which retransmissions.
    pub retransmitted: u32,
    /// From the application's send to the last byte's arrival.
    pub total: Time,
    /// From the send to the first packet handed to the NIC.
    pub sender_wait: Time,
    /// From the first packet handed to the NIC to the last one.
    pub tx_spread: Time,
    /// Transit (NIC to receiving host) of the packet that completed it.
    pub last_transit: Time,
    /// The longest transit of any of its packets.
    pub max_transit: Time,
}

#[derive(Default)]
struct Open {
    created: Time,
    len: u32,
    first_tx: Option<Time>,
    last_tx: Time,
    got: u32,
    rec: Record,
}

/// The timelines of the requests of `min_len..=max_len` bytes.
#[derive(Default)]
pub struct Timeline {
    min_len: u32,
    max_len: u32,
    open: HashMap<(HostId, u64), Open>,
    /// A request being started (host, length, time) whose id is not known
    /// yet: its first packet may leave before `send_request` returns.
    starting: Option<(HostId, u32, Time)>,
    done: Vec<Record>,
}

impl Timeline {
    /// Follows requests of `min_len..=max_len` bytes.
    pub fn new(min_len: u32, max_len: u32) -> Timeline {
        Timeline {
            min_len,
            max_len,
            ..Timeline::default()
        }
    }

    fn follows(&self, len: usize) -> bool {
        (self.min_len as usize..=self.max_len as usize).contains(&len)
    }

    pub(crate) fn starting(&mut self, host: HostId, len: usize, now: Time) {
        self.starting = self.follows(len).then_some((host, len as u32, now));
    }

    pub(crate) fn started(&mut self, host: HostId, id: u64) {
        if let Some((h, len, created)) = self.starting.take() {
            debug_assert_eq!(h, host);
            self.open.entry((host, id)).or_insert(Open {
                created,
                len,
                ..Open::default()
            });
        }
    }

    pub(crate) fn transmitted(&mut self, host: HostId, datagram: &[u8], now: Time) {
        let Ok(d) = decode(datagram) else { return };
        let Packet::Data { header, .. } = d.packet else {
            return;
        };
        if !d.common.from_client {
            return;
        }
        let key = (host, d.common.rpc_id);
        if let Some((h, len, _)) = self.starting {
            if h == host && len == header.message_length && header.offset == 0 {
                self.started(host, d.common.rpc_id);
            }
        }
        if let Some(m) = self.open.get_mut(&key) {
            m.first_tx.get_or_insert(now);
            m.last_tx = now;
        }
    }

    pub(crate) fn delivered(&mut self, src: HostId, datagram: &[u8], sent_at: Time, now: Time) {
        let Ok(d) = decode(datagram) else { return };
        let Packet::Data { payload, .. } = d.packet else {
            return;
        };
        if !d.common.from_client {
            return;
        }
        let key = (src, d.common.rpc_id);
        let Some(m) = self.open.get_mut(&key) else {
            return;
        };
        let transit = now - sent_at;
        m.rec.packets += 1;
        m.rec.retransmitted += d.common.retransmit as u32;
        m.rec.max_transit = m.rec.max_transit.max(transit);
        m.rec.last_transit = transit;
        m.got += payload.len() as u32;
        if m.got >= m.len {
            let m = self.open.remove(&key).unwrap();
            let first = m.first_tx.unwrap_or(m.created);
            self.done.push(Record {
                len: m.len,
                total: now - m.created,
                sender_wait: first - m.created,
                tx_spread: m.last_tx - first,
                ..m.rec
            });
        }
    }

    /// The finished requests' records, in completion order.
    pub fn records(&self) -> &[Record] {
        &self.done
    }

    /// A table: the mean of each component over the requests in bands of
    /// total latency (all, the median band, the 98th and 99th
    /// percentiles' bands), then each component's own percentiles.
    pub fn summary(&self) -> String {
        let mut v = self.done.clone();
        let mut s = String::new();
        let n = v.len();
        let _ = writeln!(
            s,
            "timeline of {n} requests of {}-{} B (ns):",
            self.min_len, self.max_len
        );
        if n == 0 {
            return s;
        }
        v.sort_by_key(|r| r.total);
        let _ = writeln!(
            s,
            "  band by total       n    total  sender_wait  tx_spread  last_transit  max_transit  packets  retx"
        );
        for (name, lo, hi) in [
            ("all", 0, n),
            ("p50-p60", n / 2, n * 6 / 10),
            ("p98-p99", n * 98 / 100, n * 99 / 100),
            ("p99-p100", n * 99 / 100, n),
        ] {
            let band = &v[lo..hi.max(lo + 1).min(n)];
            let k = band.len() as f64;
            let mean = |f: fn(&Record) -> u64| band.iter().map(f).sum::<u64>() as f64 / k;
            let _ = writeln!(
                s,
                "  {name:<14} {:>6} {:>8.0} {:>12.0} {:>10.0} {:>13.0} {:>12.0} {:>8.2} {:>5.2}",
                band.len(),
                mean(|r| r.total),
                mean(|r| r.sender_wait),
                mean(|r| r.tx_spread),
                mean(|r| r.last_transit),
                mean(|r| r.max_transit),
                mean(|r| r.packets as u64),
                mean(|r| r.retransmitted as u64),
            );
        }
        let comps: [(&str, Component); 5] = [
            ("total", |r| r.total),
            ("sender_wait", |r| r.sender_wait),
            ("tx_spread", |r| r.tx_spread),
            ("last_transit", |r| r.last_transit),
            ("max_transit", |r| r.max_transit),
        ];
        for (name, f) in comps {
            let mut w: Vec<u64> = v.iter().map(f).collect();
            w.sort_unstable();
            let _ = writeln!(
                s,
                "  {name:<13} p50 {:>8} p90 {:>8} p99 {:>8} max {:>8}",
                w[n / 2],
                w[n * 9 / 10],
                w[n * 99 / 100],
                w[n - 1]
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use crate::{EngineNet, Fabric, Reply, TestApp};
    use homa_proto::Config;

    #[test]
    fn an_idle_network_shows_no_wait_and_back_to_back_packets() {
        // A 25 Gbps star (the engine's default link rate), 1 µs links: a
        // 3,000-byte request is three packets, a full one 492 ns on the wire.
        let fabric = Fabric::star(2, 25_000_000_000, 1_000, 250).with_seed(1);
        let mut net =
            EngineNet::uniform(fabric, Config::default(), |_| TestApp::new(Reply::Fixed(0)))
                .unwrap();
        net.enable_timeline(2_000, 4_000);
        // Not followed: too short.
        net.send_request(0, 1, bytes::Bytes::from(vec![0u8; 100]))
            .unwrap();
        let id = net
            .send_request(0, 1, bytes::Bytes::from(vec![0u8; 3_000]))
            .unwrap();
        assert!(net.run_until_cond(1_000_000_000, |n| n.app(0).finished_at(id).is_some()));
        let tl = net.timeline().unwrap();
        assert_eq!(tl.records().len(), 1);
        let r = tl.records()[0];
        assert_eq!((r.len, r.packets, r.retransmitted), (3_000, 3, 0));
        // Nothing waits at the sender but the short packet before it (the
        // pacer lets one full packet queue in the NIC), and the three
        // packets leave within their own wire times.
        assert!(r.sender_wait < 100, "{r:?}");
        assert!(r.tx_spread <= 2 * 492, "{r:?}");
        // Transit: two links, a switch, two serializations and at most two
        // packets queued ahead in the NIC.
        assert!(r.max_transit <= 2 * 1_000 + 250 + 4 * 492, "{r:?}");
        assert_eq!(r.total, r.sender_wait + r.tx_spread + r.last_transit);
        assert!(tl
            .summary()
            .contains("timeline of 1 requests of 2000-4000 B"));
    }
}
