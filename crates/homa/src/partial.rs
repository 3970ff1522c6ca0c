//! Incremental delivery: a response read while it is still arriving
//! ([`Endpoint::call_partial`], [`IncomingMessage`]).
//!
//! The engine hands the message over when its first bytes are in the
//! receive pool and publishes how many leading bytes are in place
//! (`homa_proto::PartialMessage`); the reader takes each newly arrived
//! range as a slice of the pool, without a copy, and sleeps (after the
//! usual busy-poll) until the engine reports more. The whole-message path
//! (`call`, `recv_response`) is untouched by it.

use crate::driver::Target;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::message::Message;
use crate::shared::Shared;
use crate::wait::{Notify, Slot, Waiter};
use homa_proto::{Outgoing, PartialState, RpcId};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

impl Endpoint {
    /// Sends a request and returns its response as soon as the response's
    /// first bytes have arrived: read the rest with
    /// [`IncomingMessage::next_chunk`] (each newly arrived range, in order,
    /// straight from the receive pool) or through [`std::io::Read`] while it
    /// is still coming in. For a long response the application can start on
    /// it a transfer time earlier than with [`Endpoint::call`].
    ///
    /// Fails as `call` does until the first bytes are in; after that, a
    /// response that stops (the RPC times out, the endpoint shuts down)
    /// fails its reader with [`Error::Incomplete`], which says how much
    /// arrived. Dropping the [`IncomingMessage`] before the end cancels the
    /// RPC.
    pub fn call_partial(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<IncomingMessage> {
        let shared = self.shared();
        let slot = Arc::new(Slot::new());
        let id = shared.start(peer, request.into(), Target::Partial(slot.clone()))?;
        let first = if slot.is_done() {
            slot.take()
        } else {
            if let Err(e) = shared.check_may_wait() {
                shared.cancel(id);
                return Err(e);
            }
            shared.wait_slot(&slot, None)
        };
        match first {
            Some(Ok((message, notify))) => Ok(IncomingMessage {
                serial: message.serial(),
                message: Some(message),
                pos: 0,
                shared: shared.clone(),
                notify,
                id,
            }),
            Some(Err(e)) => Err(e),
            None => {
                if !slot.is_done() {
                    shared.cancel(id);
                }
                Err(Error::Shutdown)
            }
        }
    }
}

/// A message being received, readable in order as it arrives: each call
/// to [`Self::next_chunk`] returns the next range of bytes that is in
/// place, as a slice of the receive pool (no copy), waiting for it if need
/// be; `std::io::Read` copies instead.
///
/// It holds the message's receive-pool space until dropped (or turned into
/// a [`Message`] with [`Self::into_message`]). Dropping it before the end
/// cancels its RPC.
pub struct IncomingMessage {
    /// Always `Some` outside `into_message`.
    message: Option<homa_proto::PartialMessage>,
    /// Bytes before this have been returned by `next_chunk` or `read`.
    pos: usize,
    serial: u64,
    shared: Arc<Shared>,
    notify: Arc<Notify>,
    id: RpcId,
}

impl IncomingMessage {
    fn inner(&self) -> &homa_proto::PartialMessage {
        self.message.as_ref().expect("present until consumed")
    }

    /// The whole message's length in bytes (known from its first packet).
    pub fn len(&self) -> usize {
        self.inner().len()
    }

    /// Whether the message is zero-length.
    pub fn is_empty(&self) -> bool {
        self.inner().is_empty()
    }

    /// How many leading bytes have arrived so far.
    pub fn received(&self) -> usize {
        self.inner().readable()
    }

    /// How many bytes `next_chunk` and `read` have returned.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Whether every byte has arrived.
    pub fn is_complete(&self) -> bool {
        self.inner().state() == PartialState::Complete
    }

    /// Waits until bytes past `pos` are in place or the message ended.
    fn wait_for_more(&self) -> Result<()> {
        let inner = self.inner();
        let pos = self.pos;
        let ready = || inner.readable() > pos || inner.state() != PartialState::Receiving;
        if ready() {
            return Ok(());
        }
        self.shared.check_may_wait()?;
        let r = self.shared.wait_with(
            None,
            None,
            || ready().then_some(()),
            |w: Waiter| {
                self.notify.register(w);
                // Progress reported between the check and the registration
                // found no waiter: look again before sleeping.
                if ready() {
                    None
                } else {
                    Some(None)
                }
            },
            |_| {},
        );
        match r {
            Some(()) => Ok(()),
            None if ready() => Ok(()),
            None => Err(Error::Shutdown),
        }
    }

    /// The next range of bytes that has arrived, in order, as a slice of
    /// the receive pool (at most one 64 KiB pool page at a time), waiting
    /// for it if none is in place yet. `Ok(None)` once the whole message has
    /// been returned; [`Error::Incomplete`] if it stopped before its end.
    pub fn next_chunk(&mut self) -> Result<Option<&[u8]>> {
        self.wait_for_more()?;
        let inner = self.inner();
        let readable = inner.readable();
        if self.pos < readable {
            let start = self.pos;
            let n = inner
                .fragments(start, readable)
                .next()
                .map_or(0, <[u8]>::len);
            self.pos += n;
            return Ok(self.inner().fragments(start, start + n).next());
        }
        match inner.state() {
            PartialState::Complete => Ok(None),
            _ => Err(Error::Incomplete {
                received: readable,
                len: inner.len(),
            }),
        }
    }

    /// Waits for the rest and returns the whole message (including bytes
    /// already returned by `next_chunk`), or [`Error::Incomplete`].
    pub fn into_message(mut self) -> Result<Message> {
        loop {
            self.pos = self.inner().readable();
            match self.inner().state() {
                PartialState::Complete => break,
                PartialState::Failed => {
                    return Err(Error::Incomplete {
                        received: self.pos,
                        len: self.len(),
                    })
                }
                PartialState::Receiving => self.wait_for_more()?,
            }
        }
        let m = self.message.take().expect("present until consumed");
        match m.into_message() {
            Ok(m) => Ok(Message::new(m)),
            Err(_) => unreachable!("complete"),
        }
    }
}

impl io::Read for IncomingMessage {
    /// Copies the next bytes that have arrived (waiting for some if none
    /// have); 0 at the end of the message. A message that stopped early is
    /// an error of kind `UnexpectedEof` carrying [`Error::Incomplete`].
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.wait_for_more()?;
        let inner = self.inner();
        let n = inner.copy_from(self.pos, buf);
        if n == 0 && inner.state() == PartialState::Failed {
            return Err(Error::Incomplete {
                received: inner.readable(),
                len: inner.len(),
            }
            .into());
        }
        self.pos += n;
        Ok(n)
    }
}

impl std::fmt::Debug for IncomingMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IncomingMessage")
            .field("len", &self.message.as_ref().map(|m| m.len()))
            .field("received", &self.message.as_ref().map(|m| m.readable()))
            .field("position", &self.pos)
            .finish()
    }
}

impl Drop for IncomingMessage {
    fn drop(&mut self) {
        let unfinished = self
            .message
            .as_ref()
            .is_some_and(|m| m.state() == PartialState::Receiving);
        let (serial, id) = (self.serial, self.id);
        self.shared.locked(|d| {
            d.partials.remove(&serial);
            if unfinished {
                d.engine.cancel(id);
            }
        });
    }
}
