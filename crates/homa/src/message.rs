//! Received messages: the engine's pool-backed fragments, handed to the
//! application without a copy, with contiguous access when wanted, as a
//! [`bytes::Buf`], and cheap to clone.

use bytes::{Buf, Bytes};
use std::borrow::Cow;
use std::io;

/// A received request or response. Its bytes live in the endpoint's receive
/// pool as one or more fragments; dropping the message (its last clone)
/// returns the space. It is the engine's [`homa_proto::Message`] (the same
/// message, see [`Self::into_inner`]) with a read position for [`Buf`].
///
/// `Message` implements [`bytes::Buf`] over those fragments without copying
/// them: [`Buf::chunk`] is the rest of the current fragment, [`Buf::advance`]
/// moves past bytes, and [`Buf::copy_to_bytes`] shares the pool space when
/// the bytes lie in one fragment. Every method sees only the bytes not yet
/// consumed through `Buf` (as with [`Bytes`]): [`Self::len`],
/// [`Self::fragments`], [`Self::to_vec`]...
///
/// Cloning is cheap and shares the pool space: a clone adds one reference
/// to each 64 KiB pool page the message occupies (an atomic increment; a
/// message of up to 64 KiB has one page) and, for a message longer than a
/// page, copies the short list of its whole pages (one small allocation).
/// No bytes are copied, and the space goes back to the pool when the last
/// clone is dropped. Receiving a message costs nothing extra for this.
///
/// ```no_run
/// # fn show(m: homa::Message) {
/// use bytes::Buf;
/// for piece in m.fragments() { /* zero-copy */ let _ = piece; }
/// let all: std::borrow::Cow<[u8]> = m.contiguous(); // copies only if fragmented
/// let mut m = m.clone(); // shares the pool space
/// let tag = m.get_u32(); // Buf: parse across fragment boundaries
/// let body = m.copy_to_bytes(m.remaining()); // shared when in one fragment
/// # let _ = (all, tag, body);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Message {
    inner: homa_proto::Message,
    /// Bytes at the front consumed through [`Buf::advance`].
    start: usize,
}

impl Message {
    pub(crate) fn new(inner: homa_proto::Message) -> Message {
        Message { inner, start: 0 }
    }
    /// Length in bytes (not counting bytes consumed through [`Buf`]).
    pub fn len(&self) -> usize {
        self.inner.len() - self.start
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes in order, as contiguous slices of the receive pool.
    pub fn fragments(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut skip = self.start;
        self.inner.fragments().filter_map(move |f| {
            if skip >= f.len() {
                skip -= f.len();
                None
            } else {
                let rest = &f[skip..];
                skip = 0;
                Some(rest)
            }
        })
    }
    /// The bytes as one slice of the pool if they are in one fragment.
    fn single(&self) -> Option<&[u8]> {
        if self.start == 0 {
            // The engine's fast answer for a whole message.
            return self.inner.contiguous();
        }
        let mut it = self.fragments();
        match (it.next(), it.next()) {
            (None, _) => Some(&[]),
            (Some(only), None) => Some(only),
            _ => None,
        }
    }
    /// The whole message as one slice: borrowed when it is a single fragment
    /// (messages up to a pool page usually are), copied otherwise.
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        match self.single() {
            Some(only) => Cow::Borrowed(only),
            None => Cow::Owned(self.to_vec()),
        }
    }
    /// The message as [`Bytes`](bytes::Bytes): without a copy when it is one
    /// fragment (messages up to a pool page usually are), in which case its
    /// pool space stays held until the last clone of the `Bytes` is dropped;
    /// copied otherwise. Lets a server echo or forward what it received
    /// (`reply(request.into_bytes())`) without copying the bytes.
    pub fn into_bytes(self) -> Bytes {
        if self.single().is_some() {
            Bytes::from_owner(Contiguous(self))
        } else {
            Bytes::from(self.to_vec())
        }
    }
    /// Copies the message into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for f in self.fragments() {
            v.extend_from_slice(f);
        }
        v
    }
    /// Copies `dst.len()` bytes starting at `offset` into `dst`; returns how
    /// many were available (fewer at the end of the message).
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> usize {
        let mut pos = 0; // message offset of the current fragment
        let mut done = 0;
        for f in self.fragments() {
            let end = pos + f.len();
            if end > offset + done && done < dst.len() {
                let from = offset + done - pos;
                let n = (f.len() - from).min(dst.len() - done);
                dst[done..done + n].copy_from_slice(&f[from..from + n]);
                done += n;
            }
            pos = end;
            if done == dst.len() {
                break;
            }
        }
        done
    }
    /// A reader over the message's bytes.
    pub fn reader(&self) -> MessageReader<'_> {
        MessageReader { msg: self, pos: 0 }
    }
    /// The engine's message type, for code that works with `homa_proto`
    /// directly: the whole message, bytes consumed through [`Buf`] included.
    pub fn into_inner(self) -> homa_proto::Message {
        self.inner
    }
}

/// A zero-copy view over the pool fragments: `chunk` is the rest of the
/// current fragment (finding it walks the message's few fragments: at most
/// one per 64 KiB).
impl Buf for Message {
    fn remaining(&self) -> usize {
        self.len()
    }
    fn chunk(&self) -> &[u8] {
        self.fragments().next().unwrap_or(&[])
    }
    fn advance(&mut self, cnt: usize) {
        assert!(
            cnt <= self.len(),
            "cannot advance past the end: {cnt} > {} remaining",
            self.len()
        );
        self.start += cnt;
    }
    fn chunks_vectored<'a>(&'a self, dst: &mut [io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slot, f) in dst.iter_mut().zip(self.fragments()) {
            *slot = io::IoSlice::new(f);
            n += 1;
        }
        n
    }
    /// Shares the pool space (no copy) when the `len` bytes lie in the
    /// current fragment; copies them otherwise. A shared `Bytes` holds the
    /// whole message's pool space until it (and its clones) are dropped,
    /// as a slice of a `Bytes` holds its whole buffer.
    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.len(),
            "cannot take {len} bytes: {} remaining",
            self.len()
        );
        if len == 0 {
            return Bytes::new();
        }
        let out = if self.chunk().len() >= len {
            // The clone holds the pool space for as long as the `Bytes` (and
            // its clones) live.
            Bytes::from_owner(Chunk(self.clone())).slice(..len)
        } else {
            let mut v = Vec::with_capacity(len);
            let mut need = len;
            for f in self.fragments() {
                let n = f.len().min(need);
                v.extend_from_slice(&f[..n]);
                need -= n;
                if need == 0 {
                    break;
                }
            }
            Bytes::from(v)
        };
        self.advance(len);
        out
    }
}

/// A message known to be one fragment, as a `Bytes` owner.
struct Contiguous(Message);

impl AsRef<[u8]> for Contiguous {
    fn as_ref(&self) -> &[u8] {
        self.0.single().unwrap_or(&[])
    }
}

/// A message's current fragment, as a `Bytes` owner.
struct Chunk(Message);

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        self.0.chunk()
    }
}

impl From<Message> for Bytes {
    fn from(m: Message) -> Bytes {
        m.into_bytes()
    }
}

impl PartialEq<[u8]> for Message {
    fn eq(&self, other: &[u8]) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let mut at = 0;
        for f in self.fragments() {
            if f != &other[at..at + f.len()] {
                return false;
            }
            at += f.len();
        }
        true
    }
}

/// [`io::Read`] over a [`Message`].
pub struct MessageReader<'a> {
    msg: &'a Message,
    pos: usize,
}

impl io::Read for MessageReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.msg.copy_to(self.pos, buf);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use homa_proto::pool::Pool;

    fn message(pool: &mut Pool, data: &[u8]) -> Message {
        let a = pool.allocate(data.len()).unwrap();
        pool.write(&a, 0, data);
        Message::new(pool.into_message(a))
    }

    #[test]
    fn into_bytes_shares_one_fragment_and_holds_its_space() {
        let mut pool = Pool::new(4 << 16);
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let m = message(&mut pool, &data);
        let at = m.fragments().next().unwrap().as_ptr();
        let b = m.into_bytes();
        assert_eq!(&b[..], &data[..]);
        assert_eq!(b.as_ptr(), at, "one fragment must not be copied");
        assert_eq!(pool.bpages_in_use(), 1);
        let c = b.clone();
        drop(b);
        assert_eq!(pool.bpages_in_use(), 1, "a clone still holds the space");
        drop(c);
        assert_eq!(pool.bpages_in_use(), 0);
    }

    #[test]
    fn into_bytes_copies_a_fragmented_message() {
        let mut pool = Pool::new(8 << 16);
        // Fill the current page partly so that a large message's tail lands
        // apart from its whole pages.
        let small = message(&mut pool, &[1; 100]);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let m = message(&mut pool, &data);
        assert!(m.fragments().count() > 1);
        let b = Bytes::from(m);
        assert_eq!(&b[..], &data[..]);
        assert_eq!(pool.bpages_in_use(), 1, "only the small message's page");
        drop(small);
        assert_eq!(b.len(), 200_000);
        let empty = message(&mut pool, &[]).into_bytes();
        assert!(empty.is_empty());
    }

    /// A message of `data` that is split into several fragments: a small
    /// message first fills the pool's current page partly, so the large
    /// one's tail lands apart from its whole pages. Returns the message and
    /// its fragments' lengths.
    fn fragmented(pool: &mut Pool, data: &[u8]) -> (Message, Message, Vec<usize>) {
        let small = message(pool, &[1; 100]);
        let m = message(pool, data);
        let lens: Vec<usize> = m.fragments().map(|f| f.len()).collect();
        assert!(lens.len() > 1, "{lens:?}");
        (small, m, lens)
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 7 + (i >> 9)) as u8).collect()
    }

    #[test]
    fn buf_walks_the_fragments_without_copying() {
        let mut pool = Pool::new(8 << 16);
        let data = data(200_000);
        let (_small, mut m, lens) = fragmented(&mut pool, &data);
        let frags: Vec<(usize, usize)> = m
            .fragments()
            .map(|f| (f.as_ptr() as usize, f.len()))
            .collect();
        assert_eq!(m.remaining(), 200_000);
        // The first chunk is the first fragment itself.
        assert_eq!(m.chunk().as_ptr() as usize, frags[0].0);
        assert_eq!(m.chunk().len(), lens[0]);
        // Odd steps cross every fragment boundary somewhere inside a step.
        let mut got = Vec::new();
        let mut at = 0;
        while m.has_remaining() {
            let c = m.chunk();
            // Every chunk points into the pool fragment holding byte `at`.
            let (mut f, mut off) = (0, at);
            while off >= frags[f].1 {
                off -= frags[f].1;
                f += 1;
            }
            assert_eq!(c.as_ptr() as usize, frags[f].0 + off);
            assert_eq!(c.len(), frags[f].1 - off);
            let step = c.len().min(7777);
            got.extend_from_slice(&c[..step]);
            m.advance(step);
            at += step;
            assert_eq!(m.remaining(), 200_000 - at);
            assert_eq!(m.len(), m.remaining());
        }
        assert_eq!(got, data);
        assert!(m.chunk().is_empty());
        assert_eq!(m.fragments().count(), 0);
    }

    #[test]
    fn buf_reads_values_that_straddle_a_fragment_boundary() {
        let mut pool = Pool::new(8 << 16);
        let data = data(200_000);
        let (_small, mut m, lens) = fragmented(&mut pool, &data);
        let edge = lens[0];
        m.advance(edge - 2);
        assert_eq!(m.chunk().len(), 2);
        let want = u32::from_be_bytes(data[edge - 2..edge + 2].try_into().unwrap());
        assert_eq!(m.get_u32(), want);
        assert_eq!(m.remaining(), 200_000 - edge - 2);
        assert_eq!(m.chunk().len(), lens[1] - 2);
        // The other accessors see the same rest of the message.
        assert_eq!(m.to_vec(), &data[edge + 2..]);
        assert!(m == data[edge + 2..]);
        let mut head = [0u8; 10];
        assert_eq!(m.copy_to(0, &mut head), 10);
        assert_eq!(head, data[edge + 2..edge + 12]);
        let mut r = Vec::new();
        std::io::Read::read_to_end(&mut Message::reader(&m), &mut r).unwrap();
        assert_eq!(r, &data[edge + 2..]);
        let mut io = [std::io::IoSlice::new(&[]); 8];
        let n = m.chunks_vectored(&mut io);
        assert_eq!(n, lens.len() - 1);
        assert_eq!(io[..n].iter().map(|s| s.len()).sum::<usize>(), m.len());
    }

    #[test]
    fn copy_to_bytes_shares_a_fragment_and_copies_across_one() {
        let mut pool = Pool::new(8 << 16);
        let data = data(200_000);
        let (small, mut m, lens) = fragmented(&mut pool, &data);
        drop(small);
        let at = m.chunk().as_ptr();
        let head = m.copy_to_bytes(1000);
        assert_eq!(head.as_ptr(), at, "inside one fragment: no copy");
        assert_eq!(&head[..], &data[..1000]);
        assert_eq!(m.remaining(), 199_000);
        // Across the first boundary: copied, and right.
        let across = m.copy_to_bytes(lens[0]);
        assert_eq!(&across[..], &data[1000..1000 + lens[0]]);
        let rest = m.copy_to_bytes(m.remaining());
        assert_eq!(&rest[..], &data[1000 + lens[0]..]);
        assert_eq!(m.remaining(), 0);
        assert!(m.copy_to_bytes(0).is_empty());
        // The shared head holds the message's space after it is gone (all
        // of it, as a slice of a `Bytes` holds its whole buffer).
        let pages = pool.bpages_in_use();
        drop(m);
        drop((across, rest));
        assert_eq!(pool.bpages_in_use(), pages);
        assert_eq!(&head[..], &data[..1000]);
        drop(head);
        assert_eq!(pool.bpages_in_use(), 0);
    }

    #[test]
    #[should_panic(expected = "cannot advance past the end")]
    fn advance_past_the_end_panics() {
        let mut pool = Pool::new(4 << 16);
        let mut m = message(&mut pool, b"abc");
        m.advance(4);
    }

    #[test]
    fn clones_share_the_pool_space_until_the_last_drop() {
        let mut pool = Pool::new(8 << 16);
        let data = data(200_000);
        let (small, m, _) = fragmented(&mut pool, &data);
        drop(small);
        let pages = pool.bpages_in_use();
        assert!(pages >= 4);
        let reserved = pool.bytes_reserved();
        let mut c = m.clone();
        assert_eq!(pool.bpages_in_use(), pages, "a clone takes no new space");
        assert_eq!(
            c.fragments().next().unwrap().as_ptr(),
            m.fragments().next().unwrap().as_ptr(),
            "a clone shares the bytes"
        );
        // Consuming a clone leaves the original as it was.
        c.advance(5000);
        assert_eq!(m.len(), 200_000);
        assert!(m == data[..]);
        drop(m);
        assert_eq!(
            pool.bpages_in_use(),
            pages,
            "the clone still holds the space"
        );
        assert!(c == data[5000..]);
        let c2 = c.clone();
        drop(c);
        assert_eq!(pool.bpages_in_use(), pages);
        assert_eq!(c2.to_vec(), &data[5000..]);
        drop(c2);
        assert_eq!(pool.bpages_in_use(), 0);
        assert!(pool.bytes_reserved() <= reserved - 200_000);
    }

    #[test]
    fn into_bytes_after_advance_shares_the_rest() {
        let mut pool = Pool::new(4 << 16);
        let data = data(5000);
        let mut m = message(&mut pool, &data);
        m.advance(100);
        let at = m.chunk().as_ptr();
        assert_eq!(m.contiguous().as_ptr(), at);
        let b = m.into_bytes();
        assert_eq!(b.as_ptr(), at);
        assert_eq!(&b[..], &data[100..]);
        drop(b);
        assert_eq!(pool.bpages_in_use(), 0);
    }
}
