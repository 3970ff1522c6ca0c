//! # homa-rpc
//!
//! A general-purpose RPC framework on Homa (issue #23): services declared
//! in Rust with [`service!`], method ids on the wire, typed requests and
//! responses (serde, encoded with postcard) or raw bytes straight from the
//! receive pool, gRPC-like status codes, deadlines carried with every
//! request and propagated to nested calls, cancellation notices, and a
//! threading mode chosen per method: run to completion inside the receive
//! pass (`inline`), a worker pool (`pool`), or a tokio task (`task`).
//!
//! * [`wire`]: the request and response headers (docs/rpc.md).
//! * [`Client`], [`Call`]: starting, waiting for and cancelling calls.
//! * [`Server`], [`Context`]: serving, and what a handler knows.
//!
//! See the crate README for an example.

/// The examples in the crate's README.md, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod client;
mod server;
mod status;
pub mod wire;

pub use client::{Call, Client};
pub use server::{Context, Server, ServerBuilder};
pub use status::{Code, Status};
pub use wire::method_id;

// For the code `service!` generates.
#[doc(hidden)]
pub use homa;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

/// How a method's handler runs (chosen per method in [`service!`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Inside the serving thread's receive pass, no handoff: for short
    /// handlers that do not block (they hold up the endpoint meanwhile).
    Inline,
    /// On the server's worker pool: for long or blocking handlers.
    Pool,
    /// As a task on the server's tokio runtime: for async handlers.
    Task,
}

/// How a request or response type travels. Every serde type does (encoded
/// with postcard); [`Raw`] is the zero-copy path.
pub trait Payload {
    /// What the sender gives.
    type Out;
    /// What the receiver gets.
    type In;
    /// Appends the encoding of `v` to `out`.
    fn encode(v: &Self::Out, out: &mut Vec<u8>) -> Result<(), Status>;
    /// Decodes a received body (untrusted: an error, never a panic).
    fn decode(m: homa::Message) -> Result<Self::In, Status>;
    /// Bytes to reserve for `v`'s encoding.
    fn size_hint(_v: &Self::Out) -> usize {
        64
    }
}

impl<T: Serialize + DeserializeOwned> Payload for T {
    type Out = T;
    type In = T;
    fn encode(v: &T, out: &mut Vec<u8>) -> Result<(), Status> {
        postcard::to_io(v, out)
            .map(|_| ())
            .map_err(|e| Status::internal(format!("encoding failed: {e}")))
    }
    fn decode(m: homa::Message) -> Result<T, Status> {
        postcard::from_bytes(&m.contiguous())
            .map_err(|e| Status::invalid_argument(format!("body did not decode: {e}")))
    }
}

/// Raw bytes: the sender gives [`Bytes`], the receiver gets the
/// [`homa::Message`] itself (fragments of the receive pool, past the
/// framework's header; no copy).
#[derive(Debug)]
pub enum Raw {}

impl Payload for Raw {
    type Out = Bytes;
    type In = homa::Message;
    fn encode(v: &Bytes, out: &mut Vec<u8>) -> Result<(), Status> {
        out.extend_from_slice(v);
        Ok(())
    }
    fn decode(m: homa::Message) -> Result<homa::Message, Status> {
        Ok(m)
    }
    fn size_hint(v: &Bytes) -> usize {
        v.len()
    }
}

/// An OK response: its header, then `v` encoded.
pub fn encode_ok<R: Payload>(v: &R::Out) -> Result<Vec<u8>, Status> {
    let mut out = Vec::with_capacity(wire::RESPONSE_HEADER_LEN + R::size_hint(v));
    wire::put_ok_header(&mut out);
    R::encode(v, &mut out)?;
    Ok(out)
}

/// An async handler's boxed future.
pub type BoxFuture = Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>>;

/// A service's server side, as [`service!`] generates it: which methods it
/// has, how each runs, and how to call them with an undecoded body.
pub trait Dispatch: Send + Sync + 'static {
    /// The service's name.
    fn name(&self) -> &'static str;
    /// The mode of `method`, `None` if the service has no such method.
    fn mode(&self, method: u32) -> Option<Mode>;
    /// Runs an `Inline` or `Pool` method: the encoded response (OK header
    /// included) or a status.
    fn call(&self, method: u32, cx: &Context, body: homa::Message) -> Result<Vec<u8>, Status>;
    /// Runs a `Task` method.
    fn call_async(&self, method: u32, cx: Context, body: homa::Message) -> BoxFuture;
}

/// Declares a service: a module with its method ids, the trait a server
/// implements (`Service`), the server adapter (`server(impl Service)`),
/// a blocking client stub (`Client`), an async one (`AsyncClient`), and
/// `Start`, which starts calls without waiting (for fan-out).
///
/// Each method is `MODE fn NAME(REQUEST) -> RESPONSE;` with `MODE` one of
/// `inline`, `pool`, `task` (see [`Mode`]) and the types any serde type or
/// [`Raw`]. The method id is [`method_id`]`("module/method")`, checked at
/// compile time to differ from the others'.
///
/// Handler signatures: `inline` and `pool` methods are
/// `fn m(&self, cx: &Context, req: In) -> Result<Out, Status>`; `task`
/// methods are `fn m(self: Arc<Self>, cx: Context, req: In) -> impl
/// Future<Output = Result<Out, Status>> + Send + 'static` (an `async fn`
/// implements it).
#[macro_export]
macro_rules! service {
    (
        $(#[$meta:meta])*
        $vis:vis mod $svc:ident {
            $(
                $(#[$mmeta:meta])*
                $mode:ident fn $method:ident ( $req:ty ) -> $resp:ty ;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis mod $svc {
            #![allow(dead_code, non_upper_case_globals, clippy::all)]
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::Payload as _;

            /// The service's name (the first half of every method's name).
            pub const NAME: &str = stringify!($svc);

            /// Each method's id on the wire.
            pub mod ids {
                $(
                    pub const $method: u32 =
                        $crate::method_id(concat!(stringify!($svc), "/", stringify!($method)));
                )*
            }
            const _: () = assert!(
                $crate::wire::all_distinct(&[$(ids::$method),*]),
                "two methods of this service hash to one id: rename one"
            );

            /// What a server of this service implements.
            pub trait Service: Send + Sync + 'static {
                $( $crate::__rpc_sig!($mode [$(#[$mmeta])*] $method, $req, $resp); )*
            }

            /// The server side: give it to `homa_rpc::Server::builder(..).service(..)`.
            pub struct Server<S>(pub ::std::sync::Arc<S>);

            /// Wraps an implementation for a `homa_rpc::Server`.
            pub fn server<S: Service>(s: S) -> Server<S> {
                Server(::std::sync::Arc::new(s))
            }

            impl<S: Service> $crate::Dispatch for Server<S> {
                fn name(&self) -> &'static str {
                    NAME
                }
                fn mode(&self, method: u32) -> ::std::option::Option<$crate::Mode> {
                    $(
                        if method == ids::$method {
                            return ::std::option::Option::Some($crate::__rpc_mode!($mode));
                        }
                    )*
                    ::std::option::Option::None
                }
                fn call(
                    &self,
                    method: u32,
                    cx: &$crate::Context,
                    body: $crate::homa::Message,
                ) -> ::std::result::Result<::std::vec::Vec<u8>, $crate::Status> {
                    $( $crate::__rpc_sync!($mode, (&*self.0), method, cx, body, $method, $req, $resp); )*
                    ::std::result::Result::Err($crate::Status::unimplemented("not a blocking method"))
                }
                fn call_async(
                    &self,
                    method: u32,
                    cx: $crate::Context,
                    body: $crate::homa::Message,
                ) -> $crate::BoxFuture {
                    $( $crate::__rpc_async!($mode, self.0, method, cx, body, $method, $req, $resp); )*
                    ::std::boxed::Box::pin(async {
                        ::std::result::Result::Err($crate::Status::unimplemented("not an async method"))
                    })
                }
            }

            /// Blocking client stub: one method per RPC method.
            #[derive(Clone, Debug)]
            pub struct Client {
                rpc: $crate::Client,
                addr: ::std::net::SocketAddr,
            }

            impl Client {
                pub fn new(rpc: $crate::Client, addr: ::std::net::SocketAddr) -> Client {
                    Client { rpc, addr }
                }
                /// The framework client underneath (deadline, endpoint).
                pub fn rpc(&self) -> &$crate::Client {
                    &self.rpc
                }
                /// The same stub with every call bounded by `timeout`.
                pub fn with_timeout(&self, timeout: ::std::time::Duration) -> Client {
                    Client { rpc: self.rpc.with_timeout(timeout), addr: self.addr }
                }
                /// Starts calls without waiting (fan-out): `stub.start().m(&req)?.wait()`.
                pub fn start(&self) -> Start<'_> {
                    Start(self)
                }
                $(
                    $(#[$mmeta])*
                    pub fn $method(
                        &self,
                        req: &<$req as $crate::Payload>::Out,
                    ) -> ::std::result::Result<<$resp as $crate::Payload>::In, $crate::Status> {
                        self.rpc.call::<$req, $resp>(self.addr, ids::$method, req)
                    }
                )*
            }

            /// Starts calls of a [`Client`] without waiting for them.
            pub struct Start<'a>(&'a Client);

            impl Start<'_> {
                $(
                    $(#[$mmeta])*
                    pub fn $method(
                        &self,
                        req: &<$req as $crate::Payload>::Out,
                    ) -> ::std::result::Result<$crate::Call<$resp>, $crate::Status> {
                        self.0.rpc.start::<$req, $resp>(self.0.addr, ids::$method, req)
                    }
                )*
            }

            /// Async client stub: the same methods as futures.
            #[derive(Clone, Debug)]
            pub struct AsyncClient {
                rpc: $crate::Client,
                addr: ::std::net::SocketAddr,
            }

            impl AsyncClient {
                pub fn new(rpc: $crate::Client, addr: ::std::net::SocketAddr) -> AsyncClient {
                    AsyncClient { rpc, addr }
                }
                pub fn rpc(&self) -> &$crate::Client {
                    &self.rpc
                }
                pub fn with_timeout(&self, timeout: ::std::time::Duration) -> AsyncClient {
                    AsyncClient { rpc: self.rpc.with_timeout(timeout), addr: self.addr }
                }
                $(
                    $(#[$mmeta])*
                    /// (The request leaves at once; the future waits for
                    /// the response, and dropping it cancels the call.)
                    pub fn $method(
                        &self,
                        req: &<$req as $crate::Payload>::Out,
                    ) -> impl ::std::future::Future<
                        Output = ::std::result::Result<<$resp as $crate::Payload>::In, $crate::Status>,
                    > + Send
                           + 'static {
                        let call = self.rpc.start::<$req, $resp>(self.addr, ids::$method, req);
                        async move { call?.wait_async().await }
                    }
                )*
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_mode {
    (inline) => {
        $crate::Mode::Inline
    };
    (pool) => {
        $crate::Mode::Pool
    };
    (task) => {
        $crate::Mode::Task
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_sig {
    (inline [$($m:tt)*] $method:ident, $req:ty, $resp:ty) => {
        $($m)*
        fn $method(
            &self,
            cx: &$crate::Context,
            req: <$req as $crate::Payload>::In,
        ) -> ::std::result::Result<<$resp as $crate::Payload>::Out, $crate::Status>;
    };
    (pool [$($m:tt)*] $method:ident, $req:ty, $resp:ty) => {
        $crate::__rpc_sig!(inline [$($m)*] $method, $req, $resp);
    };
    (task [$($m:tt)*] $method:ident, $req:ty, $resp:ty) => {
        $($m)*
        fn $method(
            self: ::std::sync::Arc<Self>,
            cx: $crate::Context,
            req: <$req as $crate::Payload>::In,
        ) -> impl ::std::future::Future<
            Output = ::std::result::Result<<$resp as $crate::Payload>::Out, $crate::Status>,
        > + Send
               + 'static;
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_sync {
    (task, $s:expr, $id:expr, $cx:expr, $body:expr, $method:ident, $req:ty, $resp:ty) => {};
    ($mode:ident, $s:expr, $id:expr, $cx:expr, $body:expr, $method:ident, $req:ty, $resp:ty) => {
        if $id == ids::$method {
            let req = <$req as $crate::Payload>::decode($body)?;
            $crate::homa::timetrace::record("rpc handler start");
            let resp = Service::$method($s, $cx, req);
            $crate::homa::timetrace::record("rpc handler done");
            return $crate::encode_ok::<$resp>(&resp?);
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __rpc_async {
    (task, $s:expr, $id:expr, $cx:expr, $body:expr, $method:ident, $req:ty, $resp:ty) => {
        if $id == ids::$method {
            let svc = ::std::sync::Arc::clone(&$s);
            return ::std::boxed::Box::pin(async move {
                let req = <$req as $crate::Payload>::decode($body)?;
                let resp = Service::$method(svc, $cx, req).await?;
                $crate::encode_ok::<$resp>(&resp)
            });
        }
    };
    ($mode:ident, $s:expr, $id:expr, $cx:expr, $body:expr, $method:ident, $req:ty, $resp:ty) => {};
}
