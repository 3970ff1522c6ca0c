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
//! Streaming calls go whole in one RPC by default (the request stream is
//! sent when it ends, the response stream when the handler's ends), or on
//! a `homa::Stream` each for the methods named in
//! [`HomaChannel::with_streaming`] (docs/grpc.md §4).

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
