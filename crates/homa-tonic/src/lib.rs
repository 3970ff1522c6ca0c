//! gRPC over Homa: unmodified tonic-generated clients and servers, each
//! unary call one Homa RPC (docs/grpc.md).
//!
//! * Client: [`HomaChannel`] is a `tower::Service<http::Request<_>>`, so a
//!   generated client takes it where it takes tonic's `Channel`:
//!   `GreeterClient::new(HomaChannel::new(endpoint, server_addr))`.
//! * Server: [`serve`] runs any tonic service (a [`Router`] of generated
//!   servers, tonic's `Routes`, or one generated server) on a Homa
//!   endpoint.
//!
//! Streaming calls are carried whole (see docs/grpc.md, "Streaming"): the
//! request stream is sent when it ends, the response stream when the
//! handler's ends.

mod body;
mod client;
mod server;
mod streaming;
pub mod wire;

#[cfg(feature = "bench")]
pub mod bench;

pub use body::HomaBody;
pub use client::{HomaChannel, ResponseFuture};
pub use server::{serve, Router};
