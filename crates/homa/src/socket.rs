//! The UDP socket layer: one non-blocking socket, received in batches with
//! `recvmmsg` (splitting UDP GRO super-datagrams back into packets) and sent in
//! batches with `sendmmsg`, where consecutive packets to one destination at one
//! priority become a single UDP GSO send. Each send carries the packet's
//! priority as DSCP in an `IP_TOS` / `IPV6_TCLASS` control message. ICMP errors
//! are read from the error queue so that unreachable peers fail fast.
//!
//! Nothing here knows about Homa: it moves byte strings between the engine and
//! the kernel and counts what it sees.

use crate::sys::{read_sockaddr, write_sockaddr};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Receive buffer per datagram: the largest (GRO-coalesced) UDP payload.
pub(crate) const RX_BUF_SIZE: usize = 65_536;
/// Most packets in one GSO send (the kernel's limit is 64 on older kernels).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes in one GSO send (one IP datagram before segmentation).
const GSO_MAX_BYTES: usize = 65_000;
/// Initial capacity of a transmit buffer (see [`TxQueue::next_buf`]).
const SMALL_TX_BUF: usize = 2048;
/// Most `mmsghdr`s handed to one `sendmmsg`.
const TX_MAX_MSGS: usize = 64;
/// Control buffer per message: room for two int cmsgs (TOS and UDP_SEGMENT).
type Ctrl = [u64; 8];

/// How the socket is set up.
#[derive(Clone, Debug)]
pub(crate) struct SocketOptions {
    pub gso: bool,
    pub gro: bool,
    pub buffer_bytes: usize,
    /// Set DF and never fragment (see `EndpointConfig::dont_fragment`).
    pub dont_fragment: bool,
    /// TOS byte set on the socket itself: a lone packet with this TOS goes
    /// out with `sendto`, no control message (see [`TxQueue::flush`]).
    pub default_tos: u8,
    /// Set SO_REUSEPORT before bind (see `EndpointConfig::reuse_port`).
    pub reuse_port: bool,
}

/// Counters kept by the socket layer (the engine keeps its own).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketStats {
    /// `recvmmsg` calls that returned at least one datagram.
    pub recv_batches: u64,
    /// `recvmmsg` calls that found nothing (polling).
    pub recv_empty: u64,
    /// Packets handed to the engine (after GRO splitting).
    pub packets_received: u64,
    /// Received datagrams that carried several GRO-coalesced packets.
    pub gro_datagrams: u64,
    /// Times UDP GRO was switched on or off (see `RxBatch::note_sizes`).
    pub gro_switches: u64,
    /// Datagrams whose payload the kernel wrote straight into the receive
    /// pool (see `RxBatch::peek`), and times landing was switched on or off.
    pub landed: u64,
    pub landing_switches: u64,
    /// Landed datagrams whose headers differed from the peeked ones, or that
    /// were cut short (dropped; the protocol asks again).
    pub landing_failed: u64,
    pub bytes_received: u64,
    /// Datagrams the kernel truncated (larger than the receive buffer).
    pub truncated: u64,
    /// Datagrams from an address the runtime cannot represent.
    pub bad_source: u64,
    /// `sendmmsg` calls.
    pub send_calls: u64,
    /// Packets put on the wire (counting each GSO segment).
    pub packets_sent: u64,
    /// GSO sends (each carries two or more packets).
    pub gso_sends: u64,
    /// Lone packets sent with `sendto` (no cmsg: their TOS is the socket's).
    pub lone_sends: u64,
    pub bytes_sent: u64,
    /// Sends deferred because the socket buffer was full.
    pub send_would_block: u64,
    /// Packets dropped because the kernel refused them.
    pub send_errors: u64,
    /// Of those, packets larger than their route's MTU (`EMSGSIZE`; with
    /// `dont_fragment`, the configured MTU is too large for that path).
    pub send_too_big: u64,
    /// ICMP errors read from the error queue.
    pub icmp_errors: u64,
    /// Packets dropped by the fault injector.
    pub injected_rx_drops: u64,
    pub injected_tx_drops: u64,
}

/// One UDP socket, IPv4 or IPv6 (dual-stack when bound to `[::]`).
pub(crate) struct UdpSocket {
    sock: Socket,
    v6: bool,
    local: SocketAddr,
    /// UDP GSO is available (and not found broken at run time).
    gso: std::sync::atomic::AtomicBool,
    /// The kernel has UDP GRO and it was asked for (it is switched on only
    /// while long messages arrive, see `RxBatch::note_sizes`).
    gro: bool,
    /// The TOS the socket applies to packets without a TOS cmsg, for IPv4
    /// (also v4-mapped) and IPv6 destinations; `None` if it could not be set.
    tos_v4: Option<u8>,
    tos_v6: Option<u8>,
}

impl UdpSocket {
    pub(crate) fn bind(addr: SocketAddr, opts: &SocketOptions) -> io::Result<UdpSocket> {
        let v6 = addr.is_ipv6();
        let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
        let sock = Socket::new(
            domain,
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        if v6 {
            // `[::]` serves both families; a specific v6 address only its own.
            sock.set_only_v6(!addr.ip().is_unspecified())?;
        }
        set_buffer(
            &sock,
            libc::SO_RCVBUFFORCE,
            libc::SO_RCVBUF,
            opts.buffer_bytes,
        );
        set_buffer(
            &sock,
            libc::SO_SNDBUFFORCE,
            libc::SO_SNDBUF,
            opts.buffer_bytes,
        );
        if opts.reuse_port {
            sock.set_reuse_port(true)?;
        }
        sock.bind(&addr.into())?;
        let fd = sock.as_raw_fd();
        // ICMP errors (port unreachable...) go to the error queue instead of
        // being ignored, so the runtime can fail RPCs to a dead peer quickly.
        setsockopt_int(fd, libc::SOL_IP, libc::IP_RECVERR, 1).ok();
        if v6 {
            setsockopt_int(fd, libc::SOL_IPV6, libc::IPV6_RECVERR, 1).ok();
        }
        if opts.dont_fragment {
            // Best effort: without it the kernel fragments when needed.
            setsockopt_int(
                fd,
                libc::SOL_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )
            .ok();
            if v6 {
                setsockopt_int(
                    fd,
                    libc::SOL_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO,
                )
                .ok();
            }
        }
        let tos = opts.default_tos as libc::c_int;
        let tos_v4 = setsockopt_int(fd, libc::SOL_IP, libc::IP_TOS, tos)
            .ok()
            .map(|_| opts.default_tos);
        let tos_v6 = if v6 {
            setsockopt_int(fd, libc::SOL_IPV6, libc::IPV6_TCLASS, tos)
                .ok()
                .map(|_| opts.default_tos)
        } else {
            None
        };
        let gso = opts.gso && getsockopt_int(fd, SOL_UDP, UDP_SEGMENT).is_ok();
        // Probed, then left off until long messages arrive: a GRO socket
        // receives short datagrams more slowly (`RxBatch::note_sizes`).
        let gro = opts.gro
            && setsockopt_int(fd, SOL_UDP, UDP_GRO, 1).is_ok()
            && setsockopt_int(fd, SOL_UDP, UDP_GRO, 0).is_ok();
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        Ok(UdpSocket {
            sock,
            v6,
            local,
            gso: std::sync::atomic::AtomicBool::new(gso),
            gro,
            tos_v4,
            tos_v6,
        })
    }
    /// The TOS a packet to `dest` gets without a TOS cmsg.
    fn default_tos(&self, dest: &SocketAddr) -> Option<u8> {
        if dest.is_ipv4() {
            self.tos_v4
        } else {
            self.tos_v6
        }
    }
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }
    pub(crate) fn is_v6(&self) -> bool {
        self.v6
    }
    pub(crate) fn gso(&self) -> bool {
        self.gso.load(std::sync::atomic::Ordering::Relaxed)
    }
    pub(crate) fn gro(&self) -> bool {
        self.gro
    }
    /// Switches UDP GRO on or off; false if the kernel refused.
    fn set_gro(&self, on: bool) -> bool {
        setsockopt_int(self.fd(), SOL_UDP, UDP_GRO, on as libc::c_int).is_ok()
    }
    /// Whether this socket can send to `dest` at all (family check).
    pub(crate) fn can_reach(&self, dest: &SocketAddr) -> bool {
        if self.v6 {
            // A v6 socket bound to a specific address cannot reach v4 peers.
            dest.is_ipv6() || self.local.ip().is_unspecified()
        } else {
            dest.is_ipv4()
        }
    }

    /// Drains the error queue; pushes (original destination, errno) for each
    /// ICMP or local error and returns how many were read.
    pub(crate) fn read_errors(
        &self,
        out: &mut Vec<(SocketAddr, i32)>,
        stats: &mut SocketStats,
    ) -> usize {
        let mut n = 0;
        for _ in 0..64 {
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            let mut name: libc::sockaddr_storage = unsafe { mem::zeroed() };
            let mut data = [0u8; 64];
            let mut ctrl: [u64; 32] = [0; 32];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
            hdr.msg_name = &mut name as *mut _ as *mut libc::c_void;
            hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            hdr.msg_controllen = mem::size_of_val(&ctrl);
            // SAFETY: every pointer in hdr refers to a live local buffer.
            let r = unsafe {
                libc::recvmsg(self.fd(), &mut hdr, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT)
            };
            if r < 0 {
                break;
            }
            n += 1;
            stats.icmp_errors += 1;
            let dest = read_sockaddr(&name, hdr.msg_namelen);
            // SAFETY: walking the control buffer the kernel filled, within
            // msg_controllen, with the libc CMSG helpers.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&hdr);
                while !c.is_null() {
                    let lvl = (*c).cmsg_level;
                    let ty = (*c).cmsg_type;
                    if (lvl == libc::SOL_IP && ty == libc::IP_RECVERR)
                        || (lvl == libc::SOL_IPV6 && ty == libc::IPV6_RECVERR)
                    {
                        let ee = std::ptr::read_unaligned(
                            libc::CMSG_DATA(c) as *const libc::sock_extended_err
                        );
                        if let Some(d) = dest {
                            out.push((d, ee.ee_errno as i32));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&hdr, c);
                }
            }
        }
        n
    }
}

fn set_buffer(sock: &Socket, force: libc::c_int, plain: libc::c_int, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // The FORCE variants ignore the system maximum but need CAP_NET_ADMIN.
    if setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, force, v).is_err() {
        setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, plain, v).ok();
    }
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: passes a pointer to a live int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: passes a pointer to a live int and its size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// Result of one receive attempt.
#[derive(Debug)]
pub(crate) enum RecvOutcome {
    /// Datagrams (before GRO splitting) were handed to the callback; `true`
    /// when the batch was full, so more may be waiting.
    Received(bool),
    /// Nothing was waiting.
    Empty,
    /// The kernel reported an error (usually a pending ICMP error, meaning the
    /// error queue should be read).
    Error,
}

/// Datagrams in a row without a packet of a multi-packet message after
/// which UDP GRO goes off again (see [`RxBatch::note_sizes`]). Long enough
/// that the short packets between a bulk transfer's messages (grants,
/// replies) keep it on.
const GRO_OFF_AFTER: u32 = 256;

/// The smallest datagram worth landing (see [`RxBatch::peek`]): below it
/// the extra system call costs more than the copy it saves. Only packets
/// larger than an Ethernet MTU reach it (loopback, jumbo frames).
pub(crate) const LANDING_MIN_BYTES: usize = 16 * 1024;
/// Datagrams in a row that could not land after which landing goes off.
const LANDING_OFF_AFTER: u32 = 64;

/// What [`RxBatch::peek`] found at the head of the socket's queue.
pub(crate) enum Peeked {
    /// A datagram of this length from this address; its first bytes are in
    /// [`RxBatch::peeked_head`].
    Datagram(SocketAddr, usize),
    Empty,
    Error,
}

/// What [`RxBatch::recv_landed`] did.
pub(crate) enum Landed<'a> {
    /// Received whole, with the peeked headers (these).
    Whole(&'a [u8]),
    /// Received, but cut short or with other headers than peeked: dropped
    /// (counted in `SocketStats::landing_failed`; the protocol asks again).
    Dropped,
    /// Not received: still queued.
    Queued,
}

/// Reusable buffers for `recvmmsg`.
pub(crate) struct RxBatch {
    /// Headers `0..dirty` may have been written by the last call.
    dirty: usize,
    /// How many datagrams to ask for next: 1 while traffic comes one
    /// datagram at a time (a full batch would cost the kernel an extra,
    /// failing receive attempt after the one that succeeds), the whole batch
    /// once two successive receives found something.
    vlen: usize,
    streak: u8,
    /// UDP GRO is on (see [`Self::note_sizes`]).
    gro_on: bool,
    /// Datagrams received since the last one of a multi-packet message.
    since_long: u32,
    /// All headers have been set up once.
    ready: bool,
    /// Landing is on (see [`Self::peek`]), and datagrams in a row that did
    /// not land.
    landing_on: bool,
    since_landed: u32,
    /// The first bytes of the datagram [`Self::peek`] found, and of the one
    /// [`Self::recv_landed`] received.
    peek_head: [u8; homa_proto::wire::MAX_LANDING_HEAD],
    landed_head: [u8; homa_proto::wire::MAX_LANDING_HEAD],
    data: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<Ctrl>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside the headers only ever point into this
// struct's own vectors and are rebuilt before each use.
unsafe impl Send for RxBatch {}

impl RxBatch {
    pub(crate) fn new(batch: usize) -> RxBatch {
        let n = batch.max(1);
        RxBatch {
            vlen: 1,
            streak: 0,
            gro_on: false,
            since_long: 0,
            dirty: 0,
            ready: false,
            landing_on: false,
            since_landed: 0,
            peek_head: [0; homa_proto::wire::MAX_LANDING_HEAD],
            landed_head: [0; homa_proto::wire::MAX_LANDING_HEAD],
            data: vec![0u8; n * RX_BUF_SIZE],
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            names: vec![unsafe { mem::zeroed() }; n],
            ctrl: vec![[0u64; 8]; n],
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                n
            ],
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            hdrs: vec![unsafe { mem::zeroed() }; n],
        }
    }

    /// Points header `i` at its buffers and clears what the kernel writes.
    fn reset(&mut self, i: usize) {
        self.iovs[i] = libc::iovec {
            iov_base: self.data[i * RX_BUF_SIZE..].as_mut_ptr() as *mut libc::c_void,
            iov_len: RX_BUF_SIZE,
        };
        let h = &mut self.hdrs[i];
        h.msg_len = 0;
        h.msg_hdr.msg_name = &mut self.names[i] as *mut _ as *mut libc::c_void;
        h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_hdr.msg_iov = &mut self.iovs[i];
        h.msg_hdr.msg_iovlen = 1;
        h.msg_hdr.msg_control = self.ctrl[i].as_mut_ptr() as *mut libc::c_void;
        h.msg_hdr.msg_controllen = mem::size_of::<Ctrl>();
        h.msg_hdr.msg_flags = 0;
    }

    /// Receives up to one batch without blocking and calls `f(source, data,
    /// segment)` for every datagram: `data` holds one packet, or several of
    /// `segment` bytes each (the last may be shorter) coalesced by GRO.
    pub(crate) fn recv(
        &mut self,
        sock: &UdpSocket,
        stats: &mut SocketStats,
        f: impl FnMut(SocketAddr, &[u8], usize),
    ) -> RecvOutcome {
        if self.vlen == 1 {
            return self.recv_one(sock, stats, f);
        }
        self.recv_batch(sock, stats, f)
    }

    /// One datagram at a time: plain `recvfrom`, which costs the kernel
    /// less than `recvmsg` (no message header or iovec to copy in, no
    /// control message out): ~250 ns less per busy-polled round trip, ~60 ns
    /// less per empty poll. With no GRO control message, a coalesced
    /// datagram is cut by its packets' own lengths
    /// (`wire::coalesced_segment`). Every busy poll and every short
    /// exchange comes here; it touches no message header.
    pub(crate) fn recv_one(
        &mut self,
        sock: &UdpSocket,
        stats: &mut SocketStats,
        mut f: impl FnMut(SocketAddr, &[u8], usize),
    ) -> RecvOutcome {
        let mut namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: the buffer and address storage are owned by self and sized
        // as declared. The raw syscall skips libc's cancellation-point
        // wrapper, which costs on every poll.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                sock.fd(),
                self.data.as_mut_ptr() as *mut libc::c_void,
                RX_BUF_SIZE,
                // MSG_TRUNC: the datagram's real length, to detect truncation
                // as recvmsg's flags would.
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                &mut self.names[0] as *mut _ as *mut libc::sockaddr,
                &mut namelen as *mut libc::socklen_t,
            )
        };
        if r < 0 {
            self.streak = 0;
            return failed_recv(stats);
        }
        crate::timetrace::record("recvmmsg got");
        // Two datagrams in a row: more are likely queued, batch them.
        self.streak = self.streak.saturating_add(1);
        if self.streak >= 2 {
            self.vlen = self.hdrs.len();
        }
        stats.recv_batches += 1;
        let len = r as usize;
        if len > RX_BUF_SIZE {
            stats.truncated += 1;
            return RecvOutcome::Received(false);
        }
        let Some(src) = read_sockaddr(&self.names[0], namelen) else {
            stats.bad_source += 1;
            return RecvOutcome::Received(false);
        };
        let buf = &self.data[..len];
        let seg = homa_proto::wire::coalesced_segment(buf);
        stats.bytes_received += len as u64;
        stats.packets_received += if len <= seg {
            1
        } else {
            stats.gro_datagrams += 1;
            len.div_ceil(seg) as u64
        };
        f(src, buf, seg);
        if landable(&self.data[..len], seg) {
            self.landing_goes_on(stats);
        }
        if sock.gro {
            let long = homa_proto::wire::is_multi_packet_data(&self.data[..len]);
            self.note_sizes(sock, stats, 1, long);
        }
        RecvOutcome::Received(false)
    }

    /// Up to `vlen` datagrams with `recvmmsg`.
    fn recv_batch(
        &mut self,
        sock: &UdpSocket,
        stats: &mut SocketStats,
        mut f: impl FnMut(SocketAddr, &[u8], usize),
    ) -> RecvOutcome {
        let n = self.hdrs.len();
        // Headers are set up once and only the fields the kernel overwrote
        // are reset.
        if !self.ready {
            self.dirty = n;
            self.ready = true;
        }
        for i in 0..self.dirty.min(n) {
            self.reset(i);
        }
        // SAFETY: every header points at buffers owned by self (heap memory
        // that does not move), sized as declared.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvmmsg,
                sock.fd(),
                self.hdrs.as_mut_ptr(),
                self.vlen as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
        if r > 0 {
            crate::timetrace::record("recvmmsg got");
        }
        // What the call overwrote.
        self.dirty = if r > 0 { (r as usize + 1).min(n) } else { 1 };
        let asked = self.vlen;
        if r <= 1 {
            // One datagram or none: back to `recvfrom`.
            self.vlen = 1;
            self.streak = 0;
        }
        if r < 0 {
            return failed_recv(stats);
        }
        let got = r as usize;
        stats.recv_batches += 1;
        for i in 0..got {
            let h = &self.hdrs[i];
            let len = h.msg_len as usize;
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                stats.truncated += 1;
                continue;
            }
            let Some(src) = read_sockaddr(&self.names[i], h.msg_hdr.msg_namelen) else {
                stats.bad_source += 1;
                continue;
            };
            let buf = &self.data[i * RX_BUF_SIZE..i * RX_BUF_SIZE + len.min(RX_BUF_SIZE)];
            // Without a GRO control message (GRO just switched off with
            // coalesced datagrams still queued) a coalesced datagram is cut
            // by its packets' own lengths.
            let seg = gro_segment_size(&h.msg_hdr)
                .unwrap_or_else(|| homa_proto::wire::coalesced_segment(buf))
                .max(1);
            if buf.len() > seg {
                stats.gro_datagrams += 1;
            }
            stats.bytes_received += buf.len() as u64;
            stats.packets_received += buf.len().div_ceil(seg).max(1) as u64;
            f(src, buf, seg);
        }
        if (0..got).any(|i| {
            let h = &self.hdrs[i];
            let len = (h.msg_len as usize).min(RX_BUF_SIZE);
            len >= LANDING_MIN_BYTES
                && gro_segment_size(&h.msg_hdr).is_none()
                && landable(&self.data[i * RX_BUF_SIZE..][..len], len)
        }) {
            self.landing_goes_on(stats);
        }
        if sock.gro {
            let long = (0..got).any(|i| {
                let len = (self.hdrs[i].msg_len as usize).min(RX_BUF_SIZE);
                homa_proto::wire::is_multi_packet_data(&self.data[i * RX_BUF_SIZE..][..len])
            });
            self.note_sizes(sock, stats, got, long);
        }
        RecvOutcome::Received(asked > 1 && got == asked)
    }

    /// Whether datagrams are peeked at and landed (see [`Self::peek`]).
    pub(crate) fn landing(&self) -> bool {
        self.landing_on
    }

    /// Landing: with packets larger than [`LANDING_MIN_BYTES`] (a large
    /// MTU), a long message's payload is received straight into the receive
    /// pool (`Endpoint::landing_site`) instead of into this batch's buffer
    /// and copied from there, one copy per byte fewer. It costs one more
    /// system call per datagram (this peek at its headers), so it is on only
    /// while such packets arrive: it goes on when [`Self::recv`] hands over
    /// one, and off after [`LANDING_OFF_AFTER`] datagrams in a row that did
    /// not land.
    pub(crate) fn peek(&mut self, sock: &UdpSocket, stats: &mut SocketStats) -> Peeked {
        let mut namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: the buffer and address storage are owned by self and sized
        // as declared.
        let r = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                sock.fd(),
                self.peek_head.as_mut_ptr() as *mut libc::c_void,
                self.peek_head.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC | libc::MSG_PEEK,
                &mut self.names[0] as *mut _ as *mut libc::sockaddr,
                &mut namelen as *mut libc::socklen_t,
            )
        };
        if r < 0 {
            return match failed_recv(stats) {
                RecvOutcome::Empty => Peeked::Empty,
                _ => Peeked::Error,
            };
        }
        match read_sockaddr(&self.names[0], namelen) {
            Some(src) => Peeked::Datagram(src, r as usize),
            None => {
                // Consumed and counted by the ordinary receive.
                Peeked::Datagram(SocketAddr::from(([0, 0, 0, 0], 0)), 0)
            }
        }
    }

    /// The first bytes of the datagram [`Self::peek`] found (fewer if it
    /// was shorter).
    pub(crate) fn peeked_head(&self, len: usize) -> &[u8] {
        &self.peek_head[..len.min(self.peek_head.len())]
    }

    /// Receives the datagram [`Self::peek`] found, of `len` bytes: its
    /// first `header_len` bytes into this batch, the rest into `payload`
    /// (the pool).
    pub(crate) fn recv_landed(
        &mut self,
        sock: &UdpSocket,
        stats: &mut SocketStats,
        len: usize,
        header_len: usize,
        payload: &mut [&mut [u8]],
    ) -> Landed<'_> {
        let header_len = header_len.min(self.landed_head.len());
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 4];
        if payload.len() + 1 > iov.len() {
            return Landed::Queued;
        }
        iov[0] = libc::iovec {
            iov_base: self.landed_head.as_mut_ptr() as *mut libc::c_void,
            iov_len: header_len,
        };
        for (v, span) in iov[1..].iter_mut().zip(payload.iter_mut()) {
            *v = libc::iovec {
                iov_base: span.as_mut_ptr() as *mut libc::c_void,
                iov_len: span.len(),
            };
        }
        // SAFETY: a plain C struct: all-zero bytes are a valid value.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = payload.len() + 1;
        // SAFETY: every iovec points at memory we hold mutably for the call
        // (this batch's header buffer, the pool slices), sized as declared.
        let r = unsafe { libc::recvmsg(sock.fd(), &mut msg, libc::MSG_DONTWAIT) };
        crate::timetrace::record("recvmsg landed");
        stats.recv_batches += 1;
        if r < 0 {
            // The peeked datagram is still queued: received the ordinary way next.
            return Landed::Queued;
        }
        let whole = r as usize == len && msg.msg_flags & libc::MSG_TRUNC == 0;
        let head = &self.landed_head[..header_len];
        if !whole || head != &self.peek_head[..header_len] {
            stats.landing_failed += 1;
            return Landed::Dropped;
        }
        stats.landed += 1;
        stats.packets_received += 1;
        stats.bytes_received += len as u64;
        self.since_landed = 0;
        Landed::Whole(head)
    }

    /// A peeked datagram that will not land; after enough in a row, landing
    /// goes off.
    pub(crate) fn not_landed(&mut self, stats: &mut SocketStats) {
        self.since_landed += 1;
        if self.since_landed >= LANDING_OFF_AFTER {
            self.landing_on = false;
            stats.landing_switches += 1;
        }
    }

    /// Landing goes on when a datagram that could have landed arrives the
    /// ordinary way ([`landable`]).
    fn landing_goes_on(&mut self, stats: &mut SocketStats) {
        if !self.landing_on {
            self.landing_on = true;
            self.since_landed = 0;
            stats.landing_switches += 1;
        }
    }

    /// Switches UDP GRO on when packets of multi-packet messages arrive and
    /// off after [`GRO_OFF_AFTER`] datagrams without one. GRO is what bulk
    /// transfers need (one receive for up to 64 KB of packets), but a GRO
    /// socket pays for it on every datagram: a busy-polled ping-pong of
    /// 100-200-byte datagrams measured ~0.25 µs slower per round trip with
    /// GRO on the sockets (docs/performance.md). The switch is one
    /// `setsockopt`; a peer that forges long-message packets can make it
    /// switch at most twice per `GRO_OFF_AFTER + 1` datagrams.
    /// `got` datagrams arrived, `long` if any was part of a multi-packet
    /// message.
    fn note_sizes(&mut self, sock: &UdpSocket, stats: &mut SocketStats, got: usize, long: bool) {
        if long {
            self.since_long = 0;
            if !self.gro_on && sock.set_gro(true) {
                self.gro_on = true;
                stats.gro_switches += 1;
            }
        } else {
            self.since_long = self.since_long.saturating_add(got as u32);
            if self.gro_on && self.since_long >= GRO_OFF_AFTER && sock.set_gro(false) {
                self.gro_on = false;
                stats.gro_switches += 1;
            }
        }
    }
}

/// Whether a datagram received the ordinary way (cut into `seg`-byte
/// packets) could have landed: one packet of a multi-packet message, of
/// [`LANDING_MIN_BYTES`] or more.
fn landable(data: &[u8], seg: usize) -> bool {
    data.len() >= LANDING_MIN_BYTES
        && data.len() <= seg
        && homa_proto::wire::is_multi_packet_data(data)
}

/// What a receive call that returned an error means: nothing queued (or a
/// signal), or a socket error to read from the error queue.
fn failed_recv(stats: &mut SocketStats) -> RecvOutcome {
    // errno read directly: this is every empty poll, and building an
    // io::Error (then dropping it) cost more than the check.
    // SAFETY: errno is thread-local and was just set by the call.
    let errno = unsafe { *libc::__errno_location() };
    if errno == libc::EAGAIN || errno == libc::EWOULDBLOCK || errno == libc::EINTR {
        stats.recv_empty += 1;
        return RecvOutcome::Empty;
    }
    RecvOutcome::Error
}

/// The GRO segment size announced in a received message's control data.
fn gro_segment_size(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: walks the control buffer the kernel filled with the libc helpers.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return (v > 0).then_some(v as usize);
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

/// One queued packet: its headers are `bufs[buf][head_at..head_at + head_len]`
/// and its payload `payloads[payload][pay_at..pay_at + len - head_len]`.
#[derive(Clone, Copy, Debug)]
struct TxMeta {
    dest: SocketAddr,
    tos: u8,
    /// Whole datagram: headers, payload and padding.
    len: usize,
    head_len: u32,
    /// Zero bytes after the payload (declared in the header).
    pad: u32,
    buf: u32,
    head_at: u32,
    payload: u32,
    pay_at: u32,
}

/// Payloads at least this long go to the kernel from where they are (an
/// iovec of their own) instead of being copied next to their header.
const APART_PAYLOAD_BYTES: usize = 4096;

impl TxMeta {
    /// The payload is sent from the message's bytes, its header from the
    /// header buffer: two iovecs instead of a copy ([`APART_PAYLOAD_BYTES`]).
    #[inline]
    fn payload_apart(&self) -> bool {
        self.pad == 0 && self.len - self.head_len as usize >= APART_PAYLOAD_BYTES
    }
}

/// Result of a flush.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FlushOutcome {
    /// Everything queued was handed to the kernel (or dropped on error).
    Done,
    /// The socket buffer is full; the rest stays queued (wait for POLLOUT).
    WouldBlock,
}

/// Packets waiting to be sent, and the scratch space to send them.
pub(crate) struct TxQueue {
    /// Header buffers, one per queued burst (`used_bufs` of them in use).
    bufs: Vec<Vec<u8>>,
    used_bufs: usize,
    meta: Vec<TxMeta>,
    /// Payload of each queued burst (a handle on the message's own memory,
    /// copied only into `staging` at send time); empty for control packets.
    payloads: Vec<bytes::Bytes>,
    head: usize,
    capacity: usize,
    packet_size: usize,
    // Scratch for sendmmsg, rebuilt on every call.
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<Ctrl>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    groups: Vec<(usize, usize)>,
    /// Where each `sendmmsg` entry's packets are gathered (headers and
    /// payloads, back to back), so that each entry is one iovec. The kernel
    /// pays per iovec: a GSO send of 44 packets as 88 iovecs ran ~25% slower
    /// than the same bytes as one, more than this copy of (usually
    /// cache-hot) payload costs. Allocated on first use.
    staging: Vec<u8>,
    /// A lone `sendto`'s destination, as the kernel reads it.
    lone_name: libc::sockaddr_storage,
    lone_namelen: libc::socklen_t,
    /// Scratch of `build`: each group's iovecs as (in place, address or
    /// staging offset, length), and each group's range of them.
    pieces: Vec<(bool, usize, usize)>,
    group_pieces: Vec<(usize, usize)>,
    /// The lone packet's bytes (in `staging` or in a queued payload).
    lone: (*const u8, usize),
}

// SAFETY: as for RxBatch, the pointers refer only to the struct's own vectors.
unsafe impl Send for TxQueue {}

impl TxQueue {
    /// A queue of at most `capacity` packets of up to `packet_size` bytes.
    pub(crate) fn new(capacity: usize, packet_size: usize) -> TxQueue {
        let capacity = capacity.max(1);
        TxQueue {
            bufs: Vec::new(),
            used_bufs: 0,
            meta: Vec::with_capacity(capacity),
            payloads: Vec::with_capacity(capacity),
            head: 0,
            capacity,
            packet_size,
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            names: vec![unsafe { mem::zeroed() }; TX_MAX_MSGS],
            ctrl: vec![[0u64; 8]; TX_MAX_MSGS],
            iovs: Vec::with_capacity(capacity),
            pieces: Vec::with_capacity(capacity),
            group_pieces: Vec::with_capacity(TX_MAX_MSGS),
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            hdrs: vec![unsafe { mem::zeroed() }; TX_MAX_MSGS],
            groups: Vec::with_capacity(TX_MAX_MSGS),
            staging: Vec::new(),
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            lone_name: unsafe { mem::zeroed() },
            lone_namelen: 0,
            lone: (std::ptr::null(), 0),
        }
    }
    /// Packets queued and not yet sent.
    pub(crate) fn pending(&self) -> usize {
        self.meta.len() - self.head
    }
    pub(crate) fn is_full(&self) -> bool {
        self.meta.len() >= self.capacity
    }
    /// Packets that may still be queued before a flush is needed.
    pub(crate) fn room(&self) -> usize {
        self.capacity.saturating_sub(self.meta.len())
    }
    /// The buffer the next packet's (or burst's) headers go into.
    pub(crate) fn next_buf(&mut self) -> &mut Vec<u8> {
        let i = self.used_bufs;
        if i == self.bufs.len() {
            // Room for a control packet or a short message; a buffer that
            // ever holds a whole large packet grows once and keeps it (with
            // 65,000-byte loopback packets, a full-size buffer for every
            // grant would cost far more memory than it saves).
            self.bufs
                .push(Vec::with_capacity(self.packet_size.min(SMALL_TX_BUF)));
        }
        &mut self.bufs[i]
    }
    /// Queues the whole packet just written into [`Self::next_buf`].
    #[cfg(test)]
    pub(crate) fn commit(&mut self, dest: SocketAddr, tos: u8, len: usize) {
        self.commit_burst(
            homa_proto::Burst {
                dest,
                priority: 0,
                count: 1,
                header_len: len,
                segment: 0,
                payload: bytes::Bytes::new(),
                pad: 0,
            },
            tos,
            |_| true,
        );
    }

    /// Queues the packets of `burst`, whose headers were just written into
    /// [`Self::next_buf`], except those `keep(i)` refuses (fault injection).
    pub(crate) fn commit_burst(
        &mut self,
        burst: homa_proto::Burst,
        tos: u8,
        mut keep: impl FnMut(usize) -> bool,
    ) {
        let buf = self.used_bufs;
        debug_assert!(self.bufs[buf].len() >= burst.count * burst.header_len);
        let payload = self.payloads.len() as u32;
        let mut kept = false;
        for i in 0..burst.count {
            if !keep(i) {
                continue;
            }
            kept = true;
            let pay_len = burst.payload_of(i).len();
            let pad = if i + 1 == burst.count { burst.pad } else { 0 };
            debug_assert!(pad == 0 || burst.header_len > 0, "padding in place");
            self.meta.push(TxMeta {
                dest: burst.dest,
                tos,
                len: burst.header_len + pay_len + pad,
                head_len: burst.header_len as u32,
                pad: pad as u32,
                buf: buf as u32,
                head_at: (i * burst.header_len) as u32,
                payload,
                pay_at: (i * burst.segment) as u32,
            });
        }
        if kept {
            self.used_bufs += 1;
            self.payloads.push(burst.payload);
        }
    }

    /// Hands queued packets to the kernel. Destinations the kernel calls
    /// unreachable are appended to `unreachable` (their packets are dropped).
    pub(crate) fn flush(
        &mut self,
        sock: &UdpSocket,
        stats: &mut SocketStats,
        unreachable: &mut Vec<(SocketAddr, i32)>,
    ) -> FlushOutcome {
        let mut retries = 0;
        let mut first_call = true;
        while self.head < self.meta.len() {
            let gso = sock.gso();
            // A lone packet whose TOS the socket applies anyway goes out with
            // `sendto`: it skips the kernel's message-header and cmsg
            // handling, ~100 ns of a short RPC's send (measured against
            // `sendmmsg` of one message with its TOS cmsg).
            let first = self.meta[self.head];
            // (A long payload kept apart from its header needs two iovecs.)
            let lone = self.meta.len() - self.head == 1
                && sock.default_tos(&first.dest) == Some(first.tos)
                && (first.head_len == 0 || !first.payload_apart());
            if lone {
                self.build_lone(sock);
            } else {
                // The first call of a flush carries one entry (one GSO run):
                // the receiver starts on it while the rest is gathered.
                // Gathering everything first delayed a 100 KB echo by ~3 µs
                // (51.9-52.7 against 48.4-49.1 µs); throughput is unchanged.
                let max_groups = if first_call { 1 } else { TX_MAX_MSGS };
                self.build(sock, gso, max_groups);
                first_call = false;
            }
            let count = self.groups.len();
            stats.send_calls += 1;
            crate::timetrace::record("sendmmsg start");
            // SAFETY: headers point into self's scratch and packet buffers,
            // which stay untouched until the call returns.
            let r = unsafe {
                if lone {
                    let n = self.send_lone(sock, self.lone.0, self.lone.1);
                    if n >= 0 {
                        1
                    } else {
                        n
                    }
                } else {
                    libc::syscall(
                        libc::SYS_sendmmsg,
                        sock.fd(),
                        self.hdrs.as_mut_ptr(),
                        count as libc::c_uint,
                        0,
                    )
                }
            };
            crate::timetrace::record("sendmmsg done");
            if r > 0 {
                stats.lone_sends += lone as u64;
                for g in 0..r as usize {
                    let (a, b) = self.groups[g];
                    stats.packets_sent += (b - a) as u64;
                    if b - a > 1 {
                        stats.gso_sends += 1;
                    }
                    stats.bytes_sent += self.meta[a..b].iter().map(|m| m.len as u64).sum::<u64>();
                    self.head = b;
                }
                continue;
            }
            let e = io::Error::last_os_error();
            let errno = e.raw_os_error().unwrap_or(0);
            let (a, b) = self.groups[0];
            match errno {
                libc::EINTR => continue,
                libc::EAGAIN => {
                    stats.send_would_block += 1;
                    return FlushOutcome::WouldBlock;
                }
                // A pending asynchronous error (ICMP) is reported by the next
                // send instead of the packet being sent: read it and retry.
                libc::ECONNREFUSED if retries < 4 => {
                    retries += 1;
                    sock.read_errors(unreachable, stats);
                    continue;
                }
                // The device cannot segment (e.g. no checksum offload): stop
                // using GSO on this socket and send the packets one by one.
                libc::EIO | libc::EINVAL | libc::ENOPROTOOPT if gso && b - a > 1 => {
                    sock.gso.store(false, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::EHOSTDOWN
                | libc::EADDRNOTAVAIL
                | libc::EAFNOSUPPORT
                | libc::EACCES
                | libc::EPERM
                | libc::ECONNREFUSED => {
                    unreachable.push((self.meta[a].dest, errno));
                    stats.send_errors += (b - a) as u64;
                    self.head = b;
                }
                _ => {
                    // EMSGSIZE, ENOBUFS and the like: the packets are lost, as
                    // they could be on any network; the protocol recovers.
                    stats.send_errors += (b - a) as u64;
                    if errno == libc::EMSGSIZE {
                        stats.send_too_big += (b - a) as u64;
                    }
                    self.head = b;
                }
            }
        }
        self.meta.clear();
        self.payloads.clear();
        self.used_bufs = 0;
        self.head = 0;
        FlushOutcome::Done
    }

    /// `sendto` of `len` bytes at `data` to `lone_name`: no message header,
    /// no cmsg. Returns the system call's result.
    ///
    /// # Safety
    /// `data` must be valid for `len` bytes until the call returns.
    unsafe fn send_lone(&self, sock: &UdpSocket, data: *const u8, len: usize) -> libc::c_long {
        libc::syscall(
            libc::SYS_sendto,
            sock.fd(),
            data,
            len,
            0,
            &self.lone_name as *const libc::sockaddr_storage,
            self.lone_namelen,
        )
    }

    fn set_lone_dest(&mut self, sock: &UdpSocket, dest: &SocketAddr) {
        // Written every time: for IPv4 that costs less than comparing the
        // address with the previous one.
        self.lone_namelen = write_sockaddr(dest, sock.is_v6(), &mut self.lone_name);
    }

    /// Sends the packet of `len` bytes just written whole into
    /// [`Self::next_buf`] at once, with `sendto`, if nothing is queued and
    /// the socket's own TOS is the packet's: no queue entry, no gather, no
    /// second look at the queue. A short message's packet and a control
    /// packet take this path when they are all there is to send (callgrind:
    /// ~250 fewer instructions per packet than queueing and flushing).
    /// Returns false if it sent nothing; the caller then queues the packet
    /// and the flush that follows sends it or deals with the error.
    pub(crate) fn send_whole_now(
        &mut self,
        sock: &UdpSocket,
        dest: &SocketAddr,
        tos: u8,
        len: usize,
        stats: &mut SocketStats,
        unreachable: &mut Vec<(SocketAddr, i32)>,
    ) -> bool {
        if self.head != self.meta.len() || sock.default_tos(dest) != Some(tos) {
            return false;
        }
        self.set_lone_dest(sock, dest);
        let buf = &self.bufs[self.used_bufs];
        debug_assert!(buf.len() >= len);
        crate::timetrace::record("sendmmsg start");
        // SAFETY: `len` bytes of the buffer, untouched until the call returns.
        let n = unsafe { self.send_lone(sock, buf.as_ptr(), len) };
        let errno = (n < 0).then(|| io::Error::last_os_error().raw_os_error());
        crate::timetrace::record("sendmmsg done");
        if let Some(errno) = errno {
            // The flush reports the error, or retries; a pending ICMP error
            // this call returned (and so cleared) is read here, as the flush
            // would have.
            if errno == Some(libc::ECONNREFUSED) {
                sock.read_errors(unreachable, stats);
            }
            return false;
        }
        stats.send_calls += 1;
        stats.lone_sends += 1;
        stats.packets_sent += 1;
        stats.bytes_sent += len as u64;
        true
    }

    /// Prepares the packet at `head` for `sendto`: its bytes in `lone`
    /// (in `staging`, or in place in a send buffer), its destination in
    /// `lone_name` (no message header, no cmsg).
    fn build_lone(&mut self, sock: &UdpSocket) {
        let m = self.meta[self.head];
        self.groups.clear();
        self.groups.push((self.head, self.head + 1));
        self.set_lone_dest(sock, &m.dest);
        if m.head_len == 0 {
            // A whole packet in place in a send buffer.
            let p = &self.payloads[m.payload as usize][m.pay_at as usize..][..m.len];
            self.lone = (p.as_ptr(), p.len());
            return;
        }
        if m.head_len as usize == m.len {
            // Written whole by the engine (a short message): no gather.
            let p = &self.bufs[m.buf as usize][m.head_at as usize..][..m.len];
            self.lone = (p.as_ptr(), p.len());
            return;
        }
        self.staging.clear();
        stage(&mut self.staging, &self.bufs, &self.payloads, &m);
        self.lone = (self.staging.as_ptr(), self.staging.len());
    }

    /// Fills the sendmmsg headers with up to `max_groups` groups of queued
    /// packets from `head`.
    fn build(&mut self, sock: &UdpSocket, gso: bool, max_groups: usize) {
        self.groups.clear();
        self.iovs.clear();
        let mut i = self.head;
        while i < self.meta.len() && self.groups.len() < max_groups {
            let first = self.meta[i];
            let mut j = i + 1;
            let mut total = first.len;
            if gso {
                while j < self.meta.len()
                    && j - i < GSO_MAX_SEGMENTS
                    && self.meta[j].dest == first.dest
                    && self.meta[j].tos == first.tos
                    && self.meta[j].len <= first.len
                    && self.meta[j].len > 0
                    && total + self.meta[j].len <= GSO_MAX_BYTES
                {
                    total += self.meta[j].len;
                    j += 1;
                    // Only the last segment of a GSO send may be shorter.
                    if self.meta[j - 1].len < first.len {
                        break;
                    }
                }
            }
            self.groups.push((i, j));
            i = j;
        }
        // Each group becomes as few iovecs as possible: packets whose headers
        // sit in place in a send buffer are sent from there (consecutive runs
        // of one buffer are adjacent in memory and merge), the others are
        // gathered, headers and payload back to back, into the staging
        // buffer. Pointers into staging are taken only once it is complete;
        // it is sized once for what these groups stage, and keeps its
        // capacity from call to call.
        // A packet with a long payload is not gathered: its header (in its
        // header buffer) and its payload (in the message's `Bytes`) go to
        // the kernel as two iovecs, which costs less than copying the
        // payload, and a message sent again and again from one `Bytes` is
        // read from where it already is in the cache.
        self.staging.clear();
        let staged: usize = self
            .groups
            .iter()
            .flat_map(|&(a, b)| &self.meta[a..b])
            .filter(|m| m.head_len != 0 && !m.payload_apart())
            .map(|m| m.len)
            .sum();
        self.staging.reserve(staged);
        // (in place, address or staging offset, length)
        self.pieces.clear();
        self.group_pieces.clear();
        for &(a, b) in &self.groups {
            let first_piece = self.pieces.len();
            let push = |pieces: &mut Vec<(bool, usize, usize)>, direct, at, len| {
                let in_group = pieces.len() > first_piece;
                match pieces.last_mut() {
                    Some(last) if in_group && last.0 == direct && last.1 + last.2 == at => {
                        last.2 += len
                    }
                    _ => pieces.push((direct, at, len)),
                }
            };
            for m in &self.meta[a..b] {
                let head_len = m.head_len as usize;
                let payload = &self.payloads[m.payload as usize];
                if head_len == 0 {
                    let p = &payload[m.pay_at as usize..][..m.len];
                    push(&mut self.pieces, true, p.as_ptr() as usize, m.len);
                } else if m.payload_apart() {
                    let h = &self.bufs[m.buf as usize][m.head_at as usize..][..head_len];
                    push(&mut self.pieces, true, h.as_ptr() as usize, head_len);
                    let p = &payload[m.pay_at as usize..][..m.len - head_len];
                    push(&mut self.pieces, true, p.as_ptr() as usize, p.len());
                } else {
                    let start = self.staging.len();
                    stage(&mut self.staging, &self.bufs, &self.payloads, m);
                    push(&mut self.pieces, false, start, m.len);
                }
            }
            self.group_pieces.push((first_piece, self.pieces.len()));
        }
        for &(direct, at, len) in &self.pieces {
            let base = if direct {
                // The kernel only reads it; `payloads` keeps it alive.
                at as *mut libc::c_void
            } else {
                self.staging[at..].as_mut_ptr() as *mut libc::c_void
            };
            self.iovs.push(libc::iovec {
                iov_base: base,
                iov_len: len,
            });
        }
        for (g, &(a, b)) in self.groups.iter().enumerate() {
            let m = self.meta[a];
            let namelen = write_sockaddr(&m.dest, sock.is_v6(), &mut self.names[g]);
            let ctrl = &mut self.ctrl[g];
            *ctrl = [0; 8];
            let h = &mut self.hdrs[g];
            h.msg_len = 0;
            h.msg_hdr.msg_name = &mut self.names[g] as *mut _ as *mut libc::c_void;
            h.msg_hdr.msg_namelen = namelen;
            let (p0, p1) = self.group_pieces[g];
            h.msg_hdr.msg_iov = &mut self.iovs[p0];
            h.msg_hdr.msg_iovlen = p1 - p0;
            h.msg_hdr.msg_flags = 0;
            h.msg_hdr.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = mem::size_of::<Ctrl>();
            // The TOS cmsg must match the family of the packet actually sent: a
            // v4 destination (also v4-mapped on a v6 socket) uses IP_TOS.
            let (lvl, ty) = if m.dest.is_ipv4() {
                (libc::SOL_IP, libc::IP_TOS)
            } else {
                (libc::SOL_IPV6, libc::IPV6_TCLASS)
            };
            let mut used = 0;
            // SAFETY: the control buffer has room for two int cmsgs (64 bytes
            // >= 2 * CMSG_SPACE(4)); CMSG_* walk within msg_controllen.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                (*c).cmsg_level = lvl;
                (*c).cmsg_type = ty;
                (*c).cmsg_len = libc::CMSG_LEN(4) as _;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c) as *mut libc::c_int,
                    m.tos as libc::c_int,
                );
                used += libc::CMSG_SPACE(4) as usize;
                if b - a > 1 {
                    let c2 = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                    (*c2).cmsg_level = SOL_UDP;
                    (*c2).cmsg_type = UDP_SEGMENT;
                    (*c2).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c2) as *mut u16, m.len as u16);
                    used += libc::CMSG_SPACE(2) as usize;
                }
            }
            h.msg_hdr.msg_controllen = used;
        }
    }
}

/// Appends queued packet `m` (headers apart from its payload) to `staging`:
/// its headers, its payload, and the zero padding its header declares.
fn stage(staging: &mut Vec<u8>, bufs: &[Vec<u8>], payloads: &[bytes::Bytes], m: &TxMeta) {
    let head_len = m.head_len as usize;
    staging.extend_from_slice(&bufs[m.buf as usize][m.head_at as usize..][..head_len]);
    let pay_len = m.len - head_len - m.pad as usize;
    if pay_len > 0 {
        staging.extend_from_slice(&payloads[m.payload as usize][m.pay_at as usize..][..pay_len]);
    }
    staging.resize(staging.len() + m.pad as usize, 0);
}

/// Drops packets at random on receive and transmit, for tests of loss
/// recovery over real sockets. Deterministic for a given seed.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    /// Probability (0..=1) that a received packet is discarded before the engine sees it.
    pub rx_loss: f64,
    /// Probability (0..=1) that a packet from the engine is never sent.
    pub tx_loss: f64,
    /// Seed of the generator.
    pub seed: u64,
}

/// The running state of a [`FaultInjector`].
pub(crate) struct Faults {
    rx: u64,
    tx: u64,
    state: u64,
    /// Received packets discarded so far.
    pub(crate) rx_drops: u64,
}

impl Faults {
    pub(crate) fn new(f: &FaultInjector) -> Faults {
        let scale = |p: f64| (p.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        Faults {
            rx: scale(f.rx_loss),
            tx: scale(f.tx_loss),
            state: f.seed | 1,
            rx_drops: 0,
        }
    }
    fn next(&mut self) -> u64 {
        // xorshift64*: fast and good enough to pick packets to lose.
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub(crate) fn drop_rx(&mut self) -> bool {
        let d = self.rx > 0 && self.next() < self.rx;
        self.rx_drops += d as u64;
        d
    }
    pub(crate) fn drop_tx(&mut self) -> bool {
        self.tx > 0 && self.next() < self.tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn opts() -> SocketOptions {
        SocketOptions {
            gso: true,
            gro: true,
            buffer_bytes: 1 << 20,
            dont_fragment: true,
            default_tos: 46 << 2,
            reuse_port: false,
        }
    }

    fn recv_all(
        rx: &mut RxBatch,
        s: &UdpSocket,
        want: usize,
    ) -> (Vec<(SocketAddr, Vec<u8>)>, SocketStats) {
        let mut stats = SocketStats::default();
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < want && start.elapsed() < Duration::from_secs(5) {
            let split = |a, data: &[u8], seg: usize| {
                if data.is_empty() {
                    return vec![(a, Vec::new())];
                }
                data.chunks(seg)
                    .map(|p| (a, p.to_vec()))
                    .collect::<Vec<_>>()
            };
            match rx.recv(s, &mut stats, |a, d, seg| got.extend(split(a, d, seg))) {
                RecvOutcome::Error => panic!("{}", io::Error::last_os_error()),
                _ => std::thread::yield_now(),
            }
        }
        (got, stats)
    }

    fn send(
        tx: &mut TxQueue,
        s: &UdpSocket,
        dest: SocketAddr,
        pkts: &[Vec<u8>],
        tos: u8,
    ) -> SocketStats {
        let mut stats = SocketStats::default();
        let mut unr = Vec::new();
        for p in pkts {
            write_next(tx, p);
            tx.commit(dest, tos, p.len());
        }
        assert_eq!(tx.flush(s, &mut stats, &mut unr), FlushOutcome::Done);
        assert!(unr.is_empty());
        stats
    }

    /// `n` Homa DATA packets of `len` bytes each (at least the 56-byte
    /// header plus one byte) with distinct payloads: packets describe their
    /// own length, which a receive without a GRO control message (`recvfrom`)
    /// needs to cut a coalesced datagram.
    fn pattern(n: usize, len: usize) -> Vec<Vec<u8>> {
        use homa_proto::wire::{self, Body, CommonHeader, DataHeader, DATA_PACKET_OVERHEAD};
        let per = len - DATA_PACKET_OVERHEAD;
        (0..n)
            .map(|i| {
                let payload: Vec<u8> = (0..per).map(|j| (i * 7 + j) as u8).collect();
                let mut out = Vec::new();
                wire::encode(
                    &mut out,
                    &CommonHeader {
                        from_client: true,
                        retransmit: false,
                        rpc_id: 1,
                        send_time: 1,
                        echo_time: 0,
                    },
                    &Body::Data {
                        header: DataHeader {
                            message_length: (n * per) as u32,
                            offset: (i * per) as u32,
                            unsched_bytes: 0,
                            cutoff_version: 0,
                            ack: 0,
                        },
                        payload: &payload,
                    },
                    false,
                );
                assert_eq!(out.len(), len);
                out
            })
            .collect()
    }

    /// Writes `pkt` into the queue's next buffer, as the engine would.
    fn write_next(tx: &mut TxQueue, pkt: &[u8]) {
        let buf = tx.next_buf();
        buf.clear();
        buf.extend_from_slice(pkt);
    }

    /// An address nothing listens on: a port bound, learnt and closed.
    fn closed_port() -> SocketAddr {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    }

    fn check_roundtrip(a_addr: &str, gso: bool, gro: bool) {
        let o = SocketOptions { gso, gro, ..opts() };
        let a = UdpSocket::bind(a_addr.parse().unwrap(), &o).unwrap();
        let b = UdpSocket::bind(a_addr.parse().unwrap(), &o).unwrap();
        let mut tx = TxQueue::new(256, 1472);
        let mut rx = RxBatch::new(8);
        // 40 full packets and a short tail: one GSO group when available.
        let mut pkts = pattern(40, 1400);
        pkts.push(vec![9u8; 100]);
        // Then packets to the same place at another priority (a new group).
        pkts.extend(pattern(3, 500));
        let mut sent = send(&mut tx, &a, b.local_addr(), &pkts[..41], 0xb8);
        let s2 = send(&mut tx, &a, b.local_addr(), &pkts[41..], 0x20);
        sent.packets_sent += s2.packets_sent;
        sent.gso_sends += s2.gso_sends;
        assert_eq!(sent.packets_sent, pkts.len() as u64);
        if gso && a.gso() {
            assert!(sent.gso_sends >= 2, "{sent:?}");
        } else {
            assert_eq!(sent.gso_sends, 0);
        }
        let (got, stats) = recv_all(&mut rx, &b, pkts.len());
        assert_eq!(got.len(), pkts.len(), "{stats:?}");
        for ((src, data), want) in got.iter().zip(&pkts) {
            assert_eq!(*src, a.local_addr());
            assert_eq!(data, want);
        }
        if !gro {
            assert_eq!(stats.gro_datagrams, 0);
        }
    }

    /// A DATA packet of `len` payload bytes, headers apart, as the engine
    /// writes a padded one: (headers, payload, the whole padded packet).
    fn padded_packet(len: usize, pad: u8) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        use homa_proto::wire::{self, Body, CommonHeader, DataHeader};
        let payload: Vec<u8> = (0..len).map(|j| (j * 3 + 1) as u8).collect();
        let common = CommonHeader {
            from_client: true,
            retransmit: false,
            rpc_id: 1,
            send_time: 1,
            echo_time: 0,
        };
        let body = Body::Data {
            header: DataHeader {
                message_length: len as u32,
                offset: 0,
                unsched_bytes: len as u32,
                cutoff_version: 0,
                ack: 0,
            },
            payload: &payload,
        };
        let (mut head, mut whole) = (Vec::new(), Vec::new());
        wire::encode_headers_padded(&mut head, &common, &body, false, pad);
        wire::encode_padded(&mut whole, &common, &body, false, pad);
        (head, payload, whole)
    }

    #[test]
    fn padded_packets_go_out_with_their_zeros() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let mut tx = TxQueue::new(16, 1472);
        let mut rx = RxBatch::new(8);
        let mut stats = SocketStats::default();
        let mut unr = Vec::new();
        // Alone (sendto), then two at two TOS values (sendmmsg, gathered).
        for tos in [vec![46 << 2], vec![46 << 2, 0x20]] {
            let mut want = Vec::new();
            for (i, &t) in tos.iter().enumerate() {
                let (head, payload, whole) = padded_packet(100 + i, 42 - i as u8);
                write_next(&mut tx, &head);
                tx.commit_burst(
                    homa_proto::Burst {
                        dest: b.local_addr(),
                        priority: 0,
                        count: 1,
                        header_len: head.len(),
                        segment: payload.len(),
                        payload: bytes::Bytes::from(payload),
                        pad: 42 - i,
                    },
                    t,
                    |_| true,
                );
                want.push(whole);
            }
            assert_eq!(tx.flush(&a, &mut stats, &mut unr), FlushOutcome::Done);
            let (got, _) = recv_all(&mut rx, &b, want.len());
            let got: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
            assert_eq!(got, want);
        }
        assert_eq!(stats.lone_sends, 1);
    }

    #[test]
    fn gro_goes_on_for_long_messages_and_off_after_short_ones() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        if !b.gro() {
            eprintln!("skipped: no UDP GRO in this kernel");
            return;
        }
        let gro_on = || getsockopt_int(b.fd(), SOL_UDP, UDP_GRO).unwrap() != 0;
        assert!(!gro_on(), "off until long messages arrive");
        let mut tx = TxQueue::new(512, 1472);
        let mut rx = RxBatch::new(8);
        // Short messages: one packet each, GRO stays off.
        let short: Vec<Vec<u8>> = (0..10).map(|_| padded_packet(100, 0).2).collect();
        send(&mut tx, &a, b.local_addr(), &short, 0);
        let (got, stats) = recv_all(&mut rx, &b, short.len());
        assert_eq!((got.len(), stats.gro_switches), (short.len(), 0));
        assert!(!gro_on());
        // A packet of a multi-packet message switches it on.
        let long = pattern(4, 1400);
        send(&mut tx, &a, b.local_addr(), &long, 0);
        let (got, stats) = recv_all(&mut rx, &b, long.len());
        assert_eq!(got.len(), long.len());
        assert_eq!(stats.gro_switches, 1);
        assert!(gro_on());
        // Off again after GRO_OFF_AFTER short datagrams, and only then
        // (sent one at a time, as short messages go: GSO would batch them
        // into fewer datagrams).
        for _ in 0..GRO_OFF_AFTER - 1 {
            send(&mut tx, &a, b.local_addr(), &short[..1], 0);
            let (got, stats) = recv_all(&mut rx, &b, 1);
            assert_eq!((got.len(), stats.gro_switches), (1, 0));
        }
        assert!(gro_on());
        send(&mut tx, &a, b.local_addr(), &short[..1], 0);
        let (_, stats) = recv_all(&mut rx, &b, 1);
        assert_eq!(stats.gro_switches, 1);
        assert!(!gro_on());
    }

    #[test]
    fn reuse_port_lets_a_second_socket_bind_the_same_address() {
        let o = SocketOptions {
            reuse_port: true,
            ..opts()
        };
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &o).unwrap();
        let b = UdpSocket::bind(a.local_addr(), &o).unwrap();
        assert_eq!(a.local_addr(), b.local_addr());
        // Without the option on the newcomer, the address is taken.
        assert!(UdpSocket::bind(a.local_addr(), &opts()).is_err());
    }

    #[test]
    fn dont_fragment_sets_pmtudisc_do_on_both_families() {
        for (addr, v6) in [("127.0.0.1:0", false), ("[::1]:0", true)] {
            let Ok(s) = UdpSocket::bind(addr.parse().unwrap(), &opts()) else {
                continue; // no IPv6 here
            };
            let (level, name, want) = if v6 {
                (
                    libc::SOL_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO,
                )
            } else {
                (libc::SOL_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)
            };
            assert_eq!(getsockopt_int(s.fd(), level, name).unwrap(), want, "{addr}");
            let off = UdpSocket::bind(
                addr.parse().unwrap(),
                &SocketOptions {
                    dont_fragment: false,
                    ..opts()
                },
            )
            .unwrap();
            assert_ne!(
                getsockopt_int(off.fd(), level, name).unwrap(),
                want,
                "{addr}: the kernel's default is left alone"
            );
        }
    }

    #[test]
    fn batched_send_and_receive_v4_with_offloads() {
        check_roundtrip("127.0.0.1:0", true, true);
    }

    #[test]
    fn batched_send_and_receive_v4_without_offloads() {
        check_roundtrip("127.0.0.1:0", false, false);
    }

    #[test]
    fn gso_send_is_split_by_receiver_without_gro() {
        check_roundtrip("127.0.0.1:0", true, false);
    }

    #[test]
    fn batched_send_and_receive_v6() {
        if UdpSocket::bind("[::1]:0".parse().unwrap(), &opts()).is_err() {
            eprintln!("skipping: ::1 is not available on this machine");
            return;
        }
        check_roundtrip("[::1]:0", true, true);
    }

    #[test]
    fn dual_stack_socket_talks_to_v4_peer() {
        let Ok(a) = UdpSocket::bind("[::]:0".parse().unwrap(), &opts()) else {
            eprintln!("skipping: IPv6 is not available on this machine");
            return;
        };
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        assert!(a.can_reach(&b.local_addr()));
        let mut tx = TxQueue::new(8, 1472);
        send(&mut tx, &a, b.local_addr(), &pattern(2, 300), 0x10);
        let mut rx = RxBatch::new(4);
        let (got, _) = recv_all(&mut rx, &b, 2);
        assert_eq!(got.len(), 2);
        // And the reply comes back to the v6 socket as a plain v4 source.
        let dest: SocketAddr = format!("127.0.0.1:{}", a.local_addr().port())
            .parse()
            .unwrap();
        send(&mut tx, &b, dest, &pattern(1, 60), 0);
        let (got, _) = recv_all(&mut rx, &a, 1);
        assert_eq!(got[0].0, b.local_addr());
    }

    #[test]
    fn tos_reaches_the_receiver() {
        // Read the TOS byte back with IP_RECVTOS on a plain socket. Three
        // ways out: a lone packet with the socket's default TOS (`sendto`, no
        // cmsg), a lone packet with another TOS (cmsg), a GSO pair (cmsg).
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        setsockopt_int(b.as_raw_fd(), libc::SOL_IP, libc::IP_RECVTOS, 1).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let recv_tos = || {
            let mut data = [0u8; 256];
            let mut ctrl = [0u64; 16];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut libc::c_void,
                iov_len: data.len(),
            };
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            hdr.msg_controllen = mem::size_of_val(&ctrl);
            // SAFETY: a system call given pointers to live, correctly sized local values; the result is checked.
            let r = unsafe { libc::recvmsg(b.as_raw_fd(), &mut hdr, 0) };
            let mut tos = None;
            // SAFETY: the CMSG macros walk the control buffer the kernel
            // just filled, within `msg_controllen`.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_IP && (*c).cmsg_type == libc::IP_TOS {
                        tos = Some(*libc::CMSG_DATA(c));
                    }
                    c = libc::CMSG_NXTHDR(&hdr, c);
                }
            }
            (r, tos)
        };
        let mut tx = TxQueue::new(8, 1472);
        let dest = b.local_addr().unwrap();
        let s1 = send(&mut tx, &a, dest, &pattern(1, 64), 46 << 2);
        assert_eq!(recv_tos(), (64, Some(46 << 2)));
        let s2 = send(&mut tx, &a, dest, &pattern(1, 64), 10 << 2);
        assert_eq!(recv_tos(), (64, Some(10 << 2)));
        let s3 = send(&mut tx, &a, dest, &pattern(2, 100), 46 << 2);
        assert_eq!(recv_tos(), (100, Some(46 << 2)));
        assert_eq!(recv_tos(), (100, Some(46 << 2)));
        // Only the first went out without a cmsg.
        assert_eq!((s1.lone_sends, s2.lone_sends, s3.lone_sends), (1, 0, 0));
        assert_eq!(s3.gso_sends, 1);
        // A dual-stack socket's default applies to v4-mapped destinations.
        let a6 = UdpSocket::bind("[::]:0".parse().unwrap(), &opts()).unwrap();
        let s4 = send(&mut tx, &a6, dest, &pattern(1, 64), 46 << 2);
        assert_eq!(recv_tos(), (64, Some(46 << 2)));
        assert_eq!(s4.lone_sends, 1);
    }

    #[test]
    fn plain_datagrams_keep_their_length_and_empty_ones_arrive() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        // A datagram from a non-GSO sender is one packet, not truncated...
        a.send_to(&[1u8; 2000], b.local_addr()).unwrap();
        let mut rx = RxBatch::new(2);
        let (got, stats) = recv_all(&mut rx, &b, 1);
        assert_eq!(got[0].1.len(), 2000);
        assert_eq!(stats.truncated, 0);
        // ...and an empty datagram is delivered as empty, not dropped.
        a.send_to(&[], b.local_addr()).unwrap();
        let (got, _) = recv_all(&mut rx, &b, 1);
        assert!(got[0].1.is_empty());
    }

    #[test]
    fn a_whole_packet_goes_out_at_once_only_with_nothing_queued() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let b = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let c = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let mut tx = TxQueue::new(8, 1472);
        let mut rx = RxBatch::new(4);
        let mut stats = SocketStats::default();
        let mut errs = Vec::new();
        let tos = a.default_tos(&b.local_addr()).expect("the socket's TOS");
        let pkts = pattern(3, 100);
        // Alone: sent at once, to each destination in turn.
        for (i, dest) in [b.local_addr(), c.local_addr(), b.local_addr()]
            .into_iter()
            .enumerate()
        {
            write_next(&mut tx, &pkts[i]);
            assert!(tx.send_whole_now(&a, &dest, tos, pkts[i].len(), &mut stats, &mut errs));
        }
        assert_eq!((stats.lone_sends, stats.packets_sent), (3, 3));
        assert_eq!(tx.pending(), 0);
        let (got, _) = recv_all(&mut rx, &b, 2);
        assert_eq!((&got[0].1, &got[1].1), (&pkts[0], &pkts[2]));
        let (got, _) = recv_all(&mut rx, &c, 1);
        assert_eq!(got[0], (a.local_addr(), pkts[1].clone()));
        // Behind a queued packet, or with a TOS the socket does not apply
        // itself: refused, so that order and TOS are kept.
        write_next(&mut tx, &pkts[0]);
        tx.commit(b.local_addr(), tos, pkts[0].len());
        write_next(&mut tx, &pkts[1]);
        assert!(!tx.send_whole_now(&a, &b.local_addr(), tos, 100, &mut stats, &mut errs));
        assert_eq!(tx.flush(&a, &mut stats, &mut errs), FlushOutcome::Done);
        write_next(&mut tx, &pkts[1]);
        assert!(!tx.send_whole_now(&a, &b.local_addr(), tos ^ 0x20, 100, &mut stats, &mut errs));
        assert_eq!(stats.packets_sent, 4);
    }

    #[test]
    fn a_refused_direct_send_reports_the_peer() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let dead = closed_port();
        let mut tx = TxQueue::new(8, 1472);
        let mut stats = SocketStats::default();
        let mut errs = Vec::new();
        let tos = a.default_tos(&dead).expect("the socket's TOS");
        let pkt = pattern(1, 64).remove(0);
        // The first send provokes the ICMP error; a later one returns it
        // (ECONNREFUSED), and the peer must then be reported, not lost.
        let start = Instant::now();
        while errs.is_empty() && start.elapsed() < Duration::from_secs(2) {
            write_next(&mut tx, &pkt);
            if !tx.send_whole_now(&a, &dead, tos, pkt.len(), &mut stats, &mut errs) {
                // What the runtime does then: queue it and flush.
                tx.commit(dead, tos, pkt.len());
                tx.flush(&a, &mut stats, &mut errs);
            }
            a.read_errors(&mut errs, &mut stats);
        }
        assert!(errs.contains(&(dead, libc::ECONNREFUSED)), "{errs:?}");
    }

    #[test]
    fn icmp_port_unreachable_is_reported() {
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts()).unwrap();
        let dead = closed_port();
        let mut tx = TxQueue::new(8, 1472);
        send(&mut tx, &a, dead, &pattern(1, 64), 0);
        let mut errs = Vec::new();
        let mut stats = SocketStats::default();
        let start = Instant::now();
        while errs.is_empty() && start.elapsed() < Duration::from_secs(2) {
            a.read_errors(&mut errs, &mut stats);
        }
        assert_eq!(errs, vec![(dead, libc::ECONNREFUSED)]);
        // The socket error also surfaces on receive, which the caller treats as
        // a hint to read the error queue; it must not wedge the socket.
        let mut rx = RxBatch::new(2);
        for _ in 0..3 {
            let _ = rx.recv(&a, &mut stats, |_, _, _| {});
        }
        assert!(matches!(
            rx.recv(&a, &mut stats, |_, _, _| {}),
            RecvOutcome::Empty
        ));
    }

    #[test]
    fn fault_injector_drops_about_the_asked_fraction() {
        let mut f = Faults::new(&FaultInjector {
            rx_loss: 0.1,
            tx_loss: 0.0,
            seed: 42,
        });
        let drops = (0..100_000).filter(|_| f.drop_rx()).count();
        assert!((9_000..11_000).contains(&drops), "{drops}");
        assert!(!(0..1000).any(|_| f.drop_tx()));
        let mut all = Faults::new(&FaultInjector {
            rx_loss: 1.0,
            tx_loss: 1.0,
            seed: 1,
        });
        assert!((0..1000).all(|_| all.drop_rx() && all.drop_tx()));
    }
}
