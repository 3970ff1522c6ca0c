//! The status model: what a call ends with when it does not end with a
//! response. Codes and their numbers are gRPC's, so a gRPC adapter can
//! pass them through unchanged.

use std::borrow::Cow;
use std::fmt;

/// Why a call failed (gRPC's status codes, same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    /// The call was cancelled (by its client, usually).
    Cancelled = 1,
    /// An error with no better code (also: a status byte this version does
    /// not know).
    Unknown = 2,
    /// The request could not be decoded (malformed header or body).
    InvalidArgument = 3,
    /// The deadline passed before the call completed.
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    /// Out of some resource (RPC slots, receive pool, message length).
    ResourceExhausted = 8,
    /// The call was made where it cannot work (e.g. a blocking wait inside
    /// a run-to-completion handler on the same endpoint).
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    /// No such method on the server.
    Unimplemented = 12,
    /// The server broke (a handler panicked, a response did not encode or
    /// decode).
    Internal = 13,
    /// The server could not be reached or did not answer.
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code of a status byte; unknown values are [`Code::Unknown`].
    pub fn from_u8(b: u8) -> Code {
        use Code::*;
        const ALL: [Code; 17] = [
            Ok,
            Cancelled,
            Unknown,
            InvalidArgument,
            DeadlineExceeded,
            NotFound,
            AlreadyExists,
            PermissionDenied,
            ResourceExhausted,
            FailedPrecondition,
            Aborted,
            OutOfRange,
            Unimplemented,
            Internal,
            Unavailable,
            DataLoss,
            Unauthenticated,
        ];
        ALL.get(b as usize).copied().unwrap_or(Unknown)
    }
}

/// A failed call: a code and a message for people (may be empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    code: Code,
    message: Cow<'static, str>,
}

impl Status {
    pub fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Status {
        Status {
            code,
            message: message.into(),
        }
    }
    pub fn code(&self) -> Code {
        self.code
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    pub fn cancelled(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Cancelled, m)
    }
    pub fn invalid_argument(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::InvalidArgument, m)
    }
    pub fn deadline_exceeded(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::DeadlineExceeded, m)
    }
    pub fn not_found(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::NotFound, m)
    }
    pub fn unimplemented(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Unimplemented, m)
    }
    pub fn internal(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Internal, m)
    }
    pub fn unavailable(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::Unavailable, m)
    }
    pub fn resource_exhausted(m: impl Into<Cow<'static, str>>) -> Status {
        Status::new(Code::ResourceExhausted, m)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{:?}", self.code)
        } else {
            write!(f, "{:?}: {}", self.code, self.message)
        }
    }
}

impl std::error::Error for Status {}

/// The transport's errors as statuses (client side).
impl From<homa::Error> for Status {
    fn from(e: homa::Error) -> Status {
        use homa::Error as E;
        let code = match &e {
            E::Timeout => Code::DeadlineExceeded,
            E::PeerUnreachable(_) | E::Shutdown => Code::Unavailable,
            E::MessageTooLong { .. } | E::TooManyRpcs { .. } | E::TooManyPeers { .. } => {
                Code::ResourceExhausted
            }
            E::PoolExhausted => Code::ResourceExhausted,
            E::WaitInHandler => Code::FailedPrecondition,
            E::InvalidPeer(_) | E::UnreachableFamily { .. } => Code::InvalidArgument,
            _ => Code::Unknown,
        };
        Status::new(code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_bytes_are_unknown() {
        for b in 0..=16u8 {
            assert_eq!(Code::from_u8(b) as u8, b);
        }
        assert_eq!(Code::from_u8(17), Code::Unknown);
        assert_eq!(Code::from_u8(255), Code::Unknown);
    }

    #[test]
    fn transport_errors_map_to_codes() {
        assert_eq!(
            Status::from(homa::Error::Timeout).code(),
            Code::DeadlineExceeded
        );
        assert_eq!(
            Status::from(homa::Error::Shutdown).code(),
            Code::Unavailable
        );
        assert_eq!(
            Status::from(homa::Error::WaitInHandler).code(),
            Code::FailedPrecondition
        );
    }
}
