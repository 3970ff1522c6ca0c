//! Thin wrappers over the few Linux system calls the runtime needs beyond what
//! `std`, `socket2` and `nix` offer: raw socket addresses for `mmsghdr`, the
//! background thread's doorbell (`nix`'s eventfd), and `ppoll` with a
//! nanosecond timeout.

use nix::sys::eventfd::{self, EfdFlags};
use std::io;
use std::mem;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Writes `addr` into `storage` in the socket's family and returns the length.
/// On an IPv6 socket an IPv4 destination is written as a v4-mapped address,
/// so a dual-stack endpoint can reach both families.
pub(crate) fn write_sockaddr(
    addr: &SocketAddr,
    v6_socket: bool,
    storage: &mut libc::sockaddr_storage,
) -> libc::socklen_t {
    let v6 = match (addr, v6_socket) {
        (SocketAddr::V4(a), false) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in) };
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            *sin = unsafe { mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip().octets()),
            };
            return mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        }
        (SocketAddr::V4(a), true) => SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
        (SocketAddr::V6(a), _) => *a,
    };
    // SAFETY: as above, for sockaddr_in6.
    let sin6 = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in6) };
    // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
    *sin6 = unsafe { mem::zeroed() };
    sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sin6.sin6_port = v6.port().to_be();
    sin6.sin6_addr = libc::in6_addr {
        s6_addr: v6.ip().octets(),
    };
    sin6.sin6_flowinfo = v6.flowinfo();
    sin6.sin6_scope_id = v6.scope_id();
    mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
}

/// Reads a socket address filled in by the kernel. v4-mapped IPv6 addresses
/// come back as IPv4 so that the engine sees one address per peer.
pub(crate) fn read_sockaddr(
    storage: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    match storage.ss_family as libc::c_int {
        libc::AF_INET if len as usize >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: family and length checked.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: family and length checked.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Some(SocketAddr::V4(SocketAddrV4::new(v4, port)));
            }
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                port,
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// An eventfd used as a doorbell: any thread rings it, the background thread
/// includes it in its `ppoll` set and drains it.
pub(crate) struct EventFd(eventfd::EventFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        let flags = EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC;
        Ok(EventFd(eventfd::EventFd::from_value_and_flags(0, flags)?))
    }
    pub(crate) fn ring(&self) {
        // Failure (counter overflow) still leaves the fd readable, which is
        // all a doorbell needs.
        let _ = self.0.write(1);
    }
    /// Reads (and so resets) the counter; nothing to read (EAGAIN) is fine.
    pub(crate) fn drain(&self) {
        let _ = self.0.read();
    }
    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// `ppoll` on up to a few descriptors; `None` waits forever. Returns the
/// number of ready descriptors (0 on timeout); EINTR counts as a timeout.
pub(crate) fn ppoll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts;
    let tsp = match timeout {
        Some(d) => {
            ts = libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            &ts as *const libc::timespec
        }
        None => std::ptr::null(),
    };
    // SAFETY: fds is a valid slice of pollfd; tsp is null or points to ts.
    let n = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// Lowers the calling thread's timer slack so that short sleeps (pacing
/// deadlines of a few microseconds) are not stretched by the default 50 µs.
pub(crate) fn set_timer_slack_ns(ns: u64) {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
}

/// Moves the calling thread off the CPU it runs on, leaving its allowed
/// CPUs as they were: its affinity is narrowed to the others, which makes
/// the kernel migrate it at once, then restored. Returns whether it moved
/// (not when it may run on one CPU only, or a call failed).
pub(crate) fn move_off_this_cpu() -> bool {
    // SAFETY: `sched_getcpu` takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    if cpu < 0 || cpu as usize >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: the set is `size` bytes, written by the kernel.
    if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
        return false;
    }
    // SAFETY: (`CPU_COUNT`, `CPU_ISSET`, `CPU_CLR` read and write the
    // set in place, `cpu` is below CPU_SETSIZE.)
    let (count, here) = unsafe {
        (
            libc::CPU_COUNT(&allowed),
            libc::CPU_ISSET(cpu as usize, &allowed),
        )
    };
    if count < 2 || !here {
        return false;
    }
    let mut others = allowed;
    // SAFETY: as above.
    unsafe { libc::CPU_CLR(cpu as usize, &mut others) };
    // SAFETY: valid sets of `size` bytes.
    let moved = unsafe { libc::sched_setaffinity(0, size, &others) } == 0;
    // SAFETY: as above; restores the caller's own set.
    unsafe { libc::sched_setaffinity(0, size, &allowed) };
    moved
}

/// CLOCK_MONOTONIC in nanoseconds (the clock `Instant` reads), without
/// `Instant`'s checked arithmetic: read several times per round trip.
#[inline]
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A host clock that is not the machine's: the engine reads `offset_ns`
/// plus the time since its endpoint opened, running `drift_ppb` parts per
/// billion fast (negative: slow). Test hook (`test-hooks` feature, set with
/// `EndpointBuilder::clock_skew`): endpoints on one machine share one
/// clock, and experiments on unsynchronised clocks (issue #22's On-Ramp
/// testbed run) give each its own. The default is the machine's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockSkew {
    /// Added to every reading (ns).
    pub offset_ns: u64,
    /// Rate error, parts per billion (50 ppm = 50,000).
    pub drift_ppb: i64,
}

#[cfg_attr(not(any(test, feature = "test-hooks")), allow(dead_code))]
impl ClockSkew {
    /// The skewed reading for `elapsed` ns of the machine's clock.
    #[inline]
    pub fn read(&self, elapsed: u64) -> u64 {
        // No drift (the default, and every endpoint of a build that has
        // the feature only because another crate of it turned it on): one
        // compare and an add on the clock read.
        if self.drift_ppb == 0 {
            return elapsed.saturating_add(self.offset_ns);
        }
        let drift = (elapsed as i128 * self.drift_ppb as i128) / 1_000_000_000;
        (elapsed as i128 + drift + self.offset_ns as i128).clamp(0, u64::MAX as i128) as u64
    }

    /// The machine's elapsed ns at which the skewed clock reads `t` (the
    /// inverse of [`Self::read`], to the nanosecond; a reading before the
    /// offset maps to 0).
    pub fn elapsed_at(&self, t: u64) -> u64 {
        let since = t.saturating_sub(self.offset_ns) as i128;
        let e = since * 1_000_000_000 / (1_000_000_000 + self.drift_ppb as i128).max(1);
        e.clamp(0, u64::MAX as i128) as u64
    }
}

/// The MTU of the network interface that holds `ip` (for a loopback
/// address, of the loopback interface, which holds all of `127.0.0.0/8`),
/// or `None` for a wildcard address or one no interface holds.
pub(crate) fn interface_mtu(ip: std::net::IpAddr) -> Option<usize> {
    if ip.is_unspecified() {
        return None;
    }
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name = None;
    let mut ifa = list;
    while !ifa.is_null() {
        // SAFETY: a node of the list getifaddrs returned, not yet freed.
        let node = unsafe { &*ifa };
        ifa = node.ifa_next;
        let holds = if ip.is_loopback() {
            node.ifa_flags & libc::IFF_LOOPBACK as libc::c_uint != 0
        } else if node.ifa_addr.is_null() {
            false
        } else {
            // SAFETY: ifa_addr points at a sockaddr of the family it names,
            // which fits in sockaddr_storage.
            let storage = unsafe {
                let mut st: libc::sockaddr_storage = mem::zeroed();
                let len = match (*node.ifa_addr).sa_family as libc::c_int {
                    libc::AF_INET => mem::size_of::<libc::sockaddr_in>(),
                    libc::AF_INET6 => mem::size_of::<libc::sockaddr_in6>(),
                    _ => 0,
                };
                std::ptr::copy_nonoverlapping(
                    node.ifa_addr as *const u8,
                    &mut st as *mut _ as *mut u8,
                    len,
                );
                (st, len)
            };
            storage.1 > 0
                && read_sockaddr(&storage.0, storage.1 as libc::socklen_t)
                    .is_some_and(|a| a.ip() == ip)
        };
        if holds && !node.ifa_name.is_null() {
            // SAFETY: ifa_name is a NUL-terminated string in the list.
            let s = unsafe { std::ffi::CStr::from_ptr(node.ifa_name) };
            name = Some(s.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: the list from getifaddrs, freed once; no node is used after.
    unsafe { libc::freeifaddrs(list) };
    let name = name?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skewed_clock_is_offset_drifts_and_inverts() {
        let none = ClockSkew::default();
        assert_eq!(none.read(123_456), 123_456);
        assert_eq!(none.elapsed_at(123_456), 123_456);
        let offset = ClockSkew {
            offset_ns: 1_000,
            drift_ppb: 0,
        };
        assert_eq!(offset.read(5), 1_005);
        assert_eq!(offset.elapsed_at(1_005), 5);
        let fast = ClockSkew {
            offset_ns: 1_000_000_000,
            drift_ppb: 50_000,
        };
        // 1 s of the machine's clock: 1 s + 50 µs on top of the offset.
        assert_eq!(fast.read(1_000_000_000), 2_000_050_000);
        assert_eq!(fast.read(0), 1_000_000_000);
        let slow = ClockSkew {
            offset_ns: 7,
            drift_ppb: -50_000,
        };
        assert_eq!(slow.read(1_000_000_000), 999_950_007);
        for c in [fast, slow] {
            for e in [0u64, 1, 999, 20_000_000, 3_600_000_000_000] {
                let back = c.elapsed_at(c.read(e));
                assert!(back.abs_diff(e) <= 1, "{c:?} {e} -> {back}");
            }
        }
        // Before the offset: the endpoint's opening.
        assert_eq!(fast.elapsed_at(5), 0);
        // Monotonic: a positive rate.
        assert!(slow.read(1_000_001) > slow.read(1_000_000));
    }

    fn allowed_cpus() -> libc::cpu_set_t {
        // SAFETY: an all-zero cpu_set_t is a valid empty set, filled by the kernel.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        // SAFETY: the set's own size.
        let r = unsafe { libc::sched_getaffinity(0, mem::size_of_val(&set), &mut set) };
        assert_eq!(r, 0);
        set
    }

    /// The move changes the CPU the thread runs on, never the CPUs it may
    /// run on; with one allowed CPU it does nothing.
    #[test]
    fn moving_off_this_cpu_keeps_the_allowed_cpus() {
        let before = allowed_cpus();
        // SAFETY: reads the set.
        let count = unsafe { libc::CPU_COUNT(&before) };
        // SAFETY: no arguments.
        let from = unsafe { libc::sched_getcpu() };
        let moved = move_off_this_cpu();
        // SAFETY: as above.
        let to = unsafe { libc::sched_getcpu() };
        assert_eq!(moved, count >= 2);
        if moved {
            assert_ne!(from, to);
        }
        let after = allowed_cpus();
        // SAFETY: `cpu_set_t` is plain bytes.
        let bytes = |s: &libc::cpu_set_t| unsafe {
            std::slice::from_raw_parts(s as *const _ as *const u8, mem::size_of_val(s)).to_vec()
        };
        assert_eq!(bytes(&before), bytes(&after));
    }

    #[test]
    fn sockaddr_round_trips() {
        let cases: [SocketAddr; 3] = [
            "127.0.0.1:4000".parse().unwrap(),
            "[::1]:5000".parse().unwrap(),
            "[fe80::1%2]:6000".parse().unwrap(),
        ];
        for a in cases {
            // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
            let mut st: libc::sockaddr_storage = unsafe { mem::zeroed() };
            let len = write_sockaddr(&a, a.is_ipv6(), &mut st);
            assert_eq!(read_sockaddr(&st, len), Some(a));
        }
    }

    #[test]
    fn v4_on_v6_socket_is_mapped_and_unmapped() {
        let a: SocketAddr = "10.1.2.3:99".parse().unwrap();
        // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
        let mut st: libc::sockaddr_storage = unsafe { mem::zeroed() };
        let len = write_sockaddr(&a, true, &mut st);
        assert_eq!(st.ss_family as i32, libc::AF_INET6);
        assert_eq!(read_sockaddr(&st, len), Some(a));
    }

    #[test]
    fn short_or_unknown_sockaddr_is_rejected() {
        // SAFETY: a plain C struct (integers, pointers, arrays of them): all-zero bytes are a valid value.
        let mut st: libc::sockaddr_storage = unsafe { mem::zeroed() };
        assert_eq!(read_sockaddr(&st, 0), None);
        st.ss_family = libc::AF_INET as libc::sa_family_t;
        assert_eq!(read_sockaddr(&st, 4), None);
    }

    #[test]
    fn eventfd_wakes_ppoll() {
        let e = EventFd::new().unwrap();
        let mut fds = [libc::pollfd {
            fd: e.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(ppoll(&mut fds, Some(Duration::from_millis(1))).unwrap(), 0);
        e.ring();
        assert_eq!(ppoll(&mut fds, Some(Duration::from_secs(5))).unwrap(), 1);
        e.drain();
        fds[0].revents = 0;
        assert_eq!(ppoll(&mut fds, Some(Duration::from_millis(1))).unwrap(), 0);
    }
}
