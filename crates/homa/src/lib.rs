//! # homa
//!
//! The Homa transport protocol over UDP. The protocol itself lives in
//! [`homa_proto`] (a sans-IO engine); this crate drives it over a real
//! socket and gives applications a blocking API (and, with the `tokio`
//! feature, futures).
//!
//! ```
//! use homa::Endpoint;
//!
//! // A server that echoes every request...
//! let server = Endpoint::bind("127.0.0.1:0")?;
//! let addr = server.local_addr();
//! let s = server.clone();
//! let t = std::thread::spawn(move || -> homa::Result<()> {
//!     let req = s.recv_request()?;
//!     let body = req.message().to_vec();
//!     req.reply(body)
//! });
//!
//! // ...and a client that calls it.
//! let client = Endpoint::bind("127.0.0.1:0")?;
//! let reply = client.call(addr, &b"hello"[..])?;
//! assert_eq!(reply.to_vec(), b"hello");
//! t.join().unwrap()?;
//! # Ok::<(), homa::Error>(())
//! ```
//!
//! Waiting: a thread that waits for a response or a request first
//! busy-polls the socket for [`EndpointConfig::poll`] (50 µs by default),
//! running the engine itself, and only then sleeps. See `docs/runtime.md`.
//!
//! Linux only: the runtime uses `recvmmsg`/`sendmmsg`, UDP GSO/GRO,
//! `MSG_ERRQUEUE`, `eventfd` and `ppoll` directly (the engine,
//! `homa-proto`, is portable).

#[cfg(not(target_os = "linux"))]
compile_error!(
    "the `homa` crate runs only on Linux (it uses recvmmsg/sendmmsg, UDP GSO/GRO, \
     MSG_ERRQUEUE, eventfd and ppoll); the portable protocol engine is `homa-proto`"
);

/// The examples in the crate's README.md, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(feature = "tokio")]
mod async_api;
mod config;
mod driver;
mod endpoint;
mod error;
mod handoff;
mod message;
mod partial;
#[cfg(feature = "metrics")]
mod publish;
mod serve;
mod shared;
mod socket;
mod stream;
mod sys;
pub mod timetrace;
mod wait;

#[cfg(feature = "tokio")]
pub use async_api::{AsyncEndpoint, RecvRequestFuture, RecvResponseFuture, Requests, RpcFuture};
pub use config::{EndpointBuilder, EndpointConfig, Mtu, FALLBACK_MTU, POLL_YIELD_EVERY};
pub use endpoint::{Endpoint, PendingRpc, Request, Responder, Response, RuntimeStats};
pub use error::{Error, Result};
pub use message::{Message, MessageReader};
pub use partial::IncomingMessage;
/// Test hook: random packet loss at the socket layer, set with
/// [`EndpointBuilder::fault`] (`test-hooks` feature; not part of the stable API).
#[cfg(feature = "test-hooks")]
pub use socket::FaultInjector;
pub use socket::SocketStats;
pub use stream::{Stream, StreamChunk};
/// Test hook: an engine clock offset from the machine's and drifting, set
/// with [`EndpointBuilder::clock_skew`] (`test-hooks` feature; not part of
/// the stable API).
#[cfg(feature = "test-hooks")]
pub use sys::ClockSkew;

/// The one id type of RPCs in this API: [`PendingRpc::id`],
/// [`Endpoint::send_request_shared`], [`Response::id`] and
/// [`Request::id`] all return it. The client endpoint picks it (unique among
/// its own RPCs, from a per-incarnation seed), so a client's id alone
/// identifies its RPC, while a server must pair it with the peer's address
/// ([`Request::peer`]): two clients may use the same id.
pub use homa_proto::RpcId;
/// The engine's types that appear in this API.
pub use homa_proto::{
    Config as EngineConfig, CongestionSignal, DropReason, EndpointStats, MessageSizes, Metrics,
    NetworkProfile, Outgoing, PeerRtt, ResetReason, SendBuf, SendBufError, StreamError, StreamId,
    WindowPolicy,
};
