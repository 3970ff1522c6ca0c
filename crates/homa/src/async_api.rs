//! The async API (feature `tokio`): the blocking operations as futures.
//!
//! A future first makes one non-blocking pass over the socket itself; if its
//! result is not there, it registers its waker and the endpoint's background
//! thread watches the socket and wakes it (one handoff). Futures never
//! busy-poll, so they do not hold up an executor thread. Sends and replies are
//! non-blocking already and are used as-is from async code.

use crate::endpoint::{Endpoint, PendingRpc, Request, Response};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::shared::Shared;
use crate::wait::{WaitQueue, Waiter};
use homa_proto::Outgoing;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

impl Endpoint {
    /// [`Endpoint::call`] as a future.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> homa::Result<()> {
    /// let server = homa::Endpoint::bind("127.0.0.1:0")?;
    /// let addr = server.local_addr();
    /// let client = homa::Endpoint::bind("127.0.0.1:0")?;
    /// let call = client.call_async(addr, &b"hi"[..]);
    /// let serve = async {
    ///     let req = server.recv_request_async().await?;
    ///     req.reply(&b"ho"[..])
    /// };
    /// let (reply, served) = tokio::join!(call, serve);
    /// served?;
    /// assert_eq!(reply?.to_vec(), b"ho");
    /// # Ok(()) }
    /// ```
    pub async fn call_async(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
    ) -> Result<Message> {
        self.send_request(peer, request)?.await
    }

    /// [`Endpoint::call_timeout`] as a future (the RPC is abandoned on expiry).
    pub async fn call_timeout_async(
        &self,
        peer: SocketAddr,
        request: impl Into<Outgoing>,
        timeout: Duration,
    ) -> Result<Message> {
        let fut = self.send_request(peer, request)?.into_future();
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout),
        }
    }

    /// [`Endpoint::recv_request`] as a future.
    pub fn recv_request_async(&self) -> RecvRequestFuture {
        RecvRequestFuture(QueueWait::new(self.shared_arc()))
    }

    /// [`Endpoint::recv_response`] as a future.
    pub fn recv_response_async(&self) -> RecvResponseFuture {
        RecvResponseFuture(QueueWait::new(self.shared_arc()))
    }
}

/// The response of a [`PendingRpc`], as a future (`pending.await`).
pub struct RpcFuture {
    rpc: PendingRpc,
    counted: bool,
}

impl IntoFuture for PendingRpc {
    type Output = Result<Message>;
    type IntoFuture = RpcFuture;
    fn into_future(self) -> RpcFuture {
        RpcFuture {
            rpc: self,
            counted: false,
        }
    }
}

impl Future for RpcFuture {
    type Output = Result<Message>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Message>> {
        let this = self.get_mut();
        let mut drove = false;
        loop {
            let (shared, slot) = this.rpc.parts();
            if let Some(r) = slot.take() {
                if this.counted {
                    shared.leave_blocked();
                    this.counted = false;
                }
                this.rpc.set_finished();
                return Poll::Ready(r.map(Message::new));
            }
            if !drove {
                drove = true;
                shared.drive_once();
                continue;
            }
            if !slot.register(Waiter::Task(cx.waker().clone())) {
                continue;
            }
            if !this.counted {
                this.counted = true;
                shared.enter_blocked();
            }
            return Poll::Pending;
        }
    }
}

impl Drop for RpcFuture {
    fn drop(&mut self) {
        if self.counted {
            self.rpc.parts().0.leave_blocked();
        }
    }
}

/// Which queue a [`QueueWait`] takes from.
trait Queue {
    type Item;
    type Out;
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item>;
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Self::Out;
}

struct Requests;
impl Queue for Requests {
    type Item = (homa_proto::ServerRpc, homa_proto::Message);
    type Out = Request;
    fn queue(shared: &Shared) -> &WaitQueue<Self::Item> {
        &shared.requests
    }
    fn convert(shared: &Arc<Shared>, item: Self::Item) -> Request {
        shared.request(item)
    }
}

struct Responses;
impl Queue for Responses {
    type Item = Response;
    type Out = Response;
    fn queue(shared: &Shared) -> &WaitQueue<Response> {
        &shared.responses
    }
    fn convert(_: &Arc<Shared>, item: Response) -> Response {
        item
    }
}

struct QueueWait<Q: Queue> {
    shared: Arc<Shared>,
    token: Option<u64>,
    counted: bool,
    _q: std::marker::PhantomData<Q>,
}

impl<Q: Queue> QueueWait<Q> {
    fn new(shared: Arc<Shared>) -> Self {
        QueueWait {
            shared,
            token: None,
            counted: false,
            _q: std::marker::PhantomData,
        }
    }
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Q::Out>> {
        let mut drove = false;
        loop {
            if let Some(item) = Q::queue(&self.shared).try_pop() {
                self.release();
                return Poll::Ready(Ok(Q::convert(&self.shared, item)));
            }
            if self.shared.is_shut() {
                self.release();
                return Poll::Ready(Err(Error::Shutdown));
            }
            if !drove {
                drove = true;
                self.shared.drive_once();
                continue;
            }
            if let Some(t) = self.token.take() {
                Q::queue(&self.shared).deregister(t);
            }
            match Q::queue(&self.shared).register(Waiter::Task(cx.waker().clone())) {
                None => continue,
                Some(t) => self.token = Some(t),
            }
            if !self.counted {
                self.counted = true;
                self.shared.enter_blocked();
            }
            return Poll::Pending;
        }
    }
    fn release(&mut self) {
        if let Some(t) = self.token.take() {
            Q::queue(&self.shared).deregister(t);
        }
        if self.counted {
            self.counted = false;
            self.shared.leave_blocked();
        }
    }
}

impl<Q: Queue> Drop for QueueWait<Q> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The next incoming request, as a future.
pub struct RecvRequestFuture(QueueWait<Requests>);

impl Future for RecvRequestFuture {
    type Output = Result<Request>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Request>> {
        self.get_mut().0.poll_next(cx)
    }
}

/// The next outcome of a shared RPC, as a future.
pub struct RecvResponseFuture(QueueWait<Responses>);

impl Future for RecvResponseFuture {
    type Output = Result<Response>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Response>> {
        self.get_mut().0.poll_next(cx)
    }
}
