//! Async round trips: Homa's tokio API (`AsyncEndpoint::call`, `recv_request`)
//! against a tokio `UdpSocket` and a tokio `TcpStream` ping-pong, the client
//! and the echo server as tasks of one multi-thread tokio runtime with the
//! default worker count, as an async application would run them.

use crate::baseline::MAX_UDP_PAYLOAD;
use crate::echo::HomaEchoes;
use crate::payload::Payloads;
use crate::stats::{new_histogram, record};
use anyhow::Context;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One round trip taking longer than this fails the run (Homa, TCP), or is
/// resent and left out of the samples (UDP, whose datagrams may be lost).
const ROUND_TRIP_LIMIT: Duration = Duration::from_secs(2);
/// A UDP echo not back after this is taken as lost.
const UDP_RESEND: Duration = Duration::from_millis(200);

/// An async transport of `echo-bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncTransport {
    /// Homa's tokio API.
    HomaAsync,
    /// `tokio::net::UdpSocket`, one datagram each way.
    TokioUdp,
    /// `tokio::net::TcpStream`, one connection with TCP_NODELAY.
    TokioTcp,
}

impl AsyncTransport {
    /// By its `echo-bench` name: `homa-async`, `tokio-udp`, `tokio-tcp`.
    pub fn parse(name: &str) -> Option<AsyncTransport> {
        match name {
            "homa-async" => Some(AsyncTransport::HomaAsync),
            "tokio-udp" => Some(AsyncTransport::TokioUdp),
            "tokio-tcp" => Some(AsyncTransport::TokioTcp),
            _ => None,
        }
    }
}

/// Round-trip times of `count` echoes of `size` bytes (after `warmup`) on a
/// new multi-thread runtime (default worker count: one per CPU). `homa`
/// configures both Homa endpoints.
pub fn measure(
    t: AsyncTransport,
    homa: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
) -> anyhow::Result<Histogram<u64>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let h = rt.block_on(async {
        match t {
            AsyncTransport::HomaAsync => homa_async(homa, size, count, warmup).await,
            AsyncTransport::TokioUdp => tokio_udp(size, count, warmup).await,
            AsyncTransport::TokioTcp => tokio_tcp(size, count, warmup).await,
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    h
}

async fn homa_async(
    cfg: &homa::EndpointConfig,
    size: usize,
    count: u64,
    warmup: u64,
) -> anyhow::Result<Histogram<u64>> {
    let server = homa::AsyncEndpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let addr = server.local_addr();
    let srv = server.clone();
    let echo = tokio::spawn(async move {
        loop {
            match srv.recv_request().await {
                Ok(req) => {
                    // Echoed from the pool without a copy, as the blocking
                    // benchmark's server does.
                    let (message, responder) = req.into_parts();
                    let _ = responder.reply(message.into_bytes());
                }
                Err(homa::Error::Shutdown) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let client = homa::AsyncEndpoint::bind_with("127.0.0.1:0", cfg.clone())?;
    let run = HomaEchoes::new(size, 5, warmup, count);
    let msg = run.request();
    let mut h = new_histogram();
    let result = async {
        for i in 0..warmup + count {
            let t0 = Instant::now();
            let reply = tokio::time::timeout(ROUND_TRIP_LIMIT, client.call(addr, msg.clone()))
                .await
                .context("round trip took too long")??;
            run.take(i, &reply, t0.elapsed().as_nanos() as u64, &mut h)?;
        }
        Ok(())
    }
    .await;
    server.shutdown();
    client.shutdown();
    match tokio::time::timeout(Duration::from_secs(2), echo).await {
        Ok(joined) => joined.context("echo task panicked")??,
        Err(_) => anyhow::bail!("the Homa echo task did not end after shutdown"),
    }
    result.map(|_| h)
}

async fn tokio_udp(size: usize, count: u64, warmup: u64) -> anyhow::Result<Histogram<u64>> {
    anyhow::ensure!(
        size <= MAX_UDP_PAYLOAD,
        "{size} bytes do not fit one UDP datagram"
    );
    let server = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let addr = server.local_addr()?;
    let echo = tokio::spawn(udp_echo(server));
    let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    client.connect(addr).await?;
    let payloads = Payloads::new(size);
    let msg = payloads.payload(6, size);
    let mut buf = vec![0u8; 65_536];
    let mut h = new_histogram();
    let result = async {
        let give_up = Instant::now() + ROUND_TRIP_LIMIT * (warmup + count).min(1000) as u32;
        let mut i = 0;
        while i < warmup + count {
            anyhow::ensure!(Instant::now() < give_up, "too many UDP echoes lost");
            let t0 = Instant::now();
            client.send(&msg).await?;
            match tokio::time::timeout(UDP_RESEND, client.recv(&mut buf)).await {
                // Lost (possible even on loopback under load): sent again,
                // this sample left out.
                Err(_) => continue,
                Ok(n) => {
                    let n = n?;
                    let ns = t0.elapsed().as_nanos() as u64;
                    anyhow::ensure!(n == size, "echo of {n} bytes, sent {size}");
                    if i >= warmup {
                        record(&mut h, ns);
                    }
                    i += 1;
                }
            }
        }
        anyhow::ensure!(
            payloads.matches(6, &buf[..size]),
            "UDP echo corrupted the payload"
        );
        Ok(())
    }
    .await;
    echo.abort();
    if let Ok(Ok(Err(e))) = tokio::time::timeout(Duration::from_secs(1), echo).await {
        return Err(e).context("tokio UDP echo task");
    }
    result.map(|_| h)
}

/// Sends every datagram back to its sender, until aborted.
async fn udp_echo(server: tokio::net::UdpSocket) -> std::io::Result<()> {
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = server.recv_from(&mut buf).await?;
        server.send_to(&buf[..n], from).await?;
    }
}

async fn tokio_tcp(size: usize, count: u64, warmup: u64) -> anyhow::Result<Histogram<u64>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let total = warmup + count;
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; size];
        for _ in 0..total {
            s.read_exact(&mut buf).await?;
            s.write_all(&buf).await?;
        }
        Ok::<(), std::io::Error>(())
    });
    let mut c = tokio::net::TcpStream::connect(addr).await?;
    c.set_nodelay(true)?;
    let payloads = Payloads::new(size);
    let msg = payloads.payload(7, size);
    let mut buf = vec![0u8; size];
    let mut h = new_histogram();
    let result = async {
        for i in 0..total {
            let t0 = Instant::now();
            tokio::time::timeout(ROUND_TRIP_LIMIT, async {
                c.write_all(&msg).await?;
                c.read_exact(&mut buf).await
            })
            .await
            .context("round trip took too long")??;
            if i >= warmup {
                record(&mut h, t0.elapsed().as_nanos() as u64);
            }
        }
        anyhow::ensure!(payloads.matches(7, &buf), "TCP echo corrupted the payload");
        Ok(())
    }
    .await;
    drop(c);
    match tokio::time::timeout(Duration::from_secs(2), echo).await {
        Ok(joined) => {
            let served = joined.context("TCP echo task panicked")?;
            if result.is_ok() {
                served.context("tokio TCP echo task")?;
            }
        }
        Err(_) => anyhow::bail!("the tokio TCP echo task did not end"),
    }
    result.map(|_| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse() {
        assert_eq!(
            AsyncTransport::parse("homa-async"),
            Some(AsyncTransport::HomaAsync)
        );
        assert_eq!(AsyncTransport::parse("udp"), None);
    }

    #[test]
    fn each_transport_counts_its_round_trips() {
        let cfg = crate::loopback_config();
        for t in [
            AsyncTransport::HomaAsync,
            AsyncTransport::TokioUdp,
            AsyncTransport::TokioTcp,
        ] {
            let h = measure(t, &cfg, 1000, 20, 3).unwrap();
            assert_eq!(h.len(), 20, "{t:?}");
        }
        assert!(measure(AsyncTransport::TokioUdp, &cfg, 70_000, 1, 0).is_err());
    }
}
