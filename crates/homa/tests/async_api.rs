//! The async API over real loopback sockets (feature `tokio`).
#![cfg(feature = "tokio")]

use homa::{AsyncEndpoint, Endpoint, EndpointConfig, Error};
use std::future::IntoFuture;
use std::time::Duration;

fn payload(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ seed.wrapping_mul(977)) as u8)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_call_an_async_server() {
    let server = AsyncEndpoint::bind_with("127.0.0.1:0", EndpointConfig::default()).unwrap();
    let addr = server.local_addr();
    let srv = server.clone();
    let serving = tokio::spawn(async move {
        let mut n = 0u32;
        loop {
            match srv.recv_request().await {
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
    let client = AsyncEndpoint::bind("127.0.0.1:0").unwrap();
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..25u64 {
                let len = [0usize, 10, 2000, 70_000][(i % 4) as usize];
                let data = payload(len, t * 100 + i);
                // Every other call from a send buffer (zero-copy transmit).
                let m = if i % 2 == 0 {
                    client.call(addr, data.clone()).await.unwrap()
                } else {
                    let mut b = client.new_send_buf(len);
                    b.write(0, &data).unwrap();
                    client.call(addr, b).await.unwrap()
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
        let r = client.recv_response().await.unwrap();
        assert_eq!(r.result.unwrap().len(), 10);
    }
    server.shutdown();
    assert_eq!(serving.await.unwrap(), 205);
}

#[tokio::test(flavor = "current_thread")]
async fn async_timeout_abandons_and_shutdown_wakes_waiters() {
    // Nobody answers requests on this endpoint.
    let silent = Endpoint::bind("127.0.0.1:0").unwrap();
    let client = AsyncEndpoint::bind("127.0.0.1:0").unwrap();
    let r = client
        .call_timeout(
            silent.local_addr(),
            &b"hello?"[..],
            Duration::from_millis(30),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout)));
    assert_eq!(client.blocking().engine_stats().client_rpcs, 0);

    let pending = client.send_request(silent.local_addr(), &b"x"[..]).unwrap();
    let c2 = client.clone();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        c2.shutdown();
    });
    assert!(matches!(pending.await, Err(Error::Shutdown)));
    assert!(matches!(client.recv_request().await, Err(Error::Shutdown)));
    stopper.await.unwrap();
}

/// Awaits the next item of a stream without the `futures` crate.
async fn next<S: futures_core::Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

/// Async waits are woken through tokio's reactor (the endpoint's driver
/// task), not by the background thread: a long run of async round trips
/// leaves the background thread idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_waits_are_woken_by_the_reactor() {
    let server = AsyncEndpoint::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    let mut requests = server.requests();
    let serving = tokio::spawn(async move {
        let mut n = 0u64;
        while let Some(req) = next(&mut requests).await {
            let (msg, responder) = req.into_parts();
            responder.reply(msg.into_bytes()).unwrap();
            n += 1;
        }
        n
    });
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let calls = 500u64;
    for i in 0..calls {
        let req = payload(100, i);
        let reply = client
            .send_request(addr, req.clone())
            .unwrap()
            .await
            .unwrap();
        assert_eq!(reply.to_vec(), req);
    }
    let c = client.runtime_stats();
    let s = server.blocking().runtime_stats();
    // The background threads may run a timer backstop or two, but they do
    // not deliver the results (that would be one drive per call).
    assert!(
        c.background_drives + s.background_drives < calls / 10,
        "{c:?} {s:?}"
    );
    server.shutdown();
    assert_eq!(serving.await.unwrap(), calls, "the stream ends at shutdown");
}

/// Dropping a call's future before its response cancels the RPC in the
/// engine; dropping a receive future loses no request.
#[tokio::test(flavor = "current_thread")]
async fn dropped_futures_cancel_calls_and_keep_requests() {
    let server = Endpoint::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    // Nobody answers: the call stays pending until its future is dropped.
    let call = client.send_request(addr, &b"never answered"[..]).unwrap();
    let id = call.id();
    let timed_out = tokio::time::timeout(Duration::from_millis(50), call).await;
    assert!(timed_out.is_err());
    assert_eq!(
        client.engine_stats().client_rpcs,
        0,
        "{id:?} still in the engine"
    );

    // A receive future dropped while waiting takes nothing from the queue.
    let quiet = AsyncEndpoint::bind("127.0.0.1:0").unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(20), quiet.recv_request()).await;
    assert!(waiting.is_err());
    let _pending = client
        .send_request(quiet.local_addr(), &b"second"[..])
        .unwrap();
    let req = tokio::time::timeout(Duration::from_secs(5), quiet.recv_request())
        .await
        .expect("the request is still delivered")
        .unwrap();
    assert_eq!(req.message().to_vec(), b"second");
}

/// Futures polled outside any tokio runtime still complete: the background
/// thread watches for them.
#[test]
fn futures_work_without_a_runtime() {
    let server = Endpoint::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    let s = server.clone();
    let t = std::thread::spawn(move || {
        let req = s.recv_request().unwrap();
        req.reply(&b"pong"[..]).unwrap();
    });
    let client = Endpoint::bind("127.0.0.1:0").unwrap();
    let fut = client
        .send_request(addr, &b"ping"[..])
        .unwrap()
        .into_future();
    let reply = block_on(fut).unwrap();
    assert_eq!(reply.to_vec(), b"pong");
    t.join().unwrap();
}

/// A minimal executor: parks the thread until the waker unparks it.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
}
