//! The endpoint: one Homa socket's worth of protocol state.

use crate::config::{Config, ConfigError};
use crate::metrics::Metrics;
use crate::pool::Message;
use bytes::Bytes;
use std::net::SocketAddr;
use thiserror::Error;

/// Time in nanoseconds on the driver's clock (any epoch; must not go backwards).
pub type Time = u64;

/// Client-side identifier of an RPC (unique per client endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RpcId(pub u64);

/// A request received by a server, to be answered with [`Endpoint::send_response`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServerRpc {
    pub peer: SocketAddr,
    pub id: u64,
}

/// What `poll_transmit` wrote into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub dest: SocketAddr,
    /// Priority level 0..8 (7 highest), to be carried in DSCP / a switch queue.
    pub priority: u8,
    /// Bytes written to the buffer.
    pub len: usize,
}

/// Something the application must hear about.
#[derive(Debug)]
pub enum Event {
    /// A complete request arrived; answer it with `send_response`.
    Request { rpc: ServerRpc, message: Message },
    /// The response to one of our requests arrived; the RPC is finished.
    Response { id: RpcId, message: Message },
    /// One of our RPCs failed; it is finished.
    Failed { id: RpcId, error: RpcError },
}

/// Why an RPC failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum RpcError {
    #[error("the peer did not answer within the RPC timeout")]
    Timeout,
    #[error("the response is longer than the maximum message length")]
    ResponseTooLong,
    #[error("the endpoint was shut down")]
    Shutdown,
}

/// Why a send was refused.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum SendError {
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    MessageTooLong { len: usize, max: u32 },
    #[error("too many RPCs in progress (limit {0})")]
    TooManyRpcs(usize),
    #[error("too many peers (limit {0})")]
    TooManyPeers(usize),
    #[error("no such server RPC awaiting a response (already answered, or abandoned by the client)")]
    UnknownRpc,
    #[error("the endpoint is shut down")]
    Shutdown,
}

/// Sizes of an endpoint's tables, for tests and memory reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    pub client_rpcs: usize,
    pub server_rpcs: usize,
    pub peers: usize,
    pub tombstones: usize,
    pub pool_bpages_in_use: usize,
    pub pool_empty: bool,
}

/// One Homa endpoint (the Linux module's socket).
pub struct Endpoint {
    config: Config,
    metrics: Metrics,
}

impl Endpoint {
    /// A new endpoint; `now` is the driver's current time.
    pub fn new(config: Config, now: Time) -> Result<Endpoint, ConfigError> {
        config.validate()?;
        let _ = now;
        todo!()
    }
    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }
    pub fn stats(&self) -> EndpointStats {
        todo!()
    }
    /// Feeds one received datagram (UDP payload) from `from`.
    pub fn handle_datagram(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        let _ = (now, from, datagram);
        todo!()
    }
    /// Writes the next datagram to send into `buf` (cleared first), or returns
    /// `None` if nothing may be sent now (call again after [`Self::poll_timeout`]
    /// or any other input).
    pub fn poll_transmit(&mut self, now: Time, buf: &mut Vec<u8>) -> Option<Transmit> {
        let _ = (now, buf);
        todo!()
    }
    /// When `handle_timeout` should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Time> {
        todo!()
    }
    /// Runs timers due at `now`.
    pub fn handle_timeout(&mut self, now: Time) {
        let _ = now;
        todo!()
    }
    pub fn poll_event(&mut self) -> Option<Event> {
        todo!()
    }
    /// Starts an RPC.
    pub fn send_request(&mut self, now: Time, dest: SocketAddr, request: Bytes) -> Result<RpcId, SendError> {
        let _ = (now, dest, request);
        todo!()
    }
    /// Answers a request delivered by [`Event::Request`].
    pub fn send_response(&mut self, now: Time, rpc: ServerRpc, response: Bytes) -> Result<(), SendError> {
        let _ = (now, rpc, response);
        todo!()
    }
    /// Abandons a client RPC (no event is generated for it). Unknown ids are ignored.
    pub fn cancel(&mut self, id: RpcId) {
        let _ = id;
        todo!()
    }
    /// Fails every client RPC with [`RpcError::Shutdown`], forgets every server
    /// RPC and refuses new work.
    pub fn shutdown(&mut self) {
        todo!()
    }
}
