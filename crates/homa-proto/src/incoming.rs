//! Receiver side: DATA packets, pool reservation, delivery, and grants (SRPT
//! with controlled overcommitment and rank-based scheduled priorities, or
//! BasicTransport's grant to every message).

use crate::endpoint::{
    Control, ControlBody, Endpoint, Event, RpcError, RpcId, ServerEntry, ServerRpc,
};
use crate::metrics::DropReason;
use crate::partial::PartialMessage;
use crate::peer::{PeerKey, ServerKey};
use crate::rpc::{InMsg, RpcKey, RpcState};
use crate::time::Time;
use crate::wire::{CommonHeader, DataHeader, MAX_ACKS_PER_PACKET};
use std::collections::VecDeque;
use std::net::SocketAddr;

/// A DATA packet's payload as the engine gets it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum DataPayload<'a> {
    /// In the datagram: the engine copies it into the pool.
    Bytes(&'a [u8]),
    /// Already in its place in the pool, this many bytes (the driver had the
    /// kernel write it there: `Endpoint::landing_site`).
    Landed(usize),
}

impl DataPayload<'_> {
    fn len(self) -> usize {
        match self {
            DataPayload::Bytes(b) => b.len(),
            DataPayload::Landed(n) => n,
        }
    }
    fn filter(self, f: impl FnOnce(&[u8]) -> bool) -> Option<Self> {
        match self {
            DataPayload::Bytes(b) if f(b) => Some(self),
            _ => None,
        }
    }
}

impl Endpoint {
    pub(crate) fn handle_data(
        &mut self,
        now: Time,
        from: SocketAddr,
        pk: Option<PeerKey>,
        c: &CommonHeader,
        h: &DataHeader,
        payload: DataPayload<'_>,
    ) {
        self.note_message_arrival(now, h.message_length);
        // A piggybacked ACK counts even if this packet itself is refused: the
        // client has already let go of it.
        if c.from_client && h.ack != 0 && h.ack != c.rpc_id {
            if let Some(pk) = pk {
                if self.config.defer_acks {
                    // Applied after the reply has gone out (`Deferred`).
                    self.defer_ack(now, from, h.ack);
                } else {
                    self.handle_ack_id(now, pk, h.ack);
                }
            }
        }
        let key = if c.from_client {
            let entry = pk.and_then(|peer| {
                let sk = ServerKey { peer, id: c.rpc_id };
                self.server_ids.get(sk)
            });
            match entry {
                Some(ServerEntry::Live(k)) => k,
                Some(ServerEntry::Tomb(_)) => {
                    self.hit_tombstone(now, pk, c.rpc_id);
                    self.metrics.drop(DropReason::Tombstone);
                    return;
                }
                None => match self.new_server_rpc(now, from, pk, c, h) {
                    Some(k) => k,
                    None => return,
                },
            }
        } else {
            match self.lookup(pk, c) {
                Some(k) => k,
                None => {
                    self.metrics.drop(DropReason::UnknownRpc);
                    return;
                }
            }
        };
        crate::trace_point!("engine: rpc found");
        if h.cutoff_version != self.derived.cutoff_version() {
            let pk = self.rpcs[key].peer_key;
            self.maybe_send_cutoffs(now, from, pk, c);
        }
        let rpc = &mut self.rpcs[key];
        rpc.heard(now);
        if rpc.inc.is_none() {
            let receiving = match rpc.state {
                RpcState::ClientActive => true,
                RpcState::ServerReceiving => true,
                RpcState::ServerInService | RpcState::ServerResponding => false,
            };
            if !receiving {
                self.metrics.drop(DropReason::Duplicate);
                return;
            }
            if h.message_length > self.derived.max_message_length() {
                // Only a client gets here (servers check before creating the RPC).
                self.metrics.drop(DropReason::MessageTooLong);
                self.fail_client(now, key, RpcError::ResponseTooLong);
                return;
            }
            let rpc = &mut self.rpcs[key];
            rpc.restarts = 0;
            if rpc.is_client {
                // The server has all of our request: stop sending it.
                if let Some(out) = rpc.out.as_mut() {
                    out.clear_retx();
                }
                self.unqueue_out(key);
            }
            // A whole message in one packet (every short message): straight
            // into the pool and out, with no reassembly state at all.
            if let Some(DataPayload::Bytes(payload)) = payload
                .filter(|p| h.offset == 0 && p.len() as u32 == h.message_length && !p.is_empty())
            {
                let copy = !self.derived.discard_payload();
                if let Some(message) = self.pool.message_from(payload, copy) {
                    crate::trace_point!("engine: payload written");
                    self.metrics.data_bytes_received += payload.len() as u64;
                    self.grants.unsettle();
                    self.deliver(now, key, Some(message));
                    return;
                }
                // No room: the general path below waits for the pool.
            }
            let priority = self.derived.unsched_level(h.message_length);
            let rpc = &mut self.rpcs[key];
            rpc.inc = Some(InMsg::new(h.message_length, h.unsched_bytes, priority));
        }
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        let inc = rpc.inc.as_mut().unwrap();
        if inc.len != h.message_length {
            self.metrics.drop(DropReason::InconsistentLength);
            return;
        }
        if inc.alloc.is_none() {
            if inc.waiting_for_pool {
                self.metrics.drop(DropReason::PoolExhausted);
                return;
            }
            match self.pool.allocate(inc.len as usize) {
                Some(a) => {
                    inc.alloc = Some(a);
                    self.after_alloc(key);
                    crate::trace_point!("engine: pool allocated");
                }
                None => {
                    inc.waiting_for_pool = true;
                    inc.pool_wait_since = now;
                    self.pool_waiters.add((inc.len, birth, key));
                    self.metrics.pool_waits += 1;
                    self.metrics.drop(DropReason::PoolExhausted);
                    return;
                }
            }
            if h.message_length == 0 {
                self.finish_incoming(now, key);
                return;
            }
        }
        let rpc = &mut self.rpcs[key];
        let inc = rpc.inc.as_mut().unwrap();
        if inc.complete() {
            self.metrics.drop(DropReason::Duplicate);
            return;
        }
        let start = h.offset;
        let end = start + payload.len() as u32;
        // A partial message's readable prefix is never written again (its
        // reader may be reading it): a packet overlapping it writes only
        // what lies beyond.
        let prefix = inc.partial.as_ref().map(|_| inc.received.prefix());
        let old_remaining = inc.len - inc.bytes_received;
        let old_owed = inc.owed();
        let new = match inc.received.insert(start, end) {
            None => {
                self.metrics.drop(DropReason::Unexpected);
                return;
            }
            Some(0) => {
                self.metrics.drop(DropReason::Duplicate);
                return;
            }
            Some(n) => n,
        };
        if let DataPayload::Bytes(payload) = payload {
            if !self.derived.discard_payload() {
                let alloc = inc.alloc.as_ref().unwrap();
                match prefix {
                    None => self.pool.write(alloc, start as usize, payload),
                    Some(p) => {
                        let skip = p.saturating_sub(start).min(end - start);
                        self.pool
                            .write(alloc, (start + skip) as usize, &payload[skip as usize..]);
                    }
                }
            }
        }
        crate::trace_point!("engine: payload written");
        if let Some(old) = prefix {
            publish_partial(inc, &mut self.events, old);
        }
        inc.bytes_received += new;
        self.grants.unsettle();
        self.metrics.data_bytes_received += new as u64;
        self.grants.track(old_owed, inc.owed());
        if inc.complete() {
            self.finish_incoming(now, key);
            return;
        }
        if let Some(increment) = self.grants.every_message() {
            // BasicTransport's rule: this message alone, O(1).
            let (received, granted, len) = (inc.bytes_received, inc.granted, inc.len);
            let pk = rpc.peer_key;
            let window = self.grant_window_of(pk);
            if let Some(target) = self
                .grants
                .every_message_grant(window, increment, received, granted, len)
            {
                self.raise_grant(key, target, 0);
            }
            return;
        }
        if let Some(remaining) = inc.grant_key {
            debug_assert_eq!(remaining, old_remaining);
            let new_remaining = inc.len - inc.bytes_received;
            inc.grant_key = Some(new_remaining);
            self.grants.requeue(remaining, birth, key, new_remaining);
        }
        // New data may have moved this message in the SRPT order or freed room
        // under `max_incoming` for another one.
        if self.grants.pass_now() && self.grants.any_grantable() {
            self.update_grants(now);
        }
    }

    /// Creates a server RPC for the first DATA packet of a request (which
    /// has neither an RPC nor a tombstone here), within the limits. None (and
    /// a counted drop) if the packet must be ignored.
    fn new_server_rpc(
        &mut self,
        now: Time,
        from: SocketAddr,
        known: Option<PeerKey>,
        c: &CommonHeader,
        h: &DataHeader,
    ) -> Option<RpcKey> {
        let mut pk = None;
        // A held-back acknowledgement may free the room a limit needs.
        if self.has_deferred()
            && (self.derived.server_rpcs_full(self.rpcs.servers())
                || (known.is_none() && self.peers.len() >= self.config.max_peers)
                || known.is_some_and(|k| {
                    self.derived
                        .peer_server_rpcs_full(self.peers[k].server_rpcs as usize)
                }))
        {
            self.run_deferred(now);
        }
        let reason = if h.message_length > self.derived.max_message_length() {
            Some(DropReason::MessageTooLong)
        } else if self.derived.server_rpcs_full(self.rpcs.servers()) {
            Some(DropReason::TooManyRpcs)
        } else {
            pk = known.or_else(|| self.ensure_peer(now, from));
            match pk {
                None => Some(DropReason::TooManyPeers),
                Some(k)
                    if self
                        .derived
                        .peer_server_rpcs_full(self.peers[k].server_rpcs as usize) =>
                {
                    Some(DropReason::TooManyRpcs)
                }
                Some(_) => None,
            }
        };
        if let Some(r) = reason {
            self.metrics.drop(r);
            return None;
        }
        let pk = pk.unwrap();
        let peer = &mut self.peers[pk];
        if !peer.has_echo() {
            // A new peer (a known one was observed in `packet_peer`).
            let sample = peer.observe(now, c.send_time, c.echo_time);
            if let Some(rtt) = sample.filter(|_| self.derived.measure_rtt()) {
                self.rtt_sample(now, pk, rtt);
            }
        }
        let key = self.insert_rpc(now, false, c.rpc_id, from, pk, RpcState::ServerReceiving);
        let sk = ServerKey {
            peer: pk,
            id: c.rpc_id,
        };
        self.server_ids.set(sk, ServerEntry::Live(key));
        Some(key)
    }

    fn maybe_send_cutoffs(&mut self, now: Time, from: SocketAddr, pk: PeerKey, c: &CommonHeader) {
        let interval = self.derived.resend_interval_ns();
        let peer = self.peers.info_mut(pk);
        if peer.cutoffs_sent_at.is_some_and(|t| now < t + interval) {
            return;
        }
        peer.cutoffs_sent_at = Some(now);
        self.queue_control(Control {
            dest: from,
            rpc_id: c.rpc_id,
            from_client: !c.from_client,
            body: ControlBody::Cutoffs,
        });
    }

    /// A message just got its pool space: start granting if it needs grants.
    fn after_alloc(&mut self, key: RpcKey) {
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        let inc = rpc.inc.as_mut().unwrap();
        self.grants.add(inc.owed());
        self.grants.unsettle();
        // Under `GrantPolicy::EveryMessage` no message is ranked: each is
        // granted as its own packets arrive (`handle_data`).
        if inc.granted < inc.len && inc.grant_key.is_none() && self.grants.every_message().is_none()
        {
            let remaining = inc.len - inc.bytes_received;
            inc.grant_key = Some(remaining);
            self.grants.enqueue(remaining, birth, key);
        }
        self.start_partial(key);
    }

    #[inline]
    fn remove_from_grantable(&mut self, key: RpcKey) {
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        if let Some(inc) = rpc.inc.as_mut() {
            if let Some(remaining) = inc.grant_key.take() {
                self.grants.dequeue(remaining, birth, key);
                self.grants.unsettle();
            }
        }
    }

    /// Drops RPC `key`'s incoming message (if any) and returns its pool space.
    pub(crate) fn remove_incoming(&mut self, key: RpcKey) {
        self.remove_from_grantable(key);
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        if let Some(inc) = rpc.inc.take() {
            self.grants.unsettle();
            if let Some((progress, serial)) = &inc.partial {
                progress.fail();
                self.events
                    .push_back(Event::PartialProgress { serial: *serial });
            }
            if inc.waiting_for_pool {
                self.pool_waiters.remove(&(inc.len, birth, key));
            }
            if inc.alloc.is_some() {
                // Only a message with pool space was counted (`after_alloc`).
                self.grants.remove(inc.owed());
            }
            if let Some(alloc) = inc.alloc {
                self.pool.release(alloc);
            }
        }
    }

    /// A message is complete: hand it to the application.
    fn finish_incoming(&mut self, now: Time, key: RpcKey) {
        self.remove_from_grantable(key);
        let rpc = &mut self.rpcs[key];
        // Take only what is needed; dropping the rest in place spares
        // copying the whole (112-byte) InMsg out.
        let inc = rpc.inc.as_mut().unwrap();
        self.grants.remove(inc.owed());
        self.grants.unsettle();
        if let Some((progress, serial)) = inc.partial.take() {
            // Its reader has the bytes already; the engine's allocation goes.
            let len = inc.len as usize;
            rpc.inc = None;
            progress.complete(len);
            self.events.push_back(Event::PartialProgress { serial });
            self.deliver(now, key, None);
            return;
        }
        let message = self.pool.take_message(inc.alloc.as_mut().unwrap());
        rpc.inc = None;
        self.deliver(now, key, Some(message));
    }

    /// Hands RPC `key`'s message to the application as a
    /// [`PartialMessage`] if it is to be delivered incrementally (a client
    /// that asked for it, or a request of at least
    /// `Config::partial_delivery_bytes`) and has not been yet. Its pool
    /// space must be allocated.
    pub(crate) fn start_partial(&mut self, key: RpcKey) {
        let rpc = &mut self.rpcs[key];
        let Some(inc) = rpc.inc.as_mut() else { return };
        let wanted = if rpc.is_client {
            rpc.partial_response
        } else {
            inc.len >= self.config.partial_delivery_bytes
        };
        if !wanted || inc.partial.is_some() {
            return;
        }
        let serial = self.next_partial_serial;
        self.next_partial_serial += 1;
        let shared = self.pool.share(inc.alloc.as_ref().expect("allocated"));
        let (message, progress) = PartialMessage::start(shared, serial);
        progress.advance(inc.received.prefix() as usize);
        inc.partial = Some((progress, serial));
        let (id, peer) = (rpc.id, rpc.peer);
        self.events.push_back(if rpc.is_client {
            Event::PartialResponse {
                id: RpcId(id),
                message,
            }
        } else {
            Event::PartialRequest {
                rpc: ServerRpc { peer, id },
                message,
            }
        });
    }

    /// Hands RPC `key`'s complete incoming message to the application (its
    /// reassembly state, if it had any, is gone already); `None` for a
    /// partial message, whose reader has it already.
    fn deliver(&mut self, now: Time, key: RpcKey, message: Option<crate::pool::Message>) {
        let rpc = &mut self.rpcs[key];
        if rpc.is_client {
            let (id, peer, pk) = (rpc.id, rpc.peer, rpc.peer_key);
            // A request sent from a send buffer frees at once: the buffer is
            // the application's again as soon as its RPC is over.
            let leased = rpc.out.as_ref().is_some_and(|o| o.data.lease().is_some());
            if let Some(message) = message {
                self.events.push_back(if rpc.partial_response {
                    let serial = self.next_partial_serial;
                    self.next_partial_serial += 1;
                    Event::PartialResponse {
                        id: RpcId(id),
                        message: PartialMessage::whole(message, serial),
                    }
                } else {
                    Event::Response {
                        id: RpcId(id),
                        message,
                    }
                });
            }
            self.metrics.responses_delivered += 1;
            if self.config.defer_acks && !leased {
                self.defer_free(now, key);
            } else {
                self.free_rpc(now, key);
            }
            // The peer outlives the RPC: only the timer or a full table
            // evicts peers, never `free_rpc`.
            {
                let p = &mut self.peers[pk];
                p.pending_acks.push(id);
                if p.pending_acks.len() >= MAX_ACKS_PER_PACKET {
                    let ids = std::mem::take(&mut p.pending_acks);
                    self.queue_control(Control {
                        dest: peer,
                        rpc_id: id,
                        from_client: true,
                        body: ControlBody::Ack(ids),
                    });
                }
            }
        } else {
            rpc.state = RpcState::ServerInService;
            let handle = ServerRpc {
                peer: rpc.peer,
                id: rpc.id,
            };
            self.rpcs.set_latest_request(key);
            if let Some(message) = message {
                self.events.push_back(
                    if message.len() as u64 >= self.config.partial_delivery_bytes as u64 {
                        let serial = self.next_partial_serial;
                        self.next_partial_serial += 1;
                        Event::PartialRequest {
                            rpc: handle,
                            message: PartialMessage::whole(message, serial),
                        }
                    } else {
                        Event::Request {
                            rpc: handle,
                            message,
                        }
                    },
                );
            }
            self.metrics.requests_delivered += 1;
            self.update_grants(now);
        }
    }

    /// Fails a client RPC and forgets it.
    pub(crate) fn fail_client(&mut self, now: Time, key: RpcKey, error: RpcError) {
        let id = self.rpcs[key].id;
        self.events.push_back(Event::Failed {
            id: RpcId(id),
            error,
        });
        self.metrics.rpcs_failed += 1;
        self.free_rpc(now, key);
    }

    /// Issues grants: the `max_overcommit` messages with the fewest remaining
    /// bytes may each have `grant_window` bytes in flight beyond what has
    /// arrived, subject to the `max_incoming` cap; the shortest gets the highest
    /// scheduled priority. When fewer messages than scheduled levels are active
    /// they use the lowest levels, leaving the higher ones for shorter newcomers.
    ///
    /// Returns whether it granted anything. A pass that grants nothing
    /// changes nothing that a second pass reads (at most it zeroes the FIFO
    /// credit, which a second pass would zero again), so until something
    /// else changes (see `Grants::is_settled`) another pass would do nothing.
    pub(crate) fn update_grants(&mut self, _now: Time) -> bool {
        if self.onramp.grants_held() {
            // On-Ramp holds our grants (`onramp_inbound`); the pass is owed
            // (still unsettled) and runs at the release.
            return false;
        }
        if !self.grants.any_grantable() {
            self.grants.settle(false);
            return false;
        }
        let mut any = false;
        let k = self.config.max_overcommit;
        let top = self.grants.take_top(k);
        let n = top.len();
        if self.derived.adaptive() {
            let widest = top
                .iter()
                .map(|&key| self.grant_window_of(self.rpcs[key].peer_key))
                .max()
                .unwrap_or(0);
            self.grants.cap_for_window(widest);
            if self.grants.budget() > 0 {
                let pipe = self.pipe_of(&top);
                self.grants.cap_for_budget(pipe);
            }
        }
        let competing = self.grants.grantable() > k;
        // Under a downlink budget every grant goes at the top scheduled
        // level: the budget keeps the downlink queue short, so SRPT is the
        // order of the grants themselves; with a level per rank, bytes
        // granted to a message at a low level wait behind every later,
        // shorter message's for as long as those keep coming (a whole
        // incast), past the resend interval, and their resends then
        // duplicate them in the queue (docs/congestion.md §9).
        let one_level = self.grants.budget() > 0;
        let top_level = self.grants.sched_top();
        let fifo_level = if one_level { top_level } else { 0 };
        for (rank, &key) in top.iter().enumerate() {
            let level = if one_level {
                top_level
            } else {
                self.grants.level(rank, n)
            };
            let lead = if rank == 0 {
                self.grants.lead_extra()
            } else {
                0
            };
            let granted = self.grant_one(key, level, false, lead);
            any |= granted > 0;
            if competing {
                // Credit accrues only while some message is left out.
                self.grants.accrue_fifo(granted as u64);
            }
        }
        // Messages granted in full above have left the queue: count again.
        if self.grants.fifo_due() && self.grants.grantable() > k {
            let oldest = self.grants.oldest().unwrap();
            let idle = self
                .rpcs
                .get(oldest)
                .and_then(|r| r.inc.as_ref())
                .is_some_and(|m| m.outstanding() == 0);
            if top.contains(&oldest) {
                // The oldest is already being served; don't let credit pile up.
                self.grants.clear_fifo();
            } else if idle && self.grant_one(oldest, fifo_level, true, 0) > 0 {
                self.grants.spend_fifo();
                any = true;
            }
        }
        self.grants.return_top(top);
        self.grants.settle(any);
        any
    }

    /// The bytes the messages `top` (SRPT order) keep on their paths
    /// rather than in the queue at our downlink, under the downlink budget:
    /// in rank order, each message takes the share of the link its window
    /// (or its remaining bytes, if fewer) fills over its peer's
    /// bandwidth-delay product, until the shares make the whole link; its
    /// pipe is that share of its BDP. One near message with a full window
    /// fills the link with one near BDP, and every byte granted beyond it
    /// to others waits in the queue; a far message's pipe is its longer BDP.
    fn pipe_of(&self, top: &[RpcKey]) -> u64 {
        const ONE: u64 = 1 << 16;
        let params = self.derived.windows();
        let mut left = ONE;
        let mut pipe = 0u64;
        for &key in top {
            if left == 0 {
                break;
            }
            let rpc = &self.rpcs[key];
            let Some(inc) = rpc.inc.as_ref() else {
                continue;
            };
            let pk = rpc.peer_key;
            let bdp = match self.peers.path(pk).rtt.min() {
                Some(m) => params.bdp(m),
                None => params.static_grant(),
            } as u64;
            let need = (self.grant_window_of(pk) as u64)
                .min((inc.len - inc.bytes_received) as u64)
                .min(bdp);
            let share = (need * ONE / bdp.max(1)).min(left);
            pipe += share * bdp / ONE;
            left -= share;
        }
        pipe
    }

    /// Raises one message's grant by up to a window; returns the bytes granted.
    /// Changes nothing when it returns 0 (see `update_grants`).
    /// `lead`: bytes of window beyond the message's own (the receiver's
    /// top-ranked message, `Config::lead_window_packets`).
    fn grant_one(&mut self, key: RpcKey, priority: u8, fifo: bool, lead: u32) -> u32 {
        let dpp = self.derived.data_per_packet();
        let own_window = if self.derived.adaptive() {
            self.grant_window_of(self.rpcs[key].peer_key)
        } else {
            self.grants.window()
        };
        let window = own_window.saturating_add(lead);
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        let inc = rpc.inc.as_mut().unwrap();
        let base = if fifo {
            inc.granted
        } else {
            inc.bytes_received
        };
        let Some(target) = self
            .grants
            .next_grant(window, base, inc.granted, inc.len, dpp, fifo)
        else {
            return 0;
        };
        // Boost the tail: a message with little left to grant goes at least
        // at the unscheduled level of a message of that size.
        let to_grant = inc.len - inc.granted;
        let priority = if self.grants.boosts(to_grant) {
            priority.max(self.derived.unsched_level(to_grant))
        } else {
            priority
        };
        // A message's last window goes at the level kept for it, if any
        // (FIFO grants keep theirs: they serve the oldest, not the nearly
        // done).
        let priority = if fifo {
            priority
        } else {
            self.grants.tail_or(priority, inc.len - target, own_window)
        };
        if target >= inc.len {
            let remaining = inc.grant_key.take().unwrap();
            self.grants.dequeue(remaining, birth, key);
        }
        self.raise_grant(key, target, priority)
    }

    /// Sets message `key`'s grant to `target` (above its current one) and
    /// its scheduled priority, and queues its GRANT; returns the bytes
    /// granted.
    #[inline]
    fn raise_grant(&mut self, key: RpcKey, target: u32, priority: u8) -> u32 {
        let inc = self.rpcs[key].inc.as_mut().unwrap();
        let delta = target - inc.granted;
        let old = inc.owed();
        inc.granted = target;
        inc.priority = priority;
        self.grants.track(old, inc.owed());
        self.metrics.granted_bytes += delta as u64;
        // One GRANT in the queue per message at a time: it carries whatever
        // the grant is when it is sent, so a burst of arrivals (a GRO batch)
        // costs one GRANT, not one per packet.
        if !inc.grant_queued {
            if self.control.has_room() {
                inc.grant_queued = true;
                self.control_for(key, ControlBody::GrantFor(key));
            } else {
                self.metrics.control_dropped += 1;
            }
        }
        delta
    }

    /// Gives freed pool space to waiting messages, shortest first, and asks
    /// their senders to start again from the beginning.
    pub(crate) fn check_pool_waiters(&mut self, now: Time) {
        while let Some(((len, _, key), alloc)) = self.pool_waiters.admit(&mut self.pool) {
            let rpc = &mut self.rpcs[key];
            rpc.last_heard = now;
            rpc.last_prod = now;
            let inc = rpc.inc.as_mut().unwrap();
            inc.waiting_for_pool = false;
            self.grants.unsettle();
            inc.alloc = Some(alloc);
            inc.received.clear();
            inc.bytes_received = 0;
            inc.granted = inc.unsched;
            let (length, priority) = (inc.unsched, inc.priority);
            self.after_alloc(key);
            if len == 0 {
                self.finish_incoming(now, key);
                continue;
            }
            self.control_for(
                key,
                ControlBody::Resend {
                    offset: 0,
                    length: length.max(1),
                    priority,
                },
            );
            self.update_grants(now);
        }
    }
}

/// A packet of partial message `inc` was written: publish the readable
/// prefix if it grew past `old` (the completing packet publishes in
/// `finish_incoming`). Out of line: whole messages never come here.
#[cold]
fn publish_partial(inc: &mut InMsg, events: &mut VecDeque<Event>, old: u32) {
    let now_readable = inc.received.prefix();
    if let Some((progress, serial)) = inc.partial.as_ref() {
        if now_readable > old && now_readable < inc.len {
            progress.advance(now_readable as usize);
            events.push_back(Event::PartialProgress { serial: *serial });
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::endpoint::{Endpoint, Event, RpcId};
    use crate::time::Time;
    use bytes::Bytes;
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    /// `Grants::is_settled` promises that a grant pass would do nothing: check
    /// that promise after every call into the endpoints, in traffic that
    /// keeps several messages competing for grants under a small
    /// `max_incoming`, with losses (resends, timeouts), cancelled client
    /// RPCs and abandoned requests.
    #[test]
    fn a_settled_grant_pass_grants_nothing() {
        settled_passes_grant_nothing(base_config(), false);
    }

    /// The same with adaptive windows, whose grant windows and cap change
    /// with each peer's RTT samples, on a network whose delay jumps (so
    /// that windows move and peers become congested), with the cap fixed
    /// and derived from the windows.
    #[test]
    fn a_settled_grant_pass_grants_nothing_with_adaptive_windows() {
        let config = Config {
            window_policy: crate::config::WindowPolicy::Adaptive,
            ..base_config()
        };
        settled_passes_grant_nothing(config.clone(), true);
        settled_passes_grant_nothing(
            Config {
                max_incoming: None,
                ..config
            },
            true,
        );
    }

    fn base_config() -> Config {
        Config {
            link_bps: 10_000_000_000,
            rtt_ns: 8_000,
            max_overcommit: 2,
            max_incoming: Some(40_000),
            grant_fifo_permille: 200,
            resend_interval_ns: Some(50_000),
            checksum: false,
            ..Config::default()
        }
    }

    /// Random traffic among four endpoints (see above); with `jitter`, one
    /// packet in eight takes 20 µs longer than the usual 2 µs.
    fn settled_passes_grant_nothing(config: Config, jitter: bool) {
        let n = 4;
        let addrs: Vec<SocketAddr> = (0..n)
            .map(|i| SocketAddr::from(([10, 0, 0, i as u8 + 1], 4000)))
            .collect();
        let mut eps: Vec<Endpoint> = (0..n)
            .map(|i| {
                let c = Config {
                    rpc_id_seed: i as u64 + 7,
                    ..config.clone()
                };
                Endpoint::new(c, 0).unwrap()
            })
            .collect();
        let mut rng = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let check = |ep: &mut Endpoint, now: Time, checks: &mut u64| {
            if ep.grants.is_settled() {
                *checks += 1;
                assert!(!ep.update_grants(now), "a settled grant pass granted");
            }
        };
        let mut flight: BTreeMap<(Time, u64), (usize, usize, Vec<u8>)> = BTreeMap::new();
        let mut live: Vec<Vec<RpcId>> = vec![Vec::new(); n];
        let (mut seq, mut checks, mut cancels) = (0u64, 0u64, 0u64);
        let mut buf = Vec::new();
        for step in 0..4_500u64 {
            let now = step * 1_000;
            // New requests of 10-150 KB, mostly to host 0.
            if step < 3_000 && next() % 4 == 0 {
                let src = 1 + (next() % (n as u64 - 1)) as usize;
                let dst = if next() % 4 == 0 {
                    (src % (n - 1)) + 1
                } else {
                    0
                };
                let len = 10_000 + (next() % 140_000) as usize;
                let id = eps[src]
                    .send_request(now, addrs[dst], Bytes::from(vec![0u8; len]))
                    .unwrap();
                live[src].push(id);
                check(&mut eps[src], now, &mut checks);
            }
            // Now and then a client gives up on one of its RPCs.
            if next() % 16 == 0 {
                let h = (next() % n as u64) as usize;
                if !live[h].is_empty() {
                    let i = (next() % live[h].len() as u64) as usize;
                    let id = live[h].swap_remove(i);
                    eps[h].cancel(id);
                    cancels += 1;
                    check(&mut eps[h], now, &mut checks);
                }
            }
            while let Some(e) = flight.first_entry() {
                if e.key().0 > now {
                    break;
                }
                let (dst, src, data) = e.remove();
                eps[dst].handle_datagram(now, addrs[src], &data);
                check(&mut eps[dst], now, &mut checks);
            }
            for h in 0..n {
                if eps[h].poll_timeout().is_some_and(|t| t <= now) {
                    eps[h].handle_timeout(now);
                    check(&mut eps[h], now, &mut checks);
                }
                while let Some(ev) = eps[h].poll_event() {
                    match ev {
                        // Answer two requests in three (a short response),
                        // abandon the rest.
                        Event::Request { rpc, .. } => {
                            if next() % 3 == 0 {
                                eps[h].abandon(rpc);
                            } else {
                                let _ =
                                    eps[h].send_response(now, rpc, Bytes::from_static(&[1; 100]));
                            }
                        }
                        Event::Response { id, .. } | Event::Failed { id, .. } => {
                            live[h].retain(|&x| x != id);
                        }
                        ev => panic!("not asked for: {ev:?}"),
                    }
                    check(&mut eps[h], now, &mut checks);
                }
                while let Some(t) = eps[h].poll_transmit(now, &mut buf) {
                    seq += 1;
                    let dst = addrs.iter().position(|a| *a == t.dest).unwrap();
                    if next() % 50 != 0 {
                        let delay = if jitter && next() % 8 == 0 {
                            22_000
                        } else {
                            2_000
                        };
                        flight.insert((now + delay, seq), (dst, h, buf[..t.len].to_vec()));
                    }
                }
                check(&mut eps[h], now, &mut checks);
            }
        }
        let granted: u64 = eps.iter().map(|e| e.metrics.grants_sent).sum();
        let delivered: u64 = eps.iter().map(|e| e.metrics.requests_delivered).sum();
        assert!(
            granted > 1_000 && delivered > 200 && cancels > 50,
            "{granted} {delivered} {cancels}"
        );
        assert!(checks > 10_000, "{checks}");
        if config.window_policy == crate::config::WindowPolicy::Adaptive {
            let onsets: u64 = eps.iter().map(|e| e.metrics.congestion_onsets).sum();
            let cuts: u64 = eps.iter().map(|e| e.metrics.unsched_window_cuts).sum();
            assert!(onsets > 10 && cuts > 10, "{onsets} {cuts}");
        }
    }
}
