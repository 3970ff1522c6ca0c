//! Sender side: SRPT transmit order, the NIC queue estimator (pacer), grants
//! received, and retransmission on RESEND.

use crate::endpoint::{Control, ControlBody, Endpoint, Transmit};
use crate::metrics::DropReason;
use crate::peer::PeerKey;
use crate::rpc::{OutMsg, RpcKey};
use crate::send_queue::Choice;
use crate::sendbuf::SENDBUF_HEAD;
use crate::time::Time;
use crate::wire::{self, Body, CommonHeader, DataHeader, PacketType, DATA_PACKET_OVERHEAD};
use std::net::SocketAddr;

/// A run of packets from [`crate::driver::FastPath::poll_transmit_burst`]: `count` packets
/// to `dest` at `priority`, whose headers (`header_len` bytes each) are in the
/// caller's buffer back to back and whose payloads are consecutive
/// `segment`-byte pieces of `payload` (the last piece may be shorter).
///
/// With `header_len` 0 the packets come from a [`crate::SendBuf`]: their
/// headers are already in place, `payload` holds the whole packets back to
/// back and `segment` is a whole packet's length, so the run can be sent
/// as it is, without a gather copy.
#[derive(Clone, Debug)]
pub struct Burst {
    /// Address every packet of the run goes to.
    pub dest: SocketAddr,
    /// Priority level of every packet, 0..8 (7 highest), as in [`Transmit`].
    pub priority: u8,
    /// Number of packets in the run (at least 1).
    pub count: usize,
    /// Bytes of headers per packet in the caller's buffer; 0 when the
    /// headers are already in `payload` (a [`crate::SendBuf`] run).
    pub header_len: usize,
    /// Bytes of `payload` per packet (the last packet's piece may be shorter).
    pub segment: usize,
    /// The run's payloads (or, with `header_len` 0, its whole packets) back
    /// to back, without copying the message.
    pub payload: bytes::Bytes,
    /// Zero bytes the driver appends after the last packet's payload; its
    /// header declares them (`Config::pad_v4`). Only ever set on a lone
    /// short packet.
    pub pad: usize,
}

impl Burst {
    /// The payload of packet `i` (< `count`).
    pub fn payload_of(&self, i: usize) -> &[u8] {
        let start = (i * self.segment).min(self.payload.len());
        let end = ((i + 1) * self.segment).min(self.payload.len());
        &self.payload[start..end]
    }
}

/// The state of a `poll_transmit_split` call in progress. Invariant:
/// `payload` is `None` outside one (it is set by the packet built inside
/// and taken when the call returns).
#[derive(Default)]
#[repr(C)]
pub(crate) struct Split {
    /// Inside `poll_transmit_split`: DATA payloads are handed back, not
    /// copied into the caller's buffer.
    pub(crate) on: bool,
    /// The payload handed back.
    pub(crate) payload: Option<bytes::Bytes>,
}

/// Payloads up to this long are copied into the packet by
/// [`Endpoint::poll_transmit_split`] when they end their message, instead
/// of being returned as a handle (see there).
pub(crate) const WHOLE_MAX_PAYLOAD: usize = 512;

/// The priority of a first transmission of `out`'s packet at `offset`: the
/// unscheduled level for the unscheduled bytes (and an empty message), the
/// level its grants asked for after them.
fn new_data_priority(out: &crate::rpc::OutMsg, offset: u32) -> u8 {
    if offset < out.unsched || out.len == 0 {
        out.unsched_priority
    } else {
        out.sched_priority
    }
}

impl Endpoint {
    /// Padding for a DATA datagram of `len` bytes to `dest` (see
    /// `Config::pad_v4`).
    #[inline]
    fn pad_for(&self, dest: &SocketAddr, len: usize) -> u8 {
        let v4 = match dest {
            SocketAddr::V4(_) => true,
            SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
        };
        self.derived.pad(v4, len)
    }

    /// Puts RPC `key`'s outgoing message into the SRPT sets if it has bytes to
    /// send, or takes it out if not, keyed by its current remaining bytes.
    pub(crate) fn requeue_out(&mut self, key: RpcKey) {
        self.unqueue_out(key);
        if self.onramp_parks(key) {
            // On-Ramp holds its destination: it waits outside the queue.
            if self.rpcs[key].out.as_ref().is_some_and(|o| o.sendable()) && self.onramp.park(key) {
                self.metrics.onramp_parked += 1;
            }
            return;
        }
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        if let Some(out) = rpc.out.as_mut() {
            if out.sendable() {
                out.queued = Some(out.remaining());
                self.sends.insert(out.remaining(), birth, key);
            }
        }
    }

    /// The outgoing message of live RPC `key`, which must have one.
    fn out_msg(&self, key: RpcKey) -> &OutMsg {
        self.rpcs[key]
            .out
            .as_ref()
            .expect("live RPC with an outgoing message")
    }

    pub(crate) fn unqueue_out(&mut self, key: RpcKey) {
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        if let Some(out) = rpc.out.as_mut() {
            if let Some(remaining) = out.queued.take() {
                self.sends.remove(remaining, birth, key);
            }
        }
    }

    /// See [`crate::driver::FastPath::may_transmit`].
    #[inline]
    pub(crate) fn may_transmit(&self) -> bool {
        !self.control.is_empty() || !self.sends.is_empty() || self.streams.has_ready()
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
        while let Some(mut c) = self.control.pop() {
            let mut pk = None;
            if let ControlBody::GrantFor(key) = c.body {
                match self.resolve_grant(key, &c) {
                    Some((body, k)) => (c.body, pk) = (body, Some(k)),
                    None => continue,
                }
                self.metrics.grants_sent += 1;
            }
            if let ControlBody::StreamCreditFor { probe, ask } = c.body {
                match self.resolve_stream_credit(now, &c, probe, ask) {
                    Some(body) => c.body = body,
                    None => continue,
                }
            }
            let ptype = self.encode_control(now, &c, pk, buf);
            if let ControlBody::Cutoffs = c.body {
                if let Some(k) = self.peers.find(c.dest) {
                    self.peers.info_mut(k).cutoffs_sent_at = Some(now);
                }
            }
            let priority = self.derived.top_priority();
            return Some(self.account(now, ptype, c.dest, priority, buf.len()));
        }
        self.note_time(now);
        self.onramp_release(now);
        let pacer_open = self.pacer.is_open(now);
        if pacer_open && self.sends.retx_first() {
            while let Some(key) = self.sends.retx_front() {
                if let Some(t) = self.send_retransmit(now, key, buf) {
                    return Some(t);
                }
                self.sends.pop_retx();
            }
        }
        if self.streams.has_ready() {
            let head = self
                .sends
                .head()
                .map(|k| self.out_msg(k).remaining() as u64);
            if let Some(t) = self.poll_stream(now, pacer_open, head, buf) {
                return Some(t);
            }
        }
        let Choice {
            key,
            first,
            fifo_turn,
        } = self.data_choice(pacer_open)?;
        if fifo_turn {
            self.sends.spend_fifo_turn();
        }
        let t = self.send_chosen(now, key, first, false, buf);
        self.streams.owe(t.len);
        self.sends.set_last_new(key);
        Some(t)
    }

    /// The message whose next new packet goes now, once control packets and
    /// retransmissions have had their turn (see [`Choice`]). With the pacer
    /// closed only a message short enough to bypass it may go. No side
    /// effects: `poll_transmit` takes the FIFO credit, and bursts use it to
    /// check that nothing else would go.
    // Inlined into its two callers (`poll_transmit`, `burst_continues`): a
    // call per packet costs ~18 instructions (`proto_bench stream`).
    #[inline(always)]
    fn data_choice(&self, pacer_open: bool) -> Option<Choice> {
        if pacer_open {
            self.sends.choose()
        } else {
            let first = self.sends.head()?;
            let out = self.out_msg(first);
            (out.len <= self.derived.pacer_bypass_bytes()).then_some(Choice {
                key: first,
                first,
                fifo_turn: false,
            })
        }
    }

    /// Sends the next new packet of `key`, chosen when `first` headed the
    /// SRPT order, and accrues the FIFO share's credit.
    #[inline(always)]
    fn send_chosen(
        &mut self,
        now: Time,
        key: RpcKey,
        first: RpcKey,
        headers_only: bool,
        buf: &mut Vec<u8>,
    ) -> Transmit {
        let competing = self.sends.competing();
        let t = self.send_data(now, key, headers_only, buf);
        if key == first && competing {
            // Credit accrues only while another message waits.
            self.sends.accrue_fifo(t.len as u64);
        }
        t
    }

    /// Whether the packet [`Self::poll_transmit`] would send next is the next
    /// new packet of `key` (so a burst may go on): no control packet or
    /// retransmission comes first, `key` still heads the SRPT order and the
    /// FIFO share does not pick another message, and the pacer lets it go.
    fn burst_continues(&self, now: Time, key: RpcKey) -> bool {
        if !self.control.is_empty() || self.streams.has_ready() {
            return false;
        }
        let pacer_open = self.pacer.is_open(now);
        if pacer_open && self.sends.retx_first() {
            return false;
        }
        self.data_choice(pacer_open)
            == Some(Choice {
                key,
                first: key,
                fifo_turn: false,
            })
    }

    /// See [`crate::driver::FastPath::poll_transmit_burst`].
    pub(crate) fn poll_transmit_burst(
        &mut self,
        now: Time,
        max_packets: usize,
        buf: &mut Vec<u8>,
    ) -> Option<Burst> {
        self.sends.take_last_new();
        let (t, payload) = self.poll_transmit_split(now, buf)?;
        crate::trace_point!("engine: first packet built");
        let mut burst = Burst {
            dest: t.dest,
            priority: t.priority,
            count: 1,
            header_len: buf.len(),
            segment: payload.len(),
            pad: t.len - buf.len() - payload.len(),
            payload,
        };
        let Some(key) = self.sends.take_last_new() else {
            return Some(burst);
        };
        // Headers written into a send buffer (none in `buf`): the payload
        // handle holds whole packets, header room included.
        let head_in_payload = if burst.header_len == 0 {
            SENDBUF_HEAD
        } else {
            0
        };
        let first_payload = burst.segment - head_in_payload;
        // Only full packets may be followed (GSO: every segment but the last
        // has the same size).
        let dpp = self.derived.data_per_packet() as usize;
        if first_payload != dpp {
            return Some(burst);
        }
        let start = {
            let out = self.out_msg(key);
            // The first packet ended at next_offset; it began one packet earlier.
            out.next_offset as usize - first_payload
        };
        // A run also ends where the message's unscheduled bytes do: the
        // packets after it go at the granted priority.
        while burst.count < max_packets && self.burst_continues(now, key) && {
            let out = self.out_msg(key);
            new_data_priority(out, out.next_offset) == burst.priority
        } {
            let t = self.send_chosen(now, key, key, true, buf);
            debug_assert_eq!(t.dest, burst.dest);
            debug_assert_eq!(t.priority, burst.priority);
            burst.count += 1;
            if t.len - burst.header_len - head_in_payload < dpp {
                break;
            }
        }
        if burst.count > 1 {
            let out = self.out_msg(key);
            burst.payload = match out.data.lease() {
                Some(lease) if head_in_payload > 0 => {
                    let k = start / dpp;
                    lease.run(k, k + burst.count)
                }
                _ => out.data.bytes(start, out.next_offset as usize),
            };
        }
        Some(burst)
    }

    /// The GRANT a queued `GrantFor(key)` stands for now, and the peer's key,
    /// if its message is still there (the slot may have been freed, or reused
    /// by another RPC).
    fn resolve_grant(&mut self, key: RpcKey, c: &Control) -> Option<(ControlBody, PeerKey)> {
        let rpc = self.rpcs.get_mut(key)?;
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
    pub(crate) fn account(
        &mut self,
        now: Time,
        ptype: PacketType,
        dest: SocketAddr,
        priority: u8,
        len: usize,
    ) -> Transmit {
        self.metrics.packets_sent[ptype.index()] += 1;
        self.metrics.bytes_sent += len as u64;
        self.pacer.on_transmit(now, len, &self.derived);
        Transmit {
            dest,
            priority,
            len,
        }
    }

    /// Encodes one DATA packet of RPC `key` covering `[offset, limit)` as far as
    /// one packet holds; `priority` is given for retransmissions only.
    /// Returns the packet and the end of its payload (a packet from a send
    /// buffer may stop short, at a segment boundary).
    // One call per packet on the hot path: plain arguments, no option struct.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn encode_data(
        &mut self,
        now: Time,
        key: RpcKey,
        offset: u32,
        limit: u32,
        priority: Option<u8>,
        headers_only: bool,
        buf: &mut Vec<u8>,
    ) -> (Transmit, u32) {
        let rpc = &self.rpcs[key];
        let out = rpc.out.as_ref().unwrap();
        let dpp = self.derived.data_per_packet();
        let mut end = (offset + dpp).min(limit);
        // The packet's index in a send buffer, whose packets are its
        // segments: never cross one.
        let k = out.data.lease().map(|_| offset / dpp);
        if let Some(k) = k {
            let boundary = (k as u64 + 1) * dpp as u64;
            end = end.min(boundary.min(u32::MAX as u64) as u32);
        }
        let retransmit = priority.is_some();
        let priority = priority.unwrap_or_else(|| new_data_priority(out, offset));
        // The address is read where it is used, not copied here: a copy
        // held across the function is split into bytes (~30 instructions).
        let (is_client, id) = (rpc.is_client, rpc.id);
        let p = &mut self.peers[rpc.peer_key];
        let ack = if is_client {
            p.pending_acks.pop().unwrap_or(0)
        } else {
            0
        };
        let (echo_time, cutoff_version) = (p.echo(now, self.derived.echo_hold()), p.cutoff_version);
        let common = CommonHeader {
            from_client: is_client,
            retransmit,
            rpc_id: id,
            send_time: now.max(1),
            echo_time,
        };
        let rpc = &self.rpcs[key];
        let out = rpc.out.as_ref().unwrap();
        let header = DataHeader {
            message_length: out.len,
            offset,
            unsched_bytes: out.unsched,
            cutoff_version,
            ack,
        };
        let payload = out.data.slice_in(k, offset as usize, end as usize);
        let body = Body::Data { header, payload };
        // A first transmission from a send buffer, for a driver that takes
        // headers apart from payload: the header goes into the buffer's room
        // before the payload, and the packet leaves as one slice of it.
        let in_place = match out.data.lease() {
            Some(lease) if !retransmit && (headers_only || self.split.on) => {
                debug_assert_eq!(offset % dpp, 0, "first transmissions are whole packets");
                let mut words = wire::data_header_words(&common, &header, payload.len(), 0);
                if self.derived.checksum() {
                    wire::checksum_header_words(&mut words, payload);
                }
                let k = k.expect("a buffer's packet index") as usize;
                lease.write_header(k, &words);
                if !headers_only {
                    self.split.payload = Some(lease.run(k, k + 1));
                }
                true
            }
            _ => false,
        };
        let len = if in_place {
            SENDBUF_HEAD + payload.len()
        } else if headers_only {
            // A later packet of a burst: its payload is part of the burst's.
            let before = buf.len();
            wire::encode_headers(buf, &common, &body, self.derived.checksum());
            buf.len() - before + payload.len()
        } else {
            // A packet that leaves alone (not in place, not inside a burst)
            // may be padded (`Config::pad_v4`).
            let pad = self.pad_for(&rpc.peer, DATA_PACKET_OVERHEAD + payload.len());
            // A short last packet is written whole even for a split poll:
            // copying its few bytes costs less than a handle on the payload
            // (two reference-count updates) and the driver's gather.
            let whole = end == out.len && payload.len() <= WHOLE_MAX_PAYLOAD;
            if self.split.on && !whole {
                // The whole packet (headers, payload, padding) is what the
                // driver sends; the padding is zeros it appends (`Burst`).
                wire::encode_headers_padded(buf, &common, &body, self.derived.checksum(), pad);
                self.split.payload = Some(out.data.bytes(offset as usize, end as usize));
                buf.len() + payload.len() + pad as usize
            } else {
                wire::encode_padded(buf, &common, &body, self.derived.checksum(), pad);
                buf.len()
            }
        };
        self.metrics.data_bytes_sent += (end - offset) as u64;
        let dest = self.rpcs[key].peer;
        (
            self.account(now, PacketType::Data, dest, priority, len),
            end,
        )
    }

    /// See [`crate::driver::FastPath::poll_transmit_split`].
    pub(crate) fn poll_transmit_split(
        &mut self,
        now: Time,
        buf: &mut Vec<u8>,
    ) -> Option<(Transmit, bytes::Bytes)> {
        self.split.on = true;
        let t = self.poll_transmit(now, buf);
        self.split.on = false;
        let payload = self.split.payload.take().unwrap_or_default();
        t.map(|t| (t, payload))
    }

    /// Sends the next new packet of RPC `key`.
    #[inline(always)]
    fn send_data(
        &mut self,
        now: Time,
        key: RpcKey,
        headers_only: bool,
        buf: &mut Vec<u8>,
    ) -> Transmit {
        let out = self.out_msg(key);
        let (offset, len) = (out.next_offset, out.len);
        let (t, next) = self.encode_data(now, key, offset, len, None, headers_only, buf);
        let guard = self.derived.resend_guard_ns();
        let rpc = &mut self.rpcs[key];
        let birth = rpc.birth;
        let out = rpc.out.as_mut().unwrap();
        out.note_sent(now, offset, guard);
        out.next_offset = next;
        out.zero_sent = true;
        match out.queued {
            // Still sendable: shrink its SRPT entry in place (cheap at the head).
            Some(old) if out.sendable() => {
                out.queued = Some(out.remaining());
                self.sends.update(old, birth, key, out.remaining());
                // A held destination's message that was let through for
                // its unscheduled bytes (several priority levels) parks
                // when it reaches its scheduled part. One compare when
                // nothing is held.
                if self.onramp.next_release != Time::MAX && self.onramp_parks(key) {
                    self.requeue_out(key);
                }
            }
            _ => {
                // Sent all it may (waits for a grant, or is done).
                out.stalled_at = now;
                self.unqueue_out(key)
            }
        }
        t
    }

    /// Sends one packet of RPC `key`'s pending retransmission, if it has one.
    fn send_retransmit(&mut self, now: Time, key: RpcKey, buf: &mut Vec<u8>) -> Option<Transmit> {
        let (start, end, priority) = self.rpcs.get(key)?.out.as_ref()?.retx?;
        // The packet may end short of a full one (a send buffer's packets
        // never cross a segment): go on from where it actually ended.
        let (t, sent) = self.encode_data(now, key, start, end, Some(priority), false, buf);
        self.rpcs[key].out.as_mut().unwrap().advance_retx(sent);
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
        let rpc = &mut self.rpcs[key];
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
        if self.derived.adaptive() && new > out.granted && !out.sendable() {
            // It had sent all it was granted: it waited for this grant.
            let waited = now.saturating_sub(out.stalled_at);
            let first = out.granted == out.unsched;
            self.peers
                .path_mut(rpc.peer_key)
                .unsched
                .on_wait(waited, first);
        }
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
            self.queue_control(Control {
                dest: from,
                rpc_id: c.rpc_id,
                from_client: !c.from_client,
                body: ControlBody::RpcUnknown,
            });
            return;
        };
        let dpp = self.derived.data_per_packet() as u64;
        let rpc = &mut self.rpcs[key];
        // A RESEND brings none of the data we may be waiting for from the
        // peer: while a message from it is incomplete, our silence timer
        // for that message runs on (as in the Linux module, where only DATA
        // and BUSY reset it). Otherwise a client asking for its overdue
        // response put off the server's RESEND for the request's lost
        // packets by a whole interval. It does say the peer has sent all
        // it may, so it is not merely behind (BUSY's mark goes).
        if rpc.inc.as_ref().is_none_or(|m| m.complete()) {
            rpc.heard(now);
        } else {
            rpc.peer_busy = false;
        }
        let peer_key = rpc.peer_key;
        let Some(out) = rpc.out.as_mut() else {
            // Server still receiving the request or computing the response.
            self.control_for(key, ControlBody::Busy);
            return;
        };
        // Bytes sent since a pause, within the guard, may be crossing this
        // RESEND: only older ones are sent again (if the recent ones were
        // lost, the next RESEND, an interval later, gets them).
        let sent_before = out.sent_before(now, self.derived.resend_guard_ns());
        if self.derived.adaptive() && r.offset < sent_before {
            // Bytes we sent did not arrive (in time): the path lost them.
            self.peers.path_mut(peer_key).unsched.on_loss();
        }
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
        let end = (whole.min(out.len as u64) as u32).min(sent_before);
        let zero_len = out.len == 0 && out.zero_sent && r.offset == 0;
        if r.offset < end || zero_len {
            let was_pending = out.add_retx(r.offset, end, r.priority);
            if !was_pending {
                self.sends.push_retx(key);
            }
        } else if r.offset < out.next_offset {
            self.metrics.resend_in_flight += 1;
        } else {
            self.control_for(key, ControlBody::Busy);
        }
        if regrant {
            self.requeue_out(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, Endpoint};
    use bytes::Bytes;
    use std::net::SocketAddr;

    type Datagram = (SocketAddr, u8, Vec<u8>);

    /// An endpoint with four requests queued, given as `Bytes` or (`framed`)
    /// as send buffers.
    fn endpoint(cfg: &Config, framed: bool) -> Endpoint {
        let mut ep = Endpoint::new(cfg.clone(), 0).unwrap();
        let p1: SocketAddr = "10.0.0.2:4000".parse().unwrap();
        let p2: SocketAddr = "10.0.0.3:4000".parse().unwrap();
        for (peer, n) in [(p1, 500_000), (p2, 3_000), (p1, 200_000), (p2, 0)] {
            let body: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            if framed {
                let mut b = ep.new_send_buf(n);
                b.write(0, &body).unwrap();
                ep.send_request(0, peer, b).unwrap();
            } else {
                ep.send_request(0, peer, Bytes::from(body)).unwrap();
            }
        }
        ep
    }

    /// Every datagram sent over `steps` time steps, polled one at a time.
    fn one_by_one(cfg: &Config, steps: u64) -> Vec<Datagram> {
        one_by_one_of(cfg, steps, false)
    }

    fn one_by_one_of(cfg: &Config, steps: u64, framed: bool) -> Vec<Datagram> {
        let mut ep = endpoint(cfg, framed);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for step in 0..steps {
            let now = step * 700;
            while let Some(t) = ep.poll_transmit(now, &mut buf) {
                out.push((t.dest, t.priority, buf.clone()));
            }
        }
        out
    }

    /// The same, polled in bursts of at most `max`; also returns how many
    /// bursts carried more than one packet.
    fn in_bursts(cfg: &Config, steps: u64, max: usize) -> (Vec<Datagram>, usize) {
        in_bursts_of(cfg, steps, max, false)
    }

    fn in_bursts_of(cfg: &Config, steps: u64, max: usize, framed: bool) -> (Vec<Datagram>, usize) {
        let mut ep = endpoint(cfg, framed);
        let mut out = Vec::new();
        let mut buf = Vec::new();
        let mut multi = 0;
        for step in 0..steps {
            let now = step * 700;
            while let Some(b) = ep.poll_transmit_burst(now, max, &mut buf) {
                assert!(b.count >= 1 && b.count <= max);
                assert_eq!(buf.len(), b.count * b.header_len);
                // Framed: a run's headers are in place, in its payload.
                if framed && b.count > 1 {
                    assert_eq!(b.header_len, 0);
                }
                multi += (b.count > 1) as usize;
                for i in 0..b.count {
                    let mut d = buf[i * b.header_len..(i + 1) * b.header_len].to_vec();
                    d.extend_from_slice(b.payload_of(i));
                    if i + 1 < b.count {
                        assert_eq!(b.payload_of(i).len(), b.segment);
                    }
                    out.push((b.dest, b.priority, d));
                }
            }
        }
        (out, multi)
    }

    #[test]
    fn bursts_send_exactly_what_single_polls_send() {
        for (queue_ns, checksum, fifo) in [
            (None, true, 50),
            (Some(20_000), true, 50),
            (Some(20_000), false, 0),
            (Some(200_000), false, 500),
        ] {
            let cfg = Config {
                max_nic_queue_ns: queue_ns,
                checksum,
                pacer_fifo_permille: fifo,
                ..Config::default()
            };
            let single = one_by_one(&cfg, 2_000);
            for max in [1, 2, 7, 64] {
                let (burst, multi) = in_bursts(&cfg, 2_000, max);
                assert_eq!(burst.len(), single.len(), "{queue_ns:?} max {max}");
                assert!(burst == single, "{queue_ns:?} {checksum} max {max}");
                if max > 1 && queue_ns.is_some() {
                    assert!(multi > 0, "no multi-packet burst with {queue_ns:?}");
                }
            }
            assert!(single.len() > 40, "{}", single.len());
        }
    }

    #[test]
    fn send_buffers_send_exactly_what_plain_messages_send() {
        for (queue_ns, checksum) in [(None, true), (Some(20_000), true), (Some(200_000), false)] {
            let cfg = Config {
                max_nic_queue_ns: queue_ns,
                checksum,
                ..Config::default()
            };
            let single = one_by_one(&cfg, 2_000);
            assert!(
                one_by_one_of(&cfg, 2_000, true) == single,
                "{queue_ns:?} single"
            );
            for max in [1, 2, 7, 64] {
                let (framed, multi) = in_bursts_of(&cfg, 2_000, max, true);
                assert_eq!(framed.len(), single.len(), "{queue_ns:?} max {max}");
                assert!(framed == single, "{queue_ns:?} {checksum} max {max}");
                if max > 1 && queue_ns.is_some() {
                    assert!(multi > 0, "no multi-packet burst with {queue_ns:?}");
                }
            }
        }
    }

    /// Two endpoints (with a 20 us NIC queue) and their addresses.
    fn pair() -> (Endpoint, Endpoint, SocketAddr, SocketAddr) {
        let cfg = Config {
            max_nic_queue_ns: Some(20_000),
            ..Config::default()
        };
        let seeded = |rpc_id_seed| {
            Endpoint::new(
                Config {
                    rpc_id_seed,
                    ..cfg.clone()
                },
                0,
            )
            .unwrap()
        };
        (
            seeded(3),
            seeded(9),
            "10.0.0.1:1".parse().unwrap(),
            "10.0.0.2:1".parse().unwrap(),
        )
    }

    /// A send buffer over a lossy exchange: every 7th datagram `a` sends is
    /// lost, so parts go again as retransmissions (the ordinary path, a
    /// header plus a payload slice of the buffer). The request arrives
    /// intact, and the buffer is free again once the RPC is over.
    #[test]
    fn send_buffer_survives_loss_and_is_released() {
        let (mut a, mut b, a_addr, b_addr) = pair();
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut sb = a.new_send_buf(body.len());
        sb.write(0, &body).unwrap();
        let id = a.send_request(0, b_addr, sb.clone()).unwrap();
        assert!(sb.in_flight());
        assert!(matches!(
            a.send_request(0, b_addr, sb.clone()),
            Err(crate::SendError::BufferInFlight)
        ));
        let (mut buf, mut sent, mut retransmitted) = (Vec::new(), 0u64, 0u64);
        let mut got_request = false;
        let mut response = None;
        for step in 0..20_000u64 {
            let now = step * 5_000;
            for ep in [&mut a, &mut b] {
                if ep.poll_timeout().is_some_and(|t| t <= now) {
                    ep.handle_timeout(now);
                }
            }
            while let Some(t) = a.poll_transmit_burst(now, 64, &mut buf) {
                for i in 0..t.count {
                    let mut d = buf[i * t.header_len..][..t.header_len].to_vec();
                    d.extend_from_slice(t.payload_of(i));
                    sent += 1;
                    retransmitted += (d[2] & 0x02 != 0) as u64;
                    if sent % 7 != 0 {
                        b.handle_datagram(now, a_addr, &d);
                    }
                }
            }
            while let Some(ev) = b.poll_event() {
                if let crate::Event::Request { rpc, message } = ev {
                    assert!(message.to_vec() == body, "request corrupted");
                    got_request = true;
                    b.send_response(now, rpc, Bytes::from_static(b"ok"))
                        .unwrap();
                }
            }
            while let Some(t) = b.poll_transmit(now, &mut buf) {
                a.handle_datagram(now, b_addr, &buf[..t.len]);
            }
            if let Some(crate::Event::Response { id: got, message }) = a.poll_event() {
                assert_eq!(got, id);
                response = Some(message.to_vec());
                break;
            }
        }
        assert!(got_request);
        assert_eq!(response.as_deref(), Some(&b"ok"[..]));
        assert!(retransmitted > 0, "loss must cause retransmissions");
        assert!(!sb.in_flight(), "the finished RPC must release its buffer");
        sb.write(0, &[1, 2, 3]).unwrap();
    }

    /// A RESEND that starts inside a segment of a send buffer: the first
    /// packet stops at the segment boundary, and the next one starts there
    /// (it once started a whole packet after the first one's start, so the
    /// bytes in between were never resent). Found by the fuzzer's seeds.
    #[test]
    fn send_buffer_retransmits_an_unaligned_range_without_gaps() {
        let cfg = Config::default();
        let mut a = Endpoint::new(cfg.clone(), 0).unwrap();
        let b_addr: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let body: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
        let mut sb = a.new_send_buf(body.len());
        sb.write(0, &body).unwrap();
        let id = a.send_request(0, b_addr, sb).unwrap();
        let mut buf = Vec::new();
        // Send what may go without grants; a RESEND only covers bytes sent.
        let mut sent_end = 0u32;
        for step in 0..100 {
            while let Some(t) = a.poll_transmit(step * 10_000, &mut buf) {
                if let Ok(crate::wire::Decoded {
                    packet: crate::wire::Packet::Data { header, payload },
                    ..
                }) = crate::wire::decode(&buf[..t.len])
                {
                    sent_end = sent_end.max(header.offset + payload.len() as u32);
                }
            }
        }
        assert!(sent_end >= 2 * 1416, "{sent_end}");
        let resend = |offset, length| resend_from_server(id.0, offset, length);
        let dpp = cfg.max_data_per_packet() as u32;
        let cases = [(700u32, 3000u32), (100, 2000), (dpp - 1, 2), (0, 1)];
        for (i, &(offset, length)) in cases.iter().enumerate() {
            let start = 2_000_000 * (i as u64 + 1);
            a.handle_datagram(start, b_addr, &resend(offset, length));
            let mut next = offset;
            // Over a few steps: the pacer lets a packet or two out per step.
            for now in (0..20).map(|i| start + i * 5_000) {
                while let Some(t) = a.poll_transmit(now, &mut buf) {
                    let Ok(p) = crate::wire::decode(&buf[..t.len]) else {
                        panic!("undecodable packet")
                    };
                    if let crate::wire::Packet::Data { header, payload } = p.packet {
                        assert!(p.common.retransmit);
                        assert_eq!(
                            header.offset, next,
                            "gap in the retransmission of {offset}+{length}"
                        );
                        let o = header.offset as usize;
                        assert_eq!(payload, &body[o..o + payload.len()]);
                        next += payload.len() as u32;
                    }
                }
            }
            let want = ((offset + length).div_ceil(dpp) * dpp).min(sent_end);
            assert_eq!(
                next, want,
                "retransmission of {offset}+{length} must cover whole packets"
            );
        }
    }

    /// A RESEND from a request's server (at level 0) for `length` bytes
    /// of RPC `rpc_id` from `offset`.
    fn resend_from_server(rpc_id: u64, offset: u32, length: u32) -> Vec<u8> {
        let mut p = Vec::new();
        let common = crate::wire::CommonHeader {
            from_client: false,
            retransmit: false,
            rpc_id,
            send_time: 1,
            echo_time: 0,
        };
        let r = crate::wire::Resend {
            offset,
            length,
            priority: 0,
        };
        crate::wire::encode(&mut p, &common, &crate::wire::Body::Resend(r), false);
        p
    }

    /// A short message (no grant needed) goes before a pending
    /// retransmission of a long one; with `short_before_retransmit` off the
    /// retransmission goes first, as before the rule.
    #[test]
    fn a_short_message_goes_before_pending_retransmissions() {
        for short_first in [true, false] {
            let cfg = Config::default().with_short_before_retransmit(short_first);
            let mut a = Endpoint::new(cfg.clone(), 0).unwrap();
            let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
            let c: SocketAddr = "10.0.0.3:1".parse().unwrap();
            let long = a
                .send_request(0, b, Bytes::from(vec![7u8; 200_000]))
                .unwrap();
            let mut buf = Vec::new();
            // Let some of the long request go.
            for step in 0..10u64 {
                while a.poll_transmit(step * 10_000, &mut buf).is_some() {}
            }
            // Its receiver asks for the first three packets again...
            let dpp = cfg.max_data_per_packet() as u32;
            let p = resend_from_server(long.0, 0, 3 * dpp);
            let now = 1_000_000;
            a.handle_datagram(now, b, &p);
            // ...and a short request starts meanwhile.
            a.send_request(now, c, Bytes::from(vec![1u8; 2_000]))
                .unwrap();
            let mut order = Vec::new();
            for step in 0..10u64 {
                while let Some(t) = a.poll_transmit(now + step * 10_000, &mut buf) {
                    if let Ok(crate::wire::Decoded {
                        common,
                        packet: crate::wire::Packet::Data { .. },
                        ..
                    }) = crate::wire::decode(&buf[..t.len])
                    {
                        order.push((t.dest, common.retransmit));
                    }
                }
            }
            let first_short = order.iter().position(|&(d, _)| d == c).unwrap();
            let first_retx = order.iter().position(|&(_, r)| r).unwrap();
            assert_eq!(first_short < first_retx, short_first, "{order:?}");
            // The retransmissions all go either way.
            assert_eq!(order.iter().filter(|&&(_, r)| r).count(), 3, "{order:?}");
        }
    }

    /// Packets sent since a pause may be crossing a RESEND: within the
    /// resend guard only the bytes sent before the pause go again, a RESEND
    /// for recent bytes alone sends nothing (not even BUSY), and after the
    /// guard the same RESEND gets them.
    #[test]
    fn a_resend_crossing_a_new_burst_resends_only_older_bytes() {
        let cfg = Config::default();
        let guard = cfg.effective_resend_interval_ns() / 2;
        let dpp = cfg.max_data_per_packet() as u32;
        let mut a = Endpoint::new(cfg.clone(), 0).unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let id = a
            .send_request(0, b, Bytes::from(vec![7u8; 200_000]))
            .unwrap()
            .0;
        let mut buf = Vec::new();
        // (new DATA packets, retransmitted DATA packets, BUSYs) sent over
        // the 100 us from `start` (the pacer lets a packet go at a time).
        let mut drain = |a: &mut Endpoint, start: u64| {
            let (mut new, mut again, mut busy) = (0, 0, 0);
            for now in (start..start + 100_000).step_by(1_000) {
                while let Some(t) = a.poll_transmit(now, &mut buf) {
                    match crate::wire::decode(&buf[..t.len]) {
                        Ok(crate::wire::Decoded {
                            common,
                            packet: crate::wire::Packet::Data { .. },
                            ..
                        }) => {
                            if common.retransmit {
                                again += 1
                            } else {
                                new += 1
                            }
                        }
                        Ok(crate::wire::Decoded {
                            packet: crate::wire::Packet::Busy,
                            ..
                        }) => busy += 1,
                        _ => {}
                    }
                }
            }
            (new, again, busy)
        };
        let (unsched_packets, _, _) = drain(&mut a, 0);
        let unsched = unsched_packets * dpp;
        assert!(unsched_packets > 1);
        // A long pause, then a RESEND beyond what was sent (a grant): three
        // new packets leave at once.
        let t1 = 10 * guard;
        a.handle_datagram(t1, b, &resend_from_server(id, unsched, 3 * dpp));
        assert_eq!(drain(&mut a, t1), (3, 0, 1));
        // A RESEND from before those arrived: only the older bytes again.
        let t2 = t1 + guard / 2;
        a.handle_datagram(t2, b, &resend_from_server(id, 0, unsched + 3 * dpp));
        assert_eq!(drain(&mut a, t2), (0, unsched_packets, 0));
        // One for the new bytes alone: nothing, and counted.
        a.handle_datagram(t2 + 100_000, b, &resend_from_server(id, unsched, 3 * dpp));
        assert_eq!(drain(&mut a, t2 + 100_000), (0, 0, 0));
        assert_eq!(a.metrics().resend_in_flight, 1);
        // After the guard they were lost, not late: sent again.
        let t3 = t1 + guard;
        a.handle_datagram(t3, b, &resend_from_server(id, unsched, 3 * dpp));
        assert_eq!(drain(&mut a, t3), (0, 3, 0));
    }

    /// Two RESENDs for disjoint ranges (a receiver lists every gap) get
    /// exactly those ranges, not the bytes between them; a third touching
    /// the first joins it.
    #[test]
    fn resends_of_disjoint_gaps_send_only_the_gaps() {
        let cfg = Config::default();
        let dpp = cfg.max_data_per_packet() as u32;
        let mut a = Endpoint::new(cfg.clone(), 0).unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let id = a
            .send_request(0, b, Bytes::from(vec![7u8; 20 * dpp as usize]))
            .unwrap()
            .0;
        let mut buf = Vec::new();
        // Offsets of the retransmitted DATA packets sent from `start` on.
        let mut drain = |a: &mut Endpoint, start: u64| {
            let mut again = Vec::new();
            for now in (start..start + 100_000).step_by(1_000) {
                while let Some(t) = a.poll_transmit(now, &mut buf) {
                    if let Ok(crate::wire::Decoded {
                        common,
                        packet: crate::wire::Packet::Data { header, .. },
                        ..
                    }) = crate::wire::decode(&buf[..t.len])
                    {
                        if common.retransmit {
                            again.push(header.offset / dpp);
                        }
                    }
                }
            }
            again
        };
        assert!(drain(&mut a, 0).is_empty());
        let t = 10 * cfg.effective_resend_interval_ns();
        a.handle_datagram(t, b, &resend_from_server(id, dpp, dpp));
        a.handle_datagram(t, b, &resend_from_server(id, 4 * dpp, 2 * dpp));
        a.handle_datagram(t, b, &resend_from_server(id, 9 * dpp, dpp));
        a.handle_datagram(t, b, &resend_from_server(id, 2 * dpp, dpp));
        assert_eq!(drain(&mut a, t), vec![1, 2, 4, 5, 9]);
        // A range bridging the one being sent and a waiting one merges
        // them: nothing is sent twice.
        let t = 2 * t;
        a.handle_datagram(t, b, &resend_from_server(id, 12 * dpp, dpp));
        a.handle_datagram(t, b, &resend_from_server(id, 15 * dpp, dpp));
        a.handle_datagram(t, b, &resend_from_server(id, 12 * dpp, 4 * dpp));
        assert_eq!(drain(&mut a, t), vec![12, 13, 14, 15]);
    }

    /// (priority, datagram) of every packet `a` sends of a 300 KB request
    /// that `b` grants, polled one by one or in bursts of up to `max`.
    fn granted_stream(max: Option<usize>) -> Vec<(u8, Vec<u8>)> {
        // 25 Gbit/s: unscheduled bytes (62,500) end inside the 45th packet,
        // and the 20 us NIC queue holds back part of them, so a GRANT can
        // arrive while unscheduled packets still wait.
        let (mut a, mut b, a_addr, b_addr) = pair();
        let body = Bytes::from((0..300_000).map(|i| (i % 253) as u8).collect::<Vec<_>>());
        a.send_request(0, b_addr, body).unwrap();
        let mut out = Vec::new();
        let mut buf = Vec::new();
        for step in 0..400u64 {
            let now = step * 3_000;
            match max {
                None => {
                    while let Some(t) = a.poll_transmit(now, &mut buf) {
                        b.handle_datagram(now, a_addr, &buf[..t.len]);
                        out.push((t.priority, buf[..t.len].to_vec()));
                    }
                }
                Some(max) => {
                    while let Some(t) = a.poll_transmit_burst(now, max, &mut buf) {
                        for i in 0..t.count {
                            let mut d = buf[i * t.header_len..][..t.header_len].to_vec();
                            d.extend_from_slice(t.payload_of(i));
                            b.handle_datagram(now, a_addr, &d);
                            out.push((t.priority, d));
                        }
                    }
                }
            }
            while let Some(t) = b.poll_transmit(now, &mut buf) {
                a.handle_datagram(now, b_addr, &buf[..t.len]);
            }
        }
        out
    }

    #[test]
    fn bursts_keep_each_packets_priority_across_the_unscheduled_boundary() {
        let single = granted_stream(None);
        assert!(single.len() > 200, "{}", single.len());
        let levels: std::collections::BTreeSet<u8> = single.iter().map(|p| p.0).collect();
        assert!(
            levels.len() >= 2,
            "unscheduled and scheduled levels: {levels:?}"
        );
        for max in [2, 7, 44, 64] {
            let burst = granted_stream(Some(max));
            assert_eq!(burst.len(), single.len(), "max {max}");
            for (i, (s, b)) in single.iter().zip(&burst).enumerate() {
                assert!(
                    s == b,
                    "packet {i} differs with bursts of {max}: priority {} vs {}",
                    s.0,
                    b.0
                );
            }
        }
    }
}
