//! What an endpoint remembers about each peer it talks to.

use crate::rtt::RttEstimator;
use crate::table::{LinearTable, Slot};
use crate::time::Time;
use crate::window::UnschedWindow;
use crate::wire::MAX_PRIORITIES;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

/// Index of a peer in the endpoint's peer table. Stable while the peer has
/// RPCs or tombstones (such a peer is never evicted), so RPCs and server-side
/// keys carry it instead of hashing the address again on every packet.
pub(crate) type PeerKey = u32;

/// The per-packet part of a peer, in one cache line: the simulator drives
/// hundreds of endpoints with hundreds of peers each, so a peer is usually
/// cold when touched and each extra line is a miss. Rarely used fields live
/// in [`PeerInfo`].
#[repr(C, align(64))]
pub(crate) struct Peer {
    /// The latest `send_time` received from the peer minus our clock when
    /// it arrived (wrapping; 0: none yet), so that the echo we send at time
    /// `t` is that `send_time` advanced by how long we held it,
    /// `echo_base + t` ([`Self::echo`]): the peer's sample then leaves our
    /// hold time out (`docs/wire-format.md`, *Timestamps*). One word, as the
    /// raw `send_time` was.
    echo_base: u64,
    /// Last time the peer had an RPC or sent us a packet.
    pub last_active: Time,
    /// Completed client RPCs whose server state the peer may drop.
    pub pending_acks: Vec<u64>,
    /// RPCs (client and server) that refer to this peer.
    pub rpcs: u32,
    /// Server RPCs from this peer.
    pub server_rpcs: u32,
    /// Tombstones of server RPCs from this peer (they pin the peer's key).
    pub tombstones: u32,
    /// When the timestamp in `echo_base` arrived, in [`ECHO_TICK_SHIFT`]
    /// ticks of our clock (1.024 µs, wrapping every 73 minutes), so that
    /// [`Self::echo`] can refuse to echo a timestamp held too long (the two
    /// clocks' rates differ, and the hold is measured on ours). 32 bits, so
    /// that this line still holds the cutoff summary below; the RTT minimum
    /// that used to be here lives in [`PeerPath`].
    echo_at: u32,
    /// The peer's highest unscheduled level with a cutoff and that cutoff:
    /// a message of at most `top_cutoff` bytes goes at `top_level`, found
    /// without reading `PeerInfo` (a second, usually cold, cache line for
    /// every message sent). Kept in step with `PeerInfo::cutoffs` by
    /// [`Peers::set_cutoffs`].
    top_cutoff: u32,
    /// Version of the peer's cutoffs (`PeerInfo::cutoffs`), echoed in our DATA
    /// packets so that the peer can tell us when it has newer ones.
    pub cutoff_version: u16,
    top_level: u8,
    /// Index of the peer's cutoffs in [`Peers::cutoff_sets`] ([`NO_SET`]:
    /// only in `PeerInfo`). Peers nearly always share a few cutoff arrays, so
    /// a message longer than `top_cutoff` reads a shared, hot line instead of
    /// this peer's (cold) `PeerInfo`.
    cutoff_set: u8,
}

/// [`Peer::cutoff_set`] when the peer's cutoffs are not interned.
const NO_SET: u8 = u8::MAX;

/// At most this many distinct cutoff arrays are interned per endpoint: keeps
/// memory and the interning scan bounded whatever peers announce (further
/// arrays are read from `PeerInfo`, as before interning).
const MAX_CUTOFF_SETS: usize = 16;

const _: () = assert!(std::mem::size_of::<Option<Peer>>() == 64);

/// The rest of a peer: read when sending a message or handling CUTOFFS.
pub(crate) struct PeerInfo {
    /// The peer's address (to drop its index entry, and to order evictions).
    pub addr: SocketAddr,
    /// The peer's unscheduled cutoffs (what we use when sending to it).
    pub cutoffs: [u32; MAX_PRIORITIES],
    /// When we last sent this peer a CUTOFFS packet (rate limit).
    pub cutoffs_sent_at: Option<Time>,
}

/// What the endpoint measures of the network path to a peer and the
/// windows it derives from that (`docs/congestion.md`). A table parallel to
/// the peers', not a part of [`Peer`] (whose one cache line is full and
/// read on every packet) nor of [`PeerInfo`] (read on every packet too,
/// for the address check): updated only when the endpoint measures RTT
/// (`Config::measure_rtt` or adaptive windows), so that an endpoint that
/// does not pays nothing for it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeerPath {
    /// The peer's RTT.
    pub rtt: RttEstimator,
    /// Adaptive windows: the grant window of the peer's messages (0: none
    /// computed yet, the static one applies), recomputed at a sample when
    /// `rtt_min` changes or a foreign queue is (or was) covered, rather
    /// than at every grant...
    pub grant_window: u32,
    /// ...whether it covers a foreign queue now
    /// (`Config::grant_covers_foreign_queue`), so that it is recomputed
    /// when the queue goes...
    pub covers_queue: bool,
    /// ...and the unscheduled bytes of our messages to it.
    pub unsched: UnschedWindow,
    /// On-Ramp: the one-way delay to it and whether it is held.
    pub onramp: crate::onramp::OnRampPath,
    /// On-Ramp, as a receiver: the one-way delay of its DATA to us (our
    /// arrival minus its send time), whose queueing part is our downlink's.
    pub onramp_in: crate::onramp::OwdWindow,
}

impl Peer {
    /// Version 0 means "not heard yet", so the peer's first DATA from us
    /// triggers a CUTOFFS reply.
    fn new(now: Time, cutoffs: &[u32; MAX_PRIORITIES], cutoff_set: u8) -> Peer {
        let (top_level, top_cutoff) = top_cutoff(cutoffs);
        Peer {
            echo_base: 0,
            last_active: now,
            echo_at: 0,
            pending_acks: Vec::new(),
            rpcs: 0,
            server_rpcs: 0,
            tombstones: 0,
            top_cutoff,
            cutoff_version: 0,
            top_level,
            cutoff_set,
        }
    }

    /// Nothing refers to the peer's key: it may be evicted or forgotten.
    pub fn unreferenced(&self) -> bool {
        self.rpcs == 0 && self.tombstones == 0
    }

    /// Records a packet's timestamps; returns the RTT sample (ns,
    /// saturating below `u32::MAX`) its echo gives, if any.
    #[inline]
    pub fn observe(&mut self, now: Time, send_time: u64, echo_time: u64) -> Option<u32> {
        if send_time != 0 {
            // A base of 0 would read as "none": the echo comes out 1 ns
            // early instead (only when the peer's clock equals ours).
            self.echo_base = match send_time.wrapping_sub(now) {
                0 => u64::MAX,
                b => b,
            };
            self.echo_at = echo_tick(now);
        }
        self.last_active = now;
        if echo_time != 0 && echo_time <= now {
            return Some((now - echo_time).min(u32::MAX as u64 - 1) as u32);
        }
        None
    }

    /// Whether the peer has sent us a timestamp to echo.
    #[inline]
    pub fn has_echo(&self) -> bool {
        self.echo_base != 0
    }

    /// The `echo_time` for a packet to the peer built at `now`: the latest
    /// `send_time` it sent us, plus the time since it arrived; 0 if none,
    /// or if we have held it more than `max_hold` ticks
    /// (`Config::max_echo_hold_ns`, [`echo_ticks`]).
    #[inline]
    pub fn echo(&self, now: Time, max_hold: u32) -> u64 {
        if self.echo_base == 0 || echo_tick(now).wrapping_sub(self.echo_at) > max_hold {
            0
        } else {
            self.echo_base.wrapping_add(now).max(1)
        }
    }
}

/// Hold times are kept in ticks of 2^10 ns (1.024 µs): 32 bits of them
/// cover 73 minutes, far beyond any hold worth echoing.
pub(crate) const ECHO_TICK_SHIFT: u32 = 10;

/// `now` in ticks, wrapping.
#[inline]
fn echo_tick(now: Time) -> u32 {
    (now >> ECHO_TICK_SHIFT) as u32
}

/// The longest hold, in ticks, of `max_hold_ns` (rounded up, so that a
/// hold of `max_hold_ns` is still echoed; a tick count can read one more
/// than the hold).
pub(crate) fn echo_ticks(max_hold_ns: u64) -> u32 {
    (max_hold_ns.div_ceil(1 << ECHO_TICK_SHIFT) + 1).min(u32::MAX as u64 / 2) as u32
}

/// The highest level with a non-zero cutoff and its cutoff ((0, 0) if none):
/// any length up to that cutoff gets that level from
/// [`PeerInfo::unsched_priority`].
fn top_cutoff(cutoffs: &[u32; MAX_PRIORITIES]) -> (u8, u32) {
    (0..MAX_PRIORITIES)
        .rev()
        .find(|&i| cutoffs[i] != 0)
        .map_or((0, 0), |i| (i as u8, cutoffs[i]))
}

/// Unscheduled priority for a message of `len` bytes under `cutoffs`: the
/// highest level whose cutoff admits it.
fn scan_priority(cutoffs: &[u32; MAX_PRIORITIES], len: u32) -> u8 {
    (0..MAX_PRIORITIES)
        .rev()
        .find(|&i| cutoffs[i] >= len && cutoffs[i] != 0)
        .unwrap_or(0) as u8
}

impl PeerInfo {
    /// Unscheduled priority for a message of `len` bytes sent to this peer: the
    /// highest level whose cutoff admits it.
    pub fn unsched_priority(&self, len: u32) -> u8 {
        scan_priority(&self.cutoffs, len)
    }
}

/// A peer's address as a hash-map key: the address as three machine words,
/// computed straight from the caller's `SocketAddr` (hashing a `SocketAddr`
/// field by field costs several hasher calls, and comparing copies of it
/// field by field stalled on store forwarding). Equality ignores the IPv6
/// flow label, which does not identify a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PeerAddr {
    ip_lo: u64,
    ip_hi: u64,
    /// Port, a v6 marker and the v6 scope id.
    rest: u64,
}

impl PeerAddr {
    #[inline]
    pub fn new(addr: &SocketAddr) -> PeerAddr {
        let (ip, rest) = match addr {
            SocketAddr::V4(a) => (u32::from(*a.ip()) as u128, a.port() as u64),
            SocketAddr::V6(a) => (
                u128::from(*a.ip()),
                a.port() as u64 | 1 << 16 | (a.scope_id() as u64) << 32,
            ),
        };
        PeerAddr {
            ip_lo: ip as u64,
            ip_hi: (ip >> 64) as u64,
            rest,
        }
    }
}

impl Hash for PeerAddr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // One word: the hasher's per-call cost dominates for keys this small.
        // Equal addresses give equal words; collisions only cost a compare.
        state.write_u64(self.ip_lo ^ self.ip_hi.rotate_left(29) ^ self.rest.rotate_left(48));
    }
}

/// An entry of the address index: one 32-byte slot, so a lookup reads one
/// cache line (a `HashMap` reads a control group, then the bucket).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct AddrSlot {
    addr: PeerAddr,
    /// `u32::MAX`: empty.
    key: PeerKey,
}

impl Slot for AddrSlot {
    type Key = PeerAddr;
    const EMPTY: AddrSlot = AddrSlot {
        addr: PeerAddr {
            ip_lo: 0,
            ip_hi: 0,
            rest: 0,
        },
        key: PeerKey::MAX,
    };
    #[inline]
    fn is_empty(&self) -> bool {
        self.key == PeerKey::MAX
    }
    #[inline]
    fn key(&self) -> PeerAddr {
        self.addr
    }
}

/// The peers an endpoint knows: a slab of [`Peer`]s addressed by [`PeerKey`],
/// plus a hash index from address to key used only where a packet or call
/// names a peer by address. Freed slots are reused lowest-last (a stack), so
/// keys depend only on the order of calls: deterministic.
#[derive(Default)]
pub(crate) struct Peers {
    slots: Vec<Option<Peer>>,
    /// `info[k]` belongs to `slots[k]` (stale while the slot is free).
    info: Vec<PeerInfo>,
    /// `paths[k]` belongs to `slots[k]` likewise.
    paths: Vec<PeerPath>,
    free: Vec<PeerKey>,
    index: LinearTable<AddrSlot>,
    /// Distinct cutoff arrays peers use (see [`Peer::cutoff_set`]); never
    /// shrinks, at most [`MAX_CUTOFF_SETS`] entries.
    cutoff_sets: Vec<[u32; MAX_PRIORITIES]>,
}

impl Peers {
    #[inline]
    pub fn find(&self, addr: SocketAddr) -> Option<PeerKey> {
        let i = self.index.find(PeerAddr::new(&addr))?;
        Some(self.index.at(i).key)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether `key` names a live peer.
    #[inline]
    pub fn is_live(&self, key: PeerKey) -> bool {
        self.slots.get(key as usize).is_some_and(|s| s.is_some())
    }

    /// Starts loading what [`Peers::find`] of `addr` will read first.
    #[inline]
    pub fn prefetch_find(&self, addr: &SocketAddr) {
        self.index.prefetch(PeerAddr::new(addr));
    }

    /// Starts loading peer `key`'s hot line (any key: a hint).
    #[inline]
    pub fn prefetch_peer(&self, key: PeerKey) {
        if let Some(s) = self.slots.get(key as usize) {
            crate::table::prefetch(s);
        }
    }

    /// Adds a peer not yet in the table. `cutoffs` are our own, assumed until
    /// the peer tells us its own.
    pub fn insert(
        &mut self,
        addr: SocketAddr,
        cutoffs: [u32; MAX_PRIORITIES],
        now: Time,
    ) -> PeerKey {
        let info = PeerInfo {
            addr,
            cutoffs,
            cutoffs_sent_at: None,
        };
        let set = self.intern(&cutoffs);
        let peer = Peer::new(now, &cutoffs, set);
        let key = match self.free.pop() {
            Some(k) => {
                self.slots[k as usize] = Some(peer);
                self.info[k as usize] = info;
                self.paths[k as usize] = PeerPath::default();
                k
            }
            None => {
                self.slots.push(Some(peer));
                self.info.push(info);
                self.paths.push(PeerPath::default());
                (self.slots.len() - 1) as PeerKey
            }
        };
        debug_assert!(key < PeerKey::MAX);
        self.index.insert_new(AddrSlot {
            addr: PeerAddr::new(&addr),
            key,
        });
        key
    }

    /// Forgets peer `key` (which nothing may refer to any more).
    pub fn remove(&mut self, key: PeerKey) {
        if let Some(p) = self.slots[key as usize].take() {
            debug_assert!(p.unreferenced());
            self.index
                .remove(PeerAddr::new(&self.info[key as usize].addr));
            self.free.push(key);
        }
    }

    /// Unscheduled priority for a message of `len` bytes to peer `key`
    /// ([`PeerInfo::unsched_priority`]); reads only the peer's hot line
    /// unless the message is longer than the top level's cutoff.
    #[inline]
    pub fn unsched_priority(&self, key: PeerKey, len: u32) -> u8 {
        let p = &self[key];
        if len <= p.top_cutoff {
            p.top_level
        } else if p.cutoff_set != NO_SET {
            scan_priority(&self.cutoff_sets[p.cutoff_set as usize], len)
        } else {
            self.info(key).unsched_priority(len)
        }
    }

    /// The index of `cutoffs` in `cutoff_sets`, adding it if there is room
    /// ([`NO_SET`] if not).
    fn intern(&mut self, cutoffs: &[u32; MAX_PRIORITIES]) -> u8 {
        if let Some(i) = self.cutoff_sets.iter().position(|c| c == cutoffs) {
            return i as u8;
        }
        if self.cutoff_sets.len() < MAX_CUTOFF_SETS {
            self.cutoff_sets.push(*cutoffs);
            return (self.cutoff_sets.len() - 1) as u8;
        }
        NO_SET
    }

    /// Records the cutoffs peer `key` announced.
    pub fn set_cutoffs(&mut self, key: PeerKey, cutoffs: [u32; MAX_PRIORITIES]) {
        let (level, cutoff) = top_cutoff(&cutoffs);
        let set = self.intern(&cutoffs);
        let p = &mut self[key];
        p.top_level = level;
        p.top_cutoff = cutoff;
        p.cutoff_set = set;
        self.info_mut(key).cutoffs = cutoffs;
    }

    /// The rarely used part of live peer `key`.
    pub fn info(&self, key: PeerKey) -> &PeerInfo {
        debug_assert!(self.slots[key as usize].is_some());
        &self.info[key as usize]
    }

    pub fn info_mut(&mut self, key: PeerKey) -> &mut PeerInfo {
        debug_assert!(self.slots[key as usize].is_some());
        &mut self.info[key as usize]
    }

    /// What is measured of the path to live peer `key`.
    #[inline]
    pub fn path(&self, key: PeerKey) -> &PeerPath {
        debug_assert!(self.slots[key as usize].is_some());
        &self.paths[key as usize]
    }

    #[inline]
    pub fn path_mut(&mut self, key: PeerKey) -> &mut PeerPath {
        debug_assert!(self.slots[key as usize].is_some());
        &mut self.paths[key as usize]
    }

    /// Live peers in key order (deterministic).
    pub fn iter(&self) -> impl Iterator<Item = (PeerKey, &Peer)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, p)| p.as_ref().map(|p| (k as PeerKey, p)))
    }
}

impl std::ops::Index<PeerKey> for Peers {
    type Output = Peer;
    fn index(&self, key: PeerKey) -> &Peer {
        self.slots[key as usize].as_ref().expect("live peer key")
    }
}

impl std::ops::IndexMut<PeerKey> for Peers {
    fn index_mut(&mut self, key: PeerKey) -> &mut Peer {
        self.slots[key as usize].as_mut().expect("live peer key")
    }
}

/// A server RPC's identity: the client's peer key and the client's RPC id,
/// hashed as one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerKey {
    pub peer: PeerKey,
    pub id: u64,
}

impl Hash for ServerKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Ids of one client are consecutive; peer keys are small. Putting the
        // key in the top bits keeps distinct pairs distinct in practice, and a
        // collision only costs a compare.
        state.write_u64(self.id ^ (self.peer as u64).rotate_right(24));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 4000))
    }

    /// The summary in the hot line gives the same level as the full scan,
    /// for every length around every cutoff, after inserts and updates.
    #[test]
    fn unsched_priority_summary_matches_the_cutoffs() {
        let mut t = Peers::default();
        let mut x = 7u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let random_cutoffs = |next: &mut dyn FnMut() -> u64| {
            let mut c = [0u32; MAX_PRIORITIES];
            for v in c.iter_mut() {
                *v = match next() % 4 {
                    0 => 0,
                    1 => u32::MAX,
                    _ => (next() % 200_000) as u32,
                };
            }
            c
        };
        let k = t.insert(addr(1), [0; MAX_PRIORITIES], 0);
        let (mut interned, mut not_interned) = (0, 0);
        for round in 0..500 {
            let cutoffs = random_cutoffs(&mut next);
            if round % 2 == 0 {
                t.set_cutoffs(k, cutoffs);
            } else {
                t.remove(k);
                assert_eq!(t.insert(addr(1), cutoffs, 0), k);
            }
            // Both the shared sets and, once they are full, `PeerInfo`.
            if t[k].cutoff_set == NO_SET {
                not_interned += 1;
            } else {
                interned += 1;
                assert_eq!(t.cutoff_sets[t[k].cutoff_set as usize], cutoffs);
            }
            let mut lens = vec![0, 1, u32::MAX];
            for &c in &cutoffs {
                lens.extend([c.saturating_sub(1), c, c.saturating_add(1)]);
            }
            for len in lens {
                assert_eq!(
                    t.unsched_priority(k, len),
                    t.info(k).unsched_priority(len),
                    "{cutoffs:?} len {len}"
                );
            }
        }
        assert!(interned > 0 && not_interned > 0);
        assert!(t.cutoff_sets.len() <= MAX_CUTOFF_SETS);
    }

    #[test]
    fn address_keys_ignore_only_the_flow_label() {
        use std::net::SocketAddrV6;
        let v6 = |flow, scope| {
            SocketAddr::V6(SocketAddrV6::new(
                "fe80::1".parse().unwrap(),
                4000,
                flow,
                scope,
            ))
        };
        assert_eq!(PeerAddr::new(&v6(1, 2)), PeerAddr::new(&v6(9, 2)));
        assert_ne!(PeerAddr::new(&v6(1, 2)), PeerAddr::new(&v6(1, 3)));
        // An IPv4 address and its v4-mapped or numerically equal v6 form differ.
        let v4 = SocketAddr::from(([0, 0, 0, 1], 4000));
        let v6_one = SocketAddr::from((std::net::Ipv6Addr::from(1u128), 4000));
        assert_ne!(PeerAddr::new(&v4), PeerAddr::new(&v6_one));
        assert_ne!(PeerAddr::new(&addr(1)), PeerAddr::new(&addr(2)));
        let other_port = SocketAddr::from(([10, 0, 0, 1], 4001));
        assert_ne!(PeerAddr::new(&addr(1)), PeerAddr::new(&other_port));
    }

    #[test]
    fn peer_table_reuses_keys_and_indexes_addresses() {
        let mut t = Peers::default();
        let a = t.insert(addr(1), [0; MAX_PRIORITIES], 0);
        let b = t.insert(addr(2), [0; MAX_PRIORITIES], 0);
        assert_ne!(a, b);
        assert_eq!((t.find(addr(1)), t.find(addr(2))), (Some(a), Some(b)));
        assert_eq!(t.len(), 2);
        t.remove(a);
        assert_eq!((t.find(addr(1)), t.len()), (None, 1));
        // The freed key is reused for the next address.
        let c = t.insert(addr(3), [0; MAX_PRIORITIES], 0);
        assert_eq!(c, a);
        assert_eq!(t.info(c).addr, addr(3));
        assert_eq!(
            t.iter()
                .map(|(k, _)| (k, t.info(k).addr))
                .collect::<Vec<_>>(),
            [(a, addr(3)), (b, addr(2))]
        );
    }
}

#[cfg(test)]
mod rtt_tests {
    use super::*;

    const HOLD: u32 = u32::MAX / 2;

    #[test]
    fn an_echo_gives_a_round_trip_sample() {
        let mut p = Peer::new(0, &[0; MAX_PRIORITIES], NO_SET);
        assert_eq!(p.observe(100, 5, 0), None); // no echo: no sample
        assert_eq!(p.echo(100, HOLD), 5);
        assert_eq!(p.observe(100, 6, 70), Some(30));
        assert_eq!(p.observe(300, 9, 300), Some(0)); // a zero round trip counts
        assert_eq!(p.observe(300, 9, 400), None); // an echo from the future does not
                                                  // A sample beyond 32 bits of ns saturates (and is still a sample).
        assert_eq!(p.observe(1 << 40, 5, 1), Some(u32::MAX - 1));
    }

    /// A timestamp held longer than the limit is not echoed: the two
    /// clocks' rate difference times the hold would spoil the sample.
    #[test]
    fn a_timestamp_held_too_long_is_not_echoed() {
        let max = echo_ticks(1_000_000);
        let mut p = Peer::new(0, &[0; MAX_PRIORITIES], NO_SET);
        p.observe(5_000_000, 77, 0);
        assert_eq!(p.echo(5_000_000 + 1_000_000, max), 77 + 1_000_000);
        assert_eq!(p.echo(5_000_000 + 1_010_000, max), 0);
        assert_eq!(p.echo(5_000_000 + 3_600_000_000_000, max), 0);
        // A new timestamp is echoed again.
        p.observe(8_000_000, 90, 0);
        assert_eq!(p.echo(8_000_500, max), 590);
        // Limits round up to whole ticks, plus one for the tick boundary.
        assert_eq!((echo_ticks(0), echo_ticks(1), echo_ticks(1024)), (1, 2, 2));
    }

    /// The echo is the peer's latest `send_time` advanced by the time we
    /// held it, whatever the two clocks' epochs.
    #[test]
    fn the_echo_leaves_out_the_hold_time() {
        let mut p = Peer::new(0, &[0; MAX_PRIORITIES], NO_SET);
        assert!(!p.has_echo());
        assert_eq!(p.echo(1_000, HOLD), 0);
        // The peer's clock is far ahead of ours.
        p.observe(1_000, 5_000_000, 0);
        assert!(p.has_echo());
        assert_eq!(p.echo(1_000, HOLD), 5_000_000);
        assert_eq!(p.echo(31_000, HOLD), 5_030_000);
        // ...or behind it.
        p.observe(9_000_000, 7, 0);
        assert_eq!(p.echo(9_000_100, HOLD), 107);
        // Equal clocks: 1 ns early rather than "none".
        p.observe(500, 500, 0);
        assert!(p.has_echo());
        assert_eq!(p.echo(600, HOLD), 599);
        // A send_time of 0 (no timestamp) leaves the echo alone.
        p.observe(700, 0, 0);
        assert_eq!(p.echo(600, HOLD), 599);
    }
}
