//! Incremental delivery: a response read while it is still arriving
//! ([`Endpoint::call_partial`]), and a long request read while it is
//! still arriving ([`Endpoint::recv_partial_request`]), both as an
//! [`IncomingMessage`].
//!
//! The engine hands the message over when its first bytes are in the
//! receive pool and publishes how many leading bytes are in place
//! (`homa_proto::PartialMessage`); the reader takes each newly arrived
//! range as a slice of the pool, without a copy, and sleeps (after the
//! usual busy-poll) until the engine reports more. The whole-message path
//! (`call`, `recv_response`) is untouched by it.

use crate::driver::{PartialStart, Target};
use crate::endpoint::{Endpoint, Responder};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::shared::Shared;
use crate::wait::{Notify, Slot, Waiter};
use homa_proto::{Outgoing, PartialState, RpcId, ServerRpc};
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
            Some(r) => started(shared, id, r),
            None => {
                if !slot.is_done() {
                    shared.cancel(id);
                }
                Err(Error::Shutdown)
            }
        }
    }
}

impl Endpoint {
    /// Waits for a request of at least `EngineConfig::partial_delivery_bytes`
    /// (off by default) and returns it as soon as its first bytes have
    /// arrived, with the [`Responder`] that answers it. Read it with
    /// [`IncomingMessage::next_chunk`] or `std::io::Read`; reply once it is
    /// complete (earlier replies fail with [`Error::RequestIncomplete`]).
    ///
    /// With the setting on, such requests come only here, never to
    /// [`Endpoint::recv_request`] or [`Endpoint::serve`]. If the client
    /// gives up meanwhile, the reader fails with [`Error::Incomplete`].
    /// Dropping the reader lets the rest arrive unread; dropping the
    /// responder unanswered abandons the request (also before its end).
    pub fn recv_partial_request(&self) -> Result<(IncomingMessage, Responder)> {
        let shared = self.shared();
        let item = shared
            .wait_queue(&shared.partial_requests, None)?
            .ok_or(Error::Shutdown)?;
        Ok(incoming_request(shared, item))
    }
}

/// A queued request delivered incrementally, as the application gets it.
pub(crate) fn incoming_request(
    shared: &Arc<Shared>,
    (rpc, message, notify): (ServerRpc, homa_proto::PartialMessage, Arc<Notify>),
) -> (IncomingMessage, Responder) {
    let responder = shared.responder(rpc);
    (
        IncomingMessage::new(shared, message, notify, Owner::Server(rpc)),
        responder,
    )
}

/// Whose message an [`IncomingMessage`] is, for what its drop does.
#[derive(Clone, Copy, Debug)]
enum Owner {
    /// The response of this client RPC: dropped unfinished, it is cancelled.
    Client(RpcId),
    /// The request of this server RPC: its [`Responder`] decides.
    Server(#[allow(dead_code)] ServerRpc),
}

/// The reader of client RPC `id`'s response, from what its slot got.
fn started(shared: &Arc<Shared>, id: RpcId, first: PartialStart) -> Result<IncomingMessage> {
    let (message, notify) = first?;
    Ok(IncomingMessage::new(
        shared,
        message,
        notify,
        Owner::Client(id),
    ))
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
    owner: Owner,
    /// An `AsyncRead` poll left this reader counted as a blocked waiter.
    #[cfg(feature = "tokio")]
    async_counted: bool,
}

impl IncomingMessage {
    fn new(
        shared: &Arc<Shared>,
        message: homa_proto::PartialMessage,
        notify: Arc<Notify>,
        owner: Owner,
    ) -> IncomingMessage {
        IncomingMessage {
            serial: message.serial(),
            message: Some(message),
            pos: 0,
            shared: shared.clone(),
            notify,
            owner,
            #[cfg(feature = "tokio")]
            async_counted: false,
        }
    }

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
        self.take_chunk()
    }

    /// What [`Self::next_chunk`] returns once bytes past `pos` are in place
    /// or the message ended.
    fn take_chunk(&mut self) -> Result<Option<&[u8]>> {
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
        #[cfg(feature = "tokio")]
        if self.async_counted {
            self.shared.leave_blocked();
        }
        let unfinished = self
            .message
            .as_ref()
            .is_some_and(|m| m.state() == PartialState::Receiving);
        let (serial, owner) = (self.serial, self.owner);
        self.shared.locked(|d| {
            d.partials.remove(&serial);
            if let (true, Owner::Client(id)) = (unfinished, owner) {
                d.engine.cancel(id);
            }
        });
    }
}

#[cfg(feature = "tokio")]
mod tokio_api {
    use super::*;
    use crate::async_api::{AsyncEndpoint, RecvPartialRequest, WaitUntil};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Cancels an RPC whose caller went away before its first bytes.
    struct CancelUnlessDone<'a> {
        shared: &'a Arc<Shared>,
        id: RpcId,
        armed: bool,
    }

    impl Drop for CancelUnlessDone<'_> {
        fn drop(&mut self) {
            if self.armed {
                self.shared.cancel(self.id);
            }
        }
    }

    impl AsyncEndpoint {
        /// [`Endpoint::call_partial`] as a future: resolves when the
        /// response's first bytes are in. Dropping the future before that
        /// cancels the RPC.
        pub async fn call_partial(
            &self,
            peer: SocketAddr,
            request: impl Into<Outgoing>,
        ) -> Result<IncomingMessage> {
            let shared = self.blocking().shared();
            let slot = Arc::new(Slot::new());
            let id = shared.start(peer, request.into(), Target::Partial(slot.clone()))?;
            let mut guard = CancelUnlessDone {
                shared,
                id,
                armed: true,
            };
            WaitUntil::new(
                shared,
                || slot.is_done(),
                |w| {
                    slot.register(w);
                },
            )
            .await?;
            guard.armed = false;
            match slot.take() {
                Some(r) => started(shared, id, r),
                None => Err(Error::Shutdown),
            }
        }

        /// [`Endpoint::recv_partial_request`] as a future.
        pub async fn recv_partial_request(&self) -> Result<(IncomingMessage, Responder)> {
            RecvPartialRequest::new(self.blocking().shared().clone()).await
        }
    }

    impl IncomingMessage {
        /// [`Self::next_chunk`] as a future.
        pub async fn next_chunk_async(&mut self) -> Result<Option<&[u8]>> {
            {
                let inner = self.inner();
                let pos = self.pos;
                let notify = &self.notify;
                WaitUntil::new(
                    &self.shared,
                    || inner.readable() > pos || inner.state() != PartialState::Receiving,
                    |w| notify.register(w),
                )
                .await?;
            }
            self.take_chunk()
        }

        /// [`Self::into_message`] as a future.
        pub async fn into_message_async(mut self) -> Result<Message> {
            while self.inner().state() == PartialState::Receiving {
                self.pos = self.inner().readable();
                let inner = self.inner();
                let notify = &self.notify;
                WaitUntil::new(
                    &self.shared,
                    || inner.state() != PartialState::Receiving,
                    |w| notify.register(w),
                )
                .await?;
            }
            self.into_message()
        }
    }

    impl tokio::io::AsyncRead for IncomingMessage {
        /// Copies the next bytes that have arrived, or waits for some (woken
        /// by the endpoint's driver); nothing at the end of the message. A
        /// message that stopped early is an `UnexpectedEof` error carrying
        /// [`Error::Incomplete`].
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            let pos = this.pos;
            let wants = buf.remaining() > 0;
            let message = this.message.as_ref().expect("present until consumed");
            let ready =
                || !wants || message.readable() > pos || message.state() != PartialState::Receiving;
            match this
                .shared
                .poll_ready(cx, ready, &this.notify, &mut this.async_counted)
            {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            let inner = this.message.as_ref().expect("present until consumed");
            let dst = buf.initialize_unfilled();
            let n = inner.copy_from(this.pos, dst);
            if n == 0 && !dst.is_empty() && inner.state() == PartialState::Failed {
                return Poll::Ready(Err(Error::Incomplete {
                    received: inner.readable(),
                    len: inner.len(),
                }
                .into()));
            }
            buf.advance(n);
            this.pos += n;
            Poll::Ready(Ok(()))
        }
    }
}
