//! Sender side: SRPT transmit order, the NIC queue estimator (pacer), grants
//! received, and retransmission on RESEND.

use crate::endpoint::{ControlBody, Endpoint, Time, Transmit};
use crate::metrics::DropReason;
use crate::peer::PeerKey;
use crate::rpc::RpcKey;
use crate::wire::{self, Body, CommonHeader, DataHeader, PacketType};
use std::net::SocketAddr;

impl Endpoint {
    /// Puts RPC `key`'s outgoing message into the SRPT sets if it has bytes to
    /// send, or takes it out if not, keyed by its current remaining bytes.
    pub(crate) fn requeue_out(&mut self, key: RpcKey) {
        self.unqueue_out(key);
        let rpc = self.rpcs[key as usize].as_mut().unwrap();
        let birth = rpc.birth;
        if let Some(out) = rpc.out.as_mut() {
            if out.sendable() {
                out.queued = Some(out.remaining());
                self.sendable.insert((out.remaining(), birth, key));
                self.sendable_by_age.insert((birth, key));
            }
        }
    }

    pub(crate) fn unqueue_out(&mut self, key: RpcKey) {
        let rpc = self.rpcs[key as usize].as_mut().unwrap();
        let birth = rpc.birth;
        if let Some(out) = rpc.out.as_mut() {
            if let Some(remaining) = out.queued.take() {
                self.sendable.remove(&(remaining, birth, key));
                self.sendable_by_age.remove(&(birth, key));
            }
        }
    }

    /// Writes the next datagram to send into `buf` (cleared first), or returns
    /// `None` if nothing may be sent now (call again after [`Self::poll_timeout`]
    /// or any other input).
    ///
    /// Control packets go first and bypass the queue limit. Data packets are
    /// released only while the estimated NIC queue is at most
    /// `max_nic_queue_ns`, except for messages short enough to bypass it:
    /// retransmissions first, then the message with the fewest remaining bytes
    /// (or, for `pacer_fifo_permille` of the bytes, the oldest message).
    pub fn poll_transmit(&mut self, now: Time, buf: &mut Vec<u8>) -> Option<Transmit> {
        buf.clear();
        while let Some(mut c) = self.control.pop_front() {
            let mut pk = None;
            if let ControlBody::GrantFor(key) = c.body {
                match self.resolve_grant(key, &c) {
                    Some((body, k)) => (c.body, pk) = (body, Some(k)),
                    None => continue,
                }
                self.metrics.grants_sent += 1;
            }
            let ptype = self.encode_control(now, &c, pk, buf);
            if let ControlBody::Cutoffs = c.body {
                if let Some(k) = self.peers.find(c.dest) {
                    self.peers.info_mut(k).cutoffs_sent_at = Some(now);
                }
            }
            let priority = self.top_priority;
            return Some(self.account(now, ptype, c.dest, priority, buf.len()));
        }
        self.last_now = self.last_now.max(now);
        let pacer_open = self.nic_idle_at <= now.saturating_add(self.max_nic_queue_ns);
        if pacer_open {
            while let Some(&key) = self.retx_queue.front() {
                if let Some(t) = self.send_retransmit(now, key, buf) {
                    return Some(t);
                }
                self.retx_queue.pop_front();
            }
        }
        let &(_, _, first) = self.sendable.first()?;
        let key = if pacer_open {
            let oldest = self.sendable_by_age.first().unwrap().1;
            let packet_credit = 1000 * self.data_per_packet as u64;
            if oldest != first && self.pacer_fifo_credit >= packet_credit {
                self.pacer_fifo_credit -= packet_credit;
                oldest
            } else {
                first
            }
        } else {
            let out = self.rpcs[first as usize]
                .as_ref()
                .unwrap()
                .out
                .as_ref()
                .unwrap();
            if out.len > self.config.pacer_bypass_bytes {
                return None;
            }
            first
        };
        let competing = self.sendable_by_age.len() > 1;
        let t = self.send_data(now, key, buf);
        if key == first && competing {
            // Credit accrues only while another message waits, and never
            // beyond two packets' worth: the FIFO share is a trickle, not a
            // burst after a quiet period.
            let cap = 2 * 1000 * self.data_per_packet as u64;
            self.pacer_fifo_credit = (self.pacer_fifo_credit
                + t.len as u64 * self.config.pacer_fifo_permille as u64)
                .min(cap);
        }
        Some(t)
    }

    /// The GRANT a queued `GrantFor(key)` stands for now, and the peer's key,
    /// if its message is still there (the slot may have been freed, or reused
    /// by another RPC).
    fn resolve_grant(
        &mut self,
        key: RpcKey,
        c: &crate::endpoint::Control,
    ) -> Option<(ControlBody, PeerKey)> {
        let rpc = self.rpcs.get_mut(key as usize)?.as_mut()?;
        if rpc.id != c.rpc_id || rpc.peer != c.dest || rpc.is_client != c.from_client {
            return None;
        }
        let inc = rpc.inc.as_mut()?;
        if !inc.grant_queued {
            return None;
        }
        inc.grant_queued = false;
        let body = ControlBody::Grant {
            offset: inc.granted,
            priority: inc.priority,
        };
        Some((body, rpc.peer_key))
    }

    /// Updates counters and the NIC queue model for a packet about to leave.
    fn account(
        &mut self,
        now: Time,
        ptype: PacketType,
        dest: SocketAddr,
        priority: u8,
        len: usize,
    ) -> Transmit {
        self.metrics.packets_sent[ptype.index()] += 1;
        self.metrics.bytes_sent += len as u64;
        self.nic_idle_at = self.nic_idle_at.max(now) + self.config.wire_time_ns(len);
        Transmit {
            dest,
            priority,
            len,
        }
    }

    /// Encodes one DATA packet of RPC `key` covering `[offset, limit)` as far as
    /// one packet holds; `priority` is given for retransmissions only.
    fn encode_data(
        &mut self,
        now: Time,
        key: RpcKey,
        offset: u32,
        limit: u32,
        priority: Option<u8>,
        buf: &mut Vec<u8>,
    ) -> Transmit {
        let rpc = self.rpcs[key as usize].as_ref().unwrap();
        let out = rpc.out.as_ref().unwrap();
        let end = (offset + self.data_per_packet).min(limit);
        let retransmit = priority.is_some();
        let priority = priority.unwrap_or(if offset < out.unsched || out.len == 0 {
            out.unsched_priority
        } else {
            out.sched_priority
        });
        let (dest, is_client, id) = (rpc.peer, rpc.is_client, rpc.id);
        let p = &mut self.peers[rpc.peer_key];
        let ack = if is_client {
            p.pending_acks.pop().unwrap_or(0)
        } else {
            0
        };
        let (echo_time, cutoff_version) = (p.echo_time, p.cutoff_version);
        let common = CommonHeader {
            from_client: is_client,
            retransmit,
            rpc_id: id,
            send_time: now.max(1),
            echo_time,
        };
        let rpc = self.rpcs[key as usize].as_ref().unwrap();
        let out = rpc.out.as_ref().unwrap();
        let header = DataHeader {
            message_length: out.len,
            offset,
            unsched_bytes: out.unsched,
            cutoff_version,
            ack,
        };
        let payload = &out.data[offset as usize..end as usize];
        let body = Body::Data { header, payload };
        let len = if self.split_mode {
            wire::encode_headers(buf, &common, &body, self.config.checksum);
            let len = buf.len() + payload.len();
            self.split_payload = Some(out.data.slice(offset as usize..end as usize));
            len
        } else {
            wire::encode(buf, &common, &body, self.config.checksum);
            buf.len()
        };
        self.metrics.data_bytes_sent += (end - offset) as u64;
        self.account(now, PacketType::Data, dest, priority, len)
    }

    /// Like [`Self::poll_transmit`], but a DATA packet's payload is not copied:
    /// `buf` receives the headers only, and the payload comes back as a slice
    /// of the message's `Bytes`, to be sent right after them (one `sendmsg`
    /// with two iovecs). `Transmit::len` is the whole datagram's length. The
    /// payload is empty for control packets.
    pub fn poll_transmit_split(
        &mut self,
        now: Time,
        buf: &mut Vec<u8>,
    ) -> Option<(Transmit, bytes::Bytes)> {
        self.split_mode = true;
        let t = self.poll_transmit(now, buf);
        self.split_mode = false;
        let payload = self.split_payload.take().unwrap_or_default();
        t.map(|t| (t, payload))
    }

    /// Sends the next new packet of RPC `key`.
    fn send_data(&mut self, now: Time, key: RpcKey, buf: &mut Vec<u8>) -> Transmit {
        let out = self.rpcs[key as usize]
            .as_ref()
            .unwrap()
            .out
            .as_ref()
            .unwrap();
        let (offset, len) = (out.next_offset, out.len);
        let t = self.encode_data(now, key, offset, len, None, buf);
        let next = (offset + self.data_per_packet).min(len);
        let rpc = self.rpcs[key as usize].as_mut().unwrap();
        let birth = rpc.birth;
        let out = rpc.out.as_mut().unwrap();
        out.next_offset = next;
        out.zero_sent = true;
        match out.queued {
            // Still sendable: shrink its SRPT entry in place (cheap at the head).
            Some(old) if out.sendable() => {
                out.queued = Some(out.remaining());
                self.sendable.update(&(old, birth, key), out.remaining());
            }
            _ => self.unqueue_out(key),
        }
        t
    }

    /// Sends one packet of RPC `key`'s pending retransmission, if it has one.
    fn send_retransmit(&mut self, now: Time, key: RpcKey, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (start, end, priority) = self.rpcs.get(key as usize)?.as_ref()?.out.as_ref()?.retx?;
        let t = self.encode_data(now, key, start, end, Some(priority), buf);
        let sent = (start + self.data_per_packet).min(end);
        let out = self.rpc(key).out.as_mut().unwrap();
        out.retx = (sent < end).then_some((sent, end, priority));
        self.metrics.retransmitted_packets += 1;
        self.metrics.retransmitted_bytes += (sent - start) as u64;
        Some(t)
    }

    pub(crate) fn handle_grant(
        &mut self,
        now: Time,
        pk: Option<PeerKey>,
        c: &CommonHeader,
        g: wire::Grant,
    ) {
        let Some(key) = self.lookup(pk, c) else {
            self.metrics.drop(DropReason::UnknownRpc);
            return;
        };
        let rpc = self.rpc(key);
        rpc.heard(now);
        if rpc.is_client && rpc.inc.is_some() {
            // A late GRANT for a request whose response has begun.
            self.metrics.drop(DropReason::WrongState);
            return;
        }
        let Some(out) = rpc.out.as_mut() else {
            self.metrics.drop(DropReason::WrongState);
            return;
        };
        out.sched_priority = g.priority;
        let new = g.offset.min(out.len);
        if new > out.granted {
            out.granted = new;
            // A queued message keeps its SRPT entry: a grant does not change
            // its remaining bytes.
            if out.queued.is_none() {
                self.requeue_out(key);
            }
        }
    }

    pub(crate) fn handle_resend(
        &mut self,
        now: Time,
        from: SocketAddr,
        pk: Option<PeerKey>,
        c: &CommonHeader,
        r: wire::Resend,
    ) {
        let Some(key) = self.lookup(pk, c) else {
            if c.from_client && self.hit_tombstone(now, pk, c.rpc_id) {
                // Finished here (answered and acknowledged, or abandoned):
                // saying "unknown" would make the client run it again.
                self.metrics.drop(DropReason::Tombstone);
                return;
            }
            // We have no such RPC: tell the peer so it can restart or forget it.
            self.metrics.drop(DropReason::UnknownRpc);
            self.queue_control(crate::endpoint::Control {
                dest: from,
                rpc_id: c.rpc_id,
                from_client: !c.from_client,
                body: ControlBody::RpcUnknown,
            });
            return;
        };
        let dpp = self.data_per_packet as u64;
        let rpc = self.rpc(key);
        rpc.heard(now);
        let Some(out) = rpc.out.as_mut() else {
            // Server still receiving the request or computing the response.
            self.control_for(key, ControlBody::Busy);
            return;
        };
        let want_end = (r.offset as u64 + r.length as u64).min(out.len as u64) as u32;
        // A RESEND implies a grant up to its end (the GRANT may have been lost).
        let regrant = want_end > out.granted;
        if regrant {
            out.granted = want_end;
            if r.offset >= out.unsched {
                out.sched_priority = r.priority;
            }
        }
        // Packets are cut at multiples of the packet payload size, and a packet
        // may cross the granted offset; resend whole packets so that a range
        // ending inside one is covered entirely.
        let whole = (want_end as u64).div_ceil(dpp) * dpp;
        let end = (whole.min(out.len as u64) as u32).min(out.next_offset);
        let zero_len = out.len == 0 && out.zero_sent && r.offset == 0;
        if r.offset < end || zero_len {
            let (start, end) = match out.retx {
                Some((s, e, _)) => (s.min(r.offset), e.max(end)),
                None => (r.offset, end),
            };
            let was_pending = out.retx.is_some();
            out.retx = Some((start, end, r.priority));
            if !was_pending {
                self.retx_queue.push_back(key);
            }
        } else {
            self.control_for(key, ControlBody::Busy);
        }
        if regrant {
            self.requeue_out(key);
        }
    }
}
