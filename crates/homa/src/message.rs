//! Received messages: the engine's pool-backed fragments, handed to the
//! application without a copy, with contiguous access when wanted.

use std::borrow::Cow;
use std::io;

/// A received request or response. Its bytes live in the endpoint's receive
/// pool as one or more fragments; dropping the message returns the space.
///
/// ```no_run
/// # fn show(m: homa::Message) {
/// for piece in m.fragments() { /* zero-copy */ let _ = piece; }
/// let all: std::borrow::Cow<[u8]> = m.contiguous(); // copies only if fragmented
/// # }
/// ```
#[derive(Debug)]
pub struct Message {
    inner: homa_proto::Message,
}

impl Message {
    pub(crate) fn new(inner: homa_proto::Message) -> Message {
        Message { inner }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    pub fn is_empty(&self) -> bool {
        self.inner.len() == 0
    }
    /// The bytes in order, as contiguous slices of the receive pool.
    pub fn fragments(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.inner.fragments()
    }
    /// The whole message as one slice: borrowed when it is a single fragment
    /// (messages up to a pool page usually are), copied otherwise.
    pub fn contiguous(&self) -> Cow<'_, [u8]> {
        let mut it = self.inner.fragments();
        match (it.next(), it.next()) {
            (None, _) => Cow::Borrowed(&[]),
            (Some(only), None) => Cow::Borrowed(only),
            _ => Cow::Owned(self.to_vec()),
        }
    }
    /// The message as [`Bytes`](bytes::Bytes): without a copy when it is one
    /// fragment (messages up to a pool page usually are), in which case its
    /// pool space stays held until the last clone of the `Bytes` is dropped;
    /// copied otherwise. Lets a server echo or forward what it received
    /// (`reply(request.into_bytes())`) without copying the bytes.
    pub fn into_bytes(self) -> bytes::Bytes {
        if self.inner.contiguous().is_some() {
            bytes::Bytes::from_owner(Contiguous(self.inner))
        } else {
            bytes::Bytes::from(self.to_vec())
        }
    }
    /// Copies the message into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for f in self.inner.fragments() {
            v.extend_from_slice(f);
        }
        v
    }
    /// Copies `dst.len()` bytes starting at `offset` into `dst`; returns how
    /// many were available (fewer at the end of the message).
    pub fn copy_to(&self, offset: usize, dst: &mut [u8]) -> usize {
        let mut pos = 0; // message offset of the current fragment
        let mut done = 0;
        for f in self.inner.fragments() {
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
    /// The engine's message type, for code that works with `homa_proto` directly.
    pub fn into_inner(self) -> homa_proto::Message {
        self.inner
    }
}

/// A message known to be one fragment, as a `Bytes` owner.
struct Contiguous(homa_proto::Message);

impl AsRef<[u8]> for Contiguous {
    fn as_ref(&self) -> &[u8] {
        self.0.contiguous().unwrap_or(&[])
    }
}

impl From<Message> for bytes::Bytes {
    fn from(m: Message) -> bytes::Bytes {
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
}
