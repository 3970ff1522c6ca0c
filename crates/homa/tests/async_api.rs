//! The async API over real loopback sockets (feature `tokio`).
#![cfg(feature = "tokio")]

use homa::{Endpoint, EndpointConfig, Error};
use std::time::Duration;

fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ seed.wrapping_mul(977)) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_call_an_async_server() {
    let server = Endpoint::bind_with("127.0.0.1:0", EndpointConfig::default()).unwrap();
    let addr = server.local_addr();
    let srv = server.clone();
    let serving = tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            match srv.recv_request_async().await {
                Ok(req) => {
                    let body = req.message().to_vec();
                    req.reply(body).unwrap();
                    n += 1;
                }
                Err(Error::Shutdown) => return n,
                Err(e) => panic!("{e}"),
            }
        }
    });
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let len = [0usize, 10, 2000, 70_000][(i % 4) as usize];
                let data = payload(len, t * 100 + i);
                // Every other call from a send buffer (zero-copy transmit).
                let m = if i % 2 == 0 {
                    client.call_async(addr, data.clone()).await.unwrap()
                } else {
                    let mut b = client.new_send_buf(len);
                    b.write(0, &data).unwrap();
                    client.call_async(addr, b).await.unwrap()
                };
                assert!(m == data[..]);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Shared RPCs collected asynchronously.
    for i in 0..5 {
        client.send_request_shared(addr, payload(10, i)).unwrap();
    }
    for _ in 0..5 {
        let r = client.recv_response_async().await.unwrap();
        assert_eq!(r.result.unwrap().len(), 10);
    }
    server.shutdown();
    assert_eq!(serving.await.unwrap(), 205);
}

#[tokio::test(flavor = "current_thread")]
async fn async_timeout_abandons_and_shutdown_wakes_waiters() {
    // Nobody answers requests on this endpoint.
    let silent = Endpoint::bind("127.0.0.1:0").unwrap();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let r = client
        .call_timeout_async(
            silent.local_addr(),
            &b"hello?"[..],
            Duration::from_millis(30),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout)));
    assert_eq!(client.engine_stats().client_rpcs, 0);

    let pending = client.send_request(silent.local_addr(), &b"x"[..]).unwrap();
    let c2 = client.clone();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        c2.shutdown();
    });
    assert!(matches!(pending.await, Err(Error::Shutdown)));
    assert!(matches!(
        client.recv_request_async().await,
        Err(Error::Shutdown)
    ));
    stopper.await.unwrap();
}
