//! Incremental delivery: a long incoming message handed to the application
//! when its first bytes arrive, readable in order as the rest comes in.
//!
//! Homa delivers whole messages, so a receiver cannot start on a megabyte
//! request until its last packet is in (seed 004: "good for latency,
//! challenging for throughput"). A [`PartialMessage`] is the message's pool
//! space, shared by the engine (which keeps writing packets into it) and the
//! application (which reads it), plus a published *readable prefix*: the
//! engine advances it, with release ordering, only over bytes that it has
//! written and will never write again, and the application forms slices
//! only below it. Packets that arrive out of order wait in the pool beyond
//! the prefix until the gap before them fills. Nothing is copied: the bytes
//! are read where the kernel or the engine put them, as with a whole
//! [`Message`].
//!
//! Which messages are delivered this way: requests of at least
//! [`crate::Config::partial_delivery_bytes`] at a server
//! ([`crate::Event::PartialRequest`]), and the response of a client RPC for
//! which [`crate::Endpoint::deliver_response_partially`] was called
//! ([`crate::Event::PartialResponse`]). Every other message is delivered
//! whole, by the same code as before, at the same cost.
//!
//! After that first event the engine reports each advance of the prefix,
//! and the end (complete or failed), with [`crate::Event::PartialProgress`]
//! carrying the message's [`PartialMessage::serial`], so that a driver can
//! wake whoever reads it.

use crate::pool::Message;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

/// Where a [`PartialMessage`] stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialState {
    /// More bytes are to come.
    Receiving,
    /// Every byte has arrived: [`PartialMessage::readable`] is the length.
    Complete,
    /// The message will not be completed (its RPC failed, was cancelled or
    /// abandoned, the sender's state was lost, or the endpoint shut down):
    /// only the prefix readable now was received.
    Failed,
}

const RECEIVING: u8 = 0;
const COMPLETE: u8 = 1;
const FAILED: u8 = 2;

/// What the engine publishes about a message it is still receiving.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Bytes `0..readable` are written for good.
    readable: AtomicUsize,
    state: AtomicU8,
}

impl Progress {
    /// Publishes that bytes `0..n` are written and will not be written again.
    pub(crate) fn advance(&self, n: usize) {
        self.readable.store(n, Ordering::Release);
    }
    pub(crate) fn complete(&self, len: usize) {
        self.readable.store(len, Ordering::Release);
        self.state.store(COMPLETE, Ordering::Release);
    }
    pub(crate) fn fail(&self) {
        self.state.store(FAILED, Ordering::Release);
    }
    pub(crate) fn readable(&self) -> usize {
        self.readable.load(Ordering::Acquire)
    }
}

/// An incoming message delivered before all of it has arrived: its bytes
/// `0..`[`Self::readable`] may be read now, in order and without a copy.
///
/// Holding it holds the message's whole receive-pool space, as holding a
/// [`Message`] does (drop it, or the [`Message`] it becomes, to return the
/// space). Dropping it before the end does not stop the transfer: cancel
/// the RPC (client) or abandon it (server) for that.
#[derive(Debug)]
pub struct PartialMessage {
    message: Message,
    progress: Arc<Progress>,
    serial: u64,
}

impl PartialMessage {
    /// A message being received into the pool space `message` shares with
    /// the engine; the engine keeps the returned [`Progress`].
    pub(crate) fn start(message: Message, serial: u64) -> (PartialMessage, Arc<Progress>) {
        let progress = Arc::new(Progress {
            readable: AtomicUsize::new(0),
            state: AtomicU8::new(RECEIVING),
        });
        (
            PartialMessage {
                message,
                progress: progress.clone(),
                serial,
            },
            progress,
        )
    }

    /// A message that was complete before anyone asked for its first bytes
    /// (it arrived in one packet, say).
    pub(crate) fn whole(message: Message, serial: u64) -> PartialMessage {
        let len = message.len();
        let (p, progress) = PartialMessage::start(message, serial);
        progress.complete(len);
        p
    }

    /// The whole message's length in bytes (from its first packet).
    pub fn len(&self) -> usize {
        self.message.len()
    }

    /// Whether the message is zero-length.
    pub fn is_empty(&self) -> bool {
        self.message.is_empty()
    }

    /// This message's number among the endpoint's partial messages, as
    /// carried by [`crate::Event::PartialProgress`].
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// How many leading bytes have arrived (all of them once
    /// [`PartialState::Complete`]). Never decreases.
    pub fn readable(&self) -> usize {
        self.progress.readable()
    }

    /// Whether more is to come, all arrived, or the rest never will.
    pub fn state(&self) -> PartialState {
        match self.progress.state.load(Ordering::Acquire) {
            RECEIVING => PartialState::Receiving,
            COMPLETE => PartialState::Complete,
            _ => PartialState::Failed,
        }
    }

    /// Bytes `from..to` as contiguous pieces of the receive pool, in order
    /// (usually one; one per 64 KiB bpage at most). `to` is capped at
    /// [`Self::readable`] as read at the call.
    ///
    /// Panics if `from` is greater than that cap.
    pub fn fragments(&self, from: usize, to: usize) -> impl Iterator<Item = &[u8]> + '_ {
        let to = to.min(self.readable());
        assert!(
            from <= to,
            "bytes from {from} are not readable yet (up to {to})"
        );
        // SAFETY: the engine publishes a prefix (Release, read above with
        // Acquire) only after writing its bytes, and never writes below a
        // published prefix again: packets are clipped to it and landing
        // sites are only handed out for bytes not yet received (`incoming`).
        unsafe { self.message.range(from, to) }
    }

    /// Copies bytes `from..` into `dst`, as many as are readable and fit;
    /// returns how many.
    pub fn copy_from(&self, from: usize, dst: &mut [u8]) -> usize {
        let mut n = 0;
        for piece in self.fragments(from, from.saturating_add(dst.len())) {
            dst[n..n + piece.len()].copy_from_slice(piece);
            n += piece.len();
        }
        n
    }

    /// The whole message, once [`PartialState::Complete`]; otherwise the
    /// partial message back.
    pub fn into_message(self) -> Result<Message, PartialMessage> {
        if self.state() == PartialState::Complete {
            Ok(self.message)
        } else {
            Err(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Pool, BPAGE_SIZE};

    #[test]
    fn only_the_published_prefix_is_readable() {
        let mut pool = Pool::new(8 * BPAGE_SIZE);
        let len = 2 * BPAGE_SIZE + 100;
        let alloc = pool.allocate(len).unwrap();
        let shared = pool.share(&alloc);
        let (p, progress) = PartialMessage::start(shared, 7);
        assert_eq!((p.len(), p.readable(), p.serial()), (len, 0, 7));
        assert_eq!(p.state(), PartialState::Receiving);
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        pool.write(&alloc, 0, &data[..BPAGE_SIZE + 10]);
        progress.advance(BPAGE_SIZE + 10);
        let got: Vec<u8> = p.fragments(0, usize::MAX).flatten().copied().collect();
        assert_eq!(got, &data[..BPAGE_SIZE + 10]);
        // Two pieces: the first bpage, then 10 bytes of the second.
        assert_eq!(p.fragments(0, usize::MAX).count(), 2);
        let mut buf = vec![0; 50];
        assert_eq!(p.copy_from(BPAGE_SIZE, &mut buf), 10);
        assert_eq!(&buf[..10], &data[BPAGE_SIZE..BPAGE_SIZE + 10]);
        pool.write(&alloc, BPAGE_SIZE + 10, &data[BPAGE_SIZE + 10..]);
        progress.complete(len);
        // The engine lets go of its allocation; the partial message keeps the space.
        drop(alloc);
        let p = match p.into_message() {
            Ok(m) => m,
            Err(_) => panic!("complete"),
        };
        assert_eq!(p.to_vec(), data);
        assert!(pool.bpages_in_use() > 0);
        drop(p);
        assert_eq!(pool.bytes_reserved(), 0);
    }

    /// The engine's thread writes and publishes while another reads: what
    /// the reader sees below the prefix is always the final bytes (under
    /// Miri, its data-race detector checks the publication protocol).
    #[test]
    fn a_reader_on_another_thread_sees_only_written_bytes() {
        let mut pool = Pool::new(4 * BPAGE_SIZE);
        let len = 2 * BPAGE_SIZE + 300;
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8 + 1).collect();
        let alloc = pool.allocate(len).unwrap();
        let (p, progress) = PartialMessage::start(pool.share(&alloc), 3);
        let want = data.clone();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                let done = p.state() == PartialState::Complete;
                let r = p.readable();
                for piece in p.fragments(got.len(), r) {
                    got.extend_from_slice(piece);
                }
                assert_eq!(got[..], want[..got.len()]);
                if done {
                    break;
                }
                std::thread::yield_now();
            }
            assert_eq!(got, want);
        });
        let step = BPAGE_SIZE / 4 + 7;
        let mut at = 0;
        while at < len {
            let end = (at + step).min(len);
            pool.write(&alloc, at, &data[at..end]);
            progress.advance(end);
            at = end;
        }
        progress.complete(len);
        reader.join().unwrap();
        drop(alloc);
    }

    #[test]
    #[should_panic(expected = "not readable yet")]
    fn reading_past_the_prefix_panics() {
        let mut pool = Pool::new(4 * BPAGE_SIZE);
        let alloc = pool.allocate(1000).unwrap();
        let (p, progress) = PartialMessage::start(pool.share(&alloc), 1);
        progress.advance(10);
        let _ = p.fragments(20, 30).count();
    }

    #[test]
    fn a_failed_message_keeps_its_prefix_and_is_not_a_message() {
        let mut pool = Pool::new(4 * BPAGE_SIZE);
        let alloc = pool.allocate(1000).unwrap();
        let (p, progress) = PartialMessage::start(pool.share(&alloc), 1);
        progress.advance(10);
        progress.fail();
        drop(alloc);
        assert_eq!((p.state(), p.readable()), (PartialState::Failed, 10));
        assert!(p.into_message().is_err());
    }
}
