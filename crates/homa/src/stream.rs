//! Streams over Homa (`docs/streams.md`): [`Endpoint::open_stream`] and
//! [`Endpoint::accept_stream`] give a [`Stream`], an ordered, reliable,
//! flow-controlled pair of message sequences with one peer, that is also a
//! byte stream (`std::io::Read`/`Write`; with the `tokio` feature
//! `AsyncRead`/`AsyncWrite`), so code written for a TCP stream runs over
//! it unchanged.
//!
//! The protocol is the engine's (`homa_proto::Endpoint::stream_*`); this
//! module moves the application's calls into it under the engine lock and
//! sleeps, as every other wait of the runtime does, until the engine
//! reports that the stream can go on (`Event::StreamReadable` /
//! `StreamWritable`, which set a flag here and wake the sleeper).

use crate::driver::{Driver, LockedCheck};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::wait::{Notify, Waiter};
use bytes::{Bytes, BytesMut};
use homa_proto::{StreamError, StreamId, StreamRead};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::Arc;

/// What the driver sets when the engine says a stream may go on, and who
/// to wake.
pub(crate) struct StreamSignals {
    /// Up: a read may find something. Down: the engine said `Pending` or
    /// its last read left nothing, and reports `StreamReadable` next.
    readable: AtomicBool,
    writable: AtomicBool,
    read_notify: Notify,
    write_notify: Notify,
}

impl Default for StreamSignals {
    fn default() -> Self {
        StreamSignals {
            // Nothing read yet: the first read asks the engine.
            readable: AtomicBool::new(true),
            writable: AtomicBool::new(false),
            read_notify: Notify::default(),
            write_notify: Notify::default(),
        }
    }
}

impl StreamSignals {
    /// The engine reported `StreamReadable`: the waiter to wake, if any.
    pub(crate) fn readable(&self) -> Option<Waiter> {
        self.readable.store(true, Release);
        self.read_notify.take()
    }
    /// The engine reported `StreamWritable`.
    pub(crate) fn writable(&self) -> Option<Waiter> {
        self.writable.store(true, Release);
        self.write_notify.take()
    }
    fn wake_all(&self) -> [Option<Waiter>; 2] {
        [self.readable(), self.writable()]
    }
}

impl Shared {
    /// A peer opened a stream: queue it for `accept_stream`.
    pub(crate) fn stream_opened(&self, d: &mut crate::driver::Driver, sid: StreamId) {
        let signals = Arc::new(StreamSignals::default());
        d.streams.insert(sid, signals.clone());
        if let Some(w) = self.accepted_streams.push((sid, signals)) {
            d.wakes.push(w);
        }
    }

    /// Wakes every stream's sleepers (shutdown).
    pub(crate) fn wake_streams(&self, d: &mut crate::driver::Driver) {
        for s in d.streams.values() {
            for w in s.wake_all().into_iter().flatten() {
                d.wakes.push(w);
            }
        }
    }

    /// Sleeps (after the usual busy poll) until `flag` is set, or until
    /// `locked` (run at the end of this thread's own engine passes, the
    /// engine locked) says it is done (`done`).
    fn wait_flag_or(
        &self,
        flag: &AtomicBool,
        notify: &Notify,
        locked: Option<&mut LockedCheck<'_>>,
        done: &dyn Fn() -> bool,
    ) -> Result<()> {
        if flag.load(Acquire) || done() {
            return Ok(());
        }
        self.check_may_wait()?;
        let r = self.wait_with(
            None,
            None,
            locked,
            || (flag.load(Acquire) || done()).then_some(()),
            |w: Waiter| {
                notify.register(w);
                if flag.load(Acquire) {
                    None
                } else {
                    Some(None)
                }
            },
            |_| {},
        );
        match r {
            Some(()) => Ok(()),
            None if flag.load(Acquire) || done() => Ok(()),
            None => Err(Error::Shutdown),
        }
    }

    /// Sleeps (after the usual busy poll) until `flag` is set.
    fn wait_flag(&self, flag: &AtomicBool, notify: &Notify) -> Result<()> {
        self.wait_flag_or(flag, notify, None, &|| false)
    }
}

impl Error {
    pub(crate) fn from_stream(e: StreamError) -> Error {
        match e {
            StreamError::Shutdown => Error::Shutdown,
            StreamError::Timeout => Error::Timeout,
            e => Error::Stream(e),
        }
    }
}

impl Endpoint {
    /// Opens a stream to `peer`. Nothing goes on the wire until the first
    /// write: the peer's [`Endpoint::accept_stream`] returns when the
    /// stream's first bytes arrive (no handshake round trip).
    pub fn open_stream(&self, peer: SocketAddr) -> Result<Stream> {
        let shared = self.shared();
        shared.check_peer(&peer)?;
        if shared.is_shut() {
            return Err(Error::Shutdown);
        }
        let signals = Arc::new(StreamSignals::default());
        let sid = shared.with_driver(false, |d, now| {
            let sid = d.engine.open_stream(now, peer)?;
            d.streams.insert(sid, signals.clone());
            Ok::<_, StreamError>(sid)
        });
        let sid = sid.map_err(Error::from_stream)?;
        Ok(Stream::new(shared.clone(), sid, signals))
    }

    /// Waits for a peer to open a stream to this endpoint.
    pub fn accept_stream(&self) -> Result<Stream> {
        let shared = self.shared();
        let item = shared
            .wait_queue(&shared.accepted_streams, None)?
            .ok_or(Error::Shutdown)?;
        Ok(accepted(shared, item))
    }
}

/// The handle of a stream a peer opened, as `accept_stream` hands it out.
pub(crate) fn accepted(
    shared: &Arc<Shared>,
    (sid, signals): (StreamId, Arc<StreamSignals>),
) -> Stream {
    Stream::new(shared.clone(), sid, signals)
}

/// One stream with one peer: an ordered, reliable sequence of messages in
/// each direction, any number, each of any size, with receiver-driven flow
/// control (a writer whose peer stops reading blocks after one window,
/// `EngineConfig::stream_window_bytes`).
///
/// Messages: [`Self::send`] writes one, [`Self::recv`] reads the next
/// whole one, [`Self::recv_chunk`] the next piece of one as it arrives.
/// Bytes: `std::io::Read` and `std::io::Write` (each `write` is one
/// message; message boundaries are ignored by `read`), and with the `tokio`
/// feature `AsyncRead` and `AsyncWrite`.
///
/// [`Self::finish`] ends this side (the peer reads the end of the stream
/// after the last message); dropping the handle closes the stream, which
/// cancels it (the peer gets [`Error::Stream`] with
/// `StreamError::Reset`) unless both sides had ended. A peer that crashes
/// or goes silent fails it with [`Error::Timeout`] within the RPC timeout;
/// bytes that arrived before a failure are still read first.
pub struct Stream {
    shared: Arc<Shared>,
    sid: StreamId,
    signals: Arc<StreamSignals>,
    /// The rest of a piece `read` took but could not return whole.
    leftover: Bytes,
    /// A message `recv` is assembling.
    partial: BytesMut,
    #[cfg(feature = "tokio")]
    async_counted: bool,
}

/// A piece of a stream message, as [`Stream::recv_chunk`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamChunk {
    /// The bytes, in order (never empty).
    pub bytes: Bytes,
    /// They end a message.
    pub end_of_message: bool,
}

impl Stream {
    fn new(shared: Arc<Shared>, sid: StreamId, signals: Arc<StreamSignals>) -> Stream {
        Stream {
            shared,
            sid,
            signals,
            leftover: Bytes::new(),
            partial: BytesMut::new(),
            #[cfg(feature = "tokio")]
            async_counted: false,
        }
    }

    /// The other end's address.
    pub fn peer(&self) -> SocketAddr {
        self.sid.peer
    }

    /// The engine's name for the stream (its id and which end opened it).
    pub fn id(&self) -> StreamId {
        self.sid
    }

    /// Tries to write `message` now: `Ok(false)` if a window of written
    /// bytes waits for the peer (the caller waits for writability).
    fn try_send(&self, message: &Bytes) -> Result<bool> {
        self.signals.writable.store(false, Release);
        let sid = self.sid;
        let r = self.shared.with_driver(false, |d, now| {
            d.engine.stream_send(now, sid, message.clone())
        });
        match r {
            Ok(()) => {
                if message.len() > self.shared.unsched_bytes {
                    self.shared.need_attention(message.len());
                }
                Ok(true)
            }
            Err(StreamError::Full) => Ok(false),
            Err(e) => Err(Error::from_stream(e)),
        }
    }

    /// Writes one message (at least one byte, any size), waiting while a
    /// window of earlier bytes is unacknowledged (the peer reads slower).
    pub fn send(&mut self, message: impl Into<Bytes>) -> Result<()> {
        let message = message.into();
        crate::tt!("stream send {} bytes", message.len());
        while !self.try_send(&message)? {
            self.shared
                .wait_flag(&self.signals.writable, &self.signals.write_notify)?;
        }
        self.shared.give_way(message.len());
        Ok(())
    }

    /// The next piece now, if any: `Ok(Err(()))` when nothing is readable.
    /// A drive pass only if the read queued a packet (credit): most reads
    /// queue none, and the pass (timers, events, transmit, publishing the
    /// deadline) cost about a microsecond per 100-byte echo on loopback.
    fn try_recv(&self) -> Result<std::result::Result<Option<StreamChunk>, ()>> {
        let shared = &self.shared;
        let r = shared.locked(|d| {
            let now = shared.clock(d);
            self.read_locked(d, now)
        });
        Self::chunk_of(r)
    }

    /// The engine's read, with the engine locked (`try_recv`, or a
    /// waiter's own pass, `recv_chunk`).
    fn read_locked(
        &self,
        d: &mut Driver,
        now: u64,
    ) -> std::result::Result<StreamRead, StreamError> {
        self.signals.readable.store(false, Release);
        let sid = self.sid;
        let r = d.engine.stream_recv(now, sid);
        // More to read: say so, so that the next read does not wait. A read
        // that leaves nothing readable leaves the flag down; the engine then
        // reports the next bytes (`stream_readable`).
        if matches!(r, Ok(StreamRead::Data { .. })) && d.engine.stream_readable(sid) {
            self.signals.readable.store(true, Release);
        }
        if homa_proto::driver::FastPath::may_transmit(&d.engine) {
            self.shared.drive(d, now, false);
        }
        r
    }

    /// What a read found, as `try_recv` reports it.
    fn chunk_of(
        r: std::result::Result<StreamRead, StreamError>,
    ) -> Result<std::result::Result<Option<StreamChunk>, ()>> {
        match r {
            Ok(StreamRead::Data {
                bytes,
                end_of_message,
            }) => Ok(Ok(Some(StreamChunk {
                bytes,
                end_of_message,
            }))),
            Ok(StreamRead::End) => Ok(Ok(None)),
            Ok(StreamRead::Pending) => Ok(Err(())),
            Err(e) => Err(Error::from_stream(e)),
        }
    }

    /// The next piece of the incoming messages, in order, as it arrives
    /// (no copy beyond the one from the packet), waiting for one if need
    /// be; `None` once the peer finished and everything has been read.
    pub fn recv_chunk(&mut self) -> Result<Option<StreamChunk>> {
        loop {
            // With the flag down the engine has nothing to give and will
            // report when it has (`try_recv`): wait first instead of asking
            // it to say `Pending` (a lock and an engine call per message
            // of an echo at each end).
            let read = if self.signals.readable.load(Acquire) {
                Some(self.try_recv()?)
            } else {
                // Wait; a pass of our own that raises the flag reads at
                // once, in its lock (a second lock and clock read per read
                // were one of the three things a 100-byte stream echo cost
                // more than an RPC echo, docs/streams.md).
                let got = std::cell::RefCell::new(None);
                let mut read_in_pass = |d: &mut Driver, now: u64| {
                    if self.signals.readable.load(Acquire) {
                        *got.borrow_mut() = Some(self.read_locked(d, now));
                    }
                };
                let done = || got.borrow().is_some();
                self.shared.wait_flag_or(
                    &self.signals.readable,
                    &self.signals.read_notify,
                    Some(&mut read_in_pass),
                    &done,
                )?;
                got.into_inner().map(Self::chunk_of).transpose()?
            };
            if let Some(Ok(c)) = read {
                let bytes = c.as_ref().map_or(0, |c| c.bytes.len());
                crate::tt!("stream read {} bytes", bytes);
                self.shared.give_way(bytes);
                return Ok(c);
            }
        }
    }

    /// The next whole message, waiting for it; `None` once the peer
    /// finished and everything has been read.
    pub fn recv(&mut self) -> Result<Option<Bytes>> {
        loop {
            let c = self.recv_chunk()?;
            if let Some(m) = self.assemble(c) {
                return Ok(m);
            }
        }
    }

    /// Adds a piece to the message being assembled: `Some` with the whole
    /// message when the piece ends one (`Some(None)` at the stream's end),
    /// `None` when more pieces are needed.
    fn assemble(&mut self, c: Option<StreamChunk>) -> Option<Option<Bytes>> {
        let Some(c) = c else {
            return Some(None);
        };
        if c.end_of_message && self.partial.is_empty() {
            return Some(Some(c.bytes));
        }
        self.partial.extend_from_slice(&c.bytes);
        c.end_of_message
            .then(|| Some(self.partial.split().freeze()))
    }

    /// Ends this side of the stream after the messages written so far; the
    /// peer reads the end once it has read them. Reading goes on.
    pub fn finish(&mut self) -> Result<()> {
        let sid = self.sid;
        self.shared
            .with_driver(false, |d, now| d.engine.stream_finish(now, sid))
            .map_err(Error::from_stream)
    }

    /// Whether both sides ended: this side finished and acknowledged, the
    /// peer's end read.
    pub fn is_done(&self) -> bool {
        let sid = self.sid;
        self.shared.locked(|d| d.engine.stream_is_done(sid))
    }

    /// The engine's one-line description of the stream's state (offsets,
    /// credit, what is outstanding), for diagnostics.
    pub fn describe(&self) -> String {
        let sid = self.sid;
        self.shared.locked(|d| d.engine.stream_describe(sid))
    }

    /// Cancels the stream (the same as dropping it before both sides
    /// ended): the peer's reads and writes fail with `StreamError::Reset`.
    pub fn cancel(self) {}
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("peer", &self.sid.peer)
            .field("id", &self.sid.id)
            .field("opener", &self.sid.opener)
            .finish()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        #[cfg(feature = "tokio")]
        if self.async_counted {
            self.shared.leave_blocked();
        }
        let sid = self.sid;
        if self.shared.is_shut() {
            self.shared.locked(|d| {
                d.streams.remove(&sid);
                d.engine.stream_close(0, sid);
            });
            return;
        }
        self.shared.with_driver(false, |d, now| {
            d.streams.remove(&sid);
            d.engine.stream_close(now, sid);
        });
    }
}

impl io::Read for Stream {
    /// Copies the next bytes (waiting for some); 0 once the peer finished
    /// and everything has been read. Message boundaries are not marked.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.leftover.is_empty() {
            match self.recv_chunk()? {
                Some(c) => self.leftover = c.bytes,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.leftover.len());
        buf[..n].copy_from_slice(&self.leftover[..n]);
        let _ = self.leftover.split_to(n);
        Ok(n)
    }
}

impl io::Write for Stream {
    /// Sends `buf` as one message (copied), waiting for flow control.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.send(Bytes::copy_from_slice(buf))?;
        Ok(buf.len())
    }

    /// Nothing to do: every `write` is in the engine's hands already.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(feature = "tokio")]
mod tokio_api {
    use super::*;
    use crate::async_api::{AsyncEndpoint, WaitUntil};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    impl AsyncEndpoint {
        /// [`Endpoint::open_stream`] (it does not wait).
        pub fn open_stream(&self, peer: SocketAddr) -> Result<Stream> {
            self.blocking().open_stream(peer)
        }

        /// [`Endpoint::accept_stream`] as a future.
        pub async fn accept_stream(&self) -> Result<Stream> {
            crate::async_api::AcceptStream::new(self.blocking().shared().clone()).await
        }
    }

    impl Stream {
        /// [`Self::send`] as a future.
        pub async fn send_async(&mut self, message: impl Into<Bytes>) -> Result<()> {
            let message = message.into();
            while !self.try_send(&message)? {
                let s = &self.signals;
                WaitUntil::new(
                    &self.shared,
                    || s.writable.load(Acquire),
                    |w| s.write_notify.register(w),
                )
                .await?;
            }
            Ok(())
        }

        /// [`Self::recv_chunk`] as a future.
        pub async fn recv_chunk_async(&mut self) -> Result<Option<StreamChunk>> {
            loop {
                if let Ok(c) = self.try_recv()? {
                    return Ok(c);
                }
                let s = &self.signals;
                WaitUntil::new(
                    &self.shared,
                    || s.readable.load(Acquire),
                    |w| s.read_notify.register(w),
                )
                .await?;
            }
        }

        /// [`Self::recv`] as a future.
        pub async fn recv_async(&mut self) -> Result<Option<Bytes>> {
            loop {
                let c = self.recv_chunk_async().await?;
                if let Some(m) = self.assemble(c) {
                    return Ok(m);
                }
            }
        }

        /// Registers the task to wake when `flag` is set; `Pending` unless
        /// it is set already (counted as a blocked waiter meanwhile, so the
        /// background thread keeps the engine going).
        fn poll_flag(&mut self, cx: &mut Context<'_>, write: bool) -> Poll<io::Result<()>> {
            let (flag, notify) = if write {
                (&self.signals.writable, &self.signals.write_notify)
            } else {
                (&self.signals.readable, &self.signals.read_notify)
            };
            self.shared
                .poll_ready(cx, || flag.load(Acquire), notify, &mut self.async_counted)
        }
    }

    impl tokio::io::AsyncRead for Stream {
        /// Copies the next bytes, or waits for some; nothing once the peer
        /// finished and everything has been read.
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let this = self.get_mut();
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            while this.leftover.is_empty() {
                match this.try_recv() {
                    Ok(Ok(Some(c))) => this.leftover = c.bytes,
                    Ok(Ok(None)) => return Poll::Ready(Ok(())),
                    Ok(Err(())) => {
                        if this.poll_flag(cx, false)?.is_pending() {
                            return Poll::Pending;
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e.into())),
                }
            }
            let n = buf.remaining().min(this.leftover.len());
            buf.put_slice(&this.leftover[..n]);
            let _ = this.leftover.split_to(n);
            Poll::Ready(Ok(()))
        }
    }

    impl tokio::io::AsyncWrite for Stream {
        /// Sends `buf` as one message (copied), or waits for flow control.
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if buf.is_empty() {
                return Poll::Ready(Ok(0));
            }
            let message = Bytes::copy_from_slice(buf);
            loop {
                match this.try_send(&message) {
                    Ok(true) => return Poll::Ready(Ok(buf.len())),
                    Ok(false) => {
                        if this.poll_flag(cx, true)?.is_pending() {
                            return Poll::Pending;
                        }
                    }
                    Err(e) => return Poll::Ready(Err(e.into())),
                }
            }
        }

        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        /// Ends this side ([`Stream::finish`]).
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(self.get_mut().finish().map_err(Into::into))
        }
    }
}
