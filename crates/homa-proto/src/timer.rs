//! The periodic timer: loss detection by silence (RESEND), keep-alives (BUSY),
//! NEED_ACK, RPC timeouts, and garbage collection of peers and tombstones.

use crate::endpoint::{ControlBody, Endpoint};
use crate::peer::PeerKey;
use crate::rpc::{InMsg, RpcKey, RpcState};
use crate::time::Time;
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// RESENDs sent to one peer per timer tick at most (the least recently
/// prodded RPCs first; the others wait for the next tick). The Linux module
/// sends one per peer per tick. Without a limit, a client with thousands of
/// RPCs outstanding to a server whose socket had overflowed sent one RESEND
/// per RPC per interval (1.28 million in 4 s in the 10,000-RPC loopback
/// test), whose answers overflowed its own socket in turn: the RPCs timed
/// out instead of recovering. Eight per 0.5 ms tick is 16,000 a second per
/// peer, enough to restart thousands of lost requests within a fraction of
/// the RPC timeout.
const RESENDS_PER_PEER_PER_TICK: usize = 8;

/// Most gaps of one incoming message asked for in one RESEND interval (one
/// RESEND packet each); later ones wait for the next interval.
pub(crate) const MAX_GAPS_PER_RESEND: usize = 8;

/// What the timer does for one RPC.
enum Prod {
    Nothing,
    /// Ask the peer for `[offset, offset+length)` again.
    Resend(u32, u32, u8),
    /// Ask the client to acknowledge the response.
    NeedAck,
    /// Nothing expected from the peer, but it is waiting for us: tell it we are
    /// alive so that it does not time out.
    KeepAlive,
}

/// What an incoming message needs: a RESEND for its first gap below the granted
/// offset (we are waiting on the peer), or a keep-alive (the peer waits on us).
fn incoming_prod(inc: &InMsg) -> (bool, Prod) {
    if inc.waiting_for_pool {
        return (false, Prod::KeepAlive);
    }
    match inc.first_gap(inc.granted) {
        Some((s, e)) => (true, Prod::Resend(s, e - s, inc.priority)),
        None => (false, Prod::KeepAlive),
    }
}

/// When the periodic timer next runs. Invariant: an endpoint with RPCs
/// always has a tick within one interval (creating an RPC arms it; a tick
/// with RPCs left sets the next one); without RPCs, the next tick is when a
/// peer or a tombstone is due to go, or never.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticker {
    /// The next tick (`Time::MAX`: none).
    next: Time,
    /// Between ticks while RPCs live: half the resend interval.
    interval: u64,
}

impl Ticker {
    pub fn new(config: &crate::Config) -> Ticker {
        Ticker {
            next: Time::MAX,
            interval: (config.effective_resend_interval_ns() / 2).max(1),
        }
    }

    /// An RPC exists from `now` on: a tick is due within one interval.
    #[inline]
    pub fn arm(&mut self, now: Time) {
        self.next = self.next.min(now.saturating_add(self.interval));
    }

    /// The next tick, if any.
    #[inline]
    pub fn deadline(&self) -> Time {
        self.next
    }

    /// Starts the tick due at `now`, if one is: true if it is.
    #[inline]
    pub fn start(&mut self, now: Time) -> bool {
        if now < self.next {
            return false;
        }
        self.next = Time::MAX;
        true
    }

    /// Ends a tick at `now`: the next comes one interval later if RPCs
    /// live (`busy`), else at `idle_until` (`Time::MAX`: never), but not
    /// before `now + 1`.
    pub fn finish(&mut self, now: Time, busy: bool, idle_until: Time) {
        self.next = if busy {
            now.saturating_add(self.interval)
        } else {
            idle_until.max(now + 1)
        };
    }

    /// No more ticks (the endpoint shut down).
    pub fn stop(&mut self) {
        self.next = Time::MAX;
    }
}

impl Endpoint {
    /// Runs timers due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        self.note_time(now);
        self.run_deferred(now);
        self.onramp_release(now);
        self.stream_timers(now);
        if !self.ticker.start(now) {
            return;
        }
        self.expire_tombstones(now);
        self.check_pool_waiters(now);
        // RESENDs due this tick, by peer: (last prod, rpc, what to ask). An
        // ordered map: simulations must send them in the same order every
        // run.
        let mut resends: BTreeMap<PeerKey, Vec<(Time, RpcKey, ControlBody)>> = BTreeMap::new();
        for key in 0..self.rpcs.key_end() {
            if self.rpcs.is_live(key) {
                self.rpc_timer(now, key, &mut resends);
            }
        }
        // Each peer's due RESENDs (the least recently prodded first), then
        // all of them shortest message first, within one budget of bytes
        // asked for: the answers arrive together, and a burst of
        // retransmissions larger than the downlink's queue (every sender of
        // an incast asked at the same tick) is lost again.
        let mut due_all: Vec<(u32, Time, RpcKey, ControlBody)> = Vec::new();
        for (_, mut due) in resends {
            if due.len() > RESENDS_PER_PEER_PER_TICK {
                due.select_nth_unstable_by_key(RESENDS_PER_PEER_PER_TICK, |(t, k, _)| (*t, *k));
                due.truncate(RESENDS_PER_PEER_PER_TICK);
            }
            for (t, key, body) in due {
                let left = self.rpcs[key]
                    .inc
                    .as_ref()
                    .map_or(0, |m| m.len - m.bytes_received);
                due_all.push((left, t, key, body));
            }
        }
        due_all.sort_unstable_by_key(|&(left, t, key, _)| (left, t, key));
        // Only gaps of messages being received count: a client's probe for
        // an overdue response asks for bytes that may not exist.
        let mut budget = self.derived.resend_budget();
        for (_, _, key, body) in due_all {
            let gaps = self.rpcs[key].inc.is_some();
            if gaps && budget == 0 {
                continue;
            }
            self.metrics.resends_sent += 1;
            self.rpcs[key].last_prod = now;
            let first = match body {
                ControlBody::Resend {
                    offset,
                    length,
                    priority,
                } => Some((offset, length, priority)),
                _ => None,
            };
            self.control_for(key, body);
            if let (true, Some((offset, length, priority))) = (gaps, first) {
                budget = budget.saturating_sub(length as u64);
                budget = self.resend_later_gaps(key, offset, priority, budget);
            }
        }
        let idle = self.config.peer_idle_ns;
        let gone: Vec<PeerKey> = self
            .peers
            .iter()
            .filter(|(_, p)| p.unreferenced() && now.saturating_sub(p.last_active) >= idle)
            .map(|(k, _)| k)
            .collect();
        for k in gone {
            self.peers.remove(k);
        }
        let busy = self.rpcs.clients() > 0 || self.rpcs.servers() > 0;
        let idle_until = if busy {
            Time::MAX
        } else {
            let peer_expiry = self
                .peers
                .iter()
                .filter(|(_, p)| p.unreferenced())
                .map(|(_, p)| p.last_active.saturating_add(idle))
                .min();
            let tomb_expiry = self.tombstones.front_expiry();
            match (peer_expiry, tomb_expiry) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => Time::MAX,
            }
        };
        self.ticker.finish(now, busy, idle_until);
    }

    /// After the RESEND for an incoming message's first gap (at `first`):
    /// one for each later gap below its grant, up to
    /// [`MAX_GAPS_PER_RESEND`] in all, as the Linux module does (not under
    /// `GrantPolicy::EveryMessage`, see `Derived::resend_every_gap`). Several
    /// packets lost from one burst (an incast's) are then all asked for in
    /// one interval instead of one interval each. Asks while `budget`
    /// (bytes) lasts and returns what is left of it.
    fn resend_later_gaps(&mut self, key: RpcKey, first: u32, priority: u8, budget: u64) -> u64 {
        let Some(inc) = self.rpcs[key].inc.as_ref() else {
            return budget;
        };
        if !self.derived.resend_every_gap() {
            return budget;
        }
        let later: SmallVec<[(u32, u32); MAX_GAPS_PER_RESEND]> = inc
            .gaps(inc.granted)
            .filter(|&(s, _)| s > first)
            .take(MAX_GAPS_PER_RESEND - 1)
            .collect();
        let mut left = budget;
        for (s, e) in later {
            if left == 0 {
                break;
            }
            left = left.saturating_sub((e - s) as u64);
            self.metrics.resends_sent += 1;
            self.control_for(
                key,
                ControlBody::Resend {
                    offset: s,
                    length: e - s,
                    priority,
                },
            );
        }
        left
    }

    /// The timer of one RPC: fails it on timeout, or prods its peer. A
    /// RESEND is not sent here but added to `resends` (see
    /// [`RESENDS_PER_PEER_PER_TICK`]).
    fn rpc_timer(
        &mut self,
        now: Time,
        key: RpcKey,
        resends: &mut BTreeMap<PeerKey, Vec<(Time, RpcKey, ControlBody)>>,
    ) {
        let resend = self.derived.resend_interval_ns();
        let unsched = self.derived.unsched_bytes();
        let top = self.derived.top_priority();
        let rpc = &self.rpcs[key];
        // A response that cannot get pool space hears from nobody but its own
        // application (which must release messages): after the RPC timeout
        // the caller gets an error instead of waiting forever. (A server's
        // request keeps waiting; its client sees BUSY and times out itself
        // if it is never served.)
        if let (true, Some(inc)) = (rpc.is_client, &rpc.inc) {
            if inc.waiting_for_pool
                && now.saturating_sub(inc.pool_wait_since) >= self.derived.rpc_timeout_ns()
            {
                self.metrics.pool_timeouts += 1;
                self.fail_client(now, key, crate::RpcError::PoolExhausted);
                return;
            }
        }
        let silent = now.saturating_sub(rpc.last_heard);
        let since_prod = now.saturating_sub(rpc.last_prod);
        // `waiting`: we expect something from the peer, so its silence counts.
        let (waiting, prod) = match (rpc.state, &rpc.inc, &rpc.out) {
            (RpcState::ClientActive, Some(inc), _) | (RpcState::ServerReceiving, Some(inc), _) => {
                incoming_prod(inc)
            }
            (RpcState::ClientActive, None, Some(out)) => {
                if out.sendable() {
                    (false, Prod::Nothing)
                } else {
                    // Request sent as far as allowed; the response (or a grant)
                    // is overdue. The server resends what it has, answers BUSY,
                    // or says it never heard of us.
                    (true, Prod::Resend(0, unsched, top))
                }
            }
            (RpcState::ServerResponding, _, Some(out)) => {
                if out.fully_sent() {
                    (true, Prod::NeedAck)
                } else if out.sendable() {
                    (false, Prod::Nothing)
                } else {
                    // Waiting for grants; the client drives recovery.
                    (true, Prod::Nothing)
                }
            }
            _ => (false, Prod::Nothing),
        };
        if waiting && silent >= self.derived.rpc_timeout_ns() {
            self.metrics.timeouts += 1;
            if rpc.is_client {
                self.fail_client(now, key, crate::RpcError::Timeout);
            } else {
                self.free_rpc(now, key);
            }
            return;
        }
        let body = match prod {
            Prod::Nothing => return,
            Prod::Resend(offset, length, priority) => {
                // After BUSY the peer is known to be alive and merely behind:
                // ask ten times less often.
                let mut interval = if rpc.peer_busy { 10 * resend } else { resend };
                // A server that keeps refusing the request (limits) is asked
                // exponentially less often until the RPC times out.
                interval = interval.saturating_mul(1 << rpc.restarts.min(10));
                if silent < interval || since_prod < interval {
                    return;
                }
                let body = ControlBody::Resend {
                    offset,
                    length,
                    priority,
                };
                resends
                    .entry(rpc.peer_key)
                    .or_default()
                    .push((rpc.last_prod, key, body));
                return;
            }
            Prod::NeedAck => {
                // Asked again at doubling silences (1, 2, 4... resend
                // intervals): a live client answers the first (or its next
                // request carries the ack), so only a departed one hears
                // the rest, ~log2(rpc_timeout / resend) of them instead of
                // one per interval until the timeout.
                if silent < resend || since_prod < resend.max(silent / 2) {
                    return;
                }
                ControlBody::NeedAck
            }
            Prod::KeepAlive => {
                if since_prod < self.derived.keepalive_ns() {
                    return;
                }
                ControlBody::Busy
            }
        };
        self.rpcs[key].last_prod = now;
        self.control_for(key, body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_come_an_interval_after_work_and_never_when_idle() {
        let config = crate::Config {
            resend_interval_ns: Some(1_000),
            ..crate::Config::default()
        };
        let mut t = Ticker::new(&config);
        assert_eq!(t.deadline(), Time::MAX);
        assert!(!t.start(1_000_000));
        // The first RPC arms it; later ones do not push it back.
        t.arm(100);
        t.arm(300);
        assert_eq!(t.deadline(), 600);
        assert!(!t.start(599));
        assert!(t.start(600));
        assert_eq!(t.deadline(), Time::MAX, "no tick while one runs");
        t.finish(600, true, Time::MAX);
        assert_eq!(t.deadline(), 1_100);
        assert!(t.start(5_000), "a late tick still runs");
        // Idle: the next expiry, at least a nanosecond on, or never.
        t.finish(5_000, false, 9_000);
        assert_eq!(t.deadline(), 9_000);
        assert!(t.start(9_000));
        t.finish(9_000, false, 8_000);
        assert_eq!(t.deadline(), 9_001);
        assert!(t.start(9_001));
        t.finish(9_001, false, Time::MAX);
        assert_eq!(t.deadline(), Time::MAX);
        t.arm(10_000);
        t.stop();
        assert_eq!(t.deadline(), Time::MAX);
    }
}
