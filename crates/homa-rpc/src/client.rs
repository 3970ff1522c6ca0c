//! The client side: [`Client`] starts calls (a framework header in front of
//! the encoded request, the deadline as a remaining budget), [`Call`] waits
//! for one, blocking or async, and tells the server when it is abandoned.

use crate::status::{Code, Status};
use crate::wire::{self, RequestHeader, FLAG_CANCEL, REQUEST_HEADER_LEN};
use crate::Payload;
use bytes::Buf;
use homa::{Endpoint, Message, PendingRpc, RpcId};
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Makes calls through one Homa endpoint. Cheap to clone. A client may
/// carry a deadline (every call it starts ends by then) and a timeout (each
/// call's own budget); a handler's nested client carries its request's
/// deadline ([`crate::Context::client`]).
#[derive(Clone, Debug)]
pub struct Client {
    ep: Endpoint,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
}

impl Client {
    /// A client with neither deadline nor timeout (calls fail only as the
    /// transport fails them).
    pub fn new(ep: Endpoint) -> Client {
        Client {
            ep,
            deadline: None,
            timeout: None,
        }
    }

    /// The endpoint calls go through.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The same client, each call bounded by `timeout` (from its start).
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        Client {
            timeout: Some(timeout),
            ..self.clone()
        }
    }

    /// The same client, every call ending by `deadline` (or earlier).
    pub fn with_deadline(&self, deadline: Instant) -> Client {
        Client {
            deadline: Some(self.deadline.map_or(deadline, |d| d.min(deadline))),
            ..self.clone()
        }
    }

    /// The deadline calls started now would get.
    pub fn deadline(&self) -> Option<Instant> {
        match (self.deadline, self.timeout) {
            (d, None) => d,
            (None, Some(t)) => Some(Instant::now() + t),
            (Some(d), Some(t)) => Some(d.min(Instant::now() + t)),
        }
    }

    /// Calls `method` (an id from a service's `ids`) of the server at
    /// `addr` and waits for its response.
    pub fn call<Q: Payload, R: Payload>(
        &self,
        addr: SocketAddr,
        method: u32,
        req: &Q::Out,
    ) -> Result<R::In, Status> {
        self.start::<Q, R>(addr, method, req)?.wait()
    }

    /// Starts a call and returns at once; wait for it with [`Call::wait`]
    /// or `.wait_async().await`. Several started calls are in flight
    /// together (fan-out) without a thread each.
    pub fn start<Q: Payload, R: Payload>(
        &self,
        addr: SocketAddr,
        method: u32,
        req: &Q::Out,
    ) -> Result<Call<R>, Status> {
        homa::tt!("rpc call start {}", method);
        let deadline = self.deadline();
        let budget_us = match deadline {
            None => 0,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Status::deadline_exceeded("deadline passed before the call"));
                }
                left.as_micros().clamp(1, u32::MAX as u128) as u32
            }
        };
        let mut out = Vec::with_capacity(REQUEST_HEADER_LEN + Q::size_hint(req));
        out.extend_from_slice(&RequestHeader::new(method, budget_us, 0).encode());
        Q::encode(req, &mut out)?;
        homa::tt!("rpc request encoded {}", out.len());
        let rpc = self.ep.send_request(addr, out)?;
        Ok(Call {
            rpc: Some(rpc),
            notice: None,
            deadline,
            ep: self.ep.clone(),
            addr,
            method,
            _r: PhantomData,
        })
    }
}

/// A call in progress. Dropping it before its response arrived abandons
/// it and sends the server a cancel notice (see docs/rpc.md).
#[derive(Debug)]
pub struct Call<R> {
    rpc: Option<PendingRpc>,
    /// The id of an RPC being awaited by `wait_async` (its `PendingRpc`
    /// was turned into a future): a dropped future still sends a notice.
    notice: Option<RpcId>,
    deadline: Option<Instant>,
    ep: Endpoint,
    addr: SocketAddr,
    method: u32,
    _r: PhantomData<fn() -> R>,
}

impl<R: Payload> Call<R> {
    /// The transport's id of this call.
    pub fn id(&self) -> Option<RpcId> {
        self.rpc.as_ref().map(|r| r.id()).or(self.notice)
    }

    /// The deadline the call carries.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Waits for the response (blocking), at most until the deadline.
    pub fn wait(mut self) -> Result<R::In, Status> {
        let rpc = self.rpc.take().expect("a call is waited for once");
        let msg = match self.deadline {
            None => rpc.wait().map_err(no_deadline_error)?,
            Some(d) => rpc
                .wait_timeout(d.saturating_duration_since(Instant::now()))
                .map_err(Status::from)?,
        };
        homa::tt!("rpc response got {}", msg.len());
        let r = decode_reply::<R>(msg);
        homa::tt!("rpc call done");
        r
    }

    /// Waits for the response from async code, at most until the deadline
    /// (tokio's timer: the runtime needs its time driver). Dropping the
    /// future cancels the call.
    pub async fn wait_async(mut self) -> Result<R::In, Status> {
        let rpc = self.rpc.take().expect("a call is waited for once");
        self.notice = Some(rpc.id());
        let fut = rpc.into_future();
        let r = match self.deadline {
            None => fut.await.map_err(no_deadline_error),
            Some(d) => match tokio::time::timeout_at(d.into(), fut).await {
                Ok(r) => r.map_err(Status::from),
                Err(_) => Err(Status::deadline_exceeded("deadline passed")),
            },
        };
        self.notice = None;
        decode_reply::<R>(r?)
    }

    /// Abandons the call and tells the server (same as dropping it).
    pub fn cancel(self) {}
}

impl<R> Drop for Call<R> {
    fn drop(&mut self) {
        let id = match self.rpc.take() {
            Some(rpc) if !rpc.is_done() => Some(rpc.id()),
            _ => self.notice.take(),
        };
        if let Some(id) = id {
            // Best effort, fire and forget: the notice's own response is
            // not waited for (its PendingRpc is dropped at once).
            let mut out = Vec::with_capacity(REQUEST_HEADER_LEN + 8);
            out.extend_from_slice(&RequestHeader::new(self.method, 0, FLAG_CANCEL).encode());
            out.extend_from_slice(&id.0.to_le_bytes());
            let _ = self.ep.send_request(self.addr, out);
        }
    }
}

/// Without a deadline of ours, the transport's timeout means the server
/// did not answer.
fn no_deadline_error(e: homa::Error) -> Status {
    match e {
        homa::Error::Timeout => Status::new(Code::Unavailable, "the server did not answer"),
        e => Status::from(e),
    }
}

/// A response's header, then its body decoded.
fn decode_reply<R: Payload>(mut msg: Message) -> Result<R::In, Status> {
    // The usual case, OK without a message, from four copied bytes (a
    // long response is not made contiguous for its header).
    let mut h = [0u8; wire::RESPONSE_HEADER_LEN];
    let off = if msg.copy_to(0, &mut h) == h.len() && h == [0; wire::RESPONSE_HEADER_LEN] {
        wire::RESPONSE_HEADER_LEN
    } else {
        let c = msg.contiguous();
        wire::decode_response(&c, c.len())?
    };
    msg.advance(off);
    // A response that does not decode is the server's fault, not ours.
    R::decode(msg).map_err(|s| Status::internal(format!("response: {}", s.message())))
}
