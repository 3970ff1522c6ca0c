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

#[cfg(feature = "tokio")]
mod async_api;
mod config;
mod endpoint;
mod error;
mod message;
mod socket;
mod sys;
pub mod timetrace;
mod wait;

#[cfg(feature = "tokio")]
pub use async_api::{RecvRequestFuture, RecvResponseFuture, RpcFuture};
pub use config::{EndpointConfig, RUNTIME_NIC_QUEUE_NS, RUNTIME_PAD_V4, RUNTIME_PAD_V6};
pub use endpoint::{Endpoint, PendingRpc, Request, Responder, Response, RuntimeStats};
pub use error::{Error, Result};
pub use message::{Message, MessageReader};
pub use socket::{FaultInjector, SocketStats};

/// The engine's types that appear in this API.
pub use homa_proto::{
    Config as EngineConfig, DropReason, EndpointStats, MessageSizes, Metrics, NetworkProfile,
    Outgoing, RpcId, SendBuf, SendBufError,
};
