//! # homa-proto
//!
//! The Homa transport protocol as a sans-IO state machine: the caller passes the
//! current time in, hands the engine received datagrams, and polls it for
//! datagrams to transmit, for its next timer deadline and for application
//! events. The engine never reads a clock, opens a socket or spawns a thread, so
//! the UDP runtime, the simulator and the deterministic test network all drive
//! the same code. Same inputs, same outputs.
//!
//! ```
//! use homa_proto::{Config, Endpoint, Event};
//! use std::net::SocketAddr;
//!
//! let a_addr: SocketAddr = "10.0.0.1:4000".parse().unwrap();
//! let b_addr: SocketAddr = "10.0.0.2:4000".parse().unwrap();
//! let mut a = Endpoint::new(Config::default(), 0).unwrap();
//! let mut b = Endpoint::new(Config::default().with_rpc_id_seed(7), 0).unwrap();
//! let id = a.send_request(0, b_addr, bytes::Bytes::from_static(b"ping")).unwrap();
//!
//! // A perfect, instant network: shuttle datagrams until both are quiet.
//! let mut buf = Vec::new();
//! let mut done = false;
//! while !done {
//!     done = true;
//!     while let Some(t) = a.poll_transmit(0, &mut buf) {
//!         b.handle_datagram(0, a_addr, &buf[..t.len]);
//!         done = false;
//!     }
//!     while let Some(ev) = b.poll_event() {
//!         if let Event::Request { rpc, message } = ev {
//!             assert_eq!(message.to_vec(), b"ping");
//!             b.send_response(0, rpc, bytes::Bytes::from_static(b"pong")).unwrap();
//!         }
//!     }
//!     while let Some(t) = b.poll_transmit(0, &mut buf) {
//!         a.handle_datagram(0, b_addr, &buf[..t.len]);
//!         done = false;
//!     }
//! }
//! match a.poll_event() {
//!     Some(Event::Response { id: got, message }) => {
//!         assert_eq!(got, id);
//!         assert_eq!(message.to_vec(), b"pong");
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

#![warn(missing_docs)]

pub mod config;
mod config_setters;
mod control;
mod deferred;
pub mod driver;
mod endpoint;
mod fifo;
mod grants;
mod incoming;
mod landing;
pub mod metrics;
mod onramp;
mod outgoing;
mod pacer;
mod partial;
mod peer;
pub mod pool;
pub mod priorities;
mod rpc;
mod rpc_table;
mod rtt;
mod send_queue;
pub mod sendbuf;
mod servers;
mod srpt;
mod stream;
mod table;
pub mod time;
mod timer;
mod tombstones;
pub mod trace;
mod waiters;
mod window;
pub mod wire;

pub use config::{
    Config, ConfigError, CongestionSignal, GrantPolicy, NetworkProfile, PadWindow, WindowPolicy,
};
pub use endpoint::{
    splitmix64, Endpoint, EndpointStats, Event, RpcError, RpcId, SendError, ServerRpc, Transmit,
};
pub use landing::LandingSite;
pub use metrics::{DropReason, Metrics};
pub use onramp::{mean_hold_us, PeerOnRamp};
pub use outgoing::Burst;
pub use partial::{PartialMessage, PartialState};
pub use pool::{Message, BPAGE_SIZE};
pub use priorities::{MessageSizes, PriorityPlan};
pub use rtt::PeerRtt;
pub use sendbuf::{Outgoing, SendBuf, SendBufError};
pub use stream::{StreamError, StreamId, StreamRead};
pub use time::Time;
pub use wire::ResetReason;
