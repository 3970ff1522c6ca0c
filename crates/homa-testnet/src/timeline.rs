//! Per-message timelines of requests in size ranges, for finding where a
//! message's latency goes: the wait at its sender before its first packet,
//! the spread of its packets at the sender, and the network transit of its
//! packets (queueing at every hop). The spread is split by what held the
//! message back at each instant (see [`Record`]): the sender busy with
//! other packets while it had granted bytes to send (a sender-side cause),
//! or no granted bytes to send because a grant was on its way, or its
//! packets were still in the network, or the receiver had everything sent
//! and granted nothing more (receiver-side causes). Turned on by
//! [`crate::EngineNet::enable_timeline`]; off, it costs one branch per
//! packet.

use crate::net::HostId;
use crate::sched::Time;
use homa_proto::wire::{decode, Packet};
use std::collections::HashMap;
use std::fmt::Write;

/// Reads one component of a [`Record`].
type Component = fn(&Record) -> u64;

/// The states a message's spread is split into ([`Record::split`]).
const OWN: usize = 0;
const OTHER: usize = 1;
const GRANT_NET: usize = 2;
const DATA_NET: usize = 3;
const HELD: usize = 4;

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
    /// From the first packet handed to the NIC to the last one; the sum of
    /// the five parts below.
    pub tx_spread: Time,
    /// Of the spread: the sender's NIC serializing one of this message's
    /// packets. The rest of the spread is split by state, first match:
    pub own_tx: Time,
    /// the sender had granted bytes of this message not yet sent and was
    /// not sending them (its NIC busy with other packets, or the engine
    /// choosing not to): a sender-side cause;
    pub sender_other: Time,
    /// every granted byte sent, a newer grant on its way from the receiver;
    pub grant_transit: Time,
    /// every granted byte sent, no newer grant issued, some of its packets
    /// still in the network (queued at a switch or NIC);
    pub data_in_net: Time,
    /// every granted byte sent and arrived, no newer grant issued: the
    /// receiver was granting other messages (or none).
    pub rx_held: Time,
    /// Wire time of the DATA packets of other messages its sender handed
    /// to the NIC while this one had granted bytes to send, by kind: new
    /// bytes of a message with fewer bytes left to send (SRPT), new bytes
    /// of one with at least as many (the FIFO share, or a message with
    /// bytes left that had them first), retransmissions. Their sum is most
    /// of `sender_other`.
    pub passed_by_shorter: Time,
    pub passed_by_longer: Time,
    pub passed_by_retx: Time,
    /// Wire time of the control packets (GRANTs, RESENDs...) its sender
    /// sent meanwhile.
    pub passed_by_control: Time,
    /// Mean transit of its DATA packets (NIC to receiving host).
    pub mean_data_transit: Time,
    /// Mean transit of its GRANTs (receiver's NIC to sending host); 0 if
    /// none.
    pub mean_grant_transit: Time,
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
    /// Offsets of the DATA packets that arrived (duplicates count once).
    arrived: std::collections::HashSet<u32>,
    /// Bytes the sender may send (unscheduled, then grants that arrived).
    granted: u32,
    /// One past the highest byte sent.
    sent: u32,
    /// The highest grant the receiver has sent.
    grant_issued: u32,
    /// DATA packets handed to the NIC and not yet delivered.
    in_flight: u32,
    /// The NIC serializes this message's latest packet until then.
    own_until: Time,
    /// Time since `first_tx` accounted for in `acc`.
    last_t: Time,
    acc: [Time; 5],
    /// `acc` when the latest packet left.
    at_last_tx: [Time; 5],
    /// See `Record::passed_by_shorter` and the next three.
    passed: [Time; 4],
    /// Sum of its DATA packets' transits.
    data_transit: Time,
    /// GRANTs that arrived, and the sum of their transits.
    grants: u32,
    grant_transit: Time,
    rec: Record,
}

impl Open {
    /// Accounts the time since the last event to the state the message was
    /// in (nothing before its first packet left).
    fn advance(&mut self, now: Time) {
        if self.first_tx.is_none() || now <= self.last_t {
            return;
        }
        let dt = now - self.last_t;
        let own = self.own_until.saturating_sub(self.last_t).min(dt);
        self.acc[OWN] += own;
        let dt = dt - own;
        if self.granted > self.sent {
            self.acc[OTHER] += dt;
        } else if self.grant_issued > self.granted {
            self.acc[GRANT_NET] += dt;
        } else if self.in_flight > 0 {
            self.acc[DATA_NET] += dt;
        } else {
            self.acc[HELD] += dt;
        }
        self.last_t = now;
    }
}

/// The timelines of the requests whose length is in one of some ranges.
#[derive(Default)]
pub struct Timeline {
    ranges: Vec<(u32, u32)>,
    open: HashMap<(HostId, u64), Open>,
    /// The ids of the open requests of each sending host.
    by_host: HashMap<HostId, Vec<u64>>,
    /// A request being started (host, length, time) whose id is not known
    /// yet: its first packet may leave before `send_request` returns.
    starting: Option<(HostId, u32, Time)>,
    done: Vec<Record>,
}

impl Timeline {
    /// Follows requests of `min_len..=max_len` bytes.
    pub fn new(min_len: u32, max_len: u32) -> Timeline {
        Timeline::with_ranges(&[(min_len, max_len)])
    }

    /// Follows requests whose length is in any of `ranges` (`min..=max`
    /// each); the summary has one table per range.
    pub fn with_ranges(ranges: &[(u32, u32)]) -> Timeline {
        Timeline {
            ranges: ranges.to_vec(),
            ..Timeline::default()
        }
    }

    fn follows(&self, len: usize) -> bool {
        self.ranges
            .iter()
            .any(|&(lo, hi)| (lo as usize..=hi as usize).contains(&len))
    }

    pub(crate) fn starting(&mut self, host: HostId, len: usize, now: Time) {
        self.starting = self.follows(len).then_some((host, len as u32, now));
    }

    pub(crate) fn started(&mut self, host: HostId, id: u64) {
        if let Some((h, len, created)) = self.starting.take() {
            debug_assert_eq!(h, host);
            self.open.entry((host, id)).or_insert_with(|| {
                self.by_host.entry(host).or_default().push(id);
                Open {
                    created,
                    len,
                    ..Open::default()
                }
            });
        }
    }

    /// Host `host` handed `datagram` (for host `dest`) to its NIC, which
    /// serializes it in `wire_ns`.
    pub(crate) fn transmitted(
        &mut self,
        host: HostId,
        dest: Option<HostId>,
        datagram: &[u8],
        wire_ns: Time,
        now: Time,
    ) {
        let Ok(d) = decode(datagram) else { return };
        match d.packet {
            Packet::Data { header, payload } if d.common.from_client => {
                let key = (host, d.common.rpc_id);
                self.passed(
                    host,
                    Some(d.common.rpc_id),
                    header.message_length - header.offset,
                    Some(d.common.retransmit),
                    wire_ns,
                );
                if let Some((h, len, _)) = self.starting {
                    if h == host && len == header.message_length && header.offset == 0 {
                        self.started(host, d.common.rpc_id);
                    }
                }
                if let Some(m) = self.open.get_mut(&key) {
                    if m.first_tx.is_none() {
                        m.first_tx = Some(now);
                        m.last_t = now;
                    }
                    m.advance(now);
                    m.granted = m.granted.max(header.unsched_bytes.min(m.len));
                    m.sent = m.sent.max(header.offset + payload.len() as u32);
                    m.in_flight += 1;
                    m.own_until = m.own_until.max(now) + wire_ns;
                    m.last_tx = now;
                    m.at_last_tx = m.acc;
                }
            }
            Packet::Grant(g) if !d.common.from_client => {
                let Some(client) = dest else { return };
                if let Some(m) = self.open.get_mut(&(client, d.common.rpc_id)) {
                    m.advance(now);
                    m.grant_issued = m.grant_issued.max(g.offset.min(m.len));
                }
            }
            _ => {}
        }
        if !matches!(d.packet, Packet::Data { .. }) {
            self.passed(host, None, 0, None, wire_ns);
        }
    }

    /// Host `host` sent a DATA packet of request `id` (with `left` bytes
    /// from its offset to its end; `retx`: whether a retransmission), or a
    /// control packet (`retx` `None`), taking `wire_ns`: charge it to the
    /// host's other open requests that had granted bytes to send.
    fn passed(
        &mut self,
        host: HostId,
        id: Option<u64>,
        left: u32,
        retx: Option<bool>,
        wire_ns: Time,
    ) {
        let Some(ids) = self.by_host.get(&host) else {
            return;
        };
        for &other in ids {
            if Some(other) == id {
                continue;
            }
            let Some(m) = self.open.get_mut(&(host, other)) else {
                continue;
            };
            if m.first_tx.is_none() || m.granted <= m.sent {
                continue;
            }
            let kind = if retx.is_none() {
                3
            } else if retx == Some(true) {
                2
            } else if left < m.len - m.sent {
                0
            } else {
                1
            };
            m.passed[kind] += wire_ns;
        }
    }

    /// Host `dst` received `datagram` from host `src`, sent at `sent_at`.
    pub(crate) fn delivered(
        &mut self,
        src: HostId,
        dst: HostId,
        datagram: &[u8],
        sent_at: Time,
        now: Time,
    ) {
        let Ok(d) = decode(datagram) else { return };
        let (header_offset, payload) = match d.packet {
            Packet::Data { header, payload } if d.common.from_client => (header.offset, payload),
            Packet::Grant(g) if !d.common.from_client => {
                if let Some(m) = self.open.get_mut(&(dst, d.common.rpc_id)) {
                    m.advance(now);
                    m.granted = m.granted.max(g.offset.min(m.len));
                    m.grants += 1;
                    m.grant_transit += now - sent_at;
                }
                return;
            }
            _ => return,
        };
        let key = (src, d.common.rpc_id);
        let Some(m) = self.open.get_mut(&key) else {
            return;
        };
        m.advance(now);
        m.in_flight = m.in_flight.saturating_sub(1);
        let transit = now - sent_at;
        m.rec.packets += 1;
        m.rec.retransmitted += d.common.retransmit as u32;
        m.rec.max_transit = m.rec.max_transit.max(transit);
        m.data_transit += transit;
        m.rec.last_transit = transit;
        if m.arrived.insert(header_offset) {
            m.got += payload.len() as u32;
        }
        if m.got >= m.len {
            let m = self.open.remove(&key).unwrap();
            if let Some(ids) = self.by_host.get_mut(&src) {
                ids.retain(|&i| i != key.1);
            }
            let first = m.first_tx.unwrap_or(m.created);
            let a = m.at_last_tx;
            self.done.push(Record {
                len: m.len,
                total: now - m.created,
                sender_wait: first - m.created,
                tx_spread: m.last_tx - first,
                own_tx: a[OWN],
                sender_other: a[OTHER],
                grant_transit: a[GRANT_NET],
                data_in_net: a[DATA_NET],
                rx_held: a[HELD],
                passed_by_shorter: m.passed[0],
                passed_by_longer: m.passed[1],
                passed_by_retx: m.passed[2],
                passed_by_control: m.passed[3],
                mean_data_transit: m.data_transit / m.rec.packets.max(1) as u64,
                mean_grant_transit: m.grant_transit / m.grants.max(1) as u64,
                ..m.rec
            });
        }
    }

    /// The finished requests' records, in completion order.
    pub fn records(&self) -> &[Record] {
        &self.done
    }

    /// Tables, one per range: the mean of each component over the requests
    /// in bands of total latency (all, the median band, the 98th and 99th
    /// percentiles' bands), then each component's own percentiles.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        for &(lo, hi) in &self.ranges {
            let v: Vec<Record> = self
                .done
                .iter()
                .filter(|r| (lo..=hi).contains(&r.len))
                .copied()
                .collect();
            summarize(&mut s, lo, hi, v);
        }
        s
    }
}

fn summarize(s: &mut String, lo: u32, hi: u32, mut v: Vec<Record>) {
    let n = v.len();
    let _ = writeln!(s, "timeline of {n} requests of {lo}-{hi} B (ns):");
    if n == 0 {
        return;
    }
    v.sort_by_key(|r| r.total);
    let _ = writeln!(
        s,
        "  band by total       n    total  sender_wait  tx_spread (own_tx sender_other grant_transit data_in_net rx_held)  last_transit  max_transit  data_mean_tr grant_mean_tr  packets  retx"
    );
    for (name, lo, hi) in [
        ("all", 0, n),
        ("p50-p60", n / 2, n * 6 / 10),
        ("p98-p99", n * 98 / 100, n * 99 / 100),
        ("p99-p100", n * 99 / 100, n),
    ] {
        let band = &v[lo..hi.max(lo + 1).min(n)];
        let k = band.len() as f64;
        let mean = |f: Component| band.iter().map(f).sum::<u64>() as f64 / k;
        let _ = writeln!(
            s,
            "  {name:<14} {:>6} {:>8.0} {:>12.0} {:>10.0} ({:>6.0} {:>12.0} {:>13.0} {:>11.0} {:>7.0}) {:>13.0} {:>12.0} {:>12.0} {:>13.0} {:>8.2} {:>5.2}",
            band.len(),
            mean(|r| r.total),
            mean(|r| r.sender_wait),
            mean(|r| r.tx_spread),
            mean(|r| r.own_tx),
            mean(|r| r.sender_other),
            mean(|r| r.grant_transit),
            mean(|r| r.data_in_net),
            mean(|r| r.rx_held),
            mean(|r| r.last_transit),
            mean(|r| r.max_transit),
            mean(|r| r.mean_data_transit),
            mean(|r| r.mean_grant_transit),
            mean(|r| r.packets as u64),
            mean(|r| r.retransmitted as u64),
        );
    }
    let _ = writeln!(
        s,
        "  band by total   of sender_other, others' DATA sent meanwhile: shorter  longer  retransmissions  control"
    );
    for (name, lo, hi) in [
        ("all", 0, n),
        ("p50-p60", n / 2, n * 6 / 10),
        ("p98-p99", n * 98 / 100, n * 99 / 100),
        ("p99-p100", n * 99 / 100, n),
    ] {
        let band = &v[lo..hi.max(lo + 1).min(n)];
        let k = band.len() as f64;
        let mean = |f: Component| band.iter().map(f).sum::<u64>() as f64 / k;
        let _ = writeln!(
            s,
            "  {name:<14} {:>48.0} {:>7.0} {:>16.0} {:>8.0}",
            mean(|r| r.passed_by_shorter),
            mean(|r| r.passed_by_longer),
            mean(|r| r.passed_by_retx),
            mean(|r| r.passed_by_control),
        );
    }
    let comps: [(&str, Component); 12] = [
        ("total", |r| r.total),
        ("sender_wait", |r| r.sender_wait),
        ("tx_spread", |r| r.tx_spread),
        ("own_tx", |r| r.own_tx),
        ("sender_other", |r| r.sender_other),
        ("grant_transit", |r| r.grant_transit),
        ("data_in_net", |r| r.data_in_net),
        ("rx_held", |r| r.rx_held),
        ("last_transit", |r| r.last_transit),
        ("max_transit", |r| r.max_transit),
        ("data_mean_tr", |r| r.mean_data_transit),
        ("grant_mean_tr", |r| r.mean_grant_transit),
    ];
    for (name, f) in comps {
        let mut w: Vec<u64> = v.iter().map(f).collect();
        w.sort_unstable();
        let _ = writeln!(
            s,
            "  {name:<14} p50 {:>8} p90 {:>8} p99 {:>8} max {:>8}",
            w[n / 2],
            w[n * 9 / 10],
            w[n * 99 / 100],
            w[n - 1]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Record;
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
        // All of it unscheduled: the spread is its own packets' wire time.
        assert_eq!(parts(&r), r.tx_spread);
        assert_eq!(r.own_tx, r.tx_spread, "{r:?}");
        assert!(tl
            .summary()
            .contains("timeline of 1 requests of 2000-4000 B"));
    }

    fn parts(r: &Record) -> u64 {
        r.own_tx + r.sender_other + r.grant_transit + r.data_in_net + r.rx_held
    }

    /// Runs `sends` (source, destination, bytes) at once on a 4-host star
    /// at 10 Gbps with the given overcommitment, following every request
    /// of at least 50 KB; the records by length.
    fn run(sends: &[(usize, usize, usize)], overcommit: usize) -> Vec<Record> {
        let fabric = Fabric::star(4, 10_000_000_000, 0, 250).with_seed(1);
        let mut cfg = Config::default();
        cfg.link_bps = 10_000_000_000;
        cfg.max_overcommit = overcommit;
        let mut net = EngineNet::uniform(fabric, cfg, |_| TestApp::new(Reply::Fixed(0))).unwrap();
        net.enable_timelines(&[(50_000, u32::MAX)]);
        let ids: Vec<_> = sends
            .iter()
            .map(|&(s, d, n)| {
                (
                    s,
                    net.send_request(s, d, bytes::Bytes::from(vec![0u8; n]))
                        .unwrap(),
                )
            })
            .collect();
        assert!(net.run_until_cond(1_000_000_000, |n| ids
            .iter()
            .all(|&(s, id)| n.app(s).finished_at(id).is_some())));
        let mut v = net.timeline().unwrap().records().to_vec();
        v.sort_by_key(|r| r.len);
        for r in &v {
            assert_eq!(parts(r), r.tx_spread, "{r:?}");
        }
        v
    }

    #[test]
    fn a_message_the_receiver_does_not_grant_waits_in_rx_held() {
        // Two senders, one receiver granting one message at a time: the
        // longer message's grants wait for the shorter one to finish
        // (100 KB, about 84 us at 10 Gbps).
        let v = run(&[(0, 2, 100_000), (1, 2, 200_000)], 1);
        let (short, long) = (v[0], v[1]);
        assert_eq!((short.len, long.len), (100_000, 200_000));
        // Part of the wait its unscheduled packets spend queued at the
        // receiver's downlink behind the shorter message (data_in_net),
        // the rest with everything arrived and no grant (rx_held).
        assert!(long.rx_held + long.data_in_net > 60_000, "{long:?}");
        assert!(long.rx_held > 20_000, "{long:?}");
        // Alone at its sender: a few packet times at most (the pacer
        // releasing into the NIC after a grant).
        assert!(long.sender_other < 10_000, "{long:?}");
        // The granted one is never held (its grants may wait behind the
        // other's unscheduled packets at the downlink: data_in_net).
        assert_eq!(short.rx_held, 0, "{short:?}");
    }

    #[test]
    fn a_message_its_sender_passes_over_waits_in_sender_other() {
        // One sender, two receivers: the sender's SRPT sends the shorter
        // message first, so the longer one has granted bytes it does not
        // send for about the shorter one's wire time.
        let v = run(&[(0, 1, 200_000), (0, 2, 100_000)], 8);
        let (short, long) = (v[0], v[1]);
        assert_eq!((short.len, long.len), (100_000, 200_000));
        assert!(long.sender_other > 60_000, "{long:?}");
        // What went meanwhile: the shorter message's packets.
        assert!(long.passed_by_shorter > 60_000, "{long:?}");
        assert_eq!(
            (long.passed_by_longer, long.passed_by_retx),
            (0, 0),
            "{long:?}"
        );
        assert_eq!(short.passed_by_shorter, 0, "{short:?}");
        assert!(long.rx_held < 10_000, "{long:?}");
        assert!(short.sender_other < 10_000, "{short:?}");
    }
}
