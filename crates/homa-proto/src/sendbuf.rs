//! Send buffers: outgoing messages laid out as the packets that carry them.
//!
//! A plain message (`Bytes`) is contiguous, so a driver that sends a run of
//! its packets with one UDP GSO call must first gather each packet's header
//! and payload slice into one buffer: the kernel charges per iovec, and that
//! gather copy was a sixth of a 500 KB sender's CPU time. A [`SendBuf`]
//! leaves room for the DATA headers before every `segment` bytes of payload:
//!
//! ```text
//! [hdr 0][payload 0..P][hdr 1][payload P..2P] ... [hdr n-1][payload ..len]
//! ```
//!
//! The engine writes each packet's header into its room when it transmits
//! the packet for the first time, so a run of packets is one contiguous
//! slice of the buffer, sent without a copy ([`crate::Burst`] with
//! `header_len` 0). Retransmissions take the ordinary path (a header in the
//! driver's buffer plus a payload slice).
//!
//! Ownership rules, enforced at run time:
//! * the application writes payload only through a unique handle
//!   ([`SendBuf::write`] fails while any clone, engine lease or queued run
//!   exists);
//! * only one engine may send a buffer at a time: sending a buffer that is
//!   still in flight fails with [`crate::SendError::BufferInFlight`]; it is
//!   in flight until the RPC no longer needs it *and* the driver has sent or
//!   dropped every packet run taken from it ([`SendBuf::in_flight`]).

use bytes::Bytes;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes of header room before every segment: the DATA packet's headers.
pub const SENDBUF_HEAD: usize = crate::wire::DATA_PACKET_OVERHEAD;

/// How far ahead [`Lease::write_header`] prefetches.
const PREFETCH_PACKETS: usize = 8;

struct Inner {
    /// `total` bytes, zero-initialised, owned by this struct.
    ptr: NonNull<u8>,
    total: usize,
    /// Message length.
    len: usize,
    /// Payload bytes per packet.
    segment: usize,
    /// Packets (a zero-length message still takes one).
    packets: usize,
    /// Engine lease (1) plus packet runs handed to the driver.
    holds: AtomicUsize,
}

// SAFETY: the memory is owned by `Inner`; the rules above make every write
// exclusive (payload: unique handle; headers: the single lease holder) and
// disjoint from concurrent reads.
unsafe impl Send for Inner {}
// SAFETY: the same rules make shared references safe across threads.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: allocated in `SendBuf::new` as a boxed slice of `total`.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.total,
            )));
        }
    }
}

/// An outgoing message laid out as its packets (see the module docs). Clone
/// is cheap (a reference count); clones share the bytes.
#[derive(Clone)]
pub struct SendBuf {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SendBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBuf")
            .field("len", &self.inner.len)
            .field("segment", &self.inner.segment)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl SendBuf {
    /// A zeroed message of `len` bytes, cut into packets of `segment` payload
    /// bytes. An endpoint sends it without copying only if `segment` is its
    /// own payload size per packet ([`crate::Config::max_data_per_packet`]);
    /// `Endpoint::new_send_buf` makes one that fits.
    ///
    /// Panics if `segment` is 0.
    pub fn new(len: usize, segment: usize) -> SendBuf {
        assert!(segment > 0, "a send buffer needs a non-zero segment size");
        let packets = len.div_ceil(segment).max(1);
        let total = len + packets * SENDBUF_HEAD;
        let mem: Box<[u8]> = vec![0u8; total].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(mem) as *mut u8).expect("non-null box");
        SendBuf {
            inner: Arc::new(Inner {
                ptr,
                total,
                len,
                segment,
                packets,
                holds: AtomicUsize::new(0),
            }),
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8], segment: usize) -> SendBuf {
        let mut b = SendBuf::new(data.len(), segment);
        b.write(0, data).expect("a new buffer is unique");
        b
    }

    /// Message length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the message is zero-length (it still takes one packet).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Payload bytes per packet.
    pub fn segment(&self) -> usize {
        self.inner.segment
    }

    /// Number of packets (a zero-length message still takes one).
    pub fn packets(&self) -> usize {
        self.inner.packets
    }

    /// Whether an engine holds the buffer for sending, or the driver still
    /// holds packet runs taken from it.
    pub fn in_flight(&self) -> bool {
        self.inner.holds.load(Ordering::Acquire) > 0
    }

    /// Start of packet `k` (its header room) in the buffer.
    fn packet_start(&self, k: usize) -> usize {
        k * (self.inner.segment + SENDBUF_HEAD)
    }

    /// Buffer position of message offset `offset` (< len, or == len at the end).
    fn position(&self, offset: usize) -> usize {
        let seg = self.inner.segment;
        let k = (offset / seg).min(self.packets() - 1);
        self.packet_start(k) + SENDBUF_HEAD + (offset - k * seg)
    }

    /// Copies `data` to message offset `offset`. Fails (and writes nothing)
    /// unless this is the only handle on the buffer, or if the range exceeds
    /// the message.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), SendBufError> {
        let end = offset
            .checked_add(data.len())
            .filter(|&e| e <= self.inner.len)
            .ok_or(SendBufError::OutOfRange {
                offset,
                len: data.len(),
                message: self.inner.len,
            })?;
        if Arc::get_mut(&mut self.inner).is_none() || self.in_flight() {
            return Err(SendBufError::Shared);
        }
        let seg = self.inner.segment;
        let mut pos = offset;
        while pos < end {
            let n = (seg - pos % seg).min(end - pos);
            let at = self.position(pos);
            // SAFETY: `at..at + n` lies inside one segment of the buffer, and
            // we hold the only handle (no reader, no lease).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data[pos - offset..].as_ptr(),
                    self.inner.ptr.as_ptr().add(at),
                    n,
                );
            }
            pos += n;
        }
        Ok(())
    }

    /// The payload as one mutable slice per packet, for building a message
    /// in place (serializing straight into the buffer instead of copying
    /// into it). Fails unless this is the only handle on the buffer.
    pub fn segments_mut(&mut self) -> Result<impl Iterator<Item = &mut [u8]> + '_, SendBufError> {
        if Arc::get_mut(&mut self.inner).is_none() || self.in_flight() {
            return Err(SendBufError::Shared);
        }
        let (len, seg, base) = (self.inner.len, self.inner.segment, self.inner.ptr.as_ptr());
        Ok((0..len.div_ceil(seg)).map(move |k| {
            let n = seg.min(len - k * seg);
            // SAFETY: the segments are disjoint ranges inside the buffer, and
            // `&mut self` on the only handle excludes every other access for
            // as long as the iterator's slices live.
            unsafe {
                std::slice::from_raw_parts_mut(base.add(k * (seg + SENDBUF_HEAD) + SENDBUF_HEAD), n)
            }
        }))
    }

    /// The payload, as one slice per packet.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let (len, seg) = (self.inner.len, self.inner.segment);
        (0..len.div_ceil(seg)).map(move |k| self.payload(k * seg, ((k + 1) * seg).min(len)))
    }

    /// Copies the payload into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.inner.len);
        for s in self.segments() {
            v.extend_from_slice(s);
        }
        v
    }

    /// Message bytes `[start, end)`, which must lie within one segment.
    pub(crate) fn payload(&self, start: usize, end: usize) -> &[u8] {
        self.payload_in(start / self.inner.segment, start, end)
    }

    /// [`Self::payload`] for a range in packet `k` (the caller knows it, so
    /// the hot path skips the division).
    pub(crate) fn payload_in(&self, k: usize, start: usize, end: usize) -> &[u8] {
        let seg = self.inner.segment;
        let k = k.min(self.inner.packets - 1);
        debug_assert_eq!(k, (start / seg).min(self.inner.packets - 1));
        assert!(
            k * seg <= start
                && start <= end
                && end <= self.inner.len
                && (end == start || end <= (k + 1) * seg),
            "payload range {start}..{end} of a {}-byte message crosses a packet boundary \
             or the end",
            self.inner.len
        );
        let at = self.packet_start(k) + SENDBUF_HEAD + (start - k * seg);
        // SAFETY: inside the buffer (checked above); payload bytes are
        // written only through a unique handle, which cannot coexist with
        // `&self` on another handle, nor with this borrow.
        unsafe { std::slice::from_raw_parts(self.inner.ptr.as_ptr().add(at), end - start) }
    }

    /// Takes the buffer for sending: fails if it is already in flight.
    pub(crate) fn lease(self) -> Result<Lease, SendBuf> {
        match self
            .inner
            .holds
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(Lease { buf: self }),
            Err(_) => Err(self),
        }
    }
}

/// The engine's hold on a buffer it is sending.
pub(crate) struct Lease {
    buf: SendBuf,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.buf.inner.holds.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Lease {
    pub(crate) fn buf(&self) -> &SendBuf {
        &self.buf
    }

    /// Writes the header of packet `k` (as [`crate::wire::data_header_words`])
    /// into its room.
    pub(crate) fn write_header(&self, k: usize, words: &[u64; 7]) {
        assert!(k < self.buf.packets());
        let at = self.buf.packet_start(k);
        // A buffer reused after a while is out of the cache: start loading
        // the header room a few packets ahead so that those writes do not
        // stall (prefetching past the end is harmless).
        let ahead = self.buf.packet_start(k + PREFETCH_PACKETS);
        crate::table::prefetch_ptr(self.buf.inner.ptr.as_ptr().wrapping_add(ahead));
        // SAFETY: header room is written only by the lease holder (us), and
        // nobody holds a reference into it: driver runs are `Bytes` that
        // form slices only while the driver sends them, under the same
        // single-threaded engine ownership that calls this.
        unsafe { crate::wire::store_header_words(self.buf.inner.ptr.as_ptr().add(at), words) };
    }

    /// Packets `[first, last)` with their headers, as one `Bytes` that keeps
    /// the buffer in flight until dropped.
    pub(crate) fn run(&self, first: usize, last: usize) -> Bytes {
        let start = self.buf.packet_start(first);
        let end = if last >= self.buf.packets() {
            self.buf.inner.total
        } else {
            self.buf.packet_start(last)
        };
        self.view(start, end)
    }

    /// Message bytes `[start, end)` (within one segment) as `Bytes`.
    pub(crate) fn payload_bytes(&self, start: usize, end: usize) -> Bytes {
        let p = self.buf.payload(start, end);
        let at = p.as_ptr() as usize - self.buf.inner.ptr.as_ptr() as usize;
        self.view(at, at + p.len())
    }

    fn view(&self, start: usize, end: usize) -> Bytes {
        assert!(start <= end && end <= self.buf.inner.total);
        self.buf.inner.holds.fetch_add(1, Ordering::AcqRel);
        Bytes::from_owner(View {
            buf: self.buf.clone(),
            start,
            end,
        })
    }
}

/// Part of a buffer handed to the driver; keeps the buffer in flight.
struct View {
    buf: SendBuf,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for View {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: inside the buffer; see `Lease::write_header` for why no
        // write overlaps this read.
        unsafe {
            std::slice::from_raw_parts(
                self.buf.inner.ptr.as_ptr().add(self.start),
                self.end - self.start,
            )
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.buf.inner.holds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why [`SendBuf::write`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendBufError {
    /// The write would reach past the end of the message.
    #[error("write of {len} bytes at offset {offset} exceeds the {message}-byte message")]
    OutOfRange {
        /// Message offset the write started at.
        offset: usize,
        /// Bytes the write carried.
        len: usize,
        /// The buffer's message length.
        message: usize,
    },
    /// Another handle (a clone) exists, or the buffer is in flight
    /// ([`SendBuf::in_flight`]): writing could change bytes being sent.
    #[error("the send buffer is shared (another handle exists, or it is in flight)")]
    Shared,
}

/// What an application hands the engine to send: a contiguous message, or a
/// [`SendBuf`] laid out as packets (sent without a gather copy).
#[derive(Clone, Debug)]
pub enum Outgoing {
    /// A contiguous message: each packet's header is joined to its payload
    /// slice when the packet is sent (see the module docs).
    Bytes(Bytes),
    /// A message already laid out as its packets.
    Buf(SendBuf),
}

impl Outgoing {
    /// Message length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Outgoing::Bytes(b) => b.len(),
            Outgoing::Buf(b) => b.len(),
        }
    }
    /// Whether the message is zero-length.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Into<Bytes>> From<T> for Outgoing {
    fn from(b: T) -> Outgoing {
        Outgoing::Bytes(b.into())
    }
}

impl From<SendBuf> for Outgoing {
    fn from(b: SendBuf) -> Outgoing {
        Outgoing::Buf(b)
    }
}

/// An outgoing message as the engine holds it.
pub(crate) enum Payload {
    Bytes(Bytes),
    Buf(Lease),
}

impl Payload {
    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::Bytes(b) => b.len(),
            Payload::Buf(l) => l.buf().len(),
        }
    }
    /// Message bytes `[start, end)`; for a buffer, within one segment.
    pub(crate) fn slice(&self, start: usize, end: usize) -> &[u8] {
        match self {
            Payload::Bytes(b) => &b[start..end],
            Payload::Buf(l) => l.buf().payload(start, end),
        }
    }
    /// [`Self::slice`] of a range in packet `k` of a buffer (ignored for
    /// plain bytes).
    pub(crate) fn slice_in(&self, k: Option<u32>, start: usize, end: usize) -> &[u8] {
        match (self, k) {
            (Payload::Buf(l), Some(k)) => l.buf().payload_in(k as usize, start, end),
            _ => self.slice(start, end),
        }
    }
    /// The same as `Bytes`.
    pub(crate) fn bytes(&self, start: usize, end: usize) -> Bytes {
        match self {
            Payload::Bytes(b) => b.slice(start..end),
            Payload::Buf(l) => l.payload_bytes(start, end),
        }
    }
    pub(crate) fn lease(&self) -> Option<&Lease> {
        match self {
            Payload::Bytes(_) => None,
            Payload::Buf(l) => Some(l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_payload_round_trip() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
        let b = SendBuf::from_slice(&data, 1000);
        assert_eq!(b.packets(), 10);
        assert_eq!(b.to_vec(), data);
        assert_eq!(b.segments().count(), 10);
        let odd = SendBuf::from_slice(&data[..2500], 1000);
        assert_eq!(odd.packets(), 3);
        assert_eq!(
            odd.segments().map(|s| s.len()).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
        let empty = SendBuf::new(0, 1000);
        assert_eq!(empty.packets(), 1);
        assert_eq!(empty.segments().count(), 0);
    }

    #[test]
    fn writes_need_a_unique_handle_in_range() {
        let mut b = SendBuf::new(3000, 1000);
        b.write(500, &[7; 1000]).unwrap();
        assert_eq!(
            &b.to_vec()[499..1502],
            &[[0].as_slice(), &[7; 1000], &[0, 0]].concat()[..]
        );
        assert!(matches!(
            b.write(2500, &[1; 501]),
            Err(SendBufError::OutOfRange { .. })
        ));
        let c = b.clone();
        assert_eq!(b.write(0, &[1]), Err(SendBufError::Shared));
        drop(c);
        b.write(0, &[1]).unwrap();
    }

    #[test]
    fn segments_mut_builds_in_place_and_needs_a_unique_handle() {
        let mut b = SendBuf::new(2500, 1000);
        let mut i = 0u32;
        for s in b.segments_mut().unwrap() {
            for x in s.iter_mut() {
                *x = (i % 251) as u8;
                i += 1;
            }
        }
        assert_eq!(i, 2500);
        let want: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(b.to_vec(), want);
        let c = b.clone();
        assert!(b.segments_mut().is_err());
        drop(c);
        let lease = b.clone().lease().unwrap();
        drop(lease);
        assert_eq!(b.segments_mut().unwrap().count(), 3);
        assert_eq!(SendBuf::new(0, 1000).segments_mut().unwrap().count(), 0);
    }

    #[test]
    fn lease_runs_and_headers() {
        let data: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        let mut b = SendBuf::from_slice(&data, 1000);
        let lease = b.clone().lease().unwrap();
        assert!(b.in_flight());
        assert!(b.clone().lease().is_err(), "one lease at a time");
        assert_eq!(b.write(0, &[1]), Err(SendBufError::Shared));
        for k in 0..3 {
            lease.write_header(k, &[u64::from_le_bytes([k as u8 + 1; 8]); 7]);
        }
        let run = lease.run(1, 3);
        assert_eq!(run.len(), 2 * SENDBUF_HEAD + 1500);
        assert_eq!(&run[..SENDBUF_HEAD], &[2; SENDBUF_HEAD]);
        assert_eq!(&run[SENDBUF_HEAD..SENDBUF_HEAD + 1000], &data[1000..2000]);
        assert_eq!(
            &run[1000 + SENDBUF_HEAD..1000 + 2 * SENDBUF_HEAD],
            &[3; SENDBUF_HEAD]
        );
        assert_eq!(&run[1000 + 2 * SENDBUF_HEAD..], &data[2000..]);
        let p = lease.payload_bytes(1200, 1300);
        assert_eq!(&p[..], &data[1200..1300]);
        drop(lease);
        assert!(b.in_flight(), "runs still hold the buffer");
        drop(run);
        assert!(b.in_flight());
        drop(p);
        assert!(!b.in_flight());
        b.write(0, &[1]).unwrap();
    }

    #[test]
    #[should_panic(expected = "crosses a packet boundary")]
    fn payload_must_stay_in_one_segment() {
        let b = SendBuf::new(2000, 1000);
        let _ = b.payload(900, 1100);
    }
}
