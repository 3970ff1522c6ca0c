//! Driving `homa_proto::Endpoint`s over a [`Fabric`].
//!
//! Each host owns an endpoint and an application ([`App`]). After every input
//! to an endpoint (datagram, timer, application call) the driver hands the
//! endpoint's events to the application, drains `poll_transmit` into the host's
//! NIC queue, and makes sure a timer event is pending for `poll_timeout()`.
//! The engine's pacer decides how much it releases; when it releases nothing
//! the driver asks again at the timeout (which covers the pacer's next
//! release) or after the next input. A NIC completion is no input to the
//! endpoint, so it is polled then only if its deadline has come; an engine
//! timer that fires before the (since moved) deadline only re-arms itself.
//!
//! Timers are lazy: at most one live timer event per host. A new deadline later
//! than the pending one leaves the pending event in place; when that fires early
//! the driver only re-arms it, so `handle_timeout` is never called before the
//! engine's deadline. An earlier deadline bumps a generation number, which makes
//! the older event stale (ignored when it fires).

use crate::clock::HostClock;
use crate::faults::FaultStats;
use crate::net::{addr_host, fnv, host_addr, mix, Fabric, HostId, Hosts, NetStats, Packet};
use crate::sched::Time;
use crate::timeline::Timeline;
use bytes::Bytes;
use homa_proto::driver::FastPath as _;
use homa_proto::{Config, ConfigError, Endpoint, Event, RpcError, RpcId, SendError, ServerRpc};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;

const KIND_ENGINE: u32 = 0;
const KIND_APP: u32 = 1;
const KIND_CRASH: u32 = 2;
const KIND_RESTART: u32 = 3;
const KIND_START: u32 = 4;

/// Most datagrams taken from one endpoint in one go; a safety net against an
/// engine that never stops releasing (the rest are taken at the next NIC
/// completion).
const MAX_BURST: usize = 1 << 16;

/// An application running on one host. Every method gets a [`HostCtx`] through
/// which it can use its endpoint and schedule wake-ups; the driver transmits
/// whatever the endpoint has to send after each call.
pub trait App {
    /// Called once at the start of the run (time of [`EngineNet::new`]).
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        let _ = ctx;
    }
    /// The endpoint produced an event.
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event);
    /// A wake-up set with [`HostCtx::wake_at`] is due.
    fn on_wakeup(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        let _ = (ctx, token);
    }
    /// The host's endpoint crashed: its state is gone and every RPC it had is
    /// lost without an event. Wake-ups still fire while it is down, but sends fail.
    fn on_crash(&mut self, host: HostId, now: Time) {
        let _ = (host, now);
    }
    /// A fresh endpoint replaced the crashed one.
    fn on_restart(&mut self, ctx: &mut HostCtx<'_>) {
        let _ = ctx;
    }
}

impl<T: App + ?Sized> App for Box<T> {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        (**self).on_start(ctx)
    }
    fn on_event(&mut self, ctx: &mut HostCtx<'_>, event: Event) {
        (**self).on_event(ctx, event)
    }
    fn on_wakeup(&mut self, ctx: &mut HostCtx<'_>, token: u64) {
        (**self).on_wakeup(ctx, token)
    }
    fn on_crash(&mut self, host: HostId, now: Time) {
        (**self).on_crash(host, now)
    }
    fn on_restart(&mut self, ctx: &mut HostCtx<'_>) {
        (**self).on_restart(ctx)
    }
}

/// An application's view of its host during a callback.
pub struct HostCtx<'a> {
    net: &'a mut Fabric,
    host: HostId,
    ep: Option<&'a mut Endpoint>,
    rng: &'a mut ChaCha8Rng,
    /// The host's clock (see [`EngineNet::set_clock`]).
    clock: HostClock,
    /// Per-request timelines, if enabled: requests an app starts here are
    /// followed as those started through [`EngineNet::send_request`].
    timeline: Option<&'a mut Timeline>,
}

impl<'a> HostCtx<'a> {
    #[inline]
    pub fn now(&self) -> Time {
        self.net.now()
    }
    #[inline]
    pub fn host(&self) -> HostId {
        self.host
    }
    /// This host's address.
    pub fn addr(&self) -> SocketAddr {
        host_addr(self.host)
    }
    /// Another host's address.
    pub fn addr_of(&self, h: HostId) -> SocketAddr {
        host_addr(h)
    }
    /// The host with address `addr`, if it exists.
    #[inline]
    pub fn host_of(&self, addr: SocketAddr) -> Option<HostId> {
        self.net.host_of(addr)
    }
    pub fn n_hosts(&self) -> usize {
        self.net.n_hosts()
    }
    /// False while the host is crashed.
    pub fn is_up(&self) -> bool {
        self.ep.is_some()
    }
    /// The endpoint, unless the host is down.
    #[inline]
    pub fn endpoint(&mut self) -> Option<&mut Endpoint> {
        self.ep.as_deref_mut()
    }
    /// The network (read-only: statistics, queue lengths).
    pub fn fabric(&self) -> &Fabric {
        self.net
    }
    /// This host's seeded random generator (independent of other hosts and of
    /// the network's fault RNG).
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        self.rng
    }
    /// Starts an RPC to host `dst`.
    #[inline]
    pub fn send_request(&mut self, dst: HostId, request: Bytes) -> Result<RpcId, SendError> {
        let at = self.net.now();
        if let Some(tl) = self.timeline.as_deref_mut() {
            tl.starting(self.host, request.len(), at);
        }
        let now = self.clock.host_time(at);
        let r = match self.ep.as_deref_mut() {
            Some(ep) => ep.send_request(now, host_addr(dst), request),
            None => Err(SendError::Shutdown),
        };
        if let (Some(tl), Ok(id)) = (self.timeline.as_deref_mut(), &r) {
            tl.started(self.host, id.0);
        }
        r
    }
    /// Answers a request.
    pub fn send_response(&mut self, rpc: ServerRpc, response: Bytes) -> Result<(), SendError> {
        let now = self.clock.host_time(self.net.now());
        match self.ep.as_deref_mut() {
            Some(ep) => ep.send_response(now, rpc, response),
            None => Err(SendError::Shutdown),
        }
    }
    /// Abandons a client RPC.
    #[inline]
    pub fn cancel(&mut self, id: RpcId) {
        if let Some(ep) = self.ep.as_deref_mut() {
            ep.cancel(id);
        }
    }
    /// Calls [`App::on_wakeup`] with `token` at time `at` (now if in the past).
    pub fn wake_at(&mut self, at: Time, token: u64) {
        self.net.schedule(at, self.host, KIND_APP, token);
    }
    /// Calls [`App::on_wakeup`] with `token` after `delay` ns.
    pub fn wake_after(&mut self, delay: Time, token: u64) {
        let at = self.net.now().saturating_add(delay);
        self.net.schedule(at, self.host, KIND_APP, token);
    }
}

/// Counters of the driver itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DriverStats {
    /// Datagrams handed to endpoints.
    pub datagrams_in: u64,
    /// Datagrams taken from endpoints.
    pub datagrams_out: u64,
    /// Datagrams addressed to an address that is no host of this network.
    pub unknown_dest: u64,
    /// `handle_timeout` calls.
    pub timeouts: u64,
    /// Engine timer events that were stale or early (no `handle_timeout`).
    pub idle_timer_events: u64,
    /// Times the engine still wanted a timeout at `now` right after handling
    /// one (re-armed 1 ns later to guarantee progress).
    pub timer_spins: u64,
    /// Events handed to applications.
    pub app_events: u64,
    /// Application wake-ups delivered.
    pub app_wakeups: u64,
    /// NIC completions after which the endpoint was not polled because it had
    /// nothing to send before its next deadline.
    pub idle_nic_polls_skipped: u64,
}

// `repr(C)`: what the driver reads and writes around every input and
// pump (the timer's state and the clock) shares the first cache line,
// ahead of the endpoint (itself laid out by use) and the cold rest. In a
// simulator of many hosts each event finds its host cold.
#[repr(C)]
struct EngineHost<A> {
    /// Time of the live engine timer event, if any.
    timer_at: Option<Time>,
    timer_gen: u64,
    /// Last time `handle_timeout` ran (spin guard).
    handled_at: Option<Time>,
    /// The endpoint's clock: the endpoint is given
    /// `clock.host_time(net.now())`, and its deadlines are taken back with
    /// `clock.net_time`.
    clock: HostClock,
    ep: Option<Endpoint>,
    app: A,
    rng: ChaCha8Rng,
    cfg: Config,
    incarnation: u64,
}

/// The [`Hosts`] implementation for endpoints plus applications.
struct Engines<A> {
    hosts: Vec<EngineHost<A>>,
    stats: DriverStats,
    /// Per host: the endpoint needs polling again only from this time on
    /// (without other input): its `poll_timeout()` when the last pump left
    /// it with nothing to send, `Time::MAX` if it had no deadline, 0 if it
    /// may have more (the pump stopped at `MAX_BURST`, or the host is down).
    /// Apart from the hosts, so that a NIC completion reads one small array.
    poll_due: Vec<Time>,
    /// Skip polls that cannot yield anything (see `nic_done`); tests turn
    /// it off to check that skipping changes nothing.
    skip_idle_polls: bool,
    /// Per-request timelines, if enabled ([`EngineNet::enable_timeline`]).
    timeline: Option<Box<Timeline>>,
    /// No receiver reads payload bytes ([`EngineNet::set_payload_bytes_unread`]).
    payload_unread: bool,
    /// Its buffers.
    unread: Unread,
}

/// Buffers for payloads nobody reads: a datagram's headers are written into
/// `hdr`, which becomes the datagram unless they are copied to the front of a
/// kept buffer: one of the delivered datagrams
/// of `full_len` bytes (the longest seen, more than `SMALL_DATAGRAM`: full
/// DATA packets), kept at that length for a later datagram of the same
/// length to take over with only its headers written.
#[derive(Default)]
struct Unread {
    hdr: Vec<u8>,
    sized: Vec<Vec<u8>>,
    full_len: usize,
}

/// With payloads unread, datagrams up to this length are always built whole.
const SMALL_DATAGRAM: usize = 512;
/// At most this many buffers kept at their length.
const MAX_SIZED_BUFS: usize = 4096;

/// A stream's peer host and which end we are, as one digest word.
fn stream_host(s: &homa_proto::StreamId) -> u64 {
    addr_host(s.peer).map_or(u64::MAX, |h| h as u64) << 1 | s.opener as u64
}

fn event_digest(ev: &Event) -> [u64; 4] {
    fn msg_hash(m: &homa_proto::Message) -> u64 {
        m.fragments().fold(m.len() as u64, |h, f| mix(h ^ fnv(f)))
    }
    match ev {
        Event::Request { rpc, message } => [
            1,
            rpc.id,
            addr_host(rpc.peer).map_or(u64::MAX, |h| h as u64),
            msg_hash(message),
        ],
        Event::Response { id, message } => [2, id.0, 0, msg_hash(message)],
        Event::PartialRequest { rpc, message } => [
            4,
            rpc.id,
            addr_host(rpc.peer).map_or(u64::MAX, |h| h as u64),
            message.serial() ^ (message.len() as u64) << 32,
        ],
        Event::PartialResponse { id, message } => {
            [5, id.0, 0, message.serial() ^ (message.len() as u64) << 32]
        }
        Event::PartialProgress { serial } => [6, *serial, 0, 0],
        Event::StreamOpened { stream } => [7, stream.id, stream_host(stream), 0],
        Event::StreamReadable { stream } => [8, stream.id, stream_host(stream), 0],
        Event::StreamWritable { stream } => [9, stream.id, stream_host(stream), 0],
        Event::Failed { id, error } => [
            3,
            id.0,
            match error {
                RpcError::Timeout => 1,
                RpcError::ResponseTooLong => 2,
                RpcError::Shutdown => 3,
                RpcError::PoolExhausted => 4,
            },
            0,
        ],
    }
}

impl<A: App> Engines<A> {
    /// Hands pending events to the app, drains transmissions into the NIC and
    /// re-arms the engine timer.
    fn pump(&mut self, net: &mut Fabric, h: HostId) {
        let now = net.now();
        let host = &mut self.hosts[h];
        while let Some(ev) = host.ep.as_mut().and_then(|e| e.poll_event()) {
            self.stats.app_events += 1;
            if net.trace_enabled() {
                net.trace_mix(now);
                net.trace_mix(h as u64);
                for v in event_digest(&ev) {
                    net.trace_mix(v);
                }
            }
            let mut ctx = HostCtx {
                net: &mut *net,
                host: h,
                ep: host.ep.as_mut(),
                rng: &mut host.rng,
                clock: host.clock,
                timeline: self.timeline.as_deref_mut(),
            };
            host.app.on_event(&mut ctx, ev);
        }
        let Some(ep) = host.ep.as_mut() else {
            return;
        };
        // Most pumps follow an input that queued nothing to send: those skip
        // the buffer handling of a poll that would find nothing.
        let clock = host.clock;
        let host_now = clock.host_time(now);
        let mut drained = self.skip_idle_polls && ep.poll_nothing_to_send(host_now);
        let mut burst = if drained { 0 } else { MAX_BURST };
        while burst > 0 {
            burst -= 1;
            let sent = if self.payload_unread {
                Self::poll_unread(ep, &mut self.unread, net, host_now)
            } else {
                let mut buf = net.take_buf();
                match ep.poll_transmit(host_now, &mut buf) {
                    Some(t) => Some((t, buf)),
                    None => {
                        net.recycle(buf);
                        None
                    }
                }
            };
            match sent {
                Some((t, mut buf)) => {
                    self.stats.datagrams_out += 1;
                    buf.truncate(t.len);
                    let dest = net.host_of(t.dest);
                    if let Some(tl) = self.timeline.as_deref_mut() {
                        tl.transmitted(h, dest, &buf, net.host_tx_time(h, buf.len()), now);
                    }
                    match dest {
                        Some(d) => {
                            net.send(h, d, t.priority, buf);
                        }
                        None => {
                            self.stats.unknown_dest += 1;
                            net.count_no_route();
                            net.recycle(buf);
                        }
                    }
                }
                None => {
                    drained = true;
                    break;
                }
            }
        }
        let deadline = ep.poll_timeout().map(|d| clock.net_time(d));
        self.poll_due[h] = if drained {
            deadline.unwrap_or(Time::MAX)
        } else {
            0
        };
        if let Some(d) = deadline {
            Self::arm(host, &mut self.stats, net, h, d);
        }
    }

    /// `poll_transmit` for receivers that read no payload bytes: a DATA
    /// packet's payload is not copied when a kept buffer of the datagram's
    /// length can take its headers (its payload bytes are then whatever that
    /// buffer held). Returns the datagram.
    #[inline]
    fn poll_unread(
        ep: &mut Endpoint,
        u: &mut Unread,
        net: &mut Fabric,
        now: Time,
    ) -> Option<(homa_proto::Transmit, Vec<u8>)> {
        let (t, payload) = ep.poll_transmit_split(now, &mut u.hdr)?;
        let headers = u.hdr.len();
        if headers < t.len && t.len == u.full_len {
            match u.sized.pop() {
                Some(mut kept) if kept.len() == t.len => {
                    kept[..headers].copy_from_slice(&u.hdr);
                    return Some((t, kept));
                }
                // Kept when `full_len` was shorter.
                Some(old) => net.recycle(old),
                None => {}
            }
        }
        // The headers' buffer becomes the datagram (a control packet or a
        // short message's is whole already); a fresh one takes its place.
        let mut buf = std::mem::replace(&mut u.hdr, net.take_buf());
        buf.extend_from_slice(&payload);
        buf.resize(t.len, 0);
        Some((t, buf))
    }

    /// Makes sure an engine timer event is pending no later than `deadline`
    /// (and not at `now` again right after a `handle_timeout` at `now`).
    fn arm(
        host: &mut EngineHost<A>,
        stats: &mut DriverStats,
        net: &mut Fabric,
        h: HostId,
        deadline: Time,
    ) {
        let now = net.now();
        let floor = if host.handled_at == Some(now) {
            now + 1
        } else {
            now
        };
        if deadline < floor && floor > now {
            stats.timer_spins += 1;
        }
        let d = deadline.max(floor);
        if host.timer_at.is_none_or(|t| d < t) {
            host.timer_gen += 1;
            host.timer_at = Some(d);
            net.schedule(d, h, KIND_ENGINE, host.timer_gen);
        }
    }

    fn with_ctx<R>(
        &mut self,
        net: &mut Fabric,
        h: HostId,
        f: impl FnOnce(&mut A, &mut HostCtx<'_>) -> R,
    ) -> R {
        let host = &mut self.hosts[h];
        let mut ctx = HostCtx {
            net: &mut *net,
            host: h,
            ep: host.ep.as_mut(),
            rng: &mut host.rng,
            clock: host.clock,
            timeline: self.timeline.as_deref_mut(),
        };
        let r = f(&mut host.app, &mut ctx);
        self.pump(net, h);
        r
    }

    fn crash(&mut self, net: &mut Fabric, h: HostId) {
        let host = &mut self.hosts[h];
        if host.ep.is_none() {
            return;
        }
        host.ep = None;
        self.poll_due[h] = 0;
        host.timer_at = None;
        host.timer_gen += 1;
        net.count_crash(false);
        net.set_host_up(h, false);
        net.purge_nic(h);
        net.trace_mix(0xC7A5_0000 ^ h as u64);
        host.app.on_crash(h, net.now());
    }

    fn restart(&mut self, net: &mut Fabric, h: HostId) {
        let host = &mut self.hosts[h];
        if host.ep.is_some() {
            return;
        }
        host.incarnation += 1;
        let mut cfg = host.cfg.clone();
        cfg.rpc_id_seed = mix(cfg.rpc_id_seed ^ mix(host.incarnation ^ ((h as u64) << 32)));
        host.ep = Some(
            Endpoint::new(cfg, host.clock.host_time(net.now()))
                .expect("configuration was valid at creation"),
        );
        host.handled_at = None;
        net.count_crash(true);
        net.set_host_up(h, true);
        net.trace_mix(0x5EED_0000 ^ h as u64);
        self.with_ctx(net, h, |app, ctx| app.on_restart(ctx));
    }
}

impl<A: App> Hosts for Engines<A> {
    fn deliver(&mut self, net: &mut Fabric, h: HostId, pkt: Packet) {
        let now = net.now();
        let clock = self.hosts[h].clock;
        if let Some(ep) = self.hosts[h].ep.as_mut() {
            self.stats.datagrams_in += 1;
            if let Some(tl) = self.timeline.as_deref_mut() {
                tl.delivered(pkt.src, h, &pkt.data, pkt.sent_at, now);
            }
            ep.handle_datagram(clock.host_time(now), host_addr(pkt.src), &pkt.data);
        }
        let len = pkt.data.len();
        let u = &mut self.unread;
        if self.payload_unread
            && len > SMALL_DATAGRAM
            && len >= u.full_len
            && u.sized.len() < MAX_SIZED_BUFS
        {
            u.full_len = len;
            u.sized.push(pkt.data);
        } else {
            net.recycle(pkt.data);
        }
        self.pump(net, h);
    }

    /// The NIC can take more, but the endpoint is asked again only if it may
    /// have more to release: `poll_transmit` promises nothing new until its
    /// `poll_timeout()` deadline or another input, and every input is
    /// followed by a pump that records that deadline.
    fn nic_done(&mut self, net: &mut Fabric, h: HostId) {
        let now = net.now();
        if now < self.poll_due[h] && self.skip_idle_polls {
            self.stats.idle_nic_polls_skipped += 1;
            return;
        }
        self.pump(net, h);
    }

    fn timer(&mut self, net: &mut Fabric, h: HostId, kind: u32, token: u64) {
        let now = net.now();
        match kind {
            KIND_ENGINE => {
                let host = &mut self.hosts[h];
                if token != host.timer_gen || host.ep.is_none() {
                    self.stats.idle_timer_events += 1;
                    return;
                }
                host.timer_at = None;
                let clock = host.clock;
                let ep = host.ep.as_mut().expect("checked above");
                match ep.poll_timeout().map(|d| clock.net_time(d)) {
                    Some(d) if d <= now => {
                        self.stats.timeouts += 1;
                        ep.handle_timeout(clock.host_time(now));
                        host.handled_at = Some(now);
                    }
                    // Early (the deadline moved later since this event was
                    // set) and nothing to send before the new deadline: a
                    // pump would only re-arm the timer (see `nic_done`).
                    deadline if now < self.poll_due[h] && self.skip_idle_polls => {
                        self.stats.idle_timer_events += 1;
                        self.poll_due[h] = deadline.unwrap_or(Time::MAX);
                        if let Some(d) = deadline {
                            Self::arm(host, &mut self.stats, net, h, d);
                        }
                        return;
                    }
                    _ => self.stats.idle_timer_events += 1,
                }
                self.pump(net, h);
            }
            KIND_APP => {
                self.stats.app_wakeups += 1;
                self.with_ctx(net, h, |app, ctx| app.on_wakeup(ctx, token));
            }
            KIND_START => self.with_ctx(net, h, |app, ctx| app.on_start(ctx)),
            KIND_CRASH => {
                self.crash(net, h);
                if token != u64::MAX {
                    let inc = self.hosts[h].incarnation;
                    net.schedule(now.saturating_add(token), h, KIND_RESTART, inc);
                }
            }
            KIND_RESTART => {
                // Only the restart that matches the crash it was scheduled by.
                if token == self.hosts[h].incarnation {
                    self.restart(net, h);
                }
            }
            _ => unreachable!("unknown timer kind {kind}"),
        }
    }
}

/// A deterministic in-memory network of Homa endpoints, each with an
/// application. See the crate documentation for an example.
pub struct EngineNet<A: App> {
    fabric: Fabric,
    engines: Engines<A>,
}

impl<A: App> EngineNet<A> {
    /// One endpoint per host of `fabric`, configured by `config(h)`, running
    /// `app(h)`. Each app's `on_start` runs at the current time, in host order,
    /// as the first events of the run.
    pub fn new(
        mut fabric: Fabric,
        mut config: impl FnMut(HostId) -> Config,
        mut app: impl FnMut(HostId) -> A,
    ) -> Result<EngineNet<A>, ConfigError> {
        let now = fabric.now();
        let n_hosts = fabric.n_hosts();
        let mut hosts = Vec::with_capacity(n_hosts);
        for h in 0..fabric.n_hosts() {
            let cfg = config(h);
            let ep = Endpoint::new(cfg.clone(), now)?;
            hosts.push(EngineHost {
                ep: Some(ep),
                app: app(h),
                cfg,
                incarnation: 0,
                timer_at: None,
                timer_gen: 0,
                handled_at: None,
                rng: ChaCha8Rng::seed_from_u64(mix(fabric.seed() ^ mix(0xA99 ^ h as u64))),
                clock: HostClock::default(),
            });
            fabric.schedule(now, h, KIND_START, 0);
        }
        Ok(EngineNet {
            fabric,
            engines: Engines {
                hosts,
                stats: DriverStats::default(),
                poll_due: vec![0; n_hosts],
                skip_idle_polls: true,
                timeline: None,
                payload_unread: false,
                unread: Unread::default(),
            },
        })
    }

    /// Every host gets `config` (with `link_bps` set to its uplink's rate when
    /// it has one) and `app(h)`.
    pub fn uniform(
        fabric: Fabric,
        config: Config,
        app: impl FnMut(HostId) -> A,
    ) -> Result<EngineNet<A>, ConfigError> {
        let rates: Vec<Option<u64>> = (0..fabric.n_hosts())
            .map(|h| fabric.host_nic(h).map(|l| fabric.link_info(l).rate_bps))
            .collect();
        EngineNet::new(
            fabric,
            |h| {
                config
                    .clone()
                    .with_link_bps(rates[h].unwrap_or(config.link_bps))
            },
            app,
        )
    }

    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }
    /// The network, for configuration (faults, partitions, stats resets).
    pub fn fabric_mut(&mut self) -> &mut Fabric {
        &mut self.fabric
    }
    pub fn now(&self) -> Time {
        self.fabric.now()
    }
    pub fn n_hosts(&self) -> usize {
        self.engines.hosts.len()
    }
    /// Host `h`'s synthetic address.
    pub fn addr(&self, h: HostId) -> SocketAddr {
        host_addr(h)
    }
    /// Host `h`'s endpoint; panics if the host is down (see [`Self::try_endpoint`]).
    pub fn endpoint(&self, h: HostId) -> &Endpoint {
        self.engines.hosts[h].ep.as_ref().expect("host is down")
    }
    pub fn try_endpoint(&self, h: HostId) -> Option<&Endpoint> {
        self.engines.hosts[h].ep.as_ref()
    }
    /// The configuration host `h` was created with.
    pub fn config(&self, h: HostId) -> &Config {
        &self.engines.hosts[h].cfg
    }
    pub fn app(&self, h: HostId) -> &A {
        &self.engines.hosts[h].app
    }
    pub fn app_mut(&mut self, h: HostId) -> &mut A {
        &mut self.engines.hosts[h].app
    }
    pub fn apps(&self) -> impl Iterator<Item = &A> + '_ {
        self.engines.hosts.iter().map(|h| &h.app)
    }
    pub fn is_up(&self, h: HostId) -> bool {
        self.engines.hosts[h].ep.is_some()
    }
    /// How many times host `h` was restarted.
    pub fn incarnation(&self, h: HostId) -> u64 {
        self.engines.hosts[h].incarnation
    }
    pub fn driver_stats(&self) -> &DriverStats {
        &self.engines.stats
    }

    /// Host `h`'s clock reads `offset` ns ahead of the network's from now
    /// on, at its current rate (hosts' clocks are not synchronised); see
    /// [`Self::set_clock`].
    pub fn set_clock_offset(&mut self, h: HostId, offset: Time) {
        let clock = HostClock {
            offset,
            ..self.engines.hosts[h].clock
        };
        self.set_clock(h, clock);
    }

    /// Host `h`'s endpoint reads time from `clock` from now on: an offset
    /// and a rate error against the network's clock. Set it before any
    /// traffic: the endpoint's clock jumps forward by the change, like a
    /// pause. Its deadlines are converted back, so only what the endpoint
    /// sees of time differs; applications keep the network's time.
    pub fn set_clock(&mut self, h: HostId, clock: HostClock) {
        let now = self.fabric.now();
        let host = &mut self.engines.hosts[h];
        assert!(
            clock.host_time(now) >= host.clock.host_time(now),
            "a clock must not go back"
        );
        host.clock = clock;
    }

    /// Host `h`'s clock.
    pub fn clock(&self, h: HostId) -> HostClock {
        self.engines.hosts[h].clock
    }

    /// Runs `f` with host `h`'s app and context at the current time, then
    /// transmits what the endpoint has to send. The way to act on a host from
    /// outside the event loop.
    pub fn with_host<R>(&mut self, h: HostId, f: impl FnOnce(&mut A, &mut HostCtx<'_>) -> R) -> R {
        self.engines.with_ctx(&mut self.fabric, h, f)
    }

    /// Host `src` starts an RPC to host `dst` now.
    pub fn send_request(
        &mut self,
        src: HostId,
        dst: HostId,
        request: Bytes,
    ) -> Result<RpcId, SendError> {
        self.with_host(src, |_, ctx| ctx.send_request(dst, request))
    }

    /// Tells the network that no receiver reads the payload bytes of what it
    /// receives (their engines discard payloads and check no checksums): a
    /// DATA packet then reuses a delivered datagram's buffer of the same
    /// length and only its headers are written, so its payload bytes are
    /// unspecified (in practice another packet's payload). Datagram lengths,
    /// headers, timing and every result stay the same; it saves copying each
    /// payload. Off by default.
    pub fn set_payload_bytes_unread(&mut self, unread: bool) {
        self.engines.payload_unread = unread;
        if !unread {
            self.engines.unread = Unread::default();
        }
    }

    /// Follows every request of `min_len..=max_len` bytes started with
    /// [`Self::send_request`] from then on (see [`Timeline`]).
    pub fn enable_timeline(&mut self, min_len: u32, max_len: u32) {
        self.enable_timelines(&[(min_len, max_len)]);
    }

    /// Follows every request whose length is in one of `ranges`
    /// (`min..=max` each) from then on; one summary table per range.
    pub fn enable_timelines(&mut self, ranges: &[(u32, u32)]) {
        self.engines.timeline = Some(Box::new(Timeline::with_ranges(ranges)));
    }

    /// The timelines, if enabled.
    pub fn timeline(&self) -> Option<&Timeline> {
        self.engines.timeline.as_deref()
    }

    /// Host `h` answers `rpc` now.
    pub fn send_response(
        &mut self,
        h: HostId,
        rpc: ServerRpc,
        response: Bytes,
    ) -> Result<(), SendError> {
        self.with_host(h, |_, ctx| ctx.send_response(rpc, response))
    }

    /// Processes one event; false if there was none.
    pub fn step(&mut self) -> bool {
        self.fabric.step(&mut self.engines)
    }

    /// Processes the next event if it is due at or before `limit`; false if
    /// there was none.
    pub fn step_until(&mut self, limit: Time) -> bool {
        self.fabric.step_until(&mut self.engines, limit)
    }

    /// Processes every event up to and including `t`; the clock ends at `t`.
    pub fn run_until(&mut self, t: Time) {
        self.fabric.run_until(&mut self.engines, t)
    }

    /// Runs for `d` ns from now.
    pub fn run_for(&mut self, d: Time) {
        let t = self.now().saturating_add(d);
        self.run_until(t)
    }

    /// Processes events until the queue is empty (true) or the next event is
    /// later than `limit` (false). Note that engines with pending timers
    /// (e.g. idle-peer cleanup) keep the queue non-empty until those expire.
    pub fn run_until_idle(&mut self, limit: Time) -> bool {
        self.fabric.run_until_idle(&mut self.engines, limit)
    }

    /// Processes events until `done(self)` holds (checked before each event;
    /// true) or the next event is past `limit` / none is left (false).
    pub fn run_until_cond(&mut self, limit: Time, mut done: impl FnMut(&Self) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.fabric.next_event_time() {
                Some(t) if t <= limit => {
                    self.step();
                }
                _ => return false,
            }
        }
    }

    /// Crashes host `h` now: its endpoint and every packet in its NIC queue are
    /// discarded, packets to it are dropped while it is down, and its app is
    /// told. With `Some(d)` a fresh endpoint (new `rpc_id_seed`) replaces it
    /// after `d` ns; with `None` it stays down until [`Self::restart`].
    pub fn crash(&mut self, h: HostId, downtime: Option<Time>) {
        self.engines.crash(&mut self.fabric, h);
        if let Some(d) = downtime {
            let at = self.now().saturating_add(d);
            let inc = self.engines.hosts[h].incarnation;
            self.fabric.schedule(at, h, KIND_RESTART, inc);
        }
    }

    /// Schedules [`Self::crash`] of host `h` at time `at`.
    pub fn schedule_crash(&mut self, at: Time, h: HostId, downtime: Option<Time>) {
        self.fabric
            .schedule(at, h, KIND_CRASH, downtime.unwrap_or(u64::MAX));
    }

    /// Restarts a crashed host now (no effect if it is up).
    pub fn restart(&mut self, h: HostId) {
        self.engines.restart(&mut self.fabric, h);
    }

    /// Turns on the trace hash (packet deliveries, application events, crashes).
    pub fn enable_trace(&mut self, on: bool) {
        self.fabric.enable_trace(on);
    }

    /// A hash of the trace and of every network, fault and driver counter:
    /// equal digests mean (with overwhelming probability) identical runs.
    pub fn digest(&self) -> u64 {
        let mut hs = MixHasher(self.fabric.trace_hash());
        self.now().hash(&mut hs);
        let s: &NetStats = self.fabric.stats();
        s.hash(&mut hs);
        let f: &FaultStats = self.fabric.fault_stats();
        f.hash(&mut hs);
        self.engines.stats.hash(&mut hs);
        for l in 0..self.fabric.n_links() {
            self.fabric.link_stats(l).hash(&mut hs);
        }
        hs.finish()
    }
}

/// A std `Hasher` built on [`mix`], stable across Rust versions and runs.
pub(crate) struct MixHasher(pub u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        mix(self.0)
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = mix(self.0 ^ u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = mix(self.0 ^ v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::{pattern, Reply, TestApp};
    use crate::faults::FaultConfig;
    use crate::net::LinkStats;

    /// Echo RPCs of sizes from one packet to many (paced by the engines),
    /// in waves, among four hosts with some loss and reordering; the trace,
    /// every counter and the end time.
    fn run(skip: bool) -> (u64, Time, DriverStats, NetStats, Vec<LinkStats>) {
        run_with(skip, Config::default(), false)
    }

    /// [`run`] with engine configuration `cfg`, payload bytes unread or not.
    fn run_with(
        skip: bool,
        cfg: Config,
        unread: bool,
    ) -> (u64, Time, DriverStats, NetStats, Vec<LinkStats>) {
        let fabric = Fabric::star(4, 10_000_000_000, 500, 250).with_seed(3);
        let mut net = EngineNet::uniform(fabric, cfg, |_| TestApp::new(Reply::Echo)).unwrap();
        net.engines.skip_idle_polls = skip;
        net.set_payload_bytes_unread(unread);
        net.enable_trace(true);
        net.fabric_mut().set_faults(FaultConfig {
            loss: 0.002,
            reorder: 0.01,
            reorder_max_ns: 3_000,
            ..FaultConfig::NONE
        });
        let sizes = [10usize, 1_400, 5_000, 40_000, 300_000];
        for wave in 0..6u64 {
            for i in 0..12usize {
                let (src, dst) = (i % 4, (i + 1 + wave as usize) % 4);
                if src != dst {
                    let len = sizes[(i + wave as usize) % sizes.len()];
                    net.send_request(src, dst, pattern(len, wave * 100 + i as u64))
                        .unwrap();
                }
            }
            net.run_for(150_000);
        }
        net.run_for(200_000_000);
        if unread {
            // Full packets did take delivered buffers over.
            let full = net.engines.unread.full_len;
            assert!(full > 1_000, "{full}");
        }
        let links = (0..net.fabric().n_links())
            .map(|l| net.fabric().link_stats(l))
            .collect();
        (
            net.fabric().trace_hash(),
            net.now(),
            *net.driver_stats(),
            *net.fabric().stats(),
            links,
        )
    }

    #[test]
    fn skipping_idle_polls_changes_nothing() {
        let polled = run(false);
        let mut skipped = run(true);
        assert_eq!(polled.2.idle_nic_polls_skipped, 0);
        assert!(skipped.2.idle_nic_polls_skipped > 100, "{:?}", skipped.2);
        assert!(skipped.2.datagrams_out > 2_000, "{:?}", skipped.2);
        assert!(polled.3.delivered > 2_000 && polled.3.injected > polled.3.delivered);
        skipped.2.idle_nic_polls_skipped = 0;
        assert_eq!(polled, skipped);
    }

    /// Receivers that discard payloads and check no checksums behave the
    /// same whether the network copies payload bytes or leaves a reused
    /// buffer's: every counter, link statistic and the end time agree (the
    /// trace hash covers payload bytes, which differ).
    #[test]
    fn unread_payload_bytes_change_nothing_else() {
        let cfg = Config::default()
            .with_discard_payload(true)
            .with_checksum(false);
        let copied = run_with(true, cfg.clone(), false);
        let reused = run_with(true, cfg, true);
        assert!(copied.2.datagrams_out > 2_000, "{:?}", copied.2);
        assert_eq!(copied.1, reused.1);
        assert_eq!((copied.2, copied.3), (reused.2, reused.3));
        assert_eq!(copied.4, reused.4);
    }
}
