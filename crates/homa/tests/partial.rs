//! Responses read while they arrive (`Endpoint::call_partial`) over real
//! loopback sockets.

use homa::{Endpoint, EndpointConfig, Error};
use std::io::Read;
use std::thread;
use std::time::Duration;

fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ (i as u64 >> 8) ^ seed.wrapping_mul(977)) as u8)
        .collect()
}

/// A server that answers each request (8 bytes: the response length, then
/// nothing) with `payload(len, len)`, until shut down.
fn server() -> (Endpoint, thread::JoinHandle<()>) {
    let server = Endpoint::bind_with("127.0.0.1:0", EndpointConfig::default()).unwrap();
    let srv = server.clone();
    let t = thread::spawn(move || loop {
        match srv.recv_request() {
            Ok(req) => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&req.message().to_vec()[..8]);
                let len = u64::from_le_bytes(n) as usize;
                let _ = req.reply(payload(len, len as u64));
            }
            Err(Error::Shutdown) => return,
            Err(e) => panic!("{e}"),
        }
    });
    (server, t)
}

#[test]
fn a_long_response_is_read_in_chunks_as_it_arrives() {
    let (server, t) = server();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    for len in [0usize, 100, 70_000, 999_000] {
        let mut incoming = client
            .call_partial(server.local_addr(), (len as u64).to_le_bytes().to_vec())
            .unwrap();
        assert_eq!(incoming.len(), len);
        let mut got = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = incoming.next_chunk().unwrap() {
            assert!(!chunk.is_empty());
            got.extend_from_slice(chunk);
            chunks += 1;
        }
        assert_eq!(got, payload(len, len as u64), "{len} bytes");
        assert_eq!(incoming.position(), len);
        assert!(incoming.is_complete());
        if len > 65_536 {
            // At most one 64 KiB pool page per chunk.
            assert!(chunks >= len / 65_536, "{len} bytes in {chunks} chunks");
        }
        // Whole again, from the same pool space.
        let whole = incoming.into_message().unwrap();
        assert_eq!(whole.len(), len);
    }
    server.shutdown();
    t.join().unwrap();
}

#[test]
fn io_read_copies_the_response_in_order() {
    let (server, t) = server();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let len = 500_000usize;
    let mut incoming = client
        .call_partial(server.local_addr(), (len as u64).to_le_bytes().to_vec())
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 3000];
    loop {
        let n = incoming.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, payload(len, len as u64));
    server.shutdown();
    t.join().unwrap();
}

#[test]
fn dropping_an_unfinished_response_cancels_its_rpc() {
    let (server, t) = server();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    for _ in 0..20 {
        let incoming = client
            .call_partial(server.local_addr(), 999_000u64.to_le_bytes().to_vec())
            .unwrap();
        drop(incoming);
    }
    // Every RPC is gone and its pool space back; the endpoint still works.
    let m = client
        .call_timeout(
            server.local_addr(),
            100u64.to_le_bytes().to_vec(),
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(m.len(), 100);
    drop(m);
    let stats = client.engine_stats();
    assert_eq!(stats.client_rpcs, 0);
    assert!(stats.pool_empty);
    server.shutdown();
    t.join().unwrap();
}

#[test]
fn a_response_cut_short_by_shutdown_is_incomplete() {
    let (server, t) = server();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let mut incoming = client
        .call_partial(server.local_addr(), 999_000u64.to_le_bytes().to_vec())
        .unwrap();
    client.shutdown();
    let err = loop {
        match incoming.next_chunk() {
            Ok(Some(_)) => continue,
            Ok(None) => break None,
            Err(e) => break Some(e),
        }
    };
    // Either all of it had arrived before the shutdown, or the reader
    // learns how much did.
    match err {
        None => assert!(incoming.is_complete()),
        Some(Error::Incomplete { received, len }) => {
            assert_eq!(len, 999_000);
            assert!(received < len);
            assert_eq!(incoming.position(), received);
        }
        Some(e) => panic!("{e}"),
    }
    server.shutdown();
    t.join().unwrap();
}

#[test]
fn a_long_request_is_read_while_it_arrives_and_answered_when_complete() {
    let mut cfg = EndpointConfig::default();
    cfg.engine = cfg.engine.with_partial_delivery_bytes(100_000);
    let server = Endpoint::bind_with("127.0.0.1:0", cfg).unwrap();
    let srv = server.clone();
    let t = thread::spawn(move || {
        let mut served = 0;
        loop {
            match srv.recv_partial_request() {
                Ok((mut incoming, responder)) => {
                    let len = incoming.len();
                    let mut sum = 0u64;
                    let mut seen = 0;
                    while let Some(chunk) = incoming.next_chunk().unwrap() {
                        sum += chunk.iter().map(|&b| b as u64).sum::<u64>();
                        seen += chunk.len();
                    }
                    assert_eq!(seen, len);
                    responder.reply(sum.to_le_bytes().to_vec()).unwrap();
                    served += 1;
                }
                Err(Error::Shutdown) => return served,
                Err(e) => panic!("{e}"),
            }
        }
    });
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    for len in [100_000usize, 300_000, 999_999] {
        let data = payload(len, 7);
        let want: u64 = data.iter().map(|&b| b as u64).sum();
        let m = client
            .call_timeout(server.local_addr(), data, Duration::from_secs(10))
            .unwrap();
        let mut got = [0u8; 8];
        got.copy_from_slice(&m.to_vec());
        assert_eq!(u64::from_le_bytes(got), want, "{len} bytes");
    }
    // Below the threshold: a whole request, through recv_request.
    let pending = client
        .send_request(server.local_addr(), vec![1u8; 500])
        .unwrap();
    let req = server.recv_request().unwrap();
    assert_eq!(req.message().len(), 500);
    req.reply(vec![2u8; 3]).unwrap();
    assert_eq!(pending.wait().unwrap().len(), 3);
    server.shutdown();
    assert_eq!(t.join().unwrap(), 3);
}

/// The tokio API: a request read with `AsyncRead` by an async server that
/// echoes it, whose response the client reads chunk by chunk.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_partial_request_and_response() {
    use homa::AsyncEndpoint;
    use tokio::io::AsyncReadExt;
    let mut cfg = EndpointConfig::default();
    cfg.engine = cfg.engine.with_partial_delivery_bytes(100_000);
    let server = AsyncEndpoint::bind_with("127.0.0.1:0", cfg).unwrap();
    let srv = server.clone();
    let serving = tokio::spawn(async move {
        for _ in 0..3 {
            let (mut incoming, responder) = srv.recv_partial_request().await.unwrap();
            let mut v = Vec::new();
            AsyncReadExt::read_to_end(&mut incoming, &mut v)
                .await
                .unwrap();
            assert_eq!(v.len(), incoming.len());
            responder.reply(v).unwrap();
        }
    });
    let client = AsyncEndpoint::bind("127.0.0.1:0").unwrap();
    for (i, len) in [100_000usize, 640_000, 999_999].into_iter().enumerate() {
        let data = payload(len, i as u64);
        let mut incoming = client
            .call_partial(server.local_addr(), data.clone())
            .await
            .unwrap();
        let mut got = Vec::new();
        while let Some(c) = incoming.next_chunk_async().await.unwrap() {
            got.extend_from_slice(c);
        }
        assert_eq!(got, data, "{len} bytes");
        assert_eq!(incoming.into_message_async().await.unwrap().len(), len);
    }
    serving.await.unwrap();
    assert_eq!(client.blocking().engine_stats().client_rpcs, 0);
}
