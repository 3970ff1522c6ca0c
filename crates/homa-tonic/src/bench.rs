//! `homa grpc-bench` (feature `bench`): the same tonic client and server
//! code over tonic's own HTTP/2-over-TCP transport and over Homa, unary
//! echoes, the two transports taking turns in rounds.

use crate::{serve, HomaChannel, Router};
use bytes::{Buf, BufMut, Bytes};
use hdrhistogram::Histogram;
use homa::AsyncEndpoint;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{NamedService, UnaryService};
use tonic::Status;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The transports compared: tonic over TCP, tonic over Homa, and (not by
/// default) `homa-raw`, the same echo as a bare `AsyncEndpoint` call
/// without tonic, which shows what the gRPC layers add.
pub const TRANSPORTS: [&str; 3] = ["tonic-tcp", "tonic-homa", "homa-raw"];

/// What to measure.
#[derive(Clone, Debug)]
pub struct GrpcBench {
    /// Request (and response) payload sizes in bytes.
    pub sizes: Vec<usize>,
    /// Timed calls per transport and size, over all rounds.
    pub iters: u64,
    /// Untimed calls per transport and size before the first round.
    pub warmup: u64,
    /// Rounds the transports take turns in.
    pub rounds: u64,
    /// Transports (of [`TRANSPORTS`]).
    pub transports: Vec<String>,
    /// Busy-poll time of the Homa endpoints' async waits
    /// (`EndpointConfig::async_poll`); None keeps the default (50 µs).
    pub async_poll: Option<Duration>,
    /// Progress lines on stderr.
    pub progress: bool,
}

/// A Homa endpoint on loopback with the benchmark's settings.
fn homa_endpoint(async_poll: Option<Duration>) -> homa::Result<AsyncEndpoint> {
    let mut b = homa::Endpoint::builder();
    if let Some(p) = async_poll {
        b = b.async_poll(p);
    }
    b.bind("127.0.0.1:0").map(AsyncEndpoint::from)
}

/// One row of the result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GrpcRow {
    pub transport: String,
    pub size: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Calls per second of the closed loop (one call in flight).
    pub rpcs_per_sec: f64,
}

/// The method every call goes to.
const PATH: &str = "/homa.bench.Echo/Echo";

/// A codec for raw bytes: the payload is the message (no protobuf).
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesCodec;

impl Codec for BytesCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = BytesCodec;
    type Decoder = BytesCodec;
    fn encoder(&mut self) -> BytesCodec {
        BytesCodec
    }
    fn decoder(&mut self) -> BytesCodec {
        BytesCodec
    }
}

impl Encoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for BytesCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The echo service, written the way tonic-build writes a server: tonic's
/// `Grpc::unary` does the decoding, the call and the encoding.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoServer;

impl NamedService for EchoServer {
    const NAME: &'static str = "homa.bench.Echo";
}

struct Echo;

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, Status>>;
    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(request.into_inner())))
    }
}

type EchoFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl tower_service::Service<http::Request<Body>> for EchoServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = EchoFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> EchoFuture {
        if req.uri().path() != PATH {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(BytesCodec);
            Ok(grpc.unary(Echo, req).await)
        })
    }
}

/// Both servers, on a runtime of their own (one worker thread).
struct Servers {
    tcp: SocketAddr,
    homa: SocketAddr,
    raw: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Servers {
    fn start(async_poll: Option<Duration>) -> Result<Servers, BoxError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("grpc-bench-server".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let started = (|| {
                        let incoming = tonic::transport::server::TcpIncoming::bind(
                            "127.0.0.1:0".parse().expect("address"),
                        )
                        .map_err(|e| e.to_string())?
                        .with_nodelay(Some(true));
                        let tcp = incoming.local_addr().map_err(|e| e.to_string())?;
                        let ep = homa_endpoint(async_poll).map_err(|e| e.to_string())?;
                        let raw = homa_endpoint(async_poll).map_err(|e| e.to_string())?;
                        Ok::<_, String>((incoming, tcp, ep, raw))
                    })();
                    let (incoming, tcp, ep, raw) = match started {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok((tcp, ep.local_addr(), raw.local_addr())));
                    let mut raw_requests = raw.requests();
                    let raw_echo = tokio::spawn(async move {
                        while let Some(req) = raw_requests.next().await {
                            let (msg, responder) = req.into_parts();
                            let _ = responder.reply(msg.into_bytes());
                        }
                    });
                    let homa =
                        tokio::spawn(serve(ep.clone(), Router::new().add_service(EchoServer)));
                    let tcp_server = tonic::transport::Server::builder()
                        .add_service(EchoServer)
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stopped.await;
                        });
                    let _ = tcp_server.await;
                    ep.shutdown();
                    raw.shutdown();
                    let _ = homa.await;
                    let _ = raw_echo.await;
                });
            })?;
        let (tcp, homa, raw) = rx.recv()??;
        Ok(Servers {
            tcp,
            homa,
            raw,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A tonic client over either transport.
enum Client {
    Tcp(tonic::client::Grpc<tonic::transport::Channel>),
    Homa(tonic::client::Grpc<HomaChannel>),
    Raw(AsyncEndpoint, SocketAddr),
}

impl Client {
    async fn call(&mut self, payload: Bytes) -> Result<Bytes, BoxError> {
        let path = http::uri::PathAndQuery::from_static(PATH);
        let req = tonic::Request::new(payload);
        let resp = match self {
            Client::Tcp(g) => {
                g.ready().await?;
                g.unary(req, path, BytesCodec).await?
            }
            Client::Homa(g) => {
                g.ready().await?;
                g.unary(req, path, BytesCodec).await?
            }
            Client::Raw(ep, peer) => {
                return Ok(ep.call(*peer, req.into_inner()).await?.into_bytes())
            }
        };
        Ok(resp.into_inner())
    }
}

fn round_share(total: u64, rounds: u64, r: u64) -> u64 {
    total / rounds + u64::from(r < total % rounds)
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    (h.value_at_quantile(q) as f64 / 100.0).round() / 10.0
}

/// Runs the benchmark: for each size, the transports take turns in
/// `rounds` rounds of `iters / rounds` closed-loop calls each.
pub fn measure(b: &GrpcBench) -> Result<Vec<GrpcRow>, BoxError> {
    for t in &b.transports {
        if !TRANSPORTS.contains(&t.as_str()) {
            return Err(format!("unknown transport {t} (tonic-tcp, tonic-homa, homa-raw)").into());
        }
    }
    let servers = Servers::start(b.async_poll)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let rows = rt.block_on(async {
        let mut clients = Vec::new();
        for t in &b.transports {
            clients.push(match t.as_str() {
                "tonic-tcp" => {
                    let ch =
                        tonic::transport::Endpoint::from_shared(format!("http://{}", servers.tcp))?
                            .tcp_nodelay(true)
                            .connect()
                            .await?;
                    Client::Tcp(tonic::client::Grpc::new(ch))
                }
                "homa-raw" => Client::Raw(homa_endpoint(b.async_poll)?, servers.raw),
                _ => {
                    let ep = homa_endpoint(b.async_poll)?;
                    Client::Homa(tonic::client::Grpc::new(HomaChannel::new(ep, servers.homa)))
                }
            });
        }
        let rounds = b.rounds.max(1);
        let mut rows = Vec::new();
        for &size in &b.sizes {
            let payload = Bytes::from(vec![0x5a; size]);
            let mut hs = Vec::new();
            let mut busy = vec![Duration::ZERO; clients.len()];
            for c in clients.iter_mut() {
                for _ in 0..b.warmup {
                    c.call(payload.clone()).await?;
                }
                hs.push(Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?);
            }
            for r in 0..rounds {
                let n = round_share(b.iters, rounds, r);
                for (i, c) in clients.iter_mut().enumerate() {
                    if b.progress {
                        eprintln!(
                            "{} B, round {}/{rounds}: {} ({n} calls)",
                            size,
                            r + 1,
                            b.transports[i]
                        );
                    }
                    let start = Instant::now();
                    for _ in 0..n {
                        let t = Instant::now();
                        let reply = c.call(payload.clone()).await?;
                        hs[i].record(t.elapsed().as_nanos().max(1) as u64)?;
                        if reply.len() != size {
                            return Err(
                                format!("echo of {size} B came back as {}", reply.len()).into()
                            );
                        }
                    }
                    busy[i] += start.elapsed();
                }
            }
            for (i, t) in b.transports.iter().enumerate() {
                let calls = hs[i].len() as f64;
                rows.push(GrpcRow {
                    transport: t.clone(),
                    size,
                    p50_us: us(&hs[i], 0.5),
                    p99_us: us(&hs[i], 0.99),
                    rpcs_per_sec: (calls / busy[i].as_secs_f64()).round(),
                });
            }
        }
        Ok::<_, BoxError>(rows)
    })?;
    drop(rt);
    drop(servers);
    Ok(rows)
}
