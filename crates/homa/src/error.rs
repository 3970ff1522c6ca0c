//! The runtime's error type: one enum for everything an RPC or an endpoint
//! operation can fail with, one variant per distinct cause, so that callers
//! can match on it (and convert it into [`std::io::Error`] where an I/O error
//! is expected).

use homa_proto::{RpcError, SendError};
use std::io;
use std::net::SocketAddr;
use thiserror::Error;

/// Why an operation failed.
///
/// Each variant is one cause; none carries a free-form message, so a match
/// on the variant is all a caller needs. New variants may be added (the enum
/// is `#[non_exhaustive]`). [`Error::is_transient`] tells the ones worth
/// retrying; `From<Error> for std::io::Error` maps each to an
/// [`io::ErrorKind`] (table in the crate's README).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The peer did not answer in time (the engine's RPC timeout, or the
    /// deadline given to a `*_timeout` call).
    #[error("timed out")]
    Timeout,
    /// The network said the peer cannot be reached (ICMP port or host
    /// unreachable, no route).
    #[error("peer {0} is unreachable")]
    PeerUnreachable(SocketAddr),
    /// A request or response exceeds the maximum message length
    /// (`EngineConfig::max_message_length`).
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    MessageTooLong { len: usize, max: usize },
    /// The endpoint was shut down (before or while the operation ran).
    #[error("the endpoint is shut down")]
    Shutdown,
    /// The receive pool could not hold the message: the application holds too
    /// many received messages.
    #[error("the receive buffer pool is exhausted")]
    PoolExhausted,
    /// This endpoint already has `limit` RPCs in progress
    /// (`EngineConfig::max_client_rpcs`).
    #[error("too many RPCs in progress (at most {limit})")]
    TooManyRpcs { limit: usize },
    /// This endpoint already tracks `limit` peers (`EngineConfig::max_peers`).
    #[error("too many peers (at most {limit})")]
    TooManyPeers { limit: usize },
    /// No such request awaits a reply: it was answered already, or its
    /// client abandoned it (gave up, or the RPC timed out), or the endpoint
    /// forgot it. Servers usually ignore this error.
    #[error("no such request awaits a reply (answered, or abandoned by its client)")]
    UnknownRpc,
    /// The [`SendBuf`](crate::SendBuf) is still in flight: an earlier RPC has
    /// not finished with it (see `SendBuf::in_flight`).
    #[error("the send buffer is still in flight (an earlier RPC has not finished with it)")]
    BufferInFlight,
    /// The [`SendBuf`](crate::SendBuf) is laid out for `segment`-byte packets
    /// but this endpoint sends `expected` bytes per packet; make it with
    /// `Endpoint::new_send_buf`.
    #[error(
        "the send buffer has {segment}-byte segments; this endpoint sends {expected} bytes \
         per packet (make it with Endpoint::new_send_buf)"
    )]
    BufferLayout { segment: usize, expected: usize },
    /// A blocking wait on an endpoint from inside its own
    /// [`serve`](crate::Endpoint::serve) handler, which would wait for the
    /// handler itself. Move the work to another thread.
    #[error(
        "cannot wait on an endpoint inside its own serve handler (the handler holds its \
         engine; move the work to another thread)"
    )]
    WaitInHandler,
    /// The peer address is not a unicast address with a port (port 0, an
    /// unspecified or a multicast address).
    #[error("{0} is not a unicast peer address")]
    InvalidPeer(SocketAddr),
    /// The peer's address family cannot be reached from this socket (an IPv4
    /// peer from a socket bound to an IPv6 address other than `[::]`, or an
    /// IPv6 peer from an IPv4 socket).
    #[error("{peer} is not reachable from a socket bound to {local}")]
    UnreachableFamily { peer: SocketAddr, local: SocketAddr },
    /// The response of this [`PendingRpc`](crate::PendingRpc) was already
    /// returned by an earlier `try_wait`.
    #[error("the response was already taken")]
    ResponseTaken,
    /// A reply to a request that is still arriving
    /// ([`Endpoint::recv_partial_request`](crate::Endpoint::recv_partial_request)):
    /// reply once it is complete.
    #[error("the request is still arriving; reply once it is complete")]
    RequestIncomplete,
    /// An [`IncomingMessage`](crate::IncomingMessage) stopped before its end
    /// (its RPC timed out or was cancelled, or the endpoint shut down): its
    /// first `received` of `len` bytes arrived, and were readable in order.
    #[error("the message ended after {received} of its {len} bytes")]
    Incomplete { received: usize, len: usize },
    /// A stream ended early or refused the operation: the peer reset it
    /// (`StreamError::Reset`, with the reason), or this side misused it
    /// (written after `finish`, an empty message, too many streams).
    /// Timeouts and shutdowns are [`Error::Timeout`] and [`Error::Shutdown`].
    #[error("stream: {0}")]
    Stream(homa_proto::StreamError),
    /// The endpoint or engine configuration is invalid; the text names the
    /// setting and its allowed range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The operating system refused a socket operation (or the address to
    /// bind did not resolve).
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
}

/// Shorthand for results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether retrying the same operation later might succeed: a timeout,
    /// or a resource (pool space, an RPC or peer slot, a send buffer) that
    /// is busy now and freed as RPCs finish.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout
                | Error::PoolExhausted
                | Error::TooManyRpcs { .. }
                | Error::TooManyPeers { .. }
                | Error::BufferInFlight
                | Error::Stream(homa_proto::StreamError::TooManyStreams(_))
        )
    }

    /// The [`io::ErrorKind`] this error becomes in a [`std::io::Error`].
    ///
    /// Kinds are those of Rust 1.80 (the crate's minimum): an unreachable
    /// peer is `ConnectionRefused` (what a UDP socket reports for an ICMP
    /// port unreachable), a shut-down endpoint `ConnectionAborted`, a busy
    /// resource without a kind of its own `Other`.
    pub fn io_kind(&self) -> io::ErrorKind {
        use io::ErrorKind as K;
        match self {
            Error::Timeout => K::TimedOut,
            Error::PeerUnreachable(_) => K::ConnectionRefused,
            Error::Shutdown => K::ConnectionAborted,
            Error::PoolExhausted => K::OutOfMemory,
            Error::UnknownRpc => K::NotFound,
            Error::Incomplete { .. } => K::UnexpectedEof,
            Error::RequestIncomplete => K::Other,
            Error::Stream(homa_proto::StreamError::Reset(_)) => K::ConnectionReset,
            Error::Stream(homa_proto::StreamError::Unknown) => K::NotConnected,
            Error::Stream(homa_proto::StreamError::Finished) => K::BrokenPipe,
            Error::Stream(_) => K::Other,
            Error::MessageTooLong { .. }
            | Error::BufferLayout { .. }
            | Error::InvalidPeer(_)
            | Error::UnreachableFamily { .. }
            | Error::ResponseTaken
            | Error::InvalidConfig(_) => K::InvalidInput,
            Error::TooManyRpcs { .. }
            | Error::TooManyPeers { .. }
            | Error::BufferInFlight
            | Error::WaitInHandler => K::Other,
            Error::Io(e) => e.kind(),
        }
    }

    pub(crate) fn from_send(e: SendError) -> Error {
        match e {
            SendError::MessageTooLong { len, max } => Error::MessageTooLong {
                len,
                max: max as usize,
            },
            SendError::TooManyRpcs(limit) => Error::TooManyRpcs { limit },
            SendError::TooManyPeers(limit) => Error::TooManyPeers { limit },
            SendError::UnknownRpc => Error::UnknownRpc,
            SendError::RequestIncomplete => Error::RequestIncomplete,
            SendError::Shutdown => Error::Shutdown,
            SendError::BufferInFlight => Error::BufferInFlight,
            SendError::BufferLayout { segment, expected } => {
                Error::BufferLayout { segment, expected }
            }
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

/// An [`io::Error`] of kind [`Error::io_kind`] that carries the `Error`
/// itself (get it back with `get_ref()` / `into_inner()` and
/// `downcast`); an [`Error::Io`] becomes its own `io::Error` unchanged.
impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            e => io::Error::new(e.io_kind(), e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use io::ErrorKind as K;

    fn addr() -> SocketAddr {
        "127.0.0.1:9".parse().unwrap()
    }

    #[test]
    fn engine_send_errors_map_to_their_own_variants() {
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
            Error::TooManyRpcs { limit: 3 }
        ));
        assert!(matches!(
            Error::from_send(SendError::TooManyPeers(4)),
            Error::TooManyPeers { limit: 4 }
        ));
        assert!(matches!(
            Error::from_send(SendError::UnknownRpc),
            Error::UnknownRpc
        ));
        assert!(matches!(
            Error::from_send(SendError::BufferInFlight),
            Error::BufferInFlight
        ));
        assert!(matches!(
            Error::from_send(SendError::BufferLayout {
                segment: 100,
                expected: 1416
            }),
            Error::BufferLayout {
                segment: 100,
                expected: 1416
            }
        ));
    }

    #[test]
    fn engine_rpc_errors_map_to_their_own_variants() {
        assert!(matches!(
            Error::from_rpc(RpcError::Timeout, 9),
            Error::Timeout
        ));
        assert!(matches!(
            Error::from_rpc(RpcError::ResponseTooLong, 9),
            Error::MessageTooLong { len: 10, max: 9 }
        ));
        assert!(matches!(
            Error::from_rpc(RpcError::Shutdown, 9),
            Error::Shutdown
        ));
        assert!(matches!(
            Error::from_rpc(RpcError::PoolExhausted, 9),
            Error::PoolExhausted
        ));
    }

    #[test]
    fn transient_errors_are_the_busy_resources_and_timeouts() {
        for e in [
            Error::Timeout,
            Error::PoolExhausted,
            Error::TooManyRpcs { limit: 1 },
            Error::TooManyPeers { limit: 1 },
            Error::BufferInFlight,
        ] {
            assert!(e.is_transient(), "{e:?}");
        }
        for e in [
            Error::Shutdown,
            Error::UnknownRpc,
            Error::WaitInHandler,
            Error::InvalidPeer(addr()),
            Error::InvalidConfig("x".into()),
            Error::PeerUnreachable(addr()),
            Error::Io(io::Error::other("x")),
        ] {
            assert!(!e.is_transient(), "{e:?}");
        }
    }

    #[test]
    fn every_variant_has_an_io_error_kind() {
        let cases: Vec<(Error, K)> = vec![
            (Error::Timeout, K::TimedOut),
            (Error::PeerUnreachable(addr()), K::ConnectionRefused),
            (Error::MessageTooLong { len: 2, max: 1 }, K::InvalidInput),
            (Error::Shutdown, K::ConnectionAborted),
            (Error::PoolExhausted, K::OutOfMemory),
            (Error::TooManyRpcs { limit: 1 }, K::Other),
            (Error::TooManyPeers { limit: 1 }, K::Other),
            (Error::UnknownRpc, K::NotFound),
            (Error::BufferInFlight, K::Other),
            (
                Error::BufferLayout {
                    segment: 1,
                    expected: 2,
                },
                K::InvalidInput,
            ),
            (Error::WaitInHandler, K::Other),
            (Error::InvalidPeer(addr()), K::InvalidInput),
            (
                Error::UnreachableFamily {
                    peer: addr(),
                    local: "[::1]:1".parse().unwrap(),
                },
                K::InvalidInput,
            ),
            (Error::ResponseTaken, K::InvalidInput),
            (Error::RequestIncomplete, K::Other),
            (
                Error::Incomplete {
                    received: 1,
                    len: 2,
                },
                K::UnexpectedEof,
            ),
            (Error::InvalidConfig("mtu".into()), K::InvalidInput),
            (Error::Io(io::Error::from(K::AddrInUse)), K::AddrInUse),
        ];
        for (e, kind) in cases {
            let text = e.to_string();
            let was_io = matches!(e, Error::Io(_));
            assert_eq!(e.io_kind(), kind, "{e:?}");
            let io: io::Error = e.into();
            assert_eq!(io.kind(), kind, "{text}");
            if !was_io {
                // The homa error rides inside: callers can get it back.
                let inner = io.get_ref().and_then(|i| i.downcast_ref::<Error>());
                assert_eq!(inner.map(|i| i.to_string()), Some(text));
            }
        }
    }

    #[test]
    fn io_errors_convert_both_ways_unchanged() {
        let e: Error = io::Error::from_raw_os_error(libc::EADDRINUSE).into();
        let io: io::Error = e.into();
        assert_eq!(io.raw_os_error(), Some(libc::EADDRINUSE));
        let back = io::Error::from(Error::Timeout);
        match back.into_inner().map(|b| b.downcast::<Error>()) {
            Some(Ok(e)) => assert!(matches!(*e, Error::Timeout)),
            other => panic!("{other:?}"),
        }
    }
}
