//! The runtime's error type: one enum for everything an RPC or an endpoint
//! operation can fail with, so that callers can match on the cause.

use homa_proto::{RpcError, SendError};
use std::net::SocketAddr;
use thiserror::Error;

/// Why an operation failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer did not answer in time (the engine's RPC timeout, or the
    /// deadline given to a `*_timeout` call).
    #[error("timed out")]
    Timeout,
    /// The network said the peer cannot be reached (ICMP unreachable, no route).
    #[error("peer {0} is unreachable")]
    PeerUnreachable(SocketAddr),
    /// A request or response exceeds the maximum message length.
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    MessageTooLong { len: usize, max: usize },
    /// The endpoint was shut down (before or while the operation ran).
    #[error("the endpoint is shut down")]
    Shutdown,
    /// The receive pool could not hold the message: the application holds too
    /// many received messages.
    #[error("the receive buffer pool is exhausted")]
    PoolExhausted,
    /// Too many RPCs or peers in progress at once (an engine limit).
    #[error("resource limit reached: {0}")]
    TooManyRpcs(String),
    /// The call makes no sense (wrong address family, port 0, bad config...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The operating system refused a socket operation.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether retrying the same operation later might succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout | Error::PoolExhausted | Error::TooManyRpcs(_)
        )
    }
    pub(crate) fn from_send(e: SendError) -> Error {
        match e {
            SendError::MessageTooLong { len, max } => Error::MessageTooLong {
                len,
                max: max as usize,
            },
            SendError::TooManyRpcs(n) => Error::TooManyRpcs(format!("at most {n} RPCs")),
            SendError::TooManyPeers(n) => Error::TooManyRpcs(format!("at most {n} peers")),
            SendError::UnknownRpc => Error::InvalidArgument(
                "no such request awaits a reply (answered, or abandoned by its client)".into(),
            ),
            SendError::Shutdown => Error::Shutdown,
            SendError::BufferInFlight => Error::InvalidArgument(
                "the send buffer is still in flight (an earlier RPC has not finished with it)"
                    .into(),
            ),
            SendError::BufferLayout { segment, expected } => Error::InvalidArgument(format!(
                "the send buffer has {segment}-byte segments; this endpoint sends {expected} \
                 bytes per packet (make it with Endpoint::new_send_buf)"
            )),
        }
    }
    pub(crate) fn from_rpc(e: RpcError, max_len: usize) -> Error {
        match e {
            RpcError::Timeout => Error::Timeout,
            RpcError::ResponseTooLong => Error::MessageTooLong {
                len: max_len + 1,
                max: max_len,
            },
            RpcError::Shutdown => Error::Shutdown,
            RpcError::PoolExhausted => Error::PoolExhausted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_typed_errors() {
        assert!(matches!(
            Error::from_send(SendError::MessageTooLong { len: 10, max: 5 }),
            Error::MessageTooLong { len: 10, max: 5 }
        ));
        assert!(matches!(
            Error::from_send(SendError::Shutdown),
            Error::Shutdown
        ));
        assert!(matches!(
            Error::from_send(SendError::TooManyRpcs(3)),
            Error::TooManyRpcs(_)
        ));
        assert!(matches!(
            Error::from_rpc(RpcError::Timeout, 9),
            Error::Timeout
        ));
        assert!(matches!(
            Error::from_rpc(RpcError::ResponseTooLong, 9),
            Error::MessageTooLong { max: 9, .. }
        ));
        assert!(matches!(
            Error::from_send(SendError::BufferInFlight),
            Error::InvalidArgument(_)
        ));
        assert!(Error::Timeout.is_transient());
        assert!(!Error::Shutdown.is_transient());
    }
}
